"""The TorchRL modules around a deployed policy's recurrent module, checked and run as plain modules: the
``TensorDictModule``\\ s before it (an encoder) and after it (the heads), each run in order on its in/out keys
(:class:`Chain`), and the action the actor's distribution gives under ``set_exploration_type(DETERMINISTIC)``
(:func:`action_of`). ``deployed.py`` builds its ``Deployed`` step of them.

Only classes whose computation is known are taken (:func:`check`): ``TensorDictModule``/``ValueOperator``
(no keyword in_keys, no ``method``) over ``nn.Linear``, activations, ``nn.Sequential`` and TorchRL's ``MLP``
of those, ``NormalParamExtractor`` and ``AddStateIndependentNormalScale``; anything else is refused in one
line (BadInput), never run. The two scale makers pass ``loc`` on and put a placeholder where the scale was:
the deterministic action reads ``loc`` alone.

The deterministic action, per distribution (``tensordict/nn/probabilistic.py``:
``ProbabilisticTensorDictModule._dist_sample`` returns ``dist.deterministic_sample`` where the distribution
has one, else falls back by ``DETERMINISTIC_REGISTER``):

- ``OneHotCategorical`` (torchrl): ``mode``, the one-hot of the largest logit; exported as its index;
- ``TanhNormal`` (``torchrl/modules/distributions/continuous.py:TanhNormal.deterministic_sample``): the
  root Normal's mean (``loc``; with ``tanh_loc``, ``update``'s ``(loc / upscale).tanh() * upscale`` and, for
  bounds other than [-1, 1], ``+ (high - low) / 2 + low``) through the transforms: tanh (``safe_tanh``, the
  default: ``SafeTanhTransform``, clamped to ``±(1 - finfo.resolution)``), then, for bounds other than
  [-1, 1], ``AffineTransform(loc=(high + low) / 2, scale=(high - low) / 2)`` (``loc + scale * x``);
- ``IndependentNormal`` (``...continuous.py:IndependentNormal.deterministic_sample``, its ``mean``): ``loc``
  (``tanh_loc`` is applied by its ``update`` alone, not by ``__init__``, which builds the distribution each
  step: measured, the loc passes unchanged);
- ``torch.distributions.Normal`` (no ``deterministic_sample``: the registry's ``MEAN``): ``loc``.

An actor built with ``safe=True`` and a ``Bounded`` spec projects the action onto it (``Bounded._project``:
``torch.clamp``); here the same clamp.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lstm_probe.errors import BadInput

ACTIVATIONS = (
    nn.Tanh,
    nn.ReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.LeakyReLU,
    nn.Sigmoid,
    nn.Softplus,
    nn.Mish,
    nn.Identity,
)
"""The activations (and ``nn.Identity``) taken inside a module: their exact classes."""
DISTRIBUTIONS = ("OneHotCategorical", "TanhNormal", "IndependentNormal", "Normal")
TANH_KWARGS = {"low", "high", "upscale", "tanh_loc", "safe_tanh", "event_dims"}
NORMAL_KWARGS = {"upscale", "tanh_loc", "event_dim"}


class _Loc(nn.Module):
    """``NormalParamExtractor`` (``chunk(2, -1)``: loc, then scale) or ``AddStateIndependentNormalScale``
    (loc unchanged), with the scale left out: loc, a placeholder (the deterministic action reads loc)."""

    def __init__(self, split: bool) -> None:
        super().__init__()
        self.split = split

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x, *others = tensors
        loc = x[..., : (x.shape[-1] + 1) // 2] if self.split else x  # chunk(2, -1)[0], as a Slice
        return (loc, loc, *others)


def _plain(module: Any, where: str, top: bool = True) -> nn.Module:
    """``module`` as it runs in the export: itself when every part is known (see the module docstring), the
    scale makers replaced by :class:`_Loc`; BadInput naming the first unknown class."""
    from tensordict.nn import AddStateIndependentNormalScale, NormalParamExtractor
    from torchrl.modules import MLP

    kind = type(module)
    if kind is nn.Linear or kind in ACTIVATIONS:
        return module
    if kind is MLP:  # an nn.Sequential whose forward concatenates its inputs and reshapes its output
        for child in module:
            if type(child) is not nn.Linear and type(child) not in ACTIVATIONS:
                raise BadInput(
                    f"export takes a TorchRL MLP of linear layers and activations {where}, "
                    f"not one with a {type(child).__name__[:60]}"
                )
        return module
    if kind is nn.Sequential:
        parts = list(module)
        return nn.Sequential(*(_plain(c, where, top=top and i == len(parts) - 1) for i, c in enumerate(parts)))
    if kind in (NormalParamExtractor, AddStateIndependentNormalScale) and top:
        return _Loc(split=kind is NormalParamExtractor)
    raise BadInput(
        f"export does not run a {kind.__name__[:60]} {where}: it takes nn.Linear, activations, nn.Sequential, "
        "TorchRL's MLP, and a NormalParamExtractor or AddStateIndependentNormalScale last"
    )


def check(td_module: Any, where: str) -> nn.Module:
    """The plain module a ``TensorDictModule`` runs (see :func:`_plain`), or BadInput."""
    from tensordict.nn import TensorDictModule
    from torchrl.modules import ValueOperator

    if type(td_module) not in (TensorDictModule, ValueOperator):
        raise BadInput(f"export takes TensorDictModules {where}, not a {type(td_module).__name__[:60]}")
    if td_module._kwargs or getattr(td_module, "method", None) is not None:
        raise BadInput(f"export takes TensorDictModules {where} called on positional in_keys, without method=")
    if not isinstance(td_module.module, nn.Module):
        raise BadInput(f"export takes TensorDictModules of nn.Modules {where}, not of a function")
    for p in td_module.module.parameters():
        if isinstance(p, nn.parameter.UninitializedParameter):
            raise BadInput(f"a lazy layer {where} has no weights yet: run the policy once before exporting it")
    return _plain(td_module.module, where)


class Chain(nn.Module):
    """``TensorDictModule``\\ s run in order on a dict of their in/out keys (each module's outputs written under
    its out_keys, as ``TensorDictModule.forward`` writes them)."""

    def __init__(self, td_modules: list[Any], where: str) -> None:
        super().__init__()
        self.steps = nn.ModuleList(check(m, where) for m in td_modules)
        self.keys = [(list(m.in_keys), list(m.out_keys)) for m in td_modules]

    def missing(self, known: set[Any]) -> tuple[set[Any], set[Any]]:
        """(keys read before any module here writes them, beyond ``known``; every key written)."""
        need, have = set(), set(known)
        for ins, outs in self.keys:
            need |= {k for k in ins if k not in have}
            have |= set(outs)
        return need, have

    def forward(self, values: dict[Any, torch.Tensor]) -> dict[Any, torch.Tensor]:
        values = dict(values)
        for m, (ins, outs) in zip(self.steps, self.keys, strict=True):
            out = m(*(values[k] for k in ins))
            values.update(zip(outs, out if isinstance(out, tuple) else (out,), strict=False))
        return values


class Action(nn.Module):
    """The distribution module's deterministic action from its in_keys' values (see the module docstring)."""

    minus_low: torch.Tensor
    minus_mid: torch.Tensor
    spread: torch.Tensor
    clamp_low: torch.Tensor
    clamp_high: torch.Tensor

    def __init__(self, dist: Any) -> None:
        super().__init__()
        name = dist.distribution_class.__name__
        module = dist.distribution_class.__module__
        if name not in DISTRIBUTIONS or not module.startswith(("torchrl.", "torch.distributions")):
            raise BadInput(
                f"export takes a TorchRL actor ending in a {', '.join(DISTRIBUTIONS)} distribution, not {name[:60]}"
            )
        self.kind = name
        kwargs = dict(dist.distribution_kwargs or {})
        known = {"TanhNormal": TANH_KWARGS, "IndependentNormal": NORMAL_KWARGS}.get(name, set())
        if set(kwargs) - known:
            raise BadInput(f"export does not know the {name} argument {sorted(set(kwargs) - known)[0]!r}")
        keys = dict(zip(dist.dist_keys, dist.in_keys, strict=True))
        self.key = keys.get("logits" if name == "OneHotCategorical" else "loc")
        if self.key is None:
            raise BadInput(f"export takes a {name} given its {'logits' if self.discrete else 'loc'} by an in_key")

        def tensor(v: Any) -> torch.Tensor:
            return torch.as_tensor(v, dtype=torch.float32).detach().clone()

        self.tanh_loc = bool(kwargs.get("tanh_loc", False))
        self.upscale = float(kwargs.get("upscale", 5.0))
        self.safe_tanh = bool(kwargs.get("safe_tanh", True))
        low, high = tensor(kwargs.get("low", -1.0)), tensor(kwargs.get("high", 1.0))
        # TanhNormal's non_trivial_max/min: only bounds other than [-1, 1] shift a tanh_loc
        self.bounded = bool((high != 1.0).any() or (low != -1.0).any())
        # each a + b written b - (-a) (the same float: negation is exact), so the file runs no Add, which
        # lstm-probe's own exports never hold (deploy/checks.py: OPS)
        self.register_buffer("minus_low", -low)
        self.register_buffer("minus_mid", -((high + low) / 2))  # AffineTransform(loc=(high + low) / 2, ...)
        self.register_buffer("spread", (high - low) / 2)
        clamp = _projection(dist)
        self.clamped = clamp is not None
        self.register_buffer("clamp_low", clamp[0] if clamp else torch.zeros(()))
        self.register_buffer("clamp_high", clamp[1] if clamp else torch.zeros(()))

    @property
    def discrete(self) -> bool:
        return self.kind == "OneHotCategorical"

    def forward(self, values: dict[Any, torch.Tensor]) -> torch.Tensor:
        x = values[self.key]
        if self.kind == "OneHotCategorical":
            return torch.argmax(x, dim=-1)  # the one-hot's index
        if self.kind == "TanhNormal":
            if self.tanh_loc:
                x = (x / self.upscale).tanh() * self.upscale
                if self.bounded:  # x + (high - low) / 2 + low
                    x = (x - -self.spread) - self.minus_low
            x = x.tanh()
            if self.safe_tanh:
                lim = 1.0 - torch.finfo(x.dtype).resolution
                x = x.clamp(-lim, lim)
            x = self.spread * x - self.minus_mid  # AffineTransform._call: loc + scale * x
        if self.clamped:
            x = torch.clamp(x, self.clamp_low, self.clamp_high)
        return x


def _projection(dist: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The bounds ``safe=True`` clamps the action to, or None."""
    if not getattr(dist, "safe", False):
        return None
    from torchrl.data import Bounded, Unbounded

    spec = dist.spec[dist.out_keys[0]] if dist.spec is not None else None
    if isinstance(spec, Unbounded):
        return None
    if not isinstance(spec, Bounded):
        raise BadInput(f"export takes a safe=True actor with a Bounded action spec, not {type(spec).__name__}")
    low, high = spec.space.low, spec.space.high
    return low.detach().clone().float(), high.detach().clone().float()
