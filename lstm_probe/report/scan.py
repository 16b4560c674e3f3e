"""The scalar scan: the first layer's scalar columns, read in runs of whole iterations in bounded memory.

:func:`scan` reads each run (:func:`chunks`) with :func:`read_scalars` and hands it, as a :class:`Chunk`,
to every section's accumulator; each run adds into a fresh accumulator that is then merged into the
total, so the result does not depend on where the runs are cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from lstm_probe.report.numeric import present, row_key

SCAN_BATCH = 1 << 18
"""Rows per batch while the scalar columns are read."""
SMALL_INTS = ("iteration", "epoch", "minibatch", "seq", "seq_len", "env", "episode", "episode_step")
REPORT_CHUNK_ROWS = 4_000_000
"""First-layer rows the report reads at once. A larger log is read in runs of whole iterations of up to this
many rows (~110 bytes a row at the peak), so the report's memory is bounded by this, not by the log's size
(an iteration larger than this is read whole). Every section adds up over the runs."""
COLUMNS = [
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
"""The scalar columns the scan reads (and ``worker`` where the log has it)."""
FIRST_LAYER = (ds.field("layer") == 0) & (ds.field("t") >= 0)
"""The rows the scan reads: initial-state rows (t = -1, RLlib learners) are read by the cross-process check only."""


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


def chunks(data: ds.Dataset, filt: ds.Expression, chunk_rows: int) -> list[tuple[ds.Expression, int]]:
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


def duplicates(df: pd.DataFrame) -> int:
    """Rows that repeat another's (call, batch column, step): rows are identifiable so only where env or
    seq names the column (a call is one module; layer 0 here). One sort of one int64 key per row."""
    seq, env = df["seq"].to_numpy(), df["env"].to_numpy()
    col = np.where(np.isnan(seq), env, seq)
    tagged = present(col)
    columns = [c[tagged] for c in (df["call"].to_numpy(), col, df["t"].to_numpy())]
    del seq, env, col
    key = row_key(columns)
    if key is None:  # call ids far apart (processes' id blocks): three keys, sorted together
        order = np.lexsort(columns[::-1])
        same = np.ones(len(order) - 1 if len(order) else 0, bool)
        for c in columns:
            same &= np.diff(c[order]) == 0
        return int(same.sum())
    del columns
    key.sort()
    return int((key[1:] == key[:-1]).sum())


@dataclass
class Chunk:
    """One run of whole iterations of first-layer rows, as :func:`read_scalars` returns them (train rows
    from ``front`` on), with the views sections share (computed once, on first use; no copies of the rows)."""

    df: pd.DataFrame
    front: int
    train_module: str | None
    """The module whose train rows minibatches and sequences are counted on: the first one to train in the log."""
    roll_module: str | None
    """The module whose rollout rows episodes are counted on: the first one in the rollout in the log."""

    @cached_property
    def train(self) -> pd.DataFrame:
        return self.df.iloc[self.front :]  # no copy: read_scalars packed the train rows at the end

    @cached_property
    def roll(self) -> pd.DataFrame:
        others = self.df.iloc[: self.front]
        return others[(others["phase"] == "rollout").to_numpy()]

    @cached_property
    def train_sel(self) -> np.ndarray:
        """The train rows of :attr:`train_module`."""
        return (self.train["module"] == self.train_module).to_numpy()

    @cached_property
    def starts(self) -> np.ndarray:
        """Positions in :attr:`train` of the sequences' first rows: for the rows of :attr:`train_module`, the
        first t == 0 row of each (iteration, epoch, minibatch, seq), nulls alike (a small subset: no copy)."""
        sel = self.train_sel
        if not sel.any():
            return np.zeros(0, np.intp)
        train = self.train
        pos = np.flatnonzero(sel & (train["t"].to_numpy() == 0))
        keys = pd.DataFrame({c: train[c].to_numpy()[pos] for c in ("iteration", "epoch", "minibatch", "seq")})
        return pos[~keys.duplicated().to_numpy()]


@dataclass
class ScanTotals:
    """What the scan itself finds, whatever the sections: duplicate rows and the number of iterations."""

    duplicates: int = 0
    iterations: int = 0
    train_module: str | None = None
    roll_module: str | None = None


def scan(data: ds.Dataset, accumulators: Sequence[Any], chunk_rows: int) -> ScanTotals:
    """Read the first layer's scalar rows in runs of whole iterations and add each run into every
    accumulator (a fresh one per run, merged into the total)."""
    cols = COLUMNS + (["worker"] if "worker" in data.schema.names else [])
    totals = ScanTotals()
    for filt, rows in chunks(data, FIRST_LAYER, chunk_rows):
        df, front = read_scalars(data, cols, filt, rows)
        if "worker" not in df:
            df["worker"] = np.float32(np.nan)
        totals.duplicates += duplicates(df)
        if len(df) and df["iteration"].notna().any():
            totals.iterations = max(totals.iterations, int(df["iteration"].max()) + 1)
        chunk = Chunk(df, front, totals.train_module, totals.roll_module)
        if totals.train_module is None and len(chunk.train):
            chunk.train_module = totals.train_module = str(chunk.train["module"].iloc[0])
        if totals.roll_module is None and len(chunk.roll):
            chunk.roll_module = totals.roll_module = str(chunk.roll["module"].iloc[0])
        for acc in accumulators:
            part = type(acc)()
            part.add(chunk)
            acc.merge(part)
        del df, chunk
    return totals
