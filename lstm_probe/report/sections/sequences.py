"""Section 4: training sequence lengths (the truncated-BPTT horizon) and episode lengths.

Episodes are counted from the rollout rows' ``episode`` and ``episode_step``; a log whose rollout rows carry
neither (an own loop tagged with ``episode_start`` alone) has them counted from its episode starts instead: an
env's episode runs from one start to the next (an env's step 0 starts its first)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pyarrow.dataset as ds

from lstm_probe.contract import Capabilities
from lstm_probe.log import budget
from lstm_probe.report.numeric import dense_key, summary_stats
from lstm_probe.report.scan import Chunk, Frame
from lstm_probe.report.section import (
    Accumulator,
    Block,
    Log,
    Mergeable,
    Panel,
    Parts,
    Section,
    Sum,
    fmt,
    fmt_steps,
    kept_columns,
)
from lstm_probe.report.sections.horizon import (
    applied,
    cuts_line,
    epoch_places,
    horizon_in_words,
    no_claim,
    unapplied_tail,
)
from lstm_probe.report.verdict import MID_ROLLOUT

LENGTH_EDGES = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 10**9]


@dataclass
class SequencesSection:
    """Section 4: training sequence lengths (the truncated-BPTT horizon) and episode lengths."""

    sequences: int
    length: dict[str, float]
    length_histogram: dict[str, int]
    episode_length: dict[str, float]
    episodes_completed: int
    padding_share: float
    stored_state_share: float | None
    """Share of sequences that start from a stored mid-episode state rather than a reset; None where the log
    does not say (its integration declares no ``stored_states``, or no sequence carries a start reason). It splits
    by where the stored state comes from into :attr:`stored_rollout_start_share` and
    :attr:`stored_mid_rollout_share`."""
    module: str | None = None
    """The module whose layer-0 train rows the sequences are counted on (every module and layer of an
    integration that declares ``stored_states`` runs the same sequences)."""
    episodes_under_way: int = 0
    """Episodes already under way when the log began (rollout rows with an episode but no episode_step: sb3's
    ``learn(reset_num_timesteps=False)`` on a model whose envs are mid-episode), left out of the episode figures."""
    episodes_from: str | None = None
    """What the episodes were counted from: 'episode_step' (the rollout rows' episode and step in it),
    'episode_start' (from one episode start to the next), or None where the rollout rows carry neither."""
    kept_envs: int | None = None
    """K where the log keeps the rows of env columns 0..K-1 alone (``--trace-envs K --other-envs none``): the
    sequences, episodes, padding and shares are then of those columns; None: of every column."""
    n_envs: int | None = None
    """The run's envs, as its metadata says (per env runner where ``env_runners``)."""
    env_runners: int | None = None
    """RLlib: the env runners, where more than one, that stepped ``n_envs`` envs each."""
    mid_rollout_starts: int | None = None
    """Where the log records no start reasons (an own loop): the training sequences (of :attr:`module`, layer 0)
    that start mid-rollout, neither at an episode start nor at their env's first step of that iteration's rollout,
    so from a state the rollout stored there (:func:`mid_rollout`); None where the reasons are recorded, or the
    rows cannot say (no episode_start on the train rows, or no rollout rows)."""
    gradient_length: dict[str, float] = field(default_factory=dict)
    """How far back gradients flow (the truncated-BPTT horizon; statistics as :attr:`length`'s): the stretches of
    the training sequences between the episode starts inside them where a per-step training loop resets the state
    there (:func:`gradient_segments`); :attr:`length` where no sequence holds one, or where the doctor found the
    state carried across them (:attr:`cut_by_resets` False)."""
    starts_inside: int = 0
    """Episode starts inside the training sequences (t > 0, not padding) of a per-step training loop (path
    'stepwise', rows of :attr:`module`, layer 0); a multi-step call's starts inside it are not counted: it cannot
    reset there."""
    cut_by_resets: bool | None = None
    """Whether the episode starts inside the sequences (:attr:`starts_inside`) cut the gradient: True where the
    loop resets the state there, False where the doctor found the state run on across them (:attr:`carried_by`);
    None where no sequence holds one. Set once the doctor has looked (:func:`judge_resets`)."""
    carried_by: str | None = None
    """Where :attr:`cut_by_resets` is False: the doctor's problem that says so, 'carried_in_training' (the per-step
    training loop carries the state across episode starts) or 'not_reset' (the rollout does not reset it either)."""
    stored_rollout_start_share: float | None = None
    """Of :attr:`stored_state_share`: the sequences that start at their env's first rollout step (start reason
    'env_boundary'), from the state the rollout itself began from (stored at the previous rollout's end, so never
    of older weights than the rollout's); None as :attr:`stored_state_share`."""
    stored_mid_rollout_share: float | None = None
    """Of :attr:`stored_state_share`: the sequences that start mid-rollout (start reasons
    :data:`~lstm_probe.report.verdict.MID_ROLLOUT`: a split, a minibatch cut, max_seq_len), from a state the rollout
    stored there: the only stored states that can go stale; None as :attr:`stored_state_share`."""
    stored_starts: dict[str, int] = field(default_factory=dict)
    """The counts behind the shares (what the text says, exact where rounded shares would not add up):
    'with_reason' (the sequences with a start reason), 'rollout_start' and 'mid_rollout'; empty where
    :attr:`stored_state_share` is None."""
    optimizer_steps: int | None = None
    """The optimizer steps training took, where the log counts them (metadata ``optimizer_steps``: rsl_rl's
    distillation); 0: the gradients were never applied, so :attr:`gradient_length` is empty (no horizon)."""
    steps_uncounted: bool = False
    """A distillation log without ``optimizer_steps`` (a run killed before its first update ended, an older log):
    whether any gradient was applied is not known, so :attr:`gradient_length` is empty (no horizon); in the JSON only
    where True."""
    unapplied_tail: int | None = None
    """rsl_rl distillation where ``gradient_length`` does not divide an update's student calls (epochs x steps per
    env): the calls after the update's last optimizer step, whose gradients rsl_rl never applies (the loss is
    dropped); :attr:`gradient_length` leaves their sequences out. In the JSON only where set."""
    env_step_stride: int | None = None
    """k where the doctor found the rollout's env_step a global counter (k a step): the figures read from env steps
    are withheld (:func:`judge_env_steps`); in the JSON only where set."""


def gradient_segments(part: Chunk) -> tuple[np.ndarray, np.ndarray, int]:
    """How far back gradients can flow in one scan run's training sequences (of ``part.train_module``, layer 0:
    each one's first row, ``part.starts``), one length per stretch, and how many episode starts lie inside them.

    A per-step training loop (path 'stepwise': one LSTM call a step, as CleanRL's ``(1 - done) * h``) resets the
    state where an episode starts at t > 0, and the product with zero cuts the gradient there: such a sequence
    counts as the stretches between its cuts (0, each cut's t, its seq_len). A multi-step call (one call over T
    steps) cannot reset inside the call, so its episode starts at t > 0 cut nothing (the state runs on: the doctor's
    ``across_episodes``). Padding rows cut nothing. Without a cut: each sequence's ``seq_len``, in order (the
    training sequences' lengths themselves). With each stretch's sequence (its index in ``part.starts``).
    Vectorized: the stretches are the differences of the sorted (sequence, position) pairs within each sequence."""
    train, starts = part.train, part.starts
    lens = train["seq_len"][starts].astype(np.float64)
    if not len(starts) or "episode_start" not in train or "stepwise" not in train.words("path"):
        return lens, np.arange(len(lens)), 0  # no per-step training row here: nothing resets inside a sequence
    cut = part.train_sel & train.equals("path", "stepwise") & (train["t"] > 0)
    cut &= train["episode_start"] & ~train["padding"]
    at = np.flatnonzero(cut)
    if not len(at):
        return lens, np.arange(len(lens)), 0
    both = dense_key([np.concatenate([train[c][starts], train[c][at]]) for c in SEQUENCE_KEY])
    key, cut_key = both[: len(starts)], both[len(starts) :]
    order = np.argsort(key, kind="stable")  # the sequences' keys are distinct (one first row each)
    where = np.minimum(np.searchsorted(key[order], cut_key), len(order) - 1)
    seq, t = order[where], train["t"][at].astype(np.int64)
    ok = (key[seq] == cut_key) & (t < lens[seq])  # in a sequence of this run, before its end (a null seq_len: no)
    seq, t = seq[ok], t[ok]
    if not len(seq):
        return lens, np.arange(len(lens)), 0
    held = np.zeros(len(starts), bool)
    held[seq] = True
    ends = lens[held].astype(np.int64)
    span = int(ends.max()) + 1
    pairs = np.unique(  # (sequence, position) as one int64, sorted, repeated rows once
        np.concatenate([np.flatnonzero(held) * span, np.flatnonzero(held) * span + ends, seq * span + t])
    )
    same = pairs[1:] // span == pairs[:-1] // span
    stretches = np.diff(pairs)[same].astype(np.float64)
    owner = np.concatenate([np.flatnonzero(~held), pairs[:-1][same] // span])
    return np.concatenate([lens[~held], stretches]), owner, len(pairs) - 2 * len(ends)


SEQUENCE_KEY = ("iteration", "epoch", "minibatch", "seq")
"""The columns that name a training sequence (as :attr:`~lstm_probe.report.scan.Chunk.starts` groups them)."""


@dataclass
class SequenceTotals(Accumulator[Chunk]):
    episodes: Parts[np.ndarray] = field(default_factory=Parts)
    """Per run: (env key, episode, last step, first step) of each (env, episode) of the rollout rows (one
    module's), one row each."""
    under_way: Parts[np.ndarray] = field(default_factory=Parts)
    """Per run: (env key, episode) of the rollout rows (one module's) that carry an episode but no episode_step:
    an episode under way when the log began (sb3's ``learn(reset_num_timesteps=False)``), one row each."""
    lengths: Parts[np.ndarray] = field(default_factory=Parts)
    """Per run: each training sequence's length."""
    gradient: Parts[np.ndarray] = field(default_factory=Parts)
    """Per run: the stretches of the training sequences between the episode starts inside them
    (:func:`gradient_segments`)."""
    places: Parts[np.ndarray] = field(default_factory=Parts)
    """Per run: each training sequence's (epoch, first step in its epoch) (:func:`~.horizon.epoch_places`)."""
    gradient_places: Parts[np.ndarray] = field(default_factory=Parts)
    """Per run: each stretch's sequence's place, as :attr:`places`."""
    inside: Sum = field(default_factory=Sum)
    """Episode starts inside the training sequences of a per-step training loop (:func:`gradient_segments`)."""
    stored_starts: Sum = field(default_factory=Sum)
    """Sequences whose start reason is known and is not an episode start."""
    known_starts: Sum = field(default_factory=Sum)
    """Sequences with a start reason."""
    mid_starts: Sum = field(default_factory=Sum)
    """Sequences whose start reason says they start mid-rollout (:data:`~lstm_probe.report.verdict.MID_ROLLOUT`)."""
    padding: Sum = field(default_factory=Sum)
    padding_of: Sum = field(default_factory=Sum)
    module: First = field(default_factory=lambda: First())

    def add(self, part: Chunk) -> None:
        if len(part.roll):
            self._episodes(part.roll, part.roll_module)
        if len(part.train):
            sel = part.train_sel
            first = part.train.take(part.starts)
            self.lengths.append(first["seq_len"].astype(np.float64))
            stretches, owner, inside = gradient_segments(part)
            self.gradient.append(stretches)
            places = epoch_places(first)
            self.places.append(places)
            self.gradient_places.append(places[owner])
            self.inside.add(inside)
            known = first["seq_reason"] >= 0
            self.known_starts.add(int(known.sum()))
            self.stored_starts.add(int((known & ~first.equals("seq_reason", "episode_start")).sum()))
            self.mid_starts.add(int(sum(first.equals("seq_reason", r).sum() for r in MID_ROLLOUT)))
            self.padding.add(int(part.train["padding"][sel].sum()))
            self.padding_of.add(int(sel.sum()))
            self.module.add(part.train_module)

    def _episodes(self, roll: Frame, module: str | None) -> None:
        # RLlib's extra pass on a terminal observation (bootstrap 'terminal') is not a step of the episode
        env_key = np.where(np.isnan(roll["worker"]), -1, roll["worker"]).astype(np.float64) * 1e6 + roll["env"]
        episode = roll["episode"]
        # rows without an env or episode are in none
        rows = (roll["bootstrap"] < 0) & roll.equals("module", module) & ~np.isnan(env_key) & ~np.isnan(episode)
        keep, under = rows & ~np.isnan(roll["episode_step"]), rows & np.isnan(roll["episode_step"])
        if under.any():  # an episode begun before the log: its steps unknown, it is left out (said so)
            self.under_way.append(_per_episode(env_key[under], episode[under], episode[under])[:, :2])
        if not keep.any():
            return
        self.episodes.append(_per_episode(env_key[keep], episode[keep], roll["episode_step"][keep]))

    def episodes_under_way(self) -> int:
        """The episodes under way when the log began that the episode figures leave out (:attr:`under_way`)."""
        return len(np.unique(dense_key(list(np.concatenate(self.under_way).T)))) if self.under_way else 0

    def episode_lengths(self) -> np.ndarray:
        """Lengths of the episodes that both start in the log and end before a later one of the same env."""
        if not self.episodes:
            return np.array([])
        parts = np.concatenate(self.episodes)
        per = _per_episode(parts[:, 0], parts[:, 1], parts[:, 2], parts[:, 3])  # in (env key, episode) order
        env_key, episode, last, first = per.T
        envs = np.flatnonzero(np.r_[True, env_key[1:] != env_key[:-1]])  # each env's first row
        later = np.repeat(np.maximum.reduceat(episode, envs), np.diff(np.r_[envs, len(per)]))  # its last episode
        done = (episode < later) & (first == 0)
        return (last[done] + 1).astype(np.float32)


def _per_episode(
    env_key: np.ndarray, episode: np.ndarray, last: np.ndarray, first: np.ndarray | None = None
) -> np.ndarray:
    """Per (env key, episode), in that order: [env key, episode, largest ``last``, smallest ``first``
    (``last`` where no ``first`` is given)], one row each (float64)."""
    _, inv = np.unique(dense_key([env_key, episode]), return_inverse=True)
    inv = inv.reshape(-1)
    n = int(inv.max()) + 1
    out = np.empty((n, 4))
    out[inv, 0], out[inv, 1] = env_key, episode
    out[:, 2], out[:, 3] = -np.inf, np.inf
    np.maximum.at(out[:, 2], inv, last)
    np.minimum.at(out[:, 3], inv, last if first is None else first)
    return out


@dataclass
class First(Mergeable):
    """The first value seen (in log order)."""

    value: str | None = None

    def add(self, v: str | None) -> None:
        if self.value is None:
            self.value = v

    def merge(self, other: First) -> None:
        self.add(other.value)


class Sequences(Section[SequencesSection]):
    key = "sequences"
    findings_rank: ClassVar[int] = 10

    def accumulator(self) -> SequenceTotals:
        return SequenceTotals()

    def compute(self, log: Log, acc: SequenceTotals) -> SequencesSection:
        episodes, source = acc.episode_lengths(), "episode_step" if acc.episodes else None
        if source is None:
            starts = _from_starts(log)
            source = "episode_start" if starts is not None else None
            episodes = starts if starts is not None else episodes
        lens = np.concatenate(acc.lengths) if acc.lengths else np.zeros(0)
        stretches = np.concatenate(acc.gradient) if acc.gradient else np.zeros(0)
        tail = unapplied_tail(log.meta)  # rsl_rl distillation: each update's last calls, never backpropagated
        if tail:
            lens_applied = lens[applied(np.concatenate(acc.places), log.meta)]
            stretches = stretches[applied(np.concatenate(acc.gradient_places), log.meta)]
        else:
            lens_applied = lens
        if not acc.padding_of.value:
            stored = 0.0 if log.caps.stored_states else None
            out = SequencesSection(0, {}, {}, summary_stats(episodes), len(episodes), 0.0, stored)
            out.episodes_from, out.kept_envs, out.n_envs = source, log.kept_envs, log.n_envs
            out.env_runners = log.env_runners
            return out
        hist: dict[str, int] = {}
        for lo, hi in itertools.pairwise(LENGTH_EDGES):
            n = int(((lens >= lo) & (lens < hi)).sum())
            if n:
                hist[f"{lo}-{hi - 1}" if hi < 10**9 else f">={lo}"] = n
        mid = mid_rollout(log, acc.module.value) if not acc.known_starts.value else None
        shares = log.caps.stored_states and acc.known_starts.value
        stored, of = acc.stored_starts.value, acc.known_starts.value
        steps = log.meta.get("optimizer_steps")
        uncounted = steps is None and log.meta.get("algorithm") == "Distillation"
        return SequencesSection(
            stored_rollout_start_share=(stored - acc.mid_starts.value) / of if shares else None,
            stored_mid_rollout_share=acc.mid_starts.value / of if shares else None,
            stored_starts=(
                {"with_reason": of, "rollout_start": stored - acc.mid_starts.value, "mid_rollout": acc.mid_starts.value}
                if shares
                else {}
            ),
            mid_rollout_starts=mid,
            sequences=len(lens),
            length=summary_stats(lens),
            length_histogram=hist,
            episode_length=summary_stats(episodes),
            episodes_completed=len(episodes),
            padding_share=acc.padding.value / acc.padding_of.value,
            stored_state_share=stored / of if shares else None,
            module=acc.module.value,
            episodes_from=source,
            episodes_under_way=acc.episodes_under_way(),
            kept_envs=log.kept_envs,
            n_envs=log.n_envs,
            env_runners=log.env_runners,
            gradient_length=(
                {} if steps == 0 or uncounted else summary_stats(stretches if acc.inside.value else lens_applied)
            ),
            unapplied_tail=tail or None,
            optimizer_steps=steps,
            steps_uncounted=uncounted,
            starts_inside=acc.inside.value,
        )

    def to_json(self, data: SequencesSection) -> Any:
        out = super().to_json(data)
        for key in ("env_step_stride", "optimizer_steps", "steps_uncounted", "unapplied_tail"):  # only where set
            if getattr(data, key) is None or getattr(data, key) is False:
                del out[key]
        return out

    def unavailable(self, data: SequencesSection, log: Log) -> list[str]:
        if data.env_step_stride is not None:
            return [
                f"episode lengths and where training sequences start: the rollout's env_step advances by "
                f"{data.env_step_stride} a step (a global counter, see the doctor), so they are not counted from it; "
                "tag each env's own step counter"
            ]
        if data.episodes_from is not None or not data.sequences:
            return []
        return ["episode lengths: the rollout calls carry no episode_start tag (nor episode and episode_step)"]

    def findings(self, data: SequencesSection) -> list[str]:
        s = data
        if not (s.sequences and s.length):
            return []
        kept = kept_columns(s.kept_envs, s.n_envs, s.env_runners)
        of = f" of {kept} (the only env columns with rows)" if kept else ""
        msg, why = horizon_in_words(s, of)
        if s.episode_length and not no_claim(s):
            msg += ", while " + episodes_in_words(s.episode_length, s.episodes_completed)
            msg += f" ({under_way_words(s.episodes_under_way)})" if s.episodes_under_way else ""
        msg += why
        whose = f"the training rows of {kept_columns(s.kept_envs, None)}" if kept else "training rows"
        padding = f"{s.padding_share:.0%} of {whose} are padding"
        if s.stored_state_share is None:
            return [msg, padding]
        which = f"the training sequences of {kept}" if kept else "training sequences"
        return [
            msg,
            f"{s.stored_state_share:.0%} of {which}{_of(s)} start from a stored mid-episode state rather than a "
            f"reset{_stored_from(s)}; {padding}",
        ]

    def text(self, data: SequencesSection, caps: Capabilities) -> list[Block]:
        s = data
        if not s.sequences:
            return []
        if s.env_step_stride is not None:
            starts = f"where sequences start is not counted ({_global(s)})"
        elif s.stored_state_share is not None:
            starts = (
                f"{s.stored_state_share:.1%} of sequences{_of(s)} start from a stored mid-episode state rather than "
                f"a reset{_stored_from(s)}"
            )
        elif s.mid_rollout_starts is not None:
            starts = _mid_rollout_words(s)
        elif caps.stored_states:
            starts = "where sequences start from is not recorded (no start reasons)"
        else:
            starts = "whether sequences start from stored states is not recorded (the log declares no stored states)"
        counted = f" of {fmt(s.module)} (layer 0)" if s.module else ""
        horizon = " (the truncated-BPTT horizon)" if not s.starts_inside or s.cut_by_resets is False else ""
        horizon = "" if no_claim(s) else horizon
        kept = kept_columns(s.kept_envs, s.n_envs, s.env_runners)
        if kept:
            counted += f", of {kept} alone (--other-envs none: every count here is of those columns)"
        return [
            Panel(
                "Sequences",
                (
                    f"{s.sequences:,} training sequences{counted}; length{horizon}: "
                    f"min {fmt_steps(s.length.get('min'))}, median {fmt_steps(s.length.get('median'))}, "
                    f"mean {fmt_steps(s.length.get('mean'))}, max {fmt_steps(s.length.get('max'))}\n"
                    f"{cuts_line(s)}"
                    f"histogram: {', '.join(f'{k}: {v:,}' for k, v in s.length_histogram.items())}\n"
                    f"{_episodes_line(s)}\n"
                    f"padding {s.padding_share:.1%} of train rows; {starts}",
                ),
            )
        ]


def _episodes_line(s: SequencesSection) -> str:
    if s.env_step_stride is not None:
        return f"episodes: not counted ({_global(s)})"
    e, n, u = s.episode_length, s.episodes_completed, s.episodes_under_way
    left = f"; {under_way_words(u)}" if u else ""
    if not n:  # no length to give: not 'length median -, max -'
        return f"episodes completed: 0 (none ended in the log){left}"
    return f"episodes completed: {n:,}, length median {fmt_steps(e.get('median'))}, max {fmt_steps(e.get('max'))}{left}"


def under_way_words(n: int) -> str:
    """'3 episodes already under way when the log began are left out (their steps in the episode unknown)'."""
    what, verb = ("episode", "is") if n == 1 else ("episodes", "are")
    return f"{n:,} {what} already under way when the log began {verb} left out (their steps in the episode unknown)"


def _global(s: SequencesSection) -> str:
    return f"the rollout's env_step advances by {s.env_step_stride} a step, a global counter: see the doctor"


def judge_env_steps(data: SequencesSection, stride: int) -> None:
    """The doctor found the rollout's env_step advancing by ``stride`` > 1 at every step (a global counter): the
    figures counted from env steps (episode lengths and counts, the mid-rollout starts) are withheld."""
    data.env_step_stride = stride
    data.episode_length, data.episodes_completed, data.mid_rollout_starts = {}, 0, None


ACTING_STARTS = ("rollout", "bootstrap")


def _from_starts(log: Log) -> np.ndarray | None:
    """Lengths of the episodes between an env's consecutive episode starts (its step 0 starts its first) in the
    rollout and bootstrap rows of layer 0, each (worker, env, env step) once however many modules; None where no
    such row says whether an episode starts there."""
    names = set(log.data.schema.names)
    if not {"episode_start", "env", "env_step"} <= names:
        return None
    cols = ["env", "env_step", *(["worker"] if "worker" in names else [])]
    base = (ds.field("layer") == 0) & ds.field("phase").isin(list(ACTING_STARTS)) & ds.field("env").is_valid()
    tagged = base & ds.field("env_step").is_valid() & ds.field("episode_start").is_valid()
    data = budget.prune(log.data, tagged)  # the acting rows' row groups (footer statistics)
    budget.check_stream(data, [*cols, "layer", "phase", "episode_start"], "the episodes' read")
    starts = tagged & ((ds.field("episode_start") == True) | (ds.field("env_step") == 0))  # noqa: E712
    if not data.count_rows(filter=tagged):
        return None
    keys: list[np.ndarray] = []
    for batch in data.scanner(columns=cols, filter=starts, batch_size=1 << 17).to_batches():
        if batch.num_rows:
            c = [batch.column(k).to_numpy(zero_copy_only=False).astype(np.float64) for k in cols]
            keys.append(np.stack([c[2] if len(c) > 2 else np.zeros(len(c[0])), c[0], c[1]], axis=1))
    if not keys:
        return np.zeros(0, np.float32)
    rows = np.unique(np.nan_to_num(np.concatenate(keys), nan=-1.0), axis=0)  # sorted: worker, env, env step
    same = (rows[1:, 0] == rows[:-1, 0]) & (rows[1:, 1] == rows[:-1, 1])
    return (rows[1:, 2] - rows[:-1, 2])[same].astype(np.float32)


def mid_rollout(log: Log, module: str | None) -> int | None:
    """How many training sequences of ``module`` (layer 0: each one's t = 0 row) start mid-rollout: where the train
    row's episode_start is False and its env step lies after its env's first rollout step of the same iteration
    (worker too, RLlib). Read only for a log whose train rows carry no start reason (an own loop), apart from the
    scan: the rollout rows' first steps, then the sequences' first rows. None: nothing to count from."""
    names = set(log.data.schema.names)
    if module is None or not {"episode_start", "env", "env_step", "iteration"} <= names:
        return None
    keys = ["iteration", "env", *(["worker"] if "worker" in names else [])]
    valid = ds.field("env").is_valid() & ds.field("env_step").is_valid() & ds.field("iteration").is_valid()
    roll = (ds.field("layer") == 0) & (ds.field("phase") == "rollout") & valid
    first = (ds.field("layer") == 0) & (ds.field("phase") == "train") & (ds.field("t") == 0) & valid
    first &= (ds.field("module") == module) & ds.field("episode_start").is_valid()
    budget.check_stream(log.data, [*keys, "env_step", "episode_start"], "the sequences' start read")
    if not budget.prune(log.data, first).count_rows(filter=first):
        return None  # no train row says whether its sequence starts at an episode start
    if "init" in names:  # a sequence started from zeros (or a reset) starts from no stored state, wherever it is
        first &= ds.field("init").is_null() | ~ds.field("init").isin(["zero", "reset"])
    room = budget.limit() // 64  # rows of keys (and their sorting's copies) the count may hold: else it says None
    if budget.prune(log.data, first).count_rows(filter=first) > room:
        return None

    def batches(filt: ds.Expression, cols: list[str]) -> Iterator[list[np.ndarray]]:
        scanner = budget.prune(log.data, filt).scanner(columns=cols, filter=filt, batch_size=1 << 17)
        for batch in scanner.to_batches():
            if batch.num_rows:
                yield [batch.column(c).to_numpy(zero_copy_only=False) for c in cols]

    def key(cols: list[np.ndarray]) -> np.ndarray:
        return np.stack([np.nan_to_num(c.astype(np.float64), nan=-1.0) for c in cols], axis=1)

    def lowest(k: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each distinct key of ``k`` and its smallest step."""
        keys, inv = np.unique(k, axis=0, return_inverse=True)
        low = np.full(len(keys), np.inf)
        np.minimum.at(low, inv.reshape(-1), step.astype(np.float64))
        return keys, low

    found, held = [], 0
    for cols in batches(roll, [*keys, "env_step"]):
        found.append(lowest(key(cols[:-1]), cols[-1]))  # one row a key
        held += len(found[-1][1])
        if held > room:
            return None
    train = list(batches(first, [*keys, "env_step", "episode_start"]))  # one row a sequence
    if not found:
        return None
    if not train:
        return 0
    rkeys, low = lowest(np.concatenate([k for k, _ in found]), np.concatenate([v for _, v in found]))
    *tk, tstep, tstart = (np.concatenate(c) for c in zip(*train, strict=True))
    both, where = np.unique(np.concatenate([rkeys, key(tk)]), axis=0, return_inverse=True)
    where = where.reshape(-1)
    lowest_of = np.full(len(both), np.inf)  # each (iteration, env)'s first rollout step; inf: none
    lowest_of[where[: len(rkeys)]] = low
    after = tstep.astype(np.float64) > lowest_of[where[len(rkeys) :]]
    return int((after & ~tstart.astype(bool)).sum())


def episodes_in_words(length: dict[str, float], completed: int) -> str:
    """How long completed episodes last, in words: 'the one completed episode lasts 200 steps', or
    'completed episodes last 19 steps (the median of 24 episodes)'."""
    if completed == 1:
        return f"the one completed episode lasts {fmt_steps(length['median'])} steps"
    return f"completed episodes last {fmt_steps(length['median'])} steps (the median of {completed:,} episodes)"


AT_ROLLOUT_START = "at their rollout's start (the state the rollout itself began from)"
MID_ROLLOUT_WORDS = "mid-rollout (a state the rollout stored there, with the weights it ran with)"


def _of(s: SequencesSection) -> str:
    """' (42 of 90)': the sequences that start from a stored state, of those with a start reason ('' where none
    does)."""
    n = s.stored_starts
    if not s.stored_state_share or not n:
        return ""
    return f" ({n['rollout_start'] + n['mid_rollout']:,} of {n['with_reason']:,})"


def _stored_from(s: SequencesSection) -> str:
    """Where the stored states the sequences start from come from, after their share: ': all at their rollout's
    start (...)', ': all mid-rollout (...)', or ': 12 at their rollout's start (...), 30 mid-rollout (...)' (counts:
    they add up, where rounded shares may not); '' where none starts from one."""
    n = s.stored_starts
    if not s.stored_state_share or not n:
        return ""
    at, mid = n["rollout_start"], n["mid_rollout"]
    if not mid:
        return f": all {AT_ROLLOUT_START}"
    if not at:
        return f": all {MID_ROLLOUT_WORDS}"
    return f": {at:,} {AT_ROLLOUT_START}, {mid:,} {MID_ROLLOUT_WORDS}"


def _mid_rollout_words(s: SequencesSection) -> str:
    """Where a log records no start reasons (an own loop): how many sequences start mid-rollout, counted from their
    env steps (:attr:`SequencesSection.mid_rollout_starts`)."""
    n = s.mid_rollout_starts or 0
    if not n:
        return "no sequence starts mid-rollout from a stored state, as their env steps show (no start reasons recorded)"
    return (
        f"{n:,} of {s.sequences:,} sequences start {MID_ROLLOUT_WORDS}, as their env steps show (no start "
        "reasons recorded)"
    )
