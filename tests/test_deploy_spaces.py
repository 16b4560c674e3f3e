"""Observation spaces beyond a flat Box: a CnnLstmPolicy trained on a channel-last image env (arch and export
take the env it was trained on: sb3 transposes its observations to channel-first, and the file agrees with
``model.predict`` on that env); a MultiInputLstmPolicy, whose export ``run`` prints (tests/test_deploy_dict.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env
from tiny_envs import TinyImageEnv

import lstm_probe

ENV_ID = "TinyImageEnv-v0"


@pytest.fixture(scope="module")
def image_model(tmp_path_factory):
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=TinyImageEnv)
    env = make_vec_env(ENV_ID, n_envs=1, seed=0)
    TinyImageEnv.observation_space.seed(0)  # the frames it trains on (a class's space: other tests draw from it too)
    model = RecurrentPPO(
        "CnnLstmPolicy",
        env,
        n_steps=16,
        batch_size=16,
        n_epochs=1,
        seed=0,
        policy_kwargs={"lstm_hidden_size": 8, "features_extractor_kwargs": {"features_dim": 16}},
    )
    model.learn(16)
    assert model.observation_space.shape == (3, 36, 36)  # sb3's VecTransposeImage: channel-first
    path = tmp_path_factory.mktemp("image") / "model.zip"
    model.save(path)
    return model, path


def test_arch_of_an_image_model_zip_takes_its_channel_last_env(image_model):
    _, path = image_model
    a = lstm_probe.arch(path, env_id=ENV_ID)  # was: the env's Box(36, 36, 3) differs from the model's
    assert "features extractor is shared and trained by both losses" in a.verdict


def test_export_of_an_image_model_takes_its_channel_last_env_and_agrees_with_predict(image_model, tmp_path):
    import onnxruntime as ort

    model, path = image_model
    out = tmp_path / "policy.onnx"
    lstm_probe.export(path, out, env_id=ENV_ID, episodes=2)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    assert sess.get_inputs()[0].shape[1:] == [3, 36, 36]
    # the env's own (channel-last) frames: predict transposes them, the file takes them transposed
    frames = np.random.default_rng(0).integers(0, 256, (12, 36, 36, 3), dtype=np.uint8)
    state, pstate = [np.zeros((1, 1, 8), np.float32) for _ in range(4)], None
    for t, frame in enumerate(frames):
        start = np.array([t == 0])
        want, pstate = model.predict(frame[None], state=pstate, episode_start=start, deterministic=True)
        feed = [np.transpose(frame, (2, 0, 1))[None].astype(np.float32), start.astype(np.float32), *state]
        action, _, *state = sess.run(None, dict(zip(names, feed, strict=True)))
        assert action.tolist() == want.tolist()
        assert np.allclose(state[0], pstate[0], atol=1e-5) and np.allclose(state[1], pstate[1], atol=1e-5)


def test_run_of_a_dict_env_prints_the_export_command_and_it_exports(tmp_path):
    """A MultiInputLstmPolicy exports (tests/test_deploy_dict.py): run's last line is the export command, which
    takes the model.zip and the Dict env (was: 'export would refuse it', and export refused)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "NO_COLOR": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    small = ["--steps", "32", "--n-steps", "16", "--batch-size", "16", "--n-epochs", "1", "--hidden-size", "8"]
    argv = [sys.executable, "-m", "lstm_probe", "run", "tiny_envs:TinyDictEnv-v0", *small, "--capture-obs", "-q"]
    r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("export it: lstm-probe export run.model.zip policy.onnx --"), last
    done = lstm_probe.export(tmp_path / "run.model.zip", tmp_path / "p.onnx", env_id="tiny_envs:TinyDictEnv-v0")
    assert [(k.key, k.space, k.start, k.stop) for k in done.spec.obs_keys] == [
        ("flag", "discrete", 0, 2),
        ("pos", "box", 2, 5),
    ]
    # the run's --capture-obs log holds the Dict's observations in the same flat layout: export verifies on them
    log = tmp_path / "run.parquet"
    on_log = lstm_probe.export(tmp_path / "run.model.zip", tmp_path / "q.onnx", log=log, episodes=2, trust_model=True)
    assert on_log.episodes == 2 and max(on_log.errors.values()) < 1e-5


def test_export_refuses_a_dict_of_what_it_does_not_lay_out():
    from gymnasium import spaces

    from lstm_probe.integrations.sb3.exportable import dict_refusal

    box = spaces.Box(-1, 1, (2,), np.float32)
    assert dict_refusal(spaces.Dict({"a": box, "b": spaces.Discrete(3), "c": spaces.MultiBinary(2)})) is None
    image = spaces.Box(0, 255, (3, 36, 36), np.uint8)
    assert "does not take a Dict observation with an image" in dict_refusal(spaces.Dict({"a": box, "i": image}))
    assert "not key 'n'" in dict_refusal(spaces.Dict({"a": box, "n": spaces.Dict({"x": box})}))
    assert "starting at 0" in dict_refusal(spaces.Dict({"d": spaces.Discrete(3, start=1)}))
    assert "empty Dict" in dict_refusal(spaces.Dict({}))


def test_replay_reads_a_channel_last_image_trace_and_refuses_a_flat_one(image_model, tmp_path):
    """A runtime recording the env's own frames (H, W, C), as docs/deploy.md's recorder does (obs.tolist()): replay
    transposes them to the policy's (C, H, W), as sb3 does (was: each frame's values reshaped to (3, 36, 36) as
    they lay, every pixel misplaced, and the verdict not 'correct'). Flat frames do not say their layout: one
    line, exit 2."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.refusals import one_line_error

    model, path = image_model
    starts = np.arange(16) % 8 == 0  # two episodes of 8 steps
    for seed in range(1, 65):  # frames the policy answers with both actions, so that a misread frame shows (an
        # untrained CNN may take one action on most random frames: which ones depends on its initial weights)
        frames = np.random.default_rng(seed).integers(0, 256, (16, 36, 36, 3), dtype=np.uint8)
        actions, state = [], None
        for frame, start in zip(frames, starts, strict=True):
            action, state = model.predict(frame[None], state=state, episode_start=np.array([start]), deterministic=True)
            actions.append(int(action[0]))
        if len(set(actions)) == 2:
            break
    assert len(set(actions)) == 2, "no 16 random frames of 64 draws took both actions"

    def trace(name, obs):
        rows = {"step": list(range(16)), "obs": obs, "action": actions, "episode_start": starts.tolist()}
        pq.write_table(pa.table(rows), tmp_path / name)
        return tmp_path / name

    hwc = trace("hwc.parquet", [f.tolist() for f in frames])
    chw = trace("chw.parquet", [np.transpose(f, (2, 0, 1)).tolist() for f in frames])
    for recorded in (hwc, chw):
        r = lstm_probe.replay(recorded, path, trust_model=True)
        # 16 steps of an untrained CNN: the correct loop agrees at every step (other loops may too: 'cannot tell')
        assert "correct" in [r.verdict, *r.also] and r.parted is None, (recorded.name, r.verdict, r.parted)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "NO_COLOR": "1"}
    flat = trace("flat.parquet", [f.ravel().tolist() for f in frames])
    done = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "replay", str(flat), "--policy", str(path), "--trust-model"],
        capture_output=True,
        text=True,
        env=env,
    )
    one_line_error(done, "obs are flat", "the env's (36, 36, 3) or the policy's (3, 36, 36)", "obs.tolist()")
    odd = trace("odd.parquet", [f.reshape(36, 108).tolist() for f in frames])
    with pytest.raises(lstm_probe.BadInput, match=r"frames of shape \(36, 108\), the policy takes \(3, 36, 36\)"):
        lstm_probe.replay(odd, path, trust_model=True)
    # an exported file states the layout (frame_axes in its metadata): replay of it takes the env's frames too
    onnx = tmp_path / "policy.onnx"
    lstm_probe.export(path, onnx, env_id=ENV_ID, episodes=1, trust_model=True)
    for recorded in (hwc, chw):
        r = lstm_probe.replay(recorded, onnx)
        assert "correct" in [r.verdict, *r.also] and r.parted is None, (recorded.name, r.verdict, r.parted)


def test_a_spec_states_the_env_frames_its_framework_rearranges():
    """The loader says where the framework rearranges an env's frames (sb3's VecTransposeImage), and an exported
    file's metadata keeps it; a file stating anything but a permutation of its obs axes is refused in one line.
    A policy of a flat Box states none (its traces' obs are taken as they come)."""
    from gymnasium import spaces

    from lstm_probe.deploy.spec import Spec
    from lstm_probe.integrations.sb3.deployed import _frame_axes

    assert _frame_axes(spaces.Box(0, 255, (3, 36, 36), np.uint8)) == (2, 0, 1)
    assert _frame_axes(spaces.Box(0, 255, (36, 36, 3), np.uint8)) == ()  # sb3 would not transpose this policy's env
    assert _frame_axes(spaces.Box(-1, 1, (3, 36, 36), np.float32)) == ()  # not an image to sb3 (not uint8)
    assert _frame_axes(spaces.Box(-1, 1, (3,), np.float32)) == ()
    spec = Spec("separate", (3, 4, 5), "discrete", (), 1, 8, "lstm", 2, (2, 0, 1))
    assert spec.frame_shape == (4, 5, 3)
    frames = np.arange(2 * 4 * 5 * 3, dtype=np.float32).reshape(2, 4, 5, 3)
    assert np.array_equal(spec.from_frames(frames), np.transpose(frames, (0, 3, 1, 2)))
    assert Spec.from_json(spec.to_json(), "f") == spec
    old = spec.to_json().replace(', "frame_axes": [2, 0, 1]', "")
    assert '"frame_axes"' not in old and Spec.from_json(old, "f").frame_axes == ()  # exported before it was stored
    for bad in ("[2, 0]", "[0, 0, 1]", '["a", 0, 1]', "[true, 0, 2]", '{"a": 1}', "[2, 0, 1, 3]"):
        with pytest.raises(lstm_probe.BadInput, match=r"states frame_axes .*not a permutation of the obs_shape's 3"):
            Spec.from_json(spec.to_json().replace("[2, 0, 1]", bad), "f")
