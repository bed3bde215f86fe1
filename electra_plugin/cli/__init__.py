"""The plugin's command lines, one module per command (``electra-prepare`` ... in setup.py).

Each module's ``main(argv=None)`` raises :class:`~electra_plugin.user_io.errors.ElectraUsageError`
on bad input; its ``cli()`` (the console script, also ``python -m electra_plugin.cli.NAME``)
turns that into one line and exit status 1.
"""
