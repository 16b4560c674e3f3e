"""``lstm-probe report --html``: one self-contained page with the pictures people read states with.

matplotlib draws static PNGs that are inlined as base64: the file opens anywhere with no network and
no scripts, and stays small (heat-maps are downsampled, the layout drawing is capped; the page says
what was sampled). matplotlib is an optional extra: ``pip install 'lstm-probe[html]'``.

The figures drawn from the report are in ``html_figures.py``; this module builds the page and does the
bounded reads the heat-maps and the minibatch layout need.
"""

from __future__ import annotations

import contextlib
import html
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from lstm_probe.contract import Capabilities
from lstm_probe.errors import BadInput, BadLog
from lstm_probe.log import budget
from lstm_probe.log.reader import dataset, narrow, states
from lstm_probe.log.schema import stores_vectors, summary_capture, traced_envs
from lstm_probe.report import Line, Panel, Report, Table, summarize
from lstm_probe.report.html_figures import (
    _label,
    _layout_figure,
    _lengths_figure,
    _norms_figure,
    _plt,
    _png,
    _reasons,
    _returns_figure,
    _staleness_figure,
    _staleness_trend_figure,
    _what_if_figure,
)
from lstm_probe.report.section import fmt_steps
from lstm_probe.report.sections.cross_process import kinds
from lstm_probe.report.sections.run import envs_words
from lstm_probe.report.sections.staleness_trend import POINTS
from lstm_probe.text import plain

MAX_HEAT_STEPS = 400
MAX_HEAT_UNITS = 128
MAX_HEAT_EPISODE_STEPS = 10_000  # a longer episode's heat-map shows its first steps (the page says so)
ROLLOUT = ds.field("phase") == "rollout"
STARTS = (ds.field("phase") == "train") & (ds.field("t") == 0)  # one row per training sequence
NO_VECTORS = "heat-maps: the log holds no state vectors for that episode (summary capture)"
START_COLUMNS = [
    "module",
    "iteration",
    "epoch",
    "minibatch",
    "seq",
    "seq_len",
    "seq_reason",
    "env",
    "env_step",
    "episode",
]
"""The columns of the training sequences' first rows that the minibatch layout drawing reads (one read per
drawn iteration): a deliberate subset, kept by hand (docs/architecture.md's column recipe)."""


@dataclass
class Page:
    """What ``build_html`` wrote: the figures it drew and the choices it made."""

    path: str
    bytes: int
    figures: list[str]
    iteration: int | None
    env: int | None
    episode: int | None
    notes: list[str] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)
    """The layout drawing's legend: why a sequence starts where it does (those the log's capabilities allow)."""


def build_html(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    iteration: int | None = None,
    env: int | None = None,
    episode: int | None = None,
    report: Report | None = None,
) -> Page:
    """Write the visual report of the log at ``path`` to ``out``; defaults show a typical episode of the
    last iteration. Pass the ``report`` of ``summarize(path)`` when you have it, to read the log once less.
    Raises BadInput (one line, with the fix) for an ``out`` whose directory does not exist and for an
    iteration, env or episode the log does not hold."""
    check_out(out)
    plt = _plt()
    rep = report if report is not None else summarize(path)
    data, info = dataset(path)
    # Reads stay bounded whatever the run's length: scans keep distinct values (iterations, envs, episodes)
    # or per-length counts, and rows are read only for the drawn iteration and the drawn episode.
    # Staleness and norms come from the report's aggregates.
    first = ds.field("layer") == 0
    caps = rep.capabilities
    worker: int | None = None
    if caps.shards and "worker" in data.schema.names:  # one env runner's envs are drawn (the lowest index)
        workers = _distinct(data, ["worker"], first & ROLLOUT)["worker"]
        if workers:
            worker = workers[0]
            first = first & (ds.field("worker") == worker)
    seen = _distinct(data, ["iteration", "env"], first & ROLLOUT)
    notes: list[str] = []
    if worker is not None:
        notes.append(f"one writer per process: the envs of env runner {worker} are drawn")
    iters = seen["iteration"]
    if iteration is None and iters:
        trained = _distinct(data, ["iteration"], first & STARTS)["iteration"]
        iteration = trained[-1] if trained else iters[-1]
    elif iteration is not None and iteration not in iters:
        held = f"iterations {iters[0]}..{iters[-1]}" if iters else "no rollout rows"
        raise BadInput(f"--iteration {iteration} is not in the log; it holds {held} (drop --iteration for the last)")
    if env is None and seen["env"]:
        env = seen["env"][0]
    elif env is not None and env not in seen["env"]:
        held = ", ".join(map(str, seen["env"][:20])) + (", ..." if len(seen["env"]) > 20 else "")
        raise BadInput(f"--env {env} is not in the log; it holds envs {held or 'none'} (drop --env for the first)")
    episode, span = _pick_episode(data, first, env, episode, iteration)
    starts = (
        _read(
            narrow(data, iteration=(iteration, iteration)),
            START_COLUMNS,
            first & STARTS & (ds.field("iteration") == iteration),
        )
        if iteration is not None
        else pd.DataFrame(columns=START_COLUMNS)
    )
    figures: list[tuple[str, str, str]] = []
    layout = _layout_figure(plt, starts, iteration, notes, caps)
    drawn = set(starts["seq_reason"].dropna().astype(str)) if "seq_reason" in starts else set()
    markers = [label for _, label in _reasons(caps, drawn).values()] if layout else []
    if layout:
        figures.append(
            (
                "Minibatch layout",
                layout,
                "Each epoch's minibatches as their sequences on the (env, env "
                "step) axis, coloured by episode; the marker says why each sequence starts there.",
            )
        )
    meta = info.metadata
    traced = traced_envs(meta.get("capture"))
    heat = _heat_figure(
        plt, data, first, env, episode, span, notes, stores_vectors(meta), summary_capture(meta), traced, caps
    )
    if heat:
        figures.append(
            (
                "Hidden and cell states"
                if any(r["c_norm_max"] is not None for r in rep.health.layers)
                else "Hidden states",
                heat,
                f"Units x time, env {env}, episode {episode}, rollout phase; dashed lines: episode start; dotted: "
                + (
                    "where epoch 0's training sequences start (later epochs cut the same rollout elsewhere)."
                    if caps.epochs
                    else "where training sequences start."
                ),
            )
        )
    returns = _returns_figure(plt, rep)
    if returns:
        figures.append(("Episode returns", returns, "The episodes each iteration ended: mean return, min-max band."))
    stale = _staleness_figure(plt, rep)
    if stale:
        figures.append(("Staleness", stale, _staleness_caption(rep)))
    trend = _staleness_trend_figure(plt, rep)
    if trend:
        figures.append(("Staleness over iterations", trend, _trend_caption(rep)))
    hist = _lengths_figure(plt, rep, _length_counts(data, first & STARTS))
    if hist:
        figures.append(("Sequence lengths vs episode lengths", hist, _lengths_caption(rep)))
    norms = _norms_figure(plt, rep)
    if norms:
        figures.append(("Norms over iterations", norms, "Mean rollout-state norms per module and layer."))
    what_if = _what_if_figure(plt, rep)
    if what_if:
        figures.append(("What if: other initial states", what_if, "Against refreshed states, by epoch."))
    page = _page(rep, figures, notes)
    _write(out, page)
    return Page(str(out), len(page.encode()), [t for t, _, _ in figures], iteration, env, episode, notes, markers)


def _write(out: str | os.PathLike[str], page: str) -> None:
    """The page written under a temporary name beside ``out``, then renamed onto it: a Ctrl-C or a full disk
    leaves the file there before (or none), never half a page. Readable as any file the user writes."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(out)), prefix=".lstm-probe.", suffix=".html")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if hasattr(os, "fchmod"):  # mkstemp makes it owner-only
                mask = os.umask(0)
                os.umask(mask)
                os.fchmod(f.fileno(), 0o666 & ~mask)
            f.write(page)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _lengths_caption(rep: Report) -> str:
    """The sequence lengths figure's caption: the lengths are the truncated-BPTT horizon unless a per-step loop
    resets the state at episode starts inside the sequences (the section's ``cut_by_resets``): then shorter."""
    s = rep.sequences
    if not s.starts_inside or s.cut_by_resets is False or not s.gradient_length:
        return "The truncated-BPTT horizon next to the episodes it cuts."
    return (
        f"Training sequence lengths next to the episode lengths. The state is reset at the {s.starts_inside:,} "
        f"episode starts inside the sequences, which cuts the gradient there: gradients flow back at most "
        f"{fmt_steps(s.gradient_length['max'])} steps (median {fmt_steps(s.gradient_length['median'])}; dotted line)."
    )


def _staleness_caption(rep: Report) -> str:
    """What the staleness figure draws: h, and c where the figure has a c line (dashed); train states against
    the rollout states of the same env step by epoch and position (drift columns), or, for logs of one writer
    per process (RLlib), the learner's states against the env runners' by minibatch of the update."""
    cross = rep.sections.get("cross_process")
    note = rep.staleness.drift_from if rep.staleness.by_epoch else None  # only some envs' minibatches: which
    if rep.staleness.by_epoch:
        rows, by = rep.staleness.by_epoch, "by epoch (h solid{c}) and by position in the sequence (h)"
        whose = "train states from the rollout states"
    else:
        rows = cross.by_minibatch if cross is not None else []
        by = "by minibatch of the update (h solid{c}; minibatch 0: before any optimizer step)"
        whose = "the learner's states from the env runners' rollout states"
        how = kinds(sum(int(r.get("l2_rows", r["rows"])) for r in rows), sum(int(r["rows"]) for r in rows))
        note = note or (f"the drifts: {how}" if how else None)
    with_c = any(r.get("drift_c_mean") is not None and r["drift_c_mean"] == r["drift_c_mean"] for r in rows)
    formula = (
        "||s_train - s_rollout|| / ||s_rollout|| (s = h, c)" if with_c else "||h_train - h_rollout|| / ||h_rollout||"
    )
    return (
        f"Relative L2 drift {formula} of {whose} of the same env step, {by.format(c=', c dashed' if with_c else '')} "
        "(log scale: a drift of 0.001 next to 0.4 stays visible)." + (f" {note[0].upper()}{note[1:]}." if note else "")
    )


def _trend_caption(rep: Report) -> str:
    """What the staleness trend figure draws: each iteration's last-epoch drift (last-minibatch: the cross-process
    check's), or spans of iterations' where the run has more than the JSON keeps, and whether a c line is drawn
    (dashed)."""
    rows = rep.staleness.by_iteration
    spans = any(r["iteration_last"] > r["iteration_first"] for r in rows)
    with_c = any(r["drift_c_mean"] is not None and r["drift_c_mean"] == r["drift_c_mean"] for r in rows)
    of = (
        f"in spans of iterations (the run has more than {POINTS} with a drift: each span drawn at its middle)"
        if spans
        else "by iteration"
    )
    if any("minibatch" in r for r in rows):  # the cross-process check's (``cycling_minibatches``)
        return (
            f"Mean relative L2 drift of the learner's states from the env runners' rollout states of the same env "
            f"step in each iteration's last minibatch, {of} (h solid{', c dashed' if with_c else ''}; log scale): "
            "whether stored states go staler as training goes on, which the figure by minibatch averages over."
        )
    return (
        f"Mean relative L2 drift of train states from the rollout states of the same env step in each iteration's "
        f"last epoch, {of} (h solid{', c dashed' if with_c else ''}; log scale): whether stored states go staler as "
        "training goes on, which the figure by epoch averages over."
    )


def check_out(out: str | os.PathLike[str]) -> None:
    """BadInput unless ``out`` can be created: its directory exists and it is not a directory itself."""
    target = os.path.abspath(os.fspath(out))
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        raise BadInput(
            f"cannot write --html {plain(out)}: the directory {plain(parent)} does not exist (create it: mkdir -p "
            f"{plain(parent)})"
        )
    if os.path.isdir(target):
        raise BadInput(
            f"cannot write --html {plain(out)}: it is a directory; give a file name, e.g. {plain(out)}/report.html"
        )


def _read(data: ds.Dataset, columns: list[str], filt: ds.Expression) -> pd.DataFrame:
    """The rows ``filt`` selects in ``data`` (already narrowed to the row groups that can hold them), within
    the memory budget (``budget.py``)."""
    return budget.table(data, columns, filt, "the page's read of " + ", ".join(columns)).to_pandas()


def _batches(data: ds.Dataset, columns: list[str], filt: ds.Expression) -> Any:
    """``to_batches`` with little read-ahead, within the memory budget (``budget.py``)."""
    budget.check_stream(data, columns, "the page's scan of " + ", ".join(columns))
    return data.to_batches(columns=columns, filter=filt, batch_readahead=2, fragment_readahead=1)


def _distinct(data: ds.Dataset, columns: list[str], filt: ds.Expression) -> dict[str, list[int]]:
    """The sorted distinct non-null values of integer columns, in one scan that keeps only those values."""
    seen: dict[str, set[int]] = {c: set() for c in columns}
    for batch in _batches(data, columns, filt):
        for c in columns:
            seen[c].update(int(v) for v in pc.unique(batch.column(c)).drop_null().to_pylist())
    return {c: sorted(v) for c, v in seen.items()}


def _episode_spans(data: ds.Dataset, filt: ds.Expression) -> dict[int, tuple[int | None, int | None]]:
    """First and last episode_step of every episode the filter's rows hold, one scan, one pair per episode."""
    spans: dict[int, tuple[int | None, int | None]] = {}
    for batch in _batches(data, ["episode", "episode_step"], filt & ds.field("episode").is_valid()):
        if not batch.num_rows:
            continue
        g = (
            pa.Table.from_batches([batch])
            .group_by("episode")
            .aggregate([("episode_step", "min"), ("episode_step", "max")])
        )
        for e, lo, hi in zip(
            g.column("episode").to_pylist(),
            g.column("episode_step_min").to_pylist(),
            g.column("episode_step_max").to_pylist(),
            strict=True,
        ):
            old_lo, old_hi = spans.get(e, (lo, hi))
            spans[e] = (
                lo if old_lo is None else old_lo if lo is None else min(lo, old_lo),
                hi if old_hi is None else old_hi if hi is None else max(hi, old_hi),
            )
    return spans


def _pick_episode(
    data: ds.Dataset, first: ds.Expression, env: int | None, episode: int | None, iteration: int | None
) -> tuple[int | None, tuple[int | None, int | None]]:
    """The episode to draw (the user's, checked, or the longest whole episode of the iteration) and its span."""
    if env is None:
        return None, (None, None)
    mine = first & ROLLOUT & (ds.field("env") == env)
    spans = _episode_spans(data, mine)
    eps = sorted(spans)
    if episode is not None:
        if episode not in spans:
            if not eps:
                raise BadInput(
                    f"--episode {episode}: the log's rollout rows of env {env} carry no episode numbers (an own loop "
                    "tags them with probe.tag(..., episode=...)); leave --episode out"
                )
            raise BadInput(f"--episode {episode} is not in the log for env {env}; it holds episodes {eps}")
        return episode, spans[episode]
    at = (
        eps
        if iteration is None
        else _distinct(data, ["episode"], mine & (ds.field("iteration") == iteration))["episode"]
    )
    full = [e for e in at if spans[e][0] == 0]
    if at:
        chosen = max(full or at, key=lambda e: spans[e][1] or 0)
        return chosen, spans[chosen]
    return (eps[-1], spans[eps[-1]]) if eps else (None, (None, None))


def _heat_figure(
    plt: Any,
    data: ds.Dataset,
    first: ds.Expression,
    env: int | None,
    episode: int | None,
    span: tuple[int | None, int | None],
    notes: list[str],
    vectors: bool,
    summary: bool,
    traced: int | None,
    caps: Capabilities,
) -> str | None:
    if env is None or episode is None:
        return None
    # a summary log without traced envs: reading the all-null vector columns would still build their values.
    # Not the report's health.vectors_available: its read of every rollout row's h may fall over the memory
    # budget where one episode's rows fit
    if not vectors:
        notes.append(NO_VECTORS)
        return None
    filt = first & ROLLOUT & (ds.field("env") == env) & (ds.field("episode") == episode)
    last = span[1]
    if last is not None and last >= MAX_HEAT_EPISODE_STEPS:
        filt = filt & (ds.field("episode_step") < MAX_HEAT_EPISODE_STEPS)
        notes.append(f"heat-maps: the first {MAX_HEAT_EPISODE_STEPS:,} steps of the episode's {last + 1:,}")
    # the episode's row groups only: a filter on episode alone would scan every row group's vectors (`narrow`)
    heat = ["module", "layer", "env", "episode", "env_step", "episode_step", "h", "c"]
    try:
        df = _read(narrow(data, env=(env, env), episode=(episode, episode)), heat, filt)
    except BadLog as exc:
        # a summary log's traced vectors lie in row groups of up to 65,536 rows, each row read at its full
        # width: left out, as the report's health and probes leave them, and the page says why
        if not summary or "memory budget" not in str(exc):
            raise
        notes.append("heat-maps: reading the episode's state vectors would go over the memory budget (--max-memory)")
        return None
    if not len(df) or df["h"].isna().all():
        if traced is not None:
            kept = "env 0's" if traced == 1 else f"envs 0..{traced - 1}'s"
            notes.append(f"heat-maps: env {env}'s rows hold no state vectors (--trace-envs keeps {kept})")
        else:  # e.g. --every K: the other iterations' rows
            notes.append("heat-maps: the log holds no state vectors for that episode")
        return None
    lo, hi = int(df["env_step"].min()), int(df["env_step"].max())
    # where training sequences of the first epoch start inside the drawn steps (no epochs: all of them)
    near = _read(
        narrow(data, env_step=(lo, hi)),
        ["env_step", "epoch"],
        first & STARTS & (ds.field("env") == env) & (ds.field("env_step") >= lo) & (ds.field("env_step") <= hi),
    )
    epoch0 = near["epoch"] == 0 if caps.epochs else np.ones(len(near), bool)
    cuts = near[epoch0]["env_step"].unique()
    keys = sorted({(str(m), int(lv)) for m, lv in zip(df["module"], df["layer"], strict=True)})
    has_c = df["c"].notna().any()
    cols = 2 if has_c else 1
    fig, axes = plt.subplots(len(keys), cols, figsize=(11, 2.6 * len(keys)), squeeze=False)
    for row, (module, layer) in enumerate(keys):
        d = df[(df["module"] == module) & (df["layer"] == layer)].sort_values("env_step")
        steps = d["env_step"].to_numpy()
        for col, which in enumerate(["h", "c"][:cols]):
            m = states(d, which).T  # (units, time)
            stride_t = max(1, m.shape[1] // MAX_HEAT_STEPS)
            stride_u = max(1, m.shape[0] // MAX_HEAT_UNITS)
            if stride_t > 1 or stride_u > 1:
                notes.append(
                    f"heat-map {module} layer {layer} {which}: every {stride_t} step(s), every {stride_u} unit(s)"
                )
            m = m[::stride_u, ::stride_t]
            ax = axes[row, col]
            lim = float(np.nanmax(np.abs(m))) if np.isfinite(m).any() else 1.0
            im = ax.imshow(
                m,
                aspect="auto",
                cmap="RdBu_r",
                vmin=-lim,
                vmax=lim,
                interpolation="nearest",
                extent=(steps[0] - 0.5, steps[0] - 0.5 + m.shape[1] * stride_t, m.shape[0] * stride_u, 0),
            )
            for s in d[d["episode_step"] == 0]["env_step"].to_numpy():
                ax.axvline(s - 0.5, color="black", linestyle="--", linewidth=1)
            for s in cuts:
                if steps[0] <= s <= steps[-1]:
                    ax.axvline(s - 0.5, color="green", linestyle=":", linewidth=1.2)
            ax.set_title(f"{_label(module)} layer {layer}: {which}", fontsize=9)
            ax.set_ylabel("unit")
            fig.colorbar(im, ax=ax, fraction=0.03)
    for ax in axes[-1]:
        ax.set_xlabel("env step")
    fig.tight_layout()
    return _png(fig)


def _length_counts(data: ds.Dataset, filt: ds.Expression) -> np.ndarray:
    """How many training sequences of each length (index = length) the first module in the log has: one
    scan that keeps one count per length, every epoch's sequences counted."""
    counts = np.zeros(0, dtype=np.int64)
    module: str | None = None
    for batch in _batches(data, ["module", "seq_len"], filt & ds.field("seq_len").is_valid()):
        if not batch.num_rows:
            continue
        if module is None:
            module = str(batch.column("module")[0].as_py())
        lens = pc.filter(batch.column("seq_len"), pc.equal(batch.column("module"), module)).to_numpy()
        found = np.bincount(lens.astype(np.int64))
        if len(found) > len(counts):
            counts = np.pad(counts, (0, len(found) - len(counts)))
        counts[: len(found)] += found
    return counts


def _sections(rep: Report) -> list[str]:
    """Every block the text report shows (the verdict, each section, what the log lacks, the findings), as
    HTML: the page carries what ``lstm-probe report`` prints. Rich markup is read as the terminal would
    (``Text.from_markup``), then escaped."""
    from rich.text import Text

    def e(markup: str) -> str:
        return html.escape(plain(Text.from_markup(markup).plain))

    out = []
    for blocks in rep.text():
        for block in blocks:
            if isinstance(block, Line):
                out.append(f"<p class='note'>{e(block.text)}</p>")
            elif isinstance(block, Panel):
                items = "".join(f"<li>{e(line.removeprefix('- '))}</li>" for line in block.lines)
                out.append(f"<h2>{e(block.title)}</h2><ul>{items}</ul>")
            elif isinstance(block, Table):
                head = "".join(f"<th>{e(c)}</th>" for c in block.columns)
                body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in block.rows)
                out.append(f"<h2>{e(block.title)}</h2><table class='grid'><tr>{head}</tr>{body}</table>")
    return out


def _page(rep: Report, figures: list[tuple[str, str, str]], notes: list[str]) -> str:
    def e(value: str) -> str:  # strings from the log: HTML-escaped, control characters written out
        return html.escape(plain(value))

    r = rep.run
    meta = [
        ("env", r.env_id),
        ("algorithm", r.algorithm),
        ("n_envs", envs_words(r) if r.env_runners else r.n_envs),
        (
            "steps",
            r.steps_done
            if r.steps_start is None or not isinstance(r.steps_done, int)
            else f"{r.steps_done - r.steps_start:,} (the model's steps {r.steps_start:,} to {r.steps_done:,})",
        ),
        ("iterations", r.iterations),
        ("completed", r.completed),
        ("rows", f"{r.rows:,}"),
        ("capture", (r.capture or {}).get("mode")),
    ]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>lstm-probe report</title>",
        "<style>body{font-family:Helvetica,Arial,sans-serif;max-width:1100px;margin:24px auto;color:#222}"
        "h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}"
        "table{border-collapse:collapse}td,th{padding:2px 10px 2px 0;text-align:left}img{max-width:100%}"
        ".grid td,.grid th{border-bottom:1px solid #eee;font-size:13px}"
        ".warn{color:#a33}.note{color:#666;font-size:13px}</style></head><body>",
        f"<h1>lstm-probe report: {e(str(rep.path))}</h1>",
    ]
    for w in rep.warnings:
        parts.append(f"<p class='warn'>warning: {e(w)}</p>")
    parts.append(
        "<table>" + "".join(f"<tr><td><b>{e(k)}</b></td><td>{e(str(v))}</td></tr>" for k, v in meta) + "</table>"
    )
    parts += _sections(rep)
    for title, png, caption in figures:
        parts.append(
            f"<h2>{e(title)}</h2><p class='note'>{e(caption)}</p>"
            f"<img alt='{e(title)}' src='data:image/png;base64,{png}'>"
        )
    if notes:
        parts.append("<h2>Sampling</h2><ul class='note'>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)
