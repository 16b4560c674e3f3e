"""What if an own loop's training sequences started from other states? The generic tracer's adapter of the
what-if engine (``lstm_probe/measure/whatif.py``, whose docstring says what is measured): ``trace(model, ...,
what_if=True)`` and :meth:`~lstm_probe.integrations.generic.Tracer.measure_batch` before each minibatch's loss
(docs/own-loops.md).

An own loop has no storage or loss lstm-probe could read, so the loop hands over what the engine needs:

- the rollout, step-major as a loop keeps it: ``obs`` (T, N, ...), ``episode_start`` (T, N) (the step starts an
  episode: the loop resets the state before it, CleanRL's ``dones``) and ``rollout_states``, the states stored
  during the rollout: at its first step (each (layers, N, hidden)) or before every step (each (T, layers, N,
  hidden)); the first suffice where every sequence starts at step 0 or at an episode start and no burn-in
  reaches past one of those;
- the minibatch: its sequences' ``env`` and first rollout ``step``, the ``states`` the loop trains it with, and
  ``evaluate(model, states)``: the loop's own forward and loss on the minibatch, written against the model it
  is given (the probe's private copy, ``measure/copies.py``: the user's modules never run for a measurement,
  so their hooks never see one), returning a dict: ``values``, ``log_prob`` (one per element), ``loss`` (the
  total the loop steps with), ``returns`` (the minibatch's, whose spread scales value differences); and where
  the loop has them ``entropy``, ``policy_loss``, ``value_loss``, ``clip_fraction`` and ``dist`` (the action
  distribution over the elements in the order of ``values``, for the KL divergence: a Categorical or a Normal,
  also inside Independent). A term not given is not measured (None in the log);
- ``inputs(model, obs)`` (given to ``trace``): each recurrent module's input from observations, on the copy
  (a tensor, or a dict by module name where the model has several), for the burn-in and refreshed states the
  engine computes; by default the observations themselves.

An nn.LSTMCell or nn.GRUCell stepped by hand is re-run as a one-layer nn.LSTM / nn.GRU holding the cell's weights
(``measure/copies.cell_twin``): its states come and go as the loop keeps them ((N, hidden) each), the engines see
them as (1, N, hidden).

The gradient comparison reads the gradient the loop steps with from a step pre-hook on ``optimizer`` (given
to ``trace``); parameters whose name starts with one of :data:`VALUE_PREFIXES` count as the critic's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.errors import BadInput
from lstm_probe.measure import copies
from lstm_probe.measure import whatif as engine
from lstm_probe.measure.whatif import BURN_IN, Outcome, Rollout, States

VALUE_PREFIXES = ("critic", "value", "vf", "lstm_critic")
"""A parameter whose name starts with one of these is the critic's (gradient comparison, value side); a
recurrent module so named is the critic's own (``critic='lstm'``), otherwise the values read a shared one."""
Inputs = Callable[[nn.Module, torch.Tensor], Any]
"""``inputs(model, obs)``: the recurrent modules' inputs from observations (N, ...), on the copy."""


def _tuple(state: Any) -> tuple[torch.Tensor, ...]:
    return tuple(state) if isinstance(state, tuple | list) else (state,)


def starts_of(episode_start: Any) -> np.ndarray:
    """The rollout's episode starts as a (steps, envs) bool array (one host copy)."""
    x = episode_start.detach().cpu() if isinstance(episode_start, torch.Tensor) else episode_start
    starts = np.asarray(x).astype(bool)
    if starts.ndim != 2:
        raise BadInput(f"episode_start is (steps, envs), step-major; got shape {starts.shape}")
    return starts


def _flat_dist(dist: Any, n: int) -> Any:
    """The action distribution over the ``n`` elements in their order, one batch row each (any action dims
    after it, which the KL sums): a Categorical or a Normal (also inside Independent); None otherwise (KL not
    measured)."""
    d = dist.base_dist if isinstance(dist, torch.distributions.Independent) else dist
    if isinstance(d, torch.distributions.Categorical) and d.batch_shape.numel() % n == 0:
        return torch.distributions.Categorical(logits=d.logits.reshape(n, -1, d.logits.shape[-1]))
    if type(d) is torch.distributions.Normal and d.batch_shape.numel() % n == 0:
        return torch.distributions.Normal(d.loc.reshape(n, -1), d.scale.reshape(n, -1))
    return None


def _sequence_first(rnn: nn.Module) -> nn.Module:
    """``rnn`` itself, or where it is batch-first a sequence-first twin on its parameter tensors (with its
    dropout): the engines feed (steps, batch, features), as the loops they re-run keep them."""
    if not getattr(rnn, "batch_first", False):
        return rnn
    twin = copies.twin(rnn, batch_first=False)
    twin.dropout = float(rnn.dropout)  # type: ignore[arg-type]
    return twin


class Copy:
    """The private copy of the user's ``model`` both measurements run on (``own_memory.py`` too), made at the
    first measurement (the model is then where it trains), and what they read of it: its recurrent modules by
    the probe's names (``rnns``), the recurrent modules' inputs from observations (``inputs``)."""

    def __init__(self, model: nn.Module, names: Sequence[str], inputs: Inputs | None = None):
        self.model, self.names, self.inputs = model, list(names), inputs
        own = dict(model.named_modules())
        self.cells = {n for n in self.names if isinstance(own["" if n == "root" else n], nn.LSTMCell | nn.GRUCell)}
        for name in self.names:
            m = own["" if name == "root" else name]
            if not isinstance(m, nn.LSTM | nn.GRU | nn.LSTMCell | nn.GRUCell):
                raise BadInput(
                    f"what-if and memory re-run nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell modules; {name} is a "
                    f"{type(m).__name__}: trace it without what_if and memory (its log and report need neither)"
                )
            if getattr(m, "bidirectional", False) or getattr(m, "proj_size", None):
                raise BadInput(f"what-if and memory do not follow a bidirectional or projected LSTM ({name})")
        self._copy: nn.Module | None = None
        self.rnns: dict[str, nn.Module] = {}
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def get(self) -> nn.Module:
        """The copy (made once)."""
        if self._copy is not None:
            return self._copy
        copy = copies.private_copy(self.model)
        own, theirs = dict(copy.named_modules()), dict(self.model.named_modules())
        self.pairs = copies.pairs(copy, self.model)
        for name in self.names:
            m = own["" if name == "root" else name]
            if name in self.cells:  # a one-layer LSTM/GRU of the cell's weights, kept the user's values by sync
                self.rnns[name] = copies.cell_twin(m)
                self.pairs += copies.cell_pairs(self.rnns[name], theirs["" if name == "root" else name])
            else:
                self.rnns[name] = _sequence_first(m)
        self._copy = copy
        return copy

    def sync(self, train: bool) -> nn.Module:
        """The user's current values in the copy; train or eval mode. Returns the copy."""
        copy = self.get()
        copies.sync(self.pairs)
        copy.train(train)
        for rnn in self.rnns.values():  # a batch-first module's twin is no submodule of the copy
            rnn.train(train)
        return copy

    def states(self, given: Any, what: str) -> dict[str, tuple[torch.Tensor, ...]]:
        """Per module, (h, c) or (h,): a dict by name, or one module's tuple / tensor. A cell's (N, hidden) or
        (T, N, hidden) states come as its twin's (1, N, hidden) or (T, 1, N, hidden)."""
        if isinstance(given, dict):
            missing = [n for n in self.names if n not in given]
            if missing:
                raise BadInput(f"{what} has no state for {missing[0]!r} (its keys: the recurrent modules' names)")
            got = {n: _tuple(given[n]) for n in self.names}
        elif len(self.names) != 1:
            raise BadInput(f"{what}: a dict by module name, the model has {len(self.names)} recurrent modules")
        else:
            got = {self.names[0]: _tuple(given)}
        return {n: tuple(x.unsqueeze(-3) for x in s) if n in self.cells else s for n, s in got.items()}

    def precision(self, given: Any) -> contextlib.AbstractContextManager[Any]:
        """The loop's autocast, for runs of the copy from the states ``given`` (as :meth:`states` takes them):
        states of a lower float precision than the recurrent module's weights came out of a
        ``torch.autocast`` of their dtype (a module of float32 weights takes no other input dtype), so the
        copy's runs from them (the refreshed states, burn-ins, ``evaluate`` and ``heads``) are autocast alike."""
        state = next(iter(self.states(given, "rollout_states").values()))[0]
        own = dict(self.model.named_modules())[self.names[0] if self.names[0] != "root" else ""]
        weight = next(own.parameters(), None)
        low = (torch.float16, torch.bfloat16)
        if weight is None or state.dtype not in low or weight.dtype != torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(state.device.type, dtype=state.dtype)

    def give(self, per_module: dict[str, Any], states: bool = True) -> Any:
        """Per-module values as the user's functions take them: one module's alone, several in a dict by name;
        ``states``: an LSTM's as (h, c), a GRU's as h; a cell's (1, N, hidden) each as (N, hidden)."""
        if states:
            per_module = {n: tuple(x[0] for x in s) if n in self.cells else s for n, s in per_module.items()}
            per_module = {n: (s if isinstance(self.rnns[n], nn.LSTM) else s[0]) for n, s in per_module.items()}
        return per_module if len(per_module) > 1 else next(iter(per_module.values()))

    def features(self, x: torch.Tensor, like: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each module's inputs from observations ``x`` (B, ...), (B, features), on the copy."""
        got = x if self.inputs is None else self.inputs(self.get(), x.to(like.device))
        got = got if isinstance(got, dict) else dict.fromkeys(self.names, got)
        return {m: got[m].reshape(len(x), -1).to(like.device, like.dtype) for m in self.names}


class OwnWhatIf:
    """What-if for an own loop: :meth:`measure_batch` before each minibatch's loss; the engine's ``step_hook``
    goes on the user's optimizer; :meth:`metadata` is what the log keeps under ``what_if``. ``copy``: the
    model's :class:`Copy`; ``epochs``, ``minibatches``: how many of each the loop runs per rollout (which
    minibatches are sampled)."""

    def __init__(
        self,
        copy: Copy,
        *,
        epochs: int,
        minibatches: int,
        every: int,
        burn_in: Sequence[int],
        optimizer: Any = None,
    ):
        if epochs < 1 or minibatches < 1:
            raise BadInput(f"epochs and minibatches must be >= 1, got {epochs} and {minibatches}")
        self.copy, self.names = copy, copy.names
        self.optimizer = optimizer
        self.sizes = {"epochs": epochs, "minibatches": minibatches}
        self.every, self.burn_in = every, tuple(sorted(set(BURN_IN) | set(burn_in)))
        self.engine: engine.WhatIf | None = None  # made with the copy

    def _made(self) -> engine.WhatIf:
        if self.engine is not None:
            return self.engine
        mine = [(n, p) for n, p in self.copy.get().named_parameters() if p.requires_grad]
        theirs = dict(self.copy.model.named_parameters())
        critic_own = [n for n in self.names if n.startswith(VALUE_PREFIXES)]
        gradient = self.optimizer is not None
        self.engine = engine.WhatIf(
            every=self.every,
            burn_in=self.burn_in,
            n_minibatches=self.sizes["minibatches"],
            last_epoch=self.sizes["epochs"] - 1,
            modules=self.names,
            critic="lstm" if critic_own else "shared",
            params=[p for _, p in mine] if gradient else [],
            user_params=[theirs[n] for n, _ in mine] if gradient else [],
            value_side=[n.startswith(VALUE_PREFIXES) for n, _ in mine] if gradient else [],
        )
        return self.engine

    def step_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The optimizer step pre-hook (the gradient the loop steps with), once the engine exists."""
        if self.engine is not None:
            self.engine.step_hook(optimizer, args, kwargs)

    def metadata(self) -> dict[str, Any] | None:
        """The log's ``what_if`` (None before any minibatch was measured)."""
        if self.engine is None or not self.engine.columns["iteration"]:
            return None
        return self.engine.metadata()

    # -- a minibatch ----------------------------------------------------------------------------------------
    def measure_batch(
        self,
        evaluate: Callable[[nn.Module, Any], dict[str, Any]],
        where: tuple[int, int, int],
        *,
        obs: torch.Tensor,
        episode_start: Any,
        rollout_states: Any,
        env: Any,
        states: Any,
        step: Any = 0,
    ) -> bool:
        """Measure the minibatch ``where`` (iteration, epoch, minibatch) if sampled (see the module's
        docstring for the arguments); returns whether it was."""
        wi = self._made()
        if not wi.wants(*where):
            wi.skip()
            return False
        starts = starts_of(episode_start)
        t, n = starts.shape
        env_ = np.asarray(env, dtype=np.int64).reshape(-1)
        step_ = np.broadcast_to(np.asarray(step, dtype=np.int64), env_.shape).copy()
        if len(env_) == 0 or env_.min() < 0 or env_.max() >= n or step_.min() < 0 or step_.max() >= t:
            raise BadInput(f"env and step must name sequences of the rollout ({n} envs, {t} steps)")
        stored = self.copy.states(rollout_states, "rollout_states")
        trains = self.copy.states(states, "states")
        flat = {m: self._flat(s, n, t, m) for m, s in stored.items()}
        if any(s[0].dim() == 3 for s in stored.values()):  # the rollout's first states only
            self._first_only(starts, env_, step_, wi.burn_in)
            flat = {m: self._spread(f, t) if stored[m][0].dim() == 3 else f for m, f in flat.items()}
        like = trains[self.names[0]][0]
        self.copy.sync(self.copy.model.training)

        def features(rows: np.ndarray) -> dict[str, torch.Tensor]:
            index = torch.from_numpy(rows)
            return self.copy.features(obs[index % t, index // t], like)  # step-major obs, env-major rows

        rollout = Rollout(
            iteration=where[0],
            n_envs=n,
            n_steps=t,
            episode_starts=starts.T.reshape(-1),
            rnns=dict(self.copy.rnns),
            stored=flat,
            features=features,
        )
        mini = engine.Minibatch(
            where=where,
            env=env_,
            step=step_,
            stored=trains,
            evaluate=lambda alternatives: self._evaluate(evaluate, alternatives),
        )
        with torch.enable_grad():
            wi.measure(rollout, mini, like)
        return True

    @staticmethod
    def _flat(state: tuple[torch.Tensor, ...], n: int, t: int, name: str) -> tuple[torch.Tensor, ...]:
        """(layers, N, hidden) -> (N, layers, hidden); (T, layers, N, hidden) -> env-major (N * T, layers,
        hidden)."""
        out = []
        for s in state:
            s = s.detach()
            if s.dim() == 3 and s.shape[1] == n:
                out.append(s.transpose(0, 1))
            elif s.dim() == 4 and s.shape[0] == t and s.shape[2] == n:
                out.append(s.permute(2, 0, 1, 3).reshape(n * t, s.shape[1], s.shape[3]))
            else:
                raise BadInput(
                    f"rollout_states of {name}: each (layers, {n}, hidden) at the rollout's first step or "
                    f"({t}, layers, {n}, hidden) before each step; got {tuple(s.shape)}"
                )
        return tuple(out)

    @staticmethod
    def _spread(first: tuple[torch.Tensor, ...], t: int) -> tuple[torch.Tensor, ...]:
        """The first step's states in env-major rows (N * T, layers, hidden), the other steps' NaN (never read:
        :meth:`_first_only`)."""
        out = []
        for s in first:
            full = torch.full((s.shape[0], t, *s.shape[1:]), float("nan"), dtype=s.dtype, device=s.device)
            full[:, 0] = s
            out.append(full.reshape(-1, *s.shape[1:]))
        return tuple(out)

    @staticmethod
    def _first_only(starts: np.ndarray, env: np.ndarray, step: np.ndarray, burn_in: Sequence[int]) -> None:
        """Refuse what would read a stored state after the rollout's first step, where only those were given."""
        last = engine.last_starts(starts.T.reshape(-1), starts.shape[1], starts.shape[0])[env * starts.shape[0] + step]
        for first, from_stored in engine.run_starts(step, last, burn_in).values():
            if (from_stored & (first > 0)).any():
                raise BadInput(
                    "a sequence (or a burn-in before it) starts from a stored state after the rollout's first step: "
                    "pass rollout_states with one per step, each (steps, layers, envs, hidden)"
                )

    def _evaluate(self, evaluate: Callable[[nn.Module, Any], dict[str, Any]], alternatives: list[States]) -> Outcome:
        """The user's ``evaluate`` on the copy from each alternative's states, gathered as the engine takes it."""
        copy = self.copy.get()
        device = next((p.device for p in copy.parameters()), torch.device("cpu"))
        got = []
        for s in alternatives:
            engine.reseed(device)  # every alternative draws alike (dropout, a sampled entropy)
            got.append(evaluate(copy, self.copy.give(s)))
        for key in ("values", "log_prob", "loss", "returns"):
            if key not in got[0]:
                raise BadInput(f"evaluate must return {key!r} (values, log_prob, loss, returns; see docs/own-loops.md)")
        values = torch.stack([g["values"].reshape(-1) for g in got])
        log_prob = torch.stack([g["log_prob"].reshape(-1) for g in got])
        if values.shape != log_prob.shape:
            raise BadInput(f"evaluate's values and log_prob differ in size: {values.shape[1]} and {log_prob.shape[1]}")
        nan = torch.full((), float("nan"), device=values.device)

        def term(g: dict[str, Any], key: str) -> torch.Tensor:
            if key == "entropy_loss":
                return -torch.as_tensor(g["entropy"]).mean() if "entropy" in g else nan
            return torch.as_tensor(g[key]).reshape(()).to(values.device) if key in g else nan

        terms = {k: torch.stack([term(g, k) for g in got]) for k in engine.TERMS}
        flat = [_flat_dist(g.get("dist"), values.shape[1]) for g in got]
        dists = None if any(d is None for d in flat) else [[d] for d in flat]
        mask = torch.ones(values.shape[1], dtype=torch.bool, device=values.device)
        return Outcome(values, log_prob, mask, terms, dists, got[0]["returns"].reshape(-1).detach())
