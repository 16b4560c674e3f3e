"""Where each traced call's input state came from: the ``init`` and ``init_norm`` columns.

The tracer keeps a copy of each call's input state (one ``torch.cat`` per call in the hook) and, when
it writes the call's block (a writer job, in call order), asks :class:`Inputs` about each batch column's
first step: it compares the input with what the probe already holds, the state the module last returned
for that env column (per phase group; earlier columns of the same env in the block, else the store) and,
for training calls, the rollout states of the last ``window`` env steps of each env. Host numpy, one
vectorized compare per block. The schema's ``init`` column says what each answer means. (A summary log's
rollout blocks and training calls on an accelerator answer on the device, ``ondevice_inputs.py``, with the
same index arithmetic; a store then holds their indices only, and brings their states over before host code
reads them: ``_Store.sync``.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.contract import Grid
from lstm_probe.log.schema import CODE

ZERO, PREVIOUS, STORED, OTHER_ENV, FIRST, UNCHECKED = 1, 2, 4, 8, 16, 32
OTHER_ENV_BUDGET = 1 << 22
"""Most floats a training call's answer compares against other env columns' stored states (only where some
column did not start from its own env's: a wrong start), so a wide run with that bug stays bounded."""
"""Bits of a column's answer (:func:`decode` turns them into the ``init`` codes): the input is all zeros;
bit-equal to the state the module last returned for this env column; bit-equal to the stored rollout
state (train); bit-equal to a state another env column returned; no state known for this env column yet;
train input whose rollout state the probe does not hold."""
INIT = CODE["init"]
GROUP = {"rollout": "rollout", "bootstrap": "rollout", "train": "rollout", "value": "rollout", "predict": "predict"}
"""Phase -> the store its calls compare against (other phases: 'other'); rollout, predict and other calls
keep their returned states in their own store (an evaluation's env columns are not the rollout's)."""
ACTING = frozenset({"rollout", "predict", "other"})
"""Phases whose returned states are what the next step of the same env column should start from."""
AUTO = -1
"""An :class:`Inputs` ``window`` sized by the rollout itself: the ring grows to hold every env step kept since
the last training call, and the step before them (the state a training sequence starts from)."""
AUTO_START = 16
"""An automatic ring's first size (env steps per env column); it doubles as the rollout needs."""
AUTO_BYTES = 256 << 20
"""An automatic ring grows no further than this many bytes (a loop that never trains keeps its newest steps)."""


def _grown(a: np.ndarray, n: int, fill: int = 0) -> np.ndarray:
    """``a`` with rows up to ``n``, the new ones ``fill``: zeros from a fresh allocation, whose pages are touched
    only where a row is written (a ring sized for 1,024 envs is tens of MB, much of it written late or never)."""
    out = np.zeros((n, *a.shape[1:]), a.dtype) if fill == 0 else np.full((n, *a.shape[1:]), fill, a.dtype)
    out[: len(a)] = a
    return out


class _Store:
    """One module's returned states in one phase group, host arrays of rows (R * H floats: h of every
    layer, then c): the last per env column (``last``, ``has``) and, with a ``window``, a ring of the last
    ``window`` env steps per env column (``ring``, ``steps``: the env step each slot holds, -1 none);
    ``auto``: the window grows with the rollout (:data:`AUTO`)."""

    def __init__(self, width: int, window: int, auto: bool = False):
        self.window = window
        self.auto = auto
        self.since = -1  # auto: the first env step kept since the last training call (-1: none yet)
        self.envs = 0
        self.last = np.zeros((0, width), np.float32)
        self.has = np.zeros(0, np.bool_)
        self.ring = np.zeros((0, width), np.float32)
        self.steps = np.full(0, -1, np.int64)
        self.zero_in = np.zeros(0, np.bool_)  # the rollout call at that slot's step started from zeros
        # the device path (``ondevice_inputs.py``): ``last`` and ``ring`` values written on the device only
        # (``behind``) are brought here by ``pull`` before anything on the host reads or re-lays them;
        # ``version`` counts the host's own writes of them (the device's copies are rebuilt after one)
        self.behind = False
        self.pull: Callable[[], None] | None = None
        self.version = 0

    def sync(self) -> None:
        """The values the device path wrote brought to the host (one copy), where it is behind."""
        if self.behind:
            self.behind = False
            if self.pull is not None:
                self.pull()

    def grow(self, envs: int) -> None:
        if envs <= self.envs:
            return
        self.sync()
        self.last = _grown(self.last, envs)
        self.has = _grown(self.has, envs)
        if self.window:
            w = self.window
            self.ring = _grown(self.ring, envs * w)
            self.steps = _grown(self.steps, envs * w, -1)
            self.zero_in = _grown(self.zero_in, envs * w)
        self.envs = envs

    def fit(self, lo: int, hi: int) -> None:
        """An automatic ring grown (doubled, up to :data:`AUTO_BYTES`) to hold env steps ``lo`` .. ``hi`` about
        to be kept, every step kept since the last training call, and the step before those."""
        self.since = lo if self.since < 0 else min(self.since, lo)
        need = hi - self.since + 2
        if need <= self.window:
            return
        cap = max(self.window, AUTO_BYTES // max(1, self.envs * self.last.shape[1] * 4))
        window = min(max(need, 2 * self.window), cap)
        if window > self.window:
            self._resize(window)

    def _resize(self, window: int) -> None:
        """The ring re-laid for ``window`` steps per env column, every held step in its new slot (where two
        share one, the newer)."""
        self.sync()
        held = np.flatnonzero(self.steps >= 0)
        held = held[np.argsort(self.steps[held], kind="stable")]  # older first
        slots = (held // self.window) * window + self.steps[held] % window
        ring, steps, zero_in = self.ring, self.steps, self.zero_in
        self.window = window
        self.ring = np.zeros((self.envs * window, ring.shape[1]), np.float32)
        self.steps = np.full(self.envs * window, -1, np.int64)
        self.zero_in = np.zeros(self.envs * window, np.bool_)
        _, newest = np.unique(slots[::-1], return_index=True)  # each slot's newest step
        pick = len(slots) - 1 - newest
        self.ring[slots[pick]] = ring[held[pick]]
        self.steps[slots[pick]] = steps[held[pick]]
        self.zero_in[slots[pick]] = zero_in[held[pick]]


class Inputs:
    """The probe's memory of returned states, per (module, phase group); see the module docstring.
    ``window``: env steps of rollout states kept per env column for the training calls' 'stored' check
    (:meth:`of`; :data:`AUTO`: as many as the rollout holds; 0: none; then a training call's non-zero
    input is 'stored' where ``stored_states`` says the framework takes it from its stored states, else
    'other'). Used by the writer jobs only, in call order."""

    def __init__(self, window: int, stored_states: bool):
        self.window = window
        self.stored_states = stored_states
        self.stores: dict[tuple[str, str], _Store] = {}

    @classmethod
    def of(cls, reference_window: int, stored_states: bool) -> Inputs:
        """For the option ``reference_window``: that many env steps and two more (the step before the rollout's
        first, the bootstrap step); 0 none; negative (``options.AUTO_WINDOW``) the rollout's own length
        (:data:`AUTO`)."""
        if reference_window < 0:
            return cls(AUTO, stored_states)
        return cls(reference_window + 2 if reference_window else 0, stored_states)

    def answer(
        self,
        name: str,
        phase: str,
        grid: Grid | None,
        t: int,
        x0: np.ndarray,
        out: np.ndarray | None,
        layers: int,
        multistep: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The `init` codes (M,) and input norms (L, M) of M batch columns in call order (one call, or a
        block of one-step calls side by side): ``x0`` (R, M, H) their input states, ``out`` (R, M, H) the
        states they returned (None: not kept, e.g. a per-timestep loop's first step), ``t`` the grid step
        of their first step. Columns of one env later in the block compare with the earlier ones' states."""
        m, width = x0.shape[1], x0.shape[0] * x0.shape[2]
        sq = np.einsum("rmh,rmh->rm", x0, x0, dtype=np.float64)
        norms = np.sqrt(sq[:layers] + sq[layers:] if x0.shape[0] > layers else sq).astype(np.float32)
        # all zeros exactly where every square is (float32 squares are never 0 in float64; NaN is not 0)
        zero: np.ndarray = np.logical_not((sq != 0).any(axis=0))
        flags: np.ndarray = zero.astype(np.int8)  # ZERO is bit 1
        env = step = start = None
        if grid is not None and grid.shape[0] == m:
            env = grid.env[:, t].astype(np.int64) if grid.env is not None else None
            step = grid.env_step[:, t].astype(np.int64) if grid.env_step is not None else None
            start = grid.episode_start[:, t] if grid.episode_start is not None else np.full(m, -1, np.int8)
            if grid.episode_step is not None:  # untagged episode starts: an episode's step 0 starts one
                start = np.where((start < 0) & (grid.episode_step[:, t] == 0), np.int8(1), start)
        elif grid is None:
            env = np.arange(m, dtype=np.int64)
        training = phase in ("train", "value")
        store = self.store(name, phase, width)
        store.sync()
        if training:
            store.since = -1  # an automatic ring's next rollout starts here
        if env is None or (env < 0).any():  # columns without an env: nothing to compare with
            flags |= FIRST | (UNCHECKED if training else 0)
            if env is not None and out is not None and phase in ACTING and not multistep:
                # the columns that have an env are still rollout states train rows drift from
                self._keep(store, env, step, _rows(out), zero)
            return decode(flags, start, self.stored_states), norms
        store.grow(int(env.max(initial=-1)) + 1)  # (a call of no columns: rsl_rl's minibatch of no envs)
        if training:
            flags |= self._stored(store, _rows(x0), env, step, zero)
            return decode(flags, start, self.stored_states), norms
        acting = phase in ACTING and out is not None
        # each column's previous state: the same env's earlier column in the block, else the store's
        order, sorted_env, prev, inner, held = earlier_columns(env, store.has, acting)
        same = np.zeros(m, np.bool_)
        stored = np.flatnonzero(held & ~inner)  # compared with the store's state of their env
        if len(stored):
            same[stored] = (_rows(x0[:, stored]) == store.last[env[stored]]).all(axis=1)
        if acting and inner.any():
            assert out is not None
            same[inner] = _same_as_earlier(x0, out, prev, np.flatnonzero(inner))
        flags |= (~held) * np.int8(FIRST) | same * np.int8(PREVIOUS)
        rest = ~(zero | same) & held
        if rest.any():
            outs = _rows(out) if out is not None else None
            flags |= self._other_env(store, _rows(x0), env, rest, outs) * np.int8(OTHER_ENV)
        if acting:
            assert out is not None
            last = order[np.r_[sorted_env[1:] != sorted_env[:-1], True]]
            store.last[env[last]] = _rows(out[:, last])
            store.has[env[last]] = True
            store.version += 1
            if not multistep:
                self._keep(store, env, step, out, zero, by_state=True)
        return decode(flags, start, self.stored_states), norms

    def store(self, name: str, phase: str, width: int) -> _Store:
        """Module ``name``'s store of returned states for ``phase``'s group (made at its first use), rows of
        ``width`` floats."""
        group = GROUP.get(phase, "other")
        store = self.stores.get((name, group))
        if store is None:
            store = self.stores[(name, group)] = self._store(width, group)
        return store

    def _store(self, width: int, group: str) -> _Store:
        if group != "rollout" or not self.window:
            return _Store(width, 0)
        return _Store(width, AUTO_START, auto=True) if self.window < 0 else _Store(width, self.window)

    @staticmethod
    def _keep(
        store: _Store,
        env: np.ndarray,
        step: np.ndarray | None,
        rows: np.ndarray | None,
        zero: np.ndarray,
        by_state: bool = False,
    ) -> None:
        """Rollout states ``rows`` (M, R * H) of (env, env step) into the store's ring (a store without one keeps
        none), those with an env and a step; ``zero``: whether each call started from zeros. ``by_state``:
        ``rows`` come (R, M, H), a block's layout (written into the ring's rows without a copy of them first).
        ``rows`` None: the slots' steps and ``zero`` only (the device path writes the states on the device)."""
        if not store.window or step is None:
            return
        ok = (env >= 0) & (step >= 0)
        every = bool(ok.all())
        if not every and not ok.any():
            return
        if not every:
            env, step, zero = env[ok], step[ok], zero[ok]
        store.grow(int(env.max()) + 1)
        if store.auto:
            store.fit(int(step.min()), int(step.max()))
        slots = env * store.window + step % store.window
        if rows is None:
            pass
        elif by_state:
            r, _, h = rows.shape
            source = rows.transpose(1, 0, 2)  # (M, R, H), a view
            store.ring.reshape(len(store.ring), r, h)[slots] = source if every else source[ok]
        else:
            store.ring[slots] = rows if every else rows[ok]
        if rows is not None:
            store.version += 1
        store.steps[slots] = step
        store.zero_in[slots] = zero

    def keep_steps(self, name: str, grid: Grid | None, hs: np.ndarray, cs: np.ndarray | None) -> None:
        """Every step of a multi-step rollout call into the ring of rollout states (:meth:`answer` keeps its
        last state only): hs/cs (L, T, N, H), the per-step states a multi-step call's recovery gives."""
        store = self.stores.get((name, "rollout"))
        steps, batch = hs.shape[1:3]
        if store is None or not store.window or grid is None or grid.shape != (batch, steps):
            return
        if grid.env is None or grid.env_step is None:
            return
        store.sync()
        both = np.concatenate([hs, cs]) if cs is not None else hs  # (R, T, N, H)
        if both.shape[0] * both.shape[3] != store.ring.shape[1]:
            return
        env, step = grid.env.T.reshape(-1).astype(np.int64), grid.env_step.T.reshape(-1).astype(np.int64)
        rows = both.transpose(1, 2, 0, 3).reshape(steps * batch, -1)  # (T * N, R * H), step-major as env/step
        self._keep(store, env, step, rows, np.zeros(len(env), np.bool_))

    def rollout_ring(self, name: str, sync: bool = True) -> tuple[np.ndarray, np.ndarray, int, int] | None:
        """Module ``name``'s rollout states of the last ``window`` env steps of each env column (``drift.Drift``
        reads them: the one store of rollout states in the training process): the (envs * window, R * H)
        table, the env step each slot holds (-1: none), the window and the env count; None: none held.
        ``sync``: the values the device path wrote brought here first (False: the device path's own read)."""
        store = self.stores.get((name, "rollout"))
        if store is None or not store.window or not store.envs:
            return None
        if sync:
            store.sync()
        return store.ring, store.steps, store.window, store.envs

    @staticmethod
    def _other_env(
        store: _Store, xs: np.ndarray, env: np.ndarray, rest: np.ndarray, outs: np.ndarray | None
    ) -> np.ndarray:
        """Columns ``rest`` whose input is bit-equal to a state another env column returned (held in the
        store, or returned in this block)."""
        owner: dict[bytes, int] = {}
        for e in np.flatnonzero(store.has).tolist():
            owner.setdefault(store.last[e].tobytes(), e)
        if outs is not None:
            for i, row in enumerate(outs):
                owner.setdefault(row.tobytes(), int(env[i]))
        found = np.zeros(len(xs), np.bool_)
        for i in np.flatnonzero(rest).tolist():
            other = owner.get(xs[i].tobytes())
            found[i] = other is not None and other != env[i]
        return found

    @staticmethod
    def _stored(
        store: _Store, xs: np.ndarray, env: np.ndarray, step: np.ndarray | None, zero: np.ndarray
    ) -> np.ndarray:
        """Train columns: bit-equal to the rollout state of the step before (what sb3 stores), or zeros
        where the rollout's own call at that step started from zeros (what a CleanRL-style loop stores)."""
        m = len(xs)
        if not store.window or step is None:
            return np.full(m, UNCHECKED, np.int8)
        before = step - 1
        slots = env * store.window + before % store.window
        held = (store.steps[slots] == before) & (before >= 0)
        same = held & (xs == store.ring[slots]).all(axis=1)
        here = env * store.window + step % store.window
        same |= zero & (store.steps[here] == step) & store.zero_in[here]
        other = Inputs._stored_of_other_env(store, xs, env, before, np.flatnonzero(held & ~same & ~zero))
        held |= same
        # an env's first step has no earlier state: zeros there are its initial state (a reset)
        flags = same * np.int8(STORED) | (~held) * np.int8(UNCHECKED) | (before < 0) * np.int8(FIRST)
        return flags | other * np.int8(OTHER_ENV)

    @staticmethod
    def _stored_of_other_env(
        store: _Store, xs: np.ndarray, env: np.ndarray, before: np.ndarray, odd: np.ndarray
    ) -> np.ndarray:
        """Train columns ``odd`` (their env's stored state is held, and differs): bit-equal to the state another
        env column stored at the same env step (a minibatch's initial states indexed by position, not by env).
        Only a wrong start pays it; at most :data:`OTHER_ENV_BUDGET` floats are compared in a call, the columns
        past it stay 'other'."""
        found = np.zeros(len(xs), np.bool_)
        envs = len(store.steps) // store.window if store.window else 0
        if not len(odd) or envs < 2:
            return found
        ring = store.ring.reshape(envs, store.window, -1)
        steps = store.steps.reshape(envs, store.window)
        for i in odd[: max(1, OTHER_ENV_BUDGET // (envs * ring.shape[2]))].tolist():
            b = int(before[i]) % store.window
            candidates = steps[:, b] == before[i]
            candidates[env[i]] = False
            found[i] = bool((candidates & (ring[:, b] == xs[i]).all(axis=1)).any())
        return found


def earlier_columns(
    env: np.ndarray, has: np.ndarray, acting: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A block's columns of envs ``env`` (M,), sorted by env (stable: call order within an env): (the order, the
    sorted envs, each column's earlier column of the same env (-1: none; none at all unless ``acting``), whether
    it has one, whether any state is held for it: an earlier column's or the store's, ``has`` per env)."""
    order = np.argsort(env, kind="stable")
    sorted_env = env[order]
    new_env = np.r_[True, sorted_env[1:] != sorted_env[:-1]]
    prev = np.full(len(env), -1, np.int64)
    if acting:
        prev[order[1:]] = order[:-1]
        prev[order[new_env]] = -1
    inner = prev >= 0
    return order, sorted_env, prev, inner, inner | has[env]


def _rows(states: np.ndarray) -> np.ndarray:
    """States (R, M, H) as M rows of R * H (h of every layer, then c): the layout the stores keep."""
    r, m, h = states.shape
    return np.ascontiguousarray(states.transpose(1, 0, 2)).reshape(m, r * h)


def _same_as_earlier(x0: np.ndarray, out: np.ndarray, prev: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """Whether each column ``inner`` of a block started from the state its env's earlier column ``prev``
    returned: x0 and out (R, M, H). A block of calls over the same env columns (each column's earlier one
    the same column of the call before) compares two shifted views, without gathering either side."""
    m = x0.shape[1]
    shift = m - len(inner)
    if shift > 0 and inner[0] == shift and bool((prev[inner] == inner - shift).all()):
        return (x0[:, shift:] == out[:, : m - shift]).all(axis=2).all(axis=0)
    return (x0[:, inner] == out[:, prev[inner]]).all(axis=2).all(axis=0)


def _decode(flags: np.ndarray, start: np.ndarray | None, stored_states: bool) -> np.ndarray:
    """:func:`decode`, rule by rule (it builds :data:`_CODES`, which :func:`decode` looks the answers up in)."""
    starts = start == 1 if start is not None else np.zeros(len(flags), bool)
    zero = (flags & ZERO) != 0
    out = np.full(len(flags), INIT["other"], np.int8)
    unchecked = (flags & UNCHECKED) != 0
    if stored_states:
        out[unchecked] = INIT["stored"]
    out[(flags & OTHER_ENV) != 0] = INIT["other_env"]
    out[zero] = INIT["zero"]
    out[(flags & STORED) != 0] = INIT["stored"]  # zeros too, where the rollout's own call started from them
    out[(flags & PREVIOUS) != 0] = INIT["previous"]
    # a zero state at a tagged episode start, or where no earlier state of the env column is known
    out[zero & (starts | ((flags & FIRST) != 0))] = INIT["reset"]
    return out


_BITS = 64  # every combination of the answer bits (ZERO ... UNCHECKED)
_CODES = {
    stored: _decode(np.tile(np.arange(_BITS, dtype=np.int8), 2), np.repeat(np.array([0, 1], np.int8), _BITS), stored)
    for stored in (False, True)
}
"""The `init` code of every (answer bits, episode start) pair: index bits + 64 * (episode_start == 1)."""


def decode(flags: np.ndarray, start: np.ndarray | None, stored_states: bool) -> np.ndarray:
    """The ``init`` codes (int8) of answer bits ``flags`` (N,), given each column's ``episode_start``
    (tribool int8, 1 = an episode starts; None: not tagged): one table look-up (the rules: :func:`_decode`)."""
    index = flags.astype(np.intp)
    if start is not None:
        index += (start == 1) * _BITS
    return _CODES[stored_states].take(index)


def module_input(
    mod: nn.Module, args: tuple[Any, ...], batch: int, x: torch.Tensor, unbatched: bool, is_lstm: bool
) -> torch.Tensor:
    """The input states of a one-step nn.LSTM / nn.GRU call as one (R, N, H) tensor: h of every layer,
    then c (zeros where the call was given none)."""
    hx = args[1] if len(args) > 1 else None
    if hx is None:
        layers, hidden = int(mod.num_layers), int(mod.hidden_size)  # type: ignore[arg-type]
        return torch.zeros((2 if is_lstm else 1) * layers, batch, hidden, dtype=x.dtype, device=x.device)
    x0 = torch.cat(hx).detach() if is_lstm else hx.detach().clone()  # a copy: callers change states in place
    return x0.unsqueeze(1) if unbatched else x0


def start_states(
    mod: nn.Module, args: tuple[Any, ...], batch: int, x: torch.Tensor, unbatched: bool, is_lstm: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (h0, c0) a multi-step nn.LSTM / nn.GRU call started from, each (L, N, H) (zeros where the call was
    given none; a GRU's c0 zeros), as given: no copy."""
    layers, hidden = int(mod.num_layers), int(mod.hidden_size)  # type: ignore[arg-type]
    hx = args[1] if len(args) > 1 else None
    zeros = torch.zeros(layers, batch, hidden, dtype=x.dtype, device=x.device)
    if hx is None:
        return zeros, zeros
    h0, c0 = hx if is_lstm else (hx, zeros)
    if unbatched:
        h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
    return h0, c0


def input_parts(args: tuple[Any, ...], unbatched: bool, is_lstm: bool) -> tuple[torch.Tensor, ...] | None:
    """The input states of a one-step nn.LSTM / nn.GRU call as given, (h0, c0) or (h0,), each (L, N, H), no
    copy (the block copies them into its buffer); None where the call was given none (zeros)."""
    hx = args[1] if len(args) > 1 else None
    if hx is None:
        return None
    parts = tuple(hx) if is_lstm else (hx,)
    return tuple(p.unsqueeze(1) for p in parts) if unbatched else parts


def cell_parts(args: tuple[Any, ...], batch: int, is_lstm: bool) -> tuple[torch.Tensor, ...] | None:
    """The input states of an nn.LSTMCell / nn.GRUCell call as (1, N, H) views (None: zeros)."""
    hx = args[1] if len(args) > 1 else None
    if hx is None:
        return None
    parts = hx if is_lstm else (hx,)
    return tuple(p.detach().reshape(1, batch, -1) for p in parts)


def joined(
    x0: torch.Tensor | tuple[torch.Tensor, ...] | None, rows: int, batch: int, like: torch.Tensor
) -> torch.Tensor:
    """Input states given as parts (:func:`input_parts`) as one new (R, N, H) tensor (zeros for None)."""
    if x0 is None:
        return like.new_zeros((rows, batch, like.shape[-1]))
    if isinstance(x0, torch.Tensor):
        return x0
    return torch.cat([p.detach() for p in x0]) if len(x0) > 1 else x0[0].detach().clone()


def stacked_steps(steps: list[Any], lstm: bool) -> torch.Tensor:
    """The states a per-timestep loop returned, step by step ((h, c), or h; each (L, N, H)), as one new
    (2L or L, N, T, H) tensor: h and c each stacked straight into their rows (one allocation, no torch.cat)."""
    parts = [[s[0] for s in steps], [s[1] for s in steps]] if lstm else [steps]
    h = parts[0][0]
    layers = int(h.shape[0])
    out = h.new_empty((len(parts) * layers, int(h.shape[1]), len(steps), int(h.shape[2])))
    for i, part in enumerate(parts):
        torch.stack(part, dim=2, out=out[i * layers : (i + 1) * layers])
    return out
