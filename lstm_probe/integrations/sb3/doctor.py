"""The doctor's sb3 part inside learn(): training time per sb3-contrib path (``watch`` is in watch.py).

- :class:`PathClock`: ``common/recurrent/policies.py:RecurrentActorCriticPolicy._process_sequence`` runs a
  minibatch as one call over its padded sequences, or, when the minibatch holds a single episode start,
  as one call per step (the slow path of sb3-contrib issue #113). ``ProbeCallback`` hands the clock each
  minibatch's path from its ``_get_samples`` wrapper; the wall time from one minibatch's
  ``_get_samples`` to the next (or to the end of ``train()``, i.e. the next rollout's start) is that
  minibatch's, so the log's ``minibatch_paths`` metadata says what share of training the slow path took.
"""

from __future__ import annotations

import time
from typing import Any

PATHS = ("sequence", "stepwise")


class PathClock:
    """Minibatches and training wall seconds per ``_process_sequence`` path (see the module docstring)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PATHS, 0.0)
        self.minibatches = dict.fromkeys(PATHS, 0)
        self._open: tuple[str, float] | None = None

    def sample(self, path: str | None) -> None:
        """A minibatch of ``path`` starts now (the previous one ends)."""
        now = time.perf_counter()
        self.stop(now)
        if path in self.seconds:
            assert path is not None
            self.minibatches[path] += 1
            self._open = (path, now)

    def stop(self, now: float | None = None) -> None:
        """Training stopped (a rollout starts, learn() ends): the open minibatch ends."""
        if self._open is not None:
            path, start = self._open
            self.seconds[path] += (time.perf_counter() if now is None else now) - start
            self._open = None

    def metadata(self) -> dict[str, Any]:
        """The log's ``minibatch_paths``: {path: {minibatches, seconds}}."""
        self.stop()
        return {p: {"minibatches": self.minibatches[p], "seconds": round(self.seconds[p], 4)} for p in PATHS}
