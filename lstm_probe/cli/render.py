"""What the ``lstm-probe`` command shows: the run's and export's live progress displays and the rendering of reports and
architectures. Part of the CLI layer (with cli.py, the only modules that print): the library returns data,
these functions draw it.

rich is imported where something is drawn, and the two consoles are made on first use: ``report --json``,
``--help`` and ``--version`` never load it. Markup is ours alone: every string from a file (and every path)
is printed through :func:`lstm_probe.text.safe`, and the consoles do not highlight (rich's highlighter takes
time quadratic in a long word, and would style a file's text as if it meant something).
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from lstm_probe.text import human_bytes, safe, strict_json

if TYPE_CHECKING:
    from rich.console import Console


@cache
def out() -> Console:
    """The console on stdout (made on first use)."""
    from rich.console import Console

    return Console(highlight=False)


@cache
def err() -> Console:
    """The console on stderr (made on first use)."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True, highlight=False)


class _RunDisplay:
    """What `run` shows while it trains: a live line on a terminal (rich), else a plain line on stdout every
    ``every`` seconds; nothing with ``--quiet``. Env steps, steps/s, iteration, rows handed to the writer
    (``live()``: the framework's figures, where it has them), bytes on disk, elapsed time and ETA."""

    def __init__(
        self,
        env_id: str,
        total: int,
        out_path: str,
        live: Any,
        quiet: bool,
        every: float,
        console: Console | None = None,
    ):
        self.env_id, self.total, self.out_path, self.live = env_id, total, out_path, live
        self.quiet, self.every = quiet, every
        self.console = out() if console is None else console
        self.terminal = self.console.is_terminal
        self.start = 0.0
        self.due = 0.0
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> _RunDisplay:
        import time

        self.start = time.monotonic()
        self.due = self.start + (0.25 if self.terminal else self.every)
        if self.terminal and not self.quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("training {task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[line]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
                refresh_per_second=4,
            )
            self.bar.__enter__()
            self.task = self.bar.add_task(safe(self.env_id), total=self.total, line="")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def update(self, done: int, total: int) -> None:
        """The run's progress callback (every env step: cheap unless a refresh is due)."""
        import time

        if self.quiet:
            return
        now = time.monotonic()
        if now < self.due:
            return
        self.due = now + (0.25 if self.terminal else self.every)
        line = self.line(min(done, total), total, now - self.start)
        if self.bar is not None:
            self.bar.update(self.task, completed=min(done, total), line=line)
        else:
            self.console.print(
                f"training {safe(self.env_id)}: {min(done, total):,}/{total:,} env steps, {line}, "
                f"{_clock(now - self.start)} elapsed",
                soft_wrap=True,
            )

    def line(self, done: int, total: int, elapsed: float) -> str:
        """steps/s, iteration, rows, bytes and ETA."""
        rate = done / elapsed if elapsed > 0 else 0.0
        parts = [f"{rate:,.0f} steps/s"]
        live = self.live() if self.live is not None else {}
        if "iteration" in live:
            parts.append(f"iteration {live['iteration']}")
        if "rows" in live:
            parts.append(f"{live['rows']:,} rows")
        parts.append(f"{human_bytes(_bytes_on_disk(self.out_path))} on disk")
        if rate > 0:
            parts.append(f"ETA {_clock((total - done) / rate)}")
        return ", ".join(parts)


class _ExportDisplay:
    """What `export` shows while it works (``deploy.export.Progress``), on stdout as `run`'s display (stderr
    holds a refusal's one line alone): on a terminal a live line (rich) with the stage and its count, gone
    when export ends; else a line as each stage starts, and while verifying one every :attr:`EVERY` seconds;
    nothing with ``--quiet``."""

    EVERY = 10.0
    """Seconds between two lines while verifying, when stdout is not a terminal."""
    UNITS: ClassVar[dict[str, str]] = {"verifying": " steps"}
    """What a stage's count counts where its name does not say it: verifying, the episodes' steps (each one step
    of the file and one of the PyTorch policy: the steps export reports it verified on)."""

    def __init__(self, quiet: bool, out_path: Path | None = None, console: Console | None = None) -> None:
        from lstm_probe.log.layout import fingerprint

        self.quiet, self.every = quiet, self.EVERY
        self.out_path, self.before = out_path, None if out_path is None else fingerprint(out_path)
        self.console = out() if console is None else console
        self.terminal = self.console.is_terminal
        self.stage = ""
        self.start = self.due = 0.0
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> _ExportDisplay:
        import time

        self.start = time.monotonic()
        if self.terminal and not self.quiet:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("export: {task.description}"),
                BarColumn(),
                TextColumn("{task.fields[count]}"),  # the count as the plain lines write it
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
                refresh_per_second=4,
            )
            self.bar.__enter__()
            self.task = self.bar.add_task("", total=None, count="")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def update(self, stage: str, done: int, total: int) -> None:
        """Export's progress callback (every verified step: cheap unless the stage changes or a line is due)."""
        import time

        new = stage != self.stage
        self.stage = stage  # kept with --quiet too: an interruption's line names it
        if self.quiet:
            return
        now = time.monotonic()
        if not new and now < self.due:
            return
        self.due = now + (0.25 if self.terminal else self.every)
        count = f"{done:,}/{total:,}{self.UNITS.get(stage, '')}" if total > 1 else ""
        if self.bar is not None:
            self.bar.update(self.task, description=safe(stage), completed=done, total=total, count=count)
        else:
            count = f" {count}" if count else ""
            self.console.print(f"export: {safe(stage)}{count}, {_clock(now - self.start)} elapsed", soft_wrap=True)

    def interrupted(self) -> str:
        """What an interrupted export left at OUT, and in which stage: export renames the file there only once
        it is verified, so OUT is the earlier file (or none), or the whole verified file (a Ctrl-C just after)."""
        from lstm_probe.log.layout import fingerprint

        when = f" (stopped while {self.stage})" if self.stage else ""
        if self.out_path is None:
            return f"nothing was written{when}"
        if fingerprint(self.out_path) != self.before:
            return f"{self.out_path} was written and verified before it"
        if self.before is None:
            return f"{self.out_path} was not written{when}"
        return f"nothing was written, the {self.out_path} there before is left as it was{when}"

    @staticmethod
    def show(r: Any) -> None:
        """What `export` prints once the file is written (``deploy.export.Exported``): its inputs and outputs, where
        it was verified, the largest errors and the path."""
        for kind, rows in (("in ", r.spec.inputs()), ("out", r.spec.outputs())):
            for name, shape, dtype in rows:
                line = f"{kind} {name:<15} {dtype:<8} [{', '.join(map(str, shape))}]"
                out().print(line, highlight=False, markup=False)
        out().print(f"verified on {r.steps:,} steps of {safe(r.source)}, tolerance {r.tolerance:g}", soft_wrap=True)
        worst = ", ".join(f"{k} {v:.1e}" for k, v in r.errors.items())
        out().print(f"max relative error: {worst}", soft_wrap=True)
        out().print(
            f"wrote {safe(r.path, limit=None)} ({r.format}, {r.spec.variant}; names and shapes in its metadata)"
        )
        for note in r.notes:
            out().print(f"note: {safe(note, limit=None)}", highlight=False, soft_wrap=True)


def _render_replay(r: Any, as_json: bool) -> None:
    """What `replay` prints (``deploy.replay.Replay``): each loop's agreeing steps, the verdict with its loop's
    largest action difference beside the tolerance (:func:`_difference`), where the correct loop parts, notes."""
    if as_json:
        sys.stdout.write(strict_json(r.to_dict(), indent=2) + "\n")
        return
    for lp in r.loops:
        first = "" if lp.first_diff is None else f", first differs at env {lp.first_diff[0]} step {lp.first_diff[1]}"
        out().print(f"{lp.name:<34}{lp.agree:>6,} / {lp.steps:,} steps agree{first}", highlight=False, soft_wrap=True)
    same = f" (the same actions as: {', '.join(r.also)})" if r.also and r.verdict != "cannot tell" else ""
    out().print(f"verdict: {r.headline}{same}{_difference(r)}", highlight=False, soft_wrap=True)
    if r.parted is not None:
        out().print(f"the correct loop and the recording part at env {r.parted[0]} step {r.parted[1]}", highlight=False)
    for note in r.notes:
        out().print(f"note: {note}", highlight=False, soft_wrap=True)


def _difference(r: Any) -> str:
    """``; largest action difference 3.1e-07 of the action scale, 0.0031x the tolerance 1e-04``: for a verdict
    that is a loop agreeing at every step, that loop's; for ``float16``, the correct loop's (a float16 runtime
    parts from float32 by ~1e-3 of the action scale, float32 runtimes by ~1e-7, both may be within a loose
    tolerance); nothing for Discrete actions (equal or not) or a verdict naming no loop."""
    loops = {lp.name: lp for lp in r.loops}
    whose, lp = ("", loops.get(r.verdict)) if r.verdict != "float16" else ("the correct loop's ", r.loops[0])
    if lp is None or r.action == "discrete" or not math.isfinite(lp.max_error):
        return ""
    return (
        f"; {whose}largest action difference {lp.max_error:.1e} of the action scale, "
        f"{lp.max_error / r.tolerance:.2g}x the tolerance {r.tolerance:g}"
    )


def _render_schema(markdown: bool) -> None:
    """``lstm-probe schema``: docs/schema.md with ``--markdown``, else the log's columns as a table and its
    metadata keys."""
    from rich.table import Table

    from lstm_probe.log.metadata_keys import METADATA_KEYS
    from lstm_probe.log.schema import COLUMNS, SCHEMA_VERSION, schema_markdown

    if markdown:
        sys.stdout.write(schema_markdown())
        return
    table = Table(title=f"lstm-probe log schema v{SCHEMA_VERSION}", show_lines=False)
    for col in ("column", "type", "null", "meaning"):
        table.add_column(col, overflow="fold")
    for c in COLUMNS:
        table.add_row(c.name, "list<float32>[hidden]" if c.type is None else c.type, "yes" if c.nullable else "", c.doc)
    out().print(table)
    out().print("metadata keys (JSON under lstm_probe.run): " + ", ".join(METADATA_KEYS))


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


def _bytes_on_disk(out_path: str) -> int:
    """Bytes of a log being written: its part files (a directory log, or a file log's crash journal)."""
    from lstm_probe.log.layout import partial_dir

    path = Path(out_path)
    where = path if out_path.endswith("/") or path.is_dir() else partial_dir(path)
    try:
        return sum(f.stat().st_size for f in where.glob("*.parquet"))
    except OSError:
        return 0


def _render_flow(env_id: str, result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(strict_json(result, indent=2) + "\n")
        return
    from rich.table import Table

    t = Table(title=f"Gradient flow of RLlib PPO's LSTM RLModule on {safe(env_id)}: which output reaches each tensor")
    t.add_column("parameter", overflow="fold", min_width=24)
    t.add_column("shape")
    t.add_column("trained by")
    for name, by in (result.get("gradient_flow") or {}).items():
        t.add_row(safe(name), safe("x".join(map(str, result["shapes"].get(name, [])))), safe(by))
    out().print(t)
    out().print(f"[bold]verdict:[/] {safe(result.get('verdict') or result.get('batch'))}")


def _render_architecture(
    result: Any, as_json: bool, dot: Path | None = None, svg: Path | None = None, png: Path | None = None
) -> None:
    from rich.table import Table

    from lstm_probe.integrations.sb3.arch import render, to_dot

    source = to_dot(result)
    if dot is not None:
        dot.write_text(source)
    for path, fmt in ((svg, "svg"), (png, "png")):
        if path is not None:
            render(source, path, fmt)
    if as_json:
        sys.stdout.write(strict_json(result.to_dict(), indent=2) + "\n")
        return
    out().print(f"[bold]{safe(result.policy)}[/] ({safe(result.batch)})")
    out().print("actor path:  " + " -> ".join(["obs", *map(safe, result.actor_path), "action distribution"]))
    out().print("critic path: " + " -> ".join(["obs", *map(safe, result.critic_path), "value"]))
    out().print("shared (same module object on both paths): " + (", ".join(map(safe, result.shared)) or "nothing"))
    title = "Gradient flow: which loss reaches each parameter tensor"
    columns = ("parameter", "shape", "actor", "critic", "policy loss", "value loss", "entropy", "trained by")
    rows = [
        (
            safe(p.name),
            "x".join(map(str, p.shape)),
            "yes" if p.actor_path else "",
            "yes" if p.critic_path else "",
            safe(p.policy_loss),
            safe(p.value_loss),
            safe(p.entropy_loss),
            safe(p.trained_by),
        )
        for p in result.params
    ]
    t = Table(title=title)
    for col in columns:
        t.add_column(col, no_wrap=True)
    for row in rows:
        t.add_row(*row)
    # the table's natural width: each column's widest cell, plus its borders and padding
    natural = sum(max(len(str(r[i])) for r in [columns, *rows]) + 3 for i in range(len(columns))) + 1
    if natural <= out().width:
        out().print(t)
    else:  # too narrow for the table (a pipe, 80 columns): one line per parameter, wrapped, never cut
        out().print(title, soft_wrap=True)
        for row in rows:
            paths = " and ".join(c for c, v in zip(("actor", "critic"), row[2:4], strict=True) if v) or "no"
            losses = ", ".join(f"{c} {v}" for c, v in zip(columns[4:7], row[4:7], strict=True))
            out().print(
                f"  {row[0]} (shape {row[1]}): on the {paths} path; {losses}; trained by {row[7]}", soft_wrap=True
            )
    out().print(f"[bold]verdict:[/] {safe(result.verdict)}")


def _render(rep: Any) -> None:
    """Print every section the report holds, in order; each section's first titled block is numbered."""
    from rich.panel import Panel

    from lstm_probe.report import Line
    from lstm_probe.report import Panel as PanelText
    from lstm_probe.report import Table as TableText

    for w in rep.warnings:
        err().print(f"[yellow]warning:[/] {safe(w)}")
    number = 0
    for blocks in rep.text():
        numbered = False
        for block in blocks:
            if isinstance(block, Line):
                out().print(block.text, soft_wrap=block.soft_wrap)
                continue
            title = block.title
            if not numbered and getattr(block, "numbered", True):
                number += 1
                numbered = True
                title = f"{number}. {title}"
            if isinstance(block, PanelText):
                out().print(Panel("\n".join(block.lines), title=title, expand=False))
            elif isinstance(block, TableText):
                for renderable in _table(block, title, out().width):
                    out().print(renderable)


def _table(block: Any, title: str, width: int) -> list[Any]:
    """What prints a report table at ``width`` columns without cutting a number (or any word) short: rich's own
    layout shrinks the widest columns below their longest word and cuts it with an ellipsis ('1.36e-…' at 80
    columns). Here each column keeps at least its longest word: the widest columns wrap at spaces first (a cell
    'a / b' over two lines); where even the longest words do not fit, one wrapped line per row instead."""
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    cols = list(block.columns)  # titles, headers and cells are markup (strings from files in them made safe)
    plain = [[Text.from_markup(c).plain for c in row] for row in [tuple(cols), *block.rows]]
    natural = [max(cell_len(line) for row in plain for line in row[i].splitlines() or [""]) for i in range(len(cols))]
    least = [max([cell_len(w) for row in plain for w in row[i].split()] or [1]) for i in range(len(cols))]
    budget = width - (3 * len(cols) + 1)  # borders and a space of padding either side of each cell
    if sum(least) > budget:
        lines = ["  " + "; ".join(f"{c}: {v}" for c, v in zip(cols, row, strict=True)) for row in block.rows]
        return [Text.from_markup(f"[italic]{title}[/]"), *(Text.from_markup(x) for x in lines)]
    # narrow the widest column that may still wrap: first only as far as its header wraps (once per table), then
    # its cells too, never below the longest word
    cells = [
        max([cell_len(line) for row in plain[1:] for line in row[i].splitlines()] or [0]) for i in range(len(cols))
    ]
    header = [max([cell_len(w) for w in plain[0][i].split()] or [1]) for i in range(len(cols))]
    widths = [max(n, 1) for n in natural]
    for floor in ([max(c, h) for c, h in zip(cells, header, strict=True)], least):
        while sum(widths) > budget and any(w > f for w, f in zip(widths, floor, strict=True)):
            i = max((j for j in range(len(cols)) if widths[j] > floor[j]), key=lambda j: widths[j])
            widths[i] -= 1
    t = Table(title=title)
    for col, w in zip(cols, widths, strict=True):
        t.add_column(col, width=w, overflow="fold")
    for row in block.rows:
        t.add_row(*row)
    return [t]


class ReadProgress:
    """``report``'s progress line: once a read has taken :attr:`AFTER` seconds, one line on stderr, redrawn in
    place as ``summarize`` tells how far it is, and erased when it ends; drawn only where stderr is a terminal
    (never into a pipe or a file, so ``--json`` output and piped stderr stay clean)."""

    AFTER = 1.0
    EVERY = 0.2

    def __init__(self) -> None:
        self._clock = time.monotonic
        self._start = self._clock()
        self._drawn = 0.0
        self._shown = False
        self._rows = ""
        self._on = sys.stderr.isatty()

    def __call__(self, step: str, done: int, total: int) -> None:
        if not self._on:
            return
        if step == "rows":
            self._rows = f"{done:,} of {total:,} rows read ({100 * done // max(total, 1)}%)"
            text = self._rows
        else:
            text = f"{self._rows or 'rows read'}; section {step} ({done + 1} of {total})"
        now = self._clock()
        if now - self._start < self.AFTER or (self._shown and now - self._drawn < self.EVERY):
            return
        width = shutil.get_terminal_size().columns - 1
        line = f"report: {text}, {now - self._start:.0f} s"[:width]
        sys.stderr.write(f"\r{line}\x1b[K")
        sys.stderr.flush()
        self._drawn, self._shown = now, True

    def __enter__(self) -> ReadProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._shown:  # the line erased: what follows starts at the line's beginning
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
