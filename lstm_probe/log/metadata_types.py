"""The types the readers rely on in a log's run metadata (a user's file: any value may be of another type, or
hold terminal escapes): :func:`check_types` drops each value of the wrong type with a warning, at the top level
(:data:`METADATA_TYPES`) and in the nested records the report reads (:data:`NESTED_TYPES`), so that nothing
downstream trips on them. A log is never refused for one such entry."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, TypeGuard


def is_count(value: Any) -> TypeGuard[int]:
    """Whether a value read from a log's metadata (a user's file) is a count: an int >= 0, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_number(value: Any) -> TypeGuard[int | float]:
    """Whether a value read from a log's metadata (a user's file) is a finite number, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


METADATA_TYPES: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(
        (
            "capture",
            "architecture",
            "progress",
            "probe_cost",
            "capabilities",
            "rllib",
            "versions",
            "hyperparameters",
            "returns",
        ),
        dict,
    ),
    **dict.fromkeys(("training_mode", "what_if", "memory"), dict),
    **dict.fromkeys(("hidden_size", "n_envs", "total_timesteps", "start_timesteps", "progress_num_timesteps"), int),
    **dict.fromkeys(("iterations", "optimizer_steps", "schema_version"), int),
    **dict.fromkeys(("info_keys", "obs_keys"), list),
    **dict.fromkeys(("framework", "env_id", "stop_reason", "start_time", "end_time", "autoreset_mode"), str),
}
"""The types the readers rely on for the metadata keys lstm-probe writes (None allowed for each)."""


def _counts(value: Any) -> bool:
    return isinstance(value, list) and all(is_count(v) for v in value)


def _amount(value: Any) -> bool:
    return is_number(value) and value >= 0


def _or_none(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or ok(v)


def _is_dict(value: Any) -> bool:
    return isinstance(value, dict)


NESTED_TYPES: dict[tuple[str, ...], tuple[Callable[[Any], bool], str]] = {
    ("architecture", "modules"): (_or_none(_is_dict), "a dict"),
    ("architecture", "modules", "*"): (_is_dict, "a dict"),
    ("architecture", "gradient_flow"): (_or_none(_is_dict), "a dict"),
    ("architecture", "gradient_flow", "verdict"): (_or_none(lambda v: isinstance(v, str)), "a str"),
    ("what_if", "sampling"): (_or_none(_is_dict), "a dict"),
    ("what_if", "modules"): (_or_none(lambda v: isinstance(v, list)), "a list"),
    ("what_if", "burn_in"): (_or_none(_counts), "a list of counts"),
    ("what_if", "stored_burn_in"): (_or_none(_counts), "a list of counts"),
    ("memory", "sampling"): (_or_none(_is_dict), "a dict"),
    ("memory", "modules"): (_or_none(lambda v: isinstance(v, list)), "a list"),
    ("memory", "episode_lengths"): (_or_none(_is_dict), "a dict"),
    ("memory", "lags"): (_or_none(_counts), "a list of counts"),
    ("memory", "sampling", "steps_per_env"): (_or_none(lambda v: isinstance(v, list)), "a list"),
    ("what_if", "sampling", "epochs"): (_or_none(lambda v: isinstance(v, list)), "a list"),
    ("returns", "partial"): (_or_none(is_count), "a count"),
    ("returns", "by_shard", "*"): (_is_dict, "a dict"),
    ("returns", "by_shard", "*", "partial"): (_or_none(is_count), "a count"),
    ("probe_cost", "writer"): (_or_none(lambda v: isinstance(v, str)), "a str"),
    ("probe_cost", "*"): (_amount, "a number >= 0"),
}
"""Values inside the metadata's records that the report reads, each with what it must be (``*``: every key of
that dict that no rule names itself): a value that is not is dropped with the reader's warning."""


def check_types(metadata: dict[str, Any], warnings: list[str]) -> None:
    """Drop metadata values of the wrong type (a foreign or damaged log), each with a warning, so that
    nothing downstream trips on them."""
    for key, typ in METADATA_TYPES.items():
        value = metadata.get(key)
        if value is not None and (not isinstance(value, typ) or (typ is int and isinstance(value, bool))):
            del metadata[key]
            warnings.append(f"metadata {key!r} is a {type(value).__name__}, not a {typ.__name__}: ignored")  # type: ignore[union-attr]
    if "completed" in metadata and not isinstance(metadata["completed"], bool):
        metadata["completed"] = False
    for pattern in NESTED_TYPES:
        _check_nested(metadata, pattern, (), warnings)


def _check_nested(doc: dict[str, Any], pattern: tuple[str, ...], at: tuple[str, ...], warnings: list[str]) -> None:
    """Walk ``pattern`` (a :data:`NESTED_TYPES` key) from ``doc`` (``at``: the keys walked so far) and drop the
    values at its end of the wrong type (copying each dict on the way: a document shared with another key is
    left as it was)."""
    i = len(at)
    head = pattern[i]
    if head == "*":  # every key, but those a rule of their own names
        named = {p[i] for p in NESTED_TYPES if len(p) == len(pattern) and p[:i] == pattern[:i] and p[i] != "*"}
        keys = [k for k in doc if k not in named]
    else:
        keys = [head] if head in doc else []
    for key in keys:
        value = doc[key]
        where = (*at, str(key))
        if len(where) == len(pattern):
            ok, what = NESTED_TYPES[pattern]
            if not ok(value):
                del doc[key]
                dotted = ".".join(where)
                warnings.append(f"metadata {dotted!r} is a {type(value).__name__}, not {what}: ignored")
        elif isinstance(value, dict):
            doc[key] = dict(value)
            _check_nested(doc[key], pattern, where, warnings)


_DEVICE_REPR = re.compile(r"device\(type='(\w+)'(?:, index=(\d+))?\)")
"""How older sb3 logs recorded the device (its repr), for :func:`clean_device`."""


def clean_device(metadata: dict[str, Any]) -> None:
    """The hyperparameters' ``device`` as torch names it ('cpu', 'cuda:0'), where an older log recorded its repr
    ("device(type='cpu')")."""
    hp = metadata.get("hyperparameters")
    device = hp.get("device") if isinstance(hp, dict) else None
    m = _DEVICE_REPR.fullmatch(device) if isinstance(device, str) else None
    if m is not None and isinstance(hp, dict):
        metadata["hyperparameters"] = {**hp, "device": m[1] + (f":{m[2]}" if m[2] else "")}
