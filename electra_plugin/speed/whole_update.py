"""The whole training update as one compiled function; part of :mod:`electra_plugin.speed`
(``ELECTRA_SPEED`` part ``update``).

fairseq's update runs the task's forward and backward once per micro-batch of
``--update-freq``, then in Python: ``multiply_grads`` by 1 / sample_size, the clip (norm and
coefficient), the finiteness check and the optimizer's step at the lr its scheduler set. Each
of these is host work, and on a GPU each op is a kernel launch. Here all of it is one
function compiled with ``fullgraph=True, dynamic=False``, which a GPU can replay as one CUDA
graph:

- each micro-batch's forward and backward, the gradients taken inside the graph
  (:meth:`~.compile.GraphedStep.with_gradients`), summed over the micro-batches;
- fairseq's ``multiply_grads`` and clip (``clip_grad_norm_``: the fp32 norm, then
  ``min(1, max_norm / (norm + 1e-6))``);
- :class:`~.capturable_adam.CapturableAdam`'s update, skipped on the device where the norm
  is not finite (weights, moments and step counts left as they are, as fairseq leaves them).

Nothing in it reads the host. The lr comes from a device table that the host writes at each
update (:meth:`WholeUpdate.set_lr`: the lrs fairseq's scheduler set at the host's count).
The host counts an update skipped on the device until it reads the flags; the graph picks
the row of fairseq's count, the host's less the skips not yet read (``late``), as
speed/deferred.py does for the eager update.

On a GPU the compiled function is replayed as one CUDA graph (:class:`Replay`).

Through fairseq-train (:func:`whole_update_step`, a wrap of ``Trainer.train_step``) it runs
where the run has ``--graphed-step`` with its gradients inside, ``electra_adam`` and the
deferred checks (fp32 or ``--autocast-bf16``, one worker; on a GPU only with
``ELECTRA_SPEED=+replay`` until its CUDA graph has run on one); otherwise fairseq's update,
said in one log line. The host keeps fairseq's bookkeeping (seed, update count, lr
schedule); the logs wait for ``--log-interval``.
"""

import logging
import os

import torch
from fairseq.logging import metrics
from torch.utils._pytree import tree_map_only

from ..user_io.errors import ElectraUsageError, first_line
from .capturable_adam import CapturableAdam
from .clip import grad_norm, clip_coefficient
from .compile import STRICT, own_code, unguarded_structure
from .deferred import DeviceNorm, deferrable
from .switch import VARIABLE, enabled

logger = logging.getLogger(__name__)


class WholeUpdate:
    """One update of micro-batches, compiled whole at its first call; a call whose
    micro-batches differ from the first call's in number or shape (an epoch's short last
    batch or update) runs the same function eager rather than compiling again. On a GPU
    the compiled function is replayed as one CUDA graph (:class:`Replay`).

    ``step``: the model's :class:`~.compile.GraphedStep`, which must take the gradients
    inside its graph; ``adam``: a :class:`~.capturable_adam.CapturableAdam` over the
    parameters the step takes gradients of (all of them); ``clip_norm``: fairseq's
    ``--clip-norm`` (0: the norm alone); ``window``: how many updates the host may run
    before it reads the skip flags (:meth:`skips_read`), at most ``window - 1`` of them
    skipped.
    """

    def __init__(self, step, adam, clip_norm: float, backend: str, window: int):
        if not step.takes_gradients():
            raise ElectraUsageError(
                "the whole update needs the graphed step to take its gradients inside its "
                "graph (an unscaled loss, ELECTRA_SPEED's gradients part on, no parameter "
                "registered in two modules, not inductor on a GPU); train without it or meet "
                "those")
        where = {id(p): i for i, p in enumerate(step.params)}
        held = [p for group in adam.groups for p in group.params]
        if len(held) != len(step.params) or any(id(p) not in where for p in held):
            raise ElectraUsageError(
                "the whole update's Adam must hold exactly the parameters the step trains "
                "(frozen or resting parameters break this); train without the whole update")
        self.order = [[where[id(p)] for p in group.params] for group in adam.groups]
        self.step, self.adam, self.clip_norm, self.window = step, adam, clip_norm, window
        self.shapes, self.said_eager = None, False
        device = adam.lr.device
        # the host writes (fill_) into these, never rebinds them: a captured graph reads
        # them. (1-D: dynamo would take a 0-dim CPU tensor for a number and guard on it)
        self.lrs = torch.zeros(window, len(adam.groups), dtype=torch.float64, device=device)
        self.count = torch.zeros(1, dtype=torch.int64, device=device)  # the host's count
        self.late = torch.zeros(1, dtype=torch.int64, device=device)  # skips not yet read
        self.compiled = torch.compile(own_code(self.update), backend=backend, fullgraph=True,
                                      dynamic=False,
                                      options={"guard_filter_fn": unguarded_structure})
        self.replayed = device.type == "cuda"
        if self.replayed:
            self.compiled = Replay(self.compiled)

    def set_lr(self, count: int, lrs) -> None:
        """Before the update that follows ``count`` updates (as the host counts them):
        ``lrs``, each group's lr as fairseq's scheduler set it at that count."""
        self.count.fill_(count)
        row = self.lrs[count % self.window]
        for index, lr in enumerate(lrs):
            row[index].fill_(lr)

    def __call__(self, batches):
        """One update of ``batches`` (tuples ``(src_tokens, target, masked_positions,
        masked_weights)``) -> (each micro-batch's training fields and loss, the gradient
        norm, found_inf: 1.0 where the update was skipped), all on the device."""
        self.step.check_unchanged()
        batches = tuple(tuple(b) for b in batches)
        shapes = tuple(tuple(t.shape) for b in batches for t in b)
        self.shapes = self.shapes or shapes
        run = self.compiled
        if shapes != self.shapes:
            run = self.update
            if not self.said_eager:
                logger.info(f"the whole update: {len(batches)} micro-batches of other "
                            f"shapes than the graph's (the first {tuple(batches[0][0].shape)})"
                            f" run eager")
                self.said_eager = True
        with torch.no_grad():  # the graph takes the gradients: no autograd around it
            return run(self.step.values, batches)

    def skips_read(self) -> None:
        """The host has read the updates' skip flags and taken the skipped ones back from
        its count (speed/deferred.py's ``settle``): the graph's count of them restarts."""
        self.late.zero_()

    def update(self, values, batches):
        """The function compiled whole (see the module); ``values``: the parameters by name."""
        grads, fields = None, []
        for src_tokens, *args in batches:
            own, out = self.step.with_gradients(values, src_tokens, *args, True)
            grads = own if grads is None else torch._foreach_add(grads, own)
            fields.append(out)
        if len(batches) > 1:  # fairseq's multiply_grads by 1 / sample_size (1 per batch)
            torch._foreach_mul_(grads, 1.0 / len(batches))
        norm = grad_norm(grads)
        clip = clip_coefficient(norm, self.clip_norm) if self.clip_norm > 0 else \
            torch.ones_like(norm)
        found_inf = (~torch.isfinite(norm)).float()
        # the lr at fairseq's count: the host's less the skips it has not read
        row = torch.remainder(self.count - self.late, self.window)
        self.adam.lr.copy_(self.lrs.index_select(0, row)[0])
        self.adam.update([[grads[i] for i in order] for order in self.order], found_inf, clip)
        self.late.add_(found_inf.long())
        return fields, norm, found_inf


class Replay:
    """The compiled update replayed as one CUDA graph; awaits its first GPU run
    (tests/test_whole_update.py's ``gpu`` tests).

    Captured here, not by inductor's ``triton.cudagraphs``: without cudagraph trees inductor
    runs a graph once before recording it, which would apply the first update twice, and
    copies each input not marked static into a buffer of its own, where an in-place update is
    lost (pytorch/pytorch#103985). Here the first call is a real update, run by the compiled
    code on the capture's stream (the warm-up a capture needs); the second is captured, which
    runs nothing, then replayed, as every later call is. Each batch is copied into the first
    one's tensors; the outputs are copied out of the graph's memory, which the next replay
    overwrites while the logs wait for ``--log-interval``."""

    def __init__(self, compiled):
        self.compiled, self.stream = compiled, torch.cuda.Stream()
        self.batches = self.graph = self.outputs = None

    def __call__(self, values, batches):
        if self.batches is None:  # the warm-up: a real update, from the tensors kept
            self.batches = [[t.clone() for t in batch] for batch in batches]
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                outputs = self.compiled(values, self.batches)
            torch.cuda.current_stream().wait_stream(self.stream)
            return outputs
        for kept, batch in zip(self.batches, batches):
            torch._foreach_copy_(kept, list(batch))
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            try:
                # (thread_local: another thread's CUDA calls, a loader's pinning, are no
                # error, as in inductor's own capture)
                with torch.cuda.graph(self.graph, stream=self.stream,
                                      capture_error_mode="thread_local"):
                    self.outputs = self.compiled(values, self.batches)
            except Exception as error:  # (torch's capture errors have no one class)
                raise ElectraUsageError(
                    f"the whole update cannot be captured as one CUDA graph "
                    f"({first_line(error)}); train without {VARIABLE}=+replay") from error
            logger.info("the whole update is captured as one CUDA graph: each update from "
                        "now on is one replay")
        self.graph.replay()
        return tree_map_only(torch.Tensor, torch.clone, self.outputs)


# the trainer's attribute holding its TrainerUpdate (False: fairseq's update; unset: not
# decided yet, before its first update)
KEY = "electra_whole_update"


def whole_update_step(original, trainer, samples, *args, **kwargs):
    """``Trainer.train_step``: the whole update (:class:`TrainerUpdate`) where the run can
    take it (:func:`why_not`), decided at the run's first update; fairseq's otherwise."""
    if KEY not in trainer.__dict__:
        trainer.__dict__[KEY] = take_over(trainer)
    runner = trainer.__dict__[KEY]
    if runner:
        output = runner(trainer, samples)
        if output is not FELL_BACK:
            return output
    return original(trainer, samples, *args, **kwargs)


def why_not(trainer, step):
    """Why this run cannot take the whole update around its graphed ``step``, or None."""
    if not enabled("update"):
        return f"{VARIABLE}=-update"
    trainer.task.before_first_update(trainer.model, trainer.optimizer)
    if not step.takes_gradients():
        return "the graphed step cannot take its gradients inside its graph (--fp16, --amp, " \
               f"{VARIABLE}=-gradients, a parameter registered in two modules or inductor on " \
               "a GPU)"
    if not deferrable(trainer):
        return f"it needs electra_adam, one worker, fp32 or --autocast-bf16 and {VARIABLE}'s " \
               f"deferred part"
    if trainer.cuda and not enabled("replay"):
        return f"on a GPU its CUDA graph is tried only with {VARIABLE}=+replay (it ran over " \
               f"aot_eager on an H200, untimed)"
    # a generator kind whose resting_parameters overrides its base's (which rests none)
    kind = type(getattr(trainer.model, "generator_kind", None))
    if sum("resting_parameters" in vars(c) for c in kind.__mro__) > 1:
        return "this generator rests parameters between updates (two-stage training)"
    if trainer.cfg.ema.store_ema:
        return "--ema"
    return None


def take_over(trainer):
    """The run's :class:`TrainerUpdate`, its Adam's state moved into a
    :class:`~.capturable_adam.CapturableAdam` that the trainer's optimizer then holds (its
    checkpoints are fairseq's Adam's); False where the run cannot (said in one line where
    it has a graphed step)."""
    step = getattr(getattr(trainer.task, "speed", None), "step", None)
    if step is None:  # (not the electra task's --graphed-step)
        return False
    reason = why_not(trainer, step)
    if reason is None:
        fast = trainer.optimizer
        adam = CapturableAdam(fast.optimizer.param_groups, **fast.optimizer_config)
        adam.load_state_dict(fast.optimizer.state_dict())
        try:
            update = WholeUpdate(step, adam, trainer.cfg.optimization.clip_norm, step.backend,
                                 window=trainer.cfg.common.log_interval + 1)
        except ElectraUsageError as error:
            reason = str(error)
    if reason is not None:
        logger.info(f"the whole update as one graph is off: {reason}; fairseq's update runs")
        return False
    runner = TrainerUpdate(update, fast.optimizer)
    fast._optimizer = adam
    return runner


# what TrainerUpdate returns where the update cannot compile whole: fairseq's runs instead
FELL_BACK = object()


class TrainerUpdate:
    """What fairseq's ``train_step`` does for one update, with the update itself one
    :class:`WholeUpdate` call and its logs kept pending (:mod:`.deferred`); ``fairseqs``:
    the optimizer that fairseq's update steps, given back where the first update cannot
    compile whole."""

    def __init__(self, update: WholeUpdate, fairseqs):
        self.update, self.fairseqs = update, fairseqs

    def __call__(self, trainer, samples):
        trainer._set_seed()
        model, criterion = trainer.model, trainer.criterion
        model.train()
        criterion.train()
        metrics.log_start_time("train_wall", priority=800, round=0)
        samples = [sample for sample, dummy in map(trainer._prepare_sample, samples)
                   if not dummy]
        model.set_num_updates(trainer.get_num_updates())
        if model.generator_kind is not None:
            model.generator_kind.before_step(model)
        adam = self.update.adam
        self.update.set_lr(trainer.get_num_updates(), [g["lr"] for g in adam.param_groups])
        batches = [(s["net_input"]["src_tokens"], s["target"], s["net_input"]["masked_positions"],
                    s["net_input"]["masked_weights"]) for s in samples]
        try:
            with trainer.task.autocast(model):
                fields, norm, _ = self.update(batches)
        except Exception as error:  # as GraphedStep's: the compiler's errors have no one class
            if self.fairseqs is None:
                raise
            return self.fall_back(trainer, error)
        if self.fairseqs is not None:
            replayed = ", replayed as one CUDA graph" if self.update.replayed else ""
            logger.info(f"the whole update (each micro-batch's forward and backward, the "
                        f"clip, Adam) runs as one compiled graph ({self.update.step.backend}"
                        f"{replayed})")
            self.fairseqs = None
        logging_outputs = [criterion.logging_output(model, s, f["logs"], f["loss"],
                                                    s["net_input"]["masked_weights"])
                           for s, f in zip(samples, fields)]
        trainer.set_num_updates(trainer.get_num_updates() + 1)
        output = trainer._reduce_and_log_stats(logging_outputs, float(len(samples)),
                                               DeviceNorm(norm))
        metrics.log_stop_time("train_wall")
        return output

    def fall_back(self, trainer, error):
        """The first update could not compile whole: fairseq's update from now on, with its
        optimizer back (nothing has stepped); with ELECTRA_GRAPHED_STRICT=1 an error."""
        reason = first_line(error)
        if os.environ.get(STRICT) == "1":
            raise ElectraUsageError(f"the whole update cannot be compiled whole ({reason}); "
                                    f"{STRICT}=1 refuses fairseq's update instead") from error
        logger.warning(f"the whole update cannot be compiled whole ({reason}); fairseq's "
                       f"update runs ({STRICT}=1: an error)")
        trainer.optimizer._optimizer = self.fairseqs
        trainer.__dict__[KEY] = False
        return FELL_BACK
