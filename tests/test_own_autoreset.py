"""The vector env's autoreset mode in an own loop's log (``lstm_probe.trace(..., envs=envs)``): a real gymnasium
SyncVectorEnv stepped by a tiny CleanRL-shaped loop (the state reset on the done flags of the step before, tagged
as episode_start). Under NEXT_STEP (gymnasium >= 1.1's default) the doctor names each tagged episode start as the
no-op autoreset step it is; under SAME_STEP it says every step is a real transition; a log without the mode says
once what it does not know."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import lstm_probe
from lstm_probe.errors import BadInput

N, T = 3, 60


def run(tmp_path, mode, *, envs_given=True):
    """The log, and each env step's (obs, reward, done) as the loop saw them: (T, N, 4), (T, N), (T, N)."""
    torch.manual_seed(0)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(N)], autoreset_mode=mode)
    lstm, head = nn.LSTM(4, 8), nn.Linear(8, 2)
    out = tmp_path / f"{mode.value}.parquet"
    probe = lstm_probe.trace(lstm, out, force=True, envs=envs if envs_given else None, metadata={"n_envs": N})
    probe.start()
    obs, _ = envs.reset(seed=0)
    done = np.zeros(N, bool)
    state = (torch.zeros(1, N, 8), torch.zeros(1, N, 8))
    seen = {"obs": [], "reward": [], "done": []}
    with torch.no_grad():
        for t in range(T):
            keep = torch.tensor(1.0 - done, dtype=torch.float32).view(1, N, 1)  # CleanRL's reset on next_done
            with probe.tag(phase="rollout", iteration=0, env=np.arange(N), env_step=t, episode_start=done):
                y, state = lstm(torch.tensor(obs, dtype=torch.float32)[None], (keep * state[0], keep * state[1]))
            action = head(y[0]).argmax(-1).numpy()
            obs, reward, term, trunc, _ = envs.step(action)
            done = term | trunc
            seen["obs"].append(obs)
            seen["reward"].append(reward)
            seen["done"].append(done)
    probe.close()
    envs.close()
    return out, {k: np.array(v) for k, v in seen.items()}


def test_next_step_autoreset_is_named_with_its_count(tmp_path):
    out, seen = run(tmp_path, gym.vector.AutoresetMode.NEXT_STEP)
    # what gymnasium does: the step after a done returns reward 0 and no done (the action ignored)
    after = seen["done"][:-1]
    assert after.sum() >= 2
    assert (seen["reward"][1:][after] == 0).all() and not seen["done"][1:][after].any()
    rep = lstm_probe.summarize(out)
    assert lstm_probe.read_info(out).metadata["autoreset_mode"] == "NextStep"
    (p,) = rep.doctor.problems
    # every episode start the loop tagged (the done flags of the step before, past step 0) is an autoreset step
    steps, envs = np.nonzero(after)
    assert p.kind == "next_step_autoreset" and p.count == int(after.sum()) == rep.doctor.autoresets
    first = int(np.argmin(steps * N + envs))
    assert (p.first["env"], p.first["env_step"]) == (int(envs[first]), int(steps[first]) + 1)
    assert "terminal one" in p.text and "AutoresetMode.SAME_STEP" in p.text and "mask the autoreset steps" in p.text
    assert rep.findings.count(p.text) == 1
    assert not any("autoreset mode" in u for u in rep.unavailable)


def test_same_step_autoreset_is_a_fact(tmp_path):
    out, seen = run(tmp_path, gym.vector.AutoresetMode.SAME_STEP)
    # what gymnasium does: the step that ends an episode returns the next one's first observation, reward earned
    assert seen["done"].sum() >= 2 and (seen["reward"] == 1).all()
    rep = lstm_probe.summarize(out)
    assert lstm_probe.read_info(out).metadata["autoreset_mode"] == "SameStep"
    assert rep.doctor.problems == [] and rep.doctor.autoresets == int(seen["done"][:-1].sum())
    assert any(f.startswith("the vector env autoresets in SAME_STEP mode") for f in rep.doctor.facts)
    assert not any("autoreset mode" in u for u in rep.unavailable)


def test_without_the_mode_the_report_says_so_once(tmp_path):
    out, _ = run(tmp_path, gym.vector.AutoresetMode.NEXT_STEP, envs_given=False)
    rep = lstm_probe.summarize(out)
    assert "autoreset_mode" not in lstm_probe.read_info(out).metadata and rep.doctor.problems == []
    assert sum(u.startswith("the vector env's autoreset mode") and "envs=" in u for u in rep.unavailable) == 1


@pytest.mark.parametrize("given", ["next_step", "NEXT_STEP", "NextStep", gym.vector.AutoresetMode.NEXT_STEP])
def test_the_mode_given_itself(tmp_path, given):
    probe = lstm_probe.trace(nn.LSTM(4, 8), tmp_path / "m.parquet", envs=given)
    assert probe.metadata["autoreset_mode"] == "NextStep"


def test_an_env_without_a_mode_is_refused(tmp_path):
    with pytest.raises(BadInput, match="pass the mode itself"):
        lstm_probe.trace(nn.LSTM(4, 8), tmp_path / "m.parquet", envs=object())


@pytest.mark.parametrize("device", [False, True])
def test_rewards_under_next_step_are_gymnasiums_own_episodes(tmp_path, device):
    """Tracer.rewards under NEXT_STEP: each env's step after a done (the autoreset step, reward 0) is in no episode,
    so every iteration's returns and lengths are RecordEpisodeStatistics' (they were one step longer after an env's
    first episode). ``device``: the rewards as torch tensors (summed where they live)."""
    torch.manual_seed(0)
    mode = gym.vector.AutoresetMode.NEXT_STEP
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(N)], autoreset_mode=mode)
    )
    lstm = nn.LSTM(4, 8)
    out = tmp_path / "r.parquet"
    probe = lstm_probe.trace(lstm, out, force=True, envs=envs.env)
    probe.start()
    obs, _ = envs.reset(seed=0)
    done = np.zeros(N, bool)
    state = (torch.zeros(1, N, 8), torch.zeros(1, N, 8))
    gym_episodes: dict[int, list[tuple[float, int]]] = {}
    with torch.no_grad():
        for t in range(4 * T):
            it = t // 40
            keep = torch.tensor(1.0 - done, dtype=torch.float32).view(1, N, 1)
            with probe.tag(phase="rollout", iteration=it, env=np.arange(N), env_step=t, episode_start=done):
                y, state = lstm(torch.tensor(obs, dtype=torch.float32)[None], (keep * state[0], keep * state[1]))
            obs, reward, term, trunc, info = envs.step((y[0, :, 0] > 0).long().numpy())
            done = term | trunc
            probe.rewards(torch.as_tensor(reward) if device else reward, done, iteration=it)
            if "episode" in info:
                ended = info["_episode"]
                rs, ls = info["episode"]["r"][ended], info["episode"]["l"][ended]
                gym_episodes.setdefault(it, []).extend(zip(rs.tolist(), ls.tolist(), strict=True))
    probe.close()
    envs.close()
    rec = lstm_probe.read_info(out).metadata["returns"]
    by = rec["by_iteration"]
    assert rec["source"] == "rewards" and rec["partial"] == 0
    assert sum(len(v) for v in gym_episodes.values()) == rec["episodes"] > 2 * N  # episodes after each env's first
    assert by["iteration"] == sorted(gym_episodes)
    for i, it in enumerate(by["iteration"]):
        r = np.array([e[0] for e in gym_episodes[it]])
        n = np.array([e[1] for e in gym_episodes[it]])
        assert by["episodes"][i] == len(r)
        assert (by["return_sum"][i], by["return_min"][i], by["return_max"][i]) == (r.sum(), r.min(), r.max())
        assert by["length_sum"][i] == n.sum()


@pytest.mark.parametrize("whole", [True, False])
def test_next_step_autoresets_inside_multi_step_rollout_calls(tmp_path, whole):
    """An own loop that runs its LSTM over a rollout's T steps at once (``whole``: one sequence-first call; else a
    per-step loop with its resets, recorded whole in one block of (N, T) tags) writes ``init`` at the call's first
    step only: the episode starts at its later steps are the NEXT_STEP env's autoreset steps too, and are counted
    (the doctor counted the calls' first steps only)."""
    torch.manual_seed(0)
    mode = gym.vector.AutoresetMode.NEXT_STEP
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(N)], autoreset_mode=mode)
    envs.action_space.seed(0)
    lstm = nn.LSTM(4, 8)
    out = tmp_path / "whole.parquet"
    probe = lstm_probe.trace(lstm, out, force=True, envs=envs, metadata={"n_envs": N})
    probe.start()
    obs, _ = envs.reset(seed=0)
    done = np.zeros(N, bool)
    starts = []
    with torch.no_grad():
        for it in range(2):  # random actions collect T steps, then the LSTM runs over them in one block
            xs, st = [], []
            for _ in range(T):
                xs.append(obs)
                st.append(done)
                obs, _, term, trunc, _ = envs.step(envs.action_space.sample())
                done = term | trunc
            x, st = torch.tensor(np.array(xs), dtype=torch.float32), np.array(st)  # (T, N, 4), (T, N)
            starts.append(st)
            tags = dict(iteration=it, env=np.arange(N), env_step=it * T + np.arange(T)[None], episode_start=st.T)
            with probe.tag(phase="rollout", **tags):
                if whole:
                    lstm(x)
                else:
                    s = (torch.zeros(1, N, 8), torch.zeros(1, N, 8))
                    for t in range(T):
                        keep = torch.tensor(1.0 - st[t], dtype=torch.float32).view(1, N, 1)
                        _, s = lstm(x[t : t + 1], (keep * s[0], keep * s[1]))
    probe.close()
    envs.close()
    tagged = np.concatenate(starts)  # (2T, N): every env step's episode_start
    tagged[0] = False  # an env's first step is no autoreset step
    steps, env = np.nonzero(tagged)
    inside = int(tagged[1:T].sum() + tagged[T + 1 :].sum())  # at a call's later steps
    assert (inside, int(tagged.sum())) == (13 - int(tagged[T].sum()), 13)
    rep = lstm_probe.summarize(out)
    (p,) = [p for p in rep.doctor.problems if p.kind == "next_step_autoreset"]
    assert p.count == rep.doctor.autoresets == int(tagged.sum())
    assert (p.first["env"], p.first["env_step"]) == (int(env[0]), int(steps[0]))
