"""How far a report's read is: the library tells a callback (it prints nothing), and ``lstm-probe report`` draws
one line on stderr from it only where stderr is a terminal, erased when the read ends."""

from __future__ import annotations

import itertools
import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from lstm_probe.report import summarize
from lstm_probe.report.registry import SECTIONS

SAMPLE = Path(__file__).resolve().parents[1] / "sample_runs" / "pendulum-1env.parquet"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
# the CLI as a user runs it, its progress line drawn from the start (not after a second) for a small log
CLI = """
import importlib, sys
from lstm_probe.cli.render import ReadProgress
ReadProgress.AFTER = 0.0
ReadProgress.EVERY = 0.0
importlib.import_module("lstm_probe.cli.app").main(sys.argv[1:])
"""


def test_summarize_tells_progress_and_the_report_is_the_same(capsys):
    told: list[tuple[str, int, int]] = []
    rep = summarize(SAMPLE, chunk_rows=2000, progress=lambda *a: told.append(a))
    rows = [(done, total) for step, done, total in told if step == "rows"]
    table = pq.read_table(SAMPLE, columns=["layer", "t"])
    first_layer = sum(
        1 for layer, t in zip(*(table[c].to_pylist() for c in ("layer", "t")), strict=True) if not layer and t >= 0
    )
    assert rows[0] == (0, first_layer) and rows[-1] == (first_layer, first_layer)
    assert len(rows) > 2 and all(a[0] < b[0] for a, b in itertools.pairwise(rows))
    sections = [(step, done, total) for step, done, total in told if step != "rows"]
    keys = [s.key for s in SECTIONS if s.applies(rep.capabilities)]
    assert sections == [(k, i, len(keys)) for i, k in enumerate(keys)]
    assert told.index(sections[0]) > told.index(("rows", *rows[-1]))  # the sections after the scan
    assert rep.to_dict() == summarize(SAMPLE).to_dict()
    assert capsys.readouterr() == ("", "")


def _report(stderr_tty: bool) -> tuple[str, bytes]:
    """``report SAMPLE --json``: its stdout, and its stderr (through a terminal where ``stderr_tty``)."""
    cmd = [sys.executable, "-c", CLI, "report", str(SAMPLE), "--json"]
    if not stderr_tty:
        r = subprocess.run(cmd, capture_output=True, env=ENV, timeout=120, check=True)
        return r.stdout.decode(), r.stderr
    main, side = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=side, env=ENV)
    os.close(side)
    err = b""
    out = proc.stdout.read().decode() if proc.stdout else ""
    while select.select([main], [], [], 5)[0]:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        err += chunk
    os.close(main)
    assert proc.wait(timeout=120) == 0
    return out, err


def test_the_cli_draws_the_line_on_a_terminal_only():
    piped_out, piped_err = _report(stderr_tty=False)
    assert piped_err == b""  # piped: no line, even where it would be drawn at once
    out, err = _report(stderr_tty=True)
    assert json.loads(out) == json.loads(piped_out)  # stdout untouched
    assert b"report: 0 of " in err and b"rows read" in err and b"section " in err
    assert err.endswith(b"\r\x1b[K")  # erased at the end
    assert b"\n" not in err  # redrawn in place, one line
