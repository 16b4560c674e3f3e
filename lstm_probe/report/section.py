"""What a report section is, and the parts every section is built from.

A section (:class:`Section`) is one unit: its data (a dataclass, given in the JSON under the section's
``key``), its accumulator (how its share of the scalar rows adds up over the runs of whole iterations a
log is read in), its text (:data:`Block` values the CLI prints, numbered in the order of
:data:`lstm_probe.report.registry.SECTIONS`), its warnings and its findings.

How an accumulator merges is in its type: an :class:`Accumulator` is a dataclass whose fields are
mergeable values (:class:`Sum`, :class:`Max`, :class:`Counts`, :class:`Parts`, :class:`Keyed`,
:class:`GroupStats`, ...), each with an associative ``merge``; the accumulator merges field by field.
The report is the same whatever the runs are (``summarize(chunk_rows=...)``).
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np
import pyarrow.dataset as ds

from lstm_probe.contract import Capabilities
from lstm_probe.log.schema import stores_vectors, summary_capture, traced_envs
from lstm_probe.report.numeric import clean
from lstm_probe.text import safe

if TYPE_CHECKING:
    from lstm_probe.log.reader import LogInfo
    from lstm_probe.report.scan import Chunk

T = TypeVar("T")
K = TypeVar("K")
D = TypeVar("D")
M = TypeVar("M", bound="Mergeable")


class Mergeable(ABC):
    """A value that two partial results combine into: ``a.merge(b)`` folds ``b`` into ``a``; merging
    is associative, so runs of rows may be added up in any grouping (in log order)."""

    @abstractmethod
    def merge(self, other: Any) -> None: ...


@dataclass
class Sum(Mergeable):
    """A count or a total."""

    value: int = 0

    def add(self, n: int) -> None:
        self.value += n

    def merge(self, other: Sum) -> None:
        self.value += other.value


@dataclass
class Max(Mergeable):
    """The largest value seen; None before any."""

    value: float | None = None

    def add(self, v: float) -> None:
        self.value = v if self.value is None else max(self.value, v)

    def merge(self, other: Max) -> None:
        if other.value is not None:
            self.add(other.value)


@dataclass
class ArrayMax(Mergeable):
    """The elementwise maximum of equal-length arrays; None before any."""

    value: np.ndarray | None = None

    def add(self, v: np.ndarray) -> None:
        self.value = v if self.value is None else np.maximum(self.value, v)

    def merge(self, other: ArrayMax) -> None:
        if other.value is not None:
            self.add(other.value)


@dataclass
class ArrayMin(Mergeable):
    """The elementwise minimum of equal-length arrays; None before any."""

    value: np.ndarray | None = None

    def add(self, v: np.ndarray) -> None:
        self.value = v if self.value is None else np.minimum(self.value, v)

    def merge(self, other: ArrayMin) -> None:
        if other.value is not None:
            self.add(other.value)


class Counts(dict[K, int], Mergeable):
    """Counts per key, added up."""

    def add(self, key: K, n: int = 1) -> None:
        self[key] = self.get(key, 0) + n

    def merge(self, other: Counts[K]) -> None:
        for k, n in other.items():
            self.add(k, n)


class Parts(list[T], Mergeable):
    """Per-run pieces (arrays, frames), concatenated in log order; a piece is one value per sequence or
    episode, never per row."""

    def merge(self, other: Parts[T]) -> None:
        self.extend(other)


class Keyed(dict[K, M], Mergeable):
    """One mergeable value per key: values under the same key merge."""

    def merge(self, other: Keyed[K, M]) -> None:
        for k, v in other.items():
            if k in self:
                self[k].merge(v)
            else:
                self[k] = v


class GroupStats(dict[Any, np.ndarray], Mergeable):
    """Per group: ``first`` counts, then [count, sum, max] per value (a row of
    :func:`lstm_probe.report.numeric.group_stats`): counts and sums add up, maxima keep the larger."""

    def __init__(self, first: int = 0) -> None:
        super().__init__()
        self.first = first

    def add(self, key: Any, stats: np.ndarray) -> None:
        old = self.get(key)
        if old is None:
            self[key] = stats
            return
        merged = old + stats
        merged[self.first + 2 :: 3] = np.fmax(old[self.first + 2 :: 3], stats[self.first + 2 :: 3])
        self[key] = merged

    def merge(self, other: GroupStats) -> None:
        for k, v in other.items():
            self.add(k, v)


class Accumulator(Mergeable, Generic[T]):
    """A section's running totals: ``add`` takes one part of the rows (a :class:`~lstm_probe.report.scan.Chunk`
    for sections that read the scalar scan); ``merge`` folds another accumulator of the same type in,
    field by field. Subclasses are dataclasses whose every field is :class:`Mergeable` and has a default."""

    @abstractmethod
    def add(self, part: T) -> None: ...

    def merge(self, other: Any) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            getattr(self, f.name).merge(getattr(other, f.name))


@dataclass(frozen=True)
class Line:
    """One line of text (rich markup; strings from the log already passed through ``text.safe``)."""

    text: str
    soft_wrap: bool = False


@dataclass(frozen=True)
class Panel:
    """Lines in a box under a title (the CLI numbers the first titled block of each section)."""

    title: str
    lines: tuple[str, ...]
    numbered: bool = True
    """False: shown without a number (the verdict above the numbered sections)."""


@dataclass(frozen=True)
class Table:
    """A table under a title; every cell is rich markup."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


Block = Line | Panel | Table


def fmt(v: Any) -> str:
    """A value as the text shows it: '-' for None, floats to three significant digits; strings from the
    log made safe to print (``text.safe``)."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return safe(v)


def fmt_cos(v: Any) -> str:
    """A cosine as the text shows it: as :func:`fmt` (three significant digits), with more where three would read 1
    (or -1) for a cosine that is not (0.99995: '0.99995', up to six digits; closer still: '1 - 3e-09'); exactly '1'
    only where it is 1."""
    if not isinstance(v, float) or not math.isfinite(v) or abs(v) == 1:
        return fmt(v)
    for digits in (3, 4, 5, 6):
        text = f"{v:.{digits}g}"
        if text.lstrip("-") != "1":
            return text
    gap = abs(v) - 1
    return f"{'-' if v < 0 else ''}1 {'-' if gap < 0 else '+'} {abs(gap):.2g}"


def module_label(role: str, names: Any, critic: Any = None) -> str:
    """What the what-if and memory sections call a recurrent module they name by its role ('actor', 'critic'): the
    name the log's rows give it (``names``: the measurement's ``module_names``, role -> traced name; a role without
    one is its own name, as sb3's, rsl_rl's and RLlib's modules are), with the role beside it where it says more:
    'lstm (actor)', and 'lstm (critic, shared)' for values read off the actor's module (``critic`` 'shared')."""
    given = names if isinstance(names, dict) else {}
    shared = critic == "shared" and role == "critic"
    name = str(given.get(role) or (given.get("actor") if shared else None) or ("actor" if shared else role))
    if shared:
        return f"{name} (critic, shared)"
    return name if name == role else f"{name} ({role})"


def fmt_steps(v: float | None) -> str:
    """A step count or a statistic of step counts (a length, its median or mean) as the text says it, in panels
    and findings alike: three significant digits below 1,000 (20.5, 21.8, 200: a median of 20.5 is never said as
    20), whole steps above (1,000, 12,346); '-' for None."""
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def cut_spans(n: int, parts: int) -> list[tuple[int, int]]:
    """A run's ``n`` iterations (or other points in order) cut into at most ``parts`` spans: consecutive [start,
    stop) ranges of ``range(n)``, equal in length within one, the last the longest (one per point where ``n`` is
    fewer; none where 0). The staleness trend and the memory horizons cut their iterations so."""
    k = min(n, parts)
    return [(i * n // k, (i + 1) * n // k) for i in range(k)]


def span_words(first: int, last: int) -> str:
    """A span of iterations (or a range of counts) as the text says it: '12', or '12-19'."""
    return str(first) if first == last else f"{first}-{last}"


def kept_columns(kept: int | None, n_envs: int | None, runners: int | None = None) -> str:
    """The env columns a log keeps rows of, in words: 'env columns 0..3 of 256' (``kept``: K of
    ``--trace-envs K --other-envs none``; ``n_envs``: the run's envs, where known, per env runner where
    ``runners``, more than one, stepped ``n_envs`` each: 'env columns 0..3 of each runner's 32'); '' where
    every column has rows (``kept`` None)."""
    if kept is None:
        return ""
    cols = "env column 0" if kept == 1 else f"env columns 0..{kept - 1}"
    if n_envs and runners and runners > 1:
        return f"{cols} of each runner's {n_envs:,}"
    return f"{cols} of {n_envs:,}" if n_envs else cols


def module_word(kinds: dict[str, str]) -> str:
    """'LSTM' or 'GRU' where every module of ``kinds`` is one (cells included), else 'recurrent module'."""
    words = {k.removesuffix("Cell") for k in kinds.values()}
    return words.pop() if len(words) == 1 and words <= {"LSTM", "GRU"} else "recurrent module"


def env_runners(meta: dict[str, Any]) -> int | None:
    """The env runners of an RLlib run's metadata where more than one (each stepped ``n_envs`` envs, and kept
    its own ``--trace-envs`` columns); None otherwise."""
    rl = meta.get("rllib")
    n = rl.get("env_runners") if isinstance(rl, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else None


@dataclass
class Log:
    """What every section may read: the dataset, its info and metadata, its declared capabilities."""

    data: ds.Dataset
    info: LogInfo
    caps: Capabilities
    iterations: int = 0
    """Iterations in the log (the largest iteration + 1), from the scalar scan."""
    upper_layers: bool = False
    """Some rows belong to a layer above 0 (stacked LSTM/GRU layers): sections that read more than the scan's
    first layer read those rows too."""
    chunk_rows: int = 4_000_000
    """Rows a section reads at once when it reads rows beyond the scalar scan (``summarize(chunk_rows=...)``)."""

    @property
    def meta(self) -> dict[str, Any]:
        return self.info.metadata

    @property
    def not_measurable(self) -> dict[str, str]:
        """What the writing integration says it cannot measure for this run, and why (metadata ``not_measurable``:
        ``what_if``, ``memory``, ``staleness`` -> a sentence); empty where it says nothing."""
        said = self.meta.get("not_measurable")
        return {str(k): str(v) for k, v in said.items() if isinstance(v, str)} if isinstance(said, dict) else {}

    @property
    def kinds(self) -> dict[str, str]:
        """Module name -> its kind ('LSTM', 'GRU', 'LSTMCell', 'GRUCell'), as the log's metadata declares it."""
        modules = (self.meta.get("architecture") or {}).get("modules") or {}
        return {str(k): str(v.get("kind")) for k, v in modules.items() if isinstance(v, dict) and v.get("kind")}

    @property
    def kind(self) -> str:
        """What to call the traced modules in a sentence: 'LSTM' or 'GRU' where every module is one
        (cells included), else 'recurrent module'."""
        return module_word(self.kinds)

    @property
    def n_envs(self) -> int | None:
        """The run's number of envs, as its metadata says (None where it says none)."""
        n = self.meta.get("n_envs")
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    @property
    def env_runners(self) -> int | None:
        """RLlib: the env runners that stepped ``n_envs`` envs each, where more than one (``n_envs`` is then
        per runner); None otherwise."""
        return env_runners(self.meta)

    @property
    def kept_envs(self) -> int | None:
        """K where the log keeps the rows of env columns 0..K-1 alone (``--trace-envs K --other-envs none``: the
        probe writes no row of any other column), fewer than the run's envs: every shape, call and count read
        from the rows is then of those columns, not the run's. None where every column has rows."""
        capture = self.meta.get("capture")
        if not isinstance(capture, dict) or capture.get("other_envs") != "none":
            return None
        k = traced_envs(capture)
        n = self.n_envs
        return None if k is None or (n is not None and k >= n) else k

    @property
    def vectors(self) -> bool:
        """The log's rows may hold h/c vectors (:func:`stores_vectors`)."""
        return stores_vectors(self.meta)

    @property
    def summary(self) -> bool:
        """The log was written with ``--capture summary`` (its vectors, if any, are the traced envs' alone)."""
        return summary_capture(self.meta)


class Section(ABC, Generic[D]):
    """One report section. Subclasses set ``key`` and implement ``compute`` and ``text``; the rest is
    optional. Register an instance in :data:`lstm_probe.report.registry.SECTIONS`."""

    key: ClassVar[str]
    """The JSON key and the :class:`~lstm_probe.report.Report` attribute."""
    needs: ClassVar[str | None] = None
    """A :class:`~lstm_probe.contract.Capabilities` field the log must declare for the section to apply.
    Such sections come after ``findings`` and ``unavailable`` in the JSON (null where they do not apply),
    so the keys every log has keep their order."""
    json_when_absent: ClassVar[bool] = True
    """False: a section that needs a capability has no JSON key at all where it does not apply (not null), so the
    JSON of logs written before the capability stays as it was."""
    findings_rank: ClassVar[int] = 60
    """Where the section's findings go in the list (lower first, ties in registry order): what training
    did first, the run's own state last."""
    alongside: ClassVar[bool] = False
    """:meth:`compute` reads the log itself, needs nothing the scan finds (no accumulator, not
    ``Log.iterations``) and holds little: ``summarize`` may compute it in a thread while the scan runs, where
    the memory budget leaves the scan's runs whole (the same data either way)."""

    def applies(self, caps: Capabilities) -> bool:
        return self.needs is None or bool(getattr(caps, self.needs))

    def accumulator(self) -> Accumulator[Chunk] | None:
        """A fresh accumulator of the section's share of the scalar scan; None if it reads none."""
        return None

    @abstractmethod
    def compute(self, log: Log, acc: Any) -> D:
        """The section's data, from the log and the accumulator that added up the whole scan."""

    def reader(self, log: Log) -> Any:
        """For an :attr:`alongside` section: a reader the scan feeds its own batches to instead of the section's
        read of the log (:class:`lstm_probe.report.scan.Feed`: its columns, ``add(batch)``), where the scan
        reads every row of the log; None: the section reads for itself."""
        return None

    def from_reader(self, log: Log, reader: Any) -> D | None:
        """The section's data from its :meth:`reader` after the scan fed it every batch; None: computed by
        :meth:`compute` after all (the answer could depend on the order the scan read the rows in)."""
        return None

    def warnings(self, data: D, log: Log) -> list[str]:
        """Warnings the section raises (plain text)."""
        return []

    says_when_absent: ClassVar[bool] = False
    """:meth:`unavailable` is asked also where :meth:`compute` gave None (the section then says why)."""

    def unavailable(self, data: D, log: Log) -> list[str]:
        """What the section cannot show from this log, and why (plain text)."""
        return []

    def findings(self, data: D) -> list[str]:
        """What is worth knowing, as plain sentences."""
        return []

    @abstractmethod
    def text(self, data: D, caps: Capabilities) -> list[Block]:
        """What the CLI prints; empty: nothing (and no number taken)."""

    def to_json(self, data: D) -> Any:
        return clean(dataclasses.asdict(data))  # type: ignore[call-overload]
