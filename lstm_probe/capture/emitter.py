"""Where the writer jobs hand their rows over, in the training process: :class:`Emitter`, the one owner of
what emitting rows reads and counts (the input-state answers, the train rows' drifts, the rows handed over,
the observers), which the tracer makes and the jobs of ``blocks.py`` and ``calls.py`` take; neither they nor
this module import the tracer."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from lstm_probe.capture.drift import Drift, grid_keys, reduced
from lstm_probe.capture.inputs import Inputs
from lstm_probe.capture.ondevice import OnDevice
from lstm_probe.capture.ondevice_inputs import DeviceInputs
from lstm_probe.contract import Tags
from lstm_probe.log.messages import Drifts, Message, Rows, SequenceCall

if TYPE_CHECKING:
    from lstm_probe.log.logwriter import LogWriter

Observer = Callable[[Message, int, "tuple[Any, Any] | None"], None]
"""Reads each message handed to the sink (``Emitter.observers``, ``CoreTracer.observers``): the message, the
module's layers, and the rows' states (hs, cs) where the message carries their figures only (None: it
carries the states, or none were kept)."""


class Emitter:
    """Rows to the sink, from the host arrays of a job's second half (in call order): each column's input
    state answered (``inputs``: :class:`~lstm_probe.capture.inputs.Inputs`, which keeps the rollout states), the
    train rows' drifts against them (``drift``: :class:`~lstm_probe.capture.drift.Drift`, computed once), a summary
    log's rows reduced to their figures (``reduces``), the rows counted (``rows``: a progress display's
    figure), and each message read by the ``observers`` (sb3's live metrics) before the writer sends it.

    ``layers``: each module's layer count; ``keep_envs``: under ``--other-envs none``, the env columns below
    it are the only ones handed over (None: all); ``partial``: a summary log under ``--trace-envs K`` (the
    other envs summarized): rows cross reduced, with the vectors of env columns below K only; ``inputs``: the
    store of returned states it starts from (``Inputs.of`` the ``reference_window`` option)."""

    def __init__(
        self,
        layers: Mapping[str, int],
        hidden: int,
        inputs: Inputs,
        *,
        keep_envs: int | None,
        reduces: bool,
        partial: int | None = None,
    ):
        self.layers = dict(layers)
        self.hidden = hidden
        self.keep_envs = keep_envs
        self.reduces = reduces
        self.partial = partial
        self.inputs = inputs
        self.drift: Drift | None = None  # made by start(): one log's drifts refer to its own rollout only
        # a summary log's multi-step calls on an accelerator: their figures computed there (made by start())
        self.ondevice: OnDevice | None = None
        self.device_inputs: DeviceInputs | None = None  # its rollout blocks' answers there (ondevice_inputs.py)
        self.observers: list[Observer] = []
        self.rows = 0

    def start(self) -> None:
        """A new log: no rows handed over yet, and no states held (its drifts and `init` answers never refer
        to an earlier log's rollout). The observers stay."""
        self.rows = 0
        self.inputs = Inputs(self.inputs.window, self.inputs.stored_states)
        self.drift = Drift(self.hidden, self.inputs.rollout_ring)
        self.ondevice = OnDevice(self.hidden, self.inputs) if self.reduces or self.partial is not None else None
        self.device_inputs = DeviceInputs(self.ondevice) if self.ondevice is not None else None

    def train_drift(
        self, name: str, tags: Tags, t0: int, hs: np.ndarray, cs: np.ndarray | None, per_step: bool = False
    ) -> Drifts | None:
        """The drifts of train rows hs/cs (``drift.Drift.rows``); None for other phases, or without rollout
        states held."""
        if tags.phase != "train" or self.drift is None or not self.inputs.window:
            return None
        return self.drift.rows(name, tags.grid, t0, hs, cs, per_step)

    def hand_over(
        self, writer: LogWriter, message: Message, layers: int, states: tuple[Any, Any] | None = None
    ) -> None:
        """``message`` to the sink, after the observers have read it, with the rows' states ``states``
        (hs, cs) where the message carries their figures only."""
        for observe in self.observers:
            observe(message, layers, states)
        writer.send(message)

    def send(
        self,
        writer: LogWriter,
        name: str,
        tags: Tags,
        t0: int,
        path: int,
        ids: np.ndarray,
        hs: np.ndarray,
        cs: np.ndarray | None,
        t: int | None,
        init: tuple[np.ndarray, np.ndarray] | None,
        per_step: bool = False,
    ) -> None:
        """Rows with their host states hs/cs (L, N, T', H; ``per_step``: a multi-step call's (L, T', N, H)) to
        the sink, with the train rows' drifts: as their figures where the log keeps no vectors
        (``drift.reduced``: a summary log's rows never cross the pipe as states), else the states themselves."""
        layers = int(hs.shape[0])
        drift = self.train_drift(name, tags, t0, hs, cs, per_step)
        if self.reduces:
            rows = Rows(name, tags, t0, path, ids, reduced(hs, cs, drift, per_step), None, t, init)
            self.hand_over(writer, rows, layers, (hs, cs))
        elif self.partial is not None:  # only the traced envs' vectors cross; every row's figures do
            batch, steps = (hs.shape[2], hs.shape[1]) if per_step else (hs.shape[1], hs.shape[2])
            keys = grid_keys(tags.grid, t0, steps, layers, batch)
            kept = (
                np.zeros(layers * batch * steps, np.bool_)
                if keys is None
                else (keys[1] >= 0) & (keys[1] < self.partial)
            )
            figures = reduced(hs, cs, drift, per_step, kept)
            self.hand_over(writer, Rows(name, tags, t0, path, ids, figures, None, t, init), layers, (hs, cs))
        elif per_step:
            call = int(ids[0]) if len(ids) else 0
            self.hand_over(writer, SequenceCall(name, tags, call, hs, cs, init, drift), layers)
        else:
            self.hand_over(writer, Rows(name, tags, t0, path, ids, hs, cs, t, init, drift), layers)
