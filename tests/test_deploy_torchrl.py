"""`lstm-probe export` and `replay` of TorchRL policies (issue #49): the run.model.pt `lstm-probe run --framework
torchrl` saves (LSTM) and one of the same layout holding a GRU, to ONNX and TorchScript; each file reloaded with
onnxruntime / torch.jit (not through lstm-probe) agrees with TorchRL's own policy (its actor and critic in
TorchRL's env.rollout, the state carried by the env's primer, reset by is_init) over recorded episodes; replay
names a correct loop, each planted bug and other weights; a hostile checkpoint is refused in one line."""

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

pytest.importorskip("torchrl")
pytest.importorskip("onnxruntime")

import pyarrow as pa
import pyarrow.parquet as pq
from tensordict import TensorDict
from torchrl.data import OneHot
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import set_recurrent_mode

import lstm_probe
from lstm_probe import BadInput
from lstm_probe.integrations.torchrl.train import build, modules
from lstm_probe.integrations.torchrl.train import run as torchrl_run
from tests.deployed import file_run, relative
from tests.refusals import bounded_cli, one_line_error, refused_within

ENV_ID = "CartPole-v1"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
EPISODES, STEPS = 5, 40  # recorded episodes, each cut at STEPS


def _save(path: Path, actor, critic, cell: str, hidden: int = 8) -> Path:
    """A checkpoint in the layout train.run saves (run.model.pt)."""
    config = {"env_id": ENV_ID, "hidden_size": hidden, "num_layers": 1, "cell": cell}
    torch.save(
        {"lstm_probe": "torchrl", "config": config, "actor": actor.state_dict(), "critic": critic.state_dict()}, path
    )
    return path


def _policy(seed: int, cell: str, scale: float = 1.0):
    """build()'s actor and critic (its modules()), seeded; ``scale``: the recurrent weights scaled, so that
    the state sways the actions (an untrained policy's barely depend on it)."""
    torch.manual_seed(seed)
    actor, critic, rnn = modules(4, OneHot(2), hidden_size=8, cell=cell)
    with torch.no_grad():
        for p in rnn.parameters():
            p.mul_(scale)
    return actor, critic


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("torchrl")
    r = torchrl_run(ENV_ID, d / "lstm.parquet", steps=256, n_steps=64, hidden_size=8, n_epochs=1)
    gru = _save(d / "gru.model.pt", *_policy(0, "gru"), "gru")  # `run --framework torchrl` trains LSTMs
    return d, {"lstm": r.model, "gru": gru}


def _torchrl_rollout(path: Path):
    """TorchRL's own policy of a checkpoint: build()'s env and modules, the weights loaded, env.rollout with the
    deterministic action (the env's primer carries the state, InitTracker's is_init resets it); the values
    from the critic in recurrent mode over the rollout. The first EPISODES episodes: obs, starts, actions
    (indices), values, new states (layers, step, hidden)."""
    saved = torch.load(path, weights_only=True)
    c = saved["config"]
    env, actor, critic, rnn = build(
        ENV_ID, n_envs=1, hidden_size=c["hidden_size"], seed=0, num_layers=c["num_layers"], cell=c["cell"]
    )
    actor.load_state_dict(saved["actor"])
    critic.load_state_dict(saved["critic"])
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        td = env.rollout(20 * EPISODES * STEPS, actor, break_when_any_done=False)
        new = np.stack([td[k].numpy() for k in rnn.out_keys[1:]])  # (states, step, layers, hidden), the actor's
        with set_recurrent_mode(True):
            critic(td)  # (its recurrent-mode states are not per step: the actor's were kept above)
    env.close()
    starts = td["is_init"].squeeze(-1).numpy()
    end = np.flatnonzero(starts)[EPISODES] if starts.sum() > EPISODES else len(starts)
    assert starts[:end].sum() == EPISODES
    new = new[:, :end]
    return (
        td["observation"][:end].numpy(),
        starts[:end],
        td["action"][:end].argmax(-1).numpy(),
        td["state_value"][:end].numpy()[:, 0],
        new.transpose(0, 2, 1, 3),
    )


@pytest.mark.parametrize("fmt", ["onnx", "pt"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_export_agrees_with_torchrls_own_policy(checkpoints, cell, fmt):
    d, saved = checkpoints
    out = d / f"{cell}.{fmt}"
    r = lstm_probe.export(saved[cell], out, env_id=ENV_ID, episodes=EPISODES, force=True)
    assert r.spec.cell == cell and r.spec.variant == "shared" and r.spec.action == "discrete"
    assert max(r.errors.values()) < 1e-5, r.errors
    states = ["h", "c"] if cell == "lstm" else ["h"]
    assert [n for n, _, _ in r.spec.inputs()] == ["obs", "episode_start", *states]
    obs, starts, actions, values, new = _torchrl_rollout(saved[cell])
    got_actions, got_values, got_new, meta = file_run(out, obs, starts)
    assert meta["cell"] == cell and meta["action"] == "discrete"
    assert np.array_equal(got_actions, actions)
    assert relative(got_values, values) <= 1e-5, relative(got_values, values)
    assert relative(got_new, new) <= 1e-5, relative(got_new, new)
    # the state matters: the same file from zeros at every step parts from TorchRL's values
    _, zero_values, _, _ = file_run(out, obs, np.ones_like(starts))
    assert relative(zero_values, values) > 1e-3


def test_export_takes_the_policy_build_makes(checkpoints, tmp_path):
    """The live (actor, critic) pair, as build() returns it, exports as its checkpoint does."""
    actor, critic = _policy(0, "gru")
    r = lstm_probe.export((actor, critic), tmp_path / "live.onnx", env_id=ENV_ID, episodes=2)
    assert r.spec.cell == "gru" and max(r.errors.values()) < 1e-5
    with pytest.raises(BadInput, match="one shared LSTMModule or GRUModule"):
        lstm_probe.export((actor, _policy(1, "gru")[1]), tmp_path / "two.onnx", env_id=ENV_ID, episodes=1)


def _record(bug: str, actor, episodes: int = EPISODES, steps: int = STEPS):
    """A deployment loop written with TorchRL's own actor on TensorDicts, with one planted bug; the trace it
    records (env, step, obs, action index, episode_start)."""
    rnn = actor.module[0].module[0]
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
            action = int(td["action"].argmax(-1)[0])
            rows.append({"env": 0, "step": len(rows), "obs": obs.astype(np.float32), "action": action})
            rows[-1]["episode_start"] = t == 0
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
    columns = {k: [r[k] for r in rows] for k in rows[0]}
    return pa.table({**columns, "obs": [list(map(float, o)) for o in columns["obs"]]})


BUGS = {
    "correct": "correct",
    "not fed": "state not fed back",
    "every step": "reset every step",
    "no reset": "not reset at episode starts",
    "swapped": "h and c swapped",
}


@pytest.fixture(scope="module")
def memory_policy(tmp_path_factory):
    """An LSTM policy whose actions depend on its state (the recurrent weights scaled), saved and exported."""
    d = tmp_path_factory.mktemp("torchrl_replay")
    actor, critic = _policy(0, "lstm", scale=3.0)
    path = _save(d / "memory.model.pt", actor, critic, "lstm")
    lstm_probe.export(path, d / "memory.onnx", env_id=ENV_ID, episodes=1)
    return d, actor, critic, path


@pytest.mark.parametrize("bug", list(BUGS))
def test_replay_names_a_correct_torchrl_loop_and_each_planted_bug(memory_policy, bug):
    d, actor, _, path = memory_policy
    pq.write_table(_record(bug, actor), d / f"{bug}.parquet")
    for policy in (d / "memory.onnx", path):  # the exported file, or the checkpoint itself
        r = lstm_probe.replay(d / f"{bug}.parquet", policy)
        if bug == "correct":  # a float16 runtime rarely changes a discrete argmax: named beside it
            assert (r.verdict, r.also) == ("correct", ["float16"]), r.also
        elif bug in ("not fed", "every step"):  # the same computation: the state zeroed before each step
            assert (r.verdict, r.also) == ("state not fed back", ["reset every step"]), r.verdict
        else:
            assert r.verdict == BUGS[bug] and r.also == [], (r.verdict, r.also, [(lp.name, lp.agree) for lp in r.loops])
        assert r.parted is None if bug == "correct" else r.parted is not None


def test_replay_says_not_this_policy_for_other_weights(memory_policy):
    """Other weights: the same policy with its action head negated, which prefers the other action wherever
    the policy's correct loop chooses (two actions: another random policy can agree on most steps by chance,
    both preferring one action, which replay calls 'unrecognised')."""
    d, actor, _, path = memory_policy
    other = copy.deepcopy(actor)
    with torch.no_grad():
        for p in other.module[0].module[1].parameters():
            p.neg_()
    pq.write_table(_record("correct", other), d / "other.parquet")
    for policy in (d / "memory.onnx", path):
        r = lstm_probe.replay(d / "other.parquet", policy)
        assert r.verdict == "not this policy", (r.verdict, [(lp.name, lp.agree, lp.steps) for lp in r.loops])
        assert r.loops[0].agree == 0 and r.parted is not None


def _cli(*args, cwd=None):
    cmd = [sys.executable, "-m", "lstm_probe", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120, cwd=cwd)


class _Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


CLI_CASES = ("code.pt", "objects.pt", "types.pt", "cell.pt")


def test_hostile_checkpoints_are_refused_in_one_line(checkpoints, tmp_path):
    _, saved = checkpoints
    good = torch.load(saved["lstm"], weights_only=True)
    config = good["config"]
    cases = {
        "code.pt": (lambda p: p.write_bytes(pickle.dumps(_Boom())), "without unpickling code"),
        "objects.pt": (lambda p: torch.save({**good, "config": _Boom()}, p), "without unpickling code"),
        "types.pt": (
            lambda p: torch.save({**good, "config": {**config, "hidden_size": "8"}}, p),
            "its config is not build()'s arguments",
        ),
        "bool.pt": (lambda p: torch.save({**good, "config": {**config, "num_layers": True}}, p), "its config is not"),
        "cell.pt": (
            lambda p: torch.save({**good, "config": {**config, "cell": "\x1b]0;PWNED\x07"}}, p),
            "its config's cell",
        ),
        "sizes.pt": (
            lambda p: torch.save({**good, "config": {**config, "hidden_size": 1 << 20}}, p),
            "is not what its weights hold",
        ),
        "deep.pt": (  # 1,000 layers stated by thin tensors: refused before anything is built
            lambda p: torch.save(
                {
                    **good,
                    "config": {**config, "num_layers": 1000},
                    "actor": {
                        **good["actor"],
                        **{f"module.0.module.0.lstm.weight_ih_l{i}": torch.zeros(1, 1) for i in range(1, 1000)},
                    },
                },
                p,
            ),
            "weight_ih_l1' is (1, 1), not the (32, 8) build()'s policy holds",
        ),
        "tensors.pt": (lambda p: torch.save({**good, "actor": {"x": 1}}, p), "its actor is not a state dict"),
        "unshared.pt": (
            lambda p: torch.save(
                {**good, "critic": {k: v + 1 if ".lstm." in k else v for k, v in good["critic"].items()}}, p
            ),
            "do not share one LSTM",
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
    refused_within(bounded_cli("export", "fifo.pt", "out.onnx", "--env", ENV_ID, cwd=tmp_path), "not a regular file")
    # replay --policy reads a checkpoint the same way
    pq.write_table(
        pa.table({"step": [0], "obs": [[0.0] * 4], "action": [0], "episode_start": [True]}), tmp_path / "t.parquet"
    )
    one_line_error(_cli("replay", "t.parquet", "--policy", "objects.pt", cwd=tmp_path), "without unpickling code")
    # not a zip, so no TorchScript (a zip): a checkpoint whose pickle holds code, refused as such, with no advice to
    # trust it
    code = one_line_error(_cli("replay", "t.parquet", "--policy", "code.pt", cwd=tmp_path), "without unpickling code")
    assert "--trust-model" not in code
    one_line_error(_cli("replay", "t.parquet", "--policy", "fifo.pt", cwd=tmp_path), "fifo.pt")  # never waited on
    fifo = _cli("replay", "t.parquet", "--policy", "fifo.pt", "--trust-model", cwd=tmp_path)
    one_line_error(fifo, "not a regular file")
    assert not (tmp_path / "pwned.txt").exists() and not (tmp_path / "out.onnx").exists()


def test_a_torchrl_checkpoint_is_not_taken_for_rsl_rls(checkpoints, tmp_path):
    """Both save run.model.pt: TorchRL's mark tells them apart; a .pt without it goes to rsl_rl's loader."""
    from lstm_probe.integrations import deploy_policy

    _, saved = checkpoints
    assert deploy_policy(saved["gru"], False).spec.variant == "shared"  # TorchRL's: one shared GRU
    pytest.importorskip("rsl_rl")
    doc = torch.load(saved["gru"], weights_only=True)
    del doc["lstm_probe"]
    torch.save(doc, tmp_path / "plain.pt")
    with pytest.raises(BadInput, match="is not an rsl_rl checkpoint"):
        deploy_policy(tmp_path / "plain.pt", False)
