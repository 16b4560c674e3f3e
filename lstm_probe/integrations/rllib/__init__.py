"""Ray RLlib (new API stack) integration: every env runner and learner process traces its own LSTM calls.

``probe.py``: the probes, the provenance connector, :func:`probe_config` and :func:`close` (see its
docstring for the RLlib behaviour relied on); ``model.py``: the RLModule's LSTMs and their measured
gradient flow (:func:`arch`); ``run.py``: :func:`run`, training RLlib PPO with the probe
(``lstm-probe run --framework rllib``). Everything is re-exported here.
"""

from __future__ import annotations

from lstm_probe.integrations.rllib.model import arch, gradient_flow, lstms, role
from lstm_probe.integrations.rllib.probe import (
    CALL_BLOCK,
    COLUMN,
    EVAL_WORKER,
    FIELDS,
    KEY,
    LEARNER_BLOCK,
    LearnerProbe,
    Options,
    ProvenanceConnector,
    RolloutProbe,
    close,
    config_metadata,
    probe_config,
    provenance,
    train_grid,
)
from lstm_probe.integrations.rllib.run import run

__all__ = [
    "CALL_BLOCK",
    "COLUMN",
    "EVAL_WORKER",
    "FIELDS",
    "KEY",
    "LEARNER_BLOCK",
    "LearnerProbe",
    "Options",
    "ProvenanceConnector",
    "RolloutProbe",
    "arch",
    "close",
    "config_metadata",
    "gradient_flow",
    "lstms",
    "probe_config",
    "provenance",
    "role",
    "run",
    "train_grid",
]
