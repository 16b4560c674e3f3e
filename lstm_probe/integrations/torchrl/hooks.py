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

What the core records (the semantics of torchrl's rnn.py ``LSTMModule.forward``):

- sequential mode (collection): the batch flattened, one step, the input state zeroed where ``is_init``;
  the states are the ones TorchRL returned (``("next", ...)``), which the shadow's call hands the core
  (re-run only with dropout in effect): bit for bit the states the next step starts from, whatever
  computed them (cuDNN, ATen, torchrl's python-based LSTM/GRU);
- recurrent mode: each (batch, time) row split where ``is_init`` is set after its first step; every piece
  starts from the stored state of its first step (the "pad" backend: ``_split_and_pad_for_reset`` then
  ``_lstm`` from ``hidden0_in[..., 0, :, :]``; "scan": ``_lstm_scan_with_resets`` takes
  ``where(is_init, stored, carry)``: the same states). The pieces go to the shadow as one PackedSequence;
  samples TorchRL marks as padding (``("collector", "mask")``) are in none (samples.py).

Provenance (the Grid) comes from the TensorDict: env = the collection batch index, ``step_count`` (TorchRL's
``StepCounter``) = the episode step, ``("collector", "traj_ids")`` (the collectors' default) links a
loss-time sample to the env column and episode it was collected in; a value estimator's calls, whose
TensorDicts hold the network's in_keys only, take them from the batch the estimator was given (samples.py
``gae_batch``), its pass over ``data["next"]`` as next observations. The env step is the probe's own
per-env count of collection calls (a collector's ``rollout``); other sequential calls (an evaluation
``env.rollout(policy)``, the call a collector makes while it is built) are counted apart, per phase and
batch size, and never move the collection's counts. The episode starts are ``step_count == 0`` where it
is present (the truth, whatever ``is_init`` says), else ``is_init``.

Host copies: none per call. A sequential call's is_init, step counts and trajectory ids are staged on their
device (one small int64 snapshot, ``StagedCall``; its kept observation likewise) and its Grid made with the
env and env step (the probe's own counts) and the episode columns still to fill. A recurrent-mode call is
staged whole (recurrent.py ``StagedRecurrent``: copies of its input, stored states, the weights it ran with
and its int64 is_init, step counts, trajectory ids, mask and the estimator's pass flags), because its pieces'
number and lengths shape the packed call the shadow re-runs (TorchRL's "pad" backend reads the same split on
the host, torchrl/modules/tensordict_module/rnn.py ``_split_and_pad_for_reset``). Every staged call settles
in call order, all with one copy per device (samples.host), where the values are first needed: before the
core hands a kept block over (``CoreTracer.before_hand_over``, which reads the grids), at the first
sequential call after recurrent-mode ones (before it reaches the core, which numbers and writes the calls in
call order: the next collector batch), and at close. A sequential call's grid is then filled with the same
values a per-call copy gave (under ``--other-envs none`` the core's grid of the kept columns is a view of it:
``Grid.take``); a recurrent-mode call is replayed: its pieces and provenance from the host values, its
indices built on the device from ``is_init`` (``pieces_on_device``), the pieces sorted longest first so that
packing copies nothing and leaves no permutation to undo, re-run on the shadow holding the staged weights.
tests/test_torchrl_transfer.py counts the copies: one per collector batch (two with kept observations),
0.007 per LSTM call over a 4-batch, 128-step-batch run (0.072 with one copy per recurrent-mode call, 5.26
with one per call, counted the same way).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.capture.life import Probe, Tagged
from lstm_probe.capture.modules import Modes, base_metadata
from lstm_probe.capture.returns import Live
from lstm_probe.capture.tracer import CoreTracer
from lstm_probe.contract import Capabilities, Tags
from lstm_probe.errors import BadInput
from lstm_probe.integrations.torchrl import memory, whatif
from lstm_probe.integrations.torchrl.names import located
from lstm_probe.integrations.torchrl.recurrent import (
    StagedRecurrent,
    cudnn_quiet,
    holding,
    staged_budget,
    staged_bytes,
)
from lstm_probe.integrations.torchrl.returns import BatchReturns
from lstm_probe.integrations.torchrl.samples import Envs, StagedCall, estimator_batch, gae_batch, host, rows_on_host
from lstm_probe.integrations.torchrl.shadow import inner_rnn as _rnn
from lstm_probe.integrations.torchrl.shadow import shadow
from lstm_probe.options import CaptureOptions, Measure, capture_options, route, settle

_PHASE_OF_PACKAGE = (
    ("torchrl.objectives.value", "value"),  # GAE, TD(lambda): their value network runs in recurrent mode
    ("torchrl.objectives", "train"),  # a loss module
    ("torchrl.collectors", "rollout"),
)
OTHER_FRAMEWORKS = ("stable_baselines3", "sb3_contrib", "ray")
UNLINKED = (
    "the loss's samples carry no step_count, which links each to its collection step: add torchrl's StepCounter() "
    "to the env's transforms, beside InitTracker()"
)
"""Why train rows carry no env step where a loss call's samples have no ``step_count`` (metadata ``not_measurable``)."""
"""Packages the core's version list names where installed; a TorchRL log's list leaves them out."""
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


class TorchRLProbe(Probe, Tagged):
    """The TorchRL :class:`~lstm_probe.contract.Integration`: forward hooks on ``LSTMModule``/``GRUModule``
    that re-run each call on a shadow the tracer core hooks (module docstring). Use as a context manager,
    or ``start()`` / ``close()``. ``tag(epoch=..., minibatch=..., iteration=...)`` tags the calls of the
    loss loop (the phase and the collector batch are found without it). ``measure`` (what_if, memory), ``loss``,
    ``optimizer``, ``epochs``, ``minibatches``: see :func:`probe` and :meth:`measure_batch`."""

    name = "torchrl"
    tag_keys = ("iteration", "epoch", "minibatch")
    tag_refusal = "a torchrl probe takes iteration, epoch, minibatch"

    def __init__(
        self,
        modules: dict[str, nn.Module],
        options: CaptureOptions,
        metadata: dict[str, Any] | None = None,
        *,
        measure: Measure | None = None,
        loss: Any = None,
        optimizer: Any = None,
        epochs: int = 1,
        minibatches: int = 1,
        paths: dict[str, str] | None = None,
    ):
        import tensordict
        import torchrl

        self.td_modules = dict(modules)
        self._inner = {name: _rnn(m) for name, m in modules.items()}
        self.shadows = {name: shadow(inner) for name, inner in self._inner.items()}
        self._lstm = {name: isinstance(s, nn.LSTM) for name, s in self.shadows.items()}
        versions = {k: v for k, v in base_metadata()["versions"].items() if k not in OTHER_FRAMEWORKS}
        self._metadata = {
            **(metadata or {}),
            "versions": {**versions, "torchrl": torchrl.__version__, "tensordict": tensordict.__version__},
            "torchrl": {
                "version": torchrl.__version__,
                "modules": {
                    name: {
                        "type": type(m).__name__,
                        "recurrent_backend": str(getattr(m, "recurrent_backend", "pad")),
                        "in_keys": [str(k) for k in getattr(m, "in_keys", [])],
                        "dropout": float(getattr(self._inner[name], "dropout", 0.0) or 0.0),
                    }
                    | ({"path": paths[name]} if paths and name in paths else {})
                    for name, m in modules.items()
                },
            },
        }
        # capture_obs: collection rows keep the recurrent module's input (its first in_key: the observation where
        # the module reads it, as the run's does), flattened; a module of another input width keeps none
        self.obs_size: int | None = None
        m = measure or Measure()
        if m.capture_obs:
            first: Any = next(iter(self._inner.values()))
            self.obs_size = int(first.input_size)
            self._metadata["obs_size"] = self.obs_size
        self._envs = {name: Envs() for name in modules}
        self._unlinked = False  # a loss call's samples without step_count: no env step, no drift (UNLINKED)
        self._current: dict[str, Tags] = {}
        # calls whose provenance waits for its values on the host, in call order (_settle); the bytes the
        # recurrent-mode ones hold on their device (none: no recurrent-mode call waits)
        self._staged: list[StagedCall | StagedRecurrent] = []
        self._waiting, self._epochs, self.iteration = 0, False, -1
        self._user: list[dict[str, Any]] = []
        self.batch_returns = BatchReturns()  # each collector batch's episodes (returns.py)
        self._last_phase = ""
        self.frames = 0  # env steps collected under the probe (the collection calls' batch sizes)
        self.unprobed: dict[str, int] = {}  # calls the probe could not read (keyword calls), per module
        self._handles: list[Any] = []
        # in_keys a module also writes (``in_key == out_key``, TorchRL's recurrent-DQN tutorial's "embed"): the
        # call's TensorDict holds its output there once it returns, so a pre-hook keeps what it was given
        self._rewritten = {
            name: [k for k in getattr(m, "in_keys", []) if k in list(getattr(m, "out_keys", []))]
            for name, m in modules.items()
        }
        self._given: dict[str, dict[Any, Any]] = {}
        # TorchRL's own states of a sequential call, which the shadow's call returns (see _sequential)
        self._returned: dict[str, Any] = {}
        for name, s in self.shadows.items():
            s.register_forward_hook(self._returns(name), prepend=True)
        # no reference_window given: the first collection call sets it from its collector (see _window)
        self._window_from_collector = not options.reference_window
        # what-if and the memory horizon on one private copy of the user's ClipPPOLoss (whatif.py, memory.py)
        asked_w, asked_m = whatif.settings(m), memory.settings(m)
        if (asked_w or asked_m) and loss is None:
            raise BadInput("what_if and memory on TorchRL re-run the loss: pass loss= (the ClipPPOLoss) and optimizer=")
        copy: Any = whatif.Copy(loss, self.td_modules) if asked_w or asked_m else None
        sizes: dict[str, Any] = {"epochs": epochs, "minibatches": minibatches, "gradient": optimizer is not None}
        self.what_if = whatif.WhatIf(copy, **sizes, **asked_w) if asked_w else None
        self.memory = memory.Memory(copy, **asked_m) if asked_m else None
        self._optimizer, self._memory_at = optimizer, -1
        self._live = [Live(k, v.metadata) for k, v in (("what_if", self.what_if), ("memory", self.memory)) if v]
        # the loss the training calls run in, once found on the stack: what-if and memory re-run a ClipPPOLoss only,
        # so a run of another loss (a DQNLoss) declares neither and says why (whatif.refused)
        self._loss_looks = 8  # the first train calls look for it (a hand-written loss: none, and the look stops)
        self._refused: str | None = None
        self.tracer = CoreTracer(self.shadows, options, self)
        self.tracer.before_hand_over = self._settle_staged
        for name, entry in self.tracer.metadata["architecture"]["modules"].items():  # the user's, not the shadow's
            entry["dropout"] = self._metadata["torchrl"]["modules"][name]["dropout"]
        # the user's modules' mode (the shadows have no dropout), counted by the hook as each call runs: a
        # recurrent-mode call reaches the core when replayed, later, perhaps in another mode (Modes)
        self.tracer.modes = Modes(self._inner)

    # -- the contract --------------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """framework 'torchrl': training sequences start from the states stored at collection; a batch can be
        re-run on a copy of the loss (whatif.py, memory.py)."""
        caps: dict[str, Any] = dict.fromkeys(("stored_states", "replay", "respond", "observe", "returns"), True)
        if self._refused:  # the run's loss is not one they re-run
            caps |= {"replay": False, "respond": False}
        if self.batch_returns.why:  # no collector batch it could read (returns.py)
            caps["returns"] = False
        return Capabilities("torchrl", epochs=self._epochs, **caps)

    def metadata(self) -> dict[str, Any]:
        return dict(self._metadata)

    def resolve(self, module: str, steps: int, batch: int) -> Tags:
        tags = self._current.get(module)
        return tags if tags is not None else Tags("other")

    # -- lifecycle (start, close, with, tag: life.Probe and life.Tagged) -----------------------------
    def _attach(self) -> None:
        for name, m in self.td_modules.items():
            if self._rewritten[name]:
                self._handles.append(m.register_forward_pre_hook(self._make_pre_hook(name)))
            self._handles.append(m.register_forward_hook(self._make_hook(name)))
        if self.what_if is not None and self._optimizer is not None:  # the gradient the optimizer steps with
            self._handles.append(self._optimizer.register_step_pre_hook(self.what_if.step_hook))

    def _detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _final(self) -> dict[str, Any]:
        final: dict[str, Any] = {"torchrl_unprobed_calls": dict(self.unprobed)} if self.unprobed else {}
        not_measurable = {"what_if": self._refused, "memory": self._refused} if self._refused else {}
        if self._unlinked:
            not_measurable["staleness"] = UNLINKED
        if self.batch_returns.why:
            not_measurable["returns"] = self.batch_returns.why
        if not_measurable:
            final["not_measurable"] = not_measurable
        measured = {"what_if": self.what_if, "memory": self.memory}
        return final | {k: m.metadata() for k, m in measured.items() if m is not None and m.metadata() is not None}

    def close(self, completed: bool = True, stop_reason: str | None = None, **extra: Any) -> Path | None:
        """The staged calls settled (the last recurrent-mode calls replayed), then life.Probe's close."""
        if self.running:
            start, core = time.perf_counter(), self.tracer.hook_seconds
            try:
                self._settle()
                self.batch_returns.settle()  # the last batch's episodes
                self.batch_returns.returns.publish(self.tracer)
            except Exception:  # never let a failed replay hide how the run ended (as the core's flush)
                pass
            self.tracer.integration_seconds += time.perf_counter() - start - (self.tracer.hook_seconds - core)
        self.batch_returns.ended = True
        return super().close(completed, stop_reason, **extra)

    def measure_batch(self, data: Any, epoch: int, minibatch: int = 0, iteration: int | None = None) -> None:
        """Call before the loss of each (epoch, minibatch) on the collector's batch ``data`` (the value
        estimator's advantage in it): the memory horizon at the first call per batch (its collection weights),
        what-if on the minibatches it samples (nothing unless the probe was made with what_if or memory); where no
        collection call came in this process (a multi-process collector), the batch's episode returns. On a
        copy of the loss: training is untouched. ``iteration``: the collector batch (counted by the probe)."""
        it = self.iteration if iteration is None else iteration
        self._trained(data)  # where no collection call came, its episodes (returns.py TrainBatches)
        if it != self._memory_at:  # a new batch: the memory horizon on its weights; the records into the parts
            self._memory_at = it
            if self.memory is not None:
                self.memory.measure(data, it)
            for live in self._live:
                live.publish(self.tracer)
        if self.what_if is not None:
            self.what_if.on_batch(data, (it, epoch, minibatch))

    def _trained(self, data: Any) -> None:
        """A batch the training side sees: its episodes to the returns record where no collection call came."""
        if self.batch_returns.trained(data):
            self.batch_returns.returns.publish(self.tracer)

    # -- the hook ------------------------------------------------------------------------------------
    def _make_pre_hook(self, name: str) -> Any:
        """Keeps the tensors (references: TorchRL sets new ones, it never writes into them) of the in_keys
        the module overwrites with its output, for the hook after the call (:meth:`_make_hook`)."""
        from tensordict import TensorDictBase

        keys = self._rewritten[name]

        def pre_hook(mod: nn.Module, args: tuple[Any, ...]) -> None:
            td = args[0] if args else None
            if isinstance(td, TensorDictBase):
                self._given[name] = {k: td.get(k, None) for k in keys}

        return pre_hook

    def _make_hook(self, name: str) -> Any:
        from tensordict import TensorDictBase

        def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            start = time.perf_counter()
            core = self.tracer.hook_seconds
            td = args[0] if args else None
            given = self._given.pop(name, None)
            if not isinstance(td, TensorDictBase) or self.tracer.writer is None:
                self.unprobed[name] = self.unprobed.get(name, 0) + 1
                return
            if given:  # the call's input where its output now stands (a shallow copy: the user's td untouched)
                td = td.copy()
                for k, v in given.items():
                    if v is not None:
                        td.set(k, v)
            modes = self.tracer.modes  # whether dropout acts in the call (training_mode): counted now, as it runs
            if name in modes.modules:
                modes.at(self.iteration, self.tracer)  # a new collector batch: the counts so far into the parts
                modes.count(name, _phase(bool(mod.recurrent_mode)))
            grad = torch.is_grad_enabled()
            torch.set_grad_enabled(False)
            try:
                if mod.recurrent_mode:  # type: ignore[attr-defined]
                    self._recurrent(name, mod, td)
                else:
                    self._sequential(name, mod, td, output)
            finally:
                torch.set_grad_enabled(grad)
                self._current.pop(name, None)
                self._returned.pop(name, None)
                spent = time.perf_counter() - start - (self.tracer.hook_seconds - core)
                self.tracer.integration_seconds += spent

        return hook

    def _returns(self, name: str) -> Any:
        """A forward hook on the shadow, ahead of the core's: its output replaced by the states TorchRL
        returned in the call being traced, where :meth:`_sequential` put them (torch's forward hooks may
        return a new output, which the hooks after them see)."""

        def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            return self._returned.get(name)

        return hook

    def _settle_staged(self) -> None:
        """:meth:`_settle` as the core calls it, before a kept block is handed over."""
        self._settle()

    def _settle(self) -> None:
        """The staged calls settled in call order from their values on the host: one copy per device for all
        of them (samples.host), one more for the kept observations (samples.rows_on_host); each sequential
        call's grid filled, each recurrent-mode call replayed (:meth:`_replay`). Run before a kept block is
        handed over (``CoreTracer.before_hand_over``), by a sequential call that follows recurrent-mode calls
        (before it reaches the core: the core numbers and writes the calls in call order), and at close."""
        staged, self._staged, self._waiting = self._staged, [], 0
        if not staged:
            return
        arrays = iter(host([t for s in staged for t in s.tensors]))
        kept = [s.obs for s in staged if isinstance(s, StagedCall) and s.obs is not None]
        obs = iter(rows_on_host(kept) if kept else [])
        self.tracer.batch_jobs(True)  # the replayed calls' rows cross to the writer together
        try:
            for s in staged:
                values = [next(arrays) for _ in s.tensors]
                if isinstance(s, StagedCall):
                    assert values[0] is not None
                    s.settle(values[0], next(obs) if s.obs is not None else None)
                else:
                    self._replay(s, values)
        finally:
            self.tracer.batch_jobs(False, timed=False)  # (in the hook's or the integration's time already)

    def _tags(self, phase: str) -> Tags:
        if phase != self._last_phase and self.tracer.writer is not None:  # the collector's progress so far
            self.tracer.writer.progress.update(num_timesteps=self.frames, iterations=self.iteration + 1)
        if phase == "rollout" and self._last_phase != "rollout":
            self.iteration += 1  # a collector batch begins: the first collection call after training
        self._last_phase = phase
        user = self._user[-1] if self._user else {}
        it = user.get("iteration", self.iteration if self.iteration >= 0 else None)
        if phase == "rollout":
            return Tags(phase, iteration=it)
        return Tags(phase, iteration=it, epoch=user.get("epoch"), minibatch=user.get("minibatch"))

    def _window(self) -> None:
        """The rollout states kept per env for the train rows' drift and the provenance check, where no
        ``reference_window`` was given: the collector's batch, its ``frames_per_batch`` env steps per env
        (torchrl/collectors/_single.py ``Collector._setup_frames_per_batch``), read from the collector whose
        ``rollout`` makes this call, and nothing older (a replay buffer's samples of earlier batches, made
        with earlier weights, get no drift and stay out of the check). Set before any rollout state is kept
        (the first collection call): ``CoreTracer.default_window``."""
        self._window_from_collector = False
        per_env = getattr(_collector(), "frames_per_batch", None)
        if isinstance(per_env, int) and per_env > 0:
            self.tracer.default_window(per_env)

    def _sequential(self, name: str, mod: Any, td: Any, output: Any) -> None:
        """A sequential-mode call (collection, an evaluation): one step per env column, rnn.py
        ``LSTMModule.forward``'s ``td.reshape(-1).unsqueeze(-1)``, the input state zeroed where ``is_init``.
        The states the core records are the ones TorchRL returned (``("next", recurrent_state_*)``: the
        very states the next step starts from, whatever computed them: cuDNN, ATen or torchrl's
        python-based LSTM/GRU), handed over as the shadow's output (:meth:`_returns`); re-run on the shadow
        only where they are not the module's clean step (dropout in effect) or are missing."""
        if self._waiting:  # recurrent-mode calls replayed first: the core sees every call in call order
            self._settle()
        keys, out_keys = list(mod.in_keys), list(mod.out_keys)
        is_lstm = self._lstm[name]
        rnn = self.shadows[name]
        layers, hidden = int(rnn.num_layers), int(rnn.hidden_size)
        x = td.get(keys[0])
        is_init = td.get(keys[-1])
        step_count = td.get("step_count", None)
        traj = td.get(("collector", "traj_ids"), None)
        n = td.numel()
        phase = _phase(False)
        if phase == "rollout":
            self.frames += n
            if self._window_from_collector:
                self._window()
        keep_obs = phase == "rollout" and self.obs_size is not None and int(x.shape[-1]) == self.obs_size
        obs = x.detach().reshape(n, -1).float().clone() if keep_obs else None
        tags = self._tags(phase)
        if phase == "rollout" and self.batch_returns.collecting(self.iteration):  # the last batch's, once
            self.batch_returns.returns.publish(self.tracer)
        staged = StagedCall(
            self._envs[name], phase, n, [is_init, step_count, traj if phase == "rollout" else None], obs
        )
        self._staged.append(staged)
        tags.grid = staged.grid  # its episode columns filled before it is read (_settle)
        zero = is_init.reshape(n, 1, 1).bool()
        given = [td.get(k, None) for k in (keys[1], keys[2])] if is_lstm else [td.get(keys[1], None)]
        states = [
            torch.zeros(layers, n, hidden, dtype=x.dtype, device=x.device)
            if s is None
            else torch.where(zero, 0, s.reshape(n, layers, hidden)).transpose(0, 1).contiguous()
            for s in given
        ]
        inner = self._inner[name]
        clean = not (inner.training and float(getattr(inner, "dropout", 0.0) or 0.0) > 0)
        returned = [output.get(k, None) for k in out_keys] if clean and hasattr(output, "get") else []
        if returned and all(isinstance(r, torch.Tensor) for r in returned):
            y, *ends = (r.reshape(n, -1, r.shape[-1]) for r in returned)
            ends = [e.transpose(0, 1) for e in ends]  # (layers, n, hidden), as nn.LSTM returns them
            self._returned[name] = (y, tuple(ends) if is_lstm else ends[0])
        self._current[name] = tags
        with cudnn_quiet(x.device):  # a shadow of cuDNN-flattened weights is not one contiguous chunk
            rnn(x.reshape(n, 1, int(x.shape[-1])), tuple(states) if is_lstm else states[0])

    def _recurrent(self, name: str, mod: Any, td: Any) -> None:
        """A recurrent-mode call (the loss, a value estimator): staged on its device as the hook sees it
        (recurrent.StagedRecurrent), replayed on the shadow at the next settlement (:meth:`_settle`), or now
        (not copied) where the calls staged would hold more than recurrent.STAGED_BYTES. Each sample's
        provenance from its batch: the call's own TensorDict (the loss), or the batch a value estimator took
        the call's samples from (samples.gae_batch: found now, on the stack)."""
        keys = list(mod.in_keys)
        phase = _phase(True)
        if phase == "train" and self._loss_looks:  # until a loss module is found on the stack
            loss = _loss()
            self._loss_looks, self._refused = 0 if loss is not None else self._loss_looks - 1, whatif.refused(loss)
        tags = self._tags(phase)
        if phase == "train" and "step_count" not in td.keys():
            self._unlinked = True
        gae = gae_batch(td.get(keys[1], None), keys[1]) if phase == "value" else None
        if phase == "value" and not self.batch_returns.collected:  # no collection here: the estimator's batch
            self._trained(estimator_batch())
        rnn = self.shadows[name]
        size = staged_bytes(rnn, td, keys)
        now = self._waiting + size > staged_budget(td.get(keys[0]).device)  # replayed at once: nothing copied
        # the weights the call ran with are the inner module's now: a loss's target network puts its own there
        # (``target_value_network_params.to_module``), which the shadow's (the module's own) are not
        staged = StagedRecurrent(name, rnn, td, keys, tags, gae, copy=not now, weights_of=self._inner[name])
        self._staged.append(staged)
        self._waiting += size
        if now:
            self._settle()

    def _samples_of(self, name: str) -> Envs:
        """Where a module's loss-time samples are looked up (env, episode, env step by trajectory id): its own
        collection's record, or, for a module the collector's policy does not run (a critic with an LSTM of its
        own that only the loss and GAE call), another module's: the samples' provenance is the data's, not the
        module's."""
        own = self._envs[name]
        if own.collecting:
            return own
        return next((e for e in self._envs.values() if e.collecting), own)

    def _replay(self, staged: StagedRecurrent, arrays: list[np.ndarray | None]) -> None:
        """A staged recurrent-mode call's pieces re-run on the shadow with the weights it ran with (the core
        records the packed call: recurrent.py)."""
        name = staged.name
        args = staged.replay(arrays, self._samples_of(name))
        if args is None:  # every sample padding: nothing TorchRL computed is a state
            return
        rnn = self.shadows[name]
        self._current[name] = staged.tags
        try:
            with holding(rnn, staged.weights):
                rnn(*args)
        finally:
            self._current.pop(name, None)


def _loss() -> Any:
    """The innermost TorchRL loss module (``LossModule``) whose method is on the stack (the frame's ``self``), None
    where none is."""
    from torchrl.objectives import LossModule

    frame: Any = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("torchrl.objectives"):
            s = frame.f_locals.get("self")
            if isinstance(s, LossModule):
                return s
        frame = frame.f_back
    return None


def _collector() -> Any:
    """The collector whose ``rollout`` is on the stack (the frame's ``self``), None where none is."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "rollout" and frame.f_globals.get("__name__", "").startswith("torchrl.collectors"):
            return frame.f_locals.get("self")
        frame = frame.f_back
    return None


def probe(
    model: nn.Module | Iterable[nn.Module],
    out: str | os.PathLike[str] | None = None,
    *,
    modules: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    options: CaptureOptions | None = None,
    measure: Measure | None = None,
    loss: Any = None,
    optimizer: Any = None,
    epochs: int = 1,
    minibatches: int = 1,
    **capture: Any,
) -> TorchRLProbe:
    """A probe on every ``LSTMModule``/``GRUModule`` in ``model`` (the policy; pass ``[actor, critic]``
    when the critic has its own), or those named in ``modules``. Use as a context manager around
    collection and training: ``with probe(policy, "run.parquet") as p: ...``. ``out`` and the capture
    keywords as for :func:`lstm_probe.trace`.

    ``measure`` (a :class:`~lstm_probe.options.Measure`) and its fields' names: ``capture_obs=True``
    (collection rows keep the recurrent module's input, the observation where the module reads it, flattened,
    in the ``obs`` column for linear probes); ``what_if=True``, ``memory=True`` (measured on a copy of ``loss``,
    the ``ClipPPOLoss``, when the loop calls :meth:`TorchRLProbe.measure_batch` before each loss call);
    ``optimizer``: what-if's gradient comparison (a step pre-hook); ``epochs``, ``minibatches``: per collected
    batch, which what-if samples (docs/torchrl.md)."""
    cap, me = route(capture, (CaptureOptions, Measure), "torchrl.probe")
    opts = capture_options(options, out, **cap)
    m = settle(Measure, measure, me)
    if m.info_keys:
        raise BadInput("--info is not built for --framework torchrl yet (--capture-obs keeps the observations)")
    found = located(model, modules)  # names.py: by role where it knows them, the path kept in the metadata
    kw = {"loss": loss, "optimizer": optimizer, "epochs": epochs, "minibatches": minibatches}
    paths = {n: p for n, (p, _) in found.items()}
    return TorchRLProbe({n: m for n, (_, m) in found.items()}, opts, metadata, measure=m, paths=paths, **kw)
