"""``summarize(path) -> Report``: what the LSTMs did and what is wrong with them, from a log's own rows.

Never prints. Reads only the columns a section needs, in bounded memory: the scalar columns in runs of
whole iterations (:data:`REPORT_CHUNK_ROWS` rows at most, every section added up over the runs), the h/c
vectors batch by batch and only for the state-health section. Works on torch-free machines.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from lstm_probe.reader import LogInfo, dataset
from lstm_probe.schema import relative_l2

PROVENANCE_TOLERANCE = 1e-4
"""Relative drift above this in the first minibatch of epoch 0 means a provenance bug."""
SATURATION = 0.95
DEAD = 1e-3


@dataclass
class RunSection:
    """Section 1: the run."""

    env_id: str | None
    algorithm: str | None
    policy: str | None
    framework: str | None
    n_envs: int | None
    seed: Any
    hyperparameters: dict[str, Any]
    versions: dict[str, str]
    steps_asked: int | None
    steps_done: int | None
    iterations: int
    completed: bool
    stop_reason: str | None
    file_bytes: int
    files: int
    rows: int
    wall_seconds: float | None
    capture: dict[str, Any]
    command: str | None
    probe_cost: dict[str, Any] | None = None
    """What recording cost while the run went (absent in older logs): ``calls``,
    ``hook_seconds`` and ``integration_seconds`` on the training thread, ``writer_cpu_seconds`` of
    the writer (process or thread), ``wait_seconds`` training waited for the writer; summed over processes."""


@dataclass
class ArchitectureSection:
    """Section 2: the recurrent modules and what actor and critic share."""

    modules: dict[str, dict[str, Any]]
    gradient_flow: dict[str, str]
    """Parameter tensor -> the losses that train it ('policy' | 'value' | 'both' | ...), when recorded."""
    hidden_size: int | None
    shared_lstm: bool | None
    critic: str | None
    verdict: str


@dataclass
class CallGroup:
    module: str
    phase: str
    path: str
    calls: int
    rows: int
    shapes: dict[str, int]
    """'T x N' (steps x batch) -> number of calls."""


@dataclass
class CallsSection:
    """Section 3: calls per module and phase, and why training batches have the shape they have."""

    groups: list[CallGroup]
    sequences_per_minibatch: dict[int, int]
    """Number of sequences in a train minibatch -> how many minibatches had that many."""
    sequence_start_reasons: dict[str, int]
    minibatches: int
    minibatches_by_path: dict[str, int]
    explanation: str


@dataclass
class SequencesSection:
    """Section 4: training sequence lengths (the truncated-BPTT horizon) and episode lengths."""

    sequences: int
    length: dict[str, float]
    length_histogram: dict[str, int]
    episode_length: dict[str, float]
    episodes_completed: int
    padding_share: float
    stored_state_share: float
    """Share of sequences that start from a stored mid-episode state rather than a reset."""


@dataclass
class StalenessSection:
    """Section 5: train-time recomputed states vs the rollout states of the same env timestep."""

    provenance_check_rows: int
    provenance_max_drift_h: float | None
    provenance_max_drift_c: float | None
    provenance_ok: bool | None
    by_epoch: list[dict[str, Any]]
    by_update: list[dict[str, Any]]
    by_position: list[dict[str, Any]]


@dataclass
class CrossProcessSection:
    """RLlib logs: the learners' states checked against the env runners' rollout states (joined by
    worker, env and env step across the processes' part files)."""

    state_in_rows: int
    """Chunks that continue an episode: their initial state (rows with t = -1) paired with the rollout row."""
    state_in_max_abs: dict[str, float]
    state_in_ok: bool | None
    zero_starts: int
    zero_starts_ok: bool | None
    unpaired: int
    """Learner rows (not padding, not a 'last' bootstrap step) without a rollout partner."""
    first_pass: list[dict[str, Any]]
    """Per module and iteration: the value pass and minibatch 0 (before any optimizer step) vs the rollout
    states of the same weights version."""
    by_minibatch: list[dict[str, Any]]
    vectors: bool


@dataclass
class HealthSection:
    """Section 6: state health per module and layer (rollout states)."""

    layers: list[dict[str, Any]]
    norms_by_iteration: list[dict[str, Any]]
    vectors_available: bool


@dataclass
class Report:
    """Everything ``lstm-probe report`` shows; ``--json`` prints ``dataclasses.asdict`` of it."""

    path: str
    schema_version: int
    warnings: list[str]
    run: RunSection
    architecture: ArchitectureSection
    calls: CallsSection
    sequences: SequencesSection
    staleness: StalenessSection
    health: HealthSection
    findings: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    cross_process: CrossProcessSection | None = None

    def to_dict(self) -> dict[str, Any]:
        return _clean(dataclasses.asdict(self))


def _clean(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating | float):
        f = float(v)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def _stats(values: pd.Series | np.ndarray) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return {}
    return {
        "count": float(arr.size),
        "min": float(arr.min()),
        "median": float(np.median(arr)),
        "mean": float(arr.mean()),
        "p90": float(np.quantile(arr, 0.9)),
        "max": float(arr.max()),
    }


SCAN_BATCH = 1 << 18
"""Rows per batch while the scalar columns are read."""
SMALL_INTS = ("iteration", "epoch", "minibatch", "seq", "seq_len", "env", "episode", "episode_step")


def read_scalars(
    data: ds.Dataset, columns: list[str], filt: ds.Expression | None, rows: int | None = None
) -> tuple[pd.DataFrame, int]:
    """The scalar columns in compact pandas form, read batch by batch into preallocated arrays: nullable
    small counters as float32 (NaN = null; exact below 2**24), strings as categoricals. Train rows (the
    bulk of a log) are packed at the end, so that ``frame.iloc[front:]`` is the train rows without a
    copy. Peak memory is about the result plus one batch, whatever the size of the log. ``rows``: the
    number of rows the filter selects, when known (a scan fewer)."""
    n = data.count_rows(filter=filt) if rows is None else rows
    out: dict[str, np.ndarray] = {}
    vocab: dict[str, dict[str, int]] = {}
    for name in columns:
        typ = data.schema.field(name).type
        if name in SMALL_INTS or pa.types.is_floating(typ):
            out[name] = np.empty(n, np.float32)
        elif pa.types.is_string(typ):
            out[name] = np.empty(n, np.int8)  # categorical codes: a handful of words (widened if not)
            vocab[name] = {}
        elif pa.types.is_boolean(typ):
            out[name] = np.empty(n, np.bool_)
        elif pa.types.is_integer(typ) and data.schema.field(name).nullable:
            out[name] = np.empty(n, np.float64)  # a nullable counter too large for float32: NaN = null
        else:
            out[name] = np.empty(n, typ.to_pandas_dtype())
    front, back = 0, n  # other rows fill from the front, train rows from the back
    scanner = data.scanner(columns=columns, filter=filt, batch_size=SCAN_BATCH, batch_readahead=2, fragment_readahead=1)
    for batch in scanner.to_batches():
        is_train = pc.equal(batch.column("phase"), "train").fill_null(False).to_numpy(zero_copy_only=False)
        k_train = int(is_train.sum())
        k_other = batch.num_rows - k_train
        for name in columns:
            arr = batch.column(name)
            if name in vocab:
                enc = arr.dictionary_encode()
                words = vocab[name]
                remap = np.array(
                    [words.setdefault(w, len(words)) if w is not None else -1 for w in enc.dictionary.to_pylist()]
                    + [-1],
                    np.int32,
                )
                values = remap[enc.indices.fill_null(len(remap) - 1).to_numpy(zero_copy_only=False)]
                if len(words) > np.iinfo(out[name].dtype).max:
                    out[name] = out[name].astype(np.int32)
            elif out[name].dtype.kind == "f":
                target = pa.float32() if out[name].dtype == np.float32 else pa.float64()
                values = arr.cast(target).fill_null(np.nan).to_numpy(zero_copy_only=False)
            else:
                values = arr.to_numpy(zero_copy_only=False)
            out[name][front : front + k_other] = values[~is_train]
            out[name][back - k_train : back] = values[is_train]
        front += k_other
        back -= k_train
    assert front == back, "row count changed while reading"
    frame: dict[str, Any] = {}
    for name in columns:
        col = out[name]
        if name in vocab:
            frame[name] = pd.Categorical.from_codes(col, dtype=pd.CategoricalDtype(list(vocab[name]) or ["-"]))
        else:
            frame[name] = col
    return pd.DataFrame(frame, copy=False), front


REPORT_CHUNK_ROWS = 4_000_000
"""First-layer rows the report reads at once. A larger log is read in runs of whole iterations of up to this
many rows (~110 bytes a row at the peak), so the report's memory is bounded by this, not by the log's size
(an iteration larger than this is read whole). Every section adds up over the runs."""


def summarize(path: str | os.PathLike[str], *, chunk_rows: int = REPORT_CHUNK_ROWS) -> Report:
    """Read a log (file, dataset directory or a killed run's parts) and compute every report section.
    ``chunk_rows``: see :data:`REPORT_CHUNK_ROWS` (the result does not depend on it)."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be at least 1, got {chunk_rows}")
    data, info = dataset(path)
    meta = info.metadata
    warnings = list(info.warnings)
    unavailable: list[str] = []
    capture = meta.get("capture") or {}
    if capture.get("mode") == "summary":
        unavailable.append(
            "state health per unit (dead/constant units, saturation): the log was written "
            "with --capture summary, which stores no h/c vectors"
        )
    cols = [
        "call",
        "module",
        "layer",
        "phase",
        "path",
        "iteration",
        "epoch",
        "minibatch",
        "seq",
        "t",
        "seq_len",
        "seq_reason",
        "padding",
        "env",
        "episode",
        "episode_step",
        "drift_h",
        "drift_c",
        "bootstrap",
    ]
    if "worker" in data.schema.names:
        cols.append("worker")
    # initial-state rows (t = -1, RLlib learners) are read by the cross-process check only
    totals = _Totals()
    for filt, rows in _chunks(data, (ds.field("layer") == 0) & (ds.field("t") >= 0), chunk_rows):
        first_layer, front = read_scalars(data, cols, filt, rows)
        if "worker" not in first_layer:
            first_layer["worker"] = np.float32(np.nan)
        totals.add(first_layer, front)
        del first_layer
    if totals.duplicates:
        warnings.append(
            f"{totals.duplicates} duplicate rows (the same call, module, layer, column and step twice): was a "
            "part file copied or read twice? Sections count them twice"
        )
    run = _run_section(info, totals.iterations)
    arch = _arch_section(meta)
    calls = totals.calls_section()
    seqs = totals.sequences_section()
    stale = totals.staleness_section()
    health = _health_section(data, capture.get("mode") != "summary" and info.rows > 0)
    cross = _cross_process_section(data, capture.get("mode") != "summary") if meta.get("framework") == "rllib" else None
    if cross is not None and run.iterations > CROSS_ITERATIONS:
        unavailable.append(
            f"the cross-process check (RLlib) reads the first {CROSS_ITERATIONS} of {run.iterations} iterations, "
            "which bounds its memory; load() and pair() read any iteration"
        )
    if cross is not None and (cross.state_in_ok is False or cross.zero_starts_ok is False):
        warnings.append(
            "provenance check FAILED: learner chunks do not start from the env runners' stored states "
            f"(max |diff| {max(cross.state_in_max_abs.values(), default=0.0):.3g}); the row-to-timestep "
            "mapping of this log cannot be trusted"
        )
    if info.rows == 0:
        warnings.append("the log holds no rows: training made no LSTM call before it stopped")
    if stale.provenance_ok is False:
        warnings.append(
            f"provenance check FAILED: train states before the first optimizer step differ from "
            f"the rollout states (max relative drift {stale.provenance_max_drift_h:.3g}); "
            "the row-to-timestep mapping of this log cannot be trusted"
        )
    report = Report(
        path=str(info.path),
        schema_version=int(meta.get("schema_version", 0)),
        warnings=warnings,
        run=run,
        architecture=arch,
        calls=calls,
        sequences=seqs,
        staleness=stale,
        health=health,
        unavailable=unavailable,
        cross_process=cross,
    )
    report.findings = _findings(report)
    return report


def _duplicates(df: pd.DataFrame) -> int:
    """Rows that repeat another's (call, batch column, step): rows are identifiable so only where env or
    seq names the column (a call is one module; layer 0 here). One sort of one int64 key per row."""
    seq, env = df["seq"].to_numpy(), df["env"].to_numpy()
    col = np.where(np.isnan(seq), env, seq)
    tagged = _present(col)
    columns = [c[tagged] for c in (df["call"].to_numpy(), col, df["t"].to_numpy())]
    del seq, env, col
    key = _key(columns)
    if key is None:  # call ids far apart (processes' id blocks): three keys, sorted together
        order = np.lexsort(columns[::-1])
        same = np.ones(len(order) - 1 if len(order) else 0, bool)
        for c in columns:
            same &= np.diff(c[order]) == 0
        return int(same.sum())
    del columns
    key.sort()
    return int((key[1:] == key[:-1]).sum())


def _run_section(info: LogInfo, iterations: int) -> RunSection:
    meta = info.metadata
    wall = None
    try:
        start, end = pd.Timestamp(meta["start_time"]), pd.Timestamp(meta["end_time"])
        wall = float((end - start).total_seconds())
    except (KeyError, ValueError, TypeError):
        pass
    progress = meta.get("progress") or {}
    steps_done = meta.get("progress_num_timesteps", progress.get("num_timesteps"))
    return RunSection(
        env_id=meta.get("env_id"),
        algorithm=meta.get("algorithm"),
        policy=meta.get("policy"),
        framework=meta.get("framework"),
        n_envs=meta.get("n_envs"),
        seed=meta.get("seed"),
        hyperparameters=meta.get("hyperparameters") or {},
        versions=meta.get("versions") or {},
        steps_asked=meta.get("total_timesteps"),
        steps_done=steps_done,
        iterations=iterations,
        completed=bool(meta.get("completed")),
        stop_reason=meta.get("stop_reason"),
        file_bytes=info.bytes,
        files=len(info.files),
        rows=info.rows,
        wall_seconds=wall,
        capture=meta.get("capture") or {},
        command=meta.get("command"),
        probe_cost=meta.get("probe_cost"),
    )


def _arch_section(meta: dict[str, Any]) -> ArchitectureSection:
    arch = meta.get("architecture") or {}
    modules = arch.get("modules") or {}
    shared, critic = arch.get("shared_lstm"), arch.get("critic")
    if critic == "lstm":
        verdict = "actor and critic have separate LSTMs (lstm_actor, lstm_critic); neither reads the other's state"
    elif critic == "shared":
        verdict = (
            "actor and critic share one LSTM (shared_lstm): the critic reads the actor's LSTM output "
            "detached, so only the policy loss trains the LSTM"
        )
    elif critic == "mlp":
        verdict = "only the actor has an LSTM; the critic is feed-forward (enable_critic_lstm=False)"
    else:
        verdict = f"traced modules: {', '.join(modules) or 'none'}"
    flow = arch.get("gradient_flow") or {}
    if flow.get("verdict"):
        verdict = f"{flow['verdict'].rstrip('.')} (gradient flow measured on {flow.get('batch', 'one minibatch')})"
    elif arch.get("share_features_extractor") is not None:
        verdict += (
            "; the features extractor is shared"
            if arch["share_features_extractor"]
            else "; actor and critic have their own features extractors"
        )
    return ArchitectureSection(
        modules=modules,
        gradient_flow=flow.get("gradient_flow") or {},
        hidden_size=meta.get("hidden_size"),
        shared_lstm=shared,
        critic=critic,
        verdict=verdict,
    )


def _present(values: np.ndarray) -> Any:
    """An index of the values that are not NaN: every row (a slice, no copy) when none is."""
    if values.dtype.kind != "f":
        return slice(None)
    missing = np.isnan(values)
    return ~missing if missing.any() else slice(None)


KEY_CHUNK = 1 << 20
"""Rows per slice while keys are built: temporaries stay a few MB whatever the log's size."""


def _key(columns: list[np.ndarray]) -> np.ndarray | None:
    """One int64 per row that orders as the tuple of ``columns`` (integers, or floats with NaN as null,
    which sorts last), or None when the values do not fit one int64. Keys of small counters are dense:
    their range is about the number of distinct tuples (see :func:`_groups`)."""
    n = len(columns[0])
    parts = []  # (column, lowest value, null code or None, width)
    room = 1
    for col in columns:
        nulls = np.isnan(col) if col.dtype.kind == "f" else np.zeros(0, bool)
        nullable = bool(nulls.any())
        named = n > 0 and not (nullable and bool(nulls.all()))
        del nulls
        lo = int(np.nanmin(col)) if named else 0
        hi = int(np.nanmax(col)) if named else 0
        width = hi - lo + (2 if nullable else 1)  # the values, and one more for null
        room *= width
        if room >= 1 << 62:
            return None
        parts.append((col, lo, hi + 1 if nullable else None, width))
    key = np.zeros(n, np.int64)
    for start in range(0, n, KEY_CHUNK):
        k = key[start : start + KEY_CHUNK]
        for col, lo, null, width in parts:
            v = col[start : start + KEY_CHUNK]
            if null is not None:
                v = np.where(np.isnan(v), null, v)
            k *= width
            # integers before adding: int64 + float would be computed in float64, exact only below 2**53
            k += v.astype(np.int64) if v.dtype.kind == "f" else v
            k -= lo
    return key


def _groups(key: np.ndarray) -> tuple[np.ndarray, int]:
    """The group number of each row (groups in key order) and the number of groups."""
    top = int(key.max()) + 1 if len(key) else 0
    if top <= 4 * len(key) + (1 << 16):  # dense keys: counted in place of a sort
        rank = np.cumsum(np.bincount(key, minlength=top) > 0) - 1
        if top and rank[-1] < 1 << 31:
            rank = rank.astype(np.int32)
        return rank[key], int(rank[-1]) + 1 if top else 0
    uniq, inv = np.unique(key, return_inverse=True)
    return inv, len(uniq)


def _minibatches(
    train: pd.DataFrame, sel: np.ndarray, starts: np.ndarray
) -> tuple[dict[int, int], dict[str, int], dict[str, int], int]:
    """Sequences per minibatch (as counts of minibatches), why sequences start (``starts``: the sequences'
    first rows, :func:`_sequence_starts`), the path of each minibatch's first call, and the number of
    minibatches: from the train rows ``sel`` selects (one module's)."""
    if not sel.any():
        return {}, {}, {}, 0
    it, ep, mb, seq = (train[c].to_numpy()[sel] for c in ("iteration", "epoch", "minibatch", "seq"))
    mb_key = _key([it, ep, mb])
    pair = _key([mb_key, seq]) if mb_key is not None else None
    if mb_key is None or pair is None:  # keys too large for one int64 (hand-made tags): pandas' grouping
        t0 = train.loc[sel, ["iteration", "epoch", "minibatch", "seq", "t", "path", "seq_reason"]]
        groups = t0.groupby(["iteration", "epoch", "minibatch"], observed=True, dropna=False)
        per_mb: Any = groups["seq"].nunique()
        spm = {int(k): int(v) for k, v in per_mb.value_counts().sort_index().items()}
        by_path = {str(k): int(v) for k, v in groups["path"].first().value_counts().items()}
        reasons = {str(k): int(v) for k, v in train["seq_reason"].iloc[starts].value_counts().items() if v}
        return spm, reasons, by_path, len(per_mb)
    del it, ep, mb
    # Integer keys instead of pandas' grouping of float columns (several copies of them). The rows of
    # one sequence of one minibatch come together (a call's rows are ordered column, then step), so only
    # the first row of each run of equal (minibatch, seq) keys is looked at.
    runs = np.flatnonzero(np.r_[True, pair[1:] != pair[:-1]])
    run_pair, run_mb, named = pair[runs], mb_key[runs], ~np.isnan(seq[runs])
    del pair, mb_key
    # the minibatches in (iteration, epoch, minibatch) order; the first run of each starts at its first row
    mbs, first_run = np.unique(run_mb, return_index=True)
    first = runs[first_run]
    _, pair_first = np.unique(run_pair[named], return_index=True)  # distinct (minibatch, seq) with a seq
    owner = np.searchsorted(mbs, run_mb[named][pair_first])
    counts = np.bincount(owner, minlength=len(mbs))  # nunique of seq; 0 where no row names one
    del runs, run_pair, run_mb, named, pair_first, owner
    values, n = np.unique(counts, return_counts=True)
    spm = {int(k): int(v) for k, v in zip(values, n, strict=True)}
    firsts = train["path"].iloc[np.flatnonzero(sel)[first]]
    by_path = {str(k): int(v) for k, v in firsts.value_counts().items()}
    reasons = {str(k): int(v) for k, v in train["seq_reason"].iloc[starts].value_counts().items() if v}
    return spm, reasons, by_path, len(mbs)


def _sequence_starts(train: pd.DataFrame, sel: np.ndarray) -> np.ndarray:
    """Positions in ``train`` of the sequences' first rows: for the rows ``sel`` selects (one module's), the
    first t == 0 row of each (iteration, epoch, minibatch, seq), nulls alike (a small subset: no copy)."""
    pos = np.flatnonzero(sel & (train["t"].to_numpy() == 0))
    keys = pd.DataFrame({c: train[c].to_numpy()[pos] for c in ("iteration", "epoch", "minibatch", "seq")})
    return pos[~keys.duplicated().to_numpy()]


def _per_call(df: pd.DataFrame) -> pd.DataFrame:
    """One row per call of ``df``: module, phase, path, rows, first and last step (t0, t1)."""
    call = df["call"].to_numpy()
    empty = pd.DataFrame({"module": [], "phase": [], "path": [], "rows": [], "t0": [], "t1": []})
    if not len(call) or (call.dtype.kind == "f" and np.isnan(call).all()):
        return empty
    lo, hi = int(np.nanmin(call)), int(np.nanmax(call))
    if hi - lo >= 4 * len(call) + (1 << 16):  # sparse ids (processes' id blocks far apart): number them
        call, lo = pd.factorize(call, use_na_sentinel=True)[0], 0  # null: -1
        hi = int(call.max())
    span = hi - lo + 1
    t = df["t"].to_numpy()
    rows = np.zeros(span, np.int64)
    t0 = np.full(span, np.iinfo(t.dtype).max, t.dtype)
    t1 = np.full(span, np.iinfo(t.dtype).min, t.dtype)
    codes = {name: df[name].cat.codes.to_numpy() for name in ("module", "phase", "path")}
    labels = {name: np.empty(span, c.dtype) for name, c in codes.items()}
    for start in range(0, len(call), KEY_CHUNK):  # slices: the ids' int64 copy stays small
        part = slice(start, start + KEY_CHUNK)
        c = call[part]
        ok: Any = ~np.isnan(c) if c.dtype.kind == "f" else c >= lo
        if ok.all():
            ok = slice(None)
        idx = c[ok].astype(np.int64) - lo
        np.add.at(rows, idx, 1)
        np.minimum.at(t0, idx, t[part][ok])
        np.maximum.at(t1, idx, t[part][ok])
        for name, c_codes in codes.items():
            labels[name][idx] = c_codes[part][ok]  # the same for every row of a call
    present = np.flatnonzero(rows)
    out: dict[str, Any] = {}
    for name, label in labels.items():
        cat = pd.Categorical.from_codes(label[present], dtype=cast(pd.CategoricalDtype, df[name].dtype))
        out[name] = cat.reorder_categories(sorted(cat.categories))  # groups below come in name order
    out.update(rows=rows[present], t0=t0[present], t1=t1[present])
    return pd.DataFrame(out)


def _explain(batch: int, rllib: bool, spm: dict[int, int], reasons: dict[str, int], by_path: dict[str, int]) -> str:
    """Why training batches have the shape they have. ``batch``: the largest rollout call's batch."""
    if not spm:
        return "No training calls were recorded."
    if rllib:
        words = {
            "episode_start": "an episode start (initial zeros)",
            "env_boundary": "the start of an env runner's rollout fragment (the state stored at the end of the "
            "previous fragment)",
            "max_seq_len": "max_seq_len (the previous piece of the episode chunk was full; the state stored at "
            "the step before)",
        }
        parts = [f"{words.get(k, k)}: {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])]
        return (
            f"Rollout calls have batch {batch} (one column per env of one env runner, one step each). The learner "
            "cuts each episode chunk (plus one appended bootstrap step) into max_seq_len pieces, zero-padded on the "
            "right; its minibatches slice whole pieces and cycle through the batch across epoch boundaries, so a "
            f"training call's batch is the number of pieces in its minibatch: here {min(spm)} to {max(spm)}. "
            f"Pieces start at: {'; '.join(parts)}. The value pass runs once per update over every piece."
        )
    words = {
        "split": "the rollout buffer's random split point (its shuffling trick: each epoch the flat "
        "buffer is rotated at a random index, so the first minibatch starts mid-sequence)",
        "episode_start": "an episode start",
        "env_boundary": "an env boundary (the buffer is flattened env by env; step 0 of each env starts anew)",
        "minibatch_cut": "a minibatch cut (the previous minibatch ended there)",
    }
    parts = [f"{words.get(k, k)}: {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])]
    lo, hi = min(spm), max(spm)
    text = (
        f"Rollout calls have batch {batch} (one column per env, one step each). A training call's batch is the "
        f"number of sequences in its minibatch, not the number of envs: here {lo} to {hi} sequences per "
        f"minibatch. A new sequence starts at every episode start, every env boundary and at the start of "
        f"each minibatch; sequence starts by reason: {'; '.join(parts)}."
    )
    if by_path:
        stepwise, total = by_path.get("stepwise", 0), sum(by_path.values())
        text += (
            f" {stepwise} of {total} minibatches held an episode start and so ran the LSTM one step at a "
            "time ('stepwise': batch = sequences, 1 step per call)"
        )
        text += "; the others ran it once over the padded sequences ('sequence')." if stepwise < total else "."
    return text


def _chunks(data: ds.Dataset, filt: ds.Expression, chunk_rows: int) -> list[tuple[ds.Expression, int]]:
    """Filters that split the rows ``filt`` selects into runs of whole iterations of at most ``chunk_rows``
    rows (an iteration larger than that alone; rows without an iteration last), each with its row count.
    One pass over the iteration column; a log of at most ``chunk_rows`` rows is one run, unfiltered."""
    parts: list[tuple[np.ndarray, np.ndarray]] = []  # each batch's distinct iterations and their rows
    nulls = 0
    for batch in data.scanner(columns=["iteration"], filter=filt, batch_size=SCAN_BATCH).to_batches():
        col = batch.column("iteration")
        nulls += col.null_count
        parts.append(np.unique(col.drop_null().to_numpy().astype(np.int64), return_counts=True))
    values = np.concatenate([v for v, _ in parts]) if parts else np.zeros(0, np.int64)
    counts = np.concatenate([n for _, n in parts]) if parts else np.zeros(0, np.int64)
    del parts
    total = int(counts.sum()) + nulls
    if total <= chunk_rows:
        return [(filt, total)]
    iterations, where = np.unique(values, return_inverse=True)
    per_iteration = np.bincount(where, weights=counts, minlength=len(iterations)).astype(np.int64)
    out: list[tuple[ds.Expression, int]] = []
    iteration = ds.field("iteration")
    lo = hi = rows = 0
    for it, n in zip(iterations.tolist(), per_iteration.tolist(), strict=True):
        if rows and rows + n > chunk_rows:
            out.append((filt & (iteration >= lo) & (iteration <= hi), rows))
            rows = 0
        if not rows:
            lo = it
        hi, rows = it, rows + n
    if rows:
        out.append((filt & (iteration >= lo) & (iteration <= hi), rows))
    if nulls:
        out.append((filt & iteration.is_null(), nulls))
    return out


@dataclass
class _Totals:
    """The scalar rows' share of every section, added up over the runs of iterations a log is read in
    (:func:`_chunks`). Everything here is a count, a sum, a max or one value per sequence or episode:
    nothing grows with the number of rows."""

    duplicates: int = 0
    iterations: int = 0
    train_module: str | None = None
    """The module whose train rows minibatches and sequences are counted on: the first one to train."""
    roll_module: str | None = None
    """The module whose rollout rows episodes are counted on: the first one in the rollout."""
    shapes: dict[tuple[str, str, str], dict[tuple[int, int], int]] = field(default_factory=dict)
    calls: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    """(module, phase, path) -> [calls, rows]."""
    spm: dict[int, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    by_path: dict[str, int] = field(default_factory=dict)
    minibatches: int = 0
    roll_batch: int = 0
    rllib: bool = False
    episodes: list[pd.DataFrame] = field(default_factory=list)
    lengths: list[np.ndarray] = field(default_factory=list)
    stored_starts: int = 0
    padding: int = 0
    padding_of: int = 0
    first_rows: int = 0
    first_h: float | None = None
    first_c: float | None = None
    drift: dict[str, dict[tuple[str, float], np.ndarray]] = field(
        default_factory=lambda: {"epoch": {}, "update": {}, "position": {}}
    )
    """Staleness groups: (module, key) -> rows, then count, sum and max of drift_h, then of drift_c."""

    def add(self, df: pd.DataFrame, front: int) -> None:
        """Add one run of rows, as :func:`read_scalars` returns them (train rows from ``front`` on)."""
        self.duplicates += _duplicates(df)
        if len(df) and df["iteration"].notna().any():
            self.iterations = max(self.iterations, int(df["iteration"].max()) + 1)
        train = df.iloc[front:]  # no copy: read_scalars packed the train rows at the end
        others = df.iloc[:front]
        roll = others[(others["phase"] == "rollout").to_numpy()]
        if self.train_module is None and len(train):
            self.train_module = str(train["module"].iloc[0])
        if self.roll_module is None and len(roll):
            self.roll_module = str(roll["module"].iloc[0])
        self._calls(df)
        if len(roll):
            self.roll_batch = max(self.roll_batch, int(roll.groupby("call").size().max()))
            self.rllib = self.rllib or bool(roll["worker"].notna().any())
            self._episodes(roll)
        if len(train):
            sel = (train["module"] == self.train_module).to_numpy()
            starts = _sequence_starts(train, sel) if sel.any() else np.zeros(0, np.intp)
            spm, reasons, by_path, n_mb = _minibatches(train, sel, starts)
            for total, part in ((self.spm, spm), (self.reasons, reasons), (self.by_path, by_path)):
                into = cast(dict[Any, int], total)
                for k, v in part.items():
                    into[k] = into.get(k, 0) + v
            self.minibatches += n_mb
            first = train.iloc[starts]
            self.lengths.append(first["seq_len"].to_numpy(dtype=np.float64))
            self.stored_starts += int((first["seq_reason"] != "episode_start").sum())
            self.padding += int(train["padding"].to_numpy()[sel].sum())
            self.padding_of += int(sel.sum())
            self._staleness(train)

    def _calls(self, df: pd.DataFrame) -> None:
        # Per-call aggregates without sorting or hashing the rows: call ids are dense (a counter from a
        # per-process base), so one slot per id takes counts, first/last step and the call's labels.
        # (An argsort of the call column held several copies of it; runs of equal ids barely shorten
        # it, since a block of one-step calls interleaves its calls row by row.)
        per_call = _per_call(df)
        if not len(per_call):
            return
        per_call["steps"] = per_call["t1"] - per_call["t0"] + 1
        per_call["batch"] = per_call["rows"] // per_call["steps"]
        for key, v in per_call.groupby(["module", "phase", "path", "steps", "batch"], observed=True).size().items():
            names: Any = key
            group = self.shapes.setdefault((str(names[0]), str(names[1]), str(names[2])), {})
            shape = (int(names[3]), int(names[4]))
            group[shape] = group.get(shape, 0) + int(v)
        totals = per_call.groupby(["module", "phase", "path"], observed=True)["rows"].agg(["size", "sum"])
        for key, row in totals.iterrows():
            names = key
            total = self.calls.setdefault((str(names[0]), str(names[1]), str(names[2])), [0, 0])
            total[0] += int(row["size"])
            total[1] += int(row["sum"])

    def _episodes(self, roll: pd.DataFrame) -> None:
        """First and last step of each (env, episode) of this run's rollout rows (one module's)."""
        # RLlib's extra pass on a terminal observation (bootstrap 'terminal') is not a step of the episode
        keep = roll["episode_step"].notna().to_numpy() & roll["bootstrap"].isna().to_numpy()
        keep &= (roll["module"] == self.roll_module).to_numpy()
        roll = roll[keep]
        if not len(roll):
            return
        roll = roll.assign(env_key=roll["worker"].fillna(-1).astype(np.float64) * 1e6 + roll["env"])
        per = roll.groupby(["env_key", "episode"], observed=True)["episode_step"].agg(["max", "min"])
        self.episodes.append(per.reset_index())

    def episode_lengths(self) -> np.ndarray:
        """Lengths of the episodes that both start in the log and end before a later one of the same env."""
        if not self.episodes:
            return np.array([])
        parts = pd.concat(self.episodes, ignore_index=True)
        per = parts.groupby(["env_key", "episode"], observed=True).agg({"max": "max", "min": "min"}).reset_index()
        later = per.groupby("env_key")["episode"].max()
        done = per[(per["episode"] < per["env_key"].map(later)) & (per["min"] == 0)]
        return (done["max"] + 1).to_numpy()

    def _staleness(self, train: pd.DataFrame) -> None:
        kept = ~train["padding"].to_numpy().astype(bool) & ~np.isnan(train["drift_h"].to_numpy())
        if not kept.any():
            return

        def column(name: str) -> np.ndarray:  # taken when needed and dropped after use: memory is the bound
            return train[name].to_numpy()[kept]

        dh, dc = column("drift_h"), column("drift_c")
        module = train["module"].cat.codes.to_numpy()[kept]
        names = train["module"].cat.categories
        epoch, minibatch = column("epoch"), column("minibatch")
        first = (epoch == 0) & (minibatch == 0)
        n_first = int(first.sum())
        if n_first:
            self.first_rows += n_first
            self.first_h = max(self.first_h or 0.0, float(dh[first].max()))
            if not np.isnan(dc[first]).all():
                self.first_c = max(self.first_c or 0.0, float(np.nanmax(dc[first])))
        del first

        def agg(key: np.ndarray, label: str) -> None:
            """Rows, count, sum and max of each drift per (module, key); null keys left out."""
            keep = _present(key)
            mod, key = module[keep], key[keep]
            by = _key([mod, key])
            assert by is not None  # a module code and one small key
            inv, n_groups = _groups(by)
            del by
            stats = np.c_[np.bincount(inv, minlength=n_groups), _group_stats(inv, n_groups, [dh[keep], dc[keep]])]
            # each group's labels: every row of a group carries the same ones
            mod_g, key_g = np.empty(n_groups, mod.dtype), np.empty(n_groups, key.dtype)
            mod_g[inv], key_g[inv] = mod, key
            for m, k, s in zip(mod_g, key_g, stats, strict=True):
                _merge_stats(self.drift[label], (str(names[m]), float(k)), s, first=1)

        agg(epoch, "epoch")
        # update = order of the minibatch within its iteration (0 = before any optimizer step); runs hold
        # whole iterations, so the order is the same as over the whole log
        iteration = column("iteration")
        named = ~(np.isnan(iteration) | np.isnan(epoch) | np.isnan(minibatch))
        mb_key = _key([iteration, epoch, minibatch])
        del epoch, minibatch
        if mb_key is not None and named.any():
            inv, n_mb = _groups(mb_key[named])
            it = np.empty(n_mb, iteration.dtype)
            it[inv] = iteration[named]  # sorted: minibatches come in iteration order
            update = np.full(len(mb_key), np.nan, np.float32)
            update[named] = (np.arange(n_mb) - np.searchsorted(it, it, side="left"))[inv]
            del mb_key, inv, it, iteration
            agg(update, "update")
            del update
        t, seq_len = column("t"), column("seq_len")
        code = np.where(t == 0, 0, np.where(t == seq_len - 1, 2, 1)).astype(np.int8)
        del t, seq_len
        agg(code, "position")

    def calls_section(self) -> CallsSection:
        groups = [
            CallGroup(
                key[0],
                key[1],
                key[2],
                calls,
                rows,
                {f"{s} x {b}": n for (s, b), n in sorted(self.shapes.get(key, {}).items())},
            )
            for key, (calls, rows) in sorted(self.calls.items())
        ]
        spm = dict(sorted(self.spm.items()))
        reasons = _by_count(self.reasons)
        by_path = _by_count(self.by_path)
        explanation = _explain(self.roll_batch, self.rllib, spm, reasons, by_path)
        return CallsSection(groups, spm, reasons, self.minibatches, by_path, explanation)

    def sequences_section(self) -> SequencesSection:
        episodes = self.episode_lengths()
        lens = np.concatenate(self.lengths) if self.lengths else np.zeros(0)
        if not self.padding_of:
            return SequencesSection(0, {}, {}, _stats(episodes), len(episodes), 0.0, 0.0)
        edges = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10**9]
        hist: dict[str, int] = {}
        for lo, hi in itertools.pairwise(edges):
            n = int(((lens >= lo) & (lens < hi)).sum())
            if n:
                hist[f"{lo}-{hi - 1}" if hi < 10**9 else f">={lo}"] = n
        return SequencesSection(
            sequences=len(lens),
            length=_stats(lens),
            length_histogram=hist,
            episode_length=_stats(episodes),
            episodes_completed=len(episodes),
            padding_share=self.padding / self.padding_of,
            stored_state_share=self.stored_starts / len(lens) if len(lens) else 0.0,
        )

    def staleness_section(self) -> StalenessSection:
        if not self.first_rows and not any(self.drift.values()):
            return StalenessSection(0, None, None, None, [], [], [])
        ok = None if self.first_h is None else bool(max(self.first_h, self.first_c or 0.0) <= PROVENANCE_TOLERANCE)
        labels: dict[str, Callable[[float], Any]] = {
            "epoch": lambda k: k,
            "update": int,
            "position": lambda k: ("first", "middle", "last")[int(k)],
        }
        out: dict[str, list[dict[str, Any]]] = {}
        for label, groups in self.drift.items():
            rows = []
            for (module, k), s in sorted(groups.items()):
                row = {"module": module, label: labels[label](k), "rows": int(s[0])}
                rows.append(row | _mean_max(s, 1, "drift_h") | _mean_max(s, 4, "drift_c"))
            out[label] = rows
        return StalenessSection(
            self.first_rows, self.first_h, self.first_c, ok, out["epoch"], out["update"], out["position"]
        )


def _by_count(counts: dict[str, int]) -> dict[str, int]:
    """Non-zero counts, the largest first (ties by name)."""
    return {k: v for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if v}


def _health_section(data: ds.Dataset, vectors: bool) -> HealthSection:
    """Rollout rows only, streamed batch by batch: per-iteration norms and per-unit state health."""
    # (module, layer, iteration) -> count, sum and max of h_norm, then of c_norm (NaN left out)
    norm_acc: dict[tuple[str, int, int], np.ndarray] = {}
    acc: dict[tuple[str, int], dict[str, Any]] = {}
    # h only when the log has vectors: reading an all-null vector column still builds its values
    # (rows x hidden floats a batch)
    columns = ["module", "layer", "iteration", "h_norm", "c_norm"] + (["h"] if vectors else [])
    scanner = data.scanner(columns=columns, filter=ds.field("phase") == "rollout", batch_size=65536)
    for batch in scanner.to_batches():
        if batch.num_rows == 0:
            continue
        modules = batch.column("module").to_numpy(zero_copy_only=False)
        layers = batch.column("layer").to_numpy()
        hn = batch.column("h_norm").to_numpy(zero_copy_only=False).astype(np.float64)
        cn = batch.column("c_norm").to_numpy(zero_copy_only=False).astype(np.float64)
        _add_norms(norm_acc, batch.column("module"), layers, batch.column("iteration"), hn, cn)
        hcol = batch.column("h") if vectors else None
        for key in {(str(m), int(lv)) for m, lv in zip(modules, layers, strict=True)}:
            sel = np.nonzero((modules == key[0]) & (layers == key[1]))[0]
            a = acc.setdefault(
                key,
                {
                    "rows": 0,
                    "nan_rows": 0,
                    "sat": 0,
                    "values": 0,
                    "max_abs": None,
                    "min": None,
                    "max": None,
                    "c_max": 0.0,
                },
            )
            a["rows"] += len(sel)
            a["nan_rows"] += int((~np.isfinite(hn[sel]) | ~np.isfinite(np.nan_to_num(cn[sel], nan=0.0))).sum())
            finite_c = cn[sel][np.isfinite(cn[sel])]
            if finite_c.size:
                a["c_max"] = max(a["c_max"], float(finite_c.max()))
            if hcol is None or hcol.null_count == len(hcol):
                continue
            sub = hcol.take(sel)
            sub = sub.filter(sub.is_valid())
            if len(sub) == 0:
                continue
            h = np.asarray(sub.flatten().to_numpy(zero_copy_only=False), np.float32).reshape(-1, hcol.type.list_size)
            finite = np.where(np.isfinite(h), h, 0.0)
            a["sat"] += int((np.abs(finite) > SATURATION).sum())
            a["values"] += h.size
            mx, lo, hi = np.abs(finite).max(0), finite.min(0), finite.max(0)
            a["max_abs"] = mx if a["max_abs"] is None else np.maximum(a["max_abs"], mx)
            a["min"] = lo if a["min"] is None else np.minimum(a["min"], lo)
            a["max"] = hi if a["max"] is None else np.maximum(a["max"], hi)
    layers_out = []
    for (module, layer), a in sorted(acc.items()):
        entry: dict[str, Any] = {
            "module": module,
            "layer": layer,
            "rows": a["rows"],
            "nan_or_inf_rows": a["nan_rows"],
            "c_norm_max": a["c_max"],
        }
        if a["max_abs"] is not None:
            entry["saturated_share"] = a["sat"] / max(a["values"], 1)
            entry["dead_units"] = [int(i) for i in np.nonzero(a["max_abs"] < DEAD)[0]]
            entry["constant_units"] = [int(i) for i in np.nonzero((a["max"] - a["min"]) < 1e-6)[0]]
        layers_out.append(entry)
    norms = []
    for (module, layer, iteration), s in sorted(norm_acc.items()):
        row = {"module": module, "layer": layer, "iteration": iteration}
        norms.append(row | _mean_max(s, 0, "h_norm") | _mean_max(s, 3, "c_norm"))
    return HealthSection(layers_out, norms, vectors)


def _add_norms(
    acc: dict[tuple[str, int, int], np.ndarray],
    modules: pa.Array,
    layers: np.ndarray,
    iterations: pa.Array,
    hn: np.ndarray,
    cn: np.ndarray,
) -> None:
    """Add one batch of rollout rows to the per-(module, layer, iteration) norm counts, sums and maxima
    (rows without an iteration left out; NaN norms not counted)."""
    it = iterations.to_numpy(zero_copy_only=False)
    enc = modules.dictionary_encode()
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.float64)  # a null module: NaN, left out
    names = enc.dictionary.to_pylist()
    keep = _present(it)
    if not isinstance(keep, slice):
        keep &= ~np.isnan(codes)
    elif np.isnan(codes).any():
        keep = ~np.isnan(codes)
    columns = [codes[keep], layers[keep].astype(np.float64), it[keep].astype(np.float64)]
    if not len(columns[0]):
        return
    key = _key(columns)
    if key is None:  # hand-made iteration numbers too far apart for one key
        key = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)[1].reshape(-1)
    inv, n = _groups(key)
    stats = _group_stats(inv, n, [hn[keep], cn[keep]])
    labels = np.empty((n, 3))
    labels[inv] = np.stack(columns, axis=1)
    for (m, layer, iteration), values in zip(labels, stats, strict=True):
        _merge_stats(acc, (str(names[int(m)]), int(layer), int(iteration)), values)


def _group_stats(inv: np.ndarray, n: int, values: list[np.ndarray]) -> np.ndarray:
    """Per group (``inv``: each row's group, of ``n``): count, sum and max of each array of ``values``
    (NaN left out; max NaN where a group has none), as columns [count, sum, max] per array."""
    stats = np.zeros((n, 3 * len(values)))
    for i, v in enumerate(values):
        some = _present(v)
        stats[:, 3 * i] = np.bincount(inv[some], minlength=n)
        stats[:, 3 * i + 1] = np.bincount(inv[some], weights=v[some], minlength=n)
        top = np.full(n, -np.inf, v.dtype)  # v's dtype: ufunc.at is ~30x slower when they differ
        np.maximum.at(top, inv[some], v[some])
        stats[:, 3 * i + 2] = np.where(stats[:, 3 * i] > 0, top, np.nan)
    return stats


def _mean_max(stats: np.ndarray, col: int, name: str) -> dict[str, Any]:
    """``name``_mean and ``name``_max from the [count, sum, max] at ``col`` of a :func:`_group_stats` row."""
    n = stats[col]
    return {f"{name}_mean": stats[col + 1] / n if n else math.nan, f"{name}_max": stats[col + 2] if n else math.nan}


def _merge_stats(acc: dict[Any, np.ndarray], key: Any, stats: np.ndarray, first: int = 0) -> None:
    """Add one group's row of :func:`_group_stats` (from column ``first`` on; counts before it) into
    ``acc[key]``: counts and sums add up, maxima keep the larger."""
    old = acc.get(key)
    if old is None:
        acc[key] = stats
        return
    merged = old + stats
    merged[first + 2 :: 3] = np.fmax(old[first + 2 :: 3], stats[first + 2 :: 3])
    acc[key] = merged


CROSS_KEYS = ["module", "layer", "worker", "env", "env_step"]
CROSS_ITERATIONS = 50
"""The cross-process check reads at most this many iterations (the first ones), which bounds its memory."""


def _vectors(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name).combine_chunks()
    width = col.type.list_size
    if col.null_count:
        col = col.fill_null(pa.scalar([np.nan] * width, col.type)) if width else col
    return np.asarray(col.flatten().to_numpy(zero_copy_only=False), np.float32).reshape(-1, width)


def _cross_process_section(data: ds.Dataset, vectors: bool) -> CrossProcessSection:
    """Join learner rows to env-runner rollout rows of the same (module, layer, worker, env, env_step)."""
    state = ["h", "c"] if vectors else ["h_norm", "c_norm"]
    cols = [*CROSS_KEYS, "phase", "iteration", "minibatch", "t", "bootstrap", *state]
    base = ds.field("env_step").is_valid() & (ds.field("iteration") < CROSS_ITERATIONS)
    roll_t = data.to_table(columns=cols, filter=base & (ds.field("phase") == "rollout"))
    learn_t = data.to_table(columns=cols, filter=base & ds.field("phase").isin(["train", "value"]))

    def frame(t: pa.Table) -> pd.DataFrame:
        return t.drop_columns(state).to_pandas().reset_index(drop=True)

    roll, learn = frame(roll_t), frame(learn_t)
    if vectors:
        rh, rc, lh, lc = (_vectors(t, n) for t, n in ((roll_t, "h"), (roll_t, "c"), (learn_t, "h"), (learn_t, "c")))
    else:  # summary logs: norms only (a weaker check: equal states have equal norms)
        rh, rc, lh, lc = (
            t.column(n).to_numpy(zero_copy_only=False).astype(np.float32)[:, None]
            for t, n in ((roll_t, "h_norm"), (roll_t, "c_norm"), (learn_t, "h_norm"), (learn_t, "c_norm"))
        )
    roll = roll.drop_duplicates(CROSS_KEYS, keep="last")
    m = learn.reset_index().merge(
        roll[[*CROSS_KEYS, "iteration"]].reset_index(), on=CROSS_KEYS, suffixes=("", "_r"), how="left"
    )
    paired = m["index_r"].notna().to_numpy()
    unpaired = int((~paired & (m["bootstrap"] != "last").to_numpy()).sum())
    m = m[paired]
    li, ri = m["index"].to_numpy(), m["index_r"].to_numpy().astype(np.int64)
    with np.errstate(invalid="ignore"):
        abs_h = np.nan_to_num(np.abs(lh[li] - rh[ri]), nan=0.0).max(axis=1) if len(li) else np.zeros(0)
        abs_c = np.nan_to_num(np.abs(lc[li] - rc[ri]), nan=0.0).max(axis=1) if len(li) else np.zeros(0)
        rel_h = relative_l2(np.nan_to_num(lh[li]), np.nan_to_num(rh[ri])) if len(li) else np.zeros(0)
        rel_c = relative_l2(np.nan_to_num(lc[li]), np.nan_to_num(rc[ri])) if len(li) else np.zeros(0)
    m = m.assign(abs_h=abs_h, abs_c=abs_c, rel_h=rel_h, rel_c=rel_c)
    start = m[m["t"] == -1]
    state_in = {
        str(k): float(max(g["abs_h"].max(), g["abs_c"].max())) for k, g in start.groupby("module", observed=True)
    }
    state_in_ok = None if not len(start) else bool(max(state_in.values()) <= 1e-6)
    # chunks that start an episode must start from zeros: their t = -1 rows have no env_step
    zeros = data.to_table(
        columns=["h_norm", "c_norm"],
        filter=(ds.field("t") == -1) & ds.field("env_step").is_null() & (ds.field("padding") == False),  # noqa: E712
    )
    norms = np.concatenate(
        [zeros.column(n).to_numpy(zero_copy_only=False).astype(np.float64) for n in ("h_norm", "c_norm")]
    )
    zero_ok = None if not zeros.num_rows else bool(np.nan_to_num(norms).max() == 0.0)
    steps = m[(m["t"] >= 0) & (m["iteration"] == m["iteration_r"])]
    first = steps[(steps["phase"] == "value") | (steps["minibatch"] == 0)]
    first_pass = [
        {
            "module": str(mod),
            "iteration": int(cast(Any, it)),
            "rows": len(g),
            "max_abs_h": float(g["abs_h"].max()),
            "max_drift_h": float(g["rel_h"].max()),
            "max_drift_c": float(g["rel_c"].max()),
        }
        for (mod, it), g in first.groupby(["module", "iteration"], observed=True)
    ]
    later = steps[steps["phase"] == "train"]
    by_minibatch = [
        {
            "module": str(mod),
            "minibatch": int(cast(Any, mb)),
            "rows": len(g),
            "drift_h_mean": float(g["rel_h"].mean()),
            "drift_h_max": float(g["rel_h"].max()),
            "drift_c_mean": float(g["rel_c"].mean()),
        }
        for (mod, mb), g in later.groupby(["module", "minibatch"], observed=True)
    ]
    return CrossProcessSection(
        state_in_rows=len(start),
        state_in_max_abs=state_in,
        state_in_ok=state_in_ok,
        zero_starts=zeros.num_rows,
        zero_starts_ok=zero_ok,
        unpaired=unpaired,
        first_pass=first_pass,
        by_minibatch=by_minibatch,
        vectors=vectors,
    )


def _cross_findings(x: CrossProcessSection) -> list[str]:
    out: list[str] = []
    if x.state_in_ok is not None:
        worst = max(x.state_in_max_abs.values(), default=0.0)
        out.append(
            f"RLlib oracle: {x.state_in_rows} learner chunks that continue an episode start from exactly the "
            f"state the env runner produced one step earlier (max |diff| {worst:.2g} "
            f"{'OK' if x.state_in_ok else 'FAILED'}); {x.zero_starts} chunks that start an episode start from "
            f"{'zeros' if x.zero_starts_ok else 'NON-ZERO states'}"
        )
    per_module: dict[str, list[dict[str, Any]]] = {}
    for row in x.first_pass:
        per_module.setdefault(row["module"], []).append(row)
    exact = {m: max(r["max_drift_h"] for r in rows) <= PROVENANCE_TOLERANCE for m, rows in per_module.items()}
    for module, rows in per_module.items():
        worst = max(r["max_drift_h"] for r in rows)
        if exact[module]:
            out.append(
                f"{module}: before the first optimizer step the learner recomputes the rollout states exactly "
                f"(max relative drift {worst:.2g} over {sum(r['rows'] for r in rows)} rows)"
            )
            continue
        clean = [r["iteration"] for r in rows if r["max_drift_h"] <= PROVENANCE_TOLERANCE]
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


def _findings(r: Report) -> list[str]:
    out: list[str] = []
    s = r.sequences
    if s.sequences and s.length:
        ep = s.episode_length
        msg = (
            f"gradients flow back at most {s.length['max']:.0f} steps (median {s.length['median']:.0f}) "
            f"through the training sequences"
        )
        if ep:
            msg += f", while completed episodes last {ep['median']:.0f} steps (median of {s.episodes_completed})"
        out.append(msg)
        out.append(
            f"{s.stored_state_share:.0%} of training sequences start from a stored mid-episode state "
            f"rather than a reset; {s.padding_share:.0%} of training rows are padding"
        )
    c = r.calls
    if c.sequences_per_minibatch:
        out.append(
            f"training minibatches hold {min(c.sequences_per_minibatch)}-{max(c.sequences_per_minibatch)} "
            f"sequences: that is the batch dimension of the LSTM's training-time hidden state"
        )
        if c.sequence_start_reasons.get("split"):
            out.append(
                f"{c.sequence_start_reasons['split']} sequences start at the buffer's random split point, "
                "cut off from their episode's earlier steps"
            )
    st = r.staleness
    if st.provenance_ok is not None:
        out.append(
            f"provenance check: max relative diff {st.provenance_max_drift_h:.2g} (h), "
            f"{(st.provenance_max_drift_c or 0.0):.2g} (c) over {st.provenance_check_rows} rows of the first "
            f"minibatch {'(OK)' if st.provenance_ok else '(FAILED)'}"
        )
    last_epoch: dict[str, float] = {}
    for row in st.by_epoch:
        last_epoch[row["module"]] = row["drift_h_mean"]
    if len(last_epoch) == 2 and min(last_epoch.values()) > 0:
        a, b = last_epoch.get("actor"), last_epoch.get("critic")
        if a and b:
            ratio = b / a
            who = "critic" if ratio >= 1 else "actor"
            out.append(
                f"by the last epoch {who} states drift {max(ratio, 1 / ratio):.1f}x more than the other's "
                f"(mean relative drift actor {a:.2g}, critic {b:.2g})"
            )
    elif last_epoch:
        for m, v in last_epoch.items():
            out.append(f"by the last epoch {m} states drift {v:.2g} (mean relative L2) from the rollout states")
    for layer in r.health.layers:
        name = f"{layer['module']} layer {layer['layer']}"
        if layer.get("dead_units"):
            out.append(f"{len(layer['dead_units'])} dead units in {name} (|h| < {DEAD} on every rollout step)")
        if layer.get("saturated_share", 0) > 0.05:
            out.append(f"{layer['saturated_share']:.0%} of {name}'s h values are saturated (|h| > {SATURATION})")
        if layer["nan_or_inf_rows"]:
            out.append(f"{layer['nan_or_inf_rows']} rollout rows of {name} hold NaN or inf states")
    if r.cross_process is not None:
        out.extend(_cross_findings(r.cross_process))
    if not r.run.completed:
        out.append(f"the run did not complete: {r.run.stop_reason or 'unknown reason'}")
    return out
