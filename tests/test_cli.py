"""The command line as a user runs it: real subprocesses, real files."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ROOT_DIR = Path(__file__).resolve().parents[1]


def cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "lstm_probe", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=ENV,
        timeout=300,
    )


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    r = cli(
        "run",
        "CartPole-v1",
        "--steps",
        "64",
        "--n-steps",
        "32",
        "--batch-size",
        "16",
        "--n-epochs",
        "2",
        "--hidden-size",
        "8",
        "--torch-threads",
        "1",
        cwd=d,
    )
    assert r.returncode == 0, r.stderr
    return d, r


def test_run_writes_log_and_says_where(made):
    d, r = made
    assert "wrote run.parquet" in r.stdout and "next: lstm-probe report run.parquet" in r.stdout
    df = pd.read_parquet(d / "run.parquet")
    assert len(df) > 0 and set(df.phase) >= {"rollout", "train"}


def test_report_text_and_json(made):
    d, _ = made
    r = cli("report", "run.parquet", cwd=d)
    assert r.returncode == 0, r.stderr
    for title in (
        "1. Run",
        "2. Architecture",
        "3. Calls",
        "4. Sequences",
        "5. Staleness",
        "6. State health",
        "7. Findings",
        "provenance check",
        "by minibatch order in an iteration (0 = before any optimizer step): 0: ",
        "probe cost: ",
        "CPU on the writer process",  # the default writer
    ):
        assert title in r.stdout
    j = cli("report", "run.parquet", "--json", cwd=d)
    assert j.returncode == 0
    rep = json.loads(j.stdout)
    assert list(rep) == [
        "path",
        "schema_version",
        "warnings",
        "run",
        "architecture",
        "calls",
        "sequences",
        "staleness",
        "health",
        "findings",
        "unavailable",
        "cross_process",
    ]
    assert rep["cross_process"] is None  # RLlib logs only
    assert rep["run"]["env_id"] == "CartPole-v1" and rep["run"]["completed"] is True
    assert rep["staleness"]["provenance_ok"] is True


def test_schema_command_matches_docs():
    r = cli("schema", "--markdown")
    assert r.returncode == 0
    docs = open(os.path.join(os.path.dirname(__file__), "..", "docs", "schema.md")).read()
    assert r.stdout == docs, "docs/schema.md is stale: regenerate it with `lstm-probe schema --markdown`"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "Pendulumm-v1"], "unknown env id 'Pendulumm-v1': did you mean Pendulum-v1"),
        (["run", "Pendulum-v1", "--steps", "0"], "--steps must be >= 1"),
        (["run", "Pendulum-v1", "--steps", "ten"], "Invalid value for '--steps'"),
        (["run", "Pendulum-v1", "--hyperparam", "gama=0.9"], "did you mean gamma"),
        (["run", "Pendulum-v1", "--hyperparam", "gamma"], "is not KEY=VALUE"),
        (["run", "Pendulum-v1", "--out", "/proc/nope/run.parquet"], "not writable"),
        (["run", "Pendulum-v1", "--capture", "most"], "--capture must be full or summary"),
        (["run", "Pendulum-v1", "--part-iterations", "2"], "it needs a directory --out, e.g. --out run/"),
        (["report", "missing.parquet"], "does not exist"),
        (["report", "notparquet.txt"], "not a readable Parquet file"),
        (["report", "foreign.parquet"], "not an lstm-probe log"),
        (["bogus"], "No such command"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path, args, needle):
    (tmp_path / "notparquet.txt").write_text("hello")
    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "foreign.parquet")
    r = cli(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle in lines[0] and "Traceback" not in r.stderr


def test_existing_output_needs_force(made):
    d, _ = made
    r = cli("run", "CartPole-v1", "--steps", "8", cwd=d)
    assert r.returncode == 2 and "already exists; pass --force" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_traceback_flag_shows_traceback(tmp_path):
    r = cli("report", "missing.parquet", "--traceback", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_env_with_unsupported_spaces(tmp_path):
    # gymnasium's Blackjack has a Tuple observation space, which RecurrentPPO cannot take
    r = cli("run", "Blackjack-v1", "--steps", "8", cwd=tmp_path)
    assert r.returncode == 2 and "cannot take Tuple observations" in r.stderr
    assert not (tmp_path / "run.parquet").exists()


def test_report_of_the_rllib_sample_needs_no_ray(tmp_path):
    """The RLlib sample log (one part file per process) is read as one log, cross-process check included."""
    r = cli("report", str(ROOT_DIR / "sample_runs" / "cartpole-rllib"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "provenance check (RLlib, across processes)" in r.stdout and "max |diff| 0 OK" in r.stdout
    assert "5. Staleness (RLlib)" in r.stdout and "RLlib oracle:" in r.stdout
    j = json.loads(cli("report", str(ROOT_DIR / "sample_runs" / "cartpole-rllib"), "--json", cwd=tmp_path).stdout)
    assert j["run"]["framework"] == "rllib" and j["cross_process"]["state_in_ok"] is True
    assert j["architecture"]["shared_lstm"] is False
