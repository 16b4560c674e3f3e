"""What if training sequences started from other states? The what-if engine, for any framework that provides
the *evaluate* capability (``lstm-probe run --what-if``; the report's "What if" section).

For sampled minibatches, with the weights that minibatch is trained with (before its optimizer step), the
minibatch is evaluated again from other states at each sequence start and compared with *refreshed* states
(the recurrent modules re-run with the current weights over the rollout from its first step, the only history
a rollout keeps): ``stored`` (the rollout-time states the framework trains with), ``zero`` (zero states),
``burn_in_<k>`` (a zero state k steps before the sequence start, run forward over the stored inputs, clipped at
the episode and rollout start) and ``stored_burn_in_<k>`` (R2D2's stored-state burn-in: the stored state of the
step k steps before the sequence start, run forward the same way; a window clipped at the rollout start begins
from the stored state of the rollout's first step, one clipped at an episode start from zero). A zero burn-in
clipped at the rollout start (no episode start in between) starts from zero where refreshed starts from the
stored state, so it never equals refreshed however long; the stored-state one does wherever its window reaches
the rollout or an episode start. Each comparison becomes one record per (iteration, epoch, minibatch,
alternative); the log's metadata holds them under ``what_if`` (columnar).

What a framework hands over (its adapter, e.g. ``integrations/rsl_rl/whatif.py``): the :class:`Rollout` a
minibatch was cut from (episode starts, the states stored before each step, each recurrent module's copy and
its inputs at given steps), the :class:`Minibatch` (where each sequence starts, the initial states the
framework trains it with, and its :data:`Evaluate`: values, log-probabilities and the loss terms of the
framework's own loss from a list of initial states, on the copy), and for the gradient comparison the copy's
parameters and the user's. The engine runs everything on the copy inside ``torch.random.fork_rng``
(reseeded before each evaluation, so dropout, if any, draws alike for every alternative) and draws from no
NumPy RNG: training is untouched.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.log.schema import WHAT_IF_METRICS, WHAT_IF_NOISE

BURN_IN = (4, 16, 64)
"""Burn-in lengths always measured (``burn_in=`` adds more)."""
MAX_ITERATIONS = 500
"""Sampled iterations kept in the log: past this, every other one is dropped and the stride doubles, so the
metadata stays bounded (a few MB) however long the run."""
KEYS = ("iteration", "epoch", "minibatch", "alternative", "sequences", "episode_starts", "reached", "clipped")
"""Each record's keys besides its metrics (``reached``, ``clipped``: burn-ins only, see :meth:`WhatIf.measure`)."""
STORED_BURN_IN = "stored_burn_in_"
"""Prefix of the burn-ins from stored states: a prefix of its own, so that no report takes them for burn-ins from
zero (``burn_in_``)."""
METRICS = (*WHAT_IF_METRICS, "return_spread")
"""What each sampled minibatch records: the report's averaged figures, and the returns' spread they are
relative to."""
NOISE_DRAWS = 3
"""Where a framework's loss draws random numbers (:attr:`Minibatch.sampled`): the refreshed gradient drawn this many
times more (other seeds), its cosine with the first draw being the gradient comparison's own sampling spread."""
NOISE = WHAT_IF_NOISE
"""The stored records' sampling spread of the gradient cosine (:data:`NOISE_DRAWS`): per side, the least cosine
between two draws of the copy's own loss gradient from the same states; present only where the loss samples."""
TERMS = ("policy_loss", "value_loss", "entropy_loss", "clip_fraction", "loss")
"""The loss terms an :data:`Evaluate` returns per alternative (``loss``: the total the framework steps with)."""

States = dict[str, tuple[torch.Tensor, ...]]
"""Initial states per recurrent module: (h, c) for an LSTM, (h,) for a GRU, each (layers, sequences, hidden)."""


@dataclass
class Outcome:
    """A minibatch evaluated from A alternatives' initial states (N: its elements, padded or not)."""

    values: torch.Tensor
    """(A, N) value predictions."""
    log_prob: torch.Tensor
    """(A, N) log-probabilities of the minibatch's actions."""
    mask: torch.Tensor
    """(N,) bool: the real (unpadded) elements."""
    terms: dict[str, torch.Tensor]
    """Each of :data:`TERMS`: (A,) the framework's loss terms (``clip_fraction``: the fraction of ratios clipped)."""
    distributions: list[list[Any]] | None
    """Per alternative, the action distribution's components (torch distributions over the N elements), for the
    KL divergence; None where the framework's distribution cannot be cut (KL not measured)."""
    returns: torch.Tensor
    """(N,) the minibatch's returns (their spread scales the value differences)."""


Evaluate = Callable[[list[States]], Outcome]
"""A minibatch evaluated on the copy from each of a list of initial states (one pass for all may batch them)."""


@dataclass
class Rollout:
    """The rollout a minibatch was cut from. Flat index ``env * n_steps + step`` (env-major)."""

    iteration: int
    n_envs: int
    n_steps: int
    episode_starts: np.ndarray
    """(n_envs * n_steps,) bool: the step starts an episode (the framework resets the state before it)."""
    rnns: dict[str, nn.Module]
    """Each recurrent module's copy (nn.LSTM or nn.GRU, sequence-first), weights as the minibatch trains with."""
    stored: dict[str, tuple[Any, ...]]
    """Each module's states before each step (h, c; or h), flat (n_envs * n_steps, layers, hidden), arrays or
    tensors: the rollout's own, never reset for an episode start."""
    features: Callable[[np.ndarray], dict[str, torch.Tensor]]
    """Each module's inputs at the given flat indices (sorted, unique), (len, features), computed on the copy."""


@dataclass
class Minibatch:
    """One training minibatch: where it is, where its sequences start, how the framework trains it."""

    where: tuple[int, int, int]
    """(iteration, epoch, minibatch)."""
    env: np.ndarray
    """(sequences,) the env of each sequence."""
    step: np.ndarray
    """(sequences,) the rollout step of each sequence's first step."""
    stored: States
    """The initial states the framework trains the minibatch with (per module)."""
    evaluate: Evaluate
    sampled: bool = False
    """The framework's loss draws random numbers (a sampled entropy estimate): two draws of its gradient differ,
    and so does the one training steps with from the copy's however equal the states; the gradient comparison then
    measures that spread too (:data:`NOISE`)."""


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
    that begins at an episode start begins from zero (the stored state there is the one before the reset).

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
    rnn: nn.Module,
    features: torch.Tensor,
    rows: np.ndarray,
    stored: tuple[Any, ...],
    env: np.ndarray,
    step: np.ndarray,
    first: np.ndarray,
    from_stored: np.ndarray,
    n_steps: int,
) -> tuple[torch.Tensor, ...]:
    """States (h, c; or h), each (layers, n_seq, hidden), before rollout ``step`` of ``env`` for each sequence: a
    run of ``rnn`` over steps [first, step) from zero (or from the stored state of rollout step ``first`` of the
    env where ``from_stored``). ``features``: the module's inputs at the flat rows ``rows`` (sorted);
    ``stored``: the module's flat (n_envs * n_steps, layers, hidden) states."""
    n_seq = len(step)
    layers, hidden = int(rnn.num_layers), int(rnn.hidden_size)  # type: ignore[arg-type]
    zeros = [torch.zeros(layers, n_seq, hidden, device=features.device) for _ in stored]
    if from_stored.any():
        base = env[from_stored] * n_steps + first[from_stored]  # (k,) flat index of the step the run starts at
        cols = torch.from_numpy(np.flatnonzero(from_stored)).to(features.device)
        for z, s in zip(zeros, stored, strict=True):
            z[:, cols] = _as(s[base], z).transpose(0, 1)
    length = step - first
    run = np.flatnonzero(length > 0)
    if len(run) == 0:
        return tuple(zeros)
    t = np.arange(int(length.max()))
    flat = (env * n_steps + first)[run, None] + t[None, :]  # (n_run, max_len) flat rows
    valid = t[None, :] < length[run, None]
    pos = np.where(valid, np.searchsorted(rows, flat), 0)
    x = features[torch.from_numpy(pos.T.copy()).to(features.device)]  # (max_len, n_run, F)
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.from_numpy(length[run]), enforce_sorted=False)
    index = torch.from_numpy(run).to(features.device)
    given = tuple(z[:, index].contiguous() for z in zeros)
    _, out = rnn(packed, given if len(given) == 2 else given[0])
    for z, o in zip(zeros, out if isinstance(out, tuple) else (out,), strict=True):
        z[:, index] = o
    return tuple(zeros)


def _as(array: Any, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(array, dtype=like.dtype, device=like.device)


def computed_states(
    rollout: Rollout, env: np.ndarray, step: np.ndarray, plan: dict[str, tuple[np.ndarray, np.ndarray]], like: Any
) -> dict[str, States]:
    """Each planned alternative's initial states (:func:`run_starts`), every module's, from one pass of the
    inputs over the rows any alternative runs."""
    n = rollout.n_steps
    firsts = np.concatenate([first for first, _ in plan.values()])
    length = np.tile(step, len(plan)) - firsts
    envs = np.tile(env, len(plan))
    t = np.arange(int(length.max()) if len(length) else 0)
    rows = np.unique(((envs * n + firsts)[:, None] + t[None, :])[t[None, :] < length[:, None]])
    with torch.no_grad():
        empty = torch.zeros(0, device=like.device, dtype=like.dtype)
        features = rollout.features(rows) if len(rows) else dict.fromkeys(rollout.rnns, empty)
        return {
            name: {
                m: initial_states(rnn, features[m], rows, rollout.stored[m], env, step, first, from_stored, n)
                for m, rnn in rollout.rnns.items()
            }
            for name, (first, from_stored) in plan.items()
        }


def kl(p: Sequence[Any], q: Sequence[Any]) -> torch.Tensor:
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


def _flat(grads: Sequence[torch.Tensor | None], params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [
        torch.zeros(p.numel(), device=p.device) if g is None else g.detach().reshape(-1)
        for g, p in zip(grads, params, strict=True)
    ]


class WhatIf:
    """The what-if measurement of one run: :meth:`measure` on the minibatches :meth:`wants` (called before the
    framework trains on them); :meth:`step_hook` (an optimizer step pre-hook on the user's optimizer) reads the
    gradient the framework steps with; :meth:`metadata` is what the log keeps under ``what_if``.

    ``params`` (the copy's trainable parameters), ``user_params`` (the user's, in the same order) and
    ``value_side`` (per parameter: it belongs to the critic) serve the gradient comparison; ``modules`` names
    the recurrent modules whose states vary, ``critic`` says what the values read ('lstm', 'shared', 'mlp')."""

    def __init__(
        self,
        *,
        every: int,
        burn_in: Iterable[int] = BURN_IN,
        n_minibatches: int,
        last_epoch: int,
        modules: Sequence[str],
        critic: str,
        params: Sequence[torch.Tensor] = (),
        user_params: Sequence[torch.Tensor] = (),
        value_side: Sequence[bool] = (),
    ):
        self.asked_every = self.every = every
        self.burn_in = tuple(burn_in)
        self.n_minibatches, self.last_epoch = n_minibatches, last_epoch
        self.modules, self.critic = list(modules), critic
        self.params, self.user_params, self.value_side = list(params), list(user_params), list(value_side)
        self.columns: dict[str, list[Any]] = {c: [] for c in (*KEYS, *(f"state_{m}" for m in self.modules), *METRICS)}
        self.seconds = 0.0
        self._last: tuple[int, np.ndarray] | None = None  # (iteration, last_starts) of the current rollout
        self._pending: tuple[int, list[torch.Tensor]] | None = None  # (row, refreshed gradient) for step_hook

    def wants(self, iteration: int, epoch: int, minibatch: int) -> bool:
        """First and last minibatch of the first and last epoch, every ``every``-th iteration."""
        return (
            iteration % self.every == 0 and epoch in (0, self.last_epoch) and minibatch in (0, self.n_minibatches - 1)
        )

    def skip(self) -> None:
        """A minibatch not measured: a gradient not read by now belongs to one the framework did not step with."""
        self._pending = None

    def measure(self, rollout: Rollout, batch: Minibatch, like: torch.Tensor) -> None:
        """Measure ``batch`` (the copy's weights already those it trains with); ``like``: a tensor of the
        minibatch's dtype and device."""
        self._pending = None
        start = time.perf_counter()
        self._thin()
        device = like.device
        devices = [_index(device)] if device.type == "cuda" else []  # the generator reseed() seeds
        with torch.random.fork_rng(devices=devices):
            self._measure(rollout, batch, like)
        self.seconds += time.perf_counter() - start

    def step_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Optimizer step pre-hook: the gradient the framework is about to step with (from stored states; a
        clipping before it scales it as a whole, which leaves its direction) against the refreshed states'."""
        if self._pending is None:
            return
        start = time.perf_counter()
        row, ref = self._pending
        self._pending = None
        grads = _flat([p.grad for p in self.user_params], self.user_params)
        for side, name in ((False, "grad_cos_policy"), (True, "grad_cos_value")):
            self.columns[name][row] = _round(self._side_cos(side, grads, ref))
        self.seconds += time.perf_counter() - start

    def _measure(self, rollout: Rollout, batch: Minibatch, like: torch.Tensor) -> None:
        n = rollout.n_steps
        env, step = batch.env, batch.step
        first_rows = env * n + step
        if self._last is None or self._last[0] != rollout.iteration:
            self._last = (rollout.iteration, last_starts(rollout.episode_starts, rollout.n_envs, n))
        last = self._last[1][first_rows]
        at_start = rollout.episode_starts[first_rows]
        computed = computed_states(rollout, env, step, run_starts(step, last, self.burn_in), like)
        zero = {m: tuple(torch.zeros_like(t) for t in s) for m, s in batch.stored.items()}
        # stored: exactly what the framework trains with; the rest zero at episode starts, where it resets anyway
        alternatives = {"refreshed": computed["refreshed"], "stored": batch.stored, "zero": zero}
        alternatives.update({name: states for name, states in computed.items() if name != "refreshed"})
        names = list(alternatives)
        reseed(like.device)
        with torch.no_grad():
            out = batch.evaluate(list(alternatives.values()))
        mask = out.mask
        terms = {k: v.tolist() for k, v in out.terms.items()}
        spread = float(out.returns[mask].std()) if int(mask.sum()) > 1 else 0.0
        keep = torch.as_tensor(~at_start, dtype=like.dtype, device=like.device)[None, :, None]
        for a, name in enumerate(names[1:], start=1):
            row: dict[str, Any] = {
                "iteration": batch.where[0],
                "epoch": batch.where[1],
                "minibatch": batch.where[2],
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
            for module in self.modules:
                x = [t * keep for t in alternatives[name][module]]  # the states the framework starts from
                y = [t * keep for t in alternatives["refreshed"][module]]
                norm = math.sqrt(sum(float((t**2).sum()) for t in y))
                diff = math.sqrt(sum(float(((u - v) ** 2).sum()) for u, v in zip(x, y, strict=True)))
                row[f"state_{module}"] = _round(diff / norm if norm > 0 else (0.0 if diff == 0 else None))
            dv = float((out.values[a] - out.values[0])[mask].abs().mean())
            dlogp = (out.log_prob[a] - out.log_prob[0])[mask]
            row["value_abs"] = _round(dv)
            row["value_rel"] = _round(dv / spread) if spread > 0 else None
            dists = out.distributions
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
        if self.params:
            ref = self._gradient(batch, alternatives["refreshed"], like.device)
            self._pending = (stored_row, ref)
            if batch.sampled:
                self._noise(stored_row, batch, alternatives["refreshed"], like.device, ref)

    def _side_cos(self, side: bool, a: list[torch.Tensor], b: list[torch.Tensor]) -> float | None:
        """The cosine of two flat gradients over one side's parameters (value side or not)."""
        pick = [i for i, v in enumerate(self.value_side) if v == side]
        return _cos([a[i] for i in pick], [b[i] for i in pick])

    def _noise(self, row: int, batch: Minibatch, states: States, device: torch.device, ref: list[torch.Tensor]) -> None:
        """The gradient comparison's sampling spread (:data:`NOISE`) into the stored record ``row``: per side, the
        least cosine of :data:`NOISE_DRAWS` more draws of the refreshed gradient (seeds 1, 2, ...) with ``ref``."""
        least: dict[bool, list[float]] = {False: [], True: []}
        for seed in range(1, NOISE_DRAWS + 1):
            grads = self._gradient(batch, states, device, seed)
            for side in least:
                c = self._side_cos(side, grads, ref)
                if c is not None:
                    least[side].append(c)
        for side, name in zip((False, True), NOISE, strict=True):
            column = self.columns.setdefault(name, [None] * len(self.columns["iteration"]))
            column[row] = _round(min(least[side])) if least[side] else None

    def _gradient(self, batch: Minibatch, states: States, device: torch.device, draw: int = 0) -> list[torch.Tensor]:
        """The loss gradient on the copy from ``states`` (flattened per parameter), as the framework takes it; its
        random numbers drawn from seed ``draw`` (:func:`reseed`)."""
        global _seed
        _seed = draw
        try:
            reseed(device)
            loss = batch.evaluate([states]).terms["loss"][0]
        finally:
            _seed = 0
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return _flat(grads, self.params)

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


_seed = 0
"""What :func:`reseed` seeds with: 0, but for the gradient comparison's extra draws (:meth:`WhatIf._noise`)."""


def reseed(device: torch.device) -> None:
    """The generators a pass draws from (the CPU's, and ``device``'s if CUDA) seeded to one value: before the
    engine's passes, and before each alternative's pass of an adapter that runs them one by one (a framework's
    loss, an own loop's ``evaluate``), so every pass draws the same random numbers (a sampled entropy estimate;
    dropout) and equal states give equal terms, bit for bit. Inside the engine's ``fork_rng``: the user's
    generators are restored afterwards."""
    torch.random.default_generator.manual_seed(_seed)
    if device.type == "cuda":
        torch.cuda.default_generators[_index(device)].manual_seed(_seed)


def _index(device: torch.device) -> int:
    """A CUDA device's index (its bare name, ``cuda``, is the current device)."""
    return device.index if device.index is not None else torch.cuda.current_device()
