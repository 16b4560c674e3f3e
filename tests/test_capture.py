"""Capture levels: summary (no vectors), every K-th iteration, float16; the report says what each lacks."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import probed_run

import lstm_probe


@pytest.fixture(scope="module")
def full(runs_dir):
    return probed_run(runs_dir, "Pendulum-v1", n_envs=2)


def test_summary_keeps_norms_and_drift(runs_dir, full):
    s = probed_run(runs_dir, "Pendulum-v1", n_envs=2, capture="summary")
    a = lstm_probe.load(full.path)
    b = lstm_probe.load(s.path)
    assert len(a) == len(b) and b.h.isna().all() and b.c.isna().all()
    cols = ["call", "module", "phase", "env", "env_step", "h_norm", "c_norm", "drift_h", "drift_c"]
    assert a[cols].equals(b[cols])  # same norms and in-probe drift as a full capture
    assert s.bytes < full.bytes / 3  # hidden 16 here; at sb3's default 256 the vectors are ~99% of a row
    rep = lstm_probe.summarize(s.path)
    assert rep.staleness.provenance_ok is True  # the provenance check needs no vectors
    assert rep.unavailable and "summary" in rep.unavailable[0]
    assert all("dead_units" not in layer for layer in rep.health.layers)


def test_every_k_iterations(runs_dir):
    r = probed_run(runs_dir, "Pendulum-v1", n_envs=2, every=2)
    df = lstm_probe.load(r.path)
    has = df.groupby("iteration").h.apply(lambda s: s.notna().all())
    none = df.groupby("iteration").h.apply(lambda s: s.isna().all())
    assert list(has[has].index) == [0, 2] and list(none[none].index) == [1]


def test_float16(runs_dir, full):
    r = probed_run(runs_dir, "Pendulum-v1", n_envs=2, float16=True)
    assert pq.read_schema(r.path).field("h").type.value_type == pa.float16()
    a, b = lstm_probe.load(full.path), lstm_probe.load(r.path)
    ha, hb = lstm_probe.states(a, "h"), lstm_probe.states(b, "h")
    assert np.abs(ha - hb).max() < 1e-3 and np.array_equal(a.h_norm, b.h_norm)  # norms from full precision
    rep = lstm_probe.summarize(r.path)
    assert rep.run.capture["dtype"] == "float16"


def test_the_log_says_what_recording_cost(runs_dir, full):
    """Every log records the probe's own cost; the report prints it."""
    info = lstm_probe.read_info(full.path)
    cost = info.metadata["probe_cost"]
    df = lstm_probe.load(full.path, columns=["call"])
    assert cost["calls"] == df.call.nunique()  # one hook call per LSTM call, each in the log
    assert 0 < cost["hook_seconds"] < cost["seconds"] and 0 < cost["integration_seconds"] < cost["seconds"]
    assert cost["writer_cpu_seconds"] > 0 and cost["wait_seconds"] >= 0
    rep = lstm_probe.summarize(full.path)
    assert rep.run.probe_cost == cost


def test_summary_logs_write_fewer_larger_row_groups(tmp_path):
    """A summary log's row buffer holds no vectors: the same calls make one row group where a full capture
    at hidden 256 needs two, and the norms are the same."""
    from lstm_probe.log.layout import row_capacity

    torch = pytest.importorskip("torch")
    lstm = torch.nn.LSTM(3, 256)
    torch.manual_seed(0)
    xs = [torch.randn(50, 5, 3) for _ in range(40)]  # 10,000 rows
    assert row_capacity(256) < 10_000 <= row_capacity(256, vectors=False)
    for capture in ("full", "summary"):
        with torch.no_grad(), lstm_probe.trace(lstm, tmp_path / f"{capture}.parquet", capture=capture):
            for x in xs:
                lstm(x)
    full, summary = (pq.ParquetFile(tmp_path / f"{c}.parquet") for c in ("full", "summary"))
    assert full.metadata.num_rows == summary.metadata.num_rows == 10_000
    assert full.metadata.num_row_groups == 2 and summary.metadata.num_row_groups == 1
    a, b = lstm_probe.load(tmp_path / "full.parquet"), lstm_probe.load(tmp_path / "summary.parquet")
    assert b.h.isna().all() and b.c.isna().all()
    expected = np.linalg.norm(lstm_probe.states(a, "h").astype(np.float64), axis=1).astype(np.float32)
    assert np.array_equal(a.h_norm.to_numpy(), b.h_norm.to_numpy())
    np.testing.assert_allclose(b.h_norm.to_numpy(), expected, rtol=1e-6)
