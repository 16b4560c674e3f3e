"""``lstm-probe report --html``: one self-contained page with the pictures people read states with.

matplotlib draws static PNGs that are inlined as base64: the file opens anywhere with no network and
no scripts, and stays small (heat-maps are downsampled, the layout drawing is capped; the page says
what was sampled). matplotlib is an optional extra: ``pip install 'lstm-probe[html]'``.

One function per figure (layout, heat-maps, staleness, lengths, norms) and the bounded scans they read
keep the page's drawing in one place, a little over 600 lines.
"""

from __future__ import annotations

import base64
import html
import io
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from lstm_probe.contract import Capabilities
from lstm_probe.errors import BadInput
from lstm_probe.reader import dataset, narrow, states
from lstm_probe.report import Report, summarize
from lstm_probe.text import plain

MAX_HEAT_STEPS = 400
MAX_HEAT_UNITS = 128
MAX_LAYOUT_EPOCHS = 4
MAX_COLOUR_LEGEND = 10  # tab10 repeats after ten episodes
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
REASON_MARKERS = {
    "episode_start": ("o", "episode start"),
    "env_boundary": ("s", "env boundary"),
    "split": ("*", "buffer split point"),
    "minibatch_cut": ("v", "minibatch cut"),
    "max_seq_len": ("D", "max_seq_len"),
}
"""Why a sequence starts where it does -> (marker, legend label); the legend lists those the log's
capabilities allow (:func:`_reasons`)."""


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


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BadInput("--html needs matplotlib: pip install 'lstm-probe[html]' (or pip install matplotlib)") from None
    return plt


def _label(value: Any) -> str:
    """A string from the log as a figure label: control characters written out (matplotlib's missing-glyph
    warnings would print them raw), '$' taken literally (not as mathtext)."""
    return plain(value).replace("$", r"\$")


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


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
    data, _ = dataset(path)
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
        raise BadInput(f"--iteration {iteration} is not in the log; it holds iterations {iters[:1]}..{iters[-1:]}")
    if env is None and seen["env"]:
        env = seen["env"][0]
    elif env is not None and env not in seen["env"]:
        held = ", ".join(map(str, seen["env"][:20])) + (", ..." if len(seen["env"]) > 20 else "")
        raise BadInput(f"--env {env} is not in the log; it holds envs {held or 'none'} (drop --env for the first)")
    episode, span = _pick_episode(data, first, env, episode, iteration)
    starts = (
        data.to_table(columns=START_COLUMNS, filter=first & STARTS & (ds.field("iteration") == iteration)).to_pandas()
        if iteration is not None
        else pd.DataFrame(columns=START_COLUMNS)
    )
    figures: list[tuple[str, str, str]] = []
    layout = _layout_figure(plt, starts, iteration, notes, caps)
    markers = [label for _, label in _reasons(caps).values()] if layout else []
    if layout:
        figures.append(
            (
                "Minibatch layout",
                layout,
                "Each epoch's minibatches as their sequences on the (env, env "
                "step) axis, coloured by episode; the marker says why each sequence starts there.",
            )
        )
    heat = _heat_figure(plt, data, first, env, episode, span, notes, rep.health.vectors_available, caps)
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
    stale = _staleness_figure(plt, rep)
    if stale:
        figures.append(
            (
                "Staleness",
                stale,
                "Relative L2 drift ||h_train - h_rollout|| / ||h_rollout|| of train states from the rollout states of "
                "the same env step, "
                + ("by epoch and by position in the sequence" if rep.staleness.by_epoch else "by minibatch")
                + " (log scale: a drift of 0.001 next to 0.4 stays visible).",
            )
        )
    hist = _lengths_figure(plt, rep, _length_counts(data, first & STARTS))
    if hist:
        figures.append(
            ("Sequence lengths vs episode lengths", hist, "The truncated-BPTT horizon next to the episodes it cuts.")
        )
    norms = _norms_figure(plt, rep)
    if norms:
        figures.append(("Norms over iterations", norms, "Mean rollout-state norms per module and layer."))
    what_if = _what_if_figure(plt, rep)
    if what_if:
        figures.append(("What if: other initial states", what_if, "Against refreshed states, by epoch."))
    page = _page(rep, figures, notes)
    with open(out, "w", encoding="utf-8") as f:
        f.write(page)
    return Page(str(out), len(page.encode()), [t for t, _, _ in figures], iteration, env, episode, notes, markers)


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


def _distinct(data: ds.Dataset, columns: list[str], filt: ds.Expression) -> dict[str, list[int]]:
    """The sorted distinct non-null values of integer columns, in one scan that keeps only those values."""
    seen: dict[str, set[int]] = {c: set() for c in columns}
    for batch in data.to_batches(columns=columns, filter=filt):
        for c in columns:
            seen[c].update(int(v) for v in pc.unique(batch.column(c)).drop_null().to_pylist())
    return {c: sorted(v) for c, v in seen.items()}


def _episode_spans(data: ds.Dataset, filt: ds.Expression) -> dict[int, tuple[int | None, int | None]]:
    """First and last episode_step of every episode the filter's rows hold, one scan, one pair per episode."""
    spans: dict[int, tuple[int | None, int | None]] = {}
    for batch in data.to_batches(columns=["episode", "episode_step"], filter=filt & ds.field("episode").is_valid()):
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


def _reasons(caps: Capabilities) -> dict[str, tuple[str, str]]:
    """The sequence-start markers a log with these capabilities can show."""
    out = {k: REASON_MARKERS[k] for k in ("episode_start", "env_boundary")}
    if caps.rollout_buffer:
        out |= {k: REASON_MARKERS[k] for k in ("split", "minibatch_cut")}
    if caps.max_seq_len is not None:
        out["max_seq_len"] = (REASON_MARKERS["max_seq_len"][0], f"max_seq_len ({caps.max_seq_len})")
    return out


def _layout_figure(
    plt: Any, t: pd.DataFrame, iteration: int | None, notes: list[str], caps: Capabilities
) -> str | None:
    """``t``: the t = 0 training rows of ``iteration`` (one per sequence and module)."""
    if iteration is None or not len(t):
        return None
    t = t[t["module"] == t["module"].iloc[0]]
    t = t[t["env"].notna() & t["env_step"].notna()]
    if not len(t):  # untagged training calls (generic tracer): nothing to place on the (env, env step) axis
        notes.append("minibatch layout: the training calls carry no env and env_step tags")
        return None
    starts = t.drop_duplicates(["epoch", "minibatch", "seq"])
    if not caps.epochs:  # minibatches cycle across epochs: draw each piece once
        mbs = starts.groupby(["env", "env_step"])["minibatch"].agg(lambda v: ",".join(str(int(x)) for x in sorted(v)))
        starts = starts.drop_duplicates(["env", "env_step"]).assign(epoch=0)
        starts["mb_label"] = [mbs[(e, s)] for e, s in zip(starts["env"], starts["env_step"], strict=True)]
        notes.append("minibatch layout: each training piece once, labelled with every minibatch that held it")
    epochs = sorted(starts["epoch"].dropna().unique().astype(int).tolist())
    if len(epochs) > MAX_LAYOUT_EPOCHS:
        notes.append(f"minibatch layout: epochs {epochs[:MAX_LAYOUT_EPOCHS]} of {len(epochs)} drawn")
        epochs = epochs[:MAX_LAYOUT_EPOCHS]
    envs = sorted(t["env"].dropna().unique().astype(int).tolist())
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(
        len(epochs), 1, figsize=(11, 0.6 + 0.45 * len(envs) * len(epochs) + 0.5 * len(epochs)), squeeze=False
    )
    for ax, ep in zip(axes[:, 0], epochs, strict=True):
        s = starts[starts["epoch"] == ep]
        for _, row in s.iterrows():
            y = int(row["env"])
            x0 = int(row["env_step"])
            ax.barh(
                y,
                int(row["seq_len"]),
                left=x0 - 0.5,
                height=0.6,
                color=cmap(int(row["episode"]) % 10),
                edgecolor="black",
                linewidth=0.6,
                alpha=0.85,
            )
            marker = REASON_MARKERS.get(str(row["seq_reason"]), ("x", "?"))[0]
            ax.plot(x0 - 0.5, y, marker=marker, color="black", markersize=7, markerfacecolor="white")
            ax.text(
                x0 + int(row["seq_len"]) / 2 - 0.5,
                y,
                f"mb{row['mb_label']}" if "mb_label" in row else f"mb{int(row['minibatch'])}",
                ha="center",
                va="center",
                fontsize=7,
            )
        ax.set_yticks(envs)
        ax.set_yticklabels([f"env {e}" for e in envs])
        ax.set_ylabel("all minibatches" if "mb_label" in s else f"epoch {ep}")
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("env step")
    handles = [
        plt.Line2D([], [], marker=m, color="black", markerfacecolor="white", linestyle="", label=label)
        for m, label in _reasons(caps).values()
    ]
    episodes = sorted(int(e) for e in starts["episode"].dropna().unique())
    colours = [
        plt.Rectangle((0, 0), 1, 1, color=cmap(e % 10), alpha=0.85, label=f"episode {e}")
        for e in episodes[:MAX_COLOUR_LEGEND]
    ]
    if len(episodes) > MAX_COLOUR_LEGEND:
        notes.append(
            f"minibatch layout: the colour legend lists episodes {episodes[:MAX_COLOUR_LEGEND]} of {len(episodes)}"
        )
    axes[0, 0].set_title(f"iteration {iteration}: training sequences (bar colour = episode, mbK = minibatch K)")
    fig.tight_layout()
    fig.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=4,
        fontsize=9,
        frameon=False,
        title="why a sequence starts there",
    )
    if colours:
        axes[0, 0].legend(
            handles=colours,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=8,
            frameon=False,
            title="bar colour (env's episode)",
        )
    return _png(fig)


def _heat_figure(
    plt: Any,
    data: ds.Dataset,
    first: ds.Expression,
    env: int | None,
    episode: int | None,
    span: tuple[int | None, int | None],
    notes: list[str],
    vectors: bool,
    caps: Capabilities,
) -> str | None:
    if env is None or episode is None:
        return None
    if not vectors:  # summary capture: reading the all-null vector columns would still build their values
        notes.append(NO_VECTORS)
        return None
    filt = first & ROLLOUT & (ds.field("env") == env) & (ds.field("episode") == episode)
    last = span[1]
    if last is not None and last >= MAX_HEAT_EPISODE_STEPS:
        filt = filt & (ds.field("episode_step") < MAX_HEAT_EPISODE_STEPS)
        notes.append(f"heat-maps: the first {MAX_HEAT_EPISODE_STEPS:,} steps of the episode's {last + 1:,}")
    # the episode's row groups only: a filter on episode alone would scan every row group's vectors (`narrow`)
    df = (
        narrow(data, env=(env, env), episode=(episode, episode))
        .to_table(columns=["module", "layer", "env", "episode", "env_step", "episode_step", "h", "c"], filter=filt)
        .to_pandas()
    )
    if not len(df) or df["h"].isna().all():
        notes.append(NO_VECTORS)
        return None
    lo, hi = int(df["env_step"].min()), int(df["env_step"].max())
    # where training sequences of the first epoch start inside the drawn steps (no epochs: all of them)
    near = (
        narrow(data, env_step=(lo, hi))
        .to_table(
            columns=["env_step", "epoch"],
            filter=first
            & STARTS
            & (ds.field("env") == env)
            & (ds.field("env_step") >= lo)
            & (ds.field("env_step") <= hi),
        )
        .to_pandas()
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


def _staleness_figure(plt: Any, rep: Report) -> str | None:
    """Drift by epoch and by position in the sequence (per module and layer), or where the log has no drift
    columns but the cross-process check paired learner and rollout states, drift by minibatch; log scale."""
    st = rep.staleness
    cross = rep.sections.get("cross_process")
    if not st.by_epoch:
        return _cross_staleness_figure(plt, cross.by_minibatch) if cross is not None and cross.by_minibatch else None
    by_epoch = pd.DataFrame(st.by_epoch)
    layered = bool((by_epoch["layer"] > 0).any())

    def name(module: Any, layer: Any) -> str:
        return f"{_label(module)} L{layer}" if layered else _label(module)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.4))
    for (module, layer), g in by_epoch.groupby(["module", "layer"]):
        a1.plot(g["epoch"], g["drift_h_mean"], marker="o", label=f"{name(module, layer)} h")
        if g["drift_c_mean"].notna().any():
            a1.plot(g["epoch"], g["drift_c_mean"], marker="s", linestyle="--", label=f"{name(module, layer)} c")
    a1.set_xlabel("epoch")
    a1.set_ylabel("mean relative drift")
    a1.set_yscale("log", nonpositive="mask")
    a1.xaxis.set_major_locator(_integer_ticks())
    a1.legend(fontsize=8)
    pos = pd.DataFrame(st.by_position)
    pos = pos[pos["position"] != "middle"]
    pos = pos.assign(name=[name(m, lv) for m, lv in zip(pos["module"], pos["layer"], strict=True)])
    pos.pivot(index="name", columns="position", values="drift_h_mean").plot.bar(ax=a2, rot=0, logy=True)
    a2.set_xlabel("")
    a2.set_ylabel("mean relative drift (h)")
    a2.set_title("by position in sequence", fontsize=9)
    return _png(fig)


def _cross_staleness_figure(plt: Any, by_minibatch: list[dict[str, Any]]) -> str:
    g = pd.DataFrame(by_minibatch)
    fig, ax = plt.subplots(figsize=(11, 3.4))
    for module, d in g.groupby("module"):
        ax.plot(d["minibatch"], d["drift_h_mean"], marker="o", label=f"{_label(module)} h")
        ax.plot(d["minibatch"], d["drift_c_mean"], marker="s", linestyle="--", label=f"{_label(module)} c")
    ax.set_xlabel("minibatch (0 = before any optimizer step)")
    ax.set_ylabel("mean relative drift")
    ax.set_yscale("log", nonpositive="mask")
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.legend(fontsize=8)
    return _png(fig)


def _integer_ticks() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _length_counts(data: ds.Dataset, filt: ds.Expression) -> np.ndarray:
    """How many training sequences of each length (index = length) the first module in the log has: one
    scan that keeps one count per length, every epoch's sequences counted."""
    counts = np.zeros(0, dtype=np.int64)
    module: str | None = None
    for batch in data.to_batches(columns=["module", "seq_len"], filter=filt & ds.field("seq_len").is_valid()):
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


def _lengths_figure(plt: Any, rep: Report, counts: np.ndarray) -> str | None:
    if not counts.sum():
        return None
    fig, ax = plt.subplots(figsize=(11, 3))
    lengths = np.flatnonzero(counts)
    ax.hist(lengths, bins=30, weights=counts[lengths], alpha=0.7, label="training sequence length")
    ep = rep.sequences.episode_length
    if ep:
        ax.axvline(ep["median"], color="red", linestyle="--", label=f"median episode length ({ep['median']:.0f})")
    ax.set_xlabel("steps")
    ax.set_ylabel("training sequences")
    ax.legend(fontsize=8)
    return _png(fig)


def _norms_figure(plt: Any, rep: Report) -> str | None:
    """Mean rollout-state norms per iteration, from the report's own per-iteration aggregates."""
    g = pd.DataFrame(rep.health.norms_by_iteration)
    if not len(g):
        return None
    has_c = bool(g["c_norm_mean"].notna().any())  # GRUs have no cell state
    fig, axes = plt.subplots(1, 2 if has_c else 1, figsize=(11, 3), squeeze=False)
    for (module, layer), d in g.groupby(["module", "layer"]):
        for ax, which in zip(axes[0], ("h", "c"), strict=False):
            ax.plot(d["iteration"], d[f"{which}_norm_mean"], marker=".", label=f"{_label(module)} L{layer}")
    for ax, which in zip(axes[0], ("h", "c"), strict=False):
        ax.set_title(f"mean ||{which}||", fontsize=9)
        ax.set_ylabel(f"mean ||{which}|| (rollout)")
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.legend(fontsize=8)
    return _png(fig)


def _what_if_figure(plt: Any, rep: Report) -> str | None:
    """Value difference (share of the return spread) and KL by epoch for stored, zero and burn-in initial states."""
    w = getattr(rep, "what_if", None)
    if w is None or not w.measured or not w.by_epoch:
        return None
    g = pd.DataFrame(w.by_epoch)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3), squeeze=False)
    for alt, d in g.groupby("alternative", sort=False):
        for ax, col in zip(axes[0], ("value_rel", "kl"), strict=True):
            ax.plot(d["epoch"], d[col].astype(float), marker="o", label=_label(alt))
    for ax, title in zip(axes[0], ("|value difference| / return spread", "KL(refreshed || alternative)"), strict=True):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_yscale("symlog", linthresh=1e-6)
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.legend(fontsize=8)
    return _png(fig)


def _page(rep: Report, figures: list[tuple[str, str, str]], notes: list[str]) -> str:
    def e(value: str) -> str:  # strings from the log: HTML-escaped, control characters written out
        return html.escape(plain(value))

    r = rep.run
    meta = [
        ("env", r.env_id),
        ("algorithm", r.algorithm),
        ("n_envs", r.n_envs),
        ("steps", r.steps_done),
        ("iterations", r.iterations),
        ("completed", r.completed),
        ("rows", f"{r.rows:,}"),
        ("capture", (r.capture or {}).get("mode")),
    ]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>lstm-probe report</title>",
        "<style>body{font-family:Helvetica,Arial,sans-serif;max-width:1100px;margin:24px auto;color:#222}"
        "h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}"
        "table{border-collapse:collapse}td{padding:2px 10px 2px 0}img{max-width:100%}"
        ".warn{color:#a33}.note{color:#666;font-size:13px}</style></head><body>",
        f"<h1>lstm-probe report: {e(str(rep.path))}</h1>",
    ]
    for w in rep.warnings:
        parts.append(f"<p class='warn'>warning: {e(w)}</p>")
    parts.append(
        "<table>" + "".join(f"<tr><td><b>{e(k)}</b></td><td>{e(str(v))}</td></tr>" for k, v in meta) + "</table>"
    )
    parts.append(f"<p>{e(rep.architecture.verdict)}</p>")
    parts.append("<h2>Findings</h2><ul>" + "".join(f"<li>{e(f)}</li>" for f in rep.findings) + "</ul>")
    parts.append(f"<p>{e(rep.calls.explanation)}</p>")
    for title, png, caption in figures:
        parts.append(
            f"<h2>{e(title)}</h2><p class='note'>{e(caption)}</p>"
            f"<img alt='{e(title)}' src='data:image/png;base64,{png}'>"
        )
    if notes:
        parts.append("<h2>Sampling</h2><ul class='note'>" + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)
