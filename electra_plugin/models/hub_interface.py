"""Python access to a trained ELECTRA checkpoint, in the style of fairseq's RoBERTa hub."""

import os
from typing import List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data.tokenizer import load_tokenizer
from ..user_io.errors import ElectraUsageError
from .core.checkpoint_file import require_checkpoint_file


def from_pretrained(model_dir, checkpoint_file="checkpoint_best.pt", data_name_or_path=".",
                    **overrides):
    """Load ``model_dir/checkpoint_file`` with its task and the dictionary of the data
    directory ``data_name_or_path``, found as fairseq's RoBERTa hub finds it: from
    ``model_dir`` where it starts with '.' (the default: ``model_dir`` itself), else as given."""
    from fairseq import hub_utils

    require_checkpoint_file(os.path.join(model_dir, checkpoint_file))
    data = os.path.abspath(os.path.join(model_dir, data_name_or_path)
                           if data_name_or_path.startswith(".") else data_name_or_path)
    if not os.path.isdir(data):
        raise ElectraUsageError(f"data directory {data} does not exist; pass the directory "
                                f"holding the dict.txt the model was trained with")
    loaded = hub_utils.from_pretrained(model_dir, checkpoint_file, data,
                                       archive_map={}, load_checkpoint_heads=True, **overrides)
    return ElectraHubInterface(loaded["args"], loaded["task"], loaded["models"][0])


class ElectraHubInterface(nn.Module):
    """encode / decode / extract_features / predict / replaced_token_scores for one model.

    Text is tokenized with the tokenizer ``electra-prepare`` saved into the data
    directory (copied next to fine-tuning data by the GLUE and SQuAD preprocessing scripts).
    """

    def __init__(self, cfg, task, model):
        super().__init__()
        self.cfg = cfg
        self.task = task
        self.model = model.eval()
        self._tokenizer = None

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.task.cfg.data)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer):
        """Another tokenizer than the data directory's (electra-score: whitespace tokens of
        plain fairseq-preprocess data)."""
        self._tokenizer = tokenizer

    def encode(self, sentence: str, *addl_sentences: str) -> torch.LongTensor:
        """``<s> a </s> b </s>`` token ids (ELECTRA's [CLS] a [SEP] b [SEP])."""
        d = self.task.source_dictionary
        ids = [d.bos()]
        for text in (sentence,) + addl_sentences:
            ids += [d.index(p) for p in self.tokenizer.pieces(text)] + [d.eos()]
        if len(ids) > self.model.max_positions():
            raise ElectraUsageError(f"the input has {len(ids)} tokens, more than the model's "
                                    f"{self.model.max_positions()} positions")
        return torch.tensor(ids, dtype=torch.long)

    def pieces(self, tokens: torch.LongTensor) -> List[str]:
        d = self.task.source_dictionary
        return [d[int(t)] for t in tokens]

    def decode(self, tokens: torch.LongTensor) -> str:
        """Text of the ids between the specials; sentences are joined by a space."""
        d = self.task.source_dictionary
        specials = {d.bos(), d.eos(), d.pad()}
        return self.tokenizer.detokenize([d[int(t)] for t in tokens if int(t) not in specials])

    def _batch(self, tokens):
        tokens = tokens.unsqueeze(0) if tokens.dim() == 1 else tokens
        return tokens.to(device=self.device, dtype=torch.long)

    @torch.no_grad()
    def extract_features(self, tokens, return_all_hiddens=False):
        """B x T x H last-layer features, or a list of every layer's with return_all_hiddens."""
        features, extra = self.model(self._batch(tokens), features_only=True,
                                     return_all_hiddens=return_all_hiddens)
        return extra["inner_states"] if return_all_hiddens else features

    def register_classification_head(self, name, num_classes=None, **kwargs):
        self.model.register_classification_head(name, num_classes=num_classes, **kwargs)

    @torch.no_grad()
    def predict(self, head: str, tokens, return_logits=False):
        """Log-probabilities (or raw logits / regression values) of a classification head."""
        logits, _ = self.model(self._batch(tokens), features_only=True,
                               classification_head_name=head)
        return logits if return_logits else F.log_softmax(logits.float(), dim=-1)

    @torch.no_grad()
    def replaced_token_scores(self, sentence: str) -> List[Tuple[str, float]]:
        """The discriminator's probability that each piece of ``sentence`` was replaced."""
        tokens = self.encode(sentence)
        logits, _ = self.model(self._batch(tokens))
        probs = torch.sigmoid(logits[0].float())[1:-1]
        return list(zip(self.pieces(tokens[1:-1]), probs.tolist()))

    @torch.no_grad()
    def generate_and_detect(self, sentence: str, mask_prob: float = 0.15,
                            seed: int = 0) -> List[Tuple[str, str, float]]:
        """One replaced-token-detection step on ``sentence``, for looking at the model.

        Masks ``mask_prob`` of the pieces (at least one), lets the generator sample
        replacements, and returns (original piece, piece the discriminator read, its
        replaced-token probability) for every piece. Needs a pre-training checkpoint.
        """
        if not self.model.pretraining or self.model.discriminator_head is None or \
                not self.model.objective.corrupts:
            raise ElectraUsageError("generate_and_detect needs a replaced-token-detection "
                                    "pre-training checkpoint (electra task, --objective "
                                    "electra or electra_15)")
        tokens = self.encode(sentence)
        inner = len(tokens) - 2
        generator = torch.Generator().manual_seed(seed)
        picked = torch.randperm(inner, generator=generator)[:max(1, round(mask_prob * inner))]
        picked = picked + 1  # after <s>
        src = tokens.clone()
        src[picked] = self.task.mask_idx
        target = torch.full_like(tokens, self.task.source_dictionary.pad())
        target[picked] = tokens[picked]
        torch.manual_seed(seed)
        out = self.model(self._batch(src), target=self._batch(target))
        probs = torch.sigmoid(out.main[0].float())[1:-1]
        read = out.corrupted[0][1:-1]
        return list(zip(self.pieces(tokens[1:-1]), self.pieces(read), probs.tolist()))
