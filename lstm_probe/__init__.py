"""lstm-probe: see what the LSTMs inside a recurrent RL policy do during training."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lstm_probe.errors import BadInput, BadLog, Interrupted, OutputError, ProbeError

if TYPE_CHECKING:  # the checker sees the real names; at run time __getattr__ imports each on first use
    from lstm_probe.integrations.generic import Tracer, trace
    from lstm_probe.integrations.sb3 import ProbeCallback
    from lstm_probe.integrations.sb3_run import run
    from lstm_probe.integrations.sb3_watch import watch
    from lstm_probe.options import CaptureOptions
    from lstm_probe.probes import probe
    from lstm_probe.reader import LogInfo, load, pair, read_info, states
    from lstm_probe.report import summarize

    __version__: str

__all__ = [
    "BadInput",
    "BadLog",
    "CaptureOptions",
    "Interrupted",
    "LogInfo",
    "OutputError",
    "ProbeCallback",
    "ProbeError",
    "Tracer",
    "__version__",
    "load",
    "pair",
    "probe",
    "read_info",
    "run",
    "states",
    "summarize",
    "trace",
    "watch",
]


def __getattr__(name: str) -> object:
    # Everything loads lazily: `import lstm_probe` for reading logs needs neither torch nor sb3, and a
    # training process with a writer process never loads pyarrow (~29 MB of RSS). Even the version is
    # looked up on first use: importlib.metadata costs ~20-30 ms of every command's start-up otherwise.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("lstm-probe")
        except PackageNotFoundError:  # running from a source tree that was not installed
            found = "0+unknown"
        globals()["__version__"] = found  # looked up once
        return found
    if name in ("LogInfo", "load", "pair", "read_info", "states"):
        from lstm_probe import reader

        return getattr(reader, name)
    if name == "ProbeCallback":
        from lstm_probe.integrations.sb3 import ProbeCallback

        return ProbeCallback
    if name in ("trace", "Tracer"):  # the generic torch integration: calls tagged by the user
        from lstm_probe.integrations import generic

        return getattr(generic, name)
    if name == "CaptureOptions":
        from lstm_probe.options import CaptureOptions

        return CaptureOptions
    if name == "watch":  # the doctor over an sb3 model's predict calls outside learn()
        from lstm_probe.integrations.sb3_watch import watch

        return watch
    if name == "run":
        from lstm_probe.integrations.sb3_run import run

        return run
    if name == "rllib":  # `from lstm_probe import rllib`: the RLlib integration (needs the rllib extra)
        from lstm_probe.integrations import rllib

        return rllib
    if name == "probe":  # linear probes from a log (numpy only)
        from lstm_probe.probes import probe

        return probe
    if name == "summarize":
        from lstm_probe.report import summarize

        return summarize
    raise AttributeError(f"module 'lstm_probe' has no attribute {name!r}")
