"""Row groups into Parquet part files: the writer settings every part is written with, the rolling parts of
one log (:class:`PartWriter`), and the threads that encode row groups side by side in a writer process.

A part file is written under a hidden ``.tmp`` name and renamed once its footer is written (published); a
single-file log copies each published part into itself (``assemble.py``). With ``threads`` > 1 (a writer
process on a machine with cores to spare, ``options.WriterConfig.encode_threads``) each row group written while
the writer is behind (more input waits in its pipe: ``PartWriter.behind``, set by the writer process's loop)
is encoded by a thread of its own into a part of its own (Parquet's encoding and zstd release the interpreter
lock: measured, two threads write a 4,096-env run's row groups in half the wall time for the same CPU); the
other row groups go into the open part, as with one thread. Parts are published in order as they finish, so
the journal always holds a run's first rows, whatever finishes first, and the log holds the same row groups as
with one thread. Torch-free.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lstm_probe.log.assemble import Assembly
from lstm_probe.log.schema import COLUMNS
from lstm_probe.options import CaptureOptions, default

META_FINAL_KEY = b"lstm_probe.final"
"""File-level key written when a part closes: the run's progress and, in the last part, its outcome."""

COMPRESSION = "zstd"
ENCODING: dict[str, Any] = {
    "compression_level": None,
    "vector_bss": True,
    "vector_compression": COMPRESSION,
    "scalar_compression": COMPRESSION,
    "float_compression": None,
}
"""Encoding knobs (benchmarks/writer_profile.py measures variants of them side by side): the zstd level
(None: Arrow's default), byte-stream-split on the state vectors, the vectors' codec, the other columns' codec
and the float columns' among them (None: the other columns')."""
STRING_COLUMNS = [c.name for c in COLUMNS if c.kind == "code"]
VECTOR_COLUMNS = [c.name for c in COLUMNS if c.kind == "vector"]


def _parquet_writer(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    # Dictionary encoding and min/max statistics on the float vectors only cost time: random floats
    # never fit a dictionary and nobody filters on a vector. Measured: 2x faster writes, 8% smaller.
    # No page index (nor bloom filters): a part's row groups must move into a single-file log with their
    # offsets in the footer alone (assemble.py).
    scalars = [n for n in schema.names if n not in VECTOR_COLUMNS]
    # per leaf column (a vector's values are "h.list.element"; a name Arrow does not know is uncompressed)
    compression: Any = {
        f"{n}.list.element" if pa.types.is_fixed_size_list(schema.field(n).type) else n: _codec(schema.field(n))
        for n in schema.names
    }
    level = ENCODING["compression_level"]
    levels = None if level is None else {n: level for n, codec in compression.items() if codec == "zstd"} or None
    return pq.ParquetWriter(
        path,
        schema,
        compression=compression,
        compression_level=levels,
        use_dictionary=STRING_COLUMNS,
        write_statistics=scalars,
        column_encoding=column_encodings(schema),
        write_page_index=False,
    )


def _codec(field: pa.Field) -> str:
    if field.name in VECTOR_COLUMNS:
        return str(ENCODING["vector_compression"])
    if ENCODING["float_compression"] and pa.types.is_floating(field.type):
        return str(ENCODING["float_compression"])
    return str(ENCODING["scalar_compression"])


def column_encodings(schema: pa.Schema) -> dict[str, str]:
    """Parquet encodings of the log's columns (both standard Parquet encodings every Arrow engine reads).

    Floats are stored byte-stream-split (the bytes of each value spread over separate streams, so zstd
    sees the exponent bytes of neighbouring values together); integers delta-encoded (call, env_step,
    episode_step rise by small steps). Measured on logs of 1024-step Pendulum runs at the defaults (36k
    rows, hidden 256; float16: 512 steps): full capture 1629 -> 1164 B/row, float16 647 -> 494, summary
    13.4 -> 8.9; writing is no slower (5.9 -> 5.2 us/row).
    """
    out: dict[str, str] = {}
    for f in schema:
        typ = f.type
        if pa.types.is_fixed_size_list(typ):
            if ENCODING["vector_bss"]:
                out[f"{f.name}.list.element"] = "BYTE_STREAM_SPLIT"
        elif pa.types.is_floating(typ):
            out[f.name] = "BYTE_STREAM_SPLIT"
        elif pa.types.is_integer(typ):
            out[f.name] = "DELTA_BINARY_PACKED"
    return out


def _spans(iteration: pa.Array, n: int) -> list[tuple[int, int, int]]:
    """Runs of rows of the same span of ``n`` iterations: (start, stop, span). A row without an iteration
    belongs to the run before it (span -1 at the start: any part takes it)."""
    values = iteration.to_numpy(zero_copy_only=False)
    if len(values) == 0:
        return []
    if values.dtype.kind == "f":  # nulls present: NaN
        named = ~np.isnan(values)
        last = np.maximum.accumulate(np.where(named, np.arange(len(values)), -1))
        span = np.where(last >= 0, values[np.maximum(last, 0)] // n, -1).astype(np.int64)
    else:
        span = values.astype(np.int64) // n
    bounds = [0, *(np.flatnonzero(span[1:] != span[:-1]) + 1).tolist(), len(span)]
    return [(a, b, int(span[a])) for a, b in itertools.pairwise(bounds)]


class PartWriter:
    """Writes record batches into rolling part files of one directory (``threads`` > 1: each batch a part of
    its own, encoded on a thread; see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        schema: pa.Schema,
        part_rows: int,
        single: Path | None = None,
        shard: str | None = None,
        part_iterations: int | None = default(CaptureOptions, "part_iterations"),
        threads: int = 1,
        always: bool = False,
    ):
        self.dir = directory
        self.shard = shard
        # A single-file log is assembled from the parts (its crash journal) as each is published, so
        # closing it costs the last part's copy and one footer.
        self.assembly = Assembly(single) if single is not None else None
        self.schema = schema
        self.part_rows = part_rows
        self.index = 0
        self.writer: pq.ParquetWriter | None = None
        self.tmp: Path | None = None
        self.oldest = math.inf
        """When the writer took the oldest row of the open part (``time.monotonic()``; inf: none yet)."""
        self.part_count = 0
        self.parts: list[Path] = []
        self.rows = 0  # rows written into parts (open or published)
        self.part_iterations = part_iterations
        self.span = -1
        """The span of iterations (iteration // part_iterations) of the open part's rows; -1: none yet."""
        self.encoding = _Encoding(threads) if threads > 1 else None
        self.threads = threads
        self.threaded_groups = 0
        """Row groups the encoding threads wrote (each a part of its own)."""
        self.always = always
        """The threads take every row group (``writer_threads`` given), not only those written while behind."""
        self.behind = always
        """Set by the writer process's loop: more input waits in its pipe (the writer is what training waits
        for). Only then are row groups encoded on the threads; else into the open part, as with one."""

    @property
    def threaded(self) -> bool:
        """Whether the next row group goes to the encoding threads (its arrays then must not share memory with
        the row buffers, which fill again while it is encoded)."""
        return self.encoding is not None and self.behind

    def part_name(self) -> str:
        return f"part-{self.shard}-{self.index:05d}.parquet" if self.shard else f"part-{self.index:05d}.parquet"

    def _open(self) -> None:
        name = self.part_name()
        self.tmp = self.dir / f".{name}.tmp"
        self.writer = _parquet_writer(self.tmp, self.schema)
        self.oldest = math.inf
        self.part_count = 0

    def write(self, batch: pa.RecordBatch, progress: dict[str, Any], since: float | None = None) -> None:
        """Write ``batch`` as a row group; ``since``: when the writer took its oldest row (``time.monotonic()``;
        None: now), from which its part's age is counted (:meth:`oldest_row`)."""
        since = time.monotonic() if since is None else since
        if self.threaded:  # each batch (each span's rows of it) a part of its own
            if self.writer is not None:  # the open part goes first (the threads' parts are named after it)
                self.close_part(progress)
            spans = [(0, batch.num_rows, -1)] if self.part_iterations is None else None
            for start, stop, _ in spans or _spans(batch.column("iteration"), self.part_iterations or 1):
                self._submit(
                    batch if stop - start == batch.num_rows else batch.slice(start, stop - start), progress, since
                )
            return
        if self.part_iterations is None:
            self._write(batch, progress, -1, since)
            return
        for start, stop, span in _spans(batch.column("iteration"), self.part_iterations):
            if self.writer is not None and span >= 0 and self.span >= 0 and span != self.span:
                self.close_part(progress)
            self._write(batch.slice(start, stop - start), progress, span, since)

    def _write(self, batch: pa.RecordBatch, progress: dict[str, Any], span: int, since: float) -> None:
        if self.writer is None:
            self._open()
            self.span = -1
        assert self.writer is not None
        if span >= 0:
            self.span = span
        try:
            self.writer.write_batch(batch)
        except BaseException:  # a half-written row group: the part cannot be finished (disk full)
            self.discard()
            raise
        self.rows += batch.num_rows
        self.part_count += batch.num_rows
        self.oldest = min(self.oldest, since)
        # (its age closes it where the log's owner asks: FileLog.write_due, with the rows still buffered)
        if self.part_count >= self.part_rows:
            self.close_part(progress)

    def _submit(self, batch: pa.RecordBatch, progress: dict[str, Any], since: float) -> None:
        assert self.encoding is not None
        name = self.part_name()
        self.index += 1
        final = json.dumps(progress, default=str)
        self.encoding.submit(self.dir / f".{name}.tmp", self.dir / name, self.schema, batch, final, since)
        self.rows += batch.num_rows
        self.threaded_groups += 1
        self.publish(self.encoding.threads)

    def publish(self, keep: int = 0) -> None:
        """Publish the parts the encoding threads finished, in order (waiting while more than ``keep`` are
        pending); a failed one drops those after it (their rows are lost, as a failed part's are)."""
        if self.encoding is None:
            return
        done, error = self.encoding.finished(keep)
        if error is not None:  # the failed part and those after it are dropped; those before it published
            self.rows -= self.encoding.cancel()
        for target in done:  # each one is in the journal already: each is counted, whatever fails
            try:
                self._published(target)
            except BaseException as exc:  # the single file given up (a full disk): the journal keeps the rows
                error = error or exc
        if error is not None:
            raise error

    def _published(self, target: Path) -> None:
        self.parts.append(target)
        if self.assembly is not None:
            try:
                self.assembly.append(target)
            except BaseException:  # (a full disk) the journal keeps every row; the single file is given up
                self.drop_single()
                raise

    def oldest_row(self) -> float:
        """When the writer took the oldest row written and not yet published (in the open part or a part the
        encoding threads hold; ``time.monotonic()``, inf: none)."""
        oldest = self.oldest if self.writer is not None else math.inf
        return min(oldest, self.encoding.oldest()) if self.encoding is not None else oldest

    def close_part(self, final: dict[str, Any]) -> None:
        """Close the open part (if any) with ``final`` in its key-value metadata, then publish it (after
        every part the encoding threads hold)."""
        self.publish()
        if self.writer is None:
            return
        assert self.tmp is not None
        writer, self.writer = self.writer, None
        try:
            writer.add_key_value_metadata({META_FINAL_KEY.decode(): json.dumps(final, default=str)})
            writer.close()
        except BaseException:  # a part whose footer was not written is not published (disk full)
            self.discard()
            raise
        target = self.dir / self.part_name()
        os.replace(self.tmp, target)
        self.index += 1
        self._published(target)

    def single_complete(self) -> bool:
        """Whether the single-file log holds every row the published parts hold."""
        pending = self.encoding is not None and self.encoding.pending
        return self.assembly is not None and self.assembly.rows == self.rows and self.writer is None and not pending

    def finish_single(self) -> None:
        """Write the single-file log's footer (the last part's: the outcome) and move it into place."""
        if self.assembly is None:
            raise OSError(f"the single-file log was given up after a failed write; its rows are in {self.dir}/")
        self.assembly.finish()

    def abort_encoding(self) -> None:
        """Stop the encoding threads; the parts they held and had not published are given up."""
        if self.encoding is not None:
            self.rows -= self.encoding.shutdown()
            self.encoding = None

    def abort(self) -> None:
        self.abort_encoding()
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()
        self.writer = None
        self.drop_single()

    def discard(self) -> None:
        """Give up the open part after a failed write: close it quietly and remove its temp file (its rows
        are lost; the parts published before it stay)."""
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()
            self.writer = None
        self.rows -= self.part_count
        self.part_count = 0
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                self.tmp.unlink()

    def drop_single(self) -> None:
        """Give up the single-file log (the journal keeps the rows): close and remove its temp file."""
        if self.assembly is not None:
            self.assembly.drop()
            self.assembly = None


def _write_part(tmp: Path, schema: pa.Schema, batch: pa.RecordBatch, final: str) -> None:
    """One part of one row group, written whole under its temp name (an encoding thread's job)."""
    writer = _parquet_writer(tmp, schema)
    try:
        writer.write_batch(batch)
        writer.add_key_value_metadata({META_FINAL_KEY.decode(): final})
        writer.close()
    except BaseException:  # (a full disk) nothing of it is published
        with contextlib.suppress(Exception):
            writer.close()
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class _Encoding:
    """Row groups encoded on ``threads`` threads, each into a part of its own; :meth:`finished` hands the parts
    over in the order they were given, once written. At most ``threads`` wait besides the one being handed
    over: the writer's memory holds that many row groups' arrays."""

    def __init__(self, threads: int):
        self.threads = threads
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="lstm-probe-parquet")
        self.pending: deque[tuple[Future[None], Path, Path, int, float]] = deque()

    def submit(
        self, tmp: Path, target: Path, schema: pa.Schema, batch: pa.RecordBatch, final: str, since: float
    ) -> None:
        future = self.executor.submit(_write_part, tmp, schema, batch, final)
        self.pending.append((future, tmp, target, batch.num_rows, since))

    def oldest(self) -> float:
        """When the writer took the oldest row of the pending parts (inf: none)."""
        return min((p[4] for p in self.pending), default=math.inf)

    def finished(self, keep: int) -> tuple[list[Path], BaseException | None]:
        """The parts written, in order, renamed to their names (their paths); waits while more than
        ``keep`` are pending. A failed part stops the hand-over (the error comes second, the parts renamed
        before it first: they are in the journal) and stays first in line (:meth:`cancel` drops it with those
        after it)."""
        out: list[Path] = []
        while self.pending and (len(self.pending) > keep or self.pending[0][0].done()):
            future, tmp, target, _, _ = self.pending[0]
            try:
                future.result()
                os.replace(tmp, target)
            except BaseException as exc:
                return out, exc
            self.pending.popleft()
            out.append(target)
        return out, None

    def cancel(self) -> int:
        """Wait for the pending parts and remove them unpublished; the rows they held."""
        rows = 0
        while self.pending:
            future, tmp, _, n, _ = self.pending.popleft()
            with contextlib.suppress(BaseException):
                future.result()
            with contextlib.suppress(OSError):
                tmp.unlink()
            rows += n
        return rows

    def shutdown(self) -> int:
        rows = self.cancel()
        self.executor.shutdown(wait=True)
        return rows
