"""How the plugin wraps a function of the installed fairseq: the wrapper gets the original
first and calls it, and each wrap names itself, so that docs/design.md's table of wraps is
checked against what is installed (tests/test_fairseq_wraps.py)."""

import functools


def wrap_function(owner, name, wrapper):
    """``owner.name`` becomes ``wrapper(original, *args)``; it keeps the original's name and
    signature (``__wrapped__``) and names its wrapper (``electra_wrapper``), which
    docs/design.md lists and tests/test_fairseq_wraps.py checks."""
    original = getattr(owner, name)
    wrapped = functools.wraps(original)(functools.partial(wrapper, original))
    wrapped.electra_wrapper = wrapper.__name__
    setattr(owner, name, wrapped)


def wrap_property(cls, name, wrapper):
    """:func:`wrap_function` for a property's getter."""
    prop = getattr(cls, name)
    getter = functools.wraps(prop.fget)(functools.partial(wrapper, prop.fget))
    getter.electra_wrapper = wrapper.__name__
    setattr(cls, name, property(getter, prop.fset))


def wrap_method(cls, name, wrapper):
    """:func:`wrap_function` for a method: a partial object would not bind ``self``."""
    original = getattr(cls, name)

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        return wrapper(original, self, *args, **kwargs)

    method.electra_wrapper = wrapper.__name__
    setattr(cls, name, method)
