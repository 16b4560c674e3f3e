"""The tracer's hook's work, one function per kind of call (``tracer.CoreTracer`` sends each call here).

One-step calls are kept and written in blocks, each call copied into its block's buffer on the device
(``blocks.Block``): the steps of a per-timestep loop over a sequence batch (sb3's 'stepwise' path) along the
time axis, consecutive one-step calls with the same tags (rollout steps) along the batch axis. A block is
handed to the writer (:meth:`LogWriter.submit`) when the tags change, when its buffer is full, and at close;
it crosses to the host in one copy (``transfer.Staged``), as does each call that fits no block (a multi-step
call, a lone one-step call: ``calls.py``). The `init` columns come from each call's input states (h of every
layer, then c; :class:`~lstm_probe.capture.inputs.Inputs`).

:func:`rnn_call` sends an nn.LSTM / nn.GRU call to a step of the open per-timestep loop's block
(:func:`_stepwise_step`), another one-step call (:func:`_one_step`), a multi-step or packed call
(:func:`_sequence_call`, :func:`_packed_call`: a job of its own); :func:`cell_call` takes a cell's.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

from lstm_probe.capture.blocks import (
    Block,
    Hooked,
    KeptColumns,
    block_key,
    fitted,
    kept_columns,
    select,
    tensor_bytes,
)
from lstm_probe.capture.calls import Recovery, sequence, write_call
from lstm_probe.capture.emitter import Emitter
from lstm_probe.capture.held import Held
from lstm_probe.capture.inputs import cell_parts, input_parts, joined, module_input
from lstm_probe.capture.recover import Scratch
from lstm_probe.contract import Resolver, Tags, padded
from lstm_probe.log.logwriter import LogWriter


class CoreTracer(Protocol):
    """What of ``tracer.CoreTracer`` these functions read and keep (this module does not import the tracer,
    which imports it): its settings, counters, the open block's state and the hand-over's deadline."""

    writer: LogWriter | None
    resolver: Resolver
    emitter: Emitter
    scratch: Scratch
    held: Held
    keep_envs: int | None
    keep_columns: KeptColumns | None
    initial_states: bool
    batching: bool
    calls: int
    call_base: int
    unsupported_calls: int
    empty_calls: int
    _due: float
    _pending: dict[str, Block]
    _pending_tags: Tags | None
    _pending_key: tuple[Any, ...] | None
    _stepwise_tags: Tags | None
    _key_tags: Tags | None
    _key_batch: int
    _key: tuple[Any, ...] | None

    def flush_pending(self) -> None: ...


def rnn_call(tracer: CoreTracer, m: Hooked, mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
    """An nn.LSTM / nn.GRU call, to the function of its kind by its input: a step of the open per-timestep
    loop's block, another one-step call, a multi-step call or a packed sequence."""
    x = args[0]
    if not isinstance(x, torch.Tensor):
        if isinstance(x, PackedSequence):
            _packed_call(tracer, m, mod, args, x, output)
        else:  # no per-step layout to map (the log's metadata counts them; the report says so)
            tracer.unsupported_calls += 1
        return
    y, state = output
    hn, cn = state if m.lstm else (state, None)
    shape = x.shape
    tags = None  # asked once: a call that misses the open block takes them along
    if len(shape) == 3 and shape[m.time_axis] == 1 and tracer._stepwise_tags is not None:
        tags = tracer.resolver(m.name, 1, int(shape[1 - m.time_axis]))
        if tags is tracer._stepwise_tags:  # the block's own object: the loop's next step
            _stepwise_step(tracer, m, tags, mod, args, x, hn, cn)
            return
    unbatched = len(shape) == 2
    if unbatched:
        steps, batch = int(shape[0]), 1
    elif m.batch_first:
        batch, steps = int(shape[0]), int(shape[1])
    else:
        steps, batch = int(shape[0]), int(shape[1])
    if batch == 0:  # no batch column, no row (rsl_rl trains on empty minibatches where they outnumber the envs)
        tracer.empty_calls += 1
        return
    if steps == 1:
        if unbatched:
            hn = hn.unsqueeze(1)
            cn = cn.unsqueeze(1) if cn is not None else None
        _one_step(tracer, m, tags, batch, hn, cn, input_parts(args, unbatched, m.lstm))
        return
    x, y = x.detach(), y.detach()
    if unbatched:
        x, y = x.unsqueeze(1), y.unsqueeze(1)
    elif m.batch_first:
        x, y = x.transpose(0, 1), y.transpose(0, 1)
    _sequence_call(tracer, m, args, x, y, unbatched, None, output, None)


def cell_call(tracer: CoreTracer, m: Hooked, mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
    """An nn.LSTMCell / nn.GRUCell call: one step of one layer."""
    h, c = output if m.lstm else (output, None)
    if h.dim() == 1:
        h = h.unsqueeze(0)
        c = c.unsqueeze(0) if c is not None else None
    batch = int(h.shape[0])
    if batch == 0:  # no batch column, no row
        tracer.empty_calls += 1
        return
    x0 = cell_parts(args, batch, m.lstm)
    _one_step(tracer, m, None, batch, h[None], c[None] if c is not None else None, x0)


def _stepwise_step(
    tracer: CoreTracer,
    m: Hooked,
    tags: Tags,
    mod: nn.Module,
    args: tuple[Any, ...],
    x: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor | None,
) -> None:
    """The next step of a per-timestep loop whose block is open, call by call (sb3's stepwise training path
    makes most of a run's calls): its returned states copied now into the block's buffer (a loop may change
    them in place, ``h[:, done] = 0``); the module's first step of the loop also its input states."""
    name = m.name
    done = tags.stepwise.get(name, 0)
    tags.stepwise[name] = done + 1
    call = tracer.call_base + tracer.calls
    tracer.calls += 1
    block = tracer._pending.get(name)
    if block is None:
        block = tracer._pending[name] = Block.for_loop(h, m.rows, done, tags.grid.shape[1] - done)  # type: ignore[union-attr]
        tracer._due = tracer.held.kept(tracer.writer)
    if done == 0:
        block.inputs.append(module_input(mod, args, int(x.shape[1 - m.time_axis]), x, False, m.lstm))
    block.calls.append(call)
    block.put_step(h, c)


def _one_step(
    tracer: CoreTracer,
    m: Hooked,
    tags: Tags | None,
    batch: int,
    h: torch.Tensor,
    c: torch.Tensor | None,
    x0: tuple[torch.Tensor, ...] | None,
) -> None:
    """A one-step call, its (L, N, H) states ``h``/``c`` as the module returned them and its input states
    ``x0`` (parts, or None: zeros), copied into the block it joins (:func:`block_key`; a new block once the
    key or the batch changes, after the kept ones are handed over); a call that joins none is a job of its
    own. ``tags``: as the hook already asked them (None: asked here)."""
    writer = tracer.writer
    if writer is None:
        return
    name = m.name
    if tags is None:
        tags = tracer.resolver(name, 1, batch)
    grid = tags.grid
    call = tracer.call_base + tracer.calls
    tracer.calls += 1
    if tags is tracer._key_tags and batch == tracer._key_batch:
        key = tracer._key  # the call before had these tags (a rollout step's actor, then critic)
    else:
        key = block_key(tags, batch)
        tracer._key_tags, tracer._key_batch, tracer._key = tags, batch, key
    if key is None:
        out = h.clone() if c is None else torch.cat((h, c))
        _call_job(tracer, writer, name, tags, call, batch, 1, joined(x0, out.shape[0], batch, out), out, None, 0)
        return
    stepwise = key[0] == "stepwise"
    t = 0  # the call's step in its grid
    if stepwise:
        t = tags.stepwise.get(name, 0)
        tags.stepwise[name] = t + 1
    elif tracer.keep_columns is not None:  # --other-envs none: kept columns only (blocks.py)
        kept = tracer.keep_columns(grid, batch, h, c, x0)
        if kept is None:
            return
        grid, batch, h, c, x0 = kept
    block = tracer._pending.get(name)
    if key != tracer._pending_key or (block is not None and not stepwise and block.batch != batch):
        tracer.flush_pending()
        tracer._pending_key, tracer._pending_tags = key, tags
        if stepwise:
            tracer._stepwise_tags = tags
        block = None
    rows = int(h.shape[0]) * (1 if c is None else 2)
    if stepwise:
        assert grid is not None
        if block is None:
            block = tracer._pending[name] = Block.for_loop(h, rows, t, grid.shape[1] - t)
            tracer._due = tracer.held.kept(writer)
        if t == 0:  # a per-timestep loop's first step: its input state (see Inputs)
            block.inputs.append(joined(x0, rows, batch, h))
        block.calls.append(call)
        block.put_step(h, c)
        return
    if block is None:
        block = tracer._pending[name] = Block.for_steps(h, rows)
        tracer._due = tracer.held.kept(writer)
    block.calls.append(call)
    block.put(h, c, x0)
    if grid is not None:
        block.grids.append(grid)
    if block.full:
        tracer.flush_pending()


def _packed_call(
    tracer: CoreTracer, m: Hooked, mod: nn.Module, args: tuple[Any, ...], xp: PackedSequence, output: Any
) -> None:
    """A call on a PackedSequence: rows per (sequence, step) in the caller's batch order
    (pad_packed_sequence undoes the packing's sort by length); the steps after a sequence's end are padding
    rows."""
    x, lengths = pad_packed_sequence(xp)  # (T, N, F) sequence-first, whatever batch_first says
    y = pad_packed_sequence(output[0])[0]  # (T, N, H), zeros after each sequence's end
    steps, batch = int(x.shape[0]), int(x.shape[1])
    valid = np.arange(steps)[:, None] < lengths.numpy()[None, :]  # (T, N)
    tags = padded(tracer.resolver(m.name, steps, batch), valid)
    _sequence_call(tracer, m, args, x, y, False, valid, output, tags)


def _sequence_call(
    tracer: CoreTracer,
    m: Hooked,
    args: tuple[Any, ...],
    x: torch.Tensor,
    y: torch.Tensor,
    unbatched: bool,
    valid: np.ndarray | None,
    output: Any,
    tags: Tags | None,
) -> None:
    """A multi-step call, ``x``/``y`` (T, N, .) sequence-first (``valid``: (T, N), False on a packed call's
    padding steps): what its job needs taken now (``calls.sequence``), the job handed over."""
    writer = tracer.writer
    if writer is None:
        return
    module = cast("nn.LSTM | nn.GRU", m.module)
    held, initial, scratch = not writer.inline, tracer.initial_states, tracer.scratch
    x0, out, recovery, size = sequence(module, args, x, y, unbatched, valid, output, held, initial, scratch)
    steps, batch = int(x.shape[0]), int(x.shape[1])
    if tags is None:
        tags = tracer.resolver(m.name, steps, batch)
    call = tracer.call_base + tracer.calls
    tracer.calls += 1
    _call_job(tracer, writer, m.name, tags, call, batch, steps, x0, out, recovery, size)


def _call_job(
    tracer: CoreTracer,
    writer: LogWriter,
    name: str,
    tags: Tags,
    call: int,
    batch: int,
    steps: int,
    x0: torch.Tensor,
    out: torch.Tensor,
    recovery: Recovery | None,
    nbytes: int,
) -> None:
    """A call that fits no block, handed to the writer as a job of its own (``calls.write_call``), after the
    kept one-step calls (the log keeps call order); under ``--other-envs none`` its kept columns only."""
    tracer.flush_pending()
    columns = kept_columns(tracer.keep_envs, tags.grid, np.arange(batch))
    if columns is not None:  # --other-envs none: the other env columns stay where they are
        if len(columns) == 0:
            return
        x0, out = select(x0, 1, columns), select(out, 1, columns)
        tags = dataclasses.replace(tags, grid=fitted(tags.grid, batch, columns))
        batch = len(columns)
    job = functools.partial(
        write_call, tracer.emitter, writer, name, tags, call, batch, steps, x0, out, recovery, columns
    )
    writer.submit(job, nbytes or tensor_bytes(out), batch=tracer.batching)  # (its oldest call: now)
    tracer._due = tracer.held.due(writer)
