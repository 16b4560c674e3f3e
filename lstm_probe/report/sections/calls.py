"""Section 3: calls per module and phase, and why training batches have the shape they have."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from lstm_probe.contract import Capabilities
from lstm_probe.log import budget
from lstm_probe.report.numeric import KEY_CHUNK, by_count, dense_key, groups
from lstm_probe.report.scan import Chunk, Frame
from lstm_probe.report.section import Accumulator, Block, Counts, Line, Log, Max, Section, Sum, Table, kept_columns
from lstm_probe.text import safe

SHOWN_SHAPES = 6


@dataclass
class CallGroup:
    module: str
    phase: str
    path: str
    calls: int
    rows: int
    shapes: dict[str, int]
    """'T x N' (steps x batch) -> number of calls."""
    rows_by_layer: dict[int, int] = field(default_factory=dict)
    """Layer -> rows of that layer (``rows`` is layer 0's: every layer of a call has the same rows)."""


@dataclass
class CallsSection:
    """Section 3: calls per module and phase, and why training batches have the shape they have."""

    groups: list[CallGroup]
    sequences_per_minibatch: dict[int, int]
    """Number of sequences in a train minibatch -> how many minibatches had that many."""
    sequence_start_reasons: dict[str, int]
    minibatches: int
    minibatches_by_path: dict[str, int]
    explanation: str
    kind: str = "LSTM"
    """What the traced modules are, in a word ('LSTM', 'GRU', 'recurrent module')."""
    kept_envs: int | None = None
    """K where the log keeps the rows of env columns 0..K-1 alone (``--trace-envs K --other-envs none``): the
    groups' calls, rows and shapes, the sequences per minibatch, ``minibatches`` and the start reasons are then
    of those columns (a call or minibatch without such a column is not counted); None: of every column."""
    n_envs: int | None = None
    """The run's envs, as its metadata says (per env runner where ``env_runners``)."""
    run_minibatches: dict[str, int] | None = None
    """The run's own minibatches per path ('sequence', 'stepwise'), where its metadata counts them (sb3's
    ``minibatch_paths``): whatever columns the log keeps."""
    env_runners: int | None = None
    """RLlib: the env runners, where more than one, that stepped ``n_envs`` envs each."""


def per_call(df: Frame) -> dict[str, np.ndarray]:
    """One entry per call of ``df``: the codes of its module, phase and path (``df``'s words), its rows,
    first and last step (t0, t1)."""
    # Per-call aggregates without sorting or hashing the rows: call ids are dense (a counter from a
    # per-process base), so one slot per id takes counts, first/last step and the call's labels.
    # (An argsort of the call column held several copies of it; runs of equal ids barely shorten
    # it, since a block of one-step calls interleaves its calls row by row.)
    call = df["call"]
    t = df["t"]
    empty = {name: np.zeros(0, np.int64) for name in ("module", "phase", "path", "rows", "t0", "t1")}
    if not len(call) or (call.dtype.kind == "f" and np.isnan(call).all()):
        return empty
    lo, hi = int(np.nanmin(call)), int(np.nanmax(call))
    if hi - lo >= 4 * len(call) + (1 << 16):  # sparse ids (processes' id blocks far apart): number them
        ids, inv = np.unique(call, return_inverse=True)
        inv = inv.reshape(-1)
        if ids.dtype.kind == "f" and len(ids) and np.isnan(ids[-1]):
            inv[inv == len(ids) - 1] = -1  # null: -1, left out below
        call, lo = inv, 0
        hi = int(call.max())
    span = hi - lo + 1
    rows = np.zeros(span, np.int64)
    t0 = np.full(span, np.iinfo(t.dtype).max, t.dtype)
    t1 = np.full(span, np.iinfo(t.dtype).min, t.dtype)
    codes = {name: df[name] for name in ("module", "phase", "path")}
    labels = {name: np.empty(span, c.dtype) for name, c in codes.items()}
    for start in range(0, len(call), KEY_CHUNK):  # slices: the ids' int64 copy stays small
        part = slice(start, start + KEY_CHUNK)
        c = call[part]
        ok: Any = ~np.isnan(c) if c.dtype.kind == "f" else c >= lo
        if ok.all():
            ok = slice(None)
        idx = c[ok].astype(np.int64) - lo
        rows += np.bincount(idx, minlength=span)
        np.minimum.at(t0, idx, t[part][ok])
        np.maximum.at(t1, idx, t[part][ok])
        for name, c_codes in codes.items():
            labels[name][idx] = c_codes[part][ok]  # the same for every row of a call
    present = np.flatnonzero(rows)
    out = {name: label[present] for name, label in labels.items()}
    out.update(rows=rows[present], t0=t0[present], t1=t1[present])
    return out


def minibatches(
    train: Frame, sel: np.ndarray, starts: np.ndarray
) -> tuple[dict[int, int], dict[str, int], dict[str, int], int]:
    """Sequences per minibatch (as counts of minibatches), why sequences start (``starts``: the sequences'
    first rows, :attr:`Chunk.starts`), the path of each minibatch's first call, and the number of
    minibatches: from the train rows ``sel`` selects (one module's)."""
    if not sel.any():
        return {}, {}, {}, 0
    every = bool(sel.all())  # one module's rows (most logs): the columns as they are, not copied
    it, ep, mb, seq = (train[c] if every else train[c][sel] for c in ("iteration", "epoch", "minibatch", "seq"))
    # Integer keys instead of grouping float columns (several copies of them). The rows of one sequence
    # of one minibatch come together (a call's rows are ordered column, then step), so only the first row
    # of each run of equal (minibatch, seq) keys is looked at.
    mb_key = dense_key([it, ep, mb])
    pair = dense_key([mb_key, seq])
    del it, ep, mb
    runs = np.flatnonzero(np.r_[True, pair[1:] != pair[:-1]])
    run_pair, run_mb, named = pair[runs], mb_key[runs], ~np.isnan(seq[runs])
    del pair, mb_key
    # the minibatches in (iteration, epoch, minibatch) order; the first run of each starts at its first row
    mbs, first_run = np.unique(run_mb, return_index=True)
    first = runs[first_run]
    _, pair_first = np.unique(run_pair[named], return_index=True)  # distinct (minibatch, seq) with a seq
    owner = np.searchsorted(mbs, run_mb[named][pair_first])
    counts = np.bincount(owner, minlength=len(mbs))  # nunique of seq; 0 where no row names one
    del runs, run_pair, run_mb, named, pair_first, owner
    values, n = np.unique(counts, return_counts=True)
    spm = {int(k): int(v) for k, v in zip(values, n, strict=True)}
    by_path = train.counts("path", first if every else np.flatnonzero(sel)[first])
    reasons = train.counts("seq_reason", starts)
    return spm, reasons, by_path, len(mbs)


def _reasons(words: dict[str, str], reasons: dict[str, int]) -> str:
    if not reasons:
        return "not recorded (the integration that wrote this log does not say why a training sequence starts)"
    return "; ".join(f"{words.get(k, k)}: {v:,}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]))


def span(lo: int, hi: int) -> str:
    """'2' or '1 to 3'."""
    return str(lo) if lo == hi else f"{lo} to {hi}"


def run_paths(meta: dict[str, Any]) -> dict[str, int] | None:
    """The run's minibatches per path from its ``minibatch_paths`` metadata (sb3), None where it has none."""
    paths = meta.get("minibatch_paths")
    if not isinstance(paths, dict):
        return None
    out = {}
    for path in ("sequence", "stepwise"):
        entry = paths.get(path)
        n = entry.get("minibatches") if isinstance(entry, dict) else None
        out[path] = n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0
    return out if sum(out.values()) else None


def explain(
    batch: int,
    caps: Capabilities,
    spm: dict[int, int],
    reasons: dict[str, int],
    by_path: dict[str, int],
    kind: str = "LSTM",
    kept: str = "",
    run: dict[str, int] | None = None,
    total: int = 0,
) -> str:
    """Why training batches have the shape they have, in the terms of the log's capabilities (a rollout
    buffer cut into sequences, or chunks cut at max_seq_len). ``batch``: the largest rollout call's batch;
    ``kind``: what the modules are called ('LSTM', 'GRU', 'recurrent module'); ``kept``: the env columns the log
    keeps rows of where it keeps only some (:func:`kept_columns`; the shapes and counts are then theirs);
    ``run``: the run's own minibatches per path where its metadata counts them (:func:`run_paths`); ``total``: the
    training minibatches the log holds rows of (said where neither a rollout buffer's paths nor chunks count them)."""
    if not spm:
        return "No training calls were recorded."
    lo, hi = min(spm), max(spm)
    if kept:
        rolled = (
            f"Rollout calls have batch {batch} here: the log keeps the rows of {kept} alone (--other-envs none), "
            "and every batch and count here is of those columns."
        )
        held = f"this log holds {span(lo, hi)} of their sequences per minibatch (the other envs' have no rows)"
    else:
        rolled = f"Rollout calls have batch {batch}."
        held = f"here {span(lo, hi)}"
    if caps.rollout_buffer:
        words = {
            "split": "the rollout buffer's random split point (its shuffling trick: each epoch the flat "
            "buffer is rotated at a random index, so the first minibatch starts mid-sequence)",
            "episode_start": "an episode start",
            "env_boundary": "an env boundary (the buffer is flattened env by env; step 0 of each env starts anew)",
            "minibatch_cut": "a minibatch cut (the previous minibatch ended there)",
        }
        text = (
            (
                f"{rolled} A training call's batch is the number of sequences in its minibatch, not the number of "
                f"envs: {held}."
                if kept
                else f"Rollout calls have batch {batch} (one column per env, one step each). A training call's "
                f"batch is the number of sequences in its minibatch, not the number of envs: here {span(lo, hi)} "
                "sequences per minibatch."
            )
            + " A new sequence starts at every episode start, every env boundary and at the start of each "
            f"minibatch; sequence starts by reason{' (of those columns)' if kept else ''}: "
            f"{_reasons(words, reasons)}."
        )
        paths = run if kept and run else by_path
        if paths:
            stepwise, total = paths.get("stepwise", 0), sum(paths.values())
            whose = " that hold rows of those columns" if kept and paths is by_path else ""
            of = "the run's " if paths is run else ""
            text += (
                f" {stepwise} of {of}{total} minibatches{whose} held an episode start and so ran the {kind} one "
                "step at a time ('stepwise': batch = sequences, 1 step per call)"
            )
            text += "; the others ran it once over the padded sequences ('sequence')." if stepwise < total else "."
        return text
    if caps.max_seq_len is not None:
        words = {
            "episode_start": "an episode start (initial zeros)",
            "env_boundary": "the start of an env runner's rollout fragment (the state stored at the end of the "
            "previous fragment)",
            "max_seq_len": "max_seq_len (the previous piece of the episode chunk was full; the state stored at "
            "the step before)",
        }
        one = (
            rolled
            if kept
            else f"Rollout calls have batch {batch} (one column per env of one env runner, one step each)."
        )
        return (
            f"{one} The learner "
            "cuts each episode chunk (plus one appended bootstrap step) into max_seq_len pieces, zero-padded on the "
            "right; its minibatches slice whole pieces and cycle through the batch across epoch boundaries, so a "
            f"training call's batch is the number of pieces in its minibatch: {held.replace('sequences', 'pieces')}. "
            f"Pieces start at: {_reasons(words, reasons)}. The value pass runs once per update over every piece."
        )
    if total:
        held += (
            f"; {total:,} minibatches hold rows of them"
            if kept
            else f" sequence{'s' if hi > 1 else ''} per minibatch, over {total:,} minibatches"
        )
    return (
        f"{rolled} A training call's batch is the number of sequences in its minibatch: "
        f"{held}; why a sequence starts where it does: {_reasons(GENERIC_REASONS, reasons)}."
    )


GENERIC_REASONS = {
    "episode_start": "an episode start (zero state)",
    # the state the rollout began from: the previous rollout's end in PPO, training's last state in rsl_rl's
    # Distillation (whose every epoch restarts from it)
    "env_boundary": "the first step of its env's rollout (the state the rollout began from)",
    "split": "a cut inside the rollout (the state stored at that step)",
    "minibatch_cut": "a minibatch cut (the previous minibatch ended there)",
    "max_seq_len": "max_seq_len (the previous piece was full)",
    "gradient_window": "a gradient window's first step (the state goes on from the pass's previous step, detached: "
    "the previous window's optimizer step came there)",
}
"""The start reasons in words where the log has neither a rollout buffer nor max_seq_len chunks (rsl_rl, TorchRL,
own loops that record them): the same words whatever the framework."""


def layer_rows(g: CallGroup) -> str:
    """A group's rows per layer: '192' where every layer has as many, else 'L0 192, L1 180'."""
    counts = set(g.rows_by_layer.values())
    if len(counts) <= 1:
        return f"{g.rows:,}"
    return ", ".join(f"L{layer} {n:,}" for layer, n in sorted(g.rows_by_layer.items()))


def upper_layer_rows(log: Log) -> dict[tuple[str, str, str, int], int]:
    """Rows of every layer above 0 per (module, phase, path, layer), initial-state rows (t = -1) left out as
    the scan leaves them out: one pass over four small columns, one grouped count per batch."""
    out: Counts[tuple[str, str, str, int]] = Counts()
    filt = (ds.field("layer") > 0) & (ds.field("t") >= 0)
    keys = ["module", "phase", "path", "layer"]
    budget.check_stream(log.data, keys, "the count of upper-layer rows")
    for batch in log.data.to_batches(columns=keys, filter=filt, batch_readahead=2, fragment_readahead=1):
        if not batch.num_rows:
            continue
        g = pa.Table.from_batches([batch]).group_by(keys).aggregate([([], "count_all")])
        for m, p, path, layer, n in zip(*(g.column(k).to_pylist() for k in [*keys, "count_all"]), strict=True):
            out.add((str(m), str(p), str(path), int(layer)), int(n))
    return out


def _grouped(key: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """Each row's group (in key order), the number of groups, and one row of each group (every row of a
    group has its key): small dense keys are counted, not sorted."""
    inv, n = groups(key)
    one = np.empty(n, np.intp)
    one[inv] = np.arange(len(inv))
    return inv, n, one


def _most(call: np.ndarray) -> int:
    """The most rows any one call id has (``call``: ids, no nulls): counted in one slot per id where they are
    dense (a counter), instead of sorted."""
    lo, hi = int(call.min()), int(call.max())
    if hi - lo >= 4 * len(call) + (1 << 16):
        return int(np.unique(call, return_counts=True)[1].max())
    return int(np.bincount((call - lo).astype(np.int64), minlength=1).max())


@dataclass
class CallsTotals(Accumulator[Chunk]):
    calls: Counts[tuple[str, str, str]] = field(default_factory=Counts)
    """(module, phase, path) -> calls."""
    rows: Counts[tuple[str, str, str]] = field(default_factory=Counts)
    shapes: Counts[tuple[str, str, str, int, int]] = field(default_factory=Counts)
    """(module, phase, path, steps, batch) -> calls."""
    roll_batch: Max = field(default_factory=Max)
    spm: Counts[int] = field(default_factory=Counts)
    reasons: Counts[str] = field(default_factory=Counts)
    by_path: Counts[str] = field(default_factory=Counts)
    minibatches: Sum = field(default_factory=Sum)

    def add(self, part: Chunk) -> None:
        calls = per_call(part.df)
        # calls without a module, phase or path are not counted (as a grouping leaves null keys out)
        named = (calls["module"] >= 0) & (calls["phase"] >= 0) & (calls["path"] >= 0)
        if named.any():
            labels = [calls[name][named].astype(np.int64) for name in ("module", "phase", "path")]
            steps = calls["t1"][named].astype(np.int64) - calls["t0"][named] + 1
            rows = calls["rows"][named]
            words = [part.df.words(name) for name in ("module", "phase", "path")]
            inv, n, first = _grouped(dense_key([*labels, steps, rows // steps]))
            for i, k in zip(first.tolist(), np.bincount(inv, minlength=n).tolist(), strict=True):
                m, p, path = (w[c[i]] for w, c in zip(words, labels, strict=True))
                self.shapes.add((m, p, path, int(steps[i]), int(rows[i] // steps[i])), k)
            inv, n, first = _grouped(dense_key(labels))
            size = np.bincount(inv, minlength=n)
            total = np.bincount(inv, weights=rows, minlength=n)
            for g, i in enumerate(first.tolist()):
                key = (words[0][labels[0][i]], words[1][labels[1][i]], words[2][labels[2][i]])
                self.calls.add(key, int(size[g]))
                self.rows.add(key, int(total[g]))
        if len(part.roll):
            call = part.roll["call"]
            call = call[~np.isnan(call)] if call.dtype.kind == "f" else call
            if len(call):
                self.roll_batch.add(_most(call))
        if len(part.train):
            spm, reasons, by_path, n_mb = minibatches(part.train, part.train_sel, part.starts)
            for k_spm, n in spm.items():
                self.spm.add(k_spm, n)
            for k_r, n in reasons.items():
                self.reasons.add(k_r, n)
            for k_p, n in by_path.items():
                self.by_path.add(k_p, n)
            self.minibatches.add(n_mb)


class Calls(Section[CallsSection]):
    key = "calls"
    findings_rank: ClassVar[int] = 20

    def accumulator(self) -> CallsTotals:
        return CallsTotals()

    def compute(self, log: Log, acc: CallsTotals) -> CallsSection:
        shapes: dict[tuple[str, str, str], dict[str, int]] = {}
        for (m, p, path, steps, batch), n in sorted(acc.shapes.items()):
            shapes.setdefault((m, p, path), {})[f"{steps} x {batch}"] = n
        upper = upper_layer_rows(log) if log.upper_layers else {}
        groups = []
        for key, calls in sorted(acc.calls.items()):
            by_layer = {0: acc.rows[key]} | {layer: n for (*k, layer), n in sorted(upper.items()) if tuple(k) == key}
            groups.append(CallGroup(key[0], key[1], key[2], calls, acc.rows[key], shapes.get(key, {}), by_layer))
        spm = dict(sorted(acc.spm.items()))
        reasons = by_count(acc.reasons)
        by_path = by_count(acc.by_path)
        kind, kept, run = log.kind, log.kept_envs, run_paths(log.meta)
        words = kept_columns(kept, log.n_envs, log.env_runners)
        explanation = explain(
            int(acc.roll_batch.value or 0), log.caps, spm, reasons, by_path, kind, words, run, acc.minibatches.value
        )
        data = CallsSection(
            groups, spm, reasons, acc.minibatches.value, by_path, explanation, kind, kept, log.n_envs, run
        )
        data.env_runners = log.env_runners
        return data

    def findings(self, data: CallsSection) -> list[str]:
        out: list[str] = []
        spm = data.sequences_per_minibatch
        if spm:
            kept = kept_columns(data.kept_envs, data.n_envs, data.env_runners)
            if not kept:  # else the minibatches' other sequences have no rows: said under unavailable
                noun = "sequence" if max(spm) == 1 else "sequences"
                out.append(
                    f"training minibatches hold {span(min(spm), max(spm))} {noun}: that is the batch dimension of "
                    f"the {data.kind}'s training-time hidden state"
                )
            if data.sequence_start_reasons.get("split"):
                whose = f" of {kept}" if kept else ""
                out.append(
                    f"{data.sequence_start_reasons['split']:,} sequences{whose} start at the buffer's random split "
                    "point, cut off from their episode's earlier steps"
                )
        return out

    def unavailable(self, data: CallsSection, log: Log) -> list[str]:
        spm = data.sequences_per_minibatch
        kept = kept_columns(data.kept_envs, data.n_envs, data.env_runners)
        if not (spm and kept):
            return []
        return [
            f"the batch dimension of the {data.kind}'s training-time hidden state (the sequences in a minibatch): "
            f"the log keeps the rows of {kept} alone (--other-envs none), {span(min(spm), max(spm))} of their "
            "sequences per minibatch; --other-envs summary keeps a summary row of every env"
        ]

    def text(self, data: CallsSection, caps: Capabilities) -> list[Block]:
        rows = []
        layered = any(len(g.rows_by_layer) > 1 for g in data.groups)
        for g in data.groups:
            shapes = ", ".join(f"{k} ({v:,})" for k, v in list(g.shapes.items())[:SHOWN_SHAPES])
            if len(g.shapes) > SHOWN_SHAPES:
                shapes += f", ... {len(g.shapes) - SHOWN_SHAPES} more"
            cells: tuple[str, ...] = (safe(g.module), safe(g.phase), safe(g.path), f"{g.calls:,}")
            if layered:
                cells += (str(len(g.rows_by_layer) or 1), layer_rows(g))
            else:
                cells += (f"{g.rows:,}",)
            rows.append((*cells, shapes))
        columns = ("module", "phase", "path", "calls") + (("layers", "rows per layer") if layered else ("rows",))
        kept = kept_columns(data.kept_envs, data.n_envs, data.env_runners)
        title = "Calls (per module, phase and path; shapes are steps x batch)"
        if kept:
            title = f"Calls with rows of {kept} (per module, phase and path; shapes are steps x their batch columns)"
        out: list[Block] = [Table(title, (*columns, "shapes"), tuple(rows))]
        if kept:
            out.append(
                Line(
                    f"[dim]--other-envs none: the log keeps the rows of {kept} alone; calls, rows and shapes are "
                    "of those columns (a call without one is not counted), not the run's[/]"
                )
            )
        if data.sequences_per_minibatch:
            dist = ", ".join(f"{k} seq: {v:,}" for k, v in data.sequences_per_minibatch.items())
            if kept:
                run = data.run_minibatches
                of = f" of the run's {sum(run.values()):,}" if run else ""
                out.append(
                    Line(
                        f"sequences of {kept_columns(data.kept_envs, None)} per training minibatch "
                        f"({data.minibatches:,} minibatches{of} hold rows of them): {dist}"
                    )
                )
            else:
                out.append(Line(f"sequences per training minibatch ({data.minibatches:,} minibatches): {dist}"))
            if layered:
                out.append(
                    Line("[dim]sequences and minibatches are counted on layer 0: every layer runs the same ones[/]")
                )
        out.append(Line(safe(data.explanation)))
        return out
