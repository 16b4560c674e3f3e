"""The lines `lstm-probe export` and `replay` print (a user trial): export's progress counts the steps it
says it verified on, on a terminal as in plain lines; Ctrl-C (SIGINT) during export or replay ends in one
line on stderr saying it was interrupted and what was (not) written, exit 130, no traceback, OUT never half
written; replay's verdict shows the largest action difference beside the tolerance, so a float16 runtime
(~1e-3 of the action scale) is told from a float32 one (~1e-7) even where both are within it. A real (tiny)
RecurrentPPO, real files, the CLI in a subprocess as a user runs it."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
import torch
from sb3_contrib import RecurrentPPO

import lstm_probe

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "NO_COLOR": "1"}
WAIT = 240
"""Seconds a test waits at most for a condition (a guard against a hang: the condition ends the wait)."""


def cli(*args, cwd):
    cmd = [sys.executable, "-m", "lstm_probe", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory):
    """A RecurrentPPO on Pendulum-v1 (hidden 8, 64 steps of training), saved and exported to ONNX."""
    d = tmp_path_factory.mktemp("lines")
    torch.set_num_threads(1)
    model = RecurrentPPO(
        "MlpLstmPolicy", "Pendulum-v1", n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu",
        policy_kwargs={"lstm_hidden_size": 8},
    ).learn(64)  # fmt: skip
    model.save(d / "pendulum.zip")
    lstm_probe.export(d / "pendulum.zip", d / "pendulum.onnx", synthetic=True, episodes=1)
    return d, model


def test_export_counts_the_steps_it_verifies(pendulum):
    """1 synthetic episode is 200 steps, each one of the file's and one of the PyTorch policy's: the progress
    says 0/200 steps (it said 0/400, with no unit), as the summary says 200 steps."""
    d, _ = pendulum
    r = cli("export", "pendulum.zip", "counted.onnx", "--synthetic", "--episodes", "1", cwd=d)
    assert r.returncode == 0 and not r.stderr.strip(), r.stdout + r.stderr
    lines = [re.sub(r", \d+:\d\d elapsed$", "", x) for x in r.stdout.splitlines() if x.startswith("export: ")]
    assert lines[:3] == ["export: reading the policy", "export: writing the file", "export: verifying 0/200 steps"]
    assert all(re.fullmatch(r"export: verifying [\d,]+/200 steps", x) for x in lines[3:]), lines
    assert "verified on 200 steps of 1 episode of 200 synthetic observations" in r.stdout


def test_the_terminal_line_counts_as_the_plain_line():
    from rich.console import Console

    from lstm_probe.cli.render import _ExportDisplay

    buf = io.StringIO()
    with _ExportDisplay(False, console=Console(file=buf, force_terminal=True, width=200)) as display:
        display.update("verifying", 0, 1000)
        display.due = 0.0  # a redraw due
        display.update("verifying", 250, 1000)
        display.bar.refresh()
    assert re.search(r"export: verifying .* 250/1,000 steps", buf.getvalue()), buf.getvalue()
