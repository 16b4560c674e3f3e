"""sb3-contrib RecurrentPPO integration: tells the tracer each LSTM call's phase and provenance.

Everything here relies on sb3-contrib 2.x behaviour, cited by file:function:

- ``ppo_recurrent.py:RecurrentPPO.collect_rollouts`` calls ``self.policy(obs, states, starts)`` once per
  env step (actor LSTM, then critic LSTM, batch n_envs, one step): a forward pre-hook on the policy
  marks those calls as rollout steps. After ``env.step`` it calls ``callback.on_step()``, then
  ``policy.predict_values`` for each truncated episode's terminal observation (batch 1), and after
  the loop once more for the last observation (batch n_envs): these are the bootstrap calls, told
  apart by a wrapper of ``policy.predict_values``. ``EvalCallback`` calls ``model.predict`` (which calls
  ``policy.predict``) inside ``on_step``: actor only, never through the policy's ``__call__``; a wrapper
  of ``policy.predict`` makes those calls phase "predict", and they never move the env step counters.
  The wrappers are instance attributes set while learn() runs (``attach.Attachment.wrap``; the
  policy is saved by its state_dict, never pickled) and removed on every way out of learn().
- ``common/recurrent/buffers.py:RecurrentRolloutBuffer.get`` is called once per epoch and draws the
  shuffling split point; ``_get_samples(batch_inds, env_change)`` is the only place a minibatch's
  flat indices are visible, and it leaves ``seq_start_indices`` on the buffer. Both are wrapped on
  the buffer *instance* while learn() runs (the buffer is excluded from ``model.save``) and unwrapped
  afterwards. A flat index i is env i // n_steps, rollout step i % n_steps (``swap_and_flatten``).
- ``common/recurrent/policies.py:RecurrentActorCriticPolicy._process_sequence`` runs one call over the
  padded sequences when ``th.all(episode_starts == 0.0)`` over the minibatch, else one call per step:
  a train call's ``path`` says which ('sequence' or 'stepwise'), also when every sequence has length 1
  and both branches make calls of one step. While learn() runs, an instance wrapper of that staticmethod
  (:func:`_loops`) has the tracer record a stepwise minibatch's per-step loop whole, as one block.
- ``common/recurrent/policies.py:RecurrentActorCriticPolicy._process_sequence`` reshapes a minibatch
  to (max_len, n_seq, F): batch column = sequence, so train call column s / step t is minibatch
  element ``seq_start[s] + t`` when t < len(s), padding otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import weakref
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback

from lstm_probe.capture.life import Scope
from lstm_probe.capture.tracer import CoreTracer
from lstm_probe.contract import SEQ_REASON, Capabilities, Grid, Tags
from lstm_probe.errors import BadInput
from lstm_probe.integrations.sb3 import doctor, memory, metrics, obs, returns, whatif
from lstm_probe.integrations.sb3.arch import summary
from lstm_probe.integrations.sb3.attach import ACTIVE, Attachment, WeakIntegration, weak
from lstm_probe.integrations.sb3.options import Measure
from lstm_probe.options import CaptureOptions, route, settle

HYPERPARAMETERS = (
    "n_steps",
    "batch_size",
    "n_epochs",
    "gamma",
    "gae_lambda",
    "clip_range",
    "clip_range_vf",
    "normalize_advantage",
    "ent_coef",
    "vf_coef",
    "max_grad_norm",
    "learning_rate",
    "use_sde",
    "sde_sample_freq",
    "target_kl",
    "stats_window_size",
    "seed",
    "device",
    "n_envs",
)
PROVIDED: dict[str, Any] = {"replay": True, "respond": True, "observe": True, "returns": True}
"""The capabilities sb3's integration provides: what-if, memory, observations, returns."""
POLICY_KEYS = (
    "lstm_hidden_size",
    "n_lstm_layers",
    "shared_lstm",
    "enable_critic_lstm",
    "share_features_extractor",
    "net_arch",
    "activation_fn",
    "ortho_init",
    "features_extractor_class",
    "lstm_kwargs",
)


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, type):
        return v.__name__
    if isinstance(v, torch.device):
        return str(v)  # 'cpu', 'cuda:0'
    return repr(v)


def model_metadata(model: Any) -> dict[str, Any]:
    """What the log's metadata says about a RecurrentPPO model and its env."""
    policy = model.policy
    env_id = None
    try:
        spec = model.get_env().get_attr("spec")[0]
        env_id = spec.id if spec is not None else None
    except Exception:  # a custom VecEnv without specs
        pass
    hyper = {k: _jsonable(getattr(model, k, None)) for k in HYPERPARAMETERS}
    hyper["policy_kwargs"] = _jsonable(getattr(model, "policy_kwargs", {}))
    for k in POLICY_KEYS:
        if hasattr(policy, k):
            hyper.setdefault("policy", {})[k] = _jsonable(getattr(policy, k))
    shared = bool(getattr(policy, "shared_lstm", False))
    critic = "lstm" if policy.lstm_critic is not None else ("shared" if shared else "mlp")
    return {
        "framework": "sb3",
        "algorithm": type(model).__name__,
        "policy": type(policy).__name__,
        "env_id": env_id,
        "n_envs": int(model.n_envs),
        "seed": model.seed,
        "hyperparameters": hyper,
        "architecture_sb3": {
            "shared_lstm": shared,
            "critic": critic,
            "share_features_extractor": bool(getattr(policy, "share_features_extractor", True)),
            "features_extractor": type(policy.features_extractor).__name__,
        },
    }


F = TypeVar("F", bound=Any)


def _timed(method: F) -> F:
    """Count the time a probe callback takes into its tracer's ``integration_seconds``."""

    @functools.wraps(method)
    def wrapper(self: ProbeCallback, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(self, *args)
        finally:
            if self.tracer is not None:
                self.tracer.integration_seconds += time.perf_counter() - start

    return cast(F, wrapper)


class ProbeCallback(BaseCallback, Scope):
    """Record every LSTM call of a RecurrentPPO ``learn()`` into an lstm-probe log.

    ``model.learn(n, callback=ProbeCallback("run.parquet"))``. Works inside a CallbackList. Use it as a
    context manager (``with ProbeCallback(...) as probe: model.learn(..., callback=probe)``) to be sure
    the log is closed and the hooks are removed at once when learn() raises. Without it that happens
    when the probe is collected (nothing but learn() held it), when the next learn() on the model
    starts, or at exit.
    The settings come as objects (``options=CaptureOptions(...)``: the log; ``measure=Measure(...)``: what-if,
    memory, observations, see ``options.py``) and as keyword arguments of their fields' names, which
    override them (``ProbeCallback("run.parquet", capture="summary", what_if=True)``).
    ``live_metrics``: record per-iteration figures through SB3's logger (``metrics.py``); None (default)
    where that logger writes somewhere.

    It is the sb3 :class:`~lstm_probe.contract.Integration`: it tells the tracer each call's phase and
    provenance (:meth:`resolve`), from sb3-contrib's rollout loop and rollout buffer.
    """

    name = "sb3"
    _loop_blocks = True  # record sb3's per-step training loops whole (_loops); False: call by call (tests)

    def __init__(
        self,
        out: str | Path | None = None,
        *,
        options: CaptureOptions | None = None,
        measure: Measure | None = None,
        metadata: dict[str, Any] | None = None,
        verbose: int = 0,
        live_metrics: bool | None = None,
        **overrides: Any,
    ):
        super().__init__(verbose)
        cap, me = route(overrides, (CaptureOptions, Measure), "ProbeCallback")
        if out is not None:
            cap["out"] = out
        self.options = settle(CaptureOptions, options, cap)
        self.measure = m = settle(Measure, measure, me)
        self.live_metrics = live_metrics  # None: where SB3's logger writes somewhere (metrics.seen)
        # rollout rows' obs and info columns (obs.py)
        self.observations = obs.Observations(m.capture_obs, m.info_keys)
        self.memory_settings = memory.memory_settings(m)  # memory.py
        self.memory: memory.Memory | None = None
        self.what_if_settings = whatif.what_if_settings(m)  # whatif.py
        self.what_if: whatif.WhatIf | None = None
        self.out = self.options.out
        self._metadata: dict[str, Any] = {}
        self.extra_metadata = dict(metadata or {})
        self.path: Path | None = None
        self._used = False
        self._attachment: Attachment | None = None
        self._handles: list[Any] = []  # the attachment's hook handles (the same list)
        self.entry: str | None = None  # the wrapped entry point running now: 'bootstrap' or 'predict'
        self.predict_start: Any = None  # the episode_start passed to policy.predict
        self.clock = doctor.PathClock()  # training time per _process_sequence path (doctor.py)
        self.returns = returns.Sb3Returns(None)  # made again when learn() starts
        self.metrics: metrics.LiveMetrics | None = None

    @property
    def tracer(self) -> CoreTracer | None:
        """The tracer while the log is open."""
        return self._attachment.tracer if self._attachment is not None else None

    # -- sb3 callback events ---------------------------------------------------------------------
    def _on_training_start(self) -> None:
        if self._used:
            raise BadInput("this ProbeCallback already wrote its log; pass a new ProbeCallback to each learn()")
        self._used = True
        stale = ACTIVE.get(self.model)
        if stale is not None:
            stale.finish(False, "learn() ended with an exception (closed by the next ProbeCallback)")
        model: Any = self.model
        policy: Any = model.policy
        if not hasattr(policy, "lstm_actor") or not hasattr(model, "rollout_buffer"):
            raise BadInput(f"ProbeCallback needs sb3-contrib's RecurrentPPO, not {type(model).__name__}")
        k = self.options.trace_envs
        if k is not None and k > int(model.n_envs):
            raise BadInput(f"trace_envs {k} is more envs than the model has ({int(model.n_envs)}); pass at most that")
        attachment = self._attachment = ACTIVE[model] = Attachment(model)
        self._handles = attachment.handles
        self._start_time = model.start_time  # set by every learn() (base_class.py:_setup_learn)
        modules = {"actor": policy.lstm_actor}
        if policy.lstm_critic is not None:
            modules["critic"] = policy.lstm_critic
        self.shared = bool(getattr(policy, "shared_lstm", False))
        self.n_envs, self.n_steps = int(model.n_envs), int(model.n_steps)
        # provenance state
        self.iteration = -1
        self.env_step = 0
        self.episode = np.full(self.n_envs, -1, np.int64)
        self.episode_step = np.full(self.n_envs, -1, np.int64)
        self.in_rollout = False
        self.in_forward = False
        self.epoch = -1
        self.minibatch = -1
        self.current = Tags()
        self.terminal_queue: list[int] = []
        self.last_dones = np.zeros(self.n_envs, bool)
        self._env_column = np.arange(self.n_envs, dtype=np.int32)[:, None]
        self._no_padding = np.zeros((self.n_envs, 1), np.bool_)
        meta = model_metadata(model)
        # Measured on a private copy of the policy, RNG states restored: the user's modules never run.
        meta["architecture_sb3"]["gradient_flow"] = summary(model)
        meta["total_timesteps"] = int(self.locals.get("total_timesteps", 0))
        if int(model.num_timesteps) > 0:  # learn(reset_num_timesteps=False): sb3 counts on from the model's steps
            meta["start_timesteps"] = int(model.num_timesteps)
        meta["architecture_sb3"]["lstm_modules"] = list(modules)
        meta.update(self.observations.start(model))
        meta.update(self.extra_metadata)
        self._metadata = meta
        options = dataclasses.replace(self.options, reference_window=self.n_steps)
        tracer = CoreTracer(modules, options, WeakIntegration(self))
        tracer.metadata["architecture"].update(meta.pop("architecture_sb3"))
        tracer.start()
        attachment.open(self, tracer)
        try:
            # Everything put on the model reaches this probe through a weak reference (attach.py).
            self._handles += [
                policy.register_forward_pre_hook(weak(self._rollout_step_begin)),
                policy.register_forward_hook(weak(self._rollout_step_end)),
            ]
            me = weakref.ref(self)
            buffer = model.rollout_buffer

            def get(inner: Any, batch_size: int | None = None) -> Any:
                probe = me()
                if probe is not None:
                    probe.epoch += 1
                    probe.minibatch = -1
                yield from inner(batch_size)

            def get_samples(inner: Any, batch_inds: np.ndarray, env_change: np.ndarray, *args: Any, **kw: Any) -> Any:
                samples = inner(batch_inds, env_change, *args, **kw)
                probe = me()
                if probe is not None:
                    probe.minibatch += 1
                    probe._train_tags(np.asarray(batch_inds), np.asarray(buffer.seq_start_indices), buffer)
                    probe.clock.sample(probe.current.path)
                    if probe.what_if is not None:
                        where = (probe.iteration, probe.epoch, probe.minibatch)
                        probe.what_if.on_samples(probe.model, samples, np.asarray(batch_inds), buffer, *where)
                return samples

            attachment.wrap(buffer, "get", get)
            attachment.wrap(buffer, "_get_samples", get_samples)
            if self._loop_blocks:
                attachment.wrap(policy, "_process_sequence", _loops(me))
            attachment.wrap(policy, "predict_values", _entry(me, "bootstrap"))
            attachment.wrap(policy, "predict", _entry(me, "predict"))
            attachment.extra["minibatch_paths"] = self.clock.metadata
            self.returns = returns.Sb3Returns(model, tracer)  # the episodes each rollout ended (returns.py)
            attachment.extra["returns"] = self.returns.publish
            self.metrics = metrics.attach(self, self.live_metrics)  # figures through SB3's logger (metrics.py)
            if self.memory_settings is not None:  # the memory horizon, on a copy of the policy (memory.py)
                self.memory = memory.Memory(model, **self.memory_settings)
                attachment.extra["memory"] = self.memory.metadata
            if self.what_if_settings is not None:  # counterfactual initial states, on a copy (whatif.py)
                self.what_if = whatif.WhatIf(model, **self.what_if_settings)
                attachment.extra["what_if"] = self.what_if.metadata
                self._handles.append(policy.optimizer.register_step_pre_hook(self.what_if.step_hook))
        except BaseException:
            self._finish(False, "failed to attach")
            raise

    def _on_rollout_start(self) -> None:
        self.clock.stop()  # train() ended
        if self.tracer is not None:
            self.tracer.batch_jobs(False)  # the update's training calls to the writer, as one message
        if self.metrics is not None:  # a logger that writes somewhere now gets the figures (metrics.py)
            self.metrics.rollout_start(self.model)
        self.iteration += 1
        self.in_rollout = True
        self.k = 0
        self.base_step = self.env_step
        self.tab_episode = np.full((self.n_steps, self.n_envs), -1, np.int64)
        self.tab_episode_step = np.full((self.n_steps, self.n_envs), -1, np.int64)
        # (n_steps, n_envs, 1): row k is the env_step column of the rollout's k-th step
        self.tab_env_step = np.repeat(self.env_step + np.arange(self.n_steps, dtype=np.int64), self.n_envs).reshape(
            self.n_steps, self.n_envs, 1
        )
        self.epoch = -1
        self.current = Tags()
        if self._attachment is not None:
            self._attachment.iterations = self.iteration + 1
        if self.tracer is not None and self.tracer.writer is not None:
            self.tracer.writer.progress.update(num_timesteps=int(self.model.num_timesteps), iterations=self.iteration)

    @_timed
    def _on_step(self) -> bool:
        # Same test as ppo_recurrent.py:collect_rollouts uses for its terminal-value bootstrap, so the
        # k-th critic call that follows belongs to the k-th env listed here.
        dones, infos = self.locals.get("dones"), self.locals.get("infos")
        if dones is not None and infos is not None:
            self.last_dones = np.asarray(dones, bool)
            self.terminal_queue = [
                i
                for i, d in enumerate(dones)
                if d and infos[i].get("terminal_observation") is not None and infos[i].get("TimeLimit.truncated", False)
            ]
            if self.observations.keys:
                self.observations.step(self.model, self.last_dones, infos)
            self.returns.step(self.locals, self.iteration)
        return True

    def _on_rollout_end(self) -> None:
        self.in_rollout = False
        if self.tracer is not None:
            self.tracer.batch_jobs(True)  # train() next: its calls' rows cross the pipe together
        self.current = Tags()
        if self.memory is not None:
            self.memory.measure(self.model.rollout_buffer, self.iteration)  # type: ignore[attr-defined]
        if self._attachment is not None:  # returns, what-if, memory into the writer's progress (every part's)
            self._attachment.publish()

    def _on_training_end(self) -> None:
        done = int(self.model.num_timesteps) >= int(self.locals.get("total_timesteps", 0))
        self._finish(done, None if done else "stopped early by a callback")

    # -- lifecycle -------------------------------------------------------------------------------
    def _finish(self, completed: bool, reason: str | None) -> None:
        if self._attachment is not None:
            self.observations.warn_unseen()
            tracer = self.tracer
            self.path = self._attachment.finish(completed, reason)
            if tracer is not None and self.metrics is not None:
                self.metrics.closed(tracer.rows)

    # (``with``: life.Scope; the log opens when learn() starts, as the model is needed, and closes as it ends)
    @property
    def running(self) -> bool:
        return self.tracer is not None

    def start(self) -> ProbeCallback:
        """Nothing to start before learn(): the probe attaches itself when learn() starts."""
        return self

    def close(self, completed: bool = False, stop_reason: str | None = None) -> Path | None:
        """Close the log now, if learn() has not: then the run did not reach its end (the log says not
        completed, whatever ``completed`` says), ``stop_reason`` [closed before learn() finished]. Idempotent;
        returns the log's path."""
        if self.tracer is not None:
            self._finish(False, stop_reason or "closed before learn() finished")
        elif self._attachment is not None:  # finished meanwhile (the next probe on the model, at exit)
            self.path = self._attachment.path
        return self.path

    # -- provenance ------------------------------------------------------------------------------
    @_timed
    def _rollout_step_begin(self, module: Any, args: Any) -> None:
        if self.model.start_time != self._start_time:  # type: ignore[union-attr]
            # a later learn() without this probe: the one it was attached in raised
            self._finish(False, "learn() ended with an exception")
            return
        if not self.in_rollout:
            return
        # ppo_recurrent.py:collect_rollouts passes self._last_episode_starts (as a tensor) to the policy.
        starts = np.asarray(self.model._last_episode_starts, bool).reshape(-1)
        k = self.k
        if k < self.n_steps:
            # this step's row of the iteration's tables, written once: the grid below holds views of it
            episode, episode_step = self.tab_episode[k], self.tab_episode_step[k]
            env_step = self.tab_env_step[k]
        else:
            episode, episode_step = np.empty(self.n_envs, np.int64), np.empty(self.n_envs, np.int64)
            env_step = np.full((self.n_envs, 1), self.env_step, np.int64)
        _advance(self.episode, self.episode_step, starts, episode, episode_step)
        self.episode, self.episode_step = episode, episode_step
        # built from whole columns (Grid.one_step's general broadcasting costs more per step); the shared
        # env and padding columns are never written to, and Grid.concat copies
        grid = Grid(
            env=self._env_column,
            env_step=env_step,
            episode=episode[:, None],
            episode_step=episode_step[:, None],
            episode_start=starts.astype(np.int8)[:, None],
            padding=self._no_padding,
        )
        if self.observations.active:
            self.observations.fill(grid, self.model)
        self.current = Tags("rollout", self.iteration, grid=grid)
        self.in_forward = True

    @_timed
    def _rollout_step_end(self, module: Any, args: Any, output: Any) -> None:
        if self.in_forward:
            self.in_forward = False
            self.k += 1
            self.env_step += 1
            self.current = Tags()
        if self.in_rollout and self.metrics is not None and self.metrics.figures:  # live metrics ride on this hook
            self.metrics.rollout_step(self)

    @_timed
    def _train_tags(self, batch_inds: np.ndarray, seq_starts: np.ndarray, buffer: Any) -> None:
        n_steps = self.n_steps
        size = len(batch_inds)
        lens = np.diff(np.append(seq_starts, size))  # (n_seq,) unpadded lengths
        max_len = int(lens.max())
        t = np.arange(max_len)
        valid = t[None, :] < lens[:, None]  # (n_seq, max_len)
        flat = np.where(valid, batch_inds[np.minimum(seq_starts[:, None] + t[None, :], size - 1)], 0)
        env, k = flat // n_steps, flat % n_steps
        null = ~valid
        episode = np.where(null, -1, self.tab_episode[k, env])
        episode_step = np.where(null, -1, self.tab_episode_step[k, env])
        # the buffer's own flattened episode_starts (buffers.py:get swap_and_flatten), as sb3 used them
        starts = np.asarray(buffer.episode_starts).reshape(-1)[flat] > 0.5
        # ``_process_sequence`` runs one call per step when the minibatch holds an episode start
        path = "stepwise" if starts[valid].any() else "sequence"
        first = batch_inds[seq_starts]
        first_start = np.asarray(buffer.episode_starts).reshape(-1)[first] > 0.5
        # Only the first sequence of a minibatch can start at the split point or a minibatch cut: later ones
        # start at episode starts or env changes only (buffers.py:create_sequencers), which the first two
        # cases catch.
        reason = np.where(
            first_start,
            SEQ_REASON["episode_start"],
            np.where(
                first % n_steps == 0,
                SEQ_REASON["env_boundary"],
                SEQ_REASON["split" if self.minibatch == 0 else "minibatch_cut"],
            ),
        )
        grid = Grid(
            env=np.where(null, -1, env).astype(np.int32),
            env_step=np.where(null, -1, self.base_step + k),
            episode=episode,
            episode_step=episode_step,
            episode_start=np.where(null, -1, starts).astype(np.int8),
            padding=null,
            train=True,
            seq_len=lens.astype(np.int32),
            seq_reason=reason.astype(np.int8),
        )
        self.current = Tags("train", self.iteration, self.epoch, self.minibatch, grid=grid, path=path)
        if self.metrics is not None and self.metrics.figures:
            self.metrics.minibatch(self.current)

    # -- the Integration contract ----------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """Train rows have epochs; sequences are cut from the rollout buffer and start from its stored states."""
        return Capabilities("sb3", epochs=True, rollout_buffer=True, stored_states=True, **PROVIDED)

    def metadata(self) -> dict[str, Any]:
        """The model's, its env's and its hyperparameters' record (made when learn() starts)."""
        return self._metadata

    def resolve(self, name: str, steps: int, batch: int) -> Tags:
        """The tags of a call of LSTM ``name`` (see the module docstring for how each kind is told apart)."""
        entry = self.entry
        if entry is None or self.in_forward:
            return self.current  # rollout step, or train minibatch (or untagged outside both)
        if entry == "predict":
            return self._predict_tags(batch)
        return self._bootstrap_tags(batch) if self.in_rollout else self.current

    def _bootstrap_tags(self, batch: int) -> Tags:
        """Tags of a predict_values call made by collect_rollouts (terminal or last value)."""
        buffer: Any = self.model.rollout_buffer  # type: ignore[attr-defined]
        if buffer.full or batch != 1 or not self.terminal_queue:
            # the last-value call: its input is the next step's observation, its state masked by dones,
            # exactly as the next rollout's first call will see it
            d = self.last_dones
            episode, episode_step = _advance(self.episode, self.episode_step, d)
            grid = Grid.one_step(np.arange(self.n_envs), self.env_step, episode, episode_step, d)
            return Tags("bootstrap", self.iteration, bootstrap="last", grid=grid)
        i = self.terminal_queue.pop(0)
        step = self.episode_step[i] + 1 if self.episode_step[i] >= 0 else -1
        grid = Grid.one_step(i, self.env_step, self.episode[i], step, 0)
        return Tags("bootstrap", self.iteration, bootstrap="terminal", grid=grid)

    def _predict_tags(self, batch: int) -> Tags:
        """policy.predict (model.predict) from a callback (EvalCallback) or user code."""
        starts = self.predict_start
        start = np.full(batch, -1, np.int8) if starts is None else np.asarray(starts).reshape(-1).astype(np.int8)
        if len(start) != batch:
            start = np.full(batch, -1, np.int8)
        grid = Grid.one_step(np.arange(batch), -1, -1, -1, start)
        return Tags("predict", self.iteration, grid=grid)


def _advance(
    episode: np.ndarray,
    episode_step: np.ndarray,
    starts: np.ndarray,
    out_episode: np.ndarray | None = None,
    out_step: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-env (episode, episode_step) one step on; ``starts`` marks envs whose state was reset. An
    episode_step of -1 (an episode begun before the probe) stays unknown until the next reset. Written
    into ``out_episode`` / ``out_step`` when given (never the inputs themselves)."""
    # episode -1 (begun before the probe) counts as episode 0 from here on: max(episode + start, 0)
    out_episode = np.add(episode, starts, out=out_episode)
    np.maximum(out_episode, 0, out=out_episode)
    out_step = np.add(episode_step, 1, out=out_step)
    out_step[episode_step < 0] = -1
    out_step[starts] = 0
    return out_episode, out_step


def _entry(probe_ref: weakref.ref[ProbeCallback], kind: str) -> Any:
    """The wrapper body of an entry point whose LSTM calls are ``kind`` ('bootstrap': predict_values,
    'predict': predict); nests (an entry inside another restores the outer one on return)."""

    def around(inner: Any, *args: Any, **kwargs: Any) -> Any:
        probe = probe_ref()
        if probe is None:
            return inner(*args, **kwargs)
        saved = probe.entry, probe.predict_start
        probe.entry = kind
        if kind == "predict":  # policies.py:predict(observation, state, episode_start, deterministic)
            probe.predict_start = kwargs.get("episode_start", args[2] if len(args) > 2 else None)
        try:
            return inner(*args, **kwargs)
        finally:
            probe.entry, probe.predict_start = saved

    return around


def _loops(probe_ref: weakref.ref[ProbeCallback]) -> Any:
    """The wrapper body of ``policies.py:RecurrentActorCriticPolicy._process_sequence`` (a staticmethod:
    ``(features, lstm_states, episode_starts, lstm)``). For a train minibatch that holds an episode start
    (path 'stepwise') it runs the per-step loop as a block the tracer records whole
    (:meth:`CoreTracer.loop_begin`): the LSTM is called exactly as before (every hook sees every step), and
    sb3 changes no state the loop returns in place (it masks each step's input into a new tensor)."""

    def around(inner: Any, *args: Any, **kwargs: Any) -> Any:
        probe = probe_ref()
        tracer = probe.tracer if probe is not None else None
        if probe is None or tracer is None or probe.entry is not None or probe.current.path != "stepwise":
            return inner(*args, **kwargs)
        lstm: Any = args[3] if len(args) > 3 else kwargs.get("lstm")
        states: Any = args[1] if len(args) > 1 else kwargs.get("lstm_states")
        n_seq = int(states[0].shape[1])
        loop = tracer.loop_begin(lstm, n_seq)
        if loop is None:
            return inner(*args, **kwargs)
        try:
            return inner(*args, **kwargs)
        finally:
            tracer.loop_end(loop)

    return around
