"""The ``obs`` and ``info`` columns of sb3 rollout rows (``ProbeCallback(capture_obs=True, info=[KEY, ...])``,
``lstm-probe run --capture-obs --info KEY``): what linear probes read targets from (``lstm_probe.probe``).

``obs``: at each rollout call, the observation sb3-contrib passes to the policy (``ppo_recurrent.py:
collect_rollouts`` converts ``self._last_obs``, after any VecNormalize), flattened to ``obs_size`` floats.

``info``: ``info[KEY]`` for the observation that went in, as one float vector column whose order is the
``info_keys`` metadata, not one column per key: the schema's columns are declared once (``schema.COLUMNS``),
so a reader, the writer's buffers and docs/schema.md never depend on a run's keys, and any number of keys costs
one column. The info that belongs to an observation is the one the env returned with it: the step's info,
or, after an episode ended, the reset info of the next episode's first observation (``DummyVecEnv.step_wait``
keeps it in ``reset_infos``; the step's info then describes the terminal observation).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from lstm_probe.contract import Grid
from lstm_probe.errors import BadInput


class InfoKeyWarning(UserWarning):
    """An ``--info KEY`` the env's info never held in the run: the log's info:KEY has no value."""


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _innermost(env: Any) -> Any:
    """The VecEnv under any VecEnvWrapper: a wrapper's own ``reset_infos`` is never updated."""
    while hasattr(env, "venv"):
        env = env.venv
    return env


class Observations:
    """Fills rollout grids' ``obs`` and ``info`` columns while capture is on."""

    def __init__(self, capture_obs: bool, keys: Sequence[str]):
        if isinstance(keys, str):
            keys = [keys]
        self.capture_obs = bool(capture_obs)
        self.keys = [str(k) for k in keys]
        if len(set(self.keys)) != len(self.keys):
            raise BadInput(f"info keys repeat: {self.keys}")
        self.active = self.capture_obs or bool(self.keys)
        self.info = np.zeros((0, 0), np.float32)
        self.unseen = set(self.keys)
        """The keys no info dict has held yet."""

    def start(self, model: Any) -> dict[str, Any]:
        """Checks the observation space; the metadata keys of the columns that will be filled."""
        meta: dict[str, Any] = {}
        if self.capture_obs:
            shape = getattr(model.observation_space, "shape", None)
            if not shape:
                raise BadInput(f"--capture-obs needs an array observation space, not {model.observation_space}")
            meta["obs_size"] = int(np.prod(shape))
        if self.keys:
            meta["info_keys"] = list(self.keys)
            n_envs = int(model.n_envs)
            self.info = np.full((n_envs, len(self.keys)), np.nan, np.float32)
            resets = getattr(_innermost(model.env), "reset_infos", None) or [{}] * n_envs
            self._set(resets)
        return meta

    def step(self, model: Any, dones: np.ndarray, infos: Sequence[dict[str, Any]]) -> None:
        """After an env step: the info of each env's next observation."""
        resets = getattr(_innermost(model.env), "reset_infos", None)
        chosen = [resets[i] if d and resets is not None else infos[i] for i, d in enumerate(dones)]
        self._set(chosen)

    def _set(self, infos: Sequence[dict[str, Any]]) -> None:
        for i in range(len(self.info)):
            src = infos[i] if i < len(infos) else {}
            self.info[i] = [_number(src.get(k, math.nan)) for k in self.keys]
            if self.unseen:
                self.unseen.difference_update(src.keys())

    def warn_unseen(self) -> None:
        """At the log's close: a warning for each key the env's info never held (once)."""
        for key in sorted(self.unseen):
            warnings.warn(
                f"--info {key}: the env's info never held {key!r} in this run, so the log holds no values for "
                f"info:{key} (the probes report leaves it out)",
                InfoKeyWarning,
                stacklevel=2,
            )
        self.unseen = set()

    def fill(self, grid: Grid, model: Any) -> None:
        """The grid of one rollout call (N envs, one step): obs and info as (N, 1, width)."""
        if self.capture_obs:
            obs = np.array(model._last_obs, np.float32)  # a copy: the writer may read it later
            grid.obs = obs.reshape(obs.shape[0], 1, -1)
        if self.keys:
            grid.info = self.info.copy()[:, None, :]
