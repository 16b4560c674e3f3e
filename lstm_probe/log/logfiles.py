"""A log's files checked one by one before any row is read, so that a file from elsewhere costs little: the
Parquet footer's size (:data:`MAX_FOOTER_BYTES`) and counts, the metadata JSON documents
(:data:`MAX_METADATA_BYTES`, :data:`MAX_JSON_DEPTH`), regular files only; and :func:`reading`, which makes
a damaged file's failure one line. Used by reader.py; imports no torch and no pandas.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from lstm_probe.errors import BadLog, ProbeError, one_line
from lstm_probe.log.layout import arrow_too_old, partial_dir

MAX_FOOTER_BYTES = 64 << 20
"""Largest Parquet footer read. The writer's footers hold the metadata twice (as JSON and inside the
stored Arrow schema) plus ~5 KB per row group: tens of KB for a run, a few MB for a 10 GB log part."""
MAX_METADATA_BYTES = 16 << 20
"""Largest metadata JSON document parsed (the writer's are a few KB)."""
MAX_JSON_DEPTH = 64
"""Deepest nesting accepted in a metadata JSON document (the writer's nest 5 levels at most)."""
F = TypeVar("F", bound=Callable[..., Any])


def reads(what: str, values: bool = False) -> Callable[[F], F]:
    """A reading function whose first argument is a log's path runs inside :func:`reading`."""

    def wrap(func: F) -> F:
        @functools.wraps(func)
        def inner(path: Any, *args: Any, **kwargs: Any) -> Any:
            with reading(path, what, values):
                return func(path, *args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap


@contextlib.contextmanager
def reading(path: str | os.PathLike[str], what: str = "read", values: bool = False) -> Iterator[None]:
    """Inside: a failure of the file rather than of the code is one line (:class:`BadLog`): pages or a
    footer that do not decode (``--traceback`` shows the cause); with ``values``, also Python's errors
    about values, where the code inside reads nothing but the log (metadata of other types than lstm-probe
    writes: ``read_info``, ``summarize``; functions that take arguments check them first and leave
    ``values`` off, so a wrong argument is not blamed on the file). Our own errors (:class:`ProbeError`)
    pass as they are."""
    try:
        yield
    except ProbeError:
        raise
    except (pa.ArrowException, OSError, EOFError) as exc:
        if isinstance(exc, pa.ArrowException) and (old := arrow_too_old()):
            raise BadLog(f"{path} cannot be {what}: {old}") from exc
        raise BadLog(f"{path} cannot be {what} ({one_line(exc)}): a damaged file, or not an lstm-probe log") from exc
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        if not values:
            raise
        raise BadLog(f"{path} holds values lstm-probe does not write ({one_line(exc)}); it cannot be {what}") from exc


def open_part(file: Path) -> pq.ParquetFile:
    try:
        mode = os.stat(file).st_mode
    except OSError as exc:
        raise BadLog(f"{file} cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):  # a FIFO would block the read forever; a device could be endless
        raise BadLog(f"{file} is not a regular file (a pipe, socket or device): not an lstm-probe log")
    try:
        with open(file, "rb") as f:  # the footer's length is the 4 bytes before the closing magic
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 8))
            tail = f.read(8)
    except OSError as exc:
        raise BadLog(f"{file} cannot be read ({exc.strerror or exc})") from None
    footer = int.from_bytes(tail[:4], "little") if len(tail) == 8 and tail[4:] == b"PAR1" else 0
    if footer > MAX_FOOTER_BYTES:
        raise BadLog(
            f"{file} has a Parquet footer of {footer / 2**20:.0f} MiB, over the {MAX_FOOTER_BYTES >> 20} MiB "
            "lstm-probe reads (its logs' footers are KBs): not an lstm-probe log"
        )
    try:
        return pq.ParquetFile(file)
    except (pa.ArrowInvalid, OSError) as exc:
        journal = partial_dir(file)
        hint = (
            f"the run was killed: report the directory it left, {journal}/"
            if journal.is_dir()
            else "lstm-probe reports the Parquet logs `lstm-probe run` or ProbeCallback write"
            if tail[4:] != b"PAR1"
            else "the file is cut short (a copy still going, or a full disk?)"
        )
        raise BadLog(f"{file} is not a readable Parquet file ({str(exc).splitlines()[0]}); {hint}") from None


def metadata_json(file: Path, what: str, raw: bytes) -> dict[str, Any]:
    """A metadata JSON object, within :data:`MAX_METADATA_BYTES` and :data:`MAX_JSON_DEPTH`."""
    if len(raw) > MAX_METADATA_BYTES:
        raise BadLog(
            f"{file} has {what} of {len(raw) / 2**20:.0f} MiB, over the {MAX_METADATA_BYTES >> 20} MiB "
            "lstm-probe reads (its logs' are KBs): not an lstm-probe log"
        )
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadLog(f"{file} has corrupt {what}") from None
    if not isinstance(doc, dict):
        raise BadLog(f"{file} has corrupt {what} (not a JSON object)")
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:  # no recursion: the depth is what is being checked
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise BadLog(f"{file} has {what} nested over {MAX_JSON_DEPTH} levels deep: not an lstm-probe log")
        if isinstance(value, dict | list):
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return doc


def check_counts(file: Path, pf: pq.ParquetFile) -> None:
    """The footer's row counts agree with each other: the file's with its row groups', and every flat
    column's value count with its row group's rows (a footer is what every read trusts for sizes)."""
    meta = pf.metadata
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    if sum(rg.num_rows for rg in groups) != meta.num_rows or any(rg.num_rows < 0 for rg in groups):
        raise BadLog(
            f"{file} has a footer whose row counts disagree ({meta.num_rows:,} rows in all, "
            f"{sum(rg.num_rows for rg in groups):,} in its row groups): a damaged file, not one lstm-probe wrote"
        )
    flat = [j for j in range(meta.num_columns) if meta.schema.column(j).max_repetition_level == 0]
    for i, rg in enumerate(groups):
        for j in flat:
            if rg.column(j).num_values != rg.num_rows:
                raise BadLog(
                    f"{file} has a footer whose row group {i} claims {rg.num_rows:,} rows but column "
                    f"{meta.schema.column(j).path!r} {rg.column(j).num_values:,} values: a damaged file"
                )
