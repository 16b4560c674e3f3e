"""What a command sets up in its own process before it reads a log: pyarrow.dataset loaded without pandas,
and allocators that reuse the memory a read frees. Only the command line calls these (the library never
changes how its host process imports or allocates)."""

from __future__ import annotations

import sys
from typing import Any


class _NoPandas:
    """A meta path finder under which ``import pandas`` fails (see :func:`pyarrow_without_pandas`)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == "pandas":
            raise ModuleNotFoundError("pandas is not imported while pyarrow.dataset loads", name=fullname)


def pyarrow_without_pandas() -> None:
    """Import pyarrow.dataset without importing pandas (0.2-0.6 s, most of a small log's ``report``).

    Loading pyarrow/_dataset.pyx evaluates ``Expression._scalar(True)``; ``pa.scalar`` asks whether its value
    is array-like (pyarrow/array.pxi: ``_is_array_like``), and pyarrow's pandas shim answers by importing
    pandas when it is installed (pyarrow/pandas-shim.pxi: ``_PandasAPIShim._check_import``). While the import
    runs here, ``import pandas`` fails, so the shim notes pandas as absent; its first call that needs pandas
    (``Table.to_pandas``, where a report section builds a DataFrame) imports it after all. Until that call
    pyarrow would not recognise a pandas object handed to ``pa.array``; the report and the probes hand it
    none. Only the command's entry does this, and only where neither pandas nor pyarrow.dataset is loaded
    yet (a fresh ``lstm-probe`` process); the library never changes how pyarrow sees pandas."""
    if "pandas" in sys.modules or "pyarrow.dataset" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        import pyarrow.dataset  # noqa: F401
    finally:
        sys.meta_path.remove(finder)


def reuse_freed_memory() -> None:
    """Let ``report`` reuse the memory it frees instead of mapping fresh pages for every buffer (~2/3 of its
    page faults and ~0.5-1 s of system time on a 9.9M-row log, most of it the kernel zeroing pages). Arrow
    allocates from the C library's heap (its default pool, mimalloc, hands freed pages back and faults them in
    again), and glibc keeps buffers up to 32 MiB (a 4M-row run's float64 column) in its heap rather than a
    mapping of their own that it unmaps on free, and keeps up to 256 MiB of freed memory at the heap's top.
    Peak memory is what the report holds at once either way (measured: lower, 590 against 735 MB). One heap
    (arena) for every thread: the reader threads' buffers, freed by the scan's thread, are reused by the next
    read instead of being handed back from a thread's own heap and faulted in again. No transparent huge pages
    for this process: numpy asks for them for every array of 4 MB or more, and each first touch of one zeroes
    2 MB (and may compact memory first) for arrays that live a few milliseconds (a 9.9M-row report: ~0.6 s less
    system time, ~70 MB less peak RSS). Only the command's entry does this, for its own process."""
    import ctypes

    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator as it is
        return
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD
    mallopt(-8, 1)  # M_ARENA_MAX
    prctl = getattr(libc, "prctl", None)
    if prctl is not None:
        prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE (Linux); elsewhere an error code, ignored
