"""--capture-obs of a Dict observation (MultiInputLstmPolicy): the obs vectors are the observation flattened as
sb3's CombinedExtractor concatenates it (keys in the space's order, a Discrete key one-hot, a Box key's values),
the ``obs_keys`` metadata says which slice is which key, and the probes name the components by key."""

from __future__ import annotations

import numpy as np
import pytest
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env
from tiny_envs import TinyDictEnv

import lstm_probe
from lstm_probe import ProbeCallback
from lstm_probe.errors import BadInput
from lstm_probe.log.reader import load
from lstm_probe.report.probes import obs_names


@pytest.fixture(scope="module")
def dict_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("obsdict") / "d.parquet"
    env = make_vec_env(TinyDictEnv, n_envs=2, seed=0)
    model = RecurrentPPO(
        "MultiInputLstmPolicy",
        env,
        n_steps=32,
        batch_size=32,
        n_epochs=1,
        seed=0,
        policy_kwargs={"lstm_hidden_size": 8},
    )
    with ProbeCallback(out, force=True, capture_obs=True) as probe:  # was: BadInput, "needs an array observation"
        model.learn(128, callback=probe)
    return out, model


def test_a_dict_observation_is_recorded_as_sb3_concatenates_it(dict_run):
    out, model = dict_run
    meta = lstm_probe.read_info(out).metadata
    assert meta["obs_size"] == 5
    assert meta["obs_keys"] == [  # the space's order: gymnasium sorts a Dict's keys ('flag' before 'pos')
        {"key": "flag", "start": 0, "size": 2, "encoding": "one-hot", "space": "Discrete(2)"},
        {"key": "pos", "start": 2, "size": 3, "encoding": "values", "space": "Box(-1.0, 1.0, (3,), float32)"},
    ]
    df = load(out)
    roll = df[(df.phase == "rollout") & (df.module == "actor")]
    last = roll[roll.iteration == roll.iteration.max()].sort_values(["env", "env_step"])
    got = np.stack(last.obs.to_numpy())
    # the rollout buffer's observations of the last rollout, env by env after train() flattened them
    flag = model.rollout_buffer.observations["flag"].reshape(-1).astype(int)
    pos = model.rollout_buffer.observations["pos"].reshape(-1, 3)
    assert got.shape == (64, 5) and set(flag) == {0, 1}
    np.testing.assert_array_equal(got[:, :2], np.eye(2, dtype=np.float32)[flag])
    np.testing.assert_array_equal(got[:, 2:], pos)
    # sb3's own features of the same observations: the Flatten extractors' concatenation, equal to the log's
    obs = {"flag": flag[:4], "pos": pos[:4]}
    tensors, _ = model.policy.obs_to_tensor(obs)
    features = model.policy.extract_features(tensors, model.policy.features_extractor)
    np.testing.assert_array_equal(features.detach().numpy(), got[:4])


def test_probes_name_a_dict_observations_components_by_key(dict_run):
    out, _ = dict_run
    probes = lstm_probe.summarize(out).to_dict()["probes"]
    assert probes["targets"] == ["obs:flag[0]", "obs:flag[1]", "obs:pos[0]", "obs:pos[1]", "obs:pos[2]"]
    by_key = lstm_probe.probe(out, "obs:pos[1]")
    by_index = lstm_probe.probe(out, "obs:3")
    assert by_key["r2"].tolist() == by_index["r2"].tolist() and by_key["n_test"].gt(0).all()
    with pytest.raises(BadInput, match=r"'pos' has 3 components \(0..2\)"):
        lstm_probe.probe(out, "obs:pos[3]")
    with pytest.raises(BadInput, match=r"the observation's keys: flag \(2\), pos \(3\)"):
        lstm_probe.probe(out, "obs:speed[0]")


def test_the_report_takes_the_first_components_of_every_key_in_turn():
    meta = {"obs_size": 3 * 36 * 36 + 3, "obs_keys": [{"key": "image", "start": 0, "size": 3888}]}
    meta["obs_keys"].append({"key": "pos", "start": 3888, "size": 3})
    assert obs_names(meta, 8) == [*(f"obs:image[{i}]" for i in range(5)), "obs:pos[0]", "obs:pos[1]", "obs:pos[2]"]
    assert obs_names({"obs_size": 3}, 8) == ["obs:0", "obs:1", "obs:2"]  # an array observation, as before
    broken = {**meta, "obs_size": 10}  # keys that do not tile the vector: named by index
    assert obs_names(broken, 2) == ["obs:0", "obs:1"]
