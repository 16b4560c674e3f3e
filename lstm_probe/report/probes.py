"""Linear probes from a log: how well a ridge regression reads a target out of the hidden states h (each module
and layer), by iteration, scored on held-out episodes (``lstm_probe.probe``, ``lstm-probe probe``).

A target is a column of the rollout rows (``episode_step``, ``env_step``, an observation component ``obs:1`` of a
log written with ``--capture-obs``, or ``obs:KEY[i]`` where the observation was a Dict (``obs_keys`` metadata),
``info:KEY`` of one written with ``--info KEY``), or the user's own values as a DataFrame with ``env``,
``env_step`` and ``value`` (``worker`` too for RLlib logs). At lag L the target of the row at env step t is its
value at t - L in the same episode (rows whose episode is shorter than L so far are left out).

Closed-form ridge in numpy, not a library: the read side stays free of heavy dependencies (no scikit-learn, no
torch), a probe on a few hundred hidden units is one small linear solve, and the result is deterministic. The
episodes are split without an RNG: every ``round(1 / holdout)``-th (env, episode) in sorted order is held out
(contiguous runs of 16 steps of an episode, or of 8 or 4, where a rollout holds too few episodes).

pandas is imported by the functions that build a DataFrame, not by this module: the report and ``lstm-probe
probe`` call :func:`probe_rows` (numpy) and load no pandas, probe targets or not.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from lstm_probe.errors import BadInput
from lstm_probe.log import budget
from lstm_probe.log.logfiles import reads
from lstm_probe.log.reader import dataset, narrow
from lstm_probe.log.schema import stores_vectors

if TYPE_CHECKING:
    import pandas as pd

MAX_LAG = 1_000_000
"""Longest lag asked for (steps back in one episode; longer episodes are rare, and a lag past an episode's
length leaves no rows)."""
MAX_ITERATIONS = 8
"""Iterations probed by default (evenly spaced over the log, the first and last included)."""
SEGMENT = 16
"""Env steps per held-out unit where episodes are too few to hold out whole ones (halved, down to
:data:`MIN_SEGMENT`, where runs of 16 are too few too)."""
MIN_SEGMENT = 4
COLUMN_TARGETS = ("episode_step", "env_step")


def ridge(x: np.ndarray, y: np.ndarray, alpha: float = 1e-3) -> tuple[np.ndarray, float]:
    """Weights and intercept of a ridge regression of ``y`` (n,) on ``x`` (n, d); the penalty is ``alpha`` times
    the mean variance of the columns (scale-free)."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    mx, my = x.mean(0), y.mean()
    xc = x - mx
    gram = xc.T @ xc
    penalty = alpha * max(float(np.trace(gram)) / max(gram.shape[0], 1), 1e-12)
    w = np.linalg.solve(gram + penalty * np.eye(gram.shape[0]), xc.T @ (y - my))
    return w, float(my - mx @ w)


def r2(y: np.ndarray, pred: np.ndarray) -> float | None:
    """Coefficient of determination (None where ``y`` is constant)."""
    y = np.asarray(y, np.float64)
    total = float(((y - y.mean()) ** 2).sum())
    if total <= 0:
        return None
    return 1.0 - float(((y - pred) ** 2).sum()) / total


def split(episode_keys: np.ndarray, holdout: float) -> np.ndarray:
    """Held-out mask per row: every ``round(1 / holdout)``-th distinct key (sorted) is held out."""
    if not 0 < holdout < 1:
        raise BadInput(f"holdout must be between 0 and 1, got {holdout}")
    stride = max(2, round(1 / holdout))
    _, inverse = np.unique(episode_keys, return_inverse=True)
    return inverse % stride == stride - 1


def _units(env: np.ndarray, episode: np.ndarray, step: np.ndarray, holdout: float) -> np.ndarray:
    """What the split holds out whole: (env, episode), or, where a rollout holds too few episodes for the split
    (long episodes, short rollouts), contiguous runs of :data:`SEGMENT` env steps of one episode, or of 8 or 4
    where runs of 16 are too few for two to be held out.

    Runs are cut at multiples of the run length, so an episode's first and last run may be cut short by its start or
    end, or by the rollout's. A run of fewer rows than :data:`MIN_SEGMENT` (a fragment of 1-3 steps) is no unit of
    its own: it joins the episode's run before it (an episode's first steps: the run after it), so that every unit
    holds at least :data:`MIN_SEGMENT` steps and the count of held-out units (:data:`MIN_HELD_OUT_UNITS`) is not met
    by a few steps cut off an episode's end. An episode whose rows in the rollout are all fewer than that stays one
    unit (a whole episode as the rollout holds it, as with whole-episode units). The fragment's rows stay in use,
    fitted or held out with the steps beside them (dropping them would lose rows; scoring them alone let 1-3 rows
    count as a held-out unit)."""
    ep = np.nan_to_num(episode, nan=-1).astype(np.int64)
    units = env * 1_000_000_000 + ep
    need = 2 * max(2, round(1 / holdout))  # the split then holds out at least two
    if len(np.unique(units)) >= need:
        return units
    seg = SEGMENT
    while True:  # shorter runs where 16-step ones are too few (one env's 64-step rollout: 8-step runs)
        runs = _merged((units * 1_000_000 + step // seg).astype(np.int64))
        if seg <= MIN_SEGMENT or len(np.unique(runs)) >= need:
            return runs
        seg //= 2


def _merged(runs: np.ndarray) -> np.ndarray:
    """``runs`` (each row's unit * 1e6 + its run in the unit) with each run of fewer than :data:`MIN_SEGMENT` rows
    joined to the nearest full run of its unit before it, else after it, else to its unit's first run
    (:func:`_units`)."""
    keys, inverse, counts = np.unique(runs, return_inverse=True, return_counts=True)
    full = counts >= MIN_SEGMENT
    if full.all():
        return runs
    unit = keys // 1_000_000
    idx = np.arange(len(keys))
    before = np.maximum.accumulate(np.where(full, idx, -1))  # the nearest full run at or before each
    after = np.minimum.accumulate(np.where(full, idx, len(keys))[::-1])[::-1]  # at or after
    first = np.unique(unit, return_index=True)[1][np.unique(unit, return_inverse=True)[1]]
    b, a = np.maximum(before, 0), np.minimum(after, len(keys) - 1)
    target = np.where((before >= 0) & (unit[b] == unit), b, np.where((after < len(keys)) & (unit[a] == unit), a, first))
    return keys[target][inverse]


BELOW_ZERO = (
    "R² below 0: the probe predicts the held-out rows worse than predicting their mean would. It happens when few "
    "episodes (or runs of 4-16 steps of one) are held out, so their targets spread little and any offset of the fit "
    "dominates, and when the held-out states drift from the ones the probe was fitted on (another part of the "
    "episode or state space, where the linear map extrapolates)"
)
"""Why an R² is negative: the report's note beside the probes (the rows carry the ``worse_than_mean`` flag)."""


def worse_than_mean(value: float | None) -> bool | None:
    """Whether an R² is below 0 (the probe predicts worse than the held-out mean); None where there is no R²."""
    return None if value is None else bool(value < 0)


MIN_HELD_OUT_UNITS = 2
"""Fewest held-out units (episodes, or runs of 4-16 steps of one: :func:`_units`) an R² is scored on. R² compares the
probe's error with the held-out targets' spread about their own mean; from one unit that spread is the little
one episode (or run) moves, and an offset between units, which the fit cannot know, scores far below 0
(-1893 on 15 rows) whatever h encodes. Two is what the split itself aims at (:func:`_units` falls back to
shorter runs where whole episodes would hold out fewer than two)."""
TOO_FEW = (
    f"too few held-out rows to score: R² needs held-out rows from at least {MIN_HELD_OUT_UNITS} episodes (or "
    "runs of 4-16 steps of one); from one, their spread about their own mean is what one episode moves, and any offset "
    "of the fit scores far below 0 whatever h encodes. Longer rollouts (--n-steps) or more traced envs "
    "(--trace-envs) give the probes more"
)
"""Why a probe has no R²: the report's line beside the probes (the rows carry the ``too_few`` flag)."""


def score(
    x: np.ndarray, y: np.ndarray, held_out: np.ndarray, alpha: float = 1e-3, units: np.ndarray | None = None
) -> dict[str, Any]:
    """Fit on the rows not held out, R² on the held-out ones (``worse_than_mean``: R² below 0, see
    :data:`BELOW_ZERO`). ``units``: each row's held-out unit; the held-out rows come from ``n_test_units`` of them,
    and with fewer than :data:`MIN_HELD_OUT_UNITS` there is no R² (``too_few``, see :data:`TOO_FEW`)."""
    fit, test = ~held_out, held_out
    n_units = int(test.sum()) if units is None else len(np.unique(units[test]))
    counts = {"n_fit": int(fit.sum()), "n_test": int(test.sum()), "n_test_units": n_units}
    too_few = n_units < MIN_HELD_OUT_UNITS or test.sum() < 2
    if too_few and len(y) and np.all(y == y[0]):  # a constant target has no R² whatever the split
        too_few = False
    if fit.sum() < 2 or too_few:
        return {"r2": None, **counts, "worse_than_mean": None, "too_few": bool(too_few)}
    w, b = ridge(x[fit], y[fit], alpha)
    value = r2(y[test], x[test] @ w + b)
    return {"r2": value, **counts, "worse_than_mean": worse_than_mean(value), "too_few": False}


def held_iterations(data: ds.Dataset) -> list[int]:
    """The iterations the log's rollout rows hold, ascending (what probes pick from)."""
    rollout = ds.field("phase") == "rollout"
    budget.check_filtered(data, ["iteration"], rollout, "the probe's list of iterations")
    its = pc.unique(data.to_table(columns=["iteration"], filter=rollout)["iteration"])
    return sorted(int(v) for v in its.to_pylist() if v is not None)


def _iterations(data: ds.Dataset, asked: Iterable[int] | None, strict: bool = True) -> list[int]:
    """The iterations to probe: those of ``asked`` the log holds (where ``strict``, BadInput if it holds none of
    them, rather than an empty table), else the log's, at most :data:`MAX_ITERATIONS` spread over the run."""
    if asked is not None and not strict:
        return sorted({int(i) for i in asked})
    values = held_iterations(data)
    if asked is not None:  # those the log holds (range(10_000): every one); none of them: BadInput
        wanted = sorted({int(i) for i in asked})
        found = sorted(set(wanted) & set(values))
        if not found:
            held = f"iterations {values[0]}..{values[-1]}" if values else "no rollout rows"
            which = (
                f"iteration {wanted[0]} is not"
                if len(wanted) == 1
                else f"none of iterations {wanted[0]}..{wanted[-1]} is"
            )
            raise BadInput(f"{which} in the log (it holds {held}); ask for one it holds")
        return found
    if len(values) <= MAX_ITERATIONS:
        return values
    idx = np.unique(np.round(np.linspace(0, len(values) - 1, MAX_ITERATIONS)).astype(int))
    return [values[i] for i in idx]


def obs_parts(meta: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(key, start, size) of each key of a Dict observation's flattened ``obs`` vector (``obs_keys`` metadata), in
    their order; none where the log has no such metadata or it does not tile ``obs_size`` (then components are
    named by index only)."""
    parts, at = [], 0
    raw = meta.get("obs_keys")
    if not isinstance(raw, list):
        return []
    for p in raw:
        if not isinstance(p, dict):
            return []
        key, start, size = p.get("key"), p.get("start"), p.get("size")
        if not isinstance(key, str) or type(start) is not int or type(size) is not int or start != at or size < 0:
            return []
        parts.append((key, start, size))
        at += size
    return parts if parts and at == meta.get("obs_size") else []


def obs_names(meta: dict[str, Any], limit: int | None = None) -> list[str]:
    """The targets of the ``obs`` vector's components: ``obs:KEY[i]`` for a Dict observation (``obs_keys``),
    else ``obs:i``. ``limit``: at most this many, in the vector's order; for a Dict, the first components of every
    key in turn (one key's image does not crowd out the others)."""
    size = meta.get("obs_size")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return []
    parts = obs_parts(meta)
    if not parts:
        return [f"obs:{i}" for i in range(size if limit is None else min(size, limit))]
    taken = [0] * len(parts)
    total = size if limit is None else min(size, limit)
    while sum(taken) < total:  # one more component of each key in turn, while any key has one left
        for j, (_, _, n) in enumerate(parts):
            if taken[j] < n and sum(taken) < total:
                taken[j] += 1
    return [f"obs:{key}[{i}]" for (key, _, _), k in zip(parts, taken, strict=True) for i in range(k)]


def _obs_index(name: str, index: str, meta: dict[str, Any]) -> int:
    """The position in the ``obs`` vector of ``obs:i`` or ``obs:KEY[i]``."""
    if index.isdigit():
        return int(index)
    parts = obs_parts(meta)
    key, bracket, rest = index.rpartition("[")
    i = rest[:-1] if rest.endswith("]") else ""
    for k, start, n in parts:
        if bracket and k == key and i.isdigit():
            if int(i) >= n:
                raise BadInput(f"target {name!r}: the observation's {key!r} has {n} components (0..{n - 1})")
            return start + int(i)
    if parts:
        keys = ", ".join(f"{k} ({n})" for k, _, n in parts)
        raise BadInput(f"target {name!r}: name a component obs:KEY[i] or obs:i (the observation's keys: {keys})")
    raise BadInput(f"target {name!r}: obs is a vector column, name a component: obs:0")


def _is_frame(target: Any) -> bool:
    """Whether ``target`` is a DataFrame (the user's own values); no DataFrame exists unless pandas is loaded."""
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(target, pd.DataFrame)


def _column(table: pa.Table, name: str) -> np.ndarray:
    """A scalar column as numpy, as ``to_pandas`` gives it: integers with nulls as float64 with NaN."""
    return table[name].to_numpy()


def _target_values(
    rows: dict[str, np.ndarray], table: pa.Table, target: Any, meta: dict[str, Any], strict: bool = True
) -> np.ndarray:
    """The target's value at each row (at lag 0). ``info:KEY`` names an entry of the info vectors by its key
    (``info_keys`` in the metadata), ``obs:KEY[i]`` one of the obs vectors by a Dict observation's key
    (``obs_keys``)."""
    info_keys: Sequence[str] = meta.get("info_keys") or ()
    if _is_frame(target):  # the user's DataFrame: pandas is loaded
        import pandas as pd

        keys = ["worker", "env", "env_step"] if "worker" in target.columns else ["env", "env_step"]
        missing = {"env", "env_step", "value"} - set(target.columns)
        if missing:
            raise BadInput(f"a target DataFrame needs columns env, env_step and value (missing {sorted(missing)})")
        ours = pd.DataFrame({k: rows[k] for k in keys})
        merged = ours.merge(target[[*keys, "value"]].drop_duplicates(keys), on=keys, how="left")
        return merged["value"].to_numpy(np.float64)
    name = str(target)
    if name in COLUMN_TARGETS:
        return rows[name].astype(np.float64)
    column, _, index = name.partition(":")
    if column not in table.column_names:
        have = ", ".join(COLUMN_TARGETS)
        raise BadInput(
            f"target {name!r}: the log has no {column!r} column (targets: {have}; obs:i needs a log written with "
            "--capture-obs; or pass your own values as a DataFrame with env, env_step, value)"
        )
    col = table[column].combine_chunks()
    if column in ("obs", "info") and col.null_count == len(col):
        if not strict:  # nothing captured in these rows: no value
            return np.full(table.num_rows, np.nan)
        flag = "--capture-obs" if column == "obs" else "--info KEY"
        raise BadInput(
            f"target {name!r}: the log's {column!r} column is empty (a log written with {flag} has it; an own loop's "
            "log has none: pass your own values as a DataFrame with env, env_step, value)"
        )
    if column == "info" and not index.isdigit():
        if index not in info_keys:
            raise BadInput(f"target {name!r}: the log's info keys are {', '.join(info_keys) or 'none'}")
        index = str(list(info_keys).index(index))
    if column == "obs":
        index = str(_obs_index(name, index, meta))
    if pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type):
        if not index.isdigit():
            raise BadInput(f"target {name!r}: {column} is a vector column, name a component: {column}:0")
        values = pc.list_element(col, int(index))
        return values.to_numpy(zero_copy_only=False).astype(np.float64)
    return col.to_numpy(zero_copy_only=False).astype(np.float64)


def probe(
    path: str | os.PathLike[str],
    target: Any = "episode_step",
    *,
    lags: Sequence[int] = (0,),
    iterations: Iterable[int] | None = None,
    modules: Iterable[str] | None = None,
    alpha: float = 1e-3,
    holdout: float = 0.3,
) -> pd.DataFrame:
    """R² of linear probes from h to ``target`` at each lag, per (iteration, module, layer), on held-out episodes.

    ``target``: 'episode_step', 'env_step', 'COLUMN' or 'COLUMN:i' (a vector column's component: ``obs:1``; an
    info key stored with ``--info KEY``: ``info:KEY``), or a DataFrame with env, env_step, value. ``iterations``:
    default up to :data:`MAX_ITERATIONS` evenly spaced. Returns one row per (iteration, module, layer, lag): r2,
    n_fit, n_test, n_test_units (the held-out episodes or runs of steps), worse_than_mean (R² below 0: worse than
    predicting the held-out mean, see :data:`BELOW_ZERO`), too_few (held out from fewer than
    :data:`MIN_HELD_OUT_UNITS` units: no R², see :data:`TOO_FEW`)."""
    out = probe_targets(path, [target], lags=lags, iterations=iterations, modules=modules, alpha=alpha, holdout=holdout)
    return out.drop(columns=["target"])


@reads("probed")
def probe_targets(
    path: str | os.PathLike[str],
    targets: Sequence[Any],
    *,
    lags: Sequence[int] = (0,),
    iterations: Iterable[int] | None = None,
    modules: Iterable[str] | None = None,
    alpha: float = 1e-3,
    holdout: float = 0.3,
    max_rows: int | None = None,
    strict: bool = True,
) -> pd.DataFrame:
    """:func:`probe` for several targets, reading each iteration's rows once; a ``target`` column names each
    row's target (its string; 'values' for a DataFrame). ``max_rows``: at most about this many rows per
    (iteration, module, layer), whole held-out units (episodes) kept evenly (the report's bounded cost).
    ``strict=False``: an obs or info target without values scores None, and an iteration the log lacks is
    skipped, instead of raising."""
    import pandas as pd

    rows = probe_rows(
        path,
        targets,
        lags=lags,
        iterations=iterations,
        modules=modules,
        alpha=alpha,
        holdout=holdout,
        max_rows=max_rows,
        strict=strict,
    )
    return pd.DataFrame(rows, columns=list(ROW_KEYS))


ROW_KEYS = (
    "iteration",
    "module",
    "layer",
    "target",
    "lag",
    "r2",
    "n_fit",
    "n_test",
    "n_test_units",
    "worse_than_mean",
    "too_few",
)


@reads("probed")
def probe_rows(
    path: str | os.PathLike[str],
    targets: Sequence[Any],
    *,
    lags: Sequence[int] = (0,),
    iterations: Iterable[int] | None = None,
    modules: Iterable[str] | None = None,
    alpha: float = 1e-3,
    holdout: float = 0.3,
    max_rows: int | None = None,
    strict: bool = True,
) -> list[dict[str, Any]]:
    """:func:`probe_targets`' rows as dicts (keys :data:`ROW_KEYS`; r2 None where the target is constant), in
    numpy: without pandas unless a target is the user's DataFrame (the report and ``lstm-probe probe``)."""
    if not all(isinstance(lag, int | np.integer) and not isinstance(lag, bool) for lag in lags):
        raise BadInput(f"lags must be integers, got {list(lags)}")
    if any(not 0 <= int(lag) <= MAX_LAG for lag in lags):
        raise BadInput(f"lags must be 0..{MAX_LAG:,} steps, got {list(lags)}")
    data, info = dataset(path)
    if not stores_vectors(info.metadata):
        raise BadInput(
            "probes need the h vectors: this log was written with --capture summary (--trace-envs K keeps the "
            "vectors of envs 0..K-1)"
        )
    its = _iterations(data, iterations, strict)
    names = set(data.schema.names)
    counted = _counted_episodes(data, "worker" in names)
    extra = list(dict.fromkeys(str(t).partition(":")[0] for t in targets if not _is_frame(t)))
    keys = ["iteration", "module", "layer", "env", "env_step", "episode", "episode_step"]
    worker = ["worker"] if "worker" in names else []
    columns = list(dict.fromkeys([*keys, *worker, "h", *(c for c in extra if c in names)]))
    out: list[dict[str, Any]] = []
    want = None if modules is None else set(modules)
    for it in its:
        rows_of = (ds.field("phase") == "rollout") & (ds.field("iteration") == it) & ds.field("h").is_valid()
        part = narrow(data, iteration=(it, it))  # the iteration's row groups (statistics)
        table = budget.table(part, columns, rows_of, f"the probe's read of iteration {it}")
        if table.num_rows == 0:
            continue
        rows = {c: _column(table, c) for c in [*keys, *worker]}
        values = [_target_values(rows, table, t, info.metadata, strict) for t in targets]
        h = table["h"].combine_chunks()
        hidden = h.type.list_size
        x = h.flatten().to_numpy(zero_copy_only=False).astype(np.float64).reshape(-1, hidden)
        env_key = _env_keys(rows["env"], rows["worker"] if worker else None)
        all_steps = rows["env_step"].astype(np.int64)
        if counted is not None:  # an own loop's episode_start alone: episodes counted from it (the row's target too)
            known = ~np.isnan(rows["env"].astype(np.float64))
            rows["episode"], rows["episode_step"] = _look_up(counted, env_key, all_steps, known)
            values = [
                rows["episode_step"] if isinstance(t, str) and t == "episode_step" else v
                for t, v in zip(targets, values, strict=True)
            ]
        for module, layer, idx in _groups(rows["module"], rows["layer"]):
            if want is not None and module not in want:
                continue
            env, step = env_key[idx], all_steps[idx]
            episode_step = rows["episode_step"].astype(np.float64)[idx]
            episode = rows["episode"].astype(np.float64)[idx]
            units = _units(env, episode, step, holdout)
            keep = _sample(units, max_rows)
            held = np.zeros(len(units), bool)
            held[keep] = split(units[keep], holdout)  # among the kept units: the two strides never align
            for target, value in zip(targets, values, strict=True):
                for lag in lags:
                    if lag == 0:
                        y = value[idx]
                    else:
                        y = _at(env, step, value[idx], step - int(lag))
                        y[~(episode_step >= lag)] = np.nan  # t - L must lie in the same episode
                    ok = np.isfinite(y) & keep
                    result = score(x[idx][ok], y[ok], held[ok], alpha, units[ok])
                    name = "values" if _is_frame(target) else str(target)
                    row = {"iteration": it, "module": module, "layer": layer, "target": name}
                    out.append({**row, "lag": int(lag), **result})
    return out


def _env_keys(env: np.ndarray, worker: np.ndarray | None) -> np.ndarray:
    """One int64 per (worker, env): RLlib's env numbers repeat across env runners (worker null: the driver)."""
    key = env.astype(np.int64)
    if worker is not None:
        key = key + (np.nan_to_num(worker.astype(np.float64), nan=-1).astype(np.int64) + 1) * 1_000_000
    return key


Counted = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""Each rollout (env, env step) of a log, sorted: env keys, env steps, episode, step in the episode."""


def _counted_episodes(data: ds.Dataset, worker: bool) -> Counted | None:
    """Where no row carries an episode number but the rollout rows carry ``episode_start`` (an own loop with the
    fewest tags, docs/own-loops.md): each rollout (env, env step)'s episode and its step in it, counted from the
    episode starts as the report counts its episode lengths (an env's first step opens its episode 0); None
    where some row carries an episode number (the footer statistics say so: nothing is read) or no episode
    start to count from. Reads one layer-0 row per (module, env, env step); the budget holds that read and its
    sorting (four times the table)."""
    from lstm_probe.log import held

    if "episode_start" not in data.schema.names or held.spans(data, "episode") != []:
        return None
    columns = ["env", "env_step", "episode_start", *(["worker"] if worker else [])]
    keep = (ds.field("phase") == "rollout") & (ds.field("layer") == 0)
    keep &= ds.field("env").is_valid() & ds.field("env_step").is_valid()
    table = budget.table(data, columns, keep, "the probe's episode starts")
    if not table.num_rows:
        return None
    budget.refuse(4 * table.nbytes + 48 * table.num_rows, "the probe's episode count")
    env = _env_keys(_column(table, "env"), _column(table, "worker") if worker else None)
    step = _column(table, "env_step").astype(np.int64)
    start = table["episode_start"].fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
    del table
    order = np.lexsort((step, env))
    env, step, start = env[order], step[order], start[order]
    same = np.r_[False, (env[1:] == env[:-1]) & (step[1:] == step[:-1])]  # the step's other modules
    start = np.logical_or.reduceat(start, np.flatnonzero(~same))
    env, step = env[~same], step[~same]
    new_env = np.r_[True, env[1:] != env[:-1]]
    opens = new_env | start  # an episode opens at each start and at an env's first step
    segment = np.cumsum(opens) - 1
    first = np.flatnonzero(opens)
    episode = segment - segment[np.flatnonzero(new_env)][np.cumsum(new_env) - 1]
    return env, step, episode.astype(np.float64), (step - step[first][segment]).astype(np.float64)


def _look_up(counted: Counted, env: np.ndarray, step: np.ndarray, known: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The counted episode and step in it of each (env key, env step) (``known``: the rows that have an env):
    NaN where the rollout held none. One sorted key per (env, step), searched once."""
    keys_env, keys_step, episode, episode_step = counted
    out_e, out_s = np.full(len(env), np.nan), np.full(len(env), np.nan)
    envs = np.unique(keys_env)
    lo = int(min(keys_step.min(), step.min(initial=0)))
    span = int(max(keys_step.max(), step.max(initial=0))) - lo + 1
    if len(envs) * span >= 1 << 62:  # the keys would not fit one int64 (a hostile log's steps): none counted
        return out_e, out_s
    table = np.searchsorted(envs, keys_env) * span + (keys_step - lo)  # sorted: keys are by (env, step)
    rank = np.minimum(np.searchsorted(envs, env), len(envs) - 1)
    asked = rank * span + (step - lo)
    at = np.minimum(np.searchsorted(table, asked), len(table) - 1)
    hit = known & (envs[rank] == env) & (table[at] == asked)
    out_e[hit], out_s[hit] = episode[at[hit]], episode_step[at[hit]]
    return out_e, out_s


def _groups(module: np.ndarray, layer: np.ndarray) -> list[tuple[str, int, np.ndarray]]:
    """(module, layer, row positions) of each pair present, sorted by module name, then layer; rows without
    either are in none."""
    present = np.array([m is not None for m in module], bool) & ~np.isnan(layer.astype(np.float64))
    names, code = np.unique(module[present].astype(str), return_inverse=True)
    where = np.flatnonzero(present)
    layers = layer[present].astype(np.int64)
    pairs = np.unique(np.stack([code.astype(np.int64), layers], axis=1), axis=0)
    return [(str(names[m]), int(lv), where[(code == m) & (layers == lv)]) for m, lv in pairs]


def _at(env: np.ndarray, step: np.ndarray, value: np.ndarray, asked: np.ndarray) -> np.ndarray:
    """``value`` at (env, asked step) for each row: the first row of that (env, step); NaN where there is none."""
    keys = np.unique(
        np.stack([np.concatenate([env, env]), np.concatenate([step, asked])], axis=1), axis=0, return_inverse=True
    )[1].reshape(-1)
    have, want = keys[: len(env)], keys[len(env) :]
    lut = np.full(int(keys.max()) + 1, np.nan)
    _, first = np.unique(have, return_index=True)
    lut[have[first]] = value[first]
    return lut[want]


def _sample(units: np.ndarray, max_rows: int | None) -> np.ndarray:
    """Rows to keep: all, or whole units evenly spread (every k-th distinct unit) down to about ``max_rows``."""
    if max_rows is None or len(units) <= max_rows:
        return np.ones(len(units), bool)
    stride = -(-len(units) // max_rows)
    _, inverse = np.unique(units, return_inverse=True)
    return inverse % stride == 0
