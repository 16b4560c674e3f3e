"""What if (issue 26): counterfactual initial states and burn-in, measured on a copy of the policy during real
RecurrentPPO training; training itself stays bit-identical, and the exact oracles hold."""

import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

import lstm_probe
from lstm_probe import ProbeCallback
from lstm_probe.contract import Capabilities
from lstm_probe.errors import BadInput
from lstm_probe.integrations.sb3.options import Measure
from lstm_probe.integrations.sb3.whatif import initial_states, last_starts, run_starts, what_if_settings
from lstm_probe.report.sections.what_if import WhatIf, WhatIfSection, within

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
    # first and last minibatch (of 4) of epochs 0 and 1, every iteration: stored, zero, 3 burn-ins from zero
    # and 3 from stored states each
    assert len(rows) == iterations * 2 * 2 * 8
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
    # the verdict at the top: measured, and the same answer the what-if section's last epoch gives
    last = {r["alternative"]: r for r in rep.what_if.by_epoch if r["epoch"] == 1}
    v = doc["verdict"]
    assert v["matters"] is (not within(last["stored"], rep.what_if.critic)) and v["epoch"] == 1
    assert v["stale"] is (max(v["drift"].values()) > 0.01) and set(v["drift"]) == set(modules)
    assert "unmeasured" not in " ".join(v["lines"])
    if not v["matters"]:
        assert v["burn_in"] == 0 and "no burn-in needed" in v["lines"][-1]


def test_learning_rate_zero_stored_equals_refreshed_everywhere(tmp_path):
    """Weights that never change: stored states are refreshed states in every minibatch of every epoch."""
    model = make(learning_rate=0.0)
    with ProbeCallback(tmp_path / "w.parquet", what_if=True) as probe:
        model.learn(128, callback=probe)
    _, rows = records(probe.path)
    stored = [r for r in rows if r["alternative"] == "stored"]
    assert stored and all(r["state_actor"] <= TOL and r["state_critic"] <= TOL and r["kl"] <= TOL for r in stored)
    rep = lstm_probe.summarize(probe.path)
    v = rep.verdict  # stored states are refreshed states: fresh, no effect, no burn-in needed
    assert v.stale is False and max(v.drift.values()) <= TOL and v.matters is False and v.burn_in == 0
    assert v.lines[0].startswith("stored states stayed fresh") and v.lines[-1].endswith("no burn-in needed")
    assert any(f.endswith("no burn-in needed") for f in rep.findings)  # never "a 4-step burn-in brings both within"
    # the HTML figure of such a run: every value inside symlog's linear range, yet the axes span 0 to at least
    # 1e-5 with ticks at 0 and decades only (ticks at the data's own limits had labels like 4.2e-07 that ran
    # into the next panel)
    from lstm_probe.report import html_figures

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


class StoredBurnInOracle(BaseCallback):
    """At each rollout's end, before train() and so before the update's first optimizer step (the weights that
    collected the rollout): every alternative's initial states for a sequence start at every rollout step, next
    to the states the buffer stored there."""

    def __init__(self, ks):
        super().__init__()
        self.ks, self.seen = ks, []

    def _on_step(self):
        return True

    def _on_rollout_end(self):
        buf, policy = self.model.rollout_buffer, self.model.policy
        n_envs, n = buf.n_envs, buf.buffer_size

        def flat(x, hidden=False):  # as RecurrentRolloutBuffer.get flattens them: env-major
            return buf.swap_and_flatten(x.swapaxes(1, 2) if hidden else x)

        starts = flat(buf.episode_starts).reshape(-1) > 0.5
        idx = np.arange(n_envs * n)
        env, step = idx // n, idx % n
        last = last_starts(starts, n_envs, n)
        plan = run_starts(step, last, self.ks)
        obs = torch.as_tensor(flat(buf.observations))
        got = {}
        with torch.no_grad():
            features = policy.extract_features(obs)
            for module, lstm, h, c in (
                ("actor", policy.lstm_actor, buf.hidden_states_pi, buf.cell_states_pi),
                ("critic", policy.lstm_critic, buf.hidden_states_vf, buf.cell_states_vf),
            ):
                stored = (flat(h, True), flat(c, True))
                got[module] = {"stored": tuple(torch.as_tensor(s).transpose(0, 1) for s in stored)}
                for name, (first, from_stored) in plan.items():
                    got[module][name] = initial_states(lstm, features, idx, stored, env, step, first, from_stored, n)
        self.seen.append((starts, step, last, got))


def test_burn_in_from_stored_state_reproduces_stored_states_before_the_first_optimizer_step():
    """R2D2's stored-state burn-in: before any optimizer step of an update, the stored state k steps back run over
    k stored inputs with the rollout's own weights is the stored state (to float rounding), for sequences k or
    more steps into the rollout and, clipped to the rollout's first stored state, for the earlier ones; a burn-in
    from zero is not, wherever its window reaches no episode start."""
    ks = [1, 4, 16]
    oracle = StoredBurnInOracle(ks)
    make(n_steps=64).learn(512, callback=oracle)  # 2 envs; episodes of 200 steps: one starts inside rollout 3
    assert len(oracle.seen) == 4
    deep = zero_gap = 0
    for starts, step, last, got in oracle.seen[1:]:  # rollouts 1-3 do not start an episode at their first step
        check = ~starts  # at an episode start the buffer keeps the state before sb3's reset
        for k in ks:
            deep += int((check & (step >= k)).sum())
            reaches = (last >= 0) & (step - k <= last)  # the window reaches back to an episode start
            for module, states in got.items():
                for mine, want in zip(states[f"stored_burn_in_{k}"], states["stored"], strict=True):
                    assert float((mine - want)[:, check].abs().max()) <= 1e-6, (module, k)
                zero = states[f"burn_in_{k}"][0]
                zero_gap = max(zero_gap, float((zero - states["stored"][0])[:, check & ~reaches].abs().amax()))
                for mine, want in zip(zero, states["stored"][0], strict=True):  # from zero: exact only where it reaches
                    assert torch.allclose(mine[check & reaches], want[check & reaches], atol=1e-6)
        for module, states in got.items():  # and refreshed states are stored ones (the oracle the report checks)
            for mine, want in zip(states["refreshed"], states["stored"], strict=True):
                assert float((mine - want)[:, check].abs().max()) <= 1e-6, module
    assert deep > 3 * 2 * 40  # most checked sequences start at least k steps into the rollout
    assert zero_gap > 1e-2  # from zero, the same burn-in misses the stored state: the check can fail
    assert any(((last >= 0) & ~starts).any() for starts, _, last, _ in oracle.seen)  # an episode start inside


def test_stored_burn_in_as_long_as_the_rollout_equals_refreshed_in_every_epoch(tmp_path):
    """With the rollout's own weights (minibatch 0 of epoch 0) the stored-state burn-in equals refreshed at every
    length, the zero burn-in does not; and a stored-state burn-in at least as long as the rollout reaches the
    rollout start or an episode start from every sequence, so it equals refreshed after optimizer steps too (both
    run from the same state over the same inputs), while the zero burn-in of that length never reaches 0 where a
    window is cut at the rollout start."""
    model = make()  # n_steps 32 < 64
    with ProbeCallback(tmp_path / "w.parquet", what_if=True) as probe:
        model.learn(192, callback=probe)
    meta, rows = records(probe.path)
    assert meta["stored_burn_in"] == [4, 16, 64]
    by = {}
    for r in rows:
        by.setdefault(r["alternative"], []).append(r)
    for k in (4, 16, 64):
        for r in by[f"stored_burn_in_{k}"]:
            assert 0 <= r["clipped"] <= r["reached"] <= 1
            if (r["epoch"], r["minibatch"]) == (0, 0):
                assert r["state_actor"] <= 1e-6 and r["state_critic"] <= 1e-6 and r["kl"] <= TOL
                assert r["value_abs"] <= TOL and r["ratio_change"] <= TOL
    assert any(r["state_actor"] > 1e-3 for r in by["burn_in_64"] if (r["epoch"], r["minibatch"]) == (0, 0))
    assert all(r["reached"] == 1 for r in by["stored_burn_in_64"])
    for r in by["stored_burn_in_64"]:  # every epoch, after optimizer steps too
        assert r["state_actor"] <= 1e-6 and r["state_critic"] <= 1e-6 and r["value_abs"] <= TOL and r["kl"] <= TOL
    # from zero: iteration 0 starts both envs' episodes at step 0, where every window ends (exact, none cut at the
    # rollout start); iterations 1 and 2 (steps 32-95 of 200-step episodes) start none, every window is cut there
    for r in by["burn_in_64"]:
        if r["iteration"] == 0:
            assert r["reached"] == 1 and r["clipped"] == 0 and r["state_actor"] <= 1e-6 and r["state_critic"] <= 1e-6
        else:
            assert r["reached"] == 0 and r["clipped"] == 1 and r["state_actor"] > 1e-5 and r["state_critic"] > 1e-5
    # the report: the rows, the note beside the table (text and JSON), the burn-in from stored within 1%
    rep = lstm_probe.summarize(probe.path)
    doc = json.loads(json.dumps(rep.to_dict()))["what_if"]
    alts = [r["alternative"] for r in doc["by_epoch"] if r["epoch"] == 0]
    assert alts == ["stored", "zero", *(f"{kind}{k}" for kind in ("burn_in_", "stored_burn_in_") for k in (4, 16, 64))]
    assert doc["stored_burn_in"] == [4, 16, 64]
    assert len(doc["within_stored"]) == 2 and all(w["burn_in"] is not None for w in doc["within_stored"])
    assert any("rollout's first step" in n and "starts from zero" in n for n in doc["notes"])
    text = [b for b in WhatIf().text(rep.what_if, Capabilities("sb3", replay=True))]
    assert any("burn-in 64 from stored" in row[0] for b in text if hasattr(b, "rows") for row in b.rows)
    assert any(hasattr(b, "text") and "rollout's first step" in b.text for b in text)
    # the CLI at 80 columns: no number cut short (rich cuts with an ellipsis)
    import os

    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "report", str(probe.path)], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stderr
    section = r.stdout.split("What if: other initial states")[1].split("Findings")[0]
    assert "…" not in r.stdout and max(len(line) for line in section.splitlines()) <= 80
    from lstm_probe.report.section import fmt

    body = r.stdout.split("What if, epoch 0: against refreshed states")[1]
    for row in doc["by_epoch"]:
        assert fmt(row["kl"]) in body


def test_settings_and_unavailable():
    assert what_if_settings(Measure()) is None
    assert what_if_settings(Measure(what_if=True, what_if_every=3, burn_in=(8, 4))) == {
        "every": 3,
        "burn_in": (4, 8, 16, 64),
    }
    for args in [(True, 0, ()), (True, 1, [0]), (False, 2, ()), (False, 1, [8])]:
        with pytest.raises(BadInput):
            Measure(what_if=args[0], what_if_every=args[1], burn_in=args[2])
    section = WhatIf()
    log = types.SimpleNamespace(caps=Capabilities("rllib"), not_measurable={})
    assert "Capabilities.replay" not in section.unavailable(WhatIfSection(False), log)[0]  # plain words
    assert "copy of the policy" in section.unavailable(WhatIfSection(False), log)[0]
    sb3 = types.SimpleNamespace(caps=Capabilities("sb3", replay=True))
    assert section.unavailable(WhatIfSection(False), sb3) == [
        "what if (counterfactual initial states, burn-in): not measured in this run; lstm-probe run --what-if "
        "(what_if=True in code) adds it"
    ]
    assert section.to_json(WhatIfSection(False)) is None


def test_cli_refuses_info_for_rllib():
    args = [sys.executable, "-m", "lstm_probe", "run", "CartPole-v1", "--framework", "rllib", "--info", "x"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    takes = "--info applies to --framework sb3 only"
    assert r.returncode == 2 and takes in r.stdout + r.stderr


def test_a_report_names_each_measurement_its_log_lacks_and_the_option_that_adds_it():
    """The sample sb3 log was written with none of --what-if, --memory, --capture-obs: the report says so, each
    with its option, and nothing else of these sections."""
    rep = lstm_probe.summarize(Path(__file__).resolve().parent.parent / "sample_runs" / "pendulum-1env.parquet")
    lacks = {u.split(" (")[0]: u for u in rep.unavailable}
    assert "--what-if" in lacks["what if"] and "--memory" in lacks["the memory horizon"]
    assert "--capture-obs" in lacks["linear probes"]


def test_the_oracles_bound_allows_for_tf32_where_the_log_says_cudnn_ran_in_it(tmp_path):
    """On a GPU cuDNN computes in TF32 by default (metadata ``cudnn_tf32``): the oracle's two passes may then
    differ by ~1e-3 relative, which is rounding, not a stale state; the check allows 1e-2 there, 1e-4 elsewhere."""
    from lstm_probe.report.sections.what_if import CHECK_TOLERANCE, TF32_CHECK_TOLERANCE, summarize_what_if

    model = make(n_steps=32)
    with ProbeCallback(tmp_path / "w.parquet", what_if=True) as probe:
        model.learn(64, callback=probe)
    meta, _ = records(probe.path)
    assert summarize_what_if(meta).check["ok"] is True
    cols = meta["records"]
    keys = zip(cols["epoch"], cols["minibatch"], cols["alternative"], strict=True)
    first = [i for i, key in enumerate(keys) if key == (0, 0, "stored")]
    assert first
    for off, plain, tf32 in ((3e-3, False, True), (5e-2, False, False)):
        for i in first:
            cols["state_actor"][i] = off
        assert CHECK_TOLERANCE < off and (off <= TF32_CHECK_TOLERANCE) is tf32
        assert summarize_what_if(meta).check["ok"] is plain
        assert summarize_what_if(meta, tf32=True).check["ok"] is tf32
