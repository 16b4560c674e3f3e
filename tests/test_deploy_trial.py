"""Findings of a user trial of `lstm-probe export` and `replay`, each a test: --episodes bounded before episodes
are recorded, trace values a float32 runtime could not have fed or sent refused in one line (naming the column
and the step), actions that are no index of the policy's Discrete(n), episode_start values other than 0/1, a
trace that marks no episode start, and the wording of the refusals. Real RecurrentPPO models (tiny), real
files, the CLI in a subprocess."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from sb3_contrib import RecurrentPPO

import lstm_probe
from lstm_probe import BadInput
from lstm_probe.deploy.spec import META_KEY
from lstm_probe.errors import ProbeError
from tests.refusals import bounded_cli, refused_within

STEPS = 20


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A Pendulum (Box action) and a CartPole (Discrete(2)) RecurrentPPO, saved and exported (one episode)."""
    d = tmp_path_factory.mktemp("trial")
    torch.set_num_threads(1)
    for env, name in (("Pendulum-v1", "pendulum"), ("CartPole-v1", "cartpole")):
        model = RecurrentPPO(
            "MlpLstmPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu",
            policy_kwargs={"lstm_hidden_size": 8},
        ).learn(64)  # fmt: skip
        model.save(d / f"{name}.zip")
        lstm_probe.export(d / f"{name}.zip", d / f"{name}.onnx", env_id=env, episodes=1)
    return d


def _trace(path, obs, action, start=None, csv=False):
    """A trace of ``len(obs)`` steps of env 0 (Parquet lists, or CSV columns obs_0, ...)."""
    n = len(obs)
    start = (np.arange(n) == 0).astype(int) if start is None else start
    if csv:
        cols = {f"obs_{i}": obs[:, i] for i in range(obs.shape[1])}
        cols |= {f"action_{i}": action[:, i] for i in range(action.shape[1])}
        pd.DataFrame({"step": np.arange(n), "episode_start": start, **cols}).to_csv(path, index=False)
    else:
        rows = {"step": np.arange(n), "obs": obs.tolist(), "action": action.tolist(), "episode_start": start}
        pq.write_table(pa.table(rows), path)
    return path


def _replay(d, trace, policy):
    return bounded_cli("replay", trace, "--policy", d / policy, cwd=d)


# -- 1. --episodes bounded before a step is recorded ------------------------------------------------------
@pytest.mark.parametrize("episodes", ["99999999999999999999", "1000000", "0"])
def test_export_refuses_episodes_out_of_range_before_recording(models, episodes):
    d = models
    run = bounded_cli("export", "pendulum.zip", "x.onnx", "--env", "Pendulum-v1", "--episodes", episodes, cwd=d)
    line = refused_within(run, "--episodes must be an integer from 1 to 1,000", "pass --episodes 1000 or fewer")
    assert ("beyond int64" in line) == (len(episodes) > 18), line
    assert not (d / "x.onnx").exists()


def test_recording_episodes_is_held_within_the_memory_budget(models):
    """The episodes' observations and both loops' outputs grow with --episodes: refused as soon as they pass
    --max-memory, while recording (1,000 episodes of Pendulum-v1 would take minutes)."""
    d = models
    run = ("--max-memory", "1M", "export", "pendulum.zip", "x.onnx", "--env", "Pendulum-v1", "--episodes", "1000")
    refused_within(bounded_cli(*run, cwd=d), "recording 1,000 episodes of Pendulum-v1", "pass a smaller --episodes")
    lstm_probe.set_max_memory("1M")
    try:
        with pytest.raises(ProbeError, match=r"verifying on the synthetic episodes .* over the 1 MiB memory budget"):
            lstm_probe.export(d / "pendulum.zip", d / "s.onnx", synthetic=True, episodes=1000)
    finally:
        lstm_probe.set_max_memory(None)


# -- 2. values a float32 runtime could not have fed or sent ------------------------------------------------
def test_obs_and_actions_beyond_float32_are_refused_naming_column_and_step(models):
    d = models
    obs, action = np.zeros((STEPS, 3)), np.zeros((STEPS, 1))
    big = obs.copy()
    big[3, 1] = 1e39
    line = refused_within(_replay(d, _trace(d / "big.parquet", big, action), "pendulum.onnx"), "obs[1] at env 0 step 3")
    assert "1e+39" in line and "beyond float32" in line
    inf = obs.copy()
    inf[4, 2] = np.inf
    refused_within(
        _replay(d, _trace(d / "inf.csv", inf, action, csv=True), "pendulum.onnx"), "obs_2 at env 0 step 4 is inf"
    )
    act = action.copy()
    act[5, 0] = -np.inf
    refused_within(
        _replay(d, _trace(d / "ainf.parquet", obs, act), "pendulum.onnx"), "action[0] at env 0 step 5 is -inf"
    )
    run = bounded_cli("export", "pendulum.zip", "t.onnx", "--trace", d / "big.parquet", cwd=d)
    refused_within(run, "obs[1] at env 0 step 3")  # export --trace reads the trace as replay does


# -- 3. discrete actions that are no index -----------------------------------------------------------------
@pytest.mark.parametrize("bad", [0.5, 1.5, -1.0, 7.0])
def test_discrete_actions_that_are_no_index_are_refused(models, bad):
    d = models
    action = np.zeros((STEPS, 1))
    action[2, 0] = bad
    trace = _trace(d / f"d{bad}.parquet", np.zeros((STEPS, 4)), action)
    for policy in ("cartpole.onnx", "cartpole.zip"):
        refused_within(_replay(d, trace, policy), f"action {bad:g} at env 0 step 2 is not an index of Discrete(2)")


def test_a_one_hot_action_is_refused_saying_to_record_the_index(models):
    d = models
    trace = _trace(d / "onehot.parquet", np.zeros((STEPS, 4)), np.tile([1.0, 0.0], (STEPS, 1)))
    refused_within(_replay(d, trace, "cartpole.onnx"), "record a Discrete action as its index")
    meta = {p.key: p.value for p in onnx.load(str(d / "cartpole.onnx")).metadata_props}[META_KEY]
    assert json.loads(meta)["choices"] == 2 and json.loads(meta)["framework"] == "sb3"


# -- 4. episode_start -------------------------------------------------------------------------------------
def test_episode_start_other_than_0_or_1_is_refused(models):
    d = models
    start = (np.arange(STEPS) == 0).astype(int)
    start[6] = 7
    trace = _trace(d / "start7.parquet", np.zeros((STEPS, 3)), np.zeros((STEPS, 1)), start)
    refused_within(_replay(d, trace, "pendulum.onnx"), "episode_start at env 0 step 6 is 7", "0/1 or true/false")


def test_a_trace_without_episode_starts_gets_a_note(models):
    d = models
    trace = _trace(d / "nostart.parquet", np.zeros((STEPS, 3)), np.zeros((STEPS, 1)), np.zeros(STEPS, int))
    r = lstm_probe.replay(trace, d / "pendulum.onnx")
    assert any("marks no episode start" in note for note in r.notes), r.notes
    marked = _trace(d / "marked.parquet", np.zeros((STEPS, 3)), np.zeros((STEPS, 1)))
    assert not any("marks no" in n for n in lstm_probe.replay(marked, d / "pendulum.onnx").notes)
    run = _replay(d, trace, "pendulum.onnx")
    assert run[0].returncode == 0 and "note: the trace marks no episode start" in run[0].stdout.decode()


# -- 6, 7. wording ----------------------------------------------------------------------------------------
def test_refusals_of_a_model_that_is_no_saved_model_read_as_sentences(models):
    d = models
    line = refused_within(bounded_cli("export", "pendulum.onnx", "x.onnx", "--env", "Pendulum-v1", cwd=d))
    assert "is already an exported file; pass the model.zip or .pt checkpoint" in line and "take no a" not in line
    line = refused_within(bounded_cli("export", d, "x.onnx", "--env", "Pendulum-v1", cwd=d), "is a directory")
    assert "take no a" not in line
    with pytest.raises(BadInput, match=r"take no saved model named \.h5 \(they take sb3: \.zip files"):
        lstm_probe.export(d / "model.h5", d / "x.onnx", env_id="Pendulum-v1")


def test_one_episode_is_singular_and_the_vecnormalize_note_is_sb3s(models):
    d = models
    r = bounded_cli("export", "pendulum.zip", "one.onnx", "--env", "Pendulum-v1", "--episodes", "1", cwd=d)[0]
    assert r.returncode == 0 and "of 1 fresh episode of Pendulum-v1" in r.stdout.decode(), r.stderr.decode()
    trace = _trace(d / "plain.parquet", np.zeros((STEPS, 3)), np.zeros((STEPS, 1)))
    for policy in ("pendulum.onnx", "pendulum.zip"):  # sb3's: --vecnormalize applies
        assert any("--vecnormalize" in n for n in lstm_probe.replay(trace, d / policy).notes)


def test_an_env_of_other_observations_names_both_shapes(models):
    d = models
    run = bounded_cli("export", "pendulum.zip", "x.onnx", "--env", "CartPole-v1", cwd=d)
    line = refused_within(run, "Box(4,) differs from the model's Box(3,)", "pass the env the policy was trained on")
    assert "-inf" not in line and "  " not in line
