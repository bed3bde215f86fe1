"""The ELECTRA model's configuration: sizes, the option surface and its completion.

No network code: the model, the converter, the FLOPs count and the benchmark read sizes from
here. The options are one choice per axis (``--objective``, ``--generator``,
``--embedding-sharing``); what each choice needs of the others is checked by its own class
(:mod:`electra_plugin.models.generators`, :mod:`electra_plugin.models.objectives`) when the
model is built.
"""

import logging
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY, register_model_architecture
from omegaconf import OmegaConf, open_dict

from ...user_io.errors import ElectraUsageError

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
}  # the other bodies' archs are theirs (EncoderBody.archs, added by register_arch)
# each body's completion of a model config (its EncoderBody.complete_config, registered by
# register_body: this module is below the bodies)
BODY_COMPLETIONS: Dict[str, Callable] = {}
# what an --arch fills besides the sizes when the option is unset
ARCH_DEFAULTS = {"encoder_body": "bert"}
SIZE_FIELDS = ("num_layers", "hidden_size", "num_heads", "ffn_size", "embedding_size")
# Checkpoint format. 1: the options before issue 27 (--tie-generator, --generator-training,
# --untie-embeddings); 2: one choice per axis. Stored as the model's ``version`` buffer.
CHECKPOINT_VERSION = 2


@dataclass(frozen=True)
class EncoderSize:
    """One Transformer encoder (generator or discriminator) and its embedding width."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    embedding: int


def shapes_discriminator(help: str) -> dict:
    """The metadata of an option that shapes the discriminator (with the options its body
    reads, models.bodies.discriminator_options gives what builds one)."""
    return {"help": help, "discriminator": True}


@dataclass
class ElectraConfig(FairseqDataclass):
    # --- sizes: None is filled from the --arch (or model._name)
    num_layers: Optional[int] = field(
        default=None, metadata=shapes_discriminator("discriminator Transformer layers"))
    hidden_size: Optional[int] = field(
        default=None, metadata=shapes_discriminator("discriminator hidden size"))
    num_heads: Optional[int] = field(
        default=None, metadata=shapes_discriminator("discriminator attention heads"))
    ffn_size: Optional[int] = field(
        default=None, metadata=shapes_discriminator("discriminator feed-forward inner size"))
    embedding_size: Optional[int] = field(
        default=None, metadata=shapes_discriminator(
            "token embedding size; projected to the hidden size when different "
            "(ELECTRA-Small: 128 -> 256)"))
    max_positions: int = field(
        default=512, metadata=shapes_discriminator("number of learned position embeddings"))
    type_vocab_size: int = field(
        default=2, metadata=shapes_discriminator(
            "token type (segment) embeddings; 0 disables them"))
    encoder_body: Optional[str] = field(
        default=None, metadata=shapes_discriminator(
            "the encoders' body, the generator's and the discriminator's alike: bert "
            "(ELECTRA's post-LN Transformer with learned absolute positions, official), "
            "deberta (DeBERTa-v2/v3's: no absolute positions, disentangled attention over "
            "log-bucketed relative positions), modern (ModernBERT's: RoPE, GeGLU, pre-LN "
            "without biases, local/global attention, unpadded); unset: the --arch's (bert)"))
    position_buckets: int = field(
        default=256, metadata={"help": "deberta: relative-position buckets on either side "
                                       "(DeBERTa-v3's 256; exact within half of them, "
                                       "logarithmic beyond)"})
    enhanced_mask_decoder: bool = field(
        default=False, metadata={"help": "deberta: the generator predicts through DeBERTa's "
                                         "enhanced mask decoder (its last layer run twice, "
                                         "queries from absolute positions; DeBERTa-v3's "
                                         "generator); no transformers class runs it, so such "
                                         "a generator stays in the fairseq checkpoint"})
    global_attn_every_n_layers: int = field(
        default=3, metadata={"help": "modern: every n-th layer (from the first) attends "
                                     "globally, the others within --local-attention"})
    local_attention: int = field(
        default=128, metadata={"help": "modern: the sliding window of the local layers, in "
                                       "tokens (half on either side)"})
    global_rope_theta: float = field(
        default=160000.0, metadata={"help": "modern: RoPE theta of the global layers"})
    local_rope_theta: float = field(
        default=10000.0, metadata={"help": "modern: RoPE theta of the local layers"})
    checkpoint_activations: bool = field(
        default=False, metadata={"help": "modern: keep only each layer's input for the "
                                         "backward pass and recompute the rest there (the "
                                         "activations of long sequences fit where they did "
                                         "not, for one more forward pass of the layers)"})
    dropout: float = field(default=0.1, metadata={"help": "dropout probability"})
    attention_dropout: float = field(
        default=0.1, metadata={"help": "dropout probability on attention weights"})
    # --- the three axes of pre-training
    # (the choices are the registered objectives and generator kinds, checked when the
    # model is built: models/objectives/, models/generators/)
    objective: str = field(
        default="electra", metadata={"help": "pre-training objective: electra (replaced token "
                                             "detection on every token), electra_15 (only at "
                                             "the masked positions), replace_mlm (MLM on "
                                             "generator samples instead of <mask>), "
                                             "all_tokens_mlm (replace_mlm predicting every "
                                             "token, with a copy mechanism), mlm (BERT: no "
                                             "generator), electric (Electric's energy-based "
                                             "cloze objective, with --generator two_tower)"})
    generator: str = field(
        default="masked_lm", metadata={"help": "where the replacements come from: masked_lm "
                                               "(a small masked LM trained with the "
                                               "discriminator, official), adversarial "
                                               "(trained by REINFORCE on the discriminator's "
                                               "loss, Appendix F), unigram (dict.txt's "
                                               "counts, no network), tied (the discriminator "
                                               "itself), two_stage (a full-size masked LM "
                                               "trained alone for --two-stage-updates, then "
                                               "frozen, the discriminator initialised from "
                                               "it), fast_electra (an existing masked LM, "
                                               "--generator-checkpoint, frozen, sampled at a "
                                               "decaying temperature), uniform (every token "
                                               "equally likely), two_tower (Electric's "
                                               "two-tower cloze model)"})
    embedding_sharing: Optional[ChoiceEnum(["shared", "untied", "gdes"])] = field(  # type: ignore
        default=None, metadata={"help": "how generator and discriminator share embeddings: "
                                        "shared (one block, official), untied (each its own), "
                                        "gdes (DeBERTa-v3's gradient-disentangled sharing: the "
                                        "discriminator reads the generator's token embeddings "
                                        "without their gradient plus a zero-initialised "
                                        "residual of its own); unset: the generator's own "
                                        "choice (shared; untied for two_stage and "
                                        "fast_electra)"})
    # --- options of particular generators (each refuses the ones it does not read)
    generator_size: Optional[float] = field(
        default=None, metadata={"help": "masked_lm/adversarial: generator hidden size as a "
                                        "fraction of the discriminator's (official: 1/4 small "
                                        "and large, 1/3 base; default: the --arch's); must "
                                        "give whole attention heads"})
    generator_layers: Optional[float] = field(
        default=None, metadata={"help": "masked_lm/adversarial: generator depth as a fraction "
                                        "of the discriminator's layers (official "
                                        "generator_layers); must give a whole number of "
                                        "layers; unset: the same depth"})
    temperature: float = field(
        default=1.0, metadata={"help": "generator sampling temperature (fast_electra: the "
                                       "final one); 0 takes the argmax (deterministic, for "
                                       "debugging)"})
    disallow_correct: bool = field(
        default=False, metadata={"help": "never sample the original token: its probability "
                                         "is set to 0 before sampling, so every masked "
                                         "position is replaced (official disallow_correct, "
                                         "which subtracts 1000 from its logit)"})
    two_stage_updates: int = field(
        default=0, metadata={"help": "two_stage: updates of the generator alone before the "
                                     "discriminator starts"})
    generator_checkpoint: Optional[str] = field(
        default=None, metadata={"help": "fast_electra: the masked LM to sample from, a plugin "
                                        "checkpoint: an electra pre-training one (its "
                                        "generator), an --objective mlm one, or an HF "
                                        "generator imported with electra-convert"})
    temperature_start: float = field(
        default=2.0, metadata={"help": "fast_electra: sampling temperature at update 0; it "
                                       "decays to --temperature over "
                                       "--temperature-decay-updates"})
    temperature_decay_updates: int = field(
        default=0, metadata={"help": "fast_electra: updates over which the temperature "
                                     "decays (then stays at --temperature)"})
    temperature_schedule: ChoiceEnum(["linear", "cosine"]) = field(  # type: ignore
        default="linear", metadata={"help": "fast_electra: the shape of the decay"})
    # --- fine-tuning
    classifier_pooling: ChoiceEnum(["first", "mean"]) = field(  # type: ignore
        default="first", metadata={"help": "what sentence-level classification heads read: "
                                           "first: the <s> token's features (HF, official); "
                                           "mean: the mean over the non-pad tokens (the "
                                           "small-compute fine-tuning recipe; not exportable "
                                           "to HF's classifier)"})
    classifier_init: ChoiceEnum(["glorot", "normal"]) = field(  # type: ignore
        default="glorot", metadata={"help": "initialisation of a new classification head's "
                                            "output layer: glorot (Glorot-uniform, as the "
                                            "official fine-tuning code's tf.layers.dense; "
                                            "its larger start gets the encoder out of the "
                                            "chance-level plateau on every seed, see "
                                            "docs/finetuning.md) or normal (N(0, 0.02), HF's "
                                            "initializer_range). The inner dense layer is "
                                            "N(0, 0.02) either way"})
    length_buckets: int = field(
        default=0, metadata={"help": "fine-tuning: pad each batch on the right to the next of "
                                     "this many lengths spread evenly up to --max-positions, "
                                     "so that a compiled or CUDA-graphed encoder meets at "
                                     "most this many shapes (the outputs at the batch's own "
                                     "positions do not change); 0: each batch at its own "
                                     "length"})
    load_checkpoint_heads: bool = field(
        default=False, metadata={"help": "keep the classification heads a checkpoint has "
                                         "(for evaluation and the hub interface)"})
    segment_token_types: Optional[bool] = field(
        default=None, metadata={"help": "token type 1 on the second segment: inputs given "
                                        "without token types get type 1 after the first "
                                        "</s>, as BERT's [CLS] A [SEP] B [SEP] (HF/official "
                                        "checkpoints, and pre-training with "
                                        "--sample-break-mode segment_pairs, which needs it). "
                                        "Off: type 0 throughout (packed pre-training). Unset: "
                                        "as the checkpoint a fine-tuning starts from says, "
                                        "else off"})


def cli_options(cfg, names) -> List[str]:
    """The fairseq-train options that give ``names`` the values ``cfg`` has (a true boolean
    as its flag; unset and false ones left out)."""
    args = []
    for name in names:
        value = cfg.get(name, None)
        if value is None or value is False:
            continue
        args += ["--" + name.replace("_", "-")] + ([] if value is True else [str(value)])
    return args


def marked_discriminator_options() -> Tuple[str, ...]:
    """The options marked :func:`shapes_discriminator`, in the config's order."""
    return tuple(name for name, f in ElectraConfig.__dataclass_fields__.items()
                 if f.metadata.get("discriminator"))


def option_default(name: str):
    """The default of one of :class:`ElectraConfig`'s options."""
    return ElectraConfig.__dataclass_fields__[name].default


def complete_config(cfg):
    """Fill unset size fields from the architecture and bring a config of an older checkpoint
    to today's options.

    Runs whatever path built ``cfg`` (CLI --arch, hydra model._name, a checkpoint), so the
    result never depends on whether fairseq merged dataclass defaults before or after the
    arch function. The generator and objective check their options when the model is built.
    """
    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.create(vars(cfg))
    arch = cfg.get("arch", None) or cfg.get("_name", None)
    with open_dict(cfg):
        _upgrade_options(cfg)
        full = OmegaConf.merge(OmegaConf.structured(ElectraConfig), {
            k: v for k, v in cfg.items() if k in ElectraConfig.__dataclass_fields__})
        for k, v in full.items():
            cfg[k] = v
        for k in SIZE_FIELDS + tuple(ARCH_DEFAULTS):
            if cfg[k] is None:
                cfg[k] = ARCH_SIZES.get(arch, {}).get(k, ARCH_DEFAULTS.get(k))
        if cfg.encoder_body in BODY_COMPLETIONS:
            BODY_COMPLETIONS[cfg.encoder_body](cfg)
        missing = [k for k in SIZE_FIELDS if cfg[k] is None]
        if missing:
            raise ElectraUsageError(
                f"model size is not set ({', '.join(missing)}); pick --arch "
                f"{'|'.join(ARCH_SIZES)} or give --{missing[0].replace('_', '-')}")
        check_ranges(cfg)
        if cfg.hidden_size % cfg.num_heads:
            raise ElectraUsageError(
                f"hidden size {cfg.hidden_size} is not divisible by {cfg.num_heads} heads")
    return cfg


# the numeric options' ranges: (low, high, high included); None: no bound
RANGES = {**{k: (1, None, True) for k in ("num_layers", "hidden_size", "num_heads", "ffn_size",
                                          "embedding_size", "max_positions")},
          **{k: (0, None, True) for k in ("length_buckets", "two_stage_updates",
                                          "temperature_decay_updates", "temperature",
                                          "temperature_start")},
          "dropout": (0, 1, False), "attention_dropout": (0, 1, False)}
# (the generator's fractions are checked by the generator, with what they must divide)


def check_ranges(cfg) -> None:
    """A numeric option out of its range is one line naming it, before anything is built."""
    for key, (low, high, closed) in RANGES.items():
        value = cfg.get(key, None)
        if value is None:
            continue
        if value < low or (high is not None and (value > high or not closed and value == high)):
            bound = f"at least {low:g}" if high is None else \
                f"in [{low:g}, {high:g}{']' if closed else ')'}"
            raise ElectraUsageError(f"--{key.replace('_', '-')} {value:g} must be {bound}")


def register_arch(name: str, settings: dict) -> None:
    """``--arch name`` fills ``settings`` (the sizes, a body's own choices) where unset; the
    fairseq arch is registered at once where the electra model is (models/electra.py
    registers the ones named before it)."""
    ARCH_SIZES[name] = settings
    if "electra" in MODEL_REGISTRY and name not in ARCH_MODEL_REGISTRY:
        register_fairseq_arch(name)


def register_fairseq_arch(name: str) -> None:
    @register_model_architecture("electra", name)
    def fill_sizes(args):
        for key in SIZE_FIELDS:
            if getattr(args, key, None) is None:
                setattr(args, key, ARCH_SIZES[name][key])


def arch_generator_size(cfg) -> float:
    """The --arch's generator_size (1/4 for an arch of one's own)."""
    arch = cfg.get("arch", None) or cfg.get("_name", None)
    return ARCH_SIZES.get(arch, {}).get("generator_size", 0.25)


def arch_generator_layers(cfg) -> Optional[float]:
    """The --arch's generator_layers (None: the discriminator's depth)."""
    arch = cfg.get("arch", None) or cfg.get("_name", None)
    return ARCH_SIZES.get(arch, {}).get("generator_layers", None)


def _upgrade_options(cfg) -> None:
    """A version-1 config (--tie-generator, --generator-training, --untie-embeddings, and
    --two-stage-updates on the masked_lm generator) as one choice per axis."""
    old = {k: cfg.pop(k) for k in ("tie_generator", "generator_training", "untie_embeddings")
           if k in cfg}
    if not old:
        return
    if old.get("tie_generator"):
        cfg.generator = "tied"
    elif cfg.get("two_stage_updates", 0):
        cfg.generator = "two_stage"
    elif old.get("generator_training") == "adversarial":
        cfg.generator = "adversarial"
    if cfg.get("embedding_sharing") != "gdes":  # two_stage unties by itself
        cfg.embedding_sharing = "untied" if old.get("untie_embeddings") and \
            cfg.generator != "two_stage" else None
    if cfg.get("objective") == "mlm" or cfg.generator not in ("masked_lm", "adversarial") or \
            cfg.get("generator_size") == arch_generator_size(cfg):
        cfg.generator_size = None  # version 1 filled in the arch's for every generator


def discriminator_size(cfg) -> EncoderSize:
    return EncoderSize(cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.ffn_size,
                       cfg.embedding_size)


def scaled_size(disc: EncoderSize, hidden_fraction: float,
                layer_fraction: Optional[float]) -> EncoderSize:
    """An encoder of ``hidden_fraction`` of the discriminator's hidden size (whole heads of
    its head size, FFN in proportion) and ``layer_fraction`` of its layers (None: all)."""
    head_dim = disc.hidden // disc.heads
    hidden = disc.hidden * hidden_fraction
    heads = hidden / head_dim
    if not 0 < hidden_fraction <= 1 or not math.isclose(heads, round(heads), abs_tol=1e-4) \
            or round(heads) == 0:
        raise ElectraUsageError(
            f"--generator-size {hidden_fraction:g} gives a generator hidden size of "
            f"{hidden:g}, which is not a whole number of {head_dim}-dim attention heads; use a "
            f"fraction in (0, 1] that is a multiple of {head_dim}/{disc.hidden}")
    heads = round(heads)
    layers = disc.layers
    if layer_fraction is not None:
        layers = disc.layers * layer_fraction
        if not 0 < layer_fraction <= 1 or \
                not math.isclose(layers, round(layers), abs_tol=1e-4) or round(layers) == 0:
            raise ElectraUsageError(
                f"--generator-layers {layer_fraction:g} of the discriminator's {disc.layers} "
                f"layers gives the generator {layers:g}, not a whole number from 1 to "
                f"{disc.layers}; use a multiple of 1/{disc.layers} in (0, 1]")
        layers = round(layers)
    return EncoderSize(layers, heads * head_dim, heads, disc.ffn * heads // disc.heads,
                       disc.embedding)
