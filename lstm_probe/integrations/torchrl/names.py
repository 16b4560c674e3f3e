"""The names a TorchRL log gives the LSTMModules/GRUModules it traces (the log's ``module`` column).

A module shared by the whole policy is called by its kind (``lstm``, ``gru``). An actor and a critic with an
RNN of their own (``probe([actor, critic])``) are called by the role the probe knows them in, as sb3's
``lstm_actor``/``lstm_critic``: ``lstm_actor`` (``gru_actor``) for the RNN of the model that acts (a
``ProbabilisticTensorDictSequential``, or one writing ``"action"``), ``lstm_critic`` for the RNN of the model
that writes a value (``state_value``, ``state_action_value``). Otherwise, and for logs written before (whose
rows keep their names: the report reads a module's name from its rows), the module's path in the first model
that holds it (``module.0.module.0``). The path is kept beside the name (metadata ``torchrl.modules[NAME].path``),
and ``probe(modules=[...])`` takes either.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from lstm_probe.errors import BadInput

_VALUES = ("state_value", "state_action_value")


def role(model: nn.Module) -> str | None:
    """``"actor"``, ``"critic"`` or None: what ``model`` is, from its class and out_keys."""
    from tensordict.nn import ProbabilisticTensorDictSequential

    out = {str(k) for k in getattr(model, "out_keys", [])}
    if isinstance(model, ProbabilisticTensorDictSequential) or "action" in out:
        return "actor"
    return "critic" if out & set(_VALUES) else None


def find_modules(model: nn.Module | Iterable[nn.Module], names: list[str] | None = None) -> dict[str, nn.Module]:
    """Every ``LSTMModule``/``GRUModule`` in ``model`` (a module, or several: actor and critic), named as the
    module docstring says (one entry per module object: a shared one is probed once)."""
    return {n: m for n, (_, m) in located(model, names).items()}


def located(model: nn.Module | Iterable[nn.Module], names: list[str] | None = None) -> dict[str, tuple[str, nn.Module]]:
    """name -> (its path in the first model that holds it, the module): :func:`find_modules` with the paths;
    ``names``: those named (by name or path)."""
    found = paths(model)
    if names is not None:
        by_path = {p: n for n, (p, _) in found.items()}
        missing = [n for n in names if n not in found and n not in by_path]
        if missing:
            raise BadInput(f"no LSTMModule/GRUModule named {missing[0]!r}; here: {', '.join(found) or 'none'}")
        found = {k: found[k] for k in (n if n in found else by_path[n] for n in names)}
    if not found:
        raise BadInput("no torchrl LSTMModule or GRUModule found in the given module(s)")
    return found


def paths(model: nn.Module | Iterable[nn.Module]) -> dict[str, tuple[str, nn.Module]]:
    """name -> (path in the first model that holds it, module), for :func:`find_modules`."""
    from torchrl.modules import GRUModule, LSTMModule

    models = [model] if isinstance(model, nn.Module) else list(model)
    found: dict[str, tuple[str, nn.Module]] = {}
    roles: dict[str, str | None] = {}
    seen: set[int] = set()
    for i, m in enumerate(models):
        for name, sub in m.named_modules():
            if isinstance(sub, LSTMModule | GRUModule) and id(sub) not in seen:
                seen.add(id(sub))
                key = name or type(sub).__name__
                key = key if key not in found else f"{key}.{i}"
                found[key], roles[key] = (name, sub), role(m)
    kind = {k: "lstm" if isinstance(m, LSTMModule) else "gru" for k, (_, m) in found.items()}
    if len(found) == 1:  # one module: called by its kind
        return {kind[k]: v for k, v in found.items()}
    named = [roles[k] for k in found]
    if len(found) == 2 and sorted(r or "" for r in named) == ["actor", "critic"]:  # one RNN per role
        return {f"{kind[k]}_{roles[k]}": v for k, v in found.items()}
    return found
