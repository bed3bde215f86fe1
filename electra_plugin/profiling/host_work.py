"""Counts what a training update asks of the host: aten operators and host-device syncs.

On a GPU each operator is a kernel launch that costs the host microseconds, and each sync
(``.item()``, a tensor tested in an ``if``, ``nonzero``, boolean indexing) stops the host
from running ahead of the GPU. Both can be counted on a CPU, with the same code path: the
benchmark (benchmarks/bench_pretrain.py --count) and the tests use this mode.
"""

import sys
import traceback
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# operators whose result the host must wait for (their value or their output's shape)
SYNC_OPS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.is_nonzero,
            aten.equal, aten._unique, aten._unique2, aten.unique_dim,
            aten.unique_consecutive, aten.masked_scatter}
# operators that only describe memory: no kernel runs
FREE_OPS = {aten.view, aten._unsafe_view, aten.detach, aten.alias, aten.t, aten.transpose,
            aten.permute, aten.expand, aten.unsqueeze, aten.squeeze, aten.select, aten.slice,
            aten.as_strided, aten.split, aten.split_with_sizes, aten.unbind, aten.reshape,
            aten.flatten, aten.chunk, aten.narrow, aten.lift_fresh, aten.unfold,
            aten.view_as_real, aten.view_as_complex, aten.diagonal, aten.movedim}


def is_sync(func, args) -> bool:
    """Whether the host must wait for the device to run ``func`` on ``args``."""
    packet = func.overloadpacket
    if packet in SYNC_OPS:
        return True
    if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        indices = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                   for i in indices)
    if packet is aten.repeat_interleave:
        return len(args) > 0 and isinstance(args[0], torch.Tensor) and \
            "output_size" not in str(func._schema)  # the count is read on the host
    return False


class HostWork(TorchDispatchMode):
    """``with HostWork() as work: ...`` -> ``work.operators`` (aten operators issued),
    ``work.kernels`` (those that are not views or detaches), ``work.syncs`` and, with
    ``where=True``, ``work.sync_sites``: a Counter of the Python line that asked for each.

    ``work.in_graph`` (``work.graph_kernels``): the operators (kernels) that compiled code
    issued (a ``torch.compile`` graph's own calls, e.g. inductor's matmuls on a CPU), which
    a GPU replays inside one CUDA graph; the rest the host issues one by one either way."""

    def __init__(self, where: bool = False):
        super().__init__()
        self.where = where
        self.operators = self.kernels = self.syncs = self.in_graph = self.graph_kernels = 0
        self.sync_sites = Counter()

    @classmethod
    def is_infra_mode(cls):
        return True  # it only counts: compiled code runs under it as it runs without it

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        compiled = issued_by_compiled_code()
        self.operators += 1
        self.in_graph += compiled
        if func.overloadpacket not in FREE_OPS:
            self.kernels += 1
            self.graph_kernels += compiled
        if is_sync(func, args):
            self.syncs += 1
            if self.where:
                self.sync_sites[f"{func.overloadpacket.__name__} at {caller()}"] += 1
        return func(*args, **(kwargs or {}))


def issued_by_compiled_code(depth: int = 40) -> bool:
    """Whether a frame of the current call stack is compiled code: inductor's generated
    module or an FX graph's (aot_eager)."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        name = frame.f_code.co_filename
        if "torchinductor" in name or name.startswith("<eval_with_key"):
            return True
        frame = frame.f_back
    return False


def caller() -> str:
    """The innermost frame outside torch: the line whose request reached the operator."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/torch/" not in frame.filename and not frame.filename.endswith("host_work.py"):
            return f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno} " \
                   f"({frame.line})"
    return "?"
