"""Every example runs at tiny size and writes the log it promises."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import lstm_probe

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(script, *args, cwd):
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *map(str, args)],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_sb3_own_script(tmp_path):
    run("sb3_own_script.py", "--steps", "400", "--out", "own.parquet", cwd=tmp_path)
    df = lstm_probe.load(tmp_path / "own.parquet", vectors=False)
    assert {"rollout", "train", "predict"} <= set(df.phase)  # EvalCallback's predict calls are tagged
    assert sorted(df.env.dropna().unique()) == [0, 1, 2]
    first = df[(df.phase == "train") & ~df.padding & (df.epoch == 0) & (df.minibatch == 0)]
    assert first.drift_h.max() < 1e-5  # the oracle, with VecNormalize and 3 envs
    assert list((tmp_path / "checkpoints").glob("*.zip"))


def test_cleanrl_loop(tmp_path):
    run(
        "cleanrl_loop.py",
        "--iterations",
        "2",
        "--num-envs",
        "2",
        "--num-steps",
        "16",
        "--out",
        "c.parquet",
        cwd=tmp_path,
    )
    df = lstm_probe.load(tmp_path / "c.parquet", vectors=False)
    assert len(df[df.phase == "rollout"]) == 2 * 2 * 16
    train = df[df.phase == "train"]
    assert set(train.path) == {"stepwise"} and sorted(train.t.unique()) == list(range(16))
    # one full-batch update from the stored start state: every train state equals its rollout state
    assert train.drift_h.notna().all() and train.drift_h.max() < 1e-5 and train.drift_c.max() < 1e-5


def test_lstmcell_policy(tmp_path):
    run("lstmcell_policy.py", "--steps", "20", "--out", "cells.parquet", cwd=tmp_path)
    df = lstm_probe.load(tmp_path / "cells.parquet")
    assert sorted(df.module.unique()) == ["cells.0", "cells.1"]
    assert len(df) == 2 * 20 and list(df[df.module == "cells.0"].env_step) == list(range(20))
    h = lstm_probe.states(df, "h")
    assert h.shape == (40, 16) and np.isfinite(h).all() and df.c.notna().all()


def test_pendulum_no_velocity(tmp_path):
    r = run(
        "pendulum_no_velocity.py",
        "--steps",
        "512",
        "--n-envs",
        "2",
        "--n-steps",
        "64",
        "--out",
        "p.parquet",
        cwd=tmp_path,
    )
    assert "R² velocity" in r.stdout
    df = lstm_probe.load(tmp_path / "p.parquet")
    roll = df[(df.phase == "rollout") & (df.module == "actor")]
    obs, velocity = np.stack(roll.obs.to_numpy()), np.stack(roll["info"].to_numpy())[:, 0]
    assert obs.shape == (512, 2)  # cos and sin only
    # the stored velocity belongs to the observation of its row: Pendulum moves the angle by velocity * dt
    roll = roll.assign(theta=np.arctan2(obs[:, 1], obs[:, 0]), velocity=velocity).sort_values(["env", "env_step"])
    step = roll.groupby("env").theta.diff().to_numpy()
    moved = np.angle(np.exp(1j * step)) / 0.05  # the angle's change over one step, wrapped
    inside = ~roll.episode_start.astype(bool).to_numpy() & np.isfinite(step)
    assert inside.sum() > 400
    np.testing.assert_allclose(moved[inside], roll.velocity.to_numpy()[inside], atol=1e-3)
    assert lstm_probe.summarize(tmp_path / "p.parquet").to_dict()["probes"]["targets"] == [
        "obs:0",
        "obs:1",
        "info:velocity",
    ]
