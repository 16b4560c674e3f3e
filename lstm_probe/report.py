"""``summarize(path) -> Report``: what the LSTMs did and what is wrong with them, from a log's own rows.

Never prints. Reads only the columns a section needs; the h/c vectors are streamed batch by batch
(bounded memory) and only for the state-health section. Works on torch-free machines.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

from lstm_probe.load import LogInfo, dataset

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


def _scalars(data: ds.Dataset, columns: list[str], filt: ds.Expression | None) -> pd.DataFrame:
    table = data.to_table(columns=columns, filter=filt)
    return table.to_pandas(strings_to_categorical=True)


def summarize(path: str | os.PathLike[str]) -> Report:
    """Read a log (file, dataset directory or a killed run's parts) and compute every report section."""
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
        "bootstrap",
        "iteration",
        "epoch",
        "minibatch",
        "seq",
        "t",
        "seq_len",
        "seq_reason",
        "padding",
        "env",
        "env_step",
        "episode",
        "episode_step",
        "drift_h",
        "drift_c",
    ]
    first_layer = _scalars(data, cols, ds.field("layer") == 0)
    run = _run_section(info, first_layer)
    arch = _arch_section(meta)
    calls = _calls_section(first_layer)
    seqs = _sequences_section(first_layer)
    stale = _staleness_section(first_layer)
    health = _health_section(data, capture.get("mode") != "summary" and info.rows > 0)
    # rows are identifiable by (call, module, column, step) only where env or seq names the column
    tagged = first_layer[first_layer["env"].notna() | first_layer["seq"].notna()]
    keys = pd.DataFrame(
        {
            "call": tagged["call"],
            "module": tagged["module"].astype(str),
            **{k: tagged[k].fillna(-1) for k in ("seq", "env", "t")},
        }
    )
    dups = int(keys.duplicated().sum())
    if dups:
        warnings.append(
            f"{dups} duplicate rows (the same call, module, layer, column and step twice): was a part "
            "file copied or read twice? Sections count them twice"
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
    )
    report.findings = _findings(report)
    return report


def _run_section(info: LogInfo, df: pd.DataFrame) -> RunSection:
    meta = info.metadata
    wall = None
    try:
        start, end = pd.Timestamp(meta["start_time"]), pd.Timestamp(meta["end_time"])
        wall = float((end - start).total_seconds())
    except (KeyError, ValueError, TypeError):
        pass
    progress = meta.get("progress") or {}
    steps_done = meta.get("progress_num_timesteps", progress.get("num_timesteps"))
    iterations = int(df["iteration"].max()) + 1 if len(df) and df["iteration"].notna().any() else 0
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
        verdict = f"{verdict}. Measured gradient flow ({flow.get('batch', 'one minibatch')}): {flow['verdict']}"
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


def _calls_section(df: pd.DataFrame) -> CallsSection:
    groups: list[CallGroup] = []
    if len(df):
        per_call = df.groupby("call", observed=True).agg(
            module=("module", "first"),
            phase=("phase", "first"),
            path=("path", "first"),
            rows=("t", "size"),
            steps=("t", "nunique"),
            seq=("seq", "max"),
        )
        per_call["batch"] = (per_call["rows"] // per_call["steps"]).astype(int)
        per_call["shape"] = per_call["steps"].astype(str) + " x " + per_call["batch"].astype(str)
        for (module, phase, path), g in per_call.groupby(["module", "phase", "path"], observed=True):
            shapes = g["shape"].value_counts().sort_index()
            groups.append(
                CallGroup(
                    str(module),
                    str(phase),
                    str(path),
                    len(g),
                    int(g["rows"].sum()),
                    {str(k): int(v) for k, v in shapes.items()},
                )
            )
    train = df[df["phase"] == "train"]
    spm: dict[int, int] = {}
    reasons: dict[str, int] = {}
    by_path: dict[str, int] = {}
    n_mb = 0
    if len(train):
        module0 = train["module"].iloc[0]
        t0 = train[train["module"] == module0]
        mb = t0.groupby(["iteration", "epoch", "minibatch"], observed=True)
        counts = mb["seq"].nunique()
        n_mb = len(counts)
        spm = {int(k): int(v) for k, v in counts.value_counts().sort_index().items()}
        by_path = {str(k): int(v) for k, v in mb["path"].first().value_counts().items()}
        starts = t0[t0["t"] == 0].drop_duplicates(["iteration", "epoch", "minibatch", "seq"])
        reasons = {str(k): int(v) for k, v in starts["seq_reason"].value_counts().items() if v}
    explanation = _explain(df, spm, reasons, by_path)
    return CallsSection(groups, spm, reasons, n_mb, by_path, explanation)


def _explain(df: pd.DataFrame, spm: dict[int, int], reasons: dict[str, int], by_path: dict[str, int]) -> str:
    if not spm:
        return "No training calls were recorded."
    roll = df[df["phase"] == "rollout"]
    batch = int(roll.groupby("call").size().max()) if len(roll) else 0
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


def _episode_lengths(df: pd.DataFrame) -> np.ndarray:
    roll = df[(df["phase"] == "rollout") & df["episode_step"].notna()]
    if not len(roll):
        return np.array([])
    roll = roll[roll["module"] == roll["module"].iloc[0]]
    per = roll.groupby(["env", "episode"], observed=True)["episode_step"].agg(["max", "min"]).reset_index()
    later = roll.groupby("env", observed=True)["episode"].max()
    done = per[(per["episode"] < per["env"].map(later)) & (per["min"] == 0)]
    return (done["max"] + 1).to_numpy()


def _sequences_section(df: pd.DataFrame) -> SequencesSection:
    train = df[df["phase"] == "train"]
    episodes = _episode_lengths(df)
    if not len(train):
        return SequencesSection(0, {}, {}, _stats(episodes), len(episodes), 0.0, 0.0)
    t0 = train[train["module"] == train["module"].iloc[0]]
    starts = t0[t0["t"] == 0].drop_duplicates(["iteration", "epoch", "minibatch", "seq"])
    lens = starts["seq_len"].to_numpy(dtype=np.float64)
    edges = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10**9]
    hist: dict[str, int] = {}
    for lo, hi in itertools.pairwise(edges):
        n = int(((lens >= lo) & (lens < hi)).sum())
        if n:
            hist[f"{lo}-{hi - 1}" if hi < 10**9 else f">={lo}"] = n
    stored = float((starts["seq_reason"] != "episode_start").mean()) if len(starts) else 0.0
    return SequencesSection(
        sequences=len(starts),
        length=_stats(lens),
        length_histogram=hist,
        episode_length=_stats(episodes),
        episodes_completed=len(episodes),
        padding_share=float(t0["padding"].mean()),
        stored_state_share=stored,
    )


def _staleness_section(df: pd.DataFrame) -> StalenessSection:
    train = df[(df["phase"] == "train") & ~df["padding"].astype(bool) & df["drift_h"].notna()]
    if not len(train):
        return StalenessSection(0, None, None, None, [], [], [])
    first = train[(train["epoch"] == 0) & (train["minibatch"] == 0)]
    mh = float(first["drift_h"].max()) if len(first) else None
    mc = float(first["drift_c"].max()) if len(first) and first["drift_c"].notna().any() else None
    ok = None if mh is None else bool(max(mh, mc or 0.0) <= PROVENANCE_TOLERANCE)

    def agg(g: Any) -> list[dict[str, Any]]:
        out = g.agg(
            rows=("drift_h", "size"),
            drift_h_mean=("drift_h", "mean"),
            drift_h_max=("drift_h", "max"),
            drift_c_mean=("drift_c", "mean"),
            drift_c_max=("drift_c", "max"),
        ).reset_index()
        return [{k: (str(v) if k == "module" else v) for k, v in r.items()} for r in out.to_dict("records")]

    by_epoch = agg(train.groupby(["module", "epoch"], observed=True))
    order = (
        train[["iteration", "epoch", "minibatch"]].drop_duplicates().sort_values(["iteration", "epoch", "minibatch"])
    )
    order["update"] = order.groupby("iteration").cumcount()
    train = train.merge(order, on=["iteration", "epoch", "minibatch"])
    by_update = agg(train.groupby(["module", "update"], observed=True))
    pos = np.where(train["t"] == 0, "first", np.where(train["t"] == train["seq_len"] - 1, "last", "middle"))
    by_position = agg(train.assign(position=pos).groupby(["module", "position"], observed=True))
    return StalenessSection(len(first), mh, mc, ok, by_epoch, by_update, by_position)


def _health_section(data: ds.Dataset, vectors: bool) -> HealthSection:
    scal = data.to_table(
        columns=["module", "layer", "iteration", "h_norm", "c_norm"], filter=ds.field("phase") == "rollout"
    ).to_pandas(strings_to_categorical=True)
    norms: list[dict[str, Any]] = []
    if len(scal):
        g = (
            scal.groupby(["module", "layer", "iteration"], observed=True)
            .agg(
                h_norm_mean=("h_norm", "mean"),
                h_norm_max=("h_norm", "max"),
                c_norm_mean=("c_norm", "mean"),
                c_norm_max=("c_norm", "max"),
            )
            .reset_index()
        )
        norms = [{k: (str(v) if k == "module" else v) for k, v in r.items()} for r in g.to_dict("records")]
    acc: dict[tuple[str, int], dict[str, Any]] = {}
    scanner = data.scanner(
        columns=["module", "layer", "h", "h_norm", "c_norm"], filter=ds.field("phase") == "rollout", batch_size=65536
    )
    for batch in scanner.to_batches():
        if batch.num_rows == 0:
            continue
        modules = batch.column("module").to_numpy(zero_copy_only=False)
        layers = batch.column("layer").to_numpy()
        hn = batch.column("h_norm").to_numpy(zero_copy_only=False).astype(np.float64)
        cn = batch.column("c_norm").to_numpy(zero_copy_only=False).astype(np.float64)
        hcol = batch.column("h")
        width = hcol.type.list_size
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
            if not vectors or hcol.null_count == len(hcol):
                continue
            sub = hcol.take(sel)
            sub = sub.filter(sub.is_valid())
            if len(sub) == 0:
                continue
            h = np.asarray(sub.flatten().to_numpy(zero_copy_only=False), np.float32).reshape(-1, width)
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
    return HealthSection(layers_out, norms, vectors)


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
    if not r.run.completed:
        out.append(f"the run did not complete: {r.run.stop_reason or 'unknown reason'}")
    return out
