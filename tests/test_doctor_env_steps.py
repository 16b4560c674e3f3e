"""The doctor on how a rollout's env_step advances (own loops, real traced loops): a global counter tagged as each env's
step (CleanRL's global_step, N a step at N envs) is named with its fix, and the Sequences section withholds the
episode figures read from it; the ways legit logs advance otherwise (one env, ``every``, kept env columns, a resumed
run's second log, iterations thinned, gaps of varied size) are not named, and their sections read as before."""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import lstm_probe
from lstm_probe import summarize

N, H, STEPS = 4, 8, 12


def _loop(out: Path | str, env_step: Callable[[int, int], int], *, n: int = N, iterations=(0, 1), **capture) -> None:
    """``n`` envs, a rollout of STEPS one-step calls an iteration (``iterations``: their numbers), each tagged
    ``env_step(iteration, step)``, the state reset where an episode ends (at random), then the bootstrap call."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    lstm = torch.nn.LSTM(3, H)
    state, done = (torch.zeros(1, n, H), torch.zeros(1, n, H)), np.zeros(n, bool)
    with lstm_probe.trace(lstm, out, writer="thread", **{"force": True, **capture}) as probe, torch.no_grad():
        for it in iterations:
            for t in range(STEPS + 1):
                phase = "rollout" if t < STEPS else "bootstrap"
                tags = dict(iteration=it, env=np.arange(n), env_step=env_step(it, t), episode_start=done)
                keep = torch.as_tensor(1.0 - done, dtype=torch.float32).view(1, n, 1)
                with probe.tag(phase=phase, **tags):
                    _, new = lstm(torch.randn(1, n, 3), (keep * state[0], keep * state[1]))
                if phase == "rollout":
                    state, done = new, rng.random(n) < 0.2


def own(it: int, t: int) -> int:
    return it * STEPS + t


def test_a_global_counter_as_env_step_is_named_with_its_fix(tmp_path):
    """CleanRL's global_step (it * STEPS + t + 1) * N: every advance of an env's rollout calls is N."""
    _loop(tmp_path / "g.parquet", lambda it, t: (own(it, t) + 1) * N)
    rep = summarize(tmp_path / "g.parquet")
    (p,) = rep.doctor.problems
    assert (p.kind, p.phase, p.count) == ("global_env_step", "rollout", 2 * N * (STEPS - 1))
    assert p.first == {"call": 1, "module": "root", "phase": "rollout", "env": 0, "env_step": 2 * N, "stride": N}
    assert f"advances by {N} at every step" in p.text and "env_step=first + step" in p.text
    assert "not global_step" in p.text and rep.findings.count(p.text) == 1
    s = rep.sequences
    assert s.env_step_stride == N and s.episode_length == {} and s.episodes_completed == 0
    (note,) = [u for u in rep.unavailable if u.startswith("episode lengths")]
    assert f"advances by {N} a step" in note
    assert rep.to_dict()["sequences"]["env_step_stride"] == N
    # the same loop tagged with each env's own step: nothing named, the episodes counted, no stride in the JSON
    _loop(tmp_path / "ok.parquet", own)
    rep = summarize(tmp_path / "ok.parquet")
    assert rep.doctor.problems == [] and rep.sequences.episodes_completed > 0 and rep.sequences.episode_length
    assert rep.sequences.env_step_stride is None and "env_step_stride" not in rep.to_dict()["sequences"]


@pytest.mark.parametrize(
    "name",
    ["one_env_global", "every", "kept_columns", "resumed", "thinned", "varied_gaps"],
)
def test_legit_advances_are_not_named(tmp_path, name):
    out = tmp_path / "run.parquet"
    if name == "one_env_global":  # at one env a global counter is the env's own step
        _loop(out, lambda it, t: own(it, t) + 1, n=1)
    elif name == "every":
        _loop(out, own, every=2)
    elif name == "kept_columns":
        _loop(out, own, trace_envs=2, other_envs="none")
    elif name == "resumed":  # a second log of the run, its call count restarted, its env steps going on
        out = f"{tmp_path}/run/"
        _loop(out, own, iterations=(0, 1), shard="a", force=False)
        _loop(out, own, iterations=(2, 3), shard="b", force=False)
    elif name == "thinned":  # iterations 0, 3 and 6 alone: the env steps jump between them
        _loop(out, own, iterations=(0, 3, 6))
    else:  # advances of 2 and 3 in turn, never 1: not a global counter's one stride
        _loop(out, lambda it, t: 5 * own(it, t) // 2)
    rep = summarize(out)
    assert rep.doctor.problems == [], rep.doctor.findings
    if name == "resumed":  # both logs read as one
        assert set(lstm_probe.load(out, vectors=False).iteration) == {0, 1, 2, 3}
    assert rep.sequences.env_step_stride is None and "env_step_stride" not in rep.to_dict()["sequences"]
