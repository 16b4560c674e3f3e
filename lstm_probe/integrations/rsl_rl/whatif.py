"""What if rsl_rl's training trajectories started from other states? rsl_rl's adapter of the what-if engine
(``lstm_probe/measure/whatif.py``, whose docstring says what is measured; ``attach(runner, what_if=True)``,
``lstm-probe run --framework rsl_rl --what-if``).

What it relies on (rsl-rl-lib 5.5.1), cited by file:function:

- ``storage/rollout_storage.py:RolloutStorage.recurrent_mini_batch_generator`` splits each env's rollout at its
  dones (``utils/utils.py:split_and_pad_trajectories``: env-major, time ascending), gives minibatch i the
  trajectories of envs ``[i * N // M, (i + 1) * N // M)`` and starts each from the state stored at its first step
  (``saved_hidden_state_a`` / ``_c``: (steps, layers, envs, hidden), h then c; one tensor for a GRU). A trajectory
  starts at the rollout's first step or at an episode start, where the stored state is zero
  (``algorithms/ppo.py:PPO.process_env_step`` resets the modules before the next step's state is stored): rsl_rl
  re-runs every trajectory from its own start, so its stored states are refreshed states, and what can differ is
  the state carried into the rollout (``zero``) and a shorter history (burn-ins, clipped at the rollout start).
- ``models/rnn_model.py:RNNModel.get_latent``: the RNN's input is ``MLPModel.get_latent`` (the observation groups,
  concatenated and normalized); the RNN's output goes through ``mlp`` and, for the actor, ``distribution.update``
  (``modules/distribution.py``: ``log_prob``, ``entropy``, the torch distribution in ``_distribution``).
- ``algorithms/ppo.py:PPO.update``: the loss (clipped surrogate, value loss clipped with ``clip_param`` when
  ``use_clipped_value_loss``, ``entropy_coef``, ``value_loss_coef``), the advantages normalized per minibatch when
  ``normalize_advantage_per_mini_batch`` (after the generator yields, so here too), computed the same way.
  Symmetry augmentation and RND add terms this does not follow: ``--what-if`` is refused with them.

Everything runs on private copies of actor and critic (``measure/copies.py``), weights copied in before each
measured minibatch; the sequences are evaluated unpadded as rsl_rl does (``unpad_trajectories``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lstm_probe.errors import BadInput
from lstm_probe.measure import copies
from lstm_probe.measure import whatif as engine
from lstm_probe.measure.whatif import BURN_IN, Outcome, Rollout, States
from lstm_probe.options import Measure

ROLES = ("actor", "critic")


def settings(measure: Measure) -> dict[str, Any] | None:
    """The settings of :class:`WhatIf` (None when ``--what-if`` is off)."""
    if not measure.what_if:
        return None
    return {"every": measure.what_if_every, "burn_in": tuple(sorted(set(BURN_IN) | set(measure.burn_in)))}


def _tuple(state: Any) -> tuple[torch.Tensor, ...]:
    return tuple(state) if isinstance(state, tuple | list) else (state,)


def _distributions(dist: Any, n_alt: int) -> list[list[Any]] | None:
    """One torch distribution per alternative from the copy's last (T, A * E, D) distribution; None for a kind
    this does not cut."""
    d = getattr(dist, "_distribution", None)
    if isinstance(d, torch.distributions.Normal):
        params = {"loc": d.loc, "scale": d.scale}
    elif isinstance(d, torch.distributions.Beta):
        params = {"concentration1": d.concentration1, "concentration0": d.concentration0}
    else:
        return None

    def cut(x: torch.Tensor, a: int) -> torch.Tensor:
        t, ae = x.shape[:2]
        return x.reshape(t, n_alt, ae // n_alt, *x.shape[2:])[:, a].reshape(t * (ae // n_alt), *x.shape[2:])

    kind: Any = type(d)
    return [[kind(**{k: cut(v, a) for k, v in params.items()})] for a in range(n_alt)]


class WhatIf:
    """The what-if measurement of an rsl_rl run: :meth:`on_batch` on every minibatch the storage yields (before
    PPO trains on it); the engine's ``step_hook`` goes on the algorithm's optimizer; :meth:`metadata` is what the
    log keeps under ``what_if``."""

    def __init__(self, alg: Any, steps_per_env: int, *, every: int, burn_in: Any = BURN_IN):
        if getattr(alg, "symmetry", None) or getattr(alg, "rnd", None):
            raise BadInput("--what-if does not follow rsl_rl's symmetry or RND loss terms; run without them")
        self.alg = alg
        self.n_envs, self.n_steps = int(alg.storage.num_envs), steps_per_env
        models = {r: getattr(alg, r) for r in ROLES}
        self.copies = {r: copies.private_copy(m) for r, m in models.items()}
        self.modules = [r for r in ROLES if getattr(models[r], "is_recurrent", False)]
        self._pairs = [p for r in ROLES for p in copies.pairs(self.copies[r], models[r])]
        named = [(r, n) for r in ROLES for n, p in self.copies[r].named_parameters() if p.requires_grad]
        theirs = {r: dict(models[r].named_parameters()) for r in ROLES}
        self.engine = engine.WhatIf(
            every=every,
            burn_in=burn_in,
            n_minibatches=int(alg.num_mini_batches),
            last_epoch=int(alg.num_learning_epochs) - 1,
            modules=self.modules,
            critic="lstm" if "critic" in self.modules else "mlp",
            params=[dict(self.copies[r].named_parameters())[n] for r, n in named],
            user_params=[theirs[r][n] for r, n in named],
            value_side=[r == "critic" for r, _ in named],
        )
        self.step_hook = self.engine.step_hook
        self.metadata = self.engine.metadata

    def on_batch(
        self, batch: Any, starts: np.ndarray, sequences: tuple[np.ndarray, np.ndarray], where: tuple[int, int, int]
    ) -> None:
        """Called for every minibatch the storage yields: measures it if sampled. ``starts``: the rollout's
        episode starts (steps, envs), as the probe keeps them; ``sequences``: the minibatch's trajectories (env,
        first rollout step), as the probe's ``layout`` cut them from the storage's dones."""
        iteration, epoch, mb = where
        if not self.engine.wants(iteration, epoch, mb):
            self.engine.skip()
            return
        copies.sync(self._pairs)
        for r in ROLES:
            self.copies[r].train(getattr(self.alg, r).training)
        env, step = sequences
        stored = {r: _tuple(s) for r, s in zip(ROLES, batch.hidden_states, strict=True) if r in self.modules}
        mini = engine.Minibatch(
            where=where, env=env, step=step, stored=stored, evaluate=lambda s: self._evaluate(batch, s)
        )
        like = batch.returns
        self.engine.measure(self._rollout(iteration, starts), mini, like)

    def _rollout(self, iteration: int, starts: np.ndarray) -> Rollout:
        storage = self.alg.storage
        n, t = self.n_envs, self.n_steps

        def flat(saved: Any) -> tuple[torch.Tensor, ...]:  # (steps, layers, envs, hidden) -> env-major rows
            return tuple(s.permute(2, 0, 1, 3).reshape(n * t, s.shape[1], s.shape[3]) for s in saved)

        def features(rows: np.ndarray) -> dict[str, torch.Tensor]:
            index = torch.from_numpy(rows)
            obs = storage.observations[index % t, index // t]
            return {r: _inputs(self.copies[r], obs) for r in self.modules}

        saved = {"actor": storage.saved_hidden_state_a, "critic": storage.saved_hidden_state_c}
        return Rollout(
            iteration=iteration,
            n_envs=n,
            n_steps=t,
            episode_starts=(starts == 1).T.reshape(-1),
            rnns={r: self.copies[r].rnn.rnn for r in self.modules},
            stored={r: flat(saved[r]) for r in self.modules},
            features=features,
        )

    def _evaluate(self, batch: Any, states: list[States]) -> Outcome:
        """``PPO.update``'s forward and loss on the copies from each of ``states``: the minibatch repeated once
        per alternative along the trajectory axis."""
        alg, n_alt = self.alg, len(states)
        obs = torch.cat([batch.observations] * n_alt, dim=1)
        masks = torch.cat([batch.masks] * n_alt, dim=1)

        def run(role: str, stored: Any) -> torch.Tensor:
            model = self.copies[role]
            if role in self.modules:
                joined = tuple(torch.cat([s[role][i] for s in states], 1) for i in range(len(states[0][role])))
                hidden = joined if len(joined) == 2 else joined[0]
                return model.mlp(model.get_latent(obs, masks, hidden))
            from rsl_rl.utils import unpad_trajectories  # a feed-forward model reads the unpadded steps

            return model.mlp(model.get_latent(unpad_trajectories(obs, masks)))

        actor = self.copies["actor"]
        actor.distribution.update(run("actor", batch.hidden_states[0]))
        actions = torch.cat([batch.actions] * n_alt, dim=1)
        log_prob = actor.get_output_log_prob(actions)  # (T, A * E)
        entropy = actor.output_entropy
        values = run("critic", batch.hidden_states[1])  # (T, A * E, 1)
        advantages = batch.advantages
        if getattr(alg, "normalize_advantage_per_mini_batch", False):
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        e = batch.actions.shape[1]
        terms: dict[str, list[torch.Tensor]] = {k: [] for k in engine.TERMS}
        for a in range(n_alt):  # PPO.update's expressions verbatim, squeezes and all, on this alternative's (T, E)
            lp, ent, v = (x[:, a * e : (a + 1) * e] for x in (log_prob, entropy, values))
            ratio = torch.exp(lp - torch.squeeze(batch.old_actions_log_prob))
            surrogate = -torch.squeeze(advantages) * ratio
            surrogate_clipped = -torch.squeeze(advantages) * torch.clamp(
                ratio, 1.0 - alg.clip_param, 1.0 + alg.clip_param
            )
            surrogate_loss = torch.max(surrogate, surrogate_clipped).mean()
            if alg.use_clipped_value_loss:
                value_clipped = batch.values + (v - batch.values).clamp(-alg.clip_param, alg.clip_param)
                value_losses = (v - batch.returns).pow(2)
                value_loss = torch.max(value_losses, (value_clipped - batch.returns).pow(2)).mean()
            else:
                value_loss = (batch.returns - v).pow(2).mean()
            loss = surrogate_loss + alg.value_loss_coef * value_loss - alg.entropy_coef * ent.mean()
            for k, x in zip(
                engine.TERMS,
                (surrogate_loss, value_loss, -ent.mean(), ((ratio - 1).abs() > alg.clip_param).float().mean(), loss),
                strict=True,
            ):
                terms[k].append(x)

        def alt(x: torch.Tensor) -> torch.Tensor:  # (T, A * E) -> (A, T * E)
            t = x.shape[0]
            return x.reshape(t, n_alt, e).transpose(0, 1).reshape(n_alt, -1)

        flat_values = alt(values.reshape(values.shape[0], -1))
        mask = torch.ones(flat_values.shape[1], dtype=torch.bool, device=flat_values.device)
        stacked = {k: torch.stack(v) for k, v in terms.items()}
        dists = _distributions(actor.distribution, n_alt)
        return Outcome(flat_values, alt(log_prob), mask, stacked, dists, batch.returns.reshape(-1))


def _inputs(model: Any, obs: Any) -> torch.Tensor:
    """The RNN's input for ``obs`` (``models/mlp_model.py:MLPModel.get_latent``: the observation groups,
    concatenated and normalized), on the copy."""
    from rsl_rl.models.mlp_model import MLPModel

    return MLPModel.get_latent(model, obs)
