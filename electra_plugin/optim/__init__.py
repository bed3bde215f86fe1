from . import layer_decay  # noqa: F401
