"""The vectors of the few rows that keep theirs, held apart from a row buffer's scalar columns.

Under ``--trace-envs K --other-envs summary`` most rows are summary rows (at 4,096 envs and K = 16, 1 row in
256 keeps its h and c). A row buffer with a (capacity, hidden) array per vector column would then be sized by
the vectors nobody keeps: row groups of ~8k rows at hidden 256, one per hand-over at Isaac Lab widths (each
then a row group of its own), and the writer's time per row a tenth to a third more
(``benchmarks/writer_profile.py``; docs/performance.md).
:class:`KeptVectors` holds instead each hand-over's kept rows (their indices in the buffer, their h and c);
the sink adds them (``sink.py``), the encoder lays them out (:func:`laid_out`), and the buffer is written once
its scalar columns are full or the kept vectors reach ``layout.KEPT_BYTES``. Torch-free, pyarrow-free.
"""

from __future__ import annotations

import numpy as np


class KeptVectors:
    """The kept rows' vectors of one row buffer, in the order the sink added them: chunks of (rows, h, c),
    ``rows`` (k,) the rows' indices in the buffer, ``h`` and ``c`` (k, H) their vectors (``c`` None: zero, a
    GRU's). A row's vectors are laid out only where the row's flags say it keeps them (``writer.Encoder``)."""

    __slots__ = ("chunks", "nbytes")

    def __init__(self) -> None:
        self.chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
        self.nbytes = 0

    def add(self, rows: np.ndarray, h: np.ndarray, c: np.ndarray | None) -> None:
        """Keep ``h`` and ``c`` (k, H) for the buffer's ``rows`` (k,), as float32 (a full log's row buffers'
        dtype: a float16 log's vectors then round once from float32, as a full log's do), copied unless they
        own their memory (a view would keep the whole array it is cut from, every env's states, until the
        buffer is written)."""
        if len(rows) == 0:
            return
        h = _own(h)
        c = None if c is None else _own(c)
        self.chunks.append((np.asarray(rows, np.int64), h, c))
        self.nbytes += h.nbytes + (0 if c is None else c.nbytes)

    def clear(self) -> None:
        self.chunks.clear()
        self.nbytes = 0


def _own(v: np.ndarray) -> np.ndarray:
    return v if v.dtype == np.float32 and v.flags.owndata else np.array(v, np.float32)


def laid_out(kept: KeptVectors, which: int, n: int, hidden: int, dtype: np.dtype) -> np.ndarray:
    """Column ``which`` (0: h, 1: c) of ``n`` rows as Arrow's fixed-size list wants its values: (n * hidden,)
    in ``dtype``, each kept row's vector at its place, zero elsewhere. The zeros are a fresh allocation whose
    pages only the kept rows touch (the other rows are null: Parquet never reads their values)."""
    values = np.zeros(n * hidden, dtype)
    grid = values.reshape(n, hidden)
    for rows, h, c in kept.chunks:
        v = h if which == 0 else c
        if v is None:
            continue
        if len(rows) and rows.max() >= n:  # rows of a call whose hand-over failed before it was committed
            at = rows < n
            rows, v = rows[at], v[at]
        grid[rows] = v
    return values
