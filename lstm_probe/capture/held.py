"""How long rows wait on the training side before they reach the writer: :class:`Held`.

The tracer keeps rows back from the writer in three places: one-step calls in blocks (``blocks.Block``: until a
block is full or the tags change), batched jobs (``CoreTracer.batch_jobs``: an update's training calls, until
the update ends) and, with a writer process, a job's second half whose device copy is under way
(``LogWriter.submit``: until the next hand-over). With a slow env (a real robot, a heavy simulator) that could be
minutes, all lost to a SIGKILL. When the oldest call of each was made is noted once: by :class:`Held` for the
blocks, by the writer for the other two (``LogWriter.held_since``, from ``submit``'s ``since``). Once one is
:data:`HOLD_SHARE` of ``part_seconds`` old, the next traced call hands it over, on the training thread
(``CoreTracer``'s hook compares its clock with one float, :attr:`CoreTracer._due`, set from the oldest of them
by :meth:`Held.due` whenever one begins or is handed over; nothing else per call). The
writer publishes a row within ``part_seconds`` of taking it (``FileLog.write_due``): a row is published within
``(1 + HOLD_SHARE) * part_seconds`` of its call, plus the wait for the next traced call once its share has
passed and the writer's time to write (docs/reliability.md). A fast run's blocks and batches go long before
their share: it hands over exactly as before, and what it hands over is the same either way (the rows do not
depend on where a block ends)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from lstm_probe.log.logwriter import LogWriter

HOLD_SHARE = 0.25
"""The most a row waits on the training side, as a share of ``part_seconds`` (then the next call hands it over)."""

NEVER = math.inf


class Held:
    """The deadline of what waits on the training side: the tracer's blocks (when the oldest began, ``blocks``;
    ``time.perf_counter()``, :data:`NEVER`: none), and the writer's batch and held-back second half (its own
    record: ``LogWriter.held_since``)."""

    __slots__ = ("blocks", "hold")

    def __init__(self, part_seconds: float):
        self.hold = part_seconds * HOLD_SHARE
        self.blocks = NEVER

    def due(self, writer: LogWriter | None) -> float:
        """When the oldest of them must be handed over."""
        return (self.blocks if writer is None else min(self.blocks, writer.held_since())) + self.hold

    def kept(self, writer: LogWriter | None) -> float:
        """A block begins (the tracer's blocks held nothing before: its time is now). Returns :meth:`due`."""
        if self.blocks == NEVER:
            self.blocks = time.perf_counter()
        return self.due(writer)

    def hand_over(self, now: float, flush: Callable[[], None], writer: LogWriter | None) -> float:
        """At a traced call at ``now`` past :meth:`due`: hand over what is old enough (``flush``: the tracer's
        blocks; then ``LogWriter.send_held``: the batch, a held-back second half whose copy is complete, one whose
        copy is not asked again at the next call: never a wait for the device). Returns the next :meth:`due`."""
        cutoff = now - self.hold
        if self.blocks <= cutoff:
            flush()  # (the batch went first, the blocks' second half may be held)
        if writer is not None and not writer.closed:
            writer.send_held(cutoff)
        return self.due(writer)
