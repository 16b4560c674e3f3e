"""The writer process: rows are made and written outside the training process, which only hands over
host arrays through a pipe. Real processes, real signals, real files."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import lstm_probe

pytestmark = pytest.mark.skipif(os.name == "nt", reason="the writer process needs pollable pipes")


def _child(probe):
    return probe.writer._child.proc


def wait_for(condition, what, timeout=60.0):
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds (a deadline for a
    loaded machine, never a delay the test relies on)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_both_writers_write_the_same_log(tmp_path, writer):
    torch.manual_seed(0)
    m = nn.LSTM(3, 8, num_layers=2)
    x = torch.randn(6, 2, 3)
    with torch.no_grad(), lstm_probe.trace(m, tmp_path / f"{writer}.parquet", writer=writer) as probe:
        with probe.tag(phase="rollout", iteration=0):
            for t in range(4):
                m(x[t : t + 1])
        with probe.tag(phase="train", iteration=0, epoch=0, minibatch=0):
            m(x)
    info = lstm_probe.read_info(tmp_path / f"{writer}.parquet")
    assert info.completed and info.metadata["probe_cost"]["writer"] == writer
    df = lstm_probe.load(tmp_path / f"{writer}.parquet")
    assert len(df) == 4 * 2 * 2 + 6 * 2 * 2
    if writer == "process":  # the same rows and numbers from both writers
        other = tmp_path / "thread.parquet"
        with torch.no_grad(), lstm_probe.trace(m, other, writer="thread") as probe:
            with probe.tag(phase="rollout", iteration=0):
                for t in range(4):
                    m(x[t : t + 1])
            with probe.tag(phase="train", iteration=0, epoch=0, minibatch=0):
                m(x)
        ref = lstm_probe.load(other)
        for col in ("call", "layer", "phase", "path", "seq", "t", "h_norm", "c_norm"):
            assert df[col].equals(ref[col]), col
        assert np.array_equal(np.stack(df.c.to_numpy()), np.stack(ref.c.to_numpy()))


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_closed_writer_process_leaves_no_open_file_behind(tmp_path):
    """Its pipes and stderr file are closed with it: left open, each is a ResourceWarning in the user's process
    (shown under -W default, pytest, python -X dev) when it is collected."""
    import gc
    import warnings

    m = nn.LSTM(3, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad(), lstm_probe.trace(m, tmp_path / "run.parquet", writer="process") as probe:
            with probe.tag(phase="rollout", iteration=0):
                m(torch.randn(1, 2, 3))
            assert probe.writer._child is not None
        del probe
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert unclosed == []
    assert lstm_probe.read_info(tmp_path / "run.parquet").completed


def test_the_writer_process_never_loads_torch(tmp_path):
    m = nn.LSTM(3, 8)
    with torch.no_grad(), lstm_probe.trace(m, tmp_path / "x.parquet") as probe:
        m(torch.randn(5, 2, 3))
        m(torch.randn(1, 2, 3))
        deadline = time.monotonic() + 30  # it loads pyarrow when it opens the log (slower on a busy machine)
        while "libarrow" not in (maps := Path(f"/proc/{_child(probe).pid}/maps").read_text()):
            assert time.monotonic() < deadline, "the writer process never loaded pyarrow"
            time.sleep(0.1)
    assert "libtorch" not in maps and "libarrow" in maps


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_writer_process_never_loads_pandas(tmp_path):
    """pyarrow imports pandas on its first array conversion when pandas is installed (~30 MB private);
    the writer process keeps it out. Rows are encoded when a row group is flushed: a short part time
    makes the writer flush while the test still holds it."""
    from lstm_probe import Tracer
    from lstm_probe.capture.modules import find_recurrent

    m = nn.LSTM(3, 8)
    with torch.no_grad(), Tracer(find_recurrent(m), tmp_path / "p.parquet", part_seconds=0.2) as probe:
        m(torch.randn(5, 2, 3))
        journal = tmp_path / "p.parquet.partial"  # its first part file opens when the first row group is written
        deadline = time.monotonic() + 30
        while not (journal.is_dir() and any(journal.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert journal.is_dir() and any(journal.iterdir()), "the writer flushed nothing"
        maps = Path(f"/proc/{_child(probe).pid}/maps").read_text()
    assert "libarrow" in maps and "/pandas/" not in maps


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_writer_process_asks_numpy_for_no_huge_pages_and_the_training_process_keeps_its_own(tmp_path):
    """Numpy advises huge pages for arrays of 4 MB or more; the writer's are written and freed at once (a wide
    log's kept vectors laid out in a row group's mostly untouched array), and each first touch of a huge page
    zeroes 2 MB. Its own process is told so; the user's process is not touched."""
    m = nn.LSTM(3, 8)
    before = os.environ.get("NUMPY_MADVISE_HUGEPAGE")
    with torch.no_grad(), lstm_probe.trace(m, tmp_path / "x.parquet") as probe:
        m(torch.randn(5, 2, 3))
        environ = Path(f"/proc/{_child(probe).pid}/environ").read_bytes().split(b"\0")
    assert b"NUMPY_MADVISE_HUGEPAGE=0" in environ
    assert os.environ.get("NUMPY_MADVISE_HUGEPAGE") == before


TRAIN_WITHOUT_PYARROW = """
import sys
from sb3_contrib import RecurrentPPO
from lstm_probe import ProbeCallback
model = RecurrentPPO("MlpLstmPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0,
                     policy_kwargs=dict(lstm_hidden_size=8))
model.learn(64, callback=ProbeCallback(sys.argv[1]))
print(sorted(m for m in ("pyarrow", "pandas") if m in sys.modules))
"""


def test_training_with_the_writer_process_never_loads_pyarrow(tmp_path):
    """Rows are encoded and written in the writer process; the training process only hands over arrays,
    so it never pays for pyarrow (~29 MB of RSS) or pandas."""
    out = tmp_path / "t.parquet"
    r = subprocess.run([sys.executable, "-c", TRAIN_WITHOUT_PYARROW, str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
    assert lstm_probe.read_info(out).completed


def test_a_stalled_writer_process_makes_training_wait_and_loses_nothing(tmp_path):
    """With the writer process stopped, the pipe and then the backlog fill; past the budget training
    waits. Resumed, every row arrives, in call order."""
    m = nn.LSTM(3, 64)
    with torch.no_grad(), lstm_probe.trace(m, tmp_path / "q.parquet") as probe:
        probe.writer._queue_bytes = 256 * 1024
        proc = _child(probe)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            import threading

            done = threading.Event()

            def train():
                for _ in range(400):
                    m(torch.randn(50, 4, 3))
                done.set()

            worker = threading.Thread(target=train)
            worker.start()
            # past the budget the next hand-over waits: the backlog over it means training is stuck there
            wait_for(lambda: probe.writer._child.backlog_bytes > 256 * 1024, "the backlog never filled")
            assert not done.is_set(), "training never waited for the stopped writer process"
            assert 0 < probe.calls < 400
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        worker.join()
        assert probe.writer.wait_seconds > 0
    df = lstm_probe.load(tmp_path / "q.parquet", vectors=False)
    assert len(df) == 400 * 50 * 4 and df.call.is_monotonic_increasing and df.call.nunique() == 400
    assert lstm_probe.read_info(tmp_path / "q.parquet").metadata["probe_cost"]["wait_seconds"] > 0


def test_states_waiting_for_a_stalled_writer_keep_their_values_when_weights_change(tmp_path):
    """A call's recovery hands over views of the layer's weights; if the pipe cannot take them yet, they
    wait in the backlog. An optimizer step that changes the weights in place before the writer process
    catches up must not change the c recovered for the earlier call."""
    torch.manual_seed(0)
    m = nn.LSTM(3, 16)
    big = torch.randn(100, 512, 3)  # ~3.5 MB of states: more than the pipe holds
    x, h0, c0 = torch.randn(7, 2, 3), torch.randn(1, 2, 16), torch.randn(1, 2, 16)
    with torch.no_grad():
        want = []
        h, c = h0, c0
        for t in range(7):
            _, (h, c) = m(x[t : t + 1], (h, c))
            want.append(c[0].numpy().copy())
    with torch.no_grad(), lstm_probe.trace(m, tmp_path / "w.parquet") as probe:
        proc = _child(probe)
        wait_for(lambda: (tmp_path / "w.parquet.partial").is_dir(), "the writer process never opened the log")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            m(big)
            m(x, (h0, c0))
            assert probe.writer._child.backlog_bytes > 0, "the test call went into the pipe; make `big` larger"
            for p in m.parameters():  # an optimizer step, in place
                p.add_(0.5)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
    df = lstm_probe.load(tmp_path / "w.parquet")
    last = df[df["call"] == df["call"].max()].sort_values(["t", "seq"])
    got = np.stack(last["c"].to_numpy()).reshape(7, 2, 16)
    assert np.abs(got - np.stack(want)).max() < 1e-5


def test_a_killed_writer_process_stops_training_with_one_line(tmp_path):
    m = nn.LSTM(3, 8)
    probe = lstm_probe.trace(m, tmp_path / "k.parquet").start()
    with torch.no_grad():
        m(torch.randn(5, 2, 3))
        proc = _child(probe)
        proc.kill()
        proc.wait()
        with pytest.raises(lstm_probe.OutputError, match=r"writer process ended unexpectedly \(exit code -9\)"):
            for _ in range(50):  # the pipe may take a few messages before the kill shows
                m(torch.randn(5, 2, 3))
    with pytest.raises(lstm_probe.OutputError, match="ended unexpectedly"):
        probe.close()


def test_a_writer_process_that_died_leaves_no_open_file_behind(tmp_path):
    """The fail path: a process that ended on its own (killed here) has its pipes and stderr file closed at
    close too, not only one that closed the log (each left open is a ResourceWarning when collected)."""
    import gc
    import warnings

    m = nn.LSTM(3, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probe = lstm_probe.trace(m, tmp_path / "k.parquet").start()
        with torch.no_grad():
            m(torch.randn(5, 2, 3))
            child = probe.writer._child
            child.proc.kill()
            child.proc.wait()
            with pytest.raises(lstm_probe.OutputError, match="ended unexpectedly"):
                for _ in range(50):  # the pipe may take a few messages before the kill shows
                    m(torch.randn(5, 2, 3))
        with pytest.raises(lstm_probe.OutputError, match="ended unexpectedly"):
            probe.close()
        assert child.proc.stdin.closed and child.proc.stdout.closed and child.stderr.closed
        del probe, child
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


KILLED = r"""
import os, signal, sys, torch
from torch import nn
import lstm_probe
m = nn.LSTM(3, 8)
probe = lstm_probe.trace(m, sys.argv[1]).start()  # parts close every 60 s: none closes here
with torch.no_grad():
    for _ in range(30):
        m(torch.randn(7, 2, 3))
assert probe.writer._child.backlog_bytes == 0  # all handed over
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_rows_handed_over_survive_a_sigkill_of_training(tmp_path):
    """The writer process sees its pipe close and publishes every row it was given as a part of the crash
    journal (a thread writer would have lost them all: no part closes in this short run)."""
    out = tmp_path / "killed.parquet"
    r = subprocess.run([sys.executable, "-c", KILLED, str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    # the writer process frees the output's lock once it has published what it was handed
    wait_for(lambda: not (tmp_path / "killed.parquet.lock").exists(), "the writer process never finished")
    info = lstm_probe.read_info(out)
    assert not info.completed and info.rows == 30 * 7 * 2


def test_ctrl_c_to_the_whole_process_group_still_closes_a_valid_log(tmp_path):
    """A terminal's Ctrl-C reaches every process of the group: the writer process ignores it and the
    training process closes the log through it."""
    args = ["run", "Pendulum-v1", "--steps", "100000", "--n-steps", "32", "--batch-size", "32", "--n-epochs", "1",
            "--hidden-size", "8", "--torch-threads", "1", "--part-seconds", "0.3"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "lstm_probe", *args],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    partial = tmp_path / "run.parquet.partial"
    wait_for(lambda: list(partial.glob("part-*.parquet")), "the run published no part", timeout=240)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    info = lstm_probe.read_info(tmp_path / "run.parquet")
    assert not info.completed and info.rows == info.metadata["progress"]["rows"] > 0
    cost = info.metadata["probe_cost"]
    assert cost["writer"] == "process" and cost["writer_cpu_seconds"] > 0
    if sys.platform == "linux":
        assert 0 < cost["writer_peak_private_mb"] <= cost["writer_peak_rss_mb"]


def test_a_ctrl_c_inside_a_hand_over_is_trainings_interrupt_not_a_writer_failure(tmp_path):
    """With the writer process, hand-overs run on the training thread. A SIGINT landing inside one is
    training's KeyboardInterrupt (exit 130 in the CLI), not 'cannot write the log'; the log stays
    writable and closes with every row handed over before and after."""
    m = nn.LSTM(3, 8)
    out = tmp_path / "i.parquet"

    def interrupted() -> None:
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C, to the whole process
        # Its KeyboardInterrupt is raised at the main thread's next bytecode once the signal's handler ran
        # (at once here; later if another thread of the process took the signal): inside this job.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.01)
        raise AssertionError("the SIGINT never arrived")  # a bug in the job: the submit raises OutputError

    # Python's own Ctrl-C handler, also when pytest inherited SIGINT ignored (a shell's background job)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with torch.no_grad(), lstm_probe.trace(m, out) as probe:
            m(torch.randn(1, 2, 3))
            with pytest.raises(KeyboardInterrupt):
                probe.writer.submit(interrupted, 0)
            assert probe.writer.error is None
            m(torch.randn(1, 2, 3))
    finally:
        signal.signal(signal.SIGINT, previous)
    info = lstm_probe.read_info(out)
    assert info.completed and info.rows == 4


# -- the writer's own failures and timers (issue 24: items 3, 5, 8) ----------------------------------


def _rows_of(path):
    return sum(lstm_probe.read_info(f).rows for f in sorted(path.glob("part-*.parquet")))


@pytest.mark.parametrize("writer,where", [("process", "writer"), ("process", "job"), ("thread", "job")])
def test_an_exception_in_the_writer_publishes_what_was_finished_and_names_it(tmp_path, writer, where):
    """A bug in the writer process (a message it cannot handle) or in a job on the training side: the rows
    handed over before it are published, the log says it did not complete and why, and the error names
    the real cause (not "cannot write the log")."""
    m = nn.LSTM(3, 8)
    out = tmp_path / "e.parquet"
    probe = lstm_probe.trace(m, out, writer=writer).start()
    with torch.no_grad():
        for _ in range(3):
            m(torch.randn(5, 2, 3))  # 3 calls x 5 steps x 2 columns: 30 rows handed over
    expected = 3 * 5 * 2

    def bug():
        raise ValueError("a bug in a job")

    with pytest.raises(lstm_probe.OutputError) as caught:
        if where == "writer":
            probe.writer.send(object())  # no declared message: fails the writer process, seen at the next hand-over
            wait_for(lambda: _child(probe).poll() is not None, "the writer process did not fail")
            with torch.no_grad():
                m(torch.randn(5, 2, 3))
        else:
            probe.writer.submit(bug, 0)
            if writer == "thread":
                with torch.no_grad():
                    wait_for(lambda: probe.writer.error is not None, "the job never ran")
                    m(torch.randn(5, 2, 3))
    cause = "TypeError: the sink takes Rows" if where == "writer" else "ValueError: a bug in a job"
    assert cause in str(caught.value) and "cannot write" not in str(caught.value)
    with pytest.raises(lstm_probe.OutputError, match=cause):
        probe.close()
    info = lstm_probe.read_info(out)
    assert info.rows == expected and not info.completed
    assert cause in info.metadata["stop_reason"]
    assert not list(tmp_path.glob(".*.tmp")) and not list(tmp_path.glob("*/.*.tmp"))
    assert not (tmp_path / "e.parquet.lock").exists()


@pytest.mark.parametrize("package", ["numpy", "pyarrow"])
def test_a_writer_process_that_cannot_start_says_why(tmp_path, monkeypatch, package):
    """The writer process's stderr is kept: when it dies at start (its imports fail: a
    traceback on its stderr), or reports that it cannot open the log (pyarrow), the last error line and
    the fix come with the error."""
    broken = tmp_path / "broken" / package
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(f"raise ImportError('{package} is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))
    m = nn.LSTM(3, 8)
    probe = lstm_probe.trace(m, tmp_path / "s.parquet").start()
    wait_for(lambda: _child(probe).poll() is not None, "the writer process started after all")
    with pytest.raises(lstm_probe.OutputError) as caught, torch.no_grad():
        m(torch.randn(5, 2, 3))
    text = str(caught.value)
    assert f"ImportError: {package} is broken here" in text and "--writer thread" in text, text
    with pytest.raises(lstm_probe.OutputError):
        probe.close()


def test_the_writer_process_keeps_flushing_while_training_holds_a_frames_tail(tmp_path):
    """Training hands over a call larger than the pipe and goes idle with the frame's tail in its backlog.
    The writer process must not block reading that frame: its flush timer publishes the earlier rows
    within --part-seconds (what "SIGKILL loses at most --part-seconds" rests on)."""
    from lstm_probe import Tracer
    from lstm_probe.capture.modules import find_recurrent

    m = nn.LSTM(3, 64)
    out = tmp_path / "tail.parquet"
    probe = Tracer(find_recurrent(m), out, part_seconds=0.5).start()
    try:
        with torch.no_grad():
            for _ in range(4):
                m(torch.randn(5, 2, 3))  # 40 rows
            m(torch.randn(100, 64, 3))  # ~5 MB of states: more than the pipe takes at once
        assert probe.writer._child.backlog_bytes > 0, "the big call went into the pipe whole; make it larger"
        partial = tmp_path / "tail.parquet.partial"
        wait_for(lambda: _rows_of(partial) >= 40, "the writer process stopped flushing while training was idle")
    finally:
        probe.close()
    assert lstm_probe.read_info(out).rows == 40 + 100 * 64


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_an_idle_run_publishes_its_rows_within_part_seconds(tmp_path, writer):
    from lstm_probe import Tracer
    from lstm_probe.capture.modules import find_recurrent

    m = nn.LSTM(3, 8)
    probe = Tracer(find_recurrent(m), tmp_path / "idle.parquet", part_seconds=0.5, writer=writer).start()
    try:
        with torch.no_grad():
            m(torch.randn(5, 2, 3))  # then nothing: training is idle (an evaluation, a checkpoint)
        partial = tmp_path / "idle.parquet.partial"
        wait_for(lambda: _rows_of(partial) == 10, "an idle run's rows never reached a finished part")
    finally:
        probe.close()


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_rows_handed_over_at_a_slow_rate_are_published_within_part_seconds(tmp_path, writer):
    """A run that hands over a row now and then (summary capture, a slow env) never fills a row buffer: each
    row must still reach a published part within --part-seconds of its hand-over, plus a small slack (what "a
    SIGKILL of everything loses at most --part-seconds" rests on). The idle test above waits for its rows to be
    published at all; here every call's hand-over is stamped, and every part when it first appears, and each
    call's age at publication is measured. Before, a row waited up to part_seconds / 2 in its buffer, then its
    part counted part_seconds from its first row group: rows were published up to twice part_seconds late."""
    import pyarrow.parquet as pq

    from lstm_probe import Tracer
    from lstm_probe.capture.modules import find_recurrent

    part_seconds, slack, every, calls = 2.0, 0.5, 0.05, 100  # a call each 50 ms for 5 s: 2.5 part_seconds
    m = nn.LSTM(3, 8)
    partial = tmp_path / "slow.parquet.partial"
    probe = Tracer(find_recurrent(m), tmp_path / "slow.parquet", part_seconds=part_seconds, writer=writer).start()
    appeared: dict[str, float] = {}  # part -> when it was first seen

    def look() -> int:
        now = time.monotonic()
        for f in partial.glob("part-*.parquet"):
            appeared.setdefault(f.name, now)
        return len(appeared)

    handed = []  # call -> when it was handed over
    try:
        with torch.no_grad():
            # two-step calls: handed over as they return (one-step calls wait in blocks on the training side)
            m(torch.randn(2, 1, 3))  # call 0: the writer is up once its rows are published
            wait_for(lambda: look() > 0, "the first rows were never published")
            start = time.monotonic()
            for k in range(1, calls + 1):  # paced by the clock; each wait records the parts that appear
                wait_for(lambda k=k: look() >= 0 and time.monotonic() >= start + k * every, "(pacing)")
                handed.append(time.monotonic())
                m(torch.randn(2, 1, 3))  # two rows
            wait_for(lambda: look() and _rows_of(partial) == 2 * (calls + 1), "the rows were never all published")
        where = {}  # call -> the part it was published in
        for name in appeared:
            for call in pq.read_table(partial / name, columns=["call"]).column("call").to_pylist():
                assert where.get(call, name) == name, f"call {call} published twice"
                where[call] = name
    finally:
        probe.close()
    assert sorted(where) == list(range(calls + 1))
    ages = [appeared[where[k + 1]] - t for k, t in enumerate(handed)]
    late = [(k + 1, round(age, 2)) for k, age in enumerate(ages) if age > part_seconds + slack]
    assert not late, f"rows published more than {part_seconds} s + {slack} s after their hand-over: {late[:5]}"
    assert len(appeared) >= 3  # a part each part_seconds, not one at the end


@pytest.mark.parametrize("writer", ["process", "thread"])
def test_one_step_calls_at_a_slow_rate_are_published_within_the_whole_bound(tmp_path, writer):
    """One-step calls (every rollout step) wait on the training side in a block until 256 calls or a change of
    tags: with a slow env (a call each 100 ms here; a real robot's second) their rows reached the writer only
    minutes later, and a SIGKILL lost them. A block a quarter of --part-seconds old is handed over at the next
    call (capture/held.py), the writer publishes within --part-seconds of taking a row: every call must reach a
    published part within 1.25 x part_seconds of the call, plus the gap to the next call and a small slack.
    Before, no row of these 30 calls was published before close."""
    import pyarrow.parquet as pq

    from lstm_probe import Tracer
    from lstm_probe.capture.held import HOLD_SHARE
    from lstm_probe.capture.modules import find_recurrent

    part_seconds, slack, every, calls = 1.2, 0.5, 0.1, 30  # 3 s of calls: 2.5 part_seconds, no block filled
    m = nn.LSTM(3, 8)
    partial = tmp_path / "steps.parquet.partial"
    probe = Tracer(find_recurrent(m), tmp_path / "steps.parquet", part_seconds=part_seconds, writer=writer).start()
    appeared: dict[str, float] = {}  # part -> when it was first seen

    def look() -> int:
        now = time.monotonic()
        for f in partial.glob("part-*.parquet"):
            appeared.setdefault(f.name, now)
        return len(appeared)

    called = []  # call -> when it was made
    try:
        with torch.no_grad(), probe.tag(phase="rollout", iteration=0):  # the same tags throughout: one block
            start = time.monotonic()
            for k in range(calls):  # paced by the clock; each wait records the parts that appear
                wait_for(lambda k=k: look() >= 0 and time.monotonic() >= start + k * every, "(pacing)")
                called.append(time.monotonic())
                m(torch.randn(1, 2, 3))  # one step of 2 envs: two rows
            returned = time.monotonic()  # the last block began by now
            # the last call's block ages out at the next call: one more call, after its share of part_seconds
            wait_for(lambda: look() >= 0 and time.monotonic() >= returned + part_seconds * HOLD_SHARE, "(pacing)")
            m(torch.randn(1, 2, 3))
            wait_for(lambda: look() and _rows_of(partial) >= 2 * calls, "the rows were never all published", 30.0)
        where = {}  # call -> the part it was published in
        for name in appeared:
            for call in pq.read_table(partial / name, columns=["call"]).column("call").to_pylist():
                assert where.get(call, name) == name, f"call {call} published twice"
                where[call] = name
    finally:
        probe.close()
    assert set(range(calls)) <= set(where)
    bound = part_seconds * (1 + HOLD_SHARE) + every + slack
    ages = [appeared[where[k]] - t for k, t in enumerate(called)]
    late = [(k, round(age, 2)) for k, age in enumerate(ages) if age > bound]
    assert not late, f"rows published more than {bound:.2f} s after their call: {late[:5]}"
    assert len({where[k] for k in range(calls)}) >= 2  # published as they aged, not in one part at the end


@pytest.mark.parametrize("held", ["batch", "second half"])
def test_a_loop_recorded_whole_is_handed_over_by_the_age_of_its_first_step(tmp_path, monkeypatch, held):
    """A per-timestep loop recorded whole (sb3's stepwise training path: CoreTracer.loop_begin, loop_end) goes to
    the writer as one job at its end, there batched or its second half held back (the CUDA path's order of work).
    Its oldest call is its first step: the age rule (capture/held.py) counts from the loop's beginning, so a loop
    that took a quarter of --part-seconds is handed over at the next traced call (here a one-step call, which
    hands nothing over itself). Before, the rule counted from the loop's end: its rows waited a quarter more."""
    from lstm_probe import Tracer
    from lstm_probe.capture.held import HOLD_SHARE
    from lstm_probe.capture.modules import find_recurrent
    from lstm_probe.log.logwriter import LogWriter

    if held == "second half":
        monkeypatch.setattr(LogWriter, "defer_always", True)
    part_seconds, steps, envs = 2.0, 4, 2
    m = nn.LSTM(3, 8)
    out = tmp_path / "loop.parquet"
    probe = Tracer(find_recurrent(m), out, part_seconds=part_seconds).start()
    try:
        probe.batch_jobs(held == "batch")
        grid = {"env": np.arange(envs), "env_step": np.arange(steps)[None, :]}
        with torch.no_grad():
            with probe.tag(phase="train", iteration=0, epoch=0, minibatch=0, **grid):
                loop = probe.loop_begin(m, envs)
                began = time.perf_counter()  # (after the loop's own beginning)
                assert loop is not None
                state = None
                for _ in range(steps):
                    _, state = m(torch.randn(1, envs, 3), state)
                wait_for(lambda: time.perf_counter() >= began + part_seconds * HOLD_SHARE, "(pacing)")
                probe.loop_end(loop)
            assert probe.rows == 0  # the loop's rows wait on the training side
            with probe.tag(phase="rollout", iteration=1):
                m(torch.randn(1, envs, 3))  # kept in a block
            assert probe.rows == steps * envs  # the loop's rows, handed over by their age
    finally:
        probe.close()
    assert lstm_probe.read_info(out).rows == steps * envs + envs


def test_a_close_on_the_writer_thread_closes_the_log_instead_of_joining_itself(tmp_path):
    """An object whose __del__ closes the probe (sb3's learn() guard) can be collected on the writer
    thread; the thread cannot join itself: it closes the log once its job returns."""
    m = nn.LSTM(3, 8)
    out = tmp_path / "g.parquet"
    probe = lstm_probe.trace(m, out, writer="thread").start()
    with torch.no_grad():
        m(torch.randn(5, 2, 3))

    class Guard:
        def __del__(self):
            probe.close(completed=False, stop_reason="closed by a guard")

    held = [Guard()]
    thread = probe.writer._thread
    probe.writer.submit(held.clear, 0)  # the guard dies on the writer thread
    del held
    # the thread publishes the log, frees the lock and ends: wait for its end, not the log's file alone
    wait_for(lambda: not thread.is_alive(), "the writer thread never ended")
    assert out.exists(), "the log was never closed"
    info = lstm_probe.read_info(out)
    assert info.rows == 10 and info.metadata["stop_reason"] == "closed by a guard"
    assert not (tmp_path / "g.parquet.lock").exists()


def test_row_groups_are_phase_pure_and_a_phase_filter_skips_the_others(tmp_path):
    """Train rows and the other rows are buffered apart and written as row groups of their own: a filter
    on phase prunes row groups by their statistics. Rows stay in call order within each phase; the other
    lane's row groups hold a quarter of a buffer once train rows came."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from lstm_probe.log.layout import row_capacity

    torch.manual_seed(0)
    m = nn.LSTM(3, 256)
    xs = torch.randn(64, 8, 3)
    capacity = row_capacity(256)
    iterations = 2 * capacity // 512 + 1  # 512 train rows an iteration: three train row groups
    with torch.no_grad(), lstm_probe.trace(m, tmp_path / "log.parquet") as probe:
        for it in range(iterations):
            with probe.tag(phase="rollout", iteration=it):
                for t in range(16):  # 8 envs, 16 steps: 128 rollout rows an iteration
                    m(xs[t : t + 1])
            with probe.tag(phase="train", iteration=it, epoch=0, minibatch=0):
                m(xs)
    meta = pq.ParquetFile(tmp_path / "log.parquet").metadata
    column = meta.schema.to_arrow_schema().get_field_index("phase")
    groups = []
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(column).statistics
        assert stats.min == stats.max, (i, stats.min, stats.max)  # one phase per row group
        groups.append((stats.min, meta.row_group(i).num_rows))
    train = [n for phase, n in groups if phase == "train"]
    rollout = [n for phase, n in groups if phase == "rollout"]
    assert sum(train) == 512 * iterations and sum(rollout) == 128 * iterations
    assert len(train) == 3 and max(train) <= capacity
    assert len(rollout) >= 2 and max(rollout) <= capacity // 4
    df = lstm_probe.load(tmp_path / "log.parquet")
    for phase in ("rollout", "train"):
        calls = df[df.phase == phase].call.to_numpy()
        assert (np.diff(calls) >= 0).all(), phase  # call order within each phase
    data = ds.dataset(tmp_path / "log.parquet")
    rollout_only = ds.field("phase") == "rollout"
    kept = sum(len(f.split_by_row_group(rollout_only)) for f in data.get_fragments())
    assert kept == len(rollout)  # the train row groups are skipped by their statistics
    read = data.to_table(columns=["call", "h"], filter=rollout_only)
    assert read.column("call").to_pylist() == df[df.phase == "rollout"].call.tolist()


# -- batched jobs (LogWriter.submit(batch=True)): a failure or a Ctrl-C in one loses no other job's rows -----


def _batched_calls(probe, m, n):
    with torch.no_grad():
        for _ in range(n):
            m(torch.randn(5, 2, 3))  # 5 steps x 2 columns: 10 rows a call, its job batched


def _batching(out, calls):
    """A traced LSTM whose training calls' jobs are batched, ``calls`` of them made: (module, probe)."""
    m = nn.LSTM(3, 8)
    probe = lstm_probe.trace(m, out).start()
    probe.batch_jobs(True)
    _batched_calls(probe, m, calls)
    return m, probe


@pytest.mark.parametrize("half", ["second", "first"])
def test_a_bug_in_a_batched_job_keeps_the_rows_of_the_jobs_batched_before_it(tmp_path, half):
    """The jobs batched before a failing job (its second half, run with theirs; or its first half, run while
    theirs wait) had their rows made: they are published with the failed log, as they were before jobs were
    batched (each job's rows crossed the pipe when it ran)."""
    out = tmp_path / "b.parquet"
    m, probe = _batching(out, 3)

    def bug():
        raise ValueError("a bug in a job")

    if half == "second":
        probe.writer.submit(lambda: bug, 0, batch=True)
        _batched_calls(probe, m, 1)  # after the failure: never handed over
        with pytest.raises(lstm_probe.OutputError, match="a bug in a job"):
            probe.batch_jobs(False)
    else:
        with pytest.raises(lstm_probe.OutputError, match="a bug in a job"):
            probe.writer.submit(bug, 0, batch=True)
    with pytest.raises(lstm_probe.OutputError, match="a bug in a job"):
        probe.close()
    info = lstm_probe.read_info(out)
    assert not info.completed and info.rows == 3 * 10
    assert "a bug in a job" in info.metadata["stop_reason"]


def test_a_ctrl_c_in_a_batched_second_half_loses_only_that_jobs_rows(tmp_path):
    """Training's KeyboardInterrupt landing in one batched second half: the jobs batched after it still run
    (at close), as a Ctrl-C lost one job's rows before jobs were batched."""
    out = tmp_path / "c.parquet"
    m, probe = _batching(out, 1)

    def interrupted():
        raise KeyboardInterrupt  # what the SIGINT handler raises at the job's next bytecode

    probe.writer.submit(lambda: interrupted, 0, batch=True)
    _batched_calls(probe, m, 2)
    with pytest.raises(KeyboardInterrupt):
        probe.batch_jobs(False)
    assert probe.writer.error is None
    probe.close()
    info = lstm_probe.read_info(out)
    assert info.completed and info.rows == 3 * 10
