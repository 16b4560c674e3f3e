"""rsl_rl's ``DistillationRunner`` (a recurrent student trained to copy a teacher): :class:`DistillProbe`, the
:class:`~lstm_probe.integrations.rsl_rl.probe.RslRlProbe` of ``algorithms/distillation.py:Distillation``.

What rsl_rl does (rsl-rl-lib 5.5.1), and what the probe relies on:

- Rollout: ``Distillation.act`` calls the student (``stochastic_output=True``), then the teacher, once each per
  env step, on (1, num_envs, F) (``modules/rnn.py:RNN.forward``, the state kept in the module);
  ``Distillation.process_env_step`` stores the step (``storage/rollout_storage.py:RolloutStorage.add_transition``:
  observations, teacher actions, dones; no hidden state) and resets both modules' done rows in place
  (``RNN.reset(dones)``). ``Distillation.compute_returns`` does nothing: no bootstrap call. The teacher need not be
  recurrent (an ``MLPModel``), nor of the student's hidden size: then only the student is traced (a log holds one
  hidden size), and the log's ``architecture.untraced`` says why.
- Training: ``Distillation.update`` runs ``num_learning_epochs`` epochs; each restarts student and teacher from
  ``last_hidden_states`` (``RNN.reset(hidden_state=...)``: the states the rollout began from) and replays every
  stored step in order (``RolloutStorage.generator``: one batch per env step, all envs), one student call per step
  on (1, num_envs, F), then ``RNN.reset(dones)`` and ``detach_hidden_state(dones)`` of the done rows. Every
  ``gradient_length`` student calls (counted over the whole update, across epochs: ``cnt``) it steps the optimizer
  and detaches the whole state: gradients flow back at most ``gradient_length`` steps, and not across an episode
  start nor an epoch's start (the state restarted and detached there). ``cnt`` is a local of ``update``: each update
  counts from 0, and where ``gradient_length`` does not divide ``num_steps_per_env`` a window runs on from one epoch's
  last steps into the next's first. The steps after the update's last multiple of ``gradient_length`` are
  accumulated but never backpropagated (``Distillation.__init__`` warns). The teacher is not called in training.
- After the last epoch ``last_hidden_states`` is the student's state at its end (the teacher's: its module's, which
  is None once an update has run: ``reset(hidden_state=None)``), and the student's module keeps that state: the
  next rollout's first student step starts from the end of training's last pass over the previous rollout, not from
  the previous rollout's last step (the report's doctor says so: :attr:`Capabilities.rollout_start`), and training
  starts each epoch from the same state. The teacher's saved state is the None it was reset to, so every rollout after
  the first starts it from zeros while the episodes go on: its outputs there, the student's targets, are those of a
  teacher without the episode so far (declared: :attr:`Capabilities.rollout_zeroed`).

How the probe tags it: the rollout as for PPO (phase 'rollout', per-env counters from the ``env.step`` wrapper,
``probe.py``); each training step's student call is phase 'train' (iteration, epoch), one column per env. A
*minibatch* is one gradient window (the ``gradient_length`` calls one optimizer step trains on; numbered within its
epoch, 0 the window the epoch begins in; the never-backpropagated tail is the update's last), and each env's calls
in one epoch and one window are one training *sequence* (seq = env column, t = step in it): the stretch through
which the state is carried and gradients flow. A window that spans an epoch's end is two sequences (epoch e's and
e+1's), each starting where training restarts its state. A sequence's start reason: ``episode_start`` (zeros),
``env_boundary`` (an epoch's first step: the state the rollout began from) or ``gradient_window`` (a window's first
step inside an epoch: the state the pass's previous step left, detached). The calls are recorded as the tracer's
per-step loop ('stepwise' path: one tags object per sequence), their rows keyed to the rollout's env step and episode
counters of the same storage index. Before the update's first optimizer step (epoch 0's window 0) the student
recomputes exactly the rollout's states: the provenance check.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from torch import nn

from lstm_probe.capture.modules import describe_modules
from lstm_probe.capture.returns import Live
from lstm_probe.contract import SEQ_REASON, Capabilities, Grid, Tags
from lstm_probe.errors import BadInput
from lstm_probe.integrations.rsl_rl.probe import RslRlProbe, recurrent_modules

ROLES = ("student", "teacher")

HYPERPARAMETERS = ("num_learning_epochs", "gradient_length", "learning_rate", "max_grad_norm", "use_mixed_precision")
"""``algorithms/distillation.py:Distillation``'s settings the run box shows."""


class DistillProbe(RslRlProbe):
    """The probe of an rsl_rl ``Distillation`` (``DistillationRunner``): student (and a recurrent teacher) traced,
    training's per-step replay tagged by gradient window (see the module's docstring)."""

    roles = ROLES

    def __init__(self, alg: Any, *args: Any, **kwargs: Any):
        self.gradient_length = int(alg.gradient_length)
        self.epochs = int(alg.num_learning_epochs)
        self._update: list[list[tuple[int, Tags]]] | None = None  # per epoch: (first step, tags) of each sequence
        self._epoch = 0
        self.untraced: dict[str, dict[str, Any]] = {}  # the models not traced, and why (_traced)
        super().__init__(alg, *args, **kwargs)
        if self.untraced:  # the log says which models it leaves out (the report's Architecture section)
            self.tracer.metadata["architecture"]["untraced"] = self.untraced

    def capabilities(self) -> Capabilities:
        """Train rows carry epochs; a rollout's first step goes on from training's last state, the teacher's (where
        traced) from zeros, its outputs the student's targets (no stored states, no what-if or memory re-runs of
        distillation)."""
        zeroed = {} if "teacher" in self.untraced else {"teacher": "targets"}  # (_traced runs before the tracer)
        return Capabilities(
            "rsl_rl", epochs=True, observe=True, returns=True, rollout_start="training", rollout_zeroed=zeroed
        )

    def _traced(self) -> dict[str, nn.Module]:
        """The student's RNN, and the teacher's where it has one of the student's hidden size (a log holds one size:
        else the teacher, which training does not change, is left out, and the log's metadata says so; an
        ``MLPModel`` teacher has no state to trace)."""
        found = recurrent_modules(self.alg, ("student",))
        student = found["student"]
        assert isinstance(student, nn.LSTM | nn.GRU)  # recurrent_modules' kinds
        size = student.hidden_size
        teacher = getattr(self.alg, "_raw_teacher", None) or getattr(self.alg, "teacher", None)
        rnn = getattr(getattr(teacher, "rnn", None), "rnn", None)
        if not isinstance(rnn, nn.LSTM | nn.GRU):
            self.untraced["teacher"] = {"class": type(teacher).__name__, "why": "no recurrent state"}
        elif int(rnn.hidden_size) != size:
            self.untraced["teacher"] = {
                **describe_modules({"teacher": rnn})["teacher"],
                "why": f"a log holds one hidden size, the student's {size}",
            }
        else:
            found["teacher"] = rnn
        return found

    def _attach(self) -> None:
        self.optimizer_steps = 0  # counted by a step hook: gradient_length over an update's calls steps none
        self._steps_live = Live("optimizer_steps", lambda: self.optimizer_steps)  # metadata_keys.LIVE_KEYS
        self._hooks.append(self.alg.optimizer.register_step_post_hook(self._stepped))
        self._wrap(self.env, "step", self._step)
        self._wrap(self.alg, "act", self._act)
        self._wrap(self.alg, "update", self._updates)
        self._wrap(self.storage, "generator", self._steps)

    def _stepped(self, *args: Any) -> None:
        self.optimizer_steps += 1

    def _final(self) -> dict[str, Any]:
        """The base's, and the optimizer steps training took (``optimizer_steps``; 0: the report states no horizon)."""
        return {**super()._final(), "optimizer_steps": self.optimizer_steps}

    def _updates(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def update(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            self._settle(wait=True)
            self.returns.publish(self.tracer)  # the rollout's episodes
            self._update, self._epoch = self.windows(), 0
            self.tracer.integration_seconds += time.perf_counter() - start
            try:
                return fn(*args, **kwargs)
            finally:
                self.tags, self._update = None, None
                self._steps_live.publish(self.tracer)  # the count so far, with the update's rows (a killed run's)
                self.tracer.flush_pending()  # the last sequence's rows, before the next rollout's
                self.iteration += 1

        return update

    def _steps(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def generator(*args: Any, **kwargs: Any) -> Iterator[Any]:
            pieces = None
            if self._update is not None and self._epoch < len(self._update):
                pieces = dict(self._update[self._epoch])
            self._epoch += 1
            try:
                for t, batch in enumerate(fn(*args, **kwargs)):
                    if pieces is not None:
                        self.tags = pieces.get(t, self.tags)
                    yield batch
            finally:
                self.tags = None

        return generator

    def windows(self) -> list[list[tuple[int, Tags]]]:
        """Each epoch's training sequences: (first storage index, the tags of its calls), cut at the epoch's start
        and where ``cnt`` (the update's student calls so far) reaches a multiple of ``gradient_length``."""
        steps, g = self.steps_per_env, self.gradient_length
        out = []
        for epoch in range(self.epochs):
            cnt = epoch * steps + np.arange(steps)
            cuts = np.flatnonzero((np.arange(steps) == 0) | (cnt % g == 0))
            ends = np.r_[cuts[1:], steps]
            first = cnt[0] // g  # the window the epoch begins in: its minibatch 0
            pieces = zip(cuts.tolist(), ends.tolist(), strict=True)
            out.append([(a, self._tags(epoch, int(cnt[a] // g - first), a, b)) for a, b in pieces])
        return out

    def _tags(self, epoch: int, window: int, a: int, b: int) -> Tags:
        """The train tags of storage steps [a, b) of every env: one sequence per env column."""
        roll, n = self.roll, self.n

        def col(name: str, dtype: Any) -> np.ndarray:
            return np.ascontiguousarray(roll[name][a:b].T).astype(dtype)

        start = col("start", np.int8)
        grid = Grid(
            env=np.repeat(self.envs[:, None], b - a, 1).astype(np.int32),
            env_step=col("env_step", np.int64),
            episode=col("episode", np.int64),
            episode_step=col("episode_step", np.int64),
            episode_start=start,
            padding=np.zeros((n, b - a), bool),
            train=True,
        )
        grid.seq_len = np.full(n, b - a, np.int32)
        reason = "env_boundary" if a == 0 else "gradient_window"  # a window's first step: the previous step's state
        grid.seq_reason = np.where(start[:, 0] == 1, SEQ_REASON["episode_start"], SEQ_REASON[reason]).astype(np.int8)
        return Tags(phase="train", iteration=self.iteration, epoch=epoch, minibatch=window, grid=grid)


def distill_metadata(runner: Any, alg: Any) -> dict[str, Any]:
    """What the log's metadata says about an rsl_rl distillation run: the runner's and the models' settings."""
    cfg = getattr(runner, "cfg", None) or {}
    models = {}
    for role in ROLES:
        rnn = getattr(getattr(getattr(alg, role, None), "rnn", None), "rnn", None)
        if isinstance(rnn, nn.LSTM | nn.GRU):
            kind = "lstm" if isinstance(rnn, nn.LSTM) else "gru"
            models[role] = {"rnn_type": kind, "hidden_size": rnn.hidden_size, "num_layers": rnn.num_layers}
    student = getattr(alg, "student", None)
    kind = str(models.get("student", {}).get("rnn_type") or "")
    hyper = {k: getattr(alg, k) for k in HYPERPARAMETERS if isinstance(getattr(alg, k, None), int | float | bool)}
    steps = int(alg.storage.num_transitions_per_env)
    return {
        "algorithm": type(alg).__name__,
        "policy": f"{type(student).__name__} ({kind})" if kind else type(student).__name__,
        "hyperparameters": {"num_steps_per_env": steps, **hyper},
        "rsl_rl": {
            "num_envs": int(alg.storage.num_envs),
            "num_steps_per_env": steps,
            "num_learning_epochs": getattr(alg, "num_learning_epochs", None),
            "gradient_length": getattr(alg, "gradient_length", None),
            "learning_rate": getattr(alg, "learning_rate", None),
            "models": models,
            "experiment_name": cfg.get("experiment_name") if isinstance(cfg, dict) else None,
        },
    }


def check(measure: Any) -> None:
    """The measures a distillation probe has none of: what-if and memory re-run PPO's stored minibatches."""
    for name in ("what_if", "memory"):
        if getattr(measure, name, False):
            raise BadInput(f"--{name.replace('_', '-')} is not built for rsl_rl's distillation (PPO's runners only)")
