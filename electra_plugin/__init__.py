"""ELECTRA pre-training and fine-tuning for fairseq (``--user-dir electra_plugin``).

fairseq imports ``tasks/`` and ``models/`` of a user dir by itself; everything else that
registers or wraps fairseq is imported here.
"""

import sys


def _register():
    from fairseq.optim import register_optimizer

    from . import criterions, tasks  # noqa: F401
    from .models import electra  # noqa: F401  (registers the model and its archs)
    from .optim.layer_decay import ElectraAdam, ElectraAdamConfig
    from .run import command_line, divergence, loader_workers, safety_wrappers, scale_out
    from .speed import optimizer, trainer_patches

    # layer-wise decay (optim/) with the speed parts of fairseq's Adam wrapper (speed/)
    register_optimizer("electra_adam", dataclass=ElectraAdamConfig)(optimizer.fast(ElectraAdam))

    safety_wrappers.install()
    loader_workers.install()
    scale_out.install()
    trainer_patches.install(on_nonfinite=divergence.skip_or_stop,
                            skips_left=divergence.skips_left)
    command_line.install()


# ``python -m electra_plugin`` (__main__.py) only prints where the plugin's files are: while
# Python locates that module, argv[0] is "-m"; it skips fairseq's import (seconds)
if not (sys.argv[:1] == ["-m"] and "-m" in sys.orig_argv[1:-1]
        and sys.orig_argv[sys.orig_argv.index("-m") + 1] == __name__):
    _register()
