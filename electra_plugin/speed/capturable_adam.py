"""fairseq's Adam with every number that changes between updates kept on the device, so
that one update can be captured as a CUDA graph and replayed for all the others. The
whole update (speed/whole_update.py) calls it inside its graph; tests/test_capturable_adam.py
holds it to fairseq's Adam.

:class:`~.adam.MultiTensorAdam` reads the learning rate (a float fairseq's scheduler sets
each update) and the step count (an int, for the bias corrections) on the host: a captured
graph would replay the first update's values forever. Here both are device tensors, and an
overflowed update is skipped by arithmetic instead of a branch on the flag.
"""

from typing import NamedTuple

import torch
from fairseq.optim.adam import Adam


class CapturableAdam(Adam):
    """fairseq's ``Adam`` (decoupled weight decay ``p -= lr * wd * p``, eps added to
    ``sqrt(v)``) whose ``step()`` reads nothing from the host that changes between updates,
    and never waits for the device.

    Device tensors, made once; their owners write into them (``fill_``, ``copy_``), never
    rebind them, so that a captured update keeps reading the right memory:

    - ``lr``: the groups' learning rates (float64, one per group). ``group["lr"]`` stays
      the host's record (fairseq's scheduler sets it, checkpoints hold it);
      :meth:`lr_to_device` copies it over and must run after each change, outside the
      captured region;
    - ``found_inf``: 1.0 skips the update: weights, moments and step counts stay as they
      are, as fairseq leaves them by not stepping;
    - ``clip_coef``: the gradients are multiplied by it first (fairseq's clip; 1.0: none);
    - ``steps``: each group's step count (float64), which ``state[p]["step"]`` of each of
      its parameters is (a view).

    A CUDA-graphed training step would use it so: build it once over the fp32 parameters
    (every one of them must have its gradient at every step, in the same ``.grad`` tensor:
    a captured update cannot leave tensors out); warm up on a side stream with
    ``found_inf.fill_(1)`` (a step that changes nothing but zeroes the gradients); capture
    ``step()`` in ``torch.cuda.graph``; then each update: gradients into those ``.grad``
    tensors and ``found_inf`` / ``clip_coef`` written (by the graphed step itself or
    before the replay), the scheduler's ``set_lr``, :meth:`lr_to_device`, ``replay()``.

    ``state_dict()`` is fairseq's Adam's (``step`` a number; parameters never stepped left
    out) and ``load_state_dict`` takes fairseq's, copying into the existing tensors; a
    group's parameters must be at one step (here they always step together).
    """

    def __init__(self, params, **adam_args):
        super().__init__(params, **adam_args)
        device = self.param_groups[0]["params"][0].device
        if any(g["amsgrad"] or p.dtype != torch.float32 or p.device != device
               for g in self.param_groups for p in g["params"]):
            raise ValueError("CapturableAdam takes fp32 parameters on one device, without "
                             "amsgrad")
        self.found_inf = torch.zeros((), device=device)
        self.clip_coef = torch.ones((), device=device)
        # 1-D, not one 0-dim tensor per group: dynamo takes a 0-dim float64 CPU input for a
        # Python float, guards on its value and loses what the update adds to it
        self.lr = torch.tensor([g["lr"] for g in self.param_groups], dtype=torch.float64,
                               device=device)
        self.steps = torch.zeros(len(self.param_groups), dtype=torch.float64, device=device)
        self.groups = []
        for index, group in enumerate(self.param_groups):
            for p in group["params"]:
                self.state[p] = {"step": self.steps[index], "exp_avg": torch.zeros_like(p),
                                 "exp_avg_sq": torch.zeros_like(p)}
            self.groups.append(self._group(group))

    def add_param_group(self, param_group):
        if hasattr(self, "groups"):
            raise ValueError("CapturableAdam's groups are fixed when it is made (a captured "
                             "update holds their tensors)")
        super().add_param_group(param_group)

    def lr_to_device(self):
        """Each group's ``lr`` into ``self.lr``: one fill kernel per group, no copy from
        host memory and no wait."""
        for index, group in enumerate(self.param_groups):
            self.lr[index].fill_(group["lr"])

    @torch.no_grad()
    def step(self, closure=None):
        """One update from the device tensors alone (see the class); the gradients are left
        clipped, as fairseq's clip leaves them, and zeroed when the update is skipped."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = [[p.grad for p in group.params] for group in self.groups]
        if any(g is None for group in grads for g in group):
            raise ValueError("CapturableAdam updates every parameter at every step: each "
                             "needs a gradient")
        self.update(grads, self.found_inf, self.clip_coef)
        return loss

    @torch.no_grad()
    def update(self, grads, found_inf, clip_coef):
        """:meth:`step` from gradients given (a list per group, in its parameters' order)
        rather than ``.grad``, with the overflow flag and clip coefficient given: what a
        graph that takes the gradients itself calls (speed/whole_update.py). The gradients
        are clipped in place (zeroed when skipped)."""
        skip = found_inf != 0
        keep = 1 - found_inf.double()  # 0 or 1: multiplies what the update moves
        for index, (group, group_grads) in enumerate(zip(self.groups, grads)):
            _update(group, group_grads, self.steps[index], self.lr[index], clip_coef, skip,
                    keep)

    def state_dict(self):
        """fairseq's Adam's: ``step`` a number (one read of the device, at checkpoint
        time), the parameters never stepped without state."""
        saved = super().state_dict()
        for packed, count in zip(saved["param_groups"], self.steps.tolist()):
            for index in packed["params"]:
                if count == 0:
                    del saved["state"][index]
                else:
                    saved["state"][index] = dict(saved["state"][index], step=int(count))
        return saved

    def load_state_dict(self, state_dict):
        """fairseq's Adam's state (or this one's), copied into this optimizer's tensors: a
        captured update goes on reading them. A parameter without state starts afresh."""
        steps = []
        for group in state_dict["param_groups"]:
            counts = {int(state_dict["state"].get(i, {}).get("step", 0))
                      for i in group["params"]}
            if len(counts) > 1:
                raise ValueError(f"CapturableAdam steps a group's parameters together; this "
                                 f"state has them at steps {sorted(counts)}")
            steps.append(counts.pop() if counts else 0)
        own = {p: self.state[p] for group in self.param_groups for p in group["params"]}
        super().load_state_dict(state_dict)
        for p, mine in own.items():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in self.state[p]:
                    mine[key].copy_(self.state[p][key])
                else:
                    mine[key].zero_()
            self.state[p] = mine
        self.steps.copy_(torch.tensor(steps, dtype=torch.float64))
        self.groups = [self._group(group) for group in self.param_groups]
        self.lr_to_device()

    def _group(self, group):
        params = group["params"]
        return Group(group, params, [self.state[p]["exp_avg"] for p in params],
                     [self.state[p]["exp_avg_sq"] for p in params])


class Group(NamedTuple):
    """A parameter group as the update reads it: fairseq's dict of its hyperparameters and
    its tensors. (The update never reads ``param_groups`` or ``state``: dynamo guards on
    every value of an optimizer's ``param_groups``, ``lr`` included, and would compile the
    update anew for each learning rate.)"""

    hyper: dict
    params: list
    exp_avgs: list
    exp_avg_sqs: list


def _update(group, grads, step, lr, clip_coef, skip, keep):
    """fairseq's arithmetic over a group's tensors, in its order, with the scalars on the
    device: the step size and weight decay computed in float64, as fairseq computes them in
    Python, then rounded to fp32 (as its kernels round them). A skipped update multiplies
    the moments by 1, the step size and decay by 0, and adds 0 to the step count."""
    beta1, beta2 = group.hyper["betas"]
    weight_decay = group.hyper["weight_decay"]
    params, exp_avgs, exp_avg_sqs = group.params, group.exp_avgs, group.exp_avg_sqs
    torch._foreach_mul_(grads, clip_coef)
    for g in grads:  # an overflow's inf or nan would reach the moments, as 0 * inf = nan
        g.masked_fill_(skip, 0.0)
    torch._foreach_mul_(exp_avgs, torch.where(skip, 1.0, beta1).float())
    torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, torch.where(skip, 1.0, beta2).float())
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    denoms = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denoms, group.hyper["eps"])
    t = step + 1  # this update's count: finite bias corrections even when skipped at 0
    step_size = lr * torch.sqrt(1 - beta2 ** t) / (1 - beta1 ** t) * keep
    if weight_decay != 0:
        rate = (-weight_decay * lr * keep).float()
        torch._foreach_add_(params, torch._foreach_mul(params, rate))
    torch._foreach_addcdiv_(params, torch._foreach_mul(exp_avgs, (-step_size).float()), denoms)
    step.add_(keep)
