"""Optimizers: ``electra_adam``'s layer-wise lr decay (registered by the plugin's ``__init__``)."""
