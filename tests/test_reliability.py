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


def _unmount(path):
    """Unmount once nothing holds a file there any more (a writer process may still be closing its last
    part after the trainer exited); a lazy unmount if that takes over a minute."""
    deadline = time.monotonic() + 60
    while subprocess.run(["umount", str(path)], capture_output=True).returncode:
        if time.monotonic() > deadline:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
            return
        time.sleep(0.2)


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
        for part in sorted(partial.glob("part-*.parquet")):  # whatever was published stays readable
            lstm_probe.read_info(part)
    finally:
        _unmount(disk)


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
        _unmount(disk)


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


# -- the fault matrix of docs/reliability.md (issue 24): each test measures rows expected against rows read --


def cli(tmp_path, *args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "lstm_probe", *args], cwd=tmp_path, env=ENV, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def wait_for(condition, what, timeout=240.0):
    """Poll ``condition`` until it holds (a deadline for a loaded machine, never a delay relied on)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def journal_rows(directory):
    return sum(lstm_probe.read_info(p).rows for p in sorted(directory.glob("part-*.parquet")))


def test_two_runs_a_report_during_the_run_and_the_ctrl_c_message(tmp_path):
    """Items 1, 4 and 7: a second run on the same --out refuses before training, naming the first run's
    pid and host; `report` during the run reads the rows flushed so far, labelled partial; after Ctrl-C the
    message's env step is the one the log and the report give, and the lock is gone."""
    import json
    import re
    import socket

    proc = start(tmp_path)
    wait_for_parts(tmp_path, 1, proc)
    r = cli(tmp_path, "report", "run.parquet", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert any(f"being written by pid {proc.pid} on {socket.gethostname()}" in w for w in rep["warnings"]), rep
    assert "partial" in rep["run"]["stop_reason"] and rep["run"]["rows"] > 0
    second = cli(tmp_path, *ARGS[:-2], "--steps", "64")
    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pid {proc.pid} on {socket.gethostname()}" in lines[0], second.stderr
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    info = lstm_probe.read_info(tmp_path / "run.parquet")
    assert info.rows == info.metadata["progress"]["rows"] > 0  # expected (taken by the probe) == read
    said = int(re.search(r"up to env step (\d+)", err).group(1))
    rep = json.loads(cli(tmp_path, "report", "run.parquet", "--json").stdout)
    assert said == info.num_timesteps == rep["run"]["steps_done"], err
    assert not (tmp_path / "run.parquet.lock").exists()


def test_a_stale_lock_is_taken_over_with_a_note(tmp_path):
    import json
    import socket

    import torch
    from torch import nn

    from lstm_probe.lock import StaleLockWarning

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lock = tmp_path / "s.parquet.lock"
    lock.write_text(json.dumps({"pid": gone.pid, "host": socket.gethostname(), "started": "earlier"}))
    m = nn.LSTM(3, 8)
    with pytest.warns(StaleLockWarning, match=f"pid {gone.pid}"):
        probe = lstm_probe.trace(m, tmp_path / "s.parquet").start()
    with torch.no_grad():
        m(torch.randn(5, 2, 3))
    probe.close()
    assert lstm_probe.read_info(tmp_path / "s.parquet").rows == 10 and not lock.exists()


def test_a_report_before_the_first_part_says_the_log_is_being_written(tmp_path):
    import torch
    from torch import nn

    m = nn.LSTM(3, 8)
    probe = lstm_probe.trace(m, tmp_path / "w.parquet", part_seconds=600).start()
    try:
        with torch.no_grad():
            m(torch.randn(5, 2, 3))
        with pytest.raises(lstm_probe.BadLog, match=f"being written by pid {os.getpid()}"):
            lstm_probe.read_info(tmp_path / "w.parquet")
    finally:
        probe.close()


def test_a_rerun_without_force_after_a_crash_keeps_the_journal(tmp_path):
    """Item 2, and SIGKILL of training: the writer process publishes what it was handed and frees the lock;
    a rerun without --force refuses, naming the rows and how to read them, and deletes nothing."""
    proc = start(tmp_path)
    wait_for_parts(tmp_path, 2, proc)
    proc.kill()
    proc.communicate(timeout=60)
    wait_for(lambda: not (tmp_path / "run.parquet.lock").exists(), "the writer process never finished")
    partial = tmp_path / "run.parquet.partial"
    rows = journal_rows(partial)
    assert rows > 0 and lstm_probe.read_info(tmp_path / "run.parquet").rows == rows
    r = cli(tmp_path, *ARGS[:-2], "--steps", "64")
    assert r.returncode == 2, r.stderr
    assert f"holds {rows:,} rows" in r.stderr and "lstm-probe report run.parquet.partial/" in r.stderr, r.stderr
    assert journal_rows(partial) == rows  # nothing deleted
    assert lstm_probe.read_info(partial).rows == rows  # the way the message names reads them


def test_sigkill_of_the_writer_process_keeps_the_finished_parts(tmp_path):
    import json

    proc = start(tmp_path)
    wait_for_parts(tmp_path, 1, proc)
    writer = json.loads((tmp_path / "run.parquet.lock").read_text())["writer_pid"]
    os.kill(writer, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    rows = journal_rows(tmp_path / "run.parquet.partial")  # finished before the kill: expected
    assert proc.returncode == 1 and len(err.strip().splitlines()) == 1, err
    assert "writer process ended unexpectedly (exit code -9)" in err
    info = lstm_probe.read_info(tmp_path / "run.parquet")
    assert info.rows == rows > 0 and not info.completed
    assert not (tmp_path / "run.parquet.lock").exists()


def _file_size_limit(limit):
    def limited():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limited


def test_disk_full_publishes_the_finished_rows_with_the_cause(tmp_path):
    """A real full condition: a file size limit on the run (and its writer process). The single-file log
    hits it first; the writer publishes the journal's rows with the cause and training stops in one line."""
    args = [*ARGS, "--hidden-size", "64", "--part-seconds", "0.2"]
    proc = subprocess.run(
        [sys.executable, "-m", "lstm_probe", *args], cwd=tmp_path, env=ENV, capture_output=True, text=True,
        timeout=300, preexec_fn=_file_size_limit(2 << 20),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write the log" in lines[0] and "File too large" in lines[0], proc.stderr
    info = lstm_probe.read_info(tmp_path / "run.parquet")
    assert not info.completed and "File too large" in info.metadata["stop_reason"]
    assert info.rows == info.metadata["progress"]["rows"] > 0  # every row stored before the failure is read
    assert not (tmp_path / "run.parquet.lock").exists()


ENV_ERROR = """
import sys
import gymnasium as gym
from sb3_contrib import RecurrentPPO
import lstm_probe

class Broken(gym.Wrapper):
    def __init__(self, env):
        super().__init__(env)
        self.n = 0
    def step(self, action):
        self.n += 1
        if self.n == 150:
            raise RuntimeError("the env broke at step 150")
        return self.env.step(action)

model = RecurrentPPO("MlpLstmPolicy", Broken(gym.make("Pendulum-v1")), n_steps=32, batch_size=32, n_epochs=1,
                     seed=0, policy_kwargs={"lstm_hidden_size": 8})
try:
    with lstm_probe.ProbeCallback(sys.argv[1]) as probe:
        model.learn(1000, callback=probe)
except RuntimeError as exc:
    print("caught:", exc)
"""


def test_an_exception_in_the_env_reaches_you_and_closes_the_log(tmp_path):
    out = tmp_path / "env.parquet"
    r = subprocess.run(
        [sys.executable, "-c", ENV_ERROR, str(out)], env=ENV, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and r.stdout.strip() == "caught: the env broke at step 150", r.stderr
    info = lstm_probe.read_info(out)
    assert not info.completed and "the env broke at step 150" in info.metadata["stop_reason"]
    assert info.rows == info.metadata["progress"]["rows"] > 0
