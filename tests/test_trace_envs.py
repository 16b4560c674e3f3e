"""--trace-envs K: full vectors for env columns 0..K-1 (their rollout rows and the training rows that come
from them), summary rows (norms and drift) for the others; the same run's states, bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

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
    assert (s["h"].notna() == ~s["padding"]).all()  # the traced envs keep their vectors whatever --capture says
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
            "lstm_probe.cli.app",
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


def test_other_envs_none_keeps_batch_columns_where_no_env_is_tagged(tmp_path):
    """A call tagged without env columns (or an untagged one) counts its batch columns as envs, as the `init`
    columns do: --other-envs none keeps columns 0..K-1 of each call, never drops the whole call."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    lstm = nn.LSTM(3, 8)
    x = torch.randn(5, 4, 3)  # 5 steps, 4 sequences
    with lstm_probe.trace(lstm, out=tmp_path / "g.parquet", trace_envs=2, other_envs="none") as probe:
        with torch.no_grad():
            for t in range(3):
                with probe.tag(phase="rollout", iteration=0, episode=0):  # no env given
                    lstm(x[t : t + 1])
            lstm(x)  # untagged, multi-step
    df = lstm_probe.load(tmp_path / "g.parquet")
    rollout = df[df["phase"] == "rollout"]
    assert len(rollout) == 3 * 2 and rollout["episode"].eq(0).all()  # columns 0 and 1 of each tagged step
    untagged = df[df["phase"] == "other"]
    assert sorted(untagged["seq"].unique().tolist()) == [0, 1] and len(untagged) == 5 * 2
    assert np.array_equal(
        lstm_probe.states(untagged.sort_values(["seq", "t"]), "h"),
        lstm(x)[0].detach().transpose(0, 1)[:2].reshape(-1, 8).numpy(),
    )


def test_other_envs_none_selects_env_columns_wherever_they_sit(tmp_path):
    """One-step calls whose env columns are permuted, and change from call to call (the kept columns are then
    an index, not a leading run, and a call's columns are never taken from the call before): the kept envs'
    rows equal the full log's, state for state, and no other env's row is written."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    lstm = nn.LSTM(3, 8)
    x = torch.randn(6, 4, 3)
    envs = [[3, 0, 2, 1], [3, 0, 2, 1], [1, 3, 0, 2], [2, 1, 3, 0], [2, 1, 3, 0], [0, 1, 2, 3]]

    def log(name, **kw):
        out = tmp_path / f"{name}.parquet"
        with lstm_probe.trace(lstm, out=out, **kw) as probe, torch.no_grad():
            state = None
            for t, env in enumerate(envs):
                with probe.tag(phase="rollout", iteration=0, env=np.array(env), env_step=t):
                    _, state = lstm(x[t : t + 1], state)
        df = lstm_probe.load(out)
        return df.sort_values(["env_step", "env"]).reset_index(drop=True)

    full, some = log("full"), log("some", trace_envs=2, other_envs="none")
    kept = full[full["env"] < 2].reset_index(drop=True)
    assert len(some) == len(kept) == 6 * 2 and set(some["env"]) == {0, 1}
    for column in ("env", "env_step", "h_norm", "c_norm"):
        assert some[column].tolist() == kept[column].tolist(), column
    assert np.array_equal(lstm_probe.states(some, "h"), lstm_probe.states(kept, "h"))
    assert np.array_equal(lstm_probe.states(some, "c"), lstm_probe.states(kept, "c"))


def test_traced_envs_keep_their_vectors_whatever_the_capture_mode_says(tmp_path):
    """Issue #48: `--capture summary --trace-envs K` (the rsl_rl docs' wide command, the own-runner example)
    keeps envs 0..K-1's vectors, as `--capture full --trace-envs K` does: the same rows, norms and states; a
    padding row (null env) is a summary row under --other-envs summary and none alike."""
    full = lstm_probe.run("Pendulum-v1", tmp_path / "full.parquet", trace_envs=2, **RUN)
    summ = lstm_probe.run("Pendulum-v1", tmp_path / "summ.parquet", capture="summary", trace_envs=2, **RUN)
    none = lstm_probe.run(
        "Pendulum-v1", tmp_path / "none.parquet", capture="summary", trace_envs=2, other_envs="none", **RUN
    )
    a, b, c = (lstm_probe.load(r.path) for r in (full, summ, none))
    assert len(a) == len(b)
    for frame in (a, b, c):
        assert (frame["h"].notna() == (frame["env"].isin([0, 1]) & ~frame["padding"])).all()
    assert np.array_equal(lstm_probe.states(a[a.h.notna()], "h"), lstm_probe.states(b[b.h.notna()], "h"))
    assert np.array_equal(a["h_norm"].to_numpy(), b["h_norm"].to_numpy())
    assert c["padding"].sum() > 0 and c.loc[c["padding"], "h"].isna().all()


def test_rsl_rl_summary_capture_with_traced_envs_keeps_their_vectors(tmp_path):
    import pytest

    pytest.importorskip("rsl_rl")
    out = tmp_path / "wide.parquet"
    cmd = [sys.executable, "-m", "lstm_probe", "run", "Pendulum-v1", "--framework", "rsl_rl", "--torch-env"]
    cmd += ["--n-envs", "8", "--steps", "384", "--hidden-size", "8", "--capture", "summary", "--trace-envs", "2"]
    subprocess.run(
        [*cmd, "--out", str(out)],
        check=True,
        capture_output=True,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    df = lstm_probe.load(out)
    kept = df["h"].notna()
    assert kept.any() and (kept == (df["env"].isin([0, 1]) & ~df["padding"])).all()
    assert df.loc[~kept, "h_norm"].notna().all()


def _lanes(path):
    """The log's train rows and its other rows, each in file order (each in call order: writer.FileLog)."""
    import pyarrow.compute as pc

    table = pq.read_table(path)
    train = pc.equal(table["phase"], "train")
    return table.filter(train), table.filter(pc.invert(train))


@pytest.mark.parametrize(("kept_bytes", "float16"), [(None, False), (1, True)])
def test_a_traced_log_buffers_only_the_kept_rows_vectors(tmp_path, monkeypatch, kept_bytes, float16):
    """Issue #50: under --trace-envs K --other-envs summary the writer keeps the traced rows' vectors apart from
    its row buffers (log/kept.py), so a row group holds up to 65,536 rows, not the few a buffer of every
    row's h and c holds at hidden 256; the rows are the full log's, row for row in each phase, and
    the traced rows' vectors its vectors, bit for bit. With a tiny kept-vector budget (every hand-over written
    as its own row group) the rows are the same again, and so are float16 vectors."""
    from lstm_probe.log import writer
    from lstm_probe.log.layout import row_capacity

    if kept_bytes is not None:
        monkeypatch.setattr(writer, "KEPT_BYTES", kept_bytes)
    run = dict(
        RUN,
        hidden_size=256,
        n_envs=8,
        steps=1024,
        n_steps=64,
        batch_size=128,
        n_epochs=4,
        writer="thread",
        float16=float16,
    )
    full = lstm_probe.run("Pendulum-v1", tmp_path / "full.parquet", **run)
    some = lstm_probe.run("Pendulum-v1", tmp_path / "some.parquet", trace_envs=2, **run)
    meta_full, meta_some = pq.ParquetFile(full.path).metadata, pq.ParquetFile(some.path).metadata
    groups = [meta_some.row_group(i).num_rows for i in range(meta_some.num_row_groups)]
    if kept_bytes is None:
        assert max(groups) > row_capacity(256) and meta_some.num_row_groups < meta_full.num_row_groups
    else:
        assert meta_some.num_row_groups > meta_full.num_row_groups
    for a, b in zip(_lanes(full.path), _lanes(some.path), strict=True):
        assert a.num_rows == b.num_rows > 0
        for name in a.column_names:
            if name not in ("h", "c"):
                assert a[name].equals(b[name]), name
        env, padding = b["env"].to_numpy(zero_copy_only=False), b["padding"].to_numpy(zero_copy_only=False)
        traced = np.isin(env, [0, 1]) & ~padding
        for col in ("h", "c"):
            stored = b[col].is_valid().to_numpy(zero_copy_only=False)
            assert np.array_equal(stored, traced), col
            x = np.stack(b[col].filter(b[col].is_valid()).to_numpy(zero_copy_only=False))
            y = np.stack(a[col].filter(b[col].is_valid()).to_numpy(zero_copy_only=False))
            assert np.array_equal(x, y), col


def test_kept_vectors_are_laid_out_as_a_full_logs_row_buffers_hold_them():
    """kept.laid_out gives what a full log's float32 row buffers give once encoded: a float64 vector rounds
    to float16 through float32 (not straight: 1 + 2**-11 + 2**-30 is 1.0 either way in a full log), and
    the rows of a hand-over that failed before it was committed (past the buffer's rows) are left out."""
    from lstm_probe.log.kept import KeptVectors, laid_out

    hidden = 4
    x = np.full((2, hidden), 1 + 2**-11 + 2**-30)
    dense = np.empty((2, hidden), np.float32)
    dense[...] = x
    want = np.array(dense, np.float16).reshape(-1)
    kept = KeptVectors()
    kept.add(np.arange(2), x, None)
    kept.add(np.array([1, 2]), np.ones((2, hidden)), None)  # row 2: past the 2 rows committed
    want[hidden:] = 1.0
    got = laid_out(kept, 0, 2, hidden, np.dtype(np.float16))
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16)) and float(want[0]) == 1.0
    assert laid_out(kept, 1, 2, hidden, np.dtype(np.float16)).tolist() == [0.0] * 2 * hidden  # no c: zero
