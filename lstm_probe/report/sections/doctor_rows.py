"""The doctor's tallies of rows (``report/sections/doctor.py``): the earliest row of one kind and how many
(:class:`First`), the input states' counts (:class:`Tally`), and its checks of training sequences, batch by batch in
log order: episode starts the state runs on across inside multi-step training calls (:class:`Leaks`) and in
per-timestep training loops (:class:`StepScan`)."""

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
STARTS_ROWS: tuple[Test, ...] = (("episode_start", "equal", True), ("env_step", "greater", 0), ("layer", "equal", 0))
STARTS_WORDS: dict[str, tuple[str, ...]] = {"phase": ("rollout",)}
"""The rollout's tagged episode starts past an env's first step (a NEXT_STEP env's autoreset steps): those that pass
``STARTS_ROWS`` and hold ``STARTS_WORDS``; the doctor counts those without an ``init`` (a multi-step rollout call's
later steps, which the init rows leave out) with :meth:`Tally.add_starts`."""
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
    checked: int = 0
    """Episode starts the rollout did not reset the state at, inside first-minibatch training sequences (each
    iteration's minibatch 0 of epoch 0, before any optimizer step: where a reset can be seen)."""
    inside: int = 0
    """Episode starts the rollout did not reset the state at, inside any training sequence of the run (each env step
    once, whatever the epochs): the scope of the rollout's not-reset count."""


STEP_COLUMNS = ["call", "module", "phase", "env", "env_step", "iteration", "seq", "t", "episode_start", "drift_h"]
STEP_NEEDS = {"t", "path", "episode_start", "padding", "epoch", "minibatch", "iteration", "seq", "drift_h"}
STEP_ROWS: tuple[Test, ...] = (("epoch", "equal", 0), ("minibatch", "equal", 0), ("layer", "equal", 0))
STEP_ROWS += (("padding", "equal", False),)
STEP_WORDS: dict[str, tuple[str, ...]] = {"phase": ("train",), "path": ("stepwise",)}
INSIDE_ROWS: tuple[Test, ...] = (("episode_start", "equal", True), ("t", "greater", 0), ("layer", "equal", 0))
INSIDE_ROWS += (("padding", "equal", False),)
"""The rows :class:`StepScan` reads: the first minibatch's (``STEP_ROWS``), and every minibatch's episode starts
after a sequence's first step (``INSIDE_ROWS``), of ``STEP_WORDS``."""


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
        self.inside: set[tuple[str, float, float]] = set()  # (module, env, env_step) of those, in any minibatch

    def add(self, batch: pa.RecordBatch) -> None:
        inside = select_rows(batch, INSIDE_ROWS, STEP_WORDS)
        if inside.num_rows:
            keys = [inside.column(k).to_numpy(zero_copy_only=False) for k in ("module", "env", "env_step")]
            self.inside.update(
                zip(keys[0].astype(str).tolist(), *(k.astype(float).tolist() for k in keys[1:]), strict=True)
            )
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
            self.out.checked += int(kept.sum())
            # still on the rollout's state at the episode start (a drift measured there, none off it before)
            on = (departs > c["t"]) & (c["drift_h"] <= self.tolerance)
            self.out.carried_too.add(c, on & kept)
        self.out.inside = len(self.inside & not_reset)
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


ACTING = ("rollout", "predict", "other", "bootstrap")
NOT_RESET = ("previous", "other")
"""Sources that, at an episode start, mean the state was not reset."""


class Tally:
    """Counts over the init rows, batch by batch; a call's rows are kept together (the rows of the last
    call of a batch wait for the next batch), so calls with both kinds of reset error are seen whole."""

    def __init__(self, zeroed: tuple[str, ...] = ()) -> None:
        self.by_design = np.array(zeroed, str)  # modules the log declares zeroed at a rollout's start
        self.zeroed: dict[str, int] = {}
        self.train_other: dict[str, dict[str, int]] = {}
        self.sources: dict[str, dict[str, int]] = {}
        self.carried: dict[str, int] = {}  # phase -> columns that started from the previous state
        self.placed: dict[str, int] = {}  # phase -> columns that started from a non-zero state
        self.zero: dict[str, First] = {}  # phase -> zero without an episode start
        self.untagged: dict[str, First] = {}  # phase -> zero where no tag says whether an episode started
        self.unknown: dict[str, int] = {}  # phase -> columns with an env step but no tag saying if an episode starts
        self.foreign = 0  # columns of untagged ('other') calls that started from a state it cannot place
        self.not_reset: dict[str, First] = {}
        self.not_reset_at: set[tuple[str, float, float]] = set()  # (module, env, env_step) not reset there
        self.wrong_column = First()
        self.other_env = First()
        self.train_zero = First()
        self.train_state = First()
        self.rollout_zero = 0
        self.twice = First()
        self.advanced = First()
        self.last: dict[tuple[str, float], tuple[float, str, float]] = {}  # (module, env) -> (env_step, phase, it.)
        self.last_call: dict[tuple[str, float], float] = {}  # (module, env) -> its last acting call
        self.disordered = False
        """A (module, env) met a call earlier than its last one (:attr:`Pass.disordered`)."""
        self.entered: dict[str, int] = {}  # 'module/phase' -> 'other' columns at a first call in the phase's group
        self.inside: dict[str, int] = {}  # 'module/phase' -> 'other' columns at a later call in the phase's group
        self.rolled: dict[str, int] = {}  # 'module/phase' -> 'other' columns at a new iteration's first call in it
        self.strides = Strides()  # how the rollout's env_step advances: a global counter tagged as it
        self.autoresets: dict[str, First] = {}  # module -> its rollout columns tagged episode_start past env step 0

    def count_sources(self, batch: pa.RecordBatch) -> None:
        """The init sources per module and phase of one batch of init rows (nulls as ''): each column's
        dictionary codes combined into one small key and counted (the batches are small, a few thousand
        rows: Arrow's group_by costs ~4 ms a call here, sorting the rows' strings with numpy ~2.5 ms)."""
        key = np.zeros(batch.num_rows, np.int64)
        words: list[list[str]] = []
        for name in ("module", "phase", "init"):
            col = batch.column(name)
            enc = col if pa.types.is_dictionary(col.type) else col.dictionary_encode()
            # the dictionary's codes (no string built per row); null: one more code, the word '' (as a word
            # '' would be: counts are added up by word below)
            words.append([w if w is not None else "" for w in enc.dictionary.to_pylist()] + [""])
            codes = enc.indices.fill_null(len(words[-1]) - 1) if enc.null_count else enc.indices
            key = key * len(words[-1]) + codes.to_numpy(zero_copy_only=False)
        counts = np.bincount(key, minlength=1)
        for flat in np.flatnonzero(counts).tolist():
            rest, v = divmod(flat, len(words[2]))
            m, p = divmod(rest, len(words[1]))
            d = self.sources.setdefault(f"{words[0][m]}/{words[1][p]}", {})
            d[words[2][v]] = d.get(words[2][v], 0) + int(counts[flat])

    def add(self, c: dict[str, np.ndarray]) -> None:
        self.strides.add(c)
        phase, init = c["phase"], c["init"]
        # an episode start: tagged, or (untagged) an episode's step 0
        start = (c["episode_start"] == 1) | ((c["episode_start"] < 0) & (c["episode_step"] == 0))
        known = (c["episode_start"] >= 0) | ~np.isnan(c["episode_step"])  # whether a tag says if one started
        acting = np.isin(phase, ACTING)
        zero = acting & (init == "zero")
        # a second call at one env step starts from the first one's state: counted as that, not as not reset
        twice, entered = self._twice(c)
        kept = acting & start & np.isin(init, NOT_RESET) & ~twice
        other = acting & (init == "other")
        designed = zero & (entered == 2) & np.isin(c["module"], self.by_design)  # a declared zeroing
        zero &= ~designed
        _count(self.zeroed, c, designed)
        training = np.isin(phase, TRAINING)
        for reason in np.unique(c["seq_reason"][training & (init == "other")]).tolist():
            _count(self.train_other, c, training & (init == "other") & (c["seq_reason"] == reason), reason)
        later = (entered == 0) | (entered == 2)  # rolled: the later calls at a new iteration's first step
        for counts, told in ((self.entered, entered == 1), (self.inside, later), (self.rolled, entered == 2)):
            _count(counts, c, told & other)
        # a call that kept a state at an episode start and zeroed another column: the wrong column was reset
        call = c["call"]
        both = np.intersect1d(call[zero], call[kept])
        if len(both):
            in_both = np.isin(call, both)
            # the first such call: which column kept its state, which was reset instead
            first = both.min()
            at = call == first
            reset_env = c["env"][at & zero][0]
            self.wrong_column.add(c, in_both & kept, {"reset_env": np.full(len(call), reset_env)})
            zero &= ~in_both
            kept &= ~in_both
        for p in np.unique(phase[acting]).tolist():
            here = phase == p
            self.carried[p] = self.carried.get(p, 0) + int((here & (init == "previous")).sum())
            self.placed[p] = self.placed.get(p, 0) + int((here & ~np.isin(init, ("zero", "reset"))).sum())
            self.zero.setdefault(p, First()).add(c, here & zero & known)
            self.untagged.setdefault(p, First()).add(c, here & zero & ~known)
            self.unknown[p] = self.unknown.get(p, 0) + int((here & ~known & (c["env_step"] >= 0)).sum())
            self.not_reset.setdefault(p, First()).add(c, here & kept)
        if kept.any():
            self.not_reset_at.update(zip(*(c[k][kept].tolist() for k in ("module", "env", "env_step")), strict=True))
        self.rollout_zero += int(((phase == "rollout") & (init == "zero")).sum())
        # under a NEXT_STEP autoreset, every step tagged as an episode start but an env's first is an autoreset step
        starts = (phase == "rollout") & (c["episode_start"] == 1) & (c["env_step"] > 0)
        for module in np.unique(c["module"][starts]).tolist():
            self.autoresets.setdefault(module, First()).add(c, starts & (c["module"] == module))
        self.foreign += int(((phase == "other") & (init == "other")).sum())
        self.other_env.add(c, init == "other_env")
        self.train_zero.add(c, training & (init == "zero"))
        self.train_state.add(c, training & (c["init_norm"] > 0))

    def add_starts(self, c: dict[str, np.ndarray]) -> None:
        """The rollout's tagged episode starts past an env's first step inside multi-step rollout calls (``c``: the
        rows of :data:`STARTS_ROWS` without an ``init``: an own loop that runs its LSTM over several steps at once,
        or a per-step loop recorded whole, writes its ``init`` at the call's first step only), counted with those of
        the calls' first steps (:meth:`add`)."""
        for module in np.unique(c["module"]).tolist():
            self.autoresets.setdefault(module, First()).add(c, c["module"] == module)

    def _twice(self, c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Calls of one module at the (env, env_step) of its previous acting call: in the same phase (the
        state advanced twice for one observation), or a rollout call after a bootstrap call that started
        from neither the previous step's state nor a reset (the bootstrap call's advance was kept); and the
        columns whose module's previous acting call on their env column was in another phase group
        (:data:`GROUPS`), or that have none, as 1 (the first call of the column in its group; 0: a later one; -1:
        no env or env step to tell; 2: a later one in a new iteration), for the columns that started from 'other'
        (-1 elsewhere)."""
        keep = np.flatnonzero(np.isin(c["phase"], ACTING) & (c["env"] >= 0) & (c["env_step"] >= 0))
        if not len(keep):
            return np.zeros(len(c["call"]), bool), np.full(len(c["call"]), -1, np.int8)
        idx = keep[np.lexsort((c["call"][keep], c["env"][keep], c["module"][keep]))]
        module, env, step, phase = c["module"][idx], c["env"][idx], c["env_step"][idx], c["phase"][idx]
        same = np.r_[False, (module[1:] == module[:-1]) & (env[1:] == env[:-1])]
        prev_step, it = np.r_[np.nan, step[:-1]], c["iteration"][idx]
        prev_it = np.r_[np.nan, it[:-1]]
        firsts = np.flatnonzero(~same).tolist()  # a module's env column seen in an earlier batch
        seen = [self.last.get((module[i], env[i]), (np.nan, "", np.nan)) for i in firsts]
        # the phases as fixed-width strings wide enough for the earlier batches' too: compared in numpy
        width = max([phase.dtype.itemsize // 4, 1] + [len(p) for _, p, _ in seen])
        prev_phase = np.empty(len(idx), f"<U{width}")
        prev_phase[0], prev_phase[1:] = "", phase[:-1]
        for i, (s, p, k) in zip(firsts, seen, strict=True):
            prev_step[i], prev_phase[i], prev_it[i] = s, p, k
        again = prev_step == step
        twice = again & (phase == prev_phase) & (phase != "bootstrap")
        advanced = again & (prev_phase == "bootstrap") & (phase == "rollout") & (c["init"][idx] == "other")
        masks = []
        for first, found in ((self.twice, twice), (self.advanced, advanced)):
            mask = np.zeros(len(c["call"]), bool)
            mask[idx[found]] = True
            first.add(c, mask)
            masks.append(mask)
        entered = np.full(len(c["call"]), -1, np.int8)  # -1: no env or env step to tell
        other = np.flatnonzero(np.isin(c["init"][idx], ("other", "zero")))  # told for these alone (few, if any)
        entered[idx[other]] = group(prev_phase[other]) != group(phase[other])  # no earlier call: group ''
        entered[idx[other]] += 2 * ((entered[idx[other]] == 0) & (it[other] > prev_it[other]))  # a new iteration
        calls = c["call"][idx]
        for i in firsts:
            if calls[i] <= self.last_call.get((module[i], env[i]), -np.inf):
                self.disordered = True
        for i in np.flatnonzero(np.r_[~same[1:], True]).tolist():
            self.last[(module[i], env[i])] = (step[i], phase[i], it[i])
            self.last_call[(module[i], env[i])] = calls[i]
        return masks[0], entered


def _count(into: dict[str, Any], c: dict[str, np.ndarray], mask: np.ndarray, reason: str | None = None) -> None:
    """``mask``'s columns counted per 'module/phase' into ``into`` (and per ``reason`` under it, where given)."""
    if mask.any():
        key = np.char.add(np.char.add(c["module"][mask], "/"), c["phase"][mask])
        for k, n in zip(*(a.tolist() for a in np.unique(key, return_counts=True)), strict=True):
            d = into if reason is None else into.setdefault(k, {})
            at = k if reason is None else reason
            d[at] = d.get(at, 0) + n


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
