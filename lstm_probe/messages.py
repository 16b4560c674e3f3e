"""What the training process hands the sink: one declared message type per kind of data, never a method
name. :class:`Rows` (a block or one call's states, or their reduced figures), :class:`SequenceCall` (a
multi-step call's per-step h and what its c is recovered from), :class:`Progress` (the live progress
figures). ``LogWriter.send`` puts them into the writer process's pipe (pickled, arrays out of band) or hands
them to the writer thread's sink; ``Sink.take`` is the one receiver. Numpy and the core's plain types only:
the writer process imports this module and never loads torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from lstm_probe.contract import Tags
    from lstm_probe.drift import Reduced
    from lstm_probe.recover import Cells


@dataclass(slots=True)
class Rows:
    """Rows of one call, one block of one-step calls side by side, or one per-timestep loop (``Sink.rows``):
    ``hs``/``cs`` (L, N, T', H) the states, rows ordered layer, column, step; or ``hs`` the rows' figures
    already reduced where the states were (a summary log's per-step training loops, ``drift.py``; ``cs``
    None). ``call`` (N * T',) each column's (and step's) call id; ``t0`` the block's first step in its grid;
    ``path`` the schema's path code; ``t`` overrides the rows' step column (-1: a sequence's initial
    state); ``init`` the `init` codes (N,) and input norms (L, N) of each column's first step."""

    name: str
    tags: Tags
    t0: int
    path: int
    call: np.ndarray
    hs: np.ndarray | Reduced
    cs: np.ndarray | None
    t: int | None = None
    init: tuple[np.ndarray, np.ndarray] | None = None


@dataclass(slots=True)
class SequenceCall:
    """One multi-step call (``Sink.sequence``): ``hs`` (L, T, N, H) per-step h of every layer; ``cells``
    what an LSTM's per-step c is computed from (``recover.Cells``; None for a GRU); ``initial`` the
    (L, N, H) states it started from (written as t = -1 rows for a train call of whole sequences);
    ``init`` as :class:`Rows`'."""

    name: str
    tags: Tags
    call: int
    hs: np.ndarray
    cells: Cells | None
    initial: tuple[np.ndarray, np.ndarray | None] | None
    init: tuple[np.ndarray, np.ndarray] | None = None


@dataclass(slots=True)
class Progress:
    """The live progress figures (rows, calls, ...) a display reads from the log's journal."""

    values: dict[str, Any]


Message = Rows | SequenceCall | Progress
"""Every kind of data the sink takes (``Sink.take``)."""
