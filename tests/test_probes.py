"""Linear probes from a log (issue 27): exact oracles on a real tiny run's hidden states."""

import numpy as np
import pandas as pd
import pytest

import lstm_probe
from lstm_probe.errors import BadInput
from lstm_probe.probes import r2, ridge, split
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
    with pytest.raises(BadInput, match="no 'obs' column"):
        lstm_probe.probe(log, "obs:1")
    with pytest.raises(BadInput, match="lags"):
        lstm_probe.probe(log, "episode_step", lags=[-1])
