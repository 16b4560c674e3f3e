"""Forward hooks on nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell that stream per-step states to a log.

The tracer knows no RL framework. Before or during each call it asks a *resolver* for the call's
:class:`Tags` (phase, iteration, epoch, minibatch) and :class:`Grid` (which env, env step and episode
each batch column and timestep belongs to). An integration (``lstm_probe.sb3``) supplies the resolver;
users of the generic tracer supply tags with :meth:`Tracer.tag`. The tracer turns a call into rows:
one per (layer, batch column, timestep), written into columnar buffers (see ``writer.py``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import platform
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.errors import BadInput
from lstm_probe.recover import gru_sequence_states, lstm_sequence_states, snapshot_weights
from lstm_probe.schema import BOOTSTRAPS, PATHS, PHASES, SCHEMA_VERSION, SEQ_REASONS, relative_l2
from lstm_probe.writer import LogWriter, Rows

RECURRENT_TYPES = (nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell)
CODES: dict[str, tuple[str, ...]] = {"phase": PHASES, "path": PATHS, "bootstrap": BOOTSTRAPS, "seq_reason": SEQ_REASONS}
PHASE = {p: i for i, p in enumerate(PHASES)}
PATH = {p: i for i, p in enumerate(PATHS)}
BOOTSTRAP = {b: i for i, b in enumerate(BOOTSTRAPS)}
SEQ_REASON = {r: i for i, r in enumerate(SEQ_REASONS)}
CAPTURES = ("full", "summary")
MAX_PENDING = 256
"""One-step calls kept before they are written as one block (bounds the memory they hold)."""


@dataclass
class Grid:
    """Provenance of one call's batch columns and timesteps: every array is (N, T); -1 means null.

    ``train`` grids also number sequences (seq = batch column, t = timestep) and carry each
    sequence's unpadded length and start reason, shape (N,).
    """

    env: np.ndarray
    env_step: np.ndarray
    episode: np.ndarray
    episode_step: np.ndarray
    episode_start: np.ndarray  # int8: -1 null, 0, 1
    padding: np.ndarray  # bool
    train: bool = False
    seq_len: np.ndarray | None = None
    seq_reason: np.ndarray | None = None
    worker: np.ndarray | None = None  # (N, T) int32, -1 null; None: null everywhere (one-process runs)
    bootstrap: np.ndarray | None = None  # (N, T) int8 code per cell; None: the call's Tags.bootstrap

    @property
    def shape(self) -> tuple[int, int]:
        n, t = self.env.shape
        return n, t

    @staticmethod
    def one_step(env: Any, env_step: Any, episode: Any, episode_step: Any, episode_start: Any) -> Grid:
        """The grid of a one-step call from per-column values (length-N arrays or scalars; -1 = null)."""
        env = np.asarray(env, np.int32).reshape(-1)
        n = len(env)

        def col(v: Any, dtype: Any) -> np.ndarray:
            return np.broadcast_to(np.asarray(v, dtype).reshape(-1), (n,))[:, None]

        return Grid(
            env=env[:, None],
            env_step=col(env_step, np.int64),
            episode=col(episode, np.int64),
            episode_step=col(episode_step, np.int64),
            episode_start=col(episode_start, np.int8),
            padding=np.zeros((n, 1), np.bool_),
        )

    def initial(self) -> Grid:
        """The one-column grid of the states a train call's sequences started from: the step before each
        sequence's first step (null env_step and episode_step where the sequence starts an episode)."""
        first = self.episode_step[:, :1]
        before = first > 0
        return Grid(
            env=self.env[:, :1],
            env_step=np.where(before, self.env_step[:, :1] - 1, -1),
            episode=self.episode[:, :1],
            episode_step=np.where(before, first - 1, -1),
            episode_start=np.full_like(self.episode_start[:, :1], -1),
            padding=self.padding[:, :1],
            train=True,
            seq_len=self.seq_len,
            seq_reason=self.seq_reason,
            worker=None if self.worker is None else self.worker[:, :1],
        )

    @staticmethod
    def concat(grids: list[Grid]) -> Grid:
        """Grids of non-train calls stacked along the batch axis."""
        if len(grids) == 1:
            return grids[0]

        def cat(field: str) -> np.ndarray:
            return np.concatenate([getattr(g, field) for g in grids])

        def cat_opt(field: str, fill: int, dtype: Any) -> np.ndarray | None:
            if all(getattr(g, field) is None for g in grids):
                return None
            return np.concatenate(
                [v if (v := getattr(g, field)) is not None else np.full(g.shape, fill, dtype) for g in grids]
            )

        return Grid(
            env=cat("env"),
            env_step=cat("env_step"),
            episode=cat("episode"),
            episode_step=cat("episode_step"),
            episode_start=cat("episode_start"),
            padding=cat("padding"),
            worker=cat_opt("worker", -1, np.int32),
            bootstrap=cat_opt("bootstrap", -1, np.int8),
        )


@dataclass
class Tags:
    """What a call is. ``stepwise`` counts the one-step calls each module made under these tags."""

    phase: str = "other"
    iteration: int | None = None
    epoch: int | None = None
    minibatch: int | None = None
    bootstrap: str | None = None
    grid: Grid | None = None
    stepwise: dict[str, int] = field(default_factory=dict)
    learner: int | None = None


Resolver = Callable[[str, int, int], Tags]


def _host(t: torch.Tensor) -> np.ndarray:
    """A detached tensor as a float32 numpy array (one device-to-host copy when it is not on the CPU)."""
    t = t.detach()
    if t.dtype != torch.float32:
        t = t.float()
    return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.nelement() * t.element_size() for t in tensors if t is not None)


def _opt(v: int | None) -> int:
    return -1 if v is None else v


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
    import pyarrow

    versions = {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pyarrow": pyarrow.__version__,
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


class Tracer:
    """Hooks recurrent modules and writes their per-step states to a log.

    Use :func:`trace` (generic) or ``ProbeCallback`` (sb3) rather than building one directly.
    """

    def __init__(
        self,
        modules: Mapping[str, nn.Module],
        out: str | Path,
        metadata: dict[str, Any] | None = None,
        *,
        capture: str = "full",
        every: int = 1,
        float16: bool = False,
        force: bool = False,
        reference_window: int = 0,
        initial_states: bool = False,
        call_base: int = 0,
        part_seconds: float = 60.0,
        resolver: Resolver | None = None,
        shard: str | None = None,
    ):
        if capture not in CAPTURES:
            raise BadInput(f"capture must be one of {', '.join(CAPTURES)}, not {capture!r}")
        if every < 1:
            raise BadInput(f"every must be >= 1, not {every}")
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
        self.capture, self.every, self.float16 = capture, every, float16
        self.layers = {n: int(getattr(m, "num_layers", 1)) for n, m in self.modules.items()}
        self.metadata: dict[str, Any] = {
            **base_metadata(),
            "framework": "generic",
            "architecture": {"modules": describe_modules(self.modules)},
            "hidden_size": self.hidden,
            "capture": {"mode": capture, "every": every, "dtype": "float16" if float16 else "float32"},
            **(metadata or {}),
        }
        self.out, self.force, self.part_seconds = out, force, part_seconds
        self.reference_window = reference_window
        self.initial_states = initial_states
        self.shard = shard
        self.refs: dict[str, References] = {}
        self.resolver: Resolver = resolver or self._user_tags
        self._tag_stack: list[dict[str, Any]] = []
        self._tag_cache: dict[tuple[int, int, int], Tags] = {}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self.writer: LogWriter | None = None
        self.calls = 0
        self.call_base = call_base  # first call id: keeps ids unique across the processes of one log
        self.unsupported_calls = 0
        # what the probe costs, measured while it runs (see the log's `probe_cost` metadata)
        self.hook_seconds = 0.0  # training thread, inside the hooks
        self.integration_seconds = 0.0  # training thread, in an integration's own callbacks (sb3, RLlib)
        self.started = time.monotonic()
        # one-step calls waiting to be written as one block: (call, grid, h (L, N, H), c) with detached tensors
        self._pending: dict[str, list[tuple[int, Grid | None, torch.Tensor, torch.Tensor | None]]] = {}
        self._pending_tags: Tags | None = None
        self._pending_key: tuple[Any, ...] | None = None
        self._stepwise_tags: Tags | None = None  # the open per-timestep block's tags (hook fast path)
        self._resolved: Tags | None = None  # tags the hook already asked the resolver for

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Tracer:
        """Open the log and attach the hooks."""
        self.started = time.monotonic()
        self.writer = LogWriter(
            self.out,
            self.hidden,
            self.names,
            self.metadata,
            CODES,
            float16=self.float16,
            force=self.force,
            part_seconds=self.part_seconds,
            shard=self.shard,
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
        reason = None if exc is None else f"{exc_type.__name__}: {exc}".splitlines()[0]
        self.close(completed=exc is None, stop_reason=reason)

    # -- generic tagging -------------------------------------------------------------------------
    @contextlib.contextmanager
    def tag(self, **tags: Any) -> Iterator[None]:
        """Tag every call inside the block: phase, iteration, epoch, minibatch, env, env_step, episode,
        episode_step, episode_start (scalars, or arrays with one value per batch column).
        Nested blocks add to and override the outer ones."""
        unknown = set(tags) - {
            "phase",
            "iteration",
            "epoch",
            "minibatch",
            "env",
            "env_step",
            "episode",
            "episode_step",
            "episode_start",
        }
        if unknown:
            raise BadInput(
                f"unknown tag {sorted(unknown)[0]!r}; tags are phase, iteration, epoch, minibatch, "
                "env, env_step, episode, episode_step, episode_start"
            )
        if "phase" in tags and tags["phase"] not in PHASE:
            raise BadInput(f"phase must be one of {', '.join(PHASES)}, not {tags['phase']!r}")
        merged = {**(self._tag_stack[-1] if self._tag_stack else {}), **tags}
        self._tag_stack.append(merged)
        try:
            yield
        finally:
            self._tag_stack.pop()
            self._tag_cache.clear()

    def _user_tags(self, name: str, steps: int, batch: int) -> Tags:
        """Tags of a call from the innermost ``tag()`` block. A tag given as an (N, T) or (1, T) array
        with T > 1 describes a sequence; one-step calls inside the block then walk along it (a
        per-timestep loop over a sequence batch, path 'stepwise')."""
        user = self._tag_stack[-1] if self._tag_stack else {}
        prov = {
            k: user[k]
            for k in ("env", "env_step", "episode", "episode_step", "episode_start")
            if user.get(k) is not None
        }
        width = max([steps] + [np.shape(v)[-1] for v in prov.values() if np.ndim(v) == 2])
        key = (id(user), batch, width)
        cached = self._tag_cache.get(key)
        if cached is not None:
            return cached
        tags = Tags(
            phase=user.get("phase", "other"),
            iteration=user.get("iteration"),
            epoch=user.get("epoch"),
            minibatch=user.get("minibatch"),
        )
        if prov or tags.phase == "train":

            def col(key: str, dtype: Any) -> np.ndarray:
                if key not in prov:
                    return np.full((batch, width), -1, dtype)
                v = np.asarray(prov[key]).astype(dtype)
                if v.ndim == 1:
                    v = v[:, None]
                try:
                    return np.broadcast_to(v, (batch, width))
                except ValueError:
                    raise BadInput(
                        f"tag {key} has shape {np.shape(prov[key])}, which does not fit a call of "
                        f"batch {batch} over {width} step(s); give a scalar, ({batch},), ({batch}, "
                        f"{width}) or (1, {width})"
                    ) from None

            tags.grid = Grid(
                env=col("env", np.int32),
                env_step=col("env_step", np.int64),
                episode=col("episode", np.int64),
                episode_step=col("episode_step", np.int64),
                episode_start=col("episode_start", np.int8),
                padding=np.zeros((batch, width), np.bool_),
                train=tags.phase == "train",
            )
            if tags.grid.train:
                tags.grid.seq_len = np.full(batch, width, np.int32)
                tags.grid.seq_reason = np.full(batch, -1, np.int8)
        self._tag_cache[key] = tags
        return tags

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
                        items = pending.get(name)
                        if items is None:
                            items = pending[name] = []
                        items.append((call, None, hn.detach(), cn.detach() if cn is not None else None))
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
                # The recovery runs later on the writer thread: copy what the caller may still change in
                # place (its input and states, the weights an optimizer step updates); y is the call's own
                # fresh output.
                x, h0, c0 = x.clone(), h0.detach().clone(), c0.detach().clone()
                weights = snapshot_weights(module, top=is_lstm)  # type: ignore[arg-type]
                initial_states = self.initial_states

                def states() -> tuple[np.ndarray, np.ndarray | None, tuple[np.ndarray, np.ndarray | None] | None]:
                    cs: np.ndarray | None = None
                    if is_lstm:
                        hs4, cs4 = lstm_sequence_states(module, x, h0, c0, y, weights)  # type: ignore[arg-type]
                        hs, cs = hs4.transpose(0, 2, 1, 3), cs4.transpose(0, 2, 1, 3)
                    else:
                        hs = gru_sequence_states(module, x, h0, y, weights).transpose(0, 2, 1, 3)  # type: ignore[arg-type]
                    initial = None
                    if initial_states:
                        initial = (_host(h0)[:, :, None, :], _host(c0)[:, :, None, :] if is_lstm else None)
                    return hs, cs, initial

                layers = int(module.num_layers)
                nbytes = 2 * layers * _nbytes(y) + _nbytes(x, h0, c0, *(w for ws in weights for w in ws))
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
        states: Callable[[], tuple[np.ndarray, np.ndarray | None, Any]] | None = None,
        nbytes: int = 0,
    ) -> None:
        """Take one call. One-step calls bring their detached (L, N, H) states ``h``/``c``; multi-step
        calls bring ``states``, run on the writer thread, which returns (hs, cs, initial): (L, N, T', H)
        arrays of the states after each step and, when the tracer keeps them, the initial states.

        One-step calls are kept and written in blocks: the steps of a per-timestep loop over a
        sequence batch (sb3's 'stepwise' path) along the time axis, consecutive one-step calls with the
        same tags (rollout steps) along the batch axis. A block is handed to the writer thread when the
        tags change, when it holds MAX_PENDING calls, and at close; this thread only keeps references.
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
        if steps == 1 and grid is not None and grid.shape[1] > 1:
            key = ("stepwise", id(tags))
            tags.stepwise[name] = tags.stepwise.get(name, 0) + 1
        elif steps == 1 and (grid is None or (not grid.train and grid.shape == (batch, 1))):
            key = (
                "step",
                tags.phase,
                tags.iteration,
                tags.epoch,
                tags.minibatch,
                tags.bootstrap,
                tags.learner,
                grid is None,
            )
        if key is None:
            self.flush_pending()
            path = PATH["sequence"] if steps > 1 else PATH["step"]

            def job() -> None:
                initial = None
                if states is not None:
                    hs, cs, initial = states()
                else:  # a one-step call that fits no block
                    assert h is not None
                    hs = _host(h)[:, :, None, :]
                    cs = _host(c)[:, :, None, :] if c is not None else None
                self._write(writer, name, code, tags, 0, path, np.full(batch * steps, call, np.int64), hs, cs)
                if initial is not None and grid is not None and grid.train and grid.shape[0] == batch:
                    # The state each sequence started from, as rows with t = -1 (see the schema's `t`).
                    start = Tags(tags.phase, tags.iteration, tags.epoch, tags.minibatch, grid=grid.initial())
                    start.learner = tags.learner
                    ids = np.full(batch, call, np.int64)
                    self._write(writer, name, code, start, 0, path, ids, initial[0], initial[1], t=-1)

            writer.submit(job, nbytes or _nbytes(h, c))
            return
        if key != self._pending_key:
            self.flush_pending()
            self._pending_key, self._pending_tags = key, tags
            if key[0] == "stepwise":
                self._stepwise_tags = tags
        items = self._pending.setdefault(name, [])
        items.append((call, grid, h, c))  # type: ignore[arg-type]
        if len(items) >= MAX_PENDING and key[0] == "step":
            self.flush_pending()

    def flush_pending(self) -> None:
        """Hand the kept one-step calls to the writer thread (see :meth:`_emit`)."""
        pending, tags, key = dict(self._pending), self._pending_tags, self._pending_key
        self._pending.clear()  # the same dict object: the hooks hold it
        self._pending_tags, self._pending_key, self._stepwise_tags = None, None, None
        writer = self.writer
        if tags is None or key is None or writer is None:
            return
        stepwise = key[0] == "stepwise"
        for name, items in pending.items():
            t0 = tags.stepwise.get(name, len(items)) - len(items) if stepwise else 0
            _, _, h, c = items[0]
            job = functools.partial(self._write_block, writer, name, tags, stepwise, t0, items)
            writer.submit(job, len(items) * _nbytes(h, c))

    def _write_block(self, writer: LogWriter, name: str, tags: Tags, stepwise: bool, t0: int, items: list[Any]) -> None:
        """Rows of one block of one-step calls (writer thread)."""
        code = self.module_code[name]
        calls = np.array([c for c, _, _, _ in items], np.int64)
        c_list = [c for _, _, _, c in items if c is not None]
        with_c = len(c_list) == len(items)
        if stepwise:
            hs = _host(torch.stack([h for _, _, h, _ in items], dim=2))  # (L, N, T', H)
            cs = _host(torch.stack(c_list, dim=2)) if with_c else None
            per_col = np.tile(calls, hs.shape[1])  # (N * T',) in column-major order: n, then t
            self._write(writer, name, code, tags, t0, PATH["stepwise"], per_col, hs, cs)
            return
        hs = _host(torch.cat([h for _, _, h, _ in items], dim=1))[:, :, None, :]  # (L, sum N, 1, H)
        cs = _host(torch.cat(c_list, dim=1))[:, :, None, :] if with_c else None
        per_col = np.repeat(calls, [h.shape[1] for _, _, h, _ in items])
        block = tags
        if items[0][1] is not None:
            block = Tags(
                tags.phase,
                tags.iteration,
                tags.epoch,
                tags.minibatch,
                tags.bootstrap,
                grid=Grid.concat([g for _, g, _, _ in items if g is not None]),
                learner=tags.learner,
            )
        self._write(writer, name, code, block, 0, PATH["step"], per_col, hs, cs)

    def _write(
        self,
        writer: LogWriter,
        name: str,
        code: int,
        tags: Tags,
        t0: int,
        path: int,
        call: np.ndarray,
        hs: np.ndarray,
        cs: np.ndarray | None,
        t: int | None = None,
    ) -> None:
        """Rows of one call (or of one per-timestep loop): hs/cs (L, N, T', H), rows ordered layer, column, t.
        ``t`` overrides the rows' step column (-1 for the initial-state rows). Writer thread only."""
        grid = tags.grid
        layers, batch, steps = hs.shape[0], hs.shape[1], hs.shape[2]
        per_layer = batch * steps
        n = layers * per_layer
        r, i0 = writer.reserve(n)
        i1 = i0 + n
        r.call[i0:i1] = np.tile(call, layers) if layers > 1 else call
        r.module[i0:i1] = code
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
            self._fill_null(r, i0, i1)
        if t is not None:
            r.t[i0:i1] = t
        r.h[i0:i1] = hs.reshape(n, -1)
        if cs is not None:
            r.c[i0:i1] = cs.reshape(n, -1)
            r.has_c[i0:i1] = True
        else:
            r.c[i0:i1] = 0.0
            r.has_c[i0:i1] = False
        it = tags.iteration
        r.vectors[i0:i1] = self.capture == "full" and (it is None or it % self.every == 0)
        r.has_drift[i0:i1] = False
        if self.reference_window and grid is not None and tags.phase in ("rollout", "train"):
            self._drift(name, layers, r, i0, i1, tags.phase == "rollout", cs is not None)
        writer.commit(n)

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
    def _fill_null(r: Rows, i0: int, i1: int) -> None:
        for col in (
            r.worker,
            r.env,
            r.env_step,
            r.episode,
            r.episode_step,
            r.episode_start,
            r.seq,
            r.seq_len,
            r.seq_reason,
        ):
            col[i0:i1] = -1
        r.t[i0:i1] = 0
        r.padding[i0:i1] = False

    def _drift(self, name: str, layers: int, r: Rows, i0: int, i1: int, rollout: bool, has_c: bool) -> None:
        ref = self.refs.get(name)
        if ref is None:
            ref = self.refs[name] = References(self.reference_window, layers, self.hidden)
        layer = r.layer[i0:i1].astype(np.intp)
        env, step = r.env[i0:i1].astype(np.intp), r.env_step[i0:i1]
        if rollout:
            ref.store(layer, env, step, r.h[i0:i1], r.c[i0:i1])
            return
        dh, dc, found = ref.drift(layer, env, step, r.h[i0:i1], r.c[i0:i1])
        r.drift_h[i0:i1] = dh
        r.drift_c[i0:i1] = dc
        r.has_drift[i0:i1] = found


def trace(
    model: nn.Module,
    out: str | Path = "run.parquet",
    *,
    modules: list[str] | None = None,
    capture: str = "full",
    every: int = 1,
    float16: bool = False,
    force: bool = False,
    reference_window: int = 0,
    metadata: dict[str, Any] | None = None,
    shard: str | None = None,
) -> Tracer:
    """Trace every nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell in ``model`` (or those named in ``modules``).

    Use as a context manager; tag calls with ``probe.tag(phase=..., iteration=..., env=..., ...)``.
    ``reference_window`` > 0 keeps that many env steps of rollout states per env so train rows get
    ``drift_h`` / ``drift_c`` against the rollout state of the same (env, env_step).
    ``shard`` names this process's part files when several processes (workers) write one directory log
    (``out`` ending in ``/``); readers then take the directory as one log.
    """
    return Tracer(
        find_recurrent(model, modules),
        out,
        metadata,
        capture=capture,
        every=every,
        float16=float16,
        force=force,
        reference_window=reference_window,
        shard=shard,
    )
