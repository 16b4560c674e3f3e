"""Real signals at real points of a real run: what is left is readable and says how far it got."""

import os
import signal
import subprocess
import sys
import time

import pytest

import lstm_probe

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ARGS = [
    "run",
    "Pendulum-v1",
    "--steps",
    "100000",
    "--n-steps",
    "32",
    "--batch-size",
    "32",
    "--n-epochs",
    "1",
    "--hidden-size",
    "8",
    "--torch-threads",
    "1",
    "--part-seconds",
    "0.3",
]


def start(tmp_path):
    return subprocess.Popen(
        [sys.executable, "-m", "lstm_probe", *ARGS],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_parts(tmp_path, n, proc, timeout=240):
    """Until the run's crash journal holds ``n`` finished parts (a loaded machine makes them late)."""
    partial = tmp_path / "run.parquet.partial"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(list(partial.glob("part-*.parquet"))) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {n} part(s): {proc.stderr.read()}")
        time.sleep(0.05)
    found = len(list(partial.glob("part-*.parquet")))
    raise AssertionError(f"the run wrote {found} part file(s) in {timeout} s, not {n}")


@pytest.mark.parametrize("sig,parts", [(signal.SIGINT, 1), (signal.SIGTERM, 2), (signal.SIGINT, 3)])
def test_interrupt_closes_a_valid_log(tmp_path, sig, parts):
    proc = start(tmp_path)
    wait_for_parts(tmp_path, parts, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and "completed: false" in err and "Traceback" not in err
    info = lstm_probe.read_info(tmp_path / "run.parquet")
    assert not info.completed and info.rows > 0
    assert info.metadata["progress"]["rows"] == info.rows  # every row the probe took was written
    assert not (tmp_path / "run.parquet.partial").exists()
    assert len(lstm_probe.load(tmp_path / "run.parquet", vectors=False)) == info.rows
    rep = lstm_probe.summarize(tmp_path / "run.parquet")
    assert any("did not complete" in w for w in rep.warnings)


@pytest.mark.parametrize("parts", [1, 3])
def test_sigkill_loses_only_the_open_part(tmp_path, parts):
    proc = start(tmp_path)
    wait_for_parts(tmp_path, parts, proc)
    proc.kill()
    proc.communicate(timeout=60)
    # the writer process outlives training briefly: it publishes what it was handed as a last part
    partial, seen, deadline = tmp_path / "run.parquet.partial", None, time.monotonic() + 60
    while time.monotonic() < deadline:
        now = sorted(p.name for p in partial.iterdir())
        if now == seen and not any(n.startswith(".") for n in now):
            break
        seen = now
        time.sleep(1.0)
    assert not (tmp_path / "run.parquet").exists()
    info = lstm_probe.read_info(tmp_path / "run.parquet")  # salvages run.parquet.partial/
    assert not info.completed and info.rows > 0 and len(info.files) >= parts
    assert any("never finished" in w for w in info.warnings)
    df = lstm_probe.load(tmp_path / "run.parquet", vectors=False)
    assert len(df) == info.rows
    # calls are whole: a call's rows are never split across parts or cut in half
    roll = df[df.phase == "rollout"]
    assert (roll.groupby("call").size() == 1).all()  # 1 env, 1 layer: one row per rollout call
    train = df[df.phase == "train"]
    per_call = train.groupby("call").agg(rows=("t", "size"), seqs=("seq", "nunique"), steps=("t", "nunique"))
    assert (per_call.rows == per_call.seqs * per_call.steps).all()
    parts = [lstm_probe.load(f, vectors=False)[["call"]].assign(part=i) for i, f in enumerate(info.files)]
    import pandas as pd

    owners = pd.concat(parts).drop_duplicates().groupby("call").size()
    assert (owners == 1).all()
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "report", "run.parquet", "--json"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "never finished" in r.stderr + r.stdout


def _small_fs(path):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", str(path)], capture_output=True)
    if r.returncode:
        pytest.skip(f"cannot mount a small tmpfs here to fill the disk ({r.stderr.decode().strip()})")


def test_disk_full_is_one_line_and_training_stops(tmp_path):
    disk = tmp_path / "disk"
    _small_fs(disk)
    try:
        # the usual run with bigger states (fills the disk sooner); a repeated option takes the last value
        args = [*ARGS, "--hidden-size", "64", "--part-seconds", "0.2", "--out", str(disk / "run.parquet")]
        start = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "lstm_probe", *args], env=ENV, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 1, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot write the log" in lines[0] and "Traceback" not in r.stderr
        assert time.monotonic() - start < 120  # training stopped instead of running its 100k steps
        partial = disk / "run.parquet.partial"
        for part in sorted(partial.glob("part-*.parquet")):  # whatever was finished stays readable
            assert lstm_probe.read_info(part).rows > 0
    finally:
        subprocess.run(["umount", str(disk)])


SCRIPT = """
import sys
from sb3_contrib import RecurrentPPO
import lstm_probe
model = RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0,
                     policy_kwargs={"lstm_hidden_size": 64})
try:
    model.learn(100_000, callback=lstm_probe.ProbeCallback(sys.argv[1], part_seconds=0.2))
except lstm_probe.OutputError as exc:
    print("caught:", exc)
"""


def test_disk_full_in_your_own_script_raises_once(tmp_path):
    """ProbeCallback in a user's script: the disk-full error comes out of learn() as OutputError, once
    (the exit-time close of the failed log stays quiet instead of printing it again with a traceback)."""
    disk = tmp_path / "disk"
    _small_fs(disk)
    try:
        r = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(disk / "run.parquet")],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("caught: cannot write the log") and "No space left" in r.stdout
        assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    finally:
        subprocess.run(["umount", str(disk)])


def test_output_removed_mid_run(tmp_path):
    import shutil

    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lstm_probe", *ARGS, "--out", f"{out}/"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(out.glob("part-*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(out)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert len(err.strip().splitlines()) == 1 and "cannot write the log" in err
