"""The lock on a log's output: one run writes one log at a time.

A run takes the lock before training starts (:meth:`OutputLock.take`, in
:class:`~lstm_probe.log.logwriter.LogWriter`) and releases it when its log closes, on every exit path (a normal
end, an exception, Ctrl-C and SIGTERM, which reach the close as exceptions; an ``atexit`` backstop for the
rest). The lock is the kernel's advisory lock (``flock``; ``msvcrt.locking`` on Windows) on an open lock
file the run keeps open: ``run.parquet.lock`` beside a single-file log, ``DIR/.lstm-probe.lock`` inside a
dataset directory, and ``DIR/.lstm-probe-SHARD.lock`` for each shard of a multi-process log (RLlib: every
env runner and learner writes its own part files into one directory and takes its own shard's lock; the
driver takes the directory's). The kernel frees it when the last process holding it ends, however it ends
(SIGKILL, OOM kill): no pid or start-time bookkeeping decides whether a run is gone.

The file's content is only the holder's identity, for messages: the process that writes the log (``pid``),
its writer process (``writer_pid``), the host, the command and the start time. A second run on the same
output refuses in one line naming them. A lock file that no process holds is taken over; when it still
names a run (one killed before it could release its lock) the taker says so (``StaleLockWarning``). A
clean release removes the file (unlinked while still locked; a taker checks that the file it locked is
still the one at the path). A writer process that inherits the lock's descriptor (:func:`lock_fds`) keeps
the lock held after a SIGKILL of training, until it has published its last part (:func:`release_file`);
a process forked from the run does not (its copy is closed in the child). Readers (``report`` on a live
run) ask with a shared lock that they drop at once; a taker retries for :data:`GRACE_SECONDS` before it
refuses, so such a look does not make a run refuse.

``flock`` locks are per open file, not per process (unlike ``lockf``/``fcntl`` locks, which any ``close``
of the file by the process would drop): a second lock in the same process conflicts too, which is how a
second log on one output in one process is refused. On a file system that gives no locks the run goes on
unlocked with a warning (:class:`UnlockedOutputWarning`).

Torch- and pyarrow-free: the training process uses it, and so do the readers (``report`` on a live run
says who is writing it) and the writer process.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import errno
import json
import os
import socket
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lstm_probe.errors import BadInput
from lstm_probe.text import safe

if sys.platform == "win32":
    import msvcrt
else:
    import fcntl

LOCK_NAME = ".lstm-probe.lock"

GRACE_SECONDS = 0.5
"""How long a taker retries a lock it finds taken before it refuses: a reader's look holds it for
microseconds, a run for its whole life."""

_WIN_OFFSET = 1 << 30
"""Windows locks byte ranges: one byte far past the identity, so that reading the identity is never blocked."""

_MAX_READ = 1 << 16

_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation


def lock_path(out: Path, *, is_dir: bool, shard: str | None = None) -> Path:
    """Where the lock of the log at ``out`` lives (see the module docstring)."""
    if is_dir:
        return out / (f".lstm-probe-{shard}.lock" if shard else LOCK_NAME)
    return out.with_name(out.name + ".lock")


# -- the kernel's lock ----------------------------------------------------------------------------
def _try_lock(fd: int, *, shared: bool = False) -> bool:
    """Lock the open file ``fd`` without waiting: False when another open file holds it. Raises OSError
    where the file system gives no locks."""
    if sys.platform == "win32":  # no shared locks there: a reader's look is a short exclusive one
        os.lseek(fd, _WIN_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EDEADLOCK):
                return False
            raise
    else:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    return True


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        if sys.platform == "win32":
            os.lseek(fd, _WIN_OFFSET, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _drop(fd: int, *, locked: bool) -> None:
    if locked:
        _unlock(fd)
    with contextlib.suppress(OSError):
        os.close(fd)


def _file_id(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a releasing run removes it while locked)."""
    try:
        return _file_id(os.stat(path)) == _file_id(os.fstat(fd))
    except OSError:
        return False


def _read(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while len(data) < _MAX_READ:
        chunk = os.read(fd, _MAX_READ - len(data))
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace")


def _write(fd: int, doc: dict[str, Any]) -> None:
    """The identity, written over the old one (then cut to length: never an empty file in between)."""
    data = json.dumps(doc).encode()
    os.lseek(fd, 0, os.SEEK_SET)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.ftruncate(fd, len(data))


def _command() -> str:
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    if argv:
        argv[0] = os.path.basename(argv[0])
    text = " ".join(" ".join(argv).split())  # one line
    return text if len(text) <= 120 else text[:117] + "..."


# -- who holds it ---------------------------------------------------------------------------------
@dataclass
class Holder:
    """Who holds a lock: what its file says."""

    pid: int
    host: str
    started: str
    writer_pid: int | None = None
    command: str | None = None

    def describe(self) -> str:
        """Who it is, in one line: the host, start time and command come from a file anyone could have
        planted, so each is made inert (control characters as codes, cut short)."""
        if self.pid <= 0:
            return "a process that has not yet written its name into the lock"
        command = f": {_inert(self.command)}" if self.command else ""
        return f"pid {self.pid} on {_inert(self.host)} (started {_inert(self.started)}{command})"


def _inert(text: str) -> str:
    """A string read from a lock file as it may be printed: no control characters (escape sequences, newlines
    shown as codes), at most a few hundred characters."""
    return safe(text, limit=240, markup=False, word=240)


def _parse(text: str) -> Holder | None:
    try:
        doc = json.loads(text)
        writer = doc.get("writer_pid")
        return Holder(
            pid=int(doc["pid"]),
            host=str(doc["host"]),
            started=str(doc.get("started", "?")),
            writer_pid=writer if isinstance(writer, int) else None,
            command=str(doc["command"]) if doc.get("command") else None,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def holder(path: Path) -> Holder | None:
    """The holder a lock file names, held or not; None when there is no file (or it names nobody)."""
    try:
        return _parse(Path(path).read_text(errors="replace"))
    except OSError:
        return None


def _identity(fd: int) -> Holder:
    """The identity in a lock another process holds; it writes it right after it takes the lock, so an
    empty (or half-written) file is read again for a moment."""
    deadline = time.monotonic() + 1.0
    while True:
        h = _parse(_read(fd))
        if h is not None or time.monotonic() >= deadline:
            return h or Holder(pid=0, host="?", started="?")
        time.sleep(0.01)


def live_holder(path: Path) -> Holder | None:
    """The holder of the lock at ``path`` while a process holds it (this one included); None when no
    process does (no file, a file left by a killed run, a file system without locks)."""
    try:
        fd = os.open(path, os.O_RDONLY | _BINARY)
    except OSError:
        return None
    try:
        if _try_lock(fd, shared=True):
            _unlock(fd)
            return None
        return _identity(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _own(path: Path) -> OutputLock | None:
    """The lock on ``path`` this process holds, if it does."""
    try:
        lock = _HELD.get(_file_id(os.stat(path)))
    except OSError:
        return None
    return lock if lock is not None and lock.doc.get("pid") == os.getpid() else None


def refuse_if_held(path: Path, out: Path) -> None:
    """Refuse (BadInput, one line) while another run holds the lock at ``path``."""
    if _own(path) is not None:
        return
    h = live_holder(path)
    if h is not None and not (h.pid == os.getpid() and h.host == socket.gethostname()):
        raise BadInput(_refusal(out, h))


def _refusal(out: Path, h: Holder) -> str:
    return f"{out} is being written by another run ({h.describe()}); wait for it to end or choose another --out"


def _unwritable(path: Path, exc: OSError) -> BadInput:
    return BadInput(f"cannot write the lock {path}: {exc.strerror or exc}; choose another --out")


class StaleLockWarning(UserWarning):
    """A run took over the lock a killed run left on its output."""


class UnlockedOutputWarning(UserWarning):
    """The file system of the output gives no locks: the run goes on, but a second run would not be refused."""


# -- taking and releasing -------------------------------------------------------------------------
class OutputLock:
    """A lock held by this process on one log's output (see the module docstring)."""

    def __init__(self, path: Path, out: Path):
        self.path, self.out = path, out
        self.doc: dict[str, Any] = {}
        self.held = False
        self.fd: int | None = None
        """The open lock file whose kernel lock this is (while held)."""
        self.note: str | None = None
        """Set when a stale lock was taken over: what the run that left it was."""
        self._id: tuple[int, int] | None = None

    @classmethod
    def take(cls, out: Path, *, is_dir: bool, shard: str | None = None, reentrant: bool = False) -> OutputLock:
        """Take the lock of the log at ``out`` or refuse naming the run that holds it. ``reentrant``: a lock
        this process already holds is fine (the returned one is not held: releasing it does nothing)."""
        lock = cls(lock_path(out, is_dir=is_dir, shard=shard), out)
        try:
            lock.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _unwritable(lock.path, exc) from None
        if _own(lock.path) is not None:
            if reentrant:
                return lock
            raise BadInput(f"{out} is already being written by this process; choose another --out")
        lock.doc = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": _command(),
        }
        deadline = time.monotonic() + GRACE_SECONDS
        for _ in range(1000):
            try:
                fd = os.open(lock.path, os.O_RDWR | os.O_CREAT | _BINARY, 0o644)
            except OSError as exc:
                raise _unwritable(lock.path, exc) from None
            try:
                got = _try_lock(fd)
            except OSError as exc:
                os.close(fd)
                lock._unlocked(exc)
                return lock
            if got and _same_file(fd, lock.path):
                lock._hold(fd)
                return lock
            if not got and time.monotonic() >= deadline:
                try:
                    h = _identity(fd)
                finally:
                    os.close(fd)
                raise BadInput(_refusal(out, h))
            _drop(fd, locked=got)  # a file a releasing run just removed, or a reader's look: again
            if not got:
                time.sleep(0.005)
        raise BadInput(f"cannot take the lock {lock.path}: other runs keep taking it; choose another --out")

    def _hold(self, fd: int) -> None:
        old = _read(fd).strip()
        if old:  # a run that could not release it: killed, or its machine went down
            h = _parse(old)
            self.note = f"took over the stale lock {self.path} of a run that is gone" + (
                f" ({h.describe()})" if h is not None else " (a lock file this version did not write)"
            )
        self.doc["fd"] = fd  # for a writer process that inherits it (release_file)
        _write(fd, self.doc)
        self.fd, self.held, self._id = fd, True, _file_id(os.fstat(fd))
        _HELD[self._id] = self

    def _unlocked(self, exc: OSError) -> None:
        warnings.warn(
            f"cannot lock {self.path} ({exc.strerror or exc}): the file system gives no locks, so a second run "
            f"on {self.out} would not be refused",
            UnlockedOutputWarning,
            stacklevel=4,
        )

    def set_writer(self, pid: int) -> None:
        """Name the writer process too (an inherited descriptor keeps it holding the lock: lock_fds)."""
        if not self.held or self.fd is None:
            return
        self.doc["writer_pid"] = pid
        with contextlib.suppress(OSError):
            _write(self.fd, self.doc)

    def release(self) -> None:
        """Remove the lock file and free the lock (idempotent). It frees a writer process's inherited
        copy too: the lock belongs to the open file, which they share."""
        if not self.held or self.fd is None:
            return
        fd, self.fd, self.held = self.fd, None, False
        if self._id is not None and _HELD.get(self._id) is self:
            del _HELD[self._id]
        if sys.platform == "win32":  # an open file cannot be removed there: unlock, close, then remove
            _drop(fd, locked=True)
            with contextlib.suppress(OSError):  # fails while another process has it open: theirs then
                self.path.unlink()
            return
        if _same_file(fd, self.path):  # removed while still held: a taker never locks a removed file
            with contextlib.suppress(OSError):
                self.path.unlink()
        _drop(fd, locked=True)


def lock_fds(path: Path | None) -> tuple[int, ...]:
    """The descriptor a writer process should inherit (``subprocess.Popen(pass_fds=...)``) for the lock file
    at ``path`` (the lock of the log its WriterConfig names), so that the lock stays held while it publishes
    after a SIGKILL of training; () when this process holds no such lock (or ``path`` is None), or on Windows."""
    if path is None or sys.platform == "win32":
        return ()
    lock = _own(Path(path))
    return (lock.fd,) if lock is not None and lock.fd is not None else ()


def release_file(path: Path, pid: int, *, wait: float = 10.0) -> None:
    """Remove the lock file at ``path`` if it names ``pid`` and no other run holds it: the writer process
    calls this when it outlives training, once it has published its rows. Holding the lock through an
    inherited descriptor (:func:`lock_fds`), it removes the file and frees the lock.

    A process's pipes may close before the kernel frees its lock (both happen as it exits, in no set
    order): while the file still names ``pid`` and another open file holds the lock, it asks again for up
    to ``wait`` seconds."""
    try:
        fd = os.open(path, os.O_RDWR | _BINARY)
    except OSError:
        return
    deadline = time.monotonic() + wait
    got = False
    try:
        while True:
            h = _parse(_read(fd))
            if h is None or h.pid != pid or h.host != socket.gethostname():
                return  # another run's now (or nobody's)
            try:
                got = _try_lock(fd)
            except OSError:
                return
            if got:  # nobody holds it (training is gone, no descriptor inherited): still the file at path?
                if _same_file(fd, path) and _parse(_read(fd)) == h:
                    with contextlib.suppress(OSError):
                        path.unlink()
                return
            inherited = _inherited(fd, path)
            if inherited is not None:  # this process holds it with the run's own open file
                with contextlib.suppress(OSError):
                    path.unlink()
                _unlock(inherited)
                return
            if time.monotonic() >= deadline:
                return
            time.sleep(0.01)
    finally:
        _drop(fd, locked=got)


def _inherited(fd: int, path: Path) -> int | None:
    """The descriptor of ``path`` this process inherited from the run (the number its identity names)."""
    try:
        doc = json.loads(_read(fd))
        theirs = int(doc["fd"])
        return theirs if theirs != fd and _file_id(os.fstat(theirs)) == _file_id(os.fstat(fd)) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


_HELD: dict[tuple[int, int], OutputLock] = {}


@atexit.register
def _release_all() -> None:  # the backstop: a log never closed still frees its output
    for lock in list(_HELD.values()):
        lock.release()


def _forget_in_child() -> None:
    """A forked child does not hold its parent's locks: it closes its copies (so it never keeps the
    output locked after the run dies, and its exit never frees the run's lock)."""
    for lock in _HELD.values():
        if lock.fd is not None:
            with contextlib.suppress(OSError):
                os.close(lock.fd)
        lock.fd, lock.held = None, False
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
