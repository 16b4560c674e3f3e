"""A single-file log assembled from its journal's parts (assemble.py): real Parquet files, real runs."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from conftest import TINY

import lstm_probe
from lstm_probe.log.assemble import Assembly, decode, encode, read_footer
from lstm_probe.log.schema import CODES, COLUMNS
from lstm_probe.log.writer import META_FINAL_KEY, FileLog

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ["sample_runs/pendulum-1env.parquet", "sample_runs/cartpole-4env.parquet"]


def _raw_footer(path):
    raw = path.read_bytes()
    n = int.from_bytes(raw[-8:-4], "little")
    return raw[-8 - n : -8]


@pytest.mark.parametrize("sample", SAMPLES)
def test_footer_round_trip_is_byte_exact(sample):
    """Every field of a real log's footer survives decode and encode: the same bytes come back."""
    path = ROOT / sample
    fields, start = read_footer(path)
    assert encode(fields) == _raw_footer(path)
    assert start == path.stat().st_size - 8 - len(_raw_footer(path))
    assert encode(decode(_raw_footer(path))) == _raw_footer(path)
    # read one row group at a time (Assembly.append): the same row groups, in order, and the same other fields
    seen = []
    streamed, at = read_footer(path, seen.append)
    whole = dict((fid, v) for fid, _, v in fields)
    assert at == start and len(seen) == len(whole[4][1]) > 0 and seen == whole[4][1]
    assert [(f, t, v if f != 4 else (v[0], seen)) for f, t, v in streamed] == fields


@pytest.mark.parametrize("sample", SAMPLES)
def test_moving_a_row_group_byte_for_byte_equals_decoding_moving_and_encoding_it(sample):
    """moved_row_group (Assembly.append's: nothing decoded but the path to the offsets) gives the bytes of
    the decoded route, ``encode(_row_group(...))``, for every row group of a real log and any shift."""
    from lstm_probe.log.assemble import _row_group, moved_row_group

    path = ROOT / sample
    decoded = []
    read_footer(path, decoded.append)
    for shift, first in ((0, 0), (4, 7), (123_456_789, 1), (1 << 40, 30_000)):
        raw = []

        def row_group(buf, pos, shift=shift, first=first, raw=raw):
            metadata, end = moved_row_group(buf, pos, shift, first + len(raw))
            raw.append(metadata)
            return end

        read_footer(path, raw_row_group=row_group)
        assert len(raw) == len(decoded) > 0
        for i, (rg, metadata) in enumerate(zip(decoded, raw, strict=True)):
            assert bytes(metadata) == encode(_row_group(rg, shift, first + i)), (shift, i)
    # what the decoded route refuses, this one refuses too: a page index's offsets cannot be moved
    rg = decoded[0]
    columns = dict((f, v) for f, _, v in rg)[1]
    chunk = columns[1][0] + [(4, 6, 10)]  # ColumnChunk.offset_index_offset (i64)
    bad = encode([(f, t, (v[0], [chunk]) if f == 1 else v) for f, t, v in rg])
    with pytest.raises(ValueError, match="page index"):
        moved_row_group(bad, 0, 5, 0)


def _fill(log, rng, n, train):
    """``n`` rows of one call in ``log``'s lane, with random values in every column (nulls where the
    column's null convention says: negative codes, NaN)."""
    rows, i = log.reserve(n, train=train)
    for col in COLUMNS:
        buf = rows.buffers[col.name]
        low = -1 if col.nullable else 0
        if buf.ndim == 2:
            buf[i : i + n] = rng.standard_normal((n, buf.shape[1])).astype(buf.dtype)
        elif col.kind == "code":
            buf[i : i + n] = rng.integers(low, len(CODES.get(col.name, ("actor",))), n)
        elif np.issubdtype(buf.dtype, np.floating):
            buf[i : i + n] = rng.standard_normal(n)
            buf[i : i + n][(rng.random(n) < 0.1) & col.nullable] = np.nan
        else:
            buf[i : i + n] = rng.integers(low, 1000, n).astype(buf.dtype)
    for flag in rows.buffers:
        if flag not in {c.name for c in COLUMNS}:
            rows.buffers[flag][i : i + n] = rng.random(n) < 0.9
    log.commit(n)


def test_single_file_log_is_its_parts_byte_for_byte(tmp_path):
    """Each published part's column chunks are copied, not encoded again: the log's row groups are the
    parts' row groups in order, with the same compressed sizes and statistics, the same values, and the
    outcome of the closing part in the footer."""
    rng = np.random.default_rng(0)
    out = tmp_path / "run.parquet"
    log = FileLog(str(out), 8, ["actor", "critic"], {"note": "x"}, CODES, part_rows=600)
    journal = tmp_path / "run.parquet.partial"
    seen: dict[str, pa.Table] = {}
    metas = {}
    for k in range(13):
        if k < 12:
            _fill(log, rng, int(rng.integers(50, 400)), train=k % 3 != 0)
            log.flush()
        else:  # publish the open part too, to read it here (the closing part then holds no rows)
            log.parts.close_part({"progress": {}})
        for part in journal.glob("part-*.parquet"):  # read each part as it is published
            if part.name not in seen:
                seen[part.name] = pq.read_table(part)
                metas[part.name] = pq.ParquetFile(part).metadata
    log.progress = {"iteration": 3}
    log.close({"completed": True, "stop_reason": "done"})
    assert not journal.exists() and len(seen) >= 3
    parts = [seen[n] for n in sorted(seen)]
    got, want_rows = pq.read_table(out), pa.concat_tables(parts)
    assert got.schema.equals(want_rows.schema, check_metadata=True) and got.num_rows == log.rows_written
    for name in got.column_names:  # (floats compared by numpy: NaN equals NaN)
        a, b = got.column(name), want_rows.column(name)
        if pa.types.is_floating(a.type):
            np.testing.assert_array_equal(a.to_numpy(), b.to_numpy(), err_msg=name)
        else:
            assert a.equals(b), name
    md = pq.ParquetFile(out).metadata
    groups = [m.row_group(i) for n in sorted(metas) for m in [metas[n]] for i in range(m.num_row_groups)]
    assert md.num_row_groups == len(groups) >= 4
    for i, want in enumerate(groups):
        have = md.row_group(i)
        assert have.num_rows == want.num_rows and have.total_byte_size == want.total_byte_size
        for j in range(have.num_columns):
            a, b = have.column(j), want.column(j)
            assert a.total_compressed_size == b.total_compressed_size and a.statistics == b.statistics
    # nothing but the magic, the parts' column chunks and one footer: no row is stored twice
    chunks = sum(m.row_group(i).column(j).total_compressed_size for m in metas.values()
                 for i in range(m.num_row_groups) for j in range(m.num_columns))  # fmt: skip
    assert out.stat().st_size == 4 + chunks + len(_raw_footer(out)) + 8
    final = json.loads(md.metadata[META_FINAL_KEY])
    assert final["completed"] and final["final"] and final["progress"] == {"iteration": 3, "rows": log.rows_written}
    # the statistics still prune: a phase filter reads only the row groups that can hold it
    codes = pq.read_table(out, columns=["phase"]).column("phase")
    want = codes.to_pylist().count("rollout")
    assert ds.dataset(out).to_table(filter=ds.field("phase") == "rollout").num_rows == want
    assert lstm_probe.read_info(out).rows == got.num_rows


def test_an_empty_log_is_a_footer_alone(tmp_path):
    out = tmp_path / "run.parquet"
    log = FileLog(str(out), 8, ["actor"], {}, CODES)
    log.close({"completed": True})
    pf = pq.ParquetFile(out)
    assert pf.metadata.num_rows == 0 and pf.metadata.num_row_groups == 0
    assert json.loads(pf.metadata.metadata[META_FINAL_KEY])["completed"]
    assert pq.read_table(out).schema.equals(pf.schema_arrow)


def test_parts_with_page_indexes_are_refused(tmp_path):
    """A page index holds offsets of its own, which a move would leave wrong: such a part is refused
    rather than copied into a log that reads wrong."""
    table = pq.read_table(ROOT / SAMPLES[0]).slice(0, 100)
    part = tmp_path / "part.parquet"
    pq.write_table(table, part, write_page_index=True)
    asm = Assembly(tmp_path / "run.parquet")
    with pytest.raises(ValueError, match="page index"):
        asm.append(part)
    asm.drop()
    assert not asm.tmp.exists()


def test_a_failed_part_write_still_finishes_the_file_with_the_published_rows(tmp_path):
    """A part that cannot be written (here: its directory vanished) loses its rows alone: the single file
    holds every published row and says the run did not complete."""
    rng = np.random.default_rng(1)
    out = tmp_path / "run.parquet"
    log = FileLog(str(out), 8, ["actor"], {}, CODES, part_rows=100)
    _fill(log, rng, 150, train=True)
    log.flush()  # one part published and copied
    journal = tmp_path / "run.parquet.partial"
    assert len(list(journal.glob("part-*.parquet"))) == 1
    _fill(log, rng, 70, train=True)
    shutil.rmtree(journal)
    with pytest.raises(OSError):
        log.flush()
    journal.mkdir()
    log.fail({"stop_reason": "cannot write the log"})
    info = lstm_probe.read_info(out)
    assert info.files == [out] and not info.completed and info.rows == 150
    assert info.metadata["stop_reason"] == "cannot write the log" and not journal.exists()


def test_a_failed_copy_leaves_the_journal_as_the_log(tmp_path):
    """When a published part cannot be copied into the single file (here: the file's descriptor is gone;
    a full disk fails the same way), the single file is given up and the journal holds every row."""
    rng = np.random.default_rng(2)
    out = tmp_path / "run.parquet"
    log = FileLog(str(out), 8, ["actor"], {}, CODES, part_rows=100)
    _fill(log, rng, 150, train=True)
    log.flush()
    assert log.parts.assembly is not None and log.parts.assembly.rows == 150
    os.close(log.parts.assembly.fd)
    _fill(log, rng, 120, train=False)
    with pytest.raises(OSError):
        log.flush()
    assert log.parts.assembly is None and not (tmp_path / ".run.parquet.tmp").exists()
    log.fail({"stop_reason": "cannot write the log"})
    assert not out.exists()
    info = lstm_probe.read_info(out)  # the journal, with a warning
    assert info.files[0].parent.name == "run.parquet.partial" and info.rows == 270 and not info.completed
    assert any("never finished" in w for w in info.warnings)


def test_a_real_run_single_file_equals_its_directory_log(tmp_path):
    """The same RecurrentPPO run written as one file (assembled from parts published every few
    milliseconds) and as a dataset directory: the same rows and values, vectors included."""
    from lstm_probe import run

    a = run("Pendulum-v1", str(tmp_path / "a.parquet"), seed=0, part_seconds=0.05, **TINY)
    b = run("Pendulum-v1", f"{tmp_path}/d/", seed=0, part_seconds=0.05, **TINY)
    assert a.completed and b.completed
    assert pq.ParquetFile(tmp_path / "a.parquet").metadata.num_row_groups > 1
    x, y = (
        lstm_probe.load(p).sort_values("call", kind="stable").reset_index(drop=True)
        for p in (tmp_path / "a.parquet", tmp_path / "d")
    )
    assert len(x) == len(y) > 0
    for col in x.columns:
        if col in ("h", "c"):
            assert np.array_equal(lstm_probe.states(x, col), lstm_probe.states(y, col), equal_nan=True), col
        else:
            assert x[col].equals(y[col]), col


def test_copy_through_user_space_and_a_short_part(tmp_path):
    """Where the kernel cannot copy file to file (here the target is a pipe), bytes go through a buffer; a part
    shorter than its footer says is an error, never a silently short log."""
    from lstm_probe.log.assemble import _copy

    data = bytes(range(256)) * 64
    src = tmp_path / "src"
    src.write_bytes(data)
    r, w = os.pipe()
    fd = os.open(src, os.O_RDONLY)
    try:
        _copy(fd, w, 100, 5000)
        assert os.read(r, 10000) == data[100:5100]
        with pytest.raises(OSError, match="ended 100 bytes early"):
            _copy(fd, w, len(data) - 50, 150)
    finally:
        for f in (fd, r, w):
            os.close(f)
