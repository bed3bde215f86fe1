"""ELECTRA: a generator (small masked LM) and a discriminator sharing one embedding block.

``ElectraModel.electra_step`` is the whole pre-training step on one screen, masked batch to
loss: generator at the masked positions -> sample -> corrupted input -> discriminator ->
loss. ``forward`` runs it, so that DDP sees a single forward. The ablations plug in from
:mod:`electra_plugin.generators` and :mod:`electra_plugin.objectives`.
"""

import logging
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

import torch
import torch.nn as nn
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import BaseFairseqModel, register_model, register_model_architecture
from omegaconf import OmegaConf, open_dict

from ..errors import ElectraUsageError
from ..flops import EncoderSize, FlopsCounter, paper_train_flops
from ..generators import UnigramTable, build_generator
from ..objectives import OBJECTIVES, PretrainingOutput
from ..optim.layer_decay import tag_parameters
from ..run_config import complete_for_model
from .checkpoint_settings import check_model_settings, vocabulary_error
from .encoder import DisentangledEmbedding, ElectraEmbeddings, ElectraEncoder, attention_mask
from .heads import ClassificationHead, DiscriminatorHead, GeneratorHead

logger = logging.getLogger(__name__)

# The official sizes (google-research/electra configure_pretraining.py), in one place.
# generator_size is the generator's hidden size as a fraction of the discriminator's;
# the generator keeps the depth and head size, its FFN scales with its hidden size.
ARCH_SIZES = {
    "electra_tiny": dict(num_layers=4, hidden_size=128, num_heads=4, ffn_size=512,
                         embedding_size=64, generator_size=0.25),
    "electra_small": dict(num_layers=12, hidden_size=256, num_heads=4, ffn_size=1024,
                          embedding_size=128, generator_size=0.25),
    "electra_base": dict(num_layers=12, hidden_size=768, num_heads=12, ffn_size=3072,
                         embedding_size=768, generator_size=1 / 3),
    "electra_large": dict(num_layers=24, hidden_size=1024, num_heads=16, ffn_size=4096,
                          embedding_size=1024, generator_size=0.25),
}
SIZE_FIELDS = tuple(ARCH_SIZES["electra_small"])
# What a fine-tuning model keeps of a pre-training checkpoint; everything else (generator,
# pre-training heads, FLOPs counter) exists only for pre-training.
FINETUNING_PARTS = ("discriminator.", "classification_heads.")
# The discriminator's residual on the generator's token embeddings (--embedding-sharing gdes).
GDES_DELTA = "discriminator.embeddings.word_embeddings.delta"
OBJECTIVE_CHOICES = ChoiceEnum(list(OBJECTIVES))
GENERATOR_CHOICES = ChoiceEnum(["masked_lm", "unigram"])
GENERATOR_TRAINING_CHOICES = ChoiceEnum(["mle", "adversarial"])
POOLING_CHOICES = ChoiceEnum(["first", "mean"])
EMBEDDING_SHARING_CHOICES = ChoiceEnum(["shared", "gdes"])


@dataclass
class ElectraConfig(FairseqDataclass):
    # Size fields default to None: the --arch (or model._name) fills the ones left unset.
    num_layers: Optional[int] = field(
        default=None, metadata={"help": "discriminator Transformer layers (the generator's "
                                        "too unless --generator-layers)"})
    hidden_size: Optional[int] = field(
        default=None, metadata={"help": "discriminator hidden size"})
    num_heads: Optional[int] = field(
        default=None, metadata={"help": "discriminator attention heads"})
    ffn_size: Optional[int] = field(
        default=None, metadata={"help": "discriminator feed-forward inner size"})
    embedding_size: Optional[int] = field(
        default=None, metadata={"help": "token embedding size; projected to the hidden size "
                                        "when different (ELECTRA-Small: 128 -> 256)"})
    generator_size: Optional[float] = field(
        default=None, metadata={"help": "generator hidden size as a fraction of the "
                                        "discriminator's (official: 1/4 small and large, 1/3 "
                                        "base); must give whole attention heads"})
    generator_layers: Optional[float] = field(
        default=None, metadata={"help": "generator depth as a fraction of the discriminator's "
                                        "layers (official generator_layers); must give a "
                                        "whole number of layers; unset: the same depth"})
    max_positions: int = field(
        default=512, metadata={"help": "number of learned position embeddings"})
    type_vocab_size: int = field(
        default=2, metadata={"help": "token type (segment) embeddings; 0 disables them"})
    dropout: float = field(default=0.1, metadata={"help": "dropout probability"})
    attention_dropout: float = field(
        default=0.1, metadata={"help": "dropout probability on attention weights"})
    untie_embeddings: bool = field(
        default=False, metadata={"help": "give the generator its own embedding block instead "
                                         "of sharing the discriminator's"})
    embedding_sharing: EMBEDDING_SHARING_CHOICES = field(
        default="shared", metadata={"help": "shared: one embedding block for generator and "
                                            "discriminator; gdes: gradient-disentangled "
                                            "sharing (DeBERTa-v3): the discriminator reads the "
                                            "generator's token embeddings without their "
                                            "gradient plus a zero-initialised residual of its "
                                            "own, and has its own position/type embeddings and "
                                            "LayerNorm"})
    temperature: float = field(
        default=1.0, metadata={"help": "generator sampling temperature; 0 takes the argmax "
                                       "(deterministic, for debugging)"})
    objective: OBJECTIVE_CHOICES = field(
        default="electra", metadata={"help": "pre-training objective: electra (replaced token "
                                             "detection on every token), electra_15 (only at "
                                             "the masked positions), replace_mlm (MLM on "
                                             "generator samples instead of <mask>), "
                                             "all_tokens_mlm (replace_mlm predicting every "
                                             "token, with a copy mechanism), mlm (BERT: no "
                                             "generator)"})
    generator: GENERATOR_CHOICES = field(
        default="masked_lm", metadata={"help": "masked_lm: a small Transformer masked LM "
                                               "trained with the discriminator; unigram: "
                                               "samples from the unigram distribution of "
                                               "dict.txt's counts (no network)"})
    tie_generator: bool = field(
        default=False, metadata={"help": "the generator shares every weight of the "
                                         "discriminator (needs --generator-size 1.0)"})
    generator_training: GENERATOR_TRAINING_CHOICES = field(
        default="mle", metadata={"help": "mle: maximum likelihood (official); adversarial: "
                                         "REINFORCE on the discriminator's loss with a "
                                         "learned baseline (the paper's Appendix F)"})
    two_stage_updates: int = field(
        default=0, metadata={"help": "two-stage training: the generator alone for this many "
                                     "updates, then the discriminator, initialised from the "
                                     "generator, with the generator frozen (needs "
                                     "--generator-size 1.0; implies --untie-embeddings); "
                                     "0: joint training"})
    classifier_pooling: POOLING_CHOICES = field(
        default="first", metadata={"help": "what sentence-level classification heads read: "
                                           "first: the <s> token's features (HF, official); "
                                           "mean: the mean over the non-pad tokens (the "
                                           "small-compute fine-tuning recipe; not exportable "
                                           "to HF's classifier)"})
    load_checkpoint_heads: bool = field(
        default=False, metadata={"help": "keep the classification heads a checkpoint has "
                                         "(for evaluation and the hub interface)"})
    segment_token_types: bool = field(
        default=False, metadata={"help": "the encoder was pre-trained with token type 1 on "
                                         "the second segment (HF/official checkpoints; set "
                                         "by the HF import): inputs given without token "
                                         "types get type 1 after the first </s>, as BERT's "
                                         "[CLS] A [SEP] B [SEP]. Off: type 0 throughout, as "
                                         "in the plugin's own pre-training. Fine-tuning an "
                                         "imported checkpoint with --restore-file or "
                                         "--finetune-from-model needs it on the command line"})


def complete_config(cfg):
    """Fill unset size fields from the architecture and check that they fit together.

    Runs whatever path built ``cfg`` (CLI --arch, hydra model._name, a checkpoint), so the
    result never depends on whether fairseq merged dataclass defaults before or after the
    arch function.
    """
    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.create(vars(cfg))
    arch = cfg.get("arch", None) or cfg.get("_name", None)
    with open_dict(cfg):
        full = OmegaConf.merge(OmegaConf.structured(ElectraConfig), {
            k: v for k, v in cfg.items() if k in ElectraConfig.__dataclass_fields__})
        for k, v in full.items():
            cfg[k] = v
        for k, v in ARCH_SIZES.get(arch, {}).items():
            if cfg[k] is None:
                cfg[k] = v
        missing = [k for k in SIZE_FIELDS if cfg[k] is None]
        if missing:
            raise ElectraUsageError(
                f"model size is not set ({', '.join(missing)}); pick --arch "
                f"{'|'.join(ARCH_SIZES)} or give --{missing[0].replace('_', '-')}")
        if cfg.get("two_stage_updates", 0) and not cfg.untie_embeddings:
            # the second stage trains the discriminator's embeddings; shared ones would move
            # the frozen generator's sampling distribution with them
            cfg.untie_embeddings = True
            logger.info("--two-stage-updates: the generator gets its own embeddings "
                        "(--untie-embeddings), so that it stays frozen in the second stage")
    generator_sizes(cfg)
    generator_depth(cfg)
    check_generator_options(cfg)
    return cfg


def check_generator_options(cfg):
    """Combinations of objective and generator options that cannot work, as one line."""

    def fail(problem, fix):
        raise ElectraUsageError(f"{problem}; {fix}")

    network = cfg.generator == "masked_lm"
    if cfg.get("embedding_sharing", "shared") == "gdes":
        conflicts = [option for option, given in (
            ("--objective mlm", cfg.objective == "mlm"), ("--generator unigram", not network),
            ("--tie-generator", cfg.tie_generator),
            ("--two-stage-updates", cfg.two_stage_updates),  # before the untie it implies
            ("--untie-embeddings", cfg.untie_embeddings)) if given]
        if conflicts:
            fail(f"--embedding-sharing gdes shares the token embeddings of a masked_lm "
                 f"generator trained with the discriminator, which {conflicts[0]} rules out",
                 f"drop {conflicts[0]} or --embedding-sharing gdes")
    layers_given = cfg.get("generator_layers", None) is not None
    if cfg.objective == "mlm" and (not network or cfg.tie_generator or cfg.two_stage_updates
                                   or layers_given or cfg.generator_training != "mle"):
        fail("--objective mlm has no generator, so the generator options do not apply",
             "drop them or pick another --objective")
    if not network and (cfg.tie_generator or cfg.two_stage_updates or layers_given
                        or cfg.generator_training != "mle"):
        fail("--generator unigram has no network to tie, shape, train adversarially or train "
             "in two stages", "use --generator masked_lm")
    depth = generator_depth(cfg)
    if depth != cfg.num_layers and (cfg.tie_generator or cfg.two_stage_updates):
        option = "--tie-generator" if cfg.tie_generator else "--two-stage-updates"
        fail(f"{option} needs the generator at the discriminator's depth, but "
             f"--generator-layers {cfg.generator_layers:g} gives it {depth} of "
             f"{cfg.num_layers} layers", "drop --generator-layers or set it to 1.0")
    whole = math.isclose(cfg.generator_size, 1.0)
    if cfg.tie_generator and (not whole or cfg.untie_embeddings or cfg.two_stage_updates):
        fail("--tie-generator shares every weight, so the generator must be the "
             "discriminator's size with the same embeddings and no second stage",
             "set --generator-size 1.0 without --untie-embeddings/--two-stage-updates")
    if cfg.two_stage_updates and not whole:
        fail(f"--two-stage-updates initialises the discriminator from the generator, which "
             f"needs the same size (--generator-size is {cfg.generator_size:g})",
             "set --generator-size 1.0")
    if cfg.generator_training == "adversarial" and cfg.two_stage_updates:
        fail("--generator-training adversarial rewards the generator with the "
             "discriminator's loss, which the first of --two-stage-updates' stages does not "
             "compute", "drop one of the two options")
    if (cfg.generator_training == "adversarial" or cfg.two_stage_updates) and \
            not OBJECTIVES[cfg.objective].binary:
        fail(f"adversarial and two-stage generators are defined for replaced token detection, "
             f"not --objective {cfg.objective}", "use --objective electra or electra_15")


def generator_sizes(cfg):
    """(hidden, heads, ffn) of the generator; raises when the fraction breaks a head."""
    if cfg.hidden_size % cfg.num_heads:
        raise ElectraUsageError(
            f"hidden size {cfg.hidden_size} is not divisible by {cfg.num_heads} heads")
    head_dim = cfg.hidden_size // cfg.num_heads
    hidden = cfg.hidden_size * cfg.generator_size
    heads = hidden / head_dim
    if not 0 < cfg.generator_size <= 1 or not math.isclose(heads, round(heads), abs_tol=1e-4) \
            or round(heads) == 0:
        raise ElectraUsageError(
            f"--generator-size {cfg.generator_size:g} gives a generator hidden size of "
            f"{hidden:g}, which is not a whole number of {head_dim}-dim attention heads; use a "
            f"fraction in (0, 1] that is a multiple of {head_dim}/{cfg.hidden_size}")
    heads = round(heads)
    return heads * head_dim, heads, cfg.ffn_size * heads // cfg.num_heads


def generator_depth(cfg) -> int:
    """Layers of the generator; raises when the fraction does not give whole layers."""
    fraction = cfg.get("generator_layers", None)
    if fraction is None:
        return cfg.num_layers
    layers = cfg.num_layers * fraction
    if not 0 < fraction <= 1 or not math.isclose(layers, round(layers), abs_tol=1e-4) \
            or round(layers) == 0:
        raise ElectraUsageError(
            f"--generator-layers {fraction:g} of the discriminator's {cfg.num_layers} layers "
            f"gives the generator {layers:g}, not a whole number from 1 to {cfg.num_layers}; "
            f"use a multiple of 1/{cfg.num_layers} in (0, 1]")
    return round(layers)


def model_sizes(cfg):
    """(discriminator, generator) :class:`~electra_plugin.flops.EncoderSize` of a completed
    ELECTRA model config, what the FLOPs counts need."""
    gen_hidden, gen_heads, gen_ffn = generator_sizes(cfg)
    disc = EncoderSize(cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.ffn_size,
                       cfg.embedding_size)
    return disc, EncoderSize(generator_depth(cfg), gen_hidden, gen_heads, gen_ffn,
                             cfg.embedding_size)


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
        vocab = len(dictionary)

        def embeddings(word_embeddings=None):
            return ElectraEmbeddings(vocab, cfg.embedding_size, cfg.max_positions,
                                     cfg.type_vocab_size, self.padding_idx, cfg.dropout,
                                     word_embeddings)

        def encoder(embed, layers, hidden, heads, ffn):
            return ElectraEncoder(embed, cfg.embedding_size, hidden, layers, heads, ffn,
                                  cfg.dropout, cfg.attention_dropout, self.padding_idx)

        shared = embeddings()  # the generator's; the discriminator's too unless GDES
        disc_embed = shared
        if pretraining and cfg.get("embedding_sharing", "shared") == "gdes":
            # as DeBERTa-v3 only the token embeddings are shared: the discriminator's loss
            # then reaches no generator weight (a fine-tuning model holds the folded table)
            disc_embed = embeddings(DisentangledEmbedding(shared.word_embeddings))
        self.discriminator = encoder(disc_embed, cfg.num_layers, cfg.hidden_size,
                                     cfg.num_heads, cfg.ffn_size)
        self.classification_heads = nn.ModuleDict()
        self.pretraining = pretraining
        self.objective = OBJECTIVES[cfg.get("objective", "electra")]
        self.generator = self.generator_head = self.generator_baseline = None
        self.discriminator_head = self.mlm_head = self.flops_counter = None
        self.generator_variant = None  # where the step's replacements come from (generators.py)
        self._known_stage = None  # two-stage training's stage, see _stage
        if pretraining:
            self.flops_counter = FlopsCounter()  # training FLOPs seen; see flops.py
            self.generator_variant = build_generator(cfg)
            if "discriminator_head" in self.objective.heads:
                self.discriminator_head = DiscriminatorHead(cfg.hidden_size)
            if "mlm_head" in self.objective.heads:
                self.mlm_head = GeneratorHead(cfg.hidden_size, cfg.embedding_size,
                                              disc_embed.word_embeddings)
            if self.objective.corrupts:
                self._build_generator(cfg, dictionary, shared, embeddings, encoder)
        self.apply(init_bert_params)
        self.tag_parameters()

    def _build_generator(self, cfg, dictionary, shared, embeddings, encoder):
        if cfg.generator == "unigram":
            self.unigram = UnigramTable(dictionary, dictionary.index("<mask>"))
            return
        gen_hidden, gen_heads, gen_ffn = generator_sizes(cfg)
        if cfg.tie_generator:
            self.generator = self.discriminator
        else:
            gen_embed = embeddings() if cfg.untie_embeddings else shared
            self.generator = encoder(gen_embed, generator_depth(cfg), gen_hidden, gen_heads,
                                     gen_ffn)
        self.generator_head = GeneratorHead(gen_hidden, cfg.embedding_size,
                                            self.generator.embeddings.word_embeddings)
        if cfg.generator_training == "adversarial":
            self.generator_baseline = nn.Linear(gen_hidden, 1)
        if cfg.two_stage_updates:
            # saved with checkpoints, so a resumed run knows the discriminator was initialised
            self.register_buffer("second_stage", torch.zeros((), dtype=torch.bool))

    def tag_parameters(self):
        """Depth tags for ``--optimizer electra_adam`` (layer-wise lr decay)."""

        def layer_of(name):
            if name.startswith("discriminator.embeddings"):
                return 0
            if name.startswith("discriminator.encoder.layer."):
                return int(name.split(".")[3]) + 1
            return None

        tag_parameters(self.named_parameters(), self.cfg.num_layers, layer_of)

    @classmethod
    def build_model(cls, cfg, task):
        complete_for_model(cfg)  # the run's precision and DDP settings (run_config.py)
        cfg = complete_config(cfg)
        for option in ("tokens_per_sample", "max_positions", "max_seq_len"):
            length = getattr(getattr(task, "cfg", None), option, None)
            if length is not None and length > cfg.max_positions:
                raise ElectraUsageError(
                    f"the task's --{option.replace('_', '-')} {length} is larger than the "
                    f"model's {cfg.max_positions} positions; lower it (sequences are cut with "
                    f"--shorten-method truncate) or use a model with more positions")
        pretraining = getattr(task, "builds_pretraining_model", False)
        return cls(cfg, task.source_dictionary, pretraining=pretraining)

    @property
    def generator_alone(self) -> bool:
        """First stage of two-stage training: only the generator runs and learns."""
        return self._stage() == 1

    @property
    def generator_frozen(self) -> bool:
        """Second stage of two-stage training: the generator only samples."""
        return self._stage() == 2

    def _stage(self) -> int:
        """Two-stage training's stage (1 or 2), 0 without it. The ``second_stage`` flag is
        read from the device once after each load, not at every step (a host sync)."""
        if not self.cfg.get("two_stage_updates", 0) or self.generator is None:
            return 0
        if self._known_stage is None:
            self._known_stage = 2 if bool(self.second_stage) else 1
        return self._known_stage

    def set_num_updates(self, num_updates):
        """Two-stage training: at the switch, initialise the discriminator from the generator."""
        super().set_num_updates(num_updates)
        if self._stage() == 1 and num_updates >= self.cfg.two_stage_updates:
            self.discriminator.load_state_dict(self.generator.state_dict())
            self.second_stage.fill_(True)
            self._known_stage = 2
            logger.info(f"update {num_updates}: discriminator initialised from the generator, "
                        f"which is frozen from now on")

    def resting_parameters(self):
        """The parameters the current stage of two-stage training does not train (none
        otherwise). The task drops their gradients before each update: the step gives them
        none, but fairseq's legacy DDP fills in zeros, and Adam would then move them anyway
        (weight decay, momentum). requires_grad stays on: fairseq builds its optimizer from
        the parameters that require gradients, and a resumed run must find the same ones.
        """
        stage = self._stage()
        parts = {1: (self.discriminator, self.discriminator_head),
                 2: (self.generator, self.generator_head)}.get(stage, ())
        return [p for part in parts for p in part.parameters()]

    def forward(self, src_tokens, target=None, features_only=False, return_all_hiddens=False,
                classification_head_name=None, token_types=None, disc_weight=None,
                masked_positions=None, has_padding=None, **kwargs):
        """Replaced token detection when ``target`` is given, else the discriminator.

        src_tokens: B x T. With ``target`` (B x T: the original token at masked positions,
        padding elsewhere; the ``electra`` task's batch) runs :meth:`electra_step` (the
        ``electra`` criterion passes ``disc_weight``) inside this one forward, as DDP needs.
        Otherwise returns ``(x, {"inner_states": [...]})`` like fairseq's RoBERTa: x is
        B x T x H features (``features_only``), B x C logits of a classification head, or
        B x T replaced-token logits (pre-training model only).
        Without ``token_types`` every token has type 0, or with ``--segment-token-types``
        BERT's segments (1 after the first ``</s>``, see :func:`segment_ids`).
        ``masked_positions`` and ``has_padding``: what the ``electra`` task's collater knows
        of the batch on the host (see :meth:`electra_step`).
        """
        if target is not None:
            return self.electra_step(src_tokens, target, disc_weight, masked_positions,
                                     has_padding)
        if token_types is None and self.cfg.get("segment_token_types", False) and \
                self.cfg.type_vocab_size > 1:
            token_types = segment_ids(src_tokens, self.separator_idx, self.padding_idx)
        x, states = self.discriminator(src_tokens, token_types,
                                       return_all_hiddens=return_all_hiddens)
        if classification_head_name is not None:
            if classification_head_name not in self.classification_heads:
                raise ElectraUsageError(
                    f"no classification head named '{classification_head_name}'; this model "
                    f"has {sorted(self.classification_heads) or 'none'}")
            head = self.classification_heads[classification_head_name]
            x = head(x, src_tokens.eq(self.padding_idx)) \
                if isinstance(head, ClassificationHead) else head(x)
        elif not features_only:
            if self.discriminator_head is None:
                raise ElectraUsageError(
                    "this model has no replaced-token head (it was built for fine-tuning, or "
                    f"pre-trained with --objective {self.objective.name}); load an electra "
                    f"pre-training checkpoint with the electra task")
            x = self.discriminator_head(x)
        return x, {"inner_states": states}

    def electra_step(self, src_tokens, target, disc_weight: float, masked_positions=None,
                     has_padding: Optional[bool] = None) -> PretrainingOutput:
        """One pre-training step, top to bottom as the paper's section 2 tells it.

        src_tokens, target: B x T, the ``electra`` task's batch: its dataset has already
        masked the input (:mod:`electra_plugin.data.masking`), target holds the original token
        at the M picked positions and padding elsewhere. ``disc_weight``: lambda.
        ``masked_positions`` (M flat indices into B x T, ascending) and ``has_padding``, which
        the task's collater gives, spare the two host-device syncs of finding them here.
        The comments say what the default (``--objective electra``, a masked-LM generator
        trained by maximum likelihood) does; the ablations plug in at two named points:
        ``self.generator_variant`` (:mod:`electra_plugin.generators`) and ``self.objective``
        (:mod:`electra_plugin.objectives`).
        """
        padding_mask = src_tokens.eq(self.padding_idx)
        attn_mask = attention_mask(padding_mask, has_padding)  # shared by both encoders
        # 1. mask: the positions the dataset picked (--mask-prob, <mask> or kept as it says)
        masked = target.ne(self.padding_idx)
        positions = masked.flatten().nonzero().squeeze(1) if masked_positions is None \
            else masked_positions  # M flat indices (found here: a sync, M is a shape)
        masked_targets = target.flatten()[positions]
        original = torch.where(masked, target, src_tokens)
        logs = {"masked": len(positions)}
        corrupted, gen_log_probs, baseline = src_tokens, None, None
        if self.generator_variant is not None:  # BERT's mlm has none: <mask> stays
            # 2. generator: M x V log-probabilities, a small masked LM's at the masked positions
            gen_log_probs, baseline = self.generator_variant.propose(self, src_tokens, attn_mask,
                                                                     positions)
            # 3. sample, without gradient: the discriminator's loss never reaches the generator
            sampled = self.sample(gen_log_probs.detach())
            logs["sampled_correct"] = (sampled == masked_targets).sum()  # sampled_masked_lm_acc
            # 4. corrupt: the samples replace the masked tokens
            corrupted = src_tokens.flatten().index_put((positions,), sampled).view_as(src_tokens)
        # labels: replaced where the input differs (a sample equal to the original is original)
        replaced = corrupted.ne(original)
        main = copy = hidden = None
        if not self.generator_alone:  # two-stage training's first stage: no discriminator
            # 5. discriminator: one replaced/original logit per token (discriminator_head)
            hidden, _ = self.discriminator.encode(corrupted, attn_mask)
            main, copy = self.objective.predict(self, hidden, positions)
        out = PretrainingOutput(
            generator_log_probs=gen_log_probs, baseline_logits=baseline,
            masked_targets=masked_targets, positions=positions, corrupted=corrupted,
            original=original, replaced=replaced, padding_mask=padding_mask,
            main=main, copy=copy, disc_hidden=hidden)
        # 6. loss = lambda * BCE averaged over the non-pad tokens + the generator's
        #    cross-entropy averaged over the masked positions
        loss, per_token = 0.0, None
        if main is not None:
            disc_loss, per_token, counts = self.objective.main_loss(out)
            loss = (disc_weight if self.objective.binary else 1.0) * disc_loss
            logs.update({self.objective.loss_name: disc_loss.detach(), **counts})
        if self.generator_variant is not None:
            gen_loss, gen_logs = self.generator_variant.loss(self, out, per_token)
            loss = loss + gen_loss
            logs.update(gen_logs)
        logs["loss"] = loss.detach()
        return out._replace(loss=loss, logs=logs)

    def train_flops(self, length: int, sequences: int, predicted: int) -> float:
        """Training FLOPs of one batch as the paper counts them, for this model's setting."""
        disc, gen = self._sizes
        # a trained part counts forward + backward (equal, as the paper), a frozen one forward
        gen_passes = 1 if self.generator_frozen else 2
        disc_passes = 0 if self.generator_alone else 2
        return paper_train_flops(disc, gen if self.generator is not None else None,
                                 self.discriminator.embeddings.word_embeddings.num_embeddings,
                                 length, sequences, predicted, objective=self.objective.name,
                                 generator_passes=gen_passes, discriminator_passes=disc_passes)

    @cached_property
    def _sizes(self):
        """(discriminator, generator) sizes for the FLOPs count; the config does not change."""
        return model_sizes(self.cfg)

    @torch.no_grad()
    def sample(self, logits):
        """One token per row of M x V logits, drawn in fp32 from ``softmax(logits / T)``.

        Inverse-CDF sampling: the distribution of the official Gumbel-max trick, with one
        uniform number per row instead of one Gumbel variate per vocabulary entry (on CPU
        that is 6x cheaper). Temperature 0 takes the argmax.
        """
        logits = logits.float()
        if self.cfg.temperature == 0:
            return logits.argmax(-1)
        if self.cfg.temperature != 1:
            logits = logits / self.cfg.temperature
        cdf = logits.softmax(-1).cumsum_(-1)
        u = torch.rand(len(cdf), 1, device=cdf.device) * cdf[:, -1:]  # cdf[:, -1] is ~1
        return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.size(1) - 1)

    def register_classification_head(self, name, num_classes=None, inner_dim=None, **kwargs):
        """Adds (or replaces) a sentence-level head on the first token, as RoBERTa does."""
        if name in self.classification_heads:
            old = self.classification_heads[name]
            if old.out_proj.out_features != num_classes:
                logger.warning(f"re-registering head '{name}' with {num_classes} classes "
                               f"(was {old.out_proj.out_features})")
        head = ClassificationHead(self.cfg.hidden_size, inner_dim or self.cfg.hidden_size,
                                  num_classes, self.cfg.dropout,
                                  self.cfg.get("classifier_pooling", "first"))
        head.apply(init_bert_params)  # N(0, 0.02), zero biases: HF's and the official init
        self.classification_heads[name] = head
        self.tag_parameters()

    def register_span_head(self, name, answerable: bool):
        """Adds (or replaces) a SQuAD start/end head, with a no-answer classifier for 2.0."""
        from .span_head import SpanHead

        head = SpanHead(self.cfg.hidden_size, answerable, self.cfg.dropout)
        head.apply(init_bert_params)
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
        """Fit a checkpoint's optional parts to this model.

        Pre-training parts (generator, replaced-token head, FLOPs counter) are dropped when
        this model was built for fine-tuning, after folding a GDES residual into the
        discriminator's token embeddings; a pre-training checkpoint without a FLOPs
        counter (older, or converted from HF) starts the count at 0. Classification heads the
        checkpoint has and this model lacks are registered with ``--load-checkpoint-heads`` and dropped otherwise; a head of the same
        name with another number of classes is an error (``--classification-head-name``
        picks a new head).
        """
        prefix = name + "." if name else ""
        super().upgrade_state_dict_named(state_dict, name)
        if not self.pretraining:
            fold_embedding_delta(state_dict, prefix)
            keep = tuple(prefix + p for p in FINETUNING_PARTS)
            for key in [k for k in state_dict if k.startswith(prefix) and
                        not k.startswith(keep)]:
                del state_dict[key]
        elif self.flops_counter is not None:
            state_dict.setdefault(prefix + FlopsCounter.KEY, torch.zeros((), dtype=torch.float64))
        heads_prefix = prefix + "classification_heads."
        for head, num_classes in _heads_in(state_dict, heads_prefix).items():
            if head not in self.classification_heads:
                if self.cfg.get("load_checkpoint_heads", False):
                    self.register_classification_head(head, num_classes)
                else:
                    logger.info(f"dropping classification head '{head}' of the checkpoint")
                    for key in [k for k in state_dict if k.startswith(f"{heads_prefix}{head}.")]:
                        del state_dict[key]
            elif self.classification_heads[head].out_proj.out_features != num_classes:
                raise ElectraUsageError(
                    f"the checkpoint's classification head '{head}' has {num_classes} classes "
                    f"but this run asks for {self.classification_heads[head].out_proj.out_features}"
                    f"; set --num-classes {num_classes} or give the new head another "
                    f"--classification-head-name")
        for key, value in self.classification_heads.state_dict().items():
            state_dict.setdefault(heads_prefix + key, value)  # new heads keep their init

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """Reject a checkpoint of another model with one line instead of fairseq's wrapper."""
        check_model_settings(self, state_dict)  # names the settings that differ
        self._known_stage = None  # the checkpoint's second_stage flag decides
        self.upgrade_state_dict(state_dict)
        own = self.state_dict()
        for key, value in state_dict.items():
            if key in own and own[key].shape != value.shape:
                if key.endswith(("word_embeddings.weight", GDES_DELTA)) and \
                        own[key].shape[0] != value.shape[0]:
                    raise vocabulary_error(value.shape[0], own[key].shape[0])
                raise ElectraUsageError(
                    f"checkpoint does not fit this model: {key} has shape "
                    f"{list(value.shape)} there but {list(own[key].shape)} here; use the --arch "
                    f"and size options the checkpoint was trained with")
        if strict:
            missing = sorted(set(own) - set(state_dict))
            unexpected = sorted(set(state_dict) - set(own))
            if missing or unexpected:
                raise ElectraUsageError(
                    f"checkpoint does not fit this model: {len(missing)} missing keys "
                    f"{missing[:3]} and {len(unexpected)} unexpected keys {unexpected[:3]}; "
                    f"is it an ELECTRA checkpoint of the same --arch?")
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg,
                                       args=args)


def fold_embedding_delta(state_dict, prefix=""):
    """In place: a GDES discriminator's token embeddings as one table, E_generator + delta.

    What a plain ELECTRA discriminator holds (fine-tuning, the HF export, the extracted
    discriminator); a state dict without the residual is left as it is.
    """
    delta = state_dict.pop(prefix + GDES_DELTA, None)
    if delta is not None:
        shared = state_dict[prefix + "generator.embeddings.word_embeddings.weight"]
        state_dict[prefix + "discriminator.embeddings.word_embeddings.weight"] = shared + delta


def _heads_in(state_dict, heads_prefix):
    """{head name: number of classes} of the classification heads in a state dict."""
    return {key[len(heads_prefix):].split(".")[0]: value.size(0)
            for key, value in state_dict.items()
            if key.startswith(heads_prefix) and key.endswith(".out_proj.weight")}


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


def _register_arch(name):
    @register_model_architecture("electra", name)
    def fill_sizes(args):
        for key, value in ARCH_SIZES[name].items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)

    return fill_sizes


for _name in ARCH_SIZES:
    _register_arch(_name)
