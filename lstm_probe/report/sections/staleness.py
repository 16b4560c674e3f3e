"""Section 5: train-time recomputed states vs the rollout states of the same env timestep (the
``drift_h``/``drift_c`` columns), and the provenance check on the first minibatch of epoch 0."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from lstm_probe.contract import Capabilities
from lstm_probe.report.numeric import group_stats, groups, mean_max, present, row_key
from lstm_probe.report.scan import Chunk
from lstm_probe.report.section import Accumulator, Block, GroupStats, Line, Log, Max, Section, Sum, Table, fmt
from lstm_probe.text import safe

PROVENANCE_TOLERANCE = 1e-4
"""Relative drift above this in the first minibatch of epoch 0 means a provenance bug."""
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
    by_update: list[dict[str, Any]]
    by_position: list[dict[str, Any]]


def _drift_groups() -> GroupStats:
    return GroupStats(first=1)


@dataclass
class StalenessTotals(Accumulator[Chunk]):
    """Drift groups: (module, key) -> rows, then count, sum and max of drift_h, then of drift_c."""

    first_rows: Sum = field(default_factory=Sum)
    first_h: Max = field(default_factory=Max)
    first_c: Max = field(default_factory=Max)
    epoch: GroupStats = field(default_factory=_drift_groups)
    update: GroupStats = field(default_factory=_drift_groups)
    """Keyed by the order of the minibatch within its iteration (0 = before any optimizer step)."""
    position: GroupStats = field(default_factory=_drift_groups)
    """Keyed by the position in the sequence: 0 first step, 1 middle, 2 last."""

    def add(self, part: Chunk) -> None:
        train = part.train
        if not len(train):
            return
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
            self.first_rows.add(n_first)
            self.first_h.add(float(dh[first].max()))
            if not np.isnan(dc[first]).all():
                self.first_c.add(float(np.nanmax(dc[first])))
        del first
        _agg(self.epoch, names, module, epoch, dh, dc)
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
            _agg(self.update, names, module, update, dh, dc)
            del update
        t, seq_len = column("t"), column("seq_len")
        code = np.where(t == 0, 0, np.where(t == seq_len - 1, 2, 1)).astype(np.int8)
        del t, seq_len
        _agg(self.position, names, module, code, dh, dc)


def _agg(
    into: GroupStats, names: pd.Index, module: np.ndarray, key: np.ndarray, dh: np.ndarray, dc: np.ndarray
) -> None:
    """Rows, count, sum and max of each drift per (module, key); null keys left out."""
    keep = present(key)
    mod, key = module[keep], key[keep]
    by = row_key([mod, key])
    assert by is not None  # a module code and one small key
    inv, n_groups = groups(by)
    del by
    stats = np.c_[np.bincount(inv, minlength=n_groups), group_stats(inv, n_groups, [dh[keep], dc[keep]])]
    # each group's labels: every row of a group carries the same ones
    mod_g, key_g = np.empty(n_groups, mod.dtype), np.empty(n_groups, key.dtype)
    mod_g[inv], key_g[inv] = mod, key
    for m, k, s in zip(mod_g, key_g, stats, strict=True):
        into.add((str(names[m]), float(k)), s)


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
        drift = {"epoch": acc.epoch, "update": acc.update, "position": acc.position}
        if not acc.first_rows.value and not any(drift.values()):
            return StalenessSection(0, None, None, None, [], [], [])
        first_h, first_c = acc.first_h.value, acc.first_c.value
        ok = None if first_h is None else bool(max(first_h, first_c or 0.0) <= PROVENANCE_TOLERANCE)
        out: dict[str, list[dict[str, Any]]] = {}
        for label, grouped in drift.items():
            rows = []
            for (module, k), s in sorted(grouped.items()):
                row = {"module": module, label: LABELS[label](k), "rows": int(s[0])}
                rows.append(row | mean_max(s, 1, "drift_h") | mean_max(s, 4, "drift_c"))
            out[label] = rows
        return StalenessSection(
            acc.first_rows.value, first_h, first_c, ok, out["epoch"], out["update"], out["position"]
        )

    def warnings(self, data: StalenessSection, log: Log) -> list[str]:
        if data.provenance_ok is not False:
            return []
        return [
            f"provenance check FAILED: train states before the first optimizer step differ from "
            f"the rollout states (max relative drift {data.provenance_max_drift_h:.3g}); "
            "the row-to-timestep mapping of this log cannot be trusted"
        ]

    def findings(self, data: StalenessSection) -> list[str]:
        st = data
        out: list[str] = []
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
        return out

    def text(self, data: StalenessSection, caps: Capabilities) -> list[Block]:
        st = data
        if st.provenance_ok is None:
            return []
        status = "[green]OK[/]" if st.provenance_ok else "[red]FAILED[/]"
        out: list[Block] = [
            Line(
                f"provenance check: max diff {st.provenance_max_drift_h:.2g} (h), "
                f"{(st.provenance_max_drift_c or 0.0):.2g} (c) over {st.provenance_check_rows:,} rows {status}"
            )
        ]
        rows = tuple(
            (
                safe(row["module"]),
                fmt(int(row["epoch"])),
                f"{row['rows']:,}",
                fmt(row["drift_h_mean"]),
                fmt(row["drift_h_max"]),
                fmt(row["drift_c_mean"]),
                fmt(row["drift_c_max"]),
            )
            for row in st.by_epoch
        )
        out.append(
            Table(
                "Staleness: relative L2 drift of train states from rollout states, by epoch",
                ("module", "epoch", "rows", "h mean", "h max", "c mean", "c max"),
                rows,
            )
        )
        pos = ", ".join(f"{safe(r['module'])} {r['position']}: {fmt(r['drift_h_mean'])}" for r in st.by_position)
        out.append(Line(f"mean h drift by position in sequence: {pos}"))
        for module in dict.fromkeys(r["module"] for r in st.by_update):
            steps = [r for r in st.by_update if r["module"] == module]
            shown = ", ".join(f"{int(r['update'])}: {fmt(r['drift_h_mean'])}" for r in steps[:SHOWN_UPDATES])
            more = f", ... {len(steps) - SHOWN_UPDATES} more" if len(steps) > SHOWN_UPDATES else ""
            out.append(
                Line(
                    f"mean h drift of {safe(module)} by minibatch order in an iteration (0 = before any optimizer "
                    f"step): {shown}{more}",
                    soft_wrap=True,
                )
            )
        return out
