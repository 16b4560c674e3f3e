"""rsl_rl checkpoints lstm-probe did not write (issue #49): the `model_*.pt` each rsl_rl release's
`OnPolicyRunner.save` writes, with the `params/agent.yaml` Isaac Lab writes in the run's folder. The files in
tests/data/rsl_rl_versions/ were made by rsl_rl 2.3.3, 3.3.0 and 4.0.1's own code (its make.py), with the
actions and values that code computed over 40 steps of 3 envs; rsl_rl 5's is made here by a real run. Each is
read as its own release ran it (exactly), exported from the command line and the file agrees, replay names a
correct loop and a planted bug, and a hostile agent.yaml is refused in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("rsl_rl")
pytest.importorskip("onnxruntime")
pytest.importorskip("yaml")

import yaml

import lstm_probe
from lstm_probe import BadInput
from lstm_probe.integrations.rsl_rl.deployed import loader
from tests.refusals import bounded_cli, refused_within

DATA = Path(__file__).parent / "data" / "rsl_rl_versions"
VERSIONS = ["v2.3.3", "v3.3.0", "v4.0.1"]  # LSTM 1 layer (runner-level normalisers), GRU 2 layers, LSTM 2 layers
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(version: str, tmp_path: Path) -> Path:
    """A copy of the release's run folder (model_10.pt, params/agent.yaml, recording.npz); its checkpoint."""
    shutil.copytree(DATA / version, tmp_path / version)
    return tmp_path / version / "model_10.pt"


def _starts(dones: np.ndarray) -> np.ndarray:
    """Isaac Lab's play loop resets the envs that ended after each step: an episode starts the step after."""
    return np.concatenate([np.ones_like(dones[:1]), dones[:-1]]).astype(np.float32)


def _loop(step, rec, starts):
    """``step(obs, start, state) -> (action, value, state)`` over the recording, from zero states."""
    actions, values, state = [], [], None
    for t in range(len(rec["obs"])):
        action, value, state = step(rec["obs"][t], starts[t], state)
        actions.append(action)
        values.append(value)
    return np.stack(actions), np.stack(values)


def _close(got, want, rel=1e-5):
    scale = max(float(np.abs(want).max()), 1e-6)
    assert np.abs(got - want).max() <= rel * scale, float(np.abs(got - want).max() / scale)


def _zeros(spec, n):
    return tuple(np.zeros((spec.layers, n, spec.hidden), np.float32) for _ in spec.state_names)


@pytest.mark.parametrize("version", VERSIONS)
def test_each_release_is_read_as_its_own_code_ran_it(version, tmp_path):
    policy = loader(_run(version, tmp_path))
    rec = np.load(DATA / version / "recording.npz")
    starts, n = _starts(rec["dones"]), rec["obs"].shape[1]

    def reference(obs, start, state):
        return policy.reference(obs, start, state if state is not None else _zeros(policy.spec, n))

    def module(obs, start, state):
        with torch.no_grad():
            s = state if state is not None else tuple(map(torch.as_tensor, _zeros(policy.spec, n)))
            action, value, *new = policy.module(torch.as_tensor(obs), torch.as_tensor(start), *s)
        return action.numpy(), value.numpy(), tuple(new)

    for step in (reference, module):  # rsl_rl 5's own models on the renamed weights, and the deployed step
        actions, values = _loop(step, rec, starts)
        _close(actions, rec["actions"], 1e-6)
        _close(values, rec["values"], 1e-6)
    # the state matters: reset at every step the same loop parts from the release's
    actions, _ = _loop(reference, rec, np.ones_like(starts))
    assert not np.allclose(actions, rec["actions"], atol=1e-3)


def _cli(*args, cwd):
    cmd = [sys.executable, "-m", "lstm_probe", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300, cwd=cwd)


SOURCES = {  # what export verifies on: an env of the same width, normal draws, a recorded run (replay's trace)
    "v2.3.3": (("--env", "Pendulum-v1"), "5 fresh episodes of Pendulum-v1"),
    "v3.3.0": (("--synthetic",), "5 episodes of 200 synthetic observations"),
    "v4.0.1": (("--trace", "play.parquet", "--episodes", "100"), "episodes of play.parquet"),
}


@pytest.mark.parametrize("version", VERSIONS)
def test_cli_export_of_each_release_agrees_with_it(version, tmp_path):
    import onnxruntime as ort

    ckpt = _run(version, tmp_path)
    rec = np.load(DATA / version / "recording.npz")
    _trace(ckpt.parent / "play.parquet", rec, rec["actions"])
    flags, where = SOURCES[version]
    r = _cli("export", ckpt.name, "policy.onnx", *flags, cwd=ckpt.parent)
    assert r.returncode == 0, r.stderr
    assert "policy.onnx" in r.stdout and where in " ".join(r.stdout.split()) and r.stderr == ""
    if version == "v4.0.1":  # every episode of the trace: 3 envs, each starting one, and the dones' starts
        assert f"verified on {rec['obs'].size // 3} steps" in r.stdout
    sess = ort.InferenceSession(str(ckpt.parent / "policy.onnx"))
    names = [i.name for i in sess.get_inputs()][2:]
    spec = loader(ckpt).spec

    def step(obs, start, state):
        state = state if state is not None else _zeros(spec, obs.shape[0])
        action, value, *new = sess.run(
            None, {"obs": obs, "episode_start": start, **dict(zip(names, state, strict=True))}
        )
        return action, value, tuple(new)

    actions, values = _loop(step, rec, _starts(rec["dones"]))
    _close(actions, rec["actions"])
    _close(values, rec["values"])


def _trace(path: Path, rec, actions) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    steps, n = rec["obs"].shape[:2]
    starts = _starts(rec["dones"]).astype(bool)
    rows = {
        "env": np.repeat(np.arange(n), steps),
        "step": np.tile(np.arange(steps), n),
        "obs": list(rec["obs"].transpose(1, 0, 2).reshape(n * steps, -1)),
        "action": list(np.asarray(actions).transpose(1, 0, 2).reshape(n * steps, -1)),
        "episode_start": starts.T.reshape(-1),
    }
    pq.write_table(pa.table(rows), path)
    return path


def test_replay_of_an_isaac_lab_checkpoint_names_the_loop(tmp_path):
    """The release's own actions are `correct`; a loop that zeroes the state every step is named; another
    run's weights are `not this policy`."""
    ckpt = _run("v2.3.3", tmp_path)
    rec = np.load(DATA / "v2.3.3" / "recording.npz")
    policy = loader(ckpt)
    n = rec["obs"].shape[1]
    zeros, _ = _loop(lambda o, s, st: policy.reference(o, s, _zeros(policy.spec, n)), rec, _starts(rec["dones"]))
    for name, actions in (("correct", rec["actions"]), ("state not fed back", zeros)):
        r = lstm_probe.replay(_trace(tmp_path / f"{name}.parquet", rec, actions), ckpt)
        assert r.verdict == name, [(lp.name, lp.agree) for lp in r.loops]
    other = _run("v4.0.1", tmp_path)  # same sizes (3 observations, 1 action, hidden 8), other weights
    assert lstm_probe.replay(tmp_path / "correct.parquet", other).verdict == "not this policy"


def test_rsl_rl_5_checkpoint_with_isaac_labs_agent_yaml(tmp_path):
    """rsl_rl 5's OnPolicyRunner.save (no configuration inside) with an agent.yaml naming `RNNModel` as Isaac Lab's
    does: read as the same checkpoint with lstm-probe's configuration inside."""
    from lstm_probe.integrations.rsl_rl.train import run as rsl_run

    r = rsl_run("Pendulum-v1", tmp_path / "run.parquet", steps=64, n_envs=2, n_steps=8, hidden_size=8, rnn_type="gru")
    saved = torch.load(r.model, weights_only=True)
    cfg = saved["infos"]["lstm_probe"]["cfg"]
    run = tmp_path / "logs" / "rsl_rl" / "pendulum" / "2026-12-04_10-00-00"
    (run / "params").mkdir(parents=True)
    torch.save({**saved, "infos": None}, run / "model_2.pt")
    agent = {"seed": 1, "actor": {**cfg["actor"], "class_name": "RNNModel"}, "critic": {**cfg["critic"]}}
    agent["critic"]["class_name"] = "rsl_rl.models:RNNModel"
    (run / "params" / "agent.yaml").write_text(yaml.dump(agent, sort_keys=False))
    ours, theirs = loader(r.model), loader(run / "model_2.pt")
    rng = np.random.default_rng(0)
    obs, start = rng.normal(size=(4, 3)).astype(np.float32), np.array([1, 0, 0, 1], np.float32)
    state = _zeros(ours.spec, 4)
    for a, b in zip(ours.reference(obs, start, state), theirs.reference(obs, start, state), strict=True):
        for x, y in zip(a if isinstance(a, tuple) else [a], b if isinstance(b, tuple) else [b], strict=True):
            np.testing.assert_array_equal(x, y)
    e = _cli("export", "model_2.pt", "policy.onnx", "--env", "Pendulum-v1", cwd=run)
    assert e.returncode == 0 and (run / "policy.onnx").exists(), e.stderr


def test_export_takes_one_source_of_episodes(tmp_path):
    ckpt = _run("v2.3.3", tmp_path)
    for flags in ((), ("--synthetic", "--env", "Pendulum-v1")):
        line = refused_within(bounded_cli("export", ckpt.name, "out.onnx", *flags, cwd=ckpt.parent), "pass one of")
        assert "--synthetic" in line and "--trace" in line


def test_hostile_or_missing_agent_yaml_is_refused_in_one_line(tmp_path):
    ckpt = _run("v3.3.0", tmp_path)
    agent = ckpt.parent / "params" / "agent.yaml"
    good = yaml.safe_load(agent.read_text())
    args = ("export", ckpt.name, "out.onnx", "--env", "Pendulum-v1")
    cases = {
        # a Python object tag is read as nothing, never built: os.system is not called
        "code": ("activation: !!python/object/apply:os.system ['echo pwned > pwned.txt']\n", "activation is not one"),
        "escape": (yaml.dump({**good, "policy": {**good["policy"], "activation": "\x1b]0;PWNED\x07"}}), "activation"),
        "class": (yaml.dump({**good, "policy": {**good["policy"], "class_name": "os.system"}}), "not an ActorCritic"),
        "syntax": ("policy: [unclosed\n", "is not valid YAML at line"),
        "list": ("- 1\n- 2\n", "not an agent configuration"),
        "big": ("# " + "x" * (1 << 20) + "\n", "larger than 1 MiB"),
        # nested aliases (a YAML "billion laughs") are shared, never expanded
        "laughs": (
            "a: &a [x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                for p, c in zip("abcdefgh", "bcdefghi", strict=True)
            ),
            "not an ActorCriticRecurrent",
        ),
    }
    for name, (text, words) in cases.items():
        if name == "code":
            text = yaml.dump({**good, "policy": {**good["policy"], "activation": None}}).replace(
                "activation: null", "activation: !!python/object/apply:os.system ['echo pwned > pwned.txt']"
            )
        agent.write_text(text)
        refused_within(bounded_cli(*args, cwd=ckpt.parent), words)
    agent.unlink()
    os.mkfifo(agent)
    refused_within(bounded_cli(*args, cwd=ckpt.parent), "not a regular file")
    agent.unlink()
    line = refused_within(bounded_cli(*args, cwd=ckpt.parent), "holds no policy configuration", "params/agent.yaml")
    assert "model_10.pt" in line
    assert not (ckpt.parent / "pwned.txt").exists() and not (ckpt.parent / "out.onnx").exists()
    with pytest.raises(BadInput, match="holds no policy configuration"):
        loader(ckpt)


@pytest.mark.parametrize("version", ["v3.3.0", "v4.0.1"])  # GRU (2 layers), LSTM (2 layers)
def test_replay_of_rsl_rls_own_torchscript_policy(version, tmp_path):
    """The policy.pt rsl_rl's exporter writes (OnPolicyRunner.export_policy_to_jit: torch.jit.script of
    RNNModel.as_jit, the state in its buffers) replays with --trust-model: the release's own actions are `correct`,
    a loop that never feeds the state back is named; without --trust-model it is refused (it is code)."""
    from lstm_probe.integrations.rsl_rl.deployed import models_of

    ckpt = _run(version, tmp_path)
    actor, _ = models_of(ckpt)
    torch.jit.script(actor.as_jit()).save(str(ckpt.parent / "policy.pt"))
    rec = np.load(DATA / version / "recording.npz")
    policy = loader(ckpt)
    n = rec["obs"].shape[1]
    zeros, _ = _loop(lambda o, s, st: policy.reference(o, s, _zeros(policy.spec, n)), rec, _starts(rec["dones"]))
    for name, actions in (("correct", rec["actions"]), ("state not fed back", zeros)):
        trace = _trace(tmp_path / f"{name}.parquet", rec, actions)
        r = lstm_probe.replay(trace, ckpt.parent / "policy.pt", trust_model=True)
        assert r.verdict == name, [(lp.name, lp.agree) for lp in r.loops]
        assert r.envs == 3 and r.steps == rec["obs"].shape[0] * 3
        assert ("h and c swapped" in [lp.name for lp in r.loops]) == (policy.spec.cell == "lstm")
    line = refused_within(
        bounded_cli("replay", "correct.parquet", "--policy", ckpt.parent / "policy.pt", cwd=tmp_path), "--trust-model"
    )
    assert "TorchScript" in line
    r = _cli("replay", "correct.parquet", "--policy", ckpt.parent / "policy.pt", "--trust-model", cwd=tmp_path)
    assert r.returncode == 0 and "correct" in r.stdout and r.stderr == "", r.stdout + r.stderr
