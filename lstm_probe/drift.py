"""In-probe drift and norms where a block's states are: the rollout states kept per (module, layer, env,
env step), the rows' keys from a :class:`~lstm_probe.contract.Grid`, and a block reduced to the figures
a summary log keeps (:class:`Reduced`).

The sink (writer process or thread) uses them for every row it gets states for. The tracer uses them for
the per-step training loops of a summary log (``Tracer._write_block``): their vectors would only be reduced
to norms and drifts in the writer, so the tracer reduces them where they are and hands over the figures,
not the states (a 2048-step run at 8 envs sent 126 of its 135 MB over the pipe as such blocks). The same
functions on the same arrays: the figures are the same, bit for bit. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lstm_probe.contract import Grid
from lstm_probe.schema import relative_l2


def row_norms(states: np.ndarray) -> np.ndarray:
    """The L2 norm of each row of ``states`` (n, hidden), in float64 (the h_norm / c_norm columns)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.sqrt(np.einsum("ij,ij->i", states, states, dtype=np.float64))


class References:
    """The rollout states of the last ``window`` env steps of each env, for in-probe drift.

    One flat (layers * envs * window, hidden) table per state, so that a block's references come out
    with one ``take`` (numpy's multi-axis fancy indexing is several times slower here)."""

    def __init__(self, window: int, layers: int, hidden: int):
        self.window, self.layers, self.hidden = window, layers, hidden
        self.envs = 0
        self.steps = np.full(0, -1, np.int64)
        self.h = np.zeros((0, hidden), np.float32)
        self.c = np.zeros((0, hidden), np.float32)
        # reused for a block's references and differences: fresh arrays of a block's size (~0.1-1 MB) were
        # mapped anew with their page faults each time (in the training process, where the tracer reduces)
        self._scratch = np.zeros((2, 0, hidden), np.float32)

    def _grow(self, envs: int) -> None:
        if envs <= self.envs:
            return
        L, W, H, extra = self.layers, self.window, self.hidden, envs - self.envs

        def grown(a: np.ndarray, fill: float, row: tuple[int, ...]) -> np.ndarray:
            old = a.reshape(L, self.envs, W, *row)
            new = np.full((L, extra, W, *row), fill, a.dtype)
            return np.concatenate([old, new], axis=1).reshape(L * envs * W, *row)

        self.steps = grown(self.steps, -1, ())
        self.h = grown(self.h, 0.0, (H,))
        self.c = grown(self.c, 0.0, (H,))
        self.envs = envs

    def _rows(self, layer: np.ndarray, env: np.ndarray, step: np.ndarray) -> np.ndarray:
        return (layer * self.envs + env) * self.window + step % self.window

    def store(self, layer: np.ndarray, env: np.ndarray, step: np.ndarray, h: np.ndarray, c: np.ndarray) -> None:
        ok = (env >= 0) & (step >= 0)
        if not ok.all():
            layer, env, step, h, c = layer[ok], env[ok], step[ok], h[ok], c[ok]
        if len(env) == 0:
            return
        self._grow(int(env.max()) + 1)
        rows = self._rows(layer, env, step)
        self.steps[rows] = step
        self.h[rows] = h
        self.c[rows] = c

    def drift(
        self, layer: np.ndarray, env: np.ndarray, step: np.ndarray, h: np.ndarray, c: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(env)
        dh = np.zeros(n, np.float32)
        dc = np.zeros(n, np.float32)
        found = np.zeros(n, np.bool_)
        ok = (env >= 0) & (step >= 0) & (env < self.envs)
        idx = np.flatnonzero(ok)
        rows = self._rows(layer[idx], env[idx], step[idx])
        match = self.steps.take(rows) == step[idx]
        if not match.all():
            idx, rows = idx[match], rows[match]
        if len(idx) == 0:
            return dh, dc, found
        found[idx] = True
        whole = len(idx) == n  # the common case: every row has its reference, no gather of h and c
        m = len(idx)
        if self._scratch.shape[1] < m:
            self._scratch = np.zeros((2, max(m, 2 * self._scratch.shape[1]), self.hidden), np.float32)
        ref, diff = self._scratch[0, :m], self._scratch[1, :m]
        for out, states, table in ((dh, h, self.h), (dc, c, self.c)):
            np.take(table, rows, axis=0, out=ref)
            out[idx] = relative_l2(states if whole else states[idx], ref, diff)
        return dh, dc, found


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


@dataclass(frozen=True)
class Reduced:
    """A block's rows as a summary log keeps them, reduced where the states were (see the module docstring):
    ``shape`` (layers, columns, steps); per row, in the sink's row order, the norms (float64; ``c_norm`` None
    for a GRU) and the drift against the rollout states (``drift``: (drift_h, drift_c, found), None where
    no row can have one)."""

    shape: tuple[int, int, int]
    h_norm: np.ndarray
    c_norm: np.ndarray | None
    drift: tuple[np.ndarray, np.ndarray, np.ndarray] | None


RolloutRing = Callable[[str], "tuple[np.ndarray, np.ndarray, int, int] | None"]
"""A module's rollout states as the probe holds them (``Inputs.rollout_ring``): a (envs * window, R * H) table
(h of every layer, then c), the env step each slot holds (-1: none), the window and the env count; None
where it holds none."""


class Reducer:
    """The tracer's half (see the module docstring): the reduction of a train block against the rollout
    states the probe already holds for the `init` columns (``Inputs``: the one store of rollout states in
    the training process, read through ``ring``), fed in the same order as the sink's references (the
    tracer's writer jobs run in call order, as the sink's messages do). A module one of whose rollout calls
    had several steps (its per-step c is recovered in the sink only) is never reduced again: its blocks go to
    the sink whole, whose references are complete."""

    def __init__(self, window: int, hidden: int, ring: RolloutRing):
        self.window, self.hidden, self.ring = window, hidden, ring
        self.incomplete: set[str] = set()

    def reduce(
        self, name: str, phase: str | None, grid: Grid | None, t0: int, hs: np.ndarray, cs: np.ndarray | None
    ) -> Reduced | None:
        """The rows of a train block, hs/cs (L, N, T', H), as norms and drifts (None: hand its states over;
        so are blocks of other phases, whose rows the sink may keep as references)."""
        if phase != "train" or name in self.incomplete:
            return None
        layers, batch, steps = hs.shape[:3]
        h = hs.reshape(-1, self.hidden)
        c = cs.reshape(-1, self.hidden) if cs is not None else None
        drift = None
        if self.window:
            keys = grid_keys(grid, t0, steps, layers, batch)
            if keys is not None:
                drift = self._drift(name, layers, *keys, h, c)
        return Reduced((layers, batch, steps), row_norms(h), row_norms(c) if c is not None else None, drift)

    def _drift(
        self,
        name: str,
        layers: int,
        layer: np.ndarray,
        env: np.ndarray,
        step: np.ndarray,
        h: np.ndarray,
        c: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's drift against the rollout state of its (layer, env, env step), as
        ``References.drift`` computes it (a GRU's c: 0 against 0)."""
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
        lay = layer[idx]
        dh[idx] = relative_l2(h if whole else h[idx], table[rows, lay])
        if c is not None and table.shape[1] > layers:
            dc[idx] = relative_l2(c if whole else c[idx], table[rows, layers + lay])
        return dh, dc, found
