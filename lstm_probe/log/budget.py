"""One memory budget for every read of a file from elsewhere: a log (report, load, states, pair, probe,
html) or a model.zip (arch). The bytes a read will hold are computed from the schema and the Parquet footer
before any row is read (every column asked for, vectors of any width, strings, the row groups held at once),
and a read over the budget is refused with one line that says how to raise it. A file from elsewhere is
opened only if it is a regular file (:func:`open_regular`): a FIFO or a device would block or never end.

The budget: :func:`set_limit` (the CLI's ``--max-memory``), else the ``LSTM_PROBE_MAX_MEMORY`` environment
variable, else :data:`DEFAULT_BYTES`. Sizes read as bytes or with a unit: ``512M``, ``4G``, ``1.5GiB``.
Imports pyarrow only inside the functions that read footers.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from lstm_probe.errors import BadInput, BadLog

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as ds

DEFAULT_BYTES = 2 << 30
"""2 GiB: what a read may hold at once unless raised. A laptop has it to spare; lstm-probe's own reads take
far less (the 9.9M-row report peaks at ~0.7 GB of RSS with the interpreter and libraries, its reads a few
hundred MB), so only a hostile or enormous file meets it."""
ENV = "LSTM_PROBE_MAX_MEMORY"
HELD = 4
"""Row groups a streaming read may hold at once (the one decoded, the ones read ahead)."""
DECODE = 2
"""Copies of a row group's columns a read holds while it decodes them (the decoded pages and the Arrow
arrays; measured: a report streaming 534 MiB of null 65,536-wide vectors peaked 1.1 GB above its baseline)."""

_limit: int | None = None
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str | int) -> int:
    """``"4G"``, ``"512MiB"``, ``"1.5g"``, ``"2000000"`` as bytes (binary units); :class:`BadInput` otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        value: float = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(text), re.IGNORECASE)
        if m is None:
            raise BadInput(f"memory size {str(text)[:40]!r} is not a size: use bytes or a unit, e.g. 512M, 4G")
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not value >= 1 << 20:
        raise BadInput(f"memory size {text!r} is under 1 MiB: lstm-probe needs more than that to read anything")
    return int(value)


def set_limit(value: str | int | None) -> None:
    """Set the budget for this process (None: back to the environment variable or the default)."""
    global _limit
    _limit = None if value is None else parse_bytes(value)


def limit() -> int:
    """The budget in bytes."""
    if _limit is not None:
        return _limit
    env = os.environ.get(ENV)
    if env:
        try:
            return parse_bytes(env)
        except BadInput as exc:
            raise BadInput(f"{ENV}: {exc}") from None
    return DEFAULT_BYTES


def words(n: float) -> str:
    """Bytes as a short size: ``"3.4 GiB"``, ``"12 MiB"``, ``"4.4 TiB"``."""
    for unit, shift in (("TiB", 40), ("GiB", 30)):
        if n >= 1 << shift:
            return f"{n / 2**shift:,.1f} {unit}"
    return f"{n / 2**20:,.0f} MiB"


def refuse(need: int, what: str, fix: str = "") -> None:
    """:class:`BadLog` (one line) when ``need`` bytes are over the budget."""
    budget = limit()
    if need > budget:
        hint = f"{fix}, or " if fix else ""
        raise BadLog(
            f"{what} would hold {words(need)} at once, over the {words(budget)} memory budget; {hint}raise it if "
            f"the file is trusted: --max-memory SIZE on the command line, {ENV}=SIZE, or "
            "lstm_probe.set_max_memory(SIZE)"
        )


# -- Parquet: the bytes a read holds, from the footer -------------------------------------------------
def field_bytes(field: pa.Field, rows: int, chunks: Sequence[Any]) -> int:
    """Bytes ``rows`` rows of ``field`` take once read into Arrow (``chunks``: its leaf columns' chunk
    metadata in one row group). Fixed-size lists count their full width (Arrow allocates it even for nulls);
    strings their stored size, which bounds them as the reader reads them (as dictionaries); anything else
    its leaf values."""
    import pyarrow as pa

    t = field.type
    validity = rows // 8 + 1
    if pa.types.is_fixed_size_list(t):
        width = max(1, t.value_type.bit_width // 8) if _fixed(t.value_type) else 8
        return rows * t.list_size * width + 2 * validity + rows * t.list_size // 8
    if _fixed(t):
        return rows * max(1, t.bit_width // 8) + validity
    stored = sum(int(c.total_uncompressed_size) for c in chunks)
    values = sum(int(c.num_values) for c in chunks)
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        return stored + rows * 8 + validity  # read as a dictionary: its values once, an index per row
    return stored + values * 8 + rows * 8 + validity  # lists, structs, maps: offsets and values


def _fixed(t: pa.DataType) -> bool:
    try:
        return t.bit_width > 0
    except ValueError:
        return False


def _leaves(meta: Any) -> dict[str, list[int]]:
    """Top-level column name -> its leaf columns' indices in the file's row groups."""
    out: dict[str, list[int]] = {}
    for j in range(meta.num_columns):
        out.setdefault(meta.schema.column(j).path.split(".")[0], []).append(j)
    return out


def _walk(data: ds.Dataset) -> Iterator[tuple[Any, dict[str, list[int]]]]:
    """Each row group of ``data`` (those its fragments select) with its file's leaf columns (:func:`_leaves`);
    nothing for a dataset that is not of Parquet files."""
    import pyarrow.dataset as ds

    if not isinstance(data, ds.FileSystemDataset):
        return
    for frag in data.get_fragments():
        meta = frag.metadata
        leaves = _leaves(meta)
        ids = [rg.id for rg in frag.row_groups] if frag.row_groups else range(meta.num_row_groups)
        for i in ids:
            yield meta.row_group(i), leaves


def row_groups(data: ds.Dataset, columns: Iterable[str]) -> list[int]:
    """The bytes each row group of ``data`` takes once ``columns`` of it are read."""
    return [size for size, _ in groups(data, columns)]


def groups(data: ds.Dataset, columns: Iterable[str]) -> list[tuple[int, int]]:
    """(bytes once ``columns`` are read, rows) of each row group of ``data``."""
    names = [n for n in dict.fromkeys(columns) if n in data.schema.names]
    out: list[tuple[int, int]] = []
    for rg, leaves in _walk(data):
        total = 0
        for name in names:
            if name in leaves:
                chunks = [rg.column(j) for j in leaves[name]]
                total += field_bytes(data.schema.field(name), rg.num_rows, chunks)
        out.append((total, rg.num_rows))
    return out


def all_null(data: ds.Dataset, names: Iterable[str]) -> set[str]:
    """The fixed-size list columns among ``names`` that hold no vector in any row group (a summary log's h
    and c, a GRU's c): their leaf has one value per row (the null's), where a stored vector has its width.
    Read, they would still take their full width per row; a reader can skip them."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    if not isinstance(data, ds.FileSystemDataset):
        return set()
    wide = {n for n in names if n in data.schema.names and pa.types.is_fixed_size_list(data.schema.field(n).type)}
    wide = {n for n in wide if data.schema.field(n).type.list_size > 1}
    for rg, leaves in _walk(data):
        wide = {n for n in wide if n in leaves and all(rg.column(j).num_values <= rg.num_rows for j in leaves[n])}
        if not wide:
            break
    return wide


def prune(data: ds.Dataset, filt: ds.Expression | None) -> ds.Dataset:
    """The row groups of ``data`` that ``filt`` may select by their footer statistics (to scan with ``filt``).
    Arrow (pyarrow 26) prunes nothing by a filter on a dictionary column, the form :func:`dataset` reads
    strings in (``phase == "rollout"`` read every row group's vectors: 3.0 s instead of 0.27 s at 9.9M rows);
    this asks Arrow's pruning on the same files read with plain strings and keeps the row groups it keeps."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    if filt is None or not isinstance(data, ds.FileSystemDataset) or not isinstance(data.format, ds.ParquetFileFormat):
        return data
    words = {f.name for f in data.schema if pa.types.is_dictionary(f.type)}
    if not words & set(re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", str(filt))):
        return data  # Arrow prunes by the filter's columns itself
    plain = pa.schema(
        [f.with_type(f.type.value_type) if f.name in words else f for f in data.schema],
        metadata=data.schema.metadata,
    )
    twin = ds.ParquetFileFormat()
    kept = []
    for frag in data.get_fragments():
        ids = [rg.id for rg in frag.row_groups] if frag.row_groups else None
        mirror = twin.make_fragment(frag.path, frag.filesystem, row_groups=ids)
        keep = [rg.id for part in mirror.split_by_row_group(filt, schema=plain) for rg in part.row_groups]
        if keep:
            kept.append(frag.subset(row_group_ids=keep))
    return ds.FileSystemDataset(kept, data.schema, data.format, data.filesystem)


def check_filtered(
    data: ds.Dataset, columns: Iterable[str], filt: ds.Expression | None, what: str, fix: str = ""
) -> None:
    """A read that keeps the rows ``filt`` selects (``to_table(filter=...)``, then pandas) fits the budget: the
    rows it keeps (counted first by reading the filter's columns alone, within the budget too) at the
    average width of the row groups they come from, held twice (Arrow, then the caller's copy), plus the
    row groups held while they are decoded."""
    held, decoding = filtered_need(data, columns, filt, what)
    refuse(held + decoding, what, fix)


def filtered_need(data: ds.Dataset, columns: Iterable[str], filt: ds.Expression | None, what: str) -> tuple[int, int]:
    """What :func:`check_filtered` counts for one read, in two parts: (bytes its rows hold once read, bytes of
    the row groups held while it decodes them)."""
    sizes = groups(data, columns)
    if not sizes:
        return 0, 0
    total = sum(size for size, _ in sizes)
    rows = sum(n for _, n in sizes)
    kept = kept_rows(data, filt, rows, what)
    largest = sorted((size for size, _ in sizes), reverse=True)[:HELD]
    return DECODE * (total * kept // max(rows, 1)), sum(largest)


def check_together(
    reads: Iterable[tuple[ds.Dataset, Iterable[str], ds.Expression | None, str]], what: str, fix: str = ""
) -> None:
    """Several filtered reads whose tables are held at once (each ``(data, columns, filter, what)``, read one
    after another with :func:`read`) fit the budget together: the rows each keeps (:func:`filtered_need`),
    summed, plus the largest of their decoding row groups (one read decodes at a time). One line names
    ``what`` where the sum is over (each alone may fit)."""
    needs = [filtered_need(data, columns, filt, part) for data, columns, filt, part in reads]
    refuse(sum(held for held, _ in needs) + max((d for _, d in needs), default=0), what, fix)


def kept_rows(data: ds.Dataset, filt: ds.Expression | None, rows: int, what: str) -> int:
    """The rows of ``data`` (``rows`` in all) that ``filt`` keeps, counted by reading the filter's columns
    alone (checked against the budget first)."""
    if filt is None or not rows:
        return rows
    refs = sorted(set(re.findall(r"\b[a-z_]+\b", str(filt))) & set(data.schema.names))
    check_stream(data, refs, f"{what}: its filter's columns")
    return int(data.count_rows(filter=filt))


def vectors_stored(data: ds.Dataset, names: Iterable[str]) -> dict[str, tuple[int, int, int]]:
    """Per fixed-size list column among ``names`` (of width > 1): (rows of the selected row groups, rows that
    hold a vector, bytes of one vector), from the footer alone: a fixed-size list's leaf holds its width's
    values per stored vector and one per null."""
    import pyarrow as pa

    out: dict[str, tuple[int, int, int]] = {}
    wide = {n: data.schema.field(n).type for n in dict.fromkeys(names) if n in data.schema.names}
    wide = {n: t for n, t in wide.items() if pa.types.is_fixed_size_list(t) and t.list_size > 1}
    for rg, leaves in _walk(data):
        for name, t in wide.items():
            rows, held, _ = out.get(name, (0, 0, 0))
            width = int(t.list_size)
            if name in leaves:
                values = max(int(rg.column(j).num_values) for j in leaves[name])
                held += min(rg.num_rows, max(0, values - rg.num_rows) // (width - 1))
            item = max(1, t.value_type.bit_width // 8) if _fixed(t.value_type) else 8
            out[name] = (rows + rg.num_rows, held, width * item)
    return out


def table(data: ds.Dataset, columns: list[str], filt: ds.Expression | None, what: str, fix: str = "") -> pa.Table:
    """``data.to_table(columns=..., filter=...)`` within the budget: checked first (:func:`check_filtered`),
    then read one row group at a time. Arrow's own read-ahead (16 batches, 4 files) held ~2.4 GB decoding a
    1,024-env ``--trace-envs 16`` log's null vectors to keep 867 rows; this read ~0.8 GB, and was faster."""
    check_filtered(data, columns, filt, what, fix)
    return read(data, columns, filt)


def read(data: ds.Dataset, columns: list[str], filt: ds.Expression | None) -> pa.Table:
    """:func:`table`'s read alone, for a caller that checked it (:func:`check_filtered`) with others first."""
    return data.scanner(columns=columns, filter=filt, batch_readahead=0, fragment_readahead=1).to_table()


def check_stream(data: ds.Dataset, columns: Iterable[str], what: str, held: int = HELD) -> None:
    """A streaming read (``to_batches``) of ``columns``, holding ``held`` row groups at once, fits the budget."""
    sizes = sorted(row_groups(data, columns), reverse=True)
    refuse(DECODE * sum(sizes[:held]), what)


# -- files from elsewhere: regular files only -----------------------------------------------------------
def open_regular(path: str | os.PathLike[str], fix: str) -> BinaryIO:
    """``path`` opened for reading (binary) if it is a regular file; :class:`BadInput` (one line ending in
    ``fix``) for a FIFO, socket or device, whose read would wait forever or never end. Opened without
    blocking and checked on the open file (``fstat``), so a FIFO is never waited on, even one put in the
    file's place after a check."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise BadInput(f"{path} cannot be read ({exc.strerror or exc}); {fix}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadInput(f"{path} is not a regular file (a pipe, socket or device); {fix}")
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], fix: str, copies: int = 1) -> bytes:
    """The whole of the regular file ``path`` (:func:`open_regular`), refused first (one line) when ``copies``
    times its size is over the budget (a file parsed holds itself and what it is parsed into)."""
    with open_regular(path, fix) as f:
        size = os.fstat(f.fileno()).st_size
        refuse(copies * size, f"reading {path}")
        data = f.read(size + 1)
    if len(data) > size:  # a file that grows while it is read is read as its size said
        data = data[:size]
    return data
