"""Each kind of encoder layer traced once under ``torch.compile``; part ``layers`` of
:mod:`electra_plugin.speed`.

A compiled encoder inlines its layers: dynamo traces each of ELECTRA-Small's 12 in turn and
AOT autograd functionalizes and partitions each. A layer called through
``torch.compiler.nested_compile_region`` is traced the first time and its graph stamped out
for every later layer of the same class, shapes and dtypes, so the compile grows far less
with the depth (docs/benchmarks.md, "Compile time"). It computes what the plain call
computes; eager code never takes the region.

Only the graphed step with ``ELECTRA_SPEED=-gradients`` (autograd's backward, a second
graph) takes the region. A graph that takes its own gradients by ``torch.func`` (the default
graphed step) cannot hold one: dynamo stops on it ("Expected FakeTensor", torch 2.13). Nor
can the encoders of ``--torch-compile``, whose sizes are symbolic: AOT autograd fails on the
region and dynamo breaks the graph there. Those trace their layers one by one, as does the
modern body, whose layers take its unpadded layout (an object, not tensors).
"""

import torch

from .switch import enabled

# (a torch without it, older than 2.8, traces each layer)
_REGION = getattr(torch.compiler, "nested_compile_region", None)
FLAG = "layers_traced_once"  # an encoder's attribute: whether its compile takes the region


def _call(layer, *args):
    return layer(*args)


_traced_once = _REGION(_call) if _REGION is not None else _call


def run_layer(encoder, layer, *args):
    """``layer(*args)``, one of ``encoder``'s layers; under a compile that
    :func:`trace_layers_once` allowed, through the one region of its kind."""
    if getattr(encoder, FLAG, False) and torch.compiler.is_compiling():
        return _traced_once(layer, *args)
    return layer(*args)


def trace_layers_once(encoders, allowed: bool = True) -> bool:
    """Whether the coming compile of each of ``encoders`` traces its layers once (where
    ``allowed``, the part is on and this torch has the region); returns it."""
    on = allowed and enabled("layers") and _REGION is not None
    for encoder in encoders:
        setattr(encoder, FLAG, on)
    return on
