"""``electra-train``: ``fairseq-train`` with the plugin loaded and ``--bf16`` usable on GPUs
and CPUs.

fairseq's argument post-processing turns ``--bf16`` into ``--tpu`` (fairseq issue 4696),
which then fails on anything but a TPU. This entry point is fairseq-train otherwise
unchanged: same arguments, same trainer; give ``--tpu`` explicitly to train on a TPU. It
needs no ``--user-dir``, and ``electra-train --task electra --help`` lists the task's, the
model's and the criterion's options (fairseq-train prints its help before it adds them).
"""

import logging
import os
import sys

from fairseq import distributed_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq_cli import train

from electra_plugin.environment.locations import user_dir


def cli_main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    # fairseq-train's logging (to stdout); importing the plugin may have set up another
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", stream=sys.stdout, force=True,
                        level=os.environ.get("LOGLEVEL", "INFO").upper())
    distributed_utils.call_main(convert_namespace_to_omegaconf(parse_args(argv)), train.main)


def parse_args(argv):
    """fairseq-train's arguments, with ``--bf16`` left off the TPU unless ``--tpu`` is given."""
    if "--user-dir" not in argv and not any(a.startswith("--user-dir=") for a in argv):
        argv = ["--user-dir", user_dir(), *argv]
    parser = options.get_training_parser()
    if "-h" in argv or "--help" in argv:
        print_help(parser, [a for a in argv if a not in ("-h", "--help")])
    args = options.parse_args_and_arch(parser, input_args=argv)
    if args.bf16 and "--tpu" not in argv:
        args.tpu = False
    return args


def print_help(parser, argv):
    """fairseq's help with the options of the chosen task, arch (default: electra_small) and
    criterion, which it adds to ``parser`` only while it parses (with a stand-in for the
    data directory, which the help does not need)."""
    arch = [] if "--arch" in argv or "-a" in argv else ["--arch", "electra_small"]
    options.parse_args_and_arch(parser, input_args=["DATA", *argv, *arch], parse_known=True)
    for action in parser._actions:
        if "--bf16" in action.option_strings:
            action.help = "use bfloat16 (on GPUs and CPUs; add --tpu for a TPU)"
    parser.print_help()
    sys.exit(0)


if __name__ == "__main__":
    cli_main()
