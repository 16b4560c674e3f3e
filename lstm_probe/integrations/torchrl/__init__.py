"""TorchRL: probes on ``LSTMModule`` / ``GRUModule`` (every recurrent backend), in collection, loss and GAE.

Importing this package imports no TorchRL; its names load on first use: ``probe`` (the probe for a user's
own loop, ``hooks.py``), ``TorchRLProbe``, ``run`` (``lstm-probe run --framework torchrl``, ``train.py``).
``deployed.py`` is the deploy layer's loader (``lstm-probe export run.model.pt``), named by the framework's
``FRAMEWORKS`` entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lstm_probe.integrations import lazy_names

if TYPE_CHECKING:
    from lstm_probe.integrations.torchrl.hooks import TorchRLProbe, probe
    from lstm_probe.integrations.torchrl.names import find_modules
    from lstm_probe.integrations.torchrl.train import build, run

_LAZY = {
    "probe": "hooks",
    "TorchRLProbe": "hooks",
    "find_modules": "names",
    "run": "train",
    "build": "train",
}
__all__ = ["TorchRLProbe", "build", "find_modules", "probe", "run"]


__getattr__ = lazy_names(__name__, _LAZY)
