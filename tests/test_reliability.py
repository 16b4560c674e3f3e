"""Real signals at real points of a real run: what is left is readable and says how far it got."""

import contextlib
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


def _ended(pid):
    """Whether the process ``pid`` has ended: gone, or a zombie its new parent has not reaped yet."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:  # no /proc: alive as far as we can tell
        return False


@pytest.mark.parametrize("parts", [1, 3])
def test_sigkill_loses_only_the_open_part(tmp_path, parts):
    import json

    proc = start(tmp_path)
    wait_for_parts(tmp_path, parts, proc)
    writer = json.loads((tmp_path / "run.parquet.lock").read_text())["writer_pid"]
    proc.kill()
    proc.communicate(timeout=60)
    # the writer process outlives training briefly: it publishes what it was handed as a last part and
    # ends (a journal unchanged for a while proves nothing on a loaded machine)
    wait_for(lambda: _ended(writer), "the writer process never finished")
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


def _children_cpu_seconds():
    """CPU seconds of this process's ended children (and theirs), user and system."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_disk_full_is_one_line_and_training_stops(tmp_path):
    disk = tmp_path / "disk"
    _small_fs(disk)
    try:
        # the usual run with bigger states (fills the disk sooner); a repeated option takes the last value
        args = [*ARGS, "--hidden-size", "64", "--part-seconds", "0.2", "--out", str(disk / "run.parquet")]
        before = _children_cpu_seconds()
        r = subprocess.run(
            [sys.executable, "-m", "lstm_probe", *args], env=ENV, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 1, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot write the log" in lines[0] and "Traceback" not in r.stderr
        # training stopped instead of running its 100k steps: the run's CPU time (its writer process's
        # included), which a busy machine does not stretch as it stretches wall time. Stopping took ~4 s of
        # CPU, a run that kept going took ~100 s (measured on a 2-core machine).
        used = _children_cpu_seconds() - before
        assert used < 30, f"the run used {used:.0f} s of CPU: it kept training after the disk filled"
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
    wait_for(lambda: list(out.glob("part-*.parquet")), "the run published no part")

    def removed():  # the run may create a file in it while rmtree empties it (rmdir: not empty): again
        shutil.rmtree(out, ignore_errors=True)
        return not out.exists()

    wait_for(removed, f"{out} could not be removed")
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

    from lstm_probe.log.lock import StaleLockWarning

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


# -- the output lock on the kernel's lock (lock.py): real processes, no bookkeeping ----------------

HOLDER = r'''
import os, subprocess, sys
from pathlib import Path
from lstm_probe.log.lock import OutputLock, lock_fds

INHERITOR = """
import sys
from pathlib import Path
from lstm_probe.log.lock import release_file
sys.stdin.readline()  # until the test says go (its holder is dead by then)
release_file(Path(sys.argv[1]), int(sys.argv[2]))
"""

out, mode = Path(sys.argv[1]), sys.argv[2]
lock = OutputLock.take(out, is_dir=False)
extra = ""
if mode == "writer":  # as a writer process is started: it inherits the lock's open file (lock_fds)
    fds = lock_fds(lock.path)
    assert fds == (lock.fd,), fds
    child = subprocess.Popen([sys.executable, "-c", INHERITOR, str(lock.path), str(os.getpid())], pass_fds=fds)
    lock.set_writer(child.pid)
    extra = f" {child.pid}"
elif mode == "fork":
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # a normal exit of a forked child: its atexit backstop runs
    os.waitpid(pid, 0)
    pid = os.fork()
    if pid == 0:  # a forked child that outlives this process
        sys.stdin.readline()
        os._exit(0)
    extra = f" {pid}"
print("ready" + extra, flush=True)
sys.stdin.read()  # holds the lock until killed
'''


def _holder(tmp_path, out, mode="plain"):
    """A real process that takes the lock on ``out``; returns it and the pid it names (its child's)."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out), mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline().split()
    assert line[:1] == ["ready"], (line, proc.wait())
    return proc, int(line[1]) if len(line) > 1 else None


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie (reparented, not yet reaped) runs no more
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def _end(proc, *pids):
    for pid in pids:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait(timeout=60)
    for stream in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError, ValueError):
            stream.close()


posix_only = pytest.mark.skipif(os.name != "posix", reason="real signals and fork")


@posix_only
def test_the_lock_of_a_sigkilled_holder_is_taken_at_once_and_a_live_one_refuses_naming_it(tmp_path):
    import socket

    from lstm_probe.errors import BadInput
    from lstm_probe.log.lock import OutputLock, live_holder

    out = tmp_path / "k.parquet"
    proc, _ = _holder(tmp_path, out)
    try:
        named = f"pid {proc.pid} on {socket.gethostname()}"
        with pytest.raises(BadInput) as refused:
            OutputLock.take(out, is_dir=False)
        message = str(refused.value)
        assert "being written by another run" in message and named in message and "holder.py" in message
        assert "\n" not in message
        h = live_holder(tmp_path / "k.parquet.lock")  # what `report` says about the live run
        assert h is not None and h.pid == proc.pid and "holder.py" in h.command
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert live_holder(tmp_path / "k.parquet.lock") is None  # the kernel freed it with the process
        lock = OutputLock.take(out, is_dir=False)  # at once: no liveness check, no wait
        # the note LogWriter warns with (StaleLockWarning): the file still names the killed run
        assert lock.held and f"stale lock {lock.path} of a run that is gone ({named}" in lock.note
        assert live_holder(lock.path).pid == os.getpid()
        lock.release()
        assert not lock.path.exists() and live_holder(lock.path) is None
    finally:
        _end(proc)


@posix_only
def test_a_writer_process_that_inherits_the_lock_keeps_it_after_a_sigkill_of_training(tmp_path):
    """The writer process's case: its inherited open file holds the lock while it publishes after training
    was killed; the taker names training (and the file its writer); the lock is free once it is done."""
    from lstm_probe.errors import BadInput
    from lstm_probe.log.lock import OutputLock, holder

    out = tmp_path / "w.parquet"
    proc, writer = _holder(tmp_path, out, "writer")
    try:
        assert holder(tmp_path / "w.parquet.lock").writer_pid == writer
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert not _gone(writer)
        with pytest.raises(BadInput, match=f"pid {proc.pid} on"):
            OutputLock.take(out, is_dir=False)
        proc.stdin.write("go\n")  # the writer is done: it frees the lock and removes the file
        proc.stdin.close()
        wait_for(lambda: not (tmp_path / "w.parquet.lock").exists(), "the writer never released the lock")
        wait_for(lambda: _gone(writer), "the writer never ended")
        lock = OutputLock.take(out, is_dir=False)
        assert lock.held and lock.note is None  # nothing stale: released cleanly
        lock.release()
    finally:
        _end(proc, writer)


@posix_only
def test_a_forked_child_neither_frees_nor_keeps_the_lock(tmp_path):
    """A child forked from the run that exits normally (its atexit backstop runs) leaves the run's lock
    held; one that outlives the run does not keep the output locked."""
    from lstm_probe.errors import BadInput
    from lstm_probe.log.lock import OutputLock

    out = tmp_path / "f.parquet"
    proc, child = _holder(tmp_path, out, "fork")
    try:
        with pytest.raises(BadInput, match=f"pid {proc.pid} on"):
            OutputLock.take(out, is_dir=False)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert not _gone(child)
        lock = OutputLock.take(out, is_dir=False)
        assert lock.held
        lock.release()
    finally:
        _end(proc, child)


TRAINING = r"""
import sys, torch
from torch import nn
import lstm_probe
m = nn.LSTM(3, 8)
probe = lstm_probe.trace(m, sys.argv[1]).start()
with torch.no_grad():
    for _ in range(30):
        m(torch.randn(7, 2, 3))
print(probe.writer._child.proc.pid, flush=True)
sys.stdin.read()
"""


@posix_only
def test_the_writer_process_holds_the_lock_while_it_publishes_after_a_sigkill_of_training(tmp_path):
    """Held up (SIGSTOP) before it publishes, the writer process of a SIGKILLed run keeps its output locked:
    a new run is refused naming the killed one; once it is done the lock is free and its file gone."""
    from lstm_probe.errors import BadInput
    from lstm_probe.log.lock import OutputLock

    out = tmp_path / "p.parquet"
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINING, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    writer = None
    try:
        writer = int(proc.stdout.readline())
        os.kill(writer, signal.SIGSTOP)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        try:
            with pytest.raises(BadInput, match=f"pid {proc.pid} on"):
                OutputLock.take(out, is_dir=False).release()
        finally:
            os.kill(writer, signal.SIGCONT)
        wait_for(lambda: not (tmp_path / "p.parquet.lock").exists(), "the writer process never finished")
        assert lstm_probe.read_info(out).rows == 30 * 7 * 2
        lock = OutputLock.take(out, is_dir=False)
        assert lock.held and lock.note is None
        lock.release()
    finally:
        if writer is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(writer, signal.SIGCONT)
        _end(proc)


TAKER = r"""
import sys
from pathlib import Path
from lstm_probe.errors import BadInput
from lstm_probe.log.lock import OutputLock
try:
    OutputLock.take(Path(sys.argv[1]), is_dir=False)
except BadInput as exc:
    sys.exit(str(exc))
"""


@pytest.mark.parametrize(
    "content",
    [b"\x00\xffnot a lock{", b'{"pid": PID, "host": "HOST", "started": "earlier", "ticks": 1}'],
    ids=["garbage", "a previous version's, naming a live process"],
)
def test_a_lock_file_left_with_any_content_is_taken_and_then_works(tmp_path, content):
    import socket

    from lstm_probe.errors import BadInput
    from lstm_probe.log.lock import OutputLock, live_holder

    path = tmp_path / "g.parquet.lock"
    path.write_bytes(
        content.replace(b"PID", str(os.getppid()).encode()).replace(b"HOST", socket.gethostname().encode())
    )
    lock = OutputLock.take(tmp_path / "g.parquet", is_dir=False)  # no process holds it: taken
    try:
        assert lock.held and lock.note is not None and "took over the stale lock" in lock.note
        assert f"pid {os.getpid()} on" in live_holder(path).describe()
        with pytest.raises(BadInput, match="already being written by this process"):
            OutputLock.take(tmp_path / "g.parquet", is_dir=False)
        assert not OutputLock.take(tmp_path / "g.parquet", is_dir=False, reentrant=True).held
        other = subprocess.run(
            [sys.executable, "-c", TAKER, str(tmp_path / "g.parquet")], capture_output=True, text=True, timeout=120
        )
        assert other.returncode == 1 and f"pid {os.getpid()} on {socket.gethostname()}" in other.stderr, other.stderr
    finally:
        lock.release()
    assert not path.exists()
    again = OutputLock.take(tmp_path / "g.parquet", is_dir=False)
    assert again.held and again.note is None
    again.release()


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


_OWN_LOOP = """
import sys, time, torch, lstm_probe
m = torch.nn.LSTM(3, 4)
probe = lstm_probe.trace(m, out=sys.argv[1]).start()  # start() and close(), never reached: no with
t = 0
while True:
    with probe.tag(phase="rollout", iteration=0, env=[0], env_step=[t]):
        m(torch.zeros(1, 1, 3))
    t += 1
    if t == 20:
        open(sys.argv[2], "w").close()  # rows are flowing
    if t == 20 and sys.argv[3] == "raise":
        raise RuntimeError("boom in the loop")
    time.sleep(0.001)
probe.close()
"""


@pytest.mark.parametrize("how", ["sigint", "raise"])
def test_an_own_loop_without_with_keeps_its_log_when_ctrl_c_or_an_exception_ends_it(tmp_path, how):
    """``probe.start()`` ... ``probe.close()`` (the docs' equal of ``with``) ended by Ctrl-C or an exception that
    nothing catches left an empty ``LOG.partial/`` and no log: the close was never reached. The process's exit
    closes it now, not completed, with the exception that ended it."""
    script, log, ready = tmp_path / "loop.py", tmp_path / "own.parquet", tmp_path / "ready"
    script.write_text(_OWN_LOOP)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(log), str(ready), how], env=ENV, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "no rows in 240 s"
    if how == "sigint":
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "Exception ignored" not in err
    info = lstm_probe.read_info(log)
    assert not info.completed and info.rows >= 20
    cause = "KeyboardInterrupt: interrupted" if how == "sigint" else "RuntimeError: boom in the loop"
    assert info.metadata["stop_reason"] == f"the process exited before close() ({cause})"
    assert not (tmp_path / "own.parquet.partial").exists()
    assert len(lstm_probe.load(log, vectors=False)) == info.rows


_FORKED = """
import os, sys, torch, lstm_probe
m = torch.nn.LSTM(3, 4)
probe = lstm_probe.trace(m, out=sys.argv[1]).start()
with probe.tag(phase="rollout", iteration=0, env=[0], env_step=[0]):
    m(torch.zeros(1, 1, 3))
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a forked child that exits normally runs the exit hooks it inherited
os.waitpid(pid, 0)
with probe.tag(phase="rollout", iteration=0, env=[0], env_step=[1]):
    m(torch.zeros(1, 1, 3))
probe.close()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_forked_child_does_not_close_its_parents_log(tmp_path):
    """The exit-time close of a probe left open ran in a forked child too (it inherits the hook): the child's
    normal exit published the parent's log half-way, and the parent's close() then failed. Only the process that
    started the probe closes it at exit."""
    script, log = tmp_path / "fork.py", tmp_path / "f.parquet"
    script.write_text(_FORKED)
    r = subprocess.run([sys.executable, str(script), str(log)], env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    info = lstm_probe.read_info(log)
    assert info.completed and info.rows == 2
