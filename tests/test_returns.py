"""Episode returns, the *returns* capability: each integration's record in the log equals what the framework itself
reports (sb3's Monitor episodes in ``model.ep_info_buffer``; rsl_rl's and an own loop's rewards summed per
episode), a killed run keeps it, the report's line and JSON, bounded records, and logs without it as before."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import lstm_probe
from lstm_probe.capture.returns import Returns
from lstm_probe.log.reader import read_info, writing
from lstm_probe.report.sections.returns import returns_line, summarize_returns

ROOT = Path(__file__).resolve().parent.parent


def _by_iteration(record):
    """{iteration: [episodes, return sum, min, max, length sum]}; the sum rounded to 12 digits (the record adds each
    batch of episodes handed over at once, its summation order not the test's)."""
    by = record["by_iteration"]
    return {
        it: [round(by[k][i], 12 - int(np.log10(abs(by[k][i]) + 1))) if k == "return_sum" else by[k][i] for k in _KEYS]
        for i, it in enumerate(by["iteration"])
    }


_KEYS = ("episodes", "return_sum", "return_min", "return_max", "length_sum")


def _expected(per_iteration):
    """{iteration: [episodes, return sum, min, max, length sum]} from {iteration: [(return, length), ...]}."""
    out = {}
    for it, eps in per_iteration.items():
        if eps:
            r = [float(x) for x, _ in eps]
            total = float(np.sum(np.asarray(r, np.float64)))
            total = round(total, 12 - int(np.log10(abs(total) + 1)))
            out[it] = [len(r), total, min(r), max(r), float(sum(n for _, n in eps))]
    return out


# -- sb3 ---------------------------------------------------------------------------------------------------------


def _sb3_model(env):
    from sb3_contrib import RecurrentPPO

    kw = {"lstm_hidden_size": 8, "net_arch": [8]}
    return RecurrentPPO("MlpLstmPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, policy_kwargs=kw)


def _rollout_marks():
    """A callback keeping ``len(model.ep_info_buffer)`` at each rollout's end (which episodes each iteration ended)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Marks(BaseCallback):
        def __init__(self):
            super().__init__()
            self.marks = []

        def _on_step(self):
            return True

        def _on_rollout_end(self):
            self.marks.append(len(self.model.ep_info_buffer))

    return Marks()


def test_sb3_returns_are_monitors_episodes(tmp_path):
    from stable_baselines3.common.callbacks import CallbackList
    from stable_baselines3.common.env_util import make_vec_env

    model = _sb3_model(make_vec_env("CartPole-v1", n_envs=2, seed=0))  # Monitor-wrapped envs
    marks = _rollout_marks()
    model.learn(320, callback=CallbackList([lstm_probe.ProbeCallback(tmp_path / "r.parquet"), marks]))
    episodes = list(model.ep_info_buffer)
    assert 10 < len(episodes) < 100  # the buffer (maxlen 100) holds every episode of the run
    bounds = [0, *marks.marks]
    expected = _expected(
        {i: [(e["r"], e["l"]) for e in episodes[a:b]] for i, (a, b) in enumerate(itertools.pairwise(bounds))}
    )
    meta = read_info(tmp_path / "r.parquet").metadata
    record = meta["returns"]
    assert record["source"] == "monitor" and record["episodes"] == len(episodes) and record["partial"] == 0
    assert _by_iteration(record) == expected
    assert meta["capabilities"]["returns"] is True
    best = max(episodes, key=lambda e: e["r"])["r"]
    assert record["best"]["return"] == best


def test_sb3_without_monitor_sums_the_rewards_the_algorithm_saw(tmp_path):
    from stable_baselines3.common.vec_env import DummyVecEnv

    from tests.vec_seen import Seen

    env = Seen(DummyVecEnv([lambda: gym.make("CartPole-v1")] * 2))
    model = _sb3_model(env)
    model.learn(256, callback=lstm_probe.ProbeCallback(tmp_path / "r.parquet"))
    sums, lengths, per = np.zeros(2), np.zeros(2, int), {}
    for k, (rewards, dones) in enumerate(env.steps):
        sums += rewards
        lengths += 1
        for i in np.flatnonzero(dones):
            per.setdefault(k // 32, []).append((sums[i], lengths[i]))
        sums[dones], lengths[dones] = 0, 0
    record = read_info(tmp_path / "r.parquet").metadata["returns"]
    assert record["source"] == "rewards"
    assert _by_iteration(record) == _expected(per)


KILLED = textwrap.dedent(
    """
    import json, os, signal, sys
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList
    from stable_baselines3.common.env_util import make_vec_env
    import lstm_probe

    class Kill(BaseCallback):
        def _on_step(self):
            return True

        def _on_rollout_start(self):
            if self.model.num_timesteps >= 3 * 64:  # rollouts 0-2 done, their updates too
                print(json.dumps([[e["r"], e["l"]] for e in self.model.ep_info_buffer]), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        def _on_rollout_end(self):
            print("mark", len(self.model.ep_info_buffer), flush=True)

    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    kw = {"lstm_hidden_size": 8, "net_arch": [8]}
    model = RecurrentPPO("MlpLstmPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, policy_kwargs=kw)
    probe = lstm_probe.ProbeCallback(sys.argv[1], part_seconds=0.2)
    model.learn(100_000, callback=CallbackList([probe, Kill()]))
    """
)


def test_a_killed_run_keeps_its_returns(tmp_path):
    out = tmp_path / "k.parquet"
    proc = subprocess.run([sys.executable, "-c", KILLED, str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    sys.path.insert(0, str(ROOT / "tests"))
    from test_reliability import wait_for

    wait_for(lambda: writing(out) is None, "the writer process never published the killed run's last part")
    lines = proc.stdout.splitlines()
    marks = [0] + [int(x.split()[1]) for x in lines if x.startswith("mark")]
    episodes = json.loads(lines[-1])
    expected = _expected({i: episodes[a:b] for i, (a, b) in enumerate(itertools.pairwise(marks))})
    info = read_info(out)
    assert not info.metadata["completed"]
    assert _by_iteration(info.metadata["returns"]) == expected  # every rollout whose update began
    rep = lstm_probe.summarize(out)
    assert rep.returns.episodes == sum(v[0] for v in expected.values())


# -- rsl_rl ------------------------------------------------------------------------------------------------------


def test_rsl_rl_returns_are_the_rewards_summed_per_episode(tmp_path):
    pytest.importorskip("rsl_rl")
    sys.path.insert(0, str(ROOT / "tests"))
    from test_rsl_rl import STEPS, make_runner

    from lstm_probe.integrations.rsl_rl import attach

    runner = make_runner(4)
    seen, inner = [], runner.env.step

    def step(actions):  # what OnPolicyRunner.learn gets from env.step (and sums in its Logger)
        out = inner(actions)
        seen.append((out[1].double().clone(), out[2].clone()))
        return out

    runner.env.step = step
    with attach(runner, tmp_path / "r.parquet", capture="summary"):
        runner.learn(3)
    sums, lengths, per = torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.int64), {}
    for k, (rewards, dones) in enumerate(seen):
        sums += rewards
        lengths += 1
        for i in torch.nonzero(dones).flatten().tolist():
            per.setdefault(k // STEPS, []).append((sums[i].item(), lengths[i].item()))
        sums[dones != 0], lengths[dones != 0] = 0, 0
    record = read_info(tmp_path / "r.parquet").metadata["returns"]
    assert record["source"] == "rewards" and record["partial"] == 0
    assert _by_iteration(record) == _expected(per) and len(per) == 3


# -- own loops -----------------------------------------------------------------------------------------------------


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 4)


def _own_loop(path, give, iterations=3, steps=5, n=3):
    """A loop of ``iterations`` rollouts of ``steps`` env steps: fixed rewards and dones, handed over by ``give``."""
    torch.manual_seed(0)
    net, rng = _Net(), np.random.default_rng(0)
    with lstm_probe.trace(net, out=path) as probe:
        state = None
        for it in range(iterations):
            for t in range(steps):
                with probe.tag(phase="rollout", iteration=it, env=np.arange(n), env_step=it * steps + t):
                    _, state = net.lstm(torch.zeros(1, n, 3), state)
                rewards = rng.normal(size=n)
                dones = rng.random(n) < 0.3
                give(probe, it, rewards, dones)
    return read_info(path).metadata


def _sums(iterations=3, steps=5, n=3):
    rng = np.random.default_rng(0)
    sums, lengths, per = np.zeros(n), np.zeros(n, int), {}
    for it in range(iterations):
        for _ in range(steps):
            rewards, dones = rng.normal(size=n), rng.random(n) < 0.3
            sums += rewards
            lengths += 1
            for i in np.flatnonzero(dones):
                per.setdefault(it, []).append((sums[i], lengths[i]))
            sums[dones], lengths[dones] = 0, 0
    return per


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_own_loop_rewards_are_summed_per_episode(tmp_path, kind):
    def give(probe, it, rewards, dones):
        if kind == "tensor":  # summed on the tensors' device, copied to the host once per iteration
            rewards, dones = torch.as_tensor(rewards), torch.as_tensor(dones)
        probe.rewards(rewards, dones, iteration=it)

    meta = _own_loop(tmp_path / "r.parquet", give)
    assert meta["capabilities"]["returns"] is True and meta["returns"]["source"] == "rewards"
    got, want = _by_iteration(meta["returns"]), _expected(_sums())
    assert got.keys() == want.keys()
    for it in want:  # the device path sums in float64 too: exact
        assert got[it] == want[it]


def test_own_loop_episodes_as_the_loop_gives_them(tmp_path):
    def give(probe, it, rewards, dones):
        if dones.any():
            with probe.tag(iteration=it):  # the iteration from the enclosing block
                probe.episodes(rewards[dones] * 10, np.full(int(dones.sum()), 7))

    meta = _own_loop(tmp_path / "r.parquet", give)
    rng, per = np.random.default_rng(0), {}
    for it in range(3):
        for _ in range(5):
            rewards, dones = rng.normal(size=3), rng.random(3) < 0.3
            per.setdefault(it, []).extend((r * 10, 7) for r in rewards[dones])
    assert meta["returns"]["source"] == "user"
    assert _by_iteration(meta["returns"]) == _expected(per)
    with (
        lstm_probe.trace(_Net(), out=tmp_path / "x.parquet") as probe,
        pytest.raises(lstm_probe.BadInput, match="iteration"),
    ):
        probe.episodes([1.0], [3])


def test_own_loop_without_returns_declares_none(tmp_path):
    meta = _own_loop(tmp_path / "r.parquet", lambda *a: None)
    assert "returns" not in meta["capabilities"] and "returns" not in meta
    rep = lstm_probe.summarize(tmp_path / "r.parquet")
    assert "returns" not in rep.to_dict()


# -- the record and the report ------------------------------------------------------------------------------------


def test_long_runs_merge_neighbours_exactly():
    r, rng = Returns("rewards", max_entries=500), np.random.default_rng(1)
    per = {}
    for it in range(1234):
        x = rng.normal(size=3)
        per[it] = x
        r.ended(it, x, [5, 6, 7])
    rec = r.record()
    assert rec["stride"] == 4 and len(rec["by_iteration"]["iteration"]) == 309  # ceil(1234 / 4)
    by = rec["by_iteration"]
    assert by["iteration"][:3] == [0, 4, 8] and sum(by["episodes"]) == 3 * 1234
    first = np.concatenate([per[i] for i in range(4)])
    assert by["return_min"][0] == first.min() and by["return_max"][0] == first.max()
    assert by["length_sum"][0] == 4 * 18 and rec["episodes"] == 3 * 1234
    assert len(json.dumps(rec)) < 200_000


def test_report_line_and_finding():
    r = Returns("monitor")
    for it in range(40):  # the same returns throughout: a clear 'did not change'
        r.ended(it, [10.0, 12.0, 8.0], [100, 100, 100])
    data = summarize_returns(r.record(), 40)
    line = returns_line(data)
    assert line == (
        "returns (Monitor's raw rewards): 120 episodes ended; mean return 10 in the first tenth of iterations "
        "(iterations 0-3, 12 episodes), 10 in the last (iterations 36-39, 12 episodes); best 12 (iteration 0)"
    )
    from lstm_probe.report.sections.returns import Returns as Section

    assert Section().findings(data) == [
        "returns did not change over 40 iterations: mean return 10 over the first tenth's 12 episodes, 10 over the "
        "last tenth's 12 (episodes' std 1.63)"
    ]
    rising = Returns("monitor")
    for it in range(40):
        rising.ended(it, [float(it), it + 2.0], [10, 10])
    assert Section().findings(summarize_returns(rising.record(), 40)) == []
    short = summarize_returns(r.record(), 40)
    short.iterations = 10  # too few iterations to say
    assert Section().findings(short) == []
    assert returns_line(summarize_returns(None, 5)) == "returns: no episode ended in the log's 5 iterations"
    assert returns_line(summarize_returns(None, 1)) == "returns: no episode ended in the log's 1 iteration"


def test_run_panel_says_step_counts_with_thousands_separators():
    """A wide run's steps read as its rows do ('24,576 of 250 asked'), not as '24576'."""
    from lstm_probe.report.sections.run import RunSection, _steps

    run = RunSection(None, None, None, None, 1024, 0, {}, {}, 250, 24_576, 1, True, None, 0, 1, 0, None, {}, None)
    assert _steps(run) == "steps 24,576 of 250 asked, "
    run.steps_start, run.steps_done, run.steps_asked = 12_000, 24_576, 24_000
    assert _steps(run).startswith("steps 12,576 of 12,000 asked, going on from the model's step 12,000 (")


def test_report_json_and_text_of_an_sb3_log(tmp_path):
    from stable_baselines3.common.env_util import make_vec_env

    model = _sb3_model(make_vec_env("CartPole-v1", n_envs=2, seed=0))
    model.learn(128, callback=lstm_probe.ProbeCallback(tmp_path / "r.parquet"))
    rep = lstm_probe.summarize(tmp_path / "r.parquet")
    j = rep.to_dict()["returns"]
    episodes = list(model.ep_info_buffer)
    assert j["episodes"] == len(episodes) and j["source"] == "monitor" and j["iterations"] == 2
    assert sum(j["by_iteration"]["episodes"]) == len(episodes)
    mean = float(np.mean([e["r"] for e in episodes]))
    pooled = sum(
        m * n for m, n in zip(j["by_iteration"]["return_mean"], j["by_iteration"]["episodes"], strict=True)
    ) / len(episodes)
    assert pooled == pytest.approx(mean, rel=1e-12)
    blocks = [b.text for blocks in rep.text() for b in blocks if hasattr(b, "text")]
    assert any(t.startswith(f"returns (Monitor's raw rewards): {len(episodes)} episodes ended") for t in blocks)
    if len(j["by_iteration"]["iteration"]) >= 2:  # the HTML page draws them
        from lstm_probe.report.html import build_html

        page = build_html(tmp_path / "r.parquet", tmp_path / "r.html")
        assert "Episode returns" in page.figures


# -- TorchRL -------------------------------------------------------------------------------------------------------


def test_torchrl_returns_are_each_trajectorys_summed_rewards(tmp_path):
    pytest.importorskip("torchrl")
    sys.path.insert(0, str(ROOT / "tests"))
    from test_torchrl import _loop

    batches = []

    def keep(data):  # the collector's batch, (envs, steps): its rewards and dones as the loss sees them
        batches.append((data["next", "reward"].double().clone(), data["next", "done"].clone()))

    _loop(tmp_path / "r.parquet", n_envs=2, steps=24, batches=3, plant=keep)
    sums, lengths, per = torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.int64), {}
    for it, (rewards, dones) in enumerate(batches):
        for t in range(rewards.shape[1]):
            sums += rewards[:, t, 0]
            lengths += 1
            d = dones[:, t, 0]
            for i in torch.nonzero(d).flatten().tolist():
                per.setdefault(it, []).append((sums[i].item(), lengths[i].item()))
            sums[d], lengths[d] = 0, 0
    meta = read_info(tmp_path / "r.parquet").metadata
    assert meta["capabilities"]["returns"] is True and meta["returns"]["source"] == "rewards"
    assert _by_iteration(meta["returns"]) == _expected(per) and sum(len(v) for v in per.values()) >= 2


# -- RLlib -----------------------------------------------------------------------------------------------------------


def test_rllib_returns_are_rllibs_episode_metrics(tmp_path):
    ray = pytest.importorskip("ray")
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from lstm_probe.integrations import rllib

    torch.set_num_threads(1)
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, rollout_fragment_length=32, num_envs_per_env_runner=2)
        .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=1)
        .rl_module(model_config=DefaultModelConfig(use_lstm=True, max_seq_len=8, lstm_cell_size=8))
        .debugging(seed=0)
    )
    rllib.probe_config(config, f"{tmp_path}/log/")
    # ray started here and shut down after, as tests/test_rllib.py's fixture does (a ray left running fails its init)
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", num_cpus=2)
    try:
        algo = config.build_algo()
        try:
            for _ in range(3):
                result = algo.train()
            rllib.close(algo)
        finally:
            algo.stop()
    finally:
        ray.shutdown()
    runners = result["env_runners"]
    meta = read_info(tmp_path / "log").metadata
    record = meta["returns"]
    assert record["source"] == "rllib" and meta["capabilities"]["returns"] is True
    by = record["by_iteration"]
    n = sum(by["episodes"])
    assert n == record["episodes"] == runners["num_episodes_lifetime"] < 100  # RLlib's window holds them all
    # RLlib's episode metrics in a result are of the iteration's episodes: the record's last entry
    assert by["iteration"][-1] == 2 and by["episodes"][-1] == runners["num_episodes"]
    assert by["return_sum"][-1] / by["episodes"][-1] == runners["episode_return_mean"]
    assert (by["return_min"][-1], by["return_max"][-1]) == (
        runners["episode_return_min"],
        runners["episode_return_max"],
    )
    assert by["length_sum"][-1] / by["episodes"][-1] == runners["episode_len_mean"]
    line = returns_line(lstm_probe.summarize(tmp_path / "log").returns)
    assert line.startswith(f"returns (RLlib's episode returns): {n} episodes ended")


def _make_cartpole():
    from lstm_probe.integrations.torchrl import build

    return build("CartPole-v1", n_envs=1, hidden_size=8, seed=0)[0]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_torchrl_multi_process_collectors_returns_from_the_training_batches(tmp_path, kind):
    """A multi-process collector runs no collection call in the probe's process: the returns come from the batches
    the training side sees, a value estimator's (MultiSyncCollector, GAE called twice a batch: taken once) or
    measure_batch's (MultiAsyncCollector, no recurrent estimator call), each trajectory's rewards summed across
    batches by its trajectory id (unique across the workers)."""
    pytest.importorskip("torchrl")
    from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector
    from torchrl.modules import set_recurrent_mode
    from torchrl.objectives.value import GAE

    from lstm_probe.integrations.torchrl import build, probe

    torch.set_num_threads(1)
    _env, actor, critic, _ = build("CartPole-v1", n_envs=2, hidden_size=8, seed=0)
    cls = MultiSyncCollector if kind == "sync" else MultiAsyncCollector
    collector = cls([_make_cartpole, _make_cartpole], actor, frames_per_batch=32, total_frames=192)
    adv = GAE(gamma=0.99, lmbda=0.95, value_network=critic, deactivate_vmap=True)
    batches = []
    with probe([actor, critic], tmp_path / "r.parquet", force=True) as p:
        for data in collector:
            keys = [("next", "reward"), ("next", "done"), ("collector", "traj_ids"), "step_count"]
            batches.append([data.get(k).reshape(-1, data.batch_size[-1]).clone() for k in keys])
            for epoch in range(2):
                if kind == "sync":
                    with torch.no_grad(), set_recurrent_mode(True):
                        adv(data)
                else:
                    p.measure_batch(data, epoch=epoch)
    collector.shutdown()
    sums, per = {}, {}
    for it, (rewards, dones, traj, steps) in enumerate(batches):  # each trajectory's rewards, step by step
        for i in range(rewards.shape[0]):
            for t in range(rewards.shape[1]):
                s, n = sums.get(int(traj[i, t]), (0.0, 0))
                assert n == int(steps[i, t])  # every trajectory seen from its first step, its steps in order
                sums[int(traj[i, t])] = s, n = s + rewards[i, t].item(), n + 1
                if dones[i, t]:
                    per.setdefault(it, []).append((s, n))
    meta = read_info(tmp_path / "r.parquet").metadata
    assert meta["capabilities"]["returns"] is True and "not_measurable" not in meta
    assert meta["returns"]["source"] == "rewards" and meta["returns"]["iterations"] == 6
    assert _by_iteration(meta["returns"]) == _expected(per) and sum(len(v) for v in per.values()) >= 2
    rep = lstm_probe.summarize(tmp_path / "r.parquet")
    assert rep.returns.episodes == sum(len(v) for v in per.values()) and rep.returns.partial == 0


@pytest.mark.parametrize("kind", ["extend", "add", "multi"])
def test_torchrl_collectors_without_a_batch_say_why(tmp_path, kind):
    """A collector given a replay buffer extends it with its batch (the record as the buffer's rewards say); one that
    adds each step to it (extend_buffer=False) or a multi-process collector leaves the probe no batch: the log says
    why, and declares no returns."""
    pytest.importorskip("torchrl")
    from torchrl.collectors import Collector, MultiSyncCollector
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    from lstm_probe.integrations.torchrl import build, probe
    from lstm_probe.integrations.torchrl.returns import ELSEWHERE, STEPWISE

    torch.set_num_threads(1)
    env, actor, critic, _ = build("CartPole-v1", n_envs=2, hidden_size=8, seed=0)
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    if kind == "multi":
        collector = MultiSyncCollector([_make_cartpole, _make_cartpole], actor, frames_per_batch=32, total_frames=64)
    else:
        kw = {"replay_buffer": rb, "extend_buffer": kind == "extend"}
        collector = Collector(env, actor, frames_per_batch=48, total_frames=144, **kw)
    with probe([actor, critic], tmp_path / "r.parquet", force=True):
        for _ in collector:
            pass
    collector.shutdown()
    meta = read_info(tmp_path / "r.parquet").metadata
    rep = lstm_probe.summarize(tmp_path / "r.parquet")
    if kind == "extend":  # the buffer holds the batches, (envs, steps) each
        rewards, dones = rb[:]["next", "reward"].double(), rb[:]["next", "done"]
        rewards = torch.cat(list(rewards.reshape(3, 2, 24, 1)), dim=1)
        dones = torch.cat(list(dones.reshape(3, 2, 24, 1)), dim=1)
        ended = []
        for i in range(2):
            s, n = 0.0, 0
            for t in range(72):
                s, n = s + rewards[i, t, 0].item(), n + 1
                if dones[i, t, 0]:
                    ended.append((s, n))
                    s, n = 0.0, 0
        assert meta["capabilities"]["returns"] is True and "not_measurable" not in meta
        assert rep.returns.episodes == len(ended) >= 2
        assert sum(rep.returns.by_iteration["episodes"]) == len(ended)
        assert max(rep.returns.by_iteration["return_max"]) == max(r for r, _ in ended)
        return
    why = STEPWISE if kind == "add" else ELSEWHERE
    assert "returns" not in meta["capabilities"] and meta["not_measurable"] == {"returns": why}
    assert rep.returns is None and "returns" not in rep.to_dict()
    said = [u for u in rep.unavailable if u.startswith("returns")]
    assert said == [f"returns (the episodes each iteration ended): not recorded for this run ({why})"]
