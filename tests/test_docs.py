"""README.md and docs/ stay readable references, and their commands use today's spellings:
no paragraph over 12 lines, no sentence over 50 words (code blocks and tables aside), and no
option an earlier release spelled differently in a command shown in README, docs/ or
examples/. The old spellings are read from the commands' parsers (cli/vocabulary.py's
``renamed``), so a new rename is checked here without an edit."""

import argparse
import contextlib
import importlib
import re
import shlex
import sys

import pytest

from electra_plugin.cli.vocabulary import _OldSpelling
from helpers import REPO

MAX_PARAGRAPH_LINES = 12
MAX_SENTENCE_WORDS = 50
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHOWN = DOCS + sorted(p for p in (REPO / "examples").rglob("*") if p.suffix in (".md", ".sh"))
# A list item starts a paragraph of its own: a person reads each item as one unit.
ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")
# A sentence ends at . ! or ? (and any closing marks) before a capital, a code span, a quote,
# or the end of a line.
SENTENCE_END = re.compile(r"(?<=[.!?])[)\"'*_`]*(?:\s+(?=[A-Z`\"*(\[])|[ \t]*\n|[ \t]*$)")


def paragraphs(text):
    """(first line number, lines) of each paragraph: a run of non-blank lines outside fenced
    code blocks and tables, cut at headings and list items."""
    found, current, fenced = [], None, False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced, current = not fenced, None
            continue
        if fenced or not stripped or stripped.startswith(("|", "#", "<!--")):
            current = None
            continue
        if current is None or ITEM.match(line):
            current = (number, [])
            found.append(current)
        current[1].append(line)
    return found


def sentences(text):
    """(line number, word count) of each sentence of the paragraphs of ``text``."""
    found = []
    for first, lines in paragraphs(text):
        joined = ITEM.sub("", "\n".join(lines), count=1)
        start = 0
        for match in [*SENTENCE_END.finditer(joined), None]:
            end = match.start() if match else len(joined)
            words = len(joined[start:end].split())
            if words:
                found.append((first + joined.count("\n", 0, start), words))
            start = match.end() if match else end
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_no_paragraph_runs_past_twelve_lines(path):
    long = [(first, len(lines)) for first, lines in paragraphs(path.read_text(encoding="utf-8"))
            if len(lines) > MAX_PARAGRAPH_LINES]
    assert not long, f"{path.name}: paragraphs (line, lines) over {MAX_PARAGRAPH_LINES}: {long}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_no_sentence_runs_past_fifty_words(path):
    long = [s for s in sentences(path.read_text(encoding="utf-8")) if s[1] > MAX_SENTENCE_WORDS]
    assert not long, f"{path.name}: sentences (line, words) over {MAX_SENTENCE_WORDS}: {long}"


def test_the_readers_split_paragraphs_and_sentences_as_a_person_does():
    text = ("# Title\nOne sentence here. Another one\nruns on. e.g. lower stays.\n\n"
            "```\nnot. Counted.\n```\n| a. | B. |\n- item one.\n- item two!\n  Still two.\n")
    assert [(first, len(lines)) for first, lines in paragraphs(text)] == [(2, 2), (9, 1), (10, 2)]
    assert sentences(text) == [(2, 3), (2, 7), (9, 2), (10, 2), (11, 2)]


@contextlib.contextmanager
def scripts_importable():
    """scripts/ on the import path while its modules load (they import their neighbours)."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        yield
    finally:
        sys.path.remove(str(REPO / "scripts"))


def commands():
    """{(names it is typed as): its parser} of the console commands in setup.py and of the
    scripts, each with a ``build_parser``."""
    found = {}
    setup = (REPO / "setup.py").read_text()
    for name, module_name in re.findall(r'"(electra-\w+) = (electra_plugin\.cli\.\w+):', setup):
        module = importlib.import_module(module_name)
        if hasattr(module, "build_parser"):
            found[(name, f"python -m {module_name}")] = module.build_parser()
    with scripts_importable():
        for path in sorted((REPO / "scripts").glob("*.py")):
            module = importlib.import_module(path.stem)
            if hasattr(module, "build_parser"):
                found[(f"python scripts/{path.name}",)] = module.build_parser()
    return found


def retired_spellings():
    """{(command, subcommand or ""): {old option: new option}} read from the parsers."""
    found = {}

    def walk(key, parser):
        for action in parser._actions:
            if isinstance(action, _OldSpelling) and action.option_strings:
                found.setdefault(key, {}).update(dict.fromkeys(action.option_strings, action.new))
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk((key[0], name), sub)

    for names, parser in commands().items():
        for name in names:
            walk((name, ""), parser)
    return found


def shown_commands(text):
    """Each shell line of ``text`` with its backslash continuations joined, and each inline
    code span: the places a command is shown."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return joined.splitlines() + re.findall(r"`([^`\n]+)`", joined)


def old_spellings_in(text, retired):
    """(command, old option, new option) for each old spelling used in a command of ``text``."""
    found = []
    for line in shown_commands(text):
        for (command, sub), renames in retired.items():
            for typed in re.finditer(rf"(?<![\w/.-]){re.escape(command)}\b", line):
                rest = re.split(r"\||&&|;|\)|\$\(", line[typed.end():])[0]
                try:
                    words = shlex.split(rest, comments=True)
                except ValueError:
                    words = rest.split()
                if sub and (not words or words[0] != sub):
                    continue
                found += [(f"{command} {sub}".strip(), w.split("=")[0], renames[w.split("=")[0]])
                          for w in words if w.split("=")[0] in renames]
    return found


RETIRED = retired_spellings()


def test_the_old_spellings_are_read_from_the_parsers():
    assert RETIRED[("electra-convert", "import")]["--out"] == "--out-dir"
    assert RETIRED[("electra-finetune", "trials")]["--workdir"] == "--out-dir"
    assert "--out" not in RETIRED.get(("electra-extract", ""), {})  # --out is its output file
    assert RETIRED[("python scripts/electra_vs_mlm.py", "")]["--workdir"] == "--work-dir"
    text = ("electra-convert import --discriminator d \\\n  --out hf/\n"
            "and `electra-extract --checkpoint c --out x.pt`, `fairseq-preprocess --destdir d`\n"
            "python -m electra_plugin.cli.finetune trials --task A=d --workdir w | tee log\n")
    assert old_spellings_in(text, RETIRED) == [
        ("electra-convert import", "--out", "--out-dir"),
        ("python -m electra_plugin.cli.finetune trials", "--workdir", "--out-dir")]


@pytest.mark.parametrize("path", SHOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_commands_shown_use_todays_spellings(path):
    old = old_spellings_in(path.read_text(encoding="utf-8"), RETIRED)
    assert not old, f"{path.relative_to(REPO)}: (command, old spelling, now): {sorted(set(old))}"
