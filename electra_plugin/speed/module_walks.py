"""What fairseq does to the whole model on every update, without its cost: it sets the
training mode twice (its Trainer, then its task), each call a walk that assigns ``training``
on every module, and passes the update count to every module that takes it, found with a
``hasattr`` that raises and catches an AttributeError in each module that does not. At
electra_small's ~280 modules that is 0.9 ms per mode call and 0.8 ms for the count on one
CPU thread: host time that a graphed step leaves to Python. Here a walk reads the modules'
``training`` and assigns only if one differs, and the count goes to the modules whose class
(or instance) defines ``set_num_updates``; the list of the model's modules is kept until a
module is registered anywhere (torch's global registration hook). ``ELECTRA_SPEED=-walks``
turns this part off."""

from torch import nn
from torch.nn.modules.module import register_module_module_registration_hook

from .switch import enabled

_registrations = 0  # modules registered so far, anywhere: a kept list is stale after one


def _registered(module, name, submodule):
    global _registrations
    _registrations += 1


register_module_module_registration_hook(_registered)


def train(model: nn.Module, mode: bool, plain) -> nn.Module:
    """``plain(mode)`` (``nn.Module.train``) unless every module is already in ``mode``."""
    if enabled("walks") and all(m.training is mode for m in _modules(model)):
        return model
    return plain(mode)


def set_num_updates(model: nn.Module, num_updates: int, plain) -> None:
    """fairseq's ``BaseFairseqModel.set_num_updates``: ``num_updates`` to every module but
    ``model`` that has a ``set_num_updates`` (``plain``: fairseq's own walk)."""
    if not enabled("walks"):
        return plain(num_updates)
    for m in _modules(model):
        if m is not model and (hasattr(type(m), "set_num_updates")
                               or "set_num_updates" in m.__dict__):
            m.set_num_updates(num_updates)


def _modules(model: nn.Module) -> tuple:
    """``model`` and every module below it, a shared one once, kept on the model until a
    module is registered anywhere."""
    kept = model.__dict__.get("_walk")
    if kept is None or kept[0] != _registrations:
        stack, seen = [model], {}
        while stack:
            module = stack.pop()
            if id(module) not in seen:
                seen[id(module)] = module
                stack.extend(m for m in module._modules.values() if m is not None)
        kept = model.__dict__["_walk"] = (_registrations, tuple(seen.values()))
    return kept[1]
