"""An rsl_rl recurrent policy as a deployed loop runs it: one step, the RNN state (LSTM or GRU) passed in and
out explicitly; rsl_rl's :data:`~lstm_probe.deploy.spec.Loader` (:func:`loader`) for the deploy layer
(``lstm-probe export model_100.pt policy.onnx --env ENV``).

What it reads: a checkpoint as ``rsl_rl/runners/on_policy_runner.py:OnPolicyRunner.save`` writes it (``model_*.pt``:
``alg.save()``'s ``actor_state_dict`` and ``critic_state_dict``, with ``iter`` and ``infos``), loaded with
``torch.load(weights_only=True)`` (no pickled code runs) after its size is checked against the memory budget;
or a runner (``OnPolicyRunner``) or its actor and critic. The models are ``rsl_rl/models/rnn_model.py:RNNModel``
(rsl-rl-lib 5.5), whose configuration the checkpoint does not hold: ``lstm-probe run --framework rsl_rl``
stores it in ``infos["lstm_probe"]["cfg"]`` (the runner's ``actor`` and ``critic`` entries). The sizes are
taken from the weights themselves (a configuration cannot make the models larger than the file), the rest
(activation, RNN type, normalisation, distribution) from the configuration, each checked: only
``rsl_rl.models.RNNModel`` and rsl_rl's own distributions are built, never a class the file names.

The step (:class:`Deployed`) is rsl_rl's own inference, with the state made explicit:

- ``RNNModel.get_latent``: the observation normalised (``MLPModel.get_latent``: ``obs_normalizer``), then
  ``rsl_rl/modules/rnn.py:RNN.forward``'s inference branch (the torch LSTM/GRU over one step);
- the reset: ``RNN.reset(dones)`` zeroes the state of the envs that ended, before their next step: here the
  state times ``1 - episode_start``;
- the action: ``MLPModel.forward`` with ``stochastic_output=False``, the distribution's ``deterministic_output``
  (a Gaussian's mean); the value: the critic's ``MLPModel.forward`` (no distribution).

:func:`reference_step` is the same policy as rsl_rl runs it (``RNN.reset(dones)`` then ``MLPModel.forward``,
the RNN keeping its own ``hidden_state``), what an exported file is verified against.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.deploy.saved import read_checkpoint
from lstm_probe.deploy.spec import Policy, Spec, State, Step
from lstm_probe.errors import BadInput, one_line
from lstm_probe.integrations.rsl_rl import versions
from lstm_probe.measure.copies import private_copy

MODEL = versions.MODEL
DISTRIBUTIONS = ("GaussianDistribution", "HeteroscedasticGaussianDistribution")
"""The distributions of rsl_rl/modules/distribution.py a configuration may name (by its class name)."""
_FIX = (
    "pass an rsl_rl 2-5 checkpoint (model_*.pt) with its run's params/agent.yaml beside it, or one "
    "`lstm-probe run --framework rsl_rl` saved"
)


def loader(model: Any, trust_model: bool = False, env_id: str | None = None) -> Policy:
    """rsl_rl's :data:`~lstm_probe.deploy.spec.Loader`: the deploy layer's :class:`Policy` of a checkpoint
    path, an ``OnPolicyRunner``, or an (actor, critic) pair of ``RNNModel`` (see the module docstring)."""
    actor, critic = models_of(model)
    module = Deployed(actor, critic).eval()
    return Policy(module.spec, module, reference_step(actor, critic))


def models_of(model: Any) -> tuple[Any, Any]:
    """Private CPU copies of the actor and critic (``measure/copies.py``: without what their last call left, e.g.
    the distribution of training's last minibatch, part of an autograd graph), in eval mode, without gradients."""
    if isinstance(model, str | os.PathLike):
        actor, critic = _from_checkpoint(os.fspath(model))
    elif isinstance(model, tuple) and len(model) == 2:
        actor, critic = (private_copy(m) for m in model)
    elif hasattr(model, "alg"):  # an OnPolicyRunner (after learn(): its distribution holds a graph, not copied)
        actor, critic = private_copy(model.alg.actor), private_copy(model.alg.critic)
    else:
        raise BadInput(
            f"export takes an rsl_rl checkpoint, OnPolicyRunner or (actor, critic), not {type(model).__name__}"
        )
    for m in (actor, critic):
        if not getattr(m, "is_recurrent", False) or not hasattr(m, "rnn"):
            raise BadInput(f"export takes rsl_rl's recurrent models (RNNModel), not {type(m).__name__}")
        m.to("cpu").eval()
        for p in m.parameters():
            p.requires_grad_(False)
        m.rnn.hidden_state = None
    return actor, critic


def _from_checkpoint(path: str) -> tuple[Any, Any]:
    """The actor and critic of a checkpoint, read as hostile: a regular file, within the memory budget, no
    pickled code (``weights_only``), and models built only as :func:`_build` builds them."""
    saved = read_checkpoint(path, _FIX)
    if not isinstance(saved, dict):
        raise BadInput(f"{path} is not an rsl_rl checkpoint (OnPolicyRunner.save: a dict of state dicts)")
    actor_cfg, critic_cfg, actor_state, critic_state = versions.models(saved, path, _FIX)
    actor = _build(actor_state, actor_cfg, True, path)
    critic = _build(critic_state, critic_cfg, False, path)
    return actor, critic


def _build(state: Any, cfg: dict[str, Any], is_actor: bool, path: str) -> Any:
    """An ``RNNModel`` of the weights ``state``: sizes from the weights, the rest from ``cfg`` (checked)."""
    from rsl_rl.models import RNNModel
    from tensordict import TensorDict

    who = "actor" if is_actor else "critic"
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BadInput(f"{path}: its {who}_state_dict is not a dict of tensors")
    try:
        ih, hh = state["rnn.rnn.weight_ih_l0"], state["rnn.rnn.weight_hh_l0"]
        hidden, obs_dim = int(hh.shape[1]), int(ih.shape[1])
        layers = sum(1 for k in state if k.startswith("rnn.rnn.weight_ih_l") and k[19:].isdigit())
        mlp = sorted(int(k.split(".")[1]) for k in state if k.startswith("mlp.") and k.endswith(".weight"))
        dims = [int(state[f"mlp.{i}.weight"].shape[0]) for i in mlp]
    except (KeyError, IndexError, ValueError):
        raise BadInput(f"{path}: its {who}_state_dict is not an RNNModel's (rnn.rnn.*, mlp.*)") from None
    cell = {4: "lstm", 3: "gru"}.get(int(ih.shape[0]) // max(hidden, 1))
    distribution = cfg.get("distribution_cfg") if is_actor else None
    if distribution is not None:
        if not isinstance(distribution, dict) or distribution.get("class_name") not in DISTRIBUTIONS:
            raise BadInput(f"{path}: its {who}'s distribution is not one of rsl_rl's {', '.join(DISTRIBUTIONS)}")
        distribution = {k: v for k, v in distribution.items() if k == "class_name" or isinstance(v, int | float)}
        distribution["std_type"] = "log" if "distribution.log_std_param" in state else "scalar"  # as the weights say
    rnn_type = str(cfg.get("rnn_type", "lstm")).lower()
    if cfg.get("class_name") != MODEL or cell is None or rnn_type != cell or len(mlp) < 1:
        raise BadInput(f"{path}: its {who} is not an {MODEL} with an LSTM or GRU its weights match")
    activation = cfg.get("activation", "elu")
    obs = TensorDict({"policy": torch.zeros(1, obs_dim)}, batch_size=[1])
    try:
        model = RNNModel(
            obs,
            {"actor": ["policy"], "critic": ["policy"]},
            who,
            dims[-1] if distribution is None else _output_dim(state, dims[-1]),
            hidden_dims=dims[:-1],
            activation=str(activation),
            obs_normalization=any(k.startswith("obs_normalizer.") for k in state),
            distribution_cfg=distribution,
            rnn_type=cell,
            rnn_hidden_dim=hidden,
            rnn_num_layers=layers,
        )
        model.load_state_dict(state, strict=True)
    except Exception as exc:
        raise BadInput(f"{path}: its {who} does not load into an {MODEL}: {one_line(exc, kind=False)[:200]}") from None
    return model


def _output_dim(state: dict[str, torch.Tensor], mlp_out: int) -> int:
    """The actions' width: a Gaussian's MLP outputs the mean alone (its std a parameter), a heteroscedastic
    one the mean and the std (``distribution.std_param`` absent)."""
    return mlp_out if "distribution.std_param" in state or "distribution.log_std_param" in state else mlp_out // 2


def spec_of(actor: Any, critic: Any) -> Spec:
    rnn = actor.rnn.rnn
    cell = "lstm" if isinstance(rnn, nn.LSTM) else "gru"
    critic_rnn = critic.rnn.rnn
    if (critic_rnn.num_layers, critic_rnn.hidden_size, type(critic_rnn)) != (
        rnn.num_layers,
        rnn.hidden_size,
        type(rnn),
    ):
        raise BadInput("export takes an rsl_rl actor and critic with RNNs of one type, width and depth")
    if int(critic.obs_dim) != int(actor.obs_dim):  # the file feeds one observation to both
        raise BadInput(
            f"export takes an rsl_rl actor and critic that read the same observation; this critic reads "
            f"{int(critic.obs_dim)} values (its observation groups), the actor {int(actor.obs_dim)}"
        )
    out = actor.distribution.input_dim if actor.distribution is not None else actor.mlp[-1].out_features
    out = out if isinstance(out, int) else int(np.prod(out))
    width = int(actor.obs_dim)
    return Spec("separate", (width,), "box", (int(_actions(actor, out)),), rnn.num_layers, rnn.hidden_size, cell)


def _actions(actor: Any, out: int) -> int:
    with torch.no_grad():
        probe = actor.mlp[-1].weight.new_zeros(1, out)
        return int(actor.distribution.deterministic_output(probe).shape[-1]) if actor.distribution is not None else out


class Deployed(nn.Module):
    """One step of an rsl_rl actor and critic with explicit state (see the module docstring)."""

    def __init__(self, actor: Any, critic: Any) -> None:
        super().__init__()
        self.spec = spec_of(actor, critic)
        self.actor, self.critic = actor, critic

    def _one(self, model: Any, obs: torch.Tensor, state: tuple[torch.Tensor, ...], keep: torch.Tensor) -> Any:
        x = model.obs_normalizer(obs).unsqueeze(0)
        if self.spec.cell == "lstm":
            out, (h, c) = model.rnn.rnn(x, (state[0] * keep, state[1] * keep))
            return model.mlp(out.squeeze(0)), [h, c]
        out, h = model.rnn.rnn(x, state[0] * keep)
        return model.mlp(out.squeeze(0)), [h]

    def forward(self, obs: torch.Tensor, episode_start: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        keep = (1.0 - episode_start).view(1, -1, 1)  # RNN.reset(dones) before the step
        n = len(state) // 2
        out, new = self._one(self.actor, obs, state[:n], keep)
        value, new_critic = self._one(self.critic, obs, state[n:], keep)
        dist = self.actor.distribution
        action = dist.deterministic_output(out) if dist is not None else out
        return (action, value, *new, *new_critic)


def reference_step(actor: Any, critic: Any) -> Step:
    """:data:`Step` of the policy as rsl_rl runs it: each model's RNN holds the state given
    (``RNN.hidden_state``), ``RNN.reset(dones)`` zeroes the envs starting an episode, ``MLPModel.forward``
    steps (``stochastic_output=False``); the new state is the RNN's ``hidden_state``. On copies of the models."""
    from tensordict import TensorDict

    actor, critic = copy.deepcopy(actor), copy.deepcopy(critic)
    lstm = isinstance(actor.rnn.rnn, nn.LSTM)

    def one(model: Any, obs: torch.Tensor, dones: torch.Tensor, state: list[torch.Tensor]) -> Any:
        model.rnn.hidden_state = (state[0].clone(), state[1].clone()) if lstm else state[0].clone()
        model.reset(dones)
        out = model(TensorDict({"policy": obs}, batch_size=[obs.shape[0]]))
        hs = model.rnn.hidden_state
        return out, list(hs) if lstm else [hs]

    def step(obs: np.ndarray, start: np.ndarray, state: State) -> tuple[np.ndarray, np.ndarray, State]:
        t = [torch.as_tensor(np.asarray(s, np.float32)) for s in state]
        n = len(t) // 2
        with torch.no_grad():
            o = torch.as_tensor(np.asarray(obs, np.float32))
            dones = torch.as_tensor(np.asarray(start)).to(torch.long)
            action, new = one(actor, o, dones, t[:n])
            value, new_critic = one(critic, o, dones, t[n:])
        return action.numpy(), value.numpy(), tuple(s.numpy() for s in (*new, *new_critic))

    return step
