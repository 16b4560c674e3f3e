"""The training process's side of a log: :class:`LogWriter` takes the states the tracer hands over and
gets them to the log's :class:`~lstm_probe.log.sink.Sink`, in a writer process of its own (``writer="process"``,
:mod:`lstm_probe.log.writer_process`) or on a writer thread (``writer="thread"``).

The training thread only keeps references to detached state tensors (``tracer.py``) and hands them
over as *jobs*, whose memory is bounded in bytes. A job does the device-to-host copies and the torch part
of recovering per-step states (``recover.py``), then hands host arrays to the sink, which does everything
per row (``sink.py``). In-process, every bit of Python the sink runs holds the interpreter lock that
training needs, so its whole cost lands on training; in its own process it uses another core.
"""

from __future__ import annotations

import atexit
import math
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lstm_probe.errors import BadInput, OutputError, one_line
from lstm_probe.log.layout import PART_ROWS, arrow_too_old, check_output, row_capacity
from lstm_probe.log.lock import OutputLock, StaleLockWarning
from lstm_probe.log.messages import Batch, Message, Progress
from lstm_probe.log.sink import Sink
from lstm_probe.log.writer_process import Child, WriterGone
from lstm_probe.options import CaptureOptions, WriterConfig

BATCH_JOBS = 32
"""Batched jobs (``submit(batch=True)``) a writer process's batch holds before their second halves run and
their messages cross the pipe as one."""
BATCH_BYTES = 16 << 20
"""The most their snapshots (``transfer.Staged``) hold before the batch is sent."""


class LogWriter:
    """Hands one log's states to its sink: in a writer process, or on a writer thread (see the module
    docstring).

    The training thread hands over *jobs* (:meth:`submit`): closures that hold the detached state
    tensors of a block of calls and their provenance; a job ends by handing host arrays to the sink with
    :meth:`send`. With a writer process a job runs right away and its messages go into the pipe, whose
    backlog is bounded by bytes; with a writer thread jobs wait in a queue bounded by the bytes they
    hold. Either way a slow disk slows training down instead of growing memory. :meth:`close` drains
    everything, writes the outcome into the metadata and publishes the log.
    """

    defer_always = False
    """Hold back every job's second half to the next submit (see :meth:`submit`), not only those whose
    device copy is under way: the CUDA path's order of work, exercised on the CPU (tests)."""

    def __init__(
        self,
        options: CaptureOptions,
        hidden_size: int,
        modules: Sequence[str],
        metadata: dict[str, Any],
        codes: Mapping[str, Sequence[str]],
        *,
        part_rows: int = PART_ROWS,
        queue_bytes: int = 32 << 20,
        shard: str | None = None,
    ):
        if old := arrow_too_old():  # before any file is touched: an old pyarrow fails on the first null vector
            raise BadInput(old)
        self._later: Any = None  # a job's second half held back to the next submit (see submit)
        self._batch: list[Any] = []  # batched jobs' second halves, in order (see submit)
        # when the oldest call of the held-back second half's job, and of the batch's jobs, was made (held_since)
        self._later_since = self._batch_since = math.inf
        self._batch_bytes = 0
        self._gathered: list[Message] | None = None  # messages of the batch being sent (see send)
        config = WriterConfig.of(options, hidden_size, modules, metadata, codes, part_rows=part_rows, shard=shard)
        self.config = config  # checked when made (options.py); what the sink reads, in whichever process
        self.path = Path(config.out)
        # the lock first: the check below (and the writer's removal of an old log under --force) then runs
        # with no other run writing here
        self.lock = OutputLock.take(self.path, is_dir=config.directory, shard=shard)
        if self.lock.note is not None:
            warnings.warn(self.lock.note, StaleLockWarning, stacklevel=3)
        try:
            check_output(self.path, force=config.force, is_dir=config.directory, shard=shard)
        except BaseException:
            self.lock.release()
            raise
        self.progress: dict[str, Any] = {}
        self._sent_progress: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.closed = False
        self._jobs: deque[_Sized | None] = deque()
        self._queued_bytes = 0
        self._unfinished = 0  # jobs handed to the writer thread and not yet run (see drain)
        self._queue_bytes = queue_bytes
        self._cond = threading.Condition()
        self.busy_seconds = 0.0  # the writer thread's wall time in jobs and writes
        self.cpu_seconds = 0.0  # the writer thread's CPU time, set when it ends
        self.wait_seconds = 0.0  # training thread time spent waiting for room in the queue or the pipe
        self.sink: Sink | None = None
        self._child: Child | None = None
        self._final: dict[str, Any] | None = None  # a close() asked for on the writer thread itself
        self.mode = config.writer
        self._thread: threading.Thread | None = None
        try:
            if config.writer == "process":
                self._child = Child.start(self.config)
                self.lock.set_writer(self._child.proc.pid)
            else:
                self.sink = Sink(self.config)
                self._thread = threading.Thread(target=self._work, name="lstm-probe-writer", daemon=True)
                self._thread.start()
        except BaseException:
            self.lock.release()
            raise
        _OPEN.add(self)

    @property
    def inline(self) -> bool:
        """Whether :meth:`submit` runs jobs right away on the calling thread (with a writer process)."""
        return self._child is not None

    @property
    def capacity(self) -> int:
        """Rows per row group."""
        return row_capacity(self.config.hidden_size, self.config.vectors, self.config.sparse_vectors)

    # -- training thread -------------------------------------------------------------------------
    def submit(self, job: Callable[[], Any], nbytes: int, batch: bool = False, since: float | None = None) -> None:
        """Run ``job``: with a writer process, here and now (its torch ops are few and its messages go
        into the pipe without waiting; a second Python thread would cost training more in interpreter
        lock hand-overs than the job itself); with a writer thread, queued for it (this blocks while
        the queued jobs hold more than the budget).

        A job may return its second half (``transfer.Later``: the host side of a block whose device-to-host
        copy it started). With a writer process, a second half whose copy is still under way runs at the
        next submit or at close, after the halves before it (jobs stay in order): the copy overlaps the
        training steps in between instead of stalling this one.

        ``batch``: with a writer process, the job's first half runs now (its snapshot taken: what the caller
        changes later is not read), its second half waits with the batch's: they run in order, their messages
        crossing the pipe as one (:class:`~lstm_probe.log.messages.Batch`), once :data:`BATCH_JOBS` jobs or
        :data:`BATCH_BYTES` wait, at the next job not batched (which comes after them), at :meth:`drain` and
        at close, or :meth:`flush_batch`. (``CoreTracer.batch_jobs``: sb3's training calls, an update's crossing
        as one message.) With a writer thread the job is queued as any other.

        ``since``: when the job's oldest call was made (``time.perf_counter()``; None: now), for
        :meth:`held_since`."""
        if self.error is not None:
            raise self._failed()
        if self.closed:
            raise OutputError(f"the log {self.path} is already closed")
        if self._child is not None:
            since = time.perf_counter() if since is None else since
            if batch:
                self._hold(job, since)
            else:
                self._send_batch()
                self._settle(job, since)
            if self.error is not None:
                raise self._failed()
            return
        with self._cond:
            if self._queued_bytes and self._queued_bytes + nbytes > self._queue_bytes:
                start = time.monotonic()
                while self._queued_bytes and self._queued_bytes + nbytes > self._queue_bytes and self.error is None:
                    self._cond.wait()
                self.wait_seconds += time.monotonic() - start
                if self.error is not None:
                    raise self._failed()
            self._queued_bytes += nbytes
            self._unfinished += 1
            self._jobs.append(_Sized(job, nbytes))
            self._cond.notify_all()

    def drain(self) -> None:
        """Return once every job handed over so far has run, second half included (a reader of what they
        computed, such as live metrics, then sees all of it). With a writer process that is the held second
        half, run now (it waits for its device copy); with a writer thread, the queue run down. Called at
        block boundaries only: it may wait for the device."""
        if self.error is not None:
            raise self._failed()
        if self._child is not None:
            self._send_batch()
            self._settle(None)
        else:
            with self._cond:
                while self._unfinished and self.error is None and self._thread is not None and self._thread.is_alive():
                    self._cond.wait(1.0)
        if self.error is not None:
            raise self._failed()

    def _failed(self) -> OutputError:
        """The error to raise on the training thread once the writer has failed: "cannot write" for a
        disk's or the system's error, else the writer's own failure with its cause."""
        if _is_write_error(self.error):
            err = OutputError(f"cannot write the log {self.path}: {self.error}")
        else:
            err = OutputError(
                f"the lstm-probe writer failed ({self.reason()}); the log {self.path} keeps the rows written "
                "before it (completed: false)"
            )
        err.__cause__ = self.error
        return err

    def reason(self) -> str:
        """The writer's error in one line, its type named unless it is a disk's or the system's error."""
        exc = self.error
        if exc is None:
            return ""
        if isinstance(exc, WriterGone):
            return str(exc)
        return one_line(exc, kind=not isinstance(exc, OSError))

    # -- writer thread ---------------------------------------------------------------------------
    def send(self, message: Message) -> None:
        """Hand host arrays to the sink, as a declared message (``messages.py``; inside a job: on the writer
        thread, or on the training thread with a writer process)."""
        gathered = self._gathered
        if self.progress != self._sent_progress:
            self._sent_progress = dict(self.progress)
            progress = Progress(self._sent_progress)
            if gathered is None:
                self._to_sink(progress)
            else:
                gathered.append(progress)
        if gathered is None:
            self._to_sink(message)
        else:
            gathered.append(message)

    def _to_sink(self, message: Message | Batch) -> None:
        if self._child is not None:
            self.wait_seconds += self._child.send(message, self._queue_bytes)
        else:
            assert self.sink is not None
            self.sink.take(message)

    def _work(self) -> None:
        # Torch ops here (stacking states, the recovery's matmuls) must not start a second team of
        # intra-op threads next to training's: with two torch threads on two cores that doubled the run
        # time. The setting is per thread (OpenMP's and MKL's thread counts for the calling thread);
        # training's own thread count is untouched (tests/test_sb3.py checks results stay identical).
        import torch

        torch.set_num_threads(1)
        sink = self.sink  # the thread exists only without a writer process
        assert sink is not None
        while True:
            with self._cond:
                while not self._jobs:
                    # wake when the oldest unpublished row is due (FileLog.write_due), idle or not
                    timeout = sink.log.due_at() - time.monotonic()
                    if timeout <= 0:
                        break
                    self._cond.wait(None if timeout == math.inf else timeout)
                item = self._jobs.popleft() if self._jobs else _IDLE
            if item is None:  # close(): stop; close() finishes the log
                self.cpu_seconds = time.thread_time()  # this thread's CPU time, start to end
                if self._final is not None:  # close() was called on this thread: finish here
                    try:
                        self._finish(self._final)
                    except BaseException:
                        pass  # self.error holds it; the log was published as failed
                    finally:
                        self.lock.release()
                return
            if item is _IDLE:  # small or idle logs too reach disk in bounded time
                self._run(sink.write_due)
                continue
            later = self._run(item.job)
            if later is not None:  # the writer thread may wait for the device: the second half now
                self._run(later)
            with self._cond:
                self._queued_bytes -= item.nbytes
                self._unfinished -= 1
                self._cond.notify_all()
            self._run(sink.write_due)

    def _settle(self, job: Callable[[], Any] | None, since: float = math.inf) -> None:
        """Run the second half held back from the job before (first: nothing already copied is lost if the
        new job fails), then ``job``, then run or hold back its second half (see submit)."""
        held, self._later = self._later, None
        if held is not None:
            self._run(held)
        later = self._run(job) if job is not None else None
        if later is not None:
            if self.defer_always or not later.ready:
                self._later, self._later_since = later, since
            else:
                self._run(later)

    def _hold(self, job: Callable[[], Any], since: float) -> None:
        """A batched job (see submit): the second half held back before it first, then its first half now,
        its second half into the batch; the batch sent once full."""
        held, self._later = self._later, None
        if held is not None:
            self._run(held)
        later = self._run(job)
        if later is None:
            return
        self._batch_since = min(self._batch_since, since) if self._batch else since
        self._batch.append(later)
        self._batch_bytes += _staged_bytes(later)
        if len(self._batch) >= BATCH_JOBS or self._batch_bytes >= BATCH_BYTES:
            self._send_batch()

    def held_since(self) -> float:
        """When the oldest call was made (``time.perf_counter()``; ``math.inf``: none) whose rows wait in this
        process: in the batch, or in the second half held back (see :meth:`submit`)."""
        batch = self._batch_since if self._batch else math.inf
        return batch if self._later is None else min(batch, self._later_since)

    def send_held(self, made: float) -> None:
        """Hand over what waits of calls made at ``made`` or before (``capture/held.py``): the batch, and the
        second half held back if its copy is complete (never waiting for the device)."""
        if self._batch and self._batch_since <= made:
            self.flush_batch()
        later = self._later
        if later is not None and self._later_since <= made and later.ready:
            self._later = None
            self._run(later)
            if self.error is not None:
                raise self._failed()

    def flush_batch(self) -> None:
        """Send the batched jobs now (see :meth:`submit`)."""
        if self._batch:
            self._send_batch()
            if self.error is not None:
                raise self._failed()

    def _send_batch(self) -> None:
        """The batch's second halves, in order, their messages into the pipe as one. Every batched job came
        before any error of the writer (``submit`` takes no job once one is set), so they run and their
        messages cross whatever failed after them (a later job's first half): the log keeps the rows made
        before a failure, as it did when each job's rows crossed as it ran."""
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if not batch:
            return
        failed, self.error = self.error, None  # (the first error stays the writer's: restored below)
        gathered: list[Message] = []
        self._gathered = gathered
        done = 0
        try:
            for later in batch:
                done += 1
                self._run(later)  # (after one fails, the rest are not run: _run runs nothing once it is set)
        finally:
            self._gathered = None
            if done < len(batch) and self.error is None:  # a Ctrl-C inside one: those after it run at close
                self._batch = batch[done:] + self._batch
                self._batch_bytes = sum(map(_staged_bytes, self._batch))
            if gathered:  # what was handed over before a failure or a Ctrl-C crosses too
                error, self.error = self.error, None
                self._run(lambda: self._to_sink(gathered[0] if len(gathered) == 1 else Batch(gathered)))
                self.error = error if error is not None else self.error
            self.error = failed if failed is not None else self.error

    def _run(self, fn: Callable[[], Any]) -> Any:
        if self.error is not None:
            return None
        import torch

        start = time.perf_counter()
        try:
            with torch.no_grad():  # grad mode is per thread
                return fn()
        except BaseException as exc:  # disk full, path removed, writer process gone: raised on training's thread
            if self._child is not None and not isinstance(exc, Exception):
                # Ctrl-C / SIGTERM landing in a job run inline (on the training thread): training's own
                # interrupt, not a writer failure. The pipe stays whole (each write is signal-held);
                # the job's rows not yet handed over are lost with it.
                raise
            self.error = exc
            with self._cond:
                self._cond.notify_all()
        finally:
            self.busy_seconds += time.perf_counter() - start  # reported for a writer thread only

    # -- end -------------------------------------------------------------------------------------
    def close(self, final: dict[str, Any]) -> Path:
        """Write what is left, record ``final`` (completed, stop_reason, ...) and publish the log. After a
        writer error: publish what was finished, marked not completed with the cause, and raise it."""
        if self.closed:
            return self.path
        self.closed = True
        _OPEN.discard(self)
        if self._thread is not None and threading.current_thread() is self._thread:
            # Asked on the writer thread itself: an object's __del__ the garbage collector happened to run
            # here (sb3's learn() guard). The thread cannot join itself: it closes the log once the job it
            # is in returns, and the interpreter waits for that at exit.
            self._final = final
            with self._cond:
                self._jobs.append(None)
                self._cond.notify_all()
            _CLOSING.add(self._thread)
            return self.path
        try:
            interrupted: BaseException | None = None
            if self._child is not None:
                try:
                    self._send_batch()  # the batched jobs' second halves, then one held back (see submit)
                    self._settle(None)
                except BaseException as exc:  # Ctrl-C in it: the log is still published, then it is raised
                    interrupted = exc
            if self._thread is not None:
                with self._cond:
                    self._jobs.append(None)
                    self._cond.notify_all()
                self._thread.join()
            path = self._finish(final)
            if interrupted is not None:
                raise interrupted
            return path
        finally:
            self.lock.release()

    def _finish(self, final: dict[str, Any]) -> Path:
        if self.error is None and self.progress != self._sent_progress:
            self._run(lambda: self._to_sink(Progress(dict(self.progress))))
        cost = {
            **final.get("probe_cost", {}),
            "writer": self.mode,
            # with a writer process, its own (added there); the jobs run inside the hooks and callbacks,
            # so their time on the training thread is in hook_seconds and integration_seconds
            "writer_cpu_seconds": self.cpu_seconds if self._thread is not None else 0.0,
            "writer_busy_seconds": self.busy_seconds if self._thread is not None else 0.0,
            "wait_seconds": round(self.wait_seconds, 4),
        }
        final = {**final, "probe_cost": cost}
        for key in ("writer_cpu_seconds", "writer_busy_seconds"):
            cost[key] = round(cost[key], 4)
        if self.error is None:
            try:
                if self._child is not None:
                    self._child.close(final)
                else:
                    assert self.sink is not None
                    self.sink.close(final)
                return self.path
            except BaseException as exc:
                self.error = exc
        self._publish_failed(final)
        raise self._failed() from None

    def _publish_failed(self, final: dict[str, Any]) -> None:
        """Publish what was finished, marked not completed with the writer's error (best effort)."""
        final = {**final, "completed": False, "stop_reason": f"lstm-probe writer error: {self.reason()}"}
        try:
            if self._child is not None:
                self._child.fail(final)
            elif self.sink is not None:
                self.sink.fail(final)
        except BaseException:
            if self._child is not None:
                self._child.kill()
            elif self.sink is not None:
                self.sink.log.abort()


def _is_write_error(exc: BaseException | None) -> bool:
    """Whether the writer's error is the disk's or the system's (disk full, path removed)."""
    if isinstance(exc, WriterGone):
        return exc.write_error
    return isinstance(exc, OSError)


_OPEN: weakref.WeakSet[LogWriter] = weakref.WeakSet()
_CLOSING: set[threading.Thread] = set()


@atexit.register
def _wait_for_closing() -> None:
    """A log whose close was left to its writer thread is finished before the interpreter ends."""
    for thread in list(_CLOSING):
        thread.join()


class _Sized:
    __slots__ = ("job", "nbytes")

    def __init__(self, job: Callable[[], None], nbytes: int):
        self.job, self.nbytes = job, nbytes


def _staged_bytes(later: Any) -> int:
    """The host bytes a batched second half holds (its ``Staged`` copy's; 0 where it has none)."""
    staged = getattr(later, "staged", None)
    return staged.nbytes if staged is not None else 0


_IDLE: Any = object()
