"""ELECTRA: a generator (small masked LM) and a discriminator sharing one embedding block.

``ElectraModel.electra_step`` is the whole pre-training step on one screen, masked batch to
losses: generator at the masked positions -> sample -> corrupted input -> discriminator ->
losses (the ``electra`` criterion weights and adds them). ``forward`` runs it, so that DDP
sees a single forward. The variants plug in as two objects: the generator kind
(:mod:`.generators`) and the objective (:mod:`.objectives`); the configuration is
:mod:`.core.config`, the fitting of checkpoints :mod:`.loading`.
"""

import logging
from functools import cached_property
from typing import Optional

import torch
import torch.nn as nn
from fairseq.models import BaseFairseqModel, register_model
from torch.profiler import record_function

from ..optim.layer_decay import tag_parameters
from ..speed import module_walks, pad_to_bucket, sample
from ..user_io.errors import ElectraUsageError
from .bodies import body_named, body_of
from .collapse import warn_if_collapsed
from .core.checkpoint import take_settings
from .core.config import (ARCH_SIZES, CHECKPOINT_VERSION, ElectraConfig,
                          EncoderSize, complete_config, discriminator_size,
                          register_fairseq_arch)
from .core.contract import BatchLayout
from .core.encoder import DisentangledEmbedding
from .core.flops import FlopsCounter
from .core.heads import ElectraClassificationHead, HeadSettings
from .core.run_config import complete_for_model, run_config
from .generators import build_generator_kind
from .loading import (VERSION_KEY, adopt_segment_types, check_fits, check_model_settings,
                      fit_parts)
from .objectives import PretrainingOutput, objective_named

logger = logging.getLogger(__name__)



@register_model("electra", dataclass=ElectraConfig)
class ElectraModel(BaseFairseqModel):
    """Generator + discriminator for pre-training; the discriminator alone for fine-tuning.

    Built by the ``electra`` task it also holds the generator (``generator`` encoder and
    ``generator_head``, or a unigram table) and the heads of its objective
    (``discriminator_head``, ``mlm_head``); built by any other task (``sentence_prediction``,
    ``squad`` ...) it holds only ``discriminator`` and ``classification_heads``, and loading
    a pre-training checkpoint drops the other weights.
    """

    def __init__(self, cfg, dictionary, pretraining: bool):
        super().__init__()
        self.cfg = cfg
        self.padding_idx = dictionary.pad()
        self.separator_idx = dictionary.eos()  # </s> = [SEP]
        self.bos_idx, self.nspecial = dictionary.bos(), dictionary.nspecial
        self.vocab_size = len(dictionary)
        self.objective = objective_named(cfg.get("objective", "electra"))
        # settings the step reads, as plain values (a compiled step does not read configs)
        self.disallow_correct = bool(cfg.get("disallow_correct", False))
        self.read_segment_types()
        # where the step's replacements come from (generators/); None: BERT's mlm keeps <mask>
        self.generator_kind = build_generator_kind(cfg, self.objective) if pretraining else None
        # what the encoders are (bodies/): generator and discriminator are of the same kind
        self.body = body_of(cfg)(cfg, self.vocab_size, self.padding_idx)
        shared = self.make_embeddings()  # the generator's; the discriminator's too unless GDES
        disc_embed = shared
        if self.generator_kind is not None and self.generator_kind.sharing == "gdes":
            # as DeBERTa-v3 only the token embeddings are shared: the discriminator's loss
            # then reaches no generator weight (a fine-tuning model holds the folded table)
            disc_embed = self.make_embeddings(DisentangledEmbedding(shared.word_embeddings))
        self.discriminator = self.make_encoder(disc_embed, discriminator_size(cfg))
        self.classification_heads = nn.ModuleDict()
        self.pretraining = pretraining
        self.generator = self.generator_head = self.generator_baseline = None
        self.discriminator_head = self.mlm_head = self.flops_counter = None
        if pretraining:
            self.flops_counter = FlopsCounter()  # training FLOPs seen; see flops.py
            self.objective.build_heads(self, disc_embed.word_embeddings)
            if self.generator_kind is not None:
                self.generator_kind.build(self, dictionary, shared)
            # the checkpoint format, for future renames to branch on (see config.py)
            self.register_buffer(VERSION_KEY, torch.tensor(CHECKPOINT_VERSION))
        self.apply(init_bert_params)
        self.tag_parameters()

    def make_embeddings(self, word_embeddings=None) -> nn.Module:
        """An embedding block of the model's body (``word_embeddings``: that token table)."""
        return self.body.embeddings(word_embeddings)

    def make_encoder(self, embeddings, size: EncoderSize, generator: bool = False) -> nn.Module:
        """An encoder of the model's body over ``embeddings`` (``generator``: the masked-LM
        generator's)."""
        return self.body.encoder(embeddings, size, generator)

    def fresh_discriminator(self) -> nn.Module:
        """A randomly initialised discriminator of this model's size (the collapse check's
        reference)."""
        return self.make_encoder(self.make_embeddings(), self._disc_size).apply(
            init_bert_params)

    def tag_parameters(self):
        """Depth tags for ``--optimizer electra_adam`` (layer-wise lr decay), from the
        discriminator's :meth:`~.core.contract.Encoder.layers` and what it reads below them."""
        layers = self.discriminator.layers()
        depths = {id(p): i + 1 for i, layer in enumerate(layers) for p in layer.parameters()}
        depths.update({id(p): 0 for module in self.discriminator.below_layers()
                       for p in module.parameters()})
        tag_parameters(self.named_parameters(), len(layers), lambda _, p: depths.get(id(p)))

    @classmethod
    def build_model(cls, cfg, task):
        run = run_config(cfg)  # None for a config of the model alone (hub, tests)
        cfg = complete_config(cfg)
        objective_named(cfg.objective).check(cfg)
        if run is not None:  # the run's precision and DDP settings (run_config.py)
            complete_for_model(run)
        for option in ("tokens_per_sample", "max_positions", "max_seq_len"):
            length = getattr(getattr(task, "cfg", None), option, None)
            if length is not None and length > cfg.max_positions:
                raise ElectraUsageError(
                    f"the task's --{option.replace('_', '-')} {length} is larger than the "
                    f"model's {cfg.max_positions} positions; lower it (sequences are cut with "
                    f"--shorten-method truncate) or use a model with more positions")
        pretraining = getattr(task, "builds_pretraining_model", False)
        if pretraining and getattr(task.cfg, "sample_break_mode", None) == "segment_pairs" \
                and body_named(cfg.encoder_body).token_types \
                and not (cfg.segment_token_types and cfg.type_vocab_size > 1):
            raise ElectraUsageError(
                "--sample-break-mode segment_pairs gives the second segment token type 1: add "
                "--segment-token-types (with --type-vocab-size 2), or use --sample-break-mode "
                "none to pack text without segments")
        model = cls(cfg, task.source_dictionary, pretraining=pretraining)
        if run is not None and model.generator_kind is not None:
            model.generator_kind.complete_run(run)
        return model

    def train(self, mode=True):
        return module_walks.train(self, mode, super().train)

    def set_num_updates(self, num_updates):
        module_walks.set_num_updates(self, num_updates, super().set_num_updates)
        if self.generator_kind is not None:
            self.generator_kind.set_num_updates(self, num_updates)

    def resting_parameters(self):
        """Parameters the current update must not move although they require a gradient
        (two_stage training's other part); the task drops their gradients."""
        return [] if self.generator_kind is None else \
            self.generator_kind.resting_parameters(self)

    def forward(self, src_tokens, target=None, features_only=False, return_all_hiddens=False,
                classification_head_name=None, token_types=None, masked_positions=None,
                masked_weights=None, has_padding=None, **kwargs):
        """Replaced token detection when ``target`` is given, else the discriminator.

        src_tokens: B x T. With ``target`` (B x T: the original token at masked positions,
        padding elsewhere; the ``electra`` task's batch) runs :meth:`electra_step` inside this
        one forward, as DDP needs.
        Otherwise returns ``(x, {"inner_states": [...]})`` like fairseq's RoBERTa: x is
        B x T x H features (``features_only``), B x C logits of a classification head, or
        B x T replaced-token logits (pre-training model only).
        Without ``token_types`` every token has type 0, or with ``--segment-token-types``
        BERT's segments (1 after the first ``</s>``, see :func:`segment_ids`).
        ``masked_positions``, ``masked_weights`` and ``has_padding``: what the ``electra``
        task's collater knows of the batch on the host (see :meth:`electra_step`).
        """
        if target is not None:
            if self.generator_kind is not None:
                self.generator_kind.before_step(self)
            return self.electra_step(src_tokens, target, masked_positions, masked_weights,
                                     has_padding)
        if token_types is None:
            token_types = self.segments(src_tokens)
        length = src_tokens.size(1)
        tokens, types, padded = pad_to_bucket(src_tokens, token_types, self.padding_idx,
                                              self.cfg.max_positions, self.cfg.length_buckets)
        x, states = self.discriminator(tokens, types, return_all_hiddens=return_all_hiddens,
                                       has_padding=padded)
        x, states = x[:, :length], [state[:, :length] for state in states]
        if classification_head_name is not None:
            if classification_head_name not in self.classification_heads:
                raise ElectraUsageError(
                    f"no classification head named '{classification_head_name}'; this model "
                    f"has {sorted(self.classification_heads) or 'none'}")
            head = self.classification_heads[classification_head_name]
            # every head takes what any head reads; each uses its own (heads.py)
            x = head(x, padding_mask=src_tokens.eq(self.padding_idx), token_types=token_types,
                     **kwargs)
        elif not features_only:
            if self.discriminator_head is None:
                raise ElectraUsageError(
                    "this model has no replaced-token head (it was built for fine-tuning, or "
                    f"pre-trained with --objective {self.objective.name}); load an electra "
                    f"pre-training checkpoint with the electra task")
            x = self.discriminator_head(x)
        return x, {"inner_states": states}

    def electra_step(self, src_tokens, target, masked_positions=None, masked_weights=None,
                     has_padding: Optional[bool] = None) -> PretrainingOutput:
        """One pre-training step, top to bottom as the paper's section 2 tells it.

        src_tokens, target: B x T, the ``electra`` task's batch: its dataset has already
        masked the input (:mod:`electra_plugin.data.masking`), target holds the original token
        at the picked positions and padding elsewhere. ``masked_positions`` (M flat indices
        into B x T: a fixed number of slots per row) with ``masked_weights`` (M: 1 at a picked
        position, 0 at a padding slot), and ``has_padding``, which the task's collater gives,
        keep every shape independent of how many tokens were picked and spare the host-device
        syncs of finding them here (without them: M = the picked positions, a sync). The
        comments say what the default
        (``--objective electra``, ``--generator masked_lm``) does; the variants plug in as
        ``self.generator_kind`` and ``self.objective``. Returns both losses; the
        ``electra`` criterion weights and adds them. The parts run under profiler labels
        (``electra:generator`` ...), which the benchmark's breakdown reads.
        """
        generator = self.generator_kind  # None: BERT's mlm keeps <mask>
        padding_mask = src_tokens.eq(self.padding_idx)
        layout = BatchLayout(padding_mask, has_padding)  # the batch's, for both encoders
        # 1. mask: the positions the dataset picked (--mask-prob, <mask> or kept as it says)
        masked = target.ne(self.padding_idx)
        positions, weights = masked_positions, masked_weights  # M slots, M weights
        if positions is None:  # found here: a sync, M is a shape
            positions = masked.flatten().nonzero().squeeze(1)
        if weights is None:  # every position given is a picked one
            weights = torch.ones(len(positions), device=positions.device)
        real = weights.bool()
        masked_targets = target.flatten()[positions]
        original = torch.where(masked, target, src_tokens)
        # segments from the masked input: a sampled </s> must not start a new one
        token_types = self.segments(src_tokens)
        logs = {"masked": weights.sum()}
        corrupted, gen_log_probs, baseline, noise_log_probs = src_tokens, None, None, None
        if generator is not None:
            # 2. generator: M x V log-probabilities, a small masked LM's at the masked positions
            with stage("generator"):
                if generator.cloze:  # Electric: q at every token, from the original tokens
                    noise_log_probs, baseline = generator.propose(self, original, layout,
                                                                  None, token_types)
                    gen_log_probs = noise_log_probs.flatten(0, 1)[positions]
                else:
                    gen_log_probs, baseline = generator.propose(self, src_tokens, layout,
                                                                positions, token_types)
            with stage("sample"):
                # 3. sample, without gradient: the discriminator's loss never reaches the
                #    generator (--disallow-correct: never the original token)
                disallowed = masked_targets if self.disallow_correct else None
                sampled = self.sample(gen_log_probs.detach(), generator.sampling_temperature(),
                                      disallowed)
                logs["sampled_correct"] = ((sampled == masked_targets) & real).sum()  # official
                # 4. corrupt: the samples replace the masked tokens (a padding slot writes
                #    back the token it points at)
                sampled = torch.where(real, sampled, src_tokens.flatten()[positions])
                corrupted = src_tokens.flatten().index_put((positions,), sampled).view_as(
                    src_tokens)
        # labels: replaced where the input differs (a sample equal to the original is original)
        replaced = corrupted.ne(original)
        main = copy = hidden = None
        if generator is None or generator.runs_discriminator(self):
            # 5. discriminator: one replaced/original logit per token (discriminator_head)
            with stage("discriminator"):
                hidden, _ = self.discriminator.encode(corrupted, layout, token_types)
                main, copy = self.objective.predict(self, hidden, positions)
        step = dict(
            generator_log_probs=gen_log_probs, baseline_logits=baseline,
            masked_targets=masked_targets, positions=positions, masked_weights=weights,
            corrupted=corrupted,
            original=original, replaced=replaced, padding_mask=padding_mask,
            main=main, copy=copy, disc_hidden=hidden, noise_log_probs=noise_log_probs)
        out = PretrainingOutput(**step)
        # 6. losses: BCE averaged over the non-pad tokens, and the generator's cross-entropy
        #    averaged over the masked positions
        main_loss = gen_loss = per_token = None
        with stage("losses"):
            if main is not None:
                main_loss, per_token, counts = self.objective.main_loss(out)
                logs.update({self.objective.loss_name: main_loss.detach(), **counts})
            if generator is not None:
                gen_loss, gen_logs = generator.loss(self, out, per_token)
                logs.update(gen_logs)
        # built anew, not by _replace: torch 2.11's compiler cannot return a tuple that
        # _replace made inside the graph
        return PretrainingOutput(**step, main_loss=main_loss, generator_loss=gen_loss, logs=logs)

    def read_segment_types(self):
        """Whether pairs get BERT's segment types (--segment-token-types, or what a loaded
        checkpoint was trained with)."""
        self.segment_types = bool(self.cfg.get("segment_token_types", None)) and \
            self.cfg.type_vocab_size > 1

    def segments(self, tokens):
        """B x T token types of ``[CLS] A [SEP] B [SEP]`` with --segment-token-types, else
        None (type 0 throughout, with no work)."""
        if self.segment_types:
            return segment_ids(tokens, self.separator_idx, self.padding_idx)
        return None

    def train_flops(self, length: int, sequences: int, predicted: int) -> float:
        """Training FLOPs of one batch as the paper counts them: forward + backward (equal, as
        the paper) of what learns, forward of what only samples."""
        disc, vocab, positions = self._disc_size, self.vocab_size, length * sequences
        flops = 0.0
        generator = self.generator_kind
        if generator is None or generator.runs_discriminator(self):
            flops = 2 * (self.body.paper_encoder_flops(disc, vocab, length, positions)
                         + self.objective.paper_head_flops(disc, vocab, positions, predicted))
        if generator is not None:
            flops += generator.paper_flops(self, vocab, length, positions, predicted)
        return flops

    @cached_property
    def _disc_size(self) -> EncoderSize:
        return discriminator_size(self.cfg)  # the config does not change

    @staticmethod
    def sample(logits, temperature, disallowed=None):
        """One token per row of M x V logits from ``softmax(logits / T)``
        (:func:`~electra_plugin.speed.sampling.sample`). ``temperature``: a 0-d tensor
        (positive, see ``GeneratorKind.sampling_temperature``) divides like a number."""
        return sample(logits, temperature, disallowed)

    def register_classification_head(self, name, num_classes=None, inner_dim=None, **kwargs):
        """Adds (or replaces) a sentence-level head on the first token, as RoBERTa does."""
        if name in self.classification_heads:
            old = self.classification_heads[name]
            if old.out_proj.out_features != num_classes:
                logger.warning(f"re-registering head '{name}' with {num_classes} classes "
                               f"(was {old.out_proj.out_features})")
        head = ElectraClassificationHead(self.cfg.hidden_size, inner_dim or self.cfg.hidden_size,
                                         num_classes, self.cfg.dropout,
                                         self.cfg.get("classifier_pooling", "first"),
                                         self.body.head_transform())
        self.add_head(name, head)

    def head_settings(self) -> HeadSettings:
        """What a task head is built from (a fine-tuning kind's task builds its own)."""
        return HeadSettings(self.cfg.hidden_size, self.cfg.dropout, self.body.head_transform())

    def add_head(self, name, head):
        """A new task head, initialised: N(0, 0.02) and zero biases (HF's), the layers the
        official fine-tuning code gives Glorot-uniform kernels (a head's ``glorot``, by
        default its output layer) Glorot-uniform, unless ``--classifier-init normal``."""
        head.apply(init_bert_params)
        if self.cfg.get("classifier_init", "glorot") == "glorot":
            for layer in getattr(head, "glorot", ("out_proj",)):
                if getattr(head, layer, None) is not None:
                    nn.init.xavier_uniform_(getattr(head, layer).weight)
        self.classification_heads[name] = head
        self.tag_parameters()

    def max_positions(self):
        return self.cfg.max_positions

    @classmethod
    def from_pretrained(cls, model_dir, checkpoint_file="checkpoint_best.pt",
                        data_name_or_path=".", **overrides):
        """An :class:`ElectraHubInterface` (encode, predict, replaced_token_scores ...)."""
        from .hub_interface import from_pretrained

        return from_pretrained(model_dir, checkpoint_file, data_name_or_path, **overrides)

    def upgrade_state_dict_named(self, state_dict, name):
        """Fit a checkpoint's optional parts to this model (see :func:`.loading.fit_parts`)."""
        super().upgrade_state_dict_named(state_dict, name)
        fit_parts(self, state_dict, name + "." if name else "")

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """Reject a checkpoint of another model with one line instead of fairseq's wrapper."""
        path, saved = take_settings(state_dict)  # the checkpoint's settings, out of the weights
        check_model_settings(self, state_dict, path, saved)  # names the settings that differ
        adopt_segment_types(self, saved, model_cfg)
        self.read_segment_types()
        pretrained_start = not self.pretraining and any(
            k.startswith(("generator", "discriminator_head")) for k in state_dict)
        self.upgrade_state_dict(state_dict)
        check_fits(self, state_dict, strict)
        result = super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg,
                                         args=args)
        if self.generator_kind is not None:
            self.generator_kind.loaded(self)
        if pretrained_start:  # a fine-tuning that starts from a pre-training checkpoint
            warn_if_collapsed(self, f"fine-tuning from {path or 'a pre-training checkpoint'}",
                              "it will fine-tune no better than a random initialisation: "
                              "pre-train it again (a lower --lr, a longer warm-up, more "
                              "updates) or fine-tune from random initialisation")
        return result


def stage(name: str):
    """A profiler label for a part of the pre-training step (free without a profiler)."""
    return record_function(f"electra:{name}")


def segment_ids(tokens, separator_idx, padding_idx):
    """B x T token types as BERT gives them to ``[CLS] A [SEP] B [SEP]``: 0 up to and
    including the first separator after the first token, 1 for the real tokens after it.

    Single sentences (``<s> A </s>`` and padding) stay all 0. No host sync.
    """
    separators = tokens.eq(separator_idx)
    separators[:, 0] = False
    after_first = (separators.cumsum(1) - separators.long()) > 0
    return (after_first & tokens.ne(padding_idx)).long()


def init_bert_params(module):
    """BERT initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        module.weight.data.normal_(mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        module.bias.data.zero_()
    if isinstance(module, nn.Embedding) and module.padding_idx is not None:
        module.weight.data[module.padding_idx].zero_()


for _name in ARCH_SIZES:  # the archs named before the model was registered
    register_fairseq_arch(_name)
