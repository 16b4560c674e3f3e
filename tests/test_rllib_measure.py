"""What-if on RLlib: real PPO (use_lstm=True) on CartPole-v1 with a tiny model, what-if measured in the learner.

The oracle: at minibatch 0 of epoch 0 the learner's weights are the env runners' (synced before sampling), so the
stored states equal the refreshed ones, the values and log-probabilities do not move, and the gradient RLlib steps
with is the refreshed states' (cosine 1). RLlib's separate critic is the exception the adapter declares: the env
runners' inference-only module never receives the critic encoder's weights, so its stored states equal refreshed
ones in the first iteration only. Planted weights give the answers they must (an LSTM that ignores its state: no
alternative moves anything; one that integrates: zero states move values). Training is bit-identical with what-if.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

import torch

import lstm_probe
from lstm_probe.integrations import rllib

pytestmark = pytest.mark.rllib


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    import ray

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", num_cpus=2)
    yield
    ray.shutdown()


def records(path: Path) -> list[dict]:
    cols = lstm_probe.read_info(path).metadata["what_if"]["records"]
    return [dict(zip(cols, row, strict=True)) for row in zip(*cols.values(), strict=True)]


def _config(shared: bool, lr: float | None = None):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    model = DefaultModelConfig(use_lstm=True, max_seq_len=8, lstm_cell_size=16, vf_share_layers=shared)
    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, rollout_fragment_length=32, num_envs_per_env_runner=2)
        .training(
            train_batch_size_per_learner=64, minibatch_size=32, num_epochs=2, **({} if lr is None else {"lr": lr})
        )
        .rl_module(model_config=model)
        .debugging(seed=0)
    )


def _train(config, iterations: int, out: Path | None, plant=None, **measure) -> dict[str, torch.Tensor]:
    torch.set_num_threads(1)
    if out is not None:
        rllib.probe_config(config, f"{out}/", **measure)
    algo = config.build_algo()
    if plant is not None:
        plant(algo)
    for _ in range(iterations):
        algo.train()
    if out is not None:
        rllib.close(algo)
    module = algo.learner_group._learner.module["default_policy"]
    state = {k: v.clone() for k, v in module.state_dict().items()}
    algo.stop()
    return state


def test_training_untouched_and_the_oracle_holds(tmp_path: Path) -> None:
    plain = _train(_config(shared=False), 3, None)
    probed = _train(_config(shared=False), 3, tmp_path / "w", what_if=True, memory=True, capture_obs=True)
    assert plain.keys() == probed.keys() and all(torch.equal(plain[k], probed[k]) for k in plain)

    rows = records(tmp_path / "w")
    stored = [r for r in rows if r["alternative"] == "stored" and r["epoch"] == 0 and r["minibatch"] == 0]
    assert {r["iteration"] for r in stored} == {0, 1, 2}
    for r in stored:  # the actor's runner weights are the learner's at minibatch 0
        assert r["state_actor"] < 1e-5 and r["logp_abs"] < 1e-6 and r["kl"] == pytest.approx(0, abs=1e-8)
        assert r["grad_cos_policy"] == pytest.approx(1, abs=1e-5)
        if r["iteration"] == 0:  # the critic's too, before any update
            assert r["state_critic"] < 1e-5 and r["value_abs"] < 1e-6
            assert r["grad_cos_value"] == pytest.approx(1, abs=1e-5)
        else:  # never synced to the env runners afterwards: its stored states are the untrained critic's
            assert r["state_critic"] > 1e-2
    zero = [r for r in rows if r["alternative"] == "zero"]
    assert zero and all(r["state_actor"] == pytest.approx(1.0) for r in zero)
    # whatever a zero state changes, it changes by more than the oracle's rounding
    assert max(r["value_abs"] for r in zero) > 1e-4

    meta = lstm_probe.read_info(tmp_path / "w").metadata
    assert set(meta["what_if"]["unsynced"]) == {"critic"} and meta["capabilities"]["replay"] is True
    hp = meta["hyperparameters"]  # read from the user's own config (_config), not from lstm-probe's options
    assert (hp["train_batch_size_per_learner"], hp["minibatch_size"], hp["num_epochs"], hp["max_seq_len"]) == (
        64,
        32,
        2,
        8,
    )
    report = lstm_probe.summarize(tmp_path / "w").to_dict()
    assert report["what_if"]["check"]["ok"] is True
    assert any("critic's stored states come from other weights" in f for f in report["findings"])


def _plant(integrate: bool):
    """The one shared LSTM either ignores its state (no recurrent weights, forget gate shut) or integrates its
    input (forget gate open), in the learner and in the env runner alike; lr 0 keeps them."""

    def plant(algo) -> None:
        modules = [algo.learner_group._learner.module["default_policy"], algo.env_runner.module]
        for module in modules:
            lstm = module.encoder.encoder.lstm
            h = lstm.hidden_size
            with torch.no_grad():
                lstm.weight_hh_l0.zero_()
                lstm.bias_hh_l0.zero_()
                lstm.bias_ih_l0.zero_()
                lstm.bias_ih_l0[h : 2 * h] = 20.0 if integrate else -50.0  # forget gate
                lstm.bias_ih_l0[:h] = 20.0  # input gate open
                lstm.bias_ih_l0[3 * h :] = 20.0  # output gate open

    return plant


@pytest.mark.parametrize("integrate", [False, True])
def test_planted_weights(tmp_path: Path, integrate: bool) -> None:
    _train(_config(shared=True, lr=0.0), 2, tmp_path / "p", plant=_plant(integrate), what_if=True, memory=True)
    memory = lstm_probe.summarize(tmp_path / "p").to_dict()["memory"]
    last = [h for h in memory["horizons"] if h["iteration"] == 1]
    # one LSTM: the values read it (the critic's curve is the values' through the actor's LSTM)
    assert {(h["module"], h["metric"]) for h in last} == {("actor", "kl"), ("critic", "value_rel")}
    for h in last:  # an integrator remembers past the rollout; a shut forget gate and no recurrence: nothing
        assert (h["beyond"], h["unused"]) == ((True, False) if integrate else (False, True)), h
    rows = records(tmp_path / "p")
    assert "unsynced" not in lstm_probe.read_info(tmp_path / "p").metadata["what_if"]
    zero = [r for r in rows if r["alternative"] == "zero"]
    assert zero and all(r["episode_starts"] < r["sequences"] for r in zero)  # some state carried into a chunk
    stored = [r for r in rows if r["alternative"] == "stored"]
    assert all(r["state_actor"] < 1e-5 for r in stored)  # lr 0: never stale
    moved = max(r["value_abs"] for r in zero)
    if integrate:
        assert moved > 1e-3 and max(r["state_actor"] for r in zero) == pytest.approx(1.0)
    else:
        assert moved == pytest.approx(0, abs=1e-6) and max(r["kl"] for r in zero) == pytest.approx(0, abs=1e-9)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "lstm_probe", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def test_cli_run_what_if_and_report(tmp_path: Path) -> None:
    small = ["--steps", "128", "--n-envs", "2", "--n-steps", "32", "--batch-size", "32", "--n-epochs", "2"]
    r = _cli(
        "run",
        "CartPole-v1",
        "--framework",
        "rllib",
        *small,
        "--hidden-size",
        "16",
        "--what-if",
        "--memory",
        "--capture-obs",
        "--out",
        "cp/",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rep = _cli("report", "cp/", "--json", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    assert doc["what_if"]["check"]["ok"] is True and doc["what_if"]["minibatches"] >= 2
    assert doc["verdict"]["matters"] is not None  # measured, not "unmeasured: run with --what-if"
    assert doc["memory"]["measured"] is True and {h["module"] for h in doc["memory"]["horizons"]} == {"actor", "critic"}
    assert doc["probes"]["targets"][:4] == ["obs:0", "obs:1", "obs:2", "obs:3"] and doc["unavailable"] == []
    text = _cli("report", "cp/", cwd=tmp_path)
    assert "What if" in text.stdout and "what-if check FAILED" not in text.stdout + text.stderr


@pytest.mark.parametrize("flag", [["--info", "x"]])
def test_cli_refuses_what_rllib_does_not_measure_yet(tmp_path: Path, flag: list[str]) -> None:
    r = _cli("run", "CartPole-v1", "--framework", "rllib", *flag, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert flag[0] in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())


SEEN: dict[int, list] = {}
"""Every observation each env instance returned (reset and step), by instance, in order."""


def _recording_env(config):
    import gymnasium as gym

    class Recording(gym.Wrapper):
        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            SEEN.setdefault(id(self), []).append(obs.copy())
            return obs, info

        def step(self, action):
            obs, *rest = self.env.step(action)
            SEEN.setdefault(id(self), []).append(obs.copy())
            return (obs, *rest)

    return Recording(gym.make("CartPole-v1"))


def test_capture_obs_keeps_what_each_env_returned(tmp_path: Path) -> None:
    """With the env runner in the driver, every observation each env returned is recorded beside the run: each
    env's rollout rows, in env-step order, hold exactly those observations (the last one may still wait for the
    next sample)."""
    from ray.tune.registry import register_env

    register_env("RecordingCartPole", _recording_env)
    SEEN.clear()
    config = _config(shared=True).environment("RecordingCartPole")
    _train(config, 2, tmp_path / "o", capture_obs=True)
    meta = lstm_probe.read_info(tmp_path / "o").metadata
    assert meta["obs_size"] == 4 and meta["capabilities"]["observe"] is True
    df = lstm_probe.load(tmp_path / "o", phase="rollout", module="actor")
    envs = sorted(set(df["env"]))
    assert len(envs) == 2 and len(SEEN) == 2
    # gymnasium's SyncVectorEnv builds its envs in order: env column i is the i-th instance created
    for env, seen in zip(envs, SEEN.values(), strict=True):
        rows = df[df["env"] == env].sort_values("env_step")
        got = np.stack(rows["obs"].to_list())
        assert len(got) > 50 and len(seen) - len(got) in (0, 1)
        assert np.array_equal(got, np.stack(seen[: len(got)]).astype(np.float32))
    # the rows' own provenance agrees: an episode's first row holds a reset observation
    assert df["obs"].map(len).eq(4).all()


_TEXT: dict = {"capture_output": True, "text": True, "check": True}


def test_what_if_and_memory_count_kept_columns_per_env_runner(tmp_path):
    """Two env runners of 2 envs each, --trace-envs 1 --other-envs none: the log keeps env column 0 of each
    runner's 2. The what-if and memory sections say so as the calls section does, never "of 2" (the run's 4 envs
    are 2 per runner) nor of the envs the memory sampled."""
    small = ["--env-runners", "2", "--steps", "128", "--n-envs", "2", "--n-steps", "32", "--batch-size", "32"]
    small += ["--n-epochs", "2", "--hidden-size", "8", "--max-seq-len", "8", "--capture", "summary"]
    r = _cli(
        "run", "CartPole-v1", "--framework", "rllib", *small, "--trace-envs", "1", "--other-envs", "none",
        "--what-if", "--memory", "--out", "k/", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    rep = lstm_probe.summarize(tmp_path / "k")
    kept = "env column 0 of each runner's 2"
    assert kept in rep.calls.explanation  # the calls section's words, which the others now share
    assert rep.what_if.measured and rep.memory.measured
    assert rep.what_if.scope.endswith(f"not only {kept} that the log keeps rows of"), rep.what_if.scope
    assert rep.memory.scope["bptt"].startswith(f"{kept} alone"), rep.memory.scope
    assert rep.what_if.env_runners == 2 and rep.memory.env_runners == 2
    bptt = [f for f in rep.findings if "through the training sequences of env column" in f]
    assert bptt and all(f"through the training sequences of {kept}" in f for f in bptt), bptt
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    text = subprocess.run([sys.executable, "-m", "lstm_probe", "report", str(tmp_path / "k")], **_TEXT, env=env)
    words = " ".join(text.stdout.replace("│", " ").split())
    assert f"training sequences (BPTT) of {kept} (the only env columns with rows)" in words
    assert "env column 0 of 2 " not in words and "env column 0 of 2:" not in words
