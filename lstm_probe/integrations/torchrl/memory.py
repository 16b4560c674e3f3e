"""Does a TorchRL policy use its LSTMModule, and how far back? TorchRL's adapter of the memory-horizon engine
(``lstm_probe/measure/memory.py``, whose docstring says what is measured; ``probe(..., memory=True, loss=...)``
with ``TorchRLProbe.measure_batch`` before each loss call, ``lstm-probe run --framework torchrl --memory``).

What it relies on (torchrl 0.14), cited by file:function:

- the collector's batch (``collectors/_single.py:Collector.rollout``): (envs, steps), each step's module input
  (the module's first in_key), the state stored before it (``recurrent_state_h`` / ``_c``, (envs, steps,
  layers, hidden); one key for a GRUModule), ``is_init`` (``envs/transforms:InitTracker``: the step starts an
  episode, where ``modules/tensordict_module/rnn.py:LSTMModule.forward`` zeroes the state in sequential mode)
  and the values the value estimator wrote (``state_value``);
- the heads: the actor's action distribution (``ProbabilisticActor.get_dist``) and the critic's value from the
  recurrent module's output (its first out_key): the copied module, while measured, writes the given output
  instead of running (:func:`given_outputs`), and the rest of the actor and critic runs from it.

Measured at the first ``measure_batch`` of each collected batch, before any optimizer step: the weights are still
those the batch was collected with. On the private copy of the loss module :mod:`.whatif` makes (shared with
what-if), weights copied in first, in eval mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from lstm_probe.errors import BadInput
from lstm_probe.integrations.torchrl.whatif import Copy, as_rows, flat_dist
from lstm_probe.measure import memory as engine
from lstm_probe.measure.memory import DEFAULT_EVERY, Out, Rollout
from lstm_probe.options import Measure

SPLIT = (
    "memory on TorchRL takes the collector's batch, (envs, steps), and this one is split_trajs=True's trajectories "
    "padded to the longest (it holds ('collector', 'mask')): collect with split_trajs=False, pass that batch to "
    "measure_batch, and give the loss torchrl.collectors.utils.split_trajectories(data)"
)
"""The refusal of a padded batch: its padding would be measured as steps, and its shape changes every batch."""


def settings(measure: Measure) -> dict[str, Any] | None:
    """The settings of :class:`Memory` (None when ``--memory`` is off)."""
    if not measure.memory:
        return None
    return {"every": DEFAULT_EVERY if measure.memory_every is None else measure.memory_every}


@contextmanager
def given_outputs(modules: dict[str, Any], latent: dict[str, torch.Tensor]) -> Iterator[None]:
    """While open, each copied recurrent module writes the given output (its first out_key) instead of running,
    so the rest of the actor and critic runs from it. The copy is private: the instance attribute is the
    adapter's own, removed on exit."""
    for role, m in modules.items():
        if role in latent:
            key, y = m.out_keys[0], latent[role]
            m.forward = lambda td, key=key, y=y: td.set(key, y)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m in modules.values():
            vars(m).pop("forward", None)


class Memory:
    """The memory-horizon measurement of a TorchRL run: :meth:`measure` once per collected batch, before its
    first optimizer step; :meth:`metadata` is what the log keeps under ``memory``. The engine is made at the
    first batch (its envs and steps); a batch of another shape is not measured."""

    def __init__(self, copy: Copy, *, every: int = DEFAULT_EVERY):
        self.copy = copy
        self.every = every
        self.engine: engine.Memory | None = None

    def metadata(self) -> dict[str, Any] | None:
        if self.engine is None:
            return None
        return self.engine.metadata() | {"module_names": dict(self.copy.names)}

    def measure(self, data: Any, iteration: int) -> None:
        """Measure the collected batch ``data`` (the collector's, ``(envs, steps)``)."""
        c = self.copy
        td = as_rows(data)
        if ("collector", "mask") in td.keys(include_nested=True):
            raise BadInput(SPLIT)
        e, t = td.shape
        if self.engine is None:
            self.engine = engine.Memory(n_envs=e, n_steps=t, modules=list(c.modules), critic=c.critic, every=self.every)
        if (e, t) != (self.engine.n_envs, self.engine.n_steps):
            return
        is_init = td.get(c.is_init_key)
        starts = is_init.reshape(e, t).cpu().numpy().astype(bool).T  # (steps, envs), once per collected batch
        self.engine.observe(starts)
        if self.engine.wants(iteration):
            self.engine.measure(lambda: self._rollout(td, starts, iteration), is_init.device)

    def _rollout(self, td: Any, starts: np.ndarray, iteration: int) -> Rollout:
        c = self.copy
        c.sync(False)
        loss, keys = c.loss, c.loss.tensor_keys
        e, t = td.shape

        def heads(latent: dict[str, torch.Tensor], steps: np.ndarray, env: np.ndarray) -> Out:
            device = next(iter(latent.values())).device
            at = (torch.as_tensor(env, device=device), torch.as_tensor(steps, device=device))
            x = td[at]  # (B,) the sampled steps' entries: what the heads may read besides the module's output
            with given_outputs(c.modules, latent):
                dist = loss.actor_network.get_dist(x.clone(False))
                values = None
                if loss.critic_network is not None:
                    values = loss.critic_network(x.clone(False)).get(keys.value).reshape(-1)
            n = len(steps)
            return Out(values, lambda ok: flat_dist(dist, n, torch.as_tensor(ok, device=device)))

        values = td.get(keys.value, None)
        return Rollout(
            iteration=iteration,
            starts=starts,
            rnns=dict(c.rnns),
            inputs={r: td.get(c.input_key[r]).reshape(e, t, -1).transpose(0, 1) for r in c.modules},
            stored={r: tuple(td.get(k).permute(1, 2, 0, 3) for k in c.state_keys[r]) for r in c.modules},
            heads=heads,
            values=values if values is not None else td.get(keys.value_target),
            value_modules=c.value_modules,
        )
