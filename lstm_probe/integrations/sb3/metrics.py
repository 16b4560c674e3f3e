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
default at ``verbose=0`` without ``tensorboard_log``) drops every figure at its next dump, so there none is
computed. ``ProbeCallback(live_metrics=True)`` records them anyway, for code that reads
``logger.name_to_value`` before a dump; a logger of the user's own class always gets them; a logger set or
given an output format while learn() runs gets them from the next rollout on.

They have no hooks of their own and no store of their own: they read the messages the tracer hands the
sink (``CoreTracer.observers``), in the training process, on the host, after the block's one copy there:
the rollout rows' states (norms, saturation) and the train rows' drifts, which ``drift.Drift`` computed
once for the log's drift columns (so the figure is the mean of the log's own drift_h). The minibatch
figures come from the minibatch's grid (``ProbeCallback._train_tags``). Nothing here touches the device.
Rollout figures are recorded when the rollout's last step has run, train figures when the next rollout's
first step has: both land in the ``_dump_logs`` after that rollout (sb3's own ``train/`` figures lag the
same way; the last iteration's train figures, like sb3's, are recorded but never dumped by learn()). At
those two points of each iteration the tracer's blocks are handed over and the writer's jobs run
(``LogWriter.drain``): block boundaries, where one wait for a device copy is due anyway. With
``--other-envs none`` the figures cover the traced envs.

Relies on sb3-contrib 2.x: ``ppo_recurrent.py:RecurrentPPO.collect_rollouts`` calls the policy's
``forward`` once per env step (and nowhere else), then ``OnPolicyAlgorithm.learn`` dumps the logger, then
``train()`` runs the minibatches (``ProbeCallback`` tags them).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from lstm_probe.log.messages import Drifts, Message, Progress
from lstm_probe.log.schema import row_norms

if TYPE_CHECKING:
    from lstm_probe.capture.tracer import CoreTracer
    from lstm_probe.contract import Tags


class Probe(Protocol):
    """What live metrics read of the probe they serve (``callback.ProbeCallback``, which imports this module:
    the type is declared here, so that nothing here imports it back)."""

    @property
    def model(self) -> Any: ...

    @property
    def tracer(self) -> CoreTracer | None: ...

    @property
    def iteration(self) -> int: ...


SATURATION = 0.95
"""|h| above this counts as saturated (the report's health section uses the same threshold)."""

_CURRENT: weakref.ref[LiveMetrics] | None = None


def attach(probe: Probe, figures: bool | None = None) -> LiveMetrics:
    """Start live metrics for a probe whose learn() is starting. ``figures``: record the figures (None:
    where something can see them, :func:`seen`); without them only :func:`live` answers."""
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


class _Module:
    """One LSTM's figures of the current iteration: sums and counts (host floats)."""

    def __init__(self) -> None:
        self.rollout_reset()
        self.drift = {"first": [0.0, 0], "last": [0.0, 0]}  # sum, count
        self.last_epoch = -1

    def rollout_reset(self) -> None:
        self.h_norm = self.c_norm = 0.0
        self.rows = self.c_rows = 0
        self.saturated = self.values = 0


class LiveMetrics:
    """Each iteration's figures (module docstring), from the tracer's messages and the minibatch grids."""

    def __init__(self, probe: Probe, figures: bool | None = True):
        # held weakly, as everything a probe puts on the model (attach.py)
        self.probe = weakref.ref(probe)
        model: Any = probe.model
        self.logger = model.logger
        self.figures = bool(figures)  # False: no figures; live() only
        self.auto = figures is None  # decided by seen(): again at each rollout's start (rollout_start)
        tracer = probe.tracer
        self.modules = {name: _Module() for name in tracer.names} if tracer is not None else {}
        # the tracer's rows handed over, for live(): held weakly (a closed tracer keeps its reference states),
        # the count kept as last seen (ProbeCallback sets it once the log is closed: closed())
        self._tracer = weakref.ref(tracer) if tracer is not None else None
        self.rows = 0
        self._train_reset()
        if self.auto:
            self.figures = seen(self.logger)
        if self.figures:
            self._attach()

    def _attach(self) -> None:
        tracer = self._tracer() if self._tracer is not None else None
        if tracer is not None and self.observe not in tracer.observers:
            tracer.observers.append(self.observe)

    def rollout_start(self, model: Any) -> None:
        """At each rollout's start: the model's logger now (a callback may have set another since learn()
        started); where figures were off because nothing could see them and now something can, they are
        computed from this iteration on."""
        self.logger = model.logger
        if self.figures or not self.auto or not seen(self.logger):
            return
        self.figures = True
        self._attach()

    def live(self) -> dict[str, Any]:
        probe = self.probe()
        tracer = self._tracer() if self._tracer is not None else None
        if tracer is not None:
            self.rows = tracer.rows
        return {} if probe is None else {"iteration": max(probe.iteration, 0), "rows": self.rows}

    def closed(self, rows: int) -> None:
        """The log is closed with ``rows`` rows handed over (its last blocks are handed over while it closes)."""
        self.rows = rows

    # -- what the figures are made of --------------------------------------------------------------
    def observe(self, message: Message, layers: int, states: tuple[Any, Any] | None = None) -> None:
        """A message the tracer hands the sink (``emitter.Emitter.hand_over``; in call order, host arrays): a
        rollout block's states (``states`` where the message carries the rows' figures only), or train rows'
        drifts."""
        if isinstance(message, Progress):
            return
        mine = self.modules.get(message.name)
        if mine is None:
            return
        # (its time is the hand-over's: inside a hook or a timed callback, or on the writer thread)
        tags = message.tags
        if tags.phase == "rollout":
            if isinstance(message.hs, np.ndarray):
                self._rollout(mine, message.hs, message.cs)
            elif states is not None:  # a summary log's rows: their norms came computed (drift.reduced)
                self._rollout(mine, *states, norms=(message.hs.h_norm, message.hs.c_norm))
        elif tags.phase == "train" and tags.grid is not None and getattr(message, "t", None) != -1:
            # figures-only rows (a summary log's, messages.Reduced) bring their drifts with their norms
            drift = message.drift if isinstance(message.hs, np.ndarray) else message.hs.drift
            if drift is not None:
                self._train(mine, int(tags.epoch if tags.epoch is not None else 0), drift, layers)

    @staticmethod
    def _rollout(
        mine: _Module, hs: np.ndarray, cs: np.ndarray | None, norms: tuple[np.ndarray, np.ndarray | None] | None = None
    ) -> None:
        """Rollout rows' states: their norms (the h_norm / c_norm columns': ``norms`` where the message brought
        them) and saturation."""
        hidden = hs.shape[-1]
        h_norm, c_norm = norms if norms is not None else (row_norms(hs.reshape(hs.size // hidden, hidden)), None)
        if norms is None and cs is not None:
            c_norm = row_norms(cs.reshape(cs.size // hidden, hidden))
        mine.h_norm += float(h_norm.sum())
        mine.rows += len(h_norm)
        mine.saturated += int(np.count_nonzero(np.abs(hs) > SATURATION))
        mine.values += hs.size
        if c_norm is not None:
            mine.c_norm += float(c_norm.sum())
            mine.c_rows += len(c_norm)

    @staticmethod
    def _train(mine: _Module, epoch: int, drift: Drifts, layers: int) -> None:
        dh, _, found = drift
        top = slice(len(dh) // layers * (layers - 1), None)  # rows are layer-major: the top layer's are last
        got = dh[top][found[top]]
        if epoch != mine.last_epoch:
            mine.drift["last"] = [0.0, 0]
            mine.last_epoch = epoch
        total, n = float(got.sum(dtype=np.float64)), int(got.size)
        for which in ("first", "last") if epoch == 0 else ("last",):
            mine.drift[which][0] += total
            mine.drift[which][1] += n

    def minibatch(self, tags: Tags) -> None:
        """A train minibatch's tags, as ``ProbeCallback`` made them: padding, sequences and path."""
        grid = tags.grid
        if grid is None:
            return
        padding = np.asarray(grid.padding, bool)
        self.minibatches += 1
        self.stepwise += tags.path == "stepwise" and padding.shape[1] > 1
        self.cells += padding.size
        self.padded += int(padding.sum())
        self.sequences += padding.shape[0]

    def rollout_step(self, probe: Any) -> None:
        """The end of a policy forward during a rollout (called by ``ProbeCallback``'s forward hook on the
        policy, after it counted the step, inside its counted time)."""
        if probe.k == 1:  # the first step of an iteration: the previous one's training is over
            self._written(probe, flush=False)  # its blocks were handed over when this step's rows began
            self._train_end()
        if probe.k == probe.n_steps:
            self._written(probe, flush=True)
            self._rollout_end()

    @staticmethod
    def _written(probe: Any, flush: bool) -> None:
        """Every row so far handed over and through the writer's jobs (their messages observed)."""
        tracer = probe.tracer
        if tracer is None or tracer.writer is None:
            return
        if flush:
            tracer.flush_pending()
        tracer.writer.drain()

    # -- figures ---------------------------------------------------------------------------------
    def _train_reset(self) -> None:
        self.minibatches = 0
        self.stepwise = 0
        self.cells = 0
        self.padded = 0
        self.sequences = 0

    def _train_end(self) -> None:
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

    def _rollout_end(self) -> None:
        record = self.logger.record
        for name, mine in self.modules.items():
            if not mine.rows:
                continue
            record(f"lstm_probe/{name}_h_norm", mine.h_norm / mine.rows)
            if mine.c_rows:
                record(f"lstm_probe/{name}_c_norm", mine.c_norm / mine.c_rows)
            record(f"lstm_probe/{name}_saturation", mine.saturated / max(mine.values, 1))
            mine.rollout_reset()
