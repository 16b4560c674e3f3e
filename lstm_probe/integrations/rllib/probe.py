"""Ray RLlib (new API stack) probes: every env runner and learner process traces its own LSTM calls.

``probe_config(config, "runs/cp/")`` adds three things to a PPOConfig, all picklable so Ray ships them to
every process:

- an ``on_episode_created`` callback that attaches a tracer to the env runner's RLModule the first time
  the runner creates an episode, and wraps the module's ``forward_exploration`` / ``forward_inference``
  on the instance to tag each rollout call (``env/single_agent_env_runner.py:SingleAgentEnvRunner._sample``
  calls them once per vectorized env step with batch column i = env i and input (n_envs, 1, F));
- an ``on_episode_end`` callback that marks in ``episode.custom_data`` that the episode really ended;
- a learner connector piece that runs in each learner, right after PPO's
  ``connectors/learner/add_one_ts_to_episodes_and_truncate.py:AddOneTsToEpisodesAndTruncate`` (prepended
  by ``algorithms/ppo/ppo_learner.py:PPOLearner.build``), and adds one int64 column of provenance per
  timestep. RLlib's own ``AddTimeDimToBatchAndZeroPad`` then chunks it into max_seq_len pieces and
  zero-pads it exactly like the observations, and the minibatch iterator slices it along with them, so
  the learner's ``forward_train`` and ``compute_values`` calls receive the provenance of every batch
  cell with their own batch.

Provenance travels inside the episodes: the env runner writes ``custom_data["lstm_probe"]`` (worker,
env, per-env episode counter, the env step the episode began at) when it first acts on an episode;
``SingleAgentEpisode.cut`` deep-copies custom_data into the continuation chunk, and episodes reach the
learners whole. Nothing goes through the driver: each process writes its own part files
(``part-runner<k>-*.parquet``, ``part-learner<r>-*.parquet``) into one directory, which the readers
take as one log.

Facts relied on (RLlib 2.60): after an episode ends, ``_sample`` makes one more forward pass on that
episode's terminal observation and state (the next episode object is created but not yet reset:
``SingleAgentEpisode.is_reset`` is False) and throws the action away; those rows are tagged
``bootstrap='terminal'``. PPO's learner evaluates each episode chunk plus one appended timestep (the
chunk's last observation again), so its train and value rows at that step are tagged 'terminal' or
'last' too.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.utils import force_list
from torch import nn

from lstm_probe.capture.life import Probe
from lstm_probe.capture.modules import describe_modules
from lstm_probe.capture.returns import Live, Returns
from lstm_probe.capture.tracer import CoreTracer
from lstm_probe.contract import BOOTSTRAP, SEQ_REASON, Capabilities, Grid, Tags
from lstm_probe.errors import BadInput
from lstm_probe.integrations.rllib import chunks, memory, whatif
from lstm_probe.integrations.rllib.model import gradient_flow, lstms
from lstm_probe.integrations.rllib.settings import config_metadata
from lstm_probe.options import CaptureOptions, Measure, capture_options, route, settle

KEY = "lstm_probe"
"""Key of the probe's entry in ``SingleAgentEpisode.custom_data`` and prefix of its batch column."""
COLUMN = "lstm_probe_provenance"
# Fields of COLUMN, one int64 vector per timestep. VALID is 0 on RLlib's zero padding.
VALID, WORKER, ENV, EPISODE, EPISODE_STEP, ENV_STEP, BOOT, CHUNK_START = range(8)
FIELDS = 8


@dataclass(frozen=True)
class Options(CaptureOptions):
    """What every process needs to open its shard of the log (pickled to Ray actors): the capture
    settings and the run's metadata."""

    metadata: dict[str, Any] = field(default_factory=dict)
    what_if: dict[str, Any] | None = None
    """The what-if settings (``whatif.settings``; None: off), for the learners."""
    memory: dict[str, Any] | None = None
    """The memory-horizon settings (``memory.settings``; None: off), for the learners."""
    capture_obs: bool = False
    """Keep each rollout step's observation (flattened, float32) in its rows: the ``obs`` column."""


# Every probe this process opened, so close() reaches them from Ray's foreach_* calls.
_OPEN: list[Any] = []
_RUNNER_PROBES: weakref.WeakKeyDictionary[Any, RolloutProbe] = weakref.WeakKeyDictionary()
_LEARNER_PROBES: weakref.WeakKeyDictionary[Any, LearnerProbe] = weakref.WeakKeyDictionary()


MEASURES = ("what_if", "what_if_every", "burn_in", "memory", "memory_every", "capture_obs")
"""The :class:`~lstm_probe.options.Measure` fields RLlib takes (``Framework.refuses`` names the rest)."""
CALL_BLOCK = 10**12
LEARNER_BLOCK = 1000
EVAL_WORKER = 2000


def _with_obs_size(opts: Options, module: Any) -> Options:
    """``opts`` with ``obs_size`` in its metadata when observations are kept (every shard's schema has the ``obs``
    column this wide: the RLModule's observation space, flattened, the same in every process)."""
    if not opts.capture_obs:
        return opts
    shape = getattr(module.observation_space, "shape", None)
    if not shape:
        raise BadInput(f"--capture-obs needs an array observation space, not {module.observation_space}")
    return dataclasses.replace(opts, metadata={**opts.metadata, "obs_size": int(np.prod(shape))})


def _tracer(modules: dict[str, nn.Module], probe: _Probe, shard: str, call_base: int) -> CoreTracer:
    # force: probe_config() cleared the directory on the driver; a shard owns only its files
    options = dataclasses.replace(probe.options, force=True)
    return CoreTracer(modules, options, probe, initial_states=True, call_base=call_base, shard=shard)


class _Probe(Probe):
    """One process's tracer; ``tags`` is set around each forward pass of the RLModule and read by the hooks.
    Each probe is the RLlib :class:`~lstm_probe.contract.Integration` of its process, and a
    :class:`~lstm_probe.capture.life.Probe` (``close``: :func:`close` reaches it in every process)."""

    name = "rllib"
    tags: Tags | None = None
    tracer: CoreTracer
    options: Options

    def capabilities(self) -> Capabilities:
        """One writer per process; training chunks are cut at max_seq_len and start from stored states."""
        hp = self.options.metadata.get("hyperparameters") or {}
        return Capabilities(
            "rllib",
            shards=True,
            max_seq_len=hp.get("max_seq_len"),
            stored_states=True,
            replay=True,  # what_if=True (in each learner: whatif.py)
            respond=True,  # memory=True (in each learner: memory.py)
            observe=True,  # capture_obs=True (the env runners' rollout rows)
            returns=True,  # each env runner's episodes (RolloutProbe.episode_ended)
            cycling_minibatches=True,  # LearnerProbe.minibatch counts through the update (MiniBatchCyclicIterator)
        )

    def metadata(self) -> dict[str, Any]:
        return dict(self.options.metadata)

    def resolve(self, name: str, steps: int, batch: int) -> Tags:
        return self.tags if self.tags is not None else Tags()


class RolloutProbe(_Probe):
    """The tracer of one env runner: tags each rollout call with (worker, env, episode, step)."""

    def __init__(self, env_runner: Any, opts: Options):
        module = env_runner.module
        if module is None:
            raise BadInput("this env runner has no RLModule to trace")
        self.runner = env_runner
        self.options = _with_obs_size(opts, module)
        index = int(env_runner.worker_index or 0)
        # Evaluation env runners number from 1 like the training ones: their own shard names and a worker
        # id of EVAL_WORKER + k keep (worker, env) unique across the log.
        evaluation = bool(getattr(env_runner.config, "in_evaluation", False))
        self.worker = EVAL_WORKER + index if evaluation else index
        self.evaluation = evaluation
        shard = f"evalrunner{index}" if evaluation else f"runner{index}"
        n = int(env_runner.num_envs)
        self.env_steps = np.zeros(n, np.int64)  # forward passes made for each env so far
        self.episodes = np.zeros(n, np.int64)  # episodes begun in each env so far
        self.last: list[tuple[Any, dict[str, int]] | None] = [None] * n
        self.tracer = _tracer(lstms(module), self, shard, self.worker * CALL_BLOCK)
        # the episodes this runner ended, by its weights' version (an evaluation runner's: marked so, counted apart)
        self.returns = Returns("rllib", evaluation=evaluation)
        self._returns_at = -1
        self.start()
        for name, explore in (("forward_exploration", True), ("forward_inference", False)):
            setattr(module, name, self._wrap(getattr(module, name), explore))
        _OPEN.append(self)

    def _wrap(self, fn: Callable[..., Any], explore: bool) -> Callable[..., Any]:
        @functools.wraps(fn)
        def forward(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            self.tags = self._step_tags("rollout" if explore and not self.evaluation else "predict")
            if self.options.capture_obs:  # the observation the module takes: (n_envs, 1, ...) on the runner
                self.tags.grid.obs = _flat_obs(args[0] if args else kwargs["batch"])  # type: ignore[union-attr]
            self.tracer.integration_seconds += time.perf_counter() - start
            try:
                return fn(*args, **kwargs)
            finally:
                self.tags = None
                self.env_steps += 1

        return forward

    def episode_ended(self, episode: Any, chunks: list[Any]) -> None:
        """An episode ended (``on_episode_end``): its return and length as RLlib's own metrics count them
        (``env/single_agent_env_runner.py:SingleAgentEnvRunner.get_metrics``: this chunk's plus the chunks already
        returned, ``prev_episode_chunks``), under the iteration its rows carry (the weights' version)."""
        it = int(getattr(self.runner, "_weights_seq_no", 0))
        if it != self._returns_at:  # the last iteration's record is whole: written with the next part
            self.returns.publish(self.tracer)
            self._returns_at = it
        ret = float(episode.get_return()) + sum(float(c.get_return()) for c in chunks)
        self.returns.ended(it, [ret], [len(episode) + sum(len(c) for c in chunks)])

    def _final(self) -> dict[str, Any]:
        return {"returns": self.returns.record()}

    def _step_tags(self, phase: str) -> Tags:
        episodes = self.runner._ongoing_episodes
        n = len(episodes)
        if n != len(self.env_steps):
            raise BadInput(f"the env runner has {n} episodes for {len(self.env_steps)} envs")
        step = np.empty(n, np.int64)
        episode = np.empty(n, np.int64)
        env_step = np.empty(n, np.int64)
        boot = np.full(n, -1, np.int8)
        for i, ep in enumerate(episodes):
            if ep is not None and ep.is_reset:
                info = ep.custom_data.get(KEY)
                if info is None:  # first forward pass on this episode
                    info = {
                        "worker": self.worker,
                        "env": i,
                        "episode": int(self.episodes[i]),
                        "env_step0": int(self.env_steps[i]) - int(ep.t),
                    }
                    self.episodes[i] += 1
                    ep.custom_data[KEY] = info
                self.last[i] = (ep, info)
                t = int(ep.t)
            else:
                # The episode in this column ended on the previous step; RLlib evaluates its terminal
                # observation once more before the autoreset (the action is discarded).
                last = self.last[i]
                if last is None:
                    step[i] = episode[i] = env_step[i] = -1
                    continue
                ep, info = last
                t = int(ep.t)
                boot[i] = BOOTSTRAP["terminal"]
            step[i] = t
            episode[i] = info["episode"]
            env_step[i] = self.env_steps[i]
        grid = Grid.one_step(np.arange(n), env_step, episode, step, np.where(step < 0, -1, step == 0))
        grid.worker = np.full((n, 1), self.worker, np.int32)
        grid.bootstrap = boot[:, None]
        it = int(getattr(self.runner, "_weights_seq_no", 0))
        if it >= self.returns.iterations and not self.evaluation:  # the training iterations (not evaluation's)
            self.returns.at(it)
        return Tags(phase=phase, iteration=it, grid=grid)


def _flat_obs(batch: Any) -> np.ndarray:
    """A rollout call's observations as the grid's (n_envs, 1, width) float32 column (a copy: the writer reads it
    later). Env runners step on the CPU: the copy waits for no device (on a GPU runner it would, once per step)."""
    from ray.rllib.core.columns import Columns

    obs = batch[Columns.OBS]
    if isinstance(obs, torch.Tensor):
        x = obs.detach().to("cpu", torch.float32, copy=True).numpy()
    else:
        x = np.array(obs, np.float32)
    return x.reshape(len(x), 1, -1)


class LearnerProbe(_Probe):
    """The tracer of one learner: tags the whole-batch value pass and each minibatch's forward_train."""

    def __init__(self, module: Any, opts: Options, rank: int, module_id: str = "default_policy"):
        self.rank = rank
        # the copy is made before the module's methods are wrapped (chunks.py: measurements on a copy)
        replica = None if opts.what_if is None and opts.memory is None else chunks.Replica(module, "--what-if/--memory")
        self.what_if = None if opts.what_if is None else whatif.WhatIf(replica, module_id, **opts.what_if)  # type: ignore[arg-type]
        self.memory = None if opts.memory is None else memory.Memory(replica, **opts.memory)  # type: ignore[arg-type]
        # their records, kept in this learner's writer's progress: every part carries them (a killed run keeps them)
        self.live = [Live(k, m.metadata) for k, m in (("what_if", self.what_if), ("memory", self.memory)) if m]
        self.update = -1
        self.minibatch = 0
        modules = lstms(module)
        try:
            flow: dict[str, Any] = gradient_flow(module)
        except Exception as exc:  # the log matters more than the architecture record
            flow = {"verdict": None, "batch": f"not measured ({type(exc).__name__}: {exc})"}
        shared = len(modules) == 1
        architecture = {
            "modules": describe_modules(modules),
            "shared_lstm": shared,
            "critic": "shared" if shared else "lstm",
            "gradient_flow": flow,
        }
        opts = _with_obs_size(opts, module)
        self.options = dataclasses.replace(opts, metadata={**opts.metadata, "architecture": architecture})
        self.tracer = _tracer(modules, self, f"learner{rank}", (LEARNER_BLOCK + rank) * CALL_BLOCK)
        self.start()
        module.forward_train = self._wrap(module.forward_train, "train")
        module.compute_values = self._wrap(module.compute_values, "value")
        _OPEN.append(self)

    def new_update(self) -> None:
        """An update begins (its batch through the learner connector): the last update's training calls cross
        to the writer (one message), and this one's are batched until the next (``CoreTracer.batch_jobs``)."""
        self.update += 1
        self.minibatch = 0
        self.tracer.batch_jobs(False, timed=False)  # (inside the connector's timed call)
        self.tracer.batch_jobs(True)

    def _detach(self) -> None:
        if self.what_if is not None:
            self.what_if.close()

    def _final(self) -> dict[str, Any]:
        final = {
            "what_if": None if self.what_if is None else self.what_if.metadata(),
            "memory": None if self.memory is None else self.memory.metadata(),
        }
        return {k: v for k, v in final.items() if v is not None}

    def _wrap(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def forward(batch: Any, *args: Any, **kwargs: Any) -> Any:
            prov = batch.get(COLUMN) if isinstance(batch, dict) else None
            outer = self.tags
            if outer is None:  # compute_values called inside forward_train keeps the train tags
                start = time.perf_counter()
                self.tags = Tags(
                    phase=phase,
                    iteration=self.update,
                    minibatch=self.minibatch if phase == "train" else None,
                    grid=None if prov is None else train_grid(prov),
                    learner=self.rank,
                )
                self.tracer.integration_seconds += time.perf_counter() - start
                if phase == "train" and self.what_if is not None:  # before the learner trains on it (a copy)
                    locate = None if prov is None else functools.partial(_sequence_starts, prov)
                    self.what_if.on_minibatch(batch, locate, self.update, self.minibatch)
            try:
                return fn(batch, *args, **kwargs)
            finally:
                if outer is None:
                    self.tags = None
                    if phase == "train":
                        self.minibatch += 1

        return forward


def _sequence_starts(prov: Any) -> np.ndarray:
    """Each sequence's (worker, env, episode, chunk start, episode step) at its first step, from a learner call's
    (B, T, FIELDS) provenance column (what-if locates its sequences in the update's chunks by them)."""
    first = prov[:, 0].detach().cpu().numpy() if isinstance(prov, torch.Tensor) else np.asarray(prov)[:, 0]
    return first[:, [WORKER, ENV, EPISODE, CHUNK_START, EPISODE_STEP]].astype(np.int64)


def train_grid(prov: Any) -> Grid:
    """The grid of a learner call from its (B, T, FIELDS) provenance column."""
    p = prov.detach().cpu().numpy() if isinstance(prov, torch.Tensor) else np.asarray(prov)
    p = p.astype(np.int64, copy=False)
    valid = p[..., VALID] == 1
    pad = ~valid

    def col(i: int, dtype: Any) -> np.ndarray:
        return np.where(valid, p[..., i], -1).astype(dtype)

    step = col(EPISODE_STEP, np.int64)
    grid = Grid(
        env=col(ENV, np.int32),
        env_step=col(ENV_STEP, np.int64),
        episode=col(EPISODE, np.int64),
        episode_step=step,
        episode_start=np.where(valid, step == 0, -1).astype(np.int8),
        padding=pad,
        train=True,
        worker=col(WORKER, np.int32),
        bootstrap=np.where(valid, p[..., BOOT], -1).astype(np.int8),
    )
    grid.seq_len = valid.sum(axis=1).astype(np.int32)
    first = p[:, 0]
    reason = np.where(
        first[:, EPISODE_STEP] == 0,
        SEQ_REASON["episode_start"],
        np.where(
            first[:, EPISODE_STEP] == first[:, CHUNK_START], SEQ_REASON["env_boundary"], SEQ_REASON["max_seq_len"]
        ),
    )
    grid.seq_reason = np.where(valid[:, 0], reason, -1).astype(np.int8)
    return grid


# -- the pieces probe_config() puts into the config ---------------------------------------------------
def _on_episode_created(opts: Options, *, env_runner: Any = None, **kwargs: Any) -> None:
    if env_runner is None or env_runner in _RUNNER_PROBES:
        return
    _RUNNER_PROBES[env_runner] = RolloutProbe(env_runner, opts)


def _on_episode_end(*, episode: Any = None, env_runner: Any = None, **kwargs: Any) -> None:
    info = getattr(episode, "custom_data", {}).get(KEY)
    if info is not None:
        info["ended"] = True
    probe = _RUNNER_PROBES.get(env_runner) if env_runner is not None else None
    if probe is not None:
        probe.episode_ended(episode, list(kwargs.get("prev_episode_chunks") or []))


def _learner_rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    return 0


def _build_connector(opts: Options, user: Any, obs_space: Any = None, act_space: Any = None) -> list[Any]:
    ours = ProvenanceConnector(obs_space, act_space, options=opts)
    return [ours] if user is None else [ours, *force_list(user(obs_space, act_space))]


class ProvenanceConnector(ConnectorV2):  # type: ignore[misc]
    """Adds the probe's provenance column to the train batch (first custom piece of each learner's pipeline)."""

    def __init__(self, input_observation_space: Any = None, input_action_space: Any = None, **kwargs: Any):
        self.options: Options = kwargs.pop("options")
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def __call__(
        self, *, rl_module: Any, batch: dict[str, Any], episodes: list[Any], shared_data: Any = None, **kwargs: Any
    ) -> Any:
        probe = _learner_probe(rl_module, self.options)
        start = time.perf_counter()
        probe.new_update()
        appended = bool((shared_data or {}).get("_added_loss_mask_for_valid_episode_ts"))
        if probe.what_if is not None or probe.memory is not None:  # the update's chunks, re-run on a copy
            listed = list(self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False))
            read = chunks.read(listed, KEY, (probe.what_if or probe.memory).replica)  # type: ignore[union-attr]
            if probe.memory is not None:
                probe.memory.on_update(probe.update, read)
            if probe.what_if is not None:
                probe.what_if.on_update(probe.update, read, sum(len(sa) for sa in listed))
            for live in probe.live:  # memory (this update's) and what-if (the updates before) into every part
                live.publish(probe.tracer)
        for sa in self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False):
            self.add_n_batch_items(
                batch, COLUMN, items_to_add=provenance(sa, appended), num_items=len(sa), single_agent_episode=sa
            )
        probe.tracer.integration_seconds += time.perf_counter() - start
        return batch


def provenance(sa: Any, appended: bool) -> np.ndarray:
    """The (len(sa), FIELDS) provenance rows of one episode chunk in a learner batch."""
    n = len(sa)
    rows = np.full((n, FIELDS), -1, np.int64)
    rows[:, VALID] = 1
    info = sa.custom_data.get(KEY)
    if info is None:  # collected without the probe's callbacks: provenance unknown, rows stay null
        return rows
    steps = int(sa.t_started) + np.arange(n)
    rows[:, WORKER] = info["worker"]
    rows[:, ENV] = info["env"]
    rows[:, EPISODE] = info["episode"]
    rows[:, EPISODE_STEP] = steps
    rows[:, ENV_STEP] = info["env_step0"] + steps
    rows[:, CHUNK_START] = int(sa.t_started)
    if appended and n:
        rows[-1, BOOT] = BOOTSTRAP["terminal" if info.get("ended") else "last"]
    return rows


def _learner_probe(rl_module: Any, opts: Options) -> LearnerProbe:
    probe = _LEARNER_PROBES.get(rl_module)
    if probe is None:
        modules = dict(rl_module.items()) if hasattr(rl_module, "items") else {"default_policy": rl_module}
        if len(modules) != 1:
            raise BadInput(f"lstm-probe traces single-agent RLlib runs; this one has modules {sorted(modules)}")
        ((module_id, module),) = modules.items()
        if hasattr(module, "unwrapped"):
            module = module.unwrapped()
        probe = LearnerProbe(module, opts, _learner_rank(), module_id)
        _LEARNER_PROBES[rl_module] = probe
    return probe


def _compose(ours: Callable[..., Any], theirs: Any) -> list[Callable[..., Any]]:
    if theirs is None:
        return [ours]
    return [ours, *(theirs if isinstance(theirs, list | tuple) else [theirs])]


def _directory(out: Any) -> str | None:
    return None if out is None or os.fspath(out).endswith("/") else f"{os.fspath(out)}/"


def _out(out: Any, options: CaptureOptions | None) -> Any:
    """``out`` as a directory ('/' appended); ``run/`` when neither it nor ``options`` names one."""
    return _directory(out) or out or (None if options is not None else "run/")


_DRIVER_LOCKS: list[Any] = []
"""The locks probe_config() took on its output directories (``lock.py``); close() releases them."""


def probe_config(
    config: Any,
    out: str | None = None,
    *,
    metadata: dict[str, Any] | None = None,
    options: CaptureOptions | None = None,
    measure: Measure | None = None,
    **capture: Any,
) -> Any:
    """Add the probe to an RLlib AlgorithmConfig (new API stack, single agent); returns the config.

    ``out`` is a directory (every env runner and learner writes its own part files there). The user's
    own callbacks and learner connectors are kept. Call :func:`close` with the algorithm when training
    ends, so each process writes its outcome. ``options``: the capture settings as one
    :class:`~lstm_probe.options.CaptureOptions`; ``measure``: what is measured on copies
    (:class:`~lstm_probe.options.Measure`: ``what_if`` is RLlib's, in each learner: ``whatif.py``);
    keyword arguments of their fields' names override them.
    """
    from pathlib import Path

    from lstm_probe.log.layout import check_output
    from lstm_probe.log.lock import OutputLock

    me, capture = route(capture, (Measure,), "probe_config", rest=True)
    m = settle(Measure, measure, me)
    taken = {f.name for f in dataclasses.fields(Measure) if getattr(m, f.name) != getattr(Measure(), f.name)}
    refused = sorted(taken - set(MEASURES))
    if refused:
        raise BadInput(
            f"{', '.join('--' + r.replace('_', '-') for r in refused)} not on RLlib yet: it takes --what-if "
            "--memory and --capture-obs"
        )
    given = capture_options(options, _out(out, options), **capture)
    out = _directory(given.out) or os.fspath(given.out)
    check_output(Path(out), force=given.force, is_dir=True)
    _DRIVER_LOCKS.append(OutputLock.take(Path(out), is_dir=True, reentrant=True))  # released by close()
    opts = Options(
        **{**given.settings(), "out": str(Path(out).resolve()) + "/"},
        metadata={**config_metadata(config), **(metadata or {})},
        what_if=whatif.settings(m.what_if, m.what_if_every, m.burn_in),
        memory=memory.settings(m.memory, m.memory_every),
        capture_obs=m.capture_obs,
    )
    config.callbacks(
        on_episode_created=_compose(functools.partial(_on_episode_created, opts), config.callbacks_on_episode_created),
        on_episode_end=_compose(_on_episode_end, config.callbacks_on_episode_end),
    )
    config.learners(learner_connector=functools.partial(_build_connector, opts, config._learner_connector))
    return config


def _close_here(completed: bool, stop_reason: str | None, extra: dict[str, Any], *_: Any) -> int:
    """Close every probe of this process; returns how many were closed."""
    closed = 0
    while _OPEN:
        _OPEN.pop().close(completed, stop_reason, **extra)
        closed += 1
    return closed


def _count(results: Any) -> int:
    total = 0
    for r in results or []:
        value = r.get() if hasattr(r, "get") and not isinstance(r, int | dict) else r
        total += int(value or 0)
    return total


def close(algo: Any, completed: bool = True, stop_reason: str | None = None, num_timesteps: int | None = None) -> int:
    """Close the probes of every env runner and learner of ``algo`` (and of this process), so each
    writes its last part with the run's outcome; returns how many probes were closed. Call it before
    ``algo.stop()``: a probe that is never closed loses the rows of its last ``part_seconds``."""
    extra = {} if num_timesteps is None else {"progress_num_timesteps": num_timesteps}
    done = functools.partial(_close_here, completed, stop_reason, extra)
    closed = 0
    for group in (algo.env_runner_group, getattr(algo, "eval_env_runner_group", None)):
        if group is None:
            continue
        try:
            closed += _count(group.foreach_env_runner(done, local_env_runner=True))
        except Exception:  # a dead actor must not keep the others from closing
            pass
    try:
        closed += _count(algo.learner_group.foreach_learner(done))
    except Exception:
        pass
    closed += _close_here(completed, stop_reason, extra)
    while _DRIVER_LOCKS:  # the run's lock on its directory (probe_config)
        _DRIVER_LOCKS.pop().release()
    return closed
