"""ELECTRA pre-training and fine-tuning for fairseq (``--user-dir electra_plugin``).

fairseq imports ``tasks/`` and ``models/`` of a user dir by itself; everything else that
registers is imported here.
"""

from . import criterions, optim, tasks  # noqa: F401
from .run import command_line, crash_safety, scale_out  # noqa: F401
from .models import electra  # noqa: F401  (registers the model and its archs)

crash_safety.install()
scale_out.install()
command_line.install()
