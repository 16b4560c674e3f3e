"""The returns capability for TorchRL: each collector batch's ``("next", "reward")`` summed per env until
``("next", "done")``, on the rewards' device, with one host copy per batch.

Where the rewards are (torchrl/collectors/_single.py ``Collector.rollout``): each env step's TensorDict (the
carrier, after ``env.step_and_maybe_reset``, holding ``("next", "reward")`` and ``("next", "done")``) is appended
to the ``tensordicts`` list that the rollout stacks into the batch it returns. A collection call's hook (the probe's
``_sequential``) is inside that ``rollout``: the probe keeps a reference to the list (no copy; the step TensorDicts
are the collector's own, never changed after they are appended), and once the batch is whole (the next batch's
first collection call, or close) adds its steps on the device (:class:`~lstm_probe.capture.returns.DeviceSums`)
and copies the batch's ended episodes to the host at once. A collector that writes its steps straight into a
replay buffer keeps no such list: no returns then (the log's record stays empty).
"""

from __future__ import annotations

import sys
from typing import Any

from lstm_probe.capture.returns import DeviceSums, Returns

REWARD, DONE = ("next", "reward"), ("next", "done")


def _steps_list() -> list[Any] | None:
    """The ``tensordicts`` local of the collector's ``rollout`` on the stack, None where there is none."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "rollout" and frame.f_globals.get("__name__", "").startswith("torchrl.collectors"):
            found = frame.f_locals.get("tensordicts")
            return found if isinstance(found, list) else None
        frame = frame.f_back
    return None


class BatchReturns:
    """The episodes each collector batch ended (iteration: the probe's batch count)."""

    def __init__(self) -> None:
        self.returns = Returns("rewards")
        self.sums: DeviceSums | None = None
        self._steps: list[Any] | None = None  # the batch being collected: the rollout's own list
        self._iteration = -1

    def collecting(self, iteration: int) -> bool:
        """At a collection call: a new batch's list settles the last one (True: the record changed)."""
        steps = _steps_list()
        if steps is None or steps is self._steps:
            return False
        settled = self.settle()
        self._steps, self._iteration = steps, iteration
        return settled

    def settle(self) -> bool:
        """The held batch's steps summed on the device and its ended episodes copied to the host (one copy)."""
        steps, self._steps = self._steps, None
        if not steps:
            return False
        for td in steps:
            reward, done = td.get(REWARD, None), td.get(DONE, None)
            if reward is None or done is None:
                continue
            if self.sums is None:
                self.sums = DeviceSums(reward)  # the collector resets every env before its first step
            self.sums.step(reward, done)
        if self.sums is None:
            return False
        self.sums.flush(self.returns, self._iteration)
        return True
