"""The TorchRL integration: probes on ``LSTMModule`` / ``GRUModule``, the TensorDict modules, so every
recurrent backend is seen.

TorchRL keeps the recurrent state in the TensorDict, not in the module: ``LSTMModule`` reads
``recurrent_state_h``/``_c`` and ``is_init`` and writes ``("next", "recurrent_state_h"/"_c")``, layout
(batch, steps, layers, hidden). In recurrent mode (``set_recurrent_mode(True)``: the loss, GAE) the "scan"
backend never calls ``nn.LSTM.forward`` and no backend returns the per-step states (zeros except at each
trajectory's end: torchrl/modules/tensordict_module/rnn.py, ``LSTMModule._lstm``). So the probe puts a
forward hook on the TensorDict module, reads what the call was given from the TensorDict, and re-runs it on
a shadow ``nn.LSTM``/``nn.GRU`` that shares the user's parameter tensors (no copy, no graph: under
``no_grad``, and never the user's module, whose own hooks would see it). The tracer core hooks the shadow
like any nn.LSTM: one-step calls, and packed multi-step calls whose per-step h and c it recovers exactly.

How a call is re-run (the semantics of torchrl's rnn.py ``LSTMModule.forward``):

- sequential mode (collection): the batch flattened, one step; the input state zeroed where ``is_init``;
- recurrent mode: each (batch, time) row split where ``is_init`` is set after its first step; every piece
  starts from the stored state of its first step (the "pad" backend: ``_split_and_pad_for_reset`` then
  ``_lstm`` from ``hidden0_in[..., 0, :, :]``; "scan": ``_lstm_scan_with_resets`` takes
  ``where(is_init, stored, carry)``: the same states). The pieces go to the shadow as one PackedSequence.

Provenance (the Grid) comes from the TensorDict: env = the collection batch index, ``step_count`` (TorchRL's
``StepCounter``) = the episode step, ``("collector", "traj_ids")`` (the collectors' default) links a
loss-time sample to the env column and episode it was collected in. The env step is the probe's own
per-env count of collection calls (a collector's ``rollout``); other sequential calls (an evaluation
``env.rollout(policy)``, the call a collector makes while it is built) are counted apart, per phase and
batch size, and never move the collection's counts. The episode starts are ``step_count == 0`` where it
is present (the truth, whatever ``is_init`` says), else ``is_init``.

Host copies: one per call (``_host``: is_init, step_count and the trajectory ids concatenated, one
``.cpu()``): the Grid is numpy and the core reads it while the shadow runs, so the values are needed at
once. A recurrent-mode call's indices are built on the device from ``is_init`` (``pieces_on_device``),
the pieces sorted longest first so that packing copies nothing and leaves no permutation to undo.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.contract import SEQ_REASON, Capabilities, Grid, Tags
from lstm_probe.errors import BadInput
from lstm_probe.life import Probe, Tagged
from lstm_probe.options import CaptureOptions, capture_options
from lstm_probe.schema import COLUMN
from lstm_probe.tracer import CoreTracer

_PHASE_OF_PACKAGE = (
    ("torchrl.objectives.value", "value"),  # GAE, TD(lambda): their value network runs in recurrent mode
    ("torchrl.objectives", "train"),  # a loss module
    ("torchrl.collectors", "rollout"),
)
_HELPERS = ("torchrl.modules", "torchrl.envs", "torchrl.objectives.utils", "torchrl.objectives.common", "torchrl._")
"""torchrl packages whose frames say nothing of the phase (modules, envs, helpers every phase calls)."""


def _phase(recurrent: bool) -> str:
    """The phase of a call, from the innermost torchrl collector / value estimator / loss frame on the
    stack (the module name of each frame's globals: a dict lookup a frame, no source read). A collector's
    call is collection ("rollout") only inside its ``rollout`` method: the call a collector makes while it
    is built (``_maybe_make_final_rollout``, which runs the policy once to learn its output keys) is "other"."""
    frame = sys._getframe(2)
    while frame is not None:
        mod = frame.f_globals.get("__name__", "")
        if mod.startswith("torchrl.") and not mod.startswith(_HELPERS):
            for prefix, phase in _PHASE_OF_PACKAGE:
                if mod.startswith(prefix):
                    return phase if phase != "rollout" or _in_rollout(frame) else "other"
        frame = frame.f_back  # type: ignore[assignment]
    return "train" if recurrent else "other"


def _in_rollout(frame: Any) -> bool:
    """Whether a collector frame here or further out is a collector's ``rollout`` (a collection step)."""
    while frame is not None:
        if frame.f_code.co_name == "rollout" and frame.f_globals.get("__name__", "").startswith("torchrl.collectors"):
            return True
        frame = frame.f_back
    return False


def find_modules(model: nn.Module | Iterable[nn.Module], names: list[str] | None = None) -> dict[str, nn.Module]:
    """Every ``LSTMModule``/``GRUModule`` in ``model`` (a module, or several: actor and critic), by the
    name it has in the first that holds it (one entry per module object: a shared one is probed once)."""
    from torchrl.modules import GRUModule, LSTMModule

    models = [model] if isinstance(model, nn.Module) else list(model)
    found: dict[str, nn.Module] = {}
    seen: set[int] = set()
    for i, m in enumerate(models):
        for name, sub in m.named_modules():
            if isinstance(sub, LSTMModule | GRUModule) and id(sub) not in seen:
                seen.add(id(sub))
                key = name or type(sub).__name__
                found[key if key not in found else f"{key}.{i}"] = sub
    if len(found) == 1:  # one module: called by its kind
        (only,) = found.values()
        found = {"lstm" if isinstance(only, LSTMModule) else "gru": only}
    if names is not None:
        missing = [n for n in names if n not in found]
        if missing:
            raise BadInput(f"no LSTMModule/GRUModule named {missing[0]!r}; here: {', '.join(found) or 'none'}")
        found = {n: found[n] for n in names}
    if not found:
        raise BadInput("no torchrl LSTMModule or GRUModule found in the given module(s)")
    return found


def shadow(rnn: nn.Module) -> nn.LSTM | nn.GRU:
    """An ``nn.LSTM``/``nn.GRU`` (batch first, no dropout) holding ``rnn``'s own parameter tensors: it
    computes with the user's current weights and changes nothing of them (the caller runs it without
    autograd). ``rnn``: torch's or torchrl's python-based ``LSTM``/``GRU`` (an ``nn.RNNBase``)."""
    mode = getattr(rnn, "mode", None)
    cls: type[nn.LSTM] | type[nn.GRU] = nn.LSTM if mode == "LSTM" else nn.GRU
    if mode not in ("LSTM", "GRU") or getattr(rnn, "bidirectional", False) or getattr(rnn, "proj_size", 0):
        raise BadInput(f"lstm-probe traces unidirectional LSTMs/GRUs without proj_size, not {rnn!r}")
    copy = cls(
        int(rnn.input_size),  # type: ignore[arg-type]
        int(rnn.hidden_size),  # type: ignore[arg-type]
        int(rnn.num_layers),  # type: ignore[arg-type]
        bias=bool(rnn.bias),
        batch_first=True,
        device="meta",
    )
    for name in copy._flat_weights_names:
        setattr(copy, name, getattr(rnn, name))  # RNNBase.__setattr__ refreshes _flat_weights
    return copy


def _rnn(m: nn.Module) -> nn.Module:
    inner = getattr(m, "lstm", None) or getattr(m, "gru", None)
    if not isinstance(inner, nn.Module):
        raise BadInput(f"{type(m).__name__} holds no .lstm or .gru module")
    return inner


class _Counts:
    """Per env column of one kind of sequential call: its step count, episode and episode step."""

    def __init__(self) -> None:
        self.env_step = np.zeros(0, np.int64)
        self.episode = np.full(0, -1, np.int64)
        self.episode_step = np.zeros(0, np.int64)

    def step(self, start: np.ndarray, step_count: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(env step, episode, episode step) of each column of one call, and the counts advanced."""
        n = len(start)
        if n > len(self.env_step):
            extra = n - len(self.env_step)
            self.env_step = np.r_[self.env_step, np.zeros(extra, np.int64)]
            self.episode = np.r_[self.episode, np.full(extra, -1, np.int64)]
            self.episode_step = np.r_[self.episode_step, np.zeros(extra, np.int64)]
        first = self.episode[:n] < 0
        new = start | first
        self.episode[:n] += new
        ep_step = step_count if step_count is not None else np.where(new, 0, self.episode_step[:n] + 1)
        self.episode_step[:n] = ep_step
        env_step = self.env_step[:n].copy()
        self.env_step[:n] += 1
        return env_step, self.episode[:n].copy(), ep_step


class _Envs:
    """One module's provenance of sequential calls: counts per (phase, batch size), so that only the
    collector's own calls advance the collection's env steps and episodes (an evaluation
    ``env.rollout(policy)``, phase "other", or a batch of another size counts apart), and per collector
    trajectory id the env column, episode and the env step of the episode's step 0 (collection only)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], _Counts] = {}
        # traj id -> (env, episode, env step of episode step 0); -1: not collected under the probe
        self.traj = np.full((1, 3), -1, np.int64)

    def collect(self, phase: str, start: np.ndarray, step_count: np.ndarray | None, traj: np.ndarray | None) -> Grid:
        n = len(start)
        counts = self.counts.get((phase, n))
        if counts is None:
            counts = self.counts[(phase, n)] = _Counts()
        env_step, episode, ep_step = counts.step(start, step_count)
        if phase == "rollout" and traj is not None and len(traj) and traj.min() >= 0:
            top = int(traj.max()) + 1
            if top > len(self.traj):
                self.traj = np.r_[self.traj, np.full((max(top, 2 * len(self.traj)) - len(self.traj), 3), -1, np.int64)]
            self.traj[traj, 0] = np.arange(n)
            self.traj[traj, 1] = episode
            self.traj[traj, 2] = env_step - ep_step
        return Grid.one_step(np.arange(n), env_step, episode, ep_step, start)

    def lookup(self, traj: np.ndarray | None, step_count: np.ndarray | None) -> tuple[np.ndarray, ...] | None:
        """(env, episode, env step) of loss-time samples, from their trajectory ids and step counts."""
        if traj is None or step_count is None:
            return None
        known = (traj >= 0) & (traj < len(self.traj))
        row = self.traj[np.where(known, traj, 0)]
        known &= row[:, 0] >= 0
        env = np.where(known, row[:, 0], -1)
        episode = np.where(known, row[:, 1], -1)
        env_step = np.where(known, row[:, 2] + step_count, -1)
        return env, episode, env_step


def _host(tensors: list[torch.Tensor | None], n: int) -> list[np.ndarray | None]:
    """Small integer tensors of ``n`` values each (is_init, step_count, traj ids) on the host as int64, in
    one copy per device: concatenated where they are, then one ``.cpu()`` (on a GPU the one sync of the
    call: the Grid, numpy, is built before the shadow runs, so the values are needed at once; on the CPU
    no copy at all)."""
    out: list[np.ndarray | None] = [None] * len(tensors)
    devices: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        if t is not None:
            devices.setdefault(t.device, []).append(i)
    for idx in devices.values():
        flat = torch.cat([tensors[i].detach().reshape(n).to(torch.int64) for i in idx])  # type: ignore[union-attr]
        host = flat.cpu().numpy()
        for k, i in enumerate(idx):
            out[i] = host[k * n : (k + 1) * n]
    return out


def pieces(init: np.ndarray, rows: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """A recurrent-mode call's pieces on the host: ``init`` (rows * steps,) is_init, each row split where
    it is set after the row's first step. Returns each piece's flat index of its first sample and its
    length, longest first (ties in batch order: a PackedSequence needs them sorted, and sorting here
    leaves the shadow's packed call no permutation for the core to undo)."""
    cut = init.reshape(rows, steps).astype(bool)
    cut[:, 0] = True
    first = np.flatnonzero(cut)
    row_end = (first // steps + 1) * steps
    lengths = np.minimum(np.r_[first[1:], rows * steps], row_end) - first
    order = np.argsort(-lengths, kind="stable")
    return first[order], lengths[order]


def pieces_on_device(
    is_init: torch.Tensor, rows: int, steps: int, count: int, longest: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pieces` computed where ``is_init`` is, with torch ops that never wait for the device (the
    piece count and the longest length, from the host copy, fix the shapes): each piece's first flat
    index (count,) and the (count, longest) flat indices of its samples, the padding repeating the
    first. The same pieces in the same order as :func:`pieces`."""
    dev = is_init.device
    n = rows * steps
    cut = is_init.detach().reshape(rows, steps).to(torch.bool).clone()
    cut[:, 0] = True
    piece = cut.reshape(n).cumsum(0) - 1
    pos = torch.arange(n, device=dev)
    first = torch.full((count,), n, dtype=torch.int64, device=dev).scatter_reduce_(0, piece, pos, "amin")
    lengths = torch.zeros(count, dtype=torch.int64, device=dev).scatter_add_(0, piece, torch.ones_like(pos))
    order = torch.sort(lengths, descending=True, stable=True).indices
    first, lengths = first[order], lengths[order]
    t = torch.arange(longest, device=dev)
    at = torch.where(t[None, :] < lengths[:, None], first[:, None] + t[None, :], first[:, None])
    return first, at


class TorchRLProbe(Probe, Tagged):
    """The TorchRL :class:`~lstm_probe.contract.Integration`: forward hooks on ``LSTMModule``/``GRUModule``
    that re-run each call on a shadow the tracer core hooks (module docstring). Use as a context manager,
    or ``start()`` / ``close()``. ``tag(epoch=..., minibatch=..., iteration=...)`` tags the calls of the
    loss loop (the phase and the collector batch are found without it)."""

    name = "torchrl"
    tag_keys = ("iteration", "epoch", "minibatch")
    tag_refusal = "a torchrl probe takes iteration, epoch, minibatch"

    def __init__(
        self,
        modules: dict[str, nn.Module],
        options: CaptureOptions,
        metadata: dict[str, Any] | None = None,
    ):
        import torchrl

        self.td_modules = dict(modules)
        self.shadows = {name: shadow(_rnn(m)) for name, m in modules.items()}
        self._lstm = {name: isinstance(s, nn.LSTM) for name, s in self.shadows.items()}
        self._metadata = {
            **(metadata or {}),
            "torchrl": {
                "version": torchrl.__version__,
                "modules": {
                    name: {
                        "type": type(m).__name__,
                        "recurrent_backend": str(getattr(m, "recurrent_backend", "pad")),
                        "in_keys": [str(k) for k in getattr(m, "in_keys", [])],
                        "dropout": float(getattr(self.shadows[name], "dropout", 0.0) or 0.0),
                    }
                    for name, m in modules.items()
                },
            },
        }
        self._envs = {name: _Envs() for name in modules}
        self._current: dict[str, Tags] = {}
        self._user: list[dict[str, Any]] = []
        self._epochs = False
        self.iteration = -1
        self._last_phase = ""
        self.unprobed: dict[str, int] = {}  # calls the probe could not read (keyword calls), per module
        self._handles: list[Any] = []
        self.tracer = CoreTracer(self.shadows, options, self)

    # -- the contract --------------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """framework 'torchrl': training sequences start from the states stored at collection."""
        return Capabilities("torchrl", epochs=self._epochs, stored_states=True)

    def metadata(self) -> dict[str, Any]:
        return dict(self._metadata)

    def resolve(self, module: str, steps: int, batch: int) -> Tags:
        tags = self._current.get(module)
        return tags if tags is not None else Tags("other")

    # -- lifecycle (start, close, with, tag: life.Probe and life.Tagged) -----------------------------
    def _attach(self) -> None:
        for name, m in self.td_modules.items():
            self._handles.append(m.register_forward_hook(self._make_hook(name)))

    def _detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _final(self) -> dict[str, Any]:
        return {"torchrl_unprobed_calls": dict(self.unprobed)} if self.unprobed else {}

    # -- the hook ------------------------------------------------------------------------------------
    def _make_hook(self, name: str) -> Any:
        from tensordict import TensorDictBase

        shadow_module = self.shadows[name]
        envs = self._envs[name]
        is_lstm = self._lstm[name]
        layers, hidden = int(shadow_module.num_layers), int(shadow_module.hidden_size)

        def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            start = time.perf_counter()
            core = self.tracer.hook_seconds
            td = args[0] if args else None
            if not isinstance(td, TensorDictBase) or self.tracer.writer is None:
                self.unprobed[name] = self.unprobed.get(name, 0) + 1
                return
            grad = torch.is_grad_enabled()
            torch.set_grad_enabled(False)
            try:
                self._call(name, mod, td, shadow_module, envs, is_lstm, layers, hidden)
            finally:
                torch.set_grad_enabled(grad)
                self._current.pop(name, None)
                spent = time.perf_counter() - start - (self.tracer.hook_seconds - core)
                self.tracer.integration_seconds += spent

        return hook

    def _tags(self, phase: str) -> Tags:
        if phase == "rollout" and self._last_phase != "rollout":
            self.iteration += 1  # a collector batch begins: the first collection call after training
        self._last_phase = phase
        user = self._user[-1] if self._user else {}
        it = user.get("iteration", self.iteration if self.iteration >= 0 else None)
        if phase == "rollout":
            return Tags(phase, iteration=it)
        return Tags(phase, iteration=it, epoch=user.get("epoch"), minibatch=user.get("minibatch"))

    def _call(
        self,
        name: str,
        mod: Any,
        td: Any,
        rnn: nn.LSTM | nn.GRU,
        envs: _Envs,
        is_lstm: bool,
        layers: int,
        hidden: int,
    ) -> None:
        keys = list(mod.in_keys)
        x = td.get(keys[0])
        h = td.get(keys[1], None)
        c = td.get(keys[2], None) if is_lstm else None
        is_init = td.get(keys[-1])
        recurrent = bool(mod.recurrent_mode)
        step_count = td.get("step_count", None)
        traj = td.get(("collector", "traj_ids"), None)
        feat = int(x.shape[-1])
        if not recurrent:  # sequential mode: rnn.py LSTMModule.forward, td.reshape(-1).unsqueeze(-1)
            n = td.numel()
            phase = _phase(False)
            init, sc, tr = _host([is_init, step_count, traj if phase == "rollout" else None], n)
            assert init is not None
            start = (sc == 0) if sc is not None else init.astype(bool)
            tags = self._tags(phase)
            tags.grid = envs.collect(phase, start.astype(bool), sc, tr)
            zero = is_init.reshape(n, 1, 1).bool()
            states = [
                torch.zeros(layers, n, hidden, dtype=x.dtype, device=x.device)
                if s is None
                else torch.where(zero, 0, s.reshape(n, layers, hidden)).transpose(0, 1).contiguous()
                for s in ((h, c) if is_lstm else (h,))
            ]
            self._current[name] = tags
            with warnings.catch_warnings():  # a shadow of cuDNN-flattened weights is not one contiguous chunk
                warnings.simplefilter("ignore", UserWarning)
                rnn(x.reshape(n, 1, feat), tuple(states) if is_lstm else states[0])
            return
        # recurrent mode: (B, T) rows, split where is_init is set after the first step; the pieces longest
        # first (the provenance on the host, the indices on the device: the same pieces, see pieces())
        steps = int(td.shape[-1]) if td.ndim else 1
        n = td.numel()
        rows = n // steps
        phase = _phase(True)
        tags = self._tags(phase)
        init, sc, tr = _host([is_init, step_count, traj], n)
        assert init is not None
        first, lengths = pieces(init, rows, steps)
        longest = int(lengths[0])
        at = np.where(
            np.arange(longest)[None, :] < lengths[:, None], first[:, None] + np.arange(longest), first[:, None]
        )
        first_d, at_d = pieces_on_device(
            is_init if is_init.device == x.device else is_init.to(x.device), rows, steps, len(first), longest
        )
        xs = x.reshape(n, feat)[at_d]  # (S, T', F): pack_padded_sequence skips the padding
        states = [
            torch.zeros(layers, len(first), hidden, dtype=x.dtype, device=x.device)
            if s is None
            else s.reshape(n, layers, hidden)[first_d].transpose(0, 1).contiguous()
            for s in ((h, c) if is_lstm else (h,))
        ]
        found = envs.lookup(tr, sc)
        ep_start = (sc == 0) if sc is not None else init.astype(bool)
        columns: dict[str, np.ndarray | None] = {
            "episode_start": ep_start[at],
            "episode_step": sc[at] if sc is not None else None,
        }
        if found is not None:
            env, episode, env_step = found
            columns.update(env=env[at], episode=episode[at], env_step=env_step[at])
        else:  # no trajectory ids: the row is the env column (a collector batch as it came)
            columns["env"] = np.broadcast_to((first // steps)[:, None], at.shape)
        reason = np.where(ep_start[first], "episode_start", np.where(first % steps == 0, "env_boundary", "split"))
        grid = Grid.of(
            {k: v.astype(COLUMN[k].dtype) for k, v in columns.items() if v is not None},
            train=True,
        )
        grid.seq_reason = np.array([SEQ_REASON[r] for r in reason.tolist()], COLUMN["seq_reason"].dtype)
        tags.grid = grid
        self._current[name] = tags
        # sorted already, lengths on the host: packing makes no device-to-host or host-to-device copy
        packed = nn.utils.rnn.pack_padded_sequence(xs, torch.from_numpy(lengths), batch_first=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            rnn(packed, tuple(states) if is_lstm else states[0])


def probe(
    model: nn.Module | Iterable[nn.Module],
    out: str | os.PathLike[str] | None = None,
    *,
    modules: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    options: CaptureOptions | None = None,
    **capture: Any,
) -> TorchRLProbe:
    """A probe on every ``LSTMModule``/``GRUModule`` in ``model`` (the policy; pass ``[actor, critic]``
    when the critic has its own), or those named in ``modules``. Use as a context manager around
    collection and training: ``with probe(policy, "run.parquet") as p: ...``. ``out`` and the capture
    keywords as for :func:`lstm_probe.trace`."""
    opts = capture_options(options, out, **capture)
    return TorchRLProbe(find_modules(model, modules), opts, metadata)
