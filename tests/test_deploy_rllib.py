"""`lstm-probe export` and `replay` of RLlib policies: the run.model.pt `lstm-probe run --framework rllib` saves
(RLlib's default LSTM, vf_share_layers=False: the actor's and the critic's encoder, each with its state) and a
module of RLlib's default config with vf_share_layers=True, to ONNX and TorchScript; each file reloaded with
onnxruntime / torch.jit (not through lstm-probe) agrees with RLlib's own module (``forward_inference`` and
``compute_values`` on a batch with ``Columns.STATE_IN``, the initial state at episode starts, as the env
runner's connectors give it) over recorded episodes; replay names a correct loop, planted bugs and other
weights; `run` -> `export` -> `replay` from the command line; a hostile checkpoint is refused in one line.

One training run (a subprocess of the command line, which starts its own Ray): Ray's start is slow."""

from __future__ import annotations

import copy
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("ray.rllib")
pytest.importorskip("onnxruntime")

import pyarrow as pa
import pyarrow.parquet as pq
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

import lstm_probe
from lstm_probe import BadInput
from lstm_probe.integrations import deploy_policy
from lstm_probe.integrations.rllib import deployed
from tests.deployed import file_run, relative
from tests.refusals import bounded_cli, one_line_error, refused_within

pytestmark = pytest.mark.rllib

ENV_ID = "CartPole-v1"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
EPISODES, STEPS = 5, 40  # recorded episodes, each cut at STEPS


def _cli(*args, cwd=None, timeout=120):
    cmd = [sys.executable, "-m", "lstm_probe", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`lstm-probe run --framework rllib` once, from the command line: its directory and what it printed."""
    d = tmp_path_factory.mktemp("rllib")
    small = ["--steps", "256", "--n-envs", "2", "--n-steps", "64", "--batch-size", "64", "--n-epochs", "1"]
    r = _cli("run", ENV_ID, "--framework", "rllib", *small, "--hidden-size", "8", "--out", "run/", cwd=d, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (d / "run.model.pt").is_file(), r.stdout
    return d, r.stdout


def _load(path: Path):
    """RLlib's own module of a checkpoint, built here from its config (not through lstm-probe)."""
    doc = torch.load(path, weights_only=True)
    c = doc["config"]
    model = DefaultModelConfig(
        use_lstm=True,
        lstm_cell_size=c["lstm_cell_size"],
        vf_share_layers=c["vf_share_layers"],
        fcnet_hiddens=c["fcnet_hiddens"],
        fcnet_activation=c["fcnet_activation"],
        head_fcnet_hiddens=c["head_fcnet_hiddens"],
        head_fcnet_activation=c["head_fcnet_activation"],
    )
    obs = gym.spaces.Box(-np.inf, np.inf, (c["obs"],), np.float32)
    module = deployed.build(obs, gym.spaces.Discrete(c["actions"]), model)
    module.load_state_dict(doc["module"])
    return module.eval()


def _module(shared: bool, seed: int = 0, scale: float = 3.0):
    """RLlib's default PPO module for CartPole, seeded; ``scale``: the LSTMs' weights scaled, so that the state
    sways the actions (an untrained policy's barely depend on it)."""
    torch.manual_seed(seed)
    model = DefaultModelConfig(use_lstm=True, lstm_cell_size=8, vf_share_layers=shared, fcnet_hiddens=[16, 16])
    module = deployed.build(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), model)
    with torch.no_grad():
        for n, p in module.named_parameters():
            if ".lstm." in n:
                p.mul_(scale)
    return module.eval()


def _state_in(module, state, fresh: bool):
    """``Columns.STATE_IN`` for one env: the module's initial state at an episode's start (RLlib's
    AddStatesFromEpisodesToBatch), else the last STATE_OUT; with a batch axis."""
    s = module.get_initial_state() if fresh or state is None else state
    return torch.utils._pytree.tree_map(lambda x: x[None], s)


def _rllib_rollout(module):
    """RLlib's own module stepped in the env as its env runner steps it (forward_inference, the deterministic
    action of the inference distribution, STATE_OUT fed back, the initial state at each episode's start): obs,
    starts, actions, values, new states (states, layers, step, hidden) in the file's order."""
    env, rows = gym.make(ENV_ID), []
    state = None
    for e in range(EPISODES):
        obs, _ = env.reset(seed=e)
        for t in range(STEPS):
            batch = {Columns.OBS: torch.as_tensor(obs[None, None]), Columns.STATE_IN: _state_in(module, state, t == 0)}
            with torch.no_grad():
                out = module.forward_inference(batch)
                value = module.compute_values(batch)
                dist = module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS][:, 0])
                action = int(dist.to_deterministic().sample()[0])
            state = torch.utils._pytree.tree_map(lambda x: x[0], out[Columns.STATE_OUT])
            leaves = (
                [state[r][k] for r in ("actor", "critic") for k in "hc"]
                if "actor" in state
                else [state["h"], state["c"]]
            )
            rows.append((obs, t == 0, action, float(value[0, 0]), np.stack([x.numpy() for x in leaves])))
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
    obs, starts, actions, values, new = zip(*rows, strict=True)
    return np.stack(obs), np.array(starts), np.array(actions), np.array(values), np.stack(new, axis=2)


AGREEMENT: dict[str, float] = {}


@pytest.mark.parametrize("fmt", ["onnx", "pt"])
@pytest.mark.parametrize("shared", [False, True])
def test_export_agrees_with_rllibs_own_module(trained, shared, fmt, tmp_path):
    d, _ = trained
    source = _module(True) if shared else d / "run.model.pt"  # the run trains vf_share_layers=False
    module = _module(True) if shared else _load(source)
    out = tmp_path / f"policy.{fmt}"
    r = lstm_probe.export(source, out, env_id=ENV_ID, episodes=EPISODES)
    variant = "shared" if shared else "separate"
    assert r.spec.variant == variant and r.spec.action == "discrete" and r.spec.hidden == 8
    assert max(r.errors.values()) < 1e-5, r.errors
    states = ["h", "c"] if shared else ["h", "c", "h_critic", "c_critic"]
    assert [n for n, _, _ in r.spec.inputs()] == ["obs", "episode_start", *states]
    obs, starts, actions, values, new = _rllib_rollout(module)
    assert starts.sum() == EPISODES
    got_actions, got_values, got_new, meta = file_run(out, obs, starts)
    assert meta["variant"] == variant and meta["action"] == "discrete"
    assert np.array_equal(got_actions, actions)
    assert relative(got_values, values) <= 1e-5, relative(got_values, values)
    assert relative(got_new, new) <= 1e-5, relative(got_new, new)
    AGREEMENT[f"{variant} {fmt}"] = max(relative(got_values, values), relative(got_new, new))
    print(f"\n{variant} {fmt}: values and states within {AGREEMENT[f'{variant} {fmt}']:.2e} relative")
    # the state matters: the same file from zeros at every step parts from RLlib's values
    _, zero_values, _, _ = file_run(out, obs, np.ones_like(starts))
    assert relative(zero_values, values) > 1e-4


def test_a_box_module_exports_its_mean_on_the_bounds(tmp_path):
    """A Gaussian (Box) module: the action is the mean, unsquashed onto the bounds (normalize_actions, RLlib's
    default), as RLlib's connectors hand it to the env; the checkpoint of it reads back the same."""
    torch.manual_seed(0)
    model = DefaultModelConfig(use_lstm=True, lstm_cell_size=8, vf_share_layers=False, fcnet_hiddens=[16])
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    module = deployed.build(gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), space, model)
    r = lstm_probe.export(module, tmp_path / "box.onnx", env_id="Pendulum-v1", episodes=2)
    assert (r.spec.action, r.spec.action_shape) == ("box", (1,)) and max(r.errors.values()) < 1e-5, r.errors
    torch.save(deployed.checkpoint(module), tmp_path / "box.model.pt")
    r = lstm_probe.export(tmp_path / "box.model.pt", tmp_path / "box.pt", env_id="Pendulum-v1", episodes=2)
    assert r.spec.action == "box" and max(r.errors.values()) < 1e-5, r.errors
    # a loop stepping the ONNX file (3 episodes of 30 steps), and the same loop never feeding the state back
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "box.onnx"))
    for bug, verdict in (("correct", "correct"), ("not fed", "state not fed back")):
        env, rows = gym.make("Pendulum-v1"), []
        for e in range(3):
            obs, _ = env.reset(seed=e)
            state = [np.zeros((1, 1, 8), np.float32)] * 4
            for t in range(30):
                start = np.array([float(t == 0)], np.float32)
                feed = {"obs": obs[None].astype(np.float32), "episode_start": start}
                named = dict(zip(["h", "c", "h_critic", "c_critic"], state, strict=True))
                action, _, *new = sess.run(None, {**feed, **named})
                state = new if bug == "correct" else state
                assert -2.0 <= action[0, 0] <= 2.0  # on the Box's bounds
                rows.append({"step": len(rows), "obs": obs.tolist(), "action": action[0].tolist()})
                rows[-1]["episode_start"] = t == 0
                obs, *_ = env.step(action[0])
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "box.parquet")
        r = lstm_probe.replay(tmp_path / "box.parquet", tmp_path / "box.model.pt")
        assert r.verdict == verdict, (r.verdict, [(lp.name, lp.agree, lp.steps) for lp in r.loops])


def _record(bug: str, module, episodes: int = EPISODES, steps: int = STEPS):
    """A deployment loop written with RLlib's own module (forward_inference, STATE_IN/STATE_OUT), with one
    planted bug; the trace it records (env, step, obs, action, episode_start)."""
    env, rows, state = gym.make(ENV_ID), [], None
    for e in range(episodes):
        obs, _ = env.reset(seed=e)
        for t in range(steps):
            fresh = (t == 0 and (e == 0 or bug != "no reset")) or bug in ("not fed", "every step")
            batch = {Columns.OBS: torch.as_tensor(obs[None, None]), Columns.STATE_IN: _state_in(module, state, fresh)}
            with torch.no_grad():
                out = module.forward_inference(batch)
            action = int(out[Columns.ACTION_DIST_INPUTS][0, 0].argmax())
            state = torch.utils._pytree.tree_map(lambda x: x[0], out[Columns.STATE_OUT])
            if bug == "swapped":  # each encoder's h fed as its c and c as h
                state = {r: {"h": s["c"], "c": s["h"]} for r, s in state.items()}
            rows.append({"env": 0, "step": len(rows), "obs": [float(x) for x in obs], "action": action})
            rows[-1]["episode_start"] = t == 0
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
    return pa.Table.from_pylist(rows)


@pytest.fixture(scope="module")
def memory_policy(tmp_path_factory):
    """A module whose actions depend on its state (the LSTMs' weights scaled), saved and exported."""
    d = tmp_path_factory.mktemp("rllib_replay")
    module = _module(False, seed=2)  # (with most seeds an untrained policy pushes one way and falls: no memory)
    path = d / "memory.model.pt"
    torch.save(deployed.checkpoint(module), path)
    lstm_probe.export(path, d / "memory.onnx", env_id=ENV_ID, episodes=1)
    return d, module, path


BUGS = {
    "correct": "correct",
    "not fed": "state not fed back",
    "every step": "reset every step",
    "no reset": "not reset at episode starts",
    "swapped": "h and c swapped",
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_replay_names_a_correct_rllib_loop_and_each_planted_bug(memory_policy, bug):
    d, module, path = memory_policy
    pq.write_table(_record(bug, module), d / f"{bug}.parquet")
    for policy in (d / "memory.onnx", path):  # the exported file, or the checkpoint itself
        r = lstm_probe.replay(d / f"{bug}.parquet", policy)
        loops = [(lp.name, lp.agree, lp.steps) for lp in r.loops]
        if bug == "correct":
            assert r.verdict == "correct" and set(r.also) <= {"float16"}, loops
        elif bug in ("not fed", "every step"):  # the same computation: the state zeroed before each step
            assert (r.verdict, r.also) == ("state not fed back", ["reset every step"]), loops
        else:
            assert r.verdict == BUGS[bug] and r.also == [], loops
        assert r.parted is None if bug == "correct" else r.parted is not None


def test_replay_says_not_this_policy_for_other_weights(memory_policy):
    """Other weights: the same module with its pi head negated, which prefers the other action wherever the
    policy's correct loop chooses."""
    d, module, path = memory_policy
    other = copy.deepcopy(module)
    with torch.no_grad():
        for p in other.pi.parameters():
            p.neg_()
    pq.write_table(_record("correct", other), d / "other.parquet")
    for policy in (d / "memory.onnx", path):
        r = lstm_probe.replay(d / "other.parquet", policy)
        assert r.verdict == "not this policy", (r.verdict, [(lp.name, lp.agree, lp.steps) for lp in r.loops])


def test_cli_run_export_replay(trained):
    """`run` printed where it saved the model and the export line; `export` of it, then `replay` of a loop
    that steps the ONNX file with onnxruntime (state fed back, reset at episode starts): correct."""
    d, printed = trained
    assert "saved the trained model in" in printed and "run.model.pt" in printed
    assert "export it: lstm-probe export run.model.pt policy.onnx --env CartPole-v1" in printed
    r = _cli("export", "run.model.pt", "policy.onnx", "--env", ENV_ID, "--quiet", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "WARNING" not in r.stderr, r.stderr  # RLlib's own notice on building a module is kept quiet
    obs, starts, _, _, _ = _rllib_rollout(_load(d / "run.model.pt"))
    actions, _, _, _ = file_run(d / "policy.onnx", obs, starts)
    rows = [
        {"step": i, "obs": o.tolist(), "action": int(a), "episode_start": bool(s)}
        for i, (o, a, s) in enumerate(zip(obs, actions, starts, strict=True))
    ]
    pq.write_table(pa.Table.from_pylist(rows), d / "robot.parquet")
    r = _cli("replay", "robot.parquet", "--policy", "policy.onnx", cwd=d)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "verdict: correct" in r.stdout, r.stdout
    r = _cli("replay", "robot.parquet", "--policy", "run.model.pt", cwd=d)
    assert r.returncode == 0 and "verdict: correct" in r.stdout, r.stdout + r.stderr


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


CLI_CASES = ("code.pt", "objects.pt", "activation.pt")


def test_hostile_checkpoints_are_refused_in_one_line(trained, tmp_path):
    d, _ = trained
    good = torch.load(d / "run.model.pt", weights_only=True)
    config = good["config"]
    cases = {
        "code.pt": (lambda p: p.write_bytes(pickle.dumps(_Boom())), "without unpickling code"),
        "objects.pt": (lambda p: torch.save({**good, "config": _Boom()}, p), "without unpickling code"),
        "types.pt": (
            lambda p: torch.save({**good, "config": {**config, "lstm_cell_size": "8"}}, p),
            "its config is not what `run` saves",
        ),
        "bool.pt": (lambda p: torch.save({**good, "config": {**config, "obs": True}}, p), "its config is not"),
        "activation.pt": (
            lambda p: torch.save({**good, "config": {**config, "fcnet_activation": "\x1b]0;PWNED\x07"}}, p),
            "its config's fcnet_activation",
        ),
        "sizes.pt": (
            lambda p: torch.save({**good, "config": {**config, "lstm_cell_size": 1 << 15}}, p),
            "is not what its weights hold",
        ),
        "wide.pt": (  # widths stated by the config alone: refused before anything is built
            lambda p: torch.save({**good, "config": {**config, "fcnet_hiddens": [1 << 24] * 64}}, p),
            "is not what its weights hold",
        ),
        "heads.pt": (
            lambda p: torch.save({**good, "config": {**config, "head_fcnet_hiddens": [4096]}}, p),
            "pi head's widths",
        ),
        "tensors.pt": (lambda p: torch.save({**good, "module": {"x": 1}}, p), "its module is not a state dict"),
        "two layers.pt": (
            lambda p: torch.save(
                {**good, "module": {**good["module"], "encoder.actor_encoder.lstm.weight_ih_l1": torch.zeros(1)}}, p
            ),
            "no one-layer LSTM",
        ),
        "action.pt": (
            lambda p: torch.save({**good, "config": {**config, "action": "multi"}}, p),
            "its config's action",
        ),
    }
    for name, (make, words) in cases.items():
        make(tmp_path / name)
        if name in CLI_CASES:  # the command line's refusal: exit 2, one line
            line = refused_within(bounded_cli("export", name, "out.onnx", "--env", ENV_ID, cwd=tmp_path), words)
        else:  # the same refusal, in-process (each subprocess costs seconds of import)
            with pytest.raises(BadInput, match=re.escape(words)) as caught:
                lstm_probe.export(tmp_path / name, tmp_path / "out.onnx", env_id=ENV_ID)
            line = str(caught.value)
            assert "\n" not in line
        assert "\x1b" not in line
    os.mkfifo(tmp_path / "fifo.pt")
    one_line_error(_cli("replay", "t.parquet", "--policy", "fifo.pt", cwd=tmp_path), "fifo.pt")  # never waited on
    assert not (tmp_path / "pwned.txt").exists() and not (tmp_path / "out.onnx").exists()


def test_the_mark_tells_rllib_from_rsl_rl_and_torchrl(trained, tmp_path):
    """rsl_rl, TorchRL and RLlib all save run.model.pt: RLlib's mark sends it to RLlib's loader, an RLModule
    object goes there by its package; without the mark the file goes to rsl_rl's loader."""
    d, _ = trained
    assert deploy_policy(d / "run.model.pt", False).spec.variant == "separate"
    assert deploy_policy(_module(True), False).spec.variant == "shared"
    pytest.importorskip("rsl_rl")
    doc = torch.load(d / "run.model.pt", weights_only=True)
    del doc["lstm_probe"]
    torch.save(doc, tmp_path / "plain.pt")
    with pytest.raises(BadInput, match="is not an rsl_rl checkpoint"):
        deploy_policy(tmp_path / "plain.pt", False)


def test_run_refuses_an_existing_model_before_ray_starts(tmp_path):
    from lstm_probe.integrations.rllib.train import run

    (tmp_path / "run.model.pt").write_bytes(b"earlier")
    with pytest.raises(BadInput, match=r"run\.model\.pt already exists"):
        run(ENV_ID, str(tmp_path / "run"), steps=64)
    assert (tmp_path / "run.model.pt").read_bytes() == b"earlier" and not (tmp_path / "run").exists()
