"""Capture settings in one object, checked once; and what a training run is asked and returns.

:class:`CaptureOptions` is what every entry point (``trace``, ``ProbeCallback``, ``run``, the RLlib
integration) passes down to the tracer and the writer. Its checks are the only place a bad capture
setting is refused, with the fix in the message. Imports neither torch nor pyarrow: the CLI checks its
options before it loads a framework.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lstm_probe.errors import BadInput

CAPTURES = ("full", "summary")
WRITERS = ("process", "thread")
DEFAULT_WRITER = "thread" if os.name == "nt" else "process"  # Windows pipes cannot be polled (select)
DEFAULT_OUT = "run.parquet"

Progress = Callable[[int, int], None]
"""Called with (env steps done, env steps asked) while a run trains."""


@dataclass(frozen=True)
class CaptureOptions:
    """Where the log goes and what it keeps. Checked when made (:class:`BadInput` names the fix)."""

    out: str | os.PathLike[str] = DEFAULT_OUT
    """A Parquet file, or a directory (ending in '/') for a dataset of part files."""
    capture: str = "full"
    """'full': h and c vectors; 'summary': norms and drift only."""
    every: int = 1
    """Keep full vectors every K-th iteration only."""
    float16: bool = False
    """Store vectors as float16."""
    force: bool = False
    """Overwrite an existing log."""
    part_seconds: float = 60.0
    """A finished part file is closed this often (a killed run loses at most that many seconds of rows)."""
    part_iterations: int | None = None
    """Directory logs: no part file holds rows of two spans of this many iterations."""
    writer: str = DEFAULT_WRITER
    """'process' (a writer process; the default where pipes can be polled) or 'thread'."""
    reference_window: int = 0
    """Env steps of rollout states kept per env, so train rows get drift against them (sb3: n_steps)."""

    def __post_init__(self) -> None:
        if self.capture not in CAPTURES:
            raise BadInput(f"--capture must be full or summary, got {self.capture!r}")
        for name, value, low in (("every", self.every, 1), ("part_iterations", self.part_iterations, 1)):
            if value is not None and value < low:
                raise BadInput(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
        if not self.part_seconds > 0:
            raise BadInput(f"--part-seconds must be > 0, got {self.part_seconds}")
        if self.writer not in WRITERS:
            raise BadInput(f"--writer must be one of {', '.join(WRITERS)}, not {self.writer!r}")
        if self.reference_window < 0:
            raise BadInput(f"reference_window must be >= 0, got {self.reference_window}")
        if self.part_iterations is not None and not self.directory:
            raise BadInput(
                "--part-iterations writes one set of part files per span of iterations: it needs a directory "
                f"--out, e.g. --out {Path(os.fspath(self.out)).with_suffix('')}/"
            )

    @property
    def directory(self) -> bool:
        """Whether ``out`` is a dataset directory (ends in '/' or is one) rather than one file."""
        out = os.fspath(self.out)
        return out.endswith(("/", os.sep)) or Path(out).is_dir()

    def settings(self) -> dict[str, Any]:
        """Every field but ``out``, as keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(CaptureOptions) if f.name != "out"}


def capture_options(options: CaptureOptions | None, out: str | os.PathLike[str] | None, **given: Any) -> CaptureOptions:
    """The options of a public entry point that takes both ``options=`` and the capture keyword arguments:
    ``options`` (with ``out`` when one is given), or the options the keywords spell. Setting both is refused."""
    if options is None:
        return CaptureOptions(DEFAULT_OUT if out is None else out, **given)
    defaults = {f.name: f.default for f in dataclasses.fields(CaptureOptions)}
    clash = [k for k, v in given.items() if v != defaults[k]]
    if clash:
        raise BadInput(
            f"{clash[0]}= and options= both set the capture settings: pass options=CaptureOptions(..., "
            f"{clash[0]}=...) alone, or the keyword arguments without options="
        )
    return options if out is None else dataclasses.replace(options, out=out)


# -- a training run (``lstm-probe run``): framework-neutral pieces ------------------------------------


@dataclass
class RunResult:
    """What ``run`` produced."""

    path: Path
    rows: int
    bytes: int
    completed: bool
    num_timesteps: int
    seconds: float


def validate(
    *,
    steps: int = 1,
    n_envs: int = 1,
    n_steps: int | None = None,
    batch_size: int | None = None,
    n_epochs: int | None = None,
    learning_rate: float | None = None,
    hidden_size: int | None = None,
    lstm_layers: int | None = None,
    torch_threads: int | None = None,
) -> None:
    """Check a run's numeric training options before anything is built."""
    checks: tuple[tuple[str, int | None, int], ...] = (
        ("steps", steps, 1),
        ("n_envs", n_envs, 1),
        ("n_steps", n_steps, 2),
        ("batch_size", batch_size, 2),
        ("n_epochs", n_epochs, 1),
        ("hidden_size", hidden_size, 1),
        ("lstm_layers", lstm_layers, 1),
        ("torch_threads", torch_threads, 1),
    )
    for name, value, low in checks:
        if value is not None and value < low:
            raise BadInput(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
    if learning_rate is not None and not learning_rate > 0:
        raise BadInput(f"--learning-rate must be > 0, got {learning_rate}")
