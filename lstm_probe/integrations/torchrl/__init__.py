"""TorchRL: probes on ``LSTMModule`` / ``GRUModule`` (every recurrent backend), in collection, loss and GAE.

Importing this package imports no TorchRL; its names load on first use: ``probe`` (the probe for a user's
own loop, ``hooks.py``), ``TorchRLProbe``, ``run`` (``lstm-probe run --framework torchrl``, ``train.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lstm_probe.integrations.torchrl.hooks import TorchRLProbe, find_modules, probe
    from lstm_probe.integrations.torchrl.train import arch, build, run

_LAZY = {
    "probe": "lstm_probe.integrations.torchrl.hooks",
    "TorchRLProbe": "lstm_probe.integrations.torchrl.hooks",
    "find_modules": "lstm_probe.integrations.torchrl.hooks",
    "run": "lstm_probe.integrations.torchrl.train",
    "arch": "lstm_probe.integrations.torchrl.train",
    "build": "lstm_probe.integrations.torchrl.train",
}
__all__ = ["TorchRLProbe", "arch", "build", "find_modules", "probe", "run"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
