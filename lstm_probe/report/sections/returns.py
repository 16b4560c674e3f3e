"""The returns line: did the policy's episodes return more as training went? From the log's ``returns`` metadata
(the *returns* capability: the episodes that ended in each iteration, ``capture/returns.py``), shown under the run.

Figures only: episodes, the mean return over the first and the last tenth of the run's iterations, the best episode.
A finding only where the figures are clear: enough iterations and episodes at both ends, and the two means within a
tenth of the episodes' spread (``returns did not change``); the report never says whether the policy learned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lstm_probe.contract import Capabilities
from lstm_probe.report.section import Block, Line, Log, Section, fmt
from lstm_probe.text import safe

SOURCES = {
    "monitor": "Monitor's raw rewards",
    "rewards": "summed rewards the algorithm saw",
    "normalized": "summed rewards the algorithm saw, normalized by VecNormalize: not the env's returns (a Monitor "
    "under VecNormalize records those)",
    "rllib": "RLlib's episode returns",
    "user": "as the loop gave them",
}
"""How the text says where the returns come from (the record's ``source``)."""
MIN_ITERATIONS = 20
"""The finding needs at least this many iterations in the run..."""
MIN_EPISODES = 10
"""...and at least this many episodes ended in its first and in its last tenth."""
SAME = 0.1
"""...and the two tenths' mean returns within this fraction of the episodes' standard deviation."""
_LISTS = ("episodes", "return_sum", "return_sq", "return_min", "return_max", "length_sum")


@dataclass
class Tenth:
    """The episodes that ended in a tenth of the run's iterations: [first, last] iterations, count, mean return."""

    first: int
    last: int
    episodes: int
    return_mean: float | None
    return_std: float | None


@dataclass
class ReturnsSection:
    """Episode returns by iteration, and the run's first and last tenth."""

    source: str | None
    episodes: int
    iterations: int
    """The run's iterations (the tenths are of these)."""
    partial: int = 0
    """Episodes under way when the probe started: not counted."""
    stride: int = 1
    """Iterations per entry of ``by_iteration`` (past 500 entries neighbours merged)."""
    best: dict[str, Any] | None = None
    """The best episode's return and iteration."""
    first_tenth: Tenth | None = None
    last_tenth: Tenth | None = None
    by_iteration: dict[str, list[Any]] = field(default_factory=dict)
    """Per entry (iterations with an episode's end): iteration (its first), episodes, return_mean, return_std,
    return_min, return_max, length_mean."""
    evaluation: dict[str, Any] | None = None
    """The episodes of the evaluation's processes (records marked ``evaluation``: RLlib's evaluation runners),
    counted apart from training's and in none of the fields above: episodes, return_mean, return_min, return_max,
    length_mean (None where the log has no such record: not in the JSON then)."""


def _entries(record: Any) -> list[tuple[int, list[float]]]:
    """The record's (iteration, [episodes, sum, sq, min, max, length sum]) entries, those whose values are numbers."""
    by = record.get("by_iteration") if isinstance(record, dict) else None
    if not isinstance(by, dict) or not isinstance(by.get("iteration"), list):
        return []
    columns = [by.get(k) for k in _LISTS]
    if not all(isinstance(c, list) and len(c) == len(by["iteration"]) for c in columns):
        return []
    out = []
    for i, it in enumerate(by["iteration"]):
        row = [c[i] for c in columns]  # type: ignore[index]
        ok = isinstance(it, int) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in row)
        if ok and row[0] > 0:
            out.append((it, [float(v) for v in row]))
    return out


def _pool(entries: list[tuple[int, list[float]]], first: int, last: int) -> Tenth:
    n = s = sq = 0.0
    for it, e in entries:
        if first <= it <= last:
            n, s, sq = n + e[0], s + e[1], sq + e[2]
    if not n:
        return Tenth(first, last, 0, None, None)
    mean = s / n
    return Tenth(first, last, int(n), mean, math.sqrt(max(sq / n - mean * mean, 0.0)))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _stride(rec: dict[str, Any]) -> int:
    return rec["stride"] if isinstance(rec.get("stride"), int) and rec["stride"] > 0 else 1


def _evaluation(record: Any) -> bool:
    return isinstance(record, dict) and record.get("evaluation") is True


def _split(record: Any) -> tuple[Any, list[dict[str, Any]]]:
    """The log's record less its evaluation records (marked ``evaluation``), and those."""
    rec = record if isinstance(record, dict) else {}
    shards = rec.get("by_shard")
    if not isinstance(shards, dict):
        return ({}, [rec]) if _evaluation(rec) else (rec, [])
    kept = {k: r for k, r in shards.items() if not _evaluation(r)}
    evaluated = [r for r in shards.values() if _evaluation(r)]
    if not evaluated:
        return rec, []
    return (next(iter(kept.values())) if len(kept) == 1 else {"by_shard": kept} if kept else {}), evaluated


def _evaluated(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The evaluation's episodes from its records: count, mean return, min, max, mean length; None where none."""
    if not records:
        return None
    _, entries = _merged({"by_shard": dict(enumerate(records))})
    n = sum(e[0] for _, e in entries)
    return {
        "episodes": int(n),
        "return_mean": sum(e[1] for _, e in entries) / n if n else None,
        "return_min": min(e[3] for _, e in entries) if n else None,
        "return_max": max(e[4] for _, e in entries) if n else None,
        "length_mean": sum(e[5] for _, e in entries) / n if n else None,
    }


def _merged(record: Any) -> tuple[dict[str, Any], list[tuple[int, list[float]]]]:
    """One record's fields and entries from the log's, whose ``by_shard`` (several writing processes: RLlib's env
    runners) are added up entry by entry at the widest stride."""
    rec = record if isinstance(record, dict) else {}
    shards = rec.get("by_shard")
    if not isinstance(shards, dict):
        return rec, _entries(rec)
    recs = [r for r in shards.values() if isinstance(r, dict)]
    stride = max((_stride(r) for r in recs), default=1)
    bins: dict[int, list[float]] = {}
    best: dict[str, Any] | None = None
    for r in recs:
        for it, e in _entries(r):
            b = bins.setdefault(it // stride * stride, [0.0, 0.0, 0.0, math.inf, -math.inf, 0.0])
            b[0], b[1], b[2], b[5] = b[0] + e[0], b[1] + e[1], b[2] + e[2], b[5] + e[5]
            b[3], b[4] = min(b[3], e[3]), max(b[4], e[4])
        top = r.get("best")
        if isinstance(top, dict) and isinstance(top.get("return"), int | float):
            best = top if best is None or top["return"] > best["return"] else best
    fields = {
        "source": next((r["source"] for r in recs if isinstance(r.get("source"), str)), None),
        "iterations": max((r["iterations"] for r in recs if _count(r.get("iterations"))), default=None),
        "stride": stride,
        "partial": sum(r["partial"] for r in recs if isinstance(r.get("partial"), int)),
        "best": best,
    }
    return fields, sorted(bins.items())


def summarize_returns(record: Any, iterations: int) -> ReturnsSection:
    """The section's data from the log's ``returns`` record and the run's iterations (the record's own where it says
    them: RLlib's training iterations, which its evaluation runners' rows run one weights version beyond). The
    evaluation's records (RLlib's evaluation runners') are counted apart (``evaluation``)."""
    record, evaluated = _split(record)
    rec, entries = _merged(record)
    stride = _stride(rec)
    if _count(rec.get("iterations")):  # the iterations the integration collected (not an evaluation's beyond)
        iterations = rec["iterations"]
    if entries:
        iterations = max(iterations, entries[-1][0] + stride)
    by: dict[str, list[Any]] = {k: [] for k in ("iteration", "episodes", "return_mean", "return_std")}
    by |= {k: [] for k in ("return_min", "return_max", "length_mean")}
    for it, (n, s, sq, lo, hi, length) in entries:
        mean = s / n
        values = (it, int(n), mean, math.sqrt(max(sq / n - mean * mean, 0.0)), lo, hi, length / n)
        for k, v in zip(by, values, strict=True):
            by[k].append(v)
    best = rec.get("best") if isinstance(rec.get("best"), dict) else None
    data = ReturnsSection(
        source=str(rec["source"]) if isinstance(rec.get("source"), str) else None,
        episodes=sum(int(e[0]) for _, e in entries),
        iterations=iterations,
        partial=rec["partial"] if isinstance(rec.get("partial"), int) else 0,
        stride=stride,
        best=best,
        by_iteration=by,
        evaluation=_evaluated(evaluated),
    )
    if entries and iterations > 0:
        tenth = max(1, math.ceil(iterations / 10))
        data.first_tenth = _pool(entries, 0, tenth - 1)
        data.last_tenth = _pool(entries, iterations - tenth, iterations - 1)
    return data


class Returns(Section[ReturnsSection]):
    key = "returns"
    needs: ClassVar[str | None] = "returns"
    json_when_absent: ClassVar[bool] = False  # logs written before the capability: their JSON as it was
    says_when_absent: ClassVar[bool] = True  # where the integration says why it recorded none

    def compute(self, log: Log, acc: Any) -> ReturnsSection:
        return summarize_returns(log.meta.get("returns"), log.iterations)

    def to_json(self, data: ReturnsSection) -> Any:
        out = super().to_json(data)
        if out.get("evaluation") is None:  # a log without an evaluation's episodes: its JSON as before
            out.pop("evaluation", None)
        return out

    def unavailable(self, data: ReturnsSection | None, log: Log) -> list[str]:
        if data is None and (why := log.not_measurable.get("returns")):
            return [f"returns (the episodes each iteration ended): not recorded for this run ({why})"]
        return []

    def findings(self, data: ReturnsSection) -> list[str]:
        a, b = data.first_tenth, data.last_tenth
        if a is None or b is None or data.iterations < MIN_ITERATIONS or min(a.episodes, b.episodes) < MIN_EPISODES:
            return []
        if a.return_mean is None or b.return_mean is None or a.return_std is None or b.return_std is None:
            return []
        spread = math.sqrt((a.return_std**2 + b.return_std**2) / 2)
        if abs(b.return_mean - a.return_mean) > SAME * spread:
            return []
        return [
            f"returns did not change over {data.iterations:,} iterations: mean return {a.return_mean:.4g} over the "
            f"first tenth's {a.episodes:,} episodes, {b.return_mean:.4g} over the last tenth's {b.episodes:,} "
            f"(episodes' std {spread:.3g})"
        ]

    def text(self, data: ReturnsSection, caps: Capabilities) -> list[Block]:
        return [Line(safe(returns_line(data)))]


def returns_line(data: ReturnsSection) -> str:
    """The run's returns in one line (plain text)."""
    if not data.episodes:
        return (
            f"returns: no episode ended in the log's {data.iterations:,} iteration{'s' if data.iterations != 1 else ''}"
            + _partial(data)
            + _evaluation_words(data)
        )
    source = SOURCES.get(data.source or "", data.source or "unknown source")
    line = f"returns ({source}): {data.episodes:,} episode{'s' if data.episodes != 1 else ''} ended"
    a, b = data.first_tenth, data.last_tenth
    if a is not None and b is not None and a.return_mean is None and b.return_mean is None:
        line += f"; none in the first or the last tenth of iterations ({_where(a)}; {_where(b)})"
    elif a is not None and b is not None and a.return_mean is None:  # the figure first, then the tenth without one
        line += f"; mean return {_tenth(b, 'last tenth of iterations')}, {_tenth(a, 'first')}"
    elif a is not None and b is not None:
        line += f"; mean return {_tenth(a, 'first tenth of iterations')}, {_tenth(b, 'last')}"
    best = data.best or {}
    if isinstance(best.get("return"), int | float):
        line += f"; best {best['return']:.4g} (iteration {fmt(best.get('iteration'))})"
    return line + _partial(data) + _evaluation_words(data)


def _evaluation_words(data: ReturnsSection) -> str:
    """'; evaluation: N episodes, mean R' where the log counts an evaluation's episodes apart (none: '')."""
    ev = data.evaluation
    if not ev or not ev.get("episodes"):
        return "; evaluation: no episode ended" if ev else ""
    n = int(ev["episodes"])
    return f"; evaluation: {n:,} episode{'s' if n != 1 else ''}, mean {ev['return_mean']:.4g}"


def _where(t: Tenth) -> str:
    return f"iteration {t.first}" if t.first == t.last else f"iterations {t.first}-{t.last}"


def _tenth(t: Tenth, which: str) -> str:
    where = _where(t)
    if t.return_mean is None:
        return f"none ended in the {which} ({where})"
    return f"{t.return_mean:.4g} in the {which} ({where}, {t.episodes:,} episode{'s' if t.episodes != 1 else ''})"


def _partial(data: ReturnsSection) -> str:
    return f"; {data.partial:,} under way when the probe started, not counted" if data.partial else ""
