"""What if training sequences started from other states? Counterfactual initial states and burn-in, measured
on a copy of a RecurrentPPO policy while it trains (``ProbeCallback(what_if=True)``, ``lstm-probe run --what-if``).

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

import math
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.integrations.sb3.arch import private_policy as shadow_policy
from lstm_probe.integrations.sb3.options import Measure
from lstm_probe.log.schema import WHAT_IF_METRICS

BURN_IN = (4, 16, 64)
"""Burn-in lengths always measured (``burn_in=`` adds more)."""
MAX_ITERATIONS = 500
"""Sampled iterations kept in the log: past this, every other one is dropped and the stride doubles, so the
metadata stays bounded (a few MB) however long the run."""
VALUE_PREFIXES = ("lstm_critic.", "critic.", "mlp_extractor.value_net.", "value_net.", "vf_features_extractor.")
"""Parameters of the critic side (the rest, features extractor included when shared, count as policy side)."""
KEYS = ("iteration", "epoch", "minibatch", "alternative", "sequences", "episode_starts", "reached", "clipped")
"""Each record's keys besides its metrics (``reached``, ``clipped``: burn-ins only, see :meth:`WhatIf._measure`)."""
STORED_BURN_IN = "stored_burn_in_"
"""Prefix of the burn-ins from stored states: a prefix of its own, so that no report takes them for burn-ins from
zero (``burn_in_``)."""
METRICS = (*WHAT_IF_METRICS, "return_spread")
"""What each sampled minibatch records: the report's averaged figures, and the returns' spread they are
relative to."""


def what_if_settings(measure: Measure) -> dict[str, Any] | None:
    """The settings of :class:`WhatIf` (None when ``--what-if`` is off), from checked options: the default
    burn-in lengths and those asked for."""
    if not measure.what_if:
        return None
    return {"every": measure.what_if_every, "burn_in": tuple(sorted(set(BURN_IN) | set(measure.burn_in)))}


def last_starts(episode_starts: np.ndarray, n_envs: int, n_steps: int) -> np.ndarray:
    """Per flat index (env-major): the rollout step of the last episode start at or before it in its env, -1
    where the env's rollout has none so far."""
    starts = episode_starts.reshape(n_envs, n_steps)
    steps = np.where(starts, np.arange(n_steps)[None, :], -1)
    return np.maximum.accumulate(steps, axis=1).reshape(-1)


def run_starts(step: np.ndarray, last: np.ndarray, burn_in: Iterable[int]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Where each alternative's run starts for sequences starting at rollout ``step`` (``last``: the step of
    the last episode start at or before it, -1 if none): alternative -> (first step run, whether it starts
    from the stored state of that first step rather than from zero). The run covers steps [first, step); a run
    that begins at an episode start begins from zero, as sb3 resets there (the buffer's state at an episode
    start is the one before the reset).

    ``refreshed`` runs from the last episode start, or from the stored state of the rollout's first step where
    there is none; ``burn_in_<k>`` from zero k steps back (clipped at the episode or rollout start);
    ``stored_burn_in_<k>`` from the stored state k steps back (clipped the same way: from the rollout's first
    stored state, or from zero at the episode start)."""
    from_ep = np.maximum(last, 0)
    out = {"refreshed": (from_ep, last < 0)}
    for k in burn_in:
        out[f"burn_in_{k}"] = (np.maximum(step - k, from_ep), np.zeros(len(step), bool))
    for k in burn_in:
        first = np.maximum(step - k, from_ep)
        out[f"{STORED_BURN_IN}{k}"] = (first, first > last)  # not an episode start: its stored state
    return out


def initial_states(
    lstm: nn.LSTM,
    features: torch.Tensor,
    rows: np.ndarray,
    stored: tuple[np.ndarray, np.ndarray],
    env: np.ndarray,
    step: np.ndarray,
    first: np.ndarray,
    from_stored: np.ndarray,
    n_steps: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """States (h, c), each (layers, n_seq, hidden), before rollout ``step`` of ``env`` for each sequence: a run of
    ``lstm`` over steps [first, step) from zero (or from the stored state of rollout step ``first`` of the env
    where ``from_stored``). ``features``: the LSTM inputs of the flat buffer rows ``rows`` (sorted); ``stored``:
    the buffer's flat (n_envs * n_steps, layers, hidden) states."""
    n_seq = len(step)
    layers, hidden = lstm.num_layers, lstm.hidden_size
    h0 = torch.zeros(layers, n_seq, hidden, device=features.device)
    c0 = torch.zeros_like(h0)
    if from_stored.any():
        base = env[from_stored] * n_steps + first[from_stored]  # (k,) flat index of the step the run starts at
        h0[:, torch.from_numpy(np.flatnonzero(from_stored))] = _as(stored[0][base], h0).transpose(0, 1)
        c0[:, torch.from_numpy(np.flatnonzero(from_stored))] = _as(stored[1][base], h0).transpose(0, 1)
    length = step - first
    run = np.flatnonzero(length > 0)
    if len(run) == 0:
        return h0, c0
    t = np.arange(int(length.max()))
    flat = (env * n_steps + first)[run, None] + t[None, :]  # (n_run, max_len) flat buffer rows
    valid = t[None, :] < length[run, None]
    pos = np.where(valid, np.searchsorted(rows, flat), 0)
    x = features[torch.from_numpy(pos.T.copy()).to(features.device)]  # (max_len, n_run, F)
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.from_numpy(length[run]), enforce_sorted=False)
    index = torch.from_numpy(run).to(h0.device)
    _, (h, c) = lstm(packed, (h0[:, index].contiguous(), c0[:, index].contiguous()))
    h0[:, index], c0[:, index] = h, c
    return h0, c0


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


def kl(p: list[Any], q: list[Any]) -> torch.Tensor:
    """KL(p || q) per element, summed over action dimensions and components."""
    total: Any = 0
    for a, b in zip(p, q, strict=True):
        k = torch.distributions.kl_divergence(a, b)
        total = total + (k.sum(-1) if k.dim() > 1 else k)
    return total


def _round(v: float | None) -> float | None:
    if v is None or not math.isfinite(v):
        return None
    return float(f"{v:.6g}")


def _cos(a: list[torch.Tensor], b: list[torch.Tensor]) -> float | None:
    if not a:
        return None
    x, y = torch.cat(a), torch.cat(b)
    nx, ny = float(x.norm()), float(y.norm())
    return float(x @ y) / (nx * ny) if nx > 0 and ny > 0 else None


class WhatIf:
    """The what-if measurement of one ``learn()``: :meth:`on_samples` runs on every minibatch sb3 draws and
    measures those :meth:`wants`; :meth:`step_hook` (an optimizer step pre-hook) reads the gradient sb3 steps
    with; :meth:`metadata` is what the log keeps. Holds the policy and its copy, never the model (the probe's
    attachment, which owns this, must not keep the model alive)."""

    def __init__(self, model: Any, *, every: int, burn_in: Iterable[int] = BURN_IN):
        from gymnasium import spaces

        policy = model.policy
        self.policy = policy
        self.discrete = isinstance(model.action_space, spaces.Discrete)
        self.asked_every = self.every = every
        self.burn_in = tuple(burn_in)
        self.n_envs, self.n_steps = int(model.n_envs), int(model.n_steps)
        self.n_minibatches = -(-self.n_envs * self.n_steps // int(model.batch_size))
        self.last_epoch = int(model.n_epochs) - 1
        self.shadow: Any = shadow_policy(policy)
        self.critic = "lstm" if policy.lstm_critic is not None else ("shared" if policy.shared_lstm else "mlp")
        self.modules = ["actor"] + (["critic"] if policy.lstm_critic is not None else [])
        mine = dict(self.shadow.named_parameters()) | dict(self.shadow.named_buffers())
        theirs = dict(policy.named_parameters()) | dict(policy.named_buffers())
        self._pairs = [(mine[n], theirs[n]) for n in mine]
        named = [n for n, p in self.shadow.named_parameters() if p.requires_grad]
        self.params = [mine[n] for n in named]
        self.user_params = [theirs[n] for n in named]
        self.value_side = [n.startswith(VALUE_PREFIXES) for n in named]
        self.columns: dict[str, list[Any]] = {c: [] for c in (*KEYS, *(f"state_{m}" for m in self.modules), *METRICS)}
        self.seconds = 0.0
        self._last: tuple[int, np.ndarray] | None = None  # (iteration, last_starts) of the current rollout
        self._pending: tuple[int, list[torch.Tensor]] | None = None  # (row, refreshed gradient) for step_hook

    def wants(self, iteration: int, epoch: int, minibatch: int) -> bool:
        """First and last minibatch of the first and last epoch, every ``every``-th iteration."""
        return (
            iteration % self.every == 0 and epoch in (0, self.last_epoch) and minibatch in (0, self.n_minibatches - 1)
        )

    def on_samples(
        self, model: Any, samples: Any, batch_inds: np.ndarray, buffer: Any, iteration: int, epoch: int, mb: int
    ) -> None:
        """Called for every minibatch sb3 draws (``buffers.py:_get_samples``), before it trains on it: measures
        it if sampled, with the weights it is about to be trained with."""
        self._pending = None  # a gradient not read by now belongs to a minibatch sb3 did not step with
        if not self.wants(iteration, epoch, mb):
            return
        start = time.perf_counter()
        self._thin()
        device = samples.returns.device
        devices = [device.index or torch.cuda.current_device()] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            with torch.no_grad():
                for mine, theirs in self._pairs:
                    mine.copy_(theirs)
            self.shadow.set_training_mode(self.policy.training)
            self._measure(model, samples, batch_inds, buffer, (iteration, epoch, mb), devices)
        self.seconds += time.perf_counter() - start

    def step_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Optimizer step pre-hook: the gradient sb3 is about to step with (from stored states; the clipping
        before it scales it as a whole, which leaves its direction) against the refreshed states' gradient."""
        if self._pending is None:
            return
        start = time.perf_counter()
        row, ref = self._pending
        self._pending = None
        grads = [
            torch.zeros(p.numel(), device=p.device) if p.grad is None else p.grad.detach().reshape(-1)
            for p in self.user_params
        ]
        for side, name in ((False, "grad_cos_policy"), (True, "grad_cos_value")):
            pick = [i for i, v in enumerate(self.value_side) if v == side]
            self.columns[name][row] = _round(_cos([grads[i] for i in pick], [ref[i] for i in pick]))
        self.seconds += time.perf_counter() - start

    def _measure(
        self,
        model: Any,
        samples: Any,
        batch_inds: np.ndarray,
        buffer: Any,
        where: tuple[int, int, int],
        devices: list[int],
    ) -> None:
        n = self.n_steps
        first_rows = batch_inds[np.asarray(buffer.seq_start_indices)]  # (n_seq,) flat rows of the sequence starts
        env, step = first_rows // n, first_rows % n
        episode_starts = np.asarray(buffer.episode_starts).reshape(-1) > 0.5
        if self._last is None or self._last[0] != where[0]:
            self._last = (where[0], last_starts(episode_starts, self.n_envs, n))
        last = self._last[1][first_rows]
        at_start = episode_starts[first_rows]
        computed = self._states(buffer, env, step, run_starts(step, last, self.burn_in), samples)
        h, c = samples.lstm_states.pi
        zero = (torch.zeros_like(h), torch.zeros_like(c))
        # stored: exactly what sb3 trains with; the rest zero at episode starts, where sb3 resets anyway
        alternatives = {"refreshed": computed["refreshed"], "stored": samples.lstm_states}
        alternatives["zero"] = _states_like(samples.lstm_states, zero, zero)
        alternatives.update({name: states for name, states in computed.items() if name != "refreshed"})
        names = list(alternatives)
        mask = samples.mask > 1e-8
        actions = samples.actions.long().flatten() if self.discrete else samples.actions
        self._seed(devices)
        with torch.no_grad():
            values, log_prob, entropy, dist = evaluate(self.shadow, samples, actions, list(alternatives.values()))
            terms = {k: v.tolist() for k, v in loss_terms(model, samples, mask, values, log_prob, entropy).items()}
            dists = split(dist, len(names))
        spread = float(samples.returns[mask].std()) if int(mask.sum()) > 1 else 0.0
        keep = torch.as_tensor(~at_start, dtype=h.dtype, device=h.device)[None, :, None]
        for a, name in enumerate(names[1:], start=1):
            row: dict[str, Any] = {
                "iteration": where[0],
                "epoch": where[1],
                "minibatch": where[2],
                "alternative": name,
                "sequences": len(step),
                "episode_starts": int(at_start.sum()),
                "return_spread": _round(spread),
            }
            if name.startswith(("burn_in_", STORED_BURN_IN)):
                k = int(name.rpartition("_")[2])
                # the window is cut at the rollout's first step, with no episode start in it
                clipped = (last < 0) & (step - k <= 0)
                row["clipped"] = _round(float(clipped.mean()))
                # exact where the burn-in reaches back to the episode start (or the sequence starts one); from
                # stored states also where it reaches the rollout start (refreshed starts from that state too)
                exact = at_start | ((last >= 0) & (step - k <= last))
                if name.startswith(STORED_BURN_IN):
                    exact |= clipped
                row["reached"] = _round(float(exact.mean()))
            for i, module in enumerate(self.modules):
                x = [t * keep for t in _pair(alternatives[name], i)]  # the states sb3 starts from
                y = [t * keep for t in _pair(alternatives["refreshed"], i)]
                norm = math.sqrt(sum(float((t**2).sum()) for t in y))
                diff = math.sqrt(sum(float(((u - v) ** 2).sum()) for u, v in zip(x, y, strict=True)))
                row[f"state_{module}"] = _round(diff / norm if norm > 0 else (0.0 if diff == 0 else None))
            dv = float((values[a] - values[0])[mask].abs().mean())
            dlogp = (log_prob[a] - log_prob[0])[mask]
            row["value_abs"] = _round(dv)
            row["value_rel"] = _round(dv / spread) if spread > 0 else None
            row["kl"] = None if dists is None else _round(float(kl(dists[0], dists[a])[mask].mean()))
            row["logp_abs"] = _round(float(dlogp.abs().mean()))
            row["ratio_change"] = _round(float((torch.exp(dlogp) - 1).abs().mean()))
            row["clip_fraction_delta"] = _round(terms["clip_fraction"][a] - terms["clip_fraction"][0])
            for term in ("policy_loss", "value_loss", "entropy_loss"):
                row[f"{term}_delta"] = _round(terms[term][a] - terms[term][0])
            for col, values_ in self.columns.items():
                values_.append(row.get(col))
            if name == "stored":
                stored_row = len(self.columns["iteration"]) - 1
        self._pending = (stored_row, self._gradient(model, samples, actions, mask, alternatives["refreshed"], devices))

    def _gradient(
        self, model: Any, samples: Any, actions: torch.Tensor, mask: torch.Tensor, states: Any, devices: list[int]
    ) -> list[torch.Tensor]:
        """The loss gradient on the copy from ``states`` (flattened per parameter), as sb3 would take it."""
        self._seed(devices)
        values, log_prob, entropy, _ = evaluate(self.shadow, samples, actions, [states])
        loss = loss_terms(model, samples, mask, values, log_prob, entropy)["loss"][0]
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return [
            torch.zeros(p.numel(), device=p.device) if g is None else g.reshape(-1)
            for g, p in zip(grads, self.params, strict=True)
        ]

    @staticmethod
    def _seed(devices: list[int]) -> None:
        """The same dropout draws (if any) for every pass, on the generators fork_rng restores afterwards."""
        torch.random.default_generator.manual_seed(0)
        for d in devices:
            torch.cuda.default_generators[d].manual_seed(0)

    def _states(
        self, buffer: Any, env: np.ndarray, step: np.ndarray, plan: dict[str, Any], samples: Any
    ) -> dict[str, Any]:
        """Each computed alternative's initial states, in the minibatch's RNNStates layout."""
        n = self.n_steps
        firsts = np.concatenate([first for first, _ in plan.values()])
        length = np.tile(step, len(plan)) - firsts
        envs = np.tile(env, len(plan))
        t = np.arange(int(length.max()) if len(length) else 0)
        rows = np.unique(((envs * n + firsts)[:, None] + t[None, :])[t[None, :] < length[:, None]])
        like = samples.returns
        with torch.no_grad():
            if len(rows):
                obs = buffer.observations
                batch = (
                    {k: _as(v[rows], like) for k, v in obs.items()} if isinstance(obs, dict) else _as(obs[rows], like)
                )
                features = self.shadow.extract_features(batch)
                pi_f, vf_f = (features, features) if self.shadow.share_features_extractor else features
            else:
                pi_f = vf_f = torch.zeros(0, device=like.device)
            out = {}
            for name, (first, from_stored) in plan.items():
                stored = (buffer.hidden_states_pi, buffer.cell_states_pi)
                pi = initial_states(self.shadow.lstm_actor, pi_f, rows, stored, env, step, first, from_stored, n)
                vf = pi
                if self.shadow.lstm_critic is not None:
                    stored = (buffer.hidden_states_vf, buffer.cell_states_vf)
                    vf = initial_states(self.shadow.lstm_critic, vf_f, rows, stored, env, step, first, from_stored, n)
                out[name] = _states_like(samples.lstm_states, pi, vf)
        return out

    def _thin(self) -> None:
        """Keep at most :data:`MAX_ITERATIONS` sampled iterations: drop every other one, double the stride."""
        while len(set(self.columns["iteration"])) >= MAX_ITERATIONS:
            self.every *= 2
            keep = [i for i, it in enumerate(self.columns["iteration"]) if it % self.every == 0]
            self.columns = {c: [v[i] for i in keep] for c, v in self.columns.items()}

    def metadata(self) -> dict[str, Any]:
        """What the log keeps under ``what_if``: settings, what was sampled, the records (columnar)."""
        return {
            "version": 1,
            "sampling": {
                "every": self.every,
                "asked_every": self.asked_every,
                "epochs": sorted({0, self.last_epoch}),
                "minibatches": sorted({0, self.n_minibatches - 1}),
                "minibatches_per_epoch": self.n_minibatches,
            },
            "burn_in": list(self.burn_in),
            "stored_burn_in": list(self.burn_in),
            "modules": list(self.modules),
            "critic": self.critic,
            "seconds": round(self.seconds, 3),
            "records": self.columns,
        }


def _states_like(template: Any, pi: tuple[torch.Tensor, torch.Tensor], vf: tuple[torch.Tensor, torch.Tensor]) -> Any:
    return type(template)(tuple(pi), tuple(vf))


def _pair(states: Any, module: int) -> tuple[torch.Tensor, torch.Tensor]:
    return states.pi if module == 0 else states.vf
