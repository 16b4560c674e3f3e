"""Hostile or unlucky inputs that must cost little and delete nothing: each case crafts its input in
tmp_path and runs the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "100"}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lstm_probe.cli", *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=600
    )


def one_line_refusal(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


TRAIN = ["--steps", "32", "--n-steps", "16", "--batch-size", "16", "--hidden-size", "8", "-q"]


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_a_users_partial_path_is_never_deleted_without_force(tmp_path: Path, kind: str) -> None:
    journal = tmp_path / "run.parquet.partial"
    if kind == "directory":
        journal.mkdir()
        (journal / "notes.txt").write_text("mine")
        (journal / "part-00000.parquet").write_bytes(b"")  # one of ours beside it changes nothing
    else:
        journal.write_text("mine")
    r = cli("run", "Pendulum-v1", *TRAIN, cwd=tmp_path)
    one_line_refusal(r, "run.parquet.partial", "did not write", "--force")
    assert (journal / "notes.txt").read_text() == "mine" if kind == "directory" else journal.read_text() == "mine"
    assert not (tmp_path / "run.parquet").exists()
    r = cli("run", "Pendulum-v1", *TRAIN, "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run.parquet").is_file() and not journal.exists()


def test_n_envs_has_an_upper_bound_checked_before_anything_is_built(tmp_path: Path) -> None:
    r = cli("run", "CartPole-v1", "--n-envs", "10000000", cwd=tmp_path)
    one_line_refusal(r, "--n-envs 10000000", "at most 65,536")
    assert not list(tmp_path.iterdir())
