"""The doctor's tallies of rows (``report/sections/doctor.py``): the earliest row of one kind and how many
(:class:`First`), and its checks of training sequences, batch by batch in log order: episode starts the state
runs on across inside multi-step training calls (:class:`Leaks`) and in per-timestep training loops
(:class:`StepScan`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from lstm_probe.report.rows import Test, select_rows
from lstm_probe.report.sections.staleness import PROVENANCE_TOLERANCE

TRAINING = ("train", "value")


@dataclass
class First:
    """The earliest (by call) row of one kind, and the count."""

    count: int = 0
    call: float = np.inf
    row: dict[str, Any] = field(default_factory=dict)

    def add(self, cols: dict[str, np.ndarray], mask: np.ndarray, extra: dict[str, Any] | None = None) -> None:
        n = int(mask.sum())
        if not n:
            return
        self.count += n
        idx = np.flatnonzero(mask)
        i = int(idx[np.argmin(cols["call"][idx])])
        if cols["call"][i] < self.call:
            self.call = float(cols["call"][i])
            self.row = {k: _py(cols[k][i]) for k in ("call", "module", "phase", "env", "env_step")}
            if extra:
                self.row.update({k: _py(v[i]) if isinstance(v, np.ndarray) else v for k, v in extra.items()})


def _py(v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and np.isnan(v):
        return None
    return int(v) if isinstance(v, float) and v.is_integer() else v


LEAK_COLUMNS = ["call", "module", "phase", "env", "env_step", "seq"]
LEAK_NEEDS = {"t", "path", "episode_start", "padding"}
LEAK_ROWS: tuple[Test, ...] = (("episode_start", "equal", True), ("t", "greater", 0), ("layer", "equal", 0))
LEAK_ROWS += (("padding", "equal", False),)
LEAK_WORDS: dict[str, tuple[str, ...]] = {"phase": TRAINING, "path": ("sequence",)}
"""The rows :class:`Leaks` reads: those that pass ``LEAK_ROWS`` and whose string columns hold ``LEAK_WORDS``."""
SEQUENCE = {"value": "a value-estimator sequence (GAE's passes or a loss's target network, phase value)"}
"""A training-side call's sequence by its phase, where not "a training sequence"."""


class Leaks:
    """Training rows of multi-step calls where an episode starts after the sequence's first step: the state
    runs on across the episode boundary (TorchRL: an all-false ``is_init`` over a batch that crosses
    episodes, or a value estimator's pass over next observations that runs on into the next episode, such as
    DQNLoss's target pass; any loop that runs one sequence over several episodes without a reset). Per
    phase, the episode starts (:attr:`found`) and the sequences that hold them (:attr:`sequences`). Batch by
    batch, in log order, from the doctor's one pass over the rows: a sequence's rows come together (a call's
    rows do, layer 0's by batch column and step), so its episode starts are counted as one sequence where the
    (call, module, seq) changes from the row before."""

    def __init__(self) -> None:
        self.found: dict[str, First] = {}
        self.sequences: dict[str, int] = {}
        self.last: tuple[float, str, float] | None = None  # (call, module, seq) of the last row read

    def add(self, batch: pa.RecordBatch) -> None:
        batch = select_rows(batch, LEAK_ROWS, LEAK_WORDS)
        if batch.num_rows:
            c = {k: batch.column(k).to_numpy(zero_copy_only=False) for k in LEAK_COLUMNS}
            c = {k: v.astype(str) if k in ("module", "phase") else v.astype(float) for k, v in c.items()}
            call, module, seq = c["call"], c["module"], c["seq"]
            new = np.r_[True, (call[1:] != call[:-1]) | (module[1:] != module[:-1]) | (seq[1:] != seq[:-1])]
            new[0] = self.last != (call[0], module[0], seq[0])
            self.last = (float(call[-1]), str(module[-1]), float(seq[-1]))
            for p in np.unique(c["phase"]).tolist():
                here = c["phase"] == p
                self.found.setdefault(p, First()).add(c, here)
                self.sequences[p] = self.sequences.get(p, 0) + int((here & new).sum())

    def words(self, phase: str) -> str:
        """The finding for ``phase``'s episode starts (where they were first seen is the caller's to add)."""
        n, seqs = self.found[phase].count, self.sequences[phase]
        times = "once" if n == 1 else f"{n:,} times"
        where = "in one sequence" if seqs == 1 else f"in {seqs:,} sequences"
        return (
            f"an episode starts inside {SEQUENCE.get(phase, 'a training sequence')} {times} ({where}): the state "
            "runs on across the episode boundary, from one episode into the next (is_init / episode starts not "
            "set where an episode began)"
        )


@dataclass
class Steps:
    """Per-step training loops (path 'stepwise'): episode starts the state ran on across, rows without a tag."""

    carried: First = field(default_factory=First)
    carried_too: First = field(default_factory=First)
    """Episode starts the rollout did not reset the state at either, where the train state still equals the
    rollout's there: the training loop carried the state across them too (fixing the rollout alone would not
    do)."""
    reset_only: First = field(default_factory=First)
    """Episode starts the rollout did not reset the state at, where the train state departs from the rollout's
    right there: the training loop resets it (its gradient is cut there), the rollout alone does not."""
    untagged: int = 0
    """First-minibatch train rows after a sequence's first step with no ``episode_start``."""


STEP_COLUMNS = ["call", "module", "phase", "env", "env_step", "iteration", "seq", "t", "episode_start", "drift_h"]
STEP_NEEDS = {"t", "path", "episode_start", "padding", "epoch", "minibatch", "iteration", "seq", "drift_h"}
STEP_ROWS: tuple[Test, ...] = (("epoch", "equal", 0), ("minibatch", "equal", 0), ("layer", "equal", 0))
STEP_ROWS += (("padding", "equal", False),)
STEP_WORDS: dict[str, tuple[str, ...]] = {"phase": ("train",), "path": ("stepwise",)}
"""The rows :class:`StepScan` reads (as :data:`LEAK_ROWS` and :data:`LEAK_WORDS`)."""


class StepScan:
    """Episode starts inside the training sequences of a per-timestep training loop that the state ran on
    across. Before any optimizer step (minibatch 0 of epoch 0) a train state equals the rollout state of its
    env step; where it does so up to an episode start and departs there, the loop kept its state where the
    rollout reset it. Where the rollout did not reset the state there either, a train state that still equals the
    rollout's at the episode start (it departs nowhere up to it) was carried across by the training loop too.
    Batch by batch (:meth:`add`), in log order; :meth:`result` tells the two apart."""

    def __init__(self, tolerance: float = PROVENANCE_TOLERANCE) -> None:
        self.tolerance = tolerance  # staleness.provenance_tolerance of the log
        self.out = Steps()
        self.departs: dict[tuple[str, float, float], float] = {}  # (module, iteration, seq) -> first t off the rollout
        self.starts: list[dict[str, np.ndarray]] = []  # rows where an episode starts after the sequence's first step

    def add(self, batch: pa.RecordBatch) -> None:
        batch = select_rows(batch, STEP_ROWS, STEP_WORDS)
        if not batch.num_rows:
            return
        c = {k: batch.column(k).to_numpy(zero_copy_only=False) for k in STEP_COLUMNS if k != "episode_start"}
        c = {k: v.astype(str) if k in ("module", "phase") else v.astype(float) for k, v in c.items()}
        flag = batch.column("episode_start")
        tagged = flag.is_valid().to_numpy(zero_copy_only=False)
        start = flag.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
        later = c["t"] > 0
        self.out.untagged += int((later & ~tagged).sum())
        off = np.flatnonzero(c["drift_h"] > self.tolerance)
        if len(off):  # each sequence's first step off the rollout, one Python step per sequence
            seqs, inv = np.unique(
                np.rec.fromarrays([c[k][off] for k in ("module", "iteration", "seq")]), return_inverse=True
            )
            first = np.full(len(seqs), np.inf)
            np.minimum.at(first, inv.reshape(-1), c["t"][off])
            for key, t in zip(seqs.tolist(), first.tolist(), strict=True):
                self.departs[key] = min(self.departs.get(key, np.inf), t)
        if (later & start).any():
            self.starts.append({k: v[later & start] for k, v in c.items()})

    def result(self, not_reset: set[tuple[str, float, float]]) -> Steps:
        """``not_reset``: (module, env, env_step) where the rollout did not reset the state either."""
        for c in self.starts:
            keys = zip(c["module"].tolist(), c["iteration"].tolist(), c["seq"].tolist(), strict=True)
            departs = np.array([self.departs.get(k, np.inf) for k in keys])
            envs = zip(c["module"].tolist(), c["env"].tolist(), c["env_step"].tolist(), strict=True)
            kept = np.array([k in not_reset for k in envs], bool)
            self.out.carried.add(c, (departs == c["t"]) & ~kept)
            self.out.reset_only.add(c, (departs == c["t"]) & kept)
            # still on the rollout's state at the episode start (a drift measured there, none off it before)
            on = (departs > c["t"]) & (c["drift_h"] <= self.tolerance)
            self.out.carried_too.add(c, on & kept)
        return self.out


GROUPS = {"rollout": "rollout", "bootstrap": "rollout", "predict": "predict", "other": "other"}
"""Acting phase -> the group whose returned states its calls are compared with (``capture/inputs.py``: GROUP)."""


def group(phases: np.ndarray) -> np.ndarray:
    """Each acting phase's group (:data:`GROUPS`); '' for anything else (no earlier call)."""
    out = np.full(len(phases), "", "<U8")
    for phase, group in GROUPS.items():
        out[phases == phase] = group
    return out


def earlier(a: First, b: First) -> First:
    """Both counts, first at the earlier of the two."""
    first = a if a.call <= b.call else b
    return First(a.count + b.count, first.call, first.row)


class Strides:
    """How an env's ``env_step`` advances between its consecutive one-step rollout calls of one iteration (per
    module, worker and env column; batch by batch in log order, a call's rows whole): by 1 where the tag counts the
    env's own steps. Every advance of one size k > 1 and none of 1 is the signature of a global counter tagged as
    ``env_step`` (CleanRL's ``global_step``, which advances by the number of envs each step); gaps of varied size are
    not (:meth:`stride` says None). Advances across iterations, between calls out of call order (a resumed run's
    restarted count) or from a multi-step call are not counted: a kill, a resume, thinned iterations and
    ``--every`` leave every counted advance at 1."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, float, float], tuple[float, float, float]] = {}  # -> (call, env_step, iteration)
        self.ones = 0  # advances of 1
        self.sizes: dict[float, First] = {}  # advance > 1 -> how many, the first (two sizes: varied, no more kept)

    def add(self, c: dict[str, np.ndarray]) -> None:
        """One batch of the doctor's init rows (``doctor._columns``: strings, tribools, floats)."""
        keep = (c["phase"] == "rollout") & (c["path"] == "step") & (c["env"] >= 0) & (c["env_step"] >= 0)
        rows = np.flatnonzero(keep)
        if not len(rows):
            return
        worker, it = (np.nan_to_num(c[k][rows], nan=-1.0) for k in ("worker", "iteration"))
        order = np.lexsort((c["call"][rows], c["env"][rows], worker, c["module"][rows]))
        idx, worker, it = rows[order], worker[order], it[order]
        module, env, call, step = c["module"][idx], c["env"][idx], c["call"][idx], c["env_step"][idx]
        same = np.r_[False, (module[1:] == module[:-1]) & (worker[1:] == worker[:-1]) & (env[1:] == env[:-1])]
        before = np.stack([np.r_[np.nan, a[:-1]] for a in (call, step, it)])  # the previous call's, where same
        for i in np.flatnonzero(~same).tolist():
            before[:, i] = self.last.get((str(module[i]), float(worker[i]), float(env[i])), (np.nan,) * 3)
        advance = step - before[1]
        counted = (call > before[0]) & (it == before[2]) & (advance > 0)
        self.ones += int((counted & (advance == 1)).sum())
        for size in np.unique(advance[counted & (advance > 1)]).tolist()[:2]:
            if size in self.sizes or len(self.sizes) < 2:
                mask = np.zeros(len(c["call"]), bool)
                mask[idx[counted & (advance == size)]] = True
                self.sizes.setdefault(size, First()).add(c, mask)
        for i in np.flatnonzero(np.r_[~same[1:], True]).tolist():
            self.last[(str(module[i]), float(worker[i]), float(env[i]))] = (call[i], step[i], it[i])

    def stride(self) -> tuple[int, First] | None:
        """(k, where first and how many) where every counted advance is k > 1 (at least two of them); else None."""
        if self.ones or len(self.sizes) != 1:
            return None
        (size, first), *_ = self.sizes.items()
        return (int(size), first) if first.count >= 2 else None
