"""Each integration records the traced LSTM's dropout in the log's ``architecture.modules`` (the report names it where
the provenance check fails above layer 0 alone): an own loop (``lstm_probe.trace``) and sb3-contrib's RecurrentPPO
with ``lstm_kwargs={"dropout": ...}``; TorchRL's in tests/test_torchrl_trial.py."""

from __future__ import annotations

from pathlib import Path

import torch

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
