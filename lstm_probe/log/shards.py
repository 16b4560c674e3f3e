"""One metadata document from the several a multi-process log holds (RLlib: env runners write the rollout rows,
learners the train rows, each process its own shard of part files, ``part-<shard>-NNNNN.parquet``): each key from
the most authoritative shard that has it, the probe's cost and the counts of calls in training mode summed.

Read side: no torch, nothing executed from a log (JSON values only).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROLLOUT_KEYS = frozenset({"n_envs", "progress"})
"""Metadata keys that are rollout facts: env runners' shards are authoritative for them."""


def shard_of(file: Path) -> str:
    """The writer of a part file: ``part-<shard>-00012.parquet``, or "" for ``part-00012.parquet``."""
    m = re.fullmatch(r"part-(?:(.+)-)?\d{5}\.parquet", file.name)
    return m.group(1) or "" if m else ""


def shard_rank(shard: str, rollout: bool) -> int:
    """How authoritative a shard's metadata is (0 first): learners for everything (the gradient-flow and
    architecture verdicts are computed there), env runners for the rollout facts (:data:`ROLLOUT_KEYS`),
    then any other shard, and evaluation runners last (never over a training process's)."""
    kind = re.sub(r"\d+$", "", shard)
    if kind.startswith("eval"):
        return 3
    if kind == "learner":
        return 1 if rollout else 0
    if kind == "runner":
        return 0 if rollout else 1
    return 2


def merge_shards(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One metadata document from each shard's: each key from the most authoritative shard that has it
    (:func:`shard_rank`; ties by shard name)."""
    if len(docs) == 1:
        return dict(next(iter(docs.values())))
    order = {r: sorted(docs, key=lambda s: (shard_rank(s, r), s)) for r in (False, True)}
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for s in order[False] for k in docs[s]):
        for s in order[key in ROLLOUT_KEYS]:
            if key in docs[s]:
                out[key] = docs[s][key]
                break
    return out


def summed_cost(finals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the probe cost (``probe_cost``), summed over the processes that wrote the log; the writer kind: the
    same in every process, or "mixed"."""
    cost: dict[str, Any] = {}
    for doc in finals.values():
        spent = doc.get("probe_cost")
        for k, v in (spent if isinstance(spent, dict) else {}).items():  # (a damaged shard's: nothing)
            if isinstance(v, int | float):
                cost[k] = cost.get(k, 0) + v
            else:
                cost[k] = v if cost.get(k, v) == v else "mixed"
    return cost


def summed_training_mode(records: list[Any]) -> dict[str, Any]:
    """The log's ``training_mode`` from each writing process's (``records``: each shard's, in any order; a rollout
    process counts its rollout calls, a learner its train calls): per module, per phase, [calls in training mode,
    calls] added up. What is not a count pair of integers (a damaged or foreign shard's) adds nothing."""
    out: dict[str, dict[str, list[int]]] = {}
    for record in records:
        if not isinstance(record, dict):
            continue
        for module, phases in record.items():
            if not isinstance(phases, dict):
                continue
            into = out.setdefault(str(module), {})
            for phase, pair in phases.items():
                if _is_pair(pair):
                    got = into.setdefault(str(phase), [0, 0])
                    got[0] += pair[0]
                    got[1] += pair[1]
    return out


def _is_pair(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    )
