"""The ELECTRA model (electra.py, registered by the package), its configuration and parts."""
