"""The what-if summary is robust to one outlier minibatch: a real RecurrentPPO run whose rewards shrink 10^4-fold
in one iteration (so that iteration's return spread, which the value differences are relative to, is tiny) has
one sampled minibatch whose stored-state value difference is ~650x its epoch's median. The epoch's figure, the
footer's burn-in rule and the verdict read the median; the outlier stays visible, named by iteration and
minibatch (a mean over the minibatches made the one spike the epoch's figure: "it matters")."""

import json
import statistics

import gymnasium as gym
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env

import lstm_probe
from lstm_probe import ProbeCallback
from lstm_probe.contract import Capabilities
from lstm_probe.report.section import Line
from lstm_probe.report.sections.what_if import WITHIN, WhatIf

N_STEPS, SPIKE = 32, 3
SB3 = Capabilities("sb3", epochs=True, rollout_buffer=True, stored_states=True, replay=True)


class SpikeAtOneIteration(gym.Wrapper):
    """Rewards x 1e-4 during iteration SPIKE (each env steps once per iteration step), unchanged otherwise."""

    def __init__(self, env):
        super().__init__(env)
        self.t = 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        scale = 1e-4 if self.t // N_STEPS == SPIKE else 1.0
        self.t += 1
        return obs, reward * scale, terminated, truncated, info


def test_one_outlier_minibatch_carries_no_epoch(tmp_path):
    env = make_vec_env("Pendulum-v1", n_envs=2, seed=0, wrapper_class=SpikeAtOneIteration)
    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        seed=0,
        n_steps=N_STEPS,
        batch_size=16,
        n_epochs=2,
        learning_rate=3e-3,
        policy_kwargs={"lstm_hidden_size": 16},
    )
    with ProbeCallback(tmp_path / "w.parquet", what_if=True) as probe:
        model.learn(6 * 2 * N_STEPS, callback=probe)
    cols = lstm_probe.read_info(probe.path).metadata["what_if"]["records"]
    rows = [{c: v[i] for c, v in cols.items()} for i in range(len(cols["alternative"]))]
    stored = [r for r in rows if r["alternative"] == "stored" and r["epoch"] == 1]
    values = [r["value_rel"] for r in stored]
    top = max(stored, key=lambda r: r["value_rel"])
    assert len(stored) == 12 and top["iteration"] == SPIKE  # 6 iterations x first and last minibatch
    median, mean = statistics.median(values), statistics.fmean(values)
    assert median < WITHIN < mean and top["value_rel"] > 100 * median  # the mean is the spike's alone

    rep = lstm_probe.summarize(probe.path)
    row = next(r for r in rep.what_if.by_epoch if r["epoch"] == 1 and r["alternative"] == "stored")
    assert row["value_rel"] == float(f"{median:.6g}") and row["minibatches"] == 12
    assert row["mean"]["value_rel"] == float(f"{mean:.6g}")
    assert row["furthest"]["value_rel"] == {"value": top["value_rel"], "iteration": SPIKE, "minibatch": 3}
    assert row["p10"]["value_rel"] <= median <= row["p90"]["value_rel"] < top["value_rel"]
    # the one rule (footer, JSON, verdict) reads the median: within 1%, no burn-in needed
    assert rep.what_if.within[-1] == {"epoch": 1, "burn_in": 0, "stored_within": True}
    v = rep.verdict
    assert v.matters is False and v.burn_in == 0 and v.value_rel == row["value_rel"]
    assert "(epoch 1, median of 12 minibatches)" in v.lines[-1] and v.lines[-1].endswith("no burn-in needed")
    # the outlier stays visible: in the JSON, under the tables and in the findings, by iteration and minibatch
    doc = json.loads(json.dumps(rep.to_dict()))["what_if"]
    named = [o for o in doc["outliers"] if (o["epoch"], o["alternative"], o["metric"]) == (1, "stored", "value_rel")]
    assert named == [
        {
            "epoch": 1,
            "alternative": "stored",
            "metric": "value_rel",
            "value": top["value_rel"],
            "iteration": SPIKE,
            "minibatch": 3,
            "median": row["value_rel"],
            "mean": row["mean"]["value_rel"],
        }
    ]
    text = " ".join(b.text for b in WhatIf().text(rep.what_if, SB3) if isinstance(b, Line))
    assert f"epoch 1, stored: value Δ/spread {100 * top['value_rel']:.3g}% at iteration {SPIKE}, minibatch 3" in text
    assert any(f"stored states at iteration {SPIKE}, minibatch 3 move value Δ/spread" in f for f in rep.findings)
