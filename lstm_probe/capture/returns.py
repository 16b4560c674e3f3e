"""Episode returns, the *returns* capability: the episodes that ended in each iteration (rollout), kept in the log's
run metadata (``returns``, ``metadata_keys.py``) and up to date while the run goes.

An integration hands over what its framework already holds on the host, never waiting for a device: finished
episodes' returns and lengths (:meth:`Returns.ended`: sb3's Monitor ``info["episode"]``), or each env step's rewards
and dones (:class:`StepSums`: per-env sums in numpy; :class:`DeviceSums`: on the rewards' device, one host copy per
iteration). :meth:`Returns.publish` puts the record in the writer's progress, which every part written from then on
carries (``writer.part_doc``). Bounded however long the run: past :data:`MAX_ENTRIES` entries, neighbouring ones
merge (the stride doubles); the figures kept are sums, so merged entries are exact.

:class:`Live` does the same for the measurements' records (``what_if``, ``memory``: bounded by their own thinning),
so that a killed run's parts hold them as they were (``metadata_keys.LIVE_KEYS``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

MAX_ENTRIES = 500
"""Entries of ``by_iteration`` kept: past it, each two neighbours merge into one and the stride doubles."""
SOURCES = ("monitor", "rewards", "normalized", "rllib", "user")
"""Where the returns come from (the record's ``source``; see ``metadata_keys.py``)."""
_FIELDS = ("episodes", "return_sum", "return_sq", "return_min", "return_max", "length_sum")


class Returns:
    """The episodes that ended in each iteration: count, sums of returns and of their squares, min, max, sum of
    lengths; per entry of ``stride`` iterations (merged exactly past :data:`MAX_ENTRIES`)."""

    def __init__(self, source: str, max_entries: int = MAX_ENTRIES, evaluation: bool = False):
        if source not in SOURCES:
            raise ValueError(f"returns source {source!r}: one of {', '.join(SOURCES)}")
        self.source = source
        self.evaluation = evaluation  # an evaluation's episodes (RLlib's evaluation runners), not training's
        self.max_entries = max_entries
        self.stride = 1
        self.entries: dict[int, list[float]] = {}  # iteration // stride -> [episodes, sum, sq, min, max, length sum]
        self.episodes = 0
        self.partial = 0  # episodes begun before the probe: not counted
        self.nonfinite = 0  # NaN or infinite returns: not counted
        self.best: tuple[float, int] | None = None
        self.iterations = 0  # the iterations the integration saw (at()), where it says; 0: the log's
        self.changed = False
        self.published: dict[str, Any] | None = None

    def ended(self, iteration: int, returns: Any, lengths: Any, partial: int = 0) -> None:
        """Episodes that ended in ``iteration``: their returns and lengths (host arrays or sequences, one each);
        ``partial``: how many more ended that began before the probe saw them (counted, not recorded)."""
        if partial:
            self.partial += partial
            self.changed = True
        r = np.asarray(returns, np.float64).reshape(-1)
        n = np.asarray(lengths, np.float64).reshape(-1)
        if not r.size:
            return
        finite = np.isfinite(r)
        if not finite.all():
            self.nonfinite += int((~finite).sum())
            r, n = r[finite], n[finite]
            if not r.size:
                self.changed = True
                return
        key = iteration // self.stride
        e = self.entries.get(key)
        if e is None:
            e = self.entries[key] = [0, 0.0, 0.0, math.inf, -math.inf, 0.0]
        e[0] += r.size
        e[1] += float(r.sum())
        e[2] += float((r * r).sum())
        e[3] = min(e[3], float(r.min()))
        e[4] = max(e[4], float(r.max()))
        e[5] += float(n.sum())
        self.episodes += int(r.size)
        top = float(r.max())
        if self.best is None or top > self.best[0]:
            self.best = (top, int(iteration))
        self.changed = True
        if len(self.entries) > self.max_entries:
            self._thin()

    def at(self, iteration: int) -> None:
        """The integration collects ``iteration`` (where other processes of the log run further: RLlib's evaluation
        runners, whose rows carry a later weights version than any training rollout)."""
        if iteration >= self.iterations:
            self.iterations = iteration + 1
            self.changed = True

    def _thin(self) -> None:
        """Merge each two neighbouring entries (stride doubled) until at most ``max_entries`` are left."""
        while len(self.entries) > self.max_entries:
            self.stride *= 2
            merged: dict[int, list[float]] = {}
            for key in sorted(self.entries):
                e, m = self.entries[key], merged.get(key // 2)
                if m is None:
                    merged[key // 2] = list(e)
                else:
                    m[0] += e[0]
                    m[1] += e[1]
                    m[2] += e[2]
                    m[3] = min(m[3], e[3])
                    m[4] = max(m[4], e[4])
                    m[5] += e[5]
            self.entries = merged

    def record(self) -> dict[str, Any]:
        """The log's ``returns`` record (JSON values only)."""
        keys = sorted(self.entries)
        by: dict[str, list[Any]] = {"iteration": [k * self.stride for k in keys]}
        for i, name in enumerate(_FIELDS):
            by[name] = [int(self.entries[k][0]) if i == 0 else self.entries[k][i] for k in keys]
        out: dict[str, Any] = {
            "source": self.source,
            "stride": self.stride,
            "episodes": self.episodes,
            "partial": self.partial,
            "best": None if self.best is None else {"return": self.best[0], "iteration": self.best[1]},
            "by_iteration": by,
        }
        if self.nonfinite:
            out["nonfinite"] = self.nonfinite
        if self.evaluation:
            out["evaluation"] = True
        if self.iterations:
            out["iterations"] = self.iterations
        return out

    def publish(self, tracer: Any) -> dict[str, Any]:
        """Put the record, if it changed, in the progress of ``tracer``'s writer (a new object each time: the writer
        sends progress where it differs from what it sent, by identity first; nothing once the log is closed).
        Returns the record (made once per change)."""
        if not self.changed and self.published is not None:
            return self.published
        record = self.record()
        writer = getattr(tracer, "writer", None)
        if writer is not None:
            self.published = writer.progress["returns"] = record
            self.changed = False
        return record


class StepSums:
    """Each env's reward sum and step count since its episode began, from per-step host arrays (numpy: what the
    framework already holds there, or a copy the probe already makes). An episode counts where the probe saw it
    begin (``started``: the envs at an episode's first step when the probe starts); one under way then is partial.
    ``next_step``: the env autoresets in gymnasium's NEXT_STEP mode, so an env's step after its done is the no-op
    autoreset step (reward 0, the action ignored): left out of the next episode's sum and length, as gymnasium's own
    ``RecordEpisodeStatistics`` leaves it."""

    def __init__(self, n: int, started: Any = True, next_step: bool = False):
        self.sums = np.zeros(n, np.float64)
        self.lengths = np.zeros(n, np.int64)
        self.seen = np.broadcast_to(np.asarray(started, bool).reshape(-1), (n,)).copy()
        self.next_step = next_step
        self.autoreset = np.zeros(n, bool)  # NEXT_STEP: the envs whose next step is an autoreset step

    def step(self, rewards: Any, dones: Any, returns: Returns | None, iteration: int) -> None:
        """One env step: ``rewards`` and ``dones`` (N values each); the episodes it ended go to ``returns`` (None:
        nowhere, the sums reset all the same)."""
        r = np.asarray(rewards, np.float64).reshape(-1)
        d = np.asarray(dones).reshape(-1) != 0
        if self.next_step:
            live = ~self.autoreset
            self.sums += np.where(live, r, 0.0)
            self.lengths += live
            self.autoreset = d.copy()
        else:
            self.sums += r
            self.lengths += 1
        if not d.any():
            return
        full = d & self.seen
        if returns is not None:
            returns.ended(iteration, self.sums[full], self.lengths[full], partial=int(d.sum()) - int(full.sum()))
        self.sums[d] = 0.0
        self.lengths[d] = 0
        self.seen[d] = True


class DeviceSums:
    """:class:`StepSums` on the rewards' device: each step's sums and lengths stay there (a few small kernels, no
    wait); :meth:`flush` copies the steps since the last flush to the host at once (an integration calls it once
    per iteration, where the framework waits anyway)."""

    def __init__(self, like: Any, started: Any = True, next_step: bool = False):
        import torch

        n = int(like.numel())
        self.sums = torch.zeros(n, dtype=torch.float64, device=like.device)
        self.lengths = torch.zeros(n, dtype=torch.int64, device=like.device)
        seen = torch.as_tensor(np.broadcast_to(np.asarray(started, bool).reshape(-1), (n,)).copy())
        self.seen = seen.to(like.device)
        self.autoreset = torch.zeros(n, dtype=torch.bool, device=like.device) if next_step else None
        self.steps: list[tuple[Any, Any, Any, Any]] = []  # per step: returns, lengths, ended, partial (device)

    def step(self, rewards: Any, dones: Any) -> None:
        import torch

        with torch.no_grad():
            d = dones.detach().reshape(-1) != 0
            if self.autoreset is None:
                self.sums += rewards.detach().reshape(-1)  # (float64 += float32: no conversion of its own)
                self.lengths += 1
            else:  # NEXT_STEP: an env's step after its done (the autoreset step) counts in no episode
                live = ~self.autoreset
                self.sums += rewards.detach().reshape(-1) * live
                self.lengths += live
                self.autoreset = d.clone()
            self.steps.append((self.sums.clone(), self.lengths.clone(), d & self.seen, d & ~self.seen))
            self.sums.masked_fill_(d, 0.0)
            self.lengths.masked_fill_(d, 0)
            self.seen |= d

    def flush(self, returns: Returns, iteration: int) -> None:
        """The episodes the steps since the last flush ended, to ``returns`` (one host copy)."""
        import torch

        if not self.steps:
            return
        # one host copy: the four (steps, envs) columns as float64 (lengths and flags exact in it)
        packed = torch.stack([torch.stack(x).double() for x in zip(*self.steps, strict=True)]).cpu().numpy()
        self.steps.clear()
        sums, lengths, ended, partial = packed[0], packed[1].astype(np.int64), packed[2] != 0, packed[3] != 0
        returns.ended(iteration, sums[ended], lengths[ended], partial=int(partial.sum()))


class Live:
    """A run-metadata record the training side keeps up to date in the writer's progress (``metadata_keys.LIVE_KEYS``:
    ``what_if``, ``memory``), which every part written from then on carries (``writer.part_doc``): a killed run's
    last part holds it as it was. ``make`` builds the record (None: nothing yet); the log's close writes the final
    one over it."""

    def __init__(self, key: str, make: Any):
        self.key, self.make = key, make
        self.published: Any = None

    def publish(self, tracer: Any) -> None:
        """Put the record, where it changed, in the progress of ``tracer``'s writer: a copy (the measurement goes on
        appending to its own lists; the writer sends progress where it differs from what it sent, by identity
        first). Nothing once the log is closed."""
        writer = getattr(tracer, "writer", None)
        if writer is None:
            return
        record = self.make()
        if record is None or record == self.published:
            return
        self.published = writer.progress[self.key] = _copied(record)


def _copied(value: Any) -> Any:
    """``value`` with its dicts and lists copied (JSON values: the scalars are immutable)."""
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copied(v) for v in value]
    return value
