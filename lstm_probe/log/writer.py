"""Writes rows into Parquet through the declared schema, in bounded memory; torch-free.

:class:`FileLog` is fed by the sink (``sink.py``: in a writer process, or on a writer thread) and
fills preallocated columnar numpy buffers (:class:`Rows`; never one Python object per row or per
call), computes the norms and writes row groups. Row groups are phase-pure: train rows and all other
rows (rollout, bootstrap, ...) are buffered in two lanes and written apart, so a filter on ``phase``
skips row groups by their statistics; rows are in call order within each phase (sort by ``call`` for
the order overall). Row groups go into part files (``parts.py``)
of a dataset directory (``part-00000.parquet``, ...); a part is closed (footer written, then renamed
from a hidden ``.tmp`` name) once its oldest row has waited ``part_seconds`` since the writer took it, with every
row buffered then (:meth:`FileLog.write_due`), or after ``part_rows`` (with encoding threads, each row group is a
part of its own, published once written, in order), so a SIGKILL loses at most the rows of the last
``part_seconds`` (the part being written, the buffered rows, the row groups encoding threads hold) and what
the training process had not yet handed over (at most a quarter of ``part_seconds``, ``capture/held.py``; a
writer process that
sees its pipe close publishes the rows it holds). With ``part_iterations`` N (directories only), a
part also never holds rows of two spans of N iterations (0..N-1, N..2N-1, ...): the files of a span
can be moved or deleted together.

Two output shapes:
- a directory (``--out runs/x/``): the parts are the log; any Arrow engine reads it as one table.
- a file (``--out run.parquet``): the parts go into ``run.parquet.partial/`` (the crash journal), and each
  part, once published, is copied byte for byte to the end of a hidden ``.run.parquet.tmp``
  (``assemble.py``: every row is encoded once), which gets one footer and is renamed to ``run.parquet``
  when the log closes; the journal is removed then. If the process is killed, ``run.parquet.partial/``
  stays behind and the readers salvage it.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lstm_probe.log.kept import KeptVectors, laid_out
from lstm_probe.log.layout import KEPT_BYTES, PART_ROWS, partial_dir, row_capacity
from lstm_probe.log.metadata_keys import LIVE_KEYS
from lstm_probe.log.parts import META_FINAL_KEY, PartWriter
from lstm_probe.log.schema import COLUMNS, META_RUN_KEY, ROW_FLAGS, Column, log_schema, vector_width
from lstm_probe.options import CaptureOptions, default


class Rows:
    """Preallocated buffers for ``capacity`` rows: one numpy array per column of the schema (its
    ``Column.dtype``, null as ``Column.kind`` says) and per row flag (:data:`ROW_FLAGS`), as attributes
    (``rows.env``) and by name (``rows.buffers["env"]``). Without ``vectors`` (a summary log) there
    are no h and c buffers (the attributes are None): the sink stores each row's norms (and drifts)
    only. Vector columns of their own width (``Column.width``: obs, info) always have a buffer, as wide as
    ``widths`` says (1 where absent: all null). With ``sparse`` (few rows keep their vectors) h and c are None
    too, and ``kept`` holds the kept rows' vectors apart (``kept.py``)."""

    h: np.ndarray | None
    c: np.ndarray | None

    def __init__(
        self,
        capacity: int,
        hidden_size: int,
        vectors: bool = True,
        widths: Mapping[str, int] | None = None,
        sparse: bool = False,
    ):
        self.capacity = capacity
        self.n = 0
        self.buffers: dict[str, np.ndarray] = {}
        self.kept = KeptVectors() if vectors and sparse else None
        for col in COLUMNS:
            if col.kind != "vector":
                self.buffers[col.name] = np.empty(capacity, col.dtype)
            elif col.width is not None:
                self.buffers[col.name] = np.empty((capacity, (widths or {}).get(col.name, 1)), col.dtype)
            elif vectors and not sparse:
                self.buffers[col.name] = np.empty((capacity, hidden_size), col.dtype)
            else:
                setattr(self, col.name, None)
        for flag in ROW_FLAGS:
            self.buffers[flag] = np.empty(capacity, np.bool_)
        # plain attributes: the sink's fills read them at the speed of any attribute
        self.__dict__.update(self.buffers)

    def __getattr__(self, name: str) -> np.ndarray:  # for type checkers: the buffers are attributes
        raise AttributeError(f"no row buffer {name!r}")


def _strings(codes: np.ndarray, names: Sequence[str]) -> pa.Array:
    """A string column from its codes (-1: null), laid out in numpy: the array Arrow's ``take`` of the names
    gives (that kernel loads ``pyarrow.compute``, ~0.3 s of a writer process's CPU for a handful of columns
    per row group). A row group's codes come in runs (a block's rows): each run's bytes are one repeated
    string; codes that change more often than :data:`_STRING_RUNS` times are laid out name by name."""
    encoded = [name.encode() for name in names] + [b""]  # code -1 (null) indexes the last entry: no bytes
    n = len(codes)
    null = codes < 0
    sizes = np.array([len(e) for e in encoded], np.int32)
    offsets = np.empty(n + 1, np.int32)
    offsets[0] = 0
    np.cumsum(sizes[codes], out=offsets[1:])
    starts = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    if len(starts) < _STRING_RUNS:
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


_STRING_RUNS = 4096
"""Runs of one code up to which :func:`_strings` joins each run's bytes (more: name by name)."""


class Encoder:
    """Turns filled :class:`Rows` into a record batch of the declared schema, column by column by its
    kind and null convention (``schema.Column``)."""

    def __init__(self, schema: pa.Schema, modules: Sequence[str], codes: Mapping[str, Sequence[str]], float16: bool):
        self.schema = schema
        # a string column's values: its declared codes, or the log's modules for ``module``
        self.names = {c.name: list(codes[c.name]) if c.values else list(modules) for c in COLUMNS if c.kind == "code"}
        self.float16 = float16
        self.hidden = schema.field("h").type.list_size
        self._zeros = np.zeros(0, np.float16 if float16 else np.float32)
        self.state_type = pa.list_(pa.float16() if float16 else pa.float32(), self.hidden)

    def encode(self, r: Rows, copy: bool = False) -> pa.RecordBatch:
        """The filled rows as a record batch; ``copy``: none of its arrays shares memory with the buffers (a
        batch an encoding thread writes while the buffers fill again, ``parts.py``)."""
        n = r.n
        s = slice(0, n)
        arrays = []
        for col, field in zip(COLUMNS, self.schema, strict=True):
            kind, typ = col.kind, field.type
            if kind == "vector" and col.width is not None:  # float32, null where every entry is NaN
                own = r.buffers[col.name][s]
                null = np.isnan(own).all(axis=1)
                values = pa.array(np.array(own, np.float32, copy=copy or None).reshape(-1))
                arrays.append(_lists(pa.list_(pa.float32(), own.shape[1]), values, null))
                continue
            if kind == "vector":
                v = r.buffers.get(col.name)
                if v is not None:
                    arrays.append(self._vectors(v[s], ~self._valid(r, col, s), copy))
                elif r.kept is not None and r.kept.chunks:
                    values = laid_out(r.kept, 0 if col.name == "h" else 1, n, self.hidden, self._zeros.dtype)
                    arrays.append(_lists(self.state_type, pa.array(values), ~self._valid(r, col, s)))
                else:
                    arrays.append(self._no_vectors(n))
                continue
            v = r.buffers[col.name][s]
            if copy:
                v = v.copy()
            if kind == "code":
                arrays.append(_strings(v, self.names[col.name]))
            elif kind == "tribool":
                arrays.append(pa.array(v > 0, typ, mask=v < 0))
            elif not col.nullable:
                arrays.append(pa.array(v, typ))
            elif kind == "int":
                arrays.append(pa.array(v, typ, mask=v < 0))
            else:  # float
                arrays.append(pa.array(v, typ, mask=~self._valid(r, col, s) if col.valid else np.isnan(v)))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    @staticmethod
    def _valid(r: Rows, col: Column, s: slice) -> np.ndarray:
        """Where the column's row flags are all True."""
        flags = [r.buffers[f][s] for f in col.valid]
        return flags[0] if len(flags) == 1 else np.logical_and.reduce(flags)

    def _vectors(self, v: np.ndarray, null: np.ndarray, copy: bool = False) -> pa.Array:
        flat = np.array(v, np.float16 if self.float16 else np.float32, copy=copy or None, order="C").reshape(-1)
        return _lists(self.state_type, pa.array(flat), null)

    def _no_vectors(self, n: int) -> pa.Array:
        """An all-null vector column of ``n`` rows. Arrow wants n * hidden child values even so: they are a
        view of one zeroed array that nothing writes to, so its pages are never touched (``pa.nulls``
        fills its buffer, measured +200 MB resident at 200k rows and hidden 256)."""
        if self._zeros.size < n * self.hidden:
            self._zeros = np.zeros(n * self.hidden, self._zeros.dtype)
        values = pa.array(self._zeros[: n * self.hidden])
        return _lists(self.state_type, values, np.ones(n, np.bool_))


def _lists(typ: pa.DataType, values: pa.Array, null: np.ndarray) -> pa.Array:
    """Fixed-size lists of ``typ`` over ``values``, null where ``null``: what ``FixedSizeListArray.from_arrays``
    with a mask gives (whose mask loads ``pyarrow.compute``, ~0.3 s of a writer process's CPU), its validity
    bitmap packed in numpy."""
    nulls = int(np.count_nonzero(null))
    validity = pa.py_buffer(np.packbits(~null, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(typ, len(null), [validity], null_count=nulls, children=[values])


LANE_TRAIN, LANE_OTHER = 0, 1
"""The row buffers' lanes (:class:`FileLog`): train rows, and every other row."""


class FileLog:
    """Rows of one log, buffered in preallocated columns and written as row groups into rolling parts
    (for a single-file log, copied into the file as each part is published). Synchronous: it runs
    wherever the rows are made, on the writer thread or in the writer process (``writer_process.py``);
    it never imports torch."""

    def __init__(
        self,
        out: str,
        hidden_size: int,
        modules: Sequence[str],
        metadata: dict[str, Any],
        codes: Mapping[str, Sequence[str]],
        *,
        float16: bool = default(CaptureOptions, "float16"),
        part_seconds: float = default(CaptureOptions, "part_seconds"),
        part_rows: int = PART_ROWS,
        shard: str | None = None,
        vectors: bool = True,
        part_iterations: int | None = default(CaptureOptions, "part_iterations"),
        sparse: bool = False,
        threads: int = 1,
        always: bool = False,
    ):
        self.path = Path(out)
        self.is_dir = out.endswith(("/", os.sep)) or self.path.is_dir()
        self.parts_dir = self.path if self.is_dir else partial_dir(self.path)
        if not self.is_dir and (self.parts_dir.exists() or self.parts_dir.is_symlink()):
            # only what check_output let through: the writer's own parts, or anything under --force
            if self.parts_dir.is_dir() and not self.parts_dir.is_symlink():
                shutil.rmtree(self.parts_dir)
            else:
                self.parts_dir.unlink()
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        self.hidden_size = hidden_size
        self.schema = log_schema(hidden_size, float16, dict(metadata))
        self.encoder = Encoder(self.schema, modules, codes, float16)
        self.vectors = vectors  # whether any row may store its vectors (not a summary log)
        self.sparse = sparse  # few rows keep them: their vectors apart from the buffers (kept.py)
        self.capacity = row_capacity(hidden_size, vectors, sparse)
        self.widths = {c.name: vector_width(c, hidden_size, metadata) for c in COLUMNS if c.width is not None}
        # Two lanes of row buffers, so that every row group is phase-pure: train rows (LANE_TRAIN) and all
        # others (rollout, bootstrap, ...; LANE_OTHER). A phase filter then skips the other lane's row groups
        # by their statistics (the report reads the rollout rows' vectors alone). A lane's pages are touched
        # only as far as it fills (see _limit).
        self._buffers = [Rows(self.capacity, hidden_size, vectors, self.widths, sparse) for _ in range(2)]
        self.lanes = list(self._buffers)
        self.part_iterations = part_iterations if self.is_dir else None
        self.span = -1  # the span of iterations (part_iterations) of the buffered rows; -1: none yet
        self._lane = LANE_OTHER  # the lane of the last reserve
        self._trained = False  # whether a train row came: the other lane then holds a quarter (_limit)
        self.part_seconds = part_seconds
        self._since = [math.inf, math.inf]
        """Per lane: when the writer took its oldest buffered row (``time.monotonic()``; inf: none buffered)."""
        self.rows_written = 0
        self.progress: dict[str, Any] = {}
        self.parts = PartWriter(
            self.parts_dir,
            self.schema,
            part_rows,
            single=None if self.is_dir else self.path,
            shard=shard,
            part_iterations=self.part_iterations,
            threads=threads,
            always=always,
        )

    def reserve(self, n: int, train: bool = False, iteration: int | None = None) -> tuple[Rows, int]:
        """Room for ``n`` rows of one call in its lane (``train``: a train call's rows): the buffer and the
        first index to fill. Fill, then call :meth:`commit`. ``iteration``: the call's, so that with
        ``part_iterations`` the rows of a new span of iterations start after every older row is written."""
        if self.part_iterations is not None and iteration is not None:
            span = iteration // self.part_iterations
            if span != self.span:
                if self.span >= 0:
                    self._write_lanes()
                self.span = span
        lane = LANE_TRAIN if train else LANE_OTHER
        if train and not self._trained:  # from now on the other lane holds a quarter of a buffer
            self._trained = True
            if self.lanes[LANE_OTHER].n > self.capacity // 4:
                self._write_lane(LANE_OTHER)
        rows = self.lanes[lane]
        if rows.n + n > self._limit(lane) or (rows.kept is not None and rows.kept.nbytes >= KEPT_BYTES):
            self._write_lane(lane)
            if n > self.capacity:  # one call larger than a buffer: a one-off buffer
                self.lanes[lane] = Rows(n, self.hidden_size, self.vectors, self.widths, self.sparse)
            rows = self.lanes[lane]
        self._lane = lane
        return rows, rows.n

    def _limit(self, lane: int) -> int:
        """Rows a lane holds before it is written: ``capacity``, but a quarter of it for the other lane of
        a log with train rows (sb3: ~6% of rows are not train rows; their row groups then hold ~15
        iterations' rollout rows at 1 env, ~2 at 8 envs, and the buffers' memory grows by a quarter, not
        twice). A log without train rows (the generic tracer's, untagged) writes row groups of ``capacity``
        rows, as with one buffer."""
        return self.capacity // 4 if lane == LANE_OTHER and self._trained else self.capacity

    def commit(self, n: int) -> None:
        rows = self.lanes[self._lane]
        if not rows.n:  # the lane's oldest row: its age counts from now
            self._since[self._lane] = time.monotonic()
        rows.n += n
        self.rows_written += n

    def due_at(self) -> float:
        """When the oldest row taken and not yet published (buffered, in the open part, or held by an encoding
        thread) will have waited ``part_seconds`` (``time.monotonic()``; inf: every row is published). By then
        :meth:`write_due` must have run: the writer's loop wakes for it, idle or not."""
        return min(self._since[0], self._since[1], self.parts.oldest_row()) + self.part_seconds

    def write_due(self) -> None:
        """Publish the parts the encoding threads finished; and once the oldest unpublished row has waited
        ``part_seconds`` (:meth:`due_at`), write every buffered row (a row group per lane) and publish the open
        part with them: no row waits longer than ``part_seconds`` plus this call's own time, whatever the
        rate or size of the rows. Cheap when nothing is due (the writer process calls it after each message).

        Rows wait in their lane's buffer until it is full or this moment, so a slow run writes a row group per
        lane per ``part_seconds`` (a fast one fills its buffers first: full row groups, and one partial one per
        lane per part)."""
        self.parts.publish(self.parts.threads)  # the threads' finished parts, if any
        if time.monotonic() < self.due_at():
            return
        self._write_lanes()
        self.parts.close_part(part_doc(self.progress))

    def flush(self) -> None:
        """Encode the buffered rows and write each lane's as one row group (at the log's end: its caller closes
        the part next; while it runs, :meth:`write_due` publishes parts by their rows' age)."""
        self.parts.publish(self.parts.threads)  # the threads' finished parts, if any
        self._write_lanes()

    def _write_lanes(self) -> None:
        for lane in (LANE_OTHER, LANE_TRAIN):
            self._write_lane(lane)

    def _write_lane(self, lane: int) -> None:
        """Write one lane's buffered rows as one row group."""
        rows = self.lanes[lane]
        if rows.n == 0:
            return
        try:
            batch = self.encoder.encode(rows, copy=self.parts.threaded)
            self.parts.write(batch, part_doc(self.progress), self._since[lane])
        finally:
            rows.n = 0
            self._since[lane] = math.inf
            if rows.kept is not None:
                rows.kept.clear()
            self.lanes[lane] = self._buffers[lane]  # a one-off buffer is dropped after use

    def close(self, final: dict[str, Any]) -> None:
        """Write what is left, record ``final`` (completed, stop_reason, ...) and publish the log."""
        self.flush()
        doc = part_doc({**self.progress, **final.get("progress", {}), "rows": self.rows_written})
        final = {**doc, **self._threads_cost(final), "final": True, "progress": doc["progress"]}
        if self.parts.writer is None:
            # Always end with a part that carries the outcome, even when it holds no rows.
            self.parts._open()
        self.parts.close_part(final)
        self.parts.abort_encoding()
        if not self.is_dir:
            self.parts.finish_single()
            shutil.rmtree(self.parts_dir)

    def _threads_cost(self, final: dict[str, Any]) -> dict[str, Any]:
        """``final`` with, where the writer had encoding threads, their count and the row groups they wrote in
        its ``probe_cost`` (did they engage: ``parts.py``)."""
        if self.parts.threads <= 1 or not isinstance(final.get("probe_cost"), dict):
            return final
        threads = {
            "writer_encode_threads": self.parts.threads,
            "writer_threaded_row_groups": self.parts.threaded_groups,
        }
        return {**final, "probe_cost": {**final["probe_cost"], **threads}}

    def fail(self, final: dict[str, Any]) -> None:
        """The writer failed (a write or a job raised): publish what was finished, with ``final`` (completed
        false, the cause) in the last part. A single-file log is finished too when it holds every row the
        parts hold; else its journal stays, its last part saying how the run ended."""
        with contextlib.suppress(Exception):
            self.flush()
        with contextlib.suppress(Exception):  # the encoding threads' parts: published, or dropped if one failed
            self.parts.publish()
        doc = part_doc({**self.progress, **final.get("progress", {}), "rows": self.parts.rows})
        final = {**doc, **self._threads_cost(final), "final": True, "completed": False, "progress": doc["progress"]}
        try:
            if self.parts.writer is None:
                self.parts._open()
            self.parts.close_part(final)
            self.parts.abort_encoding()
        except Exception:
            self.parts.abort()
            return
        if self.is_dir:
            return
        if not self.parts.single_complete():
            self.parts.drop_single()
            return
        try:
            self.parts.finish_single()
        except Exception:
            self.parts.drop_single()
            return
        shutil.rmtree(self.parts_dir, ignore_errors=True)

    def abandon(self) -> None:
        """The run ended without a close (its process died): publish the rows taken so far as a part of
        the crash journal, without an outcome; the readers salvage it."""
        try:
            self.flush()
            self.parts.close_part(part_doc({**self.progress, "rows": self.rows_written}))
        finally:  # the encoding threads stopped, whatever failed
            self.parts.abort()

    def abort(self) -> None:
        self.parts.abort()


__all__ = ["FileLog", "Rows", "META_FINAL_KEY", "META_RUN_KEY"]


def part_doc(progress: Mapping[str, Any]) -> dict[str, Any]:
    """A part's key-value document (``META_FINAL_KEY``): the run's progress, and beside it, as keys of the run's
    metadata, the records the training side keeps up to date in it (``metadata_keys.LIVE_KEYS``: episode returns),
    so that a killed run's last part holds them as they were."""
    live = {k: progress[k] for k in LIVE_KEYS if k in progress}
    if not live:
        return {"progress": dict(progress)}
    return {"progress": {k: v for k, v in progress.items() if k not in live}, **live}
