"""Linear probes from a log (issue 27): exact oracles on a real tiny run's hidden states."""

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest

import lstm_probe
from lstm_probe import ProbeCallback
from lstm_probe.errors import BadInput
from lstm_probe.probes import _sample, probe_targets, r2, ridge, split
from lstm_probe.reader import load, states


def test_ridge_recovers_a_linear_map():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 8))
    y = x @ np.arange(8.0) + 3.0
    w, b = ridge(x, y, alpha=1e-9)
    assert np.allclose(w, np.arange(8.0), atol=1e-5) and abs(b - 3.0) < 1e-5
    assert r2(y, x @ w + b) > 0.999999
    assert r2(np.ones(4), np.ones(4)) is None
    held = split(np.array([5, 5, 7, 9, 9, 11]), 0.5)  # keys 5, 7, 9, 11: every 2nd held out
    assert held.tolist() == [False, False, True, False, False, True]


@pytest.fixture(scope="module")
def log(runs_dir):
    from tests.conftest import probed_run

    return probed_run(runs_dir, n_envs=2, n_steps=128, batch_size=64, steps=512).path


def rollout(path, module="actor", layer=0):
    df = load(path, phase="rollout", vectors=True)
    df = df[(df["module"] == module) & (df["layer"] == layer)].reset_index(drop=True)
    return df, states(df, "h").astype(np.float64)


def test_exact_linear_target_scores_one_and_shuffled_scores_zero(log):
    df, h = rollout(log)
    w = np.linspace(-1, 1, h.shape[1])
    target = pd.DataFrame({"env": df["env"], "env_step": df["env_step"], "value": h @ w})
    res = lstm_probe.probe(log, target, alpha=1e-9)  # an exact linear map: no shrinkage needed
    actor = res[(res["module"] == "actor") & (res["layer"] == 0)]
    assert len(actor) >= 2 and (actor["r2"] > 0.9999).all(), actor
    shuffled = target.assign(value=np.random.default_rng(0).permutation(target["value"].to_numpy()))
    res = lstm_probe.probe(log, shuffled)
    actor = res[(res["module"] == "actor") & (res["layer"] == 0)]
    assert actor["r2"].between(-0.3, 0.15).all() and abs(actor["r2"].mean()) < 0.15, actor


def test_lags_and_column_targets(log):
    res = lstm_probe.probe(log, "episode_step", lags=[0, 1, 4])
    assert set(res["lag"]) == {0, 1, 4} and set(res["module"]) == {"actor", "critic"}
    assert res["n_fit"].gt(0).all()
    # the episode step at t - 4 is the episode step at t minus 4: the same R² up to the rows left out
    with pytest.raises(BadInput, match="capture-obs"):  # a log without observations: its obs column is null
        lstm_probe.probe(log, "obs:1")
    with pytest.raises(BadInput, match="lags"):
        lstm_probe.probe(log, "episode_step", lags=[-1])


class CosInInfo(gym.Wrapper):
    """Puts the observation's first entry into info["cos"]: info and obs of one row must agree."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "cos": float(obs[0])}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "cos": float(obs[0])}


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """A run with --capture-obs and --info cos (episodes end inside it: Pendulum's 200 steps, 256 per env)."""
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    out = tmp_path_factory.mktemp("obs") / "obs.parquet"
    env = make_vec_env("Pendulum-v1", n_envs=2, seed=0, wrapper_class=CosInInfo)
    model = RecurrentPPO(
        "MlpLstmPolicy", env, n_steps=128, batch_size=128, n_epochs=1, seed=0, policy_kwargs={"lstm_hidden_size": 8}
    )
    with ProbeCallback(out, force=True, capture_obs=True, info_keys=["cos", "missing"]) as probe:
        model.learn(512, callback=probe)
    return out, model


def test_capture_obs_rows_hold_the_observations_the_policy_saw(captured):
    out, model = captured
    meta = lstm_probe.read_info(out).metadata
    assert meta["obs_size"] == 3 and meta["info_keys"] == ["cos", "missing"]
    df = load(out)
    roll = df[(df.phase == "rollout") & (df.module == "actor")]
    assert roll.obs.notna().all() and df[df.phase != "rollout"].obs.isna().all()
    obs = np.stack(roll.obs.to_numpy())
    assert obs.shape == (2 * 256, 3)
    # the rollout buffer holds the last rollout's observations, env by env after train() flattened it
    last = roll[roll.iteration == roll.iteration.max()].sort_values(["env", "env_step"])
    stored = np.asarray(model.rollout_buffer.observations, np.float32).reshape(-1, 3)
    np.testing.assert_array_equal(np.stack(last.obs.to_numpy()), stored)
    # info of the observation that went in, reset infos at episode starts included; a missing key is NaN
    info = np.stack(roll["info"].to_numpy())
    np.testing.assert_array_equal(info[:, 0], obs[:, 0])
    assert np.isnan(info[:, 1]).all() and roll.episode_start.sum() >= 2 + 2  # first steps and one reset per env
    res = lstm_probe.probe(out, "info:cos", lags=[0, 1])
    assert len(res) and res["n_fit"].gt(0).all()
    with pytest.raises(BadInput, match="info keys are cos, missing"):
        lstm_probe.probe(out, "info:velocity")


def test_report_probe_table(captured, log):
    out, _ = captured
    doc = lstm_probe.summarize(out).to_dict()
    probes = doc["probes"]
    assert probes["targets"] == ["obs:0", "obs:1", "obs:2", "info:cos", "info:missing"]
    assert probes["lags"] == [0, 1] and probes["iterations"] == [0, 1]
    got = {(r["target"], r["module"], r["lag"]) for r in probes["rows"]}
    assert ("info:cos", "actor", 0) in got and ("obs:2", "critic", 1) in got
    assert all(r["r2"] is None for r in probes["rows"] if r["target"] == "info:missing")
    assert lstm_probe.summarize(log).to_dict()["probes"] is None  # no observations captured
    # the section's numpy rows (probe_rows) are the DataFrame's (probe_targets), NaN as None, of the same types
    frame = probe_targets(out, probes["targets"], lags=[0, 1], iterations=[0, 1], max_rows=4096, strict=False)
    want = [{k: None if v != v else v for k, v in r.items()} for r in frame.to_dict("records")]
    assert probes["rows"] == want
    assert [[type(v) for v in r.values()] for r in probes["rows"]] == [[type(v) for v in r.values()] for r in want]


def test_sample_keeps_whole_units():
    units = np.repeat(np.arange(10), 50)
    keep = _sample(units, 100)
    assert keep.sum() == 100 and set(np.unique(units[keep])) == {0, 5}
    assert _sample(units, None).all() and _sample(units, 10_000).all()
