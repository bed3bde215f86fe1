"""Whole-sentence scores from a pre-trained checkpoint, and n-best re-ranking with them.

Two scorers, both batched over sentences (and over masked copies):

- ``electric``: one forward pass over the clean sentence; the score is ``-sum_t E(x)_t``, the
  discriminator_head's raw outputs over the real tokens (Electric, Clark et al. 2020, reads
  them as energies; on an ELECTRA checkpoint they are replaced-token logits instead).
- ``mlm``: the masked LM's pseudo-log-likelihood (Salazar et al. 2020): each real token
  masked in turn, one pass per token, ``sum_t log p(x_t | x_\\t)``.

Both leave out ``<s>``, ``</s>`` and padding. Re-ranking picks, per sentence, the hypothesis
with the best ``translation score + w * language score``, w tuned by corpus BLEU on a dev
n-best list (sacrebleu, the ``bleu`` extra).
"""

import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..data.tokenizer import METADATA_FILE
from ..environment.optional import require
from ..models.generators.fast_electra import MASKED_LM_PARTS
from ..user_io.errors import ElectraUsageError
from ..user_io.progress import progress
from ..user_io.text_files import read_text
from .checkpoint_kind import PRETRAINING, read_kind

logger = logging.getLogger(__name__)
SCORERS = ("electric", "mlm")
BLEU_FEATURE = "re-ranking n-best lists by BLEU"
SCORE_HEADER = ("id", "hypothesis", "model_score", "language_score")
HEADER_LINE = "\t".join(SCORE_HEADER)
MLM_NEEDS = ("--scorer mlm needs a masked LM: an electra pre-training checkpoint (its generator) "
             "or an --objective mlm one; use --scorer electric for a checkpoint with a "
             "discriminator_head")
ELECTRIC_NEEDS = ("--scorer electric reads the discriminator_head's energies: give a "
                  "pre-training checkpoint that has one (--objective electric or electra), or "
                  "use --scorer mlm")


# ------------------------------------------------------------------------------ scorers

def scored_positions(model, tokens: torch.Tensor) -> torch.Tensor:
    """B x T bool: the real tokens (not ``<s>``, ``</s>`` or padding), which a score sums."""
    special = tokens.eq(model.bos_idx) | tokens.eq(model.separator_idx)
    return ~(special | tokens.eq(model.padding_idx))


def masked_lm(model):
    """-> (encoder, head) of the checkpoint's masked LM, looked for where
    :data:`MASKED_LM_PARTS` says checkpoints keep one (the generator first)."""
    for encoder, head in MASKED_LM_PARTS:
        parts = getattr(model, encoder.rstrip("."), None), getattr(model, head.rstrip("."), None)
        if all(part is not None for part in parts):
            return parts
    raise ElectraUsageError(MLM_NEEDS)


def check_checkpoint(path: str, kind: str) -> None:
    """Before its data is read: ``path`` is a pre-training checkpoint holding what the
    scorer reads (:data:`MASKED_LM_PARTS` for mlm, the discriminator_head for electric)."""
    checkpoint = read_kind(path)
    if checkpoint.task != PRETRAINING:
        raise checkpoint.refusal(f"--scorer {kind} needs a pre-training checkpoint (task "
                                 f"electra), whose heads score sentences")
    if kind == "mlm" and not any(checkpoint.has(encoder) and checkpoint.has(head)
                                 for encoder, head in MASKED_LM_PARTS):
        raise ElectraUsageError(f"--checkpoint {path} holds no masked LM; {MLM_NEEDS}")
    if kind == "electric" and not checkpoint.has("discriminator_head."):
        raise ElectraUsageError(f"--checkpoint {path} holds no discriminator_head; "
                                f"{ELECTRIC_NEEDS}")


class SentenceScorer:
    """Scores of sentences given as token ids (``<s> ... </s>``, one tensor each).

    ``batch_size`` is the number of sequences per forward pass: sentences for ``electric``,
    masked copies for ``mlm``. Sentences are batched by length, so that padding is rare;
    a score does not depend on its batch. Puts the model in eval mode (no dropout).
    """

    def __init__(self, model, kind: str, mask_idx: Optional[int] = None, batch_size: int = 64):
        if kind not in SCORERS:
            raise ElectraUsageError(f"--scorer {kind} is not a scorer; pick one of "
                                    f"{', '.join(SCORERS)}")
        if batch_size < 1:
            raise ElectraUsageError(f"--batch-size {batch_size} must be at least 1")
        if kind == "electric" and getattr(model, "discriminator_head", None) is None:
            raise ElectraUsageError(ELECTRIC_NEEDS)
        if kind == "mlm":
            self.encoder, self.head = masked_lm(model)
            if mask_idx is None:
                raise ElectraUsageError("--scorer mlm needs the dictionary's <mask> index")
        self.model, self.kind, self.mask_idx = model.eval(), kind, mask_idx
        self.batch_size = batch_size

    @property
    def device(self):
        return next(self.model.parameters()).device

    def __call__(self, sentences: Sequence[torch.Tensor]) -> List[float]:
        if not sentences:
            return []
        run = self.electric if self.kind == "electric" else self.pseudo_log_likelihood
        return run(sentences).tolist()

    def padded(self, rows: Sequence[torch.Tensor]) -> torch.Tensor:
        tokens = torch.full((len(rows), max(len(r) for r in rows)), self.model.padding_idx,
                            dtype=torch.long)
        for i, row in enumerate(rows):
            tokens[i, :len(row)] = row
        return tokens.to(self.device)

    def by_length(self, lengths: Sequence[int]):
        """Index lists of at most ``batch_size``, shortest first (stable)."""
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        return [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    @torch.inference_mode()
    def electric(self, sentences) -> torch.Tensor:
        """-sum of the energies over each sentence's real tokens: one pass."""
        scores = torch.zeros(len(sentences), dtype=torch.float64, device=self.device)
        batches = self.by_length([len(s) for s in sentences])
        for batch in progress(batches, len(batches), "scoring (electric)"):
            tokens = self.padded([sentences[i] for i in batch])
            energies, _ = self.model(tokens)  # B x T fp32, the discriminator_head's output
            kept = energies.double().masked_fill(~scored_positions(self.model, tokens), 0)
            scores[torch.tensor(batch, device=self.device)] = -kept.sum(1)
        return scores.cpu()

    @torch.inference_mode()
    def pseudo_log_likelihood(self, sentences) -> torch.Tensor:
        """sum_t log p(x_t | x_\\t): a copy per real token, that token masked."""
        model = self.model
        copies = [(i, t) for i, s in enumerate(sentences)
                  for t in scored_positions(model, s[None])[0].nonzero().squeeze(1).tolist()]
        scores = torch.zeros(len(sentences), dtype=torch.float64, device=self.device)
        batches = self.by_length([len(sentences[i]) for i, _ in copies])
        for batch in progress(batches, len(batches), "scoring (mlm: a masked copy per token)"):
            owners = torch.tensor([copies[c][0] for c in batch], device=self.device)
            where = torch.tensor([copies[c][1] for c in batch], device=self.device)
            rows = torch.arange(len(batch), device=self.device)
            tokens = self.padded([sentences[copies[c][0]] for c in batch])
            original = tokens[rows, where]
            tokens[rows, where] = self.mask_idx
            hidden, _ = self.encoder(tokens, model.segments(tokens))
            log_probs = F.log_softmax(self.head(hidden[rows, where]).float(), dim=-1)
            scores.index_add_(0, owners, log_probs[rows, original].double())
        return scores.cpu()


class WhitespaceTokens:
    """The text of plain fairseq-preprocess data, which carries no tokenizer: its
    whitespace-separated tokens are dict.txt's symbols (one it lacks becomes ``<unk>``), as
    fairseq's own hub reads text when no BPE is configured."""

    kind = "whitespace"

    def pieces(self, text: str) -> List[str]:
        return text.split()

    def detokenize(self, pieces: List[str]) -> str:
        return " ".join(pieces)


def read_plain_data_as_tokens(hub, data_dir: str) -> None:
    """Without electra-prepare's tokenizer in ``data_dir``, give ``hub`` whitespace tokens
    instead of letting it refuse the directory; says so in one log line."""
    if os.path.isfile(os.path.join(data_dir, METADATA_FILE)):
        return
    hub.tokenizer = WhitespaceTokens()
    logger.info(f"{data_dir} has no {METADATA_FILE} (plain fairseq-preprocess data): reading "
                f"the input as whitespace-separated tokens of its dict.txt, as fairseq's hub "
                f"does without a BPE; a token not in dict.txt is <unk>")


def text_scorer(hub, kind: str, batch_size: int = 64) -> Callable[[Sequence[str]], List[float]]:
    """-> a function from texts to their scores, through the checkpoint's tokenizer."""
    scorer = SentenceScorer(hub.model, kind, getattr(hub.task, "mask_idx", None), batch_size)

    def score(texts: Sequence[str]) -> List[float]:
        encoded = []
        for i, text in enumerate(texts):
            try:
                encoded.append(hub.encode(text))
            except ElectraUsageError as error:
                raise ElectraUsageError(f"hypothesis {i + 1}: {error.message}") from None
        return scorer(encoded)

    return score


# ------------------------------------------------------------------------------ inputs

@dataclass(frozen=True)
class Hypothesis:
    id: int  # the sentence's id (fairseq-generate's), or its line number in plain text
    rank: int  # its place among its sentence's hypotheses in the file, 0 first
    text: str
    model_score: float  # the translation model's (H- line); nan for plain text


@dataclass
class NBest:
    """Hypotheses in file order, and the sentences' sources (S-) and references (T-)."""

    path: str
    hypotheses: List[Hypothesis]
    sources: Dict[int, str] = field(default_factory=dict)
    references: Dict[int, str] = field(default_factory=dict)

    @property
    def scored_by_a_model(self) -> bool:
        return not any(math.isnan(h.model_score) for h in self.hypotheses)


GENERATE_LINE = re.compile(r"H-\d+\t")


def read_input(path, fmt: str = "auto") -> NBest:
    """Plain text (a sentence per line) or fairseq-generate output; ``auto``: the latter
    when a line starts with ``H-<id><tab>``."""
    lines = read_text(path).splitlines()
    if fmt == "auto":
        fmt = "generate" if any(GENERATE_LINE.match(line) for line in lines) else "text"
    if fmt == "text":
        return NBest(str(path), [Hypothesis(i, 0, line, math.nan)
                                 for i, line in enumerate(lines)])
    return parse_generate(lines, str(path))


def parse_generate(lines: Sequence[str], path: str = "<input>") -> NBest:
    """fairseq-generate's ``S-``, ``T-`` and ``H-<id>\\t<score>\\t<text>`` lines; the others
    (D-, P-, A-, the log) are skipped. A malformed line of the three is one error."""
    nbest = NBest(path, [])
    ranks: Dict[int, int] = {}
    for number, line in enumerate(lines, 1):
        kind = line[:2]
        if kind not in ("H-", "S-", "T-"):
            continue
        fields = line.split("\t", 2 if kind == "H-" else 1)
        try:
            if len(fields) != (3 if kind == "H-" else 2):
                raise ValueError
            sentence = int(fields[0][2:])
            score = float(fields[1]) if kind == "H-" else None
        except ValueError:
            layout = r"H-<id>\t<score>\t<text>" if kind == "H-" else rf"{kind}<id>\t<text>"
            raise ElectraUsageError(
                f"{path}, line {number}: {line[:60]!r} is not a fairseq-generate {kind} line "
                f"({layout})") from None
        if kind == "H-":
            rank = ranks.get(sentence, 0)
            ranks[sentence] = rank + 1
            nbest.hypotheses.append(Hypothesis(sentence, rank, fields[2], score))
        else:
            (nbest.sources if kind == "S-" else nbest.references)[sentence] = fields[1]
    if not nbest.hypotheses:
        raise ElectraUsageError(f"{path} has no H- lines: give fairseq-generate output "
                                f"(or plain text to the score command)")
    return nbest


# ------------------------------------------------------------------------------ score files

def write_scores(f, nbest: NBest, language_scores: Sequence[float]) -> None:
    """One TSV row per hypothesis, in the input's order, under a header."""
    f.write(HEADER_LINE + "\n")
    for hyp, score in zip(nbest.hypotheses, language_scores):
        f.write(f"{hyp.id}\t{hyp.rank}\t{hyp.model_score:.6f}\t{score:.6f}\n")


def read_scores(path, nbest: NBest) -> List[float]:
    """The language scores of a file :func:`write_scores` wrote for ``nbest``."""
    lines = read_text(path).splitlines()
    if not lines or lines[0] != HEADER_LINE:
        raise ElectraUsageError(f"{path} is not a score file of electra-score score (its "
                                f"header is {HEADER_LINE!r})")
    rows = lines[1:]
    if len(rows) != len(nbest.hypotheses):
        raise ElectraUsageError(f"{path} scores {len(rows)} hypotheses, {nbest.path} has "
                                f"{len(nbest.hypotheses)}: score that file")
    scores = []
    for number, (row, hyp) in enumerate(zip(rows, nbest.hypotheses), 2):
        fields = row.split("\t")
        try:
            same = len(fields) == 4 and (int(fields[0]), int(fields[1])) == (hyp.id, hyp.rank)
            scores.append(float(fields[3]))
        except ValueError:
            same = False
        if not same:
            raise ElectraUsageError(f"{path}, line {number}: {row[:60]!r} is not the score of "
                                    f"{nbest.path}'s hypothesis {hyp.rank} of sentence "
                                    f"{hyp.id}: score that file")
    return scores


# ------------------------------------------------------------------------------ re-ranking

def rerank(nbest: NBest, language_scores: Sequence[float],
           weight: float) -> Dict[int, Hypothesis]:
    """{sentence id: its hypothesis of the best model score + weight * language score}; on
    a tie the earlier one (weight 0: the translation model's own choice)."""
    if not nbest.scored_by_a_model:
        raise ElectraUsageError(f"{nbest.path} has no translation scores: re-ranking needs "
                                f"fairseq-generate output (H- lines)")
    best: Dict[int, Tuple[float, Hypothesis]] = {}
    for hyp, language in zip(nbest.hypotheses, language_scores, strict=True):
        total = hyp.model_score + weight * language
        if hyp.id not in best or total > best[hyp.id][0]:
            best[hyp.id] = (total, hyp)
    return {sentence: hyp for sentence, (_, hyp) in best.items()}


def corpus_bleu(nbest: NBest, chosen: Dict[int, Hypothesis]) -> float:
    """sacrebleu's corpus BLEU of the chosen hypotheses against the T- references."""
    sacrebleu = require(BLEU_FEATURE)
    ids = sorted(chosen)
    missing = [i for i in ids if i not in nbest.references]
    if missing:
        raise ElectraUsageError(f"{nbest.path} has no T- reference for sentence {missing[0]} "
                                f"({len(missing)} of {len(ids)} lack one): BLEU needs "
                                f"fairseq-generate's output of a set with references")
    return sacrebleu.corpus_bleu([chosen[i].text for i in ids],
                                 [[nbest.references[i] for i in ids]]).score


def weight_search(nbest: NBest, language_scores: Sequence[float],
                  grid: Sequence[float]) -> Tuple[float, List[Tuple[float, float]]]:
    """-> (the weight of the best corpus BLEU on ``nbest``, [(weight, BLEU)] of the grid in
    ascending order); on a tie the smallest weight, the one nearest the model's choice."""
    if not grid:
        raise ElectraUsageError("the weight grid is empty")
    table = [(w, corpus_bleu(nbest, rerank(nbest, language_scores, w)))
             for w in sorted(set(grid))]
    best = max(table, key=lambda row: row[1])  # the first of equal maxima
    return best[0], table
