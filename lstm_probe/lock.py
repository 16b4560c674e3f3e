"""The lock on a log's output: one run writes one log at a time.

A run takes the lock before training starts (:meth:`OutputLock.take`, in
:class:`~lstm_probe.logwriter.LogWriter`) and releases it when its log closes, on every exit path (a normal
end, an exception, Ctrl-C and SIGTERM, which reach the close as exceptions; an ``atexit`` backstop for the
rest). The lock is a small JSON file made with an atomic hard link (it exists whole or not at all):
``run.parquet.lock`` beside a single-file log, ``DIR/.lstm-probe.lock`` inside a dataset directory, and
``DIR/.lstm-probe-SHARD.lock`` for each shard of a multi-process log (RLlib: every env runner and learner
writes its own part files into one directory and takes its own shard's lock; the driver takes the
directory's). It names the process that writes the log (``pid``), its writer process (``writer_pid``),
the host and the start time. A second run on the same output refuses in one line naming them; a lock
whose processes are all gone (SIGKILL, power cut) is taken over with a note. SIGKILL of training leaves
the writer process publishing its last part: the lock stays held until it is done.

Torch- and pyarrow-free: the training process uses it, and so do the readers (``report`` on a live run
says who is writing it).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lstm_probe.errors import BadInput

LOCK_NAME = ".lstm-probe.lock"


def lock_path(out: Path, *, is_dir: bool, shard: str | None = None) -> Path:
    """Where the lock of the log at ``out`` lives (see the module docstring)."""
    if is_dir:
        return out / (f".lstm-probe-{shard}.lock" if shard else LOCK_NAME)
    return out.with_name(out.name + ".lock")


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid from the owner."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:  # the fields after the command name, which may hold spaces and parentheses
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def _alive(pid: Any, ticks: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    except OSError:
        return False
    now = _start_ticks(pid)
    return ticks is None or now is None or now == ticks


@dataclass
class Holder:
    """Who holds a lock: what its file says."""

    pid: int
    host: str
    started: str
    writer_pid: int | None = None
    ticks: int | None = None
    writer_ticks: int | None = None

    def alive(self) -> bool:
        """Whether a process of the run still runs (unknowable on another host: assumed so)."""
        if self.host != socket.gethostname():
            return True
        if _alive(self.pid, self.ticks):
            return True
        return self.writer_pid is not None and _alive(self.writer_pid, self.writer_ticks)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} (started {self.started})"


def holder(path: Path) -> Holder | None:
    """The holder a lock file names; None when there is no lock (or it is unreadable)."""
    try:
        doc = json.loads(path.read_text())
        return Holder(
            pid=int(doc["pid"]),
            host=str(doc["host"]),
            started=str(doc.get("started", "?")),
            writer_pid=doc.get("writer_pid"),
            ticks=doc.get("ticks"),
            writer_ticks=doc.get("writer_ticks"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def live_holder(path: Path) -> Holder | None:
    """The holder of a lock whose run is still going; None when unlocked or stale."""
    h = holder(path)
    return h if h is not None and h.alive() else None


def refuse_if_held(path: Path, out: Path) -> None:
    """Refuse (BadInput, one line) while another live run holds the lock at ``path``."""
    h = live_holder(path)
    if h is not None and not (h.pid == os.getpid() and h.host == socket.gethostname()):
        raise BadInput(
            f"{out} is being written by another run ({h.describe()}); wait for it to end or choose another "
            f"--out (if that run is gone, delete {path})"
        )


class OutputLock:
    """A lock held by this process on one log's output (see the module docstring)."""

    def __init__(self, path: Path, out: Path):
        self.path, self.out = path, out
        self.doc: dict[str, Any] = {}
        self.held = False
        self.note: str | None = None
        """Set when a stale lock was taken over: what the run that left it was."""

    @classmethod
    def take(cls, out: Path, *, is_dir: bool, shard: str | None = None, reentrant: bool = False) -> OutputLock:
        """Take the lock of the log at ``out`` or refuse naming the run that holds it. ``reentrant``: a lock
        this process already holds is fine (the returned one is not held: releasing it does nothing)."""
        lock = cls(lock_path(out, is_dir=is_dir, shard=shard), out)
        lock.path.parent.mkdir(parents=True, exist_ok=True)
        lock.doc = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "ticks": _start_ticks(os.getpid()),
        }
        for _ in range(3):
            if lock._link():
                lock.held = True
                _HELD.add(lock)
                return lock
            h = holder(lock.path)
            if h is not None and h.alive():
                refuse_if_held(lock.path, out)
                if reentrant:
                    return lock
                # our own pid: a second log on the same output in this process
                raise BadInput(f"{out} is already being written by this process; choose another --out")
            lock.note = f"took over the stale lock {lock.path} of a run that is gone" + (
                f" ({h.describe()})" if h is not None else ""
            )
            with contextlib.suppress(FileNotFoundError):
                lock.path.unlink()
        raise BadInput(f"cannot take the lock {lock.path}: other runs keep taking it; choose another --out")

    def _link(self) -> bool:
        """Make the lock file whole in one step: written under a private name, then hard-linked."""
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.doc))
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def set_writer(self, pid: int) -> None:
        """Name the writer process too: the lock stays held while it publishes after training died."""
        if not self.held:
            return
        self.doc.update(writer_pid=pid, writer_ticks=_start_ticks(pid))
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(self.doc))
            os.replace(tmp, self.path)

    def release(self) -> None:
        """Remove the lock if it is still ours (idempotent)."""
        if not self.held:
            return
        self.held = False
        _HELD.discard(self)
        release_file(self.path, int(self.doc["pid"]))


def release_file(path: Path, pid: int) -> None:
    """Remove the lock file at ``path`` if it names ``pid`` (the writer process uses this when it outlives
    training)."""
    h = holder(path)
    if h is not None and h.pid == pid and h.host == socket.gethostname():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


_HELD: set[OutputLock] = set()


@atexit.register
def _release_all() -> None:  # the backstop: a log never closed still frees its output
    for lock in list(_HELD):
        lock.release()


class StaleLockWarning(UserWarning):
    """A run took over the lock a killed run left on its output."""
