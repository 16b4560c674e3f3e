"""The contract between the tracer core and an integration: what a framework tells the core about a call.

An integration (``lstm_probe/integrations/``) answers the tracer's :data:`Resolver` with :class:`Tags`:
the call's phase and place in training, and a :class:`Grid` that maps each batch column and timestep
to an env, env step and episode. The core, the writer and the reader never import an integration.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lstm_probe.log.schema import CODE, COLUMN, COLUMNS, Column
from lstm_probe.log.schema import CODES as CODES  # re-exported: the string columns' values

PHASE = CODE["phase"]
PATH = CODE["path"]
BOOTSTRAP = CODE["bootstrap"]
SEQ_REASON = CODE["seq_reason"]
CAPTURES = ("full", "summary")

GRID_CELLS: tuple[Column, ...] = tuple(c for c in COLUMNS if c.source == "grid" or c.cell)
"""The columns a :class:`Grid` carries per batch column and timestep, (N, T)."""
GRID_SEQUENCES: tuple[Column, ...] = tuple(c for c in COLUMNS if c.source == "sequence")
"""The columns a train :class:`Grid` carries per sequence, (N,)."""
_CELL_NAMES = tuple(c.name for c in GRID_CELLS)
_GRID_NAMES = frozenset(_CELL_NAMES) | {c.name for c in GRID_SEQUENCES}
USER_TAGS = tuple(c.name for c in COLUMNS if c.user)
"""The keys of ``Tracer.tag()``: the user-taggable :class:`Tags` fields and :class:`Grid` columns."""
USER_CALL_TAGS = tuple(c.name for c in COLUMNS if c.user and c.source == "tags")
"""The ``Tracer.tag()`` keys that are :class:`Tags` fields (one value per call)."""
USER_GRID_TAGS = tuple(c.name for c in GRID_CELLS if c.user)
"""The ``Tracer.tag()`` keys that are :class:`Grid` columns (a value per batch column, or per step)."""


class Grid:
    """Provenance of one call's batch columns and timesteps: one array per :data:`GRID_CELLS` column of
    the schema (env, env_step, episode, episode_step, episode_start, padding, worker, bootstrap), each
    (N, T) in that column's buffer dtype and null convention (``schema.Column``: -1 means null; a vector
    column, obs or info, (N, T, width) float32, NaN means null). A column
    the grid does not carry (None) is null in every row (padding: False); for ``bootstrap``, a call-level
    column a grid may refine per cell, the call's ``Tags.bootstrap`` applies instead.

    ``train`` grids also number sequences (seq = batch column, t = timestep) and carry the
    :data:`GRID_SEQUENCES` columns (each sequence's unpadded length and start reason), shape (N,).

    Built with keywords (``Grid(env=..., env_step=..., padding=..., train=True, seq_len=...)``); every
    column is an attribute, and can be set later (``grid.worker = ...``).
    """

    train: bool
    batch_columns: np.ndarray | None
    """A train grid's columns' places in the call's batch (the rows' ``seq``), where some were left out
    (:meth:`take`); None: column i is batch column i."""

    def __init__(self, *, train: bool = False, **columns: np.ndarray | None) -> None:
        unknown = columns.keys() - _GRID_NAMES
        if unknown:
            raise TypeError(f"Grid has no column {sorted(unknown)[0]!r}; its columns: {', '.join(sorted(_GRID_NAMES))}")
        d = self.__dict__
        d["train"] = train
        d["batch_columns"] = None
        for name in _GRID_NAMES:
            d[name] = columns.get(name)

    @staticmethod
    def of(columns: Mapping[str, np.ndarray | None], train: bool = False) -> Grid:
        """``Grid(train=train, **columns)`` for columns named at run time."""
        return Grid(train=train, **columns)

    def __getattr__(self, name: str) -> np.ndarray | None:  # for type checkers: the columns are attributes
        raise AttributeError(f"Grid has no column {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in ("train", "batch_columns") and name not in _GRID_NAMES:
            raise AttributeError(f"Grid has no column {name!r}")
        self.__dict__[name] = value

    def __repr__(self) -> str:
        carried = ", ".join(name for name in _CELL_NAMES if self.__dict__[name] is not None)
        return f"Grid({carried}; shape={self.shape}, train={self.train})"

    @property
    def shape(self) -> tuple[int, int]:
        d = self.__dict__
        for name in _CELL_NAMES:
            v = d[name]
            if v is not None:
                n, t = v.shape[:2]
                return n, t
        raise ValueError("a Grid that carries no column has no shape")

    @staticmethod
    def one_step(env: Any, env_step: Any, episode: Any, episode_step: Any, episode_start: Any, **cells: Any) -> Grid:
        """The grid of a one-step call from per-column values (length-N arrays or scalars; -1 = null);
        any other grid column by keyword."""
        given = {
            "env": env,
            "env_step": env_step,
            "episode": episode,
            "episode_step": episode_step,
            "episode_start": episode_start,
            **cells,
        }
        n = np.size(env)
        columns = {
            name: np.broadcast_to(np.asarray(v, COLUMN[name].dtype).reshape(-1), (n,))[:, None]
            for name, v in given.items()
        }
        for c in GRID_CELLS:  # padding: none in a one-step call
            if c.name not in columns and not c.nullable and c.source == "grid":
                columns[c.name] = np.full((n, 1), c.fill, c.dtype)
        return Grid.of(columns)

    def initial(self) -> Grid:
        """The one-column grid of the states a train call's sequences started from: the step before each
        sequence's first step (each column as its ``Column.initial`` says: the first step's value; for
        step counters the value one step earlier, null where the sequence starts an episode)."""
        d = self.__dict__
        first_step = d["episode_step"]
        before = first_step[:, :1] > 0 if first_step is not None else False
        columns: dict[str, np.ndarray | None] = {c.name: d[c.name] for c in GRID_SEQUENCES}
        for c in GRID_CELLS:
            v = d[c.name]
            if v is None or c.initial == "null":
                continue
            columns[c.name] = v[:, :1] if c.initial == "first" else np.where(before, v[:, :1] - 1, c.fill)
        grid = Grid.of(columns, train=True)
        grid.batch_columns = d["batch_columns"]
        return grid

    def take(self, columns: np.ndarray) -> Grid:
        """The grid of the batch columns ``columns`` (indices), in that order. A contiguous run of columns
        (``--other-envs none``'s kept envs) gives views: values an integration fills in later (TorchRL's
        provenance, settled at a block's hand-over) reach the grid taken before."""
        d = self.__dict__
        n, at = len(columns), int(columns[0]) if len(columns) else 0
        run = n > 0 and np.array_equal(columns, np.arange(at, at + n))
        cols: Any = slice(at, at + n) if run else columns
        kept = {name: (None if d[name] is None else d[name][cols]) for name in _GRID_NAMES}
        grid = Grid.of(kept, train=self.train)
        places = d["batch_columns"]
        grid.batch_columns = (np.arange(self.shape[0]) if places is None else places)[columns]
        return grid

    @staticmethod
    def concat(grids: list[Grid]) -> Grid:
        """Grids of non-train calls stacked along the batch axis (a column some grids lack is null there)."""
        if len(grids) == 1:
            return grids[0]
        columns = {}
        for c in GRID_CELLS:
            parts = [g.__dict__[c.name] for g in grids]
            if all(v is None for v in parts):
                continue
            tail = next(v for v in parts if v is not None).shape[2:]  # a vector column's width
            columns[c.name] = np.concatenate(
                [
                    v if v is not None else np.full(g.shape + tail, c.fill, c.dtype)
                    for v, g in zip(parts, grids, strict=True)
                ]
            )
        return Grid.of(columns)


@dataclass
class Tags:
    """What a call is. ``stepwise`` counts the one-step calls each module made under these tags.

    Every ``tags`` column of the schema is a field of the same name (None: null)."""

    phase: str = "other"
    iteration: int | None = None
    epoch: int | None = None
    minibatch: int | None = None
    bootstrap: str | None = None
    grid: Grid | None = None
    stepwise: dict[str, int] = field(default_factory=dict)
    learner: int | None = None
    path: str | None = None
    """How the framework ran a one-step train call when its shape cannot tell: 'sequence' (one call over
    sequences that all have one step) or 'stepwise' (its per-step loop, one step long); None: 'step'."""


TAG_COLUMNS = tuple(c.name for c in COLUMNS if c.source == "tags")
"""The schema's call-level columns: each is a :class:`Tags` field of the same name."""
_missing = [name for name in TAG_COLUMNS if name not in Tags.__dataclass_fields__]
if _missing:
    raise TypeError(f"schema column(s) {_missing} come from the call's tags: declare them as Tags fields")
tag_values: Callable[[Tags], tuple[Any, ...]] = operator.attrgetter(*TAG_COLUMNS)
"""The values of a call's :data:`TAG_COLUMNS`, as a tuple (calls with equal values share their rows'
call-level columns)."""


Resolver = Callable[[str, int, int], Tags]


OPTIONAL = ("returns", "rollout_start", "rollout_zeroed", "cycling_minibatches")
"""The :class:`Capabilities` fields a log's metadata holds only where the integration declares them."""


@dataclass(frozen=True)
class Capabilities:
    """What a framework's logs can hold, declared by its integration and stored in the log's metadata
    (``capabilities``). Report sections and the HTML page ask these, never the framework's name."""

    framework: str = "generic"
    shards: bool = False
    """One writer per process (part files per process): cross-process checks and summed costs apply."""
    epochs: bool = False
    """Train rows carry an ``epoch`` (a minibatch belongs to one pass over the rollout)."""
    rollout_buffer: bool = False
    """Training sequences are cut from a rollout buffer (sb3): starts at a shuffling split point or a
    minibatch cut."""
    max_seq_len: int | None = None
    """Training chunks are cut at this length (RLlib); None where the framework has no such cut."""
    stored_states: bool = False
    """Training sequences start from states stored during the rollout."""
    replay: bool = False
    """The integration keeps a rollout's inputs and can re-run a minibatch on a copy of the policy from other
    initial states (the *evaluate* capability: what-if, ``--what-if``)."""
    respond: bool = False
    """The integration can re-run a rollout on a copy of the policy with its state ablated (the *respond*
    capability: the memory horizon, ``--memory``)."""
    observe: bool = False
    """The integration can keep each rollout step's observation beside its rows (the *observe* capability: the
    ``obs`` column, linear probes, ``--capture-obs``)."""
    returns: bool = False
    """The integration records the episodes that ended in each iteration, their returns and lengths (the *returns*
    capability: the log's ``returns`` metadata, the report's returns line)."""
    cycling_minibatches: bool = False
    """A train row's ``minibatch`` numbers it in its whole update, whose minibatches cycle through the batch across
    epoch boundaries (one minibatch may straddle two epochs), so train rows carry no epoch: the staleness trend over
    training takes each iteration's last minibatch (the update's latest weights), as it takes a loop of epochs' last
    epoch. Logs that do not declare it (written before it was) get no such trend, and report as they did."""
    rollout_start: str | None = None
    """Where a rollout's first step takes its state from by the framework's design, where that is not the state the
    previous rollout's last step left: 'training' (the state training's last pass over the previous rollout ended
    with; rsl_rl's distillation). The doctor words such a start so; None: the previous rollout's last step."""
    rollout_zeroed: dict[str, str] = field(default_factory=dict)
    """Modules whose state the framework zeroes at every rollout's first step by design while their episodes go on,
    each with what its outputs are: 'targets' (the training targets another module learns to copy; rsl_rl's
    distillation: the teacher). The doctor words those zero starts so, with their consequence, not as a bug."""

    def to_dict(self) -> dict[str, Any]:
        """The fields, less the :data:`OPTIONAL` ones where not declared (the metadata of the logs that declare none
        of them is as before)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in OPTIONAL or getattr(self, k)}

    @staticmethod
    def from_metadata(meta: dict[str, Any]) -> Capabilities:
        """A log's capabilities: as stored, or, for logs written before they were, derived from the
        framework that wrote it (the only place that names frameworks on the reading side)."""
        stored = meta.get("capabilities")
        framework = str(meta.get("framework") or "generic")
        if isinstance(stored, dict):
            known = {k: v for k, v in stored.items() if k in Capabilities.__dataclass_fields__}
            zeroed = known.pop("rollout_zeroed", None)  # module -> what its outputs are (strings from the file)
            if isinstance(zeroed, dict):
                known["rollout_zeroed"] = {str(k): str(v) for k, v in zeroed.items()}
            if framework == "sb3" and "respond" not in known:  # an sb3 log from before they were declared
                known |= {"replay": True, "respond": True, "observe": True}  # what sb3's integration provides
            return Capabilities(**known)
        if framework == "sb3":
            return Capabilities(
                "sb3", epochs=True, rollout_buffer=True, stored_states=True, replay=True, respond=True, observe=True
            )
        if framework == "rllib":
            # the training settings' one place (hyperparameters); a log from before it kept them, its rllib block
            held = [b for b in (meta.get("hyperparameters"), meta.get("rllib")) if isinstance(b, dict)]
            msl = next((b["max_seq_len"] for b in held if "max_seq_len" in b), None)
            # what RLlib's integration provides: what-if, memory, observations (integrations/rllib/)
            return Capabilities(
                "rllib", shards=True, max_seq_len=msl, stored_states=True, replay=True, respond=True, observe=True
            )
        return Capabilities(framework)


# -- the integration contract (what a framework tells the core) ----------------------------------------


@runtime_checkable
class Integration(Protocol):
    """What a framework tells the tracer core (``lstm_probe.capture.tracer.CoreTracer``). Each module under
    ``lstm_probe/integrations/`` meets it (sb3: ``ProbeCallback``; RLlib: each process's probe; the
    generic tracer: ``GenericIntegration``); the core never imports one."""

    @property
    def name(self) -> str:
        """The log's ``framework`` ('sb3', 'rllib', 'generic', ...)."""
        ...

    def capabilities(self) -> Capabilities:
        """What this framework's logs hold; stored in the log's metadata under ``capabilities``."""
        ...

    def metadata(self) -> dict[str, Any]:
        """What the log's metadata says about the run (model, env, hyperparameters), read when the
        tracer is made."""
        ...

    def resolve(self, module: str, steps: int, batch: int) -> Tags:
        """The :class:`Tags` (phase, place in training, provenance :class:`Grid`) of a call of ``module``
        over ``steps`` timesteps and ``batch`` columns (the :data:`Resolver`); called from the hooks."""
        ...


def padded(tags: Tags, valid: np.ndarray) -> Tags:
    """The tags of a call on a PackedSequence (the tracer's hook), from the integration's: ``valid`` (T, N)
    is False after a sequence's end. Those steps become padding rows (``padding`` True, every nullable grid column null
    there); the batch columns are numbered as sequences (``seq``, ``t``) with their unpadded lengths."""
    pad = ~valid.T  # (N, T)
    steps = pad.shape[1]
    grid = tags.grid
    columns: dict[str, np.ndarray | None] = {}
    for col in GRID_CELLS:
        v = getattr(grid, col.name) if grid is not None else None
        if v is not None and col.nullable:
            columns[col.name] = np.where(pad, col.fill, v[:, :steps]).astype(col.dtype, copy=False)
    columns["padding"] = pad
    columns["seq_len"] = valid.sum(axis=0).astype(np.int32)
    for col in GRID_SEQUENCES:
        v = getattr(grid, col.name) if grid is not None and grid.train else None
        if col.name != "seq_len":
            columns[col.name] = v if v is not None else np.full(pad.shape[0], col.fill, col.dtype)
    return replace(tags, grid=Grid.of(columns, train=True), stepwise={})
