"""The staleness section's trend over training: each iteration's last-epoch drift, per module and layer, from
the drift groups the section's accumulator adds up by (module, layer, iteration, epoch) in the scan's runs
(O(iterations x epochs x modules x layers), whatever the log's rows). The JSON's ``staleness.by_iteration`` holds
at most :data:`POINTS` entries per module and layer (one per iteration, or spans of iterations where the run has
more); the text's line and the verdict read :data:`SPANS` spans of those entries (:func:`spans`, computed once per
report: ``StalenessSection.trend``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lstm_probe.report.numeric import is_count, is_number, mean_max
from lstm_probe.report.section import GroupStats, cut_spans, fmt, span_words
from lstm_probe.text import safe

POINTS = 100
"""Entries of ``by_iteration`` per module and layer at most: one per iteration up to this many iterations with a
drift, else this many spans of consecutive iterations (equal in count, within one)."""
SPANS = 8
"""Spans of iterations the text's trend line and the verdict read (each iteration where there are no more)."""

Trend = dict[tuple[str, int], list[dict[str, Any]]]
"""(module, layer) -> its :data:`SPANS` spans of iterations (:func:`spans`)."""


def by_iteration(groups: GroupStats) -> list[dict[str, Any]]:
    """Per module and layer, each iteration's drift in its last epoch (the highest epoch with a drift row in that
    iteration): ``iteration_first``, ``iteration_last`` (equal, or a span's first and last iteration where the run
    has more than :data:`POINTS` iterations), ``iterations`` (with a drift, in the span), ``epoch`` (that last
    epoch; a span's where its iterations share it, else None), ``rows`` and the mean drift of h and c over those
    rows."""
    last: dict[tuple[str, int, int], tuple[int, np.ndarray]] = {}
    for (module, layer, it, ep), s in groups.items():
        key = (module, layer, int(it))
        if key not in last or ep > last[key][0]:
            last[key] = (int(ep), s)
    series: dict[tuple[str, int], list[tuple[int, int, np.ndarray]]] = {}
    for (module, layer, it), (ep, s) in sorted(last.items()):
        series.setdefault((module, layer), []).append((it, ep, s))
    out: list[dict[str, Any]] = []
    for (module, layer), points in series.items():
        for a, b in cut_spans(len(points), POINTS):
            part = points[a:b]
            s = np.sum([p[2] for p in part], axis=0)  # counts and sums add; the maxima are not shown
            epochs = {p[1] for p in part}
            out.append(
                {
                    "module": module,
                    "layer": layer,
                    "iteration_first": part[0][0],
                    "iteration_last": part[-1][0],
                    "iterations": len(part),
                    "epoch": epochs.pop() if len(epochs) == 1 else None,
                    "rows": int(s[0]),
                    "drift_h_mean": mean_max(s, 1, "drift_h")["drift_h_mean"],
                    "drift_c_mean": mean_max(s, 4, "drift_c")["drift_c_mean"],
                }
            )
    return out


def spans(entries: list[dict[str, Any]]) -> Trend:
    """Per (module, layer): :data:`SPANS` spans of its ``by_iteration`` entries (each entry where there are no
    more), each with ``iteration_first``, ``iteration_last``, ``iterations`` (with a drift), ``epoch`` (shared, or
    None), ``rows`` and ``drift_h_mean`` over its rows; ``minibatch`` (shared, or None) where the entries are of
    each iteration's last minibatch (the cross-process check's, ``cycling_minibatches``)."""
    per: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for e in entries:
        per.setdefault((e["module"], e["layer"]), []).append(e)
    out: Trend = {}
    for key, es in per.items():
        rows = []
        for a, b in cut_spans(len(es), SPANS):
            part = es[a:b]
            n = sum(e["rows"] for e in part)
            h = sum(e["rows"] * e["drift_h_mean"] for e in part if e["rows"])
            epochs = {e["epoch"] for e in part}
            row = {
                "iteration_first": part[0]["iteration_first"],
                "iteration_last": part[-1]["iteration_last"],
                "iterations": sum(e["iterations"] for e in part),
                "epoch": epochs.pop() if len(epochs) == 1 else None,
                "rows": n,
                "drift_h_mean": h / n if n else None,
            }
            if "minibatch" in part[0]:  # the trend of the last minibatch (``cycling_minibatches``)
                minibatches = {e["minibatch"] for e in part}
                row["minibatch"] = minibatches.pop() if len(minibatches) == 1 else None
            rows.append(row)
        out[key] = rows
    return out


def iterations(trend: Trend) -> int:
    """The iterations with a drift of one module and layer (the most of any)."""
    return max((sum(r["iterations"] for r in rows) for rows in trend.values()), default=0)


def lines(trend: Trend, layered: bool) -> list[str]:
    """The text's trend lines: per module and layer with a drift in more than one iteration, its last-epoch (or
    last-minibatch) mean h drift in :data:`SPANS` spans of the run's iterations (each iteration where there are no
    more), the largest named."""
    out = []
    for (module, layer), rows in trend.items():
        n = sum(r["iterations"] for r in rows)
        if n < 2:
            continue
        unit = "minibatch" if "minibatch" in rows[0] else "epoch"  # each iteration's last minibatch, or epoch
        epochs = {r[unit] for r in rows}
        epoch = f" ({epochs.pop()})" if len(epochs) == 1 and None not in epochs else ""
        named = [r for r in rows if r["drift_h_mean"] is not None]
        if not named:
            continue
        parts = ", ".join(
            f"{span_words(r['iteration_first'], r['iteration_last'])}: {fmt(r['drift_h_mean'])}" for r in named
        )
        top = max(named, key=lambda r: r["drift_h_mean"])
        largest = span_words(top["iteration_first"], top["iteration_last"])
        json = "each" if n <= POINTS else f"{POINTS} spans"
        how = f", {len(rows)} spans of its {n:,} iterations (--json has {json})" if n > len(rows) else ""
        who = f"{safe(module)}{' layer ' + str(layer) if layered else ''}"
        whose = "the" if epoch else "each iteration's"
        out.append(
            f"mean h drift of {who} in {whose} last {unit}{epoch} by iteration{how}: {parts}; largest in "
            f"{'iteration' if top['iterations'] == 1 else 'iterations'} {largest}"
        )
    return out


def last_span(trend: Trend, drift: dict[str, float], epoch: int | None, bound: float) -> dict[str, Any] | None:
    """Where a run-wide figure of the verdict (``drift``: module -> mean layer-0 h drift over every iteration's
    ``epoch``) hides a change over training: the last of :data:`SPANS` spans of the run's iterations, with each
    module's figure in it (``drift``), where some module's differs from its run-wide one by a factor of 2 or more
    and one of the two is above ``bound`` (the verdict's ``STALE``); None otherwise, and where the run has fewer
    than :data:`SPANS` iterations with a drift, or some span is not of ``epoch`` alone (its figures would be of
    another epoch)."""
    per = {m: rows for (m, layer), rows in trend.items() if layer == 0 and m in drift}
    if epoch is None or not per:
        return None
    last: dict[str, float] = {}
    for m, rows in per.items():
        if len(rows) < SPANS or any(r["epoch"] != epoch for r in rows) or rows[-1]["drift_h_mean"] is None:
            return None
        last[m] = float(rows[-1]["drift_h_mean"])
    moved = any(max(drift[m], x) > bound and (x >= 2 * drift[m] or 2 * x <= drift[m]) for m, x in last.items())
    if not moved:
        return None
    tails = {(rows[-1]["iteration_first"], rows[-1]["iteration_last"]) for rows in per.values()}
    if len(tails) > 1:  # the modules' drifts are of other iterations: no one span to name
        return None
    tail = next(iter(per.values()))[-1]
    return {"span": tail, "iterations": iterations(trend), "drift": last}


def undrifted(modules: dict[str, int]) -> str | None:
    """``StalenessSection.undrifted`` (module -> its train rows, none with a drift) as the staleness section and its
    finding say it; None where there is none."""
    if not modules:
        return None
    names = ", ".join(f"{safe(m)} ({n:,} rows)" for m, n in modules.items())
    return (
        f"no drift for the train rows of {names}: the log holds no rollout call of theirs whose state they could "
        "be compared with (the collection does not run the module): not judged"
    )


def dropout_cause(meta: dict[str, Any], per_layer: list[dict[str, Any]], bound: float) -> str | None:
    """Why a provenance check fails on the layers above the first alone, where the log's metadata records dropout
    between the layers of a traced module (``architecture.modules[NAME].dropout`` > 0, more than one layer): the
    rollout's and training's states of those layers are then computed with different dropout masks (or one of them
    without dropout), so they differ by construction. None where layer 0 fails too (a provenance bug whatever the
    dropout), where no layer above the first fails, or where the metadata records no such dropout (older logs).
    Where the log records which calls ran in training mode (``training_mode``), the cause names them, and
    is None where dropout acted in no rollout and no train call (the module in eval mode: no masks differ)."""
    modules = (meta.get("architecture") or {}).get("modules")
    if not isinstance(modules, dict):
        return None
    found = {}
    for name, m in modules.items():  # a log's (a user's file): dropout a probability, num_layers a count
        p = m.get("dropout") if isinstance(m, dict) else None
        if is_number(p) and 0 < p <= 1 and is_count(m.get("num_layers")) and m["num_layers"] > 1:
            found[str(name)] = float(p)
    failed = {int(r["layer"]) for r in per_layer if max(r["max_drift_h"] or 0.0, r["max_drift_c"] or 0.0) > bound}
    if not found or not failed or 0 in failed or not any(r["layer"] == 0 for r in per_layer):
        return None
    which = ", ".join(f"{safe(n)} {p:g}" for n, p in found.items())
    kind = "GRU" if all(modules[n].get("kind") == "GRU" for n in found) else "LSTM"  # (found: modules' names)
    modes = meta.get("training_mode")
    if not isinstance(modes, dict) or not all(_modes(modes.get(n)) for n in found):  # older logs
        return (
            f"dropout between the {kind} layers (nn.{kind} dropout: {which}): the states of the layers above the first "
            "are computed with other dropout masks in the rollout than in training (or without dropout in one of "
            "them), so they differ by construction; layer 0 agrees: no provenance bug"
        )
    acted = {ph: [_calls(modes[n].get(ph), 0) for n in found] for ph in ("rollout", "train")}
    if not any(acted["rollout"]) and not any(acted["train"]):  # recorded: dropout acted in neither
        return None
    said = "; ".join(
        f"in {ph}, {sum(acted[ph]):,} of {sum(_calls(modes[n].get(ph), 1) for n in found):,} calls in training mode"
        for ph in ("rollout", "train")
    )
    return (
        f"dropout between the {kind} layers (nn.{kind} dropout: {which}; {said}): the states of the layers above the "
        "first are computed with other dropout masks in the rollout than in training (or without dropout in one "
        "of them), so they differ by construction; layer 0 agrees: no provenance bug"
    )


def _calls(counts: Any, i: int) -> int:
    """``training_mode``'s [calls in training mode, calls] entry ``i`` (0 where absent)."""
    return int(counts[i]) if isinstance(counts, list) and len(counts) == 2 else 0


def _modes(phases: Any) -> bool:
    """Whether a module's ``training_mode`` entry (a log's: a user's file) is as lstm-probe writes it: per phase,
    [calls in training mode, calls], counts with the first at most the second."""
    return isinstance(phases, dict) and all(
        isinstance(c, list) and len(c) == 2 and is_count(c[0]) and is_count(c[1]) and c[0] <= c[1]
        for c in phases.values()
    )
