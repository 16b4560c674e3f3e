"""Every option, declared once: its type, default, check and help.

:class:`CaptureOptions` (where the log goes and what it keeps) and :class:`TrainOptions` (what a training
run trains) are the two framework-neutral groups; a framework declares its own groups beside its
integration (``integrations/sb3/options.py``, ``integrations/rllib/options.py``) the same way. Entry
points take the objects; their keyword arguments are checked overrides of the same fields
(:func:`settle`); cli.py builds its flags from the fields' declarations (:func:`flag`). A log's writer
reads its settings from one :class:`WriterConfig`, made from the CaptureOptions when the log opens; every
check of the settings is here. Imports neither torch nor pyarrow: the CLI checks its options before it
loads a framework.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from lstm_probe.errors import BadInput

CAPTURES = ("full", "summary")
WRITERS = ("process", "thread")
OTHER_ENVS = ("summary", "none")
DEFAULT_WRITER = "thread" if os.name == "nt" else "process"  # Windows pipes cannot be polled (select)
DEFAULT_OUT = "run.parquet"

AUTO_WINDOW = -1
"""``reference_window``: as many env steps as the rollout between two training calls holds, and the step before
(the rollout states a training sequence starts from and drifts against); ``lstm_probe.trace()``'s default."""

MAX_PART_SECONDS = 7 * 24 * 3600.0
"""Longest wait between published parts: a week (what a killed run may lose at most; inf broke the writer)."""
MAX_ENVS = 1 << 16
"""Most envs ``run`` makes (``make_vec_env``: one Python env object each, stepped in turn). 1e7 took 41 s and
3.5 GB before failing with MemoryError; 65,536 CartPoles take 13 s and 0.2 GB to make."""

MAX_HIDDEN_SIZE = 1 << 16
"""Widest LSTM a run trains and a log's h and c vectors are read with (RL policies use 32..2048): a wider
run would write a log no reader takes."""
MAX_ROLLOUT = 1 << 22
"""Most env steps in one rollout (``--n-envs`` x ``--n-steps``, each framework's default rollout length where
``--n-steps`` is not given): 4,194,304, e.g. 1,024 envs x 4,096 steps or 65,536 x 64. Every step's LSTM
states are stored for training (sb3-contrib's buffer: h and c of actor and critic, 4 KiB a step at the
default hidden size 256), so 65,536 envs x sb3's 128 steps would need 34 GiB: refused before any env is
made (it made the 65,536 envs, then held 15 GB a minute later, still filling its buffer)."""
BYTES_PER_PARAMETER = 16
"""Bytes a trained float32 parameter holds at least: itself, its gradient and Adam's two moments."""

Progress = Callable[[int, int], None]
"""Called with (env steps done, env steps asked) while a run trains."""

T = TypeVar("T")


def option(
    default: Any,
    help: str,
    *,
    flags: tuple[str, ...] = (),
    shown: str | None = None,
    cli: Any = None,
    hidden: bool = False,
) -> Any:
    """A declared field: its ``default`` and ``help``, and how the CLI spells it: ``flags`` (default
    ``--field-name``; a bool gets ``--name`` alone when its default is False, ``--name/--no-name`` otherwise),
    ``shown`` (the default as the help says it, where the value itself says little), ``cli`` (the flag's
    type where it differs from the field's, e.g. ``list[str]`` for a tuple), ``hidden`` (no CLI flag)."""
    meta = {"help": help, "flags": flags, "shown": shown, "cli": cli, "hidden": hidden}
    return dataclasses.field(default=default, metadata=meta)


def at_least(name: str, value: float | None, low: float) -> None:
    """:class:`BadInput` naming the flag when ``value`` (not None) is below ``low``."""
    if value is not None and value < low:
        raise BadInput(f"--{name.replace('_', '-')} must be >= {low}, got {value}")


def default(cls: type, name: str) -> Any:
    """The declared default of ``cls``'s field ``name`` (for internal signatures that must not restate it)."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


@dataclass(frozen=True)
class CaptureOptions:
    """Where the log goes and what it keeps. Checked when made (:class:`BadInput` names the fix)."""

    out: str | os.PathLike[str] = option(
        DEFAULT_OUT,
        "Log file, or a directory (ending in /) for a dataset of part files.",
        flags=("--out", "-o"),
        cli=str,
    )
    capture: str = option("full", "full: h and c vectors; summary: norms and drift only.")
    every: int = option(1, "Keep full vectors every K-th iteration only.")
    float16: bool = option(False, "Store vectors as float16.")
    trace_envs: int | None = option(
        None,
        "Full vectors for env columns 0..K-1 only (their rollout rows and the training rows that come from "
        "them), whatever --capture says; every other row (padding included) is a summary row (norms and "
        "drift). For wide runs.",
        shown="all envs",
    )
    other_envs: str = option(
        "summary",
        "With --trace-envs: what the other env columns get. summary: summary rows; none: no rows at all, "
        "their states never leave the device (wide runs: the probe's cost then follows K, not the env count).",
    )
    force: bool = option(False, "Overwrite an existing log.")
    part_seconds: float = option(
        60.0,
        "Publish every row in a finished part file at most this many seconds after the writer took it (it reaches the "
        "writer within a quarter of that of its call): a killed run loses at most the rows of its last 1.25 x "
        "this-many seconds.",
    )
    part_iterations: int | None = option(
        None,
        "Dataset directories (--out DIR/): no part file holds rows of two spans of this many iterations "
        "(0..N-1, N..2N-1, ...), so a span's files can be moved or deleted together.",
        shown="none: one span",
    )
    writer: str = option(
        DEFAULT_WRITER,
        "process: rows are made and written by a writer process (training keeps its interpreter lock); "
        "thread: by a thread of the training process. Default: process (thread on Windows).",
    )
    writer_threads: int = option(
        0,
        "Threads that encode row groups in the writer process, each into a part file of its own, for every row "
        "group (0: a quarter of the CPUs this process may use, at most 4, for the row groups written while the "
        "writer is behind, in a writer process of a one-process single-file log; else 1).",
        hidden=True,
    )
    reference_window: int = option(
        0,
        "Env steps of rollout states kept per env, so train rows get drift against them (sb3: n_steps; "
        "lstm_probe.trace(): AUTO_WINDOW, the rollout's own length, unless given).",
        hidden=True,
    )

    def __post_init__(self) -> None:
        if self.capture not in CAPTURES:
            raise BadInput(f"--capture must be full or summary, got {self.capture!r}")
        at_least("every", self.every, 1)
        at_least("trace_envs", self.trace_envs, 1)
        if self.other_envs not in OTHER_ENVS:
            raise BadInput(f"--other-envs must be summary or none, not {self.other_envs!r}")
        if self.other_envs != "summary" and self.trace_envs is None:
            raise BadInput("--other-envs none needs --trace-envs K (the env columns that keep their rows)")
        at_least("part_iterations", self.part_iterations, 1)
        if not 0 < self.part_seconds <= MAX_PART_SECONDS:
            raise BadInput(f"--part-seconds must be > 0 and at most {MAX_PART_SECONDS:,.0f}, got {self.part_seconds}")
        if self.writer not in WRITERS:
            raise BadInput(f"--writer must be one of {', '.join(WRITERS)}, not {self.writer!r}")
        at_least("writer_threads", self.writer_threads, 0)
        if self.reference_window < AUTO_WINDOW:
            raise BadInput(
                f"reference_window must be >= 0 (or {AUTO_WINDOW}: the rollout's own length), "
                f"got {self.reference_window}"
            )
        check_directory(self.out, self.directory, self.part_iterations)

    @property
    def directory(self) -> bool:
        """Whether ``out`` is a dataset directory (ends in '/' or is one) rather than one file."""
        out = os.fspath(self.out)
        return out.endswith(("/", os.sep)) or Path(out).is_dir()

    def settings(self) -> dict[str, Any]:
        """Every field but ``out``, as keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(CaptureOptions) if f.name != "out"}

    def capture_metadata(self) -> dict[str, Any]:
        """The log's ``capture`` metadata entry (part of the log's contract: the reader and the report read
        its keys): the mode, every, the vectors' dtype, and trace_envs and other_envs where given."""
        return {
            "mode": self.capture,
            "every": self.every,
            "dtype": "float16" if self.float16 else "float32",
            **({} if self.trace_envs is None else {"trace_envs": self.trace_envs}),
            **({} if self.other_envs == "summary" else {"other_envs": self.other_envs}),
        }


def check_directory(
    out: str | os.PathLike[str], directory: bool, part_iterations: int | None, shard: str | None = None
) -> None:
    """:class:`BadInput` for what only a dataset directory ``out`` takes, given a file: ``part_iterations``
    (one set of part files per span of iterations), ``shard`` (one worker's part files; also refused when
    not a plain name)."""
    if part_iterations is not None and not directory:
        raise BadInput(
            "--part-iterations writes one set of part files per span of iterations: it needs a directory "
            f"--out, e.g. --out {Path(os.fspath(out)).with_suffix('')}/"
        )
    if shard is not None and (not re.fullmatch(r"[A-Za-z0-9_.]+", shard) or not directory):
        raise BadInput(
            f"shard {shard!r}: shards need a directory --out (ending in /) and a name of letters, digits, '_' or '.'"
        )


def encode_threads(given: int, writer: str, shard: str | None, directory: bool = False) -> int:
    """Threads that encode a log's row groups: ``given``, or (0) a quarter of the CPUs this process may use, at
    most 4, in a writer process of a one-process single-file log (a writer thread's would compete with training;
    the processes of a multi-process log, RLlib's, are many already; a directory log would get a part file per
    row group): a wide run's writer keeps up with a GPU (docs/performance.md), and a 2-core machine keeps one."""
    if given:
        return given
    if writer != "process" or shard is not None or directory:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cpus // 4))


@dataclass(frozen=True)
class WriterConfig:
    """What one log's writer needs, made once per log (:meth:`of`) from its :class:`CaptureOptions` and what
    the tracer knows (hidden size, modules, metadata). The writer thread's sink reads it, and the writer
    process's: plain data, pickled into the pipe's ``open`` message (``writer_process.py``), so that no
    value in it makes the writer process import torch."""

    out: str
    """The log's path; a dataset directory's ends in the path separator."""
    hidden_size: int
    modules: tuple[str, ...]
    metadata: dict[str, Any]
    """The log's metadata, as JSON sees it (plain types: ``torch.__version__``, a str subclass of torch's,
    would import torch into the writer process when unpickled)."""
    codes: dict[str, list[str]]
    """Each string column's values (``schema.CODES``)."""
    capture: str
    every: int
    float16: bool
    part_seconds: float
    part_rows: int
    part_iterations: int | None
    shard: str | None
    """This process's part-file name in a directory log written by several processes."""
    trace_envs: int | None
    """Full vectors for env columns below it only, whatever ``capture`` says (None: every row handed over may
    keep them; with ``--other-envs none`` the tracer hands over the kept columns alone)."""
    traced: bool
    """``--trace-envs`` was given (either ``--other-envs``): the traced columns keep their vectors whatever
    ``capture`` says, and padding rows are summary rows."""
    force: bool
    writer: str
    pid: int | None
    """The training process, in whose name a writer process that outlives it frees the output's lock once
    it has published its rows (None: no lock to free)."""
    encode_threads: int = 1
    """Threads that encode row groups (``log/parts.py``): :func:`encode_threads` of the options."""
    encode_always: bool = False
    """``writer_threads`` was given: the threads take every row group, not only those written while the writer
    is behind."""

    def __post_init__(self) -> None:
        check_directory(self.out, self.directory, self.part_iterations, self.shard)

    @classmethod
    def of(
        cls,
        options: CaptureOptions,
        hidden_size: int,
        modules: Sequence[str],
        metadata: Mapping[str, Any],
        codes: Mapping[str, Sequence[str]],
        *,
        part_rows: int,
        shard: str | None = None,
    ) -> WriterConfig:
        """The writer's configuration of a log written with ``options`` (checked: :class:`BadInput`)."""
        o = options
        out = os.fspath(o.out)
        if o.directory and not out.endswith(("/", os.sep)):
            out += os.sep
        return cls(
            out=out,
            hidden_size=hidden_size,
            modules=tuple(modules),
            metadata=json.loads(json.dumps(metadata, default=str)),
            codes={k: list(v) for k, v in codes.items()},
            capture=o.capture,
            every=o.every,
            float16=o.float16,
            part_seconds=o.part_seconds,
            part_rows=part_rows,
            part_iterations=o.part_iterations,
            shard=shard,
            trace_envs=o.trace_envs if o.other_envs == "summary" else None,
            traced=o.trace_envs is not None,
            force=o.force,
            writer=o.writer,
            pid=os.getpid(),
            encode_threads=encode_threads(o.writer_threads, o.writer, shard, o.directory),
            encode_always=o.writer_threads > 0,
        )

    @property
    def directory(self) -> bool:
        """Whether the log is a dataset directory of part files."""
        return self.out.endswith(("/", os.sep))

    @property
    def vectors(self) -> bool:
        """Whether any row may store its h and c vectors: a full log's, or the traced envs' rows (``trace_envs``:
        their vectors are kept whatever the capture mode says)."""
        return self.capture == "full" or self.traced

    @property
    def sparse_vectors(self) -> bool:
        """Whether few rows keep their vectors (``--trace-envs K --other-envs summary``: the other envs' rows are
        summary rows): the writer then buffers only the kept rows' vectors (``log/kept.py``), and its row groups
        hold up to 65,536 rows whatever the hidden size (``layout.row_capacity``)."""
        return self.vectors and self.trace_envs is not None


@dataclass(frozen=True)
class TrainOptions:
    """What a training run (``lstm-probe run``, ``lstm_probe.run``) trains, whatever the framework. None:
    the framework's own default."""

    steps: int = option(250, "Env steps to train (total_timesteps).")
    seed: int | None = option(0, "Seed for the algorithm and the envs.")
    n_envs: int = option(1, "Number of parallel envs.")
    n_steps: int | None = option(
        None, "Rollout length per env.", shown="the framework's: sb3, torchrl and rllib 128, rsl_rl 24"
    )
    batch_size: int | None = option(
        None,
        "Minibatch size.",
        shown="sb3 and rllib 128, rsl_rl a quarter of the rollout, torchrl the collector batch (no other)",
    )
    n_epochs: int | None = option(None, "Epochs per update.", shown="sb3 and rllib 10, rsl_rl 5, torchrl 4")
    learning_rate: float | None = option(None, "Learning rate.", shown="3e-4, rsl_rl 1e-3, rllib its own")
    hidden_size: int | None = option(None, "LSTM hidden size.", shown="sb3 and rllib 256, rsl_rl 64, torchrl 32")
    shared_lstm: bool = option(False, "One LSTM for actor and critic.")
    torch_threads: int | None = option(
        None,
        "torch.set_num_threads for training.",
        shown="sb3 on CPU: 1 (SB3's advice for small policies: faster on MLP-sized LSTMs, and reproducible), "
        "torch's own for image policies, GPUs and rllib",
    )

    def __post_init__(self) -> None:
        for name, low in (("steps", 1), ("n_envs", 1), ("n_steps", 2), ("batch_size", 2), ("n_epochs", 1)):
            at_least(name, getattr(self, name), low)
        if self.n_envs > MAX_ENVS:
            raise BadInput(
                f"--n-envs {self.n_envs}: at most {MAX_ENVS:,} gymnasium envs in one process (each is a Python "
                "object stepped in turn); for wider runs use a batched env (--framework rllib with --env-runners)"
            )
        at_least("hidden_size", self.hidden_size, 1)
        if self.hidden_size is not None and self.hidden_size > MAX_HIDDEN_SIZE:
            raise BadInput(
                f"--hidden-size {self.hidden_size}: at most {MAX_HIDDEN_SIZE:,} (no log reader takes wider h and c "
                "vectors; RL policies use 32..2048)"
            )
        if self.n_steps is not None:
            check_rollout(self.n_envs, self.n_steps, default=False)
        at_least("torch_threads", self.torch_threads, 1)
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise BadInput(f"--learning-rate must be > 0, got {self.learning_rate}")


def check_rollout(n_envs: int, n_steps: int, *, default: bool) -> None:
    """:class:`BadInput` when a rollout of ``n_envs`` x ``n_steps`` env steps is over :data:`MAX_ROLLOUT`
    (``default``: ``n_steps`` is the framework's own, not given)."""
    if n_envs * n_steps > MAX_ROLLOUT:
        steps = f"{n_steps:,} (this framework's default)" if default else f"{n_steps:,}"
        raise BadInput(
            f"--n-envs {n_envs:,} x --n-steps {steps} = {n_envs * n_steps:,} env steps in one rollout, over the "
            f"{MAX_ROLLOUT:,} a run stores (each step's LSTM states are kept for training); pass fewer --n-envs "
            "or a shorter --n-steps"
        )


def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the system does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def check_env_id(env_id: str) -> None:
    """Refuse an env id gymnasium does not know; ``module:EnvId-v0`` (as ``gym.make`` takes it) imports
    ``module`` first, which registers its envs."""
    import importlib

    import gymnasium as gym

    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise BadInput(f"env id {env_id!r}: cannot import {module!r} to register it ({exc})") from None
    try:
        gym.spec(name)
    except Exception:
        names = list(gym.registry.keys())
        close = difflib.get_close_matches(env_id, names, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "see gymnasium.registry for the ids"
        raise BadInput(f"unknown env id {env_id!r}: {hint}") from None


def check_size(train: TrainOptions, *, n_steps: int, hidden_size: int, layers: int = 1, lstms: int = 2) -> None:
    """Refuse (:class:`BadInput`, one line), before any env or network is built, a run whose rollout or
    network cannot fit: over :data:`MAX_ROLLOUT` env steps a rollout, or more memory than this machine has
    for a lower bound of what training holds: the ``lstms`` LSTMs' recurrent weights (``layers`` of
    ``hidden_size``; the input weights left out, as the observation is not known yet) times
    :data:`BYTES_PER_PARAMETER`, and the h and c of every rollout step. ``n_steps``, ``hidden_size`` and
    ``lstms``: the framework's own (its defaults where ``train`` leaves them None)."""
    check_rollout(train.n_envs, n_steps, default=train.n_steps is None)
    have = physical_memory()
    if have is None:
        return
    h = hidden_size
    weights = lstms * (2 * layers - 1) * 4 * h * h * BYTES_PER_PARAMETER
    states = train.n_envs * n_steps * lstms * layers * 2 * h * 4
    if weights + states > have:
        from lstm_probe.log.budget import words

        fix = "a smaller --hidden-size" if weights >= states else "fewer --n-envs or a shorter --n-steps"
        raise BadInput(
            f"--hidden-size {h:,} with {train.n_envs:,} env{'s' if train.n_envs > 1 else ''} x {n_steps:,} steps "
            "would need at least "
            f"{words(weights + states)} (LSTM weights with their gradients and Adam state {words(weights)}, the "
            f"rollout's LSTM states {words(states)}), more than this machine's {words(have)} of memory; pass {fix}"
        )


def check_env_count(n_envs: int, most: int, what: str) -> None:
    """:class:`BadInput` when a framework would make more than ``most`` envs of the kind ``what`` names
    (each framework declares how many of its envs can be made in seconds; :data:`MAX_ENVS` bounds them all)."""
    if n_envs > most:
        raise BadInput(f"--n-envs {n_envs:,}: at most {most:,} {what}")


def check_envs(options: CaptureOptions, train: TrainOptions) -> None:
    """The settings of the two groups that bound each other: ``--trace-envs K`` keeps env columns
    0..K-1, so K may not exceed ``--n-envs`` (the env columns of a process; RLlib: of each env runner)."""
    k = options.trace_envs
    if k is not None and k > train.n_envs:
        raise BadInput(
            f"--trace-envs {k} is more envs than the run has (--n-envs {train.n_envs}); pass --trace-envs "
            f"{train.n_envs} or fewer, or leave it out to trace every env"
        )


def settle(cls: type[T], given: T | None, overrides: Mapping[str, Any]) -> T:
    """``given`` (or ``cls``'s defaults) with ``overrides`` of its fields applied, checked again."""
    if given is None:
        return cls(**overrides)
    if not isinstance(given, cls):
        raise BadInput(f"expected {cls.__name__}(...), got {type(given).__name__}")
    return dataclasses.replace(given, **overrides) if overrides else given  # type: ignore[type-var]


def route(overrides: Mapping[str, Any], groups: Iterable[type], where: str, rest: bool = False) -> list[dict[str, Any]]:
    """Keyword overrides sorted into the groups that declare them (one dict per group, in order); a name no
    group declares is refused with the closest names, or with ``rest`` kept in one more dict, last (for a
    caller that hands them on)."""
    groups = list(groups)
    names = [{f.name for f in dataclasses.fields(g)} for g in groups]
    out: list[dict[str, Any]] = [{} for _ in range(len(groups) + rest)]
    for key, value in overrides.items():
        i = next((i for i, n in enumerate(names) if key in n), len(groups) if rest else None)
        if i is None:
            known = sorted(set().union(*names))
            close = difflib.get_close_matches(key, known, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else f"it takes {', '.join(known)}"
            raise BadInput(f"{where} has no option {key!r}: {hint}")
        out[i][key] = value
    return out


def capture_options(options: CaptureOptions | None, out: str | os.PathLike[str] | None, **given: Any) -> CaptureOptions:
    """The capture settings of a public entry point that takes ``options=`` and keyword overrides:
    ``options`` (or the defaults) with ``out`` (when given) and the keywords applied."""
    if out is not None:
        given["out"] = out
    return settle(CaptureOptions, options, route(given, [CaptureOptions], "the capture settings")[0])


def flag(f: dataclasses.Field[Any], hint: Any, prefix: str = "") -> tuple[Any, tuple[str, ...], str]:
    """How the CLI spells a declared field: (type, flag names, help). Used by cli.py alone."""
    meta = f.metadata
    name = "--" + f.name.replace("_", "-")
    flags = meta["flags"]
    if not flags and hint is bool:
        flags = (name,) if f.default is False else (f"{name}/--no-{name[2:]}",)
    help = prefix + meta["help"]
    if meta["shown"] is not None:
        help += f"  [default: {meta['shown']}]"
    elif hint is bool and f.default is False:
        help += "  [default: off]"
    return (meta["cli"] or hint), (flags or (name,)), help


# -- a training run's result ---------------------------------------------------------------------------


@dataclass
class RunResult:
    """What ``run`` produced, read from the finished log (:func:`lstm_probe.capture.life.train` makes it for every
    framework): where the log is, its rows and bytes, whether it says the run completed, the env steps done and
    the seconds training took, and where the trained model was saved (``lstm-probe export`` takes it)."""

    path: Path
    rows: int
    bytes: int
    completed: bool
    num_timesteps: int
    seconds: float
    model: Path | None = None
    """The trained model saved beside the log (``run.parquet`` -> ``run.model.zip`` for sb3, ``run.model.pt``
    for rsl_rl and TorchRL: ``deploy/saved.py``); None where the framework saves none."""
    verify: str | None = "env"
    """How ``lstm-probe export`` can verify that model: 'env' (fresh episodes of the run's env id, ``--env``),
    'log' (the log's own observations, ``--log``: a ``--capture-obs`` run on an env without a gymnasium id, such
    as rsl_rl's ``--torch-env``), None (neither: such a run without ``--capture-obs``)."""
    unexportable: str | None = None
    """Why ``lstm-probe export`` refuses that model (sb3: a Dict observation space, squashed gSDE actions), in
    export's own words; None where it takes it."""


@dataclass(frozen=True)
class Placement:
    """Where a training run (``lstm-probe run``) trains: one declaration that each framework whose ``run`` places
    its policy takes (sb3's model, rsl_rl's runner and env: ``--framework F --device D``); checked before anything
    is built (``integrations/devices.py``)."""

    device: str = option("auto", "Torch device: auto (CUDA where torch sees one), cpu, cuda, cuda:1...")


@dataclass(frozen=True)
class Measure:
    """What the probe measures beyond the states, on a copy of the policy (``ProbeCallback``'s, ``rsl_rl.attach``'s and
    ``torchrl.attach``'s keyword arguments of these names): each framework that provides the capability takes it
    (``lstm-probe run --framework F --what-if``); one that does not refuses it in one line."""

    what_if: bool = option(
        False,
        "Do stale stored states matter? Re-evaluate sampled minibatches from refreshed, zero and burn-in initial "
        "states on a copy of the policy (the report's 'What if' section).",
    )
    what_if_every: int = option(1, "--what-if: measure every K-th iteration.")
    burn_in: tuple[int, ...] = option(
        (), "--what-if: another burn-in length to measure (repeatable).", shown="4, 16, 64", cli=list[int] | None
    )
    memory: bool = option(
        False,
        "Does the policy use its LSTM, and how far back? Zero the state k steps back at sampled steps on a copy "
        "of the policy (the report's 'Memory' section).",
    )
    memory_every: int | None = option(None, "--memory: measure every K-th iteration.", shown="1")
    capture_obs: bool = option(False, "Store the observation the policy saw in rollout rows (probe targets obs:i).")
    info_keys: tuple[str, ...] = option(
        (),
        "Store info[KEY] of each step in rollout rows (probe target info:KEY; repeatable).",
        flags=("--info",),
        shown="none",
        cli=list[str] | None,
    )

    def __post_init__(self) -> None:
        # lists (the CLI's, a user's) kept as tuples: the object is frozen and hashable
        keys = (self.info_keys,) if isinstance(self.info_keys, str) else self.info_keys
        object.__setattr__(self, "burn_in", tuple(sorted({int(k) for k in self.burn_in or ()})))
        object.__setattr__(self, "info_keys", tuple(str(k) for k in keys or ()))
        for name in ("what_if_every", "memory_every"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise BadInput(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        if any(k < 1 for k in self.burn_in):
            raise BadInput(f"--burn-in lengths must be >= 1, got {list(self.burn_in)}")
        if not self.what_if and (self.what_if_every != 1 or self.burn_in):
            raise BadInput("--what-if-every and --burn-in need --what-if (ProbeCallback(what_if=True))")
        if not self.memory and self.memory_every is not None:
            raise BadInput("--memory-every needs --memory (ProbeCallback(memory=True))")
        if len(set(self.info_keys)) != len(self.info_keys):
            raise BadInput(f"info keys repeat: {list(self.info_keys)}")
