"""Live metrics: a probed RecurrentPPO's per-iteration figures, recorded through SB3's own logger.

SB3 users watch TensorBoard, wandb or CSV through ``model.logger``; :func:`attach` (called by
``ProbeCallback`` when learn() starts) records there, under ``lstm_probe/``, what the log's report would
say of each iteration, so every output format SB3 supports gets them:

- ``lstm_probe/<module>_drift_first_epoch`` and ``..._drift_last_epoch``: mean relative drift of the train
  states from the rollout states of the same (env, env step), ||h_train - h_rollout|| / ||h_rollout||, in
  the iteration's first and last epoch (the top layer's h: the LSTM output both training paths return);
- ``lstm_probe/padding_share``: padded cells of all train minibatch cells;
- ``lstm_probe/sequences_per_minibatch``: mean sequences (batch columns) per minibatch;
- ``lstm_probe/stepwise_share``: share of minibatches trained through sb3-contrib's per-step loop;
- ``lstm_probe/<module>_h_norm``, ``..._c_norm``: mean state norm of the rollout rows (every layer);
- ``lstm_probe/<module>_saturation``: share of rollout h values with |h| > 0.95 (the report's threshold).

They are recorded only where something can see them: SB3's own ``Logger`` with no output format (sb3's
default at ``verbose=0`` without ``tensorboard_log``) drops every figure at its next dump, so there the
hooks are not attached at all: their figures took 107-126 ms of the training thread per 2048 steps,
though part of that reappears in the next phase that touches the states (docs/performance-history.md).
``ProbeCallback(live_metrics=True)`` records them anyway, for code that reads ``logger.name_to_value``
before a dump; a logger of the user's own class always gets them; a logger set or given an output format
while learn() runs gets them from the next rollout on.

The probe's rows are made in a writer process, so these are computed here, in the training process,
from the tensors LSTM forward hooks see: each hook keeps a reference (~1 us a call;
a per-step training loop's outputs come whole, once per loop: ``LiveMetrics.loop``); the few torch
reductions run once per minibatch and once per rollout. Their time counts in the log's
``probe_cost.integration_seconds``. Rollout figures are recorded when
the rollout's last step has run, train figures when the next rollout starts: both land in the
``_dump_logs`` after that rollout (sb3's own ``train/`` figures lag the same way; the last iteration's
train figures, like sb3's, are recorded but never dumped by learn()).

Relies on sb3-contrib 2.x: ``ppo_recurrent.py:RecurrentPPO.collect_rollouts`` calls the policy's
``forward`` once per env step (and nowhere else), then ``OnPolicyAlgorithm.learn`` dumps the logger, then
``train()`` runs the minibatches (``ProbeCallback`` tags them); ``policies.py:_process_sequence`` returns
the LSTM output of one multi-step call or of one call per step.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from lstm_probe.integrations.sb3 import ProbeCallback

SATURATION = 0.95
"""|h| above this counts as saturated (the report's health section uses the same threshold)."""

_CURRENT: weakref.ref[LiveMetrics] | None = None


def attach(probe: ProbeCallback, figures: bool | None = None) -> LiveMetrics:
    """Start live metrics for a probe whose learn() is starting; its ``handles`` are the hook handles (removed
    with the probe's own). ``figures``: record the figures (None: where something can see them, :func:`seen`);
    without them only :func:`live` answers."""
    global _CURRENT
    metrics = LiveMetrics(probe, figures)
    _CURRENT = weakref.ref(metrics)
    return metrics


def seen(logger: Any) -> bool:
    """Whether figures recorded through ``logger`` can reach anyone: not where it is SB3's own ``Logger`` with
    no output format (stable_baselines3/common/logger.py: ``Logger.dump`` writes to each of
    ``output_formats`` and clears the values; sb3's ``configure_logger`` gives none at ``verbose=0`` without
    ``tensorboard_log``)."""
    from stable_baselines3.common.logger import Logger

    return type(logger) is not Logger or bool(logger.output_formats)


def live() -> dict[str, Any]:
    """The latest figures of this process's most recent probed run, for a progress display: iteration and
    rows handed to the writer (empty before a run starts)."""
    metrics = _CURRENT() if _CURRENT is not None else None
    return {} if metrics is None else metrics.live()


def _count(probe: Any, start: float) -> None:
    """The time since ``start`` into the probe's ``integration_seconds`` (the log's ``probe_cost``)."""
    tracer = probe.tracer
    if tracer is not None:
        tracer.integration_seconds += time.perf_counter() - start


class _Module:
    """One LSTM's figures of the current iteration."""

    def __init__(self) -> None:
        self.rollout_y: list[torch.Tensor | None] = []  # per rollout step: the top layer's h, (n_envs, H)
        self.rollout_h: list[torch.Tensor] = []  # per rollout step: h of every layer, (L, n_envs, H)
        self.rollout_c: list[torch.Tensor] = []
        self.train_y: list[torch.Tensor] = []  # the pending minibatch's outputs, (T, n_seq, H) each
        self.drift = {"first": [0.0, 0], "last": [0.0, 0]}  # sum, count
        self.last_epoch = -1


class LiveMetrics:
    """Forward hooks on a probe's LSTMs (and the end of each rollout step, from the probe); records each
    iteration's figures (module docstring)."""

    def __init__(self, probe: ProbeCallback, figures: bool | None = True):
        # held weakly, as everything a probe puts on the model (sb3_attach.py): the hooks must not keep it alive
        self.probe = weakref.ref(probe)
        model: Any = probe.model
        self.logger = model.logger
        self.figures = bool(figures)  # False: no hooks, no figures; live() only
        self.auto = figures is None  # decided by seen(): again at each rollout's start (rollout_start)
        self.modules = {name: _Module() for name in probe.tracer.names} if probe.tracer is not None else {}
        # the tracer's rows handed over, for live(): held weakly (a closed tracer keeps its reference states),
        # the count kept as last seen (ProbeCallback sets it once the log is closed: closed())
        self._tracer = weakref.ref(probe.tracer) if probe.tracer is not None else None
        self.rows = 0
        self.pending: Any = None  # the tags of the minibatch whose outputs the modules hold
        self.pending_stepwise = False
        self.pending_base = 0  # the env step of the pending minibatch's rollout's first step
        self.reference: dict[str, torch.Tensor] = {}
        self._train_reset()
        policy: Any = model.policy
        self.lstms = {"actor": policy.lstm_actor, "critic": policy.lstm_critic}
        self.handles: list[Any] = []
        if self.auto:
            self.figures = seen(self.logger)
        if self.figures:
            self._attach()
        # the end of each rollout step comes from ProbeCallback's own forward hook on the policy (rollout_step)

    def _attach(self) -> None:
        self.handles += [m.register_forward_hook(self._hook(n)) for n, m in self.lstms.items() if n in self.modules]

    def rollout_start(self, model: Any) -> list[Any]:
        """At each rollout's start: the model's logger now (a callback may have set another since learn()
        started); where figures were off because nothing could see them and now something can, the hooks
        are attached from this iteration on. Returns the new hook handles (the probe removes them)."""
        self.logger = model.logger
        if self.figures or not self.auto or not seen(self.logger):
            return []
        self.figures = True
        self._attach()
        return self.handles

    def live(self) -> dict[str, Any]:
        probe = self.probe()
        tracer = self._tracer() if self._tracer is not None else None
        if tracer is not None:
            self.rows = tracer.rows
        return {} if probe is None else {"iteration": max(probe.iteration, 0), "rows": self.rows}

    def closed(self, rows: int) -> None:
        """The log is closed with ``rows`` rows handed over (its last blocks are handed over while it closes)."""
        self.rows = rows

    # -- hooks (training thread) -----------------------------------------------------------------
    def _hook(self, name: str) -> Any:
        mine = self.modules[name]
        ref = self.probe

        def hook(mod: Any, args: Any, output: Any) -> None:
            probe = ref()
            if probe is None or probe.loop_module is mod:  # a loop recorded whole: its outputs come in one (loop)
                return
            start = time.perf_counter()
            try:
                keep(probe, mod, output)
            finally:
                _count(probe, start)

        def keep(probe: Any, mod: Any, output: Any) -> None:
            y, (h, c) = output
            if probe.in_forward:  # a rollout step (ProbeCallback's policy pre-hook set it)
                mine.rollout_y.append(y[-1])
                mine.rollout_h.append(h)
                mine.rollout_c.append(c)
            elif not probe.in_rollout:
                self._train(probe, mine, y, int(y.shape[0]) == 1)

        return hook

    def loop(self, name: str, y: Any) -> None:
        """The outputs of a per-step training loop the tracer recorded whole (``sb3._loops``): ``y`` (T, n_seq,
        H) the top layer's h of every step, as the hook would have kept them one step at a time."""
        probe, mine = self.probe(), self.modules.get(name)
        if probe is None or mine is None or probe.in_rollout:
            return
        self._train(probe, mine, y, True)

    def _train(self, probe: Any, mine: _Module, y: Any, one_step: bool) -> None:
        tags = probe.current
        if tags.phase != "train" or tags.grid is None:
            return
        if tags is not self.pending:
            self._minibatch_end()
            self.pending, self.pending_base = tags, probe.base_step
            self.pending_stepwise = one_step and tags.grid.shape[1] > 1
        mine.train_y.append(y)

    def rollout_step(self, probe: Any) -> None:
        """The end of a policy forward during a rollout (called by ``ProbeCallback``'s forward hook on the
        policy, after it counted the step, inside its counted time)."""
        if probe.k == 1:  # the first step of an iteration: the previous one's training is over
            self._train_end()
        if probe.k == probe.n_steps:
            self._rollout_end()

    # -- figures ---------------------------------------------------------------------------------
    def _train_reset(self) -> None:
        self.minibatches = 0
        self.stepwise = 0
        self.cells = 0
        self.padded = 0
        self.sequences = 0

    @torch.no_grad()
    def _minibatch_end(self) -> None:
        tags, self.pending = self.pending, None
        if tags is None:
            return
        grid = tags.grid
        padding = np.asarray(grid.padding, bool)
        self.minibatches += 1
        self.stepwise += self.pending_stepwise
        self.cells += padding.size
        self.padded += int(padding.sum())
        self.sequences += padding.shape[0]
        # the valid cells in row-major (sequence, step) order, as index arrays: one gather per module, and the
        # same rows in the same order as masking a (n_seq, T, H) copy would give (so the same sums)
        seq, step = np.nonzero(~padding)
        env = np.asarray(grid.env)[seq, step].astype(np.int64)
        k = np.asarray(grid.env_step)[seq, step].astype(np.int64) - int(self.pending_base)
        index: dict[tuple[Any, ...], tuple[torch.Tensor, ...]] = {}  # per reference shape and device
        for name, mine in self.modules.items():
            ys, mine.train_y = mine.train_y, []
            ref = self.reference.get(name)
            if not ys or ref is None:
                continue
            y = ys[0] if len(ys) == 1 else torch.cat(ys, 0)  # (T, n_seq, H)
            if (y.shape[1], y.shape[0]) != padding.shape:
                continue
            key = (ref.shape[0], ref.shape[1], y.device, ref.device)
            at = index.get(key)
            if at is None:
                ok = (k >= 0) & (k < ref.shape[0]) & (env >= 0) & (env < ref.shape[1])
                at = index[key] = (
                    torch.from_numpy(step[ok]).to(y.device),
                    torch.from_numpy(seq[ok]).to(y.device),
                    torch.from_numpy(k[ok]).to(ref.device),
                    torch.from_numpy(env[ok]).to(ref.device),
                )
            got = y.detach()[at[0], at[1]]
            want = ref[at[2], at[3]]
            drift = (got - want).norm(dim=1) / want.norm(dim=1).clamp_min(1e-12)
            epoch = int(tags.epoch if tags.epoch is not None else 0)
            if epoch != mine.last_epoch:
                mine.drift["last"] = [0.0, 0]
                mine.last_epoch = epoch
            total, n = float(drift.sum()), int(drift.numel())
            for which in ("first", "last") if epoch == 0 else ("last",):
                mine.drift[which][0] += total
                mine.drift[which][1] += n

    def _train_end(self) -> None:
        self._minibatch_end()
        if self.minibatches:
            record = self.logger.record
            record("lstm_probe/padding_share", self.padded / max(self.cells, 1))
            record("lstm_probe/sequences_per_minibatch", self.sequences / self.minibatches)
            record("lstm_probe/stepwise_share", self.stepwise / self.minibatches)
            for name, mine in self.modules.items():
                for which, (total, n) in mine.drift.items():
                    if n:
                        record(f"lstm_probe/{name}_drift_{which}_epoch", total / n)
        self._train_reset()
        for mine in self.modules.values():
            mine.drift = {"first": [0.0, 0], "last": [0.0, 0]}
            mine.last_epoch = -1

    @torch.no_grad()
    def _rollout_end(self) -> None:
        record = self.logger.record
        for name, mine in self.modules.items():
            if not mine.rollout_h:
                continue
            ys = [y for y in mine.rollout_y if y is not None]
            self.reference[name] = torch.stack(ys).detach()  # (n_steps, n_envs, H): the drifts' reference
            h = torch.stack(mine.rollout_h).detach()  # (n_steps, L, n_envs, H)
            c = torch.stack(mine.rollout_c).detach()
            record(f"lstm_probe/{name}_h_norm", float(h.norm(dim=-1).mean()))
            record(f"lstm_probe/{name}_c_norm", float(c.norm(dim=-1).mean()))
            record(f"lstm_probe/{name}_saturation", float((h.abs() > SATURATION).float().mean()))
            mine.rollout_y, mine.rollout_h, mine.rollout_c = [], [], []
