"""Read logs: one file, a dataset directory of parts, or the parts a killed run left behind (``pair``, train rows
joined to their rollout rows: paired.py).

Nothing here imports torch or sb3, and nothing executes code from a log (Parquet + JSON only).

A log may come from someone else, so :func:`read_info` bounds what a file can make the reader allocate
before any row is read, and refuses a file past a bound with one line (:class:`BadLog`): the Parquet
footer (:data:`MAX_FOOTER_BYTES`), the metadata JSON documents (:data:`MAX_METADATA_BYTES`,
:data:`MAX_JSON_DEPTH`), the width of the h and c vectors against the ``hidden_size`` the metadata
declares (:data:`MAX_HIDDEN_SIZE`), and the bytes one row group takes once read into Arrow
(:data:`MAX_ROW_GROUP_BYTES`; a few KB on disk can hold gigabytes of null vectors). Each bound is far
above what lstm-probe's writer makes (see each constant).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:  # both load in ~0.5 s; the writer process (which imports this package) needs neither
    import pandas as pd
    import pyarrow.dataset as ds

from lstm_probe.errors import BadInput, BadLog
from lstm_probe.log import budget, held, sparse
from lstm_probe.log.layout import PARTIAL_SUFFIX, partial_dir
from lstm_probe.log.lock import Holder, live_holder, lock_path
from lstm_probe.log.logfiles import check_counts, metadata_json, open_part, reads
from lstm_probe.log.metadata_keys import LIVE_KEYS, live_metadata
from lstm_probe.log.metadata_types import check_info_keys, check_types, clean_device
from lstm_probe.log.schema import (
    COLUMNS,
    META_RUN_KEY,
    META_VERSION_KEY,
    SCHEMA_VERSION,
    log_schema,
    required_columns,
)
from lstm_probe.log.shards import merge_shards, shard_of, shard_rank, summed_cost, summed_training_mode
from lstm_probe.log.writer import META_FINAL_KEY
from lstm_probe.options import MAX_HIDDEN_SIZE

VECTORS = frozenset(c.name for c in COLUMNS if c.kind == "vector")
"""The vector columns (h, c, obs, info): skipped by ``load(vectors=False)``."""

MAX_ROW_GROUP_BYTES = 4 << 30
"""Most bytes one row group may take once read (rows times the columns' widths, h and c counted in full
even where null, as Arrow allocates them). The writer's row groups are ~16 MiB (``layout.BUFFER_BYTES``);
a summary log's hold 174,762 rows, 1.4 GiB at hidden size 1024."""
SCALAR_BYTES = 8
"""Bytes counted per row for each scalar column (int64, and the offsets of a string)."""


@dataclass
class LogInfo:
    """Where a log's rows are and what its metadata says."""

    path: Path
    files: list[Path]
    rows: int
    bytes: int
    metadata: dict[str, Any]
    schema: pa.Schema
    warnings: list[str] = field(default_factory=list)
    writing: Holder | None = None
    """The run still writing this log (its lock names a live process), or None."""

    @property
    def completed(self) -> bool:
        return bool(self.metadata.get("completed"))

    @property
    def num_timesteps(self) -> int | None:
        """The env steps the run reached: its outcome's count, else the last progress a part recorded (the
        number the report's Run section shows)."""
        done = self.metadata.get("progress_num_timesteps")
        if done is None:
            done = (self.metadata.get("progress") or {}).get("num_timesteps")
        return done if isinstance(done, int) else None


def _parts(directory: Path) -> list[Path]:
    return sorted(directory.glob("part-*.parquet"))


def writing(path: str | os.PathLike[str]) -> Holder | None:
    """The live run writing the log at ``path`` (its lock, ``lock.py``), or None: for a directory, its
    own lock or any shard's."""
    p = Path(path)
    if p.is_dir():
        locks = [lock_path(p, is_dir=True), *sorted(p.glob(".lstm-probe-*.lock"))]
    elif p.name.endswith(PARTIAL_SUFFIX):
        locks = [lock_path(p.with_name(p.name[: -len(PARTIAL_SUFFIX)]), is_dir=False)]
    else:
        locks = [lock_path(p, is_dir=False)]
    for lock in locks:
        h = live_holder(lock)
        if h is not None:
            return h
    return None


def _not_yet(p: Path, h: Holder) -> BadLog:
    return BadLog(
        f"{p} is being written by {h.describe()}; no part of it is finished yet (one is every --part-seconds, "
        "60 s by default): report it again in a minute"
    )


def resolve_files(path: str | os.PathLike[str]) -> tuple[Path, list[Path], list[str]]:
    """The files of a log and any warnings about how they were found."""
    p = Path(path)
    warnings: list[str] = []
    live = writing(p)
    if p.is_dir():
        files = _parts(p)
        if not files:
            if live is not None:
                raise _not_yet(p, live)
            raise BadLog(f"{p}/ holds no part-*.parquet files: it is not an lstm-probe log directory")
        if live is not None:
            warnings.append(_live_note(p, live, len(files)))
        return p, files, warnings
    if p.is_file():
        return p, [p], warnings
    if p.exists():
        raise BadLog(f"{p} is not a regular file (a pipe, socket or device): not an lstm-probe log")
    partial = partial_dir(p)
    parts = _parts(partial) if partial.is_dir() else []
    if live is not None:
        if not parts:
            raise _not_yet(p, live)
        warnings.append(_live_note(p, live, len(parts)))
        return partial, parts, warnings
    if parts:
        warnings.append(
            f"{p} was never finished (the process was killed or its writer failed): reading the "
            f"{len(parts)} finished part(s) in {partial}/; rows after the last part are lost"
        )
        return partial, parts, warnings
    raise BadLog(f"{p} does not exist; run `lstm-probe run ENV_ID --out {p}` to make a log")


def _live_note(p: Path, h: Holder, parts: int) -> str:
    return (
        f"{p} is being written by {h.describe()}: this reads the {parts} part(s) flushed so far "
        "(partial: the run is still going)"
    )


@reads("read", values=True)
def read_info(path: str | os.PathLike[str]) -> LogInfo:
    """Check a log against the schema and read its metadata (no rows are read)."""
    root, files, warnings = resolve_files(path)
    runs: dict[str, dict[str, Any]] = {}  # each shard's run metadata (each writing process stores its own)
    finals: dict[str, dict[str, Any]] = {}  # per shard (one per writing process; "" for a one-process log)
    progress: dict[str, dict[str, Any]] = {}
    records: dict[str, dict[str, Any]] = {}  # per shard: the run metadata its parts carry (metadata_keys.LIVE_KEYS)
    rows = 0
    size = 0
    schema: pa.Schema | None = None
    expected = log_schema(1, False)
    data_files: list[Path] = []
    for file in files:
        pf = open_part(file)
        arrow = pf.schema_arrow
        meta = arrow.metadata or {}
        if META_VERSION_KEY not in meta:
            raise BadLog(
                f"{file} is a Parquet file but not an lstm-probe log (no {META_VERSION_KEY.decode()} metadata)"
            )
        try:
            version = int(meta[META_VERSION_KEY])
        except ValueError:
            raise BadLog(f"{file} has an unreadable schema version {meta[META_VERSION_KEY]!r}") from None
        if version > SCHEMA_VERSION:
            raise BadLog(
                f"{file} was written with log schema {version}, newer than this lstm-probe reads "
                f"({SCHEMA_VERSION}); upgrade lstm-probe (pip install -U lstm-probe)"
            )
        if len(set(arrow.names)) != len(arrow.names):
            twice = sorted({n for n in arrow.names if arrow.names.count(n) > 1})
            raise BadLog(f"{file} names the column {twice[0]!r} more than once: not an lstm-probe log")
        check_counts(file, pf)
        required = required_columns(version)
        missing = required - set(arrow.names)
        if missing:
            raise BadLog(
                f"{file} lacks the column(s) {', '.join(sorted(missing))}: not an lstm-probe log of schema {version}"
            )
        wrong = [
            f"{name} is {arrow.field(name).type}, expected {expected.field(name).type}"
            for name in sorted(required - VECTORS)
            if arrow.field(name).type != expected.field(name).type
        ]
        if wrong:
            raise BadLog(
                f"{file} has columns of the wrong type ({wrong[0]}): not an lstm-probe log of schema {SCHEMA_VERSION}"
            )
        shard = shard_of(file)
        if shard not in runs:
            runs[shard] = metadata_json(file, "run metadata", meta.get(META_RUN_KEY, b"{}"))
        _check_size(file, pf, arrow, runs[shard])
        if schema is None:
            schema = arrow
        elif arrow.field("h").type != schema.field("h").type:
            raise BadLog(f"{file} has h vectors of another size than {files[0]}: parts of different logs")
        kv = pf.metadata.metadata or {}
        if META_FINAL_KEY in kv:
            try:
                doc = metadata_json(file, "final metadata", kv[META_FINAL_KEY])
            except BadLog:
                doc = {}
            shard = shard_of(file)
            if doc.get("final"):
                finals[shard] = doc
            progress[shard] = doc.get("progress", progress.get(shard, {}))
            records[shard] = {**records.get(shard, {}), **{k: doc[k] for k in LIVE_KEYS if k in doc}}
        rows += pf.metadata.num_rows
        size += file.stat().st_size
        if pf.metadata.num_rows:
            data_files.append(file)
    assert schema is not None and runs
    # parts without rows (an idle run's, or a week-long run's at the default --part-seconds: ~10,000) gave
    # their metadata above; the reads skip them (10,000 of them took a report from 0.4 s to 13 s and 1.3 GB)
    files = data_files or files[:1]
    metadata = merge_shards(runs)
    shards = sorted(runs, key=lambda s: (shard_rank(s, False), s))  # the most authoritative first
    if len(shards) > 1:
        metadata["shards"] = {
            s: {"completed": bool(finals.get(s, {}).get("completed")), "progress": progress.get(s, {})} for s in shards
        }
    open_shards = [s for s in shards if s not in finals]
    if not open_shards:
        metadata.update(merge_shards(finals))
        if len(shards) > 1:  # what the probe cost, summed over the processes that wrote the log
            metadata["probe_cost"] = summed_cost(finals)
        failed = [finals[s] for s in shards if not finals[s].get("completed")]
        if failed:
            metadata.update(completed=False, stop_reason=failed[0].get("stop_reason"))
    else:
        open_shards.sort(key=lambda s: (shard_rank(s, True), s))
        metadata.update(
            completed=False,
            progress=progress.get(open_shards[0], {}),
            stop_reason=metadata.get("stop_reason") or "the log was never closed (process killed)",
        )
    live_metadata(metadata, records, shards)  # a killed run's last parts hold them as they were (a closed one's too)
    modes = [records[s]["training_mode"] for s in shards if "training_mode" in records.get(s, {})]
    if len(modes) > 1:  # each process counted its own calls (RLlib: env runners the rollout's, learners the train's)
        metadata["training_mode"] = summed_training_mode(modes)
    check_types(metadata, warnings)  # (metadata_types.py: top-level keys and the records the report reads)
    check_info_keys(metadata, schema.names, warnings)
    clean_device(metadata)
    live = writing(path) if root != Path(path) or root.is_dir() else None
    if live is not None and open_shards:
        metadata.update(
            stop_reason=f"still being written by {live.describe()}: the rows flushed so far (partial)",
            writing={"pid": live.pid, "host": live.host, "started": live.started},
        )
    elif not metadata.get("completed"):  # (a live run's warning came from resolve_files)
        warnings.append(
            f"the run did not complete: {metadata.get('stop_reason') or 'unknown reason'}; "
            "the log holds the rows up to the interruption"
        )
    return LogInfo(root, files, rows, size, metadata, schema, warnings, live if open_shards else None)


def _check_size(file: Path, pf: pq.ParquetFile, arrow: pa.Schema, run: dict[str, Any] | None) -> None:
    """The h and c vectors as wide as the metadata's hidden_size, and no row group larger once read than
    :data:`MAX_ROW_GROUP_BYTES`."""
    widths = {}
    for name in ("h", "c"):
        typ = arrow.field(name).type
        if not pa.types.is_fixed_size_list(typ) or typ.value_type not in (pa.float32(), pa.float16()):
            raise BadLog(f"{file} has an {name} column of type {typ}, not a fixed-size list of floats")
        widths[name] = typ.list_size
    width = widths["h"]
    declared = (run or {}).get("hidden_size")
    if widths["c"] != width or width > MAX_HIDDEN_SIZE or (isinstance(declared, int) and declared != width):
        raise BadLog(
            f"{file} has h vectors of {width} and c vectors of {widths['c']} floats, but its metadata declares "
            f"hidden_size {declared} (at most {MAX_HIDDEN_SIZE}): not an lstm-probe log"
        )
    itemsize = arrow.field("h").type.value_type.byte_width
    row_bytes = SCALAR_BYTES * (len(arrow.names) - 2) + 2 * width * itemsize
    meta = pf.metadata
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        need = max(rg.num_rows * row_bytes, rg.total_byte_size)
        if need > MAX_ROW_GROUP_BYTES:
            raise BadLog(
                f"{file} has a row group of {rg.num_rows:,} rows that takes {need / 2**30:.1f} GiB once read, "
                f"over the {MAX_ROW_GROUP_BYTES / 2**30:.1f} GiB lstm-probe reads at once (its logs' take MBs): "
                "not an lstm-probe log"
            )


def dataset(path: str | os.PathLike[str]) -> tuple[ds.Dataset, LogInfo]:
    """A pyarrow dataset over every file of the log, checked against the schema."""
    info = read_info(path)
    import pyarrow.dataset as ds

    # string columns read as the dictionaries the writer stores them in: a string repeated in every row is
    # held once (a 600 KB string in a dictionary page is not expanded for every row), and the scan builds no
    # string per row
    strings = [f.name for f in info.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    schema = pa.schema(
        [f.with_type(pa.dictionary(pa.int32(), f.type)) if f.name in strings else f for f in info.schema],
        metadata=info.schema.metadata,
    )
    fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=strings))
    return ds.dataset([str(f) for f in info.files], format=fmt, schema=schema), info


def narrow(data: ds.Dataset, **within: tuple[int, int]) -> ds.Dataset:
    """The row groups of ``data`` whose footer statistics allow a value of each named integer column in
    ``lo..hi``: a dataset to scan with a filter on those columns when they hold nulls.

    Arrow's scan skips a row group by its statistics only where the filtered column has no nulls in it,
    or a single value (measured with pyarrow 26: ``episode == 5`` reads every row group whose episode
    column holds nulls and a range of values, and padding rows leave env, env_step and episode null),
    so a scan for one episode or one env step range reads the whole log. This keeps the row groups
    whose min..max meets lo..hi for every named column (and those without statistics for it); the
    filter still decides which rows are returned."""
    import pyarrow.dataset as ds

    kept = []
    for frag in data.get_fragments():
        frag.ensure_complete_metadata()
        ids = []
        for rg in frag.row_groups:
            stats = rg.statistics or {}
            if all(_may_hold(stats.get(col), lo, hi) for col, (lo, hi) in within.items()):
                ids.append(rg.id)
        if ids:
            kept.append(frag.subset(row_group_ids=ids))
    return ds.FileSystemDataset(kept, data.schema, data.format, data.filesystem)


def _may_hold(stats: dict[str, Any] | None, lo: int, hi: int) -> bool:
    if not stats or stats.get("min") is None or stats.get("max") is None:
        return True  # no statistics: the row group may hold anything
    return bool(stats["min"] <= hi and stats["max"] >= lo)


def _values(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple | set) else [value]


def _filter(expr: ds.Expression | None = None, **equals: Any) -> ds.Expression | None:
    """``expr`` and each column's value(s)."""
    import pyarrow.dataset as ds

    for col, value in equals.items():
        if value is None:
            continue
        e = ds.field(col).isin(_values(value))
        expr = e if expr is None else expr & e
    return expr


@reads("loaded")
def load(
    path: str | os.PathLike[str],
    *,
    phase: str | list[str] | None = None,
    module: str | list[str] | None = None,
    iteration: int | list[int] | None = None,
    layer: int | list[int] | None = None,
    env: int | list[int] | None = None,
    episode: int | list[int] | None = None,
    worker: int | list[int] | None = None,
    columns: list[str] | None = None,
    vectors: bool = True,
) -> pd.DataFrame:
    """The log's rows as a pandas DataFrame, optionally filtered; ``vectors=False`` skips the vector columns
    (h, c, obs, info). ``worker``: the process that wrote the rows where several did (RLlib's env runners, each
    with envs 0..N-1 of its own: ``worker=1, env=0, episode=3`` is one episode).

    Each filter reads only the row groups that can hold its values (``env=0, episode=12``: one episode's
    rows of a large log, not a scan of every row group; see :func:`narrow`). A vector column that most rows
    leave null (a ``--trace-envs K`` log's h and c) holds its stored vectors alone (:mod:`log.sparse`).

    A filter none of whose values the log can hold (``env=5`` in a 4-env log, ``phase="bogus"``, an iteration
    past the last) raises :class:`BadInput` naming the values it holds, from the footer statistics alone
    (:mod:`log.held`); filters whose values the log holds but whose combination selects no row give an empty
    frame."""
    _check_arguments(
        {"iteration": iteration, "layer": layer, "env": env, "episode": episode, "worker": worker},
        {"phase": phase, "module": module},
        columns,
    )
    within = {
        col: (min(values), max(values))
        for col, value in (("env", env), ("episode", episode))
        if value is not None and (values := _values(value))
    }
    filt = _filter(phase=phase, module=module, iteration=iteration, layer=layer, env=env, episode=episode)
    if worker is not None:  # every log has the column (null where one process wrote it: no row then)
        filt = _filter(filt, worker=worker)
    opened = dataset(path)
    asked = {"phase": phase, "module": module, "iteration": iteration, "layer": layer, "env": env}
    held.check(opened[0], {**asked, "episode": episode, "worker": worker})  # values no row group can hold
    return _load(path, columns, vectors, filt, within, opened)


def _load(
    path: str | os.PathLike[str],
    columns: list[str] | None,
    vectors: bool,
    filt: ds.Expression | None,
    within: dict[str, tuple[int, int]],
    opened: tuple[ds.Dataset, LogInfo] | None = None,
) -> pd.DataFrame:
    """:func:`load`'s rows: those ``filt`` selects in the row groups that may hold ``within`` (:func:`narrow`);
    ``opened``: the log's :func:`dataset` where the caller has it."""
    data, info = opened or dataset(path)
    if within:
        data = narrow(data, **within)
    if columns is None:
        columns = [c for c in info.schema.names if vectors or c not in VECTORS]
    else:
        unknown = set(columns) - set(info.schema.names)
        if unknown:
            raise BadLog(f"no column {sorted(unknown)[0]!r} in the log; columns: {', '.join(info.schema.names)}")
    # vector columns with no vector in the log (a summary log's h and c) are not read (Arrow would allocate
    # their full width for every null row): they come back as columns of None
    empty = budget.all_null(data, columns)
    read = [c for c in columns if c not in empty]
    what = f"loading {len(read)} column(s) of {path}"
    # vector columns that most rows leave null (a wide run's traced envs, rollout-only obs): compacted
    compact = sparse.sparse_columns(data, read)
    if compact:
        table, held = sparse.table(data, read, compact, filt, what, _LOAD_FIX)
    else:
        table, held = budget.table(data, read, filt, what, _LOAD_FIX), {}
    # integer and bool columns as pandas' nullable dtypes (Int64, boolean): null env on padding rows
    # stays <NA> instead of turning the column into floats
    import pandas as pd

    df = table.to_pandas(types_mapper=_nullable_dtype)
    for name in df.columns:  # strings (read as dictionaries) as plain objects, each distinct string held once
        col = df[name]
        if isinstance(col.dtype, pd.CategoricalDtype):
            # not col.astype(object): pandas' string categories would copy the string into every row first
            words = np.asarray([*col.cat.categories, None], dtype=object)
            df[name] = pd.Series(words[col.cat.codes.to_numpy()], index=df.index, dtype=object)
    for name in empty:
        df[name] = pd.Series(np.full(len(df), None, dtype=object), index=df.index)
    for name, col in held.items():
        df[name] = pd.Series(col.to_numpy(), index=df.index, dtype=object)
    hidden = info.metadata.get("hidden_size")
    if isinstance(hidden, int) and not isinstance(hidden, bool) and 0 < hidden <= MAX_HIDDEN_SIZE:
        df.attrs["hidden_size"] = hidden  # states(): the width of rows that hold no vector
    return df[columns]


def _check_arguments(ints: dict[str, Any], words: dict[str, Any], columns: Any) -> None:
    """:class:`BadInput` for a filter or column list of the wrong type (``iteration="5"``), before the log is
    read: Arrow's own error would not say which argument it was."""
    for name, value in ints.items():
        if value is not None and not all(
            isinstance(v, int | np.integer) and not isinstance(v, bool) for v in _values(value)
        ):
            raise BadInput(f"load({name}=...) takes an integer or a list of integers, not {value!r}")
    for name, value in words.items():
        if value is not None and not all(isinstance(v, str) for v in _values(value)):
            raise BadInput(f"load({name}=...) takes a string or a list of strings, not {value!r}")
    if columns is not None and (isinstance(columns, str) or not all(isinstance(c, str) for c in columns)):
        raise BadInput(f"load(columns=...) takes a list of column names, not {columns!r}")


_LOAD_FIX = "load fewer rows (phase=, iteration=, env=, episode=) or columns (vectors=False, columns=[...])"


def _nullable_dtype(t: pa.DataType) -> Any:
    import pandas as pd

    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return pd.api.types.pandas_dtype(str(t).capitalize() if pa.types.is_integer(t) else "boolean")
    return None


def states(df: pd.DataFrame, which: str = "h") -> np.ndarray:
    """The h or c vectors of a loaded DataFrame as one (rows, hidden) float array (NaN rows where null; where no
    row holds one, as wide as the log's ``hidden_size``, which :func:`load` keeps in ``df.attrs``)."""
    if which not in ("h", "c"):
        raise ValueError("which must be 'h' or 'c'")
    if which not in df.columns:
        raise ValueError(f"the DataFrame has no {which!r} column; load it with vectors=True")
    col = df[which].to_numpy()
    held = np.fromiter((v is not None and not isinstance(v, float) for v in col), bool, len(col))
    rows = col[held]
    # no row holds one (an env --trace-envs did not keep, a GRU's c): as wide as the log's hidden size
    width = len(rows[0]) if len(rows) else int(df.attrs.get("hidden_size", 0))
    out = np.full((len(col), width), np.nan, np.float32)
    if len(rows):  # one copy of the held rows (a wide log's traced envs: a few percent of its rows)
        out[held] = np.stack(list(rows))
    return out
