"""sb3-contrib RecurrentPPO (stable-baselines3): the probe as a callback of ``learn()``, and what the CLI does
with a RecurrentPPO.

``callback.py``: :class:`ProbeCallback`, the sb3 Integration (see its docstring for the sb3-contrib behaviour
relied on), with what it puts on the model while ``learn()`` runs (``attach.py``) and what it measures
beside the tracer (``obs.py``, ``metrics.py``, ``whatif.py``, ``memory.py``, ``doctor.py``); ``watch.py``:
``lstm_probe.watch``; ``options.py``: sb3's own options (:class:`Build`, :class:`Measure`); ``run.py``:
``lstm_probe.run``; ``arch.py``: ``lstm_probe.arch``'s analysis; ``commands.py``: the run/arch entries
``integrations.FRAMEWORKS`` names, and :func:`load_model`; ``model_zip.py``: a model.zip read without
unpickling anything; ``deployed.py``: the deploy layer's loader (:func:`loader`, a RecurrentPPO's step with
explicit LSTM state); ``torch_env.py``: the torch-native Pendulum as an SB3 VecEnv.

Names are loaded on first use: importing this package (or ``options``) imports no sb3. ``run``, ``arch`` and
``watch`` are modules of this package; their functions are ``lstm_probe.run``, ``lstm_probe.arch`` and
``lstm_probe.watch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lstm_probe.integrations import lazy_names

if TYPE_CHECKING:
    from lstm_probe.integrations.sb3.arch import Architecture, private_policy, to_dot
    from lstm_probe.integrations.sb3.callback import ProbeCallback, model_metadata
    from lstm_probe.integrations.sb3.commands import default_threads, load_model
    from lstm_probe.integrations.sb3.deployed import Deployed, loader
    from lstm_probe.integrations.sb3.options import Build, Measure
    from lstm_probe.integrations.sb3.torch_env import TorchPendulumVecEnv
    from lstm_probe.integrations.sb3.watch import Watch

_LAZY = {
    "Architecture": "arch",
    "private_policy": "arch",
    "to_dot": "arch",
    "ProbeCallback": "callback",
    "model_metadata": "callback",
    "default_threads": "commands",
    "load_model": "commands",
    "Deployed": "deployed",
    "loader": "deployed",
    "Build": "options",
    "Measure": "options",
    "TorchPendulumVecEnv": "torch_env",
    "Watch": "watch",
}

__all__ = [
    "Architecture",
    "Build",
    "Deployed",
    "Measure",
    "ProbeCallback",
    "TorchPendulumVecEnv",
    "Watch",
    "default_threads",
    "load_model",
    "loader",
    "model_metadata",
    "private_policy",
    "to_dot",
]


__getattr__ = lazy_names(__name__, _LAZY)
