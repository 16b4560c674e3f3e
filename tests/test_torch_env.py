"""The torch-native batched Pendulum: gymnasium's dynamics exactly, and a real probed RecurrentPPO run on it
(partially observable: no velocity) whose training states equal its rollout states before the first
optimizer step (the provenance oracle)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

import lstm_probe
from lstm_probe.integrations.sb3.torch_env import TorchPendulumVecEnv
from lstm_probe.torch_env import TorchPendulum


def test_the_dynamics_are_gymnasiums_pendulum_step_for_step():
    n, steps = 5, 250
    env = TorchPendulum(n, seed=3)
    refs = [gym.make("Pendulum-v1").unwrapped for _ in range(n)]
    for i, ref in enumerate(refs):
        ref.reset(seed=i)
        ref.state = np.array([env.theta[i].item(), env.theta_dot[i].item()], dtype=np.float64)
    rng = np.random.default_rng(0)
    for k in range(steps):
        u = rng.uniform(-3, 3, size=n).astype(np.float32)  # beyond the torque limit too: clipped alike
        _, reward, truncated, final = env.step(torch.from_numpy(u))
        for i, ref in enumerate(refs):
            o, r, *_ = ref.step(u[i : i + 1])
            np.testing.assert_allclose(final[i].numpy(), o, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(reward[i].item(), r, rtol=1e-4, atol=1e-4)
            ref.state = np.array([env.theta[i].item(), env.theta_dot[i].item()], dtype=np.float64)  # no drift
        assert bool(truncated.all()) == (k + 1 == 200) and not bool(truncated.any()) == (k + 1 != 200)
    assert (env.steps == 50).all()  # every env reset itself at step 200


def test_truncation_resets_on_the_device_and_the_vec_env_reports_it():
    venv = TorchPendulumVecEnv(3, max_steps=4, observe_velocity=False)
    obs = venv.reset()
    assert obs.shape == (3, 2) and venv.observation_space.shape == (2,)
    for _ in range(4):
        obs, _, dones, infos = venv.step(np.zeros((3, 1), np.float32))
    assert dones.all() and all(i["TimeLimit.truncated"] for i in infos)
    assert all(i["terminal_observation"].shape == (2,) for i in infos)
    assert (venv.env.steps == 0).all()


def test_a_probed_recurrent_ppo_run_on_it_meets_the_oracle(tmp_path):
    from sb3_contrib import RecurrentPPO

    venv = TorchPendulumVecEnv(4, observe_velocity=False, max_steps=50, seed=1)
    model = RecurrentPPO(
        "MlpLstmPolicy",
        venv,
        n_steps=32,
        batch_size=32,
        n_epochs=2,
        seed=0,
        device="cpu",
        policy_kwargs={"lstm_hidden_size": 16},
    )
    with lstm_probe.ProbeCallback(tmp_path / "run.parquet") as probe:
        model.learn(256, callback=probe)
    df = lstm_probe.load(tmp_path / "run.parquet")
    keys = ["module", "layer", "env", "env_step"]
    roll = df[df.phase == "rollout"]
    assert set(roll.env) == {0, 1, 2, 3} and (df.phase == "bootstrap").any()  # truncations bootstrapped
    train = df[(df.phase == "train") & ~df.padding]
    first = train[(train.epoch == 0) & (train.minibatch == 0)]
    merged = first.merge(roll, on=keys, suffixes=("", "_r"), how="left", indicator=True)
    assert len(merged) and (merged["_merge"] == "both").all()
    for col in ("h", "c"):
        a = lstm_probe.states(merged, col)
        b = lstm_probe.states(merged.drop(columns=[col]).rename(columns={f"{col}_r": col}), col)
        assert (np.abs(a - b) <= 1e-5 * np.maximum(1.0, np.abs(b))).all()
