"""Train rows joined to the rollout rows of the same env step (:func:`pair`), with drift recomputed from the
vectors. Nothing here imports torch; pandas is imported on first use (through :func:`reader._load`)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from lstm_probe.errors import BadInput
from lstm_probe.log import held
from lstm_probe.log.logfiles import reads
from lstm_probe.log.reader import _check_arguments, _filter, _load, dataset, states
from lstm_probe.log.schema import relative_l2, stores_vectors, traced_envs

KEYS = ["module", "layer", "env", "env_step"]
"""What pairs a train row with its rollout row (:func:`pair`; RLlib logs add ``worker``)."""
PAIR_COLUMNS = (
    "call",
    "module",
    "layer",
    "iteration",
    "epoch",
    "minibatch",
    "seq",
    "t",
    "seq_len",
    "seq_reason",
    "env",
    "env_step",
    "episode",
    "episode_step",
    "path",
    "h",
    "c",
)
"""The train rows' columns :func:`pair` reads and returns (``worker`` too where the log has it): a deliberate
subset, kept by hand (docs/architecture.md's column recipe): the columns that say where a train row comes
from, not every column a new schema version declares."""


@reads("paired")
def pair(
    path: str | os.PathLike[str], *, phase: str = "train", iteration: int | list[int] | None = None
) -> pd.DataFrame:
    """Train rows joined to the rollout rows of the same (module, layer, env, env_step), with drift.

    RLlib logs join on the worker too, and ``phase`` may be 'value'; their rows with t = -1 (the state a
    chunk started from) pair with the rollout row one step before the chunk.

    Columns: the train row's provenance, ``h_rollout``/``c_rollout`` and ``h_train``/``c_train`` norms,
    ``drift_h``/``drift_c`` (relative L2, recomputed from the vectors) and ``max_abs_h``/``max_abs_c``.
    A log written with ``--trace-envs K`` pairs the traced envs' rows (envs 0..K-1): only they hold vectors.
    """
    cols = list(PAIR_COLUMNS)
    keys = list(KEYS)
    data, info = dataset(path)
    if not stores_vectors(info.metadata):
        raise BadInput(
            f"pair recomputes drift from the h and c vectors, and {path} was written with --capture summary, which "
            "stores none (--trace-envs K keeps envs 0..K-1's); its drift_h and drift_c columns hold the probe's "
            "own: lstm_probe.load(path, phase='train')"
        )
    if "worker" in info.schema.names:  # RLlib: an env is (worker, env)
        keys.insert(2, "worker")
        cols.insert(cols.index("env"), "worker")
    _check_arguments({"iteration": iteration}, {"phase": phase}, None)
    held.check(data, {"phase": phase, "iteration": iteration}, "pair")  # values no row group can hold
    import pyarrow.dataset as ds

    k = traced_envs(info.metadata.get("capture"))  # envs 0..K-1 alone: env < K (not a list: K may be anything)
    traced, within = (None, {}) if k is None else (ds.field("env") < k, {"env": (0, k - 1)})
    train = _load(path, cols, True, _filter(traced, phase=phase, iteration=iteration), within)
    train = train[train["env"].notna()]
    roll = _load(path, [*keys, "h", "c"], True, _filter(traced, phase="rollout", iteration=iteration), within)
    roll = roll.drop_duplicates(keys, keep="last")
    merged = train.merge(roll, on=keys, how="inner", suffixes=("_train", "_rollout"))
    for which in ("h", "c"):
        a = states(merged.rename(columns={f"{which}_train": which}), which)
        b = states(merged.rename(columns={f"{which}_rollout": which}), which)
        if a.shape[1] == 0 or b.shape[1] == 0:  # no vector of this kind in these rows (a GRU's c): no drift
            merged[f"drift_{which}"] = merged[f"max_abs_{which}"] = np.full(len(merged), np.nan)
            continue
        diff = a - b
        merged[f"drift_{which}"] = relative_l2(a, b)
        merged[f"max_abs_{which}"] = np.abs(diff).max(axis=1)
    return merged
