"""Section 5: train-time recomputed states vs the rollout states of the same env timestep (the
``drift_h``/``drift_c`` columns: relative L2, ||train - rollout|| / ||rollout||), and the provenance check on
the first minibatch of epoch 0, for every layer (the scan's first layer, then the train rows of the layers
above it, read in runs as the scan reads)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow.dataset as ds

from lstm_probe.contract import Capabilities
from lstm_probe.log import budget
from lstm_probe.report.numeric import group_stats, groups, labelled_groups, mean_max, present, row_key
from lstm_probe.report.scan import Chunk, Frame, chunks, fit, read_scalars
from lstm_probe.report.section import (
    Accumulator,
    Block,
    Counts,
    GroupStats,
    Keyed,
    Line,
    Log,
    Max,
    Section,
    Sum,
    Table,
    fmt,
)
from lstm_probe.text import safe

PROVENANCE_TOLERANCE = 1e-4
"""Relative drift (||train - rollout|| / ||rollout||, per row) above this in the first minibatch of epoch 0
means a provenance bug. Relative, so that it holds whatever the states' scale: |c| reaches 13 at hidden 256,
where float32 rounding alone differs by ~1e-6 in absolute terms."""
TF32_PROVENANCE_TOLERANCE = 1e-2
"""The same bound for a log whose LSTMs ran on cuDNN in TF32 (metadata ``cudnn_tf32``, PyTorch's default on a
GPU): its matrix products keep a 10-bit mantissa (~5e-4 relative), and the rollout's one-step calls and
training's multi-step calls round differently. A provenance bug (another env step's state, a reset) differs by
far more."""


def provenance_tolerance(meta: dict[str, Any]) -> float:
    """The provenance check's bound for a log (see :data:`TF32_PROVENANCE_TOLERANCE`)."""
    return TF32_PROVENANCE_TOLERANCE if meta.get("cudnn_tf32") is True else PROVENANCE_TOLERANCE


STALENESS_COLUMNS = ["module", "layer", "phase", "iteration", "epoch", "minibatch", "t", "seq_len", "padding"]
STALENESS_COLUMNS += ["drift_h", "drift_c"]
UPPER_TRAIN = (ds.field("layer") > 0) & (ds.field("t") >= 0) & (ds.field("phase") == "train")
UPPER_TRAIN &= ds.field("drift_h").is_valid()
"""The train rows of the layers above the scan's first one that the section reads itself."""
SHOWN_UPDATES = 12
POSITIONS = ("first", "middle", "last")


@dataclass
class StalenessSection:
    """Section 5: train-time recomputed states vs the rollout states of the same env timestep."""

    provenance_check_rows: int
    provenance_max_drift_h: float | None
    provenance_max_drift_c: float | None
    provenance_ok: bool | None
    by_epoch: list[dict[str, Any]]
    """Per module, layer and epoch: rows, mean and max of drift_h and drift_c."""
    by_update: list[dict[str, Any]]
    by_position: list[dict[str, Any]]
    provenance_by_layer: list[dict[str, Any]] = field(default_factory=list)
    """Per layer: rows, max drift_h, max drift_c of the provenance check (the fields above: over every layer)."""
    provenance_tolerance: float = PROVENANCE_TOLERANCE
    train_rows: int = 0
    """Train rows (less padding) of the scan's first layer, with a drift or not."""


def _drift_groups() -> GroupStats:
    return GroupStats(first=1)


@dataclass
class StalenessTotals(Accumulator[Chunk]):
    """Drift groups: (module, layer, key) -> rows, then count, sum and max of drift_h, then of drift_c; the
    provenance check's rows and maxima per layer."""

    first_rows: Counts[int] = field(default_factory=Counts)
    first_h: Keyed[int, Max] = field(default_factory=Keyed)
    first_c: Keyed[int, Max] = field(default_factory=Keyed)
    epoch: GroupStats = field(default_factory=_drift_groups)
    update: GroupStats = field(default_factory=_drift_groups)
    """Keyed by the order of the minibatch within its iteration (0 = before any optimizer step)."""
    position: GroupStats = field(default_factory=_drift_groups)
    """Keyed by the position in the sequence: 0 first step, 1 middle, 2 last."""
    train_rows: Sum = field(default_factory=Sum)

    def add(self, part: Chunk) -> None:
        self.train_rows.add(int((~part.train["padding"].astype(bool)).sum()) if len(part.train) else 0)
        self.add_train(part.train)

    def add_train(self, train: Frame) -> None:
        """Train rows as :func:`~lstm_probe.report.scan.read_scalars` reads them (any layers)."""
        if not len(train):
            return
        kept = ~train["padding"].astype(bool) & ~np.isnan(train["drift_h"])
        if not kept.any():
            return

        every = bool(kept.all())  # every row kept (no padding, a drift on each): the columns as they are

        def column(name: str) -> np.ndarray:  # taken when needed and dropped after use: memory is the bound
            return train[name] if every else train[name][kept]

        # float64 once: the three groupings' sums (np.bincount) would each convert float32 weights again
        dh, dc = column("drift_h").astype(np.float64), column("drift_c").astype(np.float64)
        module = column("module")
        names = train.words("module")
        layer = column("layer")
        epoch, minibatch = column("epoch"), column("minibatch")
        first = (epoch == 0) & (minibatch == 0)
        if first.any():
            for lv in np.unique(layer[first]).tolist():
                mine = first & (layer == lv)
                self.first_rows.add(int(lv), int(mine.sum()))
                self.first_h.setdefault(int(lv), Max()).add(float(dh[mine].max()))
                if not np.isnan(dc[mine]).all():
                    self.first_c.setdefault(int(lv), Max()).add(float(np.nanmax(dc[mine])))
        del first
        _agg(self.epoch, names, module, layer, epoch, dh, dc)
        # update = order of the minibatch within its iteration (0 = before any optimizer step); runs hold
        # whole iterations, so the order is the same as over the whole log
        iteration = column("iteration")
        named = ~(np.isnan(iteration) | np.isnan(epoch) | np.isnan(minibatch))
        mb_key = row_key([iteration, epoch, minibatch])
        del epoch, minibatch
        if mb_key is not None and named.any():
            inv, n_mb = groups(mb_key[named])
            it = np.empty(n_mb, iteration.dtype)
            it[inv] = iteration[named]  # sorted: minibatches come in iteration order
            update = np.full(len(mb_key), np.nan, np.float32)
            update[named] = (np.arange(n_mb) - np.searchsorted(it, it, side="left"))[inv]
            del mb_key, inv, it, iteration
            _agg(self.update, names, module, layer, update, dh, dc)
            del update
        t, seq_len = column("t"), column("seq_len")
        code = np.where(t == 0, 0, np.where(t == seq_len - 1, 2, 1)).astype(np.int8)
        del t, seq_len
        _agg(self.position, names, module, layer, code, dh, dc)


def _agg(
    into: GroupStats,
    names: list[str],
    module: np.ndarray,
    layer: np.ndarray,
    key: np.ndarray,
    dh: np.ndarray,
    dc: np.ndarray,
) -> None:
    """Rows, count, sum and max of each drift per (module, layer, key); null keys left out."""
    keep = present(key)
    mod, lay, key = module[keep], layer[keep], key[keep]
    by = labelled_groups([mod, lay, key])
    assert by is not None  # a module code, a layer and one small key
    inv, n_groups, (mod_g, lay_g, key_g) = by  # each group's labels, read off its key
    rows = np.bincount(inv, minlength=n_groups)
    stats = np.c_[rows, group_stats(inv, n_groups, [dh[keep], dc[keep]], rows)]
    for m, lv, k, s in zip(mod_g.tolist(), lay_g.tolist(), key_g.tolist(), stats, strict=True):
        into.add((str(names[int(m)]), int(lv), float(k)), s)


LABELS: dict[str, Callable[[float], Any]] = {
    "epoch": lambda k: k,
    "update": int,
    "position": lambda k: POSITIONS[int(k)],
}


class Staleness(Section[StalenessSection]):
    key = "staleness"
    findings_rank: ClassVar[int] = 30

    def accumulator(self) -> StalenessTotals:
        return StalenessTotals()

    def compute(self, log: Log, acc: StalenessTotals) -> StalenessSection:
        if log.upper_layers:  # the layers above the scan's first: their train rows, in runs of whole iterations
            data = budget.prune(log.data, UPPER_TRAIN)  # the train row groups (footer statistics)
            for filt, n_rows in chunks(data, UPPER_TRAIN, fit(log.chunk_rows, len(STALENESS_COLUMNS))):
                df, front = read_scalars(data, STALENESS_COLUMNS, filt, n_rows)
                part = StalenessTotals()
                part.add_train(df.take(slice(front, None)))
                acc.merge(part)
                del df, part
        drift = {"epoch": acc.epoch, "update": acc.update, "position": acc.position}
        if not acc.first_rows and not any(drift.values()):
            return StalenessSection(0, None, None, None, [], [], [], train_rows=acc.train_rows.value)
        per_layer: list[dict[str, Any]] = [
            {
                "layer": layer,
                "rows": n,
                "max_drift_h": acc.first_h[layer].value,
                "max_drift_c": acc.first_c[layer].value if layer in acc.first_c else None,
            }
            for layer, n in sorted(acc.first_rows.items())
        ]
        hs = [float(r["max_drift_h"]) for r in per_layer if r["max_drift_h"] is not None]
        cs = [float(r["max_drift_c"]) for r in per_layer if r["max_drift_c"] is not None]
        first_h, first_c = max(hs, default=None), max(cs, default=None)
        bound = provenance_tolerance(log.meta)
        ok = None if first_h is None else bool(max(first_h, first_c or 0.0) <= bound)
        out: dict[str, list[dict[str, Any]]] = {}
        for label, grouped in drift.items():
            rows: list[dict[str, Any]] = []
            for (module, layer, k), s in sorted(grouped.items()):
                row = {"module": module, "layer": layer, label: LABELS[label](k), "rows": int(s[0])}
                rows.append(row | mean_max(s, 1, "drift_h") | mean_max(s, 4, "drift_c"))
            out[label] = rows
        return StalenessSection(
            sum(acc.first_rows.values()),
            first_h,
            first_c,
            ok,
            out["epoch"],
            out["update"],
            out["position"],
            per_layer,
            provenance_tolerance=bound,
            train_rows=acc.train_rows.value,
        )

    def unavailable(self, data: StalenessSection, log: Log) -> list[str]:
        if not data.train_rows or data.provenance_ok is not None or log.caps.shards:  # shards: cross-process check
            return []
        if not data.by_position:
            return [
                "staleness and the provenance check: no train row was paired with the rollout state of its env "
                "step (an own loop: tag env and env_step on its rollout and train calls, and keep lstm_probe.trace()'s "
                "default reference_window)"
            ]
        return [
            "the provenance check: no train row is tagged epoch 0 and minibatch 0, the minibatch before any optimizer "
            "step (tag the train calls with epoch and minibatch)"
        ]

    def warnings(self, data: StalenessSection, log: Log) -> list[str]:
        if data.provenance_ok is not False:
            return []
        return [
            f"provenance check FAILED: train states before the first optimizer step differ from "
            f"the rollout states of the same env step (largest relative difference ||train - rollout|| / "
            f"||rollout|| {data.provenance_max_drift_h:.3g}, allowed {data.provenance_tolerance:g}): the "
            "drifts compare unlike states. Either the train rows' env and env_step do not name the rollout step "
            "each recomputes (an own loop's tags, or an integration's mapping), or training does not start from "
            "the state the rollout had there, or resets (or keeps) its state where the rollout did not; the "
            "doctor's findings say which where they can"
        ]

    def findings(self, data: StalenessSection) -> list[str]:
        st = data
        out: list[str] = []
        if st.provenance_ok is not None:
            c = "" if st.provenance_max_drift_c is None else f" and {st.provenance_max_drift_c:.2g} (c)"
            verdict = "OK" if st.provenance_ok else "FAILED"
            out.append(
                f"provenance check {verdict}: in the first minibatch (before any optimizer step) train states differ "
                f"from the rollout states of the same env step by at most {st.provenance_max_drift_h:.2g} (h){c} "
                f"relative to the rollout state's norm, over {st.provenance_check_rows:,} rows"
                f"{_layers(st.provenance_by_layer)}"
            )
        last_epoch: dict[str, float] = {}
        layered = any(row["layer"] for row in st.by_epoch)
        for row in st.by_epoch:
            if row["layer"] == 0:
                last_epoch[row["module"]] = row["drift_h_mean"]
        where = " in layer 0" if layered else ""
        if len(last_epoch) == 2 and min(last_epoch.values()) > 0:
            a, b = last_epoch.get("actor"), last_epoch.get("critic")
            if a and b:
                ratio = b / a
                far, near = ("critic", "actor") if ratio >= 1 else ("actor", "critic")
                out.append(
                    f"by the last epoch {far} states are {max(ratio, 1 / ratio):.1f}x as far from their rollout "
                    f"states as {near} states{where} (mean relative drift actor {a:.2g}, critic {b:.2g})"
                )
        elif last_epoch:
            for m, v in last_epoch.items():
                out.append(
                    f"by the last epoch {m} states{where} drift {v:.2g} from the rollout states (mean relative L2 "
                    "distance)"
                )
        return out

    def text(self, data: StalenessSection, caps: Capabilities) -> list[Block]:
        st = data
        if st.provenance_ok is None:
            return []
        status = "[green]OK[/]" if st.provenance_ok else "[red]FAILED[/]"
        tf32 = ": cuDNN ran the LSTMs in TF32" if st.provenance_tolerance == TF32_PROVENANCE_TOLERANCE else ""
        layered = len(st.provenance_by_layer) > 1 or any(row["layer"] for row in st.by_epoch)
        parts = []
        for r in st.provenance_by_layer:
            c = "" if r["max_drift_c"] is None else f", c {r['max_drift_c']:.2g}"
            layer = f"layer {r['layer']}: " if layered else ""
            parts.append(f"{layer}h {r['max_drift_h']:.2g}{c} over {r['rows']:,} rows")
        out: list[Block] = [
            Line(
                "provenance check (first minibatch of epoch 0, before any optimizer step): largest relative "
                "difference ||train - rollout|| / ||rollout|| between a train state and the rollout state of the "
                f"same env step: {'; '.join(parts)} {status} (allowed {st.provenance_tolerance:g}{tf32})",
                soft_wrap=True,
            )
        ]
        has_c = any(not np.isnan(row["drift_c_mean"]) for row in st.by_epoch)
        rows = tuple(
            (safe(row["module"]),)
            + ((str(row["layer"]),) if layered else ())
            + (fmt(int(row["epoch"])), f"{row['rows']:,}", fmt(row["drift_h_mean"]), fmt(row["drift_h_max"]))
            + ((fmt(row["drift_c_mean"]), fmt(row["drift_c_max"])) if has_c else ())
            for row in st.by_epoch
        )
        out.append(
            Table(
                "Staleness: relative L2 drift ||train - rollout|| / ||rollout|| of train states from the rollout "
                "states of the same env step, by epoch",
                ("module",)
                + (("layer",) if layered else ())
                + ("epoch", "rows", "h mean", "h max")
                + (("c mean", "c max") if has_c else ()),
                rows,
            )
        )

        def name(row: dict[str, Any]) -> str:
            return f"{safe(row['module'])}{' layer ' + str(row['layer']) if layered else ''}"

        pos = ", ".join(f"{name(r)} {r['position']}: {fmt(r['drift_h_mean'])}" for r in st.by_position)
        out.append(Line(f"mean h drift by position in sequence: {pos}"))
        for module, layer in dict.fromkeys((r["module"], r["layer"]) for r in st.by_update):
            steps = [r for r in st.by_update if r["module"] == module and r["layer"] == layer]
            shown = ", ".join(f"{int(r['update'])}: {fmt(r['drift_h_mean'])}" for r in steps[:SHOWN_UPDATES])
            more = f", ... {len(steps) - SHOWN_UPDATES} more" if len(steps) > SHOWN_UPDATES else ""
            out.append(
                Line(
                    f"mean h drift of {name(steps[0])} by minibatch order in an iteration (0 = before any optimizer "
                    f"step): {shown}{more}",
                    soft_wrap=True,
                )
            )
        return out


def _layers(per_layer: list[dict[str, Any]]) -> str:
    """' (layers 0 and 1)' where the check covered more than one layer, else ''."""
    if len(per_layer) < 2:
        return ""
    names = [str(r["layer"]) for r in per_layer]
    return f" (layers {', '.join(names[:-1])} and {names[-1]})"
