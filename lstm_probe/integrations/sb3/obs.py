"""The ``obs`` and ``info`` columns of sb3 rollout rows (``ProbeCallback(capture_obs=True, info=[KEY, ...])``,
``lstm-probe run --capture-obs --info KEY``): what linear probes read targets from (``lstm_probe.probe``).

``obs``: at each rollout call, the observation sb3-contrib passes to the policy (``ppo_recurrent.py:
collect_rollouts`` converts ``self._last_obs``, after any VecNormalize), flattened to ``obs_size`` floats.
A Dict observation (MultiInputLstmPolicy) is flattened as sb3's feature extractor concatenates it
(:func:`dict_layout`), and the ``obs_keys`` metadata says which slice of the vector is which key.

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


def _part(key: str, space: Any) -> dict[str, Any]:
    """One key's slice of a flattened Dict observation (``start`` is filled in by :func:`dict_layout`)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        size, encoding = int(space.n), "one-hot"
    elif isinstance(space, spaces.MultiDiscrete):
        size, encoding = int(np.sum(space.nvec)), "one-hot"
    elif isinstance(space, spaces.Box | spaces.MultiBinary):
        size, encoding = int(np.prod(space.shape)), "values"
    else:
        raise BadInput(
            f"--capture-obs: the Dict observation's key {key!r} is a {type(space).__name__} space, which sb3's "
            "feature extractor does not take (Box, Discrete, MultiDiscrete and MultiBinary)"
        )
    return {"key": key, "start": 0, "size": size, "encoding": encoding, "space": str(space)}


def dict_layout(space: Any) -> list[dict[str, Any]]:
    """Where each key of a Dict observation lies in its flattened vector: one part per key, in the order sb3
    concatenates them, each flattened as sb3 preprocesses it. stable_baselines3/common/torch_layers.py:
    ``CombinedExtractor.forward`` concatenates the keys in the order of ``observation_space.spaces`` (a
    gymnasium Dict's: sorted, unless built from an OrderedDict); common/preprocessing.py: ``preprocess_obs``
    makes a Discrete key one-hot (``n`` floats), a MultiDiscrete key one one-hot per entry (``sum(nvec)``),
    a MultiBinary or Box key floats, then each extractor flattens it row-major (``nn.Flatten``). An image key's
    pixels are kept as the policy receives them (channel-first after VecTransposeImage, 0..255: the scaling by
    255 and the CNN come after), as a Box observation's capture keeps them."""
    parts, start = [], 0
    for key, sub in space.spaces.items():
        part = _part(str(key), sub)
        part["start"] = start
        start += part["size"]
        parts.append(part)
    return parts


def _one_hot(values: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((len(values), n), np.float32)
    out[np.arange(len(values)), values] = 1.0
    return out


def flatten_dict(obs: dict[str, Any], space: Any) -> np.ndarray:
    """A batch of Dict observations (each key (N, ...)) as (N, obs_size) float32, laid out as
    :func:`dict_layout` says."""
    from gymnasium import spaces

    columns = []
    for key, sub in space.spaces.items():
        value = np.asarray(obs[key])
        n = value.shape[0]
        if isinstance(sub, spaces.Discrete):
            columns.append(_one_hot(value.reshape(n).astype(np.int64) - int(sub.start), int(sub.n)))
        elif isinstance(sub, spaces.MultiDiscrete):
            entries = value.reshape(n, -1).astype(np.int64) - np.asarray(sub.start, np.int64).reshape(1, -1)
            nvec = np.asarray(sub.nvec).reshape(-1)
            columns += [_one_hot(entries[:, j], int(k)) for j, k in enumerate(nvec)]
        else:
            columns.append(value.astype(np.float32).reshape(n, -1))
    return np.concatenate(columns, axis=1)


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
        self.dict_space: Any = None
        """A Dict observation space (its observations flattened by :func:`flatten_dict`); None for an array."""
        self.info = np.zeros((0, 0), np.float32)
        self.unseen = set(self.keys)
        """The keys no info dict has held yet."""

    def start(self, model: Any) -> dict[str, Any]:
        """Checks the observation space; the metadata keys of the columns that will be filled."""
        meta: dict[str, Any] = {}
        if self.capture_obs:
            space = model.observation_space
            self.dict_space = space if hasattr(space, "spaces") and isinstance(space.spaces, dict) else None
            if self.dict_space is not None:
                parts = dict_layout(space)
                meta["obs_size"] = sum(p["size"] for p in parts)
                meta["obs_keys"] = parts
            else:
                shape = getattr(space, "shape", None)
                if not shape:
                    raise BadInput(
                        f"--capture-obs needs an array or Dict observation space, not {model.observation_space}"
                    )
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
                f"info:{key} (the report's linear probes leave it out; check the key's spelling)",
                InfoKeyWarning,
                stacklevel=2,
            )
        self.unseen = set()

    def fill(self, grid: Grid, model: Any) -> None:
        """The grid of one rollout call (N envs, one step): obs and info as (N, 1, width)."""
        if self.capture_obs:
            if self.dict_space is not None:
                obs = flatten_dict(model._last_obs, self.dict_space)  # a new array: the writer may read it later
            else:
                obs = np.array(model._last_obs, np.float32)  # a copy: the writer may read it later
            grid.obs = obs.reshape(obs.shape[0], 1, -1)
        if self.keys:
            grid.info = self.info.copy()[:, None, :]
