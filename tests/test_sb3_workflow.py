"""A RecurrentPPO workflow as users run it: learn() going on from a trained or loaded model, VecNormalize (its
normalized rewards, its statistics for an exported file), VecFrameStack, and what the report and export say."""

import gymnasium as gym
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

import lstm_probe
from lstm_probe import ProbeCallback
from lstm_probe.log.reader import read_info
from tests.vec_seen import Seen

KW = {"n_steps": 32, "batch_size": 32, "n_epochs": 1, "policy_kwargs": {"lstm_hidden_size": 8, "net_arch": [8]}}


def _lines(rep):
    """Every line of the text report's blocks (a panel's lines one by one)."""
    out = []
    for blocks in rep.text():
        for b in blocks:
            out += list(getattr(b, "lines", ())) or [getattr(b, "text", "")]
    return out


def test_learn_going_on_from_a_trained_model_says_so(tmp_path):
    model = RecurrentPPO("MlpLstmPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), seed=0, **KW)
    model.learn(128, callback=ProbeCallback(tmp_path / "a.parquet"))
    model.learn(192, callback=ProbeCallback(tmp_path / "b.parquet"), reset_num_timesteps=False)
    assert model.num_timesteps == 320
    a, b = read_info(tmp_path / "a.parquet").metadata, read_info(tmp_path / "b.parquet").metadata
    assert "start_timesteps" not in a  # a fresh learn(): the log as before
    assert b["start_timesteps"] == 128 and b["total_timesteps"] == 320  # sb3 counts from the model's first step
    rep = lstm_probe.summarize(tmp_path / "b.parquet")
    assert rep.staleness.provenance_ok is True
    assert rep.run.steps_start == 128 and rep.run.steps_done == 320 and rep.run.iterations == 3
    run = next(t for t in _lines(rep) if t.startswith("steps "))
    assert run.startswith(
        "steps 192 of 192 asked, going on from the model's step 128 (learn(reset_num_timesteps=False)"
    )
    assert rep.to_dict()["run"]["steps_start"] == 128
    roll = lstm_probe.load(tmp_path / "b.parquet", phase="rollout", module="actor", vectors=False)
    assert roll.env_step.min() == 0 and roll.env_step.max() == 95  # the log's own steps, as the schema says
    fresh = next(t for t in _lines(lstm_probe.summarize(tmp_path / "a.parquet")) if t.startswith("steps "))
    assert fresh.startswith("steps 128 of 128 asked, 2 iterations")


def test_episodes_under_way_when_learn_goes_on_are_said_to_be_left_out(tmp_path):
    """learn(reset_num_timesteps=False) on a model whose envs are mid-episode: those episodes' rows have no
    episode_step until their env resets, so the episode figures leave them out; the Sequences panel, its finding and
    the JSON say how many (one per env not at an episode's first step when learn() went on; nothing was said)."""
    model = RecurrentPPO("MlpLstmPolicy", make_vec_env("CartPole-v1", n_envs=4, seed=0), seed=0, **KW)
    model.learn(128)
    under = int((~model._last_episode_starts.astype(bool)).sum())
    assert under > 0
    model.learn(128, callback=ProbeCallback(tmp_path / "b.parquet"), reset_num_timesteps=False)
    roll = lstm_probe.load(tmp_path / "b.parquet", phase="rollout", module="actor", vectors=False)
    unknown = roll[roll.episode_step.isna() & roll.bootstrap.isna()]
    assert unknown.groupby(["env", "episode"]).ngroups == under  # the rows the figures leave out
    rep = lstm_probe.summarize(tmp_path / "b.parquet")
    assert rep.sequences.episodes_under_way == under and rep.to_dict()["sequences"]["episodes_under_way"] == under
    words = f"{under} episodes already under way when the log began are left out (their steps in the episode unknown)"
    line = next(t for b in _lines(rep) for t in b.splitlines() if t.startswith("episodes completed: "))
    assert line.endswith(f"; {words}"), line
    assert any(words in f for f in rep.to_dict()["findings"])
    fresh = ProbeCallback(tmp_path / "a.parquet")
    RecurrentPPO("MlpLstmPolicy", make_vec_env("CartPole-v1", n_envs=4, seed=0), seed=0, **KW).learn(128, fresh)
    assert lstm_probe.summarize(tmp_path / "a.parquet").sequences.episodes_under_way == 0  # a fresh learn(): none


def test_a_loaded_model_going_on_says_so_too(tmp_path):
    model = RecurrentPPO("MlpLstmPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), seed=0, **KW)
    model.learn(64)
    model.save(tmp_path / "m.zip")
    loaded = RecurrentPPO.load(tmp_path / "m.zip", env=make_vec_env("CartPole-v1", n_envs=2, seed=1))
    loaded.learn(64, callback=ProbeCallback(tmp_path / "c.parquet"), reset_num_timesteps=False)
    rep = lstm_probe.summarize(tmp_path / "c.parquet")
    assert rep.run.steps_start == 64 and rep.run.steps_done == 128
    assert rep.staleness.provenance_ok is True


def test_normalized_rewards_without_a_monitor_are_said_to_be_normalized(tmp_path):
    raw = DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2)
    env = VecNormalize(raw, norm_obs=True, norm_reward=True)
    model = RecurrentPPO("MlpLstmPolicy", env, seed=0, **KW)
    model.learn(256, callback=ProbeCallback(tmp_path / "n.parquet"))
    record = read_info(tmp_path / "n.parquet").metadata["returns"]
    assert record["source"] == "normalized"
    line = next(t for t in _lines(lstm_probe.summarize(tmp_path / "n.parquet")) if t.startswith("returns"))
    assert line.startswith(
        "returns (summed rewards the algorithm saw, normalized by VecNormalize: not the env's returns (a Monitor "
        "under VecNormalize records those)): "
    )
    # without norm_reward the rewards are the env's own: 'rewards', as before
    plain = RecurrentPPO("MlpLstmPolicy", VecNormalize(Seen(raw), norm_reward=False), seed=0, **KW)
    plain.learn(128, callback=ProbeCallback(tmp_path / "p.parquet"))
    record = read_info(tmp_path / "p.parquet").metadata["returns"]
    assert record["source"] == "rewards" and record["best"]["return"] == int(record["best"]["return"])


def _normalized_and_plain(tmp_path):
    """Two Pendulum models of 32 steps, one trained under VecNormalize, saved as norm.zip and plain.zip."""
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=0))
    model = RecurrentPPO("MlpLstmPolicy", env, seed=0, **KW)
    model.learn(32)
    model.save(tmp_path / "norm.zip")
    plain = RecurrentPPO("MlpLstmPolicy", make_vec_env("Pendulum-v1", n_envs=1, seed=0), seed=0, **KW)
    plain.learn(32)
    plain.save(tmp_path / "plain.zip")
    return model, plain


def test_export_says_a_vecnormalize_model_takes_normalized_observations(tmp_path):
    from lstm_probe.deploy.export import export

    model, plain = _normalized_and_plain(tmp_path)
    kw = {"env_id": "Pendulum-v1", "episodes": 1}
    for source in (tmp_path / "norm.zip", model):  # the zip (nothing unpickled) and the model object
        r = export(source, tmp_path / "n.pt", force=True, **kw)
        assert len(r.notes) == 1 and r.notes[0].startswith("the model was trained under VecNormalize: ")
        assert "replay --vecnormalize STATS" in r.notes[0] and r.to_dict()["notes"] == list(r.notes)
    for source in (tmp_path / "plain.zip", plain):
        assert export(source, tmp_path / "p.pt", force=True, **kw).notes == ()


def test_a_frame_stacked_model_refused_with_env_names_the_way_out(tmp_path):
    import subprocess
    import sys

    from stable_baselines3.common.vec_env import VecFrameStack

    model = RecurrentPPO("MlpLstmPolicy", VecFrameStack(make_vec_env("CartPole-v1", n_envs=1, seed=0), 4), **KW)
    model.save(tmp_path / "s.zip")
    cmd = [sys.executable, "-m", "lstm_probe", "export", str(tmp_path / "s.zip"), str(tmp_path / "s.pt")]
    r = subprocess.run([*cmd, "--env", "CartPole-v1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "differs from the model's Box(16,)" in r.stderr
    assert "leave --env out: export verifies on --log LOG of a run with --capture-obs, or --synthetic" in r.stderr


def test_returns_line_where_a_tenth_has_no_episode():
    from lstm_probe.capture.returns import Returns
    from lstm_probe.report.sections.returns import returns_line, summarize_returns

    middle = Returns("monitor")
    middle.ended(3, [-875.75], [200])  # a short Pendulum run: one episode, in neither tenth
    assert returns_line(summarize_returns(middle.record(), 6)) == (
        "returns (Monitor's raw rewards): 1 episode ended; none in the first or the last tenth of iterations "
        "(iteration 0; iteration 5); best -875.8 (iteration 3)"
    )
    late = Returns("monitor")
    late.ended(5, [-900.0, -850.0], [200, 200])
    assert returns_line(summarize_returns(late.record(), 6)) == (
        "returns (Monitor's raw rewards): 2 episodes ended; mean return -875 in the last tenth of iterations "
        "(iteration 5, 2 episodes), none ended in the first (iteration 0); best -850 (iteration 5)"
    )


def test_refusals_a_probecallback_user_can_act_on(tmp_path):
    import pytest

    from lstm_probe.deploy.export import export

    model = RecurrentPPO("MlpLstmPolicy", make_vec_env("Pendulum-v1", n_envs=1, seed=0), seed=0, **KW)
    model.learn(32, callback=ProbeCallback(tmp_path / "a.parquet"))
    with pytest.raises(lstm_probe.BadInput, match=r"already exists; pass --force \(force=True in code\)"):
        model.learn(32, callback=ProbeCallback(tmp_path / "a.parquet"), reset_num_timesteps=False)
    with pytest.raises(lstm_probe.BadInput, match=r"--capture-obs` \(capture_obs=True in code, e\.g\. ProbeCallback"):
        export(model, tmp_path / "p.pt", log=tmp_path / "a.parquet")


def test_a_vecmonitor_above_vecnormalize_records_normalized_returns(tmp_path):
    from stable_baselines3.common.vec_env import VecMonitor

    env = VecMonitor(VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2)))
    model = RecurrentPPO("MlpLstmPolicy", env, seed=0, **KW)
    model.learn(256, callback=ProbeCallback(tmp_path / "m.parquet"))
    record = read_info(tmp_path / "m.parquet").metadata["returns"]
    episodes = list(model.ep_info_buffer)  # VecMonitor's: sums of the normalized rewards
    assert record["source"] == "normalized" and record["episodes"] == len(episodes) and record["partial"] == 0
    assert record["best"]["return"] == max(float(e["r"]) for e in episodes)
    # a VecMonitor beneath VecNormalize records the env's own rewards: Monitor's, as before
    under = VecNormalize(VecMonitor(DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2)))
    RecurrentPPO("MlpLstmPolicy", under, seed=0, **KW).learn(128, callback=ProbeCallback(tmp_path / "u.parquet"))
    assert read_info(tmp_path / "u.parquet").metadata["returns"]["source"] == "monitor"


def test_replay_without_the_statistics_of_a_vecnormalize_model_says_what_its_verdict_means(tmp_path):
    """A file exported from a model trained under VecNormalize says so in its metadata (``normalized``), and replay
    of it (or of the model.zip) without ``--vecnormalize`` says what that means: a loop that normalises, as it must,
    reads as 'not this policy' without the statistics (was: the generic 'not checked' note, or none for the file).
    A file of a model trained without VecNormalize carries no such key and gets no such note."""
    import json

    import numpy as np
    import onnx
    import pyarrow as pa
    import pyarrow.parquet as pq

    model, plain = _normalized_and_plain(tmp_path)
    obs = np.random.default_rng(0).uniform(-1, 1, (12, 3)).astype(np.float32)
    starts = np.arange(12) % 6 == 0
    for name, m in (("norm", model), ("plain", plain)):
        out = tmp_path / f"{name}.onnx"
        lstm_probe.export(tmp_path / f"{name}.zip", out, env_id="Pendulum-v1", episodes=1)
        meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
        assert json.loads(meta["lstm_probe.deploy"]).get("normalized") is (True if name == "norm" else None)
        actions, state = [], None
        for o, s in zip(obs, starts, strict=True):  # a loop that feeds the observations as they come
            a, state = m.predict(o[None], state=state, episode_start=np.array([s]), deterministic=True)
            actions.append(a[0].tolist())
        rows = {"step": list(range(12)), "obs": obs.tolist(), "action": actions, "episode_start": starts.tolist()}
        pq.write_table(pa.table(rows), tmp_path / f"{name}.parquet")
        for policy in (out, tmp_path / f"{name}.zip"):
            r = lstm_probe.replay(tmp_path / f"{name}.parquet", policy, trust_model=True)
            said = [n for n in r.notes if "trained under VecNormalize and no statistics were given" in n]
            assert len(said) == (1 if name == "norm" else 0), (policy.name, r.notes)
            if said:
                assert "--vecnormalize STATS" in said[0] and "reads as 'not this policy'" in said[0]
            # the verdict itself says what it rests on: this loop forgot to normalize, and replay cannot tell
            assert r.verdict == "correct" and r.to_dict()["unnormalized"] is (name == "norm"), (policy.name, r.verdict)
            qualified = (
                "correct if the trace's observations are what the policy took (normalized): without --vecnormalize"
            )
            assert r.headline.startswith(qualified) if name == "norm" else r.headline == "correct", r.headline


def test_the_memory_panel_says_the_episodes_under_way_too(tmp_path):
    """The Memory panel takes its episode figures from the Sequences section's count: where a continued learn left
    episodes under way out of them, it says so as the Sequences panel does (it said the figures bare)."""
    model = RecurrentPPO("MlpLstmPolicy", make_vec_env("CartPole-v1", n_envs=4, seed=0), seed=0, **KW)
    model.learn(128)
    under = int((~model._last_episode_starts.astype(bool)).sum())
    assert under > 0
    model.learn(256, callback=ProbeCallback(tmp_path / "b.parquet", memory=True), reset_num_timesteps=False)
    rep = lstm_probe.summarize(tmp_path / "b.parquet")
    mem = rep.memory
    assert mem.episodes_from == "log" and mem.episodes_under_way == under == rep.sequences.episodes_under_way
    words = f"{under} episodes already under way when the log began are left out (their steps in the episode unknown)"
    e = rep.sequences.episode_length
    figures = f"episodes completed: {rep.sequences.episodes_completed:,}, median"
    lines = [t for b in _lines(rep) for t in b.splitlines()]
    memory_line = next(t for t in lines if figures in t and "rollout" in t)
    assert f"max {lstm_probe.report.section.fmt_steps(e['max'])} ({words});" in memory_line, memory_line
    assert rep.to_dict()["memory"]["episodes_under_way"] == under
    assert any("episodes last" in f and f"({words})" in f for f in rep.to_dict()["findings"]), rep.to_dict()["findings"]
