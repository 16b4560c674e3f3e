"""rsl_rl PPO (``RNNModel`` actor and critic): who shares what, and which loss trains which parameter
(``lstm-probe arch --framework rsl_rl``, the record sb3's arch returns: ``sb3.arch.Architecture``).

Runs on a private copy of actor and critic (``gradflow.private_copy``): the user's modules, hooks, hidden
states and storage are never called or changed. Paths: one rollout-mode call of each model on the copy,
recorded (``gradflow.architecture``). Losses: rsl_rl's three terms as ``algorithms/ppo.py:PPO.update``
computes them (clipped surrogate, value loss, entropy), on a synthetic minibatch of whole trajectories in
update mode (``masks``, initial states of zeros) drawn from a local RNG with the observation groups' shapes
of the algorithm's storage (``storage.observations``; read, never written). The global RNGs are restored.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.errors import BadInput
from lstm_probe.integrations.gradflow import architecture, private_copy, trained
from lstm_probe.integrations.sb3.arch import Architecture, _rng_kept

STEPS, SEQUENCES = 4, 2
"""The synthetic minibatch: SEQUENCES whole trajectories of STEPS steps each."""


def arch(target: Any) -> Architecture:
    """Architecture and measured gradient flow of rsl_rl PPO's recurrent actor and critic: ``target`` is an
    ``OnPolicyRunner`` or its algorithm (``runner.alg``), analysed as it is (an env id: ``train.arch``)."""
    alg = getattr(target, "alg", target)
    if not hasattr(alg, "actor") or not hasattr(alg, "critic") or not hasattr(alg, "storage"):
        raise BadInput(
            f"arch takes an rsl_rl OnPolicyRunner, its PPO algorithm or an env id, not {type(target).__name__}"
        )
    device = next(alg.actor.parameters()).device
    with _rng_kept(device):
        return _arch(alg, device)


def _arch(alg: Any, device: torch.device) -> Architecture:
    from tensordict import TensorDict

    root = private_copy({"actor": alg.actor, "critic": alg.critic})
    actor: Any = root["actor"]
    critic: Any = root["critic"]
    root.train()  # as PPO.update runs them
    rng = np.random.default_rng(0)
    stored = alg.storage.observations
    groups = {k: tuple(stored[k].shape[2:]) for k in stored.keys()}
    obs = TensorDict(
        {k: torch.as_tensor(rng.normal(size=(STEPS, SEQUENCES, *s)), dtype=torch.float32) for k, s in groups.items()},
        batch_size=[STEPS, SEQUENCES],
    ).to(device)
    masks = torch.ones(STEPS, SEQUENCES, dtype=torch.bool, device=device)
    n = STEPS * SEQUENCES
    advantages = torch.as_tensor(rng.normal(size=n), dtype=torch.float32, device=device)
    returns = torch.as_tensor(rng.normal(size=n), dtype=torch.float32, device=device)
    clip = float(getattr(alg, "clip_param", 0.2))

    def zeros(model: Any) -> Any:
        rnn = model.rnn.rnn
        h = torch.zeros(rnn.num_layers, SEQUENCES, rnn.hidden_size, device=device)
        return (h, h.clone()) if isinstance(rnn, nn.LSTM) else h

    def losses() -> dict[str, torch.Tensor]:  # algorithms/ppo.py: PPO.update
        sampled = actor(obs, masks=masks, hidden_state=zeros(actor), stochastic_output=True).detach()
        log_prob = actor.get_output_log_prob(sampled).flatten()
        entropy = actor.output_entropy.flatten()
        values = critic(obs, masks=masks, hidden_state=zeros(critic)).flatten()
        ratio = torch.exp(log_prob - log_prob.detach())
        surrogate = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()
        return {"policy": surrogate, "value": (returns - values).pow(2).mean(), "entropy": -entropy.mean()}

    def rollout(model: Any) -> Any:
        model.reset()
        return model(obs[0])

    return architecture(
        root,
        policy=f"{type(alg).__name__} ({type(actor).__name__} actor, {type(critic).__name__} critic)",
        actor=lambda: rollout(actor),
        critic=lambda: rollout(critic),
        losses=losses,
        batch=f"a synthetic minibatch of {SEQUENCES} trajectories x {STEPS} steps (update mode, zero initial states)",
        lstm=_rnn_info(actor, critic),
        verdict=_verdict,
    )


def _rnn_info(actor: Any, critic: Any) -> dict[str, Any]:
    rnn = actor.rnn.rnn
    kind = "lstm" if isinstance(rnn, nn.LSTM) else "gru"
    return {"hidden_size": rnn.hidden_size, "num_layers": rnn.num_layers, "rnn_type": kind, "critic": kind}


def _verdict(a: Architecture) -> str:
    kind = a.lstm["rnn_type"].upper()
    if "actor.rnn.rnn" in a.shared:
        return f"actor and critic share one {kind}, trained by {trained(a, 'actor.rnn.rnn')}."
    text = (
        f"actor and critic have separate {kind}s: actor.rnn.rnn is trained by {trained(a, 'actor.rnn.rnn')}, "
        f"critic.rnn.rnn by {trained(a, 'critic.rnn.rnn')}"
    )
    if a.shared:
        text += f"; shared modules: {', '.join(a.shared)}"
    return text + "."
