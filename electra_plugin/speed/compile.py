"""``torch.compile`` of the pre-training model: its encoders (``--torch-compile``), or its
whole step as one graph (``--graphed-step``); part of :mod:`electra_plugin.speed`.

Encoders: each encoder's ``encode`` (embeddings, projection, Transformer layers), which
``dynamic=True`` keeps symbolic so that a batch of another size or length reuses the graph,
its modules' floats constants (the ``floats`` part); the rest of the step stays eager.
``attn_mask`` is None for a batch without padding (SDPA may then run flash attention) and a
tensor otherwise: at most two graphs per encoder.

The step: :meth:`ElectraModel.electra_step` (generator, sampling, corruption, discriminator,
losses) forward and backward under ``fullgraph=True``, which the collater's fixed prediction
slots make possible (no shape depends on the masked count). Where the task knows the
criterion's loss weights, the loss is not scaled (not ``--fp16``/``--amp``), no parameter
is registered in two modules and inductor does not compile for a GPU (where this form failed:
:meth:`GraphedStep.inductor_on_a_gpu`), the backward is in the same graph:
``torch.func.grad_and_value`` of the criterion's loss over the parameters (the step run by
``torch.func.functional_call``) gives the gradients as the graph's outputs, and autograd
only hands them to the parameters (:class:`_Gradients`): one graph call and one
guard check per update instead of two, and no autograd walk through a compiled backward
(docs/benchmarks.md, "The update at the GPU's pace"). Otherwise (or with
``ELECTRA_SPEED=-gradients``) autograd runs the compiled backward as a second graph. On a
GPU each graph is also captured as a CUDA graph and replayed, one launch per graph instead
of one per kernel; ``ELECTRA_SPEED=-cudagraphs`` turns that off. Each graph
is captured on its own (inductor's ``triton.cudagraph_trees=False``: its inputs copied into
fixed buffers, the parameters left where they are) because cudagraph trees stop at full size
on a liveness check (pytorch#154306). A graph holds one shape (``dynamic=False``): a batch of
a new length compiles anew, and a batch with fewer rows than one already compiled at its
length (an epoch's short last batch) runs eager instead. Every batch takes the padded layout
(an attention mask), so that a batch with padding does too; validation runs the eager step
(no second graph for eval mode). A configuration the compiler cannot take whole falls back to
the eager step at its first batch, with one log line. The modules and their state-dict keys
are unchanged.
"""

import logging
import os
import types
import typing

import torch

from ..user_io.errors import ElectraUsageError, first_line
from .layers import trace_layers_once
from .switch import enabled

logger = logging.getLogger(__name__)

BACKENDS = ("off", "inductor", "aot_eager")
# =1: a step that cannot be compiled whole is an error instead of a warning and the eager
# step (the test suite runs so: no silent fall-back goes unseen)
STRICT = "ELECTRA_GRAPHED_STRICT"
CHECK_EVERY = 100  # updates between two checks that the model is the one captured


def compile_encoders(model, backend: str) -> bool:
    """Compile the generator's and the discriminator's ``encode`` in place; True if it did
    (``off``, ``ELECTRA_SPEED=0`` or a model without encoders leave it eager)."""
    if backend == "off" or not enabled():
        return False
    encoders = encoders_of(model)
    # the modules' floats (dropout rates, epsilons) as constants: dynamic=True alone traces
    # each as a symbol with its guards, values that never change from one batch to the next
    # (electra_small's first update: 0.6-0.7x with aot_eager, 0.8x with inductor;
    # docs/benchmarks.md, "Compile time")
    floats = torch._dynamo.config.patch(specialize_float=enabled("floats"))
    for encoder in encoders:
        encoder.encode = floats(torch.compile(encoder.encode, backend=str(backend),
                                              dynamic=True))
    return bool(encoders)


def encoders_of(model) -> list:
    """The generator's and the discriminator's encoders (a tied generator is the
    discriminator: once)."""
    encoders = {id(e): e for e in (getattr(model, "generator", None),
                                   getattr(model, "discriminator", None)) if e is not None}
    return list(encoders.values())


def compile_step(model, backend: str) -> bool:
    """Run ``model.electra_step`` as one compiled graph from now on (see the module); True
    if it will (``ELECTRA_SPEED=0`` leaves it eager)."""
    if not enabled():
        return False
    model.electra_step = GraphedStep(model.electra_step, backend)
    return True


class GraphedStep:
    """``electra_step`` compiled whole at its first batch (replayed as CUDA graphs on a GPU);
    the eager step if that batch's step cannot compile.

    ``combine`` (the step's output -> the loss), the criterion's rule for its loss, which the
    task sets where the loss is not scaled: then the graph also takes the gradients of that
    loss (forward and backward in one graph, see :class:`_Gradients`) and returns the loss
    as the output's ``loss``, which the criterion takes as it is; otherwise autograd runs the
    compiled backward as a second graph. ``accumulates``, which the task
    sets where no DDP wrapper watches autograd's accumulation: the backward adds those
    gradients to the parameters itself rather than through autograd's ~400 accumulation
    nodes (``ELECTRA_SPEED=-accumulate``: through them)."""

    def __init__(self, eager, backend: str):
        self.eager, self.backend = eager, backend
        self.compiled = self.fell_back = self.cudagraphs = self.layers_once = None
        self.combine, self.params, self.accumulates = None, None, False
        self.rows, self.said_short = {}, False  # length -> the most rows captured at it
        self.calls, self.structure = 0, None  # the model's fingerprint at the capture

    def __call__(self, src_tokens, target, masked_positions=None, masked_weights=None,
                 has_padding=None):
        # every batch takes the padded layout (one graph, not one per layout)
        args = (target, masked_positions, masked_weights, True)
        if self.fell_back or not self.eager.__self__.training:  # validation: eager, no graph
            return self.eager(src_tokens, *args)
        first = self.compiled is None
        if first:
            self.compile(src_tokens.is_cuda)
        self.check_unchanged()
        rows, length = src_tokens.shape  # a graph holds one shape
        most = self.rows.setdefault(length, rows)
        if rows < most:  # an epoch's short last batch: eager, rather than minutes of
            # compiling (and under CUDA graphs another graph's memory)
            if not self.said_short:
                logger.info(f"--graphed-step: a batch of {rows} rows, fewer than the graph's "
                            f"{most} at its length, runs eager")
                self.said_short = True
            return self.eager(src_tokens, *args)
        self.rows[length] = rows
        try:
            if self.params is None:
                out = self.compiled(src_tokens, *args)
            else:
                with torch.no_grad():  # the graph takes the gradients: no autograd around it
                    grads, fields = self.compiled(self.values, src_tokens, *args)
                out = self.attach(grads, fields, masked_positions, masked_weights)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            limit = torch._dynamo.config.recompile_limit
            raise ElectraUsageError(
                f"--graphed-step: the step met more than {limit} kinds of batch, dynamo's "
                f"recompile limit (torch._dynamo.config.recompile_limit; lengths seen: "
                f"{sorted(self.rows)}); give the batches fewer lengths (the electra task pads "
                f"them to --tokens-per-sample) or raise the limit") from None
        except Exception as error:  # the compiler's own errors are not all its exception
            # class (torch 2.11 raises AssertionError); a real error of the step recurs eager
            if not first:
                raise
            reason = first_line(error)
            if os.environ.get(STRICT) == "1":
                raise ElectraUsageError(f"--graphed-step: this configuration's step cannot be "
                                        f"compiled whole ({reason}); {STRICT}=1 refuses to "
                                        f"run it eager") from error
            logger.warning(f"--graphed-step: this configuration's step cannot be compiled "
                           f"whole ({reason}); it runs eager ({STRICT}=1: an error)")
            self.fell_back = True
            return self.eager(src_tokens, *args)
        if first:
            logger.info(f"--graphed-step: the step runs as one compiled graph "
                        f"({self.backend}{', CUDA graphs' if self.cudagraphs else ''}"
                        f"{', gradients inside' if self.params is not None else ''}"
                        f"{', each kind of layer traced once' if self.layers_once else ''})")
        if self.cudagraphs:  # a CUDA graph's outputs are overwritten by its next replay;
            # the logs wait for --log-interval (speed/deferred.py), so they get their own copy
            out = out._replace(logs={k: v.clone() if torch.is_tensor(v) else v
                                     for k, v in out.logs.items()})
        return out

    def check_unchanged(self):
        """Counts a call; every ``CHECK_EVERY`` calls, checks that the model is the one of
        the first call, which a graph (this step's or the whole update's) captured."""
        model = self.eager.__self__
        if self.structure is None:
            self.structure = structure(model)
        self.calls += 1
        if self.calls % CHECK_EVERY == 0 and structure(model) != self.structure:
            raise ElectraUsageError(
                "--graphed-step: the model's modules, parameters or hooks changed after its "
                "step was captured, and the graph keeps those of its first batch; make the "
                "change before training starts, or train without --graphed-step")

    def compile(self, on_cuda: bool):
        self.cudagraphs = on_cuda and self.backend == "inductor" and enabled("cudagraphs")
        replay = {"triton.cudagraphs": True, "triton.cudagraph_trees": enabled("trees")}
        step = self.eager
        gradients = self.takes_gradients()
        self.layers_once = trace_layers_once(encoders_of(self.eager.__self__),
                                             allowed=not gradients)
        if gradients:
            if self.cudagraphs:  # the weights stay where they are: no copy per replay
                for p in self.params:
                    torch._dynamo.mark_static_address(p)
            step = self.with_gradients
        options = dict(replay) if self.cudagraphs else {}
        if enabled("guards"):
            options["guard_filter_fn"] = unguarded_structure
            step = own_code(step)  # no other model's call is checked against these guards
        self.compiled = torch.compile(step, backend=self.backend, fullgraph=True,
                                      dynamic=False, options=options or None)

    def takes_gradients(self) -> bool:
        """Whether the graph can take the gradients itself (see the class); if so, what
        :meth:`with_gradients` reads is set up once: the parameters (``params``, ``values``
        by name) and the step's declared output."""
        if self.params is not None:
            return True
        # (a module shared by both encoders is one module: one name reaches it)
        if self.combine is None or not enabled("gradients") or \
                tied_across_modules(self.eager.__self__) or self.inductor_on_a_gpu():
            return False
        self.as_module = _Step(self.eager)
        self.values = {name: p for name, p in self.as_module.named_parameters()
                       if p.requires_grad}
        self.params = list(self.values.values())
        self.output = declared_output(typing.get_type_hints(self.eager)["return"])
        return True

    def inductor_on_a_gpu(self) -> bool:
        """Whether inductor compiles this step for a GPU, where the one-graph form failed at
        its first call: Triton's launcher met a CPU buffer among the logged counts' kernel
        arguments (H200, torch 2.11; docs/benchmarks.md, "The one-graph step on a GPU").
        There the backward stays with autograd, as a second graph."""
        return self.backend == "inductor" and \
            any(p.is_cuda for p in self.eager.__self__.parameters())

    def with_gradients(self, params, src_tokens, *args):
        """The gradients of the criterion's loss (``combine``), one per parameter of
        ``self.params``, and the step with that loss, traced as one function of the
        parameters."""
        device = src_tokens.device.type
        # the forward under the caller's autocast, the backward outside it, as autograd's
        autocast = torch.autocast(device, torch.get_autocast_dtype(device),
                                  enabled=torch.is_autocast_enabled(device))

        def loss(values):
            with autocast:
                out = torch.func.functional_call(self.as_module, values, (src_tokens, *args),
                                                 tie_weights=False)
            # what a training step's reader (the criterion) takes: the losses and logs
            return self.combine(out), {name: getattr(out, name)
                                       for name in self.output.TRAINING_FIELDS
                                       if getattr(out, name) is not None}

        with torch.autocast(device, enabled=False):
            grads, (value, fields) = torch.func.grad_and_value(loss, has_aux=True)(params)
        return list(grads.values()), dict(fields, loss=value)

    def attach(self, grads, fields, masked_positions, masked_weights):
        """The step's output (its losses, logs and prediction slots) with its ``loss``
        handed to autograd as :class:`_Gradients`' output."""
        out = self.output(**{name: fields.get(name) for name in self.output._fields})
        targets = self.params if self.accumulates and enabled("accumulate") else None
        loss = _Gradients.apply(grads, not self.cudagraphs, targets, out.loss,
                                *(self.params if targets is None else (_ANCHOR,)))
        return out._replace(positions=masked_positions, masked_weights=masked_weights,
                            loss=loss)


# dynamo's guards on what a module is rather than on the values the step reads: its type,
# its hook dictionaries being empty, which attributes it has, its dictionaries' keys
STRUCTURE = frozenset({"TYPE_MATCH", "EMPTY_NN_MODULE_HOOKS_DICT", "DICT_CONTAINS",
                       "DICT_NOT_CONTAINS", "NOT_PRESENT_IN_GENERIC_DICT", "DICT_KEYS_MATCH"})


def unguarded_structure(entries) -> list:
    """dynamo's ``guard_filter_fn``: every guard kept but those on the structure of the model
    (reached from the graphed function's ``self``), which the graph fixes at its first
    batch anyway (its parameters are taken then); guards on values (tensors' shapes, the
    numbers and flags the step reads, the training mode) stay. Checking the ~4,000 dropped
    guards took about 1 ms of host time per update (docs/benchmarks.md)."""
    return [not (entry.guard_type in STRUCTURE and
                 (entry.name == "self" or entry.name.startswith(("self.", "self["))))
            for entry in entries]


def structure(model) -> int:
    """A fingerprint of what a graph fixes at its capture: each parameter (name, object,
    shape, dtype, device, whether it trains) and each module (name, type, hooks). Taken
    every ``CHECK_EVERY`` updates: ~1.6 ms at electra_small on a CPU thread."""
    return hash((tuple((name, id(p), p.shape, p.dtype, p.device, p.requires_grad)
                       for name, p in model.named_parameters()),
                 tuple((name, type(m), len(m._forward_hooks), len(m._forward_pre_hooks))
                       for name, m in model.named_modules())))


def own_code(method):
    """``method`` with a copy of its code object: dynamo keeps compiled graphs per code
    object, so the copy's graphs serve this object's calls alone (as dynamo's own
    ``debug_force_nested_calls`` does)."""
    f = method.__func__
    copy = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__,
                              f.__closure__)
    copy.__kwdefaults__, copy.__annotations__ = f.__kwdefaults__, f.__annotations__
    return types.MethodType(copy, method.__self__)


def declared_output(output: type) -> type:
    """The step's output type (a NamedTuple), once it is checked to declare the fields a
    graph with the gradients inside returns (``TRAINING_FIELDS``) and fills in
    (``FILLED_BY_THE_GRAPH``) among its own: a renamed field is this error, not a step
    that fails to trace and quietly runs eager."""
    declared = (*getattr(output, "TRAINING_FIELDS", ()),
                *getattr(output, "FILLED_BY_THE_GRAPH", ()))
    missing = [name for name in declared if name not in getattr(output, "_fields", ())]
    if not declared or missing:
        raise TypeError(f"--graphed-step: the step's output {output.__name__} must be a "
                        f"NamedTuple declaring TRAINING_FIELDS and FILLED_BY_THE_GRAPH among "
                        f"its fields (missing: {', '.join(missing) or 'the declarations'})")
    return output


class _Step(torch.nn.Module):
    """The eager step as a module's forward, for ``torch.func.functional_call`` (the
    model's own forward calls the graphed step); its parameters are the model's, under
    ``model.``."""

    def __init__(self, eager):
        super().__init__()
        self.model, self.eager = eager.__self__, eager

    def forward(self, *args):
        return self.eager(*args)


def tied_across_modules(model) -> bool:
    """Whether a parameter is registered in two modules (a tie the graph's reparametrization
    would miss at one of them; a module shared whole is no such tie)."""
    owners = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                owners.setdefault(id(p), set()).add((id(module), name))
    return any(len(places) > 1 for places in owners.values())


class _Gradients(torch.autograd.Function):
    """The step's loss, whose gradients the graph has already taken. A backward of the loss
    times s (fairseq's ``loss.backward()``: s = 1; ``ignore_grad``: 0) gets s as its
    cotangent, and the graph's gradients are scaled by it. They reach the parameters through
    autograd's accumulation (``--update-freq``, DDP's hooks), or, given ``targets``, by being
    added to ``targets``' gradients here, as autograd's accumulation would (the parameters
    are then not this function's inputs: ``_ANCHOR`` is)."""

    @staticmethod
    def forward(ctx, grads, own, targets, loss, *params):
        """``own``: the gradients are this call's own (not a CUDA graph's reused buffers) and
        may be scaled in place."""
        ctx.grads, ctx.own, ctx.targets = grads, own, targets
        return loss.clone()  # (a CUDA graph's buffer is reused)

    @staticmethod
    def backward(ctx, scale):
        grads, ctx.grads = ctx.grads, None  # autograd's only reference: p.grad takes it
        if ctx.own:
            torch._foreach_mul_(grads, scale)
        else:
            grads = torch._foreach_mul(grads, scale)
        if ctx.targets is None:
            return (None, None, None, None, *grads)
        accumulate(ctx.targets, grads)
        return None, None, None, None, None  # (nothing for the anchor)


# an input that requires a gradient, so that autograd calls the backward where the
# parameters are not inputs (it never gets a gradient)
_ANCHOR = torch.zeros((), requires_grad=True)


def accumulate(params, grads) -> None:
    """``p.grad`` += ``g`` for each pair, as autograd's accumulation: a parameter without a
    gradient takes ``g`` itself (a copy in the parameter's layout where the compiler gave it
    another: the optimizer's kernels take the two as one), the others add it in place (one
    multi-tensor add)."""
    held, added = [], []
    for p, g in zip(params, grads):
        if p.grad is None:
            p.grad = g if g.stride() == p.stride() else torch.empty_like(p).copy_(g)
        else:
            held.append(p.grad)
            added.append(g)
    if held:
        torch._foreach_add_(held, added)
