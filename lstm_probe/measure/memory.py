"""Does a policy use its recurrent state, and how far back? The memory-horizon engine, for any framework that
provides the *respond* capability (``lstm-probe run --memory``; the report's "Memory" section).

At the end of sampled rollouts, for sampled rollout steps t of each env, the recurrent modules are re-run over
the rollout's stored inputs with the state *after* step t-k replaced by zero, so the policy at t sees only its
last k inputs (k = 1, 2, 4, ... up to the rollout length), and its outputs at t are compared with the unablated
ones (the rollout's own, from the stored state before t): the action distribution's KL divergence and the value
difference relative to the rollout's value spread. k = 1 is a feed-forward policy (the current input only).
Only ablations inside one episode count: a window that reaches back to the episode's start (where the framework
resets the state anyway) is left out. Effect(k), averaged over the sampled steps, is one record per (iteration,
module, k); the log's metadata holds them under ``memory`` (columnar), and the report's "Memory" section reads
them (horizon: the smallest k whose effect is below 5% of effect(1)).

What a framework hands over (its adapter: ``integrations/sb3/memory.py``, ``integrations/rsl_rl/memory.py``): the
:class:`Rollout`: episode starts, each recurrent module's copy, its inputs at every rollout step and the states
stored before each step, the rollout's values, and :data:`Heads` (the policy's outputs from the modules' outputs
at given steps). Everything runs on the copy under ``torch.no_grad`` and ``torch.random.fork_rng``, drawing from
no NumPy RNG (the sampled steps are evenly spaced): training is untouched.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

MAX_ITERATIONS = 500
"""Sampled iterations kept in the log: past this, every other one is dropped and the stride doubles."""
SAMPLES = 16
"""Rollout steps sampled per env (evenly spaced, the last step included)."""
DEFAULT_EVERY = 1
"""Measure every iteration by default: one measurement costs a few batched LSTM runs over the rollout's inputs
(about as many LSTM steps as one rollout, in a few calls; see docs/performance.md)."""
KEYS = ("iteration", "module", "k", "pairs", "kl", "value_rel")
KEPT_LENGTHS = 10_000
"""Completed episodes' lengths kept for the metadata's median and max (the latest)."""


@dataclass
class Out:
    """The policy's outputs at B sampled (step, env) pairs."""

    values: torch.Tensor | None
    """(B,) values; None where no module whose state varies reaches them."""
    dist: Callable[[np.ndarray], Any]
    """The action distribution (a torch distribution, or a list of them, one per component) of the pairs at the
    given indices into B."""


Heads = Callable[[dict[str, torch.Tensor], np.ndarray, np.ndarray], Out]
"""The policy's outputs from each recurrent module's output (B, hidden) at rollout steps t (B,) of envs (B,)."""


@dataclass
class Rollout:
    """A full rollout as the engine reads it (step-major, as it was collected)."""

    iteration: int
    starts: np.ndarray
    """(n_steps, n_envs) bool: the step starts an episode (the framework resets the state before it)."""
    rnns: dict[str, nn.Module]
    """Each recurrent module's copy (nn.LSTM or nn.GRU, sequence-first), weights as the rollout ran with."""
    inputs: dict[str, torch.Tensor]
    """Each module's inputs at every step, (n_steps, n_envs, features), computed on the copy."""
    stored: dict[str, tuple[Any, ...]]
    """Each module's states before each step (h, c; or h), (n_steps, layers, n_envs, hidden), arrays or tensors."""
    heads: Heads
    values: Any
    """The rollout's values (their spread scales the value differences)."""
    value_modules: Sequence[str]
    """The modules whose state reaches the values (the critic's, or the actor's where the critic reads it)."""


def lags(n_steps: int) -> list[int]:
    """k = 1, 2, 4, ... up to the rollout length (the rollout length itself last when not a power of two)."""
    out = [1 << i for i in range(max(1, n_steps).bit_length()) if 1 << i <= n_steps]
    if out[-1] != n_steps:
        out.append(n_steps)
    return out


def sample_steps(n_steps: int, samples: int = SAMPLES) -> np.ndarray:
    """Evenly spaced rollout steps, the last one included (no RNG)."""
    n = min(samples, n_steps)
    return np.unique(np.round(np.linspace(n_steps - 1, 0, n, endpoint=False)[::-1]).astype(np.int64))


def reach(episode_starts: np.ndarray) -> np.ndarray:
    """(n_steps, n_envs): the largest k whose ablation at step t stays inside t's episode: t - s, where s is the
    last episode start at or before t, or t + 1 where the env's rollout has none so far (the state before the
    rollout's first step is then the previous rollout's)."""
    n = episode_starts.shape[0]
    t = np.arange(n)[:, None]
    last = np.maximum.accumulate(np.where(episode_starts > 0.5, t, -1), axis=0)
    return t - last


def _kl(p: Any, q: Any) -> torch.Tensor | None:
    """KL(p || q) per element, summed over action dimensions; None for a distribution torch cannot compare. ``p``,
    ``q``: torch distributions (or lists of them, one per component)."""
    ps, qs = p, q
    pairs = list(zip(ps, qs, strict=True)) if isinstance(ps, list) else [(ps, qs)]
    total = None
    try:
        for a, b in pairs:
            kl = torch.distributions.kl_divergence(_double(a), _double(b))
            while kl.dim() > 1:
                kl = kl.sum(-1)
            total = kl if total is None else total + kl
    except NotImplementedError:
        return None
    return total


def _double(d: Any) -> Any:
    """The distribution in float64: float32's KL formula cancels to ~1e-8 where the two are equal but for rounding."""
    D = torch.distributions
    if isinstance(d, D.Normal):
        return D.Normal(d.loc.double(), d.scale.double())
    if isinstance(d, D.Categorical):
        return D.Categorical(logits=d.logits.double())
    if isinstance(d, D.Bernoulli):
        return D.Bernoulli(logits=d.logits.double())
    return d


def _round(v: float | None) -> float | None:
    if v is None or not math.isfinite(v):
        return None
    return float(f"{v:.6g}")


class Memory:
    """The memory-horizon measurement of one run: :meth:`observe` every rollout (episode lengths), :meth:`measure`
    the rollouts the stride samples; :meth:`metadata` is what the log keeps. ``modules``: the recurrent modules
    whose state is ablated; ``critic``: what the values read ('lstm', 'shared', 'mlp')."""

    def __init__(
        self,
        *,
        n_envs: int,
        n_steps: int,
        modules: Sequence[str],
        critic: str,
        every: int = DEFAULT_EVERY,
        samples: int = SAMPLES,
    ):
        self.asked_every = self.every = every
        self.n_envs, self.n_steps = n_envs, n_steps
        self.lags = lags(self.n_steps)
        self.steps = sample_steps(self.n_steps, samples)
        self.modules, self.critic = list(modules), critic
        self.columns: dict[str, list[Any]] = {c: [] for c in KEYS}
        self.seconds = 0.0
        self.measured = 0
        self.episode_lengths: list[int] = []  # completed episodes seen in the rollouts (all iterations)
        self._open = np.zeros(self.n_envs, np.int64)  # steps of each env's running episode

    def wants(self, iteration: int) -> bool:
        """Whether the stride samples ``iteration``."""
        return iteration % self.every == 0

    def observe(self, starts: np.ndarray) -> None:
        """Episode lengths from a full rollout's episode starts, (n_steps, n_envs) (every iteration, cheap)."""
        for e in range(self.n_envs):
            s = np.flatnonzero(starts[:, e])
            if len(s) == 0:
                self._open[e] += self.n_steps
                continue
            first = self._open[e] + s[0]
            self.completed(([int(first)] if first > 0 else []) + [int(x) for x in np.diff(s)])
            self._open[e] = self.n_steps - s[-1]

    def completed(self, lengths: Sequence[int]) -> None:
        """Lengths of episodes that completed (:meth:`observe`'s, or an adapter's where its rollout holds whole
        episodes); the last :data:`KEPT_LENGTHS` are kept."""
        self.episode_lengths += [int(n) for n in lengths]
        if len(self.episode_lengths) > KEPT_LENGTHS:
            del self.episode_lengths[:-KEPT_LENGTHS]

    def measure(self, make: Callable[[], Rollout], device: torch.device) -> None:
        """Measure effect(k) on the rollout ``make()`` builds (on the copy, weights synced by it)."""
        start = time.perf_counter()
        devices = (
            [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
        )
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            self._measure(make(), device)
        self.measured += 1
        self.seconds += time.perf_counter() - start
        self._thin()

    def _measure(self, r: Rollout, device: torch.device) -> None:
        n_envs = self.n_envs
        starts = r.starts

        def tensor(a: Any) -> torch.Tensor:
            return torch.as_tensor(a, dtype=torch.float32, device=device)

        t = np.repeat(self.steps, n_envs)  # (B,) sampled (step, env) pairs
        env = np.tile(np.arange(n_envs), len(self.steps))
        reachable = reach(starts)[t, env]
        keep = reachable >= 1  # a step that starts an episode has no state to ablate
        t, env, reachable = t[keep], env[keep], reachable[keep]
        if len(t) == 0:
            return
        # the unablated outputs at t: one step from the stored state before t (zero where t starts an episode)
        reset = tensor(1.0 - starts[t, env])[None, :, None]
        ref_latent = {}
        ti, ei = torch.as_tensor(t, device=device), torch.as_tensor(env, device=device)
        for module in self.modules:
            given = tuple(tensor(s[t, :, env]).transpose(0, 1).contiguous() * reset for s in r.stored[module])
            y, _ = r.rnns[module](r.inputs[module][ti, ei][None], given if len(given) == 2 else given[0])
            ref_latent[module] = y[0]
        ref = r.heads(ref_latent, t, env)
        values = np.asarray(torch.as_tensor(r.values).detach().cpu().numpy(), np.float64)
        spread = float(values.std()) if values.size > 1 else 0.0
        for module in self.modules:
            for k in self.lags:
                ok = np.flatnonzero(reachable >= k)
                if len(ok) == 0:
                    break
                tk, ek = t[ok], env[ok]
                window = tk[None, :] - k + 1 + np.arange(k)[:, None]  # (k, B') steps t-k+1 .. t
                x = r.inputs[module][
                    torch.as_tensor(window, device=device), torch.as_tensor(ek, device=device)[None, :]
                ]
                rnn = r.rnns[module]
                layers, hidden = int(rnn.num_layers), int(rnn.hidden_size)  # type: ignore[arg-type]
                zero = torch.zeros(layers, len(ok), hidden, device=device)
                y, _ = rnn(x, (zero, zero) if isinstance(rnn, nn.LSTM) else zero)
                latent = {m: ref_latent[m][ok] for m in self.modules}
                latent[module] = y[-1]
                out = r.heads(latent, tk, ek)
                kl = None
                if module == "actor":
                    d = _kl(ref.dist(ok), out.dist(np.arange(len(ok))))
                    kl = None if d is None else float(d.mean())
                value_rel = None
                if module in r.value_modules and out.values is not None and ref.values is not None:
                    dv = float((out.values - ref.values[ok]).abs().mean())
                    value_rel = dv / spread if spread > 0 else None
                row = {"iteration": r.iteration, "module": module, "k": k, "pairs": len(ok)}
                row |= {"kl": _round(kl), "value_rel": _round(value_rel)}
                for c, v in self.columns.items():
                    v.append(row[c])

    def _thin(self) -> None:
        """Keep at most :data:`MAX_ITERATIONS` sampled iterations: drop every other one, double the stride."""
        its = self.columns["iteration"]
        while len(set(its)) > MAX_ITERATIONS:
            self.every *= 2
            keep = [i for i, it in enumerate(its) if it % self.every == 0]
            self.columns = {c: [v[i] for i in keep] for c, v in self.columns.items()}
            its = self.columns["iteration"]

    def metadata(self) -> dict[str, Any]:
        """What the log keeps under ``memory``: settings, what was sampled, episode lengths, the records."""
        lengths = np.asarray(self.episode_lengths, np.int64)
        return {
            "version": 1,
            "sampling": {
                "every": self.every,
                "asked_every": self.asked_every,
                "steps_per_env": [int(s) for s in self.steps],
                "n_envs": self.n_envs,
                "iterations_measured": self.measured,
            },
            "lags": list(self.lags),
            "rollout_length": self.n_steps,
            "modules": list(self.modules),
            "critic": self.critic,
            "episode_lengths": {
                "count": len(lengths),
                "median": float(np.median(lengths)) if len(lengths) else None,
                "max": int(lengths.max()) if len(lengths) else None,
            },
            "seconds": round(self.seconds, 3),
            "records": self.columns,
        }
