"""The generic torch integration: calls are tagged by the user (``with probe.tag(phase=..., env=...)``).

``lstm_probe.trace(model, out)`` hooks every recurrent module of any torch model; a training loop says
what each call is with :meth:`Tracer.tag` blocks. :class:`GenericIntegration` turns the innermost
block's tags into the core's :class:`~lstm_probe.contract.Tags`, and declares what the user tagged as
the log's capabilities. ``trace(..., what_if=True)`` and :meth:`Tracer.measure_batch` give the loop what-if
(``own_measure.py``: the loop passes its rollout, minibatch and a function that evaluates it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from lstm_probe.capture.life import Probe, Tagged, refuse_unstarted
from lstm_probe.capture.modules import find_recurrent
from lstm_probe.capture.returns import Live
from lstm_probe.capture.tracer import CoreTracer
from lstm_probe.contract import PHASE, USER_CALL_TAGS, USER_GRID_TAGS, USER_TAGS, Capabilities, Grid, Tags
from lstm_probe.errors import BadInput
from lstm_probe.integrations.own_measure import Copy, Inputs, OwnWhatIf, starts_of
from lstm_probe.integrations.own_memory import Heads, OwnMemory
from lstm_probe.integrations.own_returns import OwnReturns
from lstm_probe.log.schema import COLUMN, PHASES
from lstm_probe.options import AUTO_WINDOW, CaptureOptions, Measure, capture_options, route, settle

TAGS = USER_TAGS  # the schema's user-taggable columns
PROVENANCE = USER_GRID_TAGS
_UNTAGGED: dict[str, Any] = {}  # the tags of a call outside every block


class GenericIntegration(Tagged):
    """Tags from the user's nested ``tag()`` blocks (see :meth:`Tracer.tag`)."""

    name = "generic"
    tag_keys = TAGS
    tag_refusal = f"tags are {', '.join(TAGS)}"

    def __init__(self, metadata: dict[str, Any] | None = None):
        self._metadata = dict(metadata or {})
        self._user: list[dict[str, Any]] = []
        self._cache: dict[tuple[int, int, int], Tags] = {}
        self._cached: dict[str, Any] | None = None  # the block whose calls' tags _cache holds
        self._epochs = False
        self.replay = False  # a minibatch was measured (Tracer.measure_batch)
        self.respond = False  # a rollout's memory horizon was measured (Tracer.measure_batch)
        self.returns = False  # episodes were handed over (Tracer.episodes, Tracer.rewards)

    def capabilities(self) -> Capabilities:
        """framework 'generic'; ``epochs`` once a call was tagged with an epoch; ``replay`` (what-if) and
        ``respond`` (the memory horizon) once :meth:`Tracer.measure_batch` measured them; ``returns`` once the loop
        handed over episodes (:meth:`Tracer.episodes`, :meth:`Tracer.rewards`)."""
        return Capabilities(
            "generic", epochs=self._epochs, replay=self.replay, respond=self.respond, returns=self.returns
        )

    def metadata(self) -> dict[str, Any]:
        return dict(self._metadata)

    def _check_tags(self, tags: dict[str, Any]) -> None:
        if "phase" in tags and tags["phase"] not in PHASE:
            raise BadInput(f"phase must be one of {', '.join(PHASES)}, not {tags['phase']!r}")

    def resolve(self, module: str, steps: int, batch: int) -> Tags:
        """Tags of a call from the innermost ``tag()`` block. A tag given as an (N, T) or (1, T) array
        with T > 1 describes a sequence; one-step calls inside the block then walk along it (a
        per-timestep loop over a sequence batch, path 'stepwise')."""
        user = self._user[-1] if self._user else _UNTAGGED
        if user is not self._cached:  # another block than the cached tags': they are no longer asked for
            self._cache.clear()
            self._cached = user
        prov = {k: user[k] for k in PROVENANCE if user.get(k) is not None}
        width = max([steps] + [np.shape(v)[-1] for v in prov.values() if np.ndim(v) == 2])
        key = (id(user), batch, width)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        tags = Tags(**{k: user[k] for k in USER_CALL_TAGS if k in user})
        if prov or tags.phase == "train":

            def col(key: str, dtype: Any) -> np.ndarray:
                if key not in prov:
                    return np.full((batch, width), -1, dtype)
                v = np.asarray(prov[key]).astype(dtype)
                if v.ndim == 1:
                    v = v[:, None]
                try:
                    return np.broadcast_to(v, (batch, width))
                except ValueError:
                    raise BadInput(
                        f"tag {key} has shape {np.shape(prov[key])}, which does not fit a call of "
                        f"batch {batch} over {width} step(s); give a scalar, ({batch},), ({batch}, "
                        f"{width}) or (1, {width})"
                    ) from None

            tags.grid = Grid.of({k: col(k, COLUMN[k].dtype) for k in PROVENANCE}, train=tags.phase == "train")
            if tags.grid.train:
                tags.grid.seq_len = np.full(batch, width, np.int32)
                tags.grid.seq_reason = np.full(batch, -1, np.int8)
        self._cache[key] = tags
        return tags


class Tracer(Probe, CoreTracer):
    """The core tracer with the generic integration: calls are tagged with :meth:`tag`. It is its own core
    tracer (its figures are the tracer's: ``calls``, ``rows``, ``metadata``, ``writer``, ...) and a
    :class:`~lstm_probe.capture.life.Probe`: ``start()``, ``close()``, ``with``.

    ``Tracer(modules, out, metadata, capture=..., ...)`` or ``Tracer(modules, options=CaptureOptions(...))``;
    :func:`trace` finds the modules for you.
    """

    integration: GenericIntegration

    def __init__(
        self,
        modules: Any,
        out: str | os.PathLike[str] | None = None,
        metadata: dict[str, Any] | None = None,
        *,
        options: CaptureOptions | None = None,
        shard: str | None = None,
        **capture: Any,
    ):
        super().__init__(modules, capture_options(options, out, **capture), GenericIntegration(metadata), shard=shard)
        self.what_if: OwnWhatIf | None = None  # trace(..., what_if=True)
        self.memory: OwnMemory | None = None  # trace(..., memory=True)
        self._step_hook: Any = None
        self._live: tuple[int, list[Live]] | None = None  # (iteration, what_if and memory records to publish)
        self.own_returns = OwnReturns()  # the episodes the loop hands over (own_returns.py)

    def _core(self) -> CoreTracer:
        return self

    def _attach(self) -> None:
        w = self.what_if
        if w is not None and w.optimizer is not None:  # the gradient the loop steps with
            self._step_hook = w.optimizer.register_step_pre_hook(w.step_hook)

    def _detach(self) -> None:
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None

    def _final(self) -> dict[str, Any]:
        measured = {k: m.metadata() for k, m in (("what_if", self.what_if), ("memory", self.memory)) if m is not None}
        self.own_returns.flush()
        self.own_returns.publish(self)
        return {k: v for k, v in measured.items() if v is not None}

    def episodes(self, returns: Any, lengths: Any, *, iteration: int | None = None) -> None:
        """Episodes that ended in ``iteration``: their returns and lengths (one value each, host values: e.g.
        gymnasium's ``RecordEpisodeStatistics`` ``info["episode"]["r"]`` and ``["l"]`` where an episode ended).
        ``iteration``: the enclosing ``tag()`` block's where not given. The report's returns line and the log's
        ``returns`` record (source 'user') come from them."""
        refuse_unstarted(self)
        self.integration.returns = True
        if self.own_returns.episodes(returns, lengths, self._iteration(iteration, "episodes")):
            self.own_returns.publish(self)  # the last iteration's

    def rewards(self, rewards: Any, dones: Any, *, iteration: int | None = None, started: Any = True) -> None:
        """One env step's ``rewards`` and ``dones`` (one per env, as ``env.step`` gave them): each env's rewards are
        summed until its episode ends (source 'rewards'). Numpy arrays are summed on the host; torch tensors on
        their device, copied to the host once per iteration (no wait per step). ``iteration``: the enclosing
        ``tag()`` block's where not given. ``started``: the envs at an episode's first step at the first call (by
        default all): an episode under way then is partial, not counted. Where the log's ``autoreset_mode`` is
        NEXT_STEP (``trace(envs=...)``), an env's step after its done (the no-op autoreset step, reward 0) is left
        out of the episodes' sums and lengths, as gymnasium's ``RecordEpisodeStatistics`` leaves it."""
        refuse_unstarted(self)
        self.integration.returns = True
        next_step = self.integration._metadata.get("autoreset_mode") == "NextStep"
        if self.own_returns.rewards(rewards, dones, self._iteration(iteration, "rewards"), started, next_step):
            self.own_returns.publish(self)  # the last iteration's

    def _iteration(self, given: int | None, what: str) -> int:
        user = self.integration._user[-1] if self.integration._user else {}
        it = user.get("iteration") if given is None else given
        if it is None:
            raise BadInput(f"{what} needs iteration= (or a tag() block around it that gives one)")
        return int(it)

    def measure_batch(
        self,
        evaluate: Any,
        *,
        obs: Any,
        episode_start: Any,
        rollout_states: Any,
        states: Any,
        values: Any = None,
        env: Any = None,
        step: Any = 0,
        iteration: int | None = None,
        epoch: int | None = None,
        minibatch: int | None = None,
    ) -> None:
        """What-if and the memory horizon, called before each training minibatch's loss (nothing unless
        ``trace(..., what_if=True)`` or ``memory=True``; on a private copy of the model: training is untouched).
        What-if on the minibatches it samples: ``evaluate(model, states)``, the loop's forward and loss on this
        minibatch from ``states``, on the ``model`` it is given, returning a dict (values, log_prob, loss,
        returns; entropy, policy_loss, value_loss, clip_fraction, dist where it has them). The memory horizon at
        the first call of each rollout (its weights). The rollout, step-major: ``obs`` (T, N, ...),
        ``episode_start`` (T, N), ``rollout_states`` (at its first step, or before each step), ``values`` (T, N;
        memory only). The minibatch: its sequences' ``env`` and first ``step``, the ``states`` the loop trains it
        with. ``iteration``, ``epoch``, ``minibatch`` and ``env``: those of the enclosing ``tag()`` block where
        not given. docs/own-loops.md shows each on CleanRL's loop."""
        if self.what_if is None and self.memory is None:
            return
        user = self.integration._user[-1] if self.integration._user else {}
        given = {"iteration": iteration, "epoch": epoch, "minibatch": minibatch, "env": env}
        got = {k: user.get(k) if v is None else v for k, v in given.items()}
        missing = [k for k, v in got.items() if v is None]
        if missing:
            raise BadInput(f"measure_batch needs {', '.join(missing)} (or a tag() block around it that gives them)")
        where = (int(got["iteration"] or 0), int(got["epoch"] or 0), int(got["minibatch"] or 0))
        if self._live is None or self._live[0] != where[0]:  # the iterations before into every part from now on
            measured = (("what_if", self.what_if), ("memory", self.memory))
            self._live = (where[0], self._live[1] if self._live else [Live(k, m.metadata) for k, m in measured if m])
            for live in self._live[1]:
                live.publish(self)
        copy = (self.memory or self.what_if).copy  # type: ignore[union-attr]
        with copy.precision(rollout_states):  # the loop's autocast, read from its states' dtype
            if self.memory is not None:
                starts = starts_of(episode_start)
                if self.memory.measure(where[0], obs, starts, rollout_states, values):
                    self.integration.respond = True
            if self.what_if is not None:
                kw = {"obs": obs, "episode_start": episode_start, "rollout_states": rollout_states, "states": states}
                if self.what_if.measure_batch(evaluate, where, env=got["env"], step=step, **kw):
                    self.integration.replay = True

    def tag(self, **tags: Any) -> contextlib.AbstractContextManager[None]:
        """Tag every call inside the block: phase, iteration, epoch, minibatch, env, env_step, episode,
        episode_step, episode_start (scalars, or arrays with one value per batch column).
        Nested blocks add to and override the outer ones."""
        refuse_unstarted(self)
        return self.integration.tag(**tags)


def trace(
    model: nn.Module,
    out: str | Path | None = None,
    *,
    modules: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    shard: str | None = None,
    options: CaptureOptions | None = None,
    measure: Measure | None = None,
    optimizer: Any = None,
    epochs: int = 1,
    minibatches: int = 1,
    inputs: Inputs | None = None,
    heads: Heads | None = None,
    envs: Any = None,
    **capture: Any,
) -> Tracer:
    """Trace every nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell in ``model`` (or those named in ``modules``).

    Use as a context manager; tag calls with ``probe.tag(phase=..., iteration=..., env=..., ...)``.
    ``out``: the log [run.parquet], a file or a directory ending in '/'.
    ``shard`` names this process's part files when several processes (workers) write one directory log
    (``out`` ending in ``/``); readers then take the directory as one log.
    The capture settings: ``options`` (a :class:`~lstm_probe.options.CaptureOptions`), and keyword
    arguments of its fields' names, which override it: ``capture`` ('full' or 'summary'), ``every``,
    ``float16``, ``force``, ``writer`` ('process': a writer process of its own, the default where pipes can
    be polled, i.e. not on Windows; 'thread'), ``part_seconds``, ``part_iterations`` and
    ``reference_window`` (the env steps of rollout states kept per env, so that train rows get ``drift_h`` /
    ``drift_c`` against the rollout state of the same (env, env_step) and the report its provenance check and
    staleness: by default as many as the rollout between two training calls holds; 0 keeps none). Each is
    documented on :class:`~lstm_probe.options.CaptureOptions`.

    What-if (docs/own-loops.md): ``what_if=True`` (``what_if_every``, ``burn_in``: a
    :class:`~lstm_probe.options.Measure`'s fields, or ``measure=``), then :meth:`Tracer.measure_batch` before
    each minibatch's loss; ``epochs`` and ``minibatches``: how many of each the loop runs per rollout (which
    it samples); ``optimizer``: the gradient comparison (a step pre-hook); ``inputs(model, obs)``: the
    recurrent modules' inputs from observations (by default the observations). The memory horizon:
    ``memory=True`` (``memory_every``) and ``heads(model, hidden)``: the policy's ``dist`` and ``values`` from
    the recurrent modules' outputs.

    ``envs``: the loop's vector env (or its autoreset mode itself: a gymnasium ``AutoresetMode`` or its name), whose
    ``metadata["autoreset_mode"]`` goes into the log's metadata (``autoreset_mode``): the doctor says what a
    NEXT_STEP env (gymnasium >= 1.1's default) means for the state resets and the training data.
    """
    cap, me = route(capture, (CaptureOptions, Measure), "trace")
    m = settle(Measure, measure, me)
    if m.capture_obs or m.info_keys:
        raise BadInput(
            "an own loop gives what-if and memory; capture_obs and info are not built for it: for linear probes "
            "pass your own values to lstm_probe.probe(log, target) as a DataFrame with env, env_step, value"
        )
    opts = capture_options(options, out, **cap)
    if "reference_window" not in cap and opts.reference_window == 0:  # the rollout's own length
        opts = dataclasses.replace(opts, reference_window=AUTO_WINDOW)
    found = find_recurrent(model, modules)
    if envs is not None:
        metadata = {**(metadata or {}), "autoreset_mode": autoreset_mode(envs)}
    tracer = Tracer(found, metadata=metadata, options=opts, shard=shard)
    copy = Copy(model, list(found), inputs) if m.what_if or m.memory else None
    if copy is not None and m.what_if:
        tracer.what_if = OwnWhatIf(
            copy, epochs=epochs, minibatches=minibatches, every=m.what_if_every, burn_in=m.burn_in, optimizer=optimizer
        )
    if copy is not None and m.memory:
        tracer.memory = OwnMemory(copy, heads, every=m.memory_every)
    return tracer


AUTORESET_MODES = ("NextStep", "SameStep", "Disabled")
"""gymnasium's ``AutoresetMode`` values (gymnasium >= 1.1), as the log's ``autoreset_mode`` metadata holds them."""


def autoreset_mode(envs: Any) -> str:
    """The autoreset mode of a vector env (its ``metadata["autoreset_mode"]``), or of a mode given itself (a
    gymnasium ``AutoresetMode``, or its value or name in any case: 'NextStep', 'next_step'), as gymnasium's value."""
    meta = getattr(envs, "metadata", None)
    mode = meta.get("autoreset_mode") if isinstance(meta, dict) else envs
    mode = getattr(mode, "value", mode)  # an AutoresetMode: its value
    if isinstance(mode, str):
        key = mode.replace("_", "").lower()
        for value in AUTORESET_MODES:
            if key == value.lower():
                return value
    raise BadInput(
        f"envs: {type(envs).__name__} has no autoreset mode the probe knows (a gymnasium >= 1.1 vector env's "
        f"metadata['autoreset_mode'] holds it); pass the mode itself, one of {', '.join(AUTORESET_MODES)}"
    )
