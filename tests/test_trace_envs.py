"""--trace-envs K: full vectors for env columns 0..K-1 (their rollout rows and the training rows that come
from them), summary rows (norms and drift) for the others; the same run's states, bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq

import lstm_probe

RUN = dict(n_envs=4, steps=512, n_steps=64, batch_size=64, n_epochs=2, hidden_size=16, seed=0, torch_threads=1)


def test_trace_envs_keeps_the_chosen_envs_vectors_and_summary_rows_for_the_rest(tmp_path):
    full = lstm_probe.run("Pendulum-v1", tmp_path / "full.parquet", **RUN)
    some = lstm_probe.run("Pendulum-v1", tmp_path / "some.parquet", trace_envs=2, **RUN)
    a, b = lstm_probe.load(full.path), lstm_probe.load(some.path)
    assert len(a) == len(b) and some.bytes < full.bytes
    stored = b["h"].notna()
    assert (stored == (b["env"].isin([0, 1]) & ~b["padding"])).all()
    # the chosen envs' rows: the same states as the full log's, bit for bit (the probe never changes training)
    keys = ["phase", "module", "layer", "iteration", "epoch", "minibatch", "seq", "t", "env", "env_step"]
    m = b[stored].merge(a, on=keys, suffixes=("", "_full"))
    assert len(m) == stored.sum()
    for col in ("h", "c"):
        x = lstm_probe.states(m, col)
        y = lstm_probe.states(m.drop(columns=[col]).rename(columns={f"{col}_full": col}), col)
        assert np.array_equal(x, y)
    # every row keeps its norms and drifts, whichever env it is
    assert np.array_equal(b["h_norm"].to_numpy(), a["h_norm"].to_numpy())
    train = b[(b.phase == "train") & ~b.padding]
    assert train["drift_h"].notna().all()
    # the provenance oracle on the chosen envs: before the first optimizer step train == rollout
    first = m[(m.phase == "train") & (m.epoch == 0) & (m.minibatch == 0)]
    assert len(first) and first["drift_h"].max() < 1e-5 and first["drift_c"].max() < 1e-5
    meta = json.loads(pq.read_schema(some.path).metadata[b"lstm_probe.run"])
    assert meta["capture"]["trace_envs"] == 2
    cmd = [sys.executable, "-m", "lstm_probe.cli", "report", str(some.path)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert "vectors of envs 0..1 only" in " ".join(r.stdout.replace("│", " ").split())


def test_other_envs_none_hands_over_the_chosen_envs_only_and_writes_their_rows_unchanged(tmp_path):
    """--other-envs none: the other env columns never leave the device (selected where the states are, before
    any host copy, input-state answer or recovery), so they have no rows; the chosen envs' rows are the full
    log's rows, states, `init` answers and drifts included, bit for bit."""
    full = lstm_probe.run("Pendulum-v1", tmp_path / "full.parquet", **RUN)
    some = lstm_probe.run("Pendulum-v1", tmp_path / "some.parquet", trace_envs=2, other_envs="none", **RUN)
    a, b = lstm_probe.load(full.path), lstm_probe.load(some.path)
    chosen = a[a["env"].isin([0, 1])]
    assert set(b["env"].dropna().unique()) == {0, 1}
    assert b["env"].isna().sum() == b["padding"].sum() > 0  # the chosen envs' sequences keep their padding
    b = b[~b["padding"]]
    assert len(b) == len(chosen) < len(a) // 2
    keys = ["phase", "module", "layer", "iteration", "epoch", "minibatch", "seq", "t", "env", "env_step", "call"]
    m = b.merge(chosen, on=keys, suffixes=("", "_full"))
    assert len(m) == len(b)  # every row is one of the full log's, same call ids included
    for col in ("init", "h_norm", "c_norm", "drift_h", "drift_c", "episode", "episode_start", "padding"):
        assert m[col].equals(m[f"{col}_full"].rename(col)), col
    for col in ("h", "c"):
        x = lstm_probe.states(m, col)
        y = lstm_probe.states(m.drop(columns=[col]).rename(columns={f"{col}_full": col}), col)
        assert np.array_equal(x, y, equal_nan=True)
    first = m[(m.phase == "train") & (m.epoch == 0) & (m.minibatch == 0)]
    assert len(first) and first["drift_h"].max() < 1e-5 and first["drift_c"].max() < 1e-5
    summary = lstm_probe.run(
        "Pendulum-v1", tmp_path / "summary.parquet", capture="summary", trace_envs=2, other_envs="none", **RUN
    )
    s = lstm_probe.load(summary.path)
    assert s["h"].isna().all()
    s = s[~s["padding"]]
    assert len(s) == len(b)
    assert np.array_equal(s["drift_h"].to_numpy(), b["drift_h"].to_numpy(), equal_nan=True)
    meta = json.loads(pq.read_schema(some.path).metadata[b"lstm_probe.run"])
    assert meta["capture"]["trace_envs"] == 2 and meta["capture"]["other_envs"] == "none"
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe.cli", "report", str(some.path)], capture_output=True, text=True
    )
    assert "the other envs have no rows" in " ".join(r.stdout.replace("│", " ").split())
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "lstm_probe.cli",
            "run",
            "Pendulum-v1",
            "--other-envs",
            "none",
            "--out",
            str(tmp_path / "x.parquet"),
        ],
        capture_output=True,
        text=True,
    )
    assert (
        bad.returncode != 0 and "--other-envs none needs --trace-envs" in bad.stderr and "Traceback" not in bad.stderr
    )
