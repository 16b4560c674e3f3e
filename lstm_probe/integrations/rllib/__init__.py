"""Ray RLlib (new API stack) integration: every env runner and learner process traces its own LSTM calls.

``probe.py``: the probes, the provenance connector, :func:`probe_config` and :func:`close` (see its
docstring for the RLlib behaviour relied on); ``model.py``: the RLModule's LSTMs and their measured
gradient flow (:func:`arch`); ``train.py``: :func:`run`, training RLlib PPO with the probe
(``lstm-probe run --framework rllib``); ``settings.py``: what the log records of the run's AlgorithmConfig
(:func:`config_metadata`). Everything is re-exported here, loaded on first use;
``options.py``: RLlib's own ``run`` options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lstm_probe.integrations import lazy_names

if TYPE_CHECKING:
    from lstm_probe.integrations.rllib.model import arch, gradient_flow, lstms, role
    from lstm_probe.integrations.rllib.options import Rllib
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
        probe_config,
        provenance,
        train_grid,
    )
    from lstm_probe.integrations.rllib.settings import config_metadata
    from lstm_probe.integrations.rllib.train import run

# name -> the submodule that defines it; loaded on first use, so that ``rllib.options`` (the CLI's flags)
# imports nothing of Ray
_LAZY = {
    **dict.fromkeys(("arch", "gradient_flow", "lstms", "role"), "model"),
    "Rllib": "options",
    **dict.fromkeys(
        (
            *("CALL_BLOCK", "COLUMN", "EVAL_WORKER", "FIELDS", "KEY", "LEARNER_BLOCK", "LearnerProbe", "Options"),
            *("ProvenanceConnector", "RolloutProbe", "close", "probe_config", "provenance"),
            "train_grid",
        ),
        "probe",
    ),
    "run": "train",
    "config_metadata": "settings",
}

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
    "Rllib",
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


__getattr__ = lazy_names(__name__, _LAZY)
