"""The device path of a summary log's rollout blocks (issue #50): a block of one-step rollout (or bootstrap)
calls whose states are on an accelerator hands the host O(columns) figures, not its (R, M, H) states: each
row's h and c norms and each column's input-state answer computed where the states are, in a few batched
tensor ops per block, crossing in the block's one copy (``transfer.Staged``). Training calls on the device
path (``calls._on_device``) answer their input states here too (the `stored` check against the device ring).

What an answer needs of the host is the grid's arithmetic (``inputs.Inputs.answer``'s: env and env step, the
sort by env, each column's earlier column of the same env, which envs have a last state, the ring's slots):
it stays on the host, in the same order. Only the value comparisons run on the device, as bool arrays:

- ZERO: every float64 square of the input zero (the host's own test, on the same float32 values);
- PREVIOUS: the input equal (``==``, as numpy's) to the earlier column's returned state, or to the module's
  last returned state of its env: a device copy of ``_Store.last`` (:class:`_Last`);
- STORED (training calls): equal to the device ring's state at env step - 1 (``ondevice._Ring``);
- OTHER_ENV: bit-equal to a state another env returned (the host keys a dict by the rows' bytes): an exact
  64-bit hash of each row's float32 bits (:func:`row_hashes`), every held column's hash looked up among the
  owners' (the last states, then the block's returned states, in the host's order: a stable sort, then a
  binary search gives the first owner of an equal hash), the candidate's bits then compared on the device in
  the same batch. The answer is the host's wherever no two of the owners that precede a match differ and
  share a hash (a 64-bit collision among different rows: never seen, ~2^-64 per pair; a collision can only
  turn an OTHER_ENV into no answer, never invent one, since equality is always confirmed).

The device copies hold the values (``last``, the ring); the host store keeps every index (``has``, the slots'
steps, ``zero_in``) and is marked ``behind``: anything on the host that reads or re-lays its values (a host
path call of the same module, a training call's drift on the host, the ring's growth) first brings them over
in one copy (``_Store.sync`` calls :meth:`DeviceInputs.pull`). Where the host writes them itself the device
copies are rebuilt from it (``_Store.version``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from lstm_probe.capture.inputs import (
    ACTING,
    FIRST,
    OTHER_ENV,
    PREVIOUS,
    STORED,
    UNCHECKED,
    Inputs,
    _Store,
    decode,
    earlier_columns,
)
from lstm_probe.capture.ondevice import OnDevice, _Plan
from lstm_probe.capture.transfer import host_arrays
from lstm_probe.contract import Grid

PHASES = frozenset({"rollout", "bootstrap"})
"""The phases whose blocks take the device path (their store is the rollout's; no drift)."""

Answered = Callable[[list[np.ndarray]], "tuple[np.ndarray, np.ndarray]"]
"""An answer's second half: the host arrays of its device half -> the `init` codes (M,) and input norms (L, M)."""

_C0, _C1, _C2 = -7046029254386353131, -4658895280553007687, -7723592293110705685  # splitmix64's, as int64


HASH_CHUNK = 1 << 22
"""Elements hashed at a time (:func:`row_hashes`): its int64 scratch stays ~100 MB at most."""


def row_hashes(rows: torch.Tensor) -> torch.Tensor:
    """A 64-bit hash of each row's float32 bits, (K, W) -> (K,) int64: each element's bits, salted by its
    position, through splitmix64's mixer, the mixed values summed (wrapping); rows taken in chunks."""
    k, w = rows.shape
    out = rows.new_empty(k, dtype=torch.int64)
    if k == 0:
        return out
    bits = rows.contiguous().view(torch.int32)
    salt = torch.arange(1, w + 1, device=rows.device, dtype=torch.int64).mul_(_C0)
    step = max(1, HASH_CHUNK // max(w, 1))
    for at in range(0, k, step):
        v = bits[at : at + step].long().add_(salt)
        v = v.bitwise_xor_(v >> 30).mul_(_C1)
        v = v.bitwise_xor_(v >> 27).mul_(_C2)
        torch.sum(v.bitwise_xor_(v >> 31), 1, out=out[at : at + step])
    return out


def _as_rows(states: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Columns ``cols`` of states (R, M, H) as (k, R * H) rows (h of every layer, then c: the stores' layout)."""
    picked = states.index_select(1, cols)
    return picked.transpose(0, 1).reshape(len(cols), states.shape[0] * states.shape[2])


@dataclass
class _Last:
    """One module's last returned state per env column of the rollout group, (envs, R, H) float32 on the
    device, and the host store's ``version`` it was copied at."""

    table: torch.Tensor
    version: int


class DeviceInputs:
    """The input-state answers of the device path (see the module docstring), for one summary log."""

    def __init__(self, ondevice: OnDevice):
        self.ondevice = ondevice
        self.inputs: Inputs = ondevice.inputs
        self.lasts: dict[str, _Last] = {}

    def takes_block(self, phase: str, device: torch.device) -> bool:
        return phase in PHASES and OnDevice.on(device)

    # -- the device copies ----------------------------------------------------------------------------
    def _last(self, name: str, store: _Store, rows: int, device: torch.device) -> torch.Tensor:
        """The device copy of ``store.last`` (made or rebuilt from the host's where it is out of date)."""
        held = self.lasts.get(name)
        if held is None or held.version != store.version or held.table.shape[0] != store.envs:
            store.sync()
            table = torch.from_numpy(store.last.reshape(store.envs, rows, -1).copy())
            if device.type != "cpu":
                table = table.pin_memory().to(device, non_blocking=True)
            held = self.lasts[name] = _Last(table, store.version)
        return held.table

    def _behind(self, name: str, store: _Store) -> None:
        """The device holds values ``store`` lacks: the host brings them over before it next reads them."""
        store.behind = True
        store.pull = lambda: self.pull(name, store)

    def pull(self, name: str, store: _Store) -> None:
        """The device's copies of module ``name``'s last states and rollout ring into ``store`` (one copy)."""
        parts: list[torch.Tensor] = []
        last, ring = self.lasts.get(name), self.ondevice.rings.get(name)
        if last is not None and last.table.shape[0] <= store.envs:
            parts.append(last.table)
        if ring is not None and len(ring.table) == len(store.ring) and ring.window == store.window:
            parts.append(ring.table)
        if not parts:
            return
        arrays = host_arrays(*parts)
        if last is not None and parts[0] is last.table:
            store.last[: len(arrays[0])] = arrays[0].reshape(len(arrays[0]), -1)
            arrays = arrays[1:]
        if arrays:
            store.ring[:] = arrays[0].reshape(len(store.ring), -1)

    # -- a rollout block --------------------------------------------------------------------------------
    def block_answer(
        self, name: str, phase: str, grid: Grid, x0: torch.Tensor, out: torch.Tensor, layers: int, plan: _Plan
    ) -> tuple[Callable[[dict[str, torch.Tensor]], list[torch.Tensor]], Answered]:
        """``Inputs.answer`` of a block's M columns (phase rollout or bootstrap, t = 0), states x0 and out (R, M,
        H) on the device: the host's index arithmetic now, the indices the device needs added to ``plan``; a
        function that, given the plan's upload, makes the device half (bool and float arrays, O(M)); and the
        second half, from their host arrays. The second half also keeps what the block returned (``has``, the
        ring's slots on the host; ``last`` and the ring's states on the device)."""
        r, m, hidden = x0.shape
        width = r * hidden
        env = step = start = None
        if grid.shape[0] == m:
            env = grid.env[:, 0].astype(np.int64) if grid.env is not None else None
            step = grid.env_step[:, 0].astype(np.int64) if grid.env_step is not None else None
            start = grid.episode_start[:, 0] if grid.episode_start is not None else np.full(m, -1, np.int8)
            if grid.episode_step is not None:
                start = np.where((start < 0) & (grid.episode_step[:, 0] == 0), np.int8(1), start)
        store = self.inputs.store(name, phase, width)
        acting = phase in ACTING
        whole = env is not None and not (env < 0).any()
        if whole:
            assert env is not None
            store.grow(int(env.max()) + 1)
        order = prev = inner = held = stored = has_envs = hashed = None
        last: torch.Tensor | None = None
        if whole:
            assert env is not None
            order, sorted_env, prev, inner, held = earlier_columns(env, store.has, acting)
            stored = np.flatnonzero(held & ~inner)
            plan.add("stored", stored)
            plan.add("stored_env", env[stored])
            plan.add("inner", np.flatnonzero(inner))
            plan.add("prev", prev[inner])
            hashed = np.flatnonzero(held)
            has_envs = np.flatnonzero(store.has)
            plan.add("hashed", hashed)
            plan.add("has_envs", has_envs)
            plan.add("owner_env", np.concatenate([has_envs, env]))
            plan.add("hashed_env", env[hashed])
            if acting:  # each env's last column: its state is the env's last one now
                lasts = order[np.r_[sorted_env[1:] != sorted_env[:-1], True]]
                plan.add("last_env", env[lasts])
                plan.add("last_col", lasts)
            last = self._last(name, store, r, x0.device)
        uploaded: dict[str, torch.Tensor] = {}

        def device_half(index: dict[str, torch.Tensor]) -> list[torch.Tensor]:
            uploaded.update(index)
            x = x0.float()
            sq = x.double().square_().sum(2)  # (R, M), float64 sums of float32 squares: the host's
            norms = (sq[:layers] + sq[layers:] if r > layers else sq).sqrt_().float()
            zero = (sq != 0).any(0).logical_not_()
            parts: list[torch.Tensor] = [norms, zero]
            if not whole:
                return parts
            assert last is not None
            o = out.float()
            same_stored = _equal(_as_rows(x, index["stored"]), last.index_select(0, index["stored_env"]))
            same_inner = _equal(_as_rows(x, index["inner"]), _as_rows(o, index["prev"]))
            owners_last = last.index_select(0, index["has_envs"]).reshape(len(index["has_envs"]), width)
            xs = _as_rows(x, index["hashed"])
            owners = torch.cat((row_hashes(owners_last), row_hashes(o.transpose(0, 1).reshape(m, width))))
            other = _other_env(xs, owners, owners_last, o, index["owner_env"], index["hashed_env"])
            return [*parts, same_stored, same_inner, other]

        def second(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
            norms, zero = arrays[0], arrays[1] != 0
            flags: np.ndarray = zero.astype(np.int8)
            if not whole:
                flags |= FIRST
                if env is not None and acting:
                    self.inputs._keep(store, env, step, None, zero)
                    self.ondevice.kept(name, grid, out, make=True)
                    self._behind(name, store)
                return decode(flags, start, self.inputs.stored_states), norms
            assert env is not None and order is not None and held is not None and inner is not None
            assert stored is not None and hashed is not None
            same = np.zeros(m, np.bool_)
            same[stored] = arrays[2] != 0
            same[inner] = arrays[3] != 0
            flags |= (~held) * np.int8(FIRST) | same * np.int8(PREVIOUS)
            rest = ~(zero | same) & held
            other = np.zeros(m, np.bool_)
            other[hashed] = arrays[4] != 0
            flags |= (other & rest) * np.int8(OTHER_ENV)
            if acting:
                store.has[env[order]] = True
                rows = out.float().index_select(1, uploaded["last_col"]).transpose(0, 1)
                self.lasts[name].table.index_copy_(0, uploaded["last_env"], rows)
                self.inputs._keep(store, env, step, None, zero)
                self.ondevice.kept(name, grid, out, make=True)
                self._behind(name, store)
            return decode(flags, start, self.inputs.stored_states), norms

        return device_half, second

    # -- a training call's `stored` check ---------------------------------------------------------------
    def train_answer(
        self, name: str, phase: str, grid: Grid | None, x0: torch.Tensor, layers: int, plan: _Plan
    ) -> tuple[Callable[[dict[str, torch.Tensor]], list[torch.Tensor]], Answered]:
        """``Inputs.answer`` of a training (or value) call's columns (t = 0), input states x0 (R, N, H) on the
        device: as :meth:`block_answer`, the `stored` check against the device ring."""
        r, m, hidden = x0.shape
        env = step = start = None
        if grid is not None and grid.shape[0] == m:
            env = grid.env[:, 0].astype(np.int64) if grid.env is not None else None
            step = grid.env_step[:, 0].astype(np.int64) if grid.env_step is not None else None
            start = grid.episode_start[:, 0] if grid.episode_start is not None else np.full(m, -1, np.int8)
            if grid.episode_step is not None:
                start = np.where((start < 0) & (grid.episode_step[:, 0] == 0), np.int8(1), start)
        elif grid is None:
            env = np.arange(m, dtype=np.int64)
        store = self.inputs.store(name, phase, r * hidden)
        whole = env is not None and not (env < 0).any()
        check = whole and bool(store.window) and step is not None
        ring = None
        held = before = None
        if whole:
            assert env is not None
            store.grow(int(env.max()) + 1)
        if check:
            assert env is not None and step is not None
            before = step - 1
            slots = env * store.window + before % store.window
            held = (store.steps[slots] == before) & (before >= 0)
            ring = self.ondevice._ring(name, x0.device)
            plan.add("train_cols", np.flatnonzero(held))
            plan.add("train_slots", slots[held])

        def device_half(index: dict[str, torch.Tensor]) -> list[torch.Tensor]:
            x = x0.float()
            sq = x.double().square_().sum(2)
            norms = (sq[:layers] + sq[layers:] if r > layers else sq).sqrt_().float()
            zero = (sq != 0).any(0).logical_not_()
            if ring is None:
                return [norms, zero]
            table = ring.table.index_select(0, index["train_slots"]).reshape(len(index["train_slots"]), r * hidden)
            return [norms, zero, _equal(_as_rows(x, index["train_cols"]), table)]

        def second(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
            norms, zero = arrays[0], arrays[1] != 0
            flags: np.ndarray = zero.astype(np.int8)
            store.since = -1
            if not whole:
                flags |= FIRST | UNCHECKED
            elif not check:
                flags |= UNCHECKED
            else:
                assert env is not None and step is not None and held is not None and before is not None
                same = np.zeros(m, np.bool_)
                if ring is not None:
                    same[np.flatnonzero(held)] = arrays[2] != 0
                here = env * store.window + step % store.window
                same |= zero & (store.steps[here] == step) & store.zero_in[here]
                got = held | same
                flags |= same * np.int8(STORED) | (~got) * np.int8(UNCHECKED) | (before < 0) * np.int8(FIRST)
            return decode(flags, start, self.inputs.stored_states), norms

        return device_half, second


def _equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Rows of a and b (k, W) equal value by value (``==``, as numpy's: -0 == 0, NaN never)."""
    if len(a) == 0:
        return a.new_zeros(0, dtype=torch.bool)
    return (a.reshape(len(a), -1) == b.reshape(len(b), -1)).all(1)


def _other_env(
    xs: torch.Tensor,
    owners: torch.Tensor,
    owners_last: torch.Tensor,
    out: torch.Tensor,
    owner_env: torch.Tensor,
    env: torch.Tensor,
) -> torch.Tensor:
    """Whether each row of ``xs`` (k, W) is bit-equal to a state another env returned: the owners are the
    last states ``owners_last`` (E, W), then the block's returned states ``out`` (R, M, H) columns, hashes
    ``owners`` (E + M), envs ``owner_env``; ``env`` the rows' envs. The first owner of an equal hash (a stable
    sort, a binary search), its bits compared."""
    k = len(xs)
    if k == 0 or len(owners) == 0:
        return xs.new_zeros(k, dtype=torch.bool)
    hashes = row_hashes(xs)
    keys, perm = torch.sort(owners, stable=True)
    pos = torch.searchsorted(keys, hashes).clamp_(max=len(keys) - 1)
    hit = keys.index_select(0, pos) == hashes
    cand = perm.index_select(0, pos)
    e = len(owners_last)
    from_last = cand < e
    rows_last = owners_last.index_select(0, cand.clamp(max=max(e - 1, 0))) if e else xs
    rows_out = _as_rows(out, (cand - e).clamp_(min=0, max=out.shape[1] - 1))
    rows = torch.where(from_last.unsqueeze(1), rows_last, rows_out)
    bits = (rows.contiguous().view(torch.int32) == xs.contiguous().view(torch.int32)).all(1)
    return hit & bits & (owner_env.index_select(0, cand) != env)
