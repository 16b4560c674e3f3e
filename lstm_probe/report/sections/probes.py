"""The "Linear probes" section: what the hidden state encodes, for logs whose rollout rows carry observations
(``--capture-obs``) or info values (``--info KEY``): R² of ridge probes from h (each module and layer) to each
observation component and info key, at lags 0 and 1, on held-out episodes, at a few iterations spread over the
run (:func:`lstm_probe.report.probes.probe_rows`, numpy only; ``lstm-probe probe`` gives any target, lag and iteration).

A Dict observation's components are named by key (``obs:pos[0]``, the ``obs_keys`` metadata), the first ones of
every key in turn. Bounded cost: at most :data:`ITERATIONS` iterations, :data:`MAX_OBS` observation components and about
:data:`MAX_ROWS` rows per (iteration, module, layer), whole episodes sampled evenly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from lstm_probe.contract import Capabilities
from lstm_probe.errors import BadLog
from lstm_probe.report.section import Block, Line, Log, Section, Table, fmt, span_words

ITERATIONS = 4
"""Iterations probed (evenly spaced, the first and last included)."""
MAX_OBS = 8
"""Observation components probed (the first ones; of a Dict observation, the first of each key in turn)."""
MAX_ROWS = 4096
"""About this many rows per (iteration, module, layer) at most."""
LAGS = (0, 1)


@dataclass
class ProbesSection:
    """R² by (target, lag, module, layer) and iteration."""

    targets: list[str] = field(default_factory=list)
    lags: list[int] = field(default_factory=list)
    iterations: list[int] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    """One per (iteration, module, layer, target, lag): r2 (None where the target is constant or too_few), n_fit,
    n_test, n_test_units, worse_than_mean (r2 below 0; None without an r2), too_few (held out from fewer than two
    episodes or runs of steps: no R², ``report.probes.TOO_FEW``)."""
    max_rows: int = MAX_ROWS
    notes: list[str] = field(default_factory=list)
    """Why some R² are below 0, where any is (how many, the lowest, the held-out rows they were scored on); why
    some probes have no R² for too few held-out rows, where any has not."""
    empty: list[str] = field(default_factory=list)
    """The targets without a value in any row probed (an ``--info KEY`` the env's info never held there): the text
    says so in a line instead of a table of '-'; their rows stay in ``rows``."""
    constant: list[str] = field(default_factory=list)
    """The targets with values but no R² at any iteration probed (constant there: an image's border pixel, a
    component the env never moves): the text says so in a line instead of rows of '-'; their rows stay in
    ``rows``."""
    too_few: list[str] = field(default_factory=list)
    """The targets with a probe held out from too few rows to score (``too_few`` rows): shown as 'few' in the
    table, never a finding, and a note under the table says why."""


def _spread(values: list[int], n: int) -> list[int]:
    if len(values) <= n:
        return values
    idx = np.unique(np.round(np.linspace(0, len(values) - 1, n)).astype(int))
    return [values[i] for i in idx]


PROBES_NOTE = "linear probes (what h encodes of the observations)"
"""How the report names the section where a log lacks it."""
OVER_BUDGET = "reading the --trace-envs rows' h vectors would go over the memory budget (--max-memory SIZE raises it)"
"""Why a summary log's probes are missing where its traced rows' vectors do not fit the budget."""


class Probes(Section[ProbesSection | None]):
    key = "probes"
    needs: ClassVar[str | None] = "observe"  # the rows keep the observations (the obs and info columns)
    findings_rank: ClassVar[int] = 13

    says_when_absent: ClassVar[bool] = True

    def unavailable(self, data: ProbesSection | None, log: Log) -> list[str]:
        if data is not None:
            return [f"{PROBES_NOTE}: {OVER_BUDGET}"] if data.notes == [OVER_BUDGET] else []
        meta = log.meta
        if isinstance(meta.get("obs_size"), int) or meta.get("info_keys"):
            if not log.vectors:
                return [f"{PROBES_NOTE}: the log was written with --capture summary, which stores no h vectors"]
            return []
        if log.caps.observe:
            return [f"{PROBES_NOTE}: the rows keep no observations; lstm-probe run --capture-obs adds them"]
        return [
            f"{PROBES_NOTE}: needs an integration that keeps each step's observation beside its rows (sb3, rsl_rl, "
            "TorchRL and RLlib: lstm-probe run --capture-obs)"
        ]

    def compute(self, log: Log, acc: Any) -> ProbesSection | None:
        meta = log.meta
        obs_size = meta.get("obs_size")
        keys = [str(k) for k in meta.get("info_keys") or []]
        if not isinstance(obs_size, int) and not keys:
            return None
        if not log.vectors or log.iterations == 0:
            return None
        from lstm_probe.report.probes import obs_names, probe_rows  # numpy: the report loads no pandas

        targets = obs_names(meta, MAX_OBS) + [f"info:{k}" for k in keys]
        iterations = _spread(list(range(log.iterations)), ITERATIONS)

        try:
            found = probe_rows(
                log.info.path, targets, lags=LAGS, iterations=iterations, max_rows=MAX_ROWS, strict=False
            )
        except BadLog as exc:
            # a summary log's vectors are its --trace-envs rows' (of row groups of up to 65,536 rows, each row's
            # h read at its full width): left out, as before they were read, and unavailable() says why
            if not log.summary or "memory budget" not in str(exc):
                raise
            return ProbesSection(targets, list(LAGS), notes=[OVER_BUDGET])
        rows: list[dict[str, Any]] = [
            {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()} for r in found
        ]
        its = sorted({int(r["iteration"]) for r in rows if r["iteration"] is not None})
        empty = [t for t in targets if rows and not any(r["n_fit"] + r["n_test"] for r in rows if r["target"] == t)]
        constant = [
            t
            for t in targets
            if t not in empty and rows and all(r["r2"] is None and not r["too_few"] for r in rows if r["target"] == t)
        ]
        few = [t for t in targets if t not in empty and any(r["too_few"] for r in rows if r["target"] == t)]
        notes = _notes(rows) + _few_notes([r for r in rows if r["target"] not in {*empty, *constant}])
        return ProbesSection(targets, list(LAGS), its, rows, notes=notes, empty=empty, constant=constant, too_few=few)

    def findings(self, data: ProbesSection | None) -> list[str]:
        """How well h reads each info key (quantities the policy does not observe) at the last iteration; none from
        a probe with too few held-out rows (no R²: the table says 'few')."""
        if data is None or not data.iterations:
            return []
        first, last = data.iterations[0], data.iterations[-1]
        out = []
        for target in (t for t in data.targets if t.startswith("info:")):
            r2 = {
                (r["iteration"], r["module"]): r["r2"]
                for r in data.rows
                if r["target"] == target and r["lag"] == 0 and r["layer"] == 0
            }
            for module in dict.fromkeys(m for _, m in r2):
                end, begin = r2.get((last, module)), r2.get((first, module))
                if end is None:
                    continue
                msg = f"{module}: h reads {target} with R² {_r2(end)} at iteration {last}"
                if begin is not None and first != last:
                    msg += f" ({_r2(begin)} at iteration {first})"
                out.append(msg)
        return out

    def text(self, data: ProbesSection | None, caps: Capabilities) -> list[Block]:
        if data is None or not data.rows:
            return []
        lines: list[Block] = [Line(_empty_words(t)) for t in data.empty]
        if data.constant:
            lines.append(Line(_constant_words(data.constant)))
        left_out = {*data.empty, *data.constant}
        cells: dict[tuple[str, int, str, int], dict[int, Any]] = {}
        for r in data.rows:
            if r["target"] in left_out:
                continue
            cells.setdefault((r["module"], r["layer"], r["target"], r["lag"]), {})[r["iteration"]] = (
                FEW if r.get("too_few") else r["r2"]
            )
        header = ("module", "layer", "target", "lag", *(f"it {i}" for i in data.iterations))
        body = tuple(
            (fmt(m), fmt(layer), fmt(t), fmt(lag), *(_cell(v.get(i)) for i in data.iterations))
            for (m, layer, t, lag), v in sorted(cells.items())
        )
        if not body:
            return lines
        table = Table("Linear probes: R² from h on held-out episodes, by iteration", header, body)
        return [table, *(Line(f"* {n}") for n in data.notes), *lines]


def _empty_words(target: str) -> str:
    """The line for a target without a value in any row probed."""
    column, _, key = target.partition(":")
    if column == "info":
        return (
            f"linear probes: the log holds no values for info:{fmt(key)} in the rows probed (the env's info "
            f"never held {fmt(repr(key))} there): left out of the table"
        )
    return f"linear probes: the log holds no values for {fmt(target)} in the rows probed: left out of the table"


def _constant_words(targets: list[str]) -> str:
    """The line for the targets that are constant in every iteration probed (no R² to give)."""
    shown = ", ".join(fmt(t) for t in targets[:8]) + (f" and {len(targets) - 8} more" if len(targets) > 8 else "")
    return (
        f"linear probes: {shown} {'is' if len(targets) == 1 else 'are'} constant in the rows probed at every "
        "iteration (no R² to give): left out of the table"
    )


FEW = "few"
"""The table's cell for a probe with too few held-out rows to score (the note under the table says why)."""


def _cell(value: Any) -> str:
    """An R² in the table: marked where below 0 (the note under the table says why); 'few' where too few held-out
    rows."""
    if value == FEW:
        return FEW
    return fmt(value) + ("*" if isinstance(value, float) and value < 0 else "")


def _r2(value: float) -> str:
    return f"{value:.2f}" + (" (worse than predicting the mean)" if value < 0 else "")


def _notes(rows: list[dict[str, Any]]) -> list[str]:
    """The note on R² below 0, with how many, the lowest and their held-out rows; none where no R² is."""
    below = [r for r in rows if r.get("r2") is not None and r["r2"] < 0]
    if not below:
        return []
    from lstm_probe.report.probes import BELOW_ZERO

    scored = sum(r.get("r2") is not None for r in rows)
    low = min(below, key=lambda r: r["r2"])
    tests = sorted(int(r["n_test"]) for r in below)
    held = span_words(tests[0], tests[-1])
    return [
        f"{BELOW_ZERO}. Here {len(below)} of {scored} probes (lowest {fmt(low['r2'])}: {fmt(low['module'])} "
        f"{fmt(low['target'])}, lag {low['lag']}, iteration {low['iteration']}), scored on {held} held-out rows"
    ]


def _few_notes(rows: list[dict[str, Any]]) -> list[str]:
    """The note on probes with too few held-out rows (how many, the held-out rows and units they had); none where
    every probe had enough."""
    few = [r for r in rows if r.get("too_few")]
    if not few:
        return []
    from lstm_probe.report.probes import MIN_HELD_OUT_UNITS, TOO_FEW

    tests = sorted(int(r["n_test"]) for r in few)
    held = span_words(tests[0], tests[-1])
    return [
        f"{FEW}: {TOO_FEW}. Here {len(few)} of {len(rows)} probes held out {held} rows, of fewer than "
        f"{MIN_HELD_OUT_UNITS} episodes or runs of 4-16 steps"
    ]
