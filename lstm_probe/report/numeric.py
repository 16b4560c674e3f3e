"""Vectorized grouping for the report: one int64 key per row, group numbers, per-group count/sum/max.

Rows are never turned into Python objects: a log holds millions of them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# the checks of a log's metadata values, kept beside the reader's types (sections import them from here)
from lstm_probe.log.metadata_types import is_count as is_count
from lstm_probe.log.metadata_types import is_number as is_number

KEY_CHUNK = 1 << 20
"""Rows per slice while keys are built: temporaries stay a few MB whatever the log's size."""


def present(values: np.ndarray) -> Any:
    """An index of the values that are not NaN: every row (a slice, no copy) when none is."""
    if values.dtype.kind != "f":
        return slice(None)
    missing = np.isnan(values)
    return ~missing if missing.any() else slice(None)


def _layout(columns: list[np.ndarray]) -> list[tuple[np.ndarray, int, int | None, int]] | None:
    """Per column of a :func:`row_key`: the column, its lowest value, its null code (None: no nulls) and its
    width; None when the values do not fit one int64."""
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
    return parts


def row_key(columns: list[np.ndarray]) -> np.ndarray | None:
    """One int64 per row that orders as the tuple of ``columns`` (integers, or floats with NaN as null,
    which sorts last), or None when the values do not fit one int64. Keys of small counters are dense:
    their range is about the number of distinct tuples (see :func:`groups`)."""
    parts = _layout(columns)
    return None if parts is None else _key(parts, len(columns[0]))


def _key(parts: list[tuple[np.ndarray, int, int | None, int]], n: int) -> np.ndarray:
    key = np.empty(n, np.int64)
    for start in range(0, n, KEY_CHUNK):
        k = key[start : start + KEY_CHUNK]
        for i, (col, lo, null, width) in enumerate(parts):
            v = col[start : start + KEY_CHUNK]
            if null is not None:
                v = np.where(np.isnan(v), null, v)
            if i:
                k *= width
            # integers before adding: int64 + float would be computed in float64, exact only below 2**53
            if not i:
                k[...] = v  # cast to int64 (floats hold whole numbers here)
            elif v.dtype.kind == "f":
                k += v.astype(np.int64)
            else:
                k += v
            if lo:
                k -= lo
    return key


def labelled_groups(columns: list[np.ndarray]) -> tuple[np.ndarray, int, list[np.ndarray]] | None:
    """:func:`groups` of the :func:`row_key` of ``columns``, with each group's value of every column (float64,
    NaN: null), read off its key instead of gathered from its rows; None when the values do not fit one
    int64."""
    parts = _layout(columns)
    if parts is None:
        return None
    inv, n, distinct = _groups(_key(parts, len(columns[0])), keys=True)
    labels = []
    for _, lo, null, width in reversed(parts):
        code = distinct % width
        distinct = distinct // width
        values = (code + lo).astype(np.float64)
        if null is not None:
            values[code + lo == null] = np.nan
        labels.append(values)
    return inv, n, labels[::-1]


def dense_key(columns: list[np.ndarray]) -> np.ndarray:
    """One int64 per row that orders as the tuple of ``columns`` (as :func:`row_key`, NaN as null, sorted
    last), whatever the values' range: where they do not fit one int64 together, each column is replaced
    by its rank among its distinct values and the ranks are combined two at a time (each pair's product
    stays below the rows squared)."""
    key = row_key(columns)
    if key is not None:
        return key
    ranks = [np.unique(c, return_inverse=True)[1].reshape(-1).astype(np.int64) for c in columns]  # NaN: one rank, last
    key = ranks[0]
    for r in ranks[1:]:
        key = np.unique(key * (int(r.max()) + 1 if len(r) else 1) + r, return_inverse=True)[1].reshape(-1)
    return key.astype(np.int64)


def groups(key: np.ndarray) -> tuple[np.ndarray, int]:
    """The group number of each row (groups in key order) and the number of groups."""
    inv, n, _ = _groups(key)
    return inv, n


def _groups(key: np.ndarray, keys: bool = False) -> tuple[np.ndarray, int, np.ndarray]:
    """:func:`groups`, and with ``keys`` the groups' keys (int64, in order; else an empty array)."""
    top = int(key.max()) + 1 if len(key) else 0
    if top <= 4 * len(key) + (1 << 16):  # dense keys: counted in place of a sort
        seen = np.bincount(key, minlength=top) > 0
        rank = np.cumsum(seen) - 1
        if top and rank[-1] < 1 << 31:
            rank = rank.astype(np.int32)
        distinct = np.flatnonzero(seen).astype(np.int64) if keys else np.empty(0, np.int64)
        return rank[key], int(rank[-1]) + 1 if top else 0, distinct
    uniq, inv = np.unique(key, return_inverse=True)
    return inv, len(uniq), uniq


def group_stats(inv: np.ndarray, n: int, values: list[np.ndarray], rows: np.ndarray | None = None) -> np.ndarray:
    """Per group (``inv``: each row's group, of ``n``): count, sum and max of each array of ``values``
    (NaN left out; max NaN where a group has none), as columns [count, sum, max] per array. ``rows``: the
    groups' row counts where known (the count of an array without NaN)."""
    stats = np.zeros((n, 3 * len(values)))
    for i, v in enumerate(values):
        some = present(v)
        whole = isinstance(some, slice) and rows is not None
        stats[:, 3 * i] = rows if whole else np.bincount(inv[some], minlength=n)
        stats[:, 3 * i + 1] = np.bincount(inv[some], weights=v[some], minlength=n)
        top = np.full(n, -np.inf, v.dtype)  # v's dtype: ufunc.at is ~30x slower when they differ
        np.maximum.at(top, inv[some], v[some])
        stats[:, 3 * i + 2] = np.where(stats[:, 3 * i] > 0, top, np.nan)
    return stats


def mean_max(stats: np.ndarray, col: int, name: str) -> dict[str, Any]:
    """``name``_mean and ``name``_max from the [count, sum, max] at ``col`` of a :func:`group_stats` row."""
    n = stats[col]
    return {f"{name}_mean": stats[col + 1] / n if n else math.nan, f"{name}_max": stats[col + 2] if n else math.nan}


def summary_stats(values: np.ndarray) -> dict[str, float]:
    """count, min, median, mean, p90 and max of the finite values ({} when there are none)."""
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


def by_count(counts: dict[str, int]) -> dict[str, int]:
    """Non-zero counts, the largest first (ties by name)."""
    return {k: v for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if v}


def clean(v: Any) -> Any:
    """``v`` as JSON takes it: string keys, Python numbers, NaN and inf as None."""
    if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [clean(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating | float):
        f = float(v)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(v, np.bool_):
        return bool(v)
    return v
