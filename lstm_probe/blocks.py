"""Blocks of one-step calls: what the tracer keeps of them on the training thread (:class:`Block`,
:class:`Loop`), and how a block is handed to the writer (:func:`write_block`, a writer job: on the training
thread with a writer process, on the writer thread otherwise)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from lstm_probe.contract import PATH, Grid, Tags

if TYPE_CHECKING:
    from lstm_probe.logwriter import LogWriter
    from lstm_probe.tracer import CoreTracer


def host(t: torch.Tensor) -> np.ndarray:
    """A detached tensor as a float32 numpy array (one device-to-host copy when it is not on the CPU)."""
    t = t.detach()
    if t.dtype != torch.float32:
        t = t.float()
    return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    """The bytes the tensors hold (what a writer job keeps alive until it runs)."""
    return sum(t.nelement() * t.element_size() for t in tensors if t is not None)


def write_block(
    tracer: CoreTracer, writer: LogWriter, name: str, tags: Tags, stepwise: bool, t0: int, block: Block
) -> None:
    """Host arrays of one block of one-step calls of module ``name``, to the sink (``CoreTracer._write_block``); a
    summary log's per-step training loops as their norms and drifts (``drift.py``)."""
    calls = np.array(block.calls, np.int64)
    layers = tracer.layers[name]
    if stepwise:
        stacked = block.stacked if block.stacked is not None else torch.stack(block.states, dim=2)
        hc = host(stacked)  # (L or 2L, N, T', H)
        with_c = hc.shape[0] == 2 * layers
        per_col = np.tile(calls, hc.shape[1])  # (N * T',) in column-major order: n, then t
        init = None
        if t0 == 0 and block.inputs:  # the loop's first step: where each column's state came from
            init = tracer.inputs.answer(name, tags.phase, tags.grid, 0, host(block.inputs[0]), None, layers)
        cs = hc[layers:] if with_c else None
        tracer.rows += layers * len(per_col)
        reducer = tracer.reducer
        reduced = reducer.reduce(name, tags.phase, tags.grid, t0, hc[:layers], cs) if reducer else None
        if reduced is not None:  # its norms and drifts, not its states (drift.py)
            writer.send("rows", name, tags, t0, PATH["stepwise"], per_col, reduced, None, None, init)
            return
        writer.send("rows", name, tags, t0, PATH["stepwise"], per_col, hc[:layers], cs, None, init)
        if reducer is not None:  # a loop of another phase: the sink keeps rollout rows as references
            reducer.rollout(name, tags.phase, tags.grid, t0, hc[:layers], cs)
        return
    hc = host(torch.cat(block.states, dim=1))[:, :, None, :]  # (L or 2L, sum N, 1, H)
    with_c = hc.shape[0] == 2 * layers  # h and c of each call as one (2L, N, H) tensor
    per_col = np.repeat(calls, [s.shape[1] for s in block.states])
    sent = tags
    if block.grids:
        sent = dataclasses.replace(tags, grid=Grid.concat(block.grids), stepwise={})
    init = None
    if len(block.inputs) == len(block.calls):  # every call's input state: where it came from (Inputs)
        grid = sent.grid
        if grid is None:  # untagged calls: env column = batch column
            grid = Grid.one_step(np.concatenate([np.arange(s.shape[1]) for s in block.states]), -1, -1, -1, -1)
        x0 = host(torch.cat(block.inputs, dim=1))
        init = tracer.inputs.answer(name, tags.phase, grid, 0, x0, hc[:, :, 0], layers)
    path = PATH["step"]
    tracer.rows += layers * len(per_col)
    cs = hc[layers:] if with_c else None
    writer.send("rows", name, sent, 0, path, per_col, hc[:layers], cs, None, init)
    if tracer.reducer is not None:  # the rows the sink keeps as references, kept here too
        tracer.reducer.rollout(name, tags.phase, sent.grid, 0, hc[:layers], cs)


class Block:
    """The one-step calls of one module kept for one block: their call ids, grids (rollout steps), states
    and input states (``inputs``, copies; see :class:`~lstm_probe.inputs.Inputs`; a per-timestep loop's first
    step only), as parallel lists. The states are copies made as each call returned (a loop may change
    what the module returned in place, ``h[:, done] = 0``): h (L, N, H), or h and c as one (2L, N, H)."""

    __slots__ = ("calls", "grids", "inputs", "stacked", "states")

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.stacked: torch.Tensor | None = None  # a loop recorded whole: its states, (L or 2L, N, T, H)
        self.grids: list[Grid] = []
        self.inputs: list[torch.Tensor] = []
        self.states: list[torch.Tensor] = []


class Loop:
    """A per-timestep loop recorded whole (:meth:`CoreTracer.loop_begin`): its module and tags, and per step
    the call id and the states the module returned ((h, c), or h); ``x0``: the first step's input states."""

    __slots__ = ("calls", "lstm", "module", "name", "steps", "tags", "x0")

    def __init__(self, module: nn.Module, name: str, tags: Tags) -> None:
        self.module, self.name, self.tags, self.lstm = module, name, tags, isinstance(module, nn.LSTM)
        self.calls: list[int] = []
        self.steps: list[Any] = []
        self.x0: torch.Tensor | None = None
