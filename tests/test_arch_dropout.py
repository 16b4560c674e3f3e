"""Each integration records the traced LSTM's dropout in the log's ``architecture.modules`` (the report names it where
the provenance check fails above layer 0 alone): an own loop (``lstm_probe.trace``) and sb3-contrib's RecurrentPPO
with ``lstm_kwargs={"dropout": ...}``; TorchRL's in tests/test_torchrl_trial.py. And whether dropout acted (the
capture core's ``training_mode``, per phase): sb3 rolls out in eval mode and trains in training mode; an own loop in
eval mode throughout gets no dropout blamed for its provenance failure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

import lstm_probe


def test_own_loop_records_dropout(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {"lstm": torch.nn.LSTM(3, 4, num_layers=2, dropout=0.25), "cell": torch.nn.LSTMCell(3, 4)}
    )
    log = tmp_path / "own.parquet"
    with torch.no_grad(), lstm_probe.trace(model, log) as probe:
        with probe.tag(phase="rollout", iteration=0):
            model["lstm"](torch.zeros(1, 2, 3))
    modules = lstm_probe.read_info(log).metadata["architecture"]["modules"]
    assert modules["lstm"] == {"kind": "LSTM", "hidden_size": 4, "num_layers": 2, "input_size": 3, "dropout": 0.25}
    assert "dropout" not in modules["cell"]


def test_sb3_records_lstm_kwargs_dropout(tmp_path: Path) -> None:
    from sb3_contrib import RecurrentPPO

    from lstm_probe.integrations.sb3 import ProbeCallback

    torch.set_num_threads(1)
    kwargs = {"lstm_hidden_size": 8, "n_lstm_layers": 2, "lstm_kwargs": {"dropout": 0.1}}
    model = RecurrentPPO(
        "MlpLstmPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=kwargs, seed=0
    )
    log = tmp_path / "sb3.parquet"
    model.learn(16, callback=ProbeCallback(log))
    modules = lstm_probe.read_info(log).metadata["architecture"]["modules"]
    assert {n: (m["num_layers"], m["dropout"]) for n, m in modules.items()} == {"actor": (2, 0.1), "critic": (2, 0.1)}


def test_sb3_records_training_mode_and_the_report_names_it(tmp_path: Path) -> None:
    """sb3-contrib's rollout runs the policy in eval mode (``set_training_mode(False)``), ``train()`` in training
    mode: dropout acts in training alone, so layer 1's train states differ from the rollout's (layer 0's agree)
    and the report names dropout with the counts (one rollout of 32 steps; the minibatch's per-step loop of 18
    steps, actor and critic)."""
    from sb3_contrib import RecurrentPPO

    from lstm_probe.integrations.sb3 import ProbeCallback

    torch.set_num_threads(1)
    kwargs = {"lstm_hidden_size": 8, "n_lstm_layers": 2, "lstm_kwargs": {"dropout": 0.2}}
    model = RecurrentPPO(
        "MlpLstmPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=kwargs, seed=0
    )
    log = tmp_path / "sb3.parquet"
    model.learn(32, callback=ProbeCallback(log))
    meta = lstm_probe.read_info(log).metadata
    assert meta["training_mode"] == {
        "actor": {"rollout": [0, 32], "train": [18, 18]},
        "critic": {"rollout": [0, 32], "bootstrap": [0, 1], "train": [18, 18]},
    }
    summary = lstm_probe.summarize(log)
    st = summary.staleness
    assert st.provenance_ok is False
    layer0, layer1 = st.provenance_by_layer
    assert layer0["max_drift_h"] == 0.0 and layer1["max_drift_h"] > st.provenance_tolerance
    assert st.provenance_dropout == (
        "dropout between the LSTM layers (nn.LSTM dropout: actor 0.2, critic 0.2; in rollout, 0 of 64 calls in "
        "training mode; in train, 36 of 36 calls in training mode): the states of the layers above the first are "
        "computed with other dropout masks in the rollout than in training (or without dropout in one of them), so "
        "they differ by construction; layer 0 agrees: no provenance bug"
    )
    assert summary.warnings == [f"provenance check FAILED on the layers above the first alone: {st.provenance_dropout}"]


def test_own_loop_in_eval_mode_gets_no_dropout_blamed(tmp_path: Path) -> None:
    """A 2-layer LSTM with dropout 0.5 in eval mode throughout (dropout never acts), whose training starts each
    sequence from the stored states with layer 1's lost (zeroed): the provenance check fails above layer 0 alone,
    and the report calls it what it is, a provenance failure, not dropout (the log records no call in training
    mode)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n, steps = 4, 16
    lstm = nn.LSTM(3, 8, num_layers=2, dropout=0.5).eval()
    state = (torch.zeros(2, n, 8), torch.zeros(2, n, 8))
    done = np.zeros(n, bool)
    log = tmp_path / "own.parquet"
    with lstm_probe.trace(lstm, log, metadata={"env_id": "random", "n_envs": n}) as probe:
        for it in range(2):
            first, initial, xs, dones = it * steps, state, torch.randn(steps, n, 3), np.zeros((steps, n), bool)
            with torch.no_grad():
                for t in range(steps):
                    keep = torch.tensor(1.0 - done, dtype=torch.float32).view(1, n, 1)
                    tags = {"iteration": it, "env": np.arange(n), "env_step": first + t, "episode_start": done}
                    with probe.tag(phase="rollout", **tags):
                        _, state = lstm(xs[t : t + 1], (keep * state[0], keep * state[1]))
                    dones[t], done = done, rng.random(n) < 0.1
            for mb, envs in enumerate([np.arange(0, n // 2), np.arange(n // 2, n)]):
                s = (initial[0][:, envs].clone(), initial[1][:, envs].clone())
                s[0][1], s[1][1] = 0, 0  # the bug: layer 1's stored state lost
                at = np.arange(first, first + steps)[None, :]
                starts = dones[:, envs].T
                with probe.tag(
                    phase="train", iteration=it, epoch=0, minibatch=mb, env=envs, env_step=at, episode_start=starts
                ):
                    for t in range(steps):
                        keep = torch.tensor(1.0 - dones[t, envs], dtype=torch.float32).view(1, -1, 1)
                        _, s = lstm(xs[t : t + 1, envs], (keep * s[0], keep * s[1]))
    meta = lstm_probe.read_info(log).metadata
    assert meta["training_mode"] == {"root": {"rollout": [0, 32], "train": [0, 64]}}
    summary = lstm_probe.summarize(log)
    st = summary.staleness
    assert st.provenance_ok is False
    layer0, layer1 = st.provenance_by_layer
    assert layer0["max_drift_h"] == 0.0 and layer1["max_drift_h"] > 0.5
    assert st.provenance_dropout is None and "provenance_dropout" not in summary.to_dict()["staleness"]
    (warning,) = [w for w in summary.warnings if "provenance" in w]
    assert warning.startswith("provenance check FAILED: train states before the first optimizer step differ")
    assert not any("dropout" in line for line in [*summary.warnings, *summary.findings, *summary.verdict.lines])


def test_no_training_mode_without_dropout(tmp_path: Path) -> None:
    """A module without dropout (and a cell) records no training_mode: such logs' metadata is unchanged."""
    model = torch.nn.ModuleDict({"lstm": torch.nn.LSTM(3, 4, num_layers=2), "cell": torch.nn.LSTMCell(3, 4)})
    log = tmp_path / "own.parquet"
    with torch.no_grad(), lstm_probe.trace(model, log) as probe:
        with probe.tag(phase="rollout", iteration=0):
            model["lstm"](torch.zeros(1, 2, 3))
            model["cell"](torch.zeros(2, 3))
    assert "training_mode" not in lstm_probe.read_info(log).metadata
