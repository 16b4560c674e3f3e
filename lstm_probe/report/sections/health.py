"""Section 6: state health per module and layer (rollout states): norms per iteration, NaN/inf, and where
the log has vectors, saturated, dead and constant units. Streams the rollout rows batch by batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from lstm_probe.contract import Capabilities
from lstm_probe.errors import BadLog
from lstm_probe.log import budget
from lstm_probe.report.numeric import group_stats, groups, mean_max, present, row_key
from lstm_probe.report.section import (
    Accumulator,
    ArrayMax,
    ArrayMin,
    Block,
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

SATURATION = 0.95
DEAD = 1e-3
HEALTH_COLUMNS = ("saturated", "dead units", "constant units", "NaN/inf")
HEALTH_LEGEND = (
    f"saturated: the share of h values beyond ±{SATURATION} (tanh's flat ends, where gradients vanish); dead units: "
    f"units whose |h| never exceeds {DEAD}; constant units: units whose h never changes; "
    "NaN/inf: rows with a NaN or inf state"
)
"""What the table's columns count, under it (where the log has vectors: the per-unit columns are '-' otherwise)."""
HEALTH_BATCH = 65536
"""Rollout rows per batch at most: the vectors of one batch are the section's memory."""
HEALTH_BATCH_BYTES = 16 << 20
"""A batch's h vectors at most (fewer rows where h is wide): under the 32 MiB that the report's process keeps in
its heap (cli/startup.py), so each batch reuses freed memory rather than page-faulting a fresh mapping. A null
vector takes its width once read: a 4,096-env ``--trace-envs 16`` log's 65,536-row batches of them cost 1.3-3.5 s
of system time and 600 MB; 16,384-row batches 0.7 s and 200 MB."""


def _batch_rows(data: ds.Dataset, vectors: bool) -> int:
    if not vectors or "h" not in data.schema.names or not pa.types.is_fixed_size_list(data.schema.field("h").type):
        return HEALTH_BATCH
    typ = data.schema.field("h").type
    width = typ.list_size * max(1, typ.value_type.bit_width // 8)
    return max(1024, min(HEALTH_BATCH, HEALTH_BATCH_BYTES // max(1, width)))


@dataclass
class HealthSection:
    """Section 6: state health per module and layer (rollout states)."""

    layers: list[dict[str, Any]]
    norms_by_iteration: list[dict[str, Any]]
    vectors_available: bool


@dataclass
class UnitTotals(Accumulator[tuple[np.ndarray, np.ndarray, pa.Array | None]]):
    """One (module, layer)'s rollout rows: counts, the largest c norm, and per unit the largest |h|, the
    lowest and the highest h (non-finite values as 0)."""

    rows: Sum = field(default_factory=Sum)
    nan_rows: Sum = field(default_factory=Sum)
    saturated: Sum = field(default_factory=Sum)
    values: Sum = field(default_factory=Sum)
    vector_rows: Sum = field(default_factory=Sum)
    c_max: Max = field(default_factory=Max)
    max_abs: ArrayMax = field(default_factory=ArrayMax)
    low: ArrayMin = field(default_factory=ArrayMin)
    high: ArrayMax = field(default_factory=ArrayMax)

    def add(self, part: tuple[np.ndarray, np.ndarray, pa.Array | None]) -> None:
        """``part``: the h norms, c norms and (None: no vectors) h vectors of this key's rows of one batch."""
        hn, cn, h_rows = part
        self.rows.add(len(hn))
        self.nan_rows.add(int((~np.isfinite(hn) | ~np.isfinite(np.nan_to_num(cn, nan=0.0))).sum()))
        finite_c = cn[np.isfinite(cn)]
        if finite_c.size:
            self.c_max.add(float(finite_c.max()))
        if h_rows is None:
            return
        sub = h_rows.filter(h_rows.is_valid()) if h_rows.null_count else h_rows
        if len(sub) == 0:
            return
        self.vector_rows.add(len(sub))
        h = np.asarray(sub.flatten().to_numpy(zero_copy_only=False), np.float32).reshape(-1, h_rows.type.list_size)
        finite = np.where(np.isfinite(h), h, 0.0)
        self.saturated.add(int((np.abs(finite) > SATURATION).sum()))
        self.values.add(h.size)
        self.max_abs.add(np.abs(finite).max(0))
        self.low.add(finite.min(0))
        self.high.add(finite.max(0))

    def result(self, module: str, layer: int) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "module": module,
            "layer": layer,
            "rows": self.rows.value,
            "nan_or_inf_rows": self.nan_rows.value,
            "c_norm_max": self.c_max.value,  # None: the module has no cell state (GRU) or none was finite
        }
        if self.max_abs.value is not None and self.low.value is not None and self.high.value is not None:
            entry["vector_rows"] = self.vector_rows.value  # the rows the per-unit figures are from (--trace-envs)
            entry["saturated_share"] = self.saturated.value / max(self.values.value, 1)
            entry["dead_units"] = [int(i) for i in np.nonzero(self.max_abs.value < DEAD)[0]]
            entry["constant_units"] = [int(i) for i in np.nonzero((self.high.value - self.low.value) < 1e-6)[0]]
        return entry


def _norm_groups() -> GroupStats:
    return GroupStats()


@dataclass
class HealthTotals(Accumulator[pa.RecordBatch]):
    units: Keyed[tuple[str, int], UnitTotals] = field(default_factory=Keyed)
    norms: GroupStats = field(default_factory=_norm_groups)
    """(module, layer, iteration) -> count, sum and max of h_norm, then of c_norm (NaN left out)."""

    def add(self, part: pa.RecordBatch) -> None:
        """One batch of rollout rows (with an ``h`` column where the log has vectors)."""
        enc = part.column("module").dictionary_encode()
        names = enc.dictionary.to_pylist()
        codes = enc.indices.fill_null(len(names)).to_numpy(zero_copy_only=False).astype(np.int64)
        names.append(None)  # a null module: str(None), as a row's own value would give
        layers = part.column("layer").to_numpy()
        hn = part.column("h_norm").to_numpy(zero_copy_only=False).astype(np.float64)
        cn = part.column("c_norm").to_numpy(zero_copy_only=False).astype(np.float64)
        self._norms(part.column("module"), layers, part.column("iteration"), hn, cn)
        hcol = part.column("h") if "h" in part.schema.names else None
        if hcol is not None and hcol.null_count == len(hcol):
            hcol = None
        key = codes * (1 << 16) + (layers.astype(np.int64) - np.iinfo(np.int16).min)  # (module, layer) per row
        distinct = np.unique(key).tolist()
        for k in distinct:  # each (module, layer) of the batch: its rows, in log order
            sel: Any = np.flatnonzero(key == k) if len(distinct) > 1 else slice(None)  # one: the whole batch
            first = 0 if isinstance(sel, slice) else int(sel[0])
            name = (str(names[k >> 16]), int(layers[first]))
            unit = self.units.get(name)
            if unit is None:
                unit = self.units[name] = UnitTotals()
            h_rows = None if hcol is None else hcol if isinstance(sel, slice) else hcol.take(sel)
            unit.add((hn[sel], cn[sel], h_rows))

    def _norms(
        self, modules: pa.Array, layers: np.ndarray, iterations: pa.Array, hn: np.ndarray, cn: np.ndarray
    ) -> None:
        """Add one batch to the per-(module, layer, iteration) norm counts, sums and maxima (rows without an
        iteration left out; NaN norms not counted)."""
        it = iterations.to_numpy(zero_copy_only=False)
        enc = modules.dictionary_encode()
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.float64)  # a null module: NaN, left out
        names = enc.dictionary.to_pylist()
        keep = present(it)
        if not isinstance(keep, slice):
            keep &= ~np.isnan(codes)
        elif np.isnan(codes).any():
            keep = ~np.isnan(codes)
        columns = [codes[keep], layers[keep].astype(np.float64), it[keep].astype(np.float64)]
        if not len(columns[0]):
            return
        key = row_key(columns)
        if key is None:  # hand-made iteration numbers too far apart for one key
            key = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)[1].reshape(-1)
        inv, n = groups(key)
        stats = group_stats(inv, n, [hn[keep], cn[keep]])
        labels = np.empty((n, 3))
        labels[inv] = np.stack(columns, axis=1)
        for (m, layer, iteration), values in zip(labels, stats, strict=True):
            self.norms.add((str(names[int(m)]), int(layer), int(iteration)), values)


WHERE = ("call", "iteration", "env", "env_step", "episode", "episode_step")
"""What says where a module's first non-finite rollout state is (``first_nan_or_inf``)."""


def first_non_finite(data: ds.Dataset) -> dict[tuple[str, int], dict[str, int | None]]:
    """Per (module, layer), where its first rollout row (in call order) with a NaN or inf h is: the rows the
    health section counts in ``nan_or_inf_rows``, read again (only where some exist) with the columns that say
    where they are."""
    import pyarrow.compute as pc

    norm = ds.field("h_norm")
    bad = (ds.field("phase") == "rollout") & (pc.invert(pc.is_finite(norm)) | norm.is_null())
    columns = ["module", "layer", *(c for c in WHERE if c in data.schema.names)]
    if "call" not in columns:
        return {}
    budget.check_filtered(data, columns, bad, "the state-health read of non-finite rows")
    table = budget.read(data, columns, bad)
    if not table.num_rows:
        return {}
    enc = table.column("module").combine_chunks().dictionary_encode()
    codes = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    layers = table.column("layer").combine_chunks().fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    calls = table.column("call").combine_chunks().fill_null(np.iinfo(np.int64).max).to_numpy(zero_copy_only=False)
    key = (codes + 1) * (1 << 32) + (layers - np.iinfo(np.int32).min)
    order = np.lexsort((calls, key))  # by (module, layer), then call: each key's first row leads its run
    lead = order[np.flatnonzero(np.r_[True, key[order][1:] != key[order][:-1]])]
    out: dict[tuple[str, int], dict[str, int | None]] = {}
    for i in lead.tolist():
        row = table.slice(i, 1).to_pylist()[0]
        name = (str(row["module"]), int(row["layer"]) if row["layer"] is not None else -1)
        out[name] = {c: (int(row[c]) if row.get(c) is not None else None) for c in WHERE if c in row}
    return out


def _where(layer: dict[str, Any]) -> str:
    """', the first at iteration 3, env 17, env step 903, episode 4, its step 12, call 5,210': where
    ``first_nan_or_inf`` says; '' where it is unknown."""
    at = layer.get("first_nan_or_inf")
    if not at:
        return ""
    parts = [
        f"{name.replace('_', ' ')} {at[name]:,}"
        for name in ("iteration", "env", "env_step")
        if at.get(name) is not None
    ]
    episode = at.get("episode")
    if episode is not None:
        step = at.get("episode_step")
        parts.append(f"episode {episode:,}" + (f", its step {step:,}" if step is not None and step >= 0 else ""))
    if at.get("call") is not None:
        parts.append(f"call {at['call']:,}")
    return f", the first at {', '.join(parts)}" if parts else ""


class Health(Section[HealthSection]):
    key = "health"
    alongside = True
    findings_rank: ClassVar[int] = 40

    def compute(self, log: Log, acc: Any) -> HealthSection:
        """Rollout rows only, streamed batch by batch: per-iteration norms and per-unit state health."""
        vectors = log.vectors and log.info.rows > 0
        totals = HealthTotals()
        # h only when the log has vectors: reading an all-null vector column still builds its values
        # (rows x hidden floats a batch)
        columns = ["module", "layer", "iteration", "h_norm", "c_norm"] + (["h"] if vectors else [])
        # little read ahead (as the scalar scan): a few batches of one file
        rollout = ds.field("phase") == "rollout"
        data = budget.prune(log.data, rollout)  # the rollout row groups alone (footer statistics)
        try:
            budget.check_stream(data, columns, "the state-health read")
        except BadLog:
            # a summary log's vectors are its --trace-envs rows' (of row groups of up to 65,536 rows, each row's
            # h read at its full width): read without them, as before they were read (unavailable() says why)
            if not vectors or not log.summary:
                raise
            vectors, columns = False, [c for c in columns if c != "h"]
            budget.check_stream(data, columns, "the state-health read")
        scanner = data.scanner(
            columns=columns,
            filter=rollout,
            batch_size=_batch_rows(data, vectors),
            batch_readahead=2,
            fragment_readahead=1,
        )
        for batch in scanner.to_batches():
            if batch.num_rows:
                totals.add(batch)
        layers = [unit.result(module, layer) for (module, layer), unit in sorted(totals.units.items())]
        if any(layer["nan_or_inf_rows"] for layer in layers):  # where it began: read only where it happened
            try:
                first = first_non_finite(data)
            except BadLog:  # their rows would not fit the memory budget: counted, not located
                first = {}
            for layer in layers:
                if layer["nan_or_inf_rows"] and (layer["module"], layer["layer"]) in first:
                    layer["first_nan_or_inf"] = first[(layer["module"], layer["layer"])]
        norms = []
        for (module, layer, iteration), s in sorted(totals.norms.items()):
            row = {"module": module, "layer": layer, "iteration": iteration}
            norms.append(row | mean_max(s, 0, "h_norm") | mean_max(s, 3, "c_norm"))
        return HealthSection(layers, norms, vectors)

    def unavailable(self, data: HealthSection, log: Log) -> list[str]:
        if log.vectors and not data.vectors_available and data.layers:
            return [
                "state health per unit (dead/constant units, saturation): reading the --trace-envs rows' h "
                "vectors would go over the memory budget (--max-memory SIZE raises it)"
            ]
        if log.vectors:
            return []
        return [
            "state health per unit (dead/constant units, saturation): the log was written "
            "with --capture summary, which stores no h/c vectors"
        ]

    def findings(self, data: HealthSection) -> list[str]:
        out: list[str] = []
        for layer in data.layers:
            name = f"{layer['module']} layer {layer['layer']}"
            if layer.get("dead_units"):
                out.append(f"{len(layer['dead_units'])} dead units in {name} (|h| < {DEAD} on every rollout step)")
            if layer.get("saturated_share", 0) > 0.05:
                out.append(f"{layer['saturated_share']:.0%} of {name}'s h values are saturated (|h| > {SATURATION})")
            if layer["nan_or_inf_rows"]:
                out.append(f"{layer['nan_or_inf_rows']} rollout rows of {name} hold NaN or inf states{_where(layer)}")
        return out

    def text(self, data: HealthSection, caps: Capabilities) -> list[Block]:
        if not data.layers:
            return []
        has_c = any(row["c_norm_max"] is not None for row in data.layers)  # GRUs have no cell state
        rows = tuple(
            (
                safe(row["module"]),
                str(row["layer"]),
                f"{row['rows']:,}",
                *((fmt(row["c_norm_max"]),) if has_c else ()),
                f"{row['saturated_share']:.1%}" if "saturated_share" in row else "-",
                str(len(row["dead_units"])) if "dead_units" in row else "-",
                str(len(row["constant_units"])) if "constant_units" in row else "-",
                str(row["nan_or_inf_rows"]),
            )
            for row in data.layers
        )
        table = Table(
            "State health (rollout states)",
            ("module", "layer", "rows", *(("max ||c||",) if has_c else ()), *HEALTH_COLUMNS),
            rows,
        )
        legend = [Line(HEALTH_LEGEND)] if any("saturated_share" in row for row in data.layers) else []
        fewer = [row for row in data.layers if row.get("vector_rows", row["rows"]) < row["rows"]]
        if not fewer:
            return [table, *legend]
        kept = ", ".join(f"{safe(row['module'])} layer {row['layer']}: {row['vector_rows']:,}" for row in fewer)
        return [table, *legend, Line(f"saturated, dead and constant units: from the rows that hold vectors ({kept})")]
