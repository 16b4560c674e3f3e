"""Forward hooks on nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell that stream per-step states to a log.

The tracer knows no RL framework. It is made with an :class:`~lstm_probe.contract.Integration` (sb3,
RLlib, or the generic tracer's user tags, all under ``lstm_probe/integrations/``), which names the
framework, declares its capabilities and, before or during each call, answers with the call's
:class:`Tags` (phase, iteration, epoch, minibatch) and :class:`Grid` (which env, env step and episode
each batch column and timestep belongs to). The tracer turns a call into rows: one per (layer, batch
column, timestep), written into columnar buffers (see ``writer.py``).

The hook sends each call to the function of its kind (``dispatch.py``): a step of a per-timestep loop
(recorded whole, :meth:`CoreTracer.loop_begin`, in the hook itself; or into the loop's open block), another
one-step call (into a block, ``blocks.py``), a multi-step or packed call (a job of its own, ``calls.py``), a
cell's call. The jobs hand their rows to the sink through the tracer's ``emitter.Emitter``. Which modules are
hooked and how the log describes them is ``modules.py``.
"""

from __future__ import annotations

import datetime as _dt
import functools
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lstm_probe.capture.blocks import Block, Hooked, KeptColumns, Loop, tensor_bytes, write_block
from lstm_probe.capture.dispatch import cell_call, rnn_call
from lstm_probe.capture.emitter import Emitter, Observer
from lstm_probe.capture.held import NEVER, Held
from lstm_probe.capture.inputs import Inputs, module_input, stacked_steps
from lstm_probe.capture.modules import RECURRENT_TYPES, Modes, base_metadata, describe_modules, numerics
from lstm_probe.capture.recover import Scratch
from lstm_probe.capture.transfer import Later
from lstm_probe.contract import CODES, Integration, Resolver, Tags
from lstm_probe.errors import BadInput
from lstm_probe.log.logwriter import LogWriter
from lstm_probe.options import CaptureOptions

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
        capture = options.capture_metadata()  # the log's `capture` entry
        # --other-envs none: only env columns below this reach the host (selected where the states are)
        self.keep_envs = options.trace_envs if options.other_envs == "none" else None
        self.keep_columns = KeptColumns(self.keep_envs) if self.keep_envs is not None else None
        self.metadata: dict[str, Any] = {
            **base_metadata(),
            **numerics(self.modules),
            "framework": integration.name,
            "architecture": {"modules": describe_modules(self.modules)},
            "hidden_size": self.hidden,
            "capture": capture,
            "capabilities": integration.capabilities().to_dict(),
            **integration.metadata(),
        }
        self.initial_states = initial_states
        self.shard = shard
        # what the jobs hand rows to the sink through (emitter.py): where each call's input state came from
        # (the `init` columns: the returned states the probe holds), each train row's drift against the rollout
        # states held (computed once), the rows counted, the observers (`observers`: sb3's live metrics)
        # a summary log's rows cross to the sink as their figures, unless some keep their vectors (--trace-envs)
        summary = options.capture == "summary" and options.trace_envs is None
        stored, reduces = integration.capabilities().stored_states, self._reduce_here and summary
        inputs = Inputs.of(options.reference_window, stored)
        # under --trace-envs K (the other envs summarized), rows cross reduced with the K envs' vectors only
        partial = options.trace_envs if not summary and options.capture == "summary" and self._reduce_here else None
        self.emitter = Emitter(
            self.layers,
            self.hidden,
            inputs,
            keep_envs=self.keep_envs,
            reduces=reduces,
            partial=partial if self.keep_envs is None else None,
        )
        self.scratch = Scratch()  # the per-step c recovery's work arrays (jobs run one at a time, in order)
        # whether dropout acted (the log's training_mode), per module with dropout: each call counted as its tags
        # are asked (the loops recorded whole at loop_end); an integration that counts its own sets modes anew
        self.modes = Modes(self.modules)
        self.resolver: Resolver = self.modes.resolving(integration.resolve, self) if self.modes else integration.resolve
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self.writer: LogWriter | None = None
        self.calls = 0
        self.call_base = call_base  # first call id: keeps ids unique across the processes of one log
        self.unsupported_calls = 0
        self.empty_calls = 0  # calls of no batch column (no rows): in the metadata where there were any
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
        # the last one-step call's block key (see dispatch._one_step); holding the tags keeps their id unique
        self._key_tags: Tags | None = None
        self._key_batch = 0
        self._key: tuple[Any, ...] | None = None
        # an integration whose grids' values reach the host later than its calls (TorchRL's: staged on the
        # device, read in bulk) settles them here, before any kept block is handed over
        self.before_hand_over: Callable[[], None] | None = None
        self.batching = False  # training calls' jobs batched (see batch_jobs)
        # what waits on the training side, handed over at the first call past _due (held.py)
        self.held, self._due = Held(options.part_seconds), NEVER

    # -- lifecycle (the core's part: a probe's start, close and `with` are life.Probe's) -----------
    def start(self) -> CoreTracer:
        """Open the log and attach the hooks."""
        self.started, self.batching = time.monotonic(), False  # a new log starts with no batch of jobs
        self.held, self._due = Held(self.options.part_seconds), NEVER
        o = self.options
        self.emitter.start()  # each log its own rows counted and states held (a generic tracer may start again)
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
            "end_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
            "unsupported_calls": self.unsupported_calls,
            **({"empty_calls": self.empty_calls} if self.empty_calls else {}),
            **self.modes.metadata(),
            "probe_cost": {
                "seconds": round(time.monotonic() - self.started, 3),  # start() to close(), wall
                "calls": self.calls,
                "hook_seconds": round(self.hook_seconds, 4),
                "integration_seconds": round(self.integration_seconds, 4),
            },
            **extra,
        }
        return writer.close(final)

    def batch_jobs(self, on: bool, timed: bool = True) -> None:
        """From now on (``on``), the jobs of calls that fit no block and of loops recorded whole are batched:
        with a writer process, their rows cross the pipe together (``LogWriter.submit``'s ``batch``) once the
        batch is full, at the next block handed over, or here when turned off. An integration turns it on
        where a burst of training calls starts (sb3: a rollout's end; rsl_rl: its minibatch generator; TorchRL:
        the replay of staged calls) and off where it ends; the rows wait in the training process until then (lost
        if the run is killed in between, as the writer's open part). ``timed``: the flush is integration time."""
        self.batching = on
        if not on and self.writer is not None:
            start = time.perf_counter()
            self.writer.flush_batch()
            self._due = self.held.due(self.writer)
            if timed:
                self.integration_seconds += time.perf_counter() - start

    def default_window(self, steps: int) -> None:
        """Keep ``steps`` env steps of rollout states per env (the train rows' drift, the provenance check) where
        no ``reference_window`` was given: for an integration that learns its rollout's length only once training
        runs (TorchRL's collector). Call it before the first rollout state is kept."""
        if not self.emitter.inputs.window:
            self.emitter.inputs.window = steps

    # -- hooks: each call to the function of its kind (below the class) -----------------------------
    def _make_hook(self, name: str) -> Callable[..., None]:
        hooked = Hooked(name, self.modules[name])
        call = rnn_call if hooked.sequences else cell_call

        def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            start = time.perf_counter()
            if start >= self._due:  # something waited a quarter of part_seconds: handed over now (held.py)
                self._due = NEVER  # (calls made inside, TorchRL's replayed ones, hand over nothing more)
                self._due = self.held.hand_over(start, self.flush_pending, self.writer)
            loop = self._loop
            if loop is not None and loop.module is mod and args[0].shape[0] == 1:
                # A step of a loop recorded whole (see loop_begin): its returned states kept as they are (no
                # copy, no tags), and the first step's input states (the `init` columns, see Inputs). Inline:
                # the probe's most frequent and cheapest call (~1 us), where one more function call would show.
                if not loop.steps:
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
                call(self, hooked, mod, args, output)
            finally:
                if grad:
                    _set_grad_enabled(True)
                self.hook_seconds += time.perf_counter() - start

        return hook

    @property
    def rows(self) -> int:
        """Rows handed to the writer so far (a progress display's figure; counted by ``emitter``)."""
        return self.emitter.rows

    @property
    def observers(self) -> list[Observer]:
        """Who else reads each message handed to the sink, in the same process (sb3's live metrics): see
        ``emitter.Emitter.hand_over``."""
        return self.emitter.observers

    def loop_begin(self, module: nn.Module, batch: int) -> Loop | None:
        """Record the one-step calls of ``module`` that follow, until :meth:`loop_end`, as one block: the
        steps of a per-timestep loop over ``batch`` sequences under the same tags (sb3's stepwise
        training path, bracketed by its integration). The hook only keeps each step's returned states
        (:meth:`_make_hook`); the block is tagged and written once, as the same rows the call-by-call path
        writes (the integration guarantees nothing changes those states in place before loop_end). None
        (call by call) unless the tags, asked now, give a grid of ``batch`` columns and several steps."""
        name = self._by_module.get(id(module))
        if name is None or self._loop is not None or self.writer is None or getattr(module, "batch_first", True):
            return None  # (LSTMCell and GRUCell have no batch_first: they make no loops to record)
        start = time.perf_counter()
        tags = self.integration.resolve(name, 1, batch)  # (its steps counted at loop_end, not here)
        grid = tags.grid
        if grid is not None and grid.shape[0] == batch and grid.shape[1] > 1:
            self.flush_pending()  # what came before is written first, as the call-by-call path does
            self._loop = Loop(module, name, tags, start)
        self.hook_seconds += time.perf_counter() - start
        return self._loop

    def loop_end(self, loop: Loop) -> None:
        """Hand the steps recorded since :meth:`loop_begin` to the writer as one block (also after an
        exception inside the loop: the steps that ran are written, as the call-by-call path does)."""
        if self._loop is loop:
            self._loop = None
        writer, name = self.writer, loop.name
        k = min(len(loop.steps), len(loop.calls))  # a Ctrl-C may stop a step's hook between its two appends
        steps, loop.calls = loop.steps[:k], loop.calls[:k]
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
        self.modes.count(name, tags.phase, len(steps))
        t0 = tags.stepwise.get(name, 0)
        tags.stepwise[name] = t0 + len(steps)
        if t0 == 0 and loop.x0 is not None:
            block.inputs.append(loop.x0)
        job = functools.partial(self._write_block, writer, name, tags, True, t0, block)
        writer.submit(job, tensor_bytes(stacked), batch=self.batching, since=loop.began)
        self._due = self.held.due(writer)
        self.hook_seconds += time.perf_counter() - start

    def flush_pending(self) -> None:
        """Hand the kept one-step calls to the writer (see ``dispatch._one_step``), their grids settled first
        (:attr:`before_hand_over`)."""
        if self._pending and self.before_hand_over is not None:
            self.before_hand_over()
        pending, tags, key = dict(self._pending), self._pending_tags, self._pending_key
        since, self.held.blocks = self.held.blocks, NEVER
        self._pending.clear()
        self._pending_tags, self._pending_key, self._stepwise_tags = None, None, None
        writer = self.writer
        if tags is None or key is None or writer is None:
            return
        stepwise = key[0] == "stepwise"
        for name, block in pending.items():
            block.settle()  # a hook that a Ctrl-C stopped half-way leaves a call without its states
            if not block.n:
                continue
            t0 = block.t0 if stepwise else 0
            job = functools.partial(self._write_block, writer, name, tags, stepwise, t0, block)
            writer.submit(job, block.nbytes(), since=since)
        self._due = self.held.due(writer)

    def _write_block(
        self, writer: LogWriter, name: str, tags: Tags, stepwise: bool, t0: int, block: Block
    ) -> Later | None:
        """Host arrays of one block of one-step calls, to the sink (a job: see :meth:`LogWriter.submit`)."""
        return write_block(self.emitter, writer, name, tags, stepwise, t0, block)
