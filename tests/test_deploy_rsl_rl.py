"""`lstm-probe export` of rsl_rl policies (issue #49): the checkpoint `lstm-probe run --framework rsl_rl` saves,
LSTM and GRU, to ONNX and TorchScript; each file reloaded with onnxruntime / torch.jit (not through
lstm-probe) agrees with rsl_rl's own policy (OnPolicyRunner.load, get_inference_policy, reset(dones)) over
recorded episodes; a hostile checkpoint is refused in one line."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("rsl_rl")
pytest.importorskip("onnxruntime")

import lstm_probe
from lstm_probe import BadInput
from lstm_probe.integrations.rsl_rl.train import build_runner, make_env
from lstm_probe.integrations.rsl_rl.train import run as rsl_run
from tests.deployed import file_run
from tests.refusals import bounded_cli, refused_within

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
EPISODES, STEPS = 5, 40  # recorded episodes, each cut at STEPS


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("rsl_rl")
    out = {}
    for cell in ("lstm", "gru"):
        r = rsl_run("Pendulum-v1", d / f"{cell}.parquet", steps=64, n_envs=4, n_steps=8, hidden_size=8, rnn_type=cell)
        out[cell] = r.model
    return d, out


def _rsl_rl_policy(path: Path):
    """rsl_rl's own inference policy of a checkpoint: a runner built from the configuration it holds, loaded."""
    cfg = torch.load(path, weights_only=True)["infos"]["lstm_probe"]["cfg"]
    runner = build_runner(make_env("Pendulum-v1", 1, seed=0, torch_env=False, device="cpu"), cfg)
    runner.load(str(path))
    return runner.get_inference_policy("cpu")


def _episodes():
    """EPISODES episodes of Pendulum-v1 (seeds 0..), random actions: the observations and episode starts."""
    env, obs, starts = gym.make("Pendulum-v1"), [], []
    rng = np.random.default_rng(0)
    for seed in range(EPISODES):
        o, _ = env.reset(seed=seed)
        for t in range(STEPS):
            obs.append(o.astype(np.float32))
            starts.append(t == 0)
            o, *_ = env.step(rng.uniform(-2, 2, (1,)).astype(np.float32))
    return np.stack(obs), np.array(starts)


def _rsl_rl_actions(policy, obs, starts):
    """rsl_rl's loop: reset(dones) where an episode ends (before the next one's first step), state inside."""
    from tensordict import TensorDict

    out = []
    with torch.inference_mode():
        policy.reset()
        for o, s in zip(obs, starts, strict=True):
            if s:
                policy.reset(torch.ones(1, dtype=torch.long))
            out.append(policy(TensorDict({"policy": torch.as_tensor(o[None])}, batch_size=[1])).numpy())
    return np.concatenate(out)


def _file_actions(path: Path, obs, starts):
    """The exported file's actions as a deployed loop runs it (tests/deployed.py), and its metadata."""
    actions, _, _, meta = file_run(path, obs, starts)
    return actions, meta


@pytest.mark.parametrize("fmt", ["onnx", "pt"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_export_agrees_with_rsl_rls_own_policy(checkpoints, cell, fmt):
    d, saved = checkpoints
    out = d / f"{cell}.{fmt}"
    r = lstm_probe.export(saved[cell], out, env_id="Pendulum-v1", episodes=EPISODES, force=True)
    assert r.spec.cell == cell and r.spec.variant == "separate" and max(r.errors.values()) < 1e-5
    states = ["h", "c", "h_critic", "c_critic"] if cell == "lstm" else ["h", "h_critic"]
    assert [n for n, _, _ in r.spec.inputs()] == ["obs", "episode_start", *states]
    obs, starts = _episodes()
    want = _rsl_rl_actions(_rsl_rl_policy(saved[cell]), obs, starts)
    got, meta = _file_actions(out, obs, starts)
    assert meta["cell"] == cell
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-5 * scale, np.abs(got - want).max() / scale
    # the state matters: the same loop from zeros at every step parts from rsl_rl's
    assert not np.allclose(_rsl_rl_actions(_rsl_rl_policy(saved[cell]), obs, np.ones_like(starts)), want)


def test_replay_names_a_correct_rsl_rl_loop_and_a_planted_bug(checkpoints):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d, saved = checkpoints
    lstm_probe.export(saved["gru"], d / "replay.onnx", env_id="Pendulum-v1", episodes=1, force=True)
    obs, starts = _episodes()
    want = _rsl_rl_actions(_rsl_rl_policy(saved["gru"]), obs, starts)
    zeros = _rsl_rl_actions(_rsl_rl_policy(saved["gru"]), obs, np.ones_like(starts))  # reset every step
    for name, actions in (("correct", want), ("state not fed back", zeros)):  # the same computation as a reset
        rows = {"step": np.arange(len(obs)), "obs": list(obs), "action": list(actions), "episode_start": starts}
        pq.write_table(pa.table(rows), d / "trace.parquet")
        for policy in (d / "replay.onnx", saved["gru"]):  # the exported file, or the checkpoint itself
            r = lstm_probe.replay(d / "trace.parquet", policy)
            assert r.verdict == name, [(lp.name, lp.agree) for lp in r.loops]
            assert r.also == ([] if name == "correct" else ["reset every step"])
            assert not r.notes  # --vecnormalize is sb3's: no note saying to pass it
        assert "h and c swapped" not in [lp.name for lp in r.loops]  # a GRU has no c


def _cli(*args, cwd=None):
    cmd = [sys.executable, "-m", "lstm_probe", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120, cwd=cwd)


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


def test_hostile_checkpoints_are_refused_in_one_line(checkpoints, tmp_path):
    _, saved = checkpoints
    good = torch.load(saved["lstm"], weights_only=True)
    cases = {
        "code.pt": (lambda p: p.write_bytes(pickle.dumps(_Boom())), "without unpickling code"),
        "objects.pt": (lambda p: torch.save({**good, "infos": _Boom()}, p), "without unpickling code"),
        "noinfo.pt": (lambda p: torch.save({**good, "infos": None}, p), "holds no policy configuration"),
        "class.pt": (
            lambda p: torch.save(
                {
                    **good,
                    "infos": {
                        "lstm_probe": {
                            "cfg": {**good["infos"]["lstm_probe"]["cfg"], "actor": {"class_name": "os.system"}}
                        }
                    },
                },
                p,
            ),
            "is not an rsl_rl.models.RNNModel",
        ),
        "other.pt": (lambda p: torch.save({"weights": torch.zeros(3)}, p), "is not an rsl_rl checkpoint"),
    }
    for name, (make, words) in cases.items():
        make(tmp_path / name)
        refused_within(bounded_cli("export", name, "out.onnx", "--env", "Pendulum-v1", cwd=tmp_path), words)
    os.mkfifo(tmp_path / "fifo.pt")
    fifo = bounded_cli("export", "fifo.pt", "out.onnx", "--env", "Pendulum-v1", cwd=tmp_path)
    refused_within(fifo, "not a regular file")
    with open(tmp_path / "huge.pt", "wb") as f:  # 8 GB on paper (a sparse file): refused before it is read
        f.truncate(8 << 30)
    refused_within(bounded_cli("export", "huge.pt", "out.onnx", "--env", "Pendulum-v1", cwd=tmp_path), "huge.pt")
    assert not (tmp_path / "pwned.txt").exists() and not (tmp_path / "out.onnx").exists()
    they_take = r"they take sb3: \.zip files; rllib: \.pt files; rsl_rl: \.pt"
    with pytest.raises(BadInput, match=r"take no saved model named \.h5 \(" + they_take):
        lstm_probe.export(tmp_path / "model.h5", tmp_path / "x.onnx", env_id="Pendulum-v1")


def test_replay_tells_a_checkpoint_from_torchscript(checkpoints):
    """A .pt that is TorchScript (code inside) still needs --trust-model; a checkpoint is read as data."""
    d, saved = checkpoints
    lstm_probe.export(saved["lstm"], d / "ts.pt", env_id="Pendulum-v1", episodes=1, force=True)
    obs, starts = _episodes()
    rows = {"step": np.arange(len(obs)), "obs": list(obs), "action": list(obs[:, :1]), "episode_start": starts}
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(rows), d / "other.parquet")
    with pytest.raises(BadInput, match="is TorchScript, which holds code"):
        lstm_probe.replay(d / "other.parquet", d / "ts.pt")
    assert lstm_probe.replay(d / "other.parquet", saved["lstm"]).verdict == "not this policy"


def test_an_env_of_other_observations_names_both_shapes(checkpoints):
    _, saved = checkpoints
    with pytest.raises(
        BadInput, match=r"CartPole-v1's observations have the shape \(4,\), the policy's \(3,\); pass the env"
    ):
        lstm_probe.export(saved["lstm"], saved["lstm"].with_suffix(".x.onnx"), env_id="CartPole-v1")
