"""Row groups written on a thread of their own, so that Parquet's encoding and compression of one row group
(pyarrow's ``write_table``, which releases the interpreter lock) overlaps the making of the next one's rows.

:class:`Behind` owns the :class:`~lstm_probe.log.writer.PartWriter` while row groups are on their way: the
writer (``writer.FileLog``) hands it each encoded row group with :meth:`Behind.write` (at most
:data:`IN_FLIGHT` wait, then it waits for room) and calls the part writer itself only through
:meth:`Behind.sync`, which waits until every handed row group is written and re-raises a failure of the
thread. The rows' buffers go back to the writer once their row group is written (``done``). Measured on a
wide run's writer (rsl_rl, 1,024 envs, LSTM 256): ``write_table`` is ~45% of its CPU; the rest is Python.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar


class Parts(Protocol):
    """What :class:`Behind` writes through (``writer.PartWriter``)."""

    def write(self, batch: Any, meta: dict[str, Any]) -> None: ...


P = TypeVar("P", bound=Parts)

IN_FLIGHT = 1
"""Row groups handed over and not yet taken by the thread (besides the one it writes): their buffers are held."""


class Behind(Generic[P]):
    """The part writer, behind a thread that writes row groups in the order they are handed over."""

    def __init__(self, parts: P):
        self._parts = parts
        self._queue: queue.Queue[tuple[Any, dict[str, Any], Callable[[], None]] | None] = queue.Queue(IN_FLIGHT)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def write(self, batch: Any, meta: dict[str, Any], done: Callable[[], None]) -> None:
        """Write ``batch`` as the next row group (``meta``: the part's metadata, as ``PartWriter.write``
        takes it), then call ``done`` (also when the write fails). Raises the thread's earlier failure."""
        self._raise()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lstm-probe-parquet", daemon=True)
            self._thread.start()
        self._queue.put((batch, meta, done))

    def sync(self, check: bool = True) -> P:
        """Wait until every handed row group is written; the part writer, for the caller's own calls.
        ``check``: re-raise the thread's failure (else the caller is already failing)."""
        if self._thread is not None:
            self._queue.join()
        if check:
            self._raise()
        return self._parts

    def stop(self) -> None:
        """Wait for the written row groups, then end the thread (a later :meth:`write` starts another)."""
        if self._thread is not None:
            self._queue.join()
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                batch, meta, done = item
                try:
                    if self._error is None:  # after a failure, nothing more is written
                        self._parts.write(batch, meta)
                except BaseException as exc:  # handed to the writer's thread: its next call raises it
                    self._error = exc
                finally:
                    done()
            finally:
                self._queue.task_done()


__all__ = ["IN_FLIGHT", "Behind", "Parts"]
