"""Which loss reaches which parameter, measured: the part of ``lstm-probe arch`` every framework shares once it
has its own modules and loss terms (rsl_rl's ``rsl_rl/arch.py``, TorchRL's ``torchrl/arch.py``; sb3's
``sb3/arch.py`` computes the same inline, and declares the record all of them return: ``Architecture``).

A framework hands :func:`architecture` a private copy of its actor and critic under one root module
(:func:`private_copy`: the caller's hooks, and what they hold, are left behind), a call of each path on that
copy (which modules each actually runs: sharing is by module identity, not by name) and its named loss terms
built on one minibatch. Each term is differentiated alone with ``torch.autograd.grad``: no ``.grad`` is
touched, no optimizer steps. The caller keeps the global RNGs as they were (``sb3.arch._rng_kept``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from lstm_probe.integrations.sb3.arch import Architecture, ModuleInfo, ParamFlow, _dedupe, _recording
from lstm_probe.measure import copies

LOSSES = ("policy", "value", "entropy")
"""The loss terms an :class:`Architecture` reports, in its columns' order (policy: PPO's surrogate)."""


def private_copy(modules: Mapping[str, nn.Module]) -> nn.ModuleDict:
    """One deep copy of ``modules`` (name -> module; a module shared between them stays shared) under an
    ``nn.ModuleDict``, that runs none of the caller's code: without the hooks on its modules (torch's own
    weight/spectral-norm hooks, which compute weights, stay), without instance attributes that shadow its
    methods (a user's wrappers), and without the tensors a module keeps between calls (an RNN's last state,
    a distribution's last parameters: outputs of the caller's runs, not the model)."""
    return copies.private_copy(nn.ModuleDict(dict(modules)), drop=_kept_output)


def _kept_output(value: Any) -> bool:
    if isinstance(value, nn.Parameter):
        return False
    if isinstance(value, torch.Tensor | torch.distributions.Distribution):
        return True
    # a list of the module's own parameters (nn.LSTM's _flat_weights) is the model
    return isinstance(value, tuple | list) and any(_kept_output(v) for v in value)


def reach(losses: Mapping[str, torch.Tensor], params: list[tuple[str, nn.Parameter]]) -> dict[str, list[str]]:
    """For each named loss, for each parameter in order: 'yes' (a non-zero gradient), 'zero' (connected, zero
    on this batch) or 'no' (not connected)."""
    tensors = [p for _, p in params]
    out = {}
    for key, loss in losses.items():
        grads = torch.autograd.grad(loss, tensors, allow_unused=True, retain_graph=True)
        out[key] = ["no" if g is None else "yes" if bool(g.abs().sum() > 0) else "zero" for g in grads]
    return out


def architecture(
    root: nn.Module,
    *,
    policy: str,
    actor: Callable[[], Any],
    critic: Callable[[], Any],
    losses: Callable[[], Mapping[str, torch.Tensor]],
    batch: str,
    lstm: dict[str, Any],
    verdict: Callable[[Architecture], str],
) -> Architecture:
    """The :class:`Architecture` of ``root`` (a :func:`private_copy`): ``actor()`` and ``critic()`` run each
    path once (recorded, without gradients), ``losses()`` builds the :data:`LOSSES` terms on one minibatch.
    A parameter whose module neither path calls (a distribution's log-std) is on the path of the root entry
    it sits under ('actor' or 'critic'); ``verdict`` words the result."""
    actor_calls: list[str] = []
    critic_calls: list[str] = []
    with torch.no_grad():
        with _recording(root, actor_calls):
            actor()
        with _recording(root, critic_calls):
            critic()
    actor_path, critic_path = _dedupe(actor_calls), _dedupe(critic_calls)
    named = [(n, p) for n, p in root.named_parameters() if p.requires_grad]
    flows = reach(losses(), named)
    modules = dict(root.named_modules())
    owner = {f"{mn}.{pn}" if mn else pn: mn for mn, m in modules.items() for pn, _ in m.named_parameters(recurse=False)}
    rows = []
    for i, (name, p) in enumerate(named):
        mname = owner.get(name, "")
        called = mname in actor_path or mname in critic_path
        on_actor = mname in actor_path or (not called and name.startswith("actor."))
        on_critic = mname in critic_path or (not called and name.startswith("critic."))
        rows.append(
            ParamFlow(name, mname, list(p.shape), p.numel(), on_actor, on_critic, *(flows[k][i] for k in LOSSES))
        )
    infos = [
        ModuleInfo(
            n,
            type(modules[n]).__name__,
            sum(p.numel() for p in modules[n].parameters()),
            n in actor_path,
            n in critic_path,
        )
        for n in _dedupe(actor_path + critic_path)
    ]
    result = Architecture(
        policy=policy,
        actor_path=actor_path,
        critic_path=critic_path,
        shared=[n for n in actor_path if n in critic_path],
        modules=infos,
        params=rows,
        batch=batch,
        verdict="",
        lstm=lstm,
    )
    result.verdict = verdict(result)
    return result


def trained(a: Architecture, prefix: str) -> str:
    """Which losses train the parameters under module ``prefix``, in words ('the value loss only', ...)."""
    kinds = {r.trained_by for r in a.params if r.module == prefix or r.module.startswith(prefix + ".")}
    words = {
        frozenset({"both"}): "both the policy and the value loss",
        frozenset({"policy"}): "the policy loss only",
        frozenset({"value"}): "the value loss only",
        frozenset(): "no loss (no trainable parameters)",
    }
    return words.get(frozenset(kinds), " and ".join(sorted(kinds)) + " losses")
