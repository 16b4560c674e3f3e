"""Drift and norms where a block's states reach the host, in the training process: the rows' keys from a
:class:`~lstm_probe.contract.Grid`, each train row's drift against the rollout states the probe holds
(:class:`Drift`: computed once, here, for the log, the live metrics and nothing else), and a block reduced
to the figures a summary log keeps (:func:`reduced`; the type, ``messages.Reduced``, is the message's).

A summary log's rows (it keeps no vectors) go to the sink as their norms and drifts (:func:`reduced`), not
their states (a 2048-step run at 8 envs sent 126 of its 135 MB over the pipe as a summary log's per-step
training loops alone); the sink computes the norms of the rows whose states it gets (a full log's) with the
same :func:`row_norms`. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from lstm_probe.contract import Grid
from lstm_probe.log.messages import Drifts, Reduced
from lstm_probe.log.schema import relative_l2, row_norms


def grid_keys(
    grid: Grid | None, t0: int, steps: int, layers: int, batch: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each row's (layer, env, env step) as the sink fills them (rows ordered layer, column, step; see
    ``Sink.rows``), as intp arrays: None where the grid does not cover the block (the rows' env and env
    step are null there, so no row has a reference)."""
    if grid is None or grid.shape[0] != batch or t0 + steps > grid.shape[1]:
        return None
    n = batch * steps

    def cols(v: np.ndarray | None) -> np.ndarray:
        if v is None:
            return np.full(n * layers, -1, np.intp)
        v = v[:, t0 : t0 + steps].reshape(-1).astype(np.intp)
        return np.tile(v, layers) if layers > 1 else v

    layer = np.repeat(np.arange(layers, dtype=np.intp), n)
    return layer, cols(grid.env), cols(grid.env_step)


def reduced(
    hs: np.ndarray,
    cs: np.ndarray | None,
    drift: Drifts | None,
    per_step: bool = False,
    kept: np.ndarray | None = None,
) -> Reduced:
    """Rows whose vectors the log does not keep, hs/cs (L, N, T', H), as the figures they keep: norms (and
    ``drift``, from :meth:`Drift.rows`). ``per_step``: hs/cs come (L, T', N, H) (a multi-step call's layout);
    the norms are computed on the rows as they lie, then put in the sink's order (layer, column, step).
    ``kept`` (a bool per row, sink order): the rows that keep their vectors (--trace-envs), sent with them
    (float32: a float16 log's vectors are rounded where they are encoded, its norms are the float32 states')."""
    layers, a, b, hidden = hs.shape
    n = layers * a * b
    h_norm = row_norms(hs.reshape(n, hidden))
    c_norm = row_norms(cs.reshape(n, hidden)) if cs is not None else None
    h = c = None
    if kept is not None:
        layer, col, step = np.nonzero(kept.reshape(layers, b, a) if per_step else kept.reshape(layers, a, b))
        h = hs[layer, step, col] if per_step else hs[layer, col, step]  # (k, H), the kept rows in sink order
        c = None if cs is None else cs[layer, step, col] if per_step else cs[layer, col, step]
    if not per_step:
        return Reduced((layers, a, b), h_norm, c_norm, drift, kept, h, c)

    def order(norms: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(norms.reshape(layers, a, b).transpose(0, 2, 1)).reshape(n)

    return Reduced((layers, b, a), order(h_norm), order(c_norm) if c_norm is not None else None, drift, kept, h, c)


RolloutRing = Callable[[str], "tuple[np.ndarray, np.ndarray, int, int] | None"]
"""A module's rollout states as the probe holds them (``Inputs.rollout_ring``): a (envs * window, R * H) table
(h of every layer, then c), the env step each slot holds (-1: none), the window and the env count; None
where it holds none."""


class Drift:
    """The one drift computation of a run, in the training process: each train row's h and c against the
    rollout state of the same (layer, env, env step), read from the rollout states the probe already holds
    for the `init` columns (``Inputs``: the one store of rollout states, read through ``ring``). The tracer
    runs it in each block's (or multi-step call's) second half, in call order, and hands the drifts to the
    sink with the rows (``messages.Rows.drift``); live metrics read the same values (``sb3/metrics.py``)."""

    def __init__(self, hidden: int, ring: RolloutRing):
        self.hidden, self.ring = hidden, ring

    def rows(
        self, name: str, grid: Grid | None, t0: int, hs: np.ndarray, cs: np.ndarray | None, per_step: bool = False
    ) -> Drifts | None:
        """(drift_h, drift_c, found) of train rows hs/cs (L, N, T', H), in the sink's row order (layer,
        column, step); ``per_step``: hs/cs come (L, T', N, H) (a multi-step call's layout). None where the
        grid does not cover them (their env and env step are null: no row can have a reference)."""
        if per_step:  # rows as they lie (layer, step, column), the drifts put in the sink's order after
            layers, steps, batch = hs.shape[:3]
        else:
            layers, batch, steps = hs.shape[:3]
        keys = grid_keys(grid, t0, steps, layers, batch)
        if keys is None:
            return None
        n = layers * batch * steps  # (a call of no steps has no rows: -1 cannot be inferred from 0)
        h = hs.reshape(n, self.hidden)
        c = cs.reshape(n, self.hidden) if cs is not None else None
        if not per_step:
            return self._drift(name, layers, *keys, h, c)

        def lying(v: np.ndarray) -> np.ndarray:  # sink order -> the rows' order
            return v.reshape(layers, batch, steps).transpose(0, 2, 1).reshape(n)

        def sink(v: np.ndarray) -> np.ndarray:  # the rows' order -> sink order
            return np.ascontiguousarray(v.reshape(layers, steps, batch).transpose(0, 2, 1)).reshape(n)

        layer, env, step = keys
        dh, dc, found = self._drift(name, layers, lying(layer), lying(env), lying(step), h, c)
        return sink(dh), sink(dc), sink(found)

    def _drift(
        self,
        name: str,
        layers: int,
        layer: np.ndarray,
        env: np.ndarray,
        step: np.ndarray,
        h: np.ndarray,
        c: np.ndarray | None,
    ) -> Drifts:
        """Each row's drift against the rollout state of its (layer, env, env step) (``schema.relative_l2``;
        a GRU's c: 0 against 0)."""
        n = len(env)
        dh, dc, found = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.bool_)
        held = self.ring(name)
        if held is None:
            return dh, dc, found
        flat, slots, window, envs = held
        table = flat.reshape(len(flat), -1, self.hidden)  # (envs * window, R, H)
        idx = np.flatnonzero((env >= 0) & (step >= 0) & (env < envs))
        rows = env[idx] * window + step[idx] % window
        match = slots.take(rows) == step[idx]
        idx, rows = idx[match], rows[match]
        if len(idx) == 0:
            return dh, dc, found
        found[idx] = True
        whole = len(idx) == n
        with_c = c is not None and table.shape[1] > layers
        if layers == 1:  # one gather of whole ring rows (h, then c), read as two views
            both = np.take(flat, rows, axis=0)
            ref_h, ref_c = both[:, : self.hidden], both[:, self.hidden : 2 * self.hidden] if with_c else None
        else:
            lay = layer[idx]
            ref_h, ref_c = table[rows, lay], table[rows, layers + lay] if with_c else None
        dh[idx] = relative_l2(h if whole else h[idx], ref_h)
        if with_c:
            assert c is not None and ref_c is not None
            dc[idx] = relative_l2(c if whole else c[idx], ref_c)
        return dh, dc, found
