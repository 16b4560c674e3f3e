"""The values a log can hold in the columns :func:`reader.load` filters on, from the Parquet footer statistics
alone (each row group's min and max per column; no row is read): a filter value outside every row group's
min..max selects nothing, whatever the other filters are, and is refused with one line (:func:`check`) that
names it and the values the log holds.

The statistics bound what a row group holds, they do not list it: ``phase='predict'`` between a rollout row
group's 'bootstrap' and 'rollout' passes the check and may still select no row (an empty frame, as a
combination of filters that selects nothing gives). A row group without statistics for a column (a foreign
writer's) allows anything there: the column is not checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lstm_probe.errors import BadInput
from lstm_probe.log.schema import PHASES

if TYPE_CHECKING:
    import pyarrow.dataset as ds

Span = tuple[Any, Any]


def spans(data: ds.Dataset, column: str) -> list[Span] | None:
    """The min..max spans of ``column`` over the row groups of ``data``, merged and sorted ([] where every row
    leaves it null or the files lack it: the worker of a log one process wrote); None where a row group that
    holds values in it has no statistics for it (it may hold anything)."""
    import pyarrow.dataset as ds

    if not isinstance(data, ds.FileSystemDataset):
        return None
    out: list[Span] = []
    for frag in data.get_fragments():
        meta = frag.metadata
        index = [j for j in range(meta.num_columns) if meta.schema.column(j).path == column]
        if not index:  # a file without the column (an older log's worker): null in every row
            continue
        if len(index) != 1:
            return None
        ids = [rg.id for rg in frag.row_groups] if frag.row_groups else range(meta.num_row_groups)
        for i in ids:
            rg = meta.row_group(i)
            if not rg.num_rows:
                continue
            st = rg.column(index[0]).statistics
            if st is not None and st.has_min_max and st.min is not None and st.max is not None:
                out.append((st.min, st.max))
            elif st is None or not st.has_null_count or st.null_count < rg.num_rows:
                return None  # values without statistics
    return _merge(out)


def _merge(found: list[Span]) -> list[Span]:
    merged: list[Span] = []
    for lo, hi in sorted(found):
        if merged and (lo <= merged[-1][1] or (isinstance(lo, int) and lo == merged[-1][1] + 1)):
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _words(held: list[Span], limit: int = 8) -> str:
    def one(v: Any) -> str:
        return repr(v) if isinstance(v, str) else str(v)

    parts = [one(lo) if lo == hi else f"{one(lo)}..{one(hi)}" for lo, hi in held[:limit]]
    return ", ".join(parts) + (", ..." if len(held) > limit else "")


OWN_TAGS = ("iteration", "epoch", "minibatch", "env", "env_step", "episode", "episode_step")
"""Columns an own loop fills from its ``tag()`` blocks alone (a null one there was not tagged)."""


def check(data: ds.Dataset, filters: dict[str, Any], who: str = "load") -> None:
    """:class:`BadInput` (one line) for the first filter none of whose values any row group of ``data`` can
    hold (by its footer statistics; ``filters``: column -> a value, a list of them, or None for no filter).
    A list some of whose values the log holds passes: it selects those (as ``probe(iterations=range(N))``).
    A log without rows passes everything (its filters select nothing, as before)."""
    if not _any_rows(data):
        return
    for name, value in filters.items():
        if value is None:
            continue
        values = list(value) if isinstance(value, list | tuple | set | range) else [value]
        try:  # a hostile footer's statistics of another type than the values asked: no check, never a traceback
            held = spans(data, name)
            if held is None or any(lo <= v <= hi for v in values for lo, hi in held):
                continue
        except (TypeError, ValueError):
            continue
        asked = f"{name}={value!r}"
        what = repr(values[0]) if len(values) == 1 else f"any of {values[:8]!r}"
        if not held:
            there = f"every row leaves {name} null" + (" (one process wrote the log)" if name == "worker" else "")
            if name in OWN_TAGS:
                there += f" (an own loop's rows hold it where its probe.tag(...) blocks give {name}=...)"
        else:
            there = f"its {name} values are {_words(held)} (by its footer statistics)"
        hint = f"; a phase is one of {', '.join(PHASES)}" if name == "phase" and not set(values) <= set(PHASES) else ""
        raise BadInput(f"{who}({asked}) selects no row: the log holds no {name} {what}; {there}{hint}")


def _any_rows(data: ds.Dataset) -> bool:
    """Whether the row groups of ``data`` hold a row (footer only; True for a dataset not of Parquet files)."""
    import pyarrow.dataset as ds

    if not isinstance(data, ds.FileSystemDataset):
        return True
    for frag in data.get_fragments():
        meta = frag.metadata
        ids = [rg.id for rg in frag.row_groups] if frag.row_groups else range(meta.num_row_groups)
        if any(meta.row_group(i).num_rows for i in ids):
            return True
    return False
