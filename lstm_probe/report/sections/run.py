"""Section 1: the run (what trained, how far, what recording cost), from the log's metadata."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from lstm_probe.contract import Capabilities
from lstm_probe.log.schema import traced_envs
from lstm_probe.report.section import Block, Log, Panel, Section, env_runners, fmt
from lstm_probe.text import human_bytes, safe

SHOWN_HYPERPARAMETERS = (
    "n_steps",
    "num_steps_per_env",
    "rollout_fragment_length",
    "batch_size",
    "num_mini_batches",
    "train_batch_size_per_learner",
    "minibatch_size",
    "n_epochs",
    "num_learning_epochs",
    "num_epochs",
    "max_seq_len",
    "gradient_length",
    "learning_rate",
    "lr",
    "gamma",
    "gae_lambda",
    "lam",
    "lambda",
    "clip_range",
    "clip_param",
)
"""The hyperparameters the run box shows, where a log has them (each framework names its own)."""


@dataclass
class RunSection:
    """Section 1: the run."""

    env_id: str | None
    algorithm: str | None
    policy: str | None
    framework: str | None
    n_envs: int | None
    seed: Any
    hyperparameters: dict[str, Any]
    versions: dict[str, str]
    steps_asked: int | None
    steps_done: int | None
    iterations: int
    completed: bool
    stop_reason: str | None
    file_bytes: int
    files: int
    rows: int
    wall_seconds: float | None
    capture: dict[str, Any]
    command: str | None
    env_runners: int | None = None
    """RLlib: the env runners, where more than one: each stepped ``n_envs`` envs (the run stepped their product)."""
    probe_cost: dict[str, Any] | None = None
    """What recording cost while the run went (absent in older logs): ``calls``,
    ``hook_seconds`` and ``integration_seconds`` on the training thread, ``writer_cpu_seconds`` of
    the writer (process or thread), ``wait_seconds`` training waited for the writer; summed over processes."""
    steps_start: int | None = None
    """sb3: the model's steps when this learn() began, where it went on from a trained model
    (``reset_num_timesteps=False``); ``steps_asked`` and ``steps_done`` count from the model's first step."""


def cost_line(cost: dict[str, Any], wall: float | None, processes: bool) -> str:
    """One line on what recording cost, from the log's own measurements (``processes``: summed over the
    processes of a sharded run, where a share of one wall clock means nothing)."""
    main = float(cost.get("hook_seconds", 0)) + float(cost.get("integration_seconds", 0))
    wall = cost.get("seconds") or wall
    share = f" ({100 * main / wall:.1f}% of the traced {wall:.1f} s)" if wall and not processes else ""
    where = "the training processes" if processes else "the training thread"
    line = (
        f"probe cost: {main:.2f} s on {where} for {int(cost.get('calls', 0)):,} calls{share}, "
        f"{float(cost.get('writer_cpu_seconds', 0)):.2f} s CPU on the writer "
        f"{'thread' if cost.get('writer') == 'thread' else 'process'}"
    )
    wait = float(cost.get("wait_seconds", 0))
    if wait >= 0.01:
        line += f", training waited {wait:.2f} s for the writer"
    return line


class Run(Section[RunSection]):
    key = "run"
    findings_rank: ClassVar[int] = 100  # the run's own state closes the list

    def compute(self, log: Log, acc: Any) -> RunSection:
        meta, info = log.meta, log.info
        wall = None
        try:
            start, end = datetime.fromisoformat(meta["start_time"]), datetime.fromisoformat(meta["end_time"])
            wall = float((end - start).total_seconds())
        except (KeyError, ValueError, TypeError):
            pass
        progress = meta.get("progress") or {}
        return RunSection(
            env_id=meta.get("env_id"),
            algorithm=meta.get("algorithm"),
            policy=meta.get("policy"),
            framework=meta.get("framework"),
            n_envs=meta.get("n_envs"),
            seed=meta.get("seed"),
            hyperparameters=meta.get("hyperparameters") or {},
            versions=meta.get("versions") or {},
            steps_asked=meta.get("total_timesteps"),
            steps_done=meta.get("progress_num_timesteps", progress.get("num_timesteps")),
            iterations=log.iterations,
            completed=bool(meta.get("completed")),
            stop_reason=meta.get("stop_reason"),
            file_bytes=info.bytes,
            files=len(info.files),
            rows=info.rows,
            wall_seconds=wall,
            capture=meta.get("capture") or {},
            command=meta.get("command"),
            probe_cost=meta.get("probe_cost"),
            env_runners=env_runners(meta),
            steps_start=_count(meta.get("start_timesteps")) or None,
        )

    def warnings(self, data: RunSection, log: Log) -> list[str]:
        out = []
        n = _count(log.meta.get("unsupported_calls"))  # calls on inputs the tracer cannot lay out
        if n:
            out.append(f"{n:,} LSTM call(s) on inputs lstm-probe cannot map to rows are not in the log")
        n = _count(log.meta.get("empty_calls"))
        if n:
            out.append(
                f"{n:,} LSTM call(s) had no batch column (no rows): e.g. more minibatches than envs or sequences, "
                "so training ran on empty minibatches"
            )
        return out

    def findings(self, data: RunSection) -> list[str]:
        return [] if data.completed else [f"the run did not complete: {data.stop_reason or 'unknown reason'}"]

    def text(self, data: RunSection, caps: Capabilities) -> list[Block]:
        r = data
        lines = [
            f"env [bold]{fmt(r.env_id)}[/], {fmt(r.algorithm)}"
            + (f" / {fmt(r.policy)}" if r.policy is not None else "")
            + f", n_envs {envs_words(r)}, seed {fmt(r.seed)}",
            _steps(r) + f"{r.iterations} iteration{'s' * (r.iterations != 1)}, "
            f"{'completed' if r.completed else '[red]NOT completed[/]: ' + fmt(r.stop_reason)}",
            f"{r.rows:,} rows in {r.files} file(s), {human_bytes(r.file_bytes)}, wall {fmt(r.wall_seconds)} s, "
            f"capture {safe(r.capture.get('mode', '-'))} ({safe(r.capture.get('dtype', '-'))})"
            + _traced(r.capture, r.env_runners),
        ]
        if r.probe_cost:
            lines.append(safe(cost_line(r.probe_cost, r.wall_seconds, caps.shards)))
        hp = r.hyperparameters
        if hp:
            shown = ", ".join(f"{safe(k)}={fmt(hp.get(k))}" for k in SHOWN_HYPERPARAMETERS if k in hp)
            lines.append("hyperparameters: " + shown)
        if r.versions:
            lines.append("versions: " + ", ".join(f"{safe(k)} {safe(v)}" for k, v in r.versions.items()))
        return [Panel("Run", tuple(lines))]


def _num(v: Any) -> str:
    """A step count as the text says it: '24,576' (with thousands separators, as row counts are)."""
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else fmt(v)


def _steps(r: RunSection) -> str:
    """'steps 512 of 512 asked, ', or as much as the log records of them (an own loop's may record neither); a
    learn() that went on from a trained model: its own steps, and from which of the model's it went on."""
    start = r.steps_start
    if start is not None and isinstance(r.steps_done, int) and isinstance(r.steps_asked, int):
        return (
            f"steps {_num(r.steps_done - start)} of {_num(r.steps_asked - start)} asked, "
            f"going on from the model's step {_num(start)} "
            "(learn(reset_num_timesteps=False): the log's env_step and iterations count from there, "
            "and its first rollout states are those the earlier learn() left), "
        )
    if r.steps_asked is None:
        return "" if r.steps_done is None else f"steps {_num(r.steps_done)}, "
    return f"steps {_num(r.steps_done)} of {_num(r.steps_asked)} asked, "


def envs_words(r: RunSection) -> str:
    """The run's envs in words: '32', or '32 per env runner, 2 env runners' (RLlib, several runners)."""
    if r.env_runners and isinstance(r.n_envs, int):
        return f"{r.n_envs:,} per env runner, {r.env_runners} env runners"
    return fmt(r.n_envs)


def _traced(capture: dict[str, Any], runners: int | None = None) -> str:
    """Which envs' rows hold vectors, where ``--trace-envs`` chose some (of each env runner, where several)."""
    k = traced_envs(capture)
    if k is None:
        return ""
    each = " of each env runner" if runners else ""
    if capture.get("other_envs") == "none":
        return f", envs 0..{k - 1}{each} only (--trace-envs {k} --other-envs none: the other envs have no rows)"
    return f", vectors of envs 0..{k - 1}{each} only (--trace-envs {k}; the other envs' rows are summary rows)"


def _count(value: object) -> int:
    """A count from the log's metadata (a file may hold anything there): 0 unless a non-negative int."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
