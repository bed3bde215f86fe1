"""fairseq's Adam update over all of a group's tensors at once; part of
:mod:`electra_plugin.speed` (``ELECTRA_SPEED=0``: fairseq's own loop).

fairseq's own Adam (used without apex) loops in Python over the parameter tensors, nine ops
each: for ELECTRA-Small's ~400 tensors that is ~4,000 kernel launches per update on a GPU,
and on CPU twice the time of torch's fused Adam kernel (24 vs 11 ms per update on 2 cores).
The state (``step``, ``exp_avg``, ``exp_avg_sq``) stays fairseq's, so checkpoints move
freely between the three. Each parameter group's lists of tensors and states are found once
and kept while they hold (a walk over ~400 states per update is ~1 ms of host time).
"""

import math
from collections import defaultdict
from typing import NamedTuple

import torch
from fairseq.optim.adam import Adam


class MultiTensorAdam(Adam):
    """fairseq's ``Adam`` (decoupled weight decay, fairseq's eps placement), multi-tensor.

    Two kernels, picked by ``fused`` (default: by device):

    - foreach (GPUs): one ``torch._foreach_*`` op per stage of fairseq's arithmetic, in its
      order: the same result bit for bit.
    - fused (CPU): torch's fused Adam kernel, one pass per tensor. It adds eps after the
      bias correction where fairseq adds it before, so it gets ``eps / sqrt(1 - beta2**t)``,
      the same denominator; the weight decay stays fairseq's ``p - lr * wd * p`` (the
      kernel's ``p * (1 - lr * wd)`` rounds ``1 - lr * wd`` the same way every update,
      a systematic error of up to 1% of the decay). Equal to fairseq's up to rounding.

    Falls back to fairseq's loop for what neither covers: amsgrad, sparse gradients, and
    parameters or gradients that are not fp32 (``--memory-efficient-fp16``).
    """

    def __init__(self, params, fused=None, **adam_args):
        super().__init__(params, **adam_args)
        self.fused = fused
        # set for the next step only: 1.0 on the device skips it there (speed/deferred.py)
        self.found_inf = None
        # set for the next step only: earlier updates skipped on the device that the host
        # still counts (speed/deferred.py), a :class:`Behind`
        self.behind = None
        # set for the next step only: the clip's coefficient, applied to the gradients as
        # the step reads them (speed/clip.py: no pass of its own over them)
        self.clip_coef = None
        self.plans = {}  # id(group) -> Plan: its tensors, found once

    @torch.no_grad()
    def step(self, closure=None):
        found_inf, self.found_inf = self.found_inf, None
        behind, self.behind = self.behind, None
        clip, self.clip_coef = self.clip_coef, None
        grads = [self._planned_grads(group) for group in self.param_groups]
        if any(g is None for g in grads) and not self._multi_tensor_ok():
            if found_inf is not None and found_inf.item():  # fairseq's loop cannot skip
                return None
            if clip is not None:
                torch._foreach_mul_([p.grad for group in self.param_groups
                                     for p in group["params"] if p.grad is not None], clip)
            return super().step(closure)
        by_group = [self._tensors_by_step(group) if g is None else self._planned(group, g)
                    for group, g in zip(self.param_groups, grads)]
        unscale = None if clip is None else clip.reciprocal()  # the fused kernel divides
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, (group, by_step) in enumerate(zip(self.param_groups, by_group)):
            lr, late = (group["lr"], None) if behind is None else \
                (behind.lrs[index], behind.count)
            for step, tensors in by_step.items():
                fused = self.fused if self.fused is not None else not tensors[0][0].is_cuda
                if found_inf is not None or fused:  # only the fused kernel skips on the device
                    _fused_update(group, step, *tensors, found_inf=found_inf,
                                  grad_scale=unscale, lr=lr, late=late)
                else:
                    if clip is not None:
                        torch._foreach_mul_(tensors[1], clip)
                    _foreach_update(group, step, *tensors)
        return loss

    def zero_grad(self, set_to_none: bool = True):
        self.clip_coef = None  # an update that stopped before its step (an overflow)
        super().zero_grad(set_to_none)

    def _tensors_by_step(self, group):
        """{step: (params, grads, exp_avgs, exp_avg_sqs)}, fairseq's state created or moved
        as its loop would. A group's tensors share one step unless some missed updates; a
        group whose every tensor had a gradient and one step gets a :class:`Plan`."""
        by_step = defaultdict(lambda: ([], [], [], []))
        states = []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]  # (a loaded one: on p's device and dtype, as torch loads)
            if len(state) == 0:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            states.append(state)
            params, grads, exp_avgs, exp_avg_sqs = by_step[state["step"]]
            params.append(p)  # (no .data: under no_grad, without a detach per tensor)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
        self.plans.pop(id(group), None)
        if len(by_step) == 1 and len(states) == len(group["params"]):
            params, _, exp_avgs, exp_avg_sqs = next(iter(by_step.values()))
            self.plans[id(group)] = Plan(group, self.state, params, states, exp_avgs,
                                         exp_avg_sqs)
        return by_step

    def _planned_grads(self, group):
        """The gradients of the group's :class:`Plan`, or None where it has none or it no
        longer holds: another state (``load_state_dict``), other parameters, a tensor
        without a gradient."""
        plan = self.plans.get(id(group))
        if plan is None or plan.group is not group or plan.state is not self.state or \
                len(group["params"]) != len(plan.params):
            return None
        grads = [p.grad for p in plan.params]
        return None if any(g is None for g in grads) else grads

    def _planned(self, group, grads):
        """``_tensors_by_step(group)`` from its :class:`Plan`: no walk over the states."""
        plan = self.plans[id(group)]
        for state in plan.states:
            state["step"] += 1
        return {plan.states[0]["step"]: (plan.params, grads, plan.exp_avgs, plan.exp_avg_sqs)}

    def _multi_tensor_ok(self):
        return all(
            not group.get("amsgrad", False) and all(
                p.grad is None or (p.dtype == torch.float32 and p.grad.dtype == torch.float32
                                   and not p.grad.is_sparse)
                for p in group["params"])
            for group in self.param_groups)


class Behind(NamedTuple):
    """Updates that the device skipped (found non-finite, not yet read) and the host still
    counts: fairseq's update and step counts are ``count`` lower, so the next update takes
    each group's lr at fairseq's count and its bias corrections at its step less ``count``."""

    count: torch.Tensor  # a device scalar
    lrs: torch.Tensor  # each group's lr at fairseq's count, on the device


class Plan(NamedTuple):
    """A parameter group's tensors and states as one step found them (their step shared),
    kept for the next steps while ``group`` and ``state`` are the optimizer's."""

    group: dict
    state: dict
    params: list
    states: list
    exp_avgs: list
    exp_avg_sqs: list


def _foreach_update(group, step, params, grads, exp_avgs, exp_avg_sqs):
    beta1, beta2 = group["betas"]
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    denoms = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denoms, group["eps"])
    step_size = group["lr"] * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
    _decay_weights(group, params)
    torch._foreach_addcdiv_(params, exp_avgs, denoms, value=-step_size)


def _fused_update(group, step, params, grads, exp_avgs, exp_avg_sqs, found_inf=None,
                  grad_scale=None, lr=None, late=None):
    """``found_inf``: a device scalar, 1.0 to leave everything as it is (no host read);
    ``grad_scale``: a device scalar the kernel divides the gradients by (the clip's
    reciprocal) in its one pass over them; ``lr``: ``group["lr"]`` or a device scalar;
    ``late``: a device count of skipped updates in ``step``, fairseq's step being
    ``step - late`` (the kernel takes eps as a number of ``step``, so the bias corrections'
    difference goes into the kernel's lr)."""
    beta1, beta2 = group["betas"]
    lr = group["lr"] if lr is None else lr
    _decay_weights(group, params, found_inf, lr)  # (m and v do not depend on p: order is free)
    if late is not None:
        lr = (lr * _step_size(step - late.double(), beta1, beta2) /
              _step_size(step, beta1, beta2)).float()
    steps = [torch.full((), float(step), device=params[0].device)] * len(params)
    torch._fused_adam_(
        params, grads, exp_avgs, exp_avg_sqs, [], steps,
        lr=lr, beta1=beta1, beta2=beta2, weight_decay=0.0,
        eps=group["eps"] / math.sqrt(1 - beta2 ** step), amsgrad=False, maximize=False,
        grad_scale=grad_scale, found_inf=found_inf)


def _step_size(step, beta1, beta2):
    """fairseq's Adam step size over lr at ``step`` (a number or a tensor)."""
    return (1 - beta2 ** step) ** 0.5 / (1 - beta1 ** step)


def _decay_weights(group, params, found_inf=None, lr=None):
    if group["weight_decay"] == 0:
        return
    rate = -group["weight_decay"] * (group["lr"] if lr is None else lr)
    if found_inf is None:
        torch._foreach_add_(params, params, alpha=rate)
    else:
        torch._foreach_add_(params, torch._foreach_mul(params, (1 - found_inf) * rate))
