"""What if training sequences started from other states? sb3's adapter of the what-if engine
(``lstm_probe/measure/whatif.py``, whose docstring says what is measured) for a RecurrentPPO policy while it trains
(``ProbeCallback(what_if=True)``, ``lstm-probe run --what-if``).

For sampled minibatches, with the weights that minibatch is trained with (before its optimizer step), the
minibatch is evaluated again from other states at each sequence start and compared with *refreshed* states
(the LSTMs re-run with the current weights over the rollout from its first step, the only history sb3 keeps):
``stored`` (the rollout-time states sb3 trains with), ``zero`` (zero states), ``burn_in_<k>`` (a zero state
k steps before the sequence start, run forward over the stored inputs, clipped at the episode and rollout
start) and ``stored_burn_in_<k>`` (R2D2's stored-state burn-in: the stored state of the step k steps before the
sequence start, run forward the same way; a window clipped at the rollout start begins from the stored state of
the rollout's first step, one clipped at an episode start from zero). A zero burn-in clipped at the rollout start
(no episode start in between) starts from zero where refreshed starts from the stored state, so it never equals
refreshed however long; the stored-state one does wherever its window reaches the rollout or an episode start.
Each comparison becomes one record per (iteration, epoch, minibatch, alternative); the log's
metadata holds them under ``what_if`` (columnar), and the report's "What if" section reads them.

It relies on sb3-contrib 2.x, cited by file:function:

- ``common/recurrent/buffers.py:RecurrentRolloutBuffer.get`` flattens the buffer env-major before the first
  minibatch (flat index i is env i // n_steps, rollout step i % n_steps); it keeps the rollout's observations,
  episode starts and the states *before* each step (``hidden_states_pi`` ..., not yet reset for an episode
  start). ``_get_samples`` cuts a minibatch into sequences (``seq_start_indices``, left on the buffer) whose
  initial states are the stored states at their starts.
- ``common/recurrent/policies.py:RecurrentActorCriticPolicy._process_sequence`` resets the state at an episode
  start (``(1 - episode_start) * state``): a sequence that starts an episode has no state to vary, and a run
  that reaches back to an episode start begins there from zero. ``evaluate_actions`` is followed step by step
  in :func:`evaluate`, keeping the action distribution for the KL divergence.
- ``ppo_recurrent/ppo_recurrent.py:RecurrentPPO.train``: the loss terms (clipped surrogate, value loss with
  ``clip_range_vf``, entropy), the advantage normalisation and the clipped fraction, computed the same way.

Training is untouched: everything runs on one copy of the policy (``arch.private_policy``: built once, without
the hooks of the original's modules and without its optimizer; weights copied in before each measurement),
inside ``torch.random.fork_rng`` (reseeded before each evaluation, so dropout, if any, draws alike for every
alternative), drawing from no NumPy RNG; gradients come from ``torch.autograd.grad`` on the copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lstm_probe.integrations.sb3.arch import private_policy as shadow_policy
from lstm_probe.measure import whatif as engine
from lstm_probe.measure.whatif import BURN_IN, Outcome, Rollout, States
from lstm_probe.options import Measure

# the engine's pieces, as this module named them before the engine was shared
initial_states, last_starts, run_starts, STORED_BURN_IN = (
    engine.initial_states,
    engine.last_starts,
    engine.run_starts,
    engine.STORED_BURN_IN,
)
VALUE_PREFIXES = ("lstm_critic.", "critic.", "mlp_extractor.value_net.", "value_net.", "vf_features_extractor.")
"""Parameters of the critic side (the rest, features extractor included when shared, count as policy side)."""


def what_if_settings(measure: Measure) -> dict[str, Any] | None:
    """The settings of :class:`WhatIf` (None when ``--what-if`` is off), from checked options: the default
    burn-in lengths and those asked for."""
    if not measure.what_if:
        return None
    return {"every": measure.what_if_every, "burn_in": tuple(sorted(set(BURN_IN) | set(measure.burn_in)))}


def _as(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(array, dtype=like.dtype, device=like.device)


def evaluate(policy: Any, data: Any, actions: torch.Tensor, states: list[Any]) -> tuple[Any, ...]:
    """``policies.py:RecurrentActorCriticPolicy.evaluate_actions`` on ``policy`` for the minibatch ``data``
    from each of ``states`` (RNNStates) at once: the minibatch repeated once per alternative along the sequence
    axis, so one pass serves them all. (values, log_prob, entropy or None, distribution), each (A, N) for A
    alternatives and N padded minibatch elements (the distribution: batched over A * N)."""
    n_alt = len(states)
    features = policy.extract_features(data.observations)
    pi_features, vf_features = (features, features) if policy.share_features_extractor else features

    def tile(x: torch.Tensor) -> torch.Tensor:
        return x.repeat(n_alt, *([1] * (x.dim() - 1)))

    def cat(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([h for h, _ in pairs], 1), torch.cat([c for _, c in pairs], 1)

    starts = tile(data.episode_starts)
    latent_pi, _ = policy._process_sequence(tile(pi_features), cat([s.pi for s in states]), starts, policy.lstm_actor)
    if policy.lstm_critic is not None:
        vf = cat([s.vf for s in states])
        latent_vf, _ = policy._process_sequence(tile(vf_features), vf, starts, policy.lstm_critic)
    elif policy.shared_lstm:
        latent_vf = latent_pi.detach()
    else:  # no state reaches the values: one pass serves every alternative, the same bit for bit
        latent_vf = policy.critic(vf_features)
    latent_pi = policy.mlp_extractor.forward_actor(latent_pi)
    latent_vf = policy.mlp_extractor.forward_critic(latent_vf)
    distribution = policy._get_action_dist_from_latent(latent_pi)
    log_prob = distribution.log_prob(tile(actions)).reshape(n_alt, -1)
    entropy = distribution.entropy()
    values = policy.value_net(latent_vf)
    stateless = policy.lstm_critic is None and not policy.shared_lstm
    values = values.reshape(1, -1).expand(n_alt, -1) if stateless else values.reshape(n_alt, -1)
    return values, log_prob, None if entropy is None else entropy.reshape(n_alt, -1), distribution


def loss_terms(
    model: Any, data: Any, mask: torch.Tensor, values: torch.Tensor, log_prob: torch.Tensor, entropy: Any
) -> dict[str, torch.Tensor]:
    """``ppo_recurrent.py:RecurrentPPO.train``'s loss terms and clipped fraction per alternative (each (A,))
    from (A, N) values, log-probabilities and entropies."""

    def mean(x: torch.Tensor) -> torch.Tensor:  # over the minibatch's real (unpadded) elements
        return (x * mask).sum(-1) / mask.sum()

    advantages = data.advantages
    if model.normalize_advantage:
        advantages = (advantages - advantages[mask].mean()) / (advantages[mask].std() + 1e-8)
    clip = model.clip_range(model._current_progress_remaining)
    ratio = torch.exp(log_prob - data.old_log_prob)
    policy_loss = -mean(torch.min(advantages * ratio, advantages * torch.clamp(ratio, 1 - clip, 1 + clip)))
    values_pred = values
    if model.clip_range_vf is not None:
        clip_vf = model.clip_range_vf(model._current_progress_remaining)
        values_pred = data.old_values + torch.clamp(values - data.old_values, -clip_vf, clip_vf)
    value_loss = mean((data.returns - values_pred) ** 2)
    entropy_loss = mean(log_prob) if entropy is None else -mean(entropy)
    return {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy_loss": entropy_loss,
        "clip_fraction": mean((torch.abs(ratio - 1) > clip).float()),
        "loss": policy_loss + model.ent_coef * entropy_loss + model.vf_coef * value_loss,
    }


def split(distribution: Any, n_alt: int) -> list[Any] | None:
    """One torch distribution per alternative from sb3's batched ``distribution``; None for a kind this does
    not know how to cut (its KL is then not measured)."""
    d = distribution.distribution
    parts = d if isinstance(d, list) else [d]
    out: list[list[Any]] = [[] for _ in range(n_alt)]
    for part in parts:
        if isinstance(part, torch.distributions.Normal):
            loc, scale = (x.reshape(n_alt, -1, *x.shape[1:]) for x in (part.loc, part.scale))
            made: list[Any] = [torch.distributions.Normal(loc[a], scale[a]) for a in range(n_alt)]
        elif isinstance(part, torch.distributions.Categorical | torch.distributions.Bernoulli):
            logits = part.logits.reshape(n_alt, -1, *part.logits.shape[1:])
            made = [type(part)(logits=logits[a]) for a in range(n_alt)]
        else:
            return None
        for a in range(n_alt):
            out[a].append(made[a])
    return out


class WhatIf:
    """The what-if measurement of one ``learn()`` (the engine's :class:`~lstm_probe.measure.whatif.WhatIf`):
    :meth:`on_samples` runs on every minibatch sb3 draws and measures those the engine wants; :meth:`step_hook`
    (an optimizer step pre-hook) reads the gradient sb3 steps with; :meth:`metadata` is what the log keeps.
    Holds the policy and its copy, never the model (the probe's attachment, which owns this, must not keep the
    model alive)."""

    def __init__(self, model: Any, *, every: int, burn_in: Any = BURN_IN):
        from gymnasium import spaces

        policy = model.policy
        self.policy = policy
        self.discrete = isinstance(model.action_space, spaces.Discrete)
        self.n_envs, self.n_steps = int(model.n_envs), int(model.n_steps)
        self.shadow: Any = shadow_policy(policy)
        critic = "lstm" if policy.lstm_critic is not None else ("shared" if policy.shared_lstm else "mlp")
        self.modules = ["actor"] + (["critic"] if policy.lstm_critic is not None else [])
        mine = dict(self.shadow.named_parameters()) | dict(self.shadow.named_buffers())
        theirs = dict(policy.named_parameters()) | dict(policy.named_buffers())
        self._pairs = [(mine[n], theirs[n]) for n in mine]
        named = [n for n, p in self.shadow.named_parameters() if p.requires_grad]
        self.engine = engine.WhatIf(
            every=every,
            burn_in=burn_in,
            n_minibatches=-(-self.n_envs * self.n_steps // int(model.batch_size)),
            last_epoch=int(model.n_epochs) - 1,
            modules=self.modules,
            critic=critic,
            params=[mine[n] for n in named],
            user_params=[theirs[n] for n in named],
            value_side=[n.startswith(VALUE_PREFIXES) for n in named],
        )
        self.step_hook = self.engine.step_hook
        self.metadata = self.engine.metadata

    def on_samples(
        self, model: Any, samples: Any, batch_inds: np.ndarray, buffer: Any, iteration: int, epoch: int, mb: int
    ) -> None:
        """Called for every minibatch sb3 draws (``buffers.py:_get_samples``), before it trains on it: measures
        it if sampled, with the weights it is about to be trained with."""
        if not self.engine.wants(iteration, epoch, mb):
            self.engine.skip()
            return
        with torch.no_grad():
            for mine, theirs in self._pairs:
                mine.copy_(theirs)
        self.shadow.set_training_mode(self.policy.training)
        first_rows = batch_inds[np.asarray(buffer.seq_start_indices)]  # (n_seq,) flat rows of the sequence starts
        n = self.n_steps
        stored = {"actor": samples.lstm_states.pi, "critic": samples.lstm_states.vf}
        batch = engine.Minibatch(
            where=(iteration, epoch, mb),
            env=first_rows // n,
            step=first_rows % n,
            stored={m: tuple(stored[m]) for m in self.modules},
            evaluate=lambda states: self._evaluate(model, samples, states),
        )
        self.engine.measure(self._rollout(buffer, iteration, samples.returns), batch, samples.returns)

    def _rollout(self, buffer: Any, iteration: int, like: torch.Tensor) -> Rollout:
        """The flattened buffer as the engine reads it (``buffers.py:RecurrentRolloutBuffer.get``: env-major)."""
        shadow = self.shadow

        def features(rows: np.ndarray) -> dict[str, torch.Tensor]:
            obs = buffer.observations
            batch = {k: _as(v[rows], like) for k, v in obs.items()} if isinstance(obs, dict) else _as(obs[rows], like)
            f = shadow.extract_features(batch)
            pi_f, vf_f = (f, f) if shadow.share_features_extractor else f
            return {"actor": pi_f, "critic": vf_f}

        rnns = {"actor": shadow.lstm_actor, "critic": shadow.lstm_critic}
        stored = {
            "actor": (buffer.hidden_states_pi, buffer.cell_states_pi),
            "critic": (buffer.hidden_states_vf, buffer.cell_states_vf),
        }
        return Rollout(
            iteration=iteration,
            n_envs=self.n_envs,
            n_steps=self.n_steps,
            episode_starts=np.asarray(buffer.episode_starts).reshape(-1) > 0.5,
            rnns={m: rnns[m] for m in self.modules},
            stored={m: stored[m] for m in self.modules},
            features=features,
        )

    def _evaluate(self, model: Any, samples: Any, states: list[States]) -> Outcome:
        """``evaluate`` and ``loss_terms`` from each of ``states`` (the critic's, where it has no LSTM, the
        actor's: sb3 ignores them)."""
        rnn = [samples.lstm_states.__class__(s["actor"], s.get("critic", s["actor"])) for s in states]
        mask = samples.mask > 1e-8
        actions = samples.actions.long().flatten() if self.discrete else samples.actions
        values, log_prob, entropy, dist = evaluate(self.shadow, samples, actions, rnn)
        terms = loss_terms(model, samples, mask, values, log_prob, entropy)
        return Outcome(values, log_prob, mask, terms, split(dist, len(states)), samples.returns)
