"""What if RLlib PPO's training chunks started from other states? RLlib's adapter of the what-if engine
(``lstm_probe/measure/whatif.py``, whose docstring says what is measured; ``probe_config(config, out,
what_if=True)``, ``lstm-probe run --framework rllib --what-if``). It runs in each learner process, beside that
learner's probe.

What it relies on (RLlib 2.60), cited by file:function:

- ``core/learner/learner.py:Learner._make_batch_if_necessary`` runs the learner connector once per update on the
  whole list of episode chunks, with the learner on the call stack (found there once: the loss's coefficients
  and the optimizer are the learner's); ``utils/minibatch_utils.py:MiniBatchCyclicIterator`` then cuts
  minibatches of ``minibatch_size`` timesteps from the shuffled sequences, crossing epoch bounds: the adapter
  numbers minibatches per update and counts ``ceil(timesteps / minibatch_size)`` of them as an epoch.
- ``connectors/common/add_states_from_episodes_to_batch.py:AddStatesFromEpisodesToBatch.__call__`` (learner
  side): each ``max_seq_len`` piece of a chunk starts from the state stored before its first step: the module's
  initial state at an episode's first step (``t_started == 0``), else the ``STATE_OUT`` of the step before (the
  lookback buffer holds the previous chunk's last one). The adapter keeps the same states for every step of
  every chunk: the rollout the engine re-runs, a chunk per "env", from the chunk's first step.
- ``core/models/torch/encoder.py:TorchLSTMEncoder._forward``: the LSTM's input is the tokenizer's output (or
  the observations), its states batch-first in the batch (``STATE_IN``: ``{"h", "c"}``, per encoder
  ``{"actor": ..., "critic": ...}`` when ``vf_share_layers=False``,
  ``core/models/base.py:StatefulActorCriticEncoder``).
- ``algorithms/ppo/torch/ppo_torch_learner.py:PPOTorchLearner.compute_loss_for_module``: the loss, followed
  verbatim (masked means over ``LOSS_MASK``, the value loss clipped at ``vf_clip_param``, the KL term with the
  learner's current coefficient when ``use_kl_loss``); the forward is the copy's ``forward_train`` and
  ``compute_values`` (``algorithms/ppo/torch/default_ppo_torch_rl_module.py``).

Everything runs on a private copy of the RLModule (``measure/copies.py``), weights copied in before each
measured minibatch: the learner's own module and its wrappers are never called.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from lstm_probe.errors import BadInput
from lstm_probe.integrations.rllib.chunks import Chunks, Replica, leaves
from lstm_probe.measure import whatif as engine
from lstm_probe.measure.whatif import BURN_IN, Outcome, Rollout, States

VALUE_SIDE = ("vf.", "encoder.critic_encoder.")
"""The parameters the value loss trains alone (the gradient cosine's value side)."""


def settings(what_if: bool, every: int, burn_in: Any) -> dict[str, Any] | None:
    """The settings of :class:`WhatIf` (None when ``--what-if`` is off)."""
    if not what_if:
        return None
    return {"every": every, "burn_in": tuple(sorted(set(BURN_IN) | set(burn_in)))}


def find_learner() -> Any:
    """The RLlib learner whose connector pipeline is running (a caller's ``self`` up the stack), or None."""
    from ray.rllib.core.learner.learner import Learner

    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Learner):
            return candidate
        frame = frame.f_back  # type: ignore[assignment]
    return None


class WhatIf:
    """The what-if measurement of one RLlib learner: :meth:`on_update` when the learner connector sees the
    update's episode chunks, :meth:`on_minibatch` on each minibatch before ``forward_train`` (the learner trains
    on it right after); :meth:`metadata` is what the learner's shard keeps under ``what_if``."""

    def __init__(self, replica: Replica, module_id: str, *, every: int, burn_in: Any = BURN_IN):
        self.replica, self.module_id = replica, module_id
        self.module, self.copy, self.rnns = replica.module, replica.copy, replica.rnns
        self.learner: Any = None
        self.hooks: list[Any] = []
        self.rollout: Rollout | None = None
        self.chunks: dict[tuple[int, int, int, int], int] = {}
        self.per_epoch = 1
        self.settings = (every, tuple(burn_in))
        self.engine: engine.WhatIf | None = None

    # -- per update: the learner, the rollout ---------------------------------------------------------
    def on_update(self, iteration: int, chunks: Chunks, total: int) -> None:
        """Keep the update's episode chunks (``total``: their timesteps) as the rollout the engine re-runs."""
        if self.engine is None:
            self.engine = self._start(find_learner())
        n_chunks, length = chunks.shape
        self.chunks = chunks.index
        starts = np.zeros(n_chunks * length, bool)
        starts[::length] = chunks.episode_start
        size = int(self.learner.config.minibatch_size or total)
        self.per_epoch = self.engine.n_minibatches = max(1, math.ceil(total / max(1, size)))
        observations = chunks.obs

        def features(rows: np.ndarray) -> dict[str, torch.Tensor]:
            x = observations.reshape(n_chunks * length, *observations.shape[2:])[torch.from_numpy(rows)]
            return {r: self.replica.inputs(r, x) for r in self.rnns}

        self.rollout = Rollout(
            iteration=iteration,
            n_envs=n_chunks,
            n_steps=length,
            episode_starts=starts,
            rnns=self.rnns,
            stored=chunks.stored,  # type: ignore[arg-type]
            features=features,
        )

    def _start(self, learner: Any) -> engine.WhatIf:
        """The engine, the loss's coefficients and the gradient hook from the learner (the first update's)."""
        if learner is None or not hasattr(learner, "entropy_coeff_schedulers_per_module"):
            raise BadInput("--what-if on RLlib follows PPO's torch learner (PPOTorchLearner); none is running here")
        self.learner = learner
        every, burn_in = self.settings
        config = learner.config
        named = [(n, p) for n, p in self.copy.named_parameters() if p.requires_grad]
        theirs = dict(self.module.named_parameters())
        eng = engine.WhatIf(
            every=every,
            burn_in=burn_in,
            n_minibatches=1,
            last_epoch=max(0, int(config.num_epochs) - 1),
            modules=list(self.rnns),
            critic="shared" if self.replica.shared else "lstm",
            params=[p for _, p in named],
            user_params=[theirs[n] for n, _ in named],
            value_side=[n.startswith(VALUE_SIDE) for n, _ in named],
        )
        for _, optimizer in learner.get_optimizers_for_module(self.module_id):
            self.hooks.append(optimizer.register_step_pre_hook(eng.step_hook))
        return eng

    def close(self) -> None:
        while self.hooks:
            self.hooks.pop().remove()

    def metadata(self) -> dict[str, Any] | None:
        if self.engine is None:
            return None
        meta = self.engine.metadata()
        meta["sampling"]["epoch_counted"] = "minibatches of minibatch_size timesteps, ceil(timesteps / size) per epoch"
        # the env runners' inference-only module leaves out these attributes when its weights are synced
        # (algorithms/ppo/default_ppo_rl_module.py:DefaultPPORLModule.get_non_inference_attributes,
        # core/rl_module/torch/torch_rl_module.py:TorchRLModule.get_state(inference_only=True)), yet a stateful
        # encoder still runs its critic there: the critic states it stores come from its initial weights
        skipped: list[str] = getattr(self.module, "get_non_inference_attributes", lambda: [])()
        if "critic" in self.rnns and "encoder.critic_encoder" in skipped:
            meta["unsynced"] = {
                "critic": "RLlib's env runners never receive the critic encoder's weights (vf_share_layers=False: "
                "their inference-only module keeps it at its initial weights), so the critic states stored in "
                "rollout come from the untrained critic"
            }
        return meta

    # -- per minibatch ------------------------------------------------------------------------------
    def on_minibatch(
        self, batch: dict[str, Any], locate: Callable[[], np.ndarray] | None, iteration: int, index: int
    ) -> None:
        """Measure the ``index``-th minibatch of the update if sampled (before the learner trains on it);
        ``locate()``: each sequence's (worker, env, episode, chunk start, episode step) of its first step, from the
        probe's provenance column (None: the batch has none)."""
        eng, rollout = self.engine, self.rollout
        if eng is None or rollout is None:
            return
        where = (iteration, index // self.per_epoch, index % self.per_epoch)
        if not eng.wants(*where) or locate is None:
            eng.skip()
            return
        first = locate()
        keys = [tuple(int(x) for x in r[:4]) for r in first]
        if not all(k in self.chunks for k in keys):  # a chunk collected without the probe: nothing to re-run
            eng.skip()
            return
        env = np.array([self.chunks[k] for k in keys], np.int64)  # type: ignore[index]
        step = (first[:, 4] - first[:, 3]).astype(np.int64)
        self.replica.sync()
        from ray.rllib.core.columns import Columns

        state_in = batch[Columns.STATE_IN]
        stored: States = {
            r: tuple(t.transpose(0, 1) for t in leaves(state_in, sub)) for r, (_, sub) in self.replica.encoders.items()
        }
        like = stored[next(iter(stored))][0]
        mini = engine.Minibatch(
            where=where, env=env, step=step, stored=stored, evaluate=lambda s: self._evaluate(batch, s)
        )
        eng.measure(rollout, mini, like)

    def _evaluate(self, batch: dict[str, Any], states: list[States]) -> Outcome:
        """``compute_loss_for_module``'s forward and loss on the copy from each of ``states``: the minibatch
        repeated once per alternative along the sequence axis."""
        from ray.rllib.core.columns import Columns
        from ray.rllib.evaluation.postprocessing import Postprocessing

        n_alt, copy = len(states), self.copy
        obs = batch[Columns.OBS]
        b, t = obs.shape[:2]

        def joined(role: str) -> dict[str, torch.Tensor]:
            h, c = (torch.cat([s[role][i] for s in states], 1).transpose(0, 1) for i in range(2))
            return {"h": h, "c": c}

        state_in: Any = (
            {sub: joined(role) for role, (_, sub) in self.replica.encoders.items()}
            if not self.replica.shared
            else joined("actor")
        )
        rep = {Columns.OBS: torch.cat([obs] * n_alt, 0), Columns.STATE_IN: state_in}
        out = type(copy).forward_train(copy, rep)
        values = type(copy).compute_values(copy, rep, embeddings=out.get(Columns.EMBEDDINGS))  # (A * B, T)
        logits = out[Columns.ACTION_DIST_INPUTS]
        config = self.learner.config.get_config_for_module(self.module_id)
        entropy_coeff = self.learner.entropy_coeff_schedulers_per_module[self.module_id].get_current_value()
        kl_coeff = self.learner.curr_kl_coeffs_per_module[self.module_id]
        mask = batch.get(Columns.LOSS_MASK)
        if mask is None:
            mask = torch.ones(b, t, dtype=torch.bool, device=obs.device)

        def masked_mean(x: torch.Tensor) -> torch.Tensor:
            return torch.sum(x[mask]) / torch.sum(mask)

        train_cls, explore_cls = copy.get_train_action_dist_cls(), copy.get_exploration_action_dist_cls()
        prev = explore_cls.from_logits(batch[Columns.ACTION_DIST_INPUTS])
        advantages, targets = batch[Postprocessing.ADVANTAGES], batch[Postprocessing.VALUE_TARGETS]
        terms: dict[str, list[torch.Tensor]] = {k: [] for k in engine.TERMS}
        log_probs, dists = [], []
        for a in range(n_alt):  # compute_loss_for_module's expressions verbatim, on this alternative's (B, T)
            curr = train_cls.from_logits(logits[a * b : (a + 1) * b])
            logp = curr.logp(batch[Columns.ACTIONS])
            ratio = torch.exp(logp - batch[Columns.ACTION_LOGP])
            kl_loss = masked_mean(prev.kl(curr)) if config.use_kl_loss else torch.zeros((), device=obs.device)
            ent = curr.entropy()
            surrogate = torch.min(
                advantages * ratio, advantages * torch.clamp(ratio, 1 - config.clip_param, 1 + config.clip_param)
            )
            v = values[a * b : (a + 1) * b]
            vf_loss = torch.clamp(torch.pow(v - targets, 2.0), 0, config.vf_clip_param)
            total = masked_mean(-surrogate + config.vf_loss_coeff * vf_loss - entropy_coeff * ent)
            if config.use_kl_loss:
                total = total + kl_coeff * kl_loss
            parts = (
                -masked_mean(surrogate),
                masked_mean(vf_loss),
                -masked_mean(ent),
                masked_mean(((ratio - 1).abs() > config.clip_param).float()),
                total,
            )
            for k, x in zip(engine.TERMS, parts, strict=True):
                terms[k].append(x)
            log_probs.append(logp.reshape(-1))
            dists.append(_flat(getattr(curr, "_dist", None), b * t))
        flat_mask = mask.reshape(-1).bool()
        distributions = None if any(d is None for d in dists) else [[d] for d in dists]
        return Outcome(
            values.reshape(n_alt, b * t),
            torch.stack(log_probs),
            flat_mask,
            {k: torch.stack(v) for k, v in terms.items()},
            distributions,
            targets.reshape(-1),
        )


def _flat(dist: Any, n: int) -> Any:
    """A torch distribution over ``n`` elements (the (B, T) cells flattened), for the KL; None for a kind this
    does not cut."""
    if isinstance(dist, torch.distributions.Categorical):
        return torch.distributions.Categorical(logits=dist.logits.reshape(n, -1))
    if isinstance(dist, torch.distributions.Normal):
        return torch.distributions.Normal(dist.loc.reshape(n, -1), dist.scale.reshape(n, -1))
    return None
