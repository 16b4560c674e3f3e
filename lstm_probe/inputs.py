"""Where each traced call's input state came from: the ``init`` and ``init_norm`` columns.

The tracer (training process) asks :class:`Inputs` about every call at the first step of each batch
column: it compares the state the call was given with what the probe already holds, the state each
module last returned for each env column (per phase group) and, for training calls, the rollout states
of the last ``window`` env steps of each env. One compare of the input against those states per call,
on the states' own device, with no host copy (a call's answer stays a small tensor until its block is
written, :func:`decode`). The schema's ``init`` column says what each answer means.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.contract import Grid
from lstm_probe.schema import CODE

ZERO, PREVIOUS, STORED, OTHER_ENV, FIRST, UNCHECKED = 1, 2, 4, 8, 16, 32
"""Bits of a column's answer (:func:`decode` turns them into the ``init`` codes): the input is all zeros;
bit-equal to the state the module last returned for this env column; bit-equal to the stored rollout
state (train); bit-equal to another env column's last state; no state known for this env column yet;
train input whose rollout state the probe does not hold."""
INIT = CODE["init"]
GROUP = {"rollout": "rollout", "bootstrap": "rollout", "train": "rollout", "value": "rollout", "predict": "predict"}
"""Phase -> the store its calls compare against (other phases: 'other'); rollout, predict and other calls
keep their returned states in their own store (an evaluation's env columns are not the rollout's)."""
ACTING = frozenset({"rollout", "predict", "other"})
"""Phases whose returned states are what the next step of the same env column should start from."""
FULL_COMPARE = 256
"""Columns x known env columns up to which every column is compared with every env column's state at once
(no host sync); above it only the columns that matched nothing are, after one sync."""


class _Store:
    """One module's returned states in one phase group: the last per env column (``last`` (R, E, H), R =
    layers for h, then layers for c) and, with a ``window``, a ring of the last ``window`` env steps per
    env column (``ring`` (R, E * W, H), ``steps`` the env step each slot holds, -1 none)."""

    def __init__(self, like: torch.Tensor, window: int):
        rows, _, hidden = like.shape
        self.window = window
        self.envs = 0
        self.last = like.new_zeros((rows, 0, hidden))
        self.has = torch.zeros(0, dtype=torch.bool, device=like.device)
        self.ring = like.new_zeros((rows, 0, hidden))
        self.steps = torch.full((0,), -1, dtype=torch.int64, device=like.device)

    def grow(self, envs: int) -> None:
        if envs <= self.envs:
            return
        extra = envs - self.envs
        rows, _, hidden = self.last.shape
        self.last = torch.cat((self.last, self.last.new_zeros((rows, extra, hidden))), 1)
        self.has = torch.cat((self.has, self.has.new_zeros(extra)))
        if self.window:
            w = self.window
            self.ring = torch.cat((self.ring, self.ring.new_zeros((rows, extra * w, hidden))), 1)
            self.steps = torch.cat((self.steps, self.steps.new_full((extra * w,), -1)))
        self.envs = envs

    def put(self, env: torch.Tensor, step: np.ndarray | None, out: torch.Tensor) -> None:
        """Keep ``out`` (R, N, H), the states a call returned, as the last of env columns ``env``."""
        self.last[:, env] = out
        self.has[env] = True
        if self.window and step is not None:
            ok = step >= 0
            if not ok.all():
                keep = torch.from_numpy(ok).to(env.device)
                env, out, step = env[keep], out[:, keep], step[ok]
            slots = env * self.window + torch.from_numpy(step % self.window).to(env.device)
            self.ring[:, slots] = out
            self.steps[slots] = torch.from_numpy(step).to(env.device)


class Inputs:
    """The probe's memory of returned states, per (module, phase group); see the module docstring.
    ``window``: env steps of rollout states kept per env column for the training calls' 'stored' check
    (0: none; then a training call's non-zero input is 'stored' where ``stored_states`` says the framework
    takes it from its stored states, else 'other')."""

    def __init__(self, window: int, stored_states: bool):
        self.window = window
        self.stored_states = stored_states
        self.stores: dict[tuple[str, str], _Store] = {}

    def ask(
        self, name: str, phase: str, grid: Grid | None, t: int, x0: torch.Tensor, layers: int
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Answer one call: ``x0`` (R, N, H) the input states of every layer (h, then c), ``t`` the grid
        step of the call's first step. Returns the answer bits (N,), the input norm per layer (L, N), and
        what :meth:`keep` needs."""
        n = x0.shape[1]
        sq = (x0 * x0).sum(-1)  # (R, N)
        norms = (sq[:layers] + sq[layers:]).sqrt() if x0.shape[0] > layers else sq.sqrt()
        zero = ~(x0 != 0).flatten(2).any(-1).any(0)  # (N,)
        env_np = step_np = None
        if grid is not None and grid.shape[0] != n:  # a grid that does not fit the call: no env columns
            pass
        elif grid is not None and grid.env is not None:
            env_np = grid.env[:, t].astype(np.int64)
            if grid.env_step is not None:
                step_np = grid.env_step[:, t].astype(np.int64)
        elif grid is None:
            env_np = np.arange(n, dtype=np.int64)
        group = GROUP.get(phase, "other")
        store = self.stores.get((name, group))
        if store is None:
            window = self.window if group == "rollout" else 0
            store = self.stores[(name, group)] = _Store(x0, window)
        flags = zero.to(torch.int8) * ZERO
        if env_np is None or (env_np < 0).any():  # columns without an env: nothing to compare with
            flags |= FIRST
            if phase in ("train", "value"):
                flags |= UNCHECKED
            return flags, norms, None
        store.grow(int(env_np.max()) + 1)
        env = torch.from_numpy(env_np).to(x0.device)
        if phase in ("train", "value"):
            flags |= self._stored(store, x0, env, step_np)
            return flags, norms, None
        has = store.has[env]
        flags |= (~has).to(torch.int8) * FIRST
        same = has & (x0 == store.last[:, env]).flatten(2).all(-1).all(0)
        flags |= same.to(torch.int8) * PREVIOUS
        if store.envs > 1:
            flags |= self._other_env(store, x0, env, zero | same | ~has) * OTHER_ENV
        return flags, norms, (store, env, step_np) if phase in ACTING else None

    @staticmethod
    def keep(kept: Any, out: torch.Tensor, multistep: bool = False) -> None:
        """After the call: ``out`` (R, N, H), the states it returned, as the last of its env columns (a
        multi-step call's are not kept in the ring: their env step is not the call's first)."""
        if kept is not None:
            store, env, step = kept
            store.put(env, None if multistep else step, out)

    @staticmethod
    def _other_env(store: _Store, x0: torch.Tensor, env: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        n, envs = x0.shape[1], store.envs
        cols = torch.arange(n, device=x0.device)
        if n * envs > FULL_COMPARE:  # only the columns that matched nothing
            rest = torch.nonzero(~done).flatten()
            if len(rest) == 0:
                return torch.zeros(n, dtype=torch.int8, device=x0.device)
            cols = rest
        eq = (x0[:, cols, None] == store.last[:, None]).flatten(3).all(-1).all(0)  # (n', E)
        eq &= store.has[None, :]
        eq[torch.arange(len(cols), device=x0.device), env[cols]] = False
        out = torch.zeros(n, dtype=torch.int8, device=x0.device)
        out[cols] = (eq.any(1) & ~done[cols]).to(torch.int8)
        return out

    def _stored(self, store: _Store, x0: torch.Tensor, env: torch.Tensor, step: np.ndarray | None) -> torch.Tensor:
        n = x0.shape[1]
        if not store.window or step is None:
            return torch.full((n,), UNCHECKED, dtype=torch.int8, device=x0.device)
        before = step - 1
        slots = env * store.window + torch.from_numpy(before % store.window).to(x0.device)
        held = (store.steps[slots] == torch.from_numpy(before).to(x0.device)) & torch.from_numpy(before >= 0).to(
            x0.device
        )
        same = held & (x0 == store.ring[:, slots]).flatten(2).all(-1).all(0)
        return same.to(torch.int8) * STORED | (~held).to(torch.int8) * UNCHECKED


def decode(flags: np.ndarray, start: np.ndarray | None, stored_states: bool) -> np.ndarray:
    """The ``init`` codes (int8) of answer bits ``flags`` (N,), given each column's ``episode_start``
    (tribool int8, 1 = an episode starts; None: not tagged)."""
    starts = start == 1 if start is not None else np.zeros(len(flags), bool)
    zero = (flags & ZERO) != 0
    out = np.full(len(flags), INIT["other"], np.int8)
    unchecked = (flags & UNCHECKED) != 0
    if stored_states:
        out[unchecked] = INIT["stored"]
    out[(flags & OTHER_ENV) != 0] = INIT["other_env"]
    out[(flags & STORED) != 0] = INIT["stored"]
    out[(flags & PREVIOUS) != 0] = INIT["previous"]
    out[zero] = INIT["zero"]
    # a zero state at a tagged episode start, or the first state the probe saw for an env column (an
    # acting call; a training call's zeros are a reset only at an episode start)
    out[zero & (starts | (((flags & FIRST) != 0) & ~unchecked))] = INIT["reset"]
    return out


def host_codes(
    flags: torch.Tensor, norms: torch.Tensor, grid: Grid | None, t: int, stored_states: bool
) -> tuple[np.ndarray, np.ndarray]:
    """What the sink takes for the `init` columns: the codes of answer bits ``flags`` (N,) (the episode
    starts at step ``t`` of ``grid``) and the norms (L, N), as host arrays."""
    flags_np = flags.cpu().numpy()
    start = grid.episode_start if grid is not None and grid.shape[0] == len(flags_np) else None
    codes = decode(flags_np, start[:, t] if start is not None else None, stored_states)
    return codes, norms.float().cpu().numpy()


def module_input(
    mod: nn.Module, args: tuple[Any, ...], batch: int, x: torch.Tensor, unbatched: bool, is_lstm: bool
) -> torch.Tensor:
    """The input states of a one-step nn.LSTM / nn.GRU call as one (R, N, H) tensor: h of every layer,
    then c (zeros where the call was given none)."""
    hx = args[1] if len(args) > 1 else None
    if hx is None:
        layers, hidden = int(mod.num_layers), int(mod.hidden_size)  # type: ignore[arg-type]
        return torch.zeros((2 if is_lstm else 1) * layers, batch, hidden, dtype=x.dtype, device=x.device)
    x0 = torch.cat(hx) if is_lstm else hx
    return x0.detach().unsqueeze(1) if unbatched else x0.detach()


def cell_input(args: tuple[Any, ...], batch: int, h: torch.Tensor, is_lstm: bool) -> torch.Tensor:
    """The input states of an nn.LSTMCell / nn.GRUCell call as (R, N, H) (``h`` the state it returned)."""
    hx = args[1] if len(args) > 1 else None
    if hx is None:
        return h.new_zeros((2 if is_lstm else 1, batch, h.shape[-1]))
    parts = hx if is_lstm else (hx,)
    return torch.stack([p.detach().reshape(batch, -1) for p in parts])
