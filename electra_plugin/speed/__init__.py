"""Where the speed work lives, all behind one switch: ``ELECTRA_SPEED=0`` turns it off.

Each part computes what a plain PyTorch or fairseq op computes (tested against it in
tests/test_fast_path.py); it only does so faster, mostly on CPU (docs/benchmarks.md has the
measurements). The model, task and optimizer code uses these names and reads as its plain
meaning. To check that a result does not depend on them, run with ``ELECTRA_SPEED=0`` in
the environment (e.g. ``ELECTRA_SPEED=0 fairseq-train ...``): every part then takes the
plain path.

========================  ==========================================  =====================
part                      fast path                                   plain path
========================  ==========================================  =====================
``Dropout``, ``dropout``  15-bit SplitMix64 mask, integer arithmetic  ``F.dropout``
                          (CPU; ``ELECTRA_SPEED=-dropout``: off);
                          compiled: uniform draws the compiler fuses
``project_qkv``           one fused q/k/v matmul, softmax scale       three ``nn.Linear``,
                          folded into the query weights               q scaled after
``attention``             two matmuls + softmax on CPU with dropout   ``F.scaled_dot_
                          or in bf16                                  product_attention``
``MultiTensorAdam``       fairseq's Adam as foreach ops (GPU) or      fairseq's per-tensor
                          torch's fused kernel (CPU)                  Adam loop
``clip_grad_norm_``       norms: one ``_foreach_norm`` per device     fairseq's per-tensor
                          and dtype; the scaling left to the          ``torch.norm`` loop
                          ``MultiTensorAdam`` step that reads them    and scaling
``retain_freed_memory``   glibc keeps freed memory (mallopt, CPU)     glibc's default
``compile_encoders``      ``torch.compile`` of each encoder           eager
                          (``--torch-compile``)
``compile_step``          the whole pre-training step as one graph    eager
                          (``--graphed-step``; on a GPU replayed
                          as CUDA graphs, ``-cudagraphs``: not;
                          its gradients taken inside the graph,
                          ``-gradients``: by autograd, a second
                          graph; without a DDP wrapper added to the
                          parameters by the step, ``-accumulate``:
                          by autograd's accumulation; dynamo's
                          guards on the model's structure dropped,
                          ``-guards``: kept)
``module_walks``          the training mode set only where a module   fairseq's walks
(``walks``)               differs; the update count to the modules    over every module
                          whose class takes it                        (``hasattr`` each)
``deferred``              the update's finiteness checks and logs     fairseq's checks
                          stay on the device until --log-interval     after every update
                          (``ELECTRA_SPEED=-deferred``)
``seed_drawing_devices``  fairseq's seed before each step given to    ``torch.manual_seed``
(``seed``)                the CPU's and initialised CUDA devices'     (lazy seeds queued
                          generators                                  with a stack trace)
``Layout`` (``unpad``)    the modern body's layers on the real        the padded B x T grid
                          tokens only; flash attention's varlen
                          kernel on CUDA with ``flash_attn``
``window_attention``      the modern body's local layers score each   the whole T x T
(``window``)              query against 3 blocks of half the window   scores, masked (SDPA)
                          (cost linear in T; ``ELECTRA_SPEED=-window``
                          turns off this part alone)
``global_attention``      the modern body's global layers on CPU      SDPA with the T x T
(``global``)              keep no T x T tensor for backward: torch's  padding mask (the
                          flash kernel with a key mask, or with       math fallback with
                          dropout query chunks that recompute their   dropout)
                          softmax and dropout mask in the backward
                          pass (``ELECTRA_SPEED=-global``: this part
                          alone off)
``start_fairseq_train``   a trial's fairseq-train forked from a fork  a new interpreter
(``launch``)              server that imported torch and fairseq      (``python -m
                          once                                        fairseq_cli.train``)
``pad_to_bucket``         fine-tuning batches padded to one of        each batch at its
(``buckets``)             ``--length-buckets`` lengths (a few shapes  own length
                          for a compiled or graphed encoder)
========================  ==========================================  =====================
"""

from .adam import MultiTensorAdam
from .allocator import retain_freed_memory
from .buckets import pad_to_bucket
from .attention import attention, project_qkv
from .clip import clip_grad_norm_
from .compile import BACKENDS as COMPILE_BACKENDS
from .compile import compile_encoders, compile_step
from .dropout import Dropout, dropout
from . import module_walks
from .switch import enabled

__all__ = ["Dropout", "dropout", "project_qkv", "attention", "MultiTensorAdam",
           "clip_grad_norm_", "retain_freed_memory", "compile_encoders", "compile_step",
           "COMPILE_BACKENDS", "enabled", "pad_to_bucket", "module_walks"]
