"""Where the plugin's own files are, for fairseq's commands outside a clone.

  python -m electra_plugin user-dir                 the directory to give --user-dir
                                                    (hydra: common.user_dir)
  python -m electra_plugin config-dir pretraining   the pre-training recipes (--config-dir)
  python -m electra_plugin config-dir glue          the GLUE fine-tuning recipes

Example (an installed plugin, any directory):
  fairseq-train data-bin/news --user-dir "$(python -m electra_plugin user-dir)" \\
      --task electra --criterion electra --arch electra_small ...
  fairseq-hydra-train --config-dir "$(python -m electra_plugin config-dir pretraining)" \\
      --config-name electra_small task.data=$PWD/data-bin/news \\
      common.user_dir="$(python -m electra_plugin user-dir)"
"""

import sys

from electra_plugin.cli.vocabulary import command_parser
from electra_plugin.environment.locations import RECIPES, recipes_dir, user_dir
from electra_plugin.user_io.errors import command_line


def build_parser():
    p = command_parser("python -m electra_plugin", __doc__)
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("user-dir", help="the plugin's directory, for --user-dir")
    recipes = sub.add_parser("config-dir", help="a directory of hydra recipes, for --config-dir")
    recipes.add_argument("recipes", choices=RECIPES, help="which recipes")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    print(user_dir() if args.what == "user-dir" else recipes_dir(args.recipes))


if __name__ == "__main__":
    sys.exit(command_line(main, logs=False))
