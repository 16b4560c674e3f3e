"""Forward hooks on nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell that stream per-step states to a log.

The tracer knows no RL framework. It is made with an :class:`~lstm_probe.contract.Integration` (sb3,
RLlib, or the generic tracer's user tags, all under ``lstm_probe/integrations/``), which names the
framework, declares its capabilities and, before or during each call, answers with the call's
:class:`Tags` (phase, iteration, epoch, minibatch) and :class:`Grid` (which env, env step and episode
each batch column and timestep belongs to). The tracer turns a call into rows: one per (layer, batch
column, timestep), written into columnar buffers (see ``writer.py``).

The ways a call reaches the log (one step, a sequence, a packed sequence, a per-timestep loop recorded
whole: :meth:`CoreTracer.loop_begin`) share the hook's state and its blocks of one-step calls, so they live
here together; which modules are hooked and how the log describes them is ``modules.py``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

from lstm_probe.blocks import (
    Block,
    KeptColumns,
    Loop,
    fitted,
    kept_columns,
    select,
    tensor_bytes,
    write_block,
    write_call,
)
from lstm_probe.contract import CODES, Integration, Resolver, Tags, padded, tag_values
from lstm_probe.drift import Drift
from lstm_probe.errors import BadInput, one_line
from lstm_probe.inputs import Inputs, cell_parts, input_parts, joined, module_input, stacked_steps, start_states
from lstm_probe.logwriter import LogWriter
from lstm_probe.messages import Drifts, Message
from lstm_probe.modules import RECURRENT_TYPES, base_metadata, describe_modules
from lstm_probe.options import CaptureOptions
from lstm_probe.recover import (
    Scratch,
    gru_assemble,
    gru_sequence_parts,
    lstm_assemble,
    lstm_cells,
    lstm_sequence_parts,
    snapshot_weights,
)
from lstm_probe.transfer import Later

Observer = Callable[[Message, int, "tuple[Any, Any] | None"], None]
"""Reads each message the tracer hands the sink (``CoreTracer.observers``): the message, the module's layers,
and the rows' states (hs, cs) where the message carries their figures only (None: it carries the states, or
none were kept)."""

_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled  # a function call; torch.no_grad() as a context costs ~4 us


class CoreTracer:
    """Hooks recurrent modules and writes their per-step states to a log.

    Made by an integration (``lstm_probe.trace``, ``ProbeCallback``, the RLlib probes), which answers
    each call's tags. ``initial_states``: also record the states each multi-step call started from.
    ``call_base``: the first call id (keeps ids unique across the processes of one log); ``shard``: this
    process's part-file name in a directory log written by several processes.
    """

    _reduce_here = True  # False: rows whose vectors the log does not keep go to the sink whole (tests)

    def __init__(
        self,
        modules: Mapping[str, nn.Module],
        options: CaptureOptions,
        integration: Integration,
        *,
        initial_states: bool = False,
        call_base: int = 0,
        shard: str | None = None,
    ):
        self.modules = dict(modules)
        sizes = set()
        for name, m in self.modules.items():
            if not isinstance(m, RECURRENT_TYPES):
                raise BadInput(f"{name} is a {type(m).__name__}, not an nn.LSTM/GRU/LSTMCell/GRUCell")
            if getattr(m, "bidirectional", False):
                raise BadInput(f"{name} is bidirectional; lstm-probe traces unidirectional modules only")
            if getattr(m, "proj_size", 0):
                raise BadInput(f"{name} has proj_size > 0; lstm-probe needs h and c of the same size")
            sizes.add(int(m.hidden_size))  # type: ignore[arg-type]
        if len(sizes) != 1:
            raise BadInput(
                f"traced modules have different hidden sizes {sorted(sizes)}; trace each size "
                "into its own log (pass modules=[...])"
            )
        self.hidden = sizes.pop()
        self.names = list(self.modules)
        self.module_code = {n: i for i, n in enumerate(self.names)}
        self.options = options
        self.layers = {n: int(getattr(m, "num_layers", 1)) for n, m in self.modules.items()}
        self.integration = integration
        capture = {
            "mode": options.capture,
            "every": options.every,
            "dtype": "float16" if options.float16 else "float32",
            **({} if options.trace_envs is None else {"trace_envs": options.trace_envs}),
            **({} if options.other_envs == "summary" else {"other_envs": options.other_envs}),
        }
        # --other-envs none: only env columns below this reach the host (selected where the states are)
        self.keep_envs = options.trace_envs if options.other_envs == "none" else None
        self.keep_columns = KeptColumns(self.keep_envs) if self.keep_envs is not None else None
        self.metadata: dict[str, Any] = {
            **base_metadata(),
            "framework": integration.name,
            "architecture": {"modules": describe_modules(self.modules)},
            "hidden_size": self.hidden,
            "capture": capture,
            "capabilities": integration.capabilities().to_dict(),
            **integration.metadata(),
        }
        self.initial_states = initial_states
        self.shard = shard
        # where each call's input state came from (the `init` columns): the returned states the probe holds
        self.inputs = Inputs.of(options.reference_window, integration.capabilities().stored_states)
        # each train row's drift against the rollout states Inputs holds: computed once, here (drift.py)
        self.drift: Drift | None = None
        self.scratch = Scratch()  # the per-step c recovery's work arrays (jobs run one at a time, in order)
        # who else reads each message handed to the sink, in the same process (sb3's live metrics)
        self.observers: list[Observer] = []
        self.resolver: Resolver = integration.resolve
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self.writer: LogWriter | None = None
        self.calls = 0
        self.rows = 0  # rows handed to the writer so far (a progress display's figure)
        self.call_base = call_base  # first call id: keeps ids unique across the processes of one log
        self.unsupported_calls = 0
        # what the probe costs, measured while it runs (see the log's `probe_cost` metadata)
        self.hook_seconds = 0.0  # training thread, inside the hooks
        self.integration_seconds = 0.0  # training thread, in an integration's own callbacks (sb3, RLlib)
        self.started = time.monotonic()
        # one-step calls waiting to be written as one block, per module
        self._pending: dict[str, Block] = {}
        self._pending_tags: Tags | None = None
        self._pending_key: tuple[Any, ...] | None = None
        self._stepwise_tags: Tags | None = None  # the open per-timestep block's tags (hook fast path)
        self._loop: Loop | None = None  # a per-timestep loop recorded whole (see loop_begin)
        self._by_module = {id(m): n for n, m in self.modules.items()}
        self._resolved: Tags | None = None  # tags the hook already asked the resolver for
        # the block key of the last one-step call's tags (see _emit); holding the tags keeps their id unique
        self._key_tags: Tags | None = None
        self._key_batch = 0
        self._key: tuple[Any, ...] | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> CoreTracer:
        """Open the log and attach the hooks."""
        self.started = time.monotonic()
        o = self.options
        self.rows = 0  # each log its own (a generic tracer may start again)
        # and its own states held: a log's drifts and `init` answers never refer to an earlier log's rollout
        self.inputs = Inputs(self.inputs.window, self.inputs.stored_states)
        self.drift = Drift(self.hidden, self.inputs.rollout_ring)
        self.writer = LogWriter(o, self.hidden, self.names, self.metadata, CODES, shard=self.shard)
        try:
            for name, m in self.modules.items():
                self._handles.append(m.register_forward_hook(self._make_hook(name)))
        except BaseException:
            self.detach()
            raise
        return self

    def detach(self) -> None:
        """Remove every hook (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def close(self, completed: bool = True, stop_reason: str | None = None, **extra: Any) -> Path | None:
        """Detach, drain the writer and record how the run ended. Returns the log's path."""
        self.detach()
        if self.writer is None:
            return None
        try:
            self.flush_pending()
        except Exception:  # never let a failed flush hide how the run ended
            pass
        writer, self.writer = self.writer, None
        writer.progress["calls"] = self.calls
        capabilities = self.integration.capabilities().to_dict()
        if capabilities != self.metadata["capabilities"]:  # learnt while tracing (the generic tracer's tags)
            extra = {"capabilities": capabilities, **extra}
        final = {
            "completed": completed,
            "stop_reason": stop_reason,
            "end_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "unsupported_calls": self.unsupported_calls,
            "probe_cost": {
                "seconds": round(time.monotonic() - self.started, 3),  # start() to close(), wall
                "calls": self.calls,
                "hook_seconds": round(self.hook_seconds, 4),
                "integration_seconds": round(self.integration_seconds, 4),
            },
            **extra,
        }
        return writer.close(final)

    def __enter__(self) -> CoreTracer:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        reason = None if exc is None else one_line(exc)
        self.close(completed=exc is None, stop_reason=reason)

    # -- hooks -----------------------------------------------------------------------------------
    def _make_hook(self, name: str) -> Callable[..., None]:
        inner = self._make_inner_hook(name)

        def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            start = time.perf_counter()
            loop = self._loop
            if loop is not None and loop.module is mod and args[0].shape[0] == 1:
                # a step of a loop recorded whole (see loop_begin): keep the returned states only
                if not loop.steps:  # and the first step's input states (the `init` columns, see Inputs)
                    with torch.no_grad():
                        loop.x0 = module_input(mod, args, int(args[0].shape[1]), args[0], False, loop.lstm)
                loop.calls.append(self.call_base + self.calls)
                self.calls += 1
                loop.steps.append(output[1])
                self.hook_seconds += time.perf_counter() - start
                return
            # Without autograd inside the hook: the copies of the states it keeps (see Block) must not
            # join the caller's graph.
            grad = _grad_enabled()
            if grad:
                _set_grad_enabled(False)
            try:
                inner(mod, args, output)
            finally:
                if grad:
                    _set_grad_enabled(True)
                self.hook_seconds += time.perf_counter() - start

        return hook

    def _make_inner_hook(self, name: str) -> Callable[..., None]:
        module = self.modules[name]
        code = self.module_code[name]
        if isinstance(module, nn.LSTM | nn.GRU):
            is_lstm = isinstance(module, nn.LSTM)
            time_axis = 1 if module.batch_first else 0
            pending = self._pending
            layers = int(module.num_layers)

            def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
                x = args[0]
                if not isinstance(x, torch.Tensor):
                    if isinstance(x, PackedSequence):
                        packed(mod, args, x, output)
                    else:  # no per-step layout to map (the log's metadata counts them; the report says so)
                        self.unsupported_calls += 1
                    return
                y, state = output
                hn, cn = state if is_lstm else (state, None)
                shape = x.shape
                if len(shape) == 3 and shape[time_axis] == 1 and self._stepwise_tags is not None:
                    # Fast path: the next step of a per-timestep loop whose block is open (sb3's stepwise
                    # training path makes most of a run's calls); tags is the block's own object.
                    tags = self.resolver(name, 1, int(shape[1 - time_axis]))
                    if tags is self._stepwise_tags:
                        done = tags.stepwise.get(name, 0)
                        tags.stepwise[name] = done + 1
                        call = self.call_base + self.calls
                        self.calls += 1
                        block = pending.get(name)
                        if block is None:
                            rows = layers * (2 if is_lstm else 1)
                            block = pending[name] = Block.for_loop(hn, rows, tags.grid.shape[1] - done)  # type: ignore[union-attr]
                        if done == 0:  # this module's first step of the loop: where its state came from
                            block.inputs.append(module_input(mod, args, int(shape[1 - time_axis]), x, False, is_lstm))
                        # Copied now, into the block's buffer: a loop may change the returned states in
                        # place (`h[:, done] = 0`).
                        block.calls.append(call)
                        block.put_step(hn, cn)
                        return
                    self._resolved = tags  # not the open block: _emit takes these tags, no second call
                unbatched = len(shape) == 2
                if unbatched:
                    steps, batch = int(shape[0]), 1
                elif module.batch_first:
                    batch, steps = int(shape[0]), int(shape[1])
                else:
                    steps, batch = int(shape[0]), int(shape[1])
                if steps == 1:
                    # Copied now (see Block), to the host once per block of calls: on a GPU that is one
                    # device-to-host copy (and sync) per block instead of one per call.
                    if unbatched:
                        hn = hn.unsqueeze(1)
                        cn = cn.unsqueeze(1) if cn is not None else None
                    self._emit(name, code, 1, batch, hn, cn, x0=input_parts(args, unbatched, is_lstm))
                    return
                x, y = x.detach(), y.detach()
                if unbatched:
                    x, y = x.unsqueeze(1), y.unsqueeze(1)
                elif module.batch_first:
                    x, y = x.transpose(0, 1), y.transpose(0, 1)
                sequence(mod, args, x, y, unbatched, None, output)

            def packed(mod: nn.Module, args: tuple[Any, ...], xp: PackedSequence, output: Any) -> None:
                # Rows per (sequence, step) in the caller's batch order (pad_packed_sequence undoes the
                # packing's sort by length); the steps after a sequence's end are padding rows.
                x, lengths = pad_packed_sequence(xp)  # (T, N, F) sequence-first, whatever batch_first says
                y = pad_packed_sequence(output[0])[0]  # (T, N, H), zeros after each sequence's end
                steps, batch = int(x.shape[0]), int(x.shape[1])
                valid = np.arange(steps)[:, None] < lengths.numpy()[None, :]  # (T, N)
                self._resolved = padded(self.resolver(name, steps, batch), valid)
                sequence(mod, args, x, y, False, valid, output)

            def sequence(
                mod: nn.Module,
                args: tuple[Any, ...],
                x: torch.Tensor,
                y: torch.Tensor,
                unbatched: bool,
                valid: np.ndarray | None,
                output: Any,
            ) -> None:
                # x, y: (T, N, .) sequence-first; valid: (T, N) False on a packed call's padding steps
                steps, batch = int(x.shape[0]), int(x.shape[1])
                h0, c0 = start_states(mod, args, batch, x, unbatched, is_lstm)
                h0, c0 = h0.detach(), c0.detach()
                x0 = torch.cat((h0, c0)) if is_lstm else h0.clone()  # copies: states change in place
                hn, cn = output[1] if is_lstm else (output[1], None)
                if unbatched:
                    hn, cn = hn.unsqueeze(1), cn.unsqueeze(1) if cn is not None else None
                out = torch.cat((hn.detach(), cn.detach())) if cn is not None else hn.detach().clone()
                weights: list[list[torch.Tensor]] | None = None
                if self.writer is not None and not self.writer.inline:
                    # The recovery runs later, on the writer thread: copy what the caller may still change
                    # in place (its input and states, the weights an optimizer step updates); y is the
                    # call's own fresh output, a packed call's x a fresh padded copy. (A writer process's
                    # job runs now, inside this hook.)
                    x = x if valid is not None else x.clone()
                    h0, c0 = h0.clone(), c0.clone()
                    weights = snapshot_weights(module, top=is_lstm)  # type: ignore[arg-type]
                initial_states = self.initial_states
                bias = bool(module.bias)

                def states(
                    columns: np.ndarray | None,
                ) -> tuple[list[torch.Tensor], Callable[[list[np.ndarray]], tuple[Any, Any, Any]]]:
                    # the torch part of the recovery here, on the call's device (lower layers only), as
                    # tensors for the job's one host copy; gates and scan in its second half. ``columns``: the
                    # batch columns kept (--other-envs none), chosen before any of it is computed
                    nonlocal x, y, h0, c0, valid
                    if columns is not None:
                        x, y, h0, c0 = (select(t, 1, columns) for t in (x, y, h0, c0))
                        valid = valid[:, columns] if valid is not None else None
                    if is_lstm:
                        parts = lstm_sequence_parts(module, x, h0, c0, y, weights)  # type: ignore[arg-type]

                        def lstm_arrays(arrays: list[np.ndarray]) -> tuple[Any, Any, Any]:
                            # per-step c here, on the host, in this half of the job (one owner: the log, drift
                            # and live metrics all read it; docs/performance.md says why not on the device)
                            hs, cells = lstm_assemble(arrays, layers, bias, valid)
                            cs = lstm_cells(hs, *cells, scratch=self.scratch, out=np.empty(hs.shape, np.float32))
                            return hs, cs, (cells[2], cells[3]) if initial_states else None

                        return parts, lstm_arrays
                    parts = gru_sequence_parts(module, x, h0, y, weights)  # type: ignore[arg-type]

                    def gru_arrays(arrays: list[np.ndarray]) -> tuple[Any, Any, Any]:
                        initial = (arrays[layers], None) if initial_states else None
                        return gru_assemble(arrays[:layers], valid), None, initial

                    return [*parts, h0], gru_arrays

                size = 2 * layers * tensor_bytes(y) + tensor_bytes(x, h0, c0, *(w for ws in weights or [] for w in ws))
                self._emit(name, code, steps, batch, None, None, states, size, x0=x0, out=out)

        else:
            is_cell_lstm = isinstance(module, nn.LSTMCell)

            def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
                h, c = output if is_cell_lstm else (output, None)
                if h.dim() == 1:
                    h = h.unsqueeze(0)
                    c = c.unsqueeze(0) if c is not None else None
                batch = int(h.shape[0])
                x0 = cell_parts(args, batch, is_cell_lstm)
                self._emit(name, code, 1, batch, h[None], c[None] if c is not None else None, x0=x0)

        return hook

    def _emit(
        self,
        name: str,
        code: int,
        steps: int,
        batch: int,
        h: torch.Tensor | None,
        c: torch.Tensor | None,
        states: Callable[[np.ndarray | None], tuple[list[torch.Tensor], Callable[[list[np.ndarray]], Any]]]
        | None = None,
        nbytes: int = 0,
        *,
        x0: torch.Tensor | tuple[torch.Tensor, ...] | None,
        out: torch.Tensor | None = None,
    ) -> None:
        """Take one call. One-step calls bring their (L, N, H) states ``h``/``c`` as the module returned them
        (copied here: the caller may change them in place once the call returns); multi-step calls bring
        ``states``, run by the job: the recovery's tensors, and what turns their host arrays into per-step h
        and c (the cell-state scan, ``recover.lstm_cells``) and the initial states (``blocks.write_call``).

        One-step calls are kept and written in blocks, each call copied into its block's buffer on the
        device (``blocks.Block``): the steps of a per-timestep loop over a sequence batch (sb3's 'stepwise'
        path) along the time axis, consecutive one-step calls with the same tags (rollout steps) along the
        batch axis. A block is handed to the writer (:meth:`LogWriter.submit`) when the tags change, when
        its buffer is full, and at close; it crosses to the host in one copy (``transfer.Staged``), as does
        each multi-step call.

        ``x0``: the states the call was given (h of every layer, then c), where the `init` columns come
        from (:class:`~lstm_probe.inputs.Inputs`): one (R, N, H) tensor, a one-step call's (h0, c0) parts,
        or None (zeros); ``out``: a multi-step call's returned states.
        """
        tags, self._resolved = self._resolved, None
        writer = self.writer
        if writer is None:
            return
        if tags is None:
            tags = self.resolver(name, steps, batch)
        grid = tags.grid
        call = self.call_base + self.calls
        self.calls += 1
        key: tuple[Any, ...] | None = None
        t = 0  # the call's first step in its grid
        if steps == 1:
            if tags is self._key_tags and batch == self._key_batch:
                key = self._key  # the call before had these tags (a rollout step's actor, then critic)
            else:
                if grid is not None and grid.shape[1] > 1:
                    key = ("stepwise", id(tags))
                elif grid is None or (not grid.train and grid.shape == (batch, 1)):
                    key = ("step", tag_values(tags), grid is None)
                self._key_tags, self._key_batch, self._key = tags, batch, key
            if key is not None and key[0] == "stepwise":
                t = tags.stepwise.get(name, 0)
                tags.stepwise[name] = t + 1
        if key is None:
            self.flush_pending()
            if h is not None:  # a one-step call that fits no block: its states and inputs, copied now
                out = h.clone() if c is None else torch.cat((h, c))
                x0 = joined(x0, out.shape[0], batch, out)
            assert isinstance(x0, torch.Tensor)
            columns = kept_columns(self.keep_envs, grid, np.arange(batch))
            if columns is not None:  # --other-envs none: the other env columns stay where they are
                if len(columns) == 0:
                    return
                x0, out = select(x0, 1, columns), select(out, 1, columns) if out is not None else None
                grid = fitted(grid, batch, columns)
                tags = dataclasses.replace(tags, grid=grid)
                batch = len(columns)
            job = functools.partial(write_call, self, writer, name, tags, call, batch, steps, x0, out, states, columns)
            writer.submit(job, nbytes or tensor_bytes(out))
            return
        assert h is not None  # a one-step call brings its states
        stepwise = key[0] == "stepwise"
        if self.keep_columns is not None and not stepwise:  # --other-envs none: kept columns only (blocks.py)
            kept = self.keep_columns(grid, batch, h, c, x0)
            if kept is None:
                return
            grid, batch, h, c, x0 = kept
        block = self._pending.get(name)
        if key != self._pending_key or (block is not None and not stepwise and block.batch != batch):
            self.flush_pending()
            self._pending_key, self._pending_tags = key, tags
            if stepwise:
                self._stepwise_tags = tags
            block = None
        rows = int(h.shape[0]) * (1 if c is None else 2)
        if stepwise:
            assert grid is not None
            if block is None:
                block = self._pending[name] = Block.for_loop(h, rows, grid.shape[1] - t)
            block.calls.append(call)
            block.put_step(h, c)
            if t == 0:  # a per-timestep loop's first step: its input state (see Inputs)
                block.inputs.append(joined(x0, rows, batch, h))
            return
        if block is None:
            block = self._pending[name] = Block.for_steps(h, rows)
        block.calls.append(call)
        block.put(h, c, x0)
        if grid is not None:
            block.grids.append(grid)
        if block.full:
            self.flush_pending()

    def loop_begin(self, module: nn.Module, batch: int) -> Loop | None:
        """Record the one-step calls of ``module`` that follow, until :meth:`loop_end`, as one block: the
        steps of a per-timestep loop over ``batch`` sequences under the same tags (sb3's stepwise
        training path, bracketed by its integration). The hook only keeps each step's returned states;
        the block is tagged and written once, as the same rows the call-by-call path writes (the
        integration guarantees nothing changes those states in place before loop_end). None (call by
        call) unless the tags, asked now, give a grid of ``batch`` columns and several steps."""
        name = self._by_module.get(id(module))
        if name is None or self._loop is not None or self.writer is None or getattr(module, "batch_first", True):
            return None  # (LSTMCell and GRUCell have no batch_first: they make no loops to record)
        start = time.perf_counter()
        tags = self.resolver(name, 1, batch)
        grid = tags.grid
        if grid is not None and grid.shape[0] == batch and grid.shape[1] > 1:
            self.flush_pending()  # what came before is written first, as the call-by-call path does
            self._loop = Loop(module, name, tags)
        self.hook_seconds += time.perf_counter() - start
        return self._loop

    def loop_end(self, loop: Loop) -> None:
        """Hand the steps recorded since :meth:`loop_begin` to the writer as one block (also after an
        exception inside the loop: the steps that ran are written, as the call-by-call path does)."""
        if self._loop is loop:
            self._loop = None
        writer, steps, name = self.writer, loop.steps, loop.name
        if writer is None or not steps:
            return
        start = time.perf_counter()
        grad = _grad_enabled()
        _set_grad_enabled(False)
        try:
            stacked = stacked_steps(steps, loop.lstm)  # (h, c) or h of each step -> (2L or L, N, T, H)
        finally:
            _set_grad_enabled(grad)
        block = Block()
        block.calls, block.stacked = loop.calls, stacked
        tags = loop.tags
        t0 = tags.stepwise.get(name, 0)
        tags.stepwise[name] = t0 + len(steps)
        if t0 == 0 and loop.x0 is not None:
            block.inputs.append(loop.x0)
        writer.submit(functools.partial(self._write_block, writer, name, tags, True, t0, block), tensor_bytes(stacked))
        self.hook_seconds += time.perf_counter() - start

    def flush_pending(self) -> None:
        """Hand the kept one-step calls to the writer (see :meth:`_emit`)."""
        pending, tags, key = dict(self._pending), self._pending_tags, self._pending_key
        self._pending.clear()  # the same dict object: the hooks hold it
        self._pending_tags, self._pending_key, self._stepwise_tags = None, None, None
        writer = self.writer
        if tags is None or key is None or writer is None:
            return
        stepwise = key[0] == "stepwise"
        for name, block in pending.items():
            n = len(block.calls)
            t0 = tags.stepwise.get(name, n) - n if stepwise else 0
            job = functools.partial(self._write_block, writer, name, tags, stepwise, t0, block)
            writer.submit(job, block.nbytes())

    def train_drift(
        self, name: str, tags: Tags, t0: int, hs: np.ndarray, cs: np.ndarray | None, per_step: bool = False
    ) -> Drifts | None:
        """The drifts of train rows hs/cs (``drift.Drift.rows``; inside a job's second half, in call order);
        None for other phases, or without rollout states held."""
        if tags.phase != "train" or self.drift is None or not self.inputs.window:
            return None
        return self.drift.rows(name, tags.grid, t0, hs, cs, per_step)

    @property
    def reduces(self) -> bool:
        """Whether rows go to the sink as their figures (``drift.reduced``), not their states: a summary log,
        which keeps no state vector."""
        return self._reduce_here and self.options.capture == "summary"

    def hand_over(
        self, writer: LogWriter, message: Message, layers: int, states: tuple[Any, Any] | None = None
    ) -> None:
        """``message`` to the sink, after the observers (``observers``: live metrics) have read it, with the
        rows' states ``states`` (hs, cs) where the message carries their figures only."""
        for observe in self.observers:
            observe(message, layers, states)
        writer.send(message)

    def _write_block(
        self, writer: LogWriter, name: str, tags: Tags, stepwise: bool, t0: int, block: Block
    ) -> Later | None:
        """Host arrays of one block of one-step calls, to the sink (a job: see :meth:`LogWriter.submit`)."""
        return write_block(self, writer, name, tags, stepwise, t0, block)
