"""The contract between the tracer core and an integration: what a framework tells the core about a call.

An integration (``lstm_probe/integrations/``) answers the tracer's :data:`Resolver` with :class:`Tags`:
the call's phase and place in training, and a :class:`Grid` that maps each batch column and timestep
to an env, env step and episode. The core, the writer and the reader never import an integration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lstm_probe.schema import BOOTSTRAPS, PATHS, PHASES, SEQ_REASONS

CODES: dict[str, tuple[str, ...]] = {"phase": PHASES, "path": PATHS, "bootstrap": BOOTSTRAPS, "seq_reason": SEQ_REASONS}
PHASE = {p: i for i, p in enumerate(PHASES)}
PATH = {p: i for i, p in enumerate(PATHS)}
BOOTSTRAP = {b: i for i, b in enumerate(BOOTSTRAPS)}
SEQ_REASON = {r: i for i, r in enumerate(SEQ_REASONS)}
CAPTURES = ("full", "summary")


@dataclass
class Grid:
    """Provenance of one call's batch columns and timesteps: every array is (N, T); -1 means null.

    ``train`` grids also number sequences (seq = batch column, t = timestep) and carry each
    sequence's unpadded length and start reason, shape (N,).
    """

    env: np.ndarray
    env_step: np.ndarray
    episode: np.ndarray
    episode_step: np.ndarray
    episode_start: np.ndarray  # int8: -1 null, 0, 1
    padding: np.ndarray  # bool
    train: bool = False
    seq_len: np.ndarray | None = None
    seq_reason: np.ndarray | None = None
    worker: np.ndarray | None = None  # (N, T) int32, -1 null; None: null everywhere (one-process runs)
    bootstrap: np.ndarray | None = None  # (N, T) int8 code per cell; None: the call's Tags.bootstrap

    @property
    def shape(self) -> tuple[int, int]:
        n, t = self.env.shape
        return n, t

    @staticmethod
    def one_step(env: Any, env_step: Any, episode: Any, episode_step: Any, episode_start: Any) -> Grid:
        """The grid of a one-step call from per-column values (length-N arrays or scalars; -1 = null)."""
        env = np.asarray(env, np.int32).reshape(-1)
        n = len(env)

        def col(v: Any, dtype: Any) -> np.ndarray:
            return np.broadcast_to(np.asarray(v, dtype).reshape(-1), (n,))[:, None]

        return Grid(
            env=env[:, None],
            env_step=col(env_step, np.int64),
            episode=col(episode, np.int64),
            episode_step=col(episode_step, np.int64),
            episode_start=col(episode_start, np.int8),
            padding=np.zeros((n, 1), np.bool_),
        )

    def initial(self) -> Grid:
        """The one-column grid of the states a train call's sequences started from: the step before each
        sequence's first step (null env_step and episode_step where the sequence starts an episode)."""
        first = self.episode_step[:, :1]
        before = first > 0
        return Grid(
            env=self.env[:, :1],
            env_step=np.where(before, self.env_step[:, :1] - 1, -1),
            episode=self.episode[:, :1],
            episode_step=np.where(before, first - 1, -1),
            episode_start=np.full_like(self.episode_start[:, :1], -1),
            padding=self.padding[:, :1],
            train=True,
            seq_len=self.seq_len,
            seq_reason=self.seq_reason,
            worker=None if self.worker is None else self.worker[:, :1],
        )

    @staticmethod
    def concat(grids: list[Grid]) -> Grid:
        """Grids of non-train calls stacked along the batch axis."""
        if len(grids) == 1:
            return grids[0]

        def cat(field: str) -> np.ndarray:
            return np.concatenate([getattr(g, field) for g in grids])

        def cat_opt(field: str, fill: int, dtype: Any) -> np.ndarray | None:
            if all(getattr(g, field) is None for g in grids):
                return None
            return np.concatenate(
                [v if (v := getattr(g, field)) is not None else np.full(g.shape, fill, dtype) for g in grids]
            )

        return Grid(
            env=cat("env"),
            env_step=cat("env_step"),
            episode=cat("episode"),
            episode_step=cat("episode_step"),
            episode_start=cat("episode_start"),
            padding=cat("padding"),
            worker=cat_opt("worker", -1, np.int32),
            bootstrap=cat_opt("bootstrap", -1, np.int8),
        )


@dataclass
class Tags:
    """What a call is. ``stepwise`` counts the one-step calls each module made under these tags."""

    phase: str = "other"
    iteration: int | None = None
    epoch: int | None = None
    minibatch: int | None = None
    bootstrap: str | None = None
    grid: Grid | None = None
    stepwise: dict[str, int] = field(default_factory=dict)
    learner: int | None = None


Resolver = Callable[[str, int, int], Tags]


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
    """The integration keeps a rollout's inputs and can re-run a minibatch on a copy of the policy
    (counterfactual initial states, memory ablations)."""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @staticmethod
    def from_metadata(meta: dict[str, Any]) -> Capabilities:
        """A log's capabilities: as stored, or, for logs written before they were, derived from the
        framework that wrote it (the only place that names frameworks on the reading side)."""
        stored = meta.get("capabilities")
        if isinstance(stored, dict):
            known = {k: v for k, v in stored.items() if k in Capabilities.__dataclass_fields__}
            return Capabilities(**known)
        framework = str(meta.get("framework") or "generic")
        if framework == "sb3":
            return Capabilities("sb3", epochs=True, rollout_buffer=True, stored_states=True)
        if framework == "rllib":
            rl = meta.get("rllib") or {}
            msl = rl.get("max_seq_len") if isinstance(rl, dict) else None
            return Capabilities("rllib", shards=True, max_seq_len=msl, stored_states=True)
        return Capabilities(framework)


# -- the integration contract (what a framework tells the core) ----------------------------------------


@runtime_checkable
class Integration(Protocol):
    """What a framework tells the tracer core (``lstm_probe.tracer.Tracer``). Each module under
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
