"""The one switch of :mod:`electra_plugin.speed`: the ``ELECTRA_SPEED`` environment variable,
and :data:`PARTS`, the one table of what it switches (docs/speed.md is checked against it).

``1`` (or unset): every part at its default; ``0``: every part off, each path the plain
PyTorch / fairseq op; ``-window,-dropout``: the parts named off, ``+trees``: a part that is
off by default on, so that a benchmark can weigh one of them in the same process. A word
that names no part is refused in one line.
"""

import os
from typing import FrozenSet, NamedTuple

from ..user_io.errors import ElectraUsageError

VARIABLE = "ELECTRA_SPEED"


class Part(NamedTuple):
    does: str  # what the part does
    instead: str  # what runs with the part off
    where: str  # the file that holds it
    default: bool = True


PARTS = {
    "accumulate": Part("the graphed step adds its gradients to the parameters itself",
                       "autograd's accumulation nodes", "speed/compile.py"),
    "adam": Part("fairseq's Adam over all tensors at once: foreach ops (GPU), torch's fused "
                 "kernel (CPU)", "fairseq's per-tensor Adam loop", "speed/adam.py"),
    "allocator": Part("glibc keeps freed memory in the process (mallopt, CPU)",
                      "glibc's default", "speed/allocator.py"),
    "attention": Part("attention as two matmuls and a softmax on CPU with dropout or in bf16",
                      "F.scaled_dot_product_attention", "speed/attention.py"),
    "buckets": Part("fine-tuning batches padded to one of --length-buckets' lengths",
                    "each batch at its own length", "speed/buckets.py"),
    "clip": Part("the gradient norms in one _foreach_norm per device and dtype, the scaling "
                 "left to the Adam step", "fairseq's per-tensor norms and scaling",
                 "speed/clip.py"),
    "cudagraphs": Part("the graphed step replayed as CUDA graphs",
                       "inductor's kernels launched one by one", "speed/compile.py"),
    "deferred": Part("the update's finiteness checks and logs stay on the device until "
                     "--log-interval", "fairseq's checks after every update",
                     "speed/deferred.py"),
    "dropout": Part("a 15-bit integer-hash dropout mask (CPU)", "F.dropout",
                    "speed/dropout.py"),
    "floats": Part("the encoders compiled by --torch-compile take the modules' floats "
                   "(dropout rates, epsilons) as constants", "each float traced as a symbol "
                   "with its guards (dynamic=True's default)", "speed/compile.py"),
    "global": Part("the modern body's global layers keep no T x T tensor for backward (CPU)",
                   "SDPA with the T x T mask", "speed/global_attention.py"),
    "gradients": Part("the graphed step's backward inside its one graph (not with inductor "
                      "on a GPU)",
                      "autograd runs the backward as a second graph", "speed/compile.py"),
    "guards": Part("dynamo's guards on the model's structure dropped from the graphed step",
                   "every guard kept", "speed/compile.py"),
    "layers": Part("the graphed step with a second graph for its backward (-gradients) traces "
                   "each kind of encoder layer once and reuses its graph",
                   "every layer traced on its own", "speed/layers.py"),
    "launch": Part("each trial's fairseq-train and each comparison arm's fairseq-hydra-train "
                   "forked from a warm server", "a new interpreter per run", "speed/launch.py"),
    "multiply": Part("fairseq's multiply_grads skipped when its factor is exactly 1",
                     "a pass multiplying every gradient by 1", "speed/optimizer.py"),
    "qkv": Part("one fused q/k/v matmul, the softmax scale folded into the query weights",
                "three nn.Linear, q scaled after", "speed/attention.py"),
    "replay": Part("on a GPU, the whole update replayed as one CUDA graph (on an H200: over "
                   "aot_eager; inductor's capture failed)",
                   "fairseq's update around the graphed step (GPU)",
                   "speed/whole_update.py", default=False),
    "sampling": Part("the generator's samples by inverse CDF: one uniform number per row",
                     "the Gumbel-max trick: one Gumbel variate per vocabulary entry",
                     "speed/sampling.py"),
    "seed": Part("fairseq's seed before each step given to the generators that draw",
                 "torch.manual_seed (lazy seeds queued with a stack trace)",
                 "speed/seed.py"),
    "trees": Part("inductor's cudagraph trees for the graphed step (they stop at full size: "
                  "pytorch/pytorch#154306)", "each graph captured on its own",
                  "speed/compile.py", default=False),
    "unpad": Part("the modern body's position-wise work on the real tokens only",
                  "the padded B x T grid", "speed/unpad.py"),
    "update": Part("with --graphed-step, the whole update (each micro-batch's forward and "
                   "backward, clip, Adam) as one compiled graph", "fairseq's update around "
                   "the graphed step", "speed/whole_update.py"),
    "walks": Part("the training mode set only where a module differs; the update count to "
                  "the modules whose class takes it", "fairseq's walks over every module",
                  "speed/module_walks.py"),
    "window": Part("the modern body's local layers score each query against 3 blocks of half "
                   "the window", "the whole T x T scores, masked", "speed/window.py"),
}


def enabled(part: str = "") -> bool:
    """Whether ``part`` is on (``""``: whether the switch is not ``0``). Read at each call
    (the parsed value kept by its text), so a test can flip it."""
    if part and part not in PARTS:
        raise ValueError(f"{part!r} is no part of {VARIABLE} ({', '.join(PARTS)})")
    on, off = parsed(os.environ.get(VARIABLE, "1"))
    if "" in off:
        return False
    return not part or part in on or (PARTS[part].default and part not in off)


_PARSED = {}  # value -> its parts; a dict, as torch.compile warns that it ignores lru_cache


def parsed(value: str) -> "tuple[FrozenSet[str], FrozenSet[str]]":
    """The parts ``value`` turns on and off ("" off: all, which ``0`` among the words
    means whatever the others say); a word that names no part is refused."""
    if value not in _PARSED:
        _PARSED[value] = _parse(value)
    return _PARSED[value]


def _parse(value: str) -> "tuple[FrozenSet[str], FrozenSet[str]]":
    on, off = set(), set()
    for word in filter(None, (w.strip() for w in value.split(","))):
        if word == "0":
            off.add("")
        elif word[:1] in "+-" and word[1:] in PARTS:
            (on if word[0] == "+" else off).add(word[1:])
        elif word != "1":
            raise ElectraUsageError(
                f"{VARIABLE}={value}: {word!r} names no part; give 0 (all off), 1 (all at "
                f"their defaults) or -PART,+PART,... with PART one of {', '.join(PARTS)}")
    return frozenset(on), frozenset(off)
