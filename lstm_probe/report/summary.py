"""``summarize(path) -> Report``: every registered section computed from one log, and the report they make."""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import pyarrow.dataset as ds

from lstm_probe.contract import Capabilities
from lstm_probe.log.logfiles import reading
from lstm_probe.log.reader import dataset
from lstm_probe.report import registry
from lstm_probe.report.reading import first_layer_only
from lstm_probe.report.scan import COLUMNS, REPORT_CHUNK_ROWS, Progress, fit, scan
from lstm_probe.report.section import Block, Line, Log, Panel, Section
from lstm_probe.report.sections.doctor_words import global_pairing
from lstm_probe.report.sections.horizon import judge_resets
from lstm_probe.report.sections.sequences import judge_env_steps
from lstm_probe.report.verdict import Verdict, verdict
from lstm_probe.text import safe


@dataclass
class Report:
    """Everything ``lstm-probe report`` shows. Each section's data is an attribute named by its key
    (``report.run``, ``report.calls``, ...; None where the section does not apply to the log);
    ``--json`` prints :meth:`to_dict`."""

    path: str
    schema_version: int
    warnings: list[str]
    sections: dict[str, Any]
    """Section key -> its data, in registry order."""
    capabilities: Capabilities
    findings: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    verdict: Verdict | None = None
    """Stale or not, whether it matters, which burn-in would suffice (``report/verdict.py``): shown first."""

    def __getattr__(self, name: str) -> Any:
        sections = self.__dict__.get("sections")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"'Report' object has no attribute {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON: path, schema_version, warnings, the sections every log has, findings, unavailable,
        then the sections only some logs have (null where they do not apply)."""
        out: dict[str, Any] = {
            "path": self.path,
            "schema_version": self.schema_version,
            "warnings": list(self.warnings),
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
        }
        for s in _json_order():
            if s.needs is None:
                out[s.key] = s.to_json(self.sections[s.key])
        out["findings"] = list(self.findings)
        out["unavailable"] = list(self.unavailable)
        for s in _json_order():
            if s.needs is not None:
                data = self.sections[s.key]
                if data is not None or s.json_when_absent:
                    out[s.key] = None if data is None else s.to_json(data)
        return out

    def text(self) -> list[list[Block]]:
        """What the CLI prints, one list of blocks per section (then what this log cannot show, then the
        findings). Strings from the log are made safe to print here."""
        out: list[list[Block]] = []
        if self.verdict is not None:
            out.append([Panel("Verdict", tuple(safe(line) for line in self.verdict.lines), numbered=False)])
        out += [s.text(self.sections[s.key], self.capabilities) for s in _present(self)]
        out.append([Line(f"[dim]not in this log: {safe(u)}[/]") for u in self.unavailable])
        if self.findings:
            out.append([Panel("Findings", tuple(f"- {safe(f)}" for f in self.findings))])
        return out


def _json_order() -> list[Section[Any]]:
    """The sections every log has, then those that need a capability (their keys come last in the JSON)."""
    return [s for s in registry.SECTIONS if s.needs is None] + [s for s in registry.SECTIONS if s.needs is not None]


def _present(rep: Report) -> list[Section[Any]]:
    return [s for s in registry.SECTIONS if rep.sections.get(s.key) is not None]


class _Alongside:
    """The sections that may be computed while the scan runs (:attr:`Section.alongside`), computed in one
    thread in registry order, from the start of the read: on two cores the scan's numpy work and their reads
    overlap (a 9.9M-row log: ~1.3 s of the doctor's and state health's wall time). Where the budget would cut
    the scan's runs (``scan.fit``), they are computed after it, as the others are. A section that raises
    stops the thread; its error is raised where it would have been (:meth:`result`)."""

    def __init__(self, sections: list[Section[Any]], log: Log) -> None:
        self.keys = [s.key for s in sections]
        self._done = {key: threading.Event() for key in self.keys}
        self._out: dict[str, tuple[bool, Any]] = {}
        threading.Thread(target=self._run, args=(sections, log), name="lstm-probe-sections", daemon=True).start()

    def _run(self, sections: list[Section[Any]], log: Log) -> None:
        try:
            for s in sections:
                try:
                    self._out[s.key] = (True, s.compute(log, None))
                except BaseException as exc:  # raised in the caller's thread, at this section's turn
                    self._out[s.key] = (False, exc)
                    return
                finally:
                    self._done[s.key].set()
        finally:
            for done in self._done.values():  # those after an error: never computed (as in one thread)
                done.set()

    def result(self, key: str) -> Any:
        """The section's data, once computed (its error raised here)."""
        self._done[key].wait()
        ok, value = self._out.get(key, (False, RuntimeError(f"section {key} was not computed")))
        if not ok:
            raise value
        return value


class _Fed:
    """A section's reader (:meth:`Section.reader`) fed the scan's batches in a thread of its own, at most
    :data:`FED_AHEAD` batches behind the scan (its numpy work overlaps the scan's on two cores; the batches are
    the scan's, not copies). An error in the reader is raised where the section's data is asked
    (:meth:`result`); the batches after it are dropped."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.columns: list[str] = list(reader.columns)
        self._ready: queue.Queue[Any] = queue.Queue(maxsize=FED_AHEAD)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="lstm-probe-fed", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (batch := self._ready.get()) is not None:
            if self._error is None:
                try:
                    self.reader.add(batch)
                except BaseException as exc:  # raised in the caller's thread, at the section's turn
                    self._error = exc

    def add(self, batch: Any) -> None:
        self._ready.put(batch)

    def close(self) -> None:
        """No more batches (also where the scan failed): the thread ends once it has added those handed."""
        if self._thread.is_alive():
            self._ready.put(None)
            self._thread.join()

    def result(self) -> Any:
        """The reader, once every batch is added (its error raised here)."""
        self.close()
        if self._error is not None:
            raise self._error
        return self.reader


FED_AHEAD = 2
"""Batches of the scan a fed section's thread may be behind (each a view of the scan's batch: no copy)."""


def _resets_inside(results: dict[str, Any]) -> None:
    """The doctor's verdict reaches the sections that say how far back gradients flow (after every section is
    computed, before the findings): the episode starts inside a per-step loop's training sequences cut the
    gradient unless the doctor found the state carried across them (:func:`judge_resets`)."""
    sequences, doctor = results.get("sequences"), results.get("doctor")
    if sequences is None or not sequences.starts_inside:
        return
    if doctor is None:
        judge_resets(sequences, [])
    else:
        judge_resets(sequences, [(p.kind, p.phase) for p in doctor.problems], doctor.train_resets)


def _env_steps(results: dict[str, Any]) -> None:
    """The doctor's global counter tagged as env_step (its problem 'global_env_step') reaches the sequences section,
    which then withholds what it counted from env steps (:func:`judge_env_steps`)."""
    sequences, doctor = results.get("sequences"), results.get("doctor")
    found = [p for p in getattr(doctor, "problems", None) or [] if p.kind == "global_env_step"]
    if sequences is not None and found:
        judge_env_steps(sequences, int(found[0].first["stride"]))
    staleness = results.get("staleness")
    if staleness is not None and found and staleness.provenance_ok is not None:
        staleness.global_pairing = global_pairing(int(found[0].first["stride"]))


def _memory_from_sequences(results: dict[str, Any]) -> None:
    """The memory section sets what the sequences section counted beside its horizons (how far back gradients
    flow; the log's completed episodes, where it holds them for every env column), so the report gives one answer
    to each (``MemorySection.from_sequences``), and marks the modules the calls section finds no rollout call of
    (``MemorySection.from_calls``)."""
    sequences, memory = results.get("sequences"), results.get("memory")
    if sequences is not None and memory is not None and memory.measured:
        memory.from_sequences(sequences)
    calls = results.get("calls")
    if calls is not None and memory is not None and memory.measured:
        memory.from_calls({g.module for g in calls.groups if g.phase == "rollout"}, {g.module for g in calls.groups})


def _trend_across(results: dict[str, Any]) -> None:
    """The staleness trend of a log whose drifts the cross-process check pairs (its train rows carry none): the
    check's last minibatch of each iteration (``cycling_minibatches``) becomes the staleness section's
    ``by_iteration`` (its JSON, the HTML page's figure and ``StalenessSection.trend``)."""
    staleness, cross = results.get("staleness"), results.get("cross_process")
    if staleness is not None and cross is not None and cross.by_iteration and not staleness.by_iteration:
        staleness.by_iteration = cross.by_iteration


def summarize(
    path: str | os.PathLike[str], *, chunk_rows: int = REPORT_CHUNK_ROWS, progress: Progress | None = None
) -> Report:
    """Read a log (file, dataset directory or a killed run's parts) and compute every report section.
    ``chunk_rows``: see :data:`REPORT_CHUNK_ROWS` (the result does not depend on it). ``progress``: told how
    far the read is (:data:`lstm_probe.report.scan.Progress`)."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be at least 1, got {chunk_rows}")
    with reading(path, "reported", values=True):
        return _summarize(path, chunk_rows, progress)


def _summarize(path: str | os.PathLike[str], chunk_rows: int, progress: Progress | None = None) -> Report:
    data, info = dataset(path)
    log = Log(data, info, Capabilities.from_metadata(info.metadata), chunk_rows=chunk_rows)
    # row-group statistics answer this without reading rows where every layer is 0
    log.upper_layers = info.rows > 0 and data.count_rows(filter=ds.field("layer") > 0) > 0
    sections = [s for s in registry.SECTIONS if s.applies(log.caps)]
    accumulators = {s.key: acc for s in sections if (acc := s.accumulator()) is not None}
    # a log of first-layer rows only: the scan reads every row, and a section that reads rows for itself may be
    # fed the scan's batches instead (the doctor: its columns decoded once, not twice)
    plain = first_layer_only(data)
    readers = {s.key: r for s in sections if s.alongside and plain and (r := s.reader(log)) is not None}
    early = [s for s in sections if s.alongside and s.key not in accumulators and s.key not in readers]
    ahead = _Alongside(early, log) if early and fit(chunk_rows, len(COLUMNS) + 1) >= chunk_rows else None
    fed = {key: _Fed(r) for key, r in readers.items()}
    try:
        totals = scan(data, list(accumulators.values()), chunk_rows, progress, list(fed.values()), plain)
    finally:
        for f in fed.values():
            f.close()
    log.iterations = totals.iterations
    warnings = list(info.warnings)
    if totals.duplicates:
        warnings.append(
            f"{totals.duplicates} duplicate rows (the same call, module, layer, column and step twice): was a "
            "part file copied or read twice? Sections count them twice"
        )
    if info.rows == 0:
        warnings.append("the log holds no rows: training made no LSTM call before it stopped")
    results: dict[str, Any] = {s.key: None for s in registry.SECTIONS}
    for i, s in enumerate(sections):
        if progress is not None:
            progress(s.key, i, len(sections))
        if ahead is not None and s.key in ahead.keys:
            results[s.key] = ahead.result(s.key)
        elif s.key in fed and (done := s.from_reader(log, fed[s.key].result())) is not None:
            results[s.key] = done
        else:
            results[s.key] = s.compute(log, accumulators.get(s.key))
    _resets_inside(results)
    _env_steps(results)
    _memory_from_sequences(results)
    _trend_across(results)
    unavailable: list[str] = []
    for s in _json_order():
        if results[s.key] is not None:
            warnings.extend(s.warnings(results[s.key], log))
        if results[s.key] is not None or s.says_when_absent:
            unavailable.extend(s.unavailable(results[s.key], log))
    ranked = sorted(sections, key=lambda s: s.findings_rank)
    findings = [f for s in ranked for f in s.findings(results[s.key])]
    return Report(
        path=str(info.path),
        schema_version=int(info.metadata.get("schema_version") or 0),  # (the reader checked its type)
        warnings=warnings,
        sections=results,
        capabilities=log.caps,
        findings=findings,
        unavailable=unavailable,
        verdict=verdict(
            results.get("staleness"),
            results.get("what_if"),
            log.caps,
            results.get("cross_process"),
            kept_envs=log.kept_envs,
            run_envs=log.n_envs,
            runners=log.env_runners,
            reasons=getattr(results.get("calls"), "sequence_start_reasons", None),
            mid_rollout=getattr(results.get("sequences"), "mid_rollout_starts", None),
            problems=getattr(results.get("doctor"), "problems", None),
            not_measurable=log.not_measurable,
        ),
    )
