"""TorchRL continuous-action policies through export and replay: an MLP encoder before a shared LSTMModule or
GRUModule, a NormalParamExtractor head and a TanhNormal (as TorchRL's examples build a PPO policy for
Pendulum), given as a ClipPPOLoss or an (actor, critic) pair; checked against TorchRL's own env.rollout
under DETERMINISTIC exploration, with real TorchRL, onnxruntime and torch.jit."""

from __future__ import annotations

import copy
import json
import re

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("torchrl")
pytest.importorskip("onnxruntime")

import torch
from tensordict import TensorDict
from tensordict.nn import AddStateIndependentNormalScale, NormalParamExtractor
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import nn
from torchrl.data import Bounded
from torchrl.envs import Compose, DoubleToFloat, GymEnv, InitTracker, StepCounter, TransformedEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import (
    MLP,
    GRUModule,
    IndependentNormal,
    LSTMModule,
    ProbabilisticActor,
    TanhDelta,
    TanhNormal,
    ValueOperator,
    set_recurrent_mode,
)
from torchrl.objectives import ClipPPOLoss

import lstm_probe
from lstm_probe.errors import BadInput
from lstm_probe.integrations.torchrl.deployed import loader
from tests.deployed import file_run, relative

DISTRIBUTION_CHECKS = False  # what TorchRL sets on import (tests/conftest.py; TanhNormal's support fails them)
ENV_ID = "Pendulum-v1"
EPISODES, STEPS = 5, 40  # replay's recorded episodes, each cut at STEPS
SPEC = Bounded(-2.0, 2.0, (1,))  # Pendulum's torque


def _policy(seed: int, cell: str, scale: float = 3.0):
    """(actor, critic, recurrent module): an MLP encoder, the recurrent module, a NormalParamExtractor head to a
    TanhNormal on Pendulum's bounds; a critic of the same encoder and recurrent module and an MLP value head.
    ``scale``: the recurrent weights scaled, so that the state sways the actions."""
    torch.manual_seed(seed)
    encoder = Mod(
        MLP(in_features=3, out_features=16, num_cells=[16], activation_class=nn.Tanh),
        in_keys=["observation"],
        out_keys=["features"],
    )
    cls = LSTMModule if cell == "lstm" else GRUModule
    rnn = cls(input_size=16, hidden_size=8, in_key="features", out_key="embed")
    head = Mod(nn.Sequential(nn.Linear(8, 2), NormalParamExtractor()), in_keys=["embed"], out_keys=["loc", "scale"])
    actor = ProbabilisticActor(
        Seq(encoder, rnn, head),
        in_keys=["loc", "scale"],
        spec=SPEC,
        distribution_class=TanhNormal,
        distribution_kwargs={"low": SPEC.space.low, "high": SPEC.space.high},
        return_log_prob=True,
    )
    critic = Seq(encoder, rnn, ValueOperator(MLP(in_features=8, out_features=1, num_cells=[8]), in_keys=["embed"]))
    with torch.no_grad():
        for p in rnn.parameters():
            p.mul_(scale)
    return actor, critic, rnn


def _torchrl_rollout(actor, critic, rnn):
    """TorchRL's own policy: GymEnv with InitTracker and the module's primer, env.rollout with the
    deterministic action over EPISODES whole episodes; the values from the critic in recurrent mode over the
    rollout. obs, starts, actions, values, new states (states, layers, step, hidden)."""
    env = TransformedEnv(GymEnv(ENV_ID), Compose(InitTracker(), StepCounter(), DoubleToFloat()))
    env.append_transform(rnn.make_tensordict_primer())
    env.set_seed(0)
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        td = env.rollout(200 * EPISODES, actor, break_when_any_done=False)
        new = np.stack([td[k].numpy() for k in rnn.out_keys[1:]])  # the actor's new states, per step
        with set_recurrent_mode(True):
            critic(td)
    env.close()
    starts = td["is_init"].squeeze(-1).numpy()
    assert starts.sum() == EPISODES, starts.sum()
    return (
        td["observation"].numpy(),
        starts,
        td["action"].numpy(),
        td["state_value"].numpy()[..., 0],
        new.transpose(0, 2, 1, 3),
    )


@pytest.fixture(scope="module")
def losses():
    """A ClipPPOLoss over each cell's policy: what export takes."""
    return {cell: ClipPPOLoss(*_policy(0, cell)[:2]) for cell in ("lstm", "gru")}


@pytest.mark.parametrize("fmt", ["onnx", "pt"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_export_of_a_clip_ppo_loss_agrees_with_torchrls_rollout(losses, cell, fmt, tmp_path):
    loss = losses[cell]
    out = tmp_path / f"{cell}.{fmt}"
    r = lstm_probe.export(loss, out, env_id=ENV_ID, episodes=5)
    assert (r.spec.action, r.spec.action_shape, r.spec.obs_shape, r.spec.cell) == ("box", (1,), (3,), cell)
    assert r.episodes == 5 and max(r.errors.values()) < 1e-5, r.errors
    rnn = loss.actor_network.module[0].module[1]
    obs, starts, actions, values, new = _torchrl_rollout(loss.actor_network, loss.critic_network, rnn)
    got_actions, got_values, got_new, meta = file_run(out, obs, starts)
    assert meta["action"] == "box" and meta["action_shape"] == [1]
    errors = [relative(got_actions, actions), relative(got_values, values), relative(got_new, new)]
    assert max(errors) <= 1e-5, errors
    print(f"{cell} {fmt}: action, value, state relative errors against env.rollout {errors}")
    # the state matters: the same file from zeros at every step parts from TorchRL's actions
    zero_actions, _, _, _ = file_run(out, obs, np.ones_like(starts))
    assert relative(zero_actions, actions) > 1e-3


def test_export_takes_other_normal_heads(tmp_path):
    """No encoder, an AddStateIndependentNormalScale head and an IndependentNormal with tanh_loc; a
    torch.distributions.Normal; a safe actor clamped to its spec: each as the (actor, critic) pair."""
    torch.manual_seed(1)
    for dist, kwargs, safe in ((IndependentNormal, {"tanh_loc": True, "upscale": 2.0}, False), (None, {}, True)):
        rnn = LSTMModule(input_size=3, hidden_size=8, in_key="observation", out_key="embed")
        head = Mod(
            nn.Sequential(nn.Linear(8, 1), AddStateIndependentNormalScale(1)),
            in_keys=["embed"],
            out_keys=["loc", "scale"],
        )
        actor = ProbabilisticActor(
            Seq(rnn, head),
            in_keys=["loc", "scale"],
            spec=SPEC,
            distribution_class=dist or torch.distributions.Normal,
            distribution_kwargs=kwargs,
            safe=safe,
        )
        with torch.no_grad():
            head.module[0].weight.mul_(10.0)  # actions beyond the bounds, which the safe actor clamps
        critic = Seq(rnn, ValueOperator(nn.Linear(8, 1), in_keys=["embed"]))
        r = lstm_probe.export((actor, critic), tmp_path / "other.onnx", env_id=ENV_ID, episodes=1, force=True)
        assert r.spec.action == "box" and max(r.errors.values()) < 1e-5, r.errors
        # a batch of 64 envs at once, the step against TorchRL's own
        policy = loader((actor, critic))
        obs = np.random.default_rng(0).uniform(-8, 8, (64, 3)).astype(np.float32)
        start, state = np.ones(64, np.float32), policy.spec.zero_state(64)
        with torch.no_grad():
            action = policy.module(torch.as_tensor(obs), torch.as_tensor(start), *map(torch.as_tensor, state))[0]
        want = policy.reference(obs, start, state)[0]
        assert np.array_equal(action.numpy(), want) and action.shape == (64, 1)
        assert (np.abs(want) == 2.0).any() == safe  # the safe actor's clamp is met


def _pair_with(encoder=None, critic_encoder=None, dist=TanhNormal, head=None, keys=("loc", "scale")):
    rnn = LSTMModule(input_size=16, hidden_size=8, in_key="features", out_key="embed")
    encoder = encoder or Mod(nn.Linear(3, 16), in_keys=["observation"], out_keys=["features"])
    head = head or Mod(nn.Sequential(nn.Linear(8, 2), NormalParamExtractor()), ["embed"], ["loc", "scale"])
    actor = ProbabilisticActor(Seq(encoder, rnn, head), in_keys=list(keys), spec=SPEC, distribution_class=dist)
    critic = Seq(critic_encoder or encoder, rnn, ValueOperator(nn.Linear(8, 1), in_keys=["embed"]))
    return actor, critic


class _Mine(nn.Module):
    def forward(self, x):
        return x


def test_unknown_modules_and_distributions_are_refused_in_one_line(tmp_path):
    cases = {
        "does not run a LayerNorm": _pair_with(
            Mod(nn.Sequential(nn.Linear(3, 16), nn.LayerNorm(16)), ["observation"], ["features"])
        ),
        "does not run a _Mine": _pair_with(
            Mod(nn.Sequential(nn.Linear(3, 16), _Mine()), ["observation"], ["features"])
        ),
        "one shared LSTMModule or GRUModule": _pair_with(
            critic_encoder=Mod(nn.Linear(3, 16), in_keys=["observation"], out_keys=["features"])
        ),
        "not TanhDelta": _pair_with(dist=TanhDelta, head=Mod(nn.Linear(8, 1), ["embed"], ["param"]), keys=["param"]),
        "a NormalParamExtractor or AddStateIndependentNormalScale last": _pair_with(
            head=Mod(nn.Sequential(NormalParamExtractor(), nn.Linear(8, 2)), ["embed"], ["loc", "scale"])
        ),
    }
    for words, pair in cases.items():
        with pytest.raises(BadInput, match=re.escape(words)) as caught:
            lstm_probe.export(pair, tmp_path / "out.onnx", env_id=ENV_ID)
        assert "\n" not in str(caught.value)
    assert not (tmp_path / "out.onnx").exists()


def _record(bug: str, actor, episodes: int = EPISODES, steps: int = STEPS):
    """A deployment loop written with TorchRL's own actor on TensorDicts, with one planted bug; the trace it
    records (env, step, obs, action, episode_start)."""
    rnn = next(m for m in actor.modules() if isinstance(m, LSTMModule | GRUModule))
    keys, next_keys = rnn.in_keys[1:-1], rnn.out_keys[1:]
    env, rows, state = gym.make(ENV_ID), [], {}
    for e in range(episodes):
        obs, _ = env.reset(seed=e)
        for t in range(steps):
            is_init = (t == 0 and (e == 0 or bug != "no reset")) or bug == "every step"
            td = TensorDict({"observation": torch.as_tensor(obs[None], dtype=torch.float32)}, batch_size=[1])
            td["is_init"] = torch.tensor([[is_init]])
            if bug != "not fed":
                td.update(state)
            with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
                actor(td)
            state = {k: td[n] for k, n in zip(keys, next_keys, strict=True)}
            if bug == "swapped":
                state = dict(zip(keys, reversed(list(state.values())), strict=True))
            action = td["action"][0].numpy()
            rows.append({"env": 0, "step": len(rows), "obs": obs.astype(np.float32), "action": action})
            rows[-1]["episode_start"] = t == 0
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
    columns = {k: [r[k] for r in rows] for k in rows[0]}
    return pa.table(
        {
            **columns,
            "obs": [list(map(float, o)) for o in columns["obs"]],
            "action": [list(map(float, a)) for a in columns["action"]],
        }
    )


BUGS = {
    "correct": "correct",
    "not fed": "state not fed back",
    "every step": "reset every step",
    "no reset": "not reset at episode starts",
    "swapped": "h and c swapped",
}


@pytest.fixture(scope="module")
def exported(losses, tmp_path_factory):
    d = tmp_path_factory.mktemp("torchrl_continuous_replay")
    lstm_probe.export(losses["lstm"], d / "memory.onnx", env_id=ENV_ID, episodes=1)
    return d, losses["lstm"]


@pytest.mark.parametrize("bug", list(BUGS))
def test_replay_names_a_correct_continuous_loop_and_each_planted_bug(exported, bug):
    d, loss = exported
    pq.write_table(_record(bug, loss.actor_network), d / f"{bug}.parquet")
    for policy in (d / "memory.onnx", loss):  # the exported file, or the ClipPPOLoss itself
        r = lstm_probe.replay(d / f"{bug}.parquet", policy)
        if bug in ("not fed", "every step"):  # the same computation: the state zeroed before each step
            assert (r.verdict, r.also) == ("state not fed back", ["reset every step"]), r.verdict
        else:
            loops = [(lp.name, lp.agree) for lp in r.loops]
            assert (r.verdict, r.also) == (BUGS[bug], []), (r.verdict, r.also, loops)
        assert r.parted is None if bug == "correct" else r.parted is not None


def test_replay_says_not_this_policy_for_other_weights(exported):
    """The same policy with its action head negated: its actions are the correct loop's, negated."""
    d, loss = exported
    other = copy.deepcopy(loss.actor_network)
    with torch.no_grad():
        for p in other.module[0].module[2].module[0].parameters():
            p.neg_()
    pq.write_table(_record("correct", other), d / "other.parquet")
    r = lstm_probe.replay(d / "other.parquet", d / "memory.onnx")
    assert r.verdict == "not this policy", (r.verdict, [(lp.name, lp.agree, lp.steps) for lp in r.loops])


def test_cli_run_export_replay_of_a_continuous_torchrl_run(tmp_path):
    """`run Pendulum-v1 --framework torchrl` trains a TanhNormal policy and saves it with its bounds; `export`
    from the command line writes a file that agrees with TorchRL's own rollout of the saved policy; replay of
    a correct recording and of a loop that never resets says so; bad bounds are refused in one line."""
    import subprocess
    import sys

    from lstm_probe.integrations.torchrl.deployed import models_of
    from tests.refusals import bounded_cli, refused_within

    def cli(*args):
        cmd = [sys.executable, "-m", "lstm_probe", *map(str, args)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)

    r = cli("run", ENV_ID, "--framework", "torchrl", "--steps", "256", "--n-steps", "64", "--hidden-size", "8")
    assert r.returncode == 0 and (tmp_path / "run.model.pt").exists(), r.stderr
    saved = torch.load(tmp_path / "run.model.pt", weights_only=True)
    assert (saved["config"]["low"], saved["config"]["high"]) == ([-2.0], [2.0])
    e = cli("export", "run.model.pt", "policy.onnx", "--env", ENV_ID)
    assert e.returncode == 0 and e.stderr == "", e.stderr
    actor, critic = models_of(tmp_path / "run.model.pt")
    rnn = next(m for m in actor.modules() if isinstance(m, LSTMModule))
    obs, starts, actions, values, new = _torchrl_rollout(actor, critic, rnn)
    got_actions, got_values, got_new, meta = file_run(tmp_path / "policy.onnx", obs, starts)
    assert meta["action"] == "box" and meta["action_shape"] == [1]
    errors = [relative(got_actions, actions), relative(got_values, values), relative(got_new, new)]
    assert max(errors) <= 1e-5, errors
    for bug in ("correct", "no reset"):
        pq.write_table(_record(bug, actor), tmp_path / f"{bug}.parquet")
        r = cli("replay", f"{bug}.parquet", "--policy", "run.model.pt", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["verdict"] == BUGS[bug], r.stdout[:400]
    torch.save({**saved, "config": {**saved["config"], "low": [3.0]}}, tmp_path / "bad.model.pt")
    refused_within(bounded_cli("export", "bad.model.pt", "x.onnx", "--env", ENV_ID, cwd=tmp_path), "low and high")
