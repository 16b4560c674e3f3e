"""Blocks of one-step calls: what the tracer keeps of them on the training thread (:class:`Block`,
:class:`Loop`), and how a block is handed to the writer (:func:`write_block`: a writer job, on the training
thread with a writer process, on the writer thread otherwise). Calls that fit no block (multi-step calls, a
lone one-step call) are ``calls.py``'s; both hand their rows to the sink through ``emitter.Emitter``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from lstm_probe.capture.drift import grid_keys
from lstm_probe.capture.ondevice import _Plan
from lstm_probe.capture.transfer import Later, Staged
from lstm_probe.contract import PATH, Grid, Tags, tag_values
from lstm_probe.log.messages import Reduced, Rows

MAX_PENDING = 256
"""One-step calls kept before they are written as one block (bounds the memory they hold)."""

if TYPE_CHECKING:
    from lstm_probe.capture.emitter import Emitter
    from lstm_probe.log.logwriter import LogWriter


BLOCK_BYTES = 64 << 20
"""The most a block's buffer of one-step calls holds on the device (states and input states) before it is
handed over: bounds the memory of wide runs (a 1,024-env, hidden-256 LSTM step is 4 MB of them)."""


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    """The bytes the tensors hold (what a writer job keeps alive until it runs)."""
    return sum(t.nelement() * t.element_size() for t in tensors if t is not None)


def kept_columns(keep_envs: int | None, grid: Grid | None, envs: np.ndarray) -> np.ndarray | None:
    """The batch columns handed over under ``--other-envs none`` (``CoreTracer.keep_envs``): those whose env is
    below ``keep_envs`` (a sequence's env: its largest, padding being -1); None: every column. ``envs``: each
    column's env where the grid does not say (no grid, no env column, or -1: the batch column, as the
    `init` columns take it, ``inputs.py``)."""
    if keep_envs is None:
        return None
    env = envs
    if grid is not None and grid.env is not None and grid.shape[0] == len(envs):
        given = grid.env.max(axis=1) if grid.env.shape[1] > 1 else grid.env[:, 0]
        env = np.where(given >= 0, given, envs)
    keep = env < keep_envs
    return None if keep.all() else np.flatnonzero(keep)


class KeptColumns:
    """``--other-envs none`` for one-step calls kept in blocks: only the kept env columns of a call's states
    (and input states) are copied into its block (a 1,024-env, hidden-256 step's states are 4 MB, its 16 kept
    columns' 64 kB). The columns of the last call are reused while its env column holds the same values (sb3
    passes one array every step; compared, not trusted)."""

    def __init__(self, keep_envs: int):
        self.keep_envs = keep_envs
        self._last: tuple[int, np.ndarray, np.ndarray | None] | None = None

    def columns(self, grid: Grid | None, batch: int) -> np.ndarray | None:
        env = grid.env if grid is not None else None
        last = self._last
        if last is not None and env is not None and last[0] == batch and np.array_equal(last[1], env):
            return last[2]
        kept = kept_columns(self.keep_envs, grid, np.arange(batch))
        self._last = None if env is None else (batch, env.copy(), kept)
        return kept

    def __call__(
        self,
        grid: Grid | None,
        batch: int,
        h: torch.Tensor,
        c: torch.Tensor | None,
        x0: torch.Tensor | tuple[torch.Tensor, ...] | None,
    ) -> tuple[Grid | None, int, torch.Tensor, torch.Tensor | None, Any] | None:
        """The call's grid, batch, states and input states for its kept columns (None: none kept)."""
        kept = self.columns(grid, batch)
        if kept is None:
            return grid, batch, h, c, x0
        if len(kept) == 0:
            return None
        h, c = select(h, 1, kept), select(c, 1, kept) if c is not None else None
        if isinstance(x0, tuple):
            x0 = tuple(select(p, 1, kept) for p in x0)
        elif x0 is not None:
            x0 = select(x0, 1, kept)
        return fitted(grid, batch, kept), len(kept), h, c, x0


_INDICES: dict[tuple[Any, bytes], torch.Tensor] = {}
"""Index tensors already on a device, by (device, columns): a run keeps the same columns block after block."""


def select(t: torch.Tensor, dim: int, columns: np.ndarray) -> torch.Tensor:
    """``t``'s ``columns`` along ``dim``, where ``t`` is. A leading run of columns is a view; other indices
    reach an accelerator from pinned memory without waiting for it (and are kept for the next block)."""
    n = len(columns)
    if n and columns[-1] == n - 1:  # 0..n-1 (the columns are sorted and distinct)
        return t.narrow(dim, 0, n)
    if t.device.type == "cpu":
        return t.index_select(dim, torch.from_numpy(columns.astype(np.int64, copy=False)))
    key = (t.device, columns.tobytes())
    index = _INDICES.get(key)
    if index is None:
        if len(_INDICES) >= 64:
            _INDICES.clear()
        pinned = torch.from_numpy(columns.astype(np.int64)).pin_memory()
        index = _INDICES[key] = pinned.to(t.device, non_blocking=True)
    return t.index_select(dim, index)


def fitted(grid: Grid | None, batch: int, columns: np.ndarray) -> Grid | None:
    """The grid of the kept ``columns`` of a call (or block) of ``batch`` columns; None where the grid did not
    fit the call (the sink leaves such rows' provenance null either way)."""
    if grid is None or grid.shape[0] != batch:
        return None
    return grid.take(columns)


def write_block(
    emitter: Emitter, writer: LogWriter, name: str, tags: Tags, stepwise: bool, t0: int, block: Block
) -> Later | None:
    """One block of one-step calls of module ``name`` (``CoreTracer._write_block``, a writer job): its device
    buffer's copy to the host started (one copy: ``transfer.Staged``), and the second half that hands the
    host arrays to the sink (``Emitter.send``: with the train rows' drifts; a summary log's rows as their
    norms and drifts). Under ``--other-envs none`` only the kept env columns cross (None: none of them). A
    summary log's rollout block on an accelerator takes the device path (:func:`_device_block`)."""
    calls = np.array(block.calls, np.int64)
    layers = emitter.layers[name]
    if stepwise:
        stacked = block.stacked if block.stacked is not None else block.steps()  # (L or 2L, N, T', H)
        first = t0 == 0 and bool(block.inputs)  # the loop's first step: where each column's state came from
        x0 = block.inputs[0] if first else None
        columns = kept_columns(emitter.keep_envs, tags.grid, np.arange(stacked.shape[1]))
        if columns is not None:
            if len(columns) == 0:
                return None
            tags = dataclasses.replace(tags, grid=fitted(tags.grid, int(stacked.shape[1]), columns))
            stacked = select(stacked, 1, columns)
            x0 = select(x0, 1, columns) if x0 is not None else None
        staged = Staged([stacked, x0] if x0 is not None else [stacked], private=True)

        def finish_loop(arrays: list[np.ndarray]) -> None:
            hc = arrays[0]
            with_c = hc.shape[0] == 2 * layers
            per_col = np.tile(calls, hc.shape[1])  # (N * T',) in column-major order: n, then t
            init = emitter.inputs.answer(name, tags.phase, tags.grid, 0, arrays[1], None, layers) if first else None
            cs = hc[layers:] if with_c else None
            emitter.rows += layers * len(per_col)
            emitter.send(writer, name, tags, t0, PATH["stepwise"], per_col, hc[:layers], cs, None, init)

        return Later(staged, finish_loop)
    states = block.sides()  # (2, R, n * N, H): the returned states, then the input states
    batch = block.batch
    per_col = np.repeat(calls, batch)
    sent = tags
    if block.grids:
        sent = dataclasses.replace(tags, grid=Grid.concat(block.grids), stepwise={})
    envs = np.tile(np.arange(batch), len(calls))  # untagged calls: env column = batch column
    columns = kept_columns(emitter.keep_envs, sent.grid, envs)
    if columns is not None:
        if len(columns) == 0:
            return None
        sent = dataclasses.replace(sent, grid=fitted(sent.grid, len(envs), columns))
        states, per_col, envs = select(states, 2, columns), per_col[columns], envs[columns]
    answers = emitter.device_inputs
    if answers is not None and columns is None and answers.takes_block(tags.phase, states.device):
        # a summary log's rollout block on an accelerator: its figures and answers computed there, O(M) crossing
        return _device_block(emitter, writer, name, tags, sent, states, per_col, envs)
    staged = Staged([states], private=True)
    # the returned states stay on the device for the device's copy of the rollout states (a summary log's)
    rollout = states[0] if emitter.ondevice is not None and tags.phase == "rollout" else None

    def finish(arrays: list[np.ndarray]) -> None:
        both = arrays[0]
        hc = both[0][:, :, None, :]  # (L or 2L, n * N, 1, H)
        with_c = hc.shape[0] == 2 * layers  # h and c of each call as one (2L, N, H) tensor
        grid = sent.grid
        if grid is None:
            grid = Grid.one_step(envs, -1, -1, -1, -1)
        init = emitter.inputs.answer(name, tags.phase, grid, 0, both[1], hc[:, :, 0], layers)
        if rollout is not None and emitter.ondevice is not None:  # the device's copy of the rollout states
            emitter.ondevice.kept(name, sent.grid, rollout)
        emitter.rows += layers * len(per_col)
        cs = hc[layers:] if with_c else None
        emitter.send(writer, name, sent, 0, PATH["step"], per_col, hc[:layers], cs, None, init)

    return Later(staged, finish)


def _device_block(
    emitter: Emitter,
    writer: LogWriter,
    name: str,
    tags: Tags,
    sent: Tags,
    states: torch.Tensor,
    per_col: np.ndarray,
    envs: np.ndarray,
) -> Later:
    """A rollout (or bootstrap) block of a summary log on the device path (``blocks.write_block``'s): its rows'
    norms, the answers' figures and the traced columns' returned states (``--trace-envs``) in one host copy
    (and the whole states where live metrics read them, ``Emitter.observers``), then ``messages.Reduced``
    to the sink as ``Emitter.send`` makes it."""
    answers = emitter.device_inputs
    assert answers is not None
    layers = emitter.layers[name]
    out, x0 = states[0], states[1]  # (R, M, H)
    r, m, hidden = out.shape
    grid = sent.grid if sent.grid is not None else Grid.one_step(envs, -1, -1, -1, -1)
    plan = _Plan()
    answer_half, second = answers.block_answer(name, tags.phase, grid, x0, out, layers, plan)
    kept = None
    if emitter.partial is not None:
        keys = grid_keys(sent.grid, 0, 1, layers, m)
        kept = np.zeros(layers * m, np.bool_) if keys is None else (keys[1] >= 0) & (keys[1] < emitter.partial)
        plan.add("kept", np.flatnonzero(kept))
    index = plan.upload(out.device)
    o = out.float()
    flat_h = o[:layers].reshape(layers * m, hidden)
    h_norm = torch.linalg.vector_norm(flat_h, dim=1, dtype=torch.float64)
    figures = [h_norm.view(torch.float32)]
    with_c = r == 2 * layers
    flat_c = o[layers:].reshape(layers * m, hidden) if with_c else None
    if flat_c is not None:
        figures.append(torch.linalg.vector_norm(flat_c, dim=1, dtype=torch.float64).view(torch.float32))
    if kept is not None:
        figures.append(flat_h.index_select(0, index["kept"]))
        if flat_c is not None:
            figures.append(flat_c.index_select(0, index["kept"]))
    answer = answer_half(index)
    observed = bool(emitter.observers)
    staged = Staged([*figures, *answer, *([out] if observed else [])])

    def finish(arrays: list[np.ndarray]) -> None:
        at = len(figures)
        init = second(arrays[at : at + len(answer)])
        h_norm = arrays[0].view(np.float64)
        c_norm = arrays[1].view(np.float64) if with_c else None
        h = c = None
        if kept is not None:
            h = arrays[2 if with_c else 1]
            c = arrays[3] if with_c else None
        rows = Reduced((layers, m, 1), h_norm, c_norm, None, kept, h, c)
        states_seen = None
        if observed:
            hc = arrays[-1][:, :, None, :]
            states_seen = (hc[:layers], hc[layers:] if with_c else None)
        emitter.rows += layers * len(per_col)
        message = Rows(name, sent, 0, PATH["step"], per_col, rows, None, None, init)
        emitter.hand_over(writer, message, layers, states_seen)

    return Later(staged, finish)


class Block:
    """The one-step calls of one module kept for one block, written into one buffer on the states' device as
    each call returns (a loop may change what the module returned in place, ``h[:, done] = 0``; no
    allocation per call): their call ids, grids (rollout steps) and input states.

    Rollout-style blocks (:meth:`for_steps`: calls side by side along the batch axis) keep each call's
    returned states and input states (h of every layer, then c; zeros where a call was given none) in
    ``buf`` (2, R, capacity, N, H); a per-timestep loop (:meth:`for_loop`) keeps its steps' states in
    ``buf`` (R, N, T, H) and its first step's input states in ``inputs``. A loop recorded whole
    (``CoreTracer.loop_end``) brings its states ``stacked`` instead."""

    __slots__ = ("batch", "buf", "calls", "capacity", "grids", "inputs", "n", "stacked", "t0")

    def __init__(self, buf: torch.Tensor | None = None, t0: int = 0) -> None:
        self.t0 = t0  # a per-timestep loop's block: the step in its grid of the block's first step
        self.calls: list[int] = []
        self.stacked: torch.Tensor | None = None  # a loop recorded whole: its states, (L or 2L, N, T, H)
        self.grids: list[Grid] = []
        self.inputs: list[torch.Tensor] = []
        self.buf = buf
        self.n = 0  # calls (or loop steps) in buf
        # fixed with the buffer, read by every call: its batch (N) and a rollout-style block's capacity (0: a loop's)
        rollout = buf is not None and buf.dim() == 5
        self.batch = 0 if buf is None else int(buf.shape[-2]) if rollout else int(buf.shape[1])
        self.capacity = int(buf.shape[2]) if buf is not None and rollout else 0

    @staticmethod
    def for_steps(like: torch.Tensor, rows: int) -> Block:
        """A block of one-step calls of ``like``'s batch (N) and hidden size: as many calls as fit
        BLOCK_BYTES, at most MAX_PENDING."""
        _, batch, hidden = like.shape
        capacity = max(1, min(MAX_PENDING, BLOCK_BYTES // max(1, 2 * rows * batch * hidden * like.element_size())))
        return Block(like.new_empty((2, rows, capacity, batch, hidden)))

    @staticmethod
    def for_loop(like: torch.Tensor, rows: int, t0: int, steps: int) -> Block:
        """A block for the ``steps`` steps from step ``t0`` of a per-timestep loop over ``like``'s batch."""
        _, batch, hidden = like.shape
        return Block(like.new_empty((rows, batch, max(1, steps), hidden)), t0)

    def settle(self) -> None:
        """Keep the calls all of whose parts are in: a Ctrl-C's KeyboardInterrupt lands between any two
        bytecodes, so a hook may stop between a call's id and its states (the writer would get one more id
        than states)."""
        k = self.n if self.stacked is None else int(self.stacked.shape[2])
        k = min(k, len(self.calls), len(self.grids) if self.grids else k)
        del self.calls[k:], self.grids[k:]
        if self.stacked is None:
            self.n = k
        else:
            self.stacked = self.stacked[:, :, :k]

    @property
    def full(self) -> bool:
        return 0 < self.capacity <= self.n

    def put(self, h: torch.Tensor, c: torch.Tensor | None, x0: torch.Tensor | tuple[torch.Tensor, ...] | None) -> None:
        """A one-step call's returned states h, c (L, N, H) and input states (one (R, N, H) tensor, its parts
        (h0, c0), or None: zeros) into the next slot."""
        assert self.buf is not None
        k, buf = self.n, self.buf
        # One torch op for the common case (h, c and input states (h0, c0) of the buffer's dtype): the slot's
        # (2, R, N, H) view as (2R, N, H), each part's rows in order, written by one cat (no view per part)
        if c is not None and type(x0) is tuple and len(x0) == 2:
            h0, c0 = x0
            dtype = buf.dtype
            if h.dtype == dtype and c.dtype == dtype and h0.dtype == dtype and c0.dtype == dtype:
                slot = buf.select(2, k)
                torch.cat((h, c, h0, c0), out=slot.view(-1, slot.shape[-2], slot.shape[-1]))
                self.n = k + 1
                return
        layers = int(h.shape[0])
        self.buf[0, :layers, k].copy_(h)
        if c is not None:
            self.buf[0, layers:, k].copy_(c)
        if x0 is None:
            self.buf[1, :, k].zero_()
        elif isinstance(x0, torch.Tensor):
            self.buf[1, :, k].copy_(x0)
        else:
            at = 0
            for part in x0:
                self.buf[1, at : at + part.shape[0], k].copy_(part)
                at += int(part.shape[0])
        self.n += 1

    def put_step(self, h: torch.Tensor, c: torch.Tensor | None) -> None:
        """A loop step's returned states (L, N, H) into the next step's column (grown if the loop runs on)."""
        assert self.buf is not None
        if self.n == self.buf.shape[2]:
            self.buf = torch.cat((self.buf, torch.empty_like(self.buf)), dim=2)
        k, layers = self.n, int(h.shape[0])
        self.buf[:layers, :, k].copy_(h)
        if c is not None:
            self.buf[layers:, :, k].copy_(c)
        self.n += 1

    def steps(self) -> torch.Tensor:
        """A loop's kept states, (R, N, T', H)."""
        assert self.buf is not None
        return self.buf[:, :, : self.n]

    def sides(self) -> torch.Tensor:
        """A rollout-style block's returned and input states, (2, R, n * N, H), calls in order."""
        assert self.buf is not None
        _, rows, _, batch, hidden = self.buf.shape
        return self.buf[:, :, : self.n].reshape(2, rows, self.n * batch, hidden)

    def nbytes(self) -> int:
        return tensor_bytes(self.buf, self.stacked, *self.inputs)


class Loop:
    """A per-timestep loop recorded whole (:meth:`CoreTracer.loop_begin`): its module and tags, when it began
    (``time.perf_counter()``: its oldest call's time), and per step the call id and the states the module
    returned ((h, c), or h); ``x0``: the first step's input states."""

    __slots__ = ("began", "calls", "lstm", "module", "name", "steps", "tags", "x0")

    def __init__(self, module: nn.Module, name: str, tags: Tags, began: float) -> None:
        self.module, self.name, self.tags, self.lstm = module, name, tags, isinstance(module, nn.LSTM)
        self.began = began
        self.calls: list[int] = []
        self.steps: list[Any] = []
        self.x0: torch.Tensor | None = None


class Hooked:
    """A hooked module as the hook's functions read it, fixed when the hook is made."""

    __slots__ = ("batch_first", "layers", "lstm", "module", "name", "rows", "sequences", "time_axis")

    def __init__(self, name: str, module: nn.Module):
        self.name, self.module = name, module
        self.sequences = isinstance(module, nn.LSTM | nn.GRU)  # else a cell: one step per call
        self.lstm = isinstance(module, nn.LSTM | nn.LSTMCell)  # it returns c as well as h
        self.batch_first = bool(getattr(module, "batch_first", False))
        self.time_axis = 1 if self.batch_first else 0
        self.layers = int(getattr(module, "num_layers", 1))
        self.rows = self.layers * (2 if self.lstm else 1)  # state rows per step: h of every layer, then c


def block_key(tags: Tags, batch: int) -> tuple[Any, ...] | None:
    """Which block a one-step call of ``batch`` columns under ``tags`` joins: a per-timestep loop's (its
    grid has several steps), the rollout steps' of these tag values (no grid, or an acting grid of one
    step), or none (a call of its own)."""
    grid = tags.grid
    if grid is not None and grid.shape[1] > 1:
        return ("stepwise", id(tags))
    if grid is None or (not grid.train and grid.shape == (batch, 1)):
        return ("step", tag_values(tags), grid is None)
    return None
