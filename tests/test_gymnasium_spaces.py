"""The safe model.zip reader reads the spaces every supported gymnasium writes (issue #46).

tests/data/gymnasium_spaces.json holds Pendulum-v1's and CartPole-v1's spaces (and an image Box) as
gymnasium 0.29.1, 1.0.0, 1.2.2 and 1.4.0 write them into a model.zip (made by tests/data/gymnasium_spaces.py
with each version). Each test saves a real RecurrentPPO, puts one version's space entries into its
``data`` and reads it back without ``--trust-model``: gymnasium 1.3 and newer write ``low_repr: null``
until a Box is printed, which the reader once refused (``export``, ``arch``, ``replay --policy``)."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from refusals import one_line_error

from lstm_probe.integrations.sb3 import model_zip

SPACES = json.loads((Path(__file__).parent / "data" / "gymnasium_spaces.json").read_text())
VERSIONS = sorted(SPACES, key=lambda v: tuple(int(x) for x in v.split(".")))
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_the_versions_span_oldest_to_newest():
    assert VERSIONS[0] == "0.29.1" and VERSIONS[-1] == "1.4.0"
    assert SPACES["1.4.0"]["pendulum_obs"]["low_repr"] is None  # what the reader must not take for the bound
    assert isinstance(SPACES["1.2.2"]["pendulum_obs"]["low_repr"], str)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """model.zip of an untrained RecurrentPPO on each env, as saved by the installed gymnasium."""
    from sb3_contrib import RecurrentPPO

    d = tmp_path_factory.mktemp("spaces")
    out = {}
    for env in ("Pendulum-v1", "CartPole-v1"):
        tiny = {"n_steps": 16, "batch_size": 16, "n_epochs": 1, "seed": 0, "policy_kwargs": {"lstm_hidden_size": 8}}
        RecurrentPPO("MlpLstmPolicy", env, device="cpu", **tiny).save(d / f"{env}.zip")
        out[env] = d / f"{env}.zip"
    return out


def _as_written_by(src: Path, dst: Path, obs: dict, act: dict) -> Path:
    """``src`` with its spaces replaced by the given entries (every other member unchanged)."""
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    data = json.loads(members["data"])
    data["observation_space"], data["action_space"] = obs, act
    members["data"] = json.dumps(data).encode()
    with zipfile.ZipFile(dst, "w") as z:
        for name, blob in members.items():
            z.writestr(name, blob)
    return dst


def _same(space, env_space, bounds):
    """``space`` is ``env_space`` with the bounds that gymnasium version's env had (0.29's CartPole: float32's
    largest number where newer versions have inf)."""
    assert type(space) is type(env_space) and space.shape == env_space.shape and space.dtype == env_space.dtype
    if isinstance(space, gym.spaces.Box):
        np.testing.assert_array_equal(space.low, np.array(bounds["low"], space.dtype))
        np.testing.assert_array_equal(space.high, np.array(bounds["high"], space.dtype))
    else:
        assert space.n == bounds["n"] == env_space.n and space.start == env_space.start


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_reads_the_spaces_each_gymnasium_writes(saved, tmp_path, version, env_id):
    key = "pendulum" if env_id.startswith("Pendulum") else "cartpole"
    entries = SPACES[version]
    path = _as_written_by(saved[env_id], tmp_path / "m.zip", entries[f"{key}_obs"], entries[f"{key}_act"])
    model = model_zip.load(path)
    env = gym.make(env_id)
    _same(model.observation_space, env.observation_space, entries["bounds"][f"{key}_obs"])
    _same(model.action_space, env.action_space, entries["bounds"][f"{key}_act"])


def test_an_image_box_printed_in_part_is_refused_naming_env(saved, tmp_path):
    """An 84x84 image's bounds: gymnasium < 1.3 states them as one number, 1.3+ only as numpy's
    summarised print ('...'): refused in one line naming --env, never guessed."""
    entries = SPACES["1.4.0"]
    image = _as_written_by(saved["Pendulum-v1"], tmp_path / "img.zip", entries["image"], entries["pendulum_act"])
    with pytest.raises(model_zip.BadInput, match=r"observation space's bounds are stated in part only .* --env ENV_ID"):
        model_zip.load(image)
    old = SPACES["1.2.2"]["image"]
    assert (old["low_repr"], old["high_repr"]) == ("0", "255")  # what the older versions allow to be read


def cli(*args, cwd):
    cmd = [sys.executable, "-m", "lstm_probe", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=cwd, timeout=300)


def test_export_and_arch_of_a_newest_gymnasium_zip_need_no_trust(saved, tmp_path):
    """The README's own commands on a model.zip whose spaces gymnasium 1.4 wrote."""
    e = SPACES["1.4.0"]
    path = _as_written_by(saved["Pendulum-v1"], tmp_path / "model.zip", e["pendulum_obs"], e["pendulum_act"])
    r = cli("export", path, "policy.onnx", "--env", "Pendulum-v1", "--episodes", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "policy.onnx").is_file()
    r = cli("arch", path, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "lstm_actor" in r.stdout


def test_export_takes_the_spaces_from_env_where_the_zip_lacks_them(saved, tmp_path):
    """An observation Box the zip states only in part: refused without --env, read from the env with it."""
    e = SPACES["1.4.0"]
    obs = {**e["pendulum_obs"], "low": "[-1. ... 8.]", "high": "[1. ... 8.]"}
    path = _as_written_by(saved["Pendulum-v1"], tmp_path / "model.zip", obs, e["pendulum_act"])
    one_line_error(cli("arch", path, cwd=tmp_path), "stated in part only", "pass --env ENV_ID")
    r = cli("export", path, "policy.onnx", "--env", "Pendulum-v1", "--episodes", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
