"""What if (issue 26): counterfactual initial states and burn-in, measured on a copy of the policy during real
RecurrentPPO training; training itself stays bit-identical, and the exact oracles hold."""

import json
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env

import lstm_probe
from lstm_probe import ProbeCallback
from lstm_probe.contract import Capabilities
from lstm_probe.errors import BadInput
from lstm_probe.integrations.sb3_whatif import initial_states, last_starts, run_starts, what_if_settings
from lstm_probe.report.sections.what_if import WhatIf, WhatIfSection

KW = {"n_steps": 32, "batch_size": 16, "n_epochs": 2}
VARIANTS = {
    "separate": {"lstm_hidden_size": 16},
    "shared": {"lstm_hidden_size": 16, "shared_lstm": True, "enable_critic_lstm": False},
    "no_critic_lstm": {"lstm_hidden_size": 16, "enable_critic_lstm": False},
    "two_layers": {"lstm_hidden_size": 16, "n_lstm_layers": 2},
}
TOL = 1e-5


def make(env_id="Pendulum-v1", n_envs=2, policy_kwargs=None, **kw):
    env = make_vec_env(env_id, n_envs=n_envs, seed=0)
    kwargs = {**KW, **kw, "policy_kwargs": policy_kwargs or VARIANTS["separate"]}
    return RecurrentPPO("MlpLstmPolicy", env, seed=0, **kwargs)


def records(path):
    meta = lstm_probe.read_info(path).metadata["what_if"]
    cols = meta["records"]
    return meta, [{c: v[i] for c, v in cols.items()} for i in range(len(cols["alternative"]))]


@pytest.mark.parametrize("variant", ["separate", "shared"])
def test_training_untouched(tmp_path, variant):
    a = make(policy_kwargs=VARIANTS[variant])
    a.learn(192, callback=ProbeCallback(tmp_path / "a.parquet"))
    rng_a, np_a = torch.get_rng_state(), np.random.get_state()
    b = make(policy_kwargs=VARIANTS[variant])
    with ProbeCallback(tmp_path / "b.parquet", what_if=True, burn_in=[2]) as probe:
        b.learn(192, callback=probe)
    rng_b, np_b = torch.get_rng_state(), np.random.get_state()
    assert a.num_timesteps == b.num_timesteps
    pa, pb = a.policy.state_dict(), b.policy.state_dict()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    sa, sb = a.policy.optimizer.state_dict()["state"], b.policy.optimizer.state_dict()["state"]
    for k in sa:
        assert torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) and torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"])
    assert torch.equal(rng_a, rng_b)
    assert np_a[0] == np_b[0] and np.array_equal(np_a[1], np_b[1]) and np_a[2:] == np_b[2:]
    meta, rows = records(probe.path)
    assert meta["burn_in"] == [2, 4, 16, 64] and rows
    assert not b.policy.optimizer._optimizer_step_pre_hooks  # the gradient hook came off with the probe


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_oracle_first_minibatch_and_report(tmp_path, variant):
    model = make(policy_kwargs=VARIANTS[variant])
    with ProbeCallback(tmp_path / "w.parquet", what_if=True) as probe:
        model.learn(192, callback=probe)
    meta, rows = records(probe.path)
    modules = ["actor"] if variant in ("shared", "no_critic_lstm") else ["actor", "critic"]
    assert meta["modules"] == modules
    assert meta["critic"] == {"separate": "lstm", "two_layers": "lstm", "shared": "shared"}.get(variant, "mlp")
    iterations = 192 // (2 * 32)
    # first and last minibatch (of 4) of epochs 0 and 1, every iteration: stored, zero and 3 burn-ins each
    assert len(rows) == iterations * 2 * 2 * 5
    first = [r for r in rows if r["epoch"] == 0 and r["minibatch"] == 0 and r["alternative"] == "stored"]
    assert len(first) == iterations
    for r in first:  # the rollout's own weights: refreshed states are the stored ones
        for m in modules:
            assert r[f"state_{m}"] <= TOL
        assert r["value_abs"] <= TOL and r["kl"] <= TOL and r["ratio_change"] <= TOL
        assert abs(r["policy_loss_delta"]) <= TOL and abs(r["value_loss_delta"]) <= TOL
        assert r["grad_cos_policy"] >= 1 - TOL and r["grad_cos_value"] >= 1 - TOL
    later = [r for r in rows if r["alternative"] == "stored" and (r["epoch"], r["minibatch"]) != (0, 0)]
    assert any(r["state_actor"] > TOL for r in later)  # after optimizer steps, stored states are stale
    zero = [r for r in rows if r["alternative"] == "zero"]
    if variant == "no_critic_lstm":  # the critic has no state to vary
        assert all(r["value_abs"] == 0 for r in rows)
    else:
        assert any(r["value_abs"] > TOL for r in zero)
    rep = lstm_probe.summarize(probe.path)
    assert rep.what_if.measured and rep.what_if.check["ok"] is True
    assert {w["epoch"] for w in rep.what_if.within} == {0, 1}
    assert any("stored states" in f for f in rep.findings)
    doc = json.loads(json.dumps(rep.to_dict()))
    assert doc["what_if"]["by_epoch"][0]["alternative"] == "stored"


def test_learning_rate_zero_stored_equals_refreshed_everywhere(tmp_path):
    """Weights that never change: stored states are refreshed states in every minibatch of every epoch."""
    model = make(learning_rate=0.0)
    with ProbeCallback(tmp_path / "w.parquet", what_if=True) as probe:
        model.learn(128, callback=probe)
    _, rows = records(probe.path)
    stored = [r for r in rows if r["alternative"] == "stored"]
    assert stored and all(r["state_actor"] <= TOL and r["state_critic"] <= TOL and r["kl"] <= TOL for r in stored)
    # the HTML figure of such a run: every value inside symlog's linear range, yet the axes span 0 to at least
    # 1e-5 with ticks at 0 and decades only (ticks at the data's own limits had labels like 4.2e-07 that ran
    # into the next panel)
    from lstm_probe import html_figures

    figs = []
    png = html_figures._png
    html_figures._png = lambda fig: figs.append(fig) or png(fig)
    try:
        assert html_figures._what_if_figure(html_figures._plt(), lstm_probe.summarize(probe.path)) is not None
    finally:
        html_figures._png = png
    for ax in figs[0].axes:
        lo, hi = ax.get_ylim()
        ticks = [t for t in ax.get_yticks() if lo <= t <= hi]
        assert lo <= 0 and hi >= 1e-5 and ticks[0] == 0
        assert all(np.isclose(np.log10(t), round(np.log10(t))) for t in ticks[1:]), ticks


def test_burn_in_reaching_an_episode_start_equals_refreshed():
    """Per sequence start: a burn-in whose window reaches back to an episode start inside the rollout starts
    there from zero, as refreshed states do (sb3 resets at episode starts): the same states."""
    model = make("CartPole-v1", n_envs=3, n_steps=64, batch_size=64)
    model.learn(192)
    buffer, policy = model.rollout_buffer, model.policy
    n_envs, n = 3, 64
    starts = np.asarray(buffer.episode_starts).reshape(-1) > 0.5
    flat = np.arange(n_envs * n)
    env, step = flat // n, flat % n
    last = last_starts(starts, n_envs, n)
    k = 8
    plan = run_starts(step, last, [k])
    with torch.no_grad():
        features = policy.extract_features(torch.as_tensor(buffer.observations))
        stored = (buffer.hidden_states_pi, buffer.cell_states_pi)
        refreshed = initial_states(policy.lstm_actor, features, flat, stored, env, step, *plan["refreshed"], n)
        burned = initial_states(policy.lstm_actor, features, flat, stored, env, step, *plan[f"burn_in_{k}"], n)
    reached = (last >= 0) & (step - k <= last)
    assert reached.sum() > 10 and (~reached & (step > 0)).sum() > 0
    for a, b in zip(refreshed, burned, strict=True):
        assert torch.allclose(a[:, reached], b[:, reached], atol=1e-6)
    gap = (refreshed[0] - burned[0]).abs().amax(dim=(0, 2))
    assert float(gap[torch.from_numpy(~reached & (step > 0))].max()) > 1e-4  # elsewhere they differ: the check can fail


def test_settings_and_unavailable():
    assert what_if_settings(False) is None
    assert what_if_settings(True, 3, [8, 4]) == {"every": 3, "burn_in": (4, 8, 16, 64)}
    for args in [(True, 0, ()), (True, 1, [0]), (False, 2, ()), (False, 1, [8])]:
        with pytest.raises(BadInput):
            what_if_settings(*args)
    section = WhatIf()
    log = types.SimpleNamespace(caps=Capabilities("rllib"))
    assert "Capabilities.replay" not in section.unavailable(WhatIfSection(False), log)[0]  # plain words
    assert "copy of the policy" in section.unavailable(WhatIfSection(False), log)[0]
    assert section.unavailable(WhatIfSection(False), types.SimpleNamespace(caps=Capabilities("sb3", replay=True))) == []
    assert section.to_json(WhatIfSection(False)) is None


def test_cli_refuses_what_if_for_rllib():
    args = [sys.executable, "-m", "lstm_probe", "run", "CartPole-v1", "--framework", "rllib", "--what-if"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--what-if applies to --framework sb3 only" in r.stdout + r.stderr
