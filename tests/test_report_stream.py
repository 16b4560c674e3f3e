"""The report's streaming reads: filtered reads skip row groups by their string columns' statistics too
(``budget.prune``), rows are selected in numpy as Arrow's filter selects them (``scan.select_rows``), and the
runs of iterations shrink to fit a small memory budget instead of the read being refused (``scan.fit``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from lstm_probe.log import budget
from lstm_probe.log.reader import dataset
from lstm_probe.report.scan import REPORT_CHUNK_ROWS, fit, rows_expr, select_rows

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
