"""The one-line contract everywhere (issue #46): a bad argument or file is refused early (before envs, a
network or a framework are built), with one line on stderr, exit 2, no traceback and no warning lines beside
it; a failed run never describes another run's log as its own.

Real subprocesses of ``python -m lstm_probe`` on inputs made in tmp_path; tiny training where a run must
get going."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from refusals import one_line_error

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "100"}
TINY = ["--steps", "32", "--n-steps", "16", "--batch-size", "16", "--hidden-size", "8", "-q"]
FRAMEWORKS = {"sb3": "sb3_contrib", "torchrl": "torchrl", "rsl_rl": "rsl_rl"}
ENV_OF = {"sb3": "Pendulum-v1", "torchrl": "CartPole-v1", "rsl_rl": "Pendulum-v1"}


def cli(*args: object, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lstm_probe", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=ENV,
        timeout=timeout,
    )


def framework(name: str) -> list[str]:
    """``--framework NAME`` (skipped when its package is not installed)."""
    if importlib.util.find_spec(FRAMEWORKS[name]) is None:
        pytest.skip(f"{FRAMEWORKS[name]} is not installed")
    return ["--framework", name]


# -- an OUT that cannot be written: refused before anything is built ------------------------------------------
@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_an_out_under_a_regular_file_is_refused_up_front(tmp_path: Path, fw: str) -> None:
    """torchrl and rsl_rl built their envs and policy, then failed taking the lock (exit 1, a
    FileExistsError); sb3 said 'File exists'."""
    (tmp_path / "notes.txt").write_text("mine")
    r = cli("run", ENV_OF[fw], *framework(fw), *TINY, "--out", "notes.txt/x.parquet", cwd=tmp_path)
    one_line_error(r, "cannot write to notes.txt", "notes.txt is a file, not a directory", "--out")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.skipif(
    not Path("/proc/self").is_dir(), reason="needs /proc (a directory nobody, root included, writes in)"
)
@pytest.mark.parametrize("fw", ["torchrl", "rsl_rl"])
def test_an_out_in_a_directory_nobody_can_write_is_refused_up_front(tmp_path: Path, fw: str) -> None:
    r = cli("run", ENV_OF[fw], *framework(fw), *TINY, "--out", "/proc/lstm-probe-test.parquet", cwd=tmp_path)
    one_line_error(r, "cannot write to /proc", "choose another --out")


@pytest.fixture(scope="module")
def model_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A RecurrentPPO zip saved right after construction (no training)."""
    from sb3_contrib import RecurrentPPO

    path = tmp_path_factory.mktemp("model") / "model.zip"
    tiny = {"n_steps": 16, "batch_size": 16, "n_epochs": 1, "seed": 0, "policy_kwargs": {"lstm_hidden_size": 8}}
    RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", device="cpu", **tiny).save(path)
    return path


@pytest.mark.parametrize("where", ["file", "proc"])
def test_an_export_out_that_cannot_be_written_is_refused_before_verifying(
    tmp_path: Path, model_zip: Path, where: str
) -> None:
    """The exported file was written after the verification episodes: an unwritable OUT failed only then."""
    if where == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("needs /proc")
    (tmp_path / "notes.txt").write_text("mine")
    out = "notes.txt/policy.onnx" if where == "file" else "/proc/lstm-probe-test.onnx"
    r = cli("export", model_zip, out, "--env", "Pendulum-v1", "--episodes", 1, cwd=tmp_path)
    one_line_error(r, "cannot write to", "choose another OUT")


# -- settings that bound each other ----------------------------------------------------------------------------
@pytest.mark.parametrize("fw", ["sb3", "torchrl", "rsl_rl", "rllib"])
def test_tracing_more_envs_than_the_run_has_is_refused(tmp_path: Path, fw: str) -> None:
    """--trace-envs 5 --n-envs 2 trained and traced the 2 envs as if nothing was wrong."""
    out = "run/" if fw == "rllib" else "run.parquet"
    args = ["--trace-envs", 5, "--n-envs", 2, "--out", out]
    r = cli("run", ENV_OF.get(fw, "CartPole-v1"), "--framework", fw, *TINY, *args, cwd=tmp_path)
    one_line_error(r, "--trace-envs 5", "--n-envs 2")
    assert not list(tmp_path.iterdir())


def test_the_library_refuses_it_too(tmp_path: Path) -> None:
    import lstm_probe
    from lstm_probe.errors import BadInput

    with pytest.raises(BadInput, match="--trace-envs 3 is more envs than the run has"):
        lstm_probe.run("Pendulum-v1", tmp_path / "x.parquet", trace_envs=3, n_envs=2, steps=32)
    assert not list(tmp_path.iterdir())
