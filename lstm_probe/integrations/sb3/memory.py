"""Does a RecurrentPPO policy use its LSTM, and how far back? sb3's adapter of the memory-horizon engine
(``lstm_probe/measure/memory.py``, whose docstring says what is measured) while it trains
(``ProbeCallback(memory=True)``, ``lstm-probe run --memory``).

At the end of sampled rollouts, for sampled rollout steps t of each env, the LSTMs are re-run over the rollout's
stored inputs with the state *after* step t-k replaced by zero, so the policy at t sees only its last k inputs
(k = 1, 2, 4, ... up to the rollout length), and its outputs at t are compared with the unablated ones (the
rollout's own, from the stored state before t): the action distribution's KL divergence and the value difference
relative to the rollout's value spread. k = 1 is a feed-forward policy (the current input only). Only ablations
inside one episode count: a window that reaches back to the episode's start (where sb3 resets the state anyway)
is left out. Effect(k), averaged over the sampled steps, is one record per (iteration, module, k); the log's
metadata holds them under ``memory`` (columnar), and the report's "Memory" section reads them (horizon: the
smallest k whose effect is below 5% of effect(1)).

It relies on sb3-contrib 2.x, cited by file:function:

- ``ppo_recurrent/ppo_recurrent.py:RecurrentPPO.collect_rollouts`` calls ``callback.on_rollout_end()`` after the
  rollout buffer is full and before ``train``: the weights are the ones the whole rollout ran with, and the
  buffer (``common/recurrent/buffers.py:RecurrentRolloutBuffer``) is not yet flattened by ``get``: observations
  (n_steps, n_envs, ...), ``episode_starts`` (n_steps, n_envs) and the states *before* each step
  (``hidden_states_pi`` ..., (n_steps, layers, n_envs, hidden), not yet reset for an episode start).
- ``common/recurrent/policies.py:RecurrentActorCriticPolicy._process_sequence`` resets the state at an episode
  start (``(1 - episode_start) * state``) and runs ``nn.LSTM`` over (steps, batch, features); ``forward`` and
  ``predict_values`` pass the LSTM output through ``mlp_extractor``, ``action_net`` / ``value_net``; with
  ``shared_lstm`` the critic reads the actor LSTM's output, with neither critic LSTM nor sharing it is an MLP.

Training is untouched: everything runs on one copy of the policy (built once without the hooks of the original's
modules and without its optimizer; weights copied in before each measurement), under ``torch.no_grad`` and
``torch.random.fork_rng``, drawing from no NumPy RNG (the sampled steps are evenly spaced).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lstm_probe.integrations.sb3.arch import private_policy as shadow_policy
from lstm_probe.measure import memory as engine
from lstm_probe.measure.memory import DEFAULT_EVERY, SAMPLES, Out, Rollout
from lstm_probe.options import Measure

# the engine's pieces, as this module named them before the engine was shared
lags, sample_steps, reach, KEYS, MAX_ITERATIONS = (
    engine.lags,
    engine.sample_steps,
    engine.reach,
    engine.KEYS,
    engine.MAX_ITERATIONS,
)


def memory_settings(measure: Measure) -> dict[str, Any] | None:
    """The settings of :class:`Memory` (None when ``--memory`` is off), from checked options."""
    if not measure.memory:
        return None
    return {"every": DEFAULT_EVERY if measure.memory_every is None else measure.memory_every}


def _torch_dist(policy: Any, latent_pi: torch.Tensor) -> Any:
    """The torch distribution(s) of the policy's action distribution at ``latent_pi``: sb3's ``Distribution``
    object is one per policy, refilled by each ``_get_action_dist_from_latent``
    (``common/distributions.py:*.proba_distribution`` returns ``self``), so it is read out at once."""
    return policy._get_action_dist_from_latent(latent_pi).distribution


class Memory:
    """The memory-horizon measurement of one ``learn()`` (the engine's :class:`~lstm_probe.measure.memory.Memory`):
    :meth:`measure` at the end of each rollout (it skips iterations the stride leaves out), :meth:`metadata` is
    what the log keeps. Holds the policy and its copy, never the model."""

    def __init__(self, model: Any, *, every: int = DEFAULT_EVERY, samples: int = SAMPLES):
        policy = model.policy
        self.policy = policy
        self.shared = bool(getattr(policy, "shared_lstm", False))
        critic = "lstm" if policy.lstm_critic is not None else ("shared" if self.shared else "mlp")
        self.modules = ["actor"] + (["critic"] if policy.lstm_critic is not None else [])
        self.engine = engine.Memory(
            n_envs=int(model.n_envs),
            n_steps=int(model.n_steps),
            modules=self.modules,
            critic=critic,
            every=every,
            samples=samples,
        )
        self.n_envs, self.n_steps = self.engine.n_envs, self.engine.n_steps
        self.metadata = self.engine.metadata
        self.shadow: Any = None
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _copy(self) -> Any:
        if self.shadow is None:
            self.shadow = shadow_policy(self.policy)
            mine = dict(self.shadow.named_parameters()) | dict(self.shadow.named_buffers())
            theirs = dict(self.policy.named_parameters()) | dict(self.policy.named_buffers())
            self._pairs = [(mine[n], theirs[n]) for n in mine]
        with torch.no_grad():
            for a, b in self._pairs:
                a.copy_(b)
        self.shadow.set_training_mode(False)
        return self.shadow

    def measure(self, buffer: Any, iteration: int) -> None:
        """Measure effect(k) on the full rollout ``buffer`` of ``iteration`` (if the stride samples it)."""
        starts = np.asarray(buffer.episode_starts).reshape(self.n_steps, self.n_envs) > 0.5
        self.engine.observe(starts)
        if self.engine.wants(iteration):
            self.engine.measure(lambda: self._rollout(buffer, iteration, starts), self.policy.device)

    def _rollout(self, buffer: Any, iteration: int, starts: np.ndarray) -> Rollout:
        """The rollout buffer (``buffers.py:RecurrentRolloutBuffer``, not yet flattened: step-major) for the engine."""
        policy = self._copy()
        n, n_envs = self.n_steps, self.n_envs
        device = policy.device
        obs = buffer.observations
        rows = n * n_envs

        def tensor(a: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(a, dtype=torch.float32, device=device)

        # features of every rollout row, step-major: row = step * n_envs + env
        if isinstance(obs, dict):
            batch: Any = {key: tensor(np.asarray(v).reshape(rows, *np.asarray(v).shape[2:])) for key, v in obs.items()}
        else:
            batch = tensor(np.asarray(obs).reshape(rows, *np.asarray(obs).shape[2:]))
        features = policy.extract_features(batch)
        pi_f, vf_f = (features, features) if policy.share_features_extractor else features
        pi_f = pi_f.reshape(n, n_envs, -1)
        vf_f = vf_f.reshape(n, n_envs, -1)
        shared = self.shared

        def heads(latent: dict[str, torch.Tensor], t: np.ndarray, env: np.ndarray) -> Out:
            """The action distribution and value from the LSTM outputs (``policies.py:forward`` after the LSTMs)."""
            if "critic" in latent:
                latent_vf = latent["critic"]
            elif shared:
                latent_vf = latent["actor"]
            else:
                latent_vf = policy.critic(vf_f[t, env])
            latent_pi = policy.mlp_extractor.forward_actor(latent["actor"])
            values = policy.value_net(policy.mlp_extractor.forward_critic(latent_vf)).flatten()
            whole = _torch_dist(policy, latent_pi)
            return Out(values, lambda ok: whole if len(ok) == len(t) else _torch_dist(policy, latent_pi[ok]))

        stored = {
            "actor": (buffer.hidden_states_pi, buffer.cell_states_pi),
            "critic": (buffer.hidden_states_vf, buffer.cell_states_vf),
        }
        lstms = {"actor": policy.lstm_actor, "critic": policy.lstm_critic}
        inputs = {"actor": pi_f, "critic": vf_f}
        return Rollout(
            iteration=iteration,
            starts=starts,
            rnns={m: lstms[m] for m in self.modules},
            inputs={m: inputs[m] for m in self.modules},
            stored={m: stored[m] for m in self.modules},
            heads=heads,
            values=buffer.values,
            value_modules=["critic", *(["actor"] if shared else [])],
        )
