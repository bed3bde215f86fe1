"""``torch.compile`` of the pre-training model: its encoders (``--torch-compile``), or its
whole step as one graph (``--graphed-step``); part of :mod:`electra_plugin.speed`.

Encoders: each encoder's ``encode`` (embeddings, projection, Transformer layers), which
``dynamic=True`` keeps symbolic so that a batch of another size or length reuses the graph;
the rest of the step stays eager. ``attn_mask`` is None for a batch without padding (SDPA
may then run flash attention) and a tensor otherwise: at most two graphs per encoder.

The step: :meth:`ElectraModel.electra_step` (generator, sampling, corruption, discriminator,
losses) forward and backward under ``fullgraph=True``, which the collater's fixed prediction
slots make possible (no shape depends on the masked count). On a GPU the forward and the
backward graph are each also captured as a CUDA graph and replayed, one launch per graph
instead of one per kernel (3.6x the eager step for electra_small at 128 x 128, 1.7x for
electra_base at 32 x 512: docs/benchmarks.md, "GPU at the paper's batches");
``ELECTRA_SPEED=-cudagraphs`` turns that off. Each graph is captured on its own (inductor's
``triton.cudagraph_trees=False``: its inputs copied into fixed buffers) because cudagraph
trees stop at full size on a liveness check (pytorch#154306); the price is a memory pool per
graph and a compile and capture per shape, so a batch with fewer rows than one captured at
its length (an epoch's short last batch) runs eager instead. Without CUDA graphs the batch
dimension is dynamic, so that such a batch reuses the graph. Every batch takes the padded
layout (an attention mask), so that a batch with padding does too; validation runs the eager
step (no second graph for eval mode). A configuration the compiler cannot take whole falls
back to the eager step at its first batch, with one log line. The modules and their state-
dict keys are unchanged.
"""

import logging

import torch

from .switch import enabled

logger = logging.getLogger(__name__)

BACKENDS = ("off", "inductor", "aot_eager")


def compile_encoders(model, backend: str) -> bool:
    """Compile the generator's and the discriminator's ``encode`` in place; True if it did
    (``off``, ``ELECTRA_SPEED=0`` or a model without encoders leave it eager)."""
    if backend == "off" or not enabled():
        return False
    encoders = {id(e): e for e in (getattr(model, "generator", None),
                                   getattr(model, "discriminator", None)) if e is not None}
    for encoder in encoders.values():  # a tied generator is the discriminator: once
        encoder.encode = torch.compile(encoder.encode, backend=str(backend), dynamic=True)
    return bool(encoders)


def compile_step(model, backend: str) -> bool:
    """Run ``model.electra_step`` as one compiled graph from now on (see the module); True
    if it will (``ELECTRA_SPEED=0`` leaves it eager)."""
    if not enabled():
        return False
    model.electra_step = GraphedStep(model.electra_step, backend)
    return True


class GraphedStep:
    """``electra_step`` compiled whole at its first batch (replayed as CUDA graphs on a GPU);
    the eager step if that batch's step cannot compile."""

    def __init__(self, eager, backend: str):
        self.eager, self.backend = eager, backend
        self.compiled = self.fell_back = self.cudagraphs = None
        self.rows, self.said_short = {}, False  # length -> the most rows captured at it

    def __call__(self, src_tokens, target, masked_positions=None, masked_weights=None,
                 has_padding=None):
        # every batch takes the padded layout (one graph, not one per layout)
        args = (target, masked_positions, masked_weights, True)
        if self.fell_back or not self.eager.__self__.training:  # validation: eager, no graph
            return self.eager(src_tokens, *args)
        first = self.compiled is None
        if first:
            self.cudagraphs = (src_tokens.is_cuda and self.backend == "inductor"
                               and enabled("cudagraphs"))
            replay = {"triton.cudagraphs": True, "triton.cudagraph_trees": False}
            self.compiled = torch.compile(self.eager, backend=self.backend, fullgraph=True,
                                          options=replay if self.cudagraphs else None)
        if self.cudagraphs:  # a CUDA graph holds one shape
            rows, length = src_tokens.shape
            most = self.rows.setdefault(length, rows)
            if rows < most:  # an epoch's short last batch: eager, rather than minutes of
                # compiling and another graph's memory
                if not self.said_short:
                    logger.info(f"--graphed-step: a batch of {rows} rows, fewer than the "
                                f"CUDA graphs' {most} at its length, runs eager")
                    self.said_short = True
                return self.eager(src_tokens, *args)
            self.rows[length] = rows
        for tensor in (src_tokens, *args):  # B x ... inputs (the slots B*P): any batch size
            if torch.is_tensor(tensor) and tensor.dim() > 0:
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
        try:
            out = self.compiled(src_tokens, *args)
        except Exception as error:  # the compiler's own errors are not all its exception
            # class (torch 2.11 raises AssertionError); a real error of the step recurs eager
            if not first:
                raise
            reason = str(error).strip().splitlines()[0]
            logger.warning(f"--graphed-step: this configuration's step cannot be compiled "
                           f"whole ({reason}); it runs eager")
            self.fell_back = True
            return self.eager(src_tokens, *args)
        if first:
            logger.info(f"--graphed-step: the step runs as one compiled graph "
                        f"({self.backend}{', CUDA graphs' if self.cudagraphs else ''})")
        if self.cudagraphs:  # a CUDA graph's outputs are overwritten by its next replay;
            # the logs wait for --log-interval (speed/deferred.py), so they get their own copy
            out = out._replace(logs={k: v.clone() if torch.is_tensor(v) else v
                                     for k, v in out.logs.items()})
        return out
