"""The report's streaming reads: filtered reads skip row groups by their string columns' statistics too
(``budget.prune``), rows are selected in numpy as Arrow's filter selects them (``rows.select_rows``), and the
runs of iterations shrink to fit a small memory budget instead of the read being refused (``scan.fit``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from lstm_probe.log import budget
from lstm_probe.log.reader import dataset
from lstm_probe.report.rows import rows_expr, select_rows
from lstm_probe.report.scan import REPORT_CHUNK_ROWS, fit

SAMPLE = Path(__file__).resolve().parents[1] / "sample_runs" / "pendulum-1env.parquet"


@pytest.fixture(scope="module")
def phase_pure(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample log rewritten as the writer lays out a long run: train rows and the other rows in row groups
    of their own, several of each."""
    table = pq.read_table(SAMPLE)
    out = tmp_path_factory.mktemp("stream") / "log.parquet"
    train = pc.equal(table["phase"], "train").fill_null(False)
    with pq.ParquetWriter(out, table.schema) as w:
        w.write_table(table.filter(pc.invert(train)), row_group_size=100)
        w.write_table(table.filter(train), row_group_size=500)
    w_meta = pq.ParquetFile(out).metadata
    assert w_meta.num_row_groups > 4
    return out


def _groups(data: ds.Dataset) -> int:
    return sum(len(f.row_groups) for f in data.get_fragments())


def test_prune_keeps_the_row_groups_a_string_filter_may_select_and_the_same_rows(phase_pure: Path) -> None:
    data, _ = dataset(phase_pure)
    for filt in (
        ds.field("phase") == "rollout",
        ds.field("phase").isin(["train", "value"]) & (ds.field("t") > 0),
        (ds.field("phase") == "train") | (ds.field("path") == "step"),
    ):
        kept = budget.prune(data, filt)
        assert 0 < _groups(kept) <= _groups(data)
        assert kept.to_table(filter=filt).equals(data.to_table(filter=filt))
    assert _groups(budget.prune(data, ds.field("phase") == "rollout")) < _groups(data)
    assert budget.prune(data, ds.field("layer") == 0) is data  # no string column: Arrow prunes it itself
    assert budget.prune(data, None) is data


def test_select_rows_selects_what_arrows_filter_selects(phase_pure: Path) -> None:
    data, _ = dataset(phase_pure)
    cases = [
        ((("episode_start", "equal", True), ("t", "greater", 0), ("padding", "equal", False)), {"phase": ("train",)}),
        ((("epoch", "equal", 0), ("minibatch", "equal", 0)), {"phase": ("train",), "path": ("stepwise", "sequence")}),
        ((("layer", "equal", 0),), {"phase": ("rollout", "bootstrap")}),
        ((("t", "greater", 10**6),), {"phase": ("train",)}),  # nothing
    ]
    for tests, words in cases:
        want = data.to_table(filter=rows_expr(tests, words))
        got = [select_rows(b, tests, words) for b in data.to_batches()]
        assert sum(b.num_rows for b in got) == want.num_rows
        for name in ("call", "t", "env"):
            values = np.concatenate([b.column(name).to_numpy(zero_copy_only=False) for b in got] or [np.zeros(0)])
            np.testing.assert_array_equal(values, want.column(name).to_numpy(zero_copy_only=False))


def test_runs_shrink_to_fit_a_small_memory_budget() -> None:
    assert fit(REPORT_CHUNK_ROWS, 20) == REPORT_CHUNK_ROWS  # the default budget: the default runs
    budget.set_limit("64M")
    try:
        assert fit(REPORT_CHUNK_ROWS, 20) == (64 << 20) // (2 * 8 * 20)
        assert fit(10, 20) == 10
    finally:
        budget.set_limit(None)


def test_read_scalars_copies_runs_of_one_phase_as_slices_in_log_order(
    phase_pure: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch spans row groups (several runs of train and other rows): the runs go where masks would put them."""
    from lstm_probe.report import scan

    data, _ = dataset(phase_pure)
    strings = scan.with_dictionaries(data, scan.COLUMNS)
    runs, front = scan.read_scalars(strings, scan.COLUMNS, scan.FIRST_LAYER)
    monkeypatch.setattr(scan, "RUNS", 1)  # every mixed batch by masks
    masks, front2 = scan.read_scalars(strings, scan.COLUMNS, scan.FIRST_LAYER)
    assert front == front2 and 0 < front < len(runs)
    for name in scan.COLUMNS:
        np.testing.assert_array_equal(runs[name], masks[name])
    table = data.to_table(filter=scan.FIRST_LAYER)
    train = pc.equal(table["phase"], "train").fill_null(False).to_numpy(zero_copy_only=False)
    call = table["call"].to_numpy(zero_copy_only=False)
    # the other rows in log order, the train rows after them (packed from the end, batch by batch)
    np.testing.assert_array_equal(runs["call"][:front], call[~train])
    np.testing.assert_array_equal(np.sort(runs["call"][front:]), np.sort(call[train]))


def test_select_rows_on_sliced_batches(phase_pure: Path) -> None:
    """Tests read off the columns' buffers (booleans as bits) hold at any offset, with nulls."""
    data, _ = dataset(phase_pure)
    tests = (("episode_start", "equal", True), ("t", "greater", 0), ("padding", "equal", False))
    words = {"phase": ("train",)}
    for batch in data.to_batches():
        for part in (batch.slice(3, 301), batch.slice(13)):
            want = pa.Table.from_batches([part]).filter(rows_expr(tests, words))
            got = select_rows(part, tests, words)
            assert got.num_rows == want.num_rows
            assert got.column("call").to_pylist() == want.column("call").to_pylist()


def test_every_group_says_when_pruning_by_input_states_would_keep_them_all(phase_pure: Path, tmp_path: Path) -> None:
    from lstm_probe.report.reading import every_group, row_groups

    table = pq.read_table(phase_pure)  # an input state at each call's first step (t = 0), as the tracer writes
    first = pc.equal(table["t"], 0).to_numpy(zero_copy_only=False)
    table = table.append_column("init", pa.array(np.where(first, "zero", None), pa.string()))
    filt = (ds.field("layer") == 0) & ds.field("init").is_valid()
    every, other = tmp_path / "every.parquet", tmp_path / "other.parquet"
    pq.write_table(table, every, row_group_size=500)
    with pq.ParquetWriter(other, table.schema) as w:
        w.write_table(table, row_group_size=500)
        w.write_table(table.filter(pc.invert(pc.equal(table["t"], 0))).slice(0, 100))  # no input-state row
    for path, expected in ((every, True), (other, False)):
        data = dataset(path)[0]
        assert every_group(data, "init") is expected
        assert (_groups(row_groups(data, filt)) == _groups(data)) is expected  # what Arrow's pruning keeps
    assert not every_group(dataset(phase_pure)[0], "init")  # a log without the column


def test_sections_computed_alongside_the_scan_give_the_same_report(monkeypatch: pytest.MonkeyPatch) -> None:
    from lstm_probe import summarize
    from lstm_probe.report.sections.doctor import Doctor
    from lstm_probe.report.sections.health import Health

    alongside = summarize(SAMPLE).to_dict()
    for section in (Doctor, Health):
        monkeypatch.setattr(section, "alongside", False)
    assert summarize(SAMPLE).to_dict() == alongside
    monkeypatch.setattr(Doctor, "alongside", True)

    def broken(self: Doctor, log: object, acc: object) -> None:
        raise RuntimeError("doctor failed")

    monkeypatch.setattr(Doctor, "compute", broken)
    with pytest.raises(RuntimeError, match="doctor failed"):
        summarize(SAMPLE)


def test_the_modules_sequences_are_counted_on_do_not_depend_on_the_row_groups(tmp_path: Path) -> None:
    """The sections count minibatches and sequences on the first module to train, episodes on the first in the
    rollout: the modules of the first calls, whatever row of a run the scan happens to hold first (it packs a
    run's train rows from the back, batch by batch). The sample log cut into row groups of 50 rows, so that
    the last train row group starts with the other module's rows, gives the sample log's report."""
    import lstm_probe

    table = pq.read_table(SAMPLE)
    train = np.flatnonzero(pc.equal(table["phase"], "train").fill_null(False).to_numpy(zero_copy_only=False))
    first = table.slice(int(train[0]), 1).column("module")[0].as_py()
    others = [int(i) for i in train if table["module"][int(i)].as_py() != first]
    cut = others[-1]  # the last train row group starts with a row of the other module
    while cut > 0 and table["module"][cut - 1].as_py() != first:
        cut -= 1
    out = tmp_path / "cut.parquet"
    final = pq.ParquetFile(SAMPLE).metadata.metadata[b"lstm_probe.final"]
    with pq.ParquetWriter(out, table.schema) as w:
        w.write_table(table.slice(0, cut), row_group_size=50)
        w.write_table(table.slice(cut))
        w.add_key_value_metadata({b"lstm_probe.final": final})
    a, b = lstm_probe.summarize(SAMPLE), lstm_probe.summarize(out)
    assert a.sequences.module == b.sequences.module == first
    x, y = a.to_dict(), b.to_dict()
    for doc in (x, y):
        del doc["path"], doc["run"]["file_bytes"]
    assert x == y
