"""The shape every refusal of a bad file or argument has: exit 2, one line on stderr starting "error: ",
no traceback (shared by the tests of hostile inputs)."""

from __future__ import annotations

import subprocess


def one_line_error(r: subprocess.CompletedProcess[str], *words: str) -> str:
    """Assert ``r`` is a one-line refusal naming each of ``words``; returns the line."""
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]
