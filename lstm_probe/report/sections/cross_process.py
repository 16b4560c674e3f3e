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
from lstm_probe.log.schema import relative_l2
from lstm_probe.report.numeric import dense_key, groups
from lstm_probe.report.section import Block, Line, Log, Section, Table, fmt
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
    """Learner rows (not padding, not a 'last' bootstrap step) without a rollout partner."""
    first_pass: list[dict[str, Any]]
    """Per module and iteration: the value pass and minibatch 0 (before any optimizer step) vs the rollout
    states of the same weights version."""
    by_minibatch: list[dict[str, Any]]
    vectors: bool
    state_in_max_relative: dict[str, float] = field(default_factory=dict)
    """Per module: the largest relative L2 difference of h and c between a chunk's initial state and the runner's."""
    provenance_tolerance: float = PROVENANCE_TOLERANCE
    """The bound on ``first_pass``' drift (``staleness.provenance_tolerance``: looser where cuDNN ran in TF32)."""


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


def _differences(
    learn: pa.Table, roll: pa.Table, which: str, li: np.ndarray, ri: np.ndarray, vectors: bool
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_compare` of each learner row ``li`` with its rollout row ``ri``: their ``which`` vectors where
    ``vectors`` and both rows hold one, else their norms (a weaker check: equal states have equal norms). A
    summary row has no vector (a summary log's, ``--trace-envs K``'s other envs', ``--every K``'s other
    iterations'): read as zeros, it would agree with anything."""
    norm = f"{which}_norm"
    out = _compare(*(t.column(norm).to_numpy().astype(np.float32)[i, None] for t, i in ((learn, li), (roll, ri))))
    if vectors:
        both = np.flatnonzero(
            learn.column(which).is_valid().to_numpy(zero_copy_only=False)[li]
            & roll.column(which).is_valid().to_numpy(zero_copy_only=False)[ri]
        )
        largest, relative = _compare(_vectors(learn, which)[li[both]], _vectors(roll, which)[ri[both]])
        out[0][both], out[1][both] = largest, relative
    return out


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


def _numbers(table: pa.Table, name: str) -> np.ndarray:
    """A scalar column as float64, NaN where null."""
    return pc.fill_null(table.column(name).cast(pa.float64()), np.nan).to_numpy()


def cross_process(data: ds.Dataset, vectors: bool) -> CrossProcessSection:
    """Join learner rows to env-runner rollout rows of the same (module, layer, worker, env, env_step).
    Only logs of several processes (RLlib) have it; numpy and pyarrow, no pandas."""
    state = ["h", "c", "h_norm", "c_norm"] if vectors else ["h_norm", "c_norm"]
    cols = [*CROSS_KEYS, "phase", "iteration", "minibatch", "t", "bootstrap", *state]
    base = ds.field("env_step").is_valid() & (ds.field("iteration") < CROSS_ITERATIONS)
    part = narrow(data, iteration=(0, CROSS_ITERATIONS - 1))  # the first iterations' row groups (statistics)
    roll, learn = base & (ds.field("phase") == "rollout"), base & ds.field("phase").isin(["train", "value"])
    roll_part, learn_part = budget.prune(part, roll), budget.prune(part, learn)  # their row groups (footer statistics)
    budget.check_filtered(roll_part, cols, roll, "the cross-process check's rollout rows")  # both, before either
    budget.check_filtered(learn_part, cols, learn, "the cross-process check's learner rows")
    roll_t, learn_t = budget.read(roll_part, cols, roll), budget.read(learn_part, cols, learn)
    partner = _join(roll_t, learn_t)
    paired = partner >= 0
    last = pc.fill_null(pc.equal(learn_t.column("bootstrap"), "last"), False).to_numpy()
    unpaired = int((~paired & ~last).sum())
    li, ri = np.flatnonzero(paired), partner[paired]
    abs_h, rel_h = _differences(learn_t, roll_t, "h", li, ri, vectors)
    abs_c, rel_c = _differences(learn_t, roll_t, "c", li, ri, vectors)
    # the paired learner rows' columns, in learner row order
    module = learn_t.column("module").to_numpy().astype(str)[li]
    phase = learn_t.column("phase").to_numpy().astype(str)[li]
    t = _numbers(learn_t, "t")[li]
    iteration, minibatch = _numbers(learn_t, "iteration")[li], _numbers(learn_t, "minibatch")[li]
    start = t == -1
    by_module = _groups([module], start)
    state_in = {str(k[0]): float(max(_max(abs_h[g]), _max(abs_c[g]))) for k, g in by_module}
    state_in_rel = {str(k[0]): float(max(_max(rel_h[g]), _max(rel_c[g]))) for k, g in by_module}
    state_in_ok = None if not start.any() else bool(max(state_in_rel.values()) <= STATE_IN_TOLERANCE)
    # chunks that start an episode must start from zeros: their t = -1 rows have no env_step
    fresh = (ds.field("t") == -1) & ds.field("env_step").is_null() & (ds.field("padding") == False)  # noqa: E712
    zeros = budget.table(data, ["h_norm", "c_norm"], fresh, "the cross-process check's episode starts")
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
        }
        for (mod, mb), g in _groups([module, minibatch], steps & (phase == "train"))
    ]
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
    )


class CrossProcess(Section[CrossProcessSection]):
    key = "cross_process"
    needs: ClassVar[str | None] = "shards"
    findings_rank: ClassVar[int] = 50

    def compute(self, log: Log, acc: Any) -> CrossProcessSection:
        # the vectors where a row has them, its norms where not (_differences); a summary log's norms alone
        # (its mostly null vector columns would be decoded whole to find its --trace-envs rows' vectors)
        data = cross_process(log.data, not log.summary)
        data.provenance_tolerance = provenance_tolerance(log.meta)
        return data

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
            out.append(
                f"RLlib oracle: {x.state_in_rows} learner chunks that continue an episode start from exactly the "
                f"state the env runner produced one step earlier (max |diff| {worst:.2g}, relative {rel:.2g}: "
                f"{'OK' if x.state_in_ok else 'FAILED'}); {x.zero_starts} chunks that start an episode start from "
                f"{'zeros' if x.zero_starts_ok else 'NON-ZERO states'}"
            )
        per_module: dict[str, list[dict[str, Any]]] = {}
        for row in x.first_pass:
            per_module.setdefault(row["module"], []).append(row)
        bound = x.provenance_tolerance
        exact = {m: max(r["max_drift_h"] for r in rows) <= bound for m, rows in per_module.items()}
        for module, rows in per_module.items():
            worst = max(r["max_drift_h"] for r in rows)
            if exact[module]:
                out.append(
                    f"{module}: before the first optimizer step the learner recomputes the rollout states exactly "
                    f"(max relative drift {worst:.2g} over {sum(r['rows'] for r in rows)} rows)"
                )
                continue
            clean = [r["iteration"] for r in rows if r["max_drift_h"] <= bound]
            msg = (
                f"{module}: the learner's states differ from the env runners' rollout states of the same weights "
                f"version already before the first optimizer step (max relative drift {worst:.2g})"
            )
            if any(exact.values()) and x.state_in_ok:
                msg += (
                    ", while provenance and stored states check out: the env runners ran this module with other "
                    "weights than the learner"
                )
                if clean == [min(r["iteration"] for r in rows)]:
                    msg += (
                        f" (exact in iteration {clean[0]} only, when both still had the initial weights: the env "
                        "runners' copy is never synced; RLlib 2.60's inference-only env-runner module keeps the "
                        "critic at its initial weights, so every stored critic state a chunk starts from comes "
                        "from an untrained critic)"
                    )
            out.append(msg)
        if x.unpaired:
            out.append(f"{x.unpaired} learner rows found no rollout row of the same worker, env and env step")
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
                f"{x.unpaired:,} learner rows without a rollout partner",
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
        for module in dict.fromkeys(r["module"] for r in x.first_pass):
            rows = [r for r in x.first_pass if r["module"] == module]
            shown = ", ".join(f"{r['iteration']}: {fmt(r['max_drift_h'])}" for r in rows[:SHOWN_ITERATIONS])
            out.append(
                Line(
                    f"max h drift of {safe(module)} before the first optimizer step, by iteration: {shown}",
                    soft_wrap=True,
                )
            )
        return out
