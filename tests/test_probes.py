"""Linear probes from a log (issue 27): exact oracles on a real tiny run's hidden states."""

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest

import lstm_probe
from lstm_probe import ProbeCallback
from lstm_probe.errors import BadInput
from lstm_probe.integrations.sb3.obs import InfoKeyWarning
from lstm_probe.log.reader import load, states
from lstm_probe.report.probes import _sample, probe_targets, r2, ridge, split
from lstm_probe.report.section import Line, Table
from lstm_probe.report.sections.probes import Probes


def test_ridge_recovers_a_linear_map():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 8))
    y = x @ np.arange(8.0) + 3.0
    w, b = ridge(x, y, alpha=1e-9)
    assert np.allclose(w, np.arange(8.0), atol=1e-5) and abs(b - 3.0) < 1e-5
    assert r2(y, x @ w + b) > 0.999999
    assert r2(np.ones(4), np.ones(4)) is None
    held = split(np.array([5, 5, 7, 9, 9, 11]), 0.5)  # keys 5, 7, 9, 11: every 2nd held out
    assert held.tolist() == [False, False, True, False, False, True]


@pytest.fixture(scope="module")
def log(runs_dir):
    from tests.conftest import probed_run

    return probed_run(runs_dir, n_envs=2, n_steps=128, batch_size=64, steps=512).path


def rollout(path, module="actor", layer=0):
    df = load(path, phase="rollout", vectors=True)
    df = df[(df["module"] == module) & (df["layer"] == layer)].reset_index(drop=True)
    return df, states(df, "h").astype(np.float64)


def test_exact_linear_target_scores_one_and_shuffled_scores_zero(log):
    df, h = rollout(log)
    w = np.linspace(-1, 1, h.shape[1])
    target = pd.DataFrame({"env": df["env"], "env_step": df["env_step"], "value": h @ w})
    res = lstm_probe.probe(log, target, alpha=1e-9)  # an exact linear map: no shrinkage needed
    actor = res[(res["module"] == "actor") & (res["layer"] == 0)]
    assert len(actor) >= 2 and (actor["r2"] > 0.9999).all(), actor
    shuffled = target.assign(value=np.random.default_rng(0).permutation(target["value"].to_numpy()))
    res = lstm_probe.probe(log, shuffled)
    actor = res[(res["module"] == "actor") & (res["layer"] == 0)]
    assert actor["r2"].between(-0.3, 0.15).all() and abs(actor["r2"].mean()) < 0.15, actor


def test_r2_below_zero_is_flagged_worse_than_the_mean(log):
    """A held-out part that drifts from the fitted one: the fit is exact on the fitted rows, the held-out targets are
    the negated map, so R² = 1 - sum((2 h w)^2) / sum((h w - mean)^2) <= -3 exactly; every such row says it is worse
    than predicting the mean (the R² kept as it is), and the ridge's own numbers flag alike."""
    from lstm_probe.report.probes import _units, score

    x = np.arange(5.0)[:, None]
    y = np.array([0.0, 1.0, 2.0, 0.0, 1.0])  # fit y = x on 0..2; held out: x 3, 4 but y 0, 1 (mean 0.5)
    held = np.array([False, False, False, True, True])
    got = score(x, y, held, alpha=1e-12)
    assert got["r2"] == pytest.approx(1 - (9 + 9) / 0.5, abs=1e-6) and got["worse_than_mean"] is True
    assert score(x, x[:, 0], held, alpha=1e-12)["worse_than_mean"] is False  # R² 1
    assert score(x, np.ones(5), held)["r2"] is None and score(x, np.ones(5), held)["worse_than_mean"] is None

    df, h = rollout(log)
    w = np.linspace(-1, 1, h.shape[1])
    sign = np.ones(len(df))
    for _, g in df.groupby("iteration"):  # the probe's own held-out split of each iteration's rows
        idx = g.index.to_numpy()
        units = _units(g["env"].to_numpy(np.int64), g["episode"].to_numpy(np.float64), g["env_step"].to_numpy(), 0.3)
        sign[idx[split(units, 0.3)]] = -1
    target = pd.DataFrame({"env": df["env"], "env_step": df["env_step"], "value": sign * (h @ w)})
    res = lstm_probe.probe(log, target, alpha=1e-9)
    actor = res[(res["module"] == "actor") & (res["layer"] == 0)]
    assert len(actor) >= 2 and (actor["r2"] <= -3 + 1e-6).all(), actor
    assert actor["worse_than_mean"].tolist() == [True] * len(actor)
    assert (res["worse_than_mean"] == (res["r2"] < 0)).all()


def test_lags_and_column_targets(log):
    res = lstm_probe.probe(log, "episode_step", lags=[0, 1, 4])
    assert set(res["lag"]) == {0, 1, 4} and set(res["module"]) == {"actor", "critic"}
    assert res["n_fit"].gt(0).all()
    # the episode step at t - 4 is the episode step at t minus 4: the same R² up to the rows left out
    with pytest.raises(BadInput, match="capture-obs"):  # a log without observations: its obs column is null
        lstm_probe.probe(log, "obs:1")
    with pytest.raises(BadInput, match="lags"):
        lstm_probe.probe(log, "episode_step", lags=[-1])


class CosInInfo(gym.Wrapper):
    """Puts the observation's first entry into info["cos"]: info and obs of one row must agree."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "cos": float(obs[0])}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "cos": float(obs[0])}


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """A run with --capture-obs and --info cos (episodes end inside it: Pendulum's 200 steps, 256 per env)."""
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    out = tmp_path_factory.mktemp("obs") / "obs.parquet"
    env = make_vec_env("Pendulum-v1", n_envs=2, seed=0, wrapper_class=CosInInfo)
    model = RecurrentPPO(
        "MlpLstmPolicy", env, n_steps=128, batch_size=128, n_epochs=1, seed=0, policy_kwargs={"lstm_hidden_size": 8}
    )
    # an info key the env never sets: said once, at the log's close (the log holds no values for it)
    with pytest.warns(InfoKeyWarning, match="the env's info never held 'missing'") as seen:
        with ProbeCallback(out, force=True, capture_obs=True, info_keys=["cos", "missing"]) as probe:
            model.learn(512, callback=probe)
    assert [str(w.message).split(":")[0] for w in seen if w.category is InfoKeyWarning] == ["--info missing"]
    assert all(
        str(w.message).endswith("(the report's linear probes leave it out; check the key's spelling)")
        for w in seen
        if w.category is InfoKeyWarning
    )
    return out, model


def test_capture_obs_rows_hold_the_observations_the_policy_saw(captured):
    out, model = captured
    meta = lstm_probe.read_info(out).metadata
    assert meta["obs_size"] == 3 and meta["info_keys"] == ["cos", "missing"]
    df = load(out)
    roll = df[(df.phase == "rollout") & (df.module == "actor")]
    assert roll.obs.notna().all() and df[df.phase != "rollout"].obs.isna().all()
    obs = np.stack(roll.obs.to_numpy())
    assert obs.shape == (2 * 256, 3)
    # the rollout buffer holds the last rollout's observations, env by env after train() flattened it
    last = roll[roll.iteration == roll.iteration.max()].sort_values(["env", "env_step"])
    stored = np.asarray(model.rollout_buffer.observations, np.float32).reshape(-1, 3)
    np.testing.assert_array_equal(np.stack(last.obs.to_numpy()), stored)
    # info of the observation that went in, reset infos at episode starts included; a missing key is NaN
    info = np.stack(roll["info"].to_numpy())
    np.testing.assert_array_equal(info[:, 0], obs[:, 0])
    assert np.isnan(info[:, 1]).all() and roll.episode_start.sum() >= 2 + 2  # first steps and one reset per env
    res = lstm_probe.probe(out, "info:cos", lags=[0, 1])
    assert len(res) and res["n_fit"].gt(0).all()
    with pytest.raises(BadInput, match="info keys are cos, missing"):
        lstm_probe.probe(out, "info:velocity")


def test_report_probe_table(captured, log):
    out, _ = captured
    doc = lstm_probe.summarize(out).to_dict()
    probes = doc["probes"]
    assert probes["targets"] == ["obs:0", "obs:1", "obs:2", "info:cos", "info:missing"]
    assert probes["lags"] == [0, 1] and probes["iterations"] == [0, 1]
    got = {(r["target"], r["module"], r["lag"]) for r in probes["rows"]}
    assert ("info:cos", "actor", 0) in got and ("obs:2", "critic", 1) in got
    assert all(r["r2"] is None for r in probes["rows"] if r["target"] == "info:missing")
    assert probes["empty"] == ["info:missing"]  # no value in any row probed: a line, not a table of '-'
    rep = lstm_probe.summarize(out)
    blocks = Probes().text(rep.probes, rep.capabilities)
    said = [b.text for b in blocks if isinstance(b, Line)]
    assert any("the log holds no values for info:missing" in t for t in said), said
    table = next(b for b in blocks if isinstance(b, Table))
    assert all(row[2] != "info:missing" for row in table.rows) and any(row[2] == "info:cos" for row in table.rows)
    assert lstm_probe.summarize(log).to_dict()["probes"] is None  # no observations captured
    # the section's numpy rows (probe_rows) are the DataFrame's (probe_targets), NaN as None, of the same types
    frame = probe_targets(out, probes["targets"], lags=[0, 1], iterations=[0, 1], max_rows=4096, strict=False)
    want = [{k: None if v != v else v for k, v in r.items()} for r in frame.to_dict("records")]
    assert probes["rows"] == want
    assert [[type(v) for v in r.values()] for r in probes["rows"]] == [[type(v) for v in r.values()] for r in want]
    for r in probes["rows"]:  # the number kept, the flag beside it
        assert r["worse_than_mean"] == (None if r["r2"] is None else r["r2"] < 0)
    below = [r for r in probes["rows"] if r["worse_than_mean"]]
    assert len(probes["notes"]) == (1 if below else 0)


def test_report_says_why_an_r2_is_below_zero():
    """The section's text and findings on an R² below 0: the number as it is, marked, and the note under the table
    (how many, the lowest, the held-out rows) in text and JSON."""
    from lstm_probe.contract import Capabilities
    from lstm_probe.report.section import Line, Table
    from lstm_probe.report.sections.probes import Probes, ProbesSection, _notes

    def row(it, target, value, n_test=40):
        return {"iteration": it, "module": "actor", "layer": 0, "target": target, "lag": 0, "r2": value,
                "n_fit": 88, "n_test": n_test, "worse_than_mean": None if value is None else value < 0}  # fmt: skip

    rows = [row(0, "info:v", 0.5), row(3, "info:v", -16.7, 32), row(3, "obs:0", -901.0, 48), row(3, "obs:1", None)]
    data = ProbesSection(["obs:0", "obs:1", "info:v"], [0], [0, 3], rows, notes=_notes(rows))
    assert len(data.notes) == 1 and data.notes[0].startswith("R² below 0: the probe predicts the held-out rows worse")
    assert (
        "2 of 3 probes (lowest -901: actor obs:0, lag 0, iteration 3), scored on 32-48 held-out rows" in data.notes[0]
    )
    assert "few episodes" in data.notes[0] and "drift" in data.notes[0]
    blocks = Probes().text(data, Capabilities("sb3"))
    table = next(b for b in blocks if isinstance(b, Table))
    assert ("actor", "0", "obs:0", "0", "-", "-901*") in table.rows and (
        "actor",
        "0",
        "info:v",
        "0",
        "0.5",
        "-16.7*",
    ) in table.rows
    assert [b.text for b in blocks if isinstance(b, Line)] == [f"* {data.notes[0]}"]
    assert Probes().findings(data) == [
        "actor: h reads info:v with R² -16.70 (worse than predicting the mean) at iteration 3 (0.50 at iteration 0)"
    ]
    assert _notes([row(0, "obs:0", 0.2)]) == []


def test_sample_keeps_whole_units():
    units = np.repeat(np.arange(10), 50)
    keep = _sample(units, 100)
    assert keep.sum() == 100 and set(np.unique(units[keep])) == {0, 5}
    assert _sample(units, None).all() and _sample(units, 10_000).all()


def _own_loop_log(path, numbered):
    """A 3-env own loop of 3 rollouts of 24 steps with random episode ends, tagged with episode_start alone
    (docs/own-loops.md's fewest tags) or with the episode numbers and steps it counted itself too."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n, steps, lstm = 3, 24, nn.LSTM(2, 8)
    state = (torch.zeros(1, n, 8), torch.zeros(1, n, 8))
    start = np.ones(n, bool)  # every env's first step opens its episode
    episode, episode_step = np.full(n, -1), np.zeros(n, int)
    with lstm_probe.trace(lstm, out=path) as probe, torch.no_grad():
        for it in range(3):
            for t in range(steps):
                episode, episode_step = np.where(start, episode + 1, episode), np.where(start, 0, episode_step + 1)
                keep = torch.tensor(1.0 - start, dtype=torch.float32).view(1, n, 1)
                x = torch.tensor(np.stack([episode_step / 10.0, rng.normal(size=n)], 1), dtype=torch.float32)
                tags = dict(phase="rollout", iteration=it, env=np.arange(n), env_step=it * steps + t)
                tags |= dict(episode_start=start)
                if numbered:
                    tags |= dict(episode=episode, episode_step=episode_step)
                with probe.tag(**tags):
                    _, state = lstm(x[None], (keep * state[0], keep * state[1]))
                start = rng.random(n) < 0.15


def test_an_own_loop_tagged_with_episode_start_alone_is_probed_as_if_it_counted_its_episodes(tmp_path):
    """An own loop's rows without episode numbers (episode_start alone) gave every probe 0 fit and test rows
    (R² '-', exit 0): the held-out units and the episode_step target come from the episode numbers. They are now
    counted from the episode starts, as the report counts episode lengths: the same R² at every lag, value for
    value, as the same loop tagged with the numbers it counted itself."""
    counted, numbered = tmp_path / "counted.parquet", tmp_path / "numbered.parquet"
    _own_loop_log(counted, numbered=False)
    _own_loop_log(numbered, numbered=True)
    assert lstm_probe.load(counted, vectors=False).episode.isna().all()
    for target in ("episode_step", "env_step"):
        got = probe_targets(counted, [target], lags=[0, 2])
        want = probe_targets(numbered, [target], lags=[0, 2])
        assert (got.n_fit > 0).all() and (got.n_test > 0).all()
        pd.testing.assert_frame_equal(got, want)


def test_counted_episodes_are_looked_up_by_env_and_step_whatever_the_rows_order():
    """The look-up of counted episodes grouped rows by their search position and checked the first row's env
    alone: rows of an env the count lacks (or without an env) took another env's episodes, or hid them."""
    from lstm_probe.report.probes import _look_up

    counted = (np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]), np.array([0.0, 1, 0, 0]), np.array([0.0, 0, 0, 1]))
    env, step = np.array([-(2**63), 0, 0, 1, 5]), np.array([0, 0, 1, 1, 0])
    known = np.array([False, True, True, True, True])
    episode, episode_step = _look_up(counted, env, step, known)
    np.testing.assert_array_equal(episode, [np.nan, 0, 1, 0, np.nan])
    np.testing.assert_array_equal(episode_step, [np.nan, 0, 0, 1, np.nan])


def test_a_constant_observation_component_is_said_in_a_line_not_rows_of_dashes(tmp_path):
    """An observation component that never moves (an image's border pixel) has no R² at any iteration: the
    section says so in one line and leaves it out of the table (was: its rows, all '-')."""
    import tiny_envs  # registers TinyConstantEnv-v0

    assert tiny_envs.TinyConstantEnv
    size = {"n_steps": 32, "batch_size": 32, "n_epochs": 1, "hidden_size": 8}
    log = lstm_probe.run("TinyConstantEnv-v0", tmp_path / "c.parquet", steps=96, capture_obs=True, **size).path
    s = lstm_probe.summarize(log)
    assert s.probes.targets == ["obs:0", "obs:1", "obs:2"] and s.probes.constant == ["obs:2"]
    assert all(r["r2"] is None for r in s.probes.rows if r["target"] == "obs:2")
    done = subprocess.run([sys.executable, "-m", "lstm_probe", "report", str(log)], capture_output=True, text=True)
    text = " ".join(done.stdout.replace("│", " ").split())
    assert "linear probes: obs:2 is constant in the rows probed at every iteration (no R² to give)" in text, text
    assert "obs:2 0" not in text and "obs:0 0" in text  # the table: obs:0's rows, none of obs:2


class GoalInInfo(gym.Wrapper):
    """info["goal"]: a value drawn at each reset that moves 1e-3 a step (a goal the policy is not shown)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.goal = float(self.env.unwrapped.np_random.uniform(-1, 1))
        return obs, {**info, "goal": self.goal}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "goal": self.goal + 1e-3 * self.env.unwrapped.t}


def test_a_probe_held_out_from_one_episode_or_run_is_too_few_not_a_finding(tmp_path):
    """A Dict run with --trace-envs 1 and 32-step rollouts of 12-step episodes held out the rows of one unit of the
    split (8-12 rows), whose goal moves 1e-3 a step; scored, R² was -80,000 and more and a finding ("h reads
    info:goal with R² -83889.74"). The split now takes shorter runs (4-16 steps) so that two units are held out
    where a rollout has rows enough; where even 4-step runs are too few (16-step rollouts here): no R², 'few' in
    the table, the note under it, no finding."""
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from tiny_envs import TinyDictEnv

    from lstm_probe.report.probes import MIN_HELD_OUT_UNITS, TOO_FEW

    out = tmp_path / "few.parquet"
    env = make_vec_env(TinyDictEnv, n_envs=2, seed=0, wrapper_class=GoalInInfo)
    kwargs = {"n_steps": 16, "batch_size": 16, "n_epochs": 1, "seed": 0, "policy_kwargs": {"lstm_hidden_size": 8}}
    model = RecurrentPPO("MultiInputLstmPolicy", env, **kwargs)
    with ProbeCallback(out, force=True, capture_obs=True, info_keys=["goal"], trace_envs=1) as probe:
        model.learn(64, callback=probe)
    rep = lstm_probe.summarize(out)
    doc = rep.to_dict()
    goal = [r for r in doc["probes"]["rows"] if r["target"] == "info:goal"]
    assert len(goal) == 2 * 2 * 2 and MIN_HELD_OUT_UNITS == 2  # 2 iterations, actor and critic, lags 0 and 1
    for r in goal:  # one unit held out, 3-4 rows (lag 1 drops an episode's first): no R², in JSON
        assert r["n_test_units"] == 1 and 3 <= r["n_test"] <= 4 and r["n_fit"] >= 8, r
        assert r["too_few"] is True and r["r2"] is None and r["worse_than_mean"] is None
    assert "info:goal" in doc["probes"]["too_few"] and doc["probes"]["constant"] == []
    assert not any("info:goal" in f for f in doc["findings"]), doc["findings"]  # was: two findings of R² -8e4
    blocks = Probes().text(rep.probes, rep.capabilities)
    table = next(b for b in blocks if isinstance(b, Table))
    assert {row[4:] for row in table.rows if row[2] == "info:goal"} == {("few", "few")}
    said = " ".join(b.text for b in blocks if isinstance(b, Line))
    assert f"few: {TOO_FEW}. Here " in said and "of fewer than 2 episodes or runs of 4-16 steps" in said, said
    # the library's rows say so too; lstm-probe probe prints 'few' and why
    frame = lstm_probe.probe(out, "info:goal")
    assert frame["too_few"].all() and frame["r2"].isna().all() and (frame["n_test_units"] == 1).all()
    done = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "probe", str(out), "--target", "info:goal"], capture_output=True, text=True
    )
    assert done.returncode == 0 and " few " in done.stdout and "few: too few held-out rows to score" in done.stdout


def test_one_envs_rollout_within_an_episode_is_split_into_runs_short_enough_to_hold_out_two():
    """One env, a 64-step rollout inside one 200-step episode (the sample log, `run Pendulum-v1`): 16-step runs
    gave 4 units and held out one, so every probe was 'few'; 8-step runs give 8 and hold out two."""
    from lstm_probe.report.probes import _units, split

    env, episode, step = np.zeros(64, np.int64), np.zeros(64), np.arange(128, 192)
    units = _units(env, episode, step, 0.25)
    assert len(np.unique(units)) == 8 and len(np.unique(units[split(units, 0.25)])) == 2
    # a rollout of 16 steps: 4-step runs at the shortest, one held out
    units = _units(env[:16], episode[:16], step[:16], 0.25)
    assert len(np.unique(units)) == 4 and len(np.unique(units[split(units, 0.25)])) == 1
    # episodes enough: whole episodes, as before
    many = np.repeat(np.arange(8), 8).astype(float)
    assert len(np.unique(_units(env, many, step, 0.25))) == 8
