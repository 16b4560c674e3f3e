"""Every report section, in the order the text shows them (and numbers them).

Adding a section: write ``lstm_probe/report/sections/<name>.py`` (its data dataclass, a
:class:`~lstm_probe.report.section.Section` subclass with ``key``, ``compute`` and ``text``, and where it reads
the scalar scan an :class:`~lstm_probe.report.section.Accumulator`), then add one line below.
"""

from __future__ import annotations

from typing import Any

from lstm_probe.report.section import Section
from lstm_probe.report.sections.architecture import Architecture
from lstm_probe.report.sections.calls import Calls
from lstm_probe.report.sections.cross_process import CrossProcess
from lstm_probe.report.sections.doctor import Doctor
from lstm_probe.report.sections.health import Health
from lstm_probe.report.sections.memory import Memory
from lstm_probe.report.sections.probes import Probes
from lstm_probe.report.sections.returns import Returns
from lstm_probe.report.sections.run import Run
from lstm_probe.report.sections.sequences import Sequences
from lstm_probe.report.sections.staleness import Staleness
from lstm_probe.report.sections.what_if import WhatIf

SECTIONS: list[Section[Any]] = [
    Run(),
    Returns(),
    Architecture(),
    Calls(),
    Sequences(),
    Staleness(),
    CrossProcess(),
    Health(),
    Doctor(),
    Memory(),
    Probes(),
    WhatIf(),
]
