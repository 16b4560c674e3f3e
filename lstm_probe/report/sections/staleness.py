"""Section 5: train-time recomputed states vs the rollout states of the same env timestep (the
``drift_h``/``drift_c`` columns: relative L2, ||train - rollout|| / ||rollout||), and the provenance check on
the first minibatch of epoch 0, for every layer (the scan's first layer, then the train rows of the layers
above it, read in runs as the scan reads)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import pyarrow.dataset as ds

from lstm_probe.contract import Capabilities
from lstm_probe.log import budget
from lstm_probe.report.numeric import dense_key, group_stats, groups, labelled_groups, mean_max, present
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
    kept_columns,
)
from lstm_probe.report.sections import staleness_trend, staleness_words
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


PROVENANCE_NOT_MADE = "the provenance check: not made (the staleness section says why)"
"""What "not in this log" says of a provenance check not made: its reason (``provenance_note``) is shown once, in
the staleness section."""

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
    unmeasured_rows: int = 0
    """Of ``train_rows``, those without a drift where some have one: their rollout states are older than the
    rollout states the probe held when they trained (a replay buffer's samples of earlier collector batches),
    so no figure here is of them; 0 where every train row has a drift, or none has. Not counting ``undrifted``."""
    undrifted: dict[str, int] = field(default_factory=dict)
    """Modules none of whose train rows has a drift, where another's have, and their train rows: no rollout call
    of theirs (the collection does not run the module: a critic's own LSTM left out of the collecting policy)."""
    minibatches_per_epoch: int | None = None
    """Minibatches in an epoch: as the log's metadata states it, or the largest minibatch index seen + 1. A
    ``by_update`` row's ``update`` is its minibatch's order in the iteration, epoch * this + minibatch (0: before
    any optimizer step), so minibatches without rows leave gaps."""
    provenance_note: str | None = None
    """Why the provenance check was not made, where train rows have drifts but none is of the first minibatch."""
    drift_minibatches: list[int] = field(default_factory=list)
    """The minibatch indices (in their epoch) that the drift figures come from."""
    drift_from: str | None = None
    """Where the log keeps only some envs' rows (``--trace-envs K --other-envs none``): which minibatches the
    figures come from (those that held the kept envs), as the report prints it."""
    kept_envs: int | None = None
    """K where the log keeps the rows of env columns 0..K-1 alone (``--trace-envs K --other-envs none``): the
    provenance check and the drifts are then of those columns, and the findings say so; None: of every column."""
    n_envs: int | None = None
    """The run's envs, as its metadata says (per env runner where ``env_runners``)."""
    env_runners: int | None = None
    """RLlib: the env runners, where more than one, that stepped ``n_envs`` envs each."""
    global_pairing: str | None = None
    """Where the doctor found env_step a global counter: what the check's pairs are then (``summary._env_steps``)."""
    by_iteration: list[dict[str, Any]] = field(default_factory=list)
    """Per module and layer, each iteration's mean drift in its last epoch, or spans of iterations where many
    (:func:`~lstm_probe.report.sections.staleness_trend.by_iteration`)."""
    provenance_dropout: str | None = None  # why the check fails above layer 0 alone: dropout (JSON: where set)

    @cached_property
    def trend(self) -> staleness_trend.Trend:
        """:attr:`by_iteration` in the spans the text's trend line and the verdict read
        (:func:`~lstm_probe.report.sections.staleness_trend.spans`): computed once, where first read; not a field,
        so not in the JSON (which holds ``by_iteration``)."""
        return staleness_trend.spans(self.by_iteration)


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
    """Keyed by the minibatch's epoch and its index in the epoch (the order is made of both in ``compute``)."""
    position: GroupStats = field(default_factory=_drift_groups)
    """Keyed by the position in the sequence: 0 first step, 1 middle, 2 last."""
    iteration: GroupStats = field(default_factory=_drift_groups)
    """Keyed by iteration and epoch (the trend over training: O(iterations x epochs) groups per module and layer)."""
    train_rows: Sum = field(default_factory=Sum)
    drift_rows: Sum = field(default_factory=Sum)
    """Of ``train_rows``, those with a drift."""
    module_rows: Counts[str] = field(default_factory=Counts)
    module_drift: Counts[str] = field(default_factory=Counts)
    """``train_rows`` and ``drift_rows`` per module."""
    tagged: Sum = field(default_factory=Sum)
    """Train rows with a drift that name their epoch and minibatch (the provenance check can find its rows)."""
    held: Sum = field(default_factory=Sum)
    """Minibatches (iteration, epoch, minibatch) of the scan's first layer with a drift row."""
    held_epochs: Sum = field(default_factory=Sum)
    """Epochs (iteration, epoch) of the scan's first layer with a drift row."""

    def add(self, part: Chunk) -> None:
        train = part.train
        if len(train):
            real = ~train["padding"].astype(bool)
            drifted = real & ~np.isnan(train["drift_h"])
            self.train_rows.add(int(real.sum()))
            self.drift_rows.add(int(drifted.sum()))
            names = train.words("module")
            for mask, into in ((real, self.module_rows), (drifted, self.module_drift)):
                codes, counts = np.unique(train["module"][mask], return_counts=True)
                for code, n in zip(codes.tolist(), counts.tolist(), strict=True):
                    into.add(names[int(code)], int(n))
        self.add_train(part.train, count=True)

    def add_train(self, train: Frame, count: bool = False) -> None:
        """Train rows as :func:`~lstm_probe.report.scan.read_scalars` reads them (any layers); ``count``: count
        the minibatches and epochs that hold them (runs hold whole iterations, so the counts add up)."""
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
        _agg(self.epoch, names, module, layer, [epoch], dh, dc)
        named = ~(np.isnan(epoch) | np.isnan(minibatch))
        self.tagged.add(int(named.sum()))
        # by the minibatch's epoch and index in it: compute() orders them, gaps left where a minibatch has no row
        _agg(self.update, names, module, layer, [epoch, minibatch], dh, dc)
        _agg(self.iteration, names, module, layer, [column("iteration"), epoch], dh, dc)
        if count and named.any():
            iteration = column("iteration")
            named &= ~np.isnan(iteration)
            for cols, into in (([iteration, epoch, minibatch], self.held), ([iteration, epoch], self.held_epochs)):
                key = dense_key([c[named] for c in cols])
                into.add(groups(key)[1] if len(key) else 0)
            del iteration
        del epoch, minibatch, named
        t, seq_len = column("t"), column("seq_len")
        code = np.where(t == 0, 0, np.where(t == seq_len - 1, 2, 1)).astype(np.int8)
        del t, seq_len
        _agg(self.position, names, module, layer, [code], dh, dc)


def _agg(
    into: GroupStats,
    names: list[str],
    module: np.ndarray,
    layer: np.ndarray,
    keys: list[np.ndarray],
    dh: np.ndarray,
    dc: np.ndarray,
) -> None:
    """Rows, count, sum and max of each drift per (module, layer, *keys); rows with a null key left out."""
    keep: Any = slice(None)
    for key in keys:
        here = present(key)
        if not isinstance(here, slice):
            keep = here if isinstance(keep, slice) else keep & here
    if not isinstance(keep, slice) and not keep.any():
        return
    columns = [module[keep], layer[keep], *(key[keep] for key in keys)]
    by = labelled_groups(columns)
    if by is None:  # keys too far apart for one int64 together (a hand-made epoch and minibatch): their rows
        distinct, inv = np.unique(
            np.stack([np.asarray(c, np.float64) for c in columns], 1), axis=0, return_inverse=True
        )
        by = (inv.reshape(-1), len(distinct), [distinct[:, i] for i in range(distinct.shape[1])])
    inv, n_groups, (mod_g, lay_g, *key_g) = by  # each group's labels, read off its key
    rows = np.bincount(inv, minlength=n_groups)
    stats = np.c_[rows, group_stats(inv, n_groups, [dh[keep], dc[keep]], rows)]
    labels = zip(mod_g.tolist(), lay_g.tolist(), *(k.tolist() for k in key_g), strict=True)
    for (m, lv, *k), s in zip(labels, stats, strict=True):
        into.add((str(names[int(m)]), int(lv), *(float(v) for v in k)), s)


LABELS: dict[str, Callable[[float], Any]] = {
    "epoch": lambda k: int(k) if k == k else None,  # an integer, as by_update's (it read 0.0)
    "position": lambda k: POSITIONS[int(k)],
}


def _count(value: object) -> int:
    """A count from the log's metadata (a file may hold anything there): 0 unless a positive int."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def minibatches_per_epoch(meta: dict[str, Any], caps: Capabilities) -> int | None:
    """Minibatches in an epoch as a log's metadata states them; None where it does not. The hyperparameters'
    ``num_mini_batches``; for a rollout buffer cut into ``batch_size`` pieces, ceil(n_steps * n_envs /
    batch_size); else the what-if record's count."""
    hp = meta.get("hyperparameters")
    hp = hp if isinstance(hp, dict) else {}
    if n := _count(hp.get("num_mini_batches")):
        return n
    if caps.rollout_buffer:
        steps, size = _count(hp.get("n_steps")), _count(hp.get("batch_size"))
        envs = _count(hp.get("n_envs")) or _count(meta.get("n_envs"))
        if steps and size and envs:
            return -(-steps * envs // size)
    what_if = meta.get("what_if")
    sampling = what_if.get("sampling") if isinstance(what_if, dict) else None
    return (_count(sampling.get("minibatches_per_epoch")) or None) if isinstance(sampling, dict) else None


def every_minibatch(acc: StalenessTotals, per_epoch: int | None) -> bool:
    """Whether the kept envs' rows were in every minibatch of every epoch that has any."""
    return bool(per_epoch and acc.held.value and acc.held.value == acc.held_epochs.value * per_epoch)


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
        undrifted = {m: n for m, n in acc.module_rows.items() if acc.drift_rows.value and not acc.module_drift.get(m)}
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
        for label in ("epoch", "position"):
            rows: list[dict[str, Any]] = []
            for (module, layer, k), s in sorted(drift[label].items()):
                row = {"module": module, "layer": layer, label: LABELS[label](k), "rows": int(s[0])}
                rows.append(row | mean_max(s, 1, "drift_h") | mean_max(s, 4, "drift_c"))
            out[label] = rows
        seen = sorted({int(k[3]) for k in acc.update})
        per_epoch = max(minibatches_per_epoch(log.meta, log.caps) or 0, seen[-1] + 1 if seen else 0) or None
        by_update = []
        for (module, layer, ep, mb), s in acc.update.items():
            order = int(ep) * (per_epoch or 1) + int(mb)
            row = {"module": module, "layer": layer, "update": order, "epoch": int(ep), "minibatch": int(mb)}
            by_update.append(row | {"rows": int(s[0])} | mean_max(s, 1, "drift_h") | mean_max(s, 4, "drift_c"))
        by_update.sort(key=lambda r: (r["module"], r["layer"], r["update"]))
        kept = log.kept_envs
        note = None
        if ok is None and out["position"]:
            first_epoch = sorted({int(k[3]) for k in acc.update if k[2] == 0})
            note = staleness_words.provenance_note(acc.tagged.value, kept, first_epoch, per_epoch)
        return StalenessSection(
            sum(acc.first_rows.values()),
            first_h,
            first_c,
            ok,
            out["epoch"],
            by_update,
            out["position"],
            per_layer,
            provenance_tolerance=bound,
            train_rows=acc.train_rows.value,
            unmeasured_rows=acc.train_rows.value - acc.drift_rows.value - sum(undrifted.values()),
            undrifted=undrifted,
            minibatches_per_epoch=per_epoch,
            provenance_note=note,
            drift_minibatches=seen,
            # none where every minibatch held the kept envs (one minibatch an epoch: TorchRL's run)
            drift_from=None
            if kept is None or not out["epoch"] or every_minibatch(acc, per_epoch)
            else staleness_words.drift_from(kept, seen, per_epoch, acc.held.value, acc.held_epochs.value),
            kept_envs=kept,
            n_envs=log.n_envs,
            env_runners=log.env_runners,
            by_iteration=staleness_trend.by_iteration(acc.iteration),
            provenance_dropout=staleness_trend.dropout_cause(log.meta, per_layer, bound) if ok is False else None,
        )

    def to_json(self, data: StalenessSection) -> Any:
        return {k: v for k, v in super().to_json(data).items() if k != "provenance_dropout" or v is not None}

    def unavailable(self, data: StalenessSection, log: Log) -> list[str]:
        if not data.train_rows or data.provenance_ok is not None or log.caps.shards:  # shards: cross-process check
            return []
        if not data.by_position:
            why = log.not_measurable.get("staleness") or (
                "an own loop: tag env and env_step on its rollout and train calls, and keep lstm_probe.trace()'s "
                "default reference_window"
            )
            unpaired = "no train row was paired with the rollout state of its env step"
            return [f"staleness and the provenance check: {unpaired} ({why})"]
        # the reason is the staleness section's, shown there beside the drifts it qualifies: said once
        return [PROVENANCE_NOT_MADE] if data.provenance_note else []

    def warnings(self, data: StalenessSection, log: Log) -> list[str]:
        if data.provenance_ok is not False:
            return []
        if data.provenance_dropout:
            return [f"provenance check FAILED on the layers above the first alone: {data.provenance_dropout}"]
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
        kept = kept_columns(st.kept_envs, st.n_envs, st.env_runners)
        of = f" of {kept} (the only env columns with rows)" if kept else ""
        if st.provenance_ok is not None:
            c = "" if st.provenance_max_drift_c is None else f" and {st.provenance_max_drift_c:.2g} (c)"
            verdict = "OK" if st.provenance_ok else "FAILED"
            verdict += ", but on a global env_step" if st.global_pairing and st.provenance_ok else ""
            out.append(
                f"provenance check {verdict}: in the first minibatch (before any optimizer step) train states differ "
                f"from the rollout states of the same env step by at most {st.provenance_max_drift_h:.2g} (h){c} "
                f"relative to the rollout state's norm, over {st.provenance_check_rows:,} rows{of}"
                f"{_layers(st.provenance_by_layer)}{'; ' + st.global_pairing if st.global_pairing else ''}"
                + (f": {st.provenance_dropout}" if st.provenance_dropout else "")
            )
        last_epoch: dict[str, float] = {}
        layered = any(row["layer"] for row in st.by_epoch)
        for row in st.by_epoch:
            if row["layer"] == 0:
                last_epoch[row["module"]] = row["drift_h_mean"]
        when = "by the last epoch"
        if (update := last_update(st)) is not None:  # one epoch: by the end of an update
            when, last_epoch = f"by the last minibatch of an update ({update[0]})", update[1]
        where = " in layer 0" if layered else ""
        if len(last_epoch) == 2 and min(last_epoch.values()) > 0:
            a, b = last_epoch.get("actor"), last_epoch.get("critic")
            if a and b:
                ratio = b / a
                far, near = ("critic", "actor") if ratio >= 1 else ("actor", "critic")
                out.append(
                    f"{when} {far} states{of} are {max(ratio, 1 / ratio):.1f}x as far from their rollout "
                    f"states as {near} states{where} (mean relative drift actor {a:.2g}, critic {b:.2g})"
                )
        elif last_epoch:
            for m, v in last_epoch.items():
                out.append(
                    f"{when} {m} states{of}{where} drift {v:.2g} from the rollout states (mean relative L2 distance)"
                )
        out.extend(w for w in (unmeasured(st), staleness_trend.undrifted(st.undrifted)) if w is not None)
        return out

    def text(self, data: StalenessSection, caps: Capabilities) -> list[Block]:
        st = data
        if st.provenance_ok is None and not st.by_position:
            return []
        layered = len(st.provenance_by_layer) > 1 or any(row["layer"] for row in st.by_epoch)
        check = "provenance check (first minibatch of epoch 0, before any optimizer step)"
        out: list[Block] = []
        if st.provenance_ok is None:
            out.append(Line(f"{check}: not made: {safe(st.provenance_note or 'no train row of that minibatch')}"))
        else:
            status = (
                ("[yellow]OK[/]" if st.global_pairing else "[green]OK[/]") if st.provenance_ok else "[red]FAILED[/]"
            )
            global_ok = st.global_pairing if st.provenance_ok else None  # OK on a global env_step
            tf32 = ": cuDNN ran the LSTMs in TF32" if st.provenance_tolerance == TF32_PROVENANCE_TOLERANCE else ""
            why = f": {safe(st.provenance_dropout)}" if st.provenance_dropout else ""
            parts = []
            for r in st.provenance_by_layer:
                c = "" if r["max_drift_c"] is None else f", c {r['max_drift_c']:.2g}"
                layer = f"layer {r['layer']}: " if layered else ""
                parts.append(f"{layer}h {r['max_drift_h']:.2g}{c} over {r['rows']:,} rows")
            out.append(
                Line(
                    f"{check}: largest relative difference ||train - rollout|| / ||rollout|| between a train state "
                    f"and the rollout state of the same env step: {'; '.join(parts)} {status} (allowed "
                    f"{st.provenance_tolerance:g}{tf32}){why}{': but ' + global_ok if global_ok else ''}",
                    soft_wrap=True,
                )
            )
        has_c = any(not np.isnan(row["drift_c_mean"]) for row in st.by_epoch)
        rows = tuple(
            (safe(row["module"]),)
            + ((str(row["layer"]),) if layered else ())
            + (fmt(int(row["epoch"])), f"{row['rows']:,}", fmt(row["drift_h_mean"]), fmt(row["drift_h_max"]))
            + ((fmt(row["drift_c_mean"]), fmt(row["drift_c_max"])) if has_c else ())
            for row in st.by_epoch
        )
        table = Table(
            "Staleness: relative L2 drift ||train - rollout|| / ||rollout|| of train states from the rollout "
            "states of the same env step, by epoch",
            ("module",)
            + (("layer",) if layered else ())
            + ("epoch", "rows", "h mean", "h max")
            + (("c mean", "c max") if has_c else ()),
            rows,
        )
        if rows:
            out.append(table)

        def name(row: dict[str, Any]) -> str:
            return f"{safe(row['module'])}{' layer ' + str(row['layer']) if layered else ''}"

        pos = ", ".join(f"{name(r)} {r['position']}: {fmt(r['drift_h_mean'])}" for r in st.by_position)
        out.append(Line(f"mean h drift by position in sequence: {pos}"))
        per_epoch = st.minibatches_per_epoch
        epochs = any(r["epoch"] for r in st.by_update)  # one epoch: the order is the minibatch's
        order = f"epoch x {per_epoch} + minibatch; " if per_epoch and per_epoch > 1 and epochs else ""
        for module, layer in dict.fromkeys((r["module"], r["layer"]) for r in st.by_update):
            steps = [r for r in st.by_update if r["module"] == module and r["layer"] == layer]
            shown = ", ".join(f"{int(r['update'])}: {fmt(r['drift_h_mean'])}" for r in steps[:SHOWN_UPDATES])
            more = f", ... {len(steps) - SHOWN_UPDATES} more" if len(steps) > SHOWN_UPDATES else ""
            out.append(
                Line(
                    f"mean h drift of {name(steps[0])} by minibatch order in an iteration ({order}0 = before any "
                    f"optimizer step): {shown}{more}",
                    soft_wrap=True,
                )
            )
        out.extend(Line(words, soft_wrap=True) for words in staleness_trend.lines(st.trend, layered))
        if st.drift_from:
            out.append(Line(safe(st.drift_from), soft_wrap=True))
        out.extend(Line(w) for w in (unmeasured(st), staleness_trend.undrifted(st.undrifted)) if w is not None)
        return out


def _share(part: int, whole: int) -> str:
    """'34%' (never 0% or 100% for a part that is neither none nor all)."""
    p = 100 * part / whole
    return "<1%" if 0 < p < 1 else ">99%" if 99 < p < 100 else f"{p:.0f}%"


def unmeasured(st: StalenessSection) -> str | None:
    """Where some train rows have no drift (``unmeasured_rows``): how many, and why, as the section, its finding
    and the verdict say it; None where every train row has one (or none has)."""
    u, n = st.unmeasured_rows, st.train_rows - sum(st.undrifted.values())
    if not u or u >= n:
        return None
    return (
        f"drift measured on {_share(n - u, n)} of train rows ({n - u:,} of {n:,}: the samples whose rollout states "
        f"the probe still held, the latest rollout's); the other {_share(u, n)} ({u:,} rows) train from earlier "
        "rollouts' stored states, which the probe no longer holds (a replay buffer's samples of earlier collector "
        "batches): not judged"
    )


def last_update(st: StalenessSection) -> tuple[int, dict[str, float]] | None:
    """Where every train row is of one epoch (epoch 0: a loop of updates, not of epochs, as a replay buffer's) over
    more than one minibatch: the last minibatch and each module's mean layer-0 h drift at its last minibatch (the
    drift by the end of an update, as "by the last epoch" is of a loop of epochs); else None."""
    rows = [r for r in st.by_update if r["layer"] == 0 and r.get("drift_h_mean") is not None]
    if not rows or any(r["epoch"] for r in st.by_update) or len({r["minibatch"] for r in rows}) < 2:
        return None
    last: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["module"] not in last or r["minibatch"] > last[r["module"]]["minibatch"]:
            last[r["module"]] = r
    return max(r["minibatch"] for r in rows), {m: float(r["drift_h_mean"]) for m, r in last.items()}


def _layers(per_layer: list[dict[str, Any]]) -> str:
    """' (layers 0 and 1)' where the check covered more than one layer, else ''."""
    if len(per_layer) < 2:
        return ""
    names = [str(r["layer"]) for r in per_layer]
    return f" (layers {', '.join(names[:-1])} and {names[-1]})"
