"""ELECTRA pre-training and fine-tuning for fairseq (``--user-dir electra_plugin``).

fairseq imports ``tasks/`` and ``models/`` of a user dir by itself; everything else that
registers is imported here.
"""

from . import criterions, crash_safety, models, optim, tasks  # noqa: F401

crash_safety.install()
