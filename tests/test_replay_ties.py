"""Replay's verdict where the trace cannot tell loops apart: loops that handle the LSTM state differently all
agreeing at every step read 'cannot tell', naming them (was: 'correct', the others in a parenthesis), while the
pairs computed alike ('state not fed back' and 'reset every step') or the correct loop beside its float16 twin
keep their verdict."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from sb3_contrib import RecurrentPPO

import lstm_probe
from lstm_probe.deploy.replay import (
    CORRECT,
    EVERY_STEP,
    FLOAT16,
    NO_RESET,
    NOT_FED,
    SWAPPED,
    TIE,
    Loop,
    Replay,
    _verdict,
)

TIP = "agree on this trace; record longer episodes / more steps"


def _loops(agreeing):
    names = [CORRECT, NOT_FED, EVERY_STEP, NO_RESET, SWAPPED, FLOAT16]
    return [Loop(n, 10 if n in agreeing else 3, 10, None if n in agreeing else (0, 3), 0.0) for n in names]


@pytest.mark.parametrize(
    ("agreeing", "want"),
    [
        ({CORRECT, FLOAT16}, (CORRECT, [FLOAT16])),  # float16 is the correct loop's state handling
        ({NOT_FED, EVERY_STEP}, (NOT_FED, [EVERY_STEP])),  # one computation, both named
        ({CORRECT, NO_RESET, FLOAT16}, (TIE, [CORRECT, NO_RESET, FLOAT16])),
        ({NOT_FED, EVERY_STEP, SWAPPED}, (TIE, [NOT_FED, EVERY_STEP, SWAPPED])),
        ({NO_RESET}, (NO_RESET, [])),
    ],
)
def test_the_verdict_of_loops_that_agree(agreeing, want):
    assert _verdict(_loops(agreeing), 1e-4) == want


def test_a_tie_names_the_loops_that_handle_the_state_differently():
    r = Replay(TIE, [CORRECT, NO_RESET, FLOAT16], None, _loops({CORRECT, NO_RESET, FLOAT16}), 10, 1, 1e-4)
    assert r.headline == f"cannot tell: loops correct and not reset at episode starts {TIP}"
    r.also = [NOT_FED, EVERY_STEP, NO_RESET, SWAPPED]
    assert r.headline == (
        f"cannot tell: loops state not fed back, not reset at episode starts and h and c swapped {TIP}"
    )
    assert r.to_dict()["headline"] == r.headline and r.to_dict()["verdict"] == "cannot tell"
    assert Replay(CORRECT, [FLOAT16], None, [], 10, 1, 1e-4).headline == "correct"


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    torch.set_num_threads(1)
    kw = {"lstm_hidden_size": 8}
    model = RecurrentPPO(
        "MlpLstmPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0, policy_kwargs=kw
    )
    model.learn(32)
    d = tmp_path_factory.mktemp("ties")
    model.save(d / "model.zip")
    return model, d


def test_short_cartpole_episodes_read_cannot_tell_not_correct(cartpole):
    """Two envs, each recorded for 5 steps of its first episode by a correct loop: no episode ends, so the loop
    that never resets runs exactly as the correct one does, and the trace cannot tell them apart."""
    model, d = cartpole
    rows = []
    for e in range(2):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=e)
        state = None
        for t in range(5):
            action, state = model.predict(obs[None], state=state, episode_start=np.array([t == 0]), deterministic=True)
            rows.append({"env": e, "step": t, "obs": obs.tolist(), "action": int(action[0]), "episode_start": t == 0})
            obs, *_ = env.step(int(action[0]))
    trace = d / "short.parquet"
    pq.write_table(pa.Table.from_pylist(rows), trace)
    r = lstm_probe.replay(trace, d / "model.zip")
    assert r.verdict == TIE and {CORRECT, NO_RESET} <= set(r.also), (r.verdict, r.also)  # was: 'correct'
    assert r.headline.startswith("cannot tell: loops correct") and r.headline.endswith(TIP), r.headline
    assert "not reset at episode starts" in r.headline and "reset every step" not in r.headline
    assert any("record until an episode ends and the next begins" in n for n in r.notes), r.notes
    done = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "replay", str(trace), "--policy", str(d / "model.zip")],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "300", "NO_COLOR": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"verdict: {r.headline}\n" in done.stdout, done.stdout
