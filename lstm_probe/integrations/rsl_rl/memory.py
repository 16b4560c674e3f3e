"""Does an rsl_rl policy use its RNN, and how far back? rsl_rl's adapter of the memory-horizon engine
(``lstm_probe/measure/memory.py``, whose docstring says what is measured; ``attach(runner, memory=True)``,
``lstm-probe run --framework rsl_rl --memory``).

What it relies on (rsl-rl-lib 5.5.1), cited by file:function:

- ``storage/rollout_storage.py:RolloutStorage``: ``observations`` (steps, envs) and the states stored before each
  step (``saved_hidden_state_a`` / ``_c``: (steps, layers, envs, hidden), h then c, one tensor for a GRU),
  zero where the step starts an episode (``algorithms/ppo.py:PPO.process_env_step`` resets before the next
  step's state is stored); ``values`` (steps, envs, 1).
- ``models/rnn_model.py:RNNModel``: the RNN's input is ``MLPModel.get_latent`` (the observation groups,
  concatenated and normalized), its output goes through ``mlp``; the actor's through ``distribution.update``
  (``modules/distribution.py``: the torch distribution in ``_distribution``).

Measured when the storage's first minibatch is drawn: the weights are still those the rollout ran with. On
private copies of actor and critic (``measure/copies.py``), weights copied in first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lstm_probe.integrations.rsl_rl.whatif import ROLES, _inputs
from lstm_probe.measure import copies
from lstm_probe.measure import memory as engine
from lstm_probe.measure.memory import DEFAULT_EVERY, Out, Rollout
from lstm_probe.options import Measure


def settings(measure: Measure) -> dict[str, Any] | None:
    """The settings of :class:`Memory` (None when ``--memory`` is off)."""
    if not measure.memory:
        return None
    return {"every": DEFAULT_EVERY if measure.memory_every is None else measure.memory_every}


def _cut(d: Any, ok: np.ndarray) -> Any:
    """The distribution ``d`` at the pairs ``ok`` (a torch distribution does not index)."""
    if isinstance(d, torch.distributions.Normal):
        return torch.distributions.Normal(d.loc[ok], d.scale[ok])
    if isinstance(d, torch.distributions.Beta):
        return torch.distributions.Beta(d.concentration1[ok], d.concentration0[ok])
    return None


class Memory:
    """The memory-horizon measurement of an rsl_rl run: :meth:`measure` once per update, before its first
    minibatch; :meth:`metadata` is what the log keeps under ``memory``."""

    def __init__(self, alg: Any, steps_per_env: int, *, every: int = DEFAULT_EVERY):
        self.alg = alg
        models = {r: getattr(alg, r) for r in ROLES}
        self.copies = {r: copies.private_copy(m) for r, m in models.items()}
        self._pairs = [p for r in ROLES for p in copies.pairs(self.copies[r], models[r])]
        self.modules = [r for r in ROLES if getattr(models[r], "is_recurrent", False)]
        self.engine = engine.Memory(
            n_envs=int(alg.storage.num_envs),
            n_steps=steps_per_env,
            modules=self.modules,
            critic="lstm" if "critic" in self.modules else "mlp",
            every=every,
        )
        self.metadata = self.engine.metadata

    def measure(self, starts: np.ndarray, iteration: int) -> None:
        """Measure the full rollout in the storage (``starts``: its episode starts, (steps, envs), as the probe
        keeps them)."""
        starts = starts == 1
        self.engine.observe(starts)
        if self.engine.wants(iteration):
            device = self.alg.storage.values.device
            self.engine.measure(lambda: self._rollout(starts, iteration), device)

    def _rollout(self, starts: np.ndarray, iteration: int) -> Rollout:
        copies.sync(self._pairs)
        for r in ROLES:
            self.copies[r].eval()
        storage = self.alg.storage
        t, n = starts.shape
        obs = storage.observations
        flat = obs.flatten(0, 1)
        inputs = {r: _inputs(self.copies[r], flat).reshape(t, n, -1) for r in self.modules}
        actor, critic = self.copies["actor"], self.copies["critic"]
        saved = {"actor": storage.saved_hidden_state_a, "critic": storage.saved_hidden_state_c}

        def heads(latent: dict[str, torch.Tensor], steps: np.ndarray, env: np.ndarray) -> Out:
            actor.distribution.update(actor.mlp(latent["actor"]))
            d = actor.distribution._distribution
            if "critic" in latent:
                values = critic.mlp(latent["critic"]).flatten()
            else:  # a feed-forward critic reads the observations
                values = critic(obs[torch.as_tensor(steps), torch.as_tensor(env)]).flatten()
            return Out(values, lambda ok: _cut(d, ok))

        return Rollout(
            iteration=iteration,
            starts=starts,
            rnns={r: self.copies[r].rnn.rnn for r in self.modules},
            inputs=inputs,
            stored={r: tuple(saved[r]) for r in self.modules},
            heads=heads,
            values=storage.values,
            value_modules=["critic"],
        )
