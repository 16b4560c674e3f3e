"""rsl_rl (``rsl-rl-lib`` 5.5, the PPO of Isaac Lab): :func:`attach` puts the probe on a runner the user built.

What rsl_rl does with its recurrent state, and what the probe relies on (rsl-rl-lib 5.5.1):

- ``modules/rnn.py:RNN`` keeps the state in the module: a rollout call runs the nn.LSTM/GRU on
  (1, num_envs, F) with ``self.hidden_state``; ``RNN.reset(dones)`` zeroes, in place, the rows of the envs
  whose ``dones == 1``. Actor and critic (``models/rnn_model.py:RNNModel``) each have their own RNN.
- ``algorithms/ppo.py:PPO.act`` takes references to both states, then calls actor and critic once each
  (one env step: batch column i = env i); ``PPO.process_env_step`` stores the transition
  (``storage/rollout_storage.py:RolloutStorage.add_transition`` copies the states at index ``storage.step``)
  and resets both modules with the step's dones. ``PPO.compute_returns`` evaluates the critic once more on
  the observation after the rollout's last step (tagged phase 'bootstrap', bootstrap 'last': the next
  rollout's first step, whose state it restores afterwards).
- ``RolloutStorage.recurrent_mini_batch_generator`` splits every env's rollout at its dones
  (``utils/utils.py:split_and_pad_trajectories``: env-major order, each trajectory zero-padded to the
  rollout's length), gives minibatch i the trajectories of envs ``[i * N // M, (i + 1) * N // M)``, in the
  same order every epoch, each starting from the state stored at its first step; the model runs one padded
  call (T, B, F) and unpads (``unpad_trajectories``). The probe computes the same split from the storage's
  own dones (one host copy per update) and tags each minibatch's calls with it.

Where the probe reads device data, and where it may wait for it (never in a hook, never in ``resolve``):

- The dones ``env.step`` returns, once per env step: the probe's wrapper of ``env.step`` starts their copy to
  the host (on a GPU: into pinned memory, without waiting, an event recorded after it) and queues it. A
  queued copy is applied to the env counters once ``event.query()`` says it is done (at the next wrapper
  or call), in order. Exact provenance needs each step's dones before the next step's calls are tagged, so
  where a copy is still under way the probe waits for it at one place per env step, outside the hooks:
  in the ``PPO.act`` (and ``compute_returns``) wrapper during training, in the ``env.step`` wrapper once
  a play loop runs (the calls since the last env step were 'predict' calls). In ``OnPolicyRunner.learn`` that
  wait finds the copy done: the runner itself syncs after every ``env.step``, in
  ``utils/utils.py:check_nan`` (``if torch.isnan(...).any()``, on unless ``check_for_nan`` is False) and,
  with a log dir, ``utils/logger.py:Logger.process_env_step`` (``nonzero``, ``.cpu()``). ``waits`` counts
  the waits that found a copy under way.
- With ``capture_obs``, each env step's observation (the actor's groups, flattened to float32) travels with
  its dones: the same copy (pinned, no wait, the same event) started in the ``env.step`` wrapper, so the
  rollout step that takes it (``PPO.act``, whose wrapper puts it in the step's grid, the ``obs`` column) finds
  it on the host after the wait above, at no further wait; its cost is the copy, N x width floats per env
  step. An ``act`` with no env step since the last (``OnPolicyRunner.learn``'s first, on
  ``env.get_observations()``) copies its own argument, which waits on a GPU: once per ``learn()`` call.
- ``resolve`` (a hook's question) never waits: a play-loop call whose env step's dones are still on their
  way (only the first call after env steps taken outside a play loop) gets its exact env and env step and
  null episode, episode step and start rather than a guess.
- The storage's dones, once per update (in the minibatch generator's wrapper; ``PPO.update`` syncs anyway,
  ``.item()`` of each minibatch's losses). Every per-step figure is kept in numpy.

Calls outside ``act``/``compute_returns``/``update`` (a play loop: ``runner.get_inference_policy()``,
which is the actor itself) with one column per env are tagged phase 'predict' with the env counters the
``env.step`` wrapper keeps, so the report's doctor sees a play loop that never resets its memory. The run's
env steps (``progress_num_timesteps``) are training's alone: an env step counts where a ``PPO.act`` came
since the last one, as in ``OnPolicyRunner.learn``; a play loop's steps give 'predict' rows, not steps.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.capture.life import Probe
from lstm_probe.capture.returns import Live, Returns, StepSums
from lstm_probe.capture.tracer import CoreTracer
from lstm_probe.contract import BOOTSTRAP, SEQ_REASON, Capabilities, Grid, Tags
from lstm_probe.errors import BadInput
from lstm_probe.integrations.rsl_rl import memory, whatif
from lstm_probe.options import CaptureOptions, Measure

ROLES = ("actor", "critic")


def recurrent_modules(alg: Any, roles: tuple[str, ...] = ROLES) -> dict[str, nn.Module]:
    """The nn.LSTM/GRU of the algorithm's recurrent models (``roles``: 'actor', 'critic'; distillation's 'student',
    'teacher'): ``model.rnn.rnn`` (``models/rnn_model.py:RNNModel.rnn`` is ``modules/rnn.py:RNN``, whose ``rnn`` is
    the torch module)."""
    found: dict[str, nn.Module] = {}
    for role in roles:
        model = getattr(alg, f"_raw_{role}", None) or getattr(alg, role, None)
        rnn = getattr(getattr(model, "rnn", None), "rnn", None)
        if isinstance(rnn, nn.LSTM | nn.GRU):
            found[role] = rnn
    if not found:
        raise BadInput(f"this rsl_rl algorithm has no recurrent {' or '.join(roles)} (RNNModel) to trace")
    return found


class _Dones:
    """One env step's dones and rewards (and, with ``capture_obs``, its flattened observation) on their way to the
    host: applied once their copy is done (:meth:`ready`). ``trained``: a training step (its action from
    ``PPO.act``), whose episodes' returns count."""

    def __init__(self, dones: torch.Tensor, obs: torch.Tensor | None = None, rewards: Any = None, trained=False):
        d = dones.detach().reshape(-1)
        r = rewards.detach().reshape(-1) if isinstance(rewards, torch.Tensor) else None
        self.event: Any = None
        self.obs: np.ndarray | None = None
        self.trained = trained
        self.rewards: Any = None
        if d.device.type == "cuda":  # pinned host buffers, copied without waiting (read after the event)
            self.host = torch.empty(d.shape, dtype=d.dtype, pin_memory=True)
            self.host.copy_(d, non_blocking=True)
            if r is not None:
                self.rewards = torch.empty(r.shape, dtype=r.dtype, pin_memory=True)
                self.rewards.copy_(r, non_blocking=True)
            if obs is not None:
                host = torch.empty(obs.shape, dtype=obs.dtype, pin_memory=True)
                host.copy_(obs, non_blocking=True)
                self.obs = host.numpy()
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(d.device))  # the copies' stream (d's device's)
        else:
            self.host = d.to("cpu", copy=True)
            self.obs = None if obs is None else obs.to("cpu", copy=True).numpy()
            self.rewards = None if r is None else r.to("cpu", copy=True)

    def ready(self) -> bool:
        """Whether the copy is done (asks the device without waiting)."""
        return self.event is None or bool(self.event.query())

    def read(self) -> np.ndarray:
        """The dones as a bool array; waits for the copy unless :meth:`ready` said it is done."""
        if self.event is not None:
            self.event.synchronize()
        return self.host.numpy() != 0


class RslRlProbe(Probe):
    """The rsl_rl :class:`~lstm_probe.contract.Integration`: tags from the wrappers around rsl_rl's own
    steps (``PPO.act``, ``PPO.compute_returns``, the storage's minibatch generator, ``env.step``). A
    :class:`~lstm_probe.capture.life.Probe`: ``close()`` takes the wrappers off and finishes the log; ``with``."""

    name = "rsl_rl"
    roles = ROLES

    def __init__(
        self, alg: Any, env: Any, options: CaptureOptions, metadata: dict[str, Any], measure: Measure | None = None
    ):
        self.alg, self.env = alg, env
        self.measure = measure or Measure()
        self.storage = alg.storage
        self.n = int(env.num_envs)
        self.steps_per_env = int(self.storage.num_transitions_per_env)
        self._metadata = {"n_envs": self.n, **metadata}  # the env's own count where the caller gives none
        self.obs_groups: list[str] | None = None  # capture_obs: the actor's observation groups, flattened
        self._obs_next: np.ndarray | None = None  # the last env step's observation, on the host
        if self.measure.capture_obs:
            self.obs_groups = list(getattr(self._models()[0], "obs_groups", None) or ["policy"])
            self._metadata = {**self._metadata, **self._obs_layout()}
        self.envs = np.arange(self.n)
        self.env_step = np.zeros(self.n, np.int64)
        self.episode = np.zeros(self.n, np.int64)
        fresh = all(getattr(getattr(m, "rnn", None), "hidden_state", None) is None for m in self._models())
        # a fresh memory (None: zeros) starts an episode for the probe; else the episode began before it
        self.episode_step = np.zeros(self.n, np.int64) if fresh else np.full(self.n, -1, np.int64)
        self.starts = np.full(self.n, 1 if fresh else 0, np.int8)
        self._counted = False  # the env's own episode counts were read (or an env step came first: never)
        self._arrived: list[_Dones] = []  # env steps whose dones are not applied yet, in order
        self.waits = 0  # waits (outside the hooks) that found a dones copy still under way
        self._playing = False  # the calls since the last env step were play-loop ('predict') calls
        # the run's env steps (the log's progress_num_timesteps): training's alone, those an env.step takes after
        # a PPO.act (runners/on_policy_runner.py:OnPolicyRunner.learn steps the env once per alg.act, nowhere
        # else); a play loop's, whose actions come from get_inference_policy() and not act, are not counted
        self.trained_steps = 0
        self._acted = False  # a PPO.act since the last env step
        self.iteration = 0  # updates done so far: rollout k is followed by update k
        self.returns = Returns("rewards")  # the episodes each rollout's env steps ended (capture/returns.py)
        self.sums: StepSums | None = None  # each env's reward sum so far, from the first training step on
        shape = (self.steps_per_env, self.n)
        self.roll = {k: np.full(shape, -1, np.int64) for k in ("env_step", "episode", "episode_step")}
        self.roll["start"] = np.full(shape, -1, np.int64)
        self.tags: Tags | None = None
        self.sequences: list[tuple[np.ndarray, np.ndarray]] = []  # layout's, per minibatch
        self._predict: tuple[int, Tags] | None = None
        self._version = 0  # env steps the counters hold
        self._undo: list[tuple[Any, str, Any]] = []
        window = options.reference_window or self.steps_per_env + 1
        self.options = dataclasses.replace(options, reference_window=window)
        self.tracer = CoreTracer(self._traced(), self.options, self)
        self.what_if: Any = None  # whatif.WhatIf while attached with what_if
        self.memory: Any = None  # memory.Memory while attached with memory
        self.live: list[Live] = []  # their records, kept in the writer's progress (a killed run's parts hold them)
        self._hooks: list[Any] = []

    def _models(self) -> list[Any]:
        return [getattr(self.alg, f"_raw_{r}", None) or getattr(self.alg, r) for r in self.roles]

    def _traced(self) -> dict[str, nn.Module]:
        """The modules the tracer hooks: every role's RNN."""
        return recurrent_modules(self.alg, self.roles)

    # -- the contract ------------------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """Train rows carry epochs; training trajectories start from states stored during the rollout; a
        minibatch can be re-run on copies of the models (``whatif.py``)."""
        return Capabilities(
            "rsl_rl", epochs=True, stored_states=True, replay=True, respond=True, observe=True, returns=True
        )

    def metadata(self) -> dict[str, Any]:
        return dict(self._metadata)

    def resolve(self, module: str, steps: int, batch: int) -> Tags:
        tags = self.tags
        if tags is not None:
            return tags
        if steps != 1 or batch != self.n:
            return Tags(phase="other")
        # a call outside rsl_rl's own steps, one column per env: a play loop. Asked inside a hook: never waits
        self._playing = True
        if not self._settle(wait=False):  # this env step's dones still on their way: no guess
            env_step = self.env_step + len(self._arrived)
            return Tags(phase="predict", grid=Grid.one_step(self.envs, env_step, -1, -1, -1))
        if self._predict is None or self._predict[0] != self._version:
            self._predict = (self._version, Tags(phase="predict", grid=self._grid()))
        return self._predict[1]

    # -- the env's counters -----------------------------------------------------------------------
    def _settle(self, wait: bool) -> bool:
        """Apply the dones of the env steps taken since, in order: those whose copy is done, and with
        ``wait`` (never in a hook) the rest too, waiting for them. True when none is left."""
        start = time.perf_counter()
        applied = 0
        for d in self._arrived:
            if not d.ready():
                if not wait:
                    break
                self.waits += 1
            done = d.read()
            self._obs_next = d.obs
            if d.trained and d.rewards is not None:  # read after the dones' wait: the same copy's event
                if self.sums is None:  # episodes under way when the probe started are partial
                    self.sums = StepSums(self.n, self.episode_step == 0)
                self.sums.step(d.rewards.numpy(), done, self.returns, self.iteration)
            # new arrays, never changed in place: the grids handed to the tracer hold views of them
            self.env_step = self.env_step + 1
            self.episode = self.episode + done
            self.episode_step = np.where(done, 0, np.where(self.episode_step >= 0, self.episode_step + 1, -1))
            self.starts = done.astype(np.int8)
            self._version += 1
            applied += 1
        del self._arrived[:applied]
        self.tracer.integration_seconds += time.perf_counter() - start
        return not self._arrived

    def _env_counts(self) -> None:
        """At the first ``PPO.act`` with no env step since the probe started: each env's step in its episode as
        the env counts it (``episode_length_buf``, where the env has one, N non-negative integers), read once
        (on a GPU one wait, once per attach). ``OnPolicyRunner.learn(init_at_random_ep_len=True)`` randomizes it
        before the first step (``runners/on_policy_runner.py:OnPolicyRunner.learn``), so an env whose count is
        k > 0 is k steps into an episode that began before the probe: its episode step goes on from k, no
        episode start is tagged (the report counts no episode whose first row is not step 0 as complete), as
        for an episode under way when the probe attaches. Where the env has no count, the probe's own rule
        stands (a fresh memory starts an episode; else its step is unknown)."""
        self._counted = True
        buf = getattr(self.env, "episode_length_buf", None)
        if not isinstance(buf, torch.Tensor) or buf.numel() != self.n or buf.dtype.is_floating_point:
            return
        count = buf.detach().reshape(-1).cpu().numpy().astype(np.int64)
        if (count < 0).any():
            return
        self.episode_step = count
        self.starts = (count == 0).astype(np.int8)

    def _grid(self, **cells: Any) -> Grid:
        return Grid.one_step(self.envs, self.env_step, self.episode, self.episode_step, self.starts, **cells)

    # -- the wrappers ------------------------------------------------------------------------------
    def _wrap(self, owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Wrap ``owner.name`` on the instance (the user's own instance wrapper, if any, stays inside)."""
        inner = getattr(owner, name)
        if getattr(inner, "_lstm_probe", False):
            raise BadInput(f"{type(owner).__name__}.{name} is wrapped by a probe already (attach once)")
        wrapper = functools.wraps(inner)(make(inner))
        wrapper._lstm_probe = True  # type: ignore[attr-defined]
        self._undo.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, wrapper)

    # start, close, with: life.Probe; the wrappers are this probe's own attachments
    def _attach(self) -> None:
        self._wrap(self.env, "step", self._step)
        self._wrap(self.alg, "act", self._act)
        self._wrap(self.alg, "compute_returns", self._returns)
        self._wrap(self.storage, "recurrent_mini_batch_generator", self._minibatches)
        settings, self.live = whatif.settings(self.measure), []
        if settings is not None:  # counterfactual initial states, on copies (whatif.py)
            self.what_if = whatif.WhatIf(self.alg, self.steps_per_env, **settings)
            self._hooks.append(self.alg.optimizer.register_step_pre_hook(self.what_if.step_hook))
            self.live.append(Live("what_if", self.what_if.metadata))
        settings = memory.settings(self.measure)
        if settings is not None:  # the memory horizon, on copies (memory.py)
            self.memory = memory.Memory(self.alg, self.steps_per_env, **settings)
            self.live.append(Live("memory", self.memory.metadata))

    def _detach(self) -> None:
        while self._hooks:
            self._hooks.pop().remove()
        while self._undo:
            owner, name, own = self._undo.pop()
            if own is None:
                vars(owner).pop(name, None)
            else:
                setattr(owner, name, own)

    def _step(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            start = time.perf_counter()
            obs = self._flat(out[0]) if self.obs_groups is not None else None
            # rsl_rl's VecEnv.step: (obs, rewards, dones, extras); the rewards OnPolicyRunner.learn hands on to
            # alg.process_env_step and sums per episode in utils/logger.py:Logger.process_env_step (cur_reward_sum)
            self._arrived.append(_Dones(out[2], obs, out[1], self._acted))
            self._counted = True  # the counters moved on from the probe's start: the env's counts are not read
            if self._acted:  # a training step (its action from PPO.act); else a play loop's or a step of the user's
                self.trained_steps += self.n
                self._acted = False
            self.tracer.integration_seconds += time.perf_counter() - start
            # a play loop's next call is tagged in a hook, which never waits: its dones are read here
            self._settle(wait=self._playing)
            return out

        return step

    def _act(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def act(*args: Any, **kwargs: Any) -> Any:
            self._playing = False
            self._acted = True
            self._settle(wait=True)  # outside the hooks; in OnPolicyRunner.learn the copy is done by now
            if not self._counted:
                self._env_counts()
            t = int(self.storage.step)  # the storage index this step's transition will have
            if t < self.steps_per_env:
                roll = self.roll
                roll["env_step"][t], roll["episode"][t] = self.env_step, self.episode
                roll["episode_step"][t], roll["start"][t] = self.episode_step, self.starts
            grid = self._grid()
            if self.obs_groups is not None:
                grid.obs = self._act_obs(args[0] if args else kwargs["obs"])
            self.tags = Tags(phase="rollout", iteration=self.iteration, grid=grid)
            try:
                return fn(*args, **kwargs)
            finally:
                self.tags = None

        return act

    # -- the observations (capture_obs) -----------------------------------------------------------
    def _flat(self, obs: Any) -> torch.Tensor:
        """The actor's observation groups of ``obs`` (a TensorDict; a tensor as it is), as (N, width) float32."""
        assert self.obs_groups is not None
        parts = [obs] if isinstance(obs, torch.Tensor) else [obs[g] for g in self.obs_groups]
        return torch.cat([p.detach().reshape(p.shape[0], -1) for p in parts], -1).to(torch.float32)

    def _obs_layout(self) -> dict[str, Any]:
        """``obs_size``, and where the actor reads several observation groups, ``obs_keys``: each group's slice of
        the flattened vector, in the order :meth:`_flat` concatenates them (probes name ``obs:GROUP[i]``)."""
        stored = self.storage.observations  # (T, N, ...) per group, allocated with the storage
        parts, start = [], 0
        for g in self.obs_groups or []:
            shape = tuple(int(d) for d in stored[g].shape[2:])
            size = int(np.prod(shape))
            parts.append({"key": g, "start": start, "size": size, "encoding": "values", "space": f"group {shape}"})
            start += size
        return {"obs_size": start, **({"obs_keys": parts} if len(parts) > 1 else {})}

    def _act_obs(self, obs: Any) -> np.ndarray:
        """A rollout step's observation as the grid's (N, 1, width) column: the one the last env step returned
        (copied to the host in the ``env.step`` wrapper with its dones, and settled with them), or where no env
        step came since the last ``act`` (``OnPolicyRunner.learn``'s first: ``env.get_observations()``) act's
        own argument, copied now (on a GPU, the one wait this adds: once per ``learn()`` call)."""
        host, self._obs_next = self._obs_next, None
        if host is None:
            host = self._flat(obs).cpu().numpy()
        return host[:, None, :]

    def _returns(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def compute_returns(*args: Any, **kwargs: Any) -> Any:
            self._playing = False
            self._settle(wait=True)
            last = np.full(self.n, BOOTSTRAP["last"], np.int8)
            grid = self._grid(bootstrap=last)
            self.tags = Tags(phase="bootstrap", iteration=self.iteration, bootstrap="last", grid=grid)
            try:
                return fn(*args, **kwargs)
            finally:
                self.tags = None

        return compute_returns

    def _minibatches(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def generator(num_mini_batches: int, num_epochs: int = 8) -> Iterator[Any]:
            start = time.perf_counter()
            grids = self.layout(num_mini_batches)
            self.returns.publish(self.tracer)  # the rollout's episodes
            self.tracer.integration_seconds += time.perf_counter() - start
            if self.memory is not None:  # the rollout's own weights: no minibatch has stepped yet
                self.memory.measure(self.roll["start"], self.iteration)
            for live in self.live:  # what-if (the updates before) and memory into every part from now on
                live.publish(self.tracer)
            self.tracer.batch_jobs(True)  # the update's training calls cross to the writer together
            try:
                for k, batch in enumerate(fn(num_mini_batches, num_epochs)):
                    epoch, mb = divmod(k, num_mini_batches)
                    self.tags = Tags(phase="train", iteration=self.iteration, epoch=epoch, minibatch=mb, grid=grids[mb])
                    if self.what_if is not None:  # before PPO trains on it, outside the hooks
                        self.tags = None
                        where = (self.iteration, epoch, mb)
                        self.what_if.on_batch(batch, self.roll["start"], self.sequences[mb], where)
                        self.tags = Tags(
                            phase="train", iteration=self.iteration, epoch=epoch, minibatch=mb, grid=grids[mb]
                        )
                    yield batch
            finally:
                self.tags = None
                self.iteration += 1
                self.tracer.batch_jobs(False)

        return generator

    def layout(self, num_mini_batches: int) -> list[Grid]:
        """The train grid of each minibatch, as ``RolloutStorage.recurrent_mini_batch_generator`` cuts the
        rollout: trajectories split at the storage's dones, env-major, padded to the rollout's length."""
        dones = self.storage.dones.reshape(self.steps_per_env, -1).cpu().numpy() != 0  # once per update
        steps, n = dones.shape
        starts = np.zeros((steps, n), bool)  # rollout_storage.py: last_was_done
        starts[0] = True
        starts[1:] = dones[:-1]
        env, t0 = np.nonzero(starts.T)  # env-major, time ascending (split_and_pad_trajectories' order)
        t1 = np.r_[t0[1:], steps]
        t1[np.r_[env[1:] != env[:-1], True]] = steps
        length = t1 - t0
        size = self.n // num_mini_batches
        grids = []
        self.sequences = []  # each minibatch's trajectories: (env, first rollout step), for what-if
        tt = np.arange(steps)
        for i in range(num_mini_batches):
            a, b = np.searchsorted(env, [i * size, (i + 1) * size])
            self.sequences.append((env[a:b], t0[a:b]))
            e, s, ln = env[a:b, None], t0[a:b, None], length[a:b]
            valid = tt[None, :] < ln[:, None]
            src = np.minimum(s + tt[None, :], steps - 1)

            def col(name: str, dtype: Any, src: np.ndarray = src, e: np.ndarray = e, valid: np.ndarray = valid) -> Any:
                return np.where(valid, self.roll[name][src, e], -1).astype(dtype)

            start = col("start", np.int8)
            grid = Grid(
                env=np.where(valid, e, -1).astype(np.int32),
                env_step=col("env_step", np.int64),
                episode=col("episode", np.int64),
                episode_step=col("episode_step", np.int64),
                episode_start=start,
                padding=~valid,
                train=True,
            )
            grid.seq_len = ln.astype(np.int32)
            reason = np.where(start[:, 0] == 1, SEQ_REASON["episode_start"], SEQ_REASON["env_boundary"])
            grid.seq_reason = reason.astype(np.int8)
            grids.append(grid)
        return grids

    # -- the end -----------------------------------------------------------------------------------
    def _final(self) -> dict[str, Any]:
        """The env steps training took (a play loop's not counted; the dones still on their way applied first:
        outside the hooks)."""
        self._settle(wait=True)
        final: dict[str, Any] = {"progress_num_timesteps": self.trained_steps, "returns": self.returns.record()}
        if self.what_if is not None:
            final["what_if"] = self.what_if.metadata()
        if self.memory is not None:
            final["memory"] = self.memory.metadata()
        return final


HYPERPARAMETERS = (
    "num_learning_epochs",
    "num_mini_batches",
    "clip_param",
    "gamma",
    "lam",
    "value_loss_coef",
    "entropy_coef",
    "learning_rate",
    "max_grad_norm",
    "use_clipped_value_loss",
    "schedule",
    "desired_kl",
    "normalize_advantage_per_mini_batch",
)
"""``algorithms/ppo.py:PPO``'s settings the run box shows (as the algorithm holds them when the probe attaches)."""


def runner_metadata(runner: Any, alg: Any) -> dict[str, Any]:
    """What the log's metadata says about an rsl_rl run: the runner's and the models' settings."""
    cfg = getattr(runner, "cfg", None) or {}
    models = {}
    for role in ROLES:
        rnn = getattr(getattr(getattr(alg, role, None), "rnn", None), "rnn", None)
        if rnn is not None:
            kind = "lstm" if isinstance(rnn, nn.LSTM) else "gru"
            models[role] = {"rnn_type": kind, "hidden_size": rnn.hidden_size, "num_layers": rnn.num_layers}
    actor = getattr(alg, "actor", None)
    kind = str(models.get("actor", {}).get("rnn_type") or "")
    hyper = {
        k: getattr(alg, k)
        for k in HYPERPARAMETERS
        if isinstance(getattr(alg, k, None), int | float | bool | str) or getattr(alg, k, 0) is None
    }
    return {
        "algorithm": type(alg).__name__,
        "policy": f"{type(actor).__name__} ({kind})" if kind else type(actor).__name__,
        "hyperparameters": {"num_steps_per_env": int(alg.storage.num_transitions_per_env), **hyper},
        "rsl_rl": {
            "num_envs": int(alg.storage.num_envs),
            "num_steps_per_env": int(alg.storage.num_transitions_per_env),
            "num_mini_batches": getattr(alg, "num_mini_batches", None),
            "num_learning_epochs": getattr(alg, "num_learning_epochs", None),
            "learning_rate": getattr(alg, "learning_rate", None),
            "gamma": getattr(alg, "gamma", None),
            "models": models,
            "experiment_name": cfg.get("experiment_name") if isinstance(cfg, dict) else None,
        },
    }
