"""lstm-probe: see what the LSTMs inside a recurrent RL policy do during training."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from lstm_probe.errors import BadInput, BadLog, Interrupted, OutputError, ProbeError

if TYPE_CHECKING:  # the checker sees the real names; at run time __getattr__ imports each on first use
    from lstm_probe.deploy.export import export
    from lstm_probe.deploy.replay import replay
    from lstm_probe.integrations import rllib
    from lstm_probe.integrations.generic import Tracer, trace
    from lstm_probe.integrations.sb3.callback import ProbeCallback
    from lstm_probe.integrations.sb3.commands import arch, load_model
    from lstm_probe.integrations.sb3.options import Build
    from lstm_probe.integrations.sb3.run import run
    from lstm_probe.integrations.sb3.watch import watch
    from lstm_probe.log.budget import set_limit as set_max_memory
    from lstm_probe.log.paired import pair
    from lstm_probe.log.reader import LogInfo, load, read_info, states
    from lstm_probe.options import CaptureOptions, Measure, Placement, RunResult, TrainOptions
    from lstm_probe.report import summarize
    from lstm_probe.report.probes import probe

    __version__: str

# The public names, each with the module that defines it. Everything loads lazily: `import lstm_probe` for
# reading logs needs neither torch nor sb3, and a training process with a writer process never loads
# pyarrow (~29 MB of RSS). No public name is also a submodule's name (``lstm_probe.run`` is the function,
# whatever was imported before).
_LAZY: dict[str, tuple[str, str]] = {  # name: (module, its attribute; "" for the module itself)
    "LogInfo": ("lstm_probe.log.reader", "LogInfo"),
    "load": ("lstm_probe.log.reader", "load"),
    "pair": ("lstm_probe.log.paired", "pair"),
    "read_info": ("lstm_probe.log.reader", "read_info"),
    "states": ("lstm_probe.log.reader", "states"),
    "summarize": ("lstm_probe.report", "summarize"),
    "probe": ("lstm_probe.report.probes", "probe"),  # linear probes from a log (numpy only)
    "CaptureOptions": ("lstm_probe.options", "CaptureOptions"),
    "TrainOptions": ("lstm_probe.options", "TrainOptions"),
    "RunResult": ("lstm_probe.options", "RunResult"),
    "trace": ("lstm_probe.integrations.generic", "trace"),  # any torch loop, calls tagged by the user
    "Tracer": ("lstm_probe.integrations.generic", "Tracer"),
    "ProbeCallback": ("lstm_probe.integrations.sb3.callback", "ProbeCallback"),
    "run": ("lstm_probe.integrations.sb3.run", "run"),
    "Build": ("lstm_probe.integrations.sb3.options", "Build"),
    "Measure": ("lstm_probe.options", "Measure"),
    "Placement": ("lstm_probe.options", "Placement"),
    "arch": ("lstm_probe.integrations.sb3.commands", "arch"),
    "load_model": ("lstm_probe.integrations.sb3.commands", "load_model"),
    "watch": ("lstm_probe.integrations.sb3.watch", "watch"),  # the doctor over predict calls outside learn()
    "export": ("lstm_probe.deploy.export", "export"),  # ONNX / TorchScript with explicit state, verified
    "replay": ("lstm_probe.deploy.replay", "replay"),  # which deployment loop recorded a trace
    "set_max_memory": ("lstm_probe.log.budget", "set_limit"),  # the memory budget of reads (--max-memory)
    "rllib": ("lstm_probe.integrations.rllib", ""),  # the RLlib integration (its functions need the rllib extra)
}

__all__ = [
    "BadInput",
    "BadLog",
    "Build",
    "CaptureOptions",
    "Interrupted",
    "LogInfo",
    "Measure",
    "OutputError",
    "Placement",
    "ProbeCallback",
    "ProbeError",
    "RunResult",
    "Tracer",
    "TrainOptions",
    "__version__",
    "arch",
    "export",
    "load",
    "load_model",
    "pair",
    "probe",
    "read_info",
    "replay",
    "rllib",
    "run",
    "set_max_memory",
    "states",
    "summarize",
    "trace",
    "watch",
]  # tests/test_public.py: these and _LAZY agree


def __getattr__(name: str) -> object:
    if name == "__version__":
        # looked up on first use: importlib.metadata costs ~20-30 ms of every command's start-up otherwise
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("lstm-probe")
        except PackageNotFoundError:  # running from a source tree that was not installed
            found = "0+unknown"
        globals()["__version__"] = found  # looked up once
        return found
    if name not in _LAZY:
        raise AttributeError(f"module 'lstm_probe' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = importlib.import_module(module)  # a module ("rllib"), or the module that defines the name
    if attr:
        value = getattr(value, attr)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return __all__
