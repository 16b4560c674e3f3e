"""The device path of a summary log's multi-step training calls: per-step c, the rows' norms and their drifts
computed where the states are, only O(rows) figures crossing to the host.

On the CPU a multi-step call's job copies its per-step h, input and weights to the host (``transfer.Staged``)
and recovers per-step c there (``recover.lstm_cells``), then reduces the rows to their norms
(``drift.reduced``) and drifts (``drift.Drift.rows``): that path is the floor there and stays as it is (logs
bit-identical). Where a call's states live on an accelerator that copy and that host arithmetic would cost
far more than the call itself (4,096 envs x hidden 256: ~650 ms of host CPU per training call), so a summary
log's multi-step LSTM calls (every phase but the rollout's, whose per-step states feed the host's ring of
rollout states) take this path instead (:meth:`OnDevice.takes`):

- per-step c recovered with torch on the call's device (:func:`cells`: the same math as ``lstm_cells``: the
  i, f, g gates from (x_t, h_{t-1}) in two addmm, sigmoid and tanh, the c scan with addcmul), zero on a
  packed call's padding steps;
- every row's h and c norms (float64 sums, ``schema.row_norms``) and each train row's drift against the
  rollout state of its (layer, env, env step) (``schema.relative_l2``) from a device copy of the rollout
  states (:class:`_Ring`, one per module, keyed as the host's ring: env x window slots; the env step each
  slot holds is a host array, so the `found` flags and the slots to read are the host's own arithmetic);
- the rows whose vectors the log keeps (``--trace-envs``) gathered on the device; then one host copy of
  the figures and the kept rows (:meth:`OnDevice.figures`) and of the `init` answers' flags (a training
  call's ``stored`` check against the device ring, ``ondevice_inputs.py``; another phase's input and
  returned states, answered on the host), and ``messages.Reduced`` as the host path makes it.

The device ring is fed where the host's ring is (a rollout block's second half, ``blocks.write_block``):
the block's returned states copied device to device into their slots (indices from the grid, moved to the
device once per block). Where the host's ring changed in a way not mirrored (its window grew, another kind of
call kept rollout states, or its slots disagree), the device ring is rebuilt from it (one upload). A summary
log's rollout blocks on the device path (``ondevice_inputs.py``) feed it alone: the host's ring then keeps the
slots' steps only, and brings the states over before host code reads them (``inputs._Store.sync``).

Engaged only where a call's states are on a CUDA device (another accelerator keeps the host path: MPS has no
float64 for the norms, and its copies are synchronous anyway); ``OnDevice._engage`` (tests and benchmarks
only) engages it on the CPU too ("always"), or nowhere ("never": the host path on CUDA, to compare).
``emitter.Emitter`` makes one per summary log; ``blocks.py`` and ``calls.py`` call it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lstm_probe.capture.drift import grid_keys
from lstm_probe.capture.inputs import Inputs
from lstm_probe.contract import Grid, Tags
from lstm_probe.log.messages import Drifts, Reduced


def _device_ints(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """An int64 host array on ``device``: as is on the CPU; elsewhere from pinned memory, without waiting."""
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


class _Ring:
    """One module's rollout states on the device, as the host's ring holds them (``inputs._Store``):
    ``table`` (envs * window, R, H) on the device, ``steps`` the env step each slot holds (host, -1: none)."""

    __slots__ = ("envs", "stale", "steps", "table", "version", "window")

    def __init__(self, table: torch.Tensor, steps: np.ndarray, window: int, envs: int):
        self.table, self.steps, self.window, self.envs = table, steps, window, envs
        self.stale = False  # the host's ring took rows this one did not (rebuilt at its next use)
        self.version = -1  # the host store's ``version`` it mirrors (-1: not checked)

    @staticmethod
    def of(ring: np.ndarray, steps: np.ndarray, window: int, envs: int, hidden: int, device: torch.device) -> _Ring:
        """A copy of the host's ring (one upload, from pinned memory: the host does not wait for the device)."""
        table = torch.from_numpy(np.array(ring, np.float32).reshape(len(ring), -1, hidden))
        if device.type != "cpu":
            table = table.pin_memory().to(device, non_blocking=True)
        return _Ring(table, steps.copy(), window, envs)

    def matches(self, held: tuple[np.ndarray, np.ndarray, int, int]) -> bool:
        return self.fits(held) and np.array_equal(held[1], self.steps)

    def fits(self, held: tuple[np.ndarray, np.ndarray, int, int]) -> bool:
        """Laid out as the host's ring (its slots' steps aside: a block about to be fed has moved them on)."""
        ring, _, window, envs = held
        return not self.stale and window == self.window and envs == self.envs and len(ring) == len(self.table)


class OnDevice:
    """The device path of one summary log (see the module docstring): the device rings of its modules, and
    the figures of the multi-step calls it takes."""

    _engage = "accelerator"  # tests and benchmarks only: "always" (the CPU too), "never" (the host path alone)

    def __init__(self, hidden: int, inputs: Inputs):
        self.hidden, self.inputs = hidden, inputs
        self.rings: dict[str, _Ring] = {}

    @classmethod
    def on(cls, device: torch.device) -> bool:
        """Whether states on ``device`` take the device path: CUDA's (see the module docstring)."""
        return cls._engage == "always" or (cls._engage == "accelerator" and device.type == "cuda")

    # -- the device rings ----------------------------------------------------------------------------
    def _ring(self, name: str, device: torch.device, feeding: bool = False) -> _Ring | None:
        """Module ``name``'s device ring, the host's ring's copy (rebuilt where they disagree); None: the host
        holds none. (Where the device path wrote rows the host's ring lacks, the two never disagree: the host
        brings them over before it re-lays its ring, ``inputs._Store.sync``.)"""
        held = self.inputs.rollout_ring(name, sync=False)
        if held is None:
            self.rings.pop(name, None)
            return None
        ring = self.rings.get(name)
        version = self.inputs.stores[(name, "rollout")].version
        if (
            ring is None
            or not (ring.fits(held) if feeding else ring.matches(held))
            or ring.table.device != device
            or ring.version not in (-1, version)
        ):
            ring = self.rings[name] = _Ring.of(*held, self.hidden, device)
        ring.version = version
        return ring

    def kept(self, name: str, grid: Grid | None, states: torch.Tensor, make: bool = False) -> None:
        """A rollout block's returned states ``states`` (R, M, H) on the device, after the host's ring kept them
        (``Inputs.answer``) or its slots only (``make``: the device path, ``ondevice_inputs.py``, where the
        device ring is the one that holds them, made or rebuilt first where needed): copied into the device
        ring's same slots (the host's newest of each slot)."""
        if not self.on(states.device):
            return
        held = self.inputs.rollout_ring(name, sync=False)
        ring = self._ring(name, states.device, True) if make and held is not None else self.rings.get(name)
        if held is None or ring is None:
            return  # made (from the host's ring, which holds these rows) at its first use
        if grid is None or grid.env is None or grid.env_step is None or grid.shape[0] != states.shape[1]:
            return
        _, host_steps, window, envs = held
        if window != ring.window or envs != ring.envs or len(host_steps) != len(ring.steps):
            ring.stale = True
            return
        ring.version = self.inputs.stores[(name, "rollout")].version
        env, step = grid.env[:, 0].astype(np.int64), grid.env_step[:, 0].astype(np.int64)
        cols = np.flatnonzero((env >= 0) & (step >= 0))
        if not len(cols):
            return
        slots = env[cols] * window + step[cols] % window
        _, newest = np.unique(slots[::-1], return_index=True)  # each slot written once: its last column
        pick = len(slots) - 1 - newest
        cols, slots = cols[pick], slots[pick]
        device = states.device
        both = _device_ints(np.concatenate([slots, cols]), device)
        rows = states.index_select(1, both[len(slots) :]).transpose(0, 1).float()  # (M', R, H)
        ring.table.index_copy_(0, both[: len(slots)], rows)
        ring.steps[slots] = step[cols]

    def stale(self, name: str) -> None:
        """The host's ring of module ``name`` kept rows another way (a multi-step or lone rollout call)."""
        ring = self.rings.get(name)
        if ring is not None:
            ring.stale = True

    # -- a multi-step call's figures ------------------------------------------------------------------
    def takes(self, lstm: bool, tags: Tags, x: torch.Tensor, columns: np.ndarray | None) -> bool:
        """Whether a multi-step call takes the device path: an LSTM's, not the rollout's, all of its columns
        reduced (no ``--other-envs none`` selection), its states on an accelerator."""
        return lstm and tags.phase != "rollout" and columns is None and self.on(x.device)

    def figures(
        self,
        name: str,
        tags: Tags,
        parts: list[torch.Tensor],
        layers: int,
        bias: bool,
        valid: np.ndarray | None,
        drift: bool,
        partial: int | None,
        initial: bool,
    ) -> tuple[list[torch.Tensor], Callable[[list[np.ndarray]], tuple[Reduced, tuple[Any, Any] | None]]]:
        """A multi-step LSTM call's rows as a summary log keeps them, from the recovery's torch half ``parts``
        (``recover.lstm_sequence_parts``, on the call's device): the tensors for the job's one host copy, and
        what turns their host arrays into its ``Reduced`` and (``initial``) its initial states (h0, c0).
        ``drift``: the rows are train rows and the probe holds rollout states; ``partial``: the env columns
        below it keep their vectors (``--trace-envs``)."""
        per = 5 if bias else 4
        h0, c0 = parts[-2].float(), parts[-1].float()
        hs = torch.stack([parts[i * per].float() for i in range(layers)])  # (L, T, N, H)
        _, steps, batch, hidden = hs.shape
        device = hs.device
        n = layers * batch * steps
        keys = grid_keys(tags.grid, 0, steps, layers, batch)
        # what the device needs of the host's arithmetic, in one upload: the padding mask, the drift's
        # (found rows, their states' rows, the ring rows of h and c), the kept rows
        plan = _Plan()
        if valid is not None:
            plan.add("valid", valid.reshape(-1).astype(np.int64))
        found: np.ndarray | None = None
        ring: _Ring | None = None
        if drift and keys is not None:
            ring = self._ring(name, device)
            found = np.zeros(n, np.bool_)
            if ring is not None:
                found = self._found(plan, ring, layers, keys, steps, batch)
        kept = None
        if partial is not None:
            kept = np.zeros(n, np.bool_) if keys is None else (keys[1] >= 0) & (keys[1] < partial)
            plan.add("kept", _lying(np.flatnonzero(kept), layers, batch, steps))
        index = plan.upload(device)
        if valid is not None:
            mask = index["valid"].view(steps, batch, 1).float()
            hs.mul_(mask)  # the lower layers ran on past a sequence's end; the module did not
        cs = cells(hs, parts, layers, per, h0, c0)
        if valid is not None:
            cs.mul_(mask)
        flat_h, flat_c = hs.view(n, hidden), cs.view(n, hidden)
        h_norm = _sink_order(torch.linalg.vector_norm(flat_h, dim=1, dtype=torch.float64), layers, steps, batch)
        c_norm = _sink_order(torch.linalg.vector_norm(flat_c, dim=1, dtype=torch.float64), layers, steps, batch)
        out = [h_norm.view(torch.float32), c_norm.view(torch.float32)]
        if found is not None:
            dh, dc = hs.new_zeros(n), hs.new_zeros(n)
            if ring is not None and "rows" in index:
                rows, states = index["rows"], index["states"]
                table = ring.table.view(-1, hidden)
                ref_h = table.index_select(0, index["ref_h"])
                dh.index_copy_(0, rows, _relative_l2(flat_h.index_select(0, states), ref_h))
                if "ref_c" in index:
                    ref_c = table.index_select(0, index["ref_c"])
                    dc.index_copy_(0, rows, _relative_l2(flat_c.index_select(0, states), ref_c))
            out += [dh, dc]
        if kept is not None:
            out += [flat_h.index_select(0, index["kept"]), flat_c.index_select(0, index["kept"])]
        if initial:
            out += [h0, c0]
        shape = (layers, batch, steps)

        def reduced(arrays: list[np.ndarray]) -> tuple[Reduced, tuple[Any, Any] | None]:
            figures: Drifts | None = None
            at = 2
            if found is not None:
                figures = (arrays[2], arrays[3], found)
                at = 4
            h = c = None
            if kept is not None:
                h, c = arrays[at], arrays[at + 1]
                at += 2
            rows = Reduced(shape, arrays[0].view(np.float64), arrays[1].view(np.float64), figures, kept, h, c)
            return rows, (arrays[at], arrays[at + 1]) if initial else None

        return out, reduced

    def _found(
        self, plan: _Plan, ring: _Ring, layers: int, keys: tuple[np.ndarray, ...], steps: int, batch: int
    ) -> np.ndarray:
        """Each row's `found` (sink order): its (env, env step) held in the ring (``drift.Drift._drift``'s
        test); what the device reads for the found ones added to ``plan``."""
        layer, env, step = keys
        n = len(env)
        found = np.zeros(n, np.bool_)
        window, envs = ring.window, ring.envs
        idx = np.flatnonzero((env >= 0) & (step >= 0) & (env < envs))
        rows = env[idx] * window + step[idx] % window
        match = ring.steps.take(rows) == step[idx]
        idx, rows = idx[match], rows[match]
        if not len(idx):
            return found
        found[idx] = True
        r = int(ring.table.shape[1])
        lay = layer[idx]
        plan.add("rows", idx)
        plan.add("states", _lying(idx, layers, batch, steps))
        plan.add("ref_h", rows * r + lay)
        if r > layers:
            plan.add("ref_c", rows * r + layers + lay)
        return found


class _Plan:
    """Named int64 index arrays bound for the device, moved in one upload."""

    def __init__(self) -> None:
        self.parts: dict[str, np.ndarray] = {}

    def add(self, name: str, values: np.ndarray) -> None:
        self.parts[name] = values.astype(np.int64, copy=False)

    def upload(self, device: torch.device) -> dict[str, torch.Tensor]:
        if not self.parts:
            return {}
        flat = _device_ints(np.concatenate(list(self.parts.values())), device)
        out, at = {}, 0
        for name, values in self.parts.items():
            out[name] = flat[at : at + len(values)]
            at += len(values)
        return out


def _lying(sink: np.ndarray, layers: int, batch: int, steps: int) -> np.ndarray:
    """Rows' indices in the sink's order (layer, column, step) -> in a multi-step call's (layer, step, column)."""
    layer, rest = np.divmod(sink, batch * steps)
    col, step = np.divmod(rest, steps)
    return (layer * steps + step) * batch + col


def _sink_order(v: torch.Tensor, layers: int, steps: int, batch: int) -> torch.Tensor:
    """Per-row figures in a multi-step call's order (layer, step, column) -> the sink's (layer, column, step)."""
    return v.view(layers, steps, batch).transpose(1, 2).contiguous().view(-1)


def _relative_l2(states: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``schema.relative_l2`` on the device: ||states - reference|| / ||reference|| per row, float32, a zero
    reference norm floored at 1e-12."""
    num = torch.linalg.vector_norm(states - reference, dim=1)
    return num / torch.linalg.vector_norm(reference, dim=1).clamp_min(1e-12)


def cells(
    hs: torch.Tensor, parts: list[torch.Tensor], layers: int, per: int, h0: torch.Tensor, c0: torch.Tensor
) -> torch.Tensor:
    """Per-step c of every layer, (L, T, N, H), on the states' device: ``recover.lstm_cells``'s math in torch.
    ``hs`` (L, T, N, H) the per-step h; ``parts`` the recovery's torch half (per layer: h, input, W_ih and
    W_hh's i, f, g rows, their biases' sum where ``per`` is 5); h0, c0 (L, N, H). In float32 whatever autocast
    region the hook runs in (a mixed-precision loop's forward): as the host's numpy recovery."""
    with torch.autocast(hs.device.type, enabled=False):
        return _cells(hs, parts, layers, per, h0, c0)


def _cells(
    hs: torch.Tensor, parts: list[torch.Tensor], layers: int, per: int, h0: torch.Tensor, c0: torch.Tensor
) -> torch.Tensor:
    _, steps, batch, hidden = hs.shape
    rows = steps * batch
    cs = torch.empty_like(hs)
    for layer in range(layers):
        x = parts[layer * per + 1].float().reshape(rows, -1)
        w_ih, w_hh = parts[layer * per + 2].float(), parts[layer * per + 3].float()
        h_prev = torch.cat((h0[layer : layer + 1], hs[layer, :-1])).view(rows, hidden)  # h_{t-1}
        if per == 5:
            gates = torch.addmm(parts[layer * per + 4].float(), x, w_ih.t())
        else:
            gates = torch.mm(x, w_ih.t())
        gates.addmm_(h_prev, w_hh.t())
        g3 = gates.view(steps, batch, 3 * hidden)
        f = torch.sigmoid(g3[..., hidden : 2 * hidden])
        ig = torch.sigmoid(g3[..., :hidden]).mul_(torch.tanh(g3[..., 2 * hidden :]))
        c, cl = c0[layer], cs[layer]
        for t in range(steps):
            torch.addcmul(ig[t], f[t], c, out=cl[t])
            c = cl[t]
    return cs
