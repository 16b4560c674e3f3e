"""The memory horizon (issue 27): exact oracles on hand-built LSTMs, training untouched, the report's section."""

import random

import numpy as np
import pytest
import torch
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env

from lstm_probe import ProbeCallback
from lstm_probe.contract import Capabilities
from lstm_probe.errors import BadInput
from lstm_probe.integrations.sb3.memory import lags, reach, sample_steps
from lstm_probe.log.reader import read_info
from lstm_probe.report import summarize
from lstm_probe.report.sections.memory import Memory, MemorySection, horizon

KW = {"n_steps": 32, "batch_size": 16, "n_epochs": 2}


def make(policy_kwargs=None, n_envs=1, **kw):
    env = make_vec_env("Pendulum-v1", n_envs=n_envs, seed=0)
    pk = {"lstm_hidden_size": 8, **(policy_kwargs or {})}
    return RecurrentPPO("MlpLstmPolicy", env, seed=0, policy_kwargs=pk, **{**KW, **kw})


def pin(lstm, forget, recurrent_zero=True, integrator=False):
    """Gates in nn.LSTM order (input, forget, cell, output): the forget gate's bias set to ``forget``."""
    H = lstm.hidden_size
    with torch.no_grad():
        for layer in range(lstm.num_layers):
            b_ih, b_hh = getattr(lstm, f"bias_ih_l{layer}"), getattr(lstm, f"bias_hh_l{layer}")
            w_ih, w_hh = getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")
            b_hh.zero_()
            b_ih[H : 2 * H] = forget
            if recurrent_zero:
                w_hh.zero_()
            if integrator:  # c_t = c_{t-1} + sigmoid(-8) * 1: a clock that never forgets
                w_ih.zero_()
                b_ih[:H] = -8.0
                b_ih[2 * H : 3 * H] = 1e4
                b_ih[3 * H :] = 1e4


def records(path):
    return read_info(path).metadata["memory"]


def curve(mem, iteration, module, metric):
    r = mem["records"]
    idx = [i for i in range(len(r["k"])) if r["iteration"][i] == iteration and r["module"][i] == module]
    return [r["k"][i] for i in idx], [r[metric][i] for i in idx]


def test_helpers():
    assert lags(32) == [1, 2, 4, 8, 16, 32]
    assert lags(48) == [1, 2, 4, 8, 16, 32, 48]
    assert sample_steps(32, 16)[-1] == 31 and len(sample_steps(32, 16)) == 16
    starts = np.zeros((6, 2))
    starts[0, 0] = starts[3, 0] = 1
    r = reach(starts)
    assert r[:, 0].tolist() == [0, 1, 2, 0, 1, 2]  # back to the episode start, never across it
    assert r[:, 1].tolist() == [1, 2, 3, 4, 5, 6]  # no start: back to the state before the rollout
    assert horizon([1, 2, 4], [1.0, 0.5, 0.01], 1e-8) == {"horizon": 4, "unused": False, "beyond": False, "max_k": 4}
    assert horizon([1, 2], [1e-12, 0.0], 1e-8)["unused"]
    assert horizon([1, 2, 4], [1.0, 0.9, 0.8], 1e-8)["beyond"]
    with pytest.raises(BadInput):
        ProbeCallback("x.parquet", memory_every=2)
    with pytest.raises(BadInput):
        ProbeCallback("x.parquet", memory=True, memory_every=0)


def test_recent_horizons_are_the_texts_last_span():
    """25 measured iterations whose horizons change too often for runs: the text's 8 spans of them (the last
    21-24), and the finding on the last iteration's outlier counts that same span: 3 of its 4 iterations at ~4."""
    said = [8 if i % 2 == 0 else 16 for i in range(21)] + [4, 4, 4, 2]
    fixed = {"metric": "kl", "effect_1": 1.0, "unused": False, "beyond": False, "max_k": 64}
    latest = {"iteration": 24, "metric": "kl", "k": [1, 2], "effect": [1.0, 0.01], "pairs": [16, 16]}
    data = MemorySection(
        measured=True,
        modules=["actor"],
        horizons=[{"iteration": i, "module": "actor", "horizon": h} | fixed for i, h in enumerate(said)],
        latest={"actor": latest | {"horizon": 2, "unused": False, "beyond": False, "max_k": 2}},
    )
    section = Memory()
    assert section.findings(data) == [
        "actor: actions depend on the last ~2 steps (iteration 24; ~4 at 3 of the last 4 measured iterations)"
    ]
    panel = section.text(data, Capabilities())[0]
    assert panel.lines[0].splitlines()[-1] == (
        "horizon by iteration, actor (8 spans of the 25 measured iterations: the most common horizon, its range in "
        "brackets; --json has every one): 0-2: 8 (8 to 16); 3-5: 16 (8 to 16); 6-8: 8 (8 to 16); 9-11: 16 (8 to "
        "16); 12-14: 8 (8 to 16); 15-17: 16 (8 to 16); 18-20: 8 (8 to 16); 21-24: 4 (2 to 4)"
    )
    data.horizons[-3]["horizon"] = 16  # 4, 16, 4, 2: no horizon holds more than half the span
    assert "of the last" not in section.findings(data)[0]


@pytest.mark.parametrize(
    "policy_kwargs", [{}, {"shared_lstm": True, "enable_critic_lstm": False}, {"n_lstm_layers": 2}]
)
def test_forget_gate_shut_is_memory_unused(tmp_path, policy_kwargs):
    model = make(policy_kwargs)
    for lstm in (model.policy.lstm_actor, model.policy.lstm_critic):
        if lstm is not None:
            pin(lstm, -1e4)
    model.learn(32, callback=ProbeCallback(tmp_path / "m.parquet", memory=True))  # one rollout: these weights
    mem = records(tmp_path / "m.parquet")
    assert mem["modules"] == (["actor"] if policy_kwargs.get("shared_lstm") else ["actor", "critic"])
    for module, metric in (("actor", "kl"), ("critic", "value_rel")):
        if module not in mem["modules"]:
            continue
        ks, effects = curve(mem, 0, module, metric)
        assert ks[0] == 1 and len(ks) >= 4
        assert max(effects) < (1e-12 if metric == "kl" else 1e-6), (module, effects)  # float rounding only
    rep = summarize(tmp_path / "m.parquet")
    assert set(rep.memory.latest) == {"actor", "critic"}  # a shared LSTM's values (the critic's) too
    assert all(c["unused"] and c["horizon"] == 0 for c in rep.memory.latest.values())
    assert any("do not depend on its recurrent state" in f for f in rep.findings)
    assert rep.to_dict()["memory"]["measured"] is True


def test_integrator_remembers_beyond_the_rollout(tmp_path):
    model = make(learning_rate=0.0)  # the weights stay as built (the measurement at a later rollout sees them)
    for lstm in (model.policy.lstm_actor, model.policy.lstm_critic):
        pin(lstm, 1e4, integrator=True)
    model.learn(96, callback=ProbeCallback(tmp_path / "m.parquet", memory=True))
    mem = records(tmp_path / "m.parquet")
    for module, metric in (("actor", "kl"), ("critic", "value_rel")):
        ks, effects = curve(mem, 2, module, metric)  # mid-episode: the state before the rollout is 64 steps old
        assert ks[-1] == 32, ks  # reaches back to the state before the rollout
        h = horizon(ks, effects, 1e-12)
        assert h["beyond"] and not h["unused"], (module, effects)
    rep = summarize(tmp_path / "m.parquet")
    assert rep.memory.latest["critic"]["beyond"]
    assert any("further back than the 32 steps measured" in f for f in rep.findings)


def state(model):
    return (
        {k: v.clone() for k, v in model.policy.state_dict().items()},
        torch.get_rng_state(),
        np.random.get_state()[1].copy(),
        random.getstate(),
        model.num_timesteps,
    )


@pytest.mark.parametrize("policy_kwargs,n_envs", [({}, 1), ({"enable_critic_lstm": False}, 2)])
def test_training_untouched(tmp_path, policy_kwargs, n_envs):
    runs = []
    for memory in (False, True):
        torch.manual_seed(1)
        np.random.seed(1)
        random.seed(1)
        model = make(policy_kwargs, n_envs)
        calls = []
        model.policy.lstm_actor.register_forward_hook(lambda m, a, o, calls=calls: calls.append(tuple(o[0].shape)))
        model.learn(96, callback=ProbeCallback(tmp_path / f"{memory}.parquet", memory=memory))
        runs.append((state(model), calls))
    (a, ca), (b, cb) = runs
    assert a[0].keys() == b[0].keys() and all(torch.equal(a[0][k], b[0][k]) for k in a[0])
    assert torch.equal(a[1], b[1]) and np.array_equal(a[2], b[2]) and a[3] == b[3] and a[4] == b[4]
    assert ca == cb  # the user's hook saw no call of the measurement
    assert "memory" not in read_info(tmp_path / "False.parquet").metadata
    assert summarize(tmp_path / "False.parquet").to_dict()["memory"]["measured"] is False
