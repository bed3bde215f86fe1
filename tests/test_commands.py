"""The console commands and the scripts speak one vocabulary (electra_plugin/cli/vocabulary.py,
docs/commands.md): every parser of every command and of every script with options is walked
and checked."""

import argparse
import importlib
import json
import logging
import sys

import pytest

from electra_plugin.cli.vocabulary import HelpFormatter, VOCABULARY
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import REPO, assert_usage_line

COMMANDS = {f"electra-{m}": importlib.import_module(f"electra_plugin.cli.{m}")
            for m in ("prepare", "glue", "squad", "finetune", "tag", "choice", "extract",
                      "convert", "score")}
# scripts/ with options (they import each other as top-level modules, as when run)
sys.path.insert(0, str(REPO / "scripts"))
SCRIPTS = {f"scripts/{path.name}": importlib.import_module(path.stem)
           for path in sorted((REPO / "scripts").glob("*.py"))
           if "add_argument" in path.read_text()}
# the spellings of earlier releases, hidden now, and what replaced them
OLD = {"--destdir": "--out-dir", "--workdir": "--out-dir", "--predictions": "--out",
       "--head-name": "--head", "--overwrite": "--force"}
# a parser's destination -> the only option that may fill it
SPELLING = {option[2:].replace("-", "_"): option for option in VOCABULARY.values()}


def parsers():
    """(name, parser) of every command and subcommand."""
    found = []

    def walk(name, parser):
        found.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(f"{name} {sub_name}", sub)

    for name, module in {**COMMANDS, **SCRIPTS}.items():
        walk(name, module.build_parser())
    return found


PARSERS = parsers()
IDS = [name for name, _ in PARSERS]


def visible(parser):
    return [a for a in parser._actions if a.help != argparse.SUPPRESS and
            not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


@pytest.mark.parametrize("name, parser", PARSERS, ids=IDS)
def test_each_concept_has_one_spelling(name, parser):
    for action in visible(parser):
        assert not set(action.option_strings) & set(OLD), (name, action.option_strings)
        if action.dest in SPELLING:
            assert action.option_strings == [SPELLING[action.dest]], (name, action.dest)


@pytest.mark.parametrize("name, parser", PARSERS, ids=IDS)
def test_every_option_has_help_and_shows_its_default(name, parser):
    formatter = HelpFormatter(name)
    for action in visible(parser):
        text = formatter._get_help_string(action)
        assert text and text.strip(), (name, action.dest)
        if action.option_strings and action.default not in (None, False, []):
            assert "default" in text, (name, action.dest, text)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_lists_its_subcommands_and_shows_examples(name):
    parser = COMMANDS[name].build_parser()
    text = parser.format_help()
    assert "Example" in (parser.epilog or ""), name
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                assert choice.help and choice.help in text, (name, choice.dest)


@pytest.mark.parametrize("argv, new", [
    (["preprocess", "--task", "RTE", "--glue-dir", "g", "--pretrain-data", "p",
      "--destdir", "d"], ("glue", "out_dir", "d")),
    (["trials", "--task", "RTE=d", "--workdir", "w"], ("finetune", "out_dir", "w")),
    (["evaluate", "--task", "RTE", "--checkpoint", "c", "--data", "d", "--predictions", "f"],
     ("glue", "out", "f")),
    (["import", "--discriminator", "d", "--out", "o", "--head-name", "h", "--overwrite"],
     ("convert", "head", "h")),
    (["export", "c.pt", "--out", "o"], ("convert", "checkpoint", "c.pt")),
    (["c.pt", "--out", "x.pt", "--overwrite"], ("extract", "force", True)),
    (["score", "--checkpoint", "c", "--data", "p", "--input", "i"],
     ("score", "pretrain_data", "p")),
])
def test_old_spellings_still_work_with_a_notice(argv, new, caplog):
    module, dest, value = new
    with caplog.at_level(logging.WARNING):
        args = COMMANDS[f"electra-{module}"].build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    notices = [r.getMessage() for r in caplog.records if "is now" in r.getMessage()]
    assert notices and all("accepted until the next release" in n for n in notices)


def test_the_scripts_with_options_are_walked():
    assert {"scripts/electra_vs_mlm.py", "scripts/demo.py", "scripts/fetch_sentiment.py",
            "scripts/fetch_conll2003.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script, argv, dest, value", [
    ("electra_vs_mlm", ["--data", "d", "--task", "t=d", "--out", "o"], "out_dir", "o"),
    ("electra_vs_mlm", ["--data", "d", "--task", "t=d", "--out-dir", "o", "--workdir", "w"],
     "work_dir", "w"),
    ("demo", ["--workdir", "w"], "out_dir", "w"),
    ("fetch_sentiment", ["--out", "s"], "out_dir", "s"),
    ("fetch_conll2003", ["--out", "c"], "out_dir", "c"),
])
def test_the_scripts_old_spellings_still_work_with_a_notice(script, argv, dest, value, caplog):
    with caplog.at_level(logging.WARNING):
        args = SCRIPTS[f"scripts/{script}.py"].build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    assert [r.getMessage() for r in caplog.records if "is now" in r.getMessage()]


def test_an_old_spelling_does_not_dodge_a_required_option(capsys):
    with pytest.raises(SystemExit):
        COMMANDS["electra-convert"].build_parser().parse_args(["export", "--out-dir", "o"])
    assert "the following arguments are required: --checkpoint" in capsys.readouterr().err


def test_a_trials_task_of_no_kind_lists_every_preparation(tmp_path):
    (tmp_path / "notes.txt").write_text("not data\n")
    with pytest.raises(ElectraUsageError) as caught:
        COMMANDS["electra-finetune"].main(["trials", "--task", f"SST2x={tmp_path}", "--arch",
                                           "electra_small", "--out-dir", str(tmp_path / "w")])
    assert_usage_line(caught.value, "--task SST2x", "is no task's data", "electra-glue",
                      "electra-tag", "electra-squad", "electra-choice")


def test_results_print_as_text_or_as_json(capsys):
    from electra_plugin.cli.vocabulary import print_result

    print_result({"split": "valid", "f1": 81.234}, False, "tagging valid")
    print_result({"split": "valid", "f1": 81.234}, True, "tagging valid")
    text, js = capsys.readouterr().out.splitlines()
    assert text == "tagging valid: split valid, f1 81.23"
    assert js == '{"split": "valid", "f1": 81.234}'


def test_every_command_shares_one_tail():
    """Each command's console script (and a subcommand command's main) comes from
    electra_plugin/cli/command.py, not from lines repeated in its module."""
    for name, module in COMMANDS.items():
        assert module.cli.__module__ == "electra_plugin.cli.command", name
        if any(isinstance(a, argparse._SubParsersAction)
               for a in module.build_parser()._actions) and name != "electra-convert":
            assert module.main.__module__ == "electra_plugin.cli.command", name


JSON_COMMANDS = [(name, parser) for name, parser in PARSERS
                 if any("--json" in a.option_strings for a in parser._actions)]


def test_the_commands_with_json_are_known():
    assert {name for name, _ in JSON_COMMANDS} >= {
        "electra-tag finetune", "electra-tag predict", "electra-score rerank",
        "electra-glue evaluate", "electra-choice evaluate", "electra-squad predict",
        "electra-squad evaluate"}


@pytest.mark.parametrize("name, parser", JSON_COMMANDS, ids=[n for n, _ in JSON_COMMANDS])
def test_json_stdout_is_the_one_object_alone(name, parser, capsys, monkeypatch):
    """Through the command's own main: whatever its work prints on the way (a command line it
    runs, a table) goes to stderr with --json, so that the whole of stdout is one object;
    without --json it stays on stdout. The work is a stand-in (the real runs are in
    test_kinds.py and test_scoring.py); what is checked is main's handling of stdout."""
    from electra_plugin.cli.vocabulary import print_result

    module = COMMANDS[name.split()[0]]

    def work(args):
        print("$ python -m fairseq_cli.train data --seed 1")
        print("  ANI          precision  50.00")
        print_result({"split": "valid", "f1": 50.0}, args.json, "tagging valid")

    for as_json in (True, False):
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args",  # the command's parser
                            lambda self, argv=None: argparse.Namespace(json=as_json, run=work))
        module.main([])
        out, err = capsys.readouterr()
        if as_json:
            assert json.loads(out) == {"split": "valid", "f1": 50.0}, out
            assert err.startswith("$ python -m fairseq_cli.train") and "ANI" in err
        else:
            assert out.startswith("$ python") and out.endswith("f1 50.00\n") and not err


def test_long_loops_log_their_progress(caplog, monkeypatch):
    """Off a terminal (a job's log), a loop logs how far it is every ELECTRA_PROGRESS_SECONDS
    (here every item) and once at its end."""
    from electra_plugin.user_io.progress import progress

    monkeypatch.setenv("ELECTRA_PROGRESS_SECONDS", "0")
    with caplog.at_level(logging.INFO, logger="electra_plugin.user_io.progress"):
        assert list(progress(iter("abc"), 3, "predicting valid")) == ["a", "b", "c"]
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" (")[0] for line in lines] == [
        "predicting valid: 1/3", "predicting valid: 2/3", "predicting valid: 3/3",
        "predicting valid: 3/3"]
    assert lines[-1].endswith(" s") and "(100%) batches in " in lines[-1]
