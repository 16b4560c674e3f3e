"""Open a saved RecurrentPPO model.zip without unpickling anything from it.

SB3's own load (``stable_baselines3/common/save_util.py:load_from_zip_file`` -> ``json_to_data``)
base64-decodes and cloudpickles every ``":serialized:"`` entry of the zip's ``data`` JSON (the policy
class, the spaces, the schedules, ``_last_obs``...): a crafted zip runs code on load. This reader takes
only what the zip states as data:

- from ``data``: the plain JSON fields (n_steps, batch_size, gamma...), the policy class by name (the
  plain-text ``__module__`` and ``__init__`` repr SB3 writes beside the pickle, matched against the three
  sb3-contrib recurrent policies), ``policy_kwargs`` when plain JSON (or a pickled dict whose entries are
  JSON or name an allowed torch/SB3 class), and the spaces from the plain-text fields SB3 writes beside
  each pickled space (``data_to_json`` adds an object's first-level attributes: Box dtype, shape and
  bounds as printed, Discrete n and start...), or from ``--env``'s env;
- the weights: ``policy.pth`` through ``torch.load(..., weights_only=True)``, loaded with
  ``strict=True`` into the policy built from the above (a mismatch is refused).

Whatever cannot be read that way is refused with one line naming ``--trust-model`` (SB3's full load,
for files whose author you trust). Schedules are read when they are SB3 constants
(``ConstantSchedule(val=...)``); otherwise the default stands in: ``arch`` never takes an optimizer step.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from lstm_probe.errors import BadInput

MAX_DATA_BYTES = 64 << 20
"""Largest ``data`` JSON read (SB3 writes a few KB; pickled ``_last_obs`` of image envs some MB)."""
MAX_WEIGHTS_BYTES = 4 << 30
"""Largest ``policy.pth`` read (a policy of ~1e9 float32 parameters)."""
MAX_JSON_DEPTH = 32
"""Deepest nesting accepted in ``data`` (SB3 writes 3 or 4 levels)."""
MAX_COUNT = 1 << 20
"""Largest integer accepted in the settings that size what gets allocated (n_steps, batch_size,
layer widths in policy_kwargs): built before the weights can be checked against them."""

POLICY_MODULE = "sb3_contrib.common.recurrent.policies"
POLICIES = ("RecurrentActorCriticPolicy", "RecurrentActorCriticCnnPolicy", "RecurrentMultiInputActorCriticPolicy")
"""The policies sb3-contrib's ``ppo_recurrent.py:RecurrentPPO.policy_aliases`` names (Mlp/Cnn/MultiInput)."""

HYPERPARAMETERS = {
    "n_steps": int,
    "batch_size": int,
    "n_epochs": int,
    "gamma": float,
    "gae_lambda": float,
    "ent_coef": float,
    "vf_coef": float,
    "max_grad_norm": float,
    "normalize_advantage": bool,
    "use_sde": bool,
    "sde_sample_freq": int,
}
"""Plain-JSON fields of ``data`` passed to ``RecurrentPPO(...)`` when present with that type."""

_CLASSES: dict[str, tuple[str, str]] = {
    "activation_fn": ("torch.nn.modules.activation.", "torch.nn"),
    "optimizer_class": ("torch.optim.", "torch.optim"),
    "features_extractor_class": ("stable_baselines3.common.torch_layers.", "stable_baselines3.common.torch_layers"),
}
"""policy_kwargs entries that may name a class: the printed module prefix, and where it is looked up."""
_ALLOWED = {
    "activation_fn": {"ReLU", "Tanh", "ELU", "LeakyReLU", "GELU", "SiLU", "Sigmoid", "Softplus", "Mish", "Identity"},
    "optimizer_class": {"Adam", "AdamW", "SGD", "RMSprop"},
    "features_extractor_class": {"FlattenExtractor", "NatureCNN", "CombinedExtractor"},
}


class Unsafe(Exception):
    """What the zip does not state as plain data; the caller turns it into the one-line refusal."""


def refusal(path: str | Path, why: str) -> BadInput:
    """The one line shown when the safe reader cannot build the model."""
    return BadInput(
        f"{path}: {why}; lstm-probe does not unpickle a model by default (that can run code stored in it): "
        "pass --trust-model for SB3's full load if you trust this file"
    )


def load(path: str | Path, env: Any = None) -> Any:
    """A RecurrentPPO built from the zip's plain data and weights (see the module docstring); ``env``
    (a VecEnv) supplies the spaces and allows a real rollout. Raises BadInput (see :func:`refusal`)."""
    try:
        data, state = _read(Path(path))
        return _build(data, state, env)
    except Unsafe as exc:
        raise refusal(path, str(exc)) from None


def _member(archive: zipfile.ZipFile, name: str, limit: int) -> bytes:
    info = archive.getinfo(name)
    if info.file_size > limit:
        raise Unsafe(f"its {name} is {info.file_size:,} bytes, over the {limit:,} this reader takes")
    with archive.open(info) as f:
        raw = f.read(limit + 1)  # the declared size can lie: read no more than the limit
    if len(raw) > limit:
        raise Unsafe(f"its {name} decompresses to over {limit:,} bytes")
    return raw


def _read(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The zip's ``data`` JSON and its policy weights. A file no loader could read is a BadInput that
    does not suggest --trust-model (SB3's load would fail on it too)."""
    import torch

    def broken(why: str) -> BadInput:
        return BadInput(f"cannot load {path} as a RecurrentPPO model: {why}")

    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            if "data" not in names or "policy.pth" not in names:
                raise broken("it is not an SB3 model.zip (no data or policy.pth in it)")
            raw = _member(archive, "data", MAX_DATA_BYTES)
            weights = _member(archive, "policy.pth", MAX_WEIGHTS_BYTES)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError) as exc:
        raise broken(f"it is not a readable zip file ({exc})") from None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise broken("its data is not valid JSON") from None
    if not isinstance(data, dict) or _depth(data) > MAX_JSON_DEPTH:
        raise broken("its data is not the JSON object SB3 writes")
    try:  # tensors and plain containers only: torch's weights_only unpickler refuses any other object
        state = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise Unsafe(f"its policy.pth holds more than tensors ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(state, dict):
        raise Unsafe("its policy.pth is not a state dict")
    return data, state


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if d <= MAX_JSON_DEPTH and isinstance(v, dict | list):
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _policy_class(entry: Any) -> type:
    from sb3_contrib.common.recurrent import policies
    from sb3_contrib.ppo_recurrent import RecurrentPPO

    if isinstance(entry, str) and entry in RecurrentPPO.policy_aliases:
        return RecurrentPPO.policy_aliases[entry]
    if not isinstance(entry, dict) or entry.get("__module__") != POLICY_MODULE:
        raise Unsafe("its policy class is not one of sb3-contrib's recurrent policies")
    # SB3 prints the class's own functions beside the pickle: "<function NAME.__init__ at 0x...>"
    m = re.fullmatch(r"<function (\w+)\.__init__ at 0x[0-9a-f]+>", str(entry.get("__init__", "")))
    if m is None or m.group(1) not in POLICIES:
        raise Unsafe("its policy class is not one of sb3-contrib's recurrent policies")
    cls: type = getattr(policies, m.group(1))
    return cls


def _policy_kwargs(entry: Any) -> dict[str, Any]:
    if entry is None:
        return {}
    if isinstance(entry, dict) and ":serialized:" not in entry:
        return _sized(dict(entry))
    if not isinstance(entry, dict) or entry.get(":type:") != "<class 'dict'>":
        raise Unsafe("its policy_kwargs are not a dict")
    import importlib

    out: dict[str, Any] = {}
    for key, value in entry.items():
        if key.startswith(":"):
            continue
        prefix, where = _CLASSES.get(key, ("", ""))
        m = re.fullmatch(r"<class '([\w.]+)\.(\w+)'>", value) if isinstance(value, str) and prefix else None
        if m and (m.group(1) + ".").startswith(prefix) and m.group(2) in _ALLOWED[key]:
            out[key] = getattr(importlib.import_module(where), m.group(2))
        elif isinstance(value, str) and value.startswith("<"):
            raise Unsafe(f"its policy_kwargs[{key!r}] is a pickled object ({value[:80]})")
        else:
            out[key] = value
    return _sized(out)


def _sized(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` when no integer in it (net_arch widths, lstm_hidden_size...) is out of range."""
    stack: list[Any] = [kwargs]
    while stack:
        v = stack.pop()
        if isinstance(v, dict | list):
            stack.extend(v.values() if isinstance(v, dict) else v)
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_COUNT:
            raise Unsafe(f"its policy_kwargs hold a size out of range ({v:,})")
    return kwargs


def _floats(text: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """An array printed by numpy (``str(arr)``, or one number when every element is equal)."""
    if not isinstance(text, str) or "..." in text:
        raise Unsafe("its spaces are not stated in full as text")
    tokens = text.replace("[", " ").replace("]", " ").split()
    try:
        values = np.array([float(t) for t in tokens])
    except ValueError:
        raise Unsafe("its spaces are not stated as numbers") from None
    size = int(np.prod(shape))
    if values.size == 1:
        values = np.full(size, values[0])
    if values.size != size:
        raise Unsafe("its space bounds do not match its shape")
    return values.reshape(shape).astype(dtype)


def _space(entry: Any, what: str) -> Any:
    """A gymnasium space from the plain text SB3 writes beside its pickle (Box, Discrete,
    MultiDiscrete, MultiBinary)."""
    from gymnasium import spaces

    if not isinstance(entry, dict):
        raise Unsafe(f"its {what} is not stated")
    kind = entry.get(":type:")
    try:
        if kind == "<class 'gymnasium.spaces.box.Box'>":
            shape = tuple(int(x) for x in entry["_shape"])
            dtype = np.dtype(str(entry["dtype"]))
            low = _floats(entry.get("low_repr", entry.get("low")), shape, dtype)
            high = _floats(entry.get("high_repr", entry.get("high")), shape, dtype)
            return spaces.Box(low, high, shape, dtype)  # type: ignore[arg-type]
        if kind == "<class 'gymnasium.spaces.discrete.Discrete'>":
            return spaces.Discrete(int(entry["n"]), start=int(entry.get("start", 0)))
        if kind == "<class 'gymnasium.spaces.multi_discrete.MultiDiscrete'>":
            nvec = [int(x) for x in str(entry["nvec"]).strip("[]").split()]
            start = [int(x) for x in str(entry.get("start", "")).strip("[]").split()] or None
            return spaces.MultiDiscrete(nvec, start=start)
        if kind == "<class 'gymnasium.spaces.multi_binary.MultiBinary'>":
            return spaces.MultiBinary(int(entry["n"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise Unsafe(f"its {what} is not stated in plain text ({type(exc).__name__})") from None
    raise Unsafe(f"its {what} ({str(kind)[:60]}) is not stated in plain text (--env ENV_ID takes it from an env)")


def _constant(entry: Any) -> float | None:
    """A schedule's value when plain JSON or SB3's ``ConstantSchedule(val=...)``; else None."""
    if isinstance(entry, int | float) and not isinstance(entry, bool):
        return float(entry)
    text = entry.get("value_schedule") if isinstance(entry, dict) else None
    m = re.fullmatch(r"ConstantSchedule\(val=([-+0-9.eE]+)\)", str(text))
    return float(m.group(1)) if m else None


def _build(data: dict[str, Any], state: dict[str, Any], env: Any) -> Any:
    import torch
    from sb3_contrib import RecurrentPPO

    policy = _policy_class(data.get("policy_class"))
    kwargs: dict[str, Any] = {k: data[k] for k, t in HYPERPARAMETERS.items() if isinstance(data.get(k), t)}
    if any(not 0 < kwargs.get(k, 1) <= MAX_COUNT for k in ("n_steps", "batch_size", "n_epochs")):
        raise Unsafe(f"its n_steps, batch_size or n_epochs is out of range (1..{MAX_COUNT:,})")
    for key, alt in (("clip_range", "clip_range"), ("learning_rate", "lr_schedule")):
        value = _constant(data.get(key))
        value = _constant(data.get(alt)) if value is None else value
        if value is not None:
            kwargs[key] = value
    if env is None:
        obs, act = (
            _space(data.get("observation_space"), "observation space"),
            _space(data.get("action_space"), "action space"),
        )
    else:
        obs, act = env.observation_space, env.action_space
        for what, given, key in (("observation", obs, "observation_space"), ("action", act, "action_space")):
            try:
                stated = _space(data.get(key), what)
            except Unsafe:
                continue  # not stated in plain text: the env's space, checked by the weights below
            if stated.shape != given.shape or type(stated) is not type(given):
                raise BadInput(f"the env's {what} space {given} differs from the model's {stated}")
    try:
        model = RecurrentPPO(
            policy, env, device="cpu", policy_kwargs=_policy_kwargs(data.get("policy_kwargs")),
            _init_setup_model=False, **kwargs,
        )  # fmt: skip
        if env is None:
            model.observation_space, model.action_space = obs, act
            n_envs = data.get("n_envs", 1)
            if not isinstance(n_envs, int) or not 0 < n_envs * model.n_steps <= MAX_COUNT:
                raise Unsafe(f"its n_envs * n_steps is out of range (1..{MAX_COUNT:,})")
            model.n_envs = n_envs
        model._setup_model()
    except (TypeError, ValueError, AssertionError, KeyError) as exc:
        first = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise Unsafe(f"its settings do not build a policy ({first})") from None
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise Unsafe("its policy.pth holds more than tensors")
    try:
        model.policy.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
        raise Unsafe(f"its weights do not fit the policy its plain settings describe ({first[:120]})") from None
    return model
