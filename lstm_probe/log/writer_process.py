"""The writer process: the pipe protocol between the training process and the process that writes its
log, and that process's loop.

The training process starts it with ``python -m lstm_probe.log.writer_process`` (:meth:`Child.start`) and
speaks to it through :class:`Child`: each message is a count, the sizes, a pickle (protocol 5) and the
pickle's out-of-band buffers (the state arrays, written into the pipe from their own memory) on its
stdin; its replies (closed, error) are length-prefixed pickles on its stdout. The process (:func:`serve`)
builds one :class:`~lstm_probe.log.sink.Sink` from the ``open`` message (the log's
:class:`~lstm_probe.options.WriterConfig`) and calls the sink's method each
message names, until ``close`` or the end of the pipe (the training process died: the rows it handed
over are published as a part of the crash journal). It never imports torch or pandas.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from lstm_probe.errors import BadInput, OutputError, one_line
from lstm_probe.log.lock import lock_fds, lock_path, release_file
from lstm_probe.log.messages import Batch, Message
from lstm_probe.log.sink import Sink
from lstm_probe.options import WriterConfig

_HEADER = struct.Struct("<Q")


def _lock(config: WriterConfig) -> Path:
    """The lock file of the log ``config`` writes (``lock.py``)."""
    return lock_path(Path(config.out), is_dir=config.directory, shard=config.shard)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM (the ones the training process turns into exceptions) for a few lines;
    they arrive right after."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


_IOV_MAX = 512  # buffers per writev (POSIX guarantees 16, Linux takes 1024)
IN_BAND_BYTES = 64 << 10
"""Arrays smaller than this cross inside a message's pickle; larger ones as buffers of their own (one copy)."""


class WriterGone(RuntimeError):
    """The writer process ended before the log was closed; the message says why (its own error when it
    reported one). ``write_error``: the error was the disk's or the system's (an OSError)."""

    def __init__(self, message: str, write_error: bool = False):
        super().__init__(message)
        self.write_error = write_error


FIX = (
    "the writer process (python -m lstm_probe.log.writer_process) must import lstm_probe and pyarrow like the "
    "training process: install lstm-probe into this environment, or pass writer='thread' (--writer thread)"
)
"""The fix named when the writer process cannot start."""

STDERR_LINES = 20
"""Lines of the writer process's stderr kept (in a temp file) to explain a failed start."""


WRITER_ENV: dict[str, str | None] = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "ARROW_DEFAULT_MEMORY_POOL": "system",
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_THRESHOLD_": "1048576",
    "NUMPY_MADVISE_HUGEPAGE": "0",
}
"""The writer process's environment on top of the training process's (see :meth:`Child.start`)."""


class Child:
    """The training side of a writer process: messages are length-prefixed pickles on its stdin, its
    replies (ready, closed, error) come back on its stdout."""

    def __init__(self, proc: subprocess.Popen[bytes], stderr: Any = None):
        self.proc = proc
        self.stderr = stderr  # a temp file: what the process printed (a traceback when it failed to start)
        assert proc.stdin is not None and proc.stdout is not None
        self.stdout = proc.stdout
        self.fd = proc.stdin.fileno()
        os.set_blocking(self.fd, False)
        with contextlib.suppress(ImportError, AttributeError, OSError):  # Linux: a 1 MB pipe (default 64 kB)
            import fcntl

            fcntl.fcntl(self.fd, fcntl.F_SETPIPE_SZ, 1 << 20)
        self.backlog: deque[memoryview] = deque()
        self.backlog_bytes = 0

    @classmethod
    def start(cls, config: WriterConfig) -> Child:
        # One core's worth of threads, and allocators that give memory back: the system allocator for
        # Arrow (its default mimalloc pool kept ~17 MB more), one glibc arena, and a fixed mmap threshold
        # (glibc raises it after large frees, and then row-group-sized buffers fragment its heap: measured,
        # +10 MB per GB written without it, flat with it). 1 MB, not 64 kB: below it every Arrow page buffer
        # was mapped anew with its page faults; 1 MB cut the writer's CPU per row by ~28% for ~8 MB more
        # private memory (benchmarks/writer_profile.py pipe, docs/performance-history.md "Writer CPU").
        # No huge pages for numpy's arrays: numpy advises them for every array of 4 MB or more, and each first
        # touch then zeroes 2 MB; a wide log's kept vectors are laid out in a mostly untouched array of a row
        # group's rows (``kept.laid_out``), written and freed at once (1,024 envs: 0.59 -> 0.52 us a row of
        # writer CPU, medians of 8 interleaved runs; docs/performance.md "The writer at width").
        env = {k: v for k, v in {**os.environ, **WRITER_ENV}.items() if v is not None}  # None: unset
        # The same lstm_probe as this process's, also when it was found through a sys.path edit
        # (a checkout next to a script) rather than installed.
        package_parent = str(Path(__file__).resolve().parent.parent)
        if package_parent not in _site_dirs():
            env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), package_parent) if p)
        # It reports its errors as answers, which the training process words; its stderr (a traceback if it
        # cannot even start) goes to a temp file whose last lines explain an unexpected end.
        stderr = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lstm_probe.log.writer_process"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
                # the output's lock, so that it stays held while this process publishes a killed run's rows
                pass_fds=lock_fds(_lock(config) if config.pid is not None else None),
            )
        except OSError as exc:
            stderr.close()
            raise OutputError(
                f"cannot start the writer process ({exc}); pass writer='thread' (--writer thread) to write "
                "from a thread of the training process"
            ) from None
        child = cls(proc, stderr)
        # No wait for an answer: the process opens the log while training starts (its imports take a
        # second). An error there (rare: the location was checked above) surfaces at the next hand-over.
        try:
            child.send(("open", (config,)), 0)
        except WriterGone as exc:
            raise OutputError(f"cannot start the writer process: {exc}") from None
        return child

    def send(self, message: Message | Batch | tuple[str, tuple[Any, ...]], budget: int) -> float:
        """Write ``message`` into the pipe as far as it takes it without waiting; what does not fit waits
        in a backlog, written first by the next send. Waits only while the backlog holds more than
        ``budget`` bytes (the writer process is behind): returns the seconds waited."""
        # Pickle protocol 5 with out-of-band buffers: the state arrays go into the pipe straight from
        # their own memory (one copy, into the pipe), not through the pickle's bytes (two).
        # Small arrays (a grid's columns, a block's call ids) go inside the pickle: a piece of its own costs the
        # writer a read and an unpickling step each, more than the copy.
        raws: list[memoryview] = []

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            raw = buffer.raw()
            if raw.nbytes < IN_BAND_BYTES:
                return True  # in band
            raws.append(raw)
            return False

        data = pickle.dumps(message, protocol=5, buffer_callback=out_of_band)
        sizes = [len(data)] + [r.nbytes for r in raws]
        frame = [memoryview(struct.pack(f"<Q{len(sizes)}Q", len(sizes), *sizes)), memoryview(data), *raws]
        return self.pump(budget, frame)

    def pump(self, budget: int, frame: Sequence[memoryview] = ()) -> float:
        """Add ``frame`` to the backlog and write the backlog into the pipe (one ``writev`` per try); wait
        for room while it holds more than ``budget`` bytes."""
        waited = 0.0
        added = len(frame)
        while True:
            # A write and its bookkeeping happen together: a Ctrl-C/SIGTERM handler raising in between
            # would leave bytes written but still in the backlog, and the stream corrupt for close().
            with _signals_held():
                if frame:
                    self.backlog.extend(frame)
                    self.backlog_bytes += sum(f.nbytes for f in frame)
                    frame = ()
                if not self.backlog:
                    break
                try:
                    n = os.writev(self.fd, list(itertools.islice(self.backlog, _IOV_MAX)))
                except BlockingIOError:
                    n = 0
                except OSError:  # a broken pipe: the process ended; say why if it told
                    raise self.gone() from None
                self.backlog_bytes -= n
                while n:
                    head = self.backlog[0]
                    if n >= head.nbytes:
                        self.backlog.popleft()
                        n -= head.nbytes
                    else:
                        self.backlog[0] = head[n:]
                        n = 0
                if not self.backlog:
                    break
                done = self.backlog_bytes <= budget  # the rest can wait for the next send
                if done and added:
                    # What the pipe did not take yet must not alias the caller's memory: raw buffers are
                    # views of host arrays that can be views of live tensors (a layer's weights, which the
                    # next optimizer step changes in place; an input buffer the framework reuses). Copied
                    # now, they keep this moment's values. Older frames' leftovers were copied by their
                    # own send (the backlog is first in, first out: what is left of this frame is its end).
                    for i in range(max(0, len(self.backlog) - added), len(self.backlog)):
                        self.backlog[i] = memoryview(bytes(self.backlog[i]))
            if done:
                break
            start = time.monotonic()  # the pipe is full (waiting here stays interruptible)
            select.select([], [self.fd], [])
            waited += time.monotonic() - start
        return waited

    def reply(self) -> tuple[Any, ...]:
        """The process's answer: ("closed",) or ("error", message, write_error)."""
        head = self.stdout.read(_HEADER.size)
        if len(head) < _HEADER.size:
            code = self.proc.wait()
            message = f"the writer process ended unexpectedly (exit code {code})"
            last = self.last_error()
            if last:
                message += f": {last}; {FIX}"
            return ("error", message, False)
        reply: tuple[Any, ...] = pickle.loads(self.stdout.read(_HEADER.unpack(head)[0]))
        return reply

    def last_error(self) -> str:
        """The last line the process wrote to its stderr that names an error ("" if none)."""
        if self.stderr is None:
            return ""
        try:
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - 8192))
            lines = self.stderr.read().decode(errors="replace").splitlines()[-STDERR_LINES:]
        except (OSError, ValueError):
            return ""
        lines = [line.strip() for line in lines if line.strip()]
        errors = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line)]
        return (errors or lines or [""])[-1]

    def gone(self) -> WriterGone:
        """The error for a process that ended: its own reply when it sent one."""
        reply = self.reply()
        return WriterGone(str(reply[1]), bool(reply[2]) if len(reply) > 2 else False)

    def close(self, final: dict[str, Any], method: str = "close") -> None:
        """Close the log (``method`` "fail": publish what was finished, marked failed) and wait for the
        process to end."""
        self.send((method, (final,)), 0)
        reply = self.reply()
        self.proc.wait()
        self._release()
        if reply[0] != "closed":
            raise WriterGone(str(reply[1]), bool(reply[2]) if len(reply) > 2 else False)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()
        self._release()

    def _release(self) -> None:
        """Close the pipes and the stderr file of a process that ended (left open, each is a ResourceWarning
        in the user's process when it is collected)."""
        for f in (self.proc.stdin, self.proc.stdout, self.stderr):
            with contextlib.suppress(OSError, ValueError):
                if f is not None:
                    f.close()

    def fail(self, final: dict[str, Any]) -> None:
        """The training side failed (a job raised): have the process publish what it has, marked failed.
        A process that already ended (it failed itself) published on its own."""
        if self.proc.poll() is not None:
            self._release()
            return
        try:
            self.close(final, "fail")
        except WriterGone:
            self.kill()


def _site_dirs() -> set[str]:
    """Directories every Python of this environment finds packages in."""
    import site

    dirs = set(site.getsitepackages())
    with contextlib.suppress(AttributeError):
        dirs.add(site.getusersitepackages())
    return {str(Path(d).resolve()) for d in dirs}


class _NoPandas:
    """Import finder that makes pandas unimportable in the writer process. pyarrow imports pandas on its
    first array conversion (to check for a Series) when pandas is installed; the writer never hands pandas
    objects to pyarrow, and the import cost it ~44 MB of private memory (measured with
    ``/proc/self/smaps_rollup``: 114 MB -> 70 MB for pyarrow alone after one conversion and one write)."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r} (kept out of the lstm-probe writer)", name=name)
        return None


class _Frames:
    """Reads messages (see :meth:`Child.send`) from a non-blocking pipe as its bytes arrive, never waiting
    for a frame's end: the training process may hold a frame's tail in its backlog until its next send,
    and meanwhile the writer must keep publishing rows as they come due (``FileLog.write_due``)."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)
        self.ended = False
        self._start()

    def _start(self) -> None:
        self.stage = 0  # 0: the count; 1: the sizes; 2: the pickle and its buffers
        self.want = [_HEADER.size]
        self.parts: list[bytearray] = [bytearray(_HEADER.size)]
        self.got = 0

    def read(self) -> tuple[Any, ...] | None:
        """What the pipe holds now, read into the frame being assembled; a whole message once it is
        complete, else None (``ended`` set at the pipe's end)."""
        while True:
            k = len(self.parts) - 1
            buf = self.parts[k]
            if self.got < len(buf):
                try:
                    n = os.readv(self.fd, [memoryview(buf)[self.got :]])
                except BlockingIOError:
                    return None
                if not n:
                    self.ended = True
                    return None
                self.got += n
                if self.got < len(buf):
                    return None
            message = self._advance()
            if message is not None:
                return message

    def _advance(self) -> tuple[Any, ...] | None:
        """The current piece is complete: start the next one, or return the finished message."""
        if self.stage == 0:
            count = _HEADER.unpack(self.parts[0])[0]
            self.stage, self.parts, self.got = 1, [bytearray(8 * count)], 0
            return None
        if self.stage == 1:
            raw = self.parts[0]
            self.sizes = list(struct.unpack(f"<{len(raw) // 8}Q", raw))
            self.stage, self.parts, self.got = 2, [bytearray(self.sizes[0])], 0
        elif len(self.parts) < len(self.sizes):
            # writable buffers: arrays unpickled onto them stay writable
            self.parts.append(bytearray(self.sizes[len(self.parts)]))
            self.got = 0
        if len(self.parts) == len(self.sizes) and self.got == len(self.parts[-1]):
            parts = self.parts
            self._start()
            message: tuple[Any, ...] = pickle.loads(parts[0], buffers=parts[1:])  # type: ignore[arg-type]
            return message
        return None


def serve() -> int:
    """The writer process: one sink, driven by the messages on stdin, until ``close`` or the pipe ends."""
    if "pandas" not in sys.modules:
        sys.meta_path.insert(0, _NoPandas)  # type: ignore[arg-type]
    # Replies go to the real stdout; anything else that prints goes to stderr.
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # A terminal's Ctrl-C reaches the whole process group; the training process decides when the log
    # ends (its close, or its death: the pipe closes).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    # Normal priority, on purpose: at the lowest (nice 19) a writer on a machine whose cores were all busy
    # got ~1.5% of a core, fell behind, and training waited for it: 222 s against 41 s at normal priority
    # (2048 steps at full capture beside two busy processes on two cores; 133 s of it waiting).
    inp = sys.stdin.buffer.fileno()
    frames = _Frames(inp)
    sink: Sink | None = None
    config: WriterConfig | None = None
    busy = 0.0
    cpu0 = time.process_time()
    memory = _Memory()

    def answer(*reply: Any) -> None:
        data = pickle.dumps(reply)
        os.write(reply_fd, _HEADER.pack(len(data)) + data)

    def failed(exc: BaseException) -> int:
        """Publish what was finished, marked failed with the cause; tell the training process; end."""
        if sink is not None:
            with contextlib.suppress(Exception):
                sink.fail({"stop_reason": f"lstm-probe writer error: {_one_line(exc)}"})
        message = _one_line(exc)
        if isinstance(exc, ImportError):
            message += f"; {FIX}"
        answer("error", message, isinstance(exc, OSError))
        os._exit(1)  # no destructors: a half-written Parquet file would complain on stderr

    while True:
        timeout = None  # nothing unpublished: wait for input alone
        if sink is not None and (due := sink.log.due_at()) != math.inf:
            timeout = max(0.0, due - time.monotonic())  # wake when the oldest unpublished row is due, idle or not
        ready, _, _ = select.select([inp], [], [], timeout)
        message = frames.read() if ready else None
        if message is None:
            if frames.ended:  # the training process is gone: keep what it handed over
                if sink is not None:
                    with contextlib.suppress(Exception):
                        sink.log.abandon()
                if config is not None and config.pid is not None:
                    release_file(_lock(config), config.pid)
                return 0
            if sink is not None:
                try:
                    sink.write_due()
                except Exception as exc:
                    return failed(exc)
            continue
        start = time.perf_counter()
        if not isinstance(message, tuple):  # data: a declared message (messages.py)
            try:
                assert sink is not None
                # behind: the next message is here already (the encoding threads take the row groups)
                parts = sink.log.parts
                parts.behind = parts.always or bool(select.select([inp], [], [], 0)[0])
                sink.take(message)
                sink.write_due()  # also while messages keep coming: the loop may never time out then
                memory.sample_now_and_then()
            except Exception as exc:
                return failed(exc)
            busy += time.perf_counter() - start
            continue
        method, args = message  # control: open, close, fail
        try:
            if method == "open":
                config = args[0]
                assert isinstance(config, WriterConfig)
                sink = Sink(config)
                cpu0 = time.process_time()
                continue
            assert sink is not None
            if method in ("close", "fail"):
                final = args[0]
                cost = final["probe_cost"]
                busy += time.perf_counter() - start
                cost["writer_busy_seconds"] = round(cost["writer_busy_seconds"] + busy, 4)
                cost["writer_cpu_seconds"] = round(cost["writer_cpu_seconds"] + time.process_time() - cpu0, 4)
                memory.sample()
                cost.update(memory.cost())
                getattr(sink, method)(final)
                answer("closed")
                return 0
            raise ValueError(f"the writer process takes open, close or fail, not {method!r}")
        except Exception as exc:
            return failed(exc)
        busy += time.perf_counter() - start


class _Memory:
    """The writer process's peak memory, for ``probe_cost`` (Linux): its peak RSS (VmHWM, counting the
    shared libraries it maps like every process that loads them) and its peak private memory (sampled at
    most once a second: what it adds to the machine, libraries shared with training excluded)."""

    def __init__(self) -> None:
        self.private_kb = 0
        self.last = 0.0

    def sample_now_and_then(self) -> None:
        if time.monotonic() - self.last >= 1.0:
            self.sample()

    def sample(self) -> None:
        self.last = time.monotonic()
        with contextlib.suppress(OSError, ValueError):
            with open("/proc/self/smaps_rollup") as f:
                kb = sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean", "Private_Dirty")))
            self.private_kb = max(self.private_kb, kb)

    def cost(self) -> dict[str, float]:
        out: dict[str, float] = {}
        with contextlib.suppress(OSError, ValueError, StopIteration):
            with open("/proc/self/status") as f:
                out["writer_peak_rss_mb"] = round(next(int(s.split()[1]) for s in f if s.startswith("VmHWM")) / 1024, 1)
        if self.private_kb:
            out["writer_peak_private_mb"] = round(self.private_kb / 1024, 1)
        return out


def _one_line(exc: BaseException) -> str:
    """An error of the writer process as the training process words it (an OSError or a bad input as its
    message, anything else with its type)."""
    return one_line(exc, kind=not isinstance(exc, OSError | BadInput))


def _profiled() -> int:
    """``serve`` under cProfile, its stats written to ``$LSTM_PROBE_WRITER_PROFILE`` on a normal end (a
    development aid, beside ``benchmarks/writer_profile.py``)."""
    import cProfile

    profile = cProfile.Profile()
    code = profile.runcall(serve)
    profile.dump_stats(os.environ["LSTM_PROBE_WRITER_PROFILE"])
    return code


if __name__ == "__main__":
    sys.exit(_profiled() if os.environ.get("LSTM_PROBE_WRITER_PROFILE") else serve())
