"""TorchRL PPO with an ``LSTMModule``/``GRUModule``: who shares what between the policy and the value
module, and which loss trains which parameter (``lstm-probe arch --framework torchrl``, the record sb3's
arch returns: ``sb3.arch.Architecture``).

Runs on a private copy of both modules (``gradflow.private_copy``, one copy: a recurrent module the two
share stays shared): the user's modules and hooks never see it. Paths: one call of each on a one-step batch,
recorded. Losses: TorchRL's own ``ClipPPOLoss`` over the copies (``loss_objective``, ``loss_critic``,
``loss_entropy``: the terms ``lstm-probe run --framework torchrl`` adds up), on a synthetic batch of whole
trajectories in recurrent mode (``is_init`` at each first step, zero states) drawn from a local RNG, with
actions and their log-probabilities from the copied policy. The global RNGs are restored.
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
"""The synthetic batch: SEQUENCES trajectories of STEPS steps each."""
TERMS = {"policy": "loss_objective", "value": "loss_critic", "entropy": "loss_entropy"}
"""ClipPPOLoss's output for each loss term of the Architecture."""


def arch(actor: nn.Module, critic: nn.Module, example: Any = None) -> Architecture:
    """Architecture and measured gradient flow of a TorchRL policy (a ``ProbabilisticActor``) and value
    module, analysed as they are (an env id: ``train.arch``). The synthetic batch fills each RNN's own input; a
    policy that reads other keys before its RNN (an encoder of the observation) needs ``example``: a TensorDict
    holding them (``env.reset()``), whose shapes and dtypes the batch takes (its values are drawn anew)."""
    device = next(actor.parameters()).device
    with _rng_kept(device):
        return _arch(actor, critic, device, example)


def _recurrent(root: nn.Module) -> list[tuple[str, Any]]:
    from torchrl.modules import GRUModule, LSTMModule

    found = [(n, m) for n, m in root.named_modules() if isinstance(m, LSTMModule | GRUModule)]
    if not found:
        raise BadInput("no torchrl LSTMModule or GRUModule in the policy or value module")
    return found


def _arch(actor_in: nn.Module, critic_in: nn.Module, device: torch.device, example: Any) -> Architecture:
    from tensordict import TensorDict
    from torchrl.modules import set_recurrent_mode
    from torchrl.objectives import ClipPPOLoss

    root = private_copy({"actor": actor_in, "critic": critic_in})
    actor, critic = root["actor"], root["critic"]
    root.train()  # as a training loop runs them: cuDNN computes no RNN backward in eval mode
    rnns = _recurrent(root)
    rng = np.random.default_rng(0)
    shape = (SEQUENCES, STEPS)
    columns: dict[str, torch.Tensor] = {}
    for _, m in rnns:
        obs_key, *state_keys, init_key = m.in_keys
        size = m.lstm.input_size if hasattr(m, "lstm") else m.gru.input_size
        rnn = m.lstm if hasattr(m, "lstm") else m.gru
        columns[obs_key] = torch.as_tensor(rng.normal(size=(*shape, size)), dtype=torch.float32)
        first = torch.zeros((*shape, 1), dtype=torch.bool)
        first[:, 0] = True
        columns[init_key] = first
        for key in state_keys:
            columns[key] = torch.zeros((*shape, rnn.num_layers, rnn.hidden_size))
    _inputs(columns, [*getattr(actor, "in_keys", ()), *getattr(critic, "in_keys", ())], example, rng, shape)
    batch = TensorDict(columns, batch_size=list(shape)).to(device)
    loss = ClipPPOLoss(actor, critic)

    def losses() -> dict[str, torch.Tensor]:
        td = batch.clone()
        with torch.no_grad(), set_recurrent_mode(True):
            actor(td)
        td["advantage"] = torch.as_tensor(rng.normal(size=(*shape, 1)), dtype=torch.float32, device=device)
        td["value_target"] = torch.as_tensor(rng.normal(size=(*shape, 1)), dtype=torch.float32, device=device)
        with set_recurrent_mode(True):
            out = loss(td)
        return {k: out[v] for k, v in TERMS.items()}

    def one_step(module: nn.Module) -> Any:
        return module(batch[:, 0].clone())

    kinds = {type(m).__name__ for _, m in rnns}
    first = rnns[0][1]
    rnn = first.lstm if hasattr(first, "lstm") else first.gru
    return architecture(
        root,
        policy=f"{type(actor).__name__} and {type(critic).__name__} ({', '.join(sorted(kinds))})",
        actor=lambda: one_step(actor),
        critic=lambda: one_step(critic),
        losses=losses,
        batch=f"a synthetic batch of {SEQUENCES} trajectories x {STEPS} steps (recurrent mode, zero initial "
        "states; ClipPPOLoss's loss_objective, loss_critic, loss_entropy)",
        lstm={
            "hidden_size": rnn.hidden_size,
            "num_layers": rnn.num_layers,
            "rnn_type": "lstm" if hasattr(first, "lstm") else "gru",
            "modules": [n for n, _ in rnns],
        },
        verdict=_verdict,
    )


def _inputs(columns: dict[Any, torch.Tensor], keys: list[Any], example: Any, rng: Any, shape: tuple[int, int]) -> None:
    """The keys the modules read that no RNN's input fills (an encoder's observation), into ``columns``: drawn as
    ``example`` holds them (its feature shape and dtype); BadInput naming them where there is no example."""
    missing = [k for k in dict.fromkeys(keys) if k not in columns]
    if not missing:
        return
    have = [] if example is None else list(example.keys(include_nested=True, leaves_only=True))
    absent = [k for k in missing if k not in have]
    if absent:
        names = ", ".join(repr(k) for k in absent[:4])
        raise BadInput(
            f"the policy reads {names} before its RNN, which the synthetic batch cannot make up: pass example="
            "env.reset() (a TensorDict holding them) to arch((actor, critic), example=...)"
        )
    lead = len(example.batch_size)
    for key in missing:
        value = example[key]
        feature = tuple(value.shape[lead:])
        if value.dtype.is_floating_point:
            columns[key] = torch.as_tensor(rng.normal(size=(*shape, *feature)), dtype=value.dtype)
        else:
            columns[key] = torch.zeros((*shape, *feature), dtype=value.dtype)


def _verdict(a: Architecture) -> str:
    kind = a.lstm["rnn_type"].upper()
    cores = [n for n in a.actor_path + a.critic_path if n.endswith((".lstm", ".gru"))]
    shared = [n for n in a.shared if n in cores]
    if shared:
        text = f"policy and value module share one {kind} ({shared[0]}), trained by {trained(a, shared[0])}"
    else:
        own = [n for n in dict.fromkeys(cores)]
        text = f"policy and value module have separate {kind}s: " + ", ".join(
            f"{n} trained by {trained(a, n)}" for n in own
        )
    others = [n for n in a.shared if n not in cores]
    if others:
        text += f"; other shared modules: {', '.join(others)}"
    return text + "."
