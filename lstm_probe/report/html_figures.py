"""The figures of ``lstm-probe report --html`` that draw from the report (layout, staleness, sequence
lengths, norms, what-if), one function each, returning an inlined PNG or None. matplotlib loads only when
a figure is drawn (:func:`_plt`)."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import pandas as pd

from lstm_probe.contract import Capabilities
from lstm_probe.errors import BadInput
from lstm_probe.report import Report
from lstm_probe.report.section import fmt_steps
from lstm_probe.text import plain

MAX_LAYOUT_EPOCHS = 4
MAX_LAYOUT_ENVS = 16
"""Envs the minibatch layout draws (the first ones): a row each per epoch drawn; a 1,024-env run drawn whole made a
figure 200,000 pixels tall (35 s and 2 GB of matplotlib for one page)."""


MAX_COLOUR_LEGEND = 10  # tab10 repeats after ten episodes


REASON_MARKERS = {
    "episode_start": ("o", "episode start"),
    "env_boundary": ("s", "env boundary"),
    "split": ("*", "buffer split point"),
    "minibatch_cut": ("v", "minibatch cut"),
    "max_seq_len": ("D", "max_seq_len"),
    "gradient_window": ("^", "gradient window"),
}


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from lstm_probe.extras import missing

        raise BadInput(str(missing("matplotlib", "--html"))) from None
    return plt


def _label(value: Any) -> str:
    """A string from the log as a figure label: control characters written out (matplotlib's missing-glyph
    warnings would print them raw), '$' taken literally (not as mathtext)."""
    return plain(value).replace("$", r"\$")


def _whole(v: Any) -> str:
    """An integer cell as a label: '?' where it is null."""
    return "?" if pd.isna(v) else str(int(v))


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _reasons(caps: Capabilities, drawn: set[str]) -> dict[str, tuple[str, str]]:
    """The sequence-start markers a log with these capabilities can show, and a per-step pass's gradient windows where
    the figure draws some (``drawn``: the start reasons of its rows)."""
    out = {k: REASON_MARKERS[k] for k in ("episode_start", "env_boundary")}
    if "gradient_window" in drawn:
        out["gradient_window"] = REASON_MARKERS["gradient_window"]
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
    if len(envs) > MAX_LAYOUT_ENVS:
        notes.append(f"minibatch layout: envs {envs[0]}-{envs[MAX_LAYOUT_ENVS - 1]} of {len(envs):,} drawn")
        envs = envs[:MAX_LAYOUT_ENVS]
        starts = starts[starts["env"] <= envs[-1]]
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(
        len(epochs), 1, figsize=(11, 0.6 + 0.45 * len(envs) * len(epochs) + 0.5 * len(epochs)), squeeze=False
    )
    if starts["episode"].isna().all():  # an own loop tagged episode_start alone: no episode number to colour by
        notes.append("minibatch layout: the rows carry no episode numbers (tag episode=...): bars uncoloured")
    for ax, ep in zip(axes[:, 0], epochs, strict=True):
        s = starts[starts["epoch"] == ep]
        for _, row in s.iterrows():
            y = int(row["env"])
            x0 = int(row["env_step"])
            length = 1 if pd.isna(row["seq_len"]) else int(row["seq_len"])
            ax.barh(
                y,
                length,
                left=x0 - 0.5,
                height=0.6,
                color="lightgrey" if pd.isna(row["episode"]) else cmap(int(row["episode"]) % 10),
                edgecolor="black",
                linewidth=0.6,
                alpha=0.85,
            )
            marker = REASON_MARKERS.get(str(row["seq_reason"]), ("x", "?"))[0]
            ax.plot(x0 - 0.5, y, marker=marker, color="black", markersize=7, markerfacecolor="white")
            ax.text(
                x0 + length / 2 - 0.5,
                y,
                f"mb{row['mb_label']}" if "mb_label" in row else f"mb{_whole(row['minibatch'])}",
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
        for m, label in _reasons(caps, set(starts["seq_reason"].dropna().astype(str))).values()
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
        _h_and_c(a1, g["epoch"], g, name(module, layer), ("o", "s"))
    _drift_axes(a1, "epoch", "mean relative drift")
    pos = pd.DataFrame(st.by_position)
    pos = pos[pos["position"] != "middle"]
    pos = pos.assign(name=[name(m, lv) for m, lv in zip(pos["module"], pos["layer"], strict=True)])
    pos.pivot(index="name", columns="position", values="drift_h_mean").plot.bar(ax=a2, rot=0, logy=True)
    a2.set_xlabel("")
    a2.set_ylabel("mean relative drift (h)")
    a2.set_title("by position in sequence", fontsize=9)
    return _png(fig)


def _staleness_trend_figure(plt: Any, rep: Report) -> str | None:
    """Each iteration's last-epoch drift (the staleness section's ``by_iteration``: iterations, or spans of them
    drawn at their middle) per module and layer, h solid and c dashed; log scale. None where no module and layer has
    a drift in more than one entry."""
    g = pd.DataFrame(rep.staleness.by_iteration)
    if not len(g) or not (g.groupby(["module", "layer"]).size() > 1).any():
        return None
    layered = bool((g["layer"] > 0).any())
    g = g.assign(at=(g["iteration_first"] + g["iteration_last"]) / 2)
    fig, ax = plt.subplots(figsize=(11, 3.4))
    for (module, layer), d in g.groupby(["module", "layer"]):
        _h_and_c(ax, d["at"], d, f"{_label(module)} L{layer}" if layered else _label(module), (".", "."))
    _drift_axes(ax, "iteration", "mean relative drift, last epoch")
    return _png(fig)


def _returns_figure(plt: Any, rep: Report) -> str | None:
    """The mean return of the episodes each iteration ended (the returns section's ``by_iteration``), their min-max
    band shaded. None where the log has no returns or fewer than two iterations with an episode's end."""
    r = rep.sections.get("returns")
    if r is None or len(r.by_iteration.get("iteration", [])) < 2:
        return None
    g = pd.DataFrame(r.by_iteration)
    fig, ax = plt.subplots(figsize=(11, 3.2))
    ax.fill_between(g["iteration"], g["return_min"], g["return_max"], alpha=0.2, label="min-max")
    ax.plot(g["iteration"], g["return_mean"], marker=".", label="mean")
    ax.set_xlabel("iteration" if r.stride == 1 else f"iteration (each point: {r.stride} iterations)")
    ax.set_ylabel("episode return")
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.legend(fontsize=8)
    return _png(fig)


def _h_and_c(ax: Any, x: Any, d: pd.DataFrame, name: str, markers: tuple[str, str]) -> None:
    """A module's mean h drift (solid) and, where it has one, its c drift (dashed) against ``x``."""
    ax.plot(x, d["drift_h_mean"], marker=markers[0], label=f"{name} h")
    if d["drift_c_mean"].notna().any():
        ax.plot(x, d["drift_c_mean"], marker=markers[1], linestyle="--", label=f"{name} c")


def _drift_axes(ax: Any, xlabel: str, ylabel: str) -> None:
    """A drift figure's axes: integer x ticks, drift on a log scale, the legend."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_yscale("log", nonpositive="mask")
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.legend(fontsize=8)


def _cross_staleness_figure(plt: Any, by_minibatch: list[dict[str, Any]]) -> str:
    g = pd.DataFrame(by_minibatch)
    fig, ax = plt.subplots(figsize=(11, 3.4))
    for module, d in g.groupby("module"):
        _h_and_c(ax, d["minibatch"], d, _label(module), ("o", "s"))
    _drift_axes(ax, "minibatch (0 = before any optimizer step)", "mean relative drift")
    return _png(fig)


def _integer_ticks() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _lengths_figure(plt: Any, rep: Report, counts: np.ndarray) -> str | None:
    if not counts.sum():
        return None
    fig, ax = plt.subplots(figsize=(11, 3))
    lengths = np.flatnonzero(counts)
    ax.hist(lengths, bins=30, weights=counts[lengths], alpha=0.7, label="training sequence length")
    ep = rep.sequences.episode_length
    if ep:
        ax.axvline(
            ep["median"], color="red", linestyle="--", label=f"median episode length ({fmt_steps(ep['median'])})"
        )
    cut = rep.sequences.gradient_length if rep.sequences.starts_inside and rep.sequences.cut_by_resets else {}
    if cut:  # a per-step loop resets the state at the episode starts inside the sequences: a shorter horizon
        ax.axvline(
            cut["median"], color="black", linestyle=":", label=f"median gradient path ({fmt_steps(cut['median'])})"
        )
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
        # at least 0 to 1e-5: values all inside the linear range otherwise get ticks at the data's own
        # limits (4.2e-07 ...), whose long labels run into the next panel
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, 0.0), max(hi, 1e-5))
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.legend(fontsize=8)
    return _png(fig)
