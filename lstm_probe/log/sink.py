"""The sink: blocks of host states in, rows of one log out (provenance, layout, norms), written through
``writer.py``. The numbers that need the run's other states (each multi-step call's per-step c, drift
against the rollout states) come computed with the rows, from the training process (``drift.Drift``).

:class:`~lstm_probe.log.logwriter.LogWriter` hands the sink its blocks: in a writer process of its own
(``writer_process.py``) or on a writer thread of the training process. The sink never imports torch.
Every column is filled by what its declaration says (``schema.Column.source``): the call's own columns
here, ``tags`` columns from the call's :class:`~lstm_probe.contract.Tags`, ``grid`` and ``sequence``
columns from its :class:`~lstm_probe.contract.Grid` (null where the call has none), ``state`` columns
from the states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lstm_probe.contract import GRID_CELLS, GRID_SEQUENCES, PATH, Grid, Tags
from lstm_probe.log import messages
from lstm_probe.log.messages import Reduced
from lstm_probe.log.schema import CODE, COLUMNS, row_norms

if TYPE_CHECKING:  # pyarrow loads only where rows are written (the writer process or thread)
    from lstm_probe.log.writer import Rows
    from lstm_probe.options import WriterConfig

_TAG_FILLS = [(c.name, c.fill, CODE.get(c.name)) for c in COLUMNS if c.source == "tags"]
"""Each tags column: its name (the Tags field), its null, its codes (string columns)."""
_GRID_FILLS = [(c.name, c.fill, c.source == "grid") for c in GRID_CELLS]
"""Each per-cell grid column: its name, its null, whether a grid that lacks it writes the null (False: a
call-level column the grid may refine, whose call value stays)."""
_NO_GRID = [(c.name, c.fill) for c in COLUMNS if c.source in ("grid", "sequence")]
"""What rows without provenance hold in the grid's columns: each one's null."""


class Sink:
    """Turns blocks of states into rows of one log (see the module docstring); ``config`` is plain data
    (``LogWriter.config``), so the sink can be built in another process."""

    def __init__(self, config: WriterConfig):
        from lstm_probe.log.writer import FileLog

        c = config
        self.log = FileLog(
            c.out,
            c.hidden_size,
            c.modules,
            c.metadata,
            c.codes,
            float16=c.float16,
            part_seconds=c.part_seconds,
            part_rows=c.part_rows,
            shard=c.shard,
            vectors=c.vectors,
            part_iterations=c.part_iterations,
            sparse=c.sparse_vectors,
            threads=c.encode_threads,
            always=c.encode_always,
        )
        self.module_code = {n: i for i, n in enumerate(c.modules)}
        self.hidden = c.hidden_size
        self.capture, self.every = c.capture, c.every
        self.trace_envs = c.trace_envs  # full vectors for env columns below it only
        self.traced = c.traced  # --trace-envs given: vectors whatever the capture mode, none on padding rows

    def take(self, message: messages.Message | messages.Batch) -> None:
        """One message from the training process (``messages.py``): the one way data reaches the sink."""
        kind = type(message)
        if kind is messages.Rows:
            m: Any = message
            self.rows(m.name, m.tags, m.t0, m.path, m.call, m.hs, m.cs, m.t, m.init, m.drift)
        elif kind is messages.SequenceCall:
            m = message
            self.sequence(m.name, m.tags, m.call, m.hs, m.cs, m.init, m.drift)
        elif kind is messages.Progress:
            self.progress(message.values)  # type: ignore[union-attr]
        elif kind is messages.Batch:
            for one in message.messages:  # type: ignore[union-attr]
                self.take(one)
        else:
            raise TypeError(f"the sink takes Rows, SequenceCall, Progress or Batch messages, not {kind.__name__}")

    def progress(self, progress: dict[str, Any]) -> None:
        self.log.progress = progress

    def sequence(
        self,
        name: str,
        tags: Tags,
        call: int,
        hs: np.ndarray,
        cs: np.ndarray | None,
        init: tuple[np.ndarray, np.ndarray] | None = None,
        drift: messages.Drifts | None = None,
    ) -> None:
        """Rows of one multi-step call: hs/cs (L, T, N, H) per-step h and c of every layer (``cs`` None for a
        GRU); ``init`` and ``drift`` as :meth:`rows`'."""
        hs = hs.transpose(0, 2, 1, 3)  # (L, N, T, H): views, copied once, into the row buffers
        cs = cs.transpose(0, 2, 1, 3) if cs is not None else None
        batch, steps = hs.shape[1], hs.shape[2]
        self.rows(name, tags, 0, PATH["sequence"], np.full(batch * steps, call, np.int64), hs, cs, None, init, drift)

    def rows(
        self,
        name: str,
        tags: Tags,
        t0: int,
        path: int,
        call: np.ndarray,
        hs: np.ndarray | Reduced,
        cs: np.ndarray | None,
        t: int | None = None,
        init: tuple[np.ndarray, np.ndarray] | None = None,
        drift: messages.Drifts | None = None,
    ) -> None:
        """Rows of one call (or of one per-timestep loop): hs/cs (L, N, T', H), rows ordered layer, column, t;
        or ``hs`` the rows' norms and drifts already reduced from their states (a summary log's rows,
        ``drift.reduced``; ``cs`` None). ``t`` overrides the rows' step column (-1 for the
        initial-state rows). ``init``: where each column's input state came from, (N,) `init` codes and
        (L, N) norms, for the rows of each column's first step (the tracer computes them, ``inputs.py``);
        the other rows' are null; ``drift`` the rows' (drift_h, drift_c, found) (None: no row has one).
        Writer thread or process."""
        grid = tags.grid
        layers, batch, steps = hs.shape[0], hs.shape[1], hs.shape[2]
        per_layer = batch * steps
        n = layers * per_layer
        log = self.log
        r, i0 = log.reserve(n, tags.phase == "train", tags.iteration)
        i1 = i0 + n
        r.call[i0:i1] = np.tile(call, layers) if layers > 1 else call
        r.module[i0:i1] = self.module_code[name]
        r.layer[i0:i1] = np.repeat(np.arange(layers, dtype=np.int16), per_layer)
        r.path[i0:i1] = path
        buffers = r.buffers
        for col, null, codes in _TAG_FILLS:
            v = getattr(tags, col)
            buffers[col][i0:i1] = null if v is None else v if codes is None else codes[v]
        if grid is not None and grid.shape[0] == batch and t0 + steps <= grid.shape[1]:
            self._fill_grid(r, i0, i1, grid, t0, steps, layers)
        else:
            self._fill_null(r, i0, i1, path, call, t0, steps, layers)
        if t is not None:
            r.t[i0:i1] = t
        it = tags.iteration
        kept = self.capture == "full" or self.traced  # traced envs: whatever the capture mode
        r.vectors[i0:i1] = kept and (it is None or it % self.every == 0)
        if self.trace_envs is not None:  # the other envs' rows: summary rows (a null env, padding: one too)
            env = r.env[i0:i1]
            r.vectors[i0:i1] &= (env >= 0) & (env < self.trace_envs)  # -1: a null env (padding, untagged)
        elif self.traced:  # --other-envs none: the kept columns only arrive; their padding rows as under summary
            r.vectors[i0:i1] &= ~r.buffers["padding"][i0:i1]
        reduced: Reduced | None = None
        if isinstance(hs, Reduced):
            reduced = hs
            self._reduced(r, i0, i1, reduced)
        else:
            self._states(r, i0, i1, hs, cs)
        r.init[i0:i1] = -1
        r.init_norm[i0:i1] = np.nan
        if init is not None:
            first = i0 + np.arange(layers)[:, None] * per_layer + np.arange(batch)[None, :] * steps  # (L, N)
            r.init[first] = init[0]
            r.init_norm[first] = init[1]
        if reduced is not None:  # its drifts came with it
            drift = reduced.drift
        if drift is not None:
            r.drift_h[i0:i1], r.drift_c[i0:i1], r.has_drift[i0:i1] = drift
        else:
            r.has_drift[i0:i1] = False
        log.commit(n)

    def _states(
        self, r: Rows, i0: int, i1: int, hs: np.ndarray, cs: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The rows' states into their buffers (a full log's) and their norms; (n, H) views of h and c in
        row order (c None without one)."""
        # copied straight into the row buffers (hs/cs are often transposed views: reshaping them to (n, H)
        # first would be a second copy); a summary log's buffers hold no vectors, and a reshape copies only
        # where it must
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
            h = hs.reshape(i1 - i0, self.hidden)
            c = cs.reshape(i1 - i0, self.hidden) if cs is not None else None
            if r.kept is not None:  # few rows keep their vectors (kept.py): those rows' only, flagged above
                at = np.flatnonzero(r.vectors[i0:i1])
                r.kept.add(i0 + at, h[at], c[at] if c is not None else None)
        r.has_c[i0:i1] = cs is not None
        r.h_norm[i0:i1] = row_norms(h)
        if cs is not None:
            assert c is not None
            r.c_norm[i0:i1] = row_norms(c)
        else:
            r.c_norm[i0:i1] = 0.0
        return h, c

    @staticmethod
    def _reduced(r: Rows, i0: int, i1: int, reduced: Reduced) -> None:
        """A reduced block's norms (a summary log's buffers hold no vectors), and the vectors of the rows that
        keep them under --trace-envs (the other rows' vectors are null: their buffer rows are never read)."""
        r.has_c[i0:i1] = reduced.c_norm is not None
        r.h_norm[i0:i1] = reduced.h_norm
        r.c_norm[i0:i1] = reduced.c_norm if reduced.c_norm is not None else 0.0
        if reduced.kept is None:
            assert r.h is None, "only a summary log's rows come reduced"
            return
        assert reduced.h is not None
        rows = i0 + np.flatnonzero(reduced.kept)
        if r.kept is not None:  # a log where few rows keep their vectors (kept.py): those flagged (not --every's)
            flagged = r.vectors[rows]
            if flagged.all():
                r.kept.add(rows, reduced.h, reduced.c)
            else:
                r.kept.add(rows[flagged], reduced.h[flagged], None if reduced.c is None else reduced.c[flagged])
            return
        assert r.h is not None and r.c is not None
        r.h[rows] = reduced.h
        r.c[rows] = reduced.c if reduced.c is not None else 0.0

    @staticmethod
    def _fill_grid(r: Rows, i0: int, i1: int, grid: Grid, t0: int, steps: int, layers: int) -> None:
        def cols(a: np.ndarray) -> np.ndarray:
            v = a[:, t0 : t0 + steps]
            # (N * T',) column-major order: n, then t; vector columns (N, T, width) -> (N * T', width)
            v = v.reshape(-1) if v.ndim == 2 else v.reshape(-1, v.shape[2])
            return v if layers == 1 else np.tile(v, layers) if v.ndim == 1 else np.tile(v, (layers, 1))

        buffers = r.buffers
        for col, null, own in _GRID_FILLS:
            v = getattr(grid, col)
            if v is not None:
                buffers[col][i0:i1] = cols(v)
            elif own:
                buffers[col][i0:i1] = null
        if grid.train:
            batch = grid.shape[0]
            places = grid.batch_columns  # the kept columns' own places (--other-envs none), else 0..N-1
            seq = np.repeat(np.arange(batch, dtype=np.int32) if places is None else places.astype(np.int32), steps)
            t = np.tile(np.arange(t0, t0 + steps, dtype=np.int32), batch)
            r.seq[i0:i1] = np.tile(seq, layers)
            r.t[i0:i1] = np.tile(t, layers)
            for c in GRID_SEQUENCES:
                v = getattr(grid, c.name)
                assert v is not None, f"a train grid carries {c.name}"
                buffers[c.name][i0:i1] = np.tile(np.repeat(v, steps), layers)
        else:
            r.seq[i0:i1] = -1
            r.t[i0:i1] = 0
            for c in GRID_SEQUENCES:
                buffers[c.name][i0:i1] = c.fill

    @staticmethod
    def _fill_null(r: Rows, i0: int, i1: int, path: int, call: np.ndarray, t0: int, steps: int, layers: int) -> None:
        """Rows without provenance (a call no integration tagged): every grid column null, but each row
        still says where in its call it sits: ``seq`` the batch column, ``t`` the step."""
        for col, null in _NO_GRID:
            r.buffers[col][i0:i1] = null
        per_layer = len(call)  # (N * T',) in column-major order: n, then t
        if path == PATH["step"]:  # one-step calls side by side (T' = 1): the column within each call
            pos = np.arange(per_layer)
            seq = pos - np.searchsorted(call, call)
        else:  # one call (sequence) or one call per step (stepwise): the batch columns
            seq = np.repeat(np.arange(per_layer // steps), steps)
        t = np.tile(np.arange(t0, t0 + steps), per_layer // steps)
        r.seq[i0:i1] = np.tile(seq, layers) if layers > 1 else seq
        r.t[i0:i1] = np.tile(t, layers) if layers > 1 else t

    def write_due(self) -> None:
        """Write and publish what has waited ``part_seconds`` (``FileLog.write_due``)."""
        self.log.write_due()

    def close(self, final: dict[str, Any]) -> None:
        self.log.close(final)

    def fail(self, final: dict[str, Any]) -> None:
        """The writer failed: publish what was finished, marked not completed with the cause."""
        self.log.fail(final)
