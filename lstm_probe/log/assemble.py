"""A single-file log assembled from its crash journal's parts, without encoding any row twice.

A single-file log (``--out run.parquet``) is written as parts into ``run.parquet.partial/`` (the crash
journal, ``writer.py``). Each part is a complete Parquet file: ``PAR1``, its row groups' column chunks,
its footer (Thrift compact protocol), the footer's length and ``PAR1``. When a part is published,
:class:`Assembly` copies its column chunks byte for byte to the end of the hidden ``.run.parquet.tmp``
(``os.copy_file_range``: the kernel copies, nothing is decoded) and keeps the part's row groups' metadata
with every file offset moved by where the bytes landed. Closing the log appends one footer (the last
part's schema and key-value metadata, every row group in order) and renames the file into place.

The footer is a Thrift struct (parquet.thrift's ``FileMetaData``); :func:`decode` and :func:`encode`
read and write the compact protocol generically, field by field, so every field a writer sets survives.
Only the offsets below change:
- ``RowGroup``: 5 ``file_offset``; 7 ``ordinal`` (renumbered);
- ``ColumnChunk``: 2 ``file_offset`` (where not 0);
- ``ColumnMetaData``: 9 ``data_page_offset``, 10 ``index_page_offset``, 11 ``dictionary_page_offset``.
The parts are written without page indexes or bloom filters (``parts._parquet_writer``), whose own
contents would hold offsets too: a part with either (``ColumnChunk`` 4 or 6, ``ColumnMetaData`` 14) is
refused (:class:`ValueError`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAGIC = b"PAR1"
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)

Field = tuple[int, int, Any]
"""A struct's field: (field id, compact type, value). Values: int (byte, i16, i32, i64), bytes (binary, and
a double's 8 raw bytes), None (bool: the type says true or false), a list ``(element type, [values])``
(list, set; a bool element is its raw byte), a map ``(key type, value type, [(key, value)])``, and a
struct: ``list[Field]``."""


# -- the Thrift compact protocol ------------------------------------------------------------------------


class Encoded(bytes):
    """A value already in compact-protocol bytes: :func:`encode` writes it as it is (a row group's moved
    metadata is kept this way, ~2 kB, instead of as Python objects, ~30x that)."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, pos
        shift += 7


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _field_head(buf: bytes, pos: int, last: int) -> tuple[int, int, int]:
    """A struct field's header at ``pos`` (``last``: the previous field's id): its id, its type and where its
    value starts; type ``_STOP`` at the struct's end."""
    head = buf[pos]
    if head == _STOP:
        return 0, _STOP, pos + 1
    typ, delta = head & 0x0F, head >> 4
    if delta:
        return last + delta, typ, pos + 1
    n, pos = _varint(buf, pos + 1)
    return _unzigzag(n), typ, pos


def _list_head(buf: bytes, pos: int) -> tuple[int, int, int]:
    """A list's (or set's) header at ``pos``: its size, its elements' type and where the elements start."""
    head = buf[pos]
    size, elem = head >> 4, head & 0x0F
    if size == 15:
        size, pos = _varint(buf, pos + 1)
        return size, elem, pos
    return size, elem, pos + 1


def _value(buf: bytes, pos: int, typ: int) -> tuple[Any, int]:
    if typ in (_TRUE, _FALSE, _BYTE):  # (a bool inside a list or map is one byte of its own)
        return buf[pos], pos + 1
    if typ in (_I16, _I32, _I64):
        n, pos = _varint(buf, pos)
        return _unzigzag(n), pos
    if typ == _DOUBLE:
        return bytes(buf[pos : pos + 8]), pos + 8
    if typ == _BINARY:
        n, pos = _varint(buf, pos)
        return bytes(buf[pos : pos + n]), pos + n
    if typ in (_LIST, _SET):
        size, elem, pos = _list_head(buf, pos)
        items = []
        for _ in range(size):
            v, pos = _value(buf, pos, elem)
            items.append(v)
        return (elem, items), pos
    if typ == _MAP:
        size, pos = _varint(buf, pos)
        if size == 0:
            return (0, 0, []), pos
        kt, vt = buf[pos] >> 4, buf[pos] & 0x0F
        pos += 1
        pairs = []
        for _ in range(size):
            k, pos = _value(buf, pos, kt)
            v, pos = _value(buf, pos, vt)
            pairs.append((k, v))
        return (kt, vt, pairs), pos
    if typ == _STRUCT:
        return _struct(buf, pos)
    raise ValueError(f"unknown Thrift compact type {typ}")


def _struct(
    buf: bytes,
    pos: int,
    row_group: Callable[[list[Field]], None] | None = None,
    raw_row_group: Callable[[bytes, int], int] | None = None,
) -> tuple[list[Field], int]:
    """A struct at ``pos`` and where it ends. ``row_group`` (a FileMetaData only): called with each row group
    as it is read, the row-group list left empty, so one row group's Python objects exist at a time (a
    part's whole footer as Python objects took ~60 MB for 250 row groups); ``raw_row_group``: called with
    the bytes and where each row group starts instead, it returns where the row group ends (nothing decoded)."""
    fields: list[Field] = []
    last = 0
    while True:
        fid, typ, pos = _field_head(buf, pos, last)
        if typ == _STOP:
            return fields, pos
        if typ in (_TRUE, _FALSE):
            fields.append((fid, typ, None))
        elif (row_group or raw_row_group) and fid == _ROW_GROUPS and typ == _LIST and buf[pos] & 0x0F == _STRUCT:
            size, elem, pos = _list_head(buf, pos)
            for _ in range(size):
                if raw_row_group is not None:
                    pos = raw_row_group(buf, pos)
                    continue
                rg, pos = _struct(buf, pos)
                assert row_group is not None
                row_group(rg)
            fields.append((fid, typ, (elem, [])))
        else:
            v, pos = _value(buf, pos, typ)
            fields.append((fid, typ, v))
        last = fid


def decode(buf: bytes) -> list[Field]:
    """A Thrift struct in the compact protocol, field by field (see :data:`Field`)."""
    fields, _ = _struct(buf, 0)
    return fields


def _put_varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _put_int(out: bytearray, n: int) -> None:
    """An integer (i16, i32, i64, a long-form field id) as the compact protocol writes it: zigzag, then varint."""
    _put_varint(out, (n << 1) ^ (n >> 63))


def _put_value(out: bytearray, typ: int, v: Any) -> None:
    if isinstance(v, Encoded):
        out += v
    elif typ in (_TRUE, _FALSE, _BYTE):
        out.append(v & 0xFF)
    elif typ in (_I16, _I32, _I64):
        _put_int(out, v)
    elif typ == _DOUBLE:
        out += v
    elif typ == _BINARY:
        _put_varint(out, len(v))
        out += v
    elif typ in (_LIST, _SET):
        elem, items = v
        if len(items) < 15:
            out.append(len(items) << 4 | elem)
        else:
            out.append(0xF0 | elem)
            _put_varint(out, len(items))
        for item in items:
            _put_value(out, elem, item)
    elif typ == _MAP:
        kt, vt, pairs = v
        _put_varint(out, len(pairs))
        if pairs:
            out.append(kt << 4 | vt)
        for k, val in pairs:
            _put_value(out, kt, k)
            _put_value(out, vt, val)
    elif typ == _STRUCT:
        _put_struct(out, v)
    else:
        raise ValueError(f"unknown Thrift compact type {typ}")


def _put_struct(out: bytearray, fields: list[Field]) -> None:
    last = 0
    for fid, typ, v in fields:
        if 0 < fid - last <= 15:
            out.append((fid - last) << 4 | typ)
        else:
            out.append(typ)
            _put_int(out, fid)
        if typ not in (_TRUE, _FALSE):
            _put_value(out, typ, v)
        last = fid
    out.append(_STOP)


def encode(fields: list[Field]) -> bytes:
    """The compact-protocol bytes of a struct :func:`decode` read (the same bytes for an unchanged struct)."""
    out = bytearray()
    _put_struct(out, fields)
    return bytes(out)


# -- Parquet footers ------------------------------------------------------------------------------------

_ROW_GROUPS, _NUM_ROWS = 4, 3  # FileMetaData
_RG_COLUMNS, _RG_OFFSETS, _RG_ORDINAL = 1, (5,), 7  # RowGroup: columns, file_offset, ordinal
_CC_META, _CC_OFFSETS, _CC_INDEXES = 3, (2,), (4, 6)  # ColumnChunk: meta_data, file_offset, page index offsets
_CM_OFFSETS, _CM_BLOOM = (9, 10, 11), 14  # ColumnMetaData: data, index, dictionary page offsets; bloom filter


def _moved(fields: list[Field], ids: tuple[int, ...], shift: int) -> list[Field]:
    # 0 is no offset (a writer leaves the deprecated ColumnChunk.file_offset 0): it stays 0
    return [(fid, typ, v + shift if fid in ids and typ == _I64 and v > 0 else v) for fid, typ, v in fields]


def _chunk(chunk: list[Field], shift: int) -> list[Field]:
    """A column chunk's metadata with its file offsets moved by ``shift`` bytes."""
    if any(fid in _CC_INDEXES for fid, _, _ in chunk):
        raise ValueError("a part with a page index cannot be moved (its offsets are inside it)")
    out = _moved(chunk, _CC_OFFSETS, shift)
    for i, (fid, typ, meta) in enumerate(out):
        if fid == _CC_META:
            if any(f == _CM_BLOOM for f, _, _ in meta):
                raise ValueError("a part with bloom filters cannot be moved")
            out[i] = (fid, typ, _moved(meta, _CM_OFFSETS, shift))
    return out


def _row_group(rg: list[Field], shift: int, ordinal: int) -> list[Field]:
    """A row group's metadata with its file offsets moved by ``shift`` bytes and its ordinal set."""
    out: list[Field] = []
    for fid, typ, v in _moved(rg, _RG_OFFSETS, shift):
        if fid == _RG_COLUMNS:
            v = (v[0], [_chunk(chunk, shift) for chunk in v[1]])
        elif fid == _RG_ORDINAL:
            v = ordinal
        out.append((fid, typ, v))
    return out


# -- moving a row group's metadata without decoding it ---------------------------------------------------
# A row group's metadata is ~2 kB of Thrift for a log's ~30 columns; decoded into Python objects, moved and
# encoded again it took 1.1-1.2 ms per row group. :func:`moved_row_group` copies every byte it does not change
# and decodes only the path to the offsets (RowGroup.columns -> ColumnChunk -> ColumnMetaData), with the same
# output as ``encode(_row_group(decode(...)))``: 0.6 ms (``benchmarks/writer_profile.py footer LOG``).

Plan = dict[int, tuple[Any, ...]]
"""A struct's fields to act on: field id -> ("offset",) move an i64 offset > 0; ("ordinal",) set it;
("struct", Plan) and ("structs", Plan) descend into a struct or a list of structs; ("refuse", why) raise."""

_CHUNK_PLAN: Plan = {
    **{fid: ("offset",) for fid in _CC_OFFSETS},
    **{fid: ("refuse", "a part with a page index cannot be moved (its offsets are inside it)") for fid in _CC_INDEXES},
    _CC_META: (
        "struct",
        {
            **{fid: ("offset",) for fid in _CM_OFFSETS},
            _CM_BLOOM: ("refuse", "a part with bloom filters cannot be moved"),
        },
    ),
}
_ROW_GROUP_PLAN: Plan = {
    **{fid: ("offset",) for fid in _RG_OFFSETS},
    _RG_ORDINAL: ("ordinal",),
    _RG_COLUMNS: ("structs", _CHUNK_PLAN),
}


def _skip(buf: bytes, pos: int, typ: int) -> int:
    """Where a value of ``typ`` at ``pos`` ends (read as :func:`_value` reads it, nothing built)."""
    if typ in (_TRUE, _FALSE, _BYTE):
        return pos + 1
    if typ in (_I16, _I32, _I64):
        while buf[pos] & 0x80:
            pos += 1
        return pos + 1
    if typ == _DOUBLE:
        return pos + 8
    if typ == _BINARY:
        n, pos = _varint(buf, pos)
        return pos + n
    if typ in (_LIST, _SET):
        size, elem, pos = _list_head(buf, pos)
        for _ in range(size):
            pos = _skip(buf, pos, elem)
        return pos
    if typ == _MAP:
        size, pos = _varint(buf, pos)
        if size == 0:
            return pos
        kt, vt = buf[pos] >> 4, buf[pos] & 0x0F
        pos += 1
        for _ in range(size):
            pos = _skip(buf, _skip(buf, pos, kt), vt)
        return pos
    if typ == _STRUCT:
        return _skip_struct(buf, pos)
    raise ValueError(f"unknown Thrift compact type {typ}")


def _skip_struct(buf: bytes, pos: int) -> int:
    while True:
        _, typ, pos = _field_head(buf, pos, 0)
        if typ == _STOP:
            return pos
        if typ not in (_TRUE, _FALSE):
            pos = _skip(buf, pos, typ)


def _rewrite(buf: bytes, pos: int, out: bytearray, plan: Plan, shift: int, ordinal: int) -> int:
    """Copy the struct at ``pos`` into ``out`` as ``plan`` says (unplanned fields byte for byte); where it ends."""
    last = 0
    while True:
        start = pos
        fid, typ, pos = _field_head(buf, pos, last)
        if typ == _STOP:
            out.append(_STOP)
            return pos
        last = fid
        act = plan.get(fid)
        if act is not None and act[0] == "refuse":
            raise ValueError(act[1])
        if typ in (_TRUE, _FALSE) or act is None:
            end = pos if typ in (_TRUE, _FALSE) else _skip(buf, pos, typ)
            out += buf[start:end]
            pos = end
            continue
        kind = act[0]
        if kind == "offset" and typ == _I64:
            out += buf[start:pos]
            n, pos = _varint(buf, pos)
            v = _unzigzag(n)
            v = v + shift if v > 0 else v
            _put_int(out, v)
        elif kind == "ordinal" and typ in (_I16, _I32, _I64):
            out += buf[start:pos]
            pos = _skip(buf, pos, typ)
            _put_int(out, ordinal)
        elif kind == "struct" and typ == _STRUCT:
            out += buf[start:pos]
            pos = _rewrite(buf, pos, out, act[1], shift, ordinal)
        elif kind == "structs" and typ == _LIST and buf[pos] & 0x0F == _STRUCT:
            size, _, end = _list_head(buf, pos)
            out += buf[start:end]
            pos = end
            for _ in range(size):
                pos = _rewrite(buf, pos, out, act[1], shift, ordinal)
        else:  # a type other than the plan's: left as it is (as _row_group leaves it)
            end = _skip(buf, pos, typ)
            out += buf[start:end]
            pos = end


def moved_row_group(buf: bytes, pos: int, shift: int, ordinal: int) -> tuple[Encoded, int]:
    """The row group's metadata at ``pos`` with its file offsets moved by ``shift`` bytes and its ordinal set
    (``encode(_row_group(rg, shift, ordinal))`` of it decoded, byte for byte), and where it ends."""
    out = bytearray()
    end = _rewrite(buf, pos, out, _ROW_GROUP_PLAN, shift, ordinal)
    return Encoded(out), end


def read_footer(
    path: Path,
    row_group: Callable[[list[Field]], None] | None = None,
    raw_row_group: Callable[[bytes, int], int] | None = None,
) -> tuple[list[Field], int]:
    """A Parquet file's footer (FileMetaData fields) and where it starts (the column chunks end there).
    ``row_group`` (decoded) or ``raw_row_group`` (the footer's bytes and where the row group starts; returns
    where it ends): called with each row group as it is read, which the footer's list then leaves out."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size < 12:
            raise ValueError(f"{path} is too short to be a Parquet file")
        f.seek(size - 8)
        tail = f.read(8)
        if tail[4:] != MAGIC:
            raise ValueError(f"{path} has no Parquet footer")
        length = struct.unpack("<I", tail[:4])[0]
        start = size - 8 - length
        f.seek(start)
        buf = f.read(length)
    return _struct(buf, 0, row_group, raw_row_group)[0], start


_O_BINARY = getattr(os, "O_BINARY", 0)  # (Windows: no newline translation)


def _copy(src: int, dst: int, offset: int, count: int) -> None:
    """Copy ``count`` bytes at ``offset`` of ``src`` to the current position of ``dst`` (file descriptors):
    in the kernel where it can (``os.copy_file_range``, Linux), else through a buffer."""
    copy = getattr(os, "copy_file_range", None)
    while count > 0:
        done = 0
        if copy is not None:
            try:
                done = copy(src, dst, count, offset)
            except OSError:  # another file system, an old kernel: copy through user space
                copy = None
        if not done:
            os.lseek(src, offset, os.SEEK_SET)
            chunk = os.read(src, min(count, 8 << 20))
            if not chunk:
                raise OSError(f"a part ended {count} bytes early while it was copied into the log")
            view = memoryview(chunk)
            while view:  # os.write may write less than it was given
                view = view[os.write(dst, view) :]
            done = len(chunk)
        offset += done
        count -= done


class Assembly:
    """The single-file log ``path``, assembled part by part (see the module's docstring). Written to
    ``.NAME.tmp`` beside it until :meth:`finish` renames it into place."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp")
        self.fd: int | None = None
        self.size = 0  # bytes written so far
        self.rows = 0
        self.row_groups: list[Encoded] = []  # every row group's moved metadata, in order
        self.template: list[Field] | None = None  # the last part's footer: schema and key-value metadata

    def append(self, part: Path) -> int:
        """Copy a published part's row groups to the end of the log; the rows it held."""
        if self.fd is None:
            self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_BINARY, 0o644)
            os.write(self.fd, MAGIC)  # (4 bytes: written whole)
            self.size = len(MAGIC)
        shift = self.size - len(MAGIC)  # where the part's bytes land, less where they were
        first = len(self.row_groups)
        moved: list[Encoded] = []

        def row_group(buf: bytes, pos: int) -> int:  # each row group moved, byte for byte, as the footer is read
            metadata, end = moved_row_group(buf, pos, shift, first + len(moved))
            moved.append(metadata)
            return end

        footer, end = read_footer(part, raw_row_group=row_group)
        src = os.open(part, os.O_RDONLY | _O_BINARY)
        try:
            _copy(src, self.fd, len(MAGIC), end - len(MAGIC))
        finally:
            os.close(src)
        rows = next((v for fid, _, v in footer if fid == _NUM_ROWS), 0)
        self.row_groups += moved
        self.size += end - len(MAGIC)
        self.rows += rows
        self.template = footer
        return rows

    def footer(self) -> bytes:
        """The log's footer: the last part's fields (its schema, its key-value metadata: the outcome when it
        is the closing part), with every row group and the total row count."""
        assert self.template is not None, "no part appended"
        fields: list[Field] = []
        for fid, typ, v in self.template:
            if fid == _NUM_ROWS:
                v = self.rows
            elif fid == _ROW_GROUPS:
                v = (v[0], self.row_groups)
            fields.append((fid, typ, v))
        return encode(fields)

    def finish(self) -> None:
        """Write the footer and move the log into place."""
        assert self.fd is not None
        footer = self.footer()
        tail = memoryview(footer + struct.pack("<I", len(footer)) + MAGIC)
        while tail:
            tail = tail[os.write(self.fd, tail) :]
        os.close(self.fd)
        self.fd = None
        os.replace(self.tmp, self.path)

    def drop(self) -> None:
        """Give up the log (the journal keeps every row): close and remove the temp file."""
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
        try:
            self.tmp.unlink()
        except OSError:
            pass


__all__ = ["Assembly", "decode", "encode", "read_footer"]
