"""Which recurrent modules a tracer hooks, and how a log's metadata describes them and the run's software.

Used by the tracer core and by integrations that describe their modules themselves (RLlib's).
"""

from __future__ import annotations

import datetime as _dt
import platform
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.capture.returns import Live
from lstm_probe.contract import Resolver, Tags
from lstm_probe.errors import BadInput
from lstm_probe.log.schema import SCHEMA_VERSION

RECURRENT_TYPES = (nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell)
"""The module types a tracer can hook."""


def find_recurrent(model: nn.Module, names: list[str] | None = None) -> dict[str, nn.Module]:
    """Every nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell in ``model`` (or those ``names``); :class:`BadInput` for
    a ``model`` that is no torch module (a dict or list of them: an ``nn.ModuleDict`` holds several)."""
    if not isinstance(model, nn.Module):
        several = isinstance(model, dict | list | tuple)
        fix = "put them in torch.nn.ModuleDict({...})" if several else "pass the policy's torch module"
        raise BadInput(f"the model to trace must be a torch nn.Module, not {type(model).__name__}; {fix}")
    found: dict[str, nn.Module] = {
        name or "root": m for name, m in model.named_modules() if isinstance(m, RECURRENT_TYPES)
    }
    if names is not None:
        missing = [n for n in names if n not in found]
        if missing:
            raise BadInput(
                f"no recurrent module named {missing[0]!r}; recurrent modules here: {', '.join(found) or 'none'}"
            )
        found = {n: found[n] for n in names}
    if not found:
        raise BadInput("the model has no nn.LSTM, nn.GRU, nn.LSTMCell or nn.GRUCell to trace")
    return found


def describe_modules(modules: Mapping[str, nn.Module]) -> dict[str, dict[str, Any]]:
    """Each module's kind, hidden and input size and layers, as the log's metadata ``modules`` holds them, and for
    an ``nn.LSTM``/``nn.GRU`` its ``dropout`` (the probability between its layers, as the module has it: with more
    than one layer, in training mode, the states of the layers above the first carry dropout masks no re-run draws
    again; the report names it where the provenance check fails above layer 0 alone). Cells have none."""
    out = {}
    for name, m in modules.items():
        size: Any = m.hidden_size
        inputs: Any = m.input_size
        out[name] = {
            "kind": type(m).__name__,
            "hidden_size": int(size),
            "num_layers": int(getattr(m, "num_layers", 1)),
            "input_size": int(inputs),
        }
        if isinstance(m, nn.RNNBase):
            out[name]["dropout"] = float(m.dropout)
    return out


LIBRARIES = {
    "stable_baselines3": "stable_baselines3",
    "sb3_contrib": "sb3_contrib",
    "gymnasium": "gymnasium",
    "ray": "ray",
    "rsl_rl": "rsl-rl-lib",
    "torchrl": "torchrl",
    "tensordict": "tensordict",
}
"""Libraries a run may train with (module -> distribution): the log's ``versions`` names those the run loaded."""


def numerics(modules: Mapping[str, nn.Module]) -> dict[str, Any]:
    """``cudnn_tf32``: True where a traced module's weights are on CUDA and cuDNN may compute in TF32
    (``torch.backends.cudnn.allow_tf32``, PyTorch's default): the report's provenance check then allows
    for TF32's rounding (``report/sections/staleness.py``). Nothing on a CPU, so CPU logs are unchanged."""
    on_cuda = any(p.is_cuda for m in modules.values() for p in m.parameters(recurse=False))
    if not on_cuda or not torch.backends.cudnn.enabled or not torch.backends.cudnn.allow_tf32:
        return {}
    return {"cudnn_tf32": True}


def base_metadata() -> dict[str, Any]:
    """The metadata every log starts with: schema and lstm-probe versions, library versions, start time."""
    from importlib.metadata import version

    versions = {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pyarrow": version("pyarrow"),  # not imported: with a writer process, training never loads it
        "python": platform.python_version(),
    }
    for module, dist in LIBRARIES.items():  # those the run loaded (importing one takes seconds, and says nothing)
        if module in sys.modules:
            try:
                versions[module] = version(dist)
            except Exception:  # a package without its distribution's metadata (a source checkout)
                versions[module] = str(getattr(sys.modules[module], "__version__", "unknown"))
    from lstm_probe import __version__

    return {
        "schema_version": SCHEMA_VERSION,
        "lstm_probe_version": __version__,
        "versions": versions,
        "start_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
    }


class Modes:
    """Whether dropout acted, the log's ``training_mode``: per traced module with dropout > 0 (nn.LSTM/nn.GRU apply
    it between their layers in training mode only), per phase, [calls made in training mode, calls]. Each call
    reads the module's ``training`` (a Python bool: no device sync). ``modules``: whose mode and dropout are read,
    by the names the log gives them (the traced modules; TorchRL's, the user's modules its traced shadows stand
    for). The tracer counts each call as it asks its tags (:meth:`resolving`); an integration whose calls reach
    the tracer later than they ran (TorchRL's replays) counts them itself, as they run (:meth:`count`). The counts
    ride the parts as the live records do (``metadata_keys.LIVE_KEYS``): published at each call of a new iteration,
    where they changed (:meth:`at`), so that a killed run's log keeps them up to its last part."""

    def __init__(self, modules: Mapping[str, nn.Module]):
        self.modules = {n: m for n, m in modules.items() if float(getattr(m, "dropout", 0.0) or 0.0) > 0}
        self.counts: dict[str, dict[str, list[int]]] = {n: {} for n in self.modules}
        self.live = Live("training_mode", lambda: self.metadata().get("training_mode"))
        self.iteration: Any = self  # the iteration of the last call (none yet: no iteration is the Modes itself)

    def __bool__(self) -> bool:
        return bool(self.modules)

    def count(self, name: str, phase: str, calls: int = 1) -> None:
        """``calls`` calls of module ``name`` in ``phase``, in the mode the module is in now."""
        module = self.modules.get(name)
        if module is not None:
            counts = self.counts[name].setdefault(phase, [0, 0])
            counts[0] += calls if module.training else 0
            counts[1] += calls

    def at(self, iteration: int | None, tracer: Any) -> None:
        """A call of ``iteration``: the first of a new one puts the counts so far, where they changed, in the
        progress of ``tracer``'s writer (``returns.Live``: every part from then on carries them)."""
        if iteration != self.iteration:
            self.iteration = iteration
            self.live.publish(tracer)

    def resolving(self, resolve: Resolver, tracer: Any) -> Resolver:
        """``resolve`` (an integration's), counting each call it answers under the phase of its tags (the counts
        before a new iteration's first call published first: :meth:`at`)."""

        def resolver(name: str, steps: int, batch: int) -> Tags:
            tags = resolve(name, steps, batch)
            self.at(tags.iteration, tracer)
            self.count(name, tags.phase)
            return tags

        return resolver

    def metadata(self) -> dict[str, Any]:
        """The log's ``training_mode`` entry; none where no module has dropout."""
        if not self.modules:
            return {}
        return {"training_mode": {n: {p: list(c) for p, c in by.items()} for n, by in self.counts.items()}}
