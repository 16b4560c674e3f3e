"""Does an own loop's policy use its LSTM, and how far back? The generic tracer's adapter of the memory-horizon
engine (``lstm_probe/measure/memory.py``, whose docstring says what is measured): ``trace(model, ...,
memory=True, heads=..., inputs=...)`` and :meth:`~lstm_probe.integrations.generic.Tracer.measure_batch`
(docs/own-loops.md).

Measured at the first ``measure_batch`` call of each rollout (before its first optimizer step: the weights are
those the rollout ran with), on the private copy ``own_measure.Copy`` makes, from what the loop hands over:

- the rollout, step-major: ``obs`` (T, N, ...), ``episode_start`` (T, N), ``values`` (T, N: their spread scales
  the value differences) and ``rollout_states``: before every step (each (T, layers, N, hidden)) or at the
  first step only (each (layers, N, hidden)), from which the copy re-runs the rollout's inputs step by step,
  its state reset before each episode start as the rollout did, for the states before every step;
- ``inputs(model, obs)`` (given to ``trace``): the recurrent modules' inputs from observations (by default the
  observations);
- ``heads(model, hidden)`` (given to ``trace``): the policy's outputs from the recurrent modules' outputs
  ((B, hidden); a dict by module name where the model has several), a dict: ``dist`` (the action distribution
  over the B rows: a Categorical, Normal or Bernoulli, also inside Independent) and ``values``.

The modules' roles: one whose name starts with ``own_measure.VALUE_PREFIXES`` is the critic's own (its value
horizon), the other one the actor's (its KL horizon; its values too where no critic has its own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.errors import BadInput
from lstm_probe.integrations.own_measure import VALUE_PREFIXES, Copy
from lstm_probe.measure import memory as engine
from lstm_probe.measure.memory import DEFAULT_EVERY, Out, Rollout

Heads = Callable[[nn.Module, Any], dict[str, Any]]
"""``heads(model, hidden)``: the policy's action distribution and values from the recurrent modules' outputs."""


def _cut(d: Any, ok: np.ndarray) -> Any:
    """The distribution ``d`` at rows ``ok`` (a torch distribution does not index); None for a kind this does not
    cut (KL not measured)."""
    D = torch.distributions
    index = torch.as_tensor(ok)
    if isinstance(d, D.Independent):
        d = d.base_dist
    if isinstance(d, D.Categorical):
        return D.Categorical(logits=d.logits[index])
    if type(d) is D.Normal:
        return D.Normal(d.loc[index], d.scale[index])
    if isinstance(d, D.Bernoulli):
        return D.Bernoulli(logits=d.logits[index])
    return None


class OwnMemory:
    """The memory horizon of an own loop: :meth:`measure` at the first ``measure_batch`` of each rollout;
    :meth:`metadata` is what the log keeps under ``memory``."""

    def __init__(self, copy: Copy, heads: Heads | None, *, every: int | None):
        if heads is None:
            raise BadInput("memory on an own loop needs heads=: the policy's dist and values from the LSTM's output")
        critics = [n for n in copy.names if n.startswith(VALUE_PREFIXES)]
        actors = [n for n in copy.names if n not in critics]
        if len(actors) != 1 or len(critics) > 1:
            raise BadInput(
                "memory on an own loop takes one recurrent module the policy reads and at most one the critic has "
                f"of its own (named critic...); here: {', '.join(copy.names)}"
            )
        self.copy, self.heads = copy, heads
        self.roles = {"actor": actors[0], **({"critic": critics[0]} if critics else {})}
        self.every = DEFAULT_EVERY if every is None else every
        self.engine: engine.Memory | None = None  # made at the first rollout (its size)
        self._at = -1

    def metadata(self) -> dict[str, Any] | None:
        """The log's ``memory`` (None before any rollout was measured)."""
        if self.engine is None or not self.engine.measured:
            return None
        return self.engine.metadata() | {"module_names": dict(self.roles)}

    def measure(self, iteration: int, obs: Any, starts: np.ndarray, rollout_states: Any, values: Any) -> bool:
        """Measure the rollout of ``iteration`` once (the first call for it); returns whether it was."""
        if iteration == self._at:
            return False
        self._at = iteration
        if values is None:
            raise BadInput("memory on an own loop needs the rollout's values (T, N) beside obs in measure_batch")
        t, n = starts.shape
        if self.engine is None:
            critic = "lstm" if "critic" in self.roles else "shared"
            self.engine = engine.Memory(n_envs=n, n_steps=t, modules=list(self.roles), critic=critic, every=self.every)
        elif (self.engine.n_steps, self.engine.n_envs) != (t, n):
            raise BadInput(
                f"memory takes rollouts of one size: {self.engine.n_steps} x {self.engine.n_envs}, not {t} x {n}"
            )
        self.engine.observe(starts)
        if not self.engine.wants(iteration):
            return False
        stored = self.copy.states(rollout_states, "rollout_states")
        device = stored[self.copy.names[0]][0].device
        self.engine.measure(lambda: self._rollout(iteration, obs, starts, stored, values), device)
        return True

    def _rollout(self, iteration: int, obs: Any, starts: np.ndarray, stored: dict[str, Any], values: Any) -> Rollout:
        t, n = starts.shape
        copy = self.copy.sync(False)
        like = stored[self.copy.names[0]][0]
        flat = self.copy.features(obs.reshape(t * n, *obs.shape[2:]), like)
        inputs = {r: flat[m].reshape(t, n, -1) for r, m in self.roles.items()}
        rnns = {r: self.copy.rnns[m] for r, m in self.roles.items()}
        per_step = {}
        for r, m in self.roles.items():
            s = tuple(x.detach().to(like.dtype) for x in stored[m])
            per_step[r] = s if s[0].dim() == 4 else _replay(rnns[r], inputs[r], s, starts)
            if per_step[r][0].shape[0] != t or per_step[r][0].shape[2] != n:
                raise BadInput(f"rollout_states of {m}: each ({t}, layers, {n}, hidden) or (layers, {n}, hidden)")
        names = {r: m for r, m in self.roles.items()}

        def heads(latent: dict[str, torch.Tensor], steps: np.ndarray, env: np.ndarray) -> Out:
            got = self.heads(copy, self.copy.give({names[r]: x for r, x in latent.items()}, states=False))
            v = got.get("values")
            d = got.get("dist")
            return Out(None if v is None else v.reshape(-1), lambda ok: _cut(d, ok))

        return Rollout(
            iteration=iteration,
            starts=starts,
            rnns=rnns,
            inputs=inputs,
            stored=per_step,
            heads=heads,
            values=values,
            value_modules=["critic"] if "critic" in self.roles else ["actor"],
        )


def _replay(rnn: nn.Module, x: torch.Tensor, first: tuple[torch.Tensor, ...], starts: np.ndarray) -> tuple[Any, ...]:
    """The states before each step, (T, layers, N, hidden) each: ``rnn`` run over the inputs ``x`` (T, N, F) one
    step at a time from ``first`` (the states before step 0), reset before each episode start."""
    keep = torch.as_tensor(~starts, dtype=x.dtype, device=x.device)[:, None, :, None]  # (T, 1, N, 1)
    s, out = first, []
    for step in range(x.shape[0]):
        out.append(s)
        given = tuple(v * keep[step] for v in s)
        _, new = rnn(x[step : step + 1], given if len(given) == 2 else given[0])
        s = tuple(new) if isinstance(new, tuple) else (new,)
    return tuple(torch.stack([o[i] for o in out]) for i in range(len(first)))
