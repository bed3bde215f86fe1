"""The words every command uses for the same things (docs/commands.md shows the table).

Each console command builds its parser with :func:`command_parser` and :func:`subcommand`,
so that its help lists the subcommands with one-line summaries, ends in examples and shows
every default; an option spelled differently in an earlier release stays accepted, hidden,
through :func:`renamed`, with a one-line notice.
"""

import argparse
import contextlib
import json
import logging
import sys

logger = logging.getLogger(__name__)

# concept -> the option that names it in every command
VOCABULARY = {
    "the checkpoint to read": "--checkpoint",
    "fine-tuning data (a prepared task's directory)": "--data",
    "pre-training data (electra-prepare's directory: dict.txt, tokenizer)": "--pretrain-data",
    "an output file": "--out",
    "an output directory": "--out-dir",
    "writing over earlier output": "--force",
    "a head of the model": "--head",
    "machine-readable output (JSON on standard output)": "--json",
    "the device (GPU when there is one)": "--cpu",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The module's text as written, and each option's default where its help leaves it out."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, [], argparse.SUPPRESS) or \
                not action.option_strings:
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {shown})"


class Parser(argparse.ArgumentParser):
    """argparse's parser, which also requires the options that an old spelling may give
    (argparse would refuse the old spelling as not the required one); subcommands' parsers
    are of the same class."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.required_spellings = []

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        missing = ["/".join(a.option_strings) for a in self.required_spellings
                   if getattr(namespace, a.dest, None) is None]
        if missing:
            self.error(f"the following arguments are required: {', '.join(missing)}")
        return namespace, rest


def command_parser(prog: str, doc: str) -> Parser:
    """A command's parser: the first line of its module's ``doc`` as description, the rest
    (subcommands, examples) after the options."""
    summary, _, rest = doc.partition("\n\n")
    return Parser(prog=prog, description=summary.strip(), epilog=rest or None,
                  formatter_class=HelpFormatter)


def subcommand(subparsers, name: str, summary: str, examples: str = "") -> argparse.ArgumentParser:
    """A subcommand listed with ``summary`` in its command's help and headed by it in its own."""
    return subparsers.add_parser(name, help=summary, description=summary,
                                 epilog=f"Example:\n{examples}" if examples else None,
                                 formatter_class=HelpFormatter)


class _OldSpelling(argparse.Action):
    def __init__(self, option_strings, dest, new=None, **kwargs):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if values is argparse.SUPPRESS:  # an optional positional that was not given
            return
        old = option_string or f"the {self.dest} as a positional argument"
        logger.warning(f"{parser.prog}: {old} is now {self.new}; the old spelling is "
                       f"accepted until the next release")
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def renamed(parser: Parser, old: str, new: str) -> None:
    """Accept ``old`` (hidden) for the option ``new`` already added, with a notice."""
    action = _still_required(parser, new)
    parser.add_argument(old, dest=action.dest, action=_OldSpelling, new=new,
                        nargs=0 if action.nargs == 0 else None, help=argparse.SUPPRESS,
                        default=argparse.SUPPRESS)


def positional_renamed(parser: Parser, new: str) -> None:
    """Accept the value of the option ``new`` as the positional argument it once was."""
    action = _still_required(parser, new)
    parser.add_argument(action.dest, nargs="?", action=_OldSpelling, new=new,
                        help=argparse.SUPPRESS, default=argparse.SUPPRESS)


def _still_required(parser: Parser, option: str) -> argparse.Action:
    """The action of ``option``, required after parsing rather than by argparse."""
    action = next(a for a in parser._actions if option in a.option_strings)
    if action.required:
        action.required = False
        parser.required_spellings.append(action)
        action.help = f"{action.help} (required)"
    return action


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON object instead of a line of text "
                             "(standard output holds it alone; progress goes to stderr)")


_result_streams = []  # where print_result writes while json_output holds standard output


@contextlib.contextmanager
def json_output(args: argparse.Namespace):
    """Around a command's work: with ``--json``, standard output is the result's one JSON
    object alone, so that ``... --json | jq`` reads it; whatever else the command prints on
    its way (the fairseq-train commands it runs, progress, a per-type table, a library's
    print) goes to standard error. Without ``--json`` nothing changes."""
    if not getattr(args, "json", False):
        yield
        return
    _result_streams.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _result_streams.pop()


def print_result(result: dict, as_json: bool, title: str) -> None:
    """A command's result on standard output: one JSON object with ``--json``, else one line
    for a person."""
    if as_json:
        print(json.dumps(result), file=_result_streams[-1] if _result_streams else sys.stdout)
        return
    shown = ", ".join(f"{key} {value:.2f}" if isinstance(value, float) else f"{key} {value}"
                      for key, value in result.items())
    print(f"{title}: {shown}")
