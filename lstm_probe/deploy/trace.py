"""The files replay reads besides the policy: a recorded run (``lstm-probe replay TRACE``), one row per env
step, ``env``, ``step``, ``obs``, ``action``, ``episode_start`` (docs/deploy.md has the schema), Parquet or CSV,
read within the memory budget and a bound on its rows and checked (every step of an env once) before replay
re-runs a policy over it; and VecNormalize statistics saved as ``.npz`` (:func:`read_stats`), each array's
header checked before its values are read. Regular files only (a FIFO is refused, never waited on)."""

from __future__ import annotations

import os
import re
import zipfile
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


def read_trace(path: str | os.PathLike[str], spec: Spec, most: int) -> Trace:
    """A recorded run (Parquet or CSV; schema in docs/deploy.md), rows in (env, step) order: one row per step of
    each env, no step repeated or missing. Read within the memory budget (``budget.py``, ``--max-memory``):
    a Parquet file by what its footer says its columns decode to, a CSV by its size; the columns become
    numpy arrays, never Python lists. More than ``most`` rows are refused (a Parquet file's from its footer,
    before a row is read)."""
    from lstm_probe.log import budget

    p = Path(path)
    fix = "pass a recorded run (Parquet or CSV, see docs/deploy.md)"
    if not p.exists():
        raise BadInput(f"{p} does not exist; {fix}")
    budget.open_regular(p, fix).close()  # a FIFO or device: refused, never waited on
    try:
        table = _read_csv(p, most) if p.suffix == ".csv" else _read_parquet(p, most)
    except ProbeError:
        raise
    except Exception as exc:
        raise BadInput(f"cannot read {p} as Parquet or CSV: {one_line(exc, kind=False)[:200]}") from None
    n = table.num_rows
    if not n:
        raise BadInput(f"{p} holds no rows")
    _refuse_rows(p, n, most)
    for need in ("step", "episode_start"):
        if need not in table.column_names:
            raise BadInput(
                f"{p} has no {need!r} column; a trace has env, step, obs, action, episode_start (docs/deploy.md)"
            )
    obs, frame = _matrix(table, "obs", n, p)
    size = int(np.prod(spec.obs_shape))
    if obs.shape[1] != size:
        raise BadInput(f"{p}'s obs hold {obs.shape[1]} values per step, the policy takes {size}")
    from_frames = _layout(p, frame, spec)
    action, _ = _matrix(table, "action", n, p)
    width = 1 if spec.action == "discrete" else int(np.prod(spec.action_shape))
    if action.shape[1] != width:
        hint = ""
        if spec.action == "discrete":
            hint = "; record a Discrete action as its index (a one-hot's argmax), one number per step"
        raise BadInput(f"{p}'s action holds {action.shape[1]} values per step, the policy gives {width}{hint}")
    ints = "env and step must be integers, episode_start 0/1 or true/false, with no nulls"
    env = _numbers(table, "env", p, "int64", ints) if "env" in table.column_names else np.zeros(n, np.int64)
    step = _numbers(table, "step", p, "int64", ints)
    start = _numbers(table, "episode_start", p, "float64", ints)
    order = np.lexsort((step, env))
    env, step = env[order], step[order]
    _check_steps(env, step, p)
    obs, action, start = obs[order], action[order], start[order]
    names = (_names(table, "obs", obs.shape[1]), _names(table, "action", action.shape[1]))
    _check_values(p, env, step, obs, action, start, spec, names)
    if from_frames:  # the env's own frames: rearranged as the framework does before its policy (Spec.frame_axes)
        return Trace(env, step, spec.from_frames(obs.reshape((-1, *(spec.frame_shape or ())))), action, start != 0)
    return Trace(env, step, obs.reshape((-1, *spec.obs_shape)), action, start != 0)


def _layout(p: Path, frame: tuple[int, ...], spec: Spec) -> bool:
    """Whether a trace's obs are the env's own frames of a policy whose framework rearranges them
    (``spec.frame_shape``, e.g. sb3's channel-last (H, W, C) images of a (C, H, W) policy), to be rearranged. A
    trace's nested lists give each obs's shape (``obs.tolist()`` of a frame): the policy's or the env's. Flat obs
    of such a policy do not say which of the two they were flattened from: refused (one line) rather than
    guessed. Any other shape of the same size is refused too."""
    shape, env_frame = tuple(spec.obs_shape), spec.frame_shape
    if env_frame is None or frame == shape:
        return False
    if frame == env_frame:
        return True
    fix = f"record each obs as the frame's nested list (obs.tolist()), the env's {env_frame} or the policy's {shape}"
    if len(frame) <= 1:
        raise BadInput(
            f"{p}'s obs are flat: {int(np.prod(shape))} values per step do not say whether a frame was the env's "
            f"{env_frame} or the policy's {shape}, and the wrong guess misplaces every value; {fix}"
        )
    raise BadInput(f"{p}'s obs are frames of shape {frame}, the policy takes {shape}; {fix}")


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _names(table: Any, name: str, width: int) -> list[str]:
    """How messages name each value of a trace's ``name``: ``obs[1]`` (a list column) or ``obs_1`` (CSV)."""
    if name in table.column_names:
        if width == 1 and not _is_list(table.column(name).type):
            return [name]
        return [f"{name}[{i}]" for i in range(width)]
    return [f"{name}_{i}" for i in range(width)]


def _is_list(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _check_values(
    p: Path,
    env: np.ndarray,
    step: np.ndarray,
    obs: np.ndarray,
    action: np.ndarray,
    start: np.ndarray,
    spec: Spec,
    names: tuple[list[str], list[str]],
) -> None:
    """Rows in (env, step) order hold what a float32 runtime fed and got: observations finite within float32's
    range, actions within it (a NaN action is what a broken runtime sent: a divergence, not refused), a
    discrete action an index of the policy's ``Discrete(n)``, ``episode_start`` 0 or 1. BadInput (one line)
    naming the column and the first such step."""

    def where(i: int) -> str:
        return f"env {int(env[i])} step {int(step[i])}"

    for what, values, names_of, nan_ok in (("obs", obs, names[0], False), ("action", action, names[1], True)):
        bad = ~(np.abs(values) <= FLOAT32_MAX)
        if nan_ok:
            bad &= ~np.isnan(values)
        if bad.any():
            i, j = (int(k) for k in np.argwhere(bad)[0])
            v = float(values[i, j])
            kind = "not a number" if np.isnan(v) else "infinite" if np.isinf(v) else "beyond float32's range"
            raise BadInput(
                f"{p}: {names_of[j]} at {where(i)} is {v:g} ({kind}); a runtime feeds and sends float32 values: "
                f"record the {what} it {'fed the policy' if what == 'obs' else 'sent'}"
            )
    if spec.action == "discrete":
        a = action[:, 0]
        bad = ~np.isnan(a) & ((a != np.round(a)) | (a < 0) | ((a >= spec.choices) if spec.choices else False))
        if bad.any():
            i = int(np.argmax(bad))
            space = f"Discrete({spec.choices})" if spec.choices else "the policy's Discrete space"
            raise BadInput(
                f"{p}: action {float(a[i]):g} at {where(i)} is not an index of {space}; record a Discrete action "
                "as its index (0, 1, ...; a one-hot's argmax)"
            )
    bad = (start != 0) & (start != 1)
    if bad.any():
        i = int(np.argmax(bad))
        raise BadInput(
            f"{p}: episode_start at {where(i)} is {float(start[i]):g}; it must be 0/1 or true/false "
            "(1 at an episode's first step)"
        )


def _wanted(name: str) -> bool:
    return name in ("env", "step", "episode_start", "obs", "action") or bool(re.fullmatch(r"(obs|action)_\d+", name))


def _refuse_rows(p: Path, rows: int, most: int) -> None:
    if rows > most:
        raise BadInput(
            f"{p} holds {rows:,} rows, over the {most:,} replay re-runs a policy over (each row once per loop); "
            "replay a part of it: fewer steps or envs"
        )


def _read_parquet(p: Path, most: int) -> Any:
    """The trace's columns of a Parquet file, refused first (one line) if its footer states more than ``most``
    rows, or if what they decode to, copied into numpy, is over the memory budget."""
    import pyarrow.dataset as ds

    from lstm_probe.log import budget

    data = ds.dataset(p, format="parquet")
    names = [n for n in data.schema.names if _wanted(n)]
    sizes = budget.groups(data, names)
    _refuse_rows(p, sum(rows for _, rows in sizes), most)
    budget.refuse((budget.DECODE + 2) * sum(size for size, _ in sizes), f"reading {p}")  # decoding, then numpy's
    return data.to_table(columns=names)


def _read_csv(p: Path, most: int) -> Any:
    """A CSV file, refused first (one line) if its size, times :data:`CSV_BYTES`, is over the memory budget
    (its rows are counted once read)."""
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


def _matrix(table: Any, name: str, n: int, p: Path) -> tuple[np.ndarray, tuple[int, ...]]:
    """A column ``name`` (numbers, or lists of the same count of numbers at every step), or the columns
    ``name_0``, ``name_1``, ... (CSV), as an (n, width) float64 array, with the shape of one step's value (the
    lengths of its nested lists: () for a number, (width,) for a flat list or CSV columns)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    fix = f"{name} must be numbers, the same count at every step, with no nulls"
    if name in table.column_names:
        col, width = table.column(name), 1
        shape: tuple[int, ...] = ()
        while pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
            if col.null_count:
                raise BadInput(f"{p}: {name} has nulls; {fix}")
            counts = pc.min_max(pc.list_value_length(col))
            low, high = counts["min"].as_py(), counts["max"].as_py()
            if low != high:
                raise BadInput(f"{p}: {name} holds {low} values at one step and {high} at another; {fix}")
            width *= high or 0
            shape = (*shape, high or 0)
            col = pc.list_flatten(col)
        return _values(col, name, p, "float64", fix).reshape(n, width), shape
    parts = [f"{name}_{i}" for i in range(table.num_columns) if f"{name}_{i}" in table.column_names]
    if parts:
        return np.stack([_numbers(table, part, p, "float64", fix) for part in parts], axis=1), (len(parts),)
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


STATS_SLACK = 1 << 16
"""Bytes an ``.npz`` of statistics may hold beyond its arrays' values (zip records, ``.npy`` headers)."""


def read_stats(path: Path, size: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """``mean``, ``var`` (``size`` numbers each, as float64), ``clip_obs`` and ``epsilon`` (defaults 10 and 1e-8)
    of VecNormalize statistics saved with ``numpy.savez``. The file is read as the zip it is, each array's
    ``.npy`` header (shape, type) checked before any value is read: a few MB of deflate can state an array of
    gigabytes, or strings. BadInput (one line) for anything else."""
    from lstm_probe.log import budget

    fix = "pass the VecNormalize statistics saved with numpy.savez(mean=..., var=..., clip_obs=..., epsilon=...)"
    with budget.open_regular(path, fix) as f:
        held = os.fstat(f.fileno()).st_size
        if held > 2 * 8 * size + 4 * STATS_SLACK:
            raise BadInput(f"{path} is {held:,} bytes, more than statistics of {size:,} values take; {fix}")
        try:
            with zipfile.ZipFile(f) as z:
                mean = _stat(z, path, "mean", size)
                var = _stat(z, path, "var", size)
                clip = _stat(z, path, "clip_obs", 1, 10.0)
                eps = _stat(z, path, "epsilon", 1, 1e-8)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
            raise BadInput(f"cannot read {path} as .npz statistics: {one_line(exc, kind=False)[:200]}; {fix}") from None
    if not (np.isfinite(mean).all() and np.isfinite(var).all() and (var >= 0).all()):
        raise BadInput(f"{path}: its mean or var holds NaN, infinite or (var) negative values; {fix}")
    c, e = float(clip[0]), float(eps[0])
    if not (np.isfinite(c) and c > 0 and np.isfinite(e) and e >= 0):
        raise BadInput(f"{path}: its clip_obs {c:g} or epsilon {e:g} is not a positive number; {fix}")
    return mean, var, c, e


def _stat(z: zipfile.ZipFile, path: Path, name: str, size: int, default: float | None = None) -> np.ndarray:
    """Array ``name`` of an ``.npz`` as ``size`` float64 values (``default`` where absent, else BadInput),
    its header checked before its values are read."""
    from numpy.lib import format as npy

    try:
        info = z.getinfo(f"{name}.npy")
    except KeyError:
        if default is None:
            raise BadInput(f"{path} has no {name} array; save mean and var with numpy.savez") from None
        return np.array([default])
    if info.file_size > 8 * size + STATS_SLACK:
        raise BadInput(f"{path}: its {name} is {info.file_size:,} bytes, more than {size:,} numbers take")
    with z.open(info) as m:
        version = npy.read_magic(m)
        read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, fortran, dtype = read(m, max_header_size=STATS_SLACK)
        count = int(np.prod(shape))
        if dtype.hasobject or dtype.kind not in "fiu" or count != size:
            raise BadInput(
                f"{path}: its {name} holds {count:,} values of type {str(dtype)[:40]}, not {size:,} numbers "
                f"(the observations hold {size:,})"
            )
        raw = m.read(count * dtype.itemsize)
    if len(raw) != count * dtype.itemsize:
        raise BadInput(f"{path}: its {name} is cut short")
    values = np.frombuffer(raw, dtype).reshape(shape, order="F" if fortran else "C")
    return np.asarray(values, np.float64).ravel()
