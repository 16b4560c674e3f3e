"""The "Doctor" section: the classic recurrent-policy bugs, found from where each call's input state came from.

It reads the ``init`` column (schema 3; the tracer fills it at each batch column's first step of a call,
``lstm_probe/capture/inputs.py``) with the phase, env, env step and episode start of those rows, in bounded runs,
and names, each with its count and first occurrence (call, module, env, env_step):

- calls that started from zeros without an episode start: in a phase that never carried its state, the
  state is not being passed back (``model.predict(obs)`` without ``state=`` and ``episode_start=``);
  elsewhere, a state reset where no episode started;
- episode starts whose state was not reset (the loop forgot ``h[:, done] = 0``), and, in the same calls as
  resets without an episode start, a reset of the wrong env column;
- states taken from another env column (a shuffled or mis-indexed state batch);
- training sequences that start from zeros although the rollout carried its state (or the reverse);
- an episode start inside a training sequence that the state runs on across: in one multi-step call (no
  reset possible), or in a per-timestep training loop whose train states match the rollout's before any
  optimizer step up to the episode start and depart from them there (or, where the rollout did not reset
  either, still match them there: neither loop resets);
- a rollout whose env_step advances by one k > 1 at every step of an env (never by 1): a global counter tagged as
  each env's step (CleanRL's global_step), which makes the episode lengths read from it k times too long;
- a state advanced twice for one observation: two calls of one module at one (env, env_step) in one acting
  phase, or a rollout call that started from the state a bootstrap call at that step left (not restored).

What the log's tags cannot show is said once, as a note, never guessed into a finding: zero states where no
``episode_start`` (or ``episode_step``) says whether an episode began, calls without a phase that start from a
state the doctor cannot place, per-step training loops without ``episode_start``.

And, as a fact where the log's ``minibatch_paths`` metadata has it (sb3), the share of the measured training
time that sb3-contrib's per-step path took (every minibatch holding an episode start takes it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from lstm_probe.contract import Capabilities
from lstm_probe.log import budget
from lstm_probe.log.schema import INITS
from lstm_probe.report.reading import every_group, is_parquet, row_groups, stream, with_dictionaries
from lstm_probe.report.rows import rows_expr, select_rows
from lstm_probe.report.section import Block, Line, Log, Section, Table, kept_columns
from lstm_probe.report.sections.doctor_rows import (
    INSIDE_ROWS,
    LEAK_COLUMNS,
    LEAK_NEEDS,
    LEAK_ROWS,
    LEAK_WORDS,
    STARTS_ROWS,
    STARTS_WORDS,
    STEP_COLUMNS,
    STEP_NEEDS,
    STEP_ROWS,
    STEP_WORDS,
    Leaks,
    Steps,
    StepScan,
    Tally,
    earlier,
)
from lstm_probe.report.sections.doctor_words import (
    AUTORESET_NOTE,
    autoreset_words,
    clean_line,
    global_step,
    paths_fact,
    rollout_alone,
    rollout_lines,
    zeroed_lines,
)
from lstm_probe.report.sections.staleness import provenance_tolerance
from lstm_probe.text import safe

COLUMNS = ["call", "module", "phase", "env", "env_step", "episode_start", "episode_step", "init", "init_norm"]
COLUMNS += ["iteration", "seq_reason"]  # a rollout's first step (Tally.rolled); a training sequence's start
COLUMNS += ["path", "worker"]  # a rollout's advances of env_step (Strides)
BATCH = 1 << 17


@dataclass
class Problem:
    """One kind of bug seen: ``kind``, how many batch columns showed it, where it was first seen."""

    kind: str
    phase: str
    count: int
    first: dict[str, Any]
    """call, module, phase, env, env_step (and, for a wrong-column reset, reset_env: the column reset instead)."""
    text: str = ""


@dataclass
class DoctorSection:
    """Where each call's input state came from, per module and phase, and the problems that shows."""

    available: bool
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    """'module/phase' -> init value -> batch columns (first steps of calls)."""
    problems: list[Problem] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    minibatch_paths: dict[str, Any] | None = None
    """sb3: per path ('sequence', 'stepwise') the minibatches and training seconds the probe measured."""
    stepwise_share: float | None = None
    """Share of the measured training time the per-step path took (sb3)."""
    facts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the doctor could not check because the log lacks a tag, and the tag that adds it (said once)."""
    entered: dict[str, int] = field(default_factory=dict)
    """'module/phase' (acting phases) -> the columns of its 'other' starts (a state the doctor cannot place) made
    at the env column's first call in that phase's group: the module's previous call on that env column (with an
    env step) was in another group, or there was none."""
    inside: dict[str, int] = field(default_factory=dict)
    """'module/phase' (acting phases) -> the columns of its 'other' starts made at a later call of the env column
    in that phase's group (the state changed between two calls of the group). An 'other' start in neither
    ``entered`` nor ``inside`` has no env or env step to tell."""
    rolled: dict[str, int] = field(default_factory=dict)
    """'module/phase' -> those of ``inside`` made at a new iteration's first call in the group (a rollout's first
    step): where a log declares ``Capabilities.rollout_start``, the state its framework carries there by design."""
    train_resets: int = 0
    """Where a per-step training loop is seen to reset the state at episode starts the rollout did not reset it at
    (its states depart from the rollout's there, in first-minibatch sequences): those episode starts inside the
    run's training sequences (each env step once), the scope of the rollout's not-reset count. The gradient is cut
    there."""
    train_resets_checked: tuple[int, int] = (0, 0)
    """Of them, those in first-minibatch sequences (before any optimizer step: where a reset can be seen): where the
    states departed there, and all such."""
    zeroed: dict[str, int] = field(default_factory=dict)
    """'module/phase' -> the columns of a module the log declares zeroed at every rollout's start
    (``Capabilities.rollout_zeroed``) that started a new iteration's first call in the group from zeros with no
    episode start: the framework's design, said with its consequence (``doctor_words.zeroed_lines``), no problem."""
    train_other: dict[str, dict[str, int]] = field(default_factory=dict)
    """'module/phase' (training phases) -> each sequence-start reason ('' none) -> its 'other' starts."""
    autoreset_mode: str | None = None
    """The vector env's gymnasium autoreset mode, where the log's metadata has it (an own loop's ``trace(envs=...)``):
    'NextStep', 'SameStep' or 'Disabled'."""
    autoresets: int = 0
    """Rollout episode starts tagged past an env's first step (of the module with the most): under a NEXT_STEP
    autoreset, the no-op steps on an ended episode's terminal observation. Counted at every step of an own loop's
    rollout calls (a multi-step call's later steps, which have no ``init``, too); other frameworks' rollout calls
    are one step each, counted at their first."""
    kept: str = ""
    """The env columns the log keeps rows of, where ``--other-envs none`` kept only some (every count here is
    then of those): 'env columns 0..3 of 256'; '' where every column has rows."""


def _where(first: dict[str, Any]) -> str:
    env = first.get("env")
    step = first.get("env_step")
    at = f"call {first.get('call')} ({safe(first.get('module'))}"
    at += f", env {env}" if env is not None else ""
    at += f", env_step {step}" if step is not None and step >= 0 else ""
    return at + ")"


def _notes(t: Tally, problems: list[Problem], steps: Steps) -> list[str]:
    """What the log's tags leave the doctor unable to check, once each, with the tag that adds it."""
    out: list[str] = []
    judged = {p.phase for p in problems if p.kind == "not_passed_back"}
    calls = [f"{safe(p)} calls" for p, n in t.unknown.items() if n]
    if steps.untagged:
        calls.append("the per-step training loop's train calls")
    if calls:
        zeros = [f"{f.count:,} {safe(p)}" for p, f in t.untagged.items() if f.count and p not in judged]
        seen = f" ({' and '.join(zeros)} call columns started from zeros)" if zeros else ""
        out.append(
            f"episode starts: the {' and '.join(calls)} carry no episode_start tag, so the doctor cannot tell a "
            f"reset from a bug{seen} nor see a state kept where an episode starts (tag episode_start: per env, "
            "True where the step starts a new episode, the done flags of the step before; an (N, T) array on "
            "train calls)"
        )
    if t.foreign:
        out.append(
            f"what the calls without a phase are: {t.foreign:,} of their columns started from a state the doctor "
            "cannot place (counted as phase 'other'; tag a value call on the observation after the rollout "
            "phase='bootstrap', an evaluation phase='predict')"
        )
    return out


def _problems(t: Tally) -> list[Problem]:
    out: list[Problem] = []
    for phase, f in t.zero.items():
        u = t.untagged[phase]
        if not f.count + u.count:
            continue
        if t.carried.get(phase, 0) == 0 and t.placed.get(phase, 0) == 0:  # never a state: not passed back
            f = earlier(f, u)
            hint = (
                "model.predict(obs, state=..., episode_start=...)"
                if phase == "predict"
                else "pass the state the module returns into its next call"
            )
            text = (
                f"{phase} calls started from a zero state {f.count} times without an episode start: the state is "
                f"not being passed back ({hint}); first at {_where(f.row)}"
            )
            out.append(Problem("not_passed_back", phase, f.count, f.row, text))
        elif f.count:  # zeros where no tag says whether an episode started: a note (_notes), not a finding
            text = f"a state was reset where no episode started {f.count} times ({phase}); first at {_where(f.row)}"
            out.append(Problem("reset_without_start", phase, f.count, f.row, text))
    for phase, f in t.not_reset.items():
        if f.count:
            starts = "episode start" if f.count == 1 else "episode starts"
            text = (
                f"the state was not reset at {f.count} {starts} ({phase}: the loop does not zero the state "
                f"where an episode ended, h[:, done] = 0); first at {_where(f.row)}"
            )
            out.append(Problem("not_reset", phase, f.count, f.row, text))
    f = t.wrong_column
    if f.count:
        text = (
            f"the state was reset in the wrong env column at {f.count} episode starts: the column whose episode "
            f"started kept its state while another column was zeroed; first at {_where(f.row)}, where env "
            f"{f.row.get('reset_env')} was reset instead"
        )
        out.append(Problem("wrong_column", str(f.row.get("phase")), f.count, f.row, text))
    f = t.other_env
    if f.count:
        text = (
            f"a column's state came from another env column {f.count} times (a shuffled or mis-indexed state "
            f"batch); first at {_where(f.row)}"
        )
        out.append(Problem("other_env", str(f.row.get("phase")), f.count, f.row, text))
    f = t.twice
    if f.count:
        text = (
            f"a module was called twice on one observation {f.count} times (two {f.row.get('phase')} calls at the "
            f"same env step: its state advanced twice for one observation); first at {_where(f.row)}"
        )
        out.append(Problem("advanced_twice", str(f.row.get("phase")), f.count, f.row, text))
    f = t.advanced
    if f.count:
        text = (
            f"a rollout step started from the state a bootstrap call on the same observation left {f.count} times "
            f"(the value call advanced the state and it was not restored); first at {_where(f.row)}"
        )
        out.append(Problem("advanced_by_bootstrap", "rollout", f.count, f.row, text))
    stride = t.strides.stride()
    if stride is not None:
        k, f = stride
        out.append(
            Problem("global_env_step", "rollout", f.count, f.row | {"stride": k}, global_step(k, f, _where(f.row)))
        )
    carried = t.carried.get("rollout", 0)
    f = t.train_zero
    if f.count and carried:
        text = (
            f"{_sequences(f.row)} start from zeros {f.count} times (not at an episode start) although the rollout "
            f"carried its state from step to step; first at {_where(f.row)}{_uncollected(t, f.row)}"
        )
        out.append(Problem("train_from_zeros", str(f.row.get("phase")), f.count, f.row, text))
    f = t.train_state
    if f.count and not carried and t.rollout_zero:
        text = (
            f"{_sequences(f.row)} start from non-zero states {f.count} times although the rollout started every "
            f"step from zeros; first at {_where(f.row)}"
        )
        out.append(Problem("train_from_states", str(f.row.get("phase")), f.count, f.row, text))
    return out


def _uncollected(t: Tally, row: dict[str, Any]) -> str:
    """Where the module of a training-side call that started from zeros has no rollout call at all (the collection
    does not run it: a critic with an LSTM of its own left out of the collecting policy), why: its stored states
    are never its own."""
    module = row.get("module")
    if module is None or f"{module}/rollout" in t.sources:
        return ""
    return (
        f" ({module} has no rollout call: the collection does not run it, so the states stored for its training "
        "are the initial zeros, never the state its episode carried; run it in the collecting policy too)"
    )


def _sequences(row: dict[str, Any]) -> str:
    """A training-side call's sequences by its phase: a value estimator's are not the loss's."""
    if row.get("phase") == "value":
        return "value-estimator sequences (GAE's passes or a loss's target network, phase value)"
    return "training sequences"


def _columns(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name in COLUMNS:
        col = batch.column(name)
        if pa.types.is_string(col.type) or pa.types.is_dictionary(col.type):
            # fixed-width numpy strings from the column's few words: compared without a Python call per row
            enc = col if pa.types.is_dictionary(col.type) else col.dictionary_encode()
            words = np.array([*(w or "" for w in enc.dictionary.to_pylist()), ""], dtype=str)
            out[name] = words[enc.indices.fill_null(len(words) - 1).to_numpy(zero_copy_only=False)]
        elif pa.types.is_boolean(col.type):  # tribool: -1 null, 0, 1
            values = col.fill_null(False).to_numpy(zero_copy_only=False).astype(np.int8)
            out[name] = np.where(col.is_null().to_numpy(zero_copy_only=False), np.int8(-1), values)
        else:
            out[name] = col.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    return out


def _cut(c: dict[str, np.ndarray], n: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    return {k: v[:n] for k, v in c.items()}, {k: v[n:] for k, v in c.items()}


class Pass:
    """The doctor's one pass over a log's rows, batch by batch in log order (:meth:`add`), for the input states,
    the episode starts inside training sequences and the per-step training loops (three filtered passes took
    2.4x the CPU on a 9.9M-row log); :meth:`finish` makes the section. ``columns``: what a batch must hold."""

    def __init__(self, log: Log) -> None:
        self.caps = log.caps
        self.generic = log.meta.get("framework") == "generic"  # an own loop: it may run a gymnasium vector env
        self.tally = Tally(tuple(log.caps.rollout_zeroed))
        names = set(log.data.schema.names)
        self.filt = (ds.field("layer") == 0) & ds.field("init").is_valid()
        columns = [*COLUMNS, "layer"]
        self.leaks = Leaks() if LEAK_NEEDS <= names else None
        self.steps = StepScan(provenance_tolerance(log.meta)) if STEP_NEEDS <= names else None
        if self.leaks is not None:
            self.filt |= rows_expr(LEAK_ROWS, LEAK_WORDS)
            columns += [*LEAK_COLUMNS, *LEAK_NEEDS, "layer"]
        # an own loop's multi-step rollout calls: their later steps' episode starts (no init) count as autoresets
        self.starts = self.generic and {"episode_start", "env_step"} <= names
        if self.starts:
            self.filt |= rows_expr(STARTS_ROWS, STARTS_WORDS) & ds.field("init").is_null()
        if self.steps is not None:
            self.filt |= rows_expr(STEP_ROWS, STEP_WORDS) | rows_expr(INSIDE_ROWS, STEP_WORDS)
            columns += [*STEP_COLUMNS, "layer", "path", "epoch", "minibatch", "padding"]
        self.columns = list(dict.fromkeys(columns))
        self.held: dict[str, np.ndarray] | None = None

    @property
    def disordered(self) -> bool:
        """Whether the answer may depend on the order the rows came in and on where the batches were cut: a
        module's env column met a call earlier than one it had met (rows out of call order), or more than one
        phase has problems or notes of one kind (they are listed in the order the phases were first met, batch
        by batch)."""
        t = self.tally
        kinds = (
            [p for p, f in t.zero.items() if f.count + t.untagged[p].count],
            [p for p, f in t.not_reset.items() if f.count],
            [p for p, n in t.unknown.items() if n],
            [p for p, f in t.untagged.items() if f.count],
        )
        return t.disordered or any(len(phases) > 1 for phases in kinds)

    def add(self, whole: pa.RecordBatch) -> None:
        """One batch of the log's rows (any rows, with :attr:`columns`), in log order."""
        if self.leaks is not None:
            self.leaks.add(whole)
        if self.steps is not None:
            self.steps.add(whole)
        init = whole.column("init")
        if self.starts and init.null_count:
            starts = select_rows(whole.select([*COLUMNS, "layer"]), STARTS_ROWS, STARTS_WORDS)
            starts = starts.filter(starts.column("init").is_null())
            if starts.num_rows:
                self.tally.add_starts(_columns(starts))
        if init.null_count == len(init):
            return
        # the doctor's own columns of the init rows (a rollout row group's every row: not copied)
        batch, layer = whole.select(COLUMNS), whole.column("layer")
        if init.null_count or layer.null_count or pc.any(pc.not_equal(layer, 0)).as_py():
            batch = batch.filter(pc.and_(init.is_valid(), pc.equal(layer, 0)))
        if not batch.num_rows:
            return
        self.tally.count_sources(batch)
        c = _columns(batch)
        if self.held is not None:
            c = {k: np.concatenate([self.held[k], v]) for k, v in c.items()}
        call = c["call"]
        other = np.flatnonzero(call != call[-1])
        if not len(other):  # one call so far: it may go on in the next batch
            self.held = c
            return
        # the last call's rows wait for the next batch (a call's rows come together)
        c, self.held = _cut(c, int(other[-1]) + 1)
        self.tally.add(c)

    def finish(self, data: DoctorSection) -> DoctorSection:
        """``data`` (the section as the log's metadata starts it) with what the rows showed."""
        tally = self.tally
        if self.held is not None and len(self.held["call"]):
            tally.add(self.held)
            self.held = None
        data.sources = {k: dict(sorted(v.items())) for k, v in sorted(tally.sources.items())}
        data.entered, data.inside = dict(sorted(tally.entered.items())), dict(sorted(tally.inside.items()))
        data.rolled, data.zeroed = dict(sorted(tally.rolled.items())), dict(sorted(tally.zeroed.items()))
        data.train_other = {k: dict(sorted(v.items())) for k, v in sorted(tally.train_other.items())}
        data.problems = _problems(tally)
        leaks = self.leaks
        for phase, leak in sorted(leaks.found.items() if leaks else [], key=lambda kv: kv[1].call):  # first seen first
            text = f"{leaks.words(phase)}; first at {_where(leak.row)}"  # type: ignore[union-attr]
            data.problems.append(Problem("across_episodes", phase, leak.count, leak.row, text))
        found = Steps() if self.steps is None else self.steps.result(tally.not_reset_at)
        f = found.carried
        if f.count:
            text = (
                f"the per-step training loop carried the state across an episode start in {f.count} training "
                "sequences: before any optimizer step (minibatch 0 of epoch 0) their train states match the "
                "rollout's up to a step where an episode starts and depart from them there (reset the state where "
                f"the stored dones say an episode began, as the rollout does); first at {_where(f.row)}"
            )
            data.problems.append(Problem("carried_in_training", "train", f.count, f.row, text))
        f = found.carried_too
        if f.count:
            text = (
                "the per-step training loop does not reset the state at episode starts either (nor does the rollout): "
                f"at {f.count} episode starts inside training sequences, before any optimizer step, the train states "
                "still equal the rollout's unreset ones; reset it in both loops (fixing the rollout alone leaves "
                f"training carrying the state across); first at {_where(f.row)}"
            )
            data.problems.append(Problem("carried_in_training", "train", f.count, f.row, text))
        if found.reset_only.count:  # the rollout alone forgot the reset: training resets there
            data.train_resets = found.inside
            data.train_resets_checked = (found.reset_only.count, found.checked)
            for p in data.problems:
                if (p.kind, p.phase) == ("not_reset", "rollout"):
                    p.text = rollout_alone(p.text, data.train_resets, *data.train_resets_checked)
        firsts = sorted(tally.autoresets.values(), key=lambda f: (-f.count, f.call))
        autoresets = firsts[0] if firsts else None
        data.autoresets = autoresets.count if autoresets else 0
        problem, fact = autoreset_words(
            data.autoreset_mode, data.autoresets, _where(autoresets.row if autoresets else {})
        )
        if problem and autoresets is not None:
            data.problems.append(Problem("next_step_autoreset", "rollout", autoresets.count, autoresets.row, problem))
        data.facts += [fact] if fact else []
        data.findings = [p.text for p in data.problems] + zeroed_lines(data.zeroed, self.caps.rollout_zeroed)
        data.notes = _notes(tally, data.problems, found)
        if data.autoreset_mode is None and data.autoresets and self.generic:
            data.notes.append(AUTORESET_NOTE)
        return data


class Doctor(Section[DoctorSection]):
    key = "doctor"
    alongside = True
    findings_rank = 20

    def compute(self, log: Log, acc: Any) -> DoctorSection:
        data = self._start(log)
        if not data.available:
            return data
        one = Pass(log)
        rows = with_dictionaries(log.data, one.columns)  # strings as stored: no string built per row
        filt: ds.Expression | None = one.filt
        parquet = is_parquet(rows)
        if parquet:  # the row groups that may hold such rows (statistics), their rows selected batch by batch:
            # Arrow's row filter on every column cost ~0.15 s more CPU on a 9.9M-row log (7% of rows kept), and
            # more on a string column (dictionaries: words_in)
            # (every row group where each may hold an input-state row: no pruning asked, it would keep them all)
            rows, filt = row_groups(rows, None if every_group(rows, "init") else filt), None
        # little read ahead (as the scalar scan): a few batches of one file
        budget.check_stream(rows, one.columns, "the doctor's read of input states")
        if parquet:
            batches = stream(rows, one.columns, BATCH)
        else:
            batches = rows.to_batches(columns=one.columns, filter=filt, batch_size=BATCH, batch_readahead=2)
        for whole in batches:
            one.add(whole)
        return one.finish(data)

    def reader(self, log: Log) -> Pass | None:
        """The doctor's pass fed the scan's own batches (every row of a log whose rows are all first-layer
        ones, in runs of whole iterations: :meth:`Pass.finish` says None where that order could change the
        answer), instead of a read of its own: the columns it reads beyond the scan's decoded once."""
        return Pass(log) if "init" in log.data.schema.names else None

    def from_reader(self, log: Log, one: Pass) -> DoctorSection | None:
        """The section from a pass the scan fed (:meth:`reader`); None where it must read the log itself."""
        return None if one.disordered else one.finish(self._start(log))

    def _start(self, log: Log) -> DoctorSection:
        meta_paths = log.meta.get("minibatch_paths")
        data = DoctorSection(
            available="init" in log.data.schema.names, kept=kept_columns(log.kept_envs, log.n_envs, log.env_runners)
        )
        mode = log.meta.get("autoreset_mode")
        data.autoreset_mode = mode if isinstance(mode, str) else None
        if isinstance(meta_paths, dict):
            data.minibatch_paths = meta_paths
            data.stepwise_share, fact = paths_fact(meta_paths)
            data.facts += [fact] if fact else []
        return data

    def unavailable(self, data: DoctorSection, log: Log) -> list[str]:
        if data.available:
            return list(data.notes)
        return ["where each call's input state came from (the doctor's checks): the log predates schema 3"]

    def findings(self, data: DoctorSection) -> list[str]:
        return list(data.findings)

    def text(self, data: DoctorSection, caps: Capabilities) -> list[Block]:
        if not data.available and not data.facts:
            return []
        blocks: list[Block] = []
        if data.sources:
            values = [v for v in INITS if any(v in d for d in data.sources.values())]
            rows = tuple((safe(k), *(f"{d.get(v, 0):,}" for v in values)) for k, d in data.sources.items())
            blocks.append(Table("Doctor: where each call's input state came from", ("module/phase", *values), rows))
        else:
            blocks.append(Line("[bold]Doctor[/]: no call recorded where its input state came from"))
        rolled = data.rolled if caps.rollout_start else {}  # by the framework's design: rollout_line says so
        if data.problems:
            blocks += [Line(f"[yellow]problem:[/] {safe(p.text)}") for p in data.problems]
        elif data.sources:
            told = (data.kept, rolled, data.zeroed, data.train_other, caps.rollout_start)
            blocks.append(Line(safe(clean_line(data.sources, data.entered, data.inside, *told))))
        blocks += [Line(safe(line)) for line in rollout_lines(rolled, caps.rollout_start)]
        blocks += [Line(safe(line)) for line in zeroed_lines(data.zeroed, caps.rollout_zeroed)]
        blocks += [Line(safe(f)) for f in data.facts]
        return blocks
