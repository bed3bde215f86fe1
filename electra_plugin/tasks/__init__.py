from . import electra_pretraining  # noqa: F401
