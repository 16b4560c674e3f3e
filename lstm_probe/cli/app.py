"""The ``lstm-probe`` command: parse, call the library function of the same name, render.

With cli_render.py (what it shows), the only module that prints; the only one that exits. One error
boundary (:func:`main`) turns every expected failure into one line on stderr and an exit code;
``--traceback`` re-raises instead.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import shlex
import signal
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer

from lstm_probe import integrations
from lstm_probe.cli import render
from lstm_probe.cli.argv import global_first, json_report, out_arg
from lstm_probe.cli.flags import NAME_HELP, arch_flags, html_only, run_flags, split, with_flags
from lstm_probe.cli.render import _ExportDisplay, _render, _render_architecture, _render_flow, _RunDisplay, err, out
from lstm_probe.cli.startup import pyarrow_without_pandas, reuse_freed_memory
from lstm_probe.cli.stops import interrupted, on_signal, stops
from lstm_probe.errors import BadInput, BadLog, Interrupted, ProbeError, one_line
from lstm_probe.extras import missing
from lstm_probe.log.layout import check_writable, fingerprint, output_dir
from lstm_probe.options import CaptureOptions, TrainOptions, check_envs, default
from lstm_probe.text import human_bytes, safe, strict_json

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # plain help: rich markup would eat bracketed text ('.[html]', '[default: ...]')
    rich_markup_mode=None,
    help="See what the LSTMs inside a recurrent RL policy do during training.",
)


def _default(text: str, default: str) -> str:
    """An option's help that names a default click does not show (None: the framework's own, off flags)."""
    return f"{text}  [default: {default}]"


def _version(value: bool) -> None:
    if value:
        from lstm_probe import __version__

        sys.stdout.write(f"lstm-probe {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help=_default("Print the version and exit.", "off")
        ),
    ] = False,
    max_memory: Annotated[
        str | None,
        typer.Option(
            help=_default(
                "Most memory a read of a log or model.zip may hold at once, e.g. 8G (also LSTM_PROBE_MAX_MEMORY); "
                "a read over it is refused with one line.",
                "2G",
            )
        ),
    ] = None,
) -> None:
    """See what the LSTMs inside a recurrent RL policy do during training."""
    if max_memory is not None:
        from lstm_probe.log import budget

        budget.set_limit(max_memory)


class Exit(enum.IntEnum):
    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    INTERRUPTED = 130


RUN_FLAGS = run_flags()


def run(
    ctx: typer.Context,
    env_id: Annotated[str, typer.Argument(metavar="ENV_ID", help="Gymnasium env id, e.g. Pendulum-v1 or CartPole-v1.")],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=_default("No progress display.", "off"))] = False,
    progress_seconds: Annotated[
        float,
        typer.Option(help="When stdout is not a terminal: print a progress line this often (seconds)."),
    ] = 10.0,
    framework: Annotated[
        str,
        typer.Option(help=integrations.help_text("run")),
    ] = "sb3",
    **flags: Any,
) -> None:
    """Train RecurrentPPO (or another framework's PPO: --framework) on ENV_ID with the probe; write the log."""
    fw = integrations.framework(framework)
    # the flags typed (even at their default value); typer's own click names the source kinds as click does
    typed = [n for n in flags if getattr(ctx.get_parameter_source(n), "name", "DEFAULT") != "DEFAULT"]
    given = split(RUN_FLAGS, flags, typed)
    groups = dict(integrations.group_classes(fw))
    for d in RUN_FLAGS:  # a flag of another framework's group, set: refused, naming the frameworks that take it
        if d.group in given and d.field.name in given[d.group] and d.group not in (CaptureOptions, TrainOptions):
            if d.field.name not in integrations.run_options(fw):
                owners = integrations.listed(integrations.owners(d.field.name))
                raise BadInput(f"{d.set_flag} applies to --framework {owners} only")
    chosen = {k: v for g, values in given.items() if g not in (CaptureOptions, TrainOptions) for k, v in values.items()}
    capture = given.get(CaptureOptions, {})
    out_path = capture.get("out", default(CaptureOptions, "out"))
    if fw.parts_per_process:  # a directory log: one set of part files per process
        if "out" not in capture:
            out_path = "run/"
        elif not out_path.endswith("/"):
            raise BadInput(
                f"--framework {fw.name} writes one part file per process: end --out with '/', e.g. {out_path}/"
            )
        capture["out"] = out_path
    # Every option that can be checked without torch or the framework is checked here, before either is
    # imported (seconds): a typo is refused at once.
    options = CaptureOptions(**capture)
    train = TrainOptions(**given.get(TrainOptions, {}))
    check_envs(options, train)
    own = {
        keyword: group(**{f.name: chosen[f.name] for f in dataclasses.fields(group) if f.name in chosen})
        for keyword, group in groups.items()
    }
    if not progress_seconds > 0:
        raise BadInput(f"--progress-seconds must be > 0, got {progress_seconds}")
    check_writable(output_dir(Path(out_path), is_dir=options.directory))  # not after the framework has loaded
    module = integrations.load(fw)
    _EARLIER[out_path] = fingerprint(out_path)  # what is at OUT now: an earlier log is not this run's
    command = "lstm-probe " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    display = _RunDisplay(env_id, train.steps, out_path, integrations.declared(fw.live), quiet, progress_seconds)
    dirs = f"the log in {out_path} holds the rows up to it"  # Ctrl-C / SIGTERM: the probe closed the log
    with interrupted(lambda: dirs if fw.parts_per_process else _partial_note(out_path)), display:
        result = module.run(env_id, options=options, train=train, command=command, progress=display.update, **own)
    shown = f"{result.path}/" if fw.parts_per_process else str(result.path)
    out().print(  # paths as written (never read as markup, never cut), control characters shown as codes
        f"wrote [bold]{safe(shown, limit=None)}[/]: {result.rows:,} rows, {human_bytes(result.bytes)}, "
        f"{result.num_timesteps:,} env steps in {result.seconds:.1f} s"
    )
    again = shlex.quote(out_path if fw.parts_per_process else str(result.path))
    out().print(f"next: lstm-probe report {safe(again, limit=None)}")
    if result.model is not None:  # the trained model, saved beside the log
        out().print(f"saved the trained model in [bold]{safe(result.model, limit=None)}[/]")
        if fw.deploy is not None and result.unexportable is not None:
            line = f"lstm-probe export would refuse it: {result.unexportable}"
            out().print(safe(line, limit=None, markup=False), highlight=False, markup=False, soft_wrap=True)
        elif fw.deploy is not None:
            model, env = shlex.quote(str(result.model)), shlex.quote(env_id)
            line = {
                "env": f"export it: lstm-probe export {model} policy.onnx --env {env}",
                "log": f"export it: lstm-probe export {model} policy.onnx --log {again}",
            }.get(
                str(result.verify),
                "export it: run again with --capture-obs (this env has no gymnasium id whose episodes export could "
                f"record), then lstm-probe export {model} policy.onnx --log LOG",
            )
            out().print(safe(line, limit=None, markup=False), highlight=False, markup=False, soft_wrap=True)


app.command()(with_flags(run, RUN_FLAGS))


def _framework_options(taken: tuple[str, ...], command: str, **options: tuple[str, Any, Any]) -> dict[str, Any]:
    """The options (name: (flag, value, default)) that only some frameworks take, as keyword arguments for
    the one that takes ``taken``; one set away from its default that this framework does not take is
    refused, naming the frameworks that do."""

    for name, (flag, value, unset) in options.items():
        if name not in taken and value != unset:
            raise BadInput(
                f"{flag} applies to --framework {integrations.listed(integrations.owners(name, command))} only"
            )
    return {name: value for name, (_, value, _) in options.items() if name in taken}


@app.command()
@stops("no report (report writes a page with --html only, and wrote none)")
def report(
    path: Annotated[
        str, typer.Argument(metavar="PATH", help="A log file, a dataset directory, or a killed run's log name.")
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help=_default("Print the report as JSON (stable keys).", "off"))
    ] = False,
    html_out: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help=_default(
                "Also write a self-contained visual report (needs matplotlib: the extra html, pip install '.[html]').",
                "none",
            ),
        ),
    ] = None,
    iteration: Annotated[
        int | None, typer.Option(help=_default("--html: the iteration to draw.", "the last trained"))
    ] = None,
    env: Annotated[
        int | None, typer.Option(help=_default("--html: the env whose states to draw.", "the first"))
    ] = None,
    episode: Annotated[
        int | None, typer.Option(help=_default("--html: the episode to draw.", "the longest of the iteration"))
    ] = None,
) -> None:
    """Explain, from a log, what the LSTMs did and what is wrong with them."""
    if not html_only(html_out, iteration=iteration, env=env, episode=episode):  # only the page needs pandas
        pyarrow_without_pandas()
    reuse_freed_memory()
    from lstm_probe.report import summarize

    if html_out is not None:  # a page that cannot be written is refused before the log is read
        from lstm_probe.report.html import check_out

        check_out(html_out)
    from lstm_probe.cli.render import ReadProgress

    with ReadProgress() as progress:
        rep = summarize(path, progress=progress)
    if html_out is not None:
        from lstm_probe.report.html import build_html

        page = build_html(path, html_out, iteration=iteration, env=env, episode=episode, report=rep)
        err().print(
            f"wrote {safe(page.path, limit=None)}: {len(page.figures)} figures, {human_bytes(page.bytes)} (iteration "
            f"{page.iteration}, env {page.env}, "
            + ("no episode numbers)" if page.episode is None else f"episode {page.episode})")
        )
    if as_json:
        sys.stdout.write(strict_json(rep.to_dict(), indent=2) + "\n")
        return
    _render(rep)


ARCH_FLAGS = arch_flags()


def arch(
    target: Annotated[
        str,
        typer.Argument(
            metavar="TARGET", help="A gymnasium env id (the policy `run` would build) or a saved model.zip."
        ),
    ],
    env_id: Annotated[
        str | None,
        typer.Option(
            "--env", help=_default("With a model.zip: env for a real rollout.", "none: a synthetic minibatch")
        ),
    ] = None,
    trust_model: Annotated[
        bool,
        typer.Option(
            "--trust-model",
            help=_default(
                "Load the model.zip with SB3's full load, which unpickles it and can run code stored in it "
                "(only for files whose author you trust; see docs/security.md).",
                "off",
            ),
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help=_default("Print the architecture as JSON.", "off"))] = False,
    dot: Annotated[Path | None, typer.Option(help=_default("Write Graphviz DOT source here.", "none"))] = None,
    svg: Annotated[
        Path | None, typer.Option(help=_default("Render an SVG here (needs Graphviz's `dot`).", "none"))
    ] = None,
    png: Annotated[
        Path | None, typer.Option(help=_default("Render a PNG here (needs Graphviz's `dot`).", "none"))
    ] = None,
    framework: Annotated[str, typer.Option(help=integrations.help_text("arch"))] = "sb3",
    **flags: Any,
) -> None:
    """Show what actor and critic share, and which loss trains which layer (measured gradient flow)."""
    fw = integrations.framework(framework, "arch")
    integrations.refuse_checkpoint(target)
    own = {
        "env_id": ("--env", env_id, None),
        "trust_model": ("--trust-model", trust_model, False),
        "dot": ("--dot", dot, None),
        "svg": ("--svg", svg, None),
        "png": ("--png", png, None),
    }
    shared = {"shared_lstm", "hidden_size"}  # every framework's arch takes these
    for d in ARCH_FLAGS:
        if d.field.name not in shared:
            own[d.field.name] = (d.set_flag, flags[d.field.name], d.parameter.default)
    given = _framework_options(fw.arch_options, "arch", **own)
    drawings = {fmt: given.pop(fmt, None) for fmt in ("dot", "svg", "png")}
    result = integrations.load(fw).arch(target, **{k: flags[k] for k in shared}, **given)
    if isinstance(result, dict):  # a gradient-flow record (RLlib's RLModule)
        _render_flow(target, result, as_json)
    else:
        _render_architecture(result, as_json, **drawings)


app.command()(
    stops("no analysis (a --dot, --svg or --png file not finished may be missing)")(with_flags(arch, ARCH_FLAGS))
)


@app.command()
def schema(
    markdown: Annotated[bool, typer.Option("--markdown", help=_default("Print docs/schema.md.", "off"))] = False,
) -> None:
    """Print the log's Arrow schema (the contract every log follows)."""
    render._render_schema(markdown)


@app.command()
@stops("no probes (probe writes no file)")
def probe(
    path: Annotated[
        str, typer.Argument(metavar="PATH", help="A log with h vectors: full capture, or --trace-envs K (envs 0..K-1).")
    ],
    target: Annotated[
        str,
        typer.Option(
            help="episode_step, env_step, obs:i or obs:KEY[i] (a log run with --capture-obs; KEY: a Dict "
            "observation's key) or info:KEY (--info KEY)."
        ),
    ] = "episode_step",
    lags: Annotated[str, typer.Option(help="Comma-separated lags L: the target at t - L in the same episode.")] = "0",
    iteration: Annotated[
        list[int] | None, typer.Option(help=_default("Iteration to probe (repeatable).", "up to 8, evenly spaced"))
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=_default("Print the rows as JSON.", "off"))] = False,
) -> None:
    """Linear probes: R² of a ridge regression from h (each module and layer) to a target, on held-out episodes."""
    from rich.table import Table

    try:
        lag_list = [int(x) for x in lags.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--lags takes comma-separated integers, e.g. 0,1,2,4, got {lags!r}") from None
    pyarrow_without_pandas()
    from lstm_probe.report.probes import probe_rows
    from lstm_probe.report.sections.probes import FEW

    # lstm_probe.probe's rows (its DataFrame less the target column) without pandas; r2 None: constant target, or
    # too_few held-out rows to score
    res = [
        {k: v for k, v in r.items() if k != "target"}
        for r in probe_rows(path, [target], lags=lag_list or [0], iterations=iteration)
    ]
    if as_json:
        sys.stdout.write(strict_json(res) + "\n")
        return
    table = Table(title=f"linear probes of {safe(target)} (R² on held-out episodes)")
    for col in ("iteration", "module", "layer", "lag", "R²", "fit / test rows"):
        table.add_column(col)
    for r in res:
        value = r["r2"]
        r2 = "-" if value is None else f"{float(value):.3f}" + ("*" if r.get("worse_than_mean") else "")
        r2 = FEW if r.get("too_few") else r2
        row = (str(r["iteration"]), safe(r["module"]), str(r["layer"]), str(r["lag"]), r2)
        table.add_row(*row, f"{r['n_fit']} / {r['n_test']}")
    out().print(table)
    if iteration is None:  # the default picks some iterations of a long log: say so
        from lstm_probe.log.reader import dataset
        from lstm_probe.report.probes import held_iterations

        held, probed = held_iterations(dataset(path)[0]), {r["iteration"] for r in res}
        if probed and len(held) > len(probed):
            out().print(
                f"{len(probed)} of the log's {len(held):,} iterations, spread over the run (first and last "
                "included); --iteration N (repeatable) probes others",
                highlight=False,
            )
    if any(r.get("worse_than_mean") for r in res):
        from lstm_probe.report.probes import BELOW_ZERO

        out().print(f"* {BELOW_ZERO}.", highlight=False)
    if any(r.get("too_few") for r in res):
        from lstm_probe.report.probes import TOO_FEW

        out().print(f"{FEW}: {TOO_FEW}.", highlight=False)


_TRUST = "Read a model.zip with SB3's full load (unpickles; see docs/security.md)."
_TRUST_REPLAY = "Read a model.zip with SB3's full load, a TorchScript .pt, a VecNormalize .pkl (unpickles)."


@app.command()
def export(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL", help="A saved model: sb3's model.zip, an RLlib, rsl_rl or TorchRL checkpoint (.pt)."
        ),
    ],
    out_path: Annotated[Path, typer.Argument(metavar="OUT", help="OUT.onnx (ONNX) or OUT.pt (TorchScript).")],
    log: Annotated[str | None, typer.Option(help="Verify on the episodes of this --capture-obs log.")] = None,
    env_id: Annotated[str | None, typer.Option("--env", help="Verify on fresh episodes of this env.")] = None,
    trace: Annotated[str | None, typer.Option(help="Verify on the episodes of a recorded run (replay's).")] = None,
    synthetic: Annotated[
        bool, typer.Option("--synthetic", help=_default("Verify on normal draws (the env is elsewhere).", "off"))
    ] = False,
    episodes: Annotated[int, typer.Option(help="Episodes to verify on.")] = 5,
    tolerance: Annotated[float, typer.Option(help="Relative tolerance on actions, values, h and c, in (0, 1).")] = 1e-5,
    trust_model: Annotated[bool, typer.Option("--trust-model", help=_default(_TRUST, "off"))] = False,
    force: Annotated[bool, typer.Option("--force", help=_default("Overwrite an existing OUT.", "off"))] = default(
        CaptureOptions, "force"
    ),
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help=_default("No progress display.", "off"))] = False,
) -> None:
    """Export a recurrent policy with explicit state (ONNX or TorchScript), verified before it is written."""
    from lstm_probe.deploy.export import export as run_export

    with _ExportDisplay(quiet, out_path) as display, interrupted(display.interrupted):
        r = run_export(
            model,
            out_path,
            log=log,
            env_id=env_id,
            trace=trace,
            synthetic=synthetic,
            episodes=episodes,
            tolerance=tolerance,
            trust_model=trust_model,
            force=force,
            progress=display.update,
        )
    _ExportDisplay.show(r)


@app.command()
def replay(
    trace: Annotated[
        str, typer.Argument(metavar="TRACE", help="A recorded run: Parquet or CSV (schema: docs/deploy.md).")
    ],
    policy: Annotated[
        str,
        typer.Option(
            help="The policy: OUT.onnx (ours, rsl_rl's, Isaac Lab's), OUT.pt, MODEL.zip, a .pt of rsl_rl/TorchRL/RLlib."
        ),
    ],
    vecnormalize: Annotated[
        str | None, typer.Option(help=_default("VecNormalize statistics (.npz, or .pkl with --trust-model).", "none"))
    ] = None,
    tolerance: Annotated[float, typer.Option(help="Relative tolerance on the recorded actions, in (0, 0.02).")] = 1e-4,
    trust_model: Annotated[bool, typer.Option("--trust-model", help=_default(_TRUST_REPLAY, "off"))] = False,
    as_json: Annotated[bool, typer.Option("--json", help=_default("Print the result as JSON.", "off"))] = False,
    name: Annotated[list[str] | None, typer.Option("--name", metavar="ROLE=NAME", help=NAME_HELP)] = None,
) -> None:
    """Which deployment loop recorded TRACE: correct, or which classic bug (state, reset, h/c, obs norm, float16)."""
    from lstm_probe.deploy.foreign import parse_names
    from lstm_probe.deploy.replay import replay as run_replay

    names = parse_names(name)
    with interrupted(lambda: "no verdict (replay writes no file)"):
        r = run_replay(
            trace, policy, vecnormalize=vecnormalize, trust_model=trust_model, tolerance=tolerance, names=names
        )
    render._render_replay(r, as_json)


def main(argv: list[str] | None = None) -> None:
    """Entry point: one error boundary for the whole CLI."""
    args = list(sys.argv[1:] if argv is None else argv)
    show_tb = "--traceback" in args
    args = global_first([a for a in args if a != "--traceback"]) or ["--help"]  # a bare `lstm-probe`: its help
    try:
        # Both stop training and close the log; SIGINT explicitly, since a shell's background job
        # inherits it ignored.
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    except ValueError:  # not the main thread
        pass
    try:
        with warnings.catch_warnings():  # restores the hook after (main called in-process)
            warnings.showwarning = _show_warning
            plain = json_report(args)
            if plain is not None:  # `report LOG --json`: the command itself, without typer's parsing
                limit, path = plain
                _root(max_memory=limit)
                code = report(path, as_json=True)
            else:
                code = app(args=args, prog_name="lstm-probe", standalone_mode=False)
        if isinstance(code, int) and code:
            raise SystemExit(code)
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        err().print("error: aborted")
        raise SystemExit(Exit.INTERRUPTED) from None
    except (Exception, KeyboardInterrupt) as exc:
        if show_tb:
            raise
        line, code = _one_line(exc, args)
        # exceptions carry file names, Arrow field names, hosts and values from files: the whole line is made
        # safe (no control characters, no markup, bounded) in one place
        err().print(safe(line, limit=ERROR_LIMIT, markup=False, word=PATH_MAX), markup=False)
        raise SystemExit(code) from None


_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
"""A terminal's colour sequence (SGR)."""


def _show_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """A warning as one line on stderr, ``warning: ...``, made safe like the error line (a stale lock's
    host and command come from a file): lstm-probe's own as their message, others' with their category;
    never Python's two lines with a file, a line number and a source line."""
    text = one_line(message if isinstance(message, Warning) else category(message), kind=False)
    text = _COLOUR.sub("", text)  # gymnasium colours its warnings: dropped, any other control shown as a code
    own = category.__module__.split(".")[0] == "lstm_probe"
    line = f"warning: {text}" if own else f"warning: {category.__name__}: {text}"
    err().print(safe(line, limit=ERROR_LIMIT, markup=False, word=PATH_MAX), markup=False)


ERROR_LIMIT, PATH_MAX = 16_384, 4096
"""An error line is cut at 16,384 characters, and a word in it at 4,096 (the longest path Linux takes):
paths in an error stay whole, enough to copy."""


def _one_line(exc: BaseException, args: list[str]) -> tuple[str, Exit]:
    """The one line and the exit code for an error that reached the boundary."""
    if isinstance(exc, typer.TyperException):  # usage errors: unknown option, bad type, missing argument
        name = getattr(getattr(exc, "ctx", None), "info_name", None)
        cmd = f"lstm-probe {name} --help" if name and name != "lstm-probe" else "lstm-probe --help"
        return f"error: {exc.format_message()} (see {cmd})", Exit.BAD_INPUT
    if isinstance(exc, BadInput | BadLog):
        return f"error: {exc}", Exit.BAD_INPUT
    if isinstance(exc, Interrupted):
        return str(exc), Exit.INTERRUPTED
    if isinstance(exc, ProbeError):  # OutputError and the rest
        return f"error: {exc}", Exit.FAILED
    if isinstance(exc, KeyboardInterrupt):
        return f"interrupted ({str(exc) or 'Ctrl-C'})", Exit.INTERRUPTED
    if isinstance(exc, ModuleNotFoundError) and (line := missing(exc.name, f"lstm-probe {args[0] if args else ''}")):
        return f"error: {line}", Exit.BAD_INPUT
    note = _partial_note(out_arg(args)) if args and args[0] == "run" else "rerun with --traceback for details"
    return f"error: {one_line(exc)} ({note})", Exit.FAILED


_EARLIER: dict[str, Any] = {}
"""``run``'s OUT, and what was there before it started (``layout.fingerprint``)."""


def _partial_note(path: str) -> str:
    """After a failed or interrupted run: what the log holds now. A log that was at OUT before the run
    started and is still there as it was (a --force run that failed before it wrote anything) is named as
    the earlier run's, never described as this run's."""
    if path in _EARLIER and _EARLIER[path] is not None and fingerprint(path) == _EARLIER[path]:
        return f"this run wrote no log; {Path(path)} is an earlier run's log, left as it was"
    try:
        from lstm_probe.log.reader import read_info

        info = read_info(path)
    except Exception:
        return "no log was written"
    steps = info.num_timesteps
    return (
        f"the log {Path(path)} holds {info.rows:,} rows up to env step {'?' if steps is None else steps} "
        f"(completed: {str(info.completed).lower()}); `lstm-probe report {path}` reads it"
    )


if __name__ == "__main__":
    main()
