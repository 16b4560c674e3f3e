"""Vector columns read compacted: only the rows that hold a vector take its width.

A wide run's log (``--capture summary --trace-envs K``) keeps h and c for K of its envs, and a
``--capture-obs`` log keeps obs on rollout rows only: the other rows' vectors are null. Arrow allocates a
fixed-size list's full width for every row, null or not, so ``load`` of a 1,024-env ``--trace-envs 16`` log
(887,808 rows, LSTM 256) would hold 3.8 GiB for ~30 MB of vectors and was refused. Read here row group by
row group, each vector column keeps its stored vectors alone (one array per column and row group), and
comes back as pandas would give it (a column of numpy arrays, None where null, each a view into its row
group's array); the scalar columns come back as a table. The budget counts what is held: the scalar columns,
the stored vectors (from the footer: a fixed-size list's leaf holds W values per stored vector and one per
null) and the row groups being decoded at full width, as a streaming read counts them
(``budget.check_stream``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lstm_probe.log import budget

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.dataset as ds

SPARSE = 0.5
"""A vector column is read compacted when fewer than this share of the rows read hold a vector."""
VIEW_BYTES = 112
"""A numpy array object (a view of one row's vector) in a pandas object column, besides its values."""


def sparse_columns(data: ds.Dataset, columns: list[str]) -> list[str]:
    """The vector columns among ``columns`` that are better read compacted (:data:`SPARSE`)."""
    return [n for n, (rows, held, _) in budget.vectors_stored(data, columns).items() if rows and held < SPARSE * rows]


def table(
    data: ds.Dataset, columns: list[str], compact: list[str], filt: ds.Expression | None, what: str, fix: str
) -> tuple[pa.Table, dict[str, pd.Series]]:
    """``columns`` of the rows ``filt`` selects, within the budget: the columns not in ``compact`` as one
    table, each of ``compact`` as a pandas object column (:func:`series`) of the same rows."""
    import pyarrow as pa

    dense = [c for c in columns if c not in compact]
    sizes = budget.groups(data, columns)
    rows = sum(n for _, n in sizes)
    kept = budget.kept_rows(data, filt, rows, what)
    scalars = sum(size for size, _ in budget.groups(data, dense))
    vectors = sum(
        min(held, kept) * (size + VIEW_BYTES) for _, held, size in budget.vectors_stored(data, compact).values()
    )
    largest = sorted((size for size, _ in sizes), reverse=True)[: budget.HELD]
    need = budget.DECODE * (scalars * kept // max(rows, 1) + sum(largest)) + vectors + kept * 8 * len(compact)
    budget.refuse(need, what, fix)
    stored = 0  # the vectors' bytes as read: a footer's counts are the file's word, checked as the rows come
    parts: list[pa.RecordBatch] = []
    held: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in compact}
    scanner = data.scanner(columns=columns, filter=filt, batch_readahead=0, fragment_readahead=1)
    for batch in scanner.to_batches():
        for name in compact:
            arr = batch.column(name)
            valid = arr.is_valid().to_numpy(zero_copy_only=False)
            width = arr.type.list_size
            values = arr.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
            held[name].append((valid, values))
            stored += values.nbytes + len(values) * VIEW_BYTES
        if stored > vectors:
            budget.refuse(need - vectors + stored, what, fix)
        parts.append(batch.select(dense))
    schema = pa.schema([data.schema.field(c) for c in dense], metadata=data.schema.metadata)
    return pa.Table.from_batches(parts, schema=schema), {n: series(pieces) for n, pieces in held.items()}


def series(pieces: list[tuple[np.ndarray, np.ndarray]]) -> pd.Series:
    """One object column from each batch's (valid mask, stored vectors): None where null, else a view of the
    row's vector (as pyarrow's ``to_pandas`` gives a fixed-size list column)."""
    import pandas as pd

    n = sum(len(valid) for valid, _ in pieces)
    out = np.full(n, None, dtype=object)
    at = 0
    for valid, values in pieces:
        where = np.flatnonzero(valid) + at
        col: list[Any] = list(values)
        out[where] = _objects(col)
        at += len(valid)
    return pd.Series(out, dtype=object)


def _objects(items: list[Any]) -> np.ndarray:
    """``items`` (numpy arrays) as a 1-d object array of them (``np.asarray`` would stack them)."""
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out
