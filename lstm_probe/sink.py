"""The writer side of a log: states in, rows out, off the training thread and, by default, out of the
training process.

The training thread only keeps references to detached state tensors (``tracer.py``) and hands them
over as *jobs* to :class:`LogWriter`, whose queue is bounded by the bytes the jobs hold. Its thread
runs them in order: the device-to-host copies and the torch part of recovering per-step states, then a
message to the :class:`Sink`, which does everything per row: provenance columns, the cell-state scan,
the in-probe drift against rollout states, norms, encoding and Parquet writes (``writer.py``).

The sink runs in a writer process of its own (``python -m lstm_probe.sink``, spoken to through a
pipe), or on the writer thread (``writer="thread"``). In-process, every bit of Python the sink runs
holds the interpreter lock that training needs, so its whole cost lands on training; in its own
process it uses another core. The sink never imports torch. If the training process dies, the sink sees
its pipe close and publishes the rows it holds as a part of the crash journal.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lstm_probe.contract import BOOTSTRAP, PATH, PHASE, Grid, Tags
from lstm_probe.errors import BadInput, OutputError
from lstm_probe.layout import check_output, row_capacity
from lstm_probe.schema import relative_l2

if TYPE_CHECKING:  # pyarrow loads only where rows are written (the writer process or thread)
    from lstm_probe.writer import Rows


class References:
    """The rollout states of the last ``window`` env steps of each env, for in-probe drift.

    One flat (layers * envs * window, hidden) table per state, so that a block's references come out
    with one ``take`` (numpy's multi-axis fancy indexing is several times slower here)."""

    def __init__(self, window: int, layers: int, hidden: int):
        self.window, self.layers, self.hidden = window, layers, hidden
        self.envs = 0
        self.steps = np.full(0, -1, np.int64)
        self.h = np.zeros((0, hidden), np.float32)
        self.c = np.zeros((0, hidden), np.float32)

    def _grow(self, envs: int) -> None:
        if envs <= self.envs:
            return
        L, W, H, extra = self.layers, self.window, self.hidden, envs - self.envs

        def grown(a: np.ndarray, fill: float, row: tuple[int, ...]) -> np.ndarray:
            old = a.reshape(L, self.envs, W, *row)
            new = np.full((L, extra, W, *row), fill, a.dtype)
            return np.concatenate([old, new], axis=1).reshape(L * envs * W, *row)

        self.steps = grown(self.steps, -1, ())
        self.h = grown(self.h, 0.0, (H,))
        self.c = grown(self.c, 0.0, (H,))
        self.envs = envs

    def _rows(self, layer: np.ndarray, env: np.ndarray, step: np.ndarray) -> np.ndarray:
        return (layer * self.envs + env) * self.window + step % self.window

    def store(self, layer: np.ndarray, env: np.ndarray, step: np.ndarray, h: np.ndarray, c: np.ndarray) -> None:
        ok = (env >= 0) & (step >= 0)
        if not ok.all():
            layer, env, step, h, c = layer[ok], env[ok], step[ok], h[ok], c[ok]
        if len(env) == 0:
            return
        self._grow(int(env.max()) + 1)
        rows = self._rows(layer, env, step)
        self.steps[rows] = step
        self.h[rows] = h
        self.c[rows] = c

    def drift(
        self, layer: np.ndarray, env: np.ndarray, step: np.ndarray, h: np.ndarray, c: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(env)
        dh = np.zeros(n, np.float32)
        dc = np.zeros(n, np.float32)
        found = np.zeros(n, np.bool_)
        ok = (env >= 0) & (step >= 0) & (env < self.envs)
        idx = np.flatnonzero(ok)
        rows = self._rows(layer[idx], env[idx], step[idx])
        match = self.steps.take(rows) == step[idx]
        if not match.all():
            idx, rows = idx[match], rows[match]
        if len(idx) == 0:
            return dh, dc, found
        found[idx] = True
        whole = len(idx) == n  # the common case: every row has its reference, no gather of h and c
        dh[idx] = relative_l2(h if whole else h[idx], self.h.take(rows, axis=0))
        dc[idx] = relative_l2(c if whole else c[idx], self.c.take(rows, axis=0))
        return dh, dc, found


def _opt(v: int | None) -> int:
    return -1 if v is None else v


Cells = tuple[list[np.ndarray], list[list[np.ndarray]], np.ndarray, np.ndarray]
"""What the per-step c of a multi-step LSTM call is computed from (``recover.lstm_sequence_io``): each
layer's input (T, N, F_l), each layer's i, f, g weight rows [W_ih (3H, F_l), W_hh (3H, H), (b_ih + b_hh)
(3H,) when the module has biases], and the initial h0, c0 (L, N, H)."""


class Scratch:
    """Reused work arrays: a fresh multi-MB array costs page faults on every first touch (more so in the
    writer process, whose allocator hands large blocks back to the system), which made the gates of one
    training call cost ~2x their arithmetic. Arrays above ``limit`` bytes are not kept."""

    def __init__(self, limit: int = 16 << 20):
        self.limit = limit
        self.flat: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape))
        if 4 * n > self.limit:
            return np.empty(shape, np.float32)
        flat = self.flat.get(name)
        if flat is None or flat.size < n:
            flat = self.flat[name] = np.empty(n, np.float32)
        return flat[:n].reshape(shape)


def lstm_cells(
    hs: np.ndarray,
    inputs: list[np.ndarray],
    weights: list[list[np.ndarray]],
    h0: np.ndarray,
    c0: np.ndarray,
    scratch: Scratch | None = None,
) -> np.ndarray:
    """Per-step c of every layer, (L, T, N, H) float32, from the per-step h ``hs`` (L, T, N, H) and
    :data:`Cells`: the i, f, g gates of all steps in one matmul from (x_t, h_{t-1}), then
    c_t = f_t * c_{t-1} + i_t * g_t as an elementwise scan. With ``scratch`` the result and the work
    arrays live in its reused memory (valid until its next use)."""
    work = scratch or Scratch(limit=0)
    layers, steps, batch, hidden = hs.shape
    cs = work.get("cs", hs.shape)
    rows = steps * batch
    for layer in range(layers):
        out = hs[layer]
        w = weights[layer]
        h_prev = work.get("h_prev", (steps, batch, hidden))  # h_{t-1}
        h_prev[0] = h0[layer]
        h_prev[1:] = out[:-1]
        # as 2-D products into reused memory: one BLAS call each (a 3-D operand is one call per step)
        gates = work.get("gates", (rows, 3 * hidden))
        np.matmul(inputs[layer].reshape(rows, -1), w[0].T, out=gates)
        part = work.get("part", (rows, 3 * hidden))
        np.matmul(h_prev.reshape(rows, hidden), w[1].T, out=part)
        gates += part
        if len(w) > 2:
            gates += w[2]
        g3 = gates.reshape(steps, batch, 3 * hidden)
        i, f, g = g3[..., :hidden], g3[..., hidden : 2 * hidden], g3[..., 2 * hidden :]
        fg = work.get("fg", (steps, batch, hidden))
        ig = work.get("ig", (steps, batch, hidden))
        tg = work.get("tg", (steps, batch, hidden))
        with np.errstate(over="ignore"):  # exp overflow -> sigmoid 0, as it should
            np.negative(f, out=fg)  # fg = 1 / (1 + exp(-f))
            np.exp(fg, out=fg)
            fg += 1.0
            np.divide(1.0, fg, out=fg)
            np.negative(i, out=ig)  # ig = tanh(g) / (1 + exp(-i))
            np.exp(ig, out=ig)
            ig += 1.0
            np.tanh(g, out=tg)
            np.divide(tg, ig, out=ig)
        c, cl = c0[layer], cs[layer]
        for t in range(steps):  # elementwise scan; numpy's per-op cost is lower than torch's here
            np.multiply(fg[t], c, out=cl[t])
            cl[t] += ig[t]
            c = cl[t]
    return cs


class Sink:
    """Turns blocks of states into rows of one log (see the module docstring); ``config`` is plain data
    (:meth:`LogWriter.sink_config`), so the sink can be built in another process."""

    def __init__(self, config: Mapping[str, Any]):
        from lstm_probe.writer import FileLog

        self.log = FileLog(**config["log"])
        self.module_code = {n: i for i, n in enumerate(config["log"]["modules"])}
        self.hidden = int(config["log"]["hidden_size"])
        self.capture, self.every = config["capture"], int(config["every"])
        self.reference_window = int(config["reference_window"])
        self.refs: dict[str, References] = {}
        self.scratch = Scratch()

    def progress(self, progress: dict[str, Any]) -> None:
        self.log.progress = progress

    def sequence(
        self,
        name: str,
        tags: Tags,
        call: int,
        hs: np.ndarray,
        cells: Cells | None,
        initial: tuple[np.ndarray, np.ndarray | None] | None,
    ) -> None:
        """Rows of one multi-step call: hs (L, T, N, H) per-step h of every layer; ``cells`` what an
        LSTM's per-step c is computed from (:data:`Cells`), None for a GRU; ``initial`` the (L, N, H)
        states the call started from, written as rows with t = -1 when the call is a train call of
        whole sequences."""
        cs = lstm_cells(hs, *cells, scratch=self.scratch).transpose(0, 2, 1, 3) if cells is not None else None
        hs = hs.transpose(0, 2, 1, 3)  # (L, N, T, H)
        batch, steps = hs.shape[1], hs.shape[2]
        path = PATH["sequence"]
        self.rows(name, tags, 0, path, np.full(batch * steps, call, np.int64), hs, cs)
        grid = tags.grid
        if initial is not None and grid is not None and grid.train and grid.shape[0] == batch:
            # The state each sequence started from, as rows with t = -1 (see the schema's `t`).
            start = Tags(tags.phase, tags.iteration, tags.epoch, tags.minibatch, grid=grid.initial())
            start.learner = tags.learner
            h0, c0 = initial
            ids = np.full(batch, call, np.int64)
            self.rows(name, start, 0, path, ids, h0[:, :, None, :], None if c0 is None else c0[:, :, None, :], t=-1)

    def rows(
        self,
        name: str,
        tags: Tags,
        t0: int,
        path: int,
        call: np.ndarray,
        hs: np.ndarray,
        cs: np.ndarray | None,
        t: int | None = None,
    ) -> None:
        """Rows of one call (or of one per-timestep loop): hs/cs (L, N, T', H), rows ordered layer, column, t.
        ``t`` overrides the rows' step column (-1 for the initial-state rows). Writer thread or process."""
        grid = tags.grid
        layers, batch, steps = hs.shape[0], hs.shape[1], hs.shape[2]
        per_layer = batch * steps
        n = layers * per_layer
        log = self.log
        r, i0 = log.reserve(n)
        i1 = i0 + n
        r.call[i0:i1] = np.tile(call, layers) if layers > 1 else call
        r.module[i0:i1] = self.module_code[name]
        r.layer[i0:i1] = np.repeat(np.arange(layers, dtype=np.int16), per_layer)
        r.phase[i0:i1] = PHASE[tags.phase]
        r.path[i0:i1] = path
        r.bootstrap[i0:i1] = -1 if tags.bootstrap is None else BOOTSTRAP[tags.bootstrap]
        r.iteration[i0:i1] = _opt(tags.iteration)
        r.epoch[i0:i1] = _opt(tags.epoch)
        r.minibatch[i0:i1] = _opt(tags.minibatch)
        r.learner[i0:i1] = _opt(tags.learner)
        if grid is not None and grid.shape[0] == batch and t0 + steps <= grid.shape[1]:
            self._fill_grid(r, i0, i1, grid, t0, steps, layers)
        else:
            self._fill_null(r, i0, i1, path, call, t0, steps, layers)
        if t is not None:
            r.t[i0:i1] = t
        # (n, H) views of this call's states in row order: copied straight into the row buffers (hs/cs are
        # often transposed views: reshaping them to (n, H) first would be a second copy); a summary log's
        # buffers hold no vectors, and a reshape copies only where it must
        h: np.ndarray
        c: np.ndarray | None
        if r.h is not None and r.c is not None:
            h = r.h[i0:i1]
            h.reshape(hs.shape)[...] = hs
            c = r.c[i0:i1]
            if cs is not None:
                c.reshape(cs.shape)[...] = cs
            else:
                c[...] = 0.0
        else:
            h = hs.reshape(n, self.hidden)
            c = cs.reshape(n, self.hidden) if cs is not None else None
        r.has_c[i0:i1] = cs is not None
        with np.errstate(over="ignore", invalid="ignore"):
            r.h_norm[i0:i1] = np.sqrt(np.einsum("ij,ij->i", h, h, dtype=np.float64))
            if cs is not None:
                assert c is not None
                r.c_norm[i0:i1] = np.sqrt(np.einsum("ij,ij->i", c, c, dtype=np.float64))
            else:
                r.c_norm[i0:i1] = 0.0
        it = tags.iteration
        r.vectors[i0:i1] = self.capture == "full" and (it is None or it % self.every == 0)
        r.has_drift[i0:i1] = False
        if self.reference_window and grid is not None and tags.phase in ("rollout", "train"):
            if c is None:
                c = np.zeros_like(h)
            self._drift(name, layers, r, i0, i1, tags.phase == "rollout", h, c)
        log.commit(n)

    @staticmethod
    def _fill_grid(r: Rows, i0: int, i1: int, grid: Grid, t0: int, steps: int, layers: int) -> None:
        def cols(a: np.ndarray) -> np.ndarray:
            v = a[:, t0 : t0 + steps].reshape(-1)  # (N * T',) column-major order: n, then t
            return np.tile(v, layers) if layers > 1 else v

        r.env[i0:i1] = cols(grid.env)
        r.env_step[i0:i1] = cols(grid.env_step)
        r.episode[i0:i1] = cols(grid.episode)
        r.episode_step[i0:i1] = cols(grid.episode_step)
        r.episode_start[i0:i1] = cols(grid.episode_start)
        r.padding[i0:i1] = cols(grid.padding)
        r.worker[i0:i1] = -1 if grid.worker is None else cols(grid.worker)
        if grid.bootstrap is not None:
            r.bootstrap[i0:i1] = cols(grid.bootstrap)
        if grid.train:
            batch = grid.shape[0]
            seq = np.repeat(np.arange(batch, dtype=np.int32), steps)
            t = np.tile(np.arange(t0, t0 + steps, dtype=np.int32), batch)
            r.seq[i0:i1] = np.tile(seq, layers)
            r.t[i0:i1] = np.tile(t, layers)
            assert grid.seq_len is not None and grid.seq_reason is not None
            r.seq_len[i0:i1] = np.tile(np.repeat(grid.seq_len, steps), layers)
            r.seq_reason[i0:i1] = np.tile(np.repeat(grid.seq_reason, steps), layers)
        else:
            r.seq[i0:i1] = -1
            r.t[i0:i1] = 0
            r.seq_len[i0:i1] = -1
            r.seq_reason[i0:i1] = -1

    @staticmethod
    def _fill_null(r: Rows, i0: int, i1: int, path: int, call: np.ndarray, t0: int, steps: int, layers: int) -> None:
        """Rows without provenance (a call no integration tagged): no env columns, but each row still says
        where in its call it sits: ``seq`` the batch column, ``t`` the step."""
        for col in (
            r.worker,
            r.env,
            r.env_step,
            r.episode,
            r.episode_step,
            r.episode_start,
            r.seq_len,
            r.seq_reason,
        ):
            col[i0:i1] = -1
        per_layer = len(call)  # (N * T',) in column-major order: n, then t
        if path == PATH["step"]:  # one-step calls side by side (T' = 1): the column within each call
            pos = np.arange(per_layer)
            seq = pos - np.searchsorted(call, call)
        else:  # one call (sequence) or one call per step (stepwise): the batch columns
            seq = np.repeat(np.arange(per_layer // steps), steps)
        t = np.tile(np.arange(t0, t0 + steps), per_layer // steps)
        r.seq[i0:i1] = np.tile(seq, layers) if layers > 1 else seq
        r.t[i0:i1] = np.tile(t, layers) if layers > 1 else t
        r.padding[i0:i1] = False

    def _drift(
        self, name: str, layers: int, r: Rows, i0: int, i1: int, rollout: bool, h: np.ndarray, c: np.ndarray
    ) -> None:
        ref = self.refs.get(name)
        if ref is None:
            ref = self.refs[name] = References(self.reference_window, layers, self.hidden)
        layer = r.layer[i0:i1].astype(np.intp)
        env, step = r.env[i0:i1].astype(np.intp), r.env_step[i0:i1]
        if rollout:
            ref.store(layer, env, step, h, c)
            return
        dh, dc, found = ref.drift(layer, env, step, h, c)
        r.drift_h[i0:i1] = dh
        r.drift_c[i0:i1] = dc
        r.has_drift[i0:i1] = found

    def flush_if_due(self) -> None:
        if self.log.flush_due():
            self.log.flush()

    def close(self, final: dict[str, Any]) -> None:
        self.log.close(final)


# -- the writer thread (training process) ---------------------------------------------------------

WRITERS = ("process", "thread")
DEFAULT_WRITER = "thread" if os.name == "nt" else "process"  # Windows pipes cannot be polled (select)


class LogWriter:
    """Hands one log's states to its sink: in a writer process, or on a writer thread (see the module
    docstring).

    The training thread hands over *jobs* (:meth:`submit`): closures that hold the detached state
    tensors of a block of calls and their provenance; a job ends by handing host arrays to the sink with
    :meth:`send`. With a writer process a job runs right away and its messages go into the pipe, whose
    backlog is bounded by bytes; with a writer thread jobs wait in a queue bounded by the bytes they
    hold. Either way a slow disk slows training down instead of growing memory. :meth:`close` drains
    everything, writes the outcome into the metadata and publishes the log.
    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        hidden_size: int,
        modules: Sequence[str],
        metadata: dict[str, Any],
        codes: Mapping[str, Sequence[str]],
        *,
        capture: str = "full",
        every: int = 1,
        reference_window: int = 0,
        float16: bool = False,
        force: bool = False,
        part_seconds: float = 60.0,
        part_rows: int = 2_000_000,
        part_iterations: int | None = None,
        queue_bytes: int = 32 << 20,
        shard: str | None = None,
        writer: str = DEFAULT_WRITER,
    ):
        if writer not in WRITERS:
            raise BadInput(f"writer must be one of {', '.join(WRITERS)}, not {writer!r}")
        out_str = os.fspath(out)
        self.path = Path(out_str)
        is_dir = out_str.endswith(("/", os.sep)) or self.path.is_dir()
        if shard is not None and (not re.fullmatch(r"[A-Za-z0-9_.]+", shard) or not is_dir):
            raise BadInput(
                f"shard {shard!r}: shards need a directory --out (ending in /) and a name of "
                "letters, digits, '_' or '.'"
            )
        if part_iterations is not None and (part_iterations < 1 or not is_dir):
            raise BadInput(
                f"part_iterations {part_iterations}: parts per span of iterations need a directory --out "
                "(ending in /) and a span of at least 1"
            )
        check_output(self.path, force=force, is_dir=is_dir, shard=shard)
        if is_dir and not out_str.endswith(("/", os.sep)):
            out_str += os.sep
        self.config: dict[str, Any] = {
            "log": {
                "out": out_str,
                "hidden_size": hidden_size,
                "modules": list(modules),
                # as JSON sees it (plain types): torch.__version__, say, is a str subclass of torch's, and
                # unpickling it would import torch into the writer process
                "metadata": json.loads(json.dumps(metadata, default=str)),
                "codes": {k: list(v) for k, v in codes.items()},
                "float16": float16,
                "part_seconds": part_seconds,
                "part_rows": part_rows,
                "part_iterations": part_iterations,
                "shard": shard,
                "vectors": capture == "full",
            },
            "capture": capture,
            "every": every,
            "reference_window": reference_window,
        }
        self.progress: dict[str, Any] = {}
        self._sent_progress: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.closed = False
        self._jobs: deque[_Sized | None] = deque()
        self._queued_bytes = 0
        self._queue_bytes = queue_bytes
        self._cond = threading.Condition()
        self.busy_seconds = 0.0  # the writer thread's wall time in jobs and writes
        self.cpu_seconds = 0.0  # the writer thread's CPU time, set when it ends
        self.wait_seconds = 0.0  # training thread time spent waiting for room in the queue or the pipe
        self.sink: Sink | None = None
        self._child: _Child | None = None
        if writer == "process":
            self._child = _Child.start(self.config)
        else:
            self.sink = Sink(self.config)
        self.mode = writer
        self._thread: threading.Thread | None = None
        if self._child is None:
            self._thread = threading.Thread(target=self._work, name="lstm-probe-writer", daemon=True)
            self._thread.start()

    @property
    def inline(self) -> bool:
        """Whether :meth:`submit` runs jobs right away on the calling thread (with a writer process)."""
        return self._child is not None

    @property
    def capacity(self) -> int:
        """Rows per row group."""
        log = self.config["log"]
        return row_capacity(int(log["hidden_size"]), bool(log["vectors"]))

    # -- training thread -------------------------------------------------------------------------
    def submit(self, job: Callable[[], None], nbytes: int) -> None:
        """Run ``job``: with a writer process, here and now (its torch ops are few and its messages go
        into the pipe without waiting; a second Python thread would cost training more in interpreter
        lock hand-overs than the job itself); with a writer thread, queued for it (this blocks while
        the queued jobs hold more than the budget)."""
        if self.error is not None:
            raise self._failed()
        if self.closed:
            raise OutputError(f"the log {self.path} is already closed")
        if self._child is not None:
            self._run(job)
            if self.error is not None:
                raise self._failed()
            return
        with self._cond:
            if self._queued_bytes and self._queued_bytes + nbytes > self._queue_bytes:
                start = time.monotonic()
                while self._queued_bytes and self._queued_bytes + nbytes > self._queue_bytes and self.error is None:
                    self._cond.wait()
                self.wait_seconds += time.monotonic() - start
                if self.error is not None:
                    raise self._failed()
            self._queued_bytes += nbytes
            self._jobs.append(_Sized(job, nbytes))
            self._cond.notify_all()

    def _failed(self) -> OutputError:
        """The error to raise on the training thread once the writer has failed."""
        err = OutputError(f"cannot write the log {self.path}: {self.error}")
        err.__cause__ = self.error
        return err

    # -- writer thread ---------------------------------------------------------------------------
    def send(self, method: str, *args: Any) -> None:
        """Hand host arrays to the sink: ``Sink.<method>(*args)`` (inside a job: on the writer thread, or
        on the training thread with a writer process)."""
        if self.progress != self._sent_progress:
            self._sent_progress = dict(self.progress)
            self._to_sink("progress", self._sent_progress)
        self._to_sink(method, *args)

    def _to_sink(self, method: str, *args: Any) -> None:
        if self._child is not None:
            self.wait_seconds += self._child.send((method, args), self._queue_bytes)
        else:
            assert self.sink is not None
            getattr(self.sink, method)(*args)

    def _work(self) -> None:
        # Torch ops here (stacking states, the recovery's matmuls) must not start a second team of
        # intra-op threads next to training's: with two torch threads on two cores that doubled the run
        # time. The setting is per thread (OpenMP's and MKL's thread counts for the calling thread);
        # training's own thread count is untouched (tests/test_sb3.py checks results stay identical).
        import torch

        torch.set_num_threads(1)
        sink = self.sink  # the thread exists only without a writer process
        assert sink is not None
        flush_seconds = float(self.config["log"]["part_seconds"]) / 2
        while True:
            with self._cond:
                while not self._jobs:
                    timeout = flush_seconds - (time.monotonic() - sink.log.last_flush)
                    if timeout <= 0:
                        break
                    self._cond.wait(timeout)
                item = self._jobs.popleft() if self._jobs else _IDLE
            if item is None:  # close(): stop; close() finishes the log
                self.cpu_seconds = time.thread_time()  # this thread's CPU time, start to end
                return
            if item is _IDLE:  # small or idle logs too reach disk in bounded time
                self._run(sink.flush_if_due)
                continue
            self._run(item.job)
            with self._cond:
                self._queued_bytes -= item.nbytes
                self._cond.notify_all()
            self._run(sink.flush_if_due)

    def _run(self, fn: Callable[[], None]) -> None:
        if self.error is not None:
            return
        import torch

        start = time.perf_counter()
        try:
            with torch.no_grad():  # grad mode is per thread
                fn()
        except BaseException as exc:  # disk full, path removed, writer process gone: raised on training's thread
            if self._child is not None and not isinstance(exc, Exception):
                # Ctrl-C / SIGTERM landing in a job run inline (on the training thread): training's own
                # interrupt, not a writer failure. The pipe stays whole (each write is signal-held);
                # the job's rows not yet handed over are lost with it.
                raise
            self.error = exc
            with self._cond:
                self._cond.notify_all()
        finally:
            self.busy_seconds += time.perf_counter() - start  # reported for a writer thread only

    # -- end -------------------------------------------------------------------------------------
    def close(self, final: dict[str, Any]) -> Path:
        """Write what is left, record ``final`` (completed, stop_reason, ...) and publish the log."""
        if self.closed:
            return self.path
        self.closed = True
        if self._thread is not None:
            with self._cond:
                self._jobs.append(None)
                self._cond.notify_all()
            self._thread.join()
        if self.error is None and self.progress != self._sent_progress:
            self._run(lambda: self._to_sink("progress", dict(self.progress)))
        cost = {
            **final.get("probe_cost", {}),
            "writer": self.mode,
            # with a writer process, its own (added there); the jobs run inside the hooks and callbacks,
            # so their time on the training thread is in hook_seconds and integration_seconds
            "writer_cpu_seconds": self.cpu_seconds if self._thread is not None else 0.0,
            "writer_busy_seconds": self.busy_seconds if self._thread is not None else 0.0,
            "wait_seconds": round(self.wait_seconds, 4),
        }
        final = {**final, "probe_cost": cost}
        try:
            if self.error is not None:
                raise self.error
            if self._child is not None:
                self._child.close(final)
            else:
                assert self.sink is not None
                for key in ("writer_cpu_seconds", "writer_busy_seconds"):
                    cost[key] = round(cost[key], 4)
                self.sink.close(final)
        except BaseException as exc:
            if self._child is not None:
                self._child.kill()
            elif self.sink is not None:
                self.sink.log.abort()
            self.error = exc
            raise self._failed() from None
        return self.path


class _Sized:
    __slots__ = ("job", "nbytes")

    def __init__(self, job: Callable[[], None], nbytes: int):
        self.job, self.nbytes = job, nbytes


_IDLE: Any = object()
_HEADER = struct.Struct("<Q")


# -- the writer process ---------------------------------------------------------------------------


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM (the ones the training process turns into exceptions) for a few lines;
    they arrive right after."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


_IOV_MAX = 512  # buffers per writev (POSIX guarantees 16, Linux takes 1024)


class WriterGone(RuntimeError):
    """The writer process ended before the log was closed; the message says why (its own error when it
    reported one)."""


class _Child:
    """The training side of a writer process: messages are length-prefixed pickles on its stdin, its
    replies (ready, closed, error) come back on its stdout."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        self.stdout = proc.stdout
        self.fd = proc.stdin.fileno()
        os.set_blocking(self.fd, False)
        with contextlib.suppress(ImportError, AttributeError, OSError):  # Linux: a 1 MB pipe (default 64 kB)
            import fcntl

            fcntl.fcntl(self.fd, fcntl.F_SETPIPE_SZ, 1 << 20)
        self.backlog: deque[memoryview] = deque()
        self.backlog_bytes = 0

    @classmethod
    def start(cls, config: dict[str, Any]) -> _Child:
        # One core's worth of threads, and allocators that give memory back: the system allocator for
        # Arrow (its default mimalloc pool kept ~17 MB more), one glibc arena, and a fixed mmap threshold
        # (glibc raises it after large frees, and then row-group-sized buffers fragment its heap: measured,
        # +10 MB per GB written without it, flat with it).
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "ARROW_DEFAULT_MEMORY_POOL": "system",
            "MALLOC_ARENA_MAX": "1",
            "MALLOC_MMAP_THRESHOLD_": "65536",
        }
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lstm_probe.sink"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # it reports its errors as answers; the training process words them
                env=env,
            )
        except OSError as exc:
            raise OutputError(
                f"cannot start the writer process ({exc}); pass writer='thread' (--writer thread) to write "
                "from a thread of the training process"
            ) from None
        child = cls(proc)
        # No wait for an answer: the process opens the log while training starts (its imports take a
        # second). An error there (rare: the location was checked above) surfaces at the next hand-over.
        try:
            child.send(("open", (config,)), 0)
        except WriterGone as exc:
            raise OutputError(f"cannot start the writer process: {exc}") from None
        return child

    def send(self, message: tuple[str, tuple[Any, ...]], budget: int) -> float:
        """Write ``message`` into the pipe as far as it takes it without waiting; what does not fit waits
        in a backlog, written first by the next send. Waits only while the backlog holds more than
        ``budget`` bytes (the writer process is behind): returns the seconds waited."""
        # Pickle protocol 5 with out-of-band buffers: the state arrays go into the pipe straight from
        # their own memory (one copy, into the pipe), not through the pickle's bytes (two).
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        sizes = [len(data)] + [r.nbytes for r in raws]
        frame = [memoryview(struct.pack(f"<Q{len(sizes)}Q", len(sizes), *sizes)), memoryview(data), *raws]
        return self.pump(budget, frame)

    def pump(self, budget: int, frame: Sequence[memoryview] = ()) -> float:
        """Add ``frame`` to the backlog and write the backlog into the pipe (one ``writev`` per try); wait
        for room while it holds more than ``budget`` bytes."""
        waited = 0.0
        added = len(frame)
        while True:
            # A write and its bookkeeping happen together: a Ctrl-C/SIGTERM handler raising in between
            # would leave bytes written but still in the backlog, and the stream corrupt for close().
            with _signals_held():
                if frame:
                    self.backlog.extend(frame)
                    self.backlog_bytes += sum(f.nbytes for f in frame)
                    frame = ()
                if not self.backlog:
                    break
                try:
                    n = os.writev(self.fd, list(itertools.islice(self.backlog, _IOV_MAX)))
                except BlockingIOError:
                    n = 0
                except OSError:  # a broken pipe: the process ended; say why if it told
                    raise WriterGone(self.reply()[1]) from None
                self.backlog_bytes -= n
                while n:
                    head = self.backlog[0]
                    if n >= head.nbytes:
                        self.backlog.popleft()
                        n -= head.nbytes
                    else:
                        self.backlog[0] = head[n:]
                        n = 0
                if not self.backlog:
                    break
                done = self.backlog_bytes <= budget  # the rest can wait for the next send
                if done and added:
                    # What the pipe did not take yet must not alias the caller's memory: raw buffers are
                    # views of host arrays that can be views of live tensors (a layer's weights, which the
                    # next optimizer step changes in place; an input buffer the framework reuses). Copied
                    # now, they keep this moment's values. Older frames' leftovers were copied by their
                    # own send (the backlog is first in, first out: what is left of this frame is its end).
                    for i in range(max(0, len(self.backlog) - added), len(self.backlog)):
                        self.backlog[i] = memoryview(bytes(self.backlog[i]))
            if done:
                break
            start = time.monotonic()  # the pipe is full (waiting here stays interruptible)
            select.select([], [self.fd], [])
            waited += time.monotonic() - start
        return waited

    def reply(self) -> tuple[Any, ...]:
        head = self.stdout.read(_HEADER.size)
        if len(head) < _HEADER.size:
            code = self.proc.wait()
            return ("error", f"the writer process ended unexpectedly (exit code {code})")
        reply: tuple[Any, ...] = pickle.loads(self.stdout.read(_HEADER.unpack(head)[0]))
        return reply

    def close(self, final: dict[str, Any]) -> None:
        self.send(("close", (final,)), 0)
        reply = self.reply()
        self.proc.wait()
        if reply[0] != "closed":
            raise RuntimeError(reply[1])

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()


class _NoPandas:
    """Import finder that makes pandas unimportable in the writer process. pyarrow imports pandas on its
    first array conversion (to check for a Series) when pandas is installed; the writer never hands pandas
    objects to pyarrow, and the import cost it ~44 MB of private memory (measured with
    ``/proc/self/smaps_rollup``: 114 MB -> 70 MB for pyarrow alone after one conversion and one write)."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r} (kept out of the lstm-probe writer)", name=name)
        return None


def _serve() -> int:
    """The writer process: one sink, driven by the messages on stdin, until ``close`` or the pipe ends."""
    if "pandas" not in sys.modules:
        sys.meta_path.insert(0, _NoPandas)  # type: ignore[arg-type]
    # Replies go to the real stdout; anything else that prints goes to stderr.
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # A terminal's Ctrl-C reaches the whole process group; the training process decides when the log
    # ends (its close, or its death: the pipe closes).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    # Normal priority, on purpose: at the lowest (nice 19) a writer on a machine whose cores were all busy
    # got ~1.5% of a core, fell behind, and training waited for it: 222 s against 41 s at normal priority
    # (2048 steps at full capture beside two busy processes on two cores; 133 s of it waiting).
    inp = sys.stdin.buffer.fileno()
    sink: Sink | None = None
    busy = 0.0
    cpu0 = time.process_time()
    memory = _Memory()

    def answer(*reply: Any) -> None:
        data = pickle.dumps(reply)
        os.write(reply_fd, _HEADER.pack(len(data)) + data)

    def read(n: int) -> bytearray | None:
        """Exactly ``n`` bytes (writable: arrays unpickled onto them stay writable), None at the pipe's end."""
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = os.readv(inp, [view[got:]])
            if not k:
                return None
            got += k
        return buf

    def frame() -> tuple[Any, ...] | None:
        """One message: a count, the sizes, the pickle, its out-of-band buffers (see :meth:`_Child.send`)."""
        head = read(_HEADER.size)
        if head is None:
            return None
        count = _HEADER.unpack(head)[0]
        sizes_raw = read(8 * count)
        if sizes_raw is None:
            return None
        parts = [read(size) for size in struct.unpack(f"<{count}Q", sizes_raw)]
        if any(p is None for p in parts):
            return None
        message: tuple[Any, ...] = pickle.loads(parts[0], buffers=parts[1:])  # type: ignore[arg-type]
        return message

    while True:
        if sink is not None:
            timeout = max(0.0, sink.log.flush_seconds - (time.monotonic() - sink.log.last_flush))
            ready, _, _ = select.select([inp], [], [], timeout)
            if not ready:
                try:
                    sink.flush_if_due()
                except Exception as exc:
                    answer("error", _one_line(exc))
                    os._exit(1)  # no destructors: a half-written Parquet file would complain on stderr
                continue
        message = frame()
        if message is None:  # the training process is gone: keep what it handed over
            if sink is not None:
                with contextlib.suppress(Exception):
                    sink.log.abandon()
            return 0
        method, args = message
        start = time.perf_counter()
        try:
            if method == "open":
                sink = Sink(*args)
                cpu0 = time.process_time()
                continue
            assert sink is not None
            if method == "close":
                final = args[0]
                cost = final["probe_cost"]
                busy += time.perf_counter() - start
                cost["writer_busy_seconds"] = round(cost["writer_busy_seconds"] + busy, 4)
                cost["writer_cpu_seconds"] = round(cost["writer_cpu_seconds"] + time.process_time() - cpu0, 4)
                memory.sample()
                cost.update(memory.cost())
                sink.close(final)
                answer("closed")
                return 0
            getattr(sink, method)(*args)
            memory.sample_now_and_then()
        except Exception as exc:
            if sink is not None:
                with contextlib.suppress(Exception):
                    sink.log.abort()
            answer("error", _one_line(exc))
            os._exit(1)  # no destructors: a half-written Parquet file would complain on stderr
        busy += time.perf_counter() - start


class _Memory:
    """The writer process's peak memory, for ``probe_cost`` (Linux): its peak RSS (VmHWM, counting the
    shared libraries it maps like every process that loads them) and its peak private memory (sampled at
    most once a second: what it adds to the machine, libraries shared with training excluded)."""

    def __init__(self) -> None:
        self.private_kb = 0
        self.last = 0.0

    def sample_now_and_then(self) -> None:
        if time.monotonic() - self.last >= 1.0:
            self.sample()

    def sample(self) -> None:
        self.last = time.monotonic()
        with contextlib.suppress(OSError, ValueError):
            with open("/proc/self/smaps_rollup") as f:
                kb = sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean", "Private_Dirty")))
            self.private_kb = max(self.private_kb, kb)

    def cost(self) -> dict[str, float]:
        out: dict[str, float] = {}
        with contextlib.suppress(OSError, ValueError, StopIteration):
            with open("/proc/self/status") as f:
                out["writer_peak_rss_mb"] = round(next(int(s.split()[1]) for s in f if s.startswith("VmHWM")) / 1024, 1)
        if self.private_kb:
            out["writer_peak_private_mb"] = round(self.private_kb / 1024, 1)
        return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if isinstance(exc, OSError | BadInput) else f"{type(exc).__name__}: {text}"


if __name__ == "__main__":
    sys.exit(_serve())
