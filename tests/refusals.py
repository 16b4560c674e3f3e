"""The shape every refusal of a bad file or argument has: exit 2, one line on stderr starting "error: ",
no traceback (shared by the tests of hostile inputs); and :func:`bounded_cli` / :func:`refused_within`, the
CLI run on a hostile file with its heap capped, its time and peak memory measured (issue #49: a refusal
within 20 s and 1.5 GB)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

SECONDS = 20
"""What a refusal (or a verdict on a hostile file) may take, the interpreter's start included."""
PEAK_MB = 1536
"""Peak RSS allowed (the interpreter with torch, onnxruntime and pyarrow takes ~400 MB)."""
CAP = 4 << 30
"""Cap on the child's heap (RLIMIT_DATA), so that a regression fails fast instead of taking the machine."""
ENV = {k: v for k, v in os.environ.items() if k != "LSTM_PROBE_MAX_MEMORY"} | {"OMP_NUM_THREADS": "1"}


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (CAP, CAP))


def bounded_cli(*args: object, cwd: Path) -> tuple[subprocess.CompletedProcess[bytes], float, float]:
    """``lstm-probe ARGS`` in a subprocess (heap capped): the result (bytes), seconds taken, peak RSS in MB."""
    peak_file = cwd / "peak-kb"
    peak_file.unlink(missing_ok=True)
    prelude = (
        "import atexit\n"
        # VmHWM starts anew at exec; ru_maxrss would count the RSS of the (large) test process at fork
        "peak = lambda: next(x.split()[1] for x in open('/proc/self/status') if x.startswith('VmHWM'))\n"
        f"atexit.register(lambda: open({str(peak_file)!r}, 'w').write(peak()))\n"
        "from lstm_probe.cli.app import main\nmain()"
    )
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-c", prelude, *map(str, args)],
        capture_output=True,
        cwd=cwd,
        env=ENV,
        timeout=120,
        preexec_fn=_cap,
    )
    took = time.monotonic() - start
    peak = int(peak_file.read_text()) / 1024 if peak_file.exists() else float("inf")
    return r, took, peak


def refused_within(run: tuple[subprocess.CompletedProcess[bytes], float, float], *words: str) -> str:
    """``run`` (:func:`bounded_cli`'s answer) is a one-line refusal naming ``words``, within :data:`SECONDS` and
    :data:`PEAK_MB`, no escape sequence on stdout or stderr; the line."""
    r, took, peak = run
    text = subprocess.CompletedProcess(
        r.args, r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    )
    for esc in ("\x1b", "\x07", "\x9b"):
        assert esc not in text.stdout + text.stderr, (text.stdout + text.stderr)[-2000:]
    line = one_line_error(text, *words)
    assert took < SECONDS and peak < PEAK_MB, (took, peak, line)
    return line


def one_line_error(r: subprocess.CompletedProcess[str], *words: str) -> str:
    """Assert ``r`` is a one-line refusal naming each of ``words``; returns the line."""
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]
