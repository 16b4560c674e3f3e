"""``summarize(path) -> Report``: what the LSTMs did and what is wrong with them, from a log's own rows.

Never prints. Reads only the columns a section needs, in bounded memory: the scalar columns in runs of
whole iterations (:data:`REPORT_CHUNK_ROWS` rows at most, every section added up over the runs), the h/c
vectors batch by batch and only for the state-health section. Works on torch-free machines.

The package: :mod:`.scan` reads the scalar rows in runs; :mod:`.section` says what a section is (data,
accumulator, text, JSON, findings); :mod:`.sections` holds one module per section; :mod:`.registry` lists
them in order; :mod:`.summary` computes them into a :class:`Report`. Sections ask the log's declared
:class:`~lstm_probe.contract.Capabilities`, never the name of the framework that wrote it.
"""

from __future__ import annotations

from lstm_probe.report.scan import REPORT_CHUNK_ROWS, read_scalars
from lstm_probe.report.section import Block, Line, Panel, Table
from lstm_probe.report.sections.architecture import ArchitectureSection
from lstm_probe.report.sections.calls import CallGroup, CallsSection
from lstm_probe.report.sections.cross_process import CrossProcessSection
from lstm_probe.report.sections.health import HealthSection
from lstm_probe.report.sections.run import RunSection
from lstm_probe.report.sections.sequences import SequencesSection
from lstm_probe.report.sections.staleness import StalenessSection
from lstm_probe.report.summary import Report, summarize

__all__ = [
    "REPORT_CHUNK_ROWS",
    "ArchitectureSection",
    "Block",
    "CallGroup",
    "CallsSection",
    "CrossProcessSection",
    "HealthSection",
    "Line",
    "Panel",
    "Report",
    "RunSection",
    "SequencesSection",
    "StalenessSection",
    "Table",
    "read_scalars",
    "summarize",
]
