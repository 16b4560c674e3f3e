"""Forward hooks on nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell that stream per-step states to a log.

The tracer knows no RL framework. It is made with an :class:`~lstm_probe.contract.Integration` (sb3,
RLlib, or the generic tracer's user tags, all under ``lstm_probe/integrations/``), which names the
framework, declares its capabilities and, before or during each call, answers with the call's
:class:`Tags` (phase, iteration, epoch, minibatch) and :class:`Grid` (which env, env step and episode
each batch column and timestep belongs to). The tracer turns a call into rows: one per (layer, batch
column, timestep), written into columnar buffers (see ``writer.py``).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import platform
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.contract import CODES, PATH, Grid, Integration, Resolver, Tags, tag_values
from lstm_probe.errors import BadInput, one_line
from lstm_probe.logwriter import LogWriter
from lstm_probe.options import CaptureOptions
from lstm_probe.recover import gru_sequence_states, lstm_sequence_io, snapshot_weights
from lstm_probe.schema import SCHEMA_VERSION

RECURRENT_TYPES = (nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell)
MAX_PENDING = 256
"""One-step calls kept before they are written as one block (bounds the memory they hold)."""


def _host(t: torch.Tensor) -> np.ndarray:
    """A detached tensor as a float32 numpy array (one device-to-host copy when it is not on the CPU)."""
    t = t.detach()
    if t.dtype != torch.float32:
        t = t.float()
    return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.nelement() * t.element_size() for t in tensors if t is not None)


def find_recurrent(model: nn.Module, names: list[str] | None = None) -> dict[str, nn.Module]:
    """Every nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell in ``model`` (or those ``names``)."""
    found: dict[str, nn.Module] = {
        name or "root": m for name, m in model.named_modules() if isinstance(m, RECURRENT_TYPES)
    }
    if names is not None:
        missing = [n for n in names if n not in found]
        if missing:
            raise BadInput(
                f"no recurrent module named {missing[0]!r}; recurrent modules here: {', '.join(found) or 'none'}"
            )
        found = {n: found[n] for n in names}
    if not found:
        raise BadInput("the model has no nn.LSTM, nn.GRU, nn.LSTMCell or nn.GRUCell to trace")
    return found


def describe_modules(modules: Mapping[str, nn.Module]) -> dict[str, dict[str, Any]]:
    out = {}
    for name, m in modules.items():
        size: Any = m.hidden_size
        inputs: Any = m.input_size
        out[name] = {
            "kind": type(m).__name__,
            "hidden_size": int(size),
            "num_layers": int(getattr(m, "num_layers", 1)),
            "input_size": int(inputs),
        }
    return out


def base_metadata() -> dict[str, Any]:
    from importlib.metadata import version

    versions = {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pyarrow": version("pyarrow"),  # not imported: with a writer process, training never loads it
        "python": platform.python_version(),
    }
    for pkg in ("stable_baselines3", "sb3_contrib", "gymnasium"):
        try:
            versions[pkg] = __import__(pkg).__version__
        except ImportError:
            pass
    if "ray" in sys.modules:  # only when already loaded: importing Ray takes seconds
        versions["ray"] = sys.modules["ray"].__version__
    from lstm_probe import __version__

    return {
        "schema_version": SCHEMA_VERSION,
        "lstm_probe_version": __version__,
        "versions": versions,
        "start_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


class Tracer:
    """Hooks recurrent modules and writes their per-step states to a log.

    Made by an integration (``lstm_probe.trace``, ``ProbeCallback``, the RLlib probes), which answers
    each call's tags. ``initial_states``: also record the states each multi-step call started from.
    ``call_base``: the first call id (keeps ids unique across the processes of one log); ``shard``: this
    process's part-file name in a directory log written by several processes.
    """

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
        }
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
        self.resolver: Resolver = integration.resolve
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self.writer: LogWriter | None = None
        self.calls = 0
        self.call_base = call_base  # first call id: keeps ids unique across the processes of one log
        self.unsupported_calls = 0
        # what the probe costs, measured while it runs (see the log's `probe_cost` metadata)
        self.hook_seconds = 0.0  # training thread, inside the hooks
        self.integration_seconds = 0.0  # training thread, in an integration's own callbacks (sb3, RLlib)
        self.started = time.monotonic()
        # one-step calls waiting to be written as one block, per module
        self._pending: dict[str, _Block] = {}
        self._pending_tags: Tags | None = None
        self._pending_key: tuple[Any, ...] | None = None
        self._stepwise_tags: Tags | None = None  # the open per-timestep block's tags (hook fast path)
        self._resolved: Tags | None = None  # tags the hook already asked the resolver for
        # the block key of the last one-step call's tags (see _emit); holding the tags keeps their id unique
        self._key_tags: Tags | None = None
        self._key_batch = 0
        self._key: tuple[Any, ...] | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Tracer:
        """Open the log and attach the hooks."""
        self.started = time.monotonic()
        o = self.options
        self.writer = LogWriter(
            o.out,
            self.hidden,
            self.names,
            self.metadata,
            CODES,
            float16=o.float16,
            capture=o.capture,
            every=o.every,
            reference_window=o.reference_window,
            force=o.force,
            part_seconds=o.part_seconds,
            part_iterations=o.part_iterations,
            shard=self.shard,
            writer=o.writer,
        )
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

    def __enter__(self) -> Tracer:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        reason = None if exc is None else one_line(exc)
        self.close(completed=exc is None, stop_reason=reason)

    # -- hooks -----------------------------------------------------------------------------------
    def _make_hook(self, name: str) -> Callable[..., None]:
        inner = self._make_inner_hook(name)

        def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            start = time.perf_counter()
            try:
                inner(mod, args, output)
            finally:
                self.hook_seconds += time.perf_counter() - start

        return hook

    def _make_inner_hook(self, name: str) -> Callable[..., None]:
        module = self.modules[name]
        code = self.module_code[name]
        if isinstance(module, nn.LSTM | nn.GRU):
            is_lstm = isinstance(module, nn.LSTM)
            time_axis = 1 if module.batch_first else 0
            pending = self._pending

            def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
                x = args[0]
                if not isinstance(x, torch.Tensor):  # PackedSequence: no per-step layout to map
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
                        tags.stepwise[name] = tags.stepwise.get(name, 0) + 1
                        call = self.call_base + self.calls
                        self.calls += 1
                        block = pending.get(name)
                        if block is None:
                            block = pending[name] = _Block()
                        # Not detached (4 us a call for a tensor that requires grad): the block's job
                        # stacks them under no_grad, which records nothing. Appended to lists, not kept as a
                        # tuple per call: a new container per call made Python's cyclic garbage collector
                        # run more often and longer (measured: 10 -> 4 us a call in sb3's stepwise path).
                        block.calls.append(call)
                        block.h.append(hn)
                        block.c.append(cn)
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
                    # Kept as (detached) tensors and copied to the host once per block of calls: on a GPU
                    # that is one device-to-host copy (and sync) per block instead of one per call.
                    h1 = hn.detach()
                    c1 = cn.detach() if cn is not None else None
                    if unbatched:
                        h1 = h1.unsqueeze(1)
                        c1 = c1.unsqueeze(1) if c1 is not None else None
                    self._emit(name, code, 1, batch, h1, c1)
                    return
                x, y = x.detach(), y.detach()
                if unbatched:
                    x, y = x.unsqueeze(1), y.unsqueeze(1)
                elif module.batch_first:
                    x, y = x.transpose(0, 1), y.transpose(0, 1)
                h0, c0 = self._initial(mod, args, batch, x, unbatched, is_lstm)
                h0, c0 = h0.detach(), c0.detach()
                weights: list[list[torch.Tensor]] | None = None
                if self.writer is not None and not self.writer.inline:
                    # The recovery runs later, on the writer thread: copy what the caller may still change
                    # in place (its input and states, the weights an optimizer step updates); y is the
                    # call's own fresh output. (A writer process's job runs now, inside this hook.)
                    x, h0, c0 = x.clone(), h0.clone(), c0.clone()
                    weights = snapshot_weights(module, top=is_lstm)  # type: ignore[arg-type]
                initial_states = self.initial_states

                def states() -> tuple[np.ndarray, Any, tuple[np.ndarray, np.ndarray | None] | None]:
                    # the torch part of the recovery here (lower layers only); gates and scan in the sink
                    cells: Any = None
                    if is_lstm:
                        hs, cells = lstm_sequence_io(module, x, h0, c0, y, weights)  # type: ignore[arg-type]
                    else:
                        hs = gru_sequence_states(module, x, h0, y, weights)  # type: ignore[arg-type]
                    initial = (_host(h0), _host(c0) if is_lstm else None) if initial_states else None
                    return hs, cells, initial

                layers = int(module.num_layers)
                nbytes = 2 * layers * _nbytes(y) + _nbytes(x, h0, c0, *(w for ws in weights or [] for w in ws))
                self._emit(name, code, steps, batch, None, None, states, nbytes)

        else:
            is_cell_lstm = isinstance(module, nn.LSTMCell)

            def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
                h, c = output if is_cell_lstm else (output, None)
                if h.dim() == 1:
                    h = h.unsqueeze(0)
                    c = c.unsqueeze(0) if c is not None else None
                batch = int(h.shape[0])
                self._emit(name, code, 1, batch, h.detach()[None], c.detach()[None] if c is not None else None)

        return hook

    @staticmethod
    def _initial(
        mod: nn.Module, args: tuple[Any, ...], batch: int, x: torch.Tensor, unbatched: bool, is_lstm: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layers, hidden = int(mod.num_layers), int(mod.hidden_size)  # type: ignore[arg-type]
        hx = args[1] if len(args) > 1 else None
        zeros = torch.zeros(layers, batch, hidden, dtype=x.dtype, device=x.device)
        if hx is None:
            return zeros, zeros
        h0, c0 = hx if is_lstm else (hx, zeros)
        if unbatched:
            h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
        return h0, c0

    def _emit(
        self,
        name: str,
        code: int,
        steps: int,
        batch: int,
        h: torch.Tensor | None,
        c: torch.Tensor | None,
        states: Callable[[], tuple[np.ndarray, Any, Any]] | None = None,
        nbytes: int = 0,
    ) -> None:
        """Take one call. One-step calls bring their detached (L, N, H) states ``h``/``c``; multi-step
        calls bring ``states``, run by the job, which returns the arguments of
        :meth:`Sink.sequence` (per-step h, the gates for the cell-state scan, the initial states).

        One-step calls are kept and written in blocks: the steps of a per-timestep loop over a
        sequence batch (sb3's 'stepwise' path) along the time axis, consecutive one-step calls with the
        same tags (rollout steps) along the batch axis. A block is handed to the writer
        (:meth:`LogWriter.submit`) when the tags change, when it holds MAX_PENDING calls, and at close.
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
                tags.stepwise[name] = tags.stepwise.get(name, 0) + 1
        if key is None:
            self.flush_pending()

            def job() -> None:
                if states is not None:
                    writer.send("sequence", name, tags, call, *states())
                else:  # a one-step call that fits no block
                    assert h is not None
                    hs = _host(h)[:, :, None, :]
                    cs = _host(c)[:, :, None, :] if c is not None else None
                    writer.send("rows", name, tags, 0, PATH["step"], np.full(batch, call, np.int64), hs, cs)

            writer.submit(job, nbytes or _nbytes(h, c))
            return
        if key != self._pending_key:
            self.flush_pending()
            self._pending_key, self._pending_tags = key, tags
            if key[0] == "stepwise":
                self._stepwise_tags = tags
        block = self._pending.get(name)
        if block is None:
            block = self._pending[name] = _Block()
        block.calls.append(call)
        block.h.append(h)  # type: ignore[arg-type]
        block.c.append(c)
        if grid is not None:
            block.grids.append(grid)
        if len(block.calls) >= MAX_PENDING and key[0] == "step":
            self.flush_pending()

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
            writer.submit(job, n * _nbytes(block.h[0], block.c[0]))

    def _write_block(self, writer: LogWriter, name: str, tags: Tags, stepwise: bool, t0: int, block: _Block) -> None:
        """Host arrays of one block of one-step calls, to the sink (a job: see :meth:`LogWriter.submit`)."""
        calls = np.array(block.calls, np.int64)
        with_c = all(c is not None for c in block.c)
        if stepwise:
            hs = _host(torch.stack(block.h, dim=2))  # (L, N, T', H)
            cs = _host(torch.stack(block.c, dim=2)) if with_c else None  # type: ignore[arg-type]
            per_col = np.tile(calls, hs.shape[1])  # (N * T',) in column-major order: n, then t
            writer.send("rows", name, tags, t0, PATH["stepwise"], per_col, hs, cs)
            return
        hs = _host(torch.cat(block.h, dim=1))[:, :, None, :]  # (L, sum N, 1, H)
        cs = _host(torch.cat(block.c, dim=1))[:, :, None, :] if with_c else None  # type: ignore[arg-type]
        per_col = np.repeat(calls, [h.shape[1] for h in block.h])
        sent = tags
        if block.grids:
            sent = dataclasses.replace(tags, grid=Grid.concat(block.grids), stepwise={})
        writer.send("rows", name, sent, 0, PATH["step"], per_col, hs, cs)


class _Block:
    """The one-step calls of one module kept for one block: their call ids, grids (rollout steps) and
    detached (L, N, H) states, as parallel lists."""

    __slots__ = ("c", "calls", "grids", "h")

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.grids: list[Grid] = []
        self.h: list[torch.Tensor] = []
        self.c: list[torch.Tensor | None] = []
