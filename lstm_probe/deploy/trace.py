"""A recorded run (``lstm-probe replay TRACE``): one row per env step, ``env``, ``step``, ``obs``, ``action``,
``episode_start`` (docs/deploy.md has the schema), Parquet or CSV, read within the memory budget and checked
(every step of an env once) before replay re-runs a policy over it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lstm_probe.deploy.spec import Spec
from lstm_probe.errors import BadInput, ProbeError, one_line


@dataclass
class Trace:
    env: np.ndarray
    step: np.ndarray
    obs: np.ndarray
    action: np.ndarray
    start: np.ndarray


CSV_BYTES = 16
"""Bytes a CSV read may hold per byte of the file: every cell, even an empty one (one separator), becomes at
most 8 bytes of Arrow (an int64 or a float64), and the columns replay keeps are copied once into numpy."""


def read_trace(path: str | os.PathLike[str], spec: Spec) -> Trace:
    """A recorded run (Parquet or CSV; schema in docs/deploy.md), rows in (env, step) order: one row per step of
    each env, no step repeated or missing. Read within the memory budget (``budget.py``, ``--max-memory``):
    a Parquet file by what its footer says its columns decode to, a CSV by its size; the columns become
    numpy arrays, never Python lists."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{p} does not exist or is not a file; pass a recorded run (Parquet or CSV, see docs/deploy.md)")
    try:
        table = _read_csv(p) if p.suffix == ".csv" else _read_parquet(p)
    except ProbeError:
        raise
    except Exception as exc:
        raise BadInput(f"cannot read {p} as Parquet or CSV: {one_line(exc, kind=False)[:200]}") from None
    n = table.num_rows
    if not n:
        raise BadInput(f"{p} holds no rows")
    for need in ("step", "episode_start"):
        if need not in table.column_names:
            raise BadInput(
                f"{p} has no {need!r} column; a trace has env, step, obs, action, episode_start (docs/deploy.md)"
            )
    obs = _matrix(table, "obs", n, p)
    size = int(np.prod(spec.obs_shape))
    if obs.shape[1] != size:
        raise BadInput(f"{p}'s obs hold {obs.shape[1]} values per step, the policy takes {size}")
    action = _matrix(table, "action", n, p)
    width = 1 if spec.action == "discrete" else int(np.prod(spec.action_shape))
    if action.shape[1] != width:
        raise BadInput(f"{p}'s action holds {action.shape[1]} values per step, the policy gives {width}")
    ints = "env and step must be integers, episode_start 0/1 or true/false, with no nulls"
    env = _numbers(table, "env", p, "int64", ints) if "env" in table.column_names else np.zeros(n, np.int64)
    step = _numbers(table, "step", p, "int64", ints)
    start = _numbers(table, "episode_start", p, "float64", ints) != 0
    order = np.lexsort((step, env))
    env, step = env[order], step[order]
    _check_steps(env, step, p)
    return Trace(env, step, obs[order].reshape((-1, *spec.obs_shape)), action[order], start[order])


def _wanted(name: str) -> bool:
    return name in ("env", "step", "episode_start", "obs", "action") or bool(re.fullmatch(r"(obs|action)_\d+", name))


def _read_parquet(p: Path) -> Any:
    """The trace's columns of a Parquet file, refused first (one line) if what they decode to, copied into
    numpy, is over the memory budget."""
    import pyarrow.dataset as ds

    from lstm_probe.log import budget

    data = ds.dataset(p, format="parquet")
    names = [n for n in data.schema.names if _wanted(n)]
    need = sum(budget.row_groups(data, names))
    budget.refuse((budget.DECODE + 2) * need, f"reading {p}")  # decoding, then numpy's float64 copies
    return data.to_table(columns=names)


def _read_csv(p: Path) -> Any:
    """A CSV file, refused first (one line) if its size, times :data:`CSV_BYTES`, is over the memory budget."""
    import pyarrow.csv as pacsv

    from lstm_probe.log import budget

    budget.refuse(CSV_BYTES * p.stat().st_size, f"reading {p} (a CSV file)")
    return pacsv.read_csv(p)


def _numbers(table: Any, name: str, p: Path, dtype: str, fix: str) -> np.ndarray:
    """A column of numbers as a 1-D numpy array of ``dtype``; BadInput (``fix``) for nulls or what does not
    convert (text, lists, fractions as integers)."""
    return _values(table.column(name), name, p, dtype, fix)


def _values(col: Any, name: str, p: Path, dtype: str, fix: str) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    if col.null_count:
        raise BadInput(f"{p}: {name} has nulls (pandas writes a NaN in a list as a null); {fix}")
    try:
        return np.asarray(pc.cast(col, getattr(pa, dtype)()).to_numpy(), dtype)
    except (pa.ArrowException, TypeError, ValueError):
        raise BadInput(f"{p}: {name} does not hold numbers; {fix}") from None


def _matrix(table: Any, name: str, n: int, p: Path) -> np.ndarray:
    """A column ``name`` (numbers, or lists of the same count of numbers at every step), or the columns
    ``name_0``, ``name_1``, ... (CSV), as an (n, width) float64 array."""
    import pyarrow as pa
    import pyarrow.compute as pc

    fix = f"{name} must be numbers, the same count at every step, with no nulls"
    if name in table.column_names:
        col, width = table.column(name), 1
        while pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
            if col.null_count:
                raise BadInput(f"{p}: {name} has nulls; {fix}")
            counts = pc.min_max(pc.list_value_length(col))
            low, high = counts["min"].as_py(), counts["max"].as_py()
            if low != high:
                raise BadInput(f"{p}: {name} holds {low} values at one step and {high} at another; {fix}")
            width *= high or 0
            col = pc.list_flatten(col)
        return _values(col, name, p, "float64", fix).reshape(n, width)
    parts = [f"{name}_{i}" for i in range(table.num_columns) if f"{name}_{i}" in table.column_names]
    if parts:
        return np.stack([_numbers(table, part, p, "float64", fix) for part in parts], axis=1)
    raise BadInput(f"{p} has no {name!r} column (nor {name}_0, {name}_1, ...); see the trace schema in docs/deploy.md")


def _check_steps(env: np.ndarray, step: np.ndarray, p: Path) -> None:
    """Rows sorted by (env, step) hold each step of an env once, with none missing: a repeated or missing step
    would be replayed as the next one (the state carried to the wrong observation)."""
    same = env[1:] == env[:-1]
    wrong = np.flatnonzero(same & (step[1:] != step[:-1] + 1))
    if not wrong.size:
        return
    i = int(wrong[0])
    e, a, b = int(env[i]), int(step[i]), int(step[i + 1])
    if a == b:
        raise BadInput(f"{p}: env {e} step {a} is in more than one row; a trace holds one row per env and step")
    missing = f"step {a + 1} is" if b == a + 2 else f"steps {a + 1}..{b - 1} are"
    raise BadInput(
        f"{p}: env {e} goes from step {a} to step {b} ({missing} missing); replay needs every step of an env"
    )
