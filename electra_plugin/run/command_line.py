"""fairseq's own command lines (fairseq-train, fairseq-hydra-train, electra-train) end with the
plugin's one line: the function they run a job through (``call_main``), each spawned worker's
(``distributed_main``) and, for fairseq-hydra-train, which imports the plugin inside its job,
hydra's reading of the job's result (``JobReturn.return_value``, which raises the job's
exception) turn an :class:`~electra_plugin.user_io.errors.ElectraUsageError`, the error itself or the
one fairseq's trainer wrapped it in, into the exit with its line, where fairseq's trainer and
hydra would print a traceback. A Python caller of the plugin never passes here and gets the
exception."""

from fairseq.distributed import utils as distributed_utils
from hydra.core.utils import JobReturn

from ..user_io.errors import usage_error_in_chain
from ..environment.wrapping import wrap_function, wrap_property


def install() -> None:
    """Wrap fairseq's functions once per process."""
    if getattr(distributed_utils.call_main, "electra_wrapper", None):
        return
    wrap_function(distributed_utils, "call_main", _exit_with_the_line)
    wrap_function(distributed_utils, "distributed_main", _exit_with_the_line)
    wrap_property(JobReturn, "return_value", _exit_with_the_line)


def _exit_with_the_line(original, *args, **kwargs):
    try:
        return original(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - only a usage error leaves as a line
        usage = usage_error_in_chain(error)
        if usage is None:
            raise
        raise SystemExit(str(usage)) from error
