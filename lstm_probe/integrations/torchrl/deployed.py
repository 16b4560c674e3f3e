"""A TorchRL recurrent policy as a deployed loop runs it: one step, the LSTM (or GRU) state passed in and out
explicitly; TorchRL's :data:`~lstm_probe.deploy.spec.Loader` (:func:`loader`) for the deploy layer
(``lstm-probe export run.model.pt policy.onnx --env CartPole-v1``, ``lstm-probe replay TRACE --policy
run.model.pt``).

What it reads: the ``run.model.pt`` ``lstm-probe run --framework torchrl`` saves (``train.py``:
``{"lstm_probe": "torchrl", "config": build()'s arguments, "actor": ..., "critic": ...}``), loaded with
``torch.load(weights_only=True)`` after its size is checked against the memory budget (``deploy/saved.py``:
``read_checkpoint``); or an ``(actor, critic)`` pair in memory (a ``ProbabilisticActor`` and a
``TensorDictSequential`` sharing one ``LSTMModule``/``GRUModule`` and the modules before it: the pair
:func:`~lstm_probe.integrations.torchrl.train.build` makes, or the user's own, discrete or continuous), or a
TorchRL loss holding one (``ClipPPOLoss``: its ``actor_network`` and ``critic_network``). From a file,
the sizes (observation width, hidden size, layers, actions) are taken from the weights, the configuration
checked against them (types and values), and only :func:`~lstm_probe.integrations.torchrl.train.modules`'
classes are built (``LSTMModule``/``GRUModule``, linear heads, ``OneHotCategorical``), never a class the
file names.

The step (:class:`Deployed`) is TorchRL's own sequential step (``recurrent_mode`` off, as a collector runs the
policy), with the state made explicit:

- the reset: ``torchrl/modules/tensordict_module/rnn.py:LSTMModule.forward`` (and ``GRUModule.forward``)
  zero the incoming state where ``is_init`` is set (``torch.where(is_init, zeros, hidden)``); here the state
  times ``1 - episode_start``, the same for a finite state;
- the recurrent call: the module's LSTM/GRU over one step (``LSTMModule._lstm``), here a sequence-first
  ``nn.LSTM``/``nn.GRU`` on the same weights (``shadow.py``; TorchRL's is batch first, which the ONNX exporter
  wraps in transposes of a size its checks cannot follow), the state ``(layers, batch, hidden)``; TorchRL's
  TensorDict holds it as ``(batch, layers, hidden)``, which :func:`reference_step` transposes;
- the encoder and the heads: the ``TensorDictModule``\\ s before the recurrent module (from the observation's
  key to its in key) and after it (actor: to the distribution's ``logits`` or ``loc``; critic: to its
  value), run in order on their in/out keys, of the classes ``heads.py`` checks (no other class is run);
- the action: the distribution's deterministic sample (``heads.py``: ``OneHotCategorical.mode``, the one-hot
  of the largest logit, exported as its index, an int64 per env, ``Spec.action == 'discrete'``;
  ``TanhNormal``'s, ``IndependentNormal``'s or ``Normal``'s, float32, ``Spec.action == 'box'`` with the
  width of ``loc``).

:func:`reference_step` is the same policy as TorchRL runs it: the actor and the critic themselves on a
TensorDict (``is_init`` from ``episode_start``, the state under the module's in keys), under
``set_exploration_type(DETERMINISTIC)``; the new state is what they write under ``("next", ...)``. What an
exported file is verified against.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.deploy import saved
from lstm_probe.deploy.spec import Policy, Spec, State, Step
from lstm_probe.errors import BadInput, one_line
from lstm_probe.integrations.torchrl.heads import Action, Chain
from lstm_probe.integrations.torchrl.shadow import shadow

MARK = "torchrl"
"""The checkpoint's ``saved.MARK`` entry: a TorchRL run's ``run.model.pt``."""
CONFIG = {"env_id": str, "hidden_size": int, "num_layers": int, "cell": str}
"""The configuration ``train.run`` saves (``build()``'s arguments), each entry's type."""
_FIX = "pass the run.model.pt `lstm-probe run --framework torchrl` saved"
HEAD = "module.0.module.1.module.weight"
"""The actor's head in a discrete run's checkpoint (a linear layer to the logits)."""
HEAD_BOX = "module.0.module.1.module.0.weight"
"""The actor's head in a continuous run's (a linear layer to loc and scale, then NormalParamExtractor)."""


def loader(model: Any, trust_model: bool = False, env_id: str | None = None) -> Policy:
    """TorchRL's :data:`~lstm_probe.deploy.spec.Loader`: the deploy layer's :class:`Policy` of a checkpoint
    path or an ``(actor, critic)`` pair (see the module docstring)."""
    actor, critic = models_of(model)
    module = Deployed(actor, critic).eval()
    return Policy(module.spec, module, reference_step(actor, critic))


def models_of(model: Any) -> tuple[Any, Any]:
    """Private CPU copies of the actor and critic (one recurrent module shared by both), in eval mode,
    without gradients."""
    if isinstance(model, str | os.PathLike):
        actor, critic = _from_checkpoint(os.fspath(model))
    elif isinstance(model, tuple) and len(model) == 2 and all(isinstance(m, nn.Module) for m in model):
        actor, critic = copy.deepcopy(model)  # one deepcopy: the shared recurrent module stays shared
    elif _is_loss(model):  # ClipPPOLoss and its kin: the networks it holds (TorchRL 0.14: the modules given it)
        actor, critic = copy.deepcopy((model.actor_network, model.critic_network))
    else:
        raise BadInput(
            f"export takes a TorchRL run.model.pt, an (actor, critic) pair or a ClipPPOLoss, "
            f"not {type(model).__name__[:60]}"
        )
    for m in (actor, critic):
        m.to("cpu").eval()
        for p in m.parameters():
            p.requires_grad_(False)
    return actor, critic


def _is_loss(model: Any) -> bool:
    """A TorchRL ``LossModule`` holding an actor and a critic (``ClipPPOLoss``, ``KLPENPPOLoss``, ...)."""
    from torchrl.objectives import LossModule

    return isinstance(model, LossModule) and all(
        isinstance(getattr(model, k, None), nn.Module) for k in ("actor_network", "critic_network")
    )


def _from_checkpoint(path: str) -> tuple[Any, Any]:
    """The actor and critic of a TorchRL run's checkpoint, read as hostile (see the module docstring)."""
    from torchrl.data import OneHot

    from lstm_probe.integrations.torchrl.train import modules

    doc = saved.read_checkpoint(path, _FIX)
    if not isinstance(doc, dict) or doc.get(saved.MARK) != MARK:
        raise BadInput(f"{path} is not a TorchRL checkpoint (no {saved.MARK!r}: {MARK!r} entry); {_FIX}")
    config = doc.get("config")
    if not isinstance(config, dict) or any(
        type(config.get(k)) is not t for k, t in CONFIG.items()
    ):  # type(...) is int: a bool is no size
        want = ", ".join(f"{k} ({t.__name__})" for k, t in CONFIG.items())
        raise BadInput(f"{path}: its config is not build()'s arguments ({want}); {_FIX}")
    cell = config["cell"]
    if cell not in ("lstm", "gru"):
        raise BadInput(f"{path}: its config's cell is {cell[:40]!r}, not 'lstm' or 'gru'; {_FIX}")
    states = []
    for who in ("actor", "critic"):
        state = doc.get(who)
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise BadInput(f"{path}: its {who} is not a state dict (names to tensors); {_FIX}")
        states.append(state)
    actor_state, critic_state = states
    rnn = f"module.0.module.0.{cell}."
    try:
        ih, hh = actor_state[f"{rnn}weight_ih_l0"], actor_state[f"{rnn}weight_hh_l0"]
        hidden, obs = int(hh.shape[1]), int(ih.shape[1])
        layers = sum(1 for k in actor_state if k.startswith(f"{rnn}weight_ih_l") and k[len(rnn) + 11 :].isdigit())
        box = HEAD_BOX in actor_state  # a continuous run's head: loc and scale (NormalParamExtractor)
        actions = int(actor_state[HEAD_BOX if box else HEAD].shape[0]) // (2 if box else 1)
        gates = int(ih.shape[0]) // max(hidden, 1)
    except (KeyError, IndexError, ValueError):
        raise BadInput(f"{path}: its actor is not build()'s ({rnn}*, a linear head); {_FIX}") from None
    if gates != {"lstm": 4, "gru": 3}[cell] or (config["hidden_size"], config["num_layers"]) != (hidden, layers):
        raise BadInput(
            f"{path}: its config (hidden_size {config['hidden_size']}, num_layers {config['num_layers']}, "
            f"{cell}) is not what its weights hold (hidden {hidden}, {layers} layers, {gates} gates); {_FIX}"
        )
    if actions < 1:
        raise BadInput(f"{path}: its actor's head gives no action; {_FIX}")
    shapes = _shapes(rnn, cell, obs, hidden, layers, actions, box)
    got = {k: tuple(v.shape) for k, v in (*actor_state.items(), *(("critic." + k, v) for k, v in critic_state.items()))}
    if any(got.get(k) != shape for k, shape in shapes.items()):  # the models built are no larger than the weights
        bad = next(k for k, shape in shapes.items() if got.get(k) != shape)
        raise BadInput(
            f"{path}: its {bad[:80]!r} is {got.get(bad)}, not the {shapes[bad]} build()'s policy holds; {_FIX}"
        )
    shared = {k[len("module.0.") :]: v for k, v in critic_state.items() if k.startswith(f"module.0.{cell}.")}
    mine = {k[len("module.0.module.0.") :]: v for k, v in actor_state.items() if k.startswith(rnn)}
    if shared.keys() != mine.keys() or not all(torch.equal(shared[k], mine[k]) for k in mine):
        raise BadInput(f"{path}: its actor and critic do not share one {cell.upper()}, as build() makes them; {_FIX}")
    try:
        spec = _bounds(config, actions, path) if box else OneHot(actions)
        actor, critic, _ = modules(obs, spec, hidden_size=hidden, num_layers=layers, cell=cell)
        actor.load_state_dict(actor_state, strict=True)
        critic.load_state_dict(critic_state, strict=True)
    except Exception as exc:
        raise BadInput(
            f"{path}: its weights do not load into build()'s policy: {one_line(exc, kind=False)[:200]}"
        ) from None
    return actor, critic


def _bounds(config: dict[str, Any], actions: int, path: str) -> Any:
    """A continuous run's action spec: its config's ``low`` and ``high`` (finite floats, one per action, low
    below high), the bounds its TanhNormal maps onto."""
    from torchrl.data import Bounded

    low, high = saved.bounds(config, actions, path, _FIX)
    return Bounded(low=torch.tensor(low), high=torch.tensor(high), shape=(actions,))


def _shapes(
    rnn: str, cell: str, obs: int, hidden: int, layers: int, actions: int, box: bool = False
) -> dict[str, tuple[int, ...]]:
    """The shape of every parameter build()'s policy of these sizes holds (the critic's prefixed ``critic.``)."""
    gates = {"lstm": 4, "gru": 3}[cell] * hidden
    want: dict[str, tuple[int, ...]] = {}
    for layer in range(layers):
        want[f"{rnn}weight_ih_l{layer}"] = (gates, obs if layer == 0 else hidden)
        want[f"{rnn}weight_hh_l{layer}"] = (gates, hidden)
        want[f"{rnn}bias_ih_l{layer}"] = want[f"{rnn}bias_hh_l{layer}"] = (gates,)
    head, out = (HEAD_BOX, 2 * actions) if box else (HEAD, actions)
    want[head], want[head[: -len("weight")] + "bias"] = (out, hidden), (out,)
    want["critic.module.1.module.weight"], want["critic.module.1.module.bias"] = (1, hidden), (1,)
    return want


def _leaves(module: Any) -> list[Any]:
    """The modules a ``TensorDictSequential`` (a ``ProbabilisticActor`` included) runs, in order, nested
    sequences flattened."""
    from tensordict.nn import TensorDictSequential

    if isinstance(module, TensorDictSequential):
        return [leaf for m in module.module for leaf in _leaves(m)]
    return [module]


@dataclass
class Parts:
    """A policy's pieces, in the order the step runs them."""

    rnn: Any
    before: list[Any]
    """The ``TensorDictModule``\\ s before the recurrent module (shared by the actor and the critic)."""
    actor_heads: list[Any]
    critic_heads: list[Any]
    dist: Any
    """The actor's ``ProbabilisticTensorDictModule``."""


def _parts(actor: Any, critic: Any) -> Parts:
    """The pieces of an actor and a critic, or BadInput for a policy this loader does not export."""
    from tensordict.nn import ProbabilisticTensorDictModule
    from torchrl.modules import GRUModule, LSTMModule

    kinds = (LSTMModule, GRUModule)
    a, c = _leaves(actor), _leaves(critic)
    rnns = [m for m in a if isinstance(m, kinds)]
    at = a.index(rnns[0]) if len(rnns) == 1 else -1
    shared = at >= 0 and len(c) > at + 1 and all(x is y for x, y in zip(a[: at + 1], c, strict=False))
    if not shared or any(isinstance(m, kinds) for m in c[at + 1 :]):
        raise BadInput(
            "export takes a TorchRL actor and critic that each run one shared LSTMModule or GRUModule, after "
            "the same modules if any (as torchrl's build() makes them)"
        )
    dist = a[-1]
    if not isinstance(dist, ProbabilisticTensorDictModule):
        raise BadInput("export takes a TorchRL actor ending in its distribution (a ProbabilisticActor)")
    net = _net(rnns[0])
    if getattr(net, "bidirectional", False) or getattr(net, "proj_size", 0):
        raise BadInput("export takes a TorchRL recurrent module over a one-way LSTM/GRU without proj_size")
    return Parts(rnns[0], a[:at], a[at + 1 : -1], c[at + 1 :], dist)


def _net(rnn: Any) -> Any:
    """The ``nn.LSTM`` of an ``LSTMModule``, the ``nn.GRU`` of a ``GRUModule``."""
    return rnn.lstm if hasattr(rnn, "lstm") else rnn.gru


def spec_of(actor: Any, critic: Any) -> Spec:
    return Deployed(actor, critic).spec


class Deployed(nn.Module):
    """One step of a TorchRL actor and critic with explicit state (see the module docstring)."""

    def __init__(self, actor: Any, critic: Any) -> None:
        super().__init__()
        parts = _parts(actor, critic)
        rnn = parts.rnn
        self.before = Chain(parts.before, "before the recurrent module")
        self.actor_heads = Chain(parts.actor_heads, "after the recurrent module")
        self.critic_heads = Chain(parts.critic_heads, "after the recurrent module")
        self.action = Action(parts.dist)
        self.net = shadow(_net(rnn), batch_first=False)  # its own weights; sequence first exports to ONNX
        self.rnn_in, self.embed = rnn.in_keys[0], rnn.out_keys[0]
        self.value = parts.critic_heads[-1].out_keys[0]
        self.obs = _observation(self, parts)
        cell = "lstm" if isinstance(self.net, nn.LSTM) else "gru"
        width = _width(parts.before[0].module) if parts.before else int(self.net.input_size)
        layers, hidden = int(self.net.num_layers), int(self.net.hidden_size)
        self.spec = Spec("shared", (width,), "discrete", (), layers, hidden, cell)
        if self.action.discrete:  # how many: the logits' width, from one step of zeros
            self.spec = Spec("shared", (width,), "discrete", (), layers, hidden, cell, self._logits())
        else:
            with torch.no_grad():
                shape = tuple(int(n) for n in self.eval()(*self.spec.example(1))[0].shape[1:])
            self.spec = Spec("shared", (width,), "box", shape, layers, hidden, cell)

    def _logits(self) -> int:
        """The width of the actor's logits (a discrete action's count): one step of zeros on this copy."""
        obs, _, *state = self.spec.example(1)
        with torch.no_grad():
            values = self.before({self.obs: obs})
            out = self.net(values[self.rnn_in].unsqueeze(0), tuple(state) if len(state) > 1 else state[0])[0]
            values[self.embed] = out.squeeze(0)
            return int(self.actor_heads(values)[self.action.key].shape[-1])

    def forward(self, obs: torch.Tensor, episode_start: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        keep = (1.0 - episode_start).view(1, -1, 1)  # LSTMModule.forward: is_init zeroes the incoming state
        values = self.before({self.obs: obs})
        x = values[self.rnn_in].unsqueeze(0)  # one step, sequence first
        if self.spec.cell == "lstm":
            out, (h, c) = self.net(x, (state[0] * keep, state[1] * keep))
            new = [h, c]
        else:
            out, h = self.net(x, state[0] * keep)
            new = [h]
        values[self.embed] = out.squeeze(0)
        action = self.action(self.actor_heads(values))
        value = self.critic_heads(values)[self.value]
        return (action, value, *new)


def _observation(step: Deployed, parts: Parts) -> Any:
    """The one key the policy reads from the env (the observation's), or BadInput; every other key a module
    reads is written by one before it."""
    rnn = parts.rnn
    need, have = step.before.missing(set())
    if rnn.in_keys[0] not in have:
        need.add(rnn.in_keys[0])
    have = have | {step.embed}
    for chain in (step.actor_heads, step.critic_heads):
        more, _ = chain.missing(have)
        need |= more
    dist_needs = {step.action.key} - step.actor_heads.missing(have)[1]
    if len(need) != 1 or dist_needs or (parts.before and need != set(parts.before[0].in_keys)):
        raise BadInput(
            "export takes a TorchRL policy reading one observation key from the env (and the recurrent state), "
            f"its first module reading it alone; this one reads {sorted(map(str, need | dist_needs))[:4]}"
        )
    return next(iter(need))


def _width(module: nn.Module) -> int:
    """The observation width the first module before the recurrent module takes (its first linear layer's)."""
    first = next((m for m in module.modules() if isinstance(m, nn.Linear)), None)
    if first is None:
        raise BadInput("export takes an encoder before the recurrent module that starts with a linear layer")
    return int(first.in_features)


def reference_step(actor: Any, critic: Any) -> Step:
    """:data:`Step` of the policy as TorchRL runs it (see the module docstring), on copies of the modules."""
    from tensordict import TensorDict
    from torchrl.envs.utils import ExplorationType, set_exploration_type
    from torchrl.modules import set_recurrent_mode

    actor, critic = copy.deepcopy((actor, critic))
    parts = _parts(actor, critic)
    rnn, value_key, obs_key = parts.rnn, parts.critic_heads[-1].out_keys[0], Deployed(actor, critic).obs
    discrete = Action(parts.dist).discrete
    state_keys = rnn.in_keys[1:-1]  # (value, *states, is_init)
    next_keys = rnn.out_keys[1:]

    def step(obs: np.ndarray, start: np.ndarray, state: State) -> tuple[np.ndarray, np.ndarray, State]:
        o = torch.as_tensor(np.asarray(obs, np.float32))
        batch = o.shape[0]
        given = {
            k: torch.as_tensor(np.asarray(s, np.float32)).transpose(0, 1)
            for k, s in zip(state_keys, state, strict=True)
        }
        is_init = torch.as_tensor(np.asarray(start) != 0).view(batch, 1)
        td = TensorDict({obs_key: o, **given, "is_init": is_init}, batch_size=[batch])
        checks = torch.distributions.Distribution._validate_args
        # TorchRL turns torch's distribution checks off on import (TanhNormal's support fails them); a process
        # that turned them on again has them for its own code, not for this step
        torch.distributions.Distribution.set_default_validate_args(False)
        try:
            with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC), set_recurrent_mode(False):
                acted = actor(td.clone())
                valued = critic(td.clone())
        finally:
            torch.distributions.Distribution.set_default_validate_args(checks)
        action = acted[parts.dist.out_keys[0]]
        action = action.argmax(-1) if discrete else action  # the one-hot's index
        value = valued[value_key]
        new = tuple(acted[k].transpose(0, 1).contiguous().numpy() for k in next_keys)
        return action.numpy(), value.numpy(), new

    return step
