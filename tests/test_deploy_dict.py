"""A MultiInputLstmPolicy (RecurrentPPO on a gymnasium Dict observation space) exports: the file takes one flat
``obs`` input, each key's slice as ``gymnasium.spaces.flatten`` lays it out and as its metadata states it
(``obs_keys``), agrees with sb3's own ``predict`` over episodes with resets, and replay reads it and its
model.zip. A file whose metadata states another layout is refused in one line (was: export refused the policy)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from gymnasium import spaces
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env
from tiny_envs import PendulumDictEnv

import lstm_probe
from lstm_probe.deploy.spec import META_KEY, Spec

ENV_ID = "PendulumDictEnv-v0"  # registered by tiny_envs; episodes of 40 steps
SPACE = PendulumDictEnv.observation_space


@pytest.fixture(scope="module")
def dict_model(tmp_path_factory):
    env = make_vec_env(ENV_ID, n_envs=1, seed=0)
    kw = {"lstm_hidden_size": 8, "net_arch": [16]}
    model = RecurrentPPO("MultiInputLstmPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, policy_kwargs=kw)
    model.learn(32)
    d = tmp_path_factory.mktemp("dict")
    model.save(d / "model.zip")
    lstm_probe.export(d / "model.zip", d / "policy.onnx", env_id=ENV_ID, episodes=2)  # read as data: no trust
    return model, d


def _predicted(model, steps=100):
    """``steps`` steps of sb3's own deployment loop on the vec env (an episode start every 40 steps: the vec env
    resets itself), ``predict`` deterministic: each step's Dict obs, episode start, action and actor (h, c)."""
    env = make_vec_env(ENV_ID, n_envs=1, seed=3)
    obs, state, start, rows = env.reset(), None, np.array([True]), []
    for _ in range(steps):
        action, state = model.predict(obs, state=state, episode_start=start, deterministic=True)
        rows.append(({k: v[0] for k, v in obs.items()}, bool(start[0]), action[0], state))
        obs, _, start, _ = env.step(action)
    return rows


def test_the_onnx_file_takes_the_dict_flat_and_agrees_with_predict_over_episodes_with_resets(dict_model):
    import onnxruntime as ort

    model, d = dict_model
    sess = ort.InferenceSession(str(d / "policy.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    assert names == ["obs", "episode_start", "h", "c", "h_critic", "c_critic"]
    assert sess.get_inputs()[0].shape == ["batch", 7]  # angle (2), phase one-hot (4), speed (1)
    meta = json.loads(onnx.load(d / "policy.onnx").metadata_props[0].value)
    assert meta["obs_keys"] == [
        {"key": "angle", "space": "box", "shape": [2], "start": 0, "stop": 2},
        {"key": "phase", "space": "discrete", "shape": [], "start": 2, "stop": 6},
        {"key": "speed", "space": "box", "shape": [1], "start": 6, "stop": 7},
    ]
    rows = _predicted(model)
    assert sum(start for _, start, _, _ in rows) == 3  # steps 0, 40 and 80: two resets within the run
    state = [np.zeros((1, 1, 8), np.float32) for _ in range(4)]
    for obs, start, want, (h, c) in rows:
        flat = spaces.flatten(SPACE, obs).astype(np.float32)[None]
        feed = [flat, np.array([start], np.float32), *state]
        action, _, *state = sess.run(None, dict(zip(names, feed, strict=True)))
        assert np.allclose(action[0], want, atol=1e-5, rtol=0), (action, want)
        assert np.allclose(state[0], h, atol=1e-5, rtol=0) and np.allclose(state[1], c, atol=1e-5, rtol=0)


def _trace(path, rows, bug=None):
    """The trace of sb3's loop (flat obs, as docs/deploy.md says a Dict policy's runtime records them)."""
    table = {
        "step": list(range(len(rows))),
        "obs": [spaces.flatten(SPACE, obs).astype(np.float32).tolist() for obs, _, _, _ in rows],
        "action": [a.tolist() for _, _, a, _ in rows],
        "episode_start": [s for _, s, _, _ in rows],
    }
    pq.write_table(pa.table(table), path)
    return path


def test_replay_reads_a_dict_policys_file_and_model_zip(dict_model, tmp_path):
    model, d = dict_model
    trace = _trace(tmp_path / "run.parquet", _predicted(model))
    for policy in (d / "policy.onnx", d / "model.zip"):  # a zip's Dict space is pickled: read with trust
        r = lstm_probe.replay(trace, policy, trust_model=policy.suffix == ".zip")
        assert (r.verdict, r.parted) == ("correct", None), (
            policy.name,
            r.verdict,
            [(lp.name, lp.agree) for lp in r.loops],
        )
        assert next(lp for lp in r.loops if lp.name == "not reset at episode starts").first_diff == (0, 40)


def test_a_file_stating_another_obs_layout_is_refused_in_one_line(dict_model, tmp_path):
    _, d = dict_model
    text = onnx.load(d / "policy.onnx").metadata_props[0].value
    spec = Spec.from_json(text, "f")
    assert [k.key for k in spec.obs_keys] == ["angle", "phase", "speed"] and spec.obs_shape == (7,)
    assert Spec.from_json(spec.to_json(), "f") == spec
    doc = json.loads(text)
    keys = doc["obs_keys"]
    bad = {
        "a gap": [keys[0], {**keys[1], "start": 3}, keys[2]],
        "short of the obs": keys[:2],
        "past the obs": [keys[0], keys[1], {**keys[2], "stop": 9}],
        "a key twice": [keys[0], {**keys[1], "key": "angle"}, keys[2]],
        "an unknown space": [{**keys[0], "space": "text"}, keys[1], keys[2]],
        "a long name": [{**keys[0], "key": "k" * 10_000}, keys[1], keys[2]],
        "a huge shape": [{**keys[0], "shape": [1 << 40]}, keys[1], keys[2]],
        "not a list": {"angle": 2},
        "too many": [{"key": str(i), "space": "box", "shape": [1], "start": i, "stop": i + 1} for i in range(300)],
    }
    for what, value in bad.items():
        with pytest.raises(lstm_probe.BadInput, match=rf"^f: its {META_KEY} metadata states") as caught:
            Spec.from_json(json.dumps({**doc, "obs_keys": value}), "f")
        assert "\n" not in str(caught.value) and len(str(caught.value)) < 400, what
    # through replay: the file's own metadata tampered with (the graph unchanged) is refused before it runs
    proto = onnx.load(d / "policy.onnx")
    proto.metadata_props[0].value = json.dumps({**doc, "obs_keys": bad["a gap"]})
    onnx.save(proto, tmp_path / "tampered.onnx")
    trace = _trace(tmp_path / "t.parquet", _predicted(dict_model[0], steps=3))
    with pytest.raises(lstm_probe.BadInput, match="states the obs key"):
        lstm_probe.replay(trace, tmp_path / "tampered.onnx")


def test_synthetic_verification_of_a_dict_with_a_discrete_key_is_refused_in_one_line(dict_model, tmp_path):
    model, _ = dict_model
    with pytest.raises(lstm_probe.BadInput, match="--synthetic draws normal values, which a Dict observation's"):
        lstm_probe.export(model, tmp_path / "p.onnx", synthetic=True)
    assert not (tmp_path / "p.onnx").exists()


def test_a_dict_policy_exports_as_torchscript_too(dict_model, tmp_path):
    _, d = dict_model
    r = lstm_probe.export(d / "model.zip", tmp_path / "p.pt", env_id=ENV_ID, episodes=1)
    assert r.format == "torchscript" and r.spec.obs_shape == (7,) and max(r.errors.values()) < 1e-5
