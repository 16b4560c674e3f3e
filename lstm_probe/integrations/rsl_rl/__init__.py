"""rsl_rl (``rsl-rl-lib``, the PPO of Isaac Lab and legged_gym): the probe on a runner the user built.

``runners.py``: :func:`attach`; ``probe.py``: :class:`RslRlProbe` (see its docstring for the rsl_rl behaviour
relied on); ``distill.py``: ``DistillProbe``, a DistillationRunner's;
``envs.py``: envs as rsl_rl's VecEnv (the torch-native Pendulum, gymnasium ids); ``train.py``: :func:`run`
(``lstm-probe run --framework rsl_rl``); ``options.py``: rsl_rl's own ``run`` options; ``deployed.py``: the
deploy layer's loader (``lstm-probe export`` of a checkpoint). Names are loaded on
first use: importing this package (or ``options``) imports no rsl_rl.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lstm_probe.integrations import lazy_names

if TYPE_CHECKING:
    from lstm_probe.integrations.rsl_rl.envs import GymVecEnv, TorchPendulumVecEnv
    from lstm_probe.integrations.rsl_rl.options import RslRl
    from lstm_probe.integrations.rsl_rl.probe import RslRlProbe, recurrent_modules
    from lstm_probe.integrations.rsl_rl.runners import attach
    from lstm_probe.integrations.rsl_rl.train import make_env, run, train_cfg

_LAZY = {
    "GymVecEnv": "envs",
    "TorchPendulumVecEnv": "envs",
    "RslRl": "options",
    "RslRlProbe": "probe",
    "attach": "runners",
    "recurrent_modules": "probe",
    "make_env": "train",
    "run": "train",
    "train_cfg": "train",
}

__all__ = [
    "GymVecEnv",
    "RslRl",
    "RslRlProbe",
    "TorchPendulumVecEnv",
    "attach",
    "make_env",
    "recurrent_modules",
    "run",
    "train_cfg",
]


__getattr__ = lazy_names(__name__, _LAZY)
