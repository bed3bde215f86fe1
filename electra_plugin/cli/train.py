"""``electra-train``: ``fairseq-train`` with ``--bf16`` usable on GPUs and CPUs.

fairseq's argument post-processing turns ``--bf16`` into ``--tpu`` (fairseq issue 4696),
which then fails on anything but a TPU. This entry point is fairseq-train otherwise
unchanged: same arguments, same trainer; give ``--tpu`` explicitly to train on a TPU.
"""

import logging
import os
import sys

from fairseq import distributed_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq_cli import train


def cli_main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    # fairseq-train's logging (to stdout); importing the plugin may have set up another
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S", stream=sys.stdout, force=True,
                        level=os.environ.get("LOGLEVEL", "INFO").upper())
    distributed_utils.call_main(convert_namespace_to_omegaconf(parse_args(argv)), train.main)


def parse_args(argv):
    """fairseq-train's arguments, with ``--bf16`` left off the TPU unless ``--tpu`` is given."""
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    if args.bf16 and "--tpu" not in argv:
        args.tpu = False
    return args


if __name__ == "__main__":
    cli_main()
