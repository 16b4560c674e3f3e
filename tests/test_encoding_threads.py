"""Issue #50: the writer process encodes row groups on threads of its own (``log/parts.py``), each into a part
file of its own, published in order. Real runs, real files: the log holds the same row groups, row for row,
as with one thread; a part that fails takes the ones after it, never one before it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lstm_probe
from lstm_probe.errors import BadInput
from lstm_probe.log.parts import META_FINAL_KEY, PartWriter
from lstm_probe.options import CaptureOptions, encode_threads

RUN = dict(n_envs=4, steps=2048, n_steps=64, batch_size=64, n_epochs=4, hidden_size=256, seed=0, torch_threads=1)


def _row_groups(path: Path) -> list[int]:
    files = sorted(path.glob("part-*.parquet")) if path.is_dir() else [path]
    return [
        m.row_group(i).num_rows for m in (pq.ParquetFile(f).metadata for f in files) for i in range(m.num_row_groups)
    ]


@pytest.mark.parametrize("out", ["run.parquet", "runs/", "spans/"])
def test_encoding_threads_write_the_log_one_thread_writes(tmp_path: Path, out: str) -> None:
    """Three encoding threads (in the writer process) and one write the same row groups, the same rows in
    the same order; a directory log then has a part per row group, in order, each published whole."""
    spans = {"part_iterations": 2} if out == "spans/" else {}
    one = lstm_probe.run("Pendulum-v1", f"{tmp_path}/one/{out}", writer_threads=1, **spans, **RUN)
    three = lstm_probe.run("Pendulum-v1", f"{tmp_path}/three/{out}", writer_threads=3, **spans, **RUN)
    a, b = tmp_path / "one" / out, tmp_path / "three" / out
    assert one.completed and three.completed and one.rows == three.rows
    groups = _row_groups(a)
    assert len(groups) > 3 and _row_groups(b) == groups
    cost_one, cost_three = (lstm_probe.read_info(x).metadata["probe_cost"] for x in (a, b))
    assert "writer_encode_threads" not in cost_one  # one thread: the log says nothing of threads
    assert cost_three["writer_encode_threads"] == 3 and cost_three["writer_threaded_row_groups"] == len(groups)
    assert pq.read_table(a).equals(pq.read_table(b))
    if out.endswith("/"):
        parts = sorted(b.glob("part-*.parquet"))
        assert [p.name for p in parts] == [f"part-{i:05d}.parquet" for i in range(len(parts))]
        assert len(parts) == len(groups) + 1  # a row group each, and the last part: the outcome, no rows
        assert not list(b.glob(".*.tmp"))
        last = json.loads(pq.ParquetFile(parts[-1]).metadata.metadata[META_FINAL_KEY])
        assert last["final"] and last["completed"] and last["progress"]["rows"] == three.rows
    else:
        assert not (b.parent / "run.parquet.partial").exists()
    report = lstm_probe.summarize(b)
    assert report.staleness.provenance_ok is True


def test_the_writer_process_hands_its_threads_the_row_groups_it_writes_while_behind(tmp_path, monkeypatch) -> None:
    """As a machine with cores to spare runs it by default (two threads, for the row groups written while more
    input waits in the pipe; here however the run's timing falls): the log the one thread writes."""
    import lstm_probe.options as options

    monkeypatch.setattr(options, "encode_threads", lambda given, *a, **k: given or 2)
    one = lstm_probe.run("Pendulum-v1", f"{tmp_path}/one.parquet", writer_threads=1, **RUN)
    auto = lstm_probe.run("Pendulum-v1", f"{tmp_path}/auto.parquet", **RUN)
    assert auto.completed and auto.rows == one.rows
    assert _row_groups(one.path) == _row_groups(auto.path)
    cost = lstm_probe.read_info(auto.path).metadata["probe_cost"]
    assert cost["writer_encode_threads"] == 2 and 0 <= cost["writer_threaded_row_groups"] <= len(_row_groups(one.path))
    assert pq.read_table(one.path).equals(pq.read_table(auto.path))


def test_a_part_that_fails_takes_the_ones_after_it_and_the_journal_stays_a_prefix(tmp_path: Path) -> None:
    """A row group whose write fails on its thread (here: a batch the part's schema refuses) raises at the
    next publish; the parts before it are published, in order, it and those after it are removed, and the
    writer counts only the rows it published."""
    schema = pa.schema([("call", pa.int64())])
    parts = PartWriter(tmp_path, schema, part_rows=10**6, threads=3, always=True)
    good = pa.RecordBatch.from_pydict({"call": pa.array(range(5), pa.int64())})
    bad = pa.RecordBatch.from_pydict({"call": pa.array(["x"])})
    for _ in range(3):
        parts.write(good, {"progress": {}})
    parts.publish()
    assert [p.name for p in parts.parts] == [f"part-{i:05d}.parquet" for i in range(3)]
    parts.write(bad, {"progress": {}})
    parts.write(good, {"progress": {}})
    with pytest.raises(ValueError, match=r"(?i)schema"):
        parts.publish()
    assert [p.name for p in sorted(tmp_path.glob("part-*"))] == [f"part-{i:05d}.parquet" for i in range(3)]
    assert not list(tmp_path.glob(".*.tmp")) and parts.rows == 15
    parts.abort()


@pytest.mark.parametrize("single", [False, True])
def test_row_groups_encoded_on_threads_and_in_the_open_part_keep_their_order(tmp_path: Path, single: bool) -> None:
    """The threads take the row groups written while the writer is behind, the open part the others: however
    they alternate, the parts (and the single file made of them) hold the rows in the order they were written."""
    schema = pa.schema([("call", pa.int64())])
    out = tmp_path / "log.parquet"
    journal = tmp_path / "journal"
    journal.mkdir()
    parts = PartWriter(journal, schema, 10**6, single=out if single else None, threads=2)
    behind = [True, True, False, False, True, False, True, True, True, False]
    for i, b in enumerate(behind):
        parts.behind = b
        parts.write(pa.RecordBatch.from_pydict({"call": pa.array(range(10 * i, 10 * i + 7), pa.int64())}), {})
    if parts.writer is None:  # as FileLog.close: the last part carries the outcome
        parts._open()
    parts.close_part({"final": True})
    parts.abort_encoding()
    names = sorted(p.name for p in journal.glob("part-*"))
    assert names == [f"part-{i:05d}.parquet" for i in range(len(names))] and not list(journal.glob(".*.tmp"))
    want = [10 * i + k for i in range(len(behind)) for k in range(7)]
    assert pq.read_table(journal).column("call").to_pylist() == want and parts.rows == len(want)
    if single:
        parts.finish_single()
        assert pq.read_table(out).column("call").to_pylist() == want


def test_disk_full_on_an_encoding_thread_publishes_the_finished_rows_with_the_cause(tmp_path: Path) -> None:
    """A file size limit on a run whose writer encodes on three threads: the log says why it ended, and every
    row it says it holds is read back."""
    script = (
        "import resource, signal, sys, lstm_probe\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))\n"
        "try:\n"
        "    lstm_probe.run('Pendulum-v1', 'run.parquet', steps=2048, hidden_size=64, writer_threads=3,\n"
        "                   part_seconds=0.2, seed=0, torch_threads=1)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        "    sys.exit(1)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "File too large" in proc.stdout, proc.stdout + proc.stderr
    info = lstm_probe.read_info(tmp_path / "run.parquet")
    assert not info.completed and "File too large" in info.metadata["stop_reason"]
    assert info.rows == info.metadata["progress"]["rows"] > 0
    assert len(lstm_probe.load(tmp_path / "run.parquet", vectors=False)) == info.rows


def test_how_many_threads_encode() -> None:
    """A quarter of the CPUs, at most 4, in a writer process of a one-process single-file log; one elsewhere;
    as given."""
    assert encode_threads(3, "thread", None) == 3
    assert encode_threads(0, "thread", None) == 1 and encode_threads(0, "process", "learner0") == 1
    assert encode_threads(0, "process", None, directory=True) == 1 and encode_threads(2, "process", None, True) == 2
    assert 1 <= encode_threads(0, "process", None) <= 4
    with pytest.raises(BadInput, match=r"--writer.threads must be >= 0"):
        CaptureOptions(writer_threads=-1)


def test_the_parts_finished_before_a_failed_one_reach_the_single_file(tmp_path: Path) -> None:
    """A part that fails on its thread, behind one that finished: the finished one is published into the
    single-file log too (not only renamed in the journal), so a failed run still ends as one file holding
    every row the writer counts."""
    schema = pa.schema([("call", pa.int64())])
    journal = tmp_path / "journal"
    journal.mkdir()
    out = tmp_path / "run.parquet"
    parts = PartWriter(journal, schema, 10**7, single=out, threads=2, always=True)
    big = pa.RecordBatch.from_pydict({"call": pa.array(range(2_000_000), pa.int64())})  # still encoding below
    parts.write(big, {"progress": {}})
    parts.write(pa.RecordBatch.from_pydict({"call": pa.array(["x"])}), {"progress": {}})
    with pytest.raises(ValueError, match=r"(?i)schema"):
        parts.publish()
    assert [p.name for p in parts.parts] == ["part-00000.parquet"] and parts.rows == big.num_rows
    parts._open()
    parts.close_part({"final": True})
    parts.abort_encoding()
    assert parts.single_complete()
    parts.finish_single()
    assert pq.read_table(out).column("call").to_pylist() == list(range(2_000_000))


@pytest.mark.parametrize("out", ["run.parquet", "runs/"])
def test_a_part_failing_while_the_writer_fails_still_leaves_the_outcome(tmp_path: Path, out: str) -> None:
    """The writer fails, and the row group its fail() writes fails on its thread too (a directory where the
    part's temp file would go): the log still ends with a part that says how the run ended, counting only
    the rows it holds."""
    from lstm_probe.log.schema import CODES, COLUMNS
    from lstm_probe.log.writer import FileLog

    log = FileLog(str(tmp_path / out), 8, ["actor"], {}, CODES, threads=2, always=True)
    rows, i = log.reserve(50)
    for col in COLUMNS:  # every column null (or zero): the rows' values do not matter here
        buf = rows.buffers[col.name]
        buf[i : i + 50] = -1 if col.kind in ("code", "int", "tribool") and col.nullable else 0
    for flag in rows.buffers:
        if flag not in {c.name for c in COLUMNS}:
            rows.buffers[flag][i : i + 50] = False
    log.commit(50)
    (log.parts_dir / ".part-00000.parquet.tmp").mkdir()  # the part fail() writes cannot be opened
    log.fail({"stop_reason": "the writer failed"})
    info = lstm_probe.read_info(tmp_path / out)
    assert not info.completed and info.metadata["stop_reason"] == "the writer failed"
    assert info.rows == info.metadata["progress"]["rows"] == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("lstm-probe-parquet")]  # none left running
