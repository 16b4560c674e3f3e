"""The returns capability for TorchRL: each collector batch's ``("next", "reward")`` summed per env until
``("next", "done")``, on the rewards' device, with one host copy per batch.

Where the rewards are (torchrl/collectors/_single.py ``Collector.rollout``): each env step's TensorDict (the
carrier, after ``env.step_and_maybe_reset``, holding ``("next", "reward")`` and ``("next", "done")``) is appended
to the ``tensordicts`` list that the rollout stacks into the batch it returns. A collection call's hook (the probe's
``_sequential``) is inside that ``rollout``: the probe keeps a reference to the list (no copy; the step TensorDicts
are the collector's own, never changed after they are appended), and once the batch is whole (the next batch's
first collection call, or close) adds its steps on the device (:class:`~lstm_probe.capture.returns.DeviceSums`)
and copies the batch's ended episodes to the host at once. A collector given a ``replay_buffer`` extends it with
that batch (``extend_buffer=True``, the default: the list is there as above).

Where there is no such list, the probe says why instead (:attr:`BatchReturns.why`: the capability is then not
declared, and the log's ``not_measurable`` says it):

- ``replay_buffer=`` with ``extend_buffer=False``: ``rollout`` adds each step to the buffer itself
  (``self.replay_buffer.add(carrier_for_out)``) and its ``tensordicts`` list stays empty;
- a multi-process collector (torchrl/collectors/_multi_base.py ``MultiCollector``: ``MultiSyncCollector``,
  ``MultiAsyncCollector``) runs ``rollout`` in its worker processes, on their copies of the policy: the probe's
  process sees no collection call at all (its batches reach the loss, their rewards collected elsewhere).
"""

from __future__ import annotations

import sys
from typing import Any

from lstm_probe.capture.returns import DeviceSums, Returns

REWARD, DONE = ("next", "reward"), ("next", "done")


STEPWISE = (
    "the collector adds each step to its replay buffer itself (replay_buffer= with extend_buffer=False): no batch "
    "of its steps holds the rewards"
)
ELSEWHERE = (
    "no collection call ran in the probe's process: a multi-process collector (MultiSyncCollector, "
    "MultiAsyncCollector) runs copies of the policy in its worker processes"
)


def _rollout() -> tuple[Any, list[Any] | None] | None:
    """The collector and the ``tensordicts`` local of its ``rollout`` on the stack; None where there is none."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "rollout" and frame.f_globals.get("__name__", "").startswith("torchrl.collectors"):
            found = frame.f_locals.get("tensordicts")
            return frame.f_locals.get("self"), found if isinstance(found, list) else None
        frame = frame.f_back
    return None


def _stepwise(collector: Any) -> bool:
    """Whether ``collector`` adds each step to its replay buffer (torchrl/collectors/_single.py ``rollout``)."""
    if getattr(collector, "replay_buffer", None) is None or getattr(collector, "_ignore_rb", False):
        return False
    return getattr(collector, "extend_buffer", True) is False


class BatchReturns:
    """The episodes each collector batch ended (iteration: the probe's batch count)."""

    def __init__(self) -> None:
        self.returns = Returns("rewards")
        self.sums: DeviceSums | None = None
        self._steps: list[Any] | None = None  # the batch being collected: the rollout's own list
        self._iteration = -1
        self.collected = False  # a collection call came
        self.stepwise = False  # a collector without the step list (STEPWISE)
        self.ended = False  # the probe closed (only then is a run without a collection call known)

    @property
    def why(self) -> str | None:
        """Why the record holds no returns for this run (None: it holds them, or none ended)."""
        if self.stepwise:
            return STEPWISE
        return ELSEWHERE if self.ended and not self.collected else None

    def collecting(self, iteration: int) -> bool:
        """At a collection call: a new batch's list settles the last one (True: the record changed)."""
        self.collected = True
        found = _rollout()
        if found is None:
            return False
        collector, steps = found
        if steps is None or steps is self._steps:
            return False
        if _stepwise(collector):
            self.stepwise = True
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
