"""What the training process hands the sink: one declared message type per kind of data, never a method
name. :class:`Rows` (a block or one call's states, or their reduced figures), :class:`SequenceCall` (a
multi-step call's per-step h and c), :class:`Progress` (the live progress figures), :class:`Batch` (several of
them in order, as one message: a writer process's batched jobs, ``LogWriter.submit``). The numbers the
training process computes (drifts: ``drift.Drift``) come with the rows; the sink lays them out.
``LogWriter.send`` puts them into the writer process's pipe (pickled, arrays out of band) or hands them to
the writer thread's sink; ``Sink.take`` is the one receiver. Numpy and the core's plain types only:
the writer process imports this module and never loads torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from lstm_probe.contract import Tags

Drifts = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Each row's (drift_h, drift_c, found), in the sink's row order (``drift.Drift.rows``)."""


@dataclass(frozen=True)
class Reduced:
    """A block's rows as a summary log keeps them, reduced where the states were (``drift.reduced``):
    ``shape`` (layers, columns, steps); per row, in the sink's row order, the norms (float64; ``c_norm`` None
    for a GRU) and the drift against the rollout states (``drift``: (drift_h, drift_c, found), None where
    no row can have one). Under ``--trace-envs`` some rows keep their vectors: ``kept`` (a bool per row, sink
    order; None: none does) and their ``h``/``c`` (k, H) in row order (``c`` None for a GRU)."""

    shape: tuple[int, int, int]
    h_norm: np.ndarray
    c_norm: np.ndarray | None
    drift: Drifts | None
    kept: np.ndarray | None = None
    h: np.ndarray | None = None
    c: np.ndarray | None = None


@dataclass(slots=True)
class Rows:
    """Rows of one call, one block of one-step calls side by side, or one per-timestep loop (``Sink.rows``):
    ``hs``/``cs`` (L, N, T', H) the states, rows ordered layer, column, step; or ``hs`` the rows' figures
    already reduced where the states were (a summary log's rows, ``drift.reduced``; ``cs`` None). ``call``
    (N * T',) each column's (and step's) call id; ``t0`` the block's first step in its grid; ``path`` the
    schema's path code; ``t`` overrides the rows' step column (-1: a sequence's initial
    state); ``init`` the `init` codes (N,) and input norms (L, N) of each column's first step; ``drift``
    the rows' drifts (None: none has one; a reduced block brings its own)."""

    name: str
    tags: Tags
    t0: int
    path: int
    call: np.ndarray
    hs: np.ndarray | Reduced
    cs: np.ndarray | None
    t: int | None = None
    init: tuple[np.ndarray, np.ndarray] | None = None
    drift: Drifts | None = None


@dataclass(slots=True)
class SequenceCall:
    """One multi-step call (``Sink.sequence``): ``hs``/``cs`` (L, T, N, H) per-step h and c of every layer
    (``cs`` None for a GRU; the layout the recovery gives, transposed by the sink into its row buffers);
    ``init`` and ``drift`` as :class:`Rows`'. (A train call's initial states follow as a :class:`Rows`
    with ``t`` -1.)"""

    name: str
    tags: Tags
    call: int
    hs: np.ndarray
    cs: np.ndarray | None
    init: tuple[np.ndarray, np.ndarray] | None = None
    drift: Drifts | None = None


@dataclass(slots=True)
class Progress:
    """The live progress figures (rows, calls, ...) a display reads from the log's journal."""

    values: dict[str, Any]


Message = Rows | SequenceCall | Progress
"""Every kind of data the sink takes (``Sink.take``), alone or in a :class:`Batch`."""


@dataclass(slots=True)
class Batch:
    """Messages taken in order, as one (``LogWriter.submit``'s batched jobs): one pickle and one read for
    the writer process, and a Tags object several of them share pickled once."""

    messages: list[Message]
