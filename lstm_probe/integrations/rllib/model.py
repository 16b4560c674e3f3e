"""RLlib PPO's LSTM RLModule: which modules are its LSTMs (and their roles), and which output trains
which parameter (measured gradient flow; ``lstm-probe arch --framework rllib``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.capture.modules import describe_modules
from lstm_probe.errors import BadInput, one_line
from lstm_probe.integrations.sb3.arch import _rng_kept
from lstm_probe.measure.copies import private_copy
from lstm_probe.options import TrainOptions, settle


def role(name: str, count: int) -> str:
    """'actor' / 'critic' for RLlib's default encoders (``encoder.actor_encoder.lstm``,
    ``encoder.critic_encoder.lstm``); with vf_share_layers the one LSTM (``encoder.encoder.lstm``) is
    'actor', as sb3's shared LSTM is. Other modules keep their names."""
    if "critic" in name:
        return "critic"
    if "actor" in name or count == 1:
        return "actor"
    return name


def lstms(module: nn.Module) -> dict[str, nn.Module]:
    found = [(n, m) for n, m in module.named_modules() if isinstance(m, nn.LSTM | nn.GRU)]
    if not found:
        raise BadInput(
            "the RLModule has no nn.LSTM or nn.GRU; set use_lstm=True in the model config "
            "(DefaultModelConfig(use_lstm=True))"
        )
    out: dict[str, nn.Module] = {}
    for n, m in found:
        name = role(n, len(found))
        out[n if name in out else name] = m  # two modules of one role keep their full names
    return out


def gradient_flow(module: Any) -> dict[str, Any]:
    """Which parameters the policy and the value outputs reach, by autograd on a synthetic batch.

    PPO's losses depend on the parameters only through these outputs: the policy and entropy losses through
    ``action_dist_inputs`` of ``forward_train``, the value loss through ``compute_values``. Runs on a private
    copy of ``module`` (``measure/copies.private_copy``: none of the user's hooks or wrappers run, the user's
    module is never called and keeps its mode) in training mode, as RLlib's learner runs it (cuDNN has no RNN
    backward in eval mode), with the global RNGs kept (``sb3.arch._rng_kept``); the batch is drawn from a
    local RNG on the module's device, and no ``.grad`` is touched (``torch.autograd.grad``): training is
    unchanged. Returns the record the report's architecture section reads.
    """

    space = module.observation_space
    shape = getattr(space, "shape", None)
    if not shape:
        return {"verdict": None, "batch": f"not measured: synthetic batches need a Box observation space ({space})"}
    first = next(module.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    with _rng_kept(device):
        copy = private_copy(module)
        copy.train(True)
        return _measured(copy, shape, device)


def _measured(module: Any, shape: tuple[int, ...], device: torch.device) -> dict[str, Any]:
    from ray.rllib.core.columns import Columns

    n, t = 2, 3
    rng = np.random.default_rng(0)
    obs = torch.as_tensor(rng.uniform(-1, 1, size=(n, t, *shape)), dtype=torch.float32, device=device)
    initial = module.get_initial_state()

    def batched(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: batched(v) for k, v in x.items()}
        x = torch.as_tensor(x, dtype=torch.float32, device=device)
        return x.unsqueeze(0).expand(n, *x.shape).contiguous()

    batch = {Columns.OBS: obs, Columns.STATE_IN: batched(initial)}
    params = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    out = module.forward_train(dict(batch))
    policy = out[Columns.ACTION_DIST_INPUTS].float().pow(2).sum()
    value = module.compute_values(dict(batch)).float().pow(2).sum()
    reach: dict[str, tuple[bool, bool]] = {name: (False, False) for name, _ in params}
    for which, loss in enumerate((policy, value)):
        grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True, retain_graph=True)
        for (name, _), g in zip(params, grads, strict=True):
            if g is not None and bool(g.abs().sum() > 0):
                pol, val = reach[name]
                reach[name] = (True, val) if which == 0 else (pol, True)
    table = {
        name: {(True, True): "both", (True, False): "policy", (False, True): "value"}.get(r, "neither")
        for name, r in reach.items()
    }
    lstm_names = [name for name, m in module.named_modules() if isinstance(m, nn.LSTM | nn.GRU)]
    parts = []
    for name in lstm_names:
        kinds = {v for k, v in table.items() if k.startswith(name + ".")}
        by = "both" if "both" in kinds or kinds >= {"policy", "value"} else next(iter(kinds), "neither")
        words = {
            "both": "trained by the policy and the value loss",
            "policy": "trained by the policy loss only",
            "value": "trained by the value loss only",
            "neither": "trained by no loss",
        }
        parts.append(f"{name} ({role(name, len(lstm_names))}) is {words[by]}")
    shared = len(lstm_names) == 1
    verdict = (
        "actor and critic share one LSTM (vf_share_layers=True): "
        if shared
        else "actor and critic have separate LSTMs (vf_share_layers=False): "
    ) + "; ".join(parts)
    return {
        "verdict": verdict,
        "gradient_flow": table,
        "batch": f"a synthetic batch of {n} sequences x {t} steps (policy: forward_train's action_dist_inputs; "
        "value: compute_values)",
        "shared": shared,
    }


def arch(env_id: str, *, train: TrainOptions | None = None, **overrides: Any) -> dict[str, Any]:
    """The measured gradient flow of RLlib PPO's default LSTM RLModule for ``env_id`` (no Ray, no training);
    ``train`` (or keyword overrides of its fields) sets ``shared_lstm`` and ``hidden_size``."""
    import gymnasium as gym
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    try:
        env = gym.make(env_id)
    except gym.error.Error as exc:
        raise BadInput(f"unknown env id {env_id!r} ({one_line(exc, kind=False)})") from None
    t = settle(TrainOptions, train, overrides)
    model: dict[str, Any] = {"use_lstm": True, "vf_share_layers": t.shared_lstm}
    if t.hidden_size:
        model["lstm_cell_size"] = t.hidden_size
    config = PPOConfig().environment(env_id).rl_module(model_config=DefaultModelConfig(**model))
    module: Any = config.get_rl_module_spec(env=env).build()
    env.close()
    flow = gradient_flow(module)
    shapes = {name: list(p.shape) for name, p in module.named_parameters()}
    return {"env_id": env_id, "modules": describe_modules(lstms(module)), "shapes": shapes, **flow}
