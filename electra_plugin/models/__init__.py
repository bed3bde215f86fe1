from . import electra  # noqa: F401
