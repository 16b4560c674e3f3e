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

Where there is no such list, the batches the training side sees are read instead (:class:`TrainBatches`): each batch
a value estimator's recurrent call is given (the estimator's ``data``, found on the stack as samples.py's
``gae_batch`` does) or that the loop hands :meth:`~lstm_probe.integrations.torchrl.hooks.TorchRLProbe.measure_batch`,
once per batch however many epochs call them. That is the case of a multi-process collector
(torchrl/collectors/_multi_base.py ``MultiCollector``: ``MultiSyncCollector``, ``MultiAsyncCollector``), which runs
``rollout`` in its worker processes on their copies of the policy: the probe's process sees no collection call, but
the batches the workers send reach the loss. Where neither comes, the probe says why instead
(:attr:`BatchReturns.why`: the capability is then not declared, and the log's ``not_measurable`` says it):

- ``replay_buffer=`` with ``extend_buffer=False``: ``rollout`` adds each step to the buffer itself
  (``self.replay_buffer.add(carrier_for_out)``) and its ``tensordicts`` list stays empty; the training side gets the
  buffer's samples, not whole trajectories in step order, whose rewards sum to no episode's return;
- a multi-process collector whose batches reach no value estimator's recurrent call and no ``measure_batch``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from lstm_probe.capture.returns import DeviceSums, Returns

REWARD, DONE = ("next", "reward"), ("next", "done")


STEPWISE = (
    "the collector adds each step to its replay buffer itself (replay_buffer= with extend_buffer=False): no batch "
    "of its steps holds the rewards, and the buffer's samples the training side gets are not whole trajectories"
)
ELSEWHERE = (
    "no collection call ran in the probe's process: a multi-process collector (MultiSyncCollector, "
    "MultiAsyncCollector) runs copies of the policy in its worker processes, and none of its batches reached a "
    "value estimator's recurrent call or measure_batch, where the probe reads them"
)
TRAJ, START = ("collector", "traj_ids"), ("is_init", "step_count")


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
        self.train = TrainBatches(self.returns)  # without a collection call: the training side's batches

    @property
    def why(self) -> str | None:
        """Why the record holds no returns for this run (None: it holds them, or none ended)."""
        if self.stepwise:
            return STEPWISE
        return ELSEWHERE if self.ended and not self.collected and not self.train.batches else None

    def trained(self, data: Any) -> bool:
        """A batch the training side sees (a value estimator's, measure_batch's): its episodes, where no collection
        call came (True: the record changed)."""
        return not self.collected and not self.stepwise and data is not None and self.train.take(data)

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


class TrainBatches:
    """The episodes of each batch the training side sees, in a process that runs no collection (module docstring):
    per row of the batch (its last dim the steps, as a collector's batch), the rewards summed along the steps on
    their device and copied to the host once per batch with the dones, trajectory ids, episode starts and step
    counts; each trajectory's steps added up across batches by its trajectory id (unique across a multi-process
    collector's workers; the row where there are none). A trajectory first seen at an episode start (``is_init``, or
    ``step_count`` 0) counts; one first seen mid-episode is partial. The same batch again (another epoch's
    estimator call: the same reward tensor) is taken once; a batch whose steps do not follow each other (a
    minibatch of shuffled samples: a step count not one more than the one before, within a trajectory) is left
    out (``skipped``)."""

    def __init__(self, returns: Returns) -> None:
        self.returns = returns
        self.batches = 0  # the batches taken (the record's iteration)
        self.skipped = 0
        self._last: Any = None  # the last batch's reward tensor (kept: its identity tells the same batch again)
        self._carry: dict[int, tuple[float, int, bool]] = {}  # trajectory id -> its sum, length, counted

    def take(self, data: Any) -> bool:
        import torch

        reward, done = data.get(REWARD, None), data.get(DONE, None)
        dims = tuple(getattr(data, "batch_size", ()))
        if reward is None or done is None or reward is self._last or not dims or reward.numel() != data.numel():
            return False
        self._last = reward
        n = dims[-1]
        with torch.no_grad():
            r = reward.detach().reshape(-1, n).double()
            cols = [r.cumsum(1), done.reshape(-1, n)]
            traj = data.get(TRAJ, None)
            rows = torch.arange(r.shape[0], device=r.device).unsqueeze(1).expand(-1, n)
            cols.append(traj.reshape(-1, n) if traj is not None and traj.numel() == r.numel() else rows)
            init, step = (data.get(k, None) for k in START)
            if step is not None and step.numel() == r.numel():
                cols += [step.reshape(-1, n) == 0, step.reshape(-1, n)]
            elif init is not None and init.numel() == r.numel():
                cols.append(init.reshape(-1, n))
            else:  # nothing says where an episode starts: the collector resets every env before its first batch
                cols.append(torch.full_like(r, float(self.batches == 0)))
            packed = torch.stack([c.to(r.device, torch.float64) for c in cols]).cpu().numpy()  # the one host copy
        return self._settle(packed)

    def _settle(self, packed: np.ndarray) -> bool:
        cs, done, traj, start = packed[0], packed[1] != 0, packed[2].astype(np.int64), packed[3] != 0
        if len(packed) > 4 and not (done[:, :-1] | (packed[4][:, 1:] == packed[4][:, :-1] + 1)).all():
            self.skipped += 1
            return False
        it = self.batches
        self.batches += 1
        self.returns.at(it)
        returns: list[float] = []
        lengths: list[int] = []
        partial = 0
        last = cs.shape[1] - 1
        for i in range(cs.shape[0]):
            total, length, counted = self._carry.pop(int(traj[i, 0]), (0.0, 0, bool(start[i, 0])))
            before, at = 0.0, -1
            for p in np.flatnonzero(done[i]):
                total, length = total + float(cs[i, p]) - before, length + int(p) - at
                if counted:
                    returns.append(total)
                    lengths.append(length)
                else:
                    partial += 1
                before, at, total, length, counted = float(cs[i, p]), int(p), 0.0, 0, True
            if at < last:
                self._carry[int(traj[i, last])] = (total + float(cs[i, last]) - before, length + last - at, counted)
        self.returns.ended(it, returns, lengths, partial=partial)
        return True
