"""The scalar scan: the first layer's scalar columns, read in runs of whole iterations in bounded memory.

:func:`scan` reads each run (:func:`chunks`) with :func:`read_scalars` and hands it, as a :class:`Chunk`,
to every section's accumulator; each run adds into a fresh accumulator that is then merged into the
total, so the result does not depend on where the runs are cut. The rows are a :class:`Frame` of numpy
arrays (no pandas: ``lstm-probe report`` starts without importing it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from lstm_probe.log import budget
from lstm_probe.report.numeric import dense_key, present, row_key
from lstm_probe.report.reading import first_layer_only, is_parquet, row_groups, stream, with_dictionaries

Progress: TypeAlias = Callable[[str, int, int], None]
"""``progress(step, done, total)``, called as a report reads a log (``summarize(progress=...)``): step
``"rows"`` with the first-layer rows read so far and the log's rows, after each run of iterations; then each
section that reads more of the log, by its key, with the sections done so far and their number. It only
tells (the CLI draws a line on a terminal); the report never prints."""
SCAN_BATCH = 1 << 18
"""Rows per batch while the scalar columns are read."""
SMALL_INTS = ("iteration", "epoch", "minibatch", "seq", "seq_len", "env", "episode", "episode_step")
"""Nullable counters of :data:`COLUMNS` read as float32 (NaN = null; exact below 2**24), not float64."""
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
    "episode_start",
    "drift_h",
    "drift_c",
    "bootstrap",
]
"""The scalar columns the scan reads (and ``worker`` where the log has it): a deliberate subset, kept by
hand (docs/architecture.md's column recipe), since every column read costs memory for every first-layer row
of a run. A section that needs another column adds it here (a nullable counter also to :data:`SMALL_INTS`,
read as float32)."""
FIRST_LAYER = (ds.field("layer") == 0) & (ds.field("t") >= 0)
"""The rows the scan reads: initial-state rows (t = -1, RLlib learners) are read by the cross-process check only."""


class Frame:
    """Named numpy columns of equal length. A string column is held as integer codes (-1: null) into its
    words (:meth:`words`); the others as their values (nullable counters as floats, NaN = null)."""

    def __init__(self, columns: dict[str, np.ndarray], words: dict[str, list[str]] | None = None) -> None:
        self.columns = columns
        self._words = words or {}
        self._n = len(next(iter(columns.values()))) if columns else 0

    def __len__(self) -> int:
        return self._n

    def __contains__(self, name: str) -> bool:
        return name in self.columns

    def __getitem__(self, name: str) -> np.ndarray:
        """The column's values (a string column's codes)."""
        return self.columns[name]

    def __setitem__(self, name: str, values: Any) -> None:
        self.columns[name] = np.broadcast_to(values, (self._n,)) if np.ndim(values) == 0 else values

    def words(self, name: str) -> list[str]:
        """A string column's words: code i is ``words[i]``."""
        return self._words[name]

    def equals(self, name: str, word: str | None) -> np.ndarray:
        """Rows whose string column ``name`` holds ``word`` (null rows never)."""
        words = self._words[name]
        if word not in words:
            return np.zeros(self._n, bool)
        return self.columns[name] == words.index(word)

    def word(self, name: str, i: int) -> str | None:
        """The string at row ``i`` (None: null)."""
        code = int(self.columns[name][i])
        return self._words[name][code] if code >= 0 else None

    def counts(self, name: str, rows: Any = slice(None)) -> dict[str, int]:
        """How often each word of string column ``name`` occurs in ``rows`` (nulls left out; words that do
        not occur left out)."""
        codes = self.columns[name][rows]
        codes = codes[codes >= 0]
        n = np.bincount(codes.astype(np.intp), minlength=len(self._words[name]))
        return {w: int(k) for w, k in zip(self._words[name], n.tolist(), strict=True) if k}

    def take(self, rows: Any) -> Frame:
        """The rows a slice (views, no copy), a boolean mask or positions select."""
        return Frame({k: v[rows] for k, v in self.columns.items()}, self._words)


def _codes(arr: pa.Array, words: dict[str, int], seen: dict[int, tuple[pa.Array, np.ndarray, bool]]) -> np.ndarray:
    """A string (or dictionary) array as codes into ``words`` (new words added; null: -1). Where the
    array's dictionary is ``words``' own order and no value is null (a log's row groups mostly), its
    indices are the codes, without a copy. ``seen``: the last dictionary met for ``words`` and its codes (the
    batches of a row group, and most row groups, share one: not turned into Python strings again)."""
    enc = arr if pa.types.is_dictionary(arr.type) else arr.dictionary_encode()
    last = seen.get(id(words))
    if last is not None and last[0].equals(enc.dictionary):
        remap, same = last[1], last[2]
    else:
        remap = np.array(
            [words.setdefault(w, len(words)) if w is not None else -1 for w in enc.dictionary.to_pylist()] + [-1],
            np.int32,
        )
        same = bool(np.array_equal(remap[:-1], np.arange(len(remap) - 1)))
        seen[id(words)] = (enc.dictionary, remap, same)
    n = len(enc)
    if enc.null_count == n:  # every value null (a column the rows' phase does not fill)
        return np.broadcast_to(np.int32(-1), (n,))
    if not enc.null_count:
        if len(remap) == 2:  # one word (a phase-pure row group's module, phase, path): its code, not gathered
            return np.broadcast_to(remap[0], (n,))
        indices = enc.indices.to_numpy()
        return indices if same else remap[indices]
    return remap[enc.indices.fill_null(len(remap) - 1).to_numpy(zero_copy_only=False)]


def read_scalars(
    data: ds.Dataset,
    columns: list[str],
    filt: ds.Expression | None,
    rows: int | None = None,
    iterations: tuple[int, int] | None = None,
    extra: Sequence[str] = (),
    feeds: Sequence[Feed] = (),
) -> tuple[Frame, int]:
    """The scalar columns in compact form, read batch by batch into preallocated arrays: nullable
    small counters as float32 (NaN = null; exact below 2**24), strings as codes into their words, booleans as
    bool (null: False). Train rows (the
    bulk of a log) are packed at the end, so that ``frame.take(slice(front, None))`` is the train rows without a
    copy. Peak memory is about the result plus one batch, whatever the size of the log. ``rows``: the
    number of rows the filter selects, when known (a scan fewer). ``data`` may read strings as
    dictionaries (:func:`with_dictionaries`). ``iterations`` (lowest, highest, or :data:`NULLS`; ``columns`` hold
    ``iteration``): the rows of those iterations, selected here from whole batches, where ``filt`` only
    chooses row groups by their statistics and selects every row of them but by iteration (Arrow's row
    filter copies every column of every batch: ~0.25 s CPU per 10M rows, where nearly every batch is
    inside the run). ``feeds``: handed each batch (with ``extra`` columns read too) where no filter selects rows
    (``filt`` None or ``iterations``; a dataset of Parquet files)."""
    n = data.count_rows(filter=filt) if rows is None else rows
    out: dict[str, np.ndarray] = {}
    vocab: dict[str, dict[str, int]] = {}
    seen: dict[int, tuple[pa.Array, np.ndarray, bool]] = {}  # :func:`_codes`' last dictionary of each column
    for name in columns:
        typ = data.schema.field(name).type
        if name in SMALL_INTS or pa.types.is_floating(typ):
            out[name] = np.empty(n, np.float32)
        elif pa.types.is_string(typ) or pa.types.is_dictionary(typ):
            out[name] = np.empty(n, np.int8)  # categorical codes: a handful of words (widened if not)
            vocab[name] = {}
        elif pa.types.is_boolean(typ):
            out[name] = np.empty(n, np.bool_)
        elif pa.types.is_integer(typ) and data.schema.field(name).nullable:
            out[name] = np.empty(n, np.float64)  # a nullable counter too large for float32: NaN = null
        else:
            out[name] = np.empty(n, typ.to_pandas_dtype())
    front, back = 0, n  # other rows fill from the front, train rows from the back
    if iterations is not None:
        assert filt is not None and "iteration" in columns
        data, filt = row_groups(data, filt), None
    budget.refuse(n * 8 * len(columns), f"the report's scan of {n:,} rows")
    budget.check_stream(data, [*columns, *(c for c in extra if c not in columns)], "the report's scan")
    if filt is None and is_parquet(data):  # read as asked (:func:`stream`), not ahead of this loop's work
        batches = stream(data, [*columns, *(c for c in extra if c not in columns)], SCAN_BATCH)
    else:
        assert not feeds, "a filtered read is fed to no reader"
        batches = data.to_batches(
            columns=columns, filter=filt, batch_size=SCAN_BATCH, batch_readahead=2, fragment_readahead=1
        )
    for batch in batches:
        if iterations is not None:
            batch = _within(batch, iterations)
        m = batch.num_rows
        if not m:
            continue
        for feed in feeds:
            feed.add(batch)
        phase = _codes(batch.column("phase"), vocab["phase"], seen)
        is_train = phase == vocab["phase"].get("train", -2)
        k_train = int(is_train.sum())
        k_other = m - k_train
        into = _runs(is_train, k_train, front, back)
        for name in columns:
            arr = batch.column(name)
            if name == "phase":
                values = phase
            elif name in vocab:
                values = _codes(arr, vocab[name], seen)
            elif arr.null_count == m and out[name].dtype.kind == "f":  # every value null: NaN, nothing to convert
                values = np.broadcast_to(np.float32(np.nan), (m,))
            elif out[name].dtype.kind == "b":
                values = bools(arr)
            else:  # numbers: nulls come as NaN (integers with nulls as float64), cast on assignment below
                values = arr.to_numpy(zero_copy_only=False)
            if name in vocab and len(vocab[name]) > np.iinfo(out[name].dtype).max:
                out[name] = out[name].astype(np.int32)
            for dest, sel in into:
                out[name][dest] = values[sel]
        front += k_other
        back -= k_train
    assert front == back, "row count changed while reading"
    return Frame(out, {name: list(words) for name, words in vocab.items()}), front


def bools(arr: pa.Array) -> np.ndarray:
    """A boolean array as numpy bools (null: False), unpacked from its bitmaps: Arrow converts one with nulls to
    Python objects, and ``fill_null`` copies it first (~13 ms per 1M rows)."""
    validity, values = arr.buffers()[:2]
    n, offset = len(arr), arr.offset

    def bits(buf: pa.Buffer) -> np.ndarray:
        return np.unpackbits(np.frombuffer(buf, np.uint8), count=offset + n, bitorder="little")[offset:].view(np.bool_)

    if values is None:
        return np.zeros(n, np.bool_)
    out = bits(values)
    if arr.null_count and validity is not None:
        out &= bits(validity)
    return out


NULLS = (1, 0)
"""``read_scalars(iterations=NULLS)``: the rows without an iteration (the last run of a log that has some)."""


def _within(batch: pa.RecordBatch, iterations: tuple[int, int]) -> pa.RecordBatch:
    """The rows of ``batch`` within ``iterations`` (lowest, highest; :data:`NULLS`: those without one), in order:
    the batch itself or a slice of it (no copy) where they are one stretch (a run's edge), else filtered
    (Arrow's filter copies every column: ~35 ms a batch, 0.3 s of a 9.9M-row log's scan)."""
    col = batch.column("iteration")
    if iterations == NULLS:
        if col.null_count in (0, len(col)):
            return batch if col.null_count else batch.slice(0, 0)
        mask = col.is_null().to_numpy(zero_copy_only=False)
    else:
        if not col.null_count:
            bounds = pc.min_max(col)
            lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
            if lo is None or (iterations[0] <= lo and hi <= iterations[1]):
                return batch
        it = col.to_numpy(zero_copy_only=False)  # nulls: NaN, in no run
        mask = (it >= iterations[0]) & (it <= iterations[1])
    inside = np.flatnonzero(mask)
    if not len(inside) or inside[-1] - inside[0] + 1 == len(inside):
        return batch.slice(int(inside[0]) if len(inside) else 0, len(inside))
    return batch.filter(pa.array(mask))


RUNS = 64
"""Most runs of one phase kind in a batch that :func:`read_scalars` copies run by run (slices); more, by masks."""


def _runs(is_train: np.ndarray, k_train: int, front: int, back: int) -> list[tuple[slice, Any]]:
    """Where a batch's rows go in :func:`read_scalars`' arrays: (destination, rows of the batch) pairs, the other
    rows from ``front`` on and the train rows up to ``back``, each in batch order. A batch of the writer's
    phase-pure row groups is a few runs of one kind (a batch spans row groups), copied as slices: boolean
    masks over every column cost ~0.5 s CPU per 10M rows."""
    m, k_other = len(is_train), len(is_train) - k_train
    if not k_train or not k_other:  # phase-pure: copied whole
        return [(slice(front, front + m), slice(None))] if k_other else [(slice(back - m, back), slice(None))]
    edges = np.flatnonzero(is_train[1:] != is_train[:-1]) + 1
    if len(edges) >= RUNS:
        return [(slice(front, front + k_other), ~is_train), (slice(back - k_train, back), is_train)]
    into: list[tuple[slice, Any]] = []
    other, train = front, back - k_train
    for a, b in zip([0, *edges.tolist()], [*edges.tolist(), m], strict=True):
        if is_train[a]:
            into.append((slice(train, train + b - a), slice(a, b)))
            train += b - a
        else:
            into.append((slice(other, other + b - a), slice(a, b)))
            other += b - a
    return into


def fit(chunk_rows: int, columns: int) -> int:
    """``chunk_rows``, or fewer where a run of that many rows of ``columns`` columns would not fit the memory
    budget (``--max-memory``): a run's columns (counted as :func:`read_scalars` counts them) take at most half
    of it, the rest left to the sections' own reads and totals. The report does not depend on the runs, so a
    smaller budget reads any log in more, smaller runs instead of refusing it."""
    return max(1, min(chunk_rows, budget.limit() // (2 * 8 * max(columns, 1))))


def chunks(data: ds.Dataset, filt: ds.Expression | None, chunk_rows: int) -> list[tuple[ds.Expression | None, int]]:
    """Filters that split the rows ``filt`` selects into runs of whole iterations of at most ``chunk_rows``
    rows (an iteration larger than that alone; rows without an iteration last), each with its row count.
    One pass over the iteration column; a log of at most ``chunk_rows`` rows is one run, unfiltered."""
    return [(f, n) for f, n, _ in _plan(data, filt, chunk_rows)]


def _plan(
    data: ds.Dataset, filt: ds.Expression | None, chunk_rows: int
) -> list[tuple[ds.Expression | None, int, tuple[int, int] | None]]:
    """:func:`chunks`, each run with its iterations (lowest, highest; None: every row ``filt`` selects, or the
    rows without an iteration)."""
    parts: list[tuple[np.ndarray, np.ndarray]] = []  # each batch's distinct iterations and their rows
    nulls = 0
    for batch in data.scanner(columns=["iteration"], filter=filt, batch_size=SCAN_BATCH).to_batches():
        col = batch.column("iteration")
        nulls += col.null_count
        parts.append(_counted(col.drop_null().to_numpy().astype(np.int64)))
    values = np.concatenate([v for v, _ in parts]) if parts else np.zeros(0, np.int64)
    counts = np.concatenate([n for _, n in parts]) if parts else np.zeros(0, np.int64)
    del parts
    total = int(counts.sum()) + nulls
    if total <= chunk_rows:
        return [(filt, total, None)]
    iterations, where = np.unique(values, return_inverse=True)
    per_iteration = np.bincount(where, weights=counts, minlength=len(iterations)).astype(np.int64)
    out: list[tuple[ds.Expression | None, int, tuple[int, int] | None]] = []
    iteration = ds.field("iteration")

    def run(lo: int, hi: int) -> ds.Expression:
        within = (iteration >= lo) & (iteration <= hi)
        return within if filt is None else filt & within

    lo = hi = rows = 0
    for it, n in zip(iterations.tolist(), per_iteration.tolist(), strict=True):
        if rows and rows + n > chunk_rows:
            out.append((run(lo, hi), rows, (lo, hi)))
            rows = 0
        if not rows:
            lo = it
        hi, rows = it, rows + n
    if rows:
        out.append((run(lo, hi), rows, (lo, hi)))
    if nulls:
        out.append((iteration.is_null() if filt is None else filt & iteration.is_null(), nulls, None))
    return out


def _counted(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_counts=True)``, counted without a sort where the values span a small range
    (a batch's iterations: a few)."""
    if not len(values):
        return values, np.zeros(0, np.int64)
    lo, hi = int(values.min()), int(values.max())
    if hi - lo > 4 * len(values) + (1 << 16):
        return np.unique(values, return_counts=True)
    counts = np.bincount(values - lo, minlength=hi - lo + 1)
    seen = np.flatnonzero(counts)
    return seen + lo, counts[seen]


def duplicates(df: Frame | dict[str, np.ndarray]) -> int:
    """Rows that repeat another's (call, batch column, step): rows are identifiable so only where env or
    seq names the column (a call is one module; layer 0 here). One sort of one int64 key per row."""
    seq, env = np.asarray(df["seq"]), np.asarray(df["env"])
    col = np.where(np.isnan(seq), env, seq)
    tagged = present(col)
    columns = [np.asarray(c)[tagged] for c in (df["call"], col, df["t"])]
    del seq, env, col
    key = row_key(columns)
    if key is None:  # call ids far apart (processes' id blocks): three keys, sorted together
        order = np.lexsort(columns[::-1])
        same = np.ones(len(order) - 1 if len(order) else 0, bool)
        for c in columns:
            same &= np.diff(c[order]) == 0
        return int(same.sum())
    del columns
    # stable (timsort): a log's rows come nearly in key order (runs of a call's columns and steps), which it
    # merges ~4x faster than quicksort sorts them (a 4M-row run: 0.06 s instead of 0.23 s)
    key.sort(kind="stable")
    return int((key[1:] == key[:-1]).sum())


@dataclass
class Chunk:
    """One run of whole iterations of first-layer rows, as :func:`read_scalars` returns them (train rows
    from ``front`` on), with the views sections share (computed once, on first use; no copies of the rows)."""

    df: Frame
    front: int
    train_module: str | None
    """The module whose train rows minibatches and sequences are counted on: the first one to train in the log."""
    roll_module: str | None
    """The module whose rollout rows episodes are counted on: the first one in the rollout in the log."""

    @cached_property
    def train(self) -> Frame:
        return self.df.take(slice(self.front, None))  # no copy: read_scalars packed the train rows at the end

    @cached_property
    def roll(self) -> Frame:
        others = self.df.take(slice(None, self.front))
        rollout = others.equals("phase", "rollout")
        return others if rollout.all() else others.take(rollout)  # every other row a rollout one: views

    @cached_property
    def train_sel(self) -> np.ndarray:
        """The train rows of :attr:`train_module`."""
        return self.train.equals("module", self.train_module)

    @cached_property
    def starts(self) -> np.ndarray:
        """Positions in :attr:`train` of the sequences' first rows: for the rows of :attr:`train_module`, the
        first t == 0 row of each (iteration, epoch, minibatch, seq), nulls alike (a small subset: no copy)."""
        sel = self.train_sel
        if not sel.any():
            return np.zeros(0, np.intp)
        train = self.train
        pos = np.flatnonzero(sel & (train["t"] == 0))
        key = dense_key([train[c][pos] for c in ("iteration", "epoch", "minibatch", "seq")])
        first = np.unique(key, return_index=True)[1]  # each key's first row (nulls alike)
        first.sort()
        return pos[first]


@dataclass
class ScanTotals:
    """What the scan itself finds, whatever the sections: duplicate rows and the number of iterations."""

    duplicates: int = 0
    iterations: int = 0
    train_module: str | None = None
    roll_module: str | None = None


class Feed(Protocol):
    """A reader of the scan's own batches (:func:`scan`'s ``feeds``): its columns read with the scan's, each
    batch handed to it as read."""

    columns: list[str]

    def add(self, batch: pa.RecordBatch) -> None: ...


def scan(
    data: ds.Dataset,
    accumulators: Sequence[Any],
    chunk_rows: int,
    progress: Progress | None = None,
    feeds: Sequence[Feed] = (),
    plain: bool | None = None,
) -> ScanTotals:
    """Read the first layer's scalar rows in runs of whole iterations and add each run into every
    accumulator (a fresh one per run, merged into the total); ``progress("rows", read, log's rows)`` after
    each run. ``feeds`` (only where :func:`first_layer_only`, passed as ``plain`` where known): handed every
    batch of the log's rows with their columns, in runs of whole iterations, each run in log order."""
    cols = COLUMNS + (["worker"] if "worker" in data.schema.names else [])
    totals = ScanTotals()
    # every row a first-layer one (row-group statistics say so without reading rows: a log of one-layer
    # modules without initial-state rows): runs are cut by iteration alone, their rows selected in numpy
    plain = first_layer_only(data) if plain is None else plain
    layer_type = data.schema.field("layer").type
    read = [c for c in cols if c != "layer"] if plain and pa.types.is_integer(layer_type) else cols
    assert plain or not feeds, "only a log of first-layer rows is fed to other readers"
    extra = list(dict.fromkeys(c for f in feeds for c in f.columns if c not in read))
    strings = with_dictionaries(data, cols + extra)
    plan = _plan(data, None if plain else FIRST_LAYER, fit(chunk_rows, len(read)))
    total, done = sum(rows for _, rows, _ in plan), 0
    if progress is not None:
        progress("rows", 0, total)
    for filt, rows, iterations in plan:
        # every row first-layer: a run's rows (those without an iteration too) selected in numpy, feeds fed
        its = (iterations if iterations is not None else None if filt is None else NULLS) if plain else None
        df, front = read_scalars(strings, read, filt, rows, its, extra, feeds)
        if "layer" not in df:  # every row's layer is 0, as the statistics say: not read
            df["layer"] = np.zeros(1, layer_type.to_pandas_dtype())[0]
        if "worker" not in df:
            df["worker"] = np.float32(np.nan)
        totals.duplicates += duplicates(df)
        iteration = df["iteration"]
        if len(df) and not np.isnan(iteration).all():
            totals.iterations = max(totals.iterations, int(np.nanmax(iteration)) + 1)
        chunk = Chunk(df, front, totals.train_module, totals.roll_module)
        # the module of the first call (not of the first row read: which row comes first in a run depends on
        # the log's row groups, the call order does not)
        if totals.train_module is None and len(chunk.train):
            first = int(np.argmin(chunk.train["call"]))
            chunk.train_module = totals.train_module = str(chunk.train.word("module", first))
        if totals.roll_module is None and len(chunk.roll):
            first = int(np.argmin(chunk.roll["call"]))
            chunk.roll_module = totals.roll_module = str(chunk.roll.word("module", first))
        for acc in accumulators:
            part = type(acc)()
            part.add(chunk)
            acc.merge(part)
        del df, chunk
        done += rows
        if progress is not None:
            progress("rows", done, total)
    return totals
