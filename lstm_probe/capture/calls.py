"""Calls that fit no block, each a writer job of its own: a multi-step call (a sequence, or a packed
sequence's padded steps) and a lone one-step call (``blocks.py`` keeps the one-step calls that fit a block).

A multi-step call's per-step states are recovered in two halves (``recover.py``): :func:`sequence` takes
what the hook must hold of the call, :class:`Recovery` runs the torch half in the job's first half, on the
call's device, and :func:`write_call` hands the host arrays to the sink (``emitter.Emitter``) after the
job's one device-to-host copy (``transfer.Staged``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from lstm_probe.capture.blocks import select, tensor_bytes
from lstm_probe.capture.inputs import start_states
from lstm_probe.capture.ondevice import _Plan
from lstm_probe.capture.recover import (
    Scratch,
    gru_assemble,
    gru_sequence_parts,
    lstm_assemble,
    lstm_cells,
    lstm_sequence_parts,
    snapshot_weights,
)
from lstm_probe.capture.transfer import Later, Staged
from lstm_probe.contract import PATH, Tags
from lstm_probe.log.messages import Rows

if TYPE_CHECKING:
    from lstm_probe.capture.emitter import Emitter
    from lstm_probe.log.logwriter import LogWriter

Arrays = tuple[Any, Any, Any]
"""A multi-step call's host states: per-step h (L, T, N, H), per-step c (None for a GRU), and the initial
states (h0, c0) of each sequence (None unless the tracer records them)."""


class Recovery:
    """A multi-step call's per-step states of every layer, recovered in the job (``recover.py``): called
    with the batch columns kept (``--other-envs none``; None: all), chosen before any of it is computed, it
    gives the torch half's tensors (on the call's device, lower layers only: for the job's one host copy)
    and what turns their host arrays into :data:`Arrays` (the gates and the c scan, in the job's second
    half, on the host: one owner, read by the log, drift and live metrics alike). A summary log's LSTM call
    on an accelerator computes its figures there instead (``ondevice.py``, :func:`_on_device`): the host
    path stays the CPU's (its logs bit-identical)."""

    __slots__ = ("c0", "h0", "initial_states", "layers", "module", "scratch", "valid", "weights", "x", "y")

    def __init__(
        self,
        module: nn.LSTM | nn.GRU,
        x: torch.Tensor,
        y: torch.Tensor,
        h0: torch.Tensor,
        c0: torch.Tensor,
        valid: np.ndarray | None,
        weights: list[list[torch.Tensor]] | None,
        initial_states: bool,
        scratch: Scratch,
    ):
        self.module, self.x, self.y, self.h0, self.c0, self.valid = module, x, y, h0, c0, valid
        self.weights, self.initial_states, self.scratch = weights, initial_states, scratch
        self.layers = int(module.num_layers)

    def __call__(self, columns: np.ndarray | None) -> tuple[list[torch.Tensor], Any]:
        if columns is not None:
            self.x, self.y, self.h0, self.c0 = (select(t, 1, columns) for t in (self.x, self.y, self.h0, self.c0))
            self.valid = self.valid[:, columns] if self.valid is not None else None
        if isinstance(self.module, nn.LSTM):
            parts = lstm_sequence_parts(self.module, self.x, self.h0, self.c0, self.y, self.weights)
            return parts, self._lstm_arrays
        parts = gru_sequence_parts(self.module, self.x, self.h0, self.y, self.weights)
        return [*parts, self.h0], self._gru_arrays

    def _lstm_arrays(self, arrays: list[np.ndarray]) -> Arrays:
        hs, cells = lstm_assemble(arrays, self.layers, bool(self.module.bias), self.valid)
        cs = lstm_cells(hs, *cells, scratch=self.scratch, out=np.empty(hs.shape, np.float32))
        return hs, cs, (cells[2], cells[3]) if self.initial_states else None

    def _gru_arrays(self, arrays: list[np.ndarray]) -> Arrays:
        initial = (arrays[self.layers], None) if self.initial_states else None
        return gru_assemble(arrays[: self.layers], self.valid), None, initial


def sequence(
    module: nn.LSTM | nn.GRU,
    args: tuple[Any, ...],
    x: torch.Tensor,
    y: torch.Tensor,
    unbatched: bool,
    valid: np.ndarray | None,
    output: Any,
    held: bool,
    initial_states: bool,
    scratch: Scratch,
) -> tuple[torch.Tensor, torch.Tensor, Recovery, int]:
    """What a multi-step call's job needs, taken inside its hook: the input states (h of every layer, then
    c), the returned states, the :class:`Recovery` and the bytes they hold. ``x``, ``y``: (T, N, .)
    sequence-first; ``valid``: (T, N) False on a packed call's padding steps. ``held``: the job runs later
    (a writer thread), so what the caller may still change in place (its input and states, the weights an
    optimizer step updates) is copied now; y is the call's own fresh output, a packed call's x a fresh
    padded copy. (A writer process's job runs now, inside the hook.)"""
    lstm = isinstance(module, nn.LSTM)
    batch = int(x.shape[1])
    h0, c0 = start_states(module, args, batch, x, unbatched, lstm)
    h0, c0 = h0.detach(), c0.detach()
    x0 = torch.cat((h0, c0)) if lstm else h0.clone()  # copies: states change in place
    hn, cn = output[1] if lstm else (output[1], None)
    if unbatched:
        hn, cn = hn.unsqueeze(1), cn.unsqueeze(1) if cn is not None else None
    out = torch.cat((hn.detach(), cn.detach())) if cn is not None else hn.detach().clone()
    weights: list[list[torch.Tensor]] | None = None
    if held:
        x = x if valid is not None else x.clone()
        h0, c0 = h0.clone(), c0.clone()
        weights = snapshot_weights(module, top=lstm)
    layers = int(module.num_layers)
    size = 2 * layers * tensor_bytes(y) + tensor_bytes(x, h0, c0, *(w for ws in weights or [] for w in ws))
    return x0, out, Recovery(module, x, y, h0, c0, valid, weights, initial_states, scratch), size


def write_call(
    emitter: Emitter,
    writer: LogWriter,
    name: str,
    tags: Tags,
    call: int,
    batch: int,
    steps: int,
    x_in: torch.Tensor,
    returned_states: torch.Tensor | None,
    recovery: Recovery | None,
    columns: np.ndarray | None,
) -> Later:
    """One call that fits no block (a writer job): a multi-step call (``recovery``: its torch half, then its
    host half) or a lone one-step call, its input states ``x_in`` and returned states; one host copy, then
    the second half that hands the rows to the sink."""
    layers = emitter.layers[name]
    grid = tags.grid
    ondevice = emitter.ondevice
    if recovery is not None and ondevice is not None:
        lstm = isinstance(recovery.module, nn.LSTM)
        if ondevice.takes(lstm, tags, recovery.x, columns):
            return _on_device(emitter, writer, name, tags, call, batch, steps, x_in, returned_states, recovery)
        if tags.phase == "rollout":  # its per-step states go to the host's ring of rollout states
            ondevice.stale(name)
    elif ondevice is not None and tags.phase == "rollout":  # a lone rollout call: the host's ring keeps it
        ondevice.stale(name)
    parts, arrays_of = recovery(columns) if recovery is not None else ([], None)
    sides = [x_in] + ([returned_states] if returned_states is not None else [])
    staged = Staged(sides + parts)

    def finish(arrays: list[np.ndarray]) -> None:
        x_host = arrays[0]
        returned = arrays[1] if returned_states is not None else None
        rest = arrays[len(sides) :]
        first = emitter.inputs.answer(name, tags.phase, grid, 0, x_host, returned, layers, steps > 1)
        emitter.rows += layers * batch * steps
        if arrays_of is not None:
            hs_all, cs_all, initial = arrays_of(rest)  # (L, T, N, H) each
            if tags.phase == "rollout":  # every step is a rollout state later train rows drift from
                emitter.inputs.keep_steps(name, grid, hs_all, cs_all)
            ids = np.full(batch * steps, call, np.int64)
            emitter.send(writer, name, tags, 0, PATH["sequence"], ids, hs_all, cs_all, None, first, per_step=True)
            if initial is not None and grid is not None and grid.train and grid.shape[0] == batch:
                # the state each sequence started from, as rows with t = -1 (see the schema's `t`)
                emitter.rows += layers * batch
                start = dataclasses.replace(tags, bootstrap=None, grid=grid.initial(), stepwise={})
                h0 = initial[0][:, :, None, :]
                c0 = initial[1][:, :, None, :] if initial[1] is not None else None
                ids = np.full(batch, call, np.int64)
                emitter.send(writer, name, start, 0, PATH["sequence"], ids, h0, c0, -1, None)
        else:  # a lone one-step call
            assert returned is not None
            hs = returned[:layers, :, None, :]
            cs = returned[layers:, :, None, :] if returned.shape[0] > layers else None
            path = PATH[tags.path or "step"]  # a train call of one step names its branch
            ids = np.full(batch, call, np.int64)
            emitter.send(writer, name, tags, 0, path, ids, hs, cs, None, first)

    return Later(staged, finish)


def _on_device(
    emitter: Emitter,
    writer: LogWriter,
    name: str,
    tags: Tags,
    call: int,
    batch: int,
    steps: int,
    x_in: torch.Tensor,
    returned_states: torch.Tensor | None,
    recovery: Recovery,
) -> Later:
    """A summary log's multi-step LSTM call on the device path (``ondevice.py``): its per-step c, norms, drifts
    and kept rows computed on the call's device, then one host copy of those figures and of its input and
    returned states; the second half answers the input states and hands ``messages.Reduced`` to the sink, as
    ``Emitter.send`` does for the host path."""
    ondevice = emitter.ondevice
    assert ondevice is not None and returned_states is not None
    layers = emitter.layers[name]
    grid = tags.grid
    module = recovery.module
    parts, _ = recovery(None)
    drift = tags.phase == "train" and emitter.drift is not None and bool(emitter.inputs.window)
    figures, reduced = ondevice.figures(
        name, tags, parts, layers, bool(module.bias), recovery.valid, drift, emitter.partial, recovery.initial_states
    )
    # a training (or value) call's input states answered there too (``ondevice_inputs.py``: the `stored` check
    # against the device ring); another phase's on the host, from its input and returned states
    answers = emitter.device_inputs
    assert answers is not None
    second: Any = None
    if tags.phase in ("train", "value"):
        plan = _Plan()
        answer_half, second = answers.train_answer(name, tags.phase, grid, x_in, layers, plan)
        sides = answer_half(plan.upload(x_in.device))
    else:
        sides = [x_in, returned_states]
    staged = Staged([*figures, *sides])  # the float64 norms first: their host views aligned

    def finish(arrays: list[np.ndarray]) -> None:
        if second is not None:
            first = second(arrays[len(figures) :])
        else:
            x_host, returned = arrays[-2], arrays[-1]
            first = emitter.inputs.answer(name, tags.phase, grid, 0, x_host, returned, layers, steps > 1)
        emitter.rows += layers * batch * steps
        rows, initial = reduced(arrays[: len(figures)])
        ids = np.full(batch * steps, call, np.int64)
        emitter.hand_over(writer, Rows(name, tags, 0, PATH["sequence"], ids, rows, None, None, first), layers)
        if initial is not None and grid is not None and grid.train and grid.shape[0] == batch:
            emitter.rows += layers * batch  # the state each sequence started from (t = -1), as write_call's
            start = dataclasses.replace(tags, bootstrap=None, grid=grid.initial(), stepwise={})
            h0, c0 = initial[0][:, :, None, :], initial[1][:, :, None, :]
            emitter.send(writer, name, start, 0, PATH["sequence"], np.full(batch, call, np.int64), h0, c0, -1, None)

    return Later(staged, finish)
