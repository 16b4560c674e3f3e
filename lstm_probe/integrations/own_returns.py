"""The returns capability for own loops: what ``Tracer.episodes`` and ``Tracer.rewards`` hand over.

A loop either hands over finished episodes (``episodes(returns, lengths)``: host values it holds, e.g. gymnasium's
``RecordEpisodeStatistics`` ``info["episode"]``; source 'user') or each env step's ``rewards(rewards, dones)``
(source 'rewards'): numpy arrays or lists are summed per env on the host; torch tensors on their device (a few
small kernels per step, no wait), copied to the host once per iteration (when the next iteration's first step
comes, and at close). An episode counts from the first step handed over; one under way then is partial unless
``started`` said which envs were at an episode's first step. Under gymnasium's NEXT_STEP autoreset (the log's
``autoreset_mode``) an env's step after its done is the no-op autoreset step: in no episode's sum or length, so the
figures are gymnasium's own (``RecordEpisodeStatistics``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lstm_probe.capture.returns import DeviceSums, Returns, StepSums
from lstm_probe.errors import BadInput


class OwnReturns:
    """One own loop's episodes, by iteration; :meth:`publish` puts the record in the writer's progress."""

    def __init__(self) -> None:
        self.returns: Returns | None = None
        self.sums: StepSums | DeviceSums | None = None
        self.iteration: int | None = None  # the iteration of the steps the device sums hold

    def _source(self, source: str) -> Returns:
        if self.returns is None:
            self.returns = Returns(source)
        elif self.returns.source != source:
            raise BadInput(
                "give a run's episodes one way: Tracer.episodes (finished episodes) or Tracer.rewards (each step's "
                "rewards), not both"
            )
        return self.returns

    def episodes(self, returns: Any, lengths: Any, iteration: int) -> bool:
        """Finished episodes; True where they begin a new iteration (the record of the last one is then whole)."""
        r = np.asarray(returns, np.float64).reshape(-1)
        n = np.asarray(lengths, np.float64).reshape(-1)
        if n.size != r.size:
            raise BadInput(f"episodes: {r.size} return(s) but {n.size} length(s); give one length per return")
        new = self._next(iteration)
        self._source("user").ended(iteration, r, n)
        return new

    def rewards(self, rewards: Any, dones: Any, iteration: int, started: Any, next_step: bool = False) -> bool:
        """One env step; True where it begins a new iteration (the steps before it then settled). ``next_step``: the
        env autoresets in gymnasium's NEXT_STEP mode (the step after an env's done counts in no episode)."""
        returns = self._source("rewards")
        on_device = hasattr(rewards, "device") and hasattr(rewards, "detach")
        if self.sums is None:
            n = int(rewards.numel()) if on_device else int(np.size(rewards))
            self.sums = DeviceSums(rewards, started, next_step) if on_device else StepSums(n, started, next_step)
        new = self._next(iteration)
        if isinstance(self.sums, DeviceSums):
            # host dones (numpy >= 2 arrays have a .device too) as a tensor
            self.sums.step(rewards, dones if hasattr(dones, "detach") else _tensor(dones, rewards))
        else:
            self.sums.step(np.asarray(rewards), np.asarray(dones), returns, iteration)
        return new

    def _next(self, iteration: int) -> bool:
        """Settle the device sums where ``iteration`` is a new one; whether it is."""
        new = self.iteration is not None and iteration != self.iteration
        if new:
            self.flush()
        self.iteration = iteration
        return new

    def flush(self) -> None:
        """The device sums' episodes to the host (one copy): at an iteration's end and at close."""
        if isinstance(self.sums, DeviceSums) and self.returns is not None and self.iteration is not None:
            self.sums.flush(self.returns, self.iteration)

    def publish(self, tracer: Any) -> None:
        if self.returns is not None:
            self.returns.publish(tracer)


def _tensor(values: Any, like: Any) -> Any:
    """Host dones as a tensor on the rewards' device (copied there without waiting)."""
    import torch

    return torch.as_tensor(np.asarray(values)).to(like.device, non_blocking=True)
