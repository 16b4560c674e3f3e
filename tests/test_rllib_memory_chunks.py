"""RLlib's memory measurement reads each update's own episode chunks (it read every update's to the first update's
longest chunk): a real tiny RLlib run on an env whose first episodes are 3 steps long and later ones 200, so the
first update's chunks are short and later updates' are whole fragments. The records' lags and pairs are exactly those
the update's chunks (read back from the log's value-pass rows) give; with a bound below the chunks, the log and the
Memory panel say how many updates were cut."""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ray.rllib")

import lstm_probe
from lstm_probe.integrations import rllib
from lstm_probe.measure.memory import lags, sample_steps

pytestmark = pytest.mark.rllib


class Growing(gym.Env):
    """Episodes of 3 steps, from the 7th on of 200 (each instance counts its own)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config=None):
        self.episodes = self.t = self.length = 0

    def reset(self, *, seed=None, options=None):
        self.t, self.length = 0, 3 if self.episodes < 6 else 200
        self.episodes += 1
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= self.length, False, {}

    def _obs(self):
        return np.array([self.t / 200, self.episodes % 2], np.float32)


def _run(out: Path, iterations: int = 4) -> None:
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    config = (
        PPOConfig()
        .environment(Growing)
        .env_runners(num_env_runners=0, rollout_fragment_length=16, num_envs_per_env_runner=1)
        .training(train_batch_size_per_learner=16, minibatch_size=16, num_epochs=1)
        .rl_module(model_config=DefaultModelConfig(use_lstm=True, max_seq_len=8, lstm_cell_size=8))
        .debugging(seed=0)
    )
    rllib.probe_config(config, f"{out}/", memory=True)
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", num_cpus=2)
    try:
        algo = config.build_algo()
        try:
            for _ in range(iterations):
                algo.train()
            rllib.close(algo)
        finally:
            algo.stop()
    finally:
        ray.shutdown()


def _chunks(log: Path) -> dict[int, list[tuple[int, bool]]]:
    """Iteration -> each chunk's (steps, whether it starts its episode), from the value pass's rows (one env: an
    episode is one chunk of an update), the appended bootstrap step included."""
    df = lstm_probe.load(log, vectors=False)
    v = df[(df["phase"] == "value") & (df["t"] >= 0) & ~df["padding"] & (df["layer"] == 0)]
    out: dict[int, list[tuple[int, bool]]] = {}
    for (it, _), g in v.groupby(["iteration", "episode"]):
        out.setdefault(int(it), []).append((len(g), int(g["episode_step"].min()) == 0))
    return out


def _expected(chunks: list[tuple[int, bool]], cap: int) -> list[tuple[int, int]]:
    """(k, pairs) of an update: the sampled steps of its longest chunk (read to ``cap``), each chunk's step t within
    its episode back to k steps (t at an episode-start chunk, t + 1 after a stored state)."""
    longest = min(max(n for n, _ in chunks), cap)
    reach = [t if start else t + 1 for n, start in chunks for t in sample_steps(longest) if t < min(n, cap)]
    reach = [r for r in reach if r >= 1]
    out = []
    for k in lags(longest):
        pairs = sum(r >= k for r in reach)
        if not pairs:
            break
        out.append((k, pairs))
    return out


@pytest.mark.parametrize("cap", [None, 10])
def test_each_update_reads_its_own_chunks(tmp_path: Path, monkeypatch, cap) -> None:
    from lstm_probe.integrations.rllib import memory

    if cap is not None:  # a bound below the later updates' chunks (the learner runs in this process)
        monkeypatch.setattr(memory, "MAX_STEPS", cap)
    _run(tmp_path / "log")
    chunks = _chunks(tmp_path / "log")
    longest = {it: max(n for n, _ in c) for it, c in chunks.items()}
    assert sorted(longest) == [0, 1, 2, 3] and longest[0] <= 4 and longest[3] == 17  # a fragment and its bootstrap
    meta = lstm_probe.read_info(tmp_path / "log").metadata["memory"]
    rec = meta["records"]
    bound = cap or memory.MAX_STEPS
    for it, c in chunks.items():
        got = [(k, p) for i, k, p in zip(rec["iteration"], rec["k"], rec["pairs"], strict=True) if i == it]
        assert got == _expected(c, bound), it
    assert rec["module"] == ["actor"] * len(rec["k"])  # one shared LSTM
    read = min(max(longest.values()), bound)
    cut = sum(n > bound for n in longest.values())
    assert (meta["rollout_length"], meta["lags"]) == (read, lags(read))
    assert meta["sampling"]["max_chunk_steps"] == bound and meta["sampling"]["cut_updates"] == cut
    assert cut == (3 if cap else 0)  # iterations 1 to 3
    text = "\n".join(
        str(getattr(b, "text", b)) for blocks in lstm_probe.summarize(tmp_path / "log").text() for b in blocks
    )
    words = " ".join(text.replace("│", " ").split())
    said = f"each update's chunks read whole (the longest {read} steps, its appended bootstrap step included)"
    assert said + (f"; {cut} update(s) had longer chunks, read to their first {cap} steps" if cap else "") in words
