"""The cross-process check, for logs written by one writer per process (capability ``shards``): the
learners' states checked against the env runners' rollout states, joined by worker, env and env step
across the processes' part files."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from lstm_probe.contract import Capabilities
from lstm_probe.log import budget
from lstm_probe.log.reader import narrow
from lstm_probe.log.schema import relative_l2, traced_envs
from lstm_probe.report.numeric import dense_key, groups
from lstm_probe.report.section import Block, Line, Log, Section, Table, fmt
from lstm_probe.report.sections import staleness_trend
from lstm_probe.report.sections.staleness import PROVENANCE_TOLERANCE, provenance_tolerance
from lstm_probe.text import safe

CROSS_KEYS = ["module", "layer", "worker", "env", "env_step"]
CROSS_ITERATIONS = 50
"""The cross-process check reads at most this many iterations (the first ones), which bounds its memory."""
STATE_IN_TOLERANCE = 1e-6
"""Largest relative L2 difference ||learner - runner|| / ||runner|| allowed between a chunk's initial state and
the state the env runner stored: the same values passed on, so only float rounding; relative, so that it holds
whatever the states' scale (|c| reaches 13 at hidden 256)."""
SHOWN_MINIBATCHES = 40
SHOWN_ITERATIONS = 12


@dataclass
class CrossProcessSection:
    """RLlib logs: the learners' states checked against the env runners' rollout states (joined by
    worker, env and env step across the processes' part files)."""

    state_in_rows: int
    """Chunks that continue an episode: their initial state (rows with t = -1) paired with the rollout row."""
    state_in_max_abs: dict[str, float]
    state_in_ok: bool | None
    """Every chunk's initial state within :data:`STATE_IN_TOLERANCE` (relative) of the runner's state."""
    zero_starts: int
    zero_starts_ok: bool | None
    unpaired: int
    """Learner rows (not padding, not a 'last' bootstrap step, not :attr:`after_end`) without a rollout partner."""
    first_pass: list[dict[str, Any]]
    """Per module and iteration: the value pass and minibatch 0 (before any optimizer step) vs the rollout
    states of the same weights version."""
    by_minibatch: list[dict[str, Any]]
    vectors: bool
    state_in_max_relative: dict[str, float] = field(default_factory=dict)
    """Per module: the largest relative L2 difference of h and c between a chunk's initial state and the runner's."""
    provenance_tolerance: float = PROVENANCE_TOLERANCE
    """The bound on ``first_pass``' drift (``staleness.provenance_tolerance``: looser where cuDNN ran in TF32)."""
    state_in_l2_rows: int = 0
    """Of the ``state_in_rows``, those compared by the relative L2 difference of their vectors (both sides hold
    them); the others by their norms alone (``first_pass`` and ``by_minibatch`` rows give theirs as ``l2_rows``)."""
    by_iteration: list[dict[str, Any]] = field(default_factory=list)
    """Where the log declares ``cycling_minibatches``: per module, layer and iteration, the drift of the iteration's
    last minibatch (the staleness trend's entries, :func:`last_minibatches`; the report hands them to the staleness
    section, whose JSON holds them, not this one's)."""
    after_end: int = 0
    """'terminal' bootstrap rows of the last iteration past the env runner's last step: the runner's forward
    for that step never ran (training stopped), so they have no rollout row by design (not ``unpaired``)."""


def _vectors(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name).combine_chunks()
    width = col.type.list_size
    if col.null_count:
        col = col.fill_null(pa.scalar([np.nan] * width, col.type)) if width else col
    return np.asarray(col.flatten().to_numpy(zero_copy_only=False), np.float32).reshape(-1, width)


def _compare(learner: np.ndarray, runner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of two (rows, width) arrays: the largest absolute difference and the relative L2 difference
    (NaN as 0)."""
    if not len(learner):
        return np.zeros(0), np.zeros(0)
    with np.errstate(invalid="ignore"):
        largest = np.nan_to_num(np.abs(learner - runner), nan=0.0).max(axis=1)
        return largest, relative_l2(np.nan_to_num(learner), np.nan_to_num(runner))


Held = tuple[tuple[pa.Table, np.ndarray], tuple[pa.Table, np.ndarray]]
"""The vectors read for each side (learner, runner): a table of ``h`` and ``c`` and, per row of that side's
table, its row there (-1: its vectors were not read)."""


def _differences(
    learn: pa.Table, roll: pa.Table, which: str, li: np.ndarray, ri: np.ndarray, held: Held | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_compare` of each learner row ``li`` with its rollout row ``ri``: their ``which`` vectors where
    both rows hold one (``held``), else their norms (a weaker check: equal states have equal norms; the relative
    figure is then abs(||a|| - ||b||) / ||b||); and per pair whether it was compared by its vectors. A summary row has
    no vector (a summary log's, ``--trace-envs K``'s other envs', ``--every K``'s other iterations'): read as
    zeros, it would agree with anything."""
    norm = f"{which}_norm"
    out = _compare(*(t.column(norm).to_numpy().astype(np.float32)[i, None] for t, i in ((learn, li), (roll, ri))))
    by_l2 = np.zeros(len(li), bool)
    if held is not None:
        (lv, lpos), (rv, rpos) = held
        a, b = lpos[li], rpos[ri]
        ok = (a >= 0) & (b >= 0)
        ok[ok] = (
            lv.column(which).is_valid().to_numpy(zero_copy_only=False)[a[ok]]
            & rv.column(which).is_valid().to_numpy(zero_copy_only=False)[b[ok]]
        )
        both = np.flatnonzero(ok)
        largest, relative = _compare(_vectors(lv, which)[a[both]], _vectors(rv, which)[b[both]])
        out[0][both], out[1][both] = largest, relative
        by_l2 = ok
    return out[0], out[1], by_l2


def kinds(l2_rows: int, rows: int) -> str:
    """How a drift figure over ``rows`` pairs was measured, in words, where not every pair by the relative L2
    difference of its vectors: '' where all were; else which by their norms alone."""
    if l2_rows >= rows:
        return ""
    if not l2_rows:
        return f"by norms only, abs(||learner|| - ||rollout||) / ||rollout||, over {rows:,} rows (no vectors)"
    return f"mixed: {l2_rows:,} rows by relative L2 of their vectors, {rows - l2_rows:,} by norms only (no vectors)"


def _join(roll: pa.Table, learn: pa.Table) -> np.ndarray:
    """For each learner row, the position of the last rollout row of the same (module, layer, worker, env,
    env_step), or -1: a left join on :data:`CROSS_KEYS` in which a null key meets a null key (the driver's rows
    have no worker)."""
    n = roll.num_rows
    codes = [
        pc.dictionary_encode(
            pa.concat_arrays([roll.column(name).combine_chunks(), learn.column(name).combine_chunks()]),
            null_encoding="encode",
        ).indices.to_numpy(zero_copy_only=False)
        for name in CROSS_KEYS
    ]
    key, distinct = groups(dense_key(codes)) if n + learn.num_rows else (np.zeros(0, np.int64), 0)
    last = np.full(distinct, -1, np.int64)
    seen, first_from_end = np.unique(key[:n][::-1], return_index=True)
    last[seen] = n - 1 - first_from_end
    return last[key[n:]]


def _groups(keys: list[np.ndarray], where: np.ndarray) -> list[tuple[tuple[Any, ...], np.ndarray]]:
    """(key values, row positions) of each distinct key among the rows ``where`` holds, sorted by key; rows
    with a NaN in a key are in none."""
    ok = where & np.logical_and.reduce([k == k for k in keys])
    rows = np.flatnonzero(ok)
    if not len(rows):
        return []
    codes = [np.unique(k[rows], return_inverse=True) for k in keys]
    group, _ = groups(dense_key([inverse.reshape(-1) for _, inverse in codes]))  # groups in key order
    order = np.argsort(group, kind="stable")
    members = np.split(order, np.flatnonzero(np.diff(group[order])) + 1)
    return [(tuple(values[inverse[idx[0]]] for values, inverse in codes), rows[idx]) for idx in members]


def _max(v: np.ndarray) -> float:
    """Largest value, NaN left out (NaN where all are)."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmax(v))


def _mean(v: np.ndarray) -> float:
    """Mean in the values' own precision (float32 drifts: as the report has always given them), NaN left out
    (NaN where all are)."""
    v = v[~np.isnan(v)]
    return float(np.mean(v)) if len(v) else float("nan")


def _mean64(v: np.ndarray) -> float:
    """Mean in float64, NaN left out (NaN where all are)."""
    v = v[~np.isnan(v)]
    return float(np.mean(v, dtype=np.float64)) if len(v) else float("nan")


def last_minibatches(keys: list[np.ndarray], where: np.ndarray, rel_h: np.ndarray, rel_c: np.ndarray) -> list[dict]:
    """The staleness trend's entries (``staleness.by_iteration``'s fields, with ``minibatch`` for ``epoch``) from the
    learner's train rows paired with their rollout rows (``where``; ``keys``: module, layer, iteration and minibatch
    per pair): per module, layer and iteration, the rows of the iteration's last minibatch with a pair, their number
    and the mean relative drift of h and c. One entry per iteration: the check reads at most
    :data:`CROSS_ITERATIONS`, fewer than ``staleness_trend.POINTS``."""
    last: dict[tuple[Any, ...], tuple[int, np.ndarray]] = {}
    for (mod, layer, it, mb), g in _groups(keys, where):  # in key order: an iteration's last minibatch last
        last[(mod, layer, it)] = (int(mb), g)
    return [
        {
            "module": str(mod),
            "layer": int(layer),
            "iteration_first": int(it),
            "iteration_last": int(it),
            "iterations": 1,
            "epoch": None,
            "minibatch": mb,
            "rows": len(g),
            "drift_h_mean": _mean64(rel_h[g]),
            "drift_c_mean": _mean64(rel_c[g]),
        }
        for (mod, layer, it), (mb, g) in last.items()
    ]


def _numbers(table: pa.Table, name: str) -> np.ndarray:
    """A scalar column as float64, NaN where null."""
    return pc.fill_null(table.column(name).cast(pa.float64()), np.nan).to_numpy()


def _positions(table: pa.Table, keep: np.ndarray | None) -> np.ndarray:
    """Per row of ``table``: its row among those ``keep`` holds (all where None), else -1."""
    if keep is None:
        return np.arange(table.num_rows)
    out = np.full(table.num_rows, -1, np.int64)
    out[keep] = np.arange(int(keep.sum()))
    return out


def _past_rollout(roll: pa.Table, learn: pa.Table, rows: np.ndarray) -> np.ndarray:
    """Which of the learner ``rows`` lie past the last rollout env step of their worker (a null worker: the
    driver's); none of a worker that has no rollout row (its rows are unpaired: the join missed them)."""
    codes = pc.dictionary_encode(
        pa.concat_arrays([roll.column("worker").combine_chunks(), learn.column("worker").combine_chunks()]),
        null_encoding="encode",
    ).indices.to_numpy(zero_copy_only=False)
    n = roll.num_rows
    last = np.full(int(codes.max()) + 1 if len(codes) else 0, -np.inf)
    np.maximum.at(last, codes[:n], _numbers(roll, "env_step"))
    mine = last[codes[n:][rows]]
    return np.isfinite(mine) & (_numbers(learn, "env_step")[rows] > mine)  # a worker without rollout rows: none


def cross_process(
    data: ds.Dataset,
    vectors: bool,
    traced: int | None = None,
    last_iteration: int | None = None,
    trend: bool = False,
) -> CrossProcessSection:
    """Join learner rows to env-runner rollout rows of the same (module, layer, worker, env, env_step).
    Only logs of several processes (RLlib) have it; numpy and pyarrow, no pandas. ``vectors``: rows may hold
    h/c vectors (``schema.stores_vectors``); ``traced``: K where env columns 0..K-1 alone may (``--capture
    summary --trace-envs K``: their vectors are read apart, the other rows' would be decoded as nulls);
    ``last_iteration``: the log's last iteration, whose learner rows past the runner's last step are counted
    apart (their rollout row was never written: training stopped); ``trend``: the log declares
    ``cycling_minibatches``, and the section gives each iteration's last minibatch's drift (``by_iteration``)."""
    state = ["h", "c", "h_norm", "c_norm"] if vectors and traced is None else ["h_norm", "c_norm"]
    cols = [*CROSS_KEYS, "phase", "iteration", "minibatch", "t", "bootstrap", *state]
    base = ds.field("env_step").is_valid() & (ds.field("iteration") < CROSS_ITERATIONS)
    part = narrow(data, iteration=(0, CROSS_ITERATIONS - 1))  # the first iterations' row groups (statistics)
    roll, learn = base & (ds.field("phase") == "rollout"), base & ds.field("phase").isin(["train", "value"])
    roll_part, learn_part = budget.prune(part, roll), budget.prune(part, learn)  # their row groups (footer statistics)
    apart = vectors and traced is not None
    if apart:
        roll_v, learn_v = roll & (ds.field("env") < traced), learn & (ds.field("env") < traced)
        roll_vp, learn_vp = budget.prune(roll_part, roll_v), budget.prune(learn_part, learn_v)
    # chunks that start an episode must start from zeros: their t = -1 rows have no env_step
    fresh = (ds.field("t") == -1) & ds.field("env_step").is_null() & (ds.field("padding") == False)  # noqa: E712
    reads = [
        (roll_part, cols, roll, "the cross-process check's rollout rows"),
        (learn_part, cols, learn, "the cross-process check's learner rows"),
        (data, ["h_norm", "c_norm"], fresh, "the cross-process check's episode starts"),
    ]
    if apart:
        reads.append((roll_vp, ["h", "c"], roll_v, "the cross-process check's traced rollout vectors"))
        reads.append((learn_vp, ["h", "c"], learn_v, "the cross-process check's traced learner vectors"))
    # every table below is held until the section is computed: the reads checked together, before any
    budget.check_together(reads, "the cross-process check's reads (rollout and learner rows, their vectors)")
    roll_t, learn_t = budget.read(roll_part, cols, roll), budget.read(learn_part, cols, learn)
    held: Held | None = None
    if apart:
        # the same rows in the same order as the tables above where env < traced (both scans keep file order)
        sides = []
        for table, part_v, filt in ((learn_t, learn_vp, learn_v), (roll_t, roll_vp, roll_v)):
            keep = pc.fill_null(pc.less(table.column("env"), traced), False).to_numpy(zero_copy_only=False)
            sides.append((budget.read(part_v, ["h", "c"], filt), _positions(table, keep)))
        # a file whose row-group statistics misstate its envs gives the vector read other rows: norms, then
        if all(vec.num_rows == int((at >= 0).sum()) for vec, at in sides):
            held = (sides[0], sides[1])
    elif vectors:
        held = ((learn_t, _positions(learn_t, None)), (roll_t, _positions(roll_t, None)))
    partner = _join(roll_t, learn_t)
    paired = partner >= 0
    last = pc.fill_null(pc.equal(learn_t.column("bootstrap"), "last"), False).to_numpy()
    terminal = pc.fill_null(pc.equal(learn_t.column("bootstrap"), "terminal"), False).to_numpy()
    lone = np.flatnonzero(~paired & ~last)
    after = np.zeros(len(lone), bool)
    if last_iteration is not None and len(lone):
        at_end = terminal[lone] & (_numbers(learn_t, "iteration")[lone] == last_iteration)
        after[at_end] = _past_rollout(roll_t, learn_t, lone[at_end])
    unpaired, after_end = int((~after).sum()), int(after.sum())
    li, ri = np.flatnonzero(paired), partner[paired]
    abs_h, rel_h, l2 = _differences(learn_t, roll_t, "h", li, ri, held)
    abs_c, rel_c, _ = _differences(learn_t, roll_t, "c", li, ri, held)
    module = learn_t.column("module").to_numpy().astype(str)[li]
    phase = learn_t.column("phase").to_numpy().astype(str)[li]
    t = _numbers(learn_t, "t")[li]
    iteration, minibatch = _numbers(learn_t, "iteration")[li], _numbers(learn_t, "minibatch")[li]
    start = t == -1
    by_module = _groups([module], start)
    state_in = {str(k[0]): float(max(_max(abs_h[g]), _max(abs_c[g]))) for k, g in by_module}
    state_in_rel = {str(k[0]): float(max(_max(rel_h[g]), _max(rel_c[g]))) for k, g in by_module}
    state_in_ok = None if not start.any() else bool(max(state_in_rel.values()) <= STATE_IN_TOLERANCE)
    zeros = budget.read(data, ["h_norm", "c_norm"], fresh)  # checked with the others above
    norms = np.concatenate(
        [zeros.column(n).to_numpy(zero_copy_only=False).astype(np.float64) for n in ("h_norm", "c_norm")]
    )
    zero_ok = None if not zeros.num_rows else bool(np.nan_to_num(norms).max() == 0.0)
    steps = (t >= 0) & (iteration == _numbers(roll_t, "iteration")[ri])
    first = steps & ((phase == "value") | (minibatch == 0))
    first_pass = [
        {
            "module": str(mod),
            "iteration": int(it),
            "rows": len(g),
            "max_abs_h": _max(abs_h[g]),
            "max_drift_h": _max(rel_h[g]),
            "max_drift_c": _max(rel_c[g]),
            "l2_rows": int(l2[g].sum()),
        }
        for (mod, it), g in _groups([module, iteration], first)
    ]
    by_minibatch = [
        {
            "module": str(mod),
            "minibatch": int(mb),
            "rows": len(g),
            "drift_h_mean": _mean(rel_h[g]),
            "drift_h_max": _max(rel_h[g]),
            "drift_c_mean": _mean(rel_c[g]),
            "l2_rows": int(l2[g].sum()),
        }
        for (mod, mb), g in _groups([module, minibatch], steps & (phase == "train"))
    ]
    by_iteration = []
    if trend:
        keys = [module, _numbers(learn_t, "layer")[li], iteration, minibatch]
        by_iteration = last_minibatches(keys, steps & (phase == "train"), rel_h, rel_c)
    return CrossProcessSection(
        state_in_rows=int(start.sum()),
        state_in_max_abs=state_in,
        state_in_ok=state_in_ok,
        zero_starts=zeros.num_rows,
        zero_starts_ok=zero_ok,
        unpaired=unpaired,
        first_pass=first_pass,
        by_minibatch=by_minibatch,
        vectors=vectors,
        state_in_max_relative=state_in_rel,
        state_in_l2_rows=int(l2[start].sum()),
        by_iteration=by_iteration,
        after_end=after_end,
    )


def unsynced(x: CrossProcessSection | None) -> dict[str, dict[str, Any]]:
    """The modules the env runners ran with other weights than the learner (module -> ``drift``: the largest
    relative drift of its states before any optimizer step; ``never_synced``: exact in the first iteration alone,
    when both still had the initial weights): their first-pass drift is above the bound while another module's is
    within it and the chunks start from the env runners' states exactly (provenance checks out). Their drift from
    the rollout states is then the env runners' copy's, not stored states gone stale (the verdict)."""
    if x is None or not x.state_in_ok:
        return {}
    per_module: dict[str, list[dict[str, Any]]] = {}
    for row in x.first_pass:
        per_module.setdefault(row["module"], []).append(row)
    worst = {m: max(r["max_drift_h"] for r in rows) for m, rows in per_module.items()}
    if not any(w <= x.provenance_tolerance for w in worst.values()):
        return {}
    out = {}
    for m, rows in per_module.items():
        if worst[m] > x.provenance_tolerance:
            clean = [r["iteration"] for r in rows if r["max_drift_h"] <= x.provenance_tolerance]
            out[m] = {"drift": worst[m], "never_synced": clean == [min(r["iteration"] for r in rows)]}
    return out


class CrossProcess(Section[CrossProcessSection]):
    key = "cross_process"
    needs: ClassVar[str | None] = "shards"
    findings_rank: ClassVar[int] = 50

    def compute(self, log: Log, acc: Any) -> CrossProcessSection:
        # the vectors where both rows have them, their norms where not (_differences); a summary log's
        # --trace-envs K rows' vectors read apart (env < K), not its mostly null vector columns whole
        traced = traced_envs(log.meta.get("capture")) if log.summary else None
        last = log.iterations - 1 if log.iterations else None
        data = cross_process(log.data, log.vectors, traced, last, trend=log.caps.cycling_minibatches)
        data.provenance_tolerance = provenance_tolerance(log.meta)
        return data

    def to_json(self, data: CrossProcessSection) -> Any:
        out = super().to_json(data)
        out.pop("by_iteration", None)  # the staleness section's JSON holds the trend (summary: _trend_across)
        return out

    def warnings(self, data: CrossProcessSection, log: Log) -> list[str]:
        if data.state_in_ok is not False and data.zero_starts_ok is not False:
            return []
        return [
            "provenance check FAILED: learner chunks do not start from the env runners' stored states "
            f"(max |diff| {max(data.state_in_max_abs.values(), default=0.0):.3g}, relative "
            f"{max(data.state_in_max_relative.values(), default=0.0):.3g}); the row-to-timestep "
            "mapping of this log cannot be trusted"
        ]

    def unavailable(self, data: CrossProcessSection, log: Log) -> list[str]:
        if log.iterations <= CROSS_ITERATIONS:
            return []
        return [
            f"the cross-process check (RLlib) reads the first {CROSS_ITERATIONS} of {log.iterations} iterations, "
            "which bounds its memory; load() and pair() read any iteration"
        ]

    def findings(self, data: CrossProcessSection) -> list[str]:
        x = data
        out: list[str] = []
        if x.state_in_ok is not None:
            worst = max(x.state_in_max_abs.values(), default=0.0)
            rel = max(x.state_in_max_relative.values(), default=0.0)
            how = kinds(x.state_in_l2_rows, x.state_in_rows)
            out.append(
                f"RLlib oracle: {x.state_in_rows} learner chunks that continue an episode start from exactly the "
                f"state the env runner produced one step earlier (max |diff| {worst:.2g}, relative {rel:.2g}"
                f"{'; ' + how if how else ''}: "
                f"{'OK' if x.state_in_ok else 'FAILED'}); {x.zero_starts} chunks that start an episode start from "
                f"{'zeros' if x.zero_starts_ok else 'NON-ZERO states'}"
            )
        per_module: dict[str, list[dict[str, Any]]] = {}
        for row in x.first_pass:
            per_module.setdefault(row["module"], []).append(row)
        bound = x.provenance_tolerance
        exact = {m: max(r["max_drift_h"] for r in rows) <= bound for m, rows in per_module.items()}
        other = unsynced(x)
        for module, rows in per_module.items():
            worst = max(r["max_drift_h"] for r in rows)
            how = kinds(sum(r.get("l2_rows", r["rows"]) for r in rows), sum(r["rows"] for r in rows))
            if exact[module]:
                n = sum(r["rows"] for r in rows)
                out.append(
                    f"{module}: before the first optimizer step the learner recomputes the rollout states exactly "
                    f"(max relative drift {worst:.2g} over {n} rows{'; ' + how if how else ''})"
                    + (": equal norms, not proven equal vectors" if how.startswith("by norms only") else "")
                )
                continue
            msg = (
                f"{module}: the learner's states differ from the env runners' rollout states of the same weights "
                f"version already before the first optimizer step (max relative drift {worst:.2g}"
                f"{'; ' + how if how else ''})"
            )
            if module in other:
                msg += (
                    ", while provenance and stored states check out: the env runners ran this module with other "
                    "weights than the learner"
                )
                if other[module]["never_synced"]:
                    msg += (
                        f" (exact in iteration {min(r['iteration'] for r in rows)} only, when both still had the "
                        "initial weights: the env runners' copy is never synced; RLlib 2.60's inference-only "
                        "env-runner module keeps the critic at its initial weights, so every stored critic state a "
                        "chunk starts from comes from an untrained critic)"
                    )
            out.append(msg)
        if x.unpaired:
            out.append(
                f"{x.unpaired} learner rows found no rollout row of the same worker, env and env step (not 'last' "
                "bootstrap steps, not the last iteration's steps past the runner's end): the join of this log's "
                "processes misses rows"
            )
        return out

    def text(self, data: CrossProcessSection, caps: Capabilities) -> list[Block]:
        x = data
        verdict = {True: "[green]OK[/]", False: "[red]FAILED[/]", None: "-"}
        worst = max(x.state_in_max_abs.values(), default=0.0)
        rel = max(x.state_in_max_relative.values(), default=0.0)
        out: list[Block] = [
            Line(
                f"provenance check (RLlib, across processes): {x.state_in_rows:,} chunk initial states vs the env "
                f"runners' states one step earlier, largest difference relative to the runner's state {rel:.2g} "
                f"(allowed {STATE_IN_TOLERANCE:g}), max |diff| {worst:.2g} {verdict[x.state_in_ok]}; "
                f"{x.zero_starts:,} episode-start chunks from zeros {verdict[x.zero_starts_ok]}; "
                f"{x.unpaired:,} learner rows without a rollout partner"
                + (
                    f" ({x.after_end:,} more: 'terminal' bootstrap steps of the last iteration past the env runners' "
                    "last step, whose forward never ran as training stopped)"
                    if x.after_end
                    else ""
                ),
                soft_wrap=True,
            ),
            Table(
                "Staleness (RLlib): relative L2 drift ||learner - rollout|| / ||rollout|| of learner states from "
                "the rollout states of the same env step, by minibatch (all layers)",
                ("module", "minibatch", "rows", "h mean", "h max", "c mean"),
                tuple(
                    (
                        safe(row["module"]),
                        str(row["minibatch"]),
                        f"{row['rows']:,}",
                        fmt(row["drift_h_mean"]),
                        fmt(row["drift_h_max"]),
                        fmt(row["drift_c_mean"]),
                    )
                    for row in x.by_minibatch[:SHOWN_MINIBATCHES]
                ),
            ),
        ]
        rows, l2 = sum(r["rows"] for r in x.by_minibatch), sum(r.get("l2_rows", r["rows"]) for r in x.by_minibatch)
        how = kinds(l2, rows)
        if how:
            out.append(Line(f"the staleness table's drifts: {how}", soft_wrap=True))
        for module in dict.fromkeys(r["module"] for r in x.first_pass):
            rows = [r for r in x.first_pass if r["module"] == module]
            shown = ", ".join(f"{r['iteration']}: {fmt(r['max_drift_h'])}" for r in rows[:SHOWN_ITERATIONS])
            out.append(
                Line(
                    f"max h drift of {safe(module)} before the first optimizer step, by iteration: {shown}",
                    soft_wrap=True,
                )
            )
        layered = any(r["layer"] for r in x.by_iteration)
        trend = staleness_trend.spans(x.by_iteration)
        out.extend(Line(words, soft_wrap=True) for words in staleness_trend.lines(trend, layered))
        return out
