"""Arrow arrays laid out in numpy for the writer's encoder (``writer.Encoder``): what ``pyarrow.compute``'s
kernels would give, without loading that module (~0.3 s of a writer process's CPU)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pyarrow as pa


def string_array(codes: np.ndarray, names: Sequence[str]) -> pa.Array:
    """A string column from its codes (-1: null), laid out in numpy: the array Arrow's ``take`` of the names
    gives (that kernel loads ``pyarrow.compute``, ~0.3 s of a writer process's CPU for a handful of columns
    per row group). A row group's codes come in runs (a block's rows): each run's bytes are one repeated
    string; codes that change more often than :data:`STRING_RUNS` times are laid out name by name."""
    encoded = [name.encode() for name in names] + [b""]  # code -1 (null) indexes the last entry: no bytes
    n = len(codes)
    null = codes < 0
    sizes = np.array([len(e) for e in encoded], np.int32)
    offsets = np.empty(n + 1, np.int32)
    offsets[0] = 0
    np.cumsum(sizes[codes], out=offsets[1:])
    starts = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    if len(starts) < STRING_RUNS:
        bounds = [0, *starts.tolist(), n] if n else [0]
        firsts = codes[bounds[:-1]].tolist()
        runs = (encoded[c] * (b - a) for c, (a, b) in zip(firsts, itertools.pairwise(bounds), strict=True))
        data = np.frombuffer(b"".join(runs), np.uint8)
    else:
        data = np.empty(int(offsets[-1]), np.uint8)
        for i, name in enumerate(encoded[:-1]):
            at = offsets[:-1][codes == i] if name else offsets[:0]
            for k, byte in enumerate(name if len(at) else b""):
                data[at + k] = byte
    nulls = int(np.count_nonzero(null))
    validity = pa.py_buffer(np.packbits(~null, bitorder="little")) if nulls else None
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data), validity, nulls)


STRING_RUNS = 4096
"""Runs of one code up to which :func:`string_array` joins each run's bytes (more: name by name)."""


def fixed_lists(typ: pa.DataType, values: pa.Array, null: np.ndarray) -> pa.Array:
    """Fixed-size lists of ``typ`` over ``values``, null where ``null``: what ``FixedSizeListArray.from_arrays``
    with a mask gives (whose mask loads ``pyarrow.compute``, ~0.3 s of a writer process's CPU), its validity
    bitmap packed in numpy."""
    nulls = int(np.count_nonzero(null))
    validity = pa.py_buffer(np.packbits(~null, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(typ, len(null), [validity], null_count=nulls, children=[values])


__all__ = ["STRING_RUNS", "fixed_lists", "string_array"]
