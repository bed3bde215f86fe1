"""ELECTRA_SPEED=0 turns --graphed-step and --torch-compile off, and says so in one line
(speed/pretraining.py): a run asked for them reads why it runs eager."""

import logging

import pytest

from electra_plugin.speed import PretrainingSpeed
from electra_plugin.speed.compile import GraphedStep
from electra_plugin.speed.switch import VARIABLE
from helpers import tiny_model


def built(switch, graphed, backend, monkeypatch, caplog):
    """A tiny model handed to the task's speed entry under ``ELECTRA_SPEED=switch`` ->
    (the model, the warnings logged)."""
    monkeypatch.setenv(VARIABLE, switch)
    model, _ = tiny_model()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        PretrainingSpeed(graphed, backend, keep_cpu_memory=True).model_built(model)
    return model, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("switch", ["0", "0,-dropout"])
def test_speed_off_names_the_options_it_turns_off_once(switch, monkeypatch, caplog):
    model, lines = built(switch, True, "inductor", monkeypatch, caplog)
    assert len(lines) == 1, lines
    for words in (f"{VARIABLE}={switch} turns", "--graphed-step", "--torch-compile inductor",
                  "runs eager"):
        assert words in lines[0], lines[0]
    assert not isinstance(model.electra_step, GraphedStep)  # it did turn them off


def test_speed_off_names_only_what_was_asked(monkeypatch, caplog):
    _, lines = built("0", False, "aot_eager", monkeypatch, caplog)
    assert len(lines) == 1 and "--graphed-step" not in lines[0], lines
    assert "--torch-compile aot_eager" in lines[0]
    assert built("0", False, "off", monkeypatch, caplog)[1] == []  # nothing asked: no line


def test_no_line_while_the_speed_parts_are_on(monkeypatch, caplog):
    model, lines = built("-dropout", True, "off", monkeypatch, caplog)
    assert lines == []
    assert isinstance(model.electra_step, GraphedStep)
