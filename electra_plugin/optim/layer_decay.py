"""Adam(W) with ELECTRA's layer-wise learning-rate decay and weight-decay exclusions.

The model tags each parameter with its depth (:func:`tag_parameters`); this optimizer turns
the tags into parameter groups. Convention: the task heads (and anything untagged) train at
the scheduled lr, the top Transformer layer at ``lr * d``, layer ``i`` (0-based, of ``L``)
at ``lr * d ** (L - i)``, the embeddings at ``lr * d ** (L + 1)``. The official code gives
every layer one extra factor of ``d`` (google-research/electra issues 51 and 64); we do not.
"""

from dataclasses import dataclass, field

from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig

from ..user_io.errors import ElectraUsageError

TAG = "electra"  # key inside p.optim_overrides, which fairseq's fp16 wrapper copies to fp32


def tag_parameters(named_parameters, num_layers: int, layer_of) -> None:
    """Record depth and weight-decay exemption on each parameter.

    ``layer_of(name, p)`` returns 0 for embeddings, ``i + 1`` for Transformer layer ``i`` and
    None for everything above the encoder (depth ``num_layers + 1``). LayerNorm weights and
    biases are exempt from weight decay, as in the official optimizer.
    """
    for name, p in named_parameters:
        depth = layer_of(name, p)
        overrides = dict(getattr(p, "optim_overrides", None) or {})
        overrides[TAG] = {
            "depth": num_layers + 1 if depth is None else depth,
            "top": num_layers + 1,
            "no_weight_decay": "LayerNorm" in name or name.endswith("bias"),
        }
        p.optim_overrides = overrides


def check_layer_decay(decay: float) -> None:
    """A layer-wise decay is a factor in (0, 1]: 0 freezes every layer below the head, above 1
    the lower layers would train faster than the top (surely a typo)."""
    if not 0 < decay <= 1:
        raise ElectraUsageError(f"--layer-decay {decay:g} is not in (0, 1]: the layer k steps "
                                f"below the task head trains at lr * d**k (ELECTRA: 0.8 "
                                f"Small/Base, 0.9 Large; 1 = off)")


@dataclass
class ElectraAdamConfig(FairseqAdamConfig):
    layer_decay: float = field(
        default=1.0, metadata={"help": "layer-wise lr decay d: the layer k steps below the "
                                       "task head trains at lr * d**k (ELECTRA fine-tuning: 0.8 "
                                       "Small/Base, 0.9 Large; 1 = off)"})


class ElectraAdam(FairseqAdam):
    """fairseq's Adam (decoupled weight decay) over depth groups; see the module docstring.
    Registered as ``electra_adam`` by the plugin's ``__init__``, with speed/'s update, clip
    and gradient scaling mixed in (:func:`electra_plugin.speed.optimizer.fast`)."""

    def __init__(self, cfg: ElectraAdamConfig, params):
        check_layer_decay(cfg.layer_decay)
        if min(cfg.lr) < 0:
            raise ElectraUsageError(f"--lr {min(cfg.lr):g} is negative: Adam would climb the "
                                    f"loss")
        super().__init__(cfg, self.groups(list(params), cfg))

    @staticmethod
    def groups(params, cfg):
        tags = [getattr(p, "optim_overrides", None) or {} for p in params]
        if len(params) == 1 and TAG not in tags[0] and \
                (cfg.layer_decay != 1.0 or cfg.weight_decay != 0.0):
            # fairseq-train unflattens for ELECTRA models (run_config.py); this is what is
            # left: a trainer of one's own, or a model that is not the plugin's
            raise ElectraUsageError(
                "electra_adam got the parameters flattened into one tensor (fairseq's --fp16 "
                "flattens its fp32 copy), so LayerNorm and biases would lose their "
                "weight-decay exemption and --layer-decay its per-layer groups; add "
                "--fp16-no-flatten-grads (or use --bf16 or --amp)")
        grouped = {}
        for p, tag in zip(params, tags):
            t = tag.get(TAG, {})
            scale = cfg.layer_decay ** (t.get("top", 0) - t.get("depth", 0))
            no_decay = t.get("no_weight_decay", False)
            group = grouped.setdefault((scale, no_decay), {
                "params": [], "lr_scale": scale,
                "weight_decay": 0.0 if no_decay else cfg.weight_decay})
            group["params"].append(p)
        return sorted(grouped.values(), key=lambda g: (-g["lr_scale"], g["weight_decay"]))

    def get_lr(self):
        """The scheduled lr (the task heads' lr)."""
        group = self.param_groups[0]
        return group["lr"] / group["lr_scale"]

    def set_lr(self, lr):
        for group in self.param_groups:
            group["lr"] = lr * group["lr_scale"]
