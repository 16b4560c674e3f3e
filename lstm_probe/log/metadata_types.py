"""The types the readers rely on in a log's run metadata (a user's file: any value may be of another type, or
hold terminal escapes): :func:`check_types` drops each value of the wrong type with a warning, at the top level
(:data:`METADATA_TYPES`), in the nested records the report reads (:data:`NESTED_TYPES`) and in the what-if and
memory measurements' columnar records (:data:`RECORD_KEYS`), so that nothing downstream trips on them. A log is
never refused for one such entry."""

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
    ("info_keys",): (_or_none(lambda v: isinstance(v, list) and all(isinstance(k, str) for k in v)), "a list of str"),
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
    for key in RECORD_KEYS:
        _check_records(metadata, key, warnings)


def check_info_keys(metadata: dict[str, Any], columns: list[str], warnings: list[str]) -> None:
    """Drop ``info_keys`` (with a warning) from the metadata of a log without an ``info`` column (``columns``: the
    log's): they name the entries of a column it does not hold."""
    if metadata.get("info_keys") and "info" not in columns:
        del metadata["info_keys"]
        warnings.append("metadata 'info_keys' names info keys, but the log has no info column: ignored")


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


def _alternative(value: Any) -> bool:
    """A what-if record's alternative: a name, a burn-in's ('burn_in_16', 'stored_burn_in_16') ending in its length."""
    if not isinstance(value, str):
        return False
    k = next((value.removeprefix(p) for p in ("stored_burn_in_", "burn_in_") if value.startswith(p)), "0")
    return k.isascii() and k.isdigit()


def _count_or_none(value: Any) -> bool:
    return value is None or is_count(value)


RECORD_KEYS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "what_if": {"iteration": is_count, "epoch": is_count, "minibatch": is_count, "alternative": _alternative},
    "memory": {"iteration": is_count, "module": lambda v: isinstance(v, str), "k": is_count},
}
"""Per measurement (``what_if``, ``memory``): the columns of its ``records`` that each record is read by; a record
whose value there is not what the rule takes is dropped (the whole ``records`` where such a column is missing)."""
RECORD_VALUES: dict[str, Callable[[Any], bool]] = {
    "sequences": _count_or_none,
    "episode_starts": _count_or_none,
    "pairs": _count_or_none,
}
"""The records' other columns with a rule of their own; every other column holds finite numbers (or null). A
value that is not what its rule takes reads as null."""


def _check_records(metadata: dict[str, Any], key: str, warnings: list[str]) -> None:
    """The columnar ``records`` of measurement ``key`` checked: a column that is no list, or of another length than
    the others, or a missing :data:`RECORD_KEYS` column drops the records; a record whose value in a
    :data:`RECORD_KEYS` column is of the wrong type is dropped; another column's value of the wrong type reads as
    null (:data:`RECORD_VALUES`). Each with one warning per column; valid records are left as they are."""
    meta = metadata.get(key)
    if not isinstance(meta, dict) or not isinstance(meta.get("records"), dict):
        return
    records: dict[str, Any] = meta["records"]
    where = f"{key}.records"
    keys = RECORD_KEYS[key]
    lengths = {len(v) for v in records.values() if isinstance(v, list)}
    bad = next((c for c, v in records.items() if not isinstance(v, list)), None)
    if bad is not None or len(lengths) > 1 or not keys.keys() <= records.keys():
        why = (
            f"its column {str(bad)!r} is a {type(records[bad]).__name__}, not a list"
            if bad is not None
            else "its columns differ in length"
            if len(lengths) > 1
            else f"it lacks the column(s) {', '.join(sorted(keys.keys() - records.keys()))}"
        )
        metadata[key] = {k: v for k, v in meta.items() if k != "records"}
        warnings.append(f"metadata {where!r}: {why}: ignored")
        return
    n = lengths.pop() if lengths else 0
    keep = [i for i in range(n) if all(ok(records[c][i]) for c, ok in keys.items())]
    out = records if len(keep) == n else {c: [v[i] for i in keep] for c, v in records.items()}
    for c, ok in keys.items():
        if wrong := sum(not ok(v) for v in records[c]):
            warnings.append(
                f"metadata {f'{where}.{c}'!r} holds {wrong:,} value(s) of the wrong type: those records ignored"
            )
    for c, v in list(out.items()):
        if c in keys:
            continue
        ok = RECORD_VALUES.get(str(c), _or_none(is_number))
        if wrong := sum(not ok(x) for x in v):
            out = {**out, c: [x if ok(x) else None for x in v]}
            warnings.append(f"metadata {f'{where}.{c}'!r} holds {wrong:,} value(s) of the wrong type: read as null")
    if out is not records:
        metadata[key] = {**meta, "records": out}


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
