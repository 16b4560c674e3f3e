"""Does a RecurrentPPO policy use its LSTM, and how far back? The memory horizon, measured on a copy of the policy
while it trains (``ProbeCallback(memory=True)``, ``lstm-probe run --memory``).

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

import math
import time
from typing import Any

import numpy as np
import torch

from lstm_probe.integrations.sb3.arch import private_policy as shadow_policy
from lstm_probe.integrations.sb3.options import Measure

MAX_ITERATIONS = 500
"""Sampled iterations kept in the log: past this, every other one is dropped and the stride doubles."""
SAMPLES = 16
"""Rollout steps sampled per env (evenly spaced, the last step included)."""
DEFAULT_EVERY = 1
"""Measure every iteration by default: one measurement costs a few batched LSTM runs over the rollout's inputs
(about as many LSTM steps as one rollout, in a few calls; see docs/performance.md)."""
KEYS = ("iteration", "module", "k", "pairs", "kl", "value_rel")


def memory_settings(measure: Measure) -> dict[str, Any] | None:
    """The settings of :class:`Memory` (None when ``--memory`` is off), from checked options."""
    if not measure.memory:
        return None
    return {"every": DEFAULT_EVERY if measure.memory_every is None else measure.memory_every}


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
    ``q``: the torch distributions (or lists of them) of sb3 ``Distribution`` objects."""
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


def _torch_dist(policy: Any, latent_pi: torch.Tensor) -> Any:
    """The torch distribution(s) of the policy's action distribution at ``latent_pi``: sb3's ``Distribution``
    object is one per policy, refilled by each ``_get_action_dist_from_latent``
    (``common/distributions.py:*.proba_distribution`` returns ``self``), so it is read out at once."""
    return policy._get_action_dist_from_latent(latent_pi).distribution


def _round(v: float | None) -> float | None:
    if v is None or not math.isfinite(v):
        return None
    return float(f"{v:.6g}")


class Memory:
    """The memory-horizon measurement of one ``learn()``: :meth:`measure` at the end of each rollout (it skips
    iterations the stride leaves out), :meth:`metadata` is what the log keeps. Holds the policy and its copy,
    never the model."""

    def __init__(self, model: Any, *, every: int = DEFAULT_EVERY, samples: int = SAMPLES):
        policy = model.policy
        self.policy = policy
        self.asked_every = self.every = every
        self.n_envs, self.n_steps = int(model.n_envs), int(model.n_steps)
        self.lags = lags(self.n_steps)
        self.steps = sample_steps(self.n_steps, samples)
        self.shared = bool(getattr(policy, "shared_lstm", False))
        self.critic = "lstm" if policy.lstm_critic is not None else ("shared" if self.shared else "mlp")
        self.modules = ["actor"] + (["critic"] if policy.lstm_critic is not None else [])
        self.shadow: Any = None
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.columns: dict[str, list[Any]] = {c: [] for c in KEYS}
        self.seconds = 0.0
        self.measured = 0
        self.episode_lengths: list[int] = []  # completed episodes seen in the rollouts (all iterations)
        self._open = np.zeros(self.n_envs, np.int64)  # steps of each env's running episode

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

    def observe(self, buffer: Any) -> None:
        """Episode lengths from a full rollout's episode starts (every iteration, cheap)."""
        starts = np.asarray(buffer.episode_starts).reshape(self.n_steps, self.n_envs) > 0.5
        for e in range(self.n_envs):
            s = np.flatnonzero(starts[:, e])
            if len(s) == 0:
                self._open[e] += self.n_steps
                continue
            first = self._open[e] + s[0]
            if first > 0:
                self.episode_lengths.append(int(first))
            self.episode_lengths += [int(x) for x in np.diff(s)]
            self._open[e] = self.n_steps - s[-1]
        if len(self.episode_lengths) > 10_000:
            del self.episode_lengths[:-10_000]

    def measure(self, buffer: Any, iteration: int) -> None:
        """Measure effect(k) on the full rollout ``buffer`` of ``iteration`` (if the stride samples it)."""
        self.observe(buffer)
        if iteration % self.every != 0:
            return
        start = time.perf_counter()
        device = self.policy.device
        devices = (
            [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
        )
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            self._measure(self._copy(), buffer, iteration)
        self.measured += 1
        self.seconds += time.perf_counter() - start
        self._thin()

    def _measure(self, policy: Any, buffer: Any, iteration: int) -> None:
        n, n_envs = self.n_steps, self.n_envs
        device = policy.device
        starts = np.asarray(buffer.episode_starts).reshape(n, n_envs)
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

        t = np.repeat(self.steps, n_envs)  # (B,) sampled (step, env) pairs
        env = np.tile(np.arange(n_envs), len(self.steps))
        reachable = reach(starts)[t, env]
        keep = reachable >= 1  # a step that starts an episode has no state to ablate
        t, env, reachable = t[keep], env[keep], reachable[keep]
        if len(t) == 0:
            return
        stored = {
            "actor": (buffer.hidden_states_pi, buffer.cell_states_pi),
            "critic": (buffer.hidden_states_vf, buffer.cell_states_vf),
        }
        lstms = {"actor": policy.lstm_actor, "critic": policy.lstm_critic}
        inputs = {"actor": pi_f, "critic": vf_f}
        # the unablated outputs at t: one step from the stored state before t (zero where t starts an episode)
        reset = tensor(1.0 - starts[t, env])[None, :, None]
        ref_latent = {}
        for module in self.modules:
            h0 = tensor(stored[module][0][t, :, env]).transpose(0, 1).contiguous() * reset
            c0 = tensor(stored[module][1][t, :, env]).transpose(0, 1).contiguous() * reset
            y, _ = lstms[module](inputs[module][t, env][None], (h0, c0))
            ref_latent[module] = y[0]
        ref = self._heads(policy, ref_latent, vf_f[t, env])
        values = np.asarray(buffer.values, np.float64)
        spread = float(values.std()) if values.size > 1 else 0.0
        for module in self.modules:
            for k in self.lags:
                ok = np.flatnonzero(reachable >= k)
                if len(ok) == 0:
                    break
                tk, ek = t[ok], env[ok]
                window = tk[None, :] - k + 1 + np.arange(k)[:, None]  # (k, B') steps t-k+1 .. t
                x = inputs[module][window, ek[None, :]]
                lstm = lstms[module]
                zero = torch.zeros(lstm.num_layers, len(ok), lstm.hidden_size, device=device)
                y, _ = lstm(x, (zero, zero))
                latent = {m: ref_latent[m][ok] for m in self.modules}
                latent[module] = y[-1]
                out = self._heads(policy, latent, vf_f[tk, ek])
                kl = None
                if module == "actor":
                    # the reference distribution of this subset, rebuilt from its latent (distributions do not index)
                    d = _kl(_torch_dist(policy, ref["latent_pi"][ok]), out["dist"])
                    kl = None if d is None else float(d.mean())
                value_rel = None
                if module == "critic" or self.shared:
                    dv = float((out["values"] - ref["values"][ok]).abs().mean())
                    value_rel = dv / spread if spread > 0 else None
                row = {"iteration": iteration, "module": module, "k": k, "pairs": len(ok)}
                row |= {"kl": _round(kl), "value_rel": _round(value_rel)}
                for c, v in self.columns.items():
                    v.append(row[c])

    def _heads(self, policy: Any, latent: dict[str, torch.Tensor], vf_features: torch.Tensor) -> dict[str, Any]:
        """The action distribution and value from the LSTM outputs (``policies.py:forward`` after the LSTMs)."""
        if "critic" in latent:
            latent_vf = latent["critic"]
        elif self.shared:
            latent_vf = latent["actor"]
        else:
            latent_vf = policy.critic(vf_features)
        latent_pi = policy.mlp_extractor.forward_actor(latent["actor"])
        values = policy.value_net(policy.mlp_extractor.forward_critic(latent_vf)).flatten()
        return {"dist": _torch_dist(policy, latent_pi), "latent_pi": latent_pi, "values": values}

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
