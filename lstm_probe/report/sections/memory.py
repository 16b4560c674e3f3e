"""The "Memory" section: does the policy use its recurrent state, and how far back (the memory horizon measured
during the run, ``--memory``), beside the training's BPTT horizon and the episode lengths.

The records come from the log's ``memory`` metadata (written by ``measure/memory.py`` through an integration's
adapter): effect(k) per (iteration, module, k), the effect on the policy's outputs at a step t of replacing the
state after step t-k by zero (the policy then sees its last k inputs only). The horizon of a curve is the smallest
k whose effect is below 5% of effect(1); "unused" when effect(1) itself is negligible; "beyond" when it never
drops within the measured k.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lstm_probe.contract import Capabilities
from lstm_probe.report.numeric import is_count
from lstm_probe.report.section import (
    Block,
    Log,
    Panel,
    Section,
    Table,
    cut_spans,
    fmt,
    fmt_steps,
    kept_columns,
    module_label,
    span_words,
)
from lstm_probe.report.sections.sequences import SequencesSection, under_way_words

SHOWN_RUNS = 12
"""The text shows a module's horizons over every measured iteration as runs of equal horizons (``2-67: 4``) where
there are at most this many runs; else as :data:`SPANS` spans of the measured iterations (the JSON keeps every one)."""
SPANS = 8
"""Spans of measured iterations the text sums a module's horizons up in where they change too often for runs; the
finding's recent iterations are the last of them."""
FRACTION = 0.05
"""The horizon is the smallest k whose effect is below this fraction of effect(1)."""
NEGLIGIBLE = {"kl": 1e-8, "value_rel": 1e-5}
"""effect(1) below this (KL in nats; value difference in units of the rollout's value spread): memory unused."""
METRIC = {"actor": "kl", "critic": "value_rel"}
"""The output each module's horizon is read from (the actor: the action distribution; the critic: the value)."""


def horizon(
    ks: list[int], effects: list[float | None], negligible: float, fraction: float = FRACTION
) -> dict[str, Any]:
    """The horizon of one effect curve (k ascending, k = 1 first): ``horizon`` (k; 0 when unused; None when beyond
    or unmeasured), ``unused`` (effect(1) below ``negligible``), ``beyond`` (never below ``fraction`` of effect(1)
    within the measured k, the largest in ``max_k``)."""
    pairs = [(k, e) for k, e in zip(ks, effects, strict=True) if e is not None]
    max_k = pairs[-1][0] if pairs else None
    out: dict[str, Any] = {"horizon": None, "unused": False, "beyond": False, "max_k": max_k}
    if not pairs or pairs[0][0] != 1:
        return out
    e1 = pairs[0][1]
    if e1 < negligible:
        return out | {"horizon": 0, "unused": True}
    for k, e in pairs[1:]:
        if e < fraction * e1:
            return out | {"horizon": k}
    return out | {"beyond": True}


@dataclass
class MemorySection:
    """The memory horizon by iteration and module, the latest curves, and the horizons beside them."""

    measured: bool
    modules: list[str] = field(default_factory=list)
    critic: str | None = None
    module_names: dict[str, str] = field(default_factory=dict)
    """Role ('actor', 'critic') -> the traced module's name where they differ (TorchRL's and own loops' ``lstm``),
    as the measurement recorded it; the text names a module as the other sections do (``section.module_label``)."""
    lags: list[int] = field(default_factory=list)
    horizons: list[dict[str, Any]] = field(default_factory=list)
    """Per measured (iteration, module): horizon, unused, beyond, max_k, metric, effect_1."""
    latest: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Module -> the last measured iteration's curve: iteration, metric, k, effect, pairs, and its horizon."""
    bptt: dict[str, float] = field(default_factory=dict)
    """How far back gradients flow (longest and median), as the sequences section's ``gradient_length``: the
    training sequences' lengths, or where a per-step training loop resets the state at episode starts inside them,
    the stretches between those (unless the doctor found the state carried across them): set by
    :meth:`from_sequences`, from the rows the sequences section counted."""
    episode_length: dict[str, Any] = field(default_factory=dict)
    """The episodes the text sets beside the horizons (count, median, max): where the log holds every env column's
    rows and its rollout rows count completed episodes, the sequences section's (the same figures as its panel:
    ``episodes_from`` 'log'); else those the measurement saw (``measured_episode_length``: 'measurement')."""
    measured_episode_length: dict[str, Any] = field(default_factory=dict)
    """The episodes the measurement itself saw (the log's ``memory.episode_lengths``: count, median, max), of every
    env, over the whole run: episodes that end in a rollout (or, for chunked rollouts, those whole within one
    chunk), the last 10,000."""
    episodes_under_way: int = 0
    """Where :attr:`episode_length` is the sequences section's ('log'): its ``episodes_under_way`` (episodes already
    under way when the log began, left out of the figures: a continued sb3 learn), said with them."""
    episodes_from: str = "measurement"
    """Where :attr:`episode_length` comes from: 'log' (the sequences section's count of the log's rollout rows) or
    'measurement' (:attr:`measured_episode_length`)."""
    chunks: int | None = None
    """Where the measured rollouts are episode chunks (an integration whose training cuts them at ``max_seq_len``,
    RLlib: each chunk one episode's steps within one rollout fragment, read as an env column): the chunks of the
    last measured update; ``rollout_length`` is then the longest chunk read (each update reads its own, at most
    ``sampling.max_chunk_steps``; in logs without it, every update's were read to the first update's longest chunk,
    its appended bootstrap step included) and ``n_envs`` None. None: env-major rollouts."""
    rollout_length: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    seconds: float | None = None
    kept_envs: int | None = None
    """K where the log keeps the rows of env columns 0..K-1 alone (``--trace-envs K --other-envs none``): the BPTT
    lengths are then of those columns, while the horizons and the episode lengths are of every env the probe
    sampled; None where every column has rows."""
    n_envs: int | None = None
    """The envs the horizons and episode lengths are measured on (``sampling.n_envs``; else the run's; None where
    the rollouts are episode chunks: ``chunks``)."""
    run_envs: int | None = None
    """The run's envs, as its metadata says (per env runner where ``env_runners``): the kept columns are of these."""
    env_runners: int | None = None
    """RLlib: the env runners, where more than one, that stepped ``run_envs`` envs each."""
    scope: dict[str, str] = field(default_factory=dict)
    """Where the log keeps only some env columns (``kept_envs``): what each figure is of, in words, under
    ``horizons`` (and ``latest``), ``episode_length`` and ``bptt``; empty where every column has rows."""
    starts_inside: int = 0
    """Episode starts inside the training sequences of a per-step training loop (the sequences section's
    ``starts_inside``)."""
    cut_by_resets: bool | None = None
    """Whether those starts cut the gradient (the sequences section's ``cut_by_resets``); None where there are none."""

    def from_sequences(self, sequences: SequencesSection) -> None:
        """What the sequences section counted on the log's rows, set beside the horizons: how far back gradients
        flow (its ``gradient_length``, after its verdict on the episode starts inside the sequences, ``judge_resets``),
        and, through :meth:`episodes_of`, the episodes."""
        self.bptt = dict(sequences.gradient_length)
        self.starts_inside, self.cut_by_resets = sequences.starts_inside, sequences.cut_by_resets
        self.episodes_of(sequences)

    def from_calls(self, rollout_modules: set[str], traced: set[str]) -> None:
        """Marks the curves of a module the collection never runs (``rollout_modules``: the modules with a rollout
        call in the log; a module not among them, a critic with an LSTM of its own left out of the collecting
        policy): the states stored for it are the initial zeros (TorchRL: the primer's), which zeroing leaves as
        they are, so its effect(1) is 0 by construction, not a sign of an unused memory. Its curves get
        ``uncollected`` and no horizon; nothing changes where the log holds no rollout call at all, nor for a
        module without calls in the log (``traced``: the modules with any call)."""
        if not rollout_modules:
            return
        curves = [(str(h["module"]), h) for h in self.horizons] + list(self.latest.items())
        for role, curve in curves:
            if self.critic == "shared" and role == "critic":
                continue  # the actor's module read for values: collected with the actor
            name = str(self.module_names.get(role) or role)
            if name in traced and name not in rollout_modules:
                curve.update(horizon=None, unused=False, beyond=False, uncollected=True)

    def episodes_of(self, sequences: SequencesSection) -> None:
        """One answer to "how long are episodes": where the log holds every env column's rows (no ``kept_envs``) and
        the sequences section counted completed episodes in them, the text says its figures, not the measurement's
        own count (which misses the episodes that end at the last rollout's end, and, for chunked rollouts, those
        split over two chunks); else the measurement's, said as such."""
        if self.measured and self.kept_envs is None and sequences.episodes_completed and sequences.episode_length:
            e = sequences.episode_length
            self.episode_length = {"count": sequences.episodes_completed, "median": e["median"], "max": e["max"]}
            self.episodes_from = "log"
            self.episodes_under_way = sequences.episodes_under_way


def memory_scope(
    kept: int | None, n_envs: int | None, run_envs: int | None, runners: int | None = None, chunked: bool = False
) -> dict[str, str]:
    """What the memory figures are of where a log keeps env columns 0..``kept``-1 alone: the horizons and the
    episode lengths of all ``n_envs`` envs (the probe measures them on the whole rollout; ``chunked``: on each
    update's episode chunks), the BPTT lengths of the kept columns (read from the log's rows; of ``run_envs``, per
    env runner where ``runners``); empty where ``kept`` is None."""
    if kept is None:
        return {}
    every = f"all {n_envs:,} envs" if n_envs else "every env"
    return {
        "horizons": f"{every} (sampled steps of each update's episode chunks, measured during the run)"
        if chunked
        else f"{every} (sampled rollout steps of each env, measured during the run)",
        "episode_length": f"{every} (the episodes whole within one chunk)"
        if chunked
        else f"{every} (the rollouts' completed episodes)",
        "bptt": f"{kept_columns(kept, run_envs or n_envs, runners)} alone (the only env columns with rows in this log)",
    }


def _curves(records: dict[str, list[Any]]) -> dict[tuple[int, str], list[tuple[int, dict[str, Any]]]]:
    out: dict[tuple[int, str], list[tuple[int, dict[str, Any]]]] = {}
    n = len(records.get("k", []))
    for i in range(n):
        row = {c: v[i] for c, v in records.items()}
        out.setdefault((int(row["iteration"]), str(row["module"])), []).append((int(row["k"]), row))
    for v in out.values():
        v.sort(key=lambda kr: kr[0])
    return out


UNCOLLECTED = (
    "the collection never runs this module, so the states stored for it in the rollout are the initial zeros "
    "(TorchRL: the primer's), which zeroing leaves as they are (its effect at k = 1 is 0 by construction, not a "
    "sign that it is unused); run it in the collecting policy too"
)
"""Why a module the collection never runs has no memory horizon (``MemorySection.from_calls``)."""

MEMORY_NOTE = "the memory horizon (does the policy use its recurrent state, and how far back?)"
"""How the report names the section where a log lacks it."""


class Memory(Section[MemorySection]):
    key = "memory"
    needs: ClassVar[str | None] = "respond"  # the measurement re-runs the policy over a rollout, state ablated
    says_when_absent: ClassVar[bool] = True  # an integration without the capability: the line says what would
    findings_rank: ClassVar[int] = 12

    def unavailable(self, data: MemorySection | None, log: Log) -> list[str]:
        if data is not None and data.measured:
            return []
        if not log.caps.respond and (why := log.not_measurable.get("memory")):
            return [f"{MEMORY_NOTE}: not available for this run ({why})"]
        if log.caps.respond:
            return [f"{MEMORY_NOTE}: not measured in this run; lstm-probe run --memory (memory=True in code) adds it"]
        return [
            f"{MEMORY_NOTE}: needs an integration that can re-run a rollout on a copy of the policy with its state "
            "ablated (sb3, rsl_rl, TorchRL and RLlib: lstm-probe run --memory; in code, memory=True where the probe "
            "is attached; an own loop: trace(..., memory=True, heads=...) and probe.measure_batch, "
            "docs/own-loops.md)"
        ]

    def compute(self, log: Log, acc: Any) -> MemorySection:
        meta = log.meta.get("memory")
        if not isinstance(meta, dict) or not isinstance(meta.get("records"), dict):
            return MemorySection(measured=False)
        sampling = dict(meta["sampling"]) if isinstance(meta.get("sampling"), dict) else {}
        sampled = sampling.get("n_envs")
        n_envs = sampled if isinstance(sampled, int) and not isinstance(sampled, bool) and sampled > 0 else log.n_envs
        chunks = n_envs if log.caps.max_seq_len is not None else None  # RLlib's rollout: an update's episode chunks
        episodes = dict(meta.get("episode_lengths") or {})
        data = MemorySection(
            measured=True,
            modules=[str(m) for m in meta.get("modules") or []],
            critic=meta.get("critic"),
            module_names={str(k): str(v) for k, v in (meta.get("module_names") or {}).items()}
            if isinstance(meta.get("module_names"), dict)
            else {},
            lags=[int(k) for k in meta.get("lags") or []],
            episode_length=episodes,
            measured_episode_length=dict(episodes),
            chunks=chunks,
            rollout_length=meta.get("rollout_length"),
            sampling=sampling,
            seconds=meta.get("seconds"),
            kept_envs=log.kept_envs,
            n_envs=None if chunks is not None else n_envs,
            run_envs=log.n_envs,
            env_runners=log.env_runners,
            scope=memory_scope(
                log.kept_envs,
                None if chunks is not None else n_envs,
                log.n_envs,
                log.env_runners,
                chunked=chunks is not None,
            ),
        )
        for (iteration, module), curve in sorted(_curves(meta["records"]).items()):
            views = [(module, METRIC.get(module, "kl"))]
            if data.critic == "shared" and module == "actor" and any(r.get("value_rel") is not None for _, r in curve):
                views.append(("critic", "value_rel"))  # the values read the actor's LSTM: their horizon too
            for label, metric in views:
                ks = [k for k, _ in curve]
                effects = [row.get(metric) for _, row in curve]
                h = horizon(ks, effects, NEGLIGIBLE[metric])
                data.horizons.append(
                    {"iteration": iteration, "module": label, "metric": metric, "effect_1": effects[0], **h}
                )
                data.latest[label] = {
                    "iteration": iteration,
                    "metric": metric,
                    "k": ks,
                    "effect": effects,
                    "pairs": [row.get("pairs") for _, row in curve],
                    **h,
                }
        return data

    def findings(self, data: MemorySection) -> list[str]:
        if not data.measured:
            return []
        out = []
        for module, c in data.latest.items():
            what = "actions" if c["metric"] == "kl" else "values"
            if c.get("uncollected"):
                label = module_label(module, data.module_names, data.critic)
                out.append(f"{label}: memory not measured (iteration {c['iteration']}): {UNCOLLECTED}")
                continue
            if c["unused"]:
                out.append(
                    f"{module}: the policy's {what} do not depend on its recurrent state (iteration {c['iteration']}): "
                    "a feed-forward policy (or frame stacking) would do"
                )
                continue
            if c["beyond"]:
                reach = f"further back than the {c['max_k']} steps measured"
            elif c["horizon"] is None:
                continue
            else:
                reach = f"on the last ~{c['horizon']} steps"
            scope = data.scope
            msg = f"{module}: {what} depend {reach} (iteration {c['iteration']}{_recent(data, module, c)}"
            msg += f", measured on {_envs(data)})" if scope else ")"
            if data.bptt:
                msg += (
                    f"; gradients flow back at most {fmt_steps(data.bptt['max'])} "
                    f"(median {fmt_steps(data.bptt['median'])})"
                )
                if scope:
                    msg += f" through the training sequences of {_kept(data)}"
                if data.starts_inside:
                    msg += (
                        ", across the episode starts inside the training sequences (the state is not reset there)"
                        if data.cut_by_resets is False
                        else ", cut at the episode starts inside the training sequences (the state is reset there)"
                    )
            if data.episode_length.get("median") is not None:
                msg += f"; episodes last {fmt_steps(data.episode_length['median'])}"
                if data.episodes_from == "log" and data.episodes_under_way:
                    msg += f" ({under_way_words(data.episodes_under_way)})"
                if scope and data.episodes_from == "measurement":
                    msg += f" (median over {_envs(data)})"
            out.append(msg)
        return out

    def text(self, data: MemorySection, caps: Capabilities) -> list[Block]:
        if not data.measured:
            return []
        rows = []
        for module, c in data.latest.items():
            curve = ", ".join(f"{k}: {fmt(e)}" for k, e in zip(c["k"], c["effect"], strict=True))
            label = module_label(module, data.module_names, data.critic)
            rows.append((fmt(label), fmt(c["metric"]), _horizon_words(c), curve))
        by_iteration: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for h in data.horizons:
            label = module_label(h["module"], data.module_names, data.critic)
            by_iteration.setdefault(label, []).append((int(h["iteration"]), h))
        sampled = data.sampling
        every, kept = "", ""
        if data.scope:  # the log keeps some env columns alone: say which figure is of which envs
            every = f" of {_envs(data)}"
            kept = f" of {_kept(data)} (the only env columns with rows)"
        steps = len(sampled.get("steps_per_env") or [])
        where = f"{steps} steps per env{every}"
        if data.chunks is not None:
            where = (
                f"up to {steps} steps per episode chunk (an episode's steps within one rollout fragment; "
                f"{data.chunks:,} chunks in the last measured update)"
            )
        lines = (
            f"state zeroed k steps back at {where}, every "
            f"{fmt(sampled.get('every'))} iteration(s) ({fmt(sampled.get('iterations_measured'))} measured, "
            f"{fmt(data.seconds)} s)\n"
            f"{_bptt_label(data, kept)}: median {fmt_steps(data.bptt.get('median'))}, "
            f"max {fmt_steps(data.bptt.get('max'))}; {_episodes_words(data, every)}; {_rollout_words(data)}\n"
            + "\n".join(_by_iteration(m, v) for m, v in by_iteration.items())
        )
        return [
            Panel("Memory", (lines,)),
            Table(
                "Memory: effect(k) at the last measured iteration",
                ("module", "metric", "horizon", "k: effect"),
                tuple(rows),
            ),
        ]


def _by_iteration(module: str, horizons: list[tuple[int, dict[str, Any]]]) -> str:
    """A module's horizons over every measured iteration (in order): runs of equal horizons where there are at most
    :data:`SHOWN_RUNS`, else :data:`SPANS` spans of the measured iterations, each with its most common horizon and
    their range, so that a long run's trend shows whole (never only its last iterations)."""
    words = [(it, _horizon_words(h)) for it, h in horizons]
    runs: list[tuple[int, int, str]] = []
    for it, w in words:
        if runs and runs[-1][2] == w:
            runs[-1] = (runs[-1][0], it, w)
        else:
            runs.append((it, it, w))
    if len(runs) <= SHOWN_RUNS:
        return f"horizon by iteration, {fmt(module)}: {'; '.join(f'{span_words(a, b)}: {w}' for a, b, w in runs)}"
    n = len(words)
    spans = []
    for a, b in cut_spans(n, SPANS):
        part = words[a:b]
        common, counts = _common([w for _, w in part])
        ordered = sorted(counts, key=_order)
        spread = f" ({ordered[0]} to {ordered[-1]})" if len(ordered) > 1 else ""
        spans.append(f"{span_words(part[0][0], part[-1][0])}: {common}{spread}")
    return (
        f"horizon by iteration, {fmt(module)} ({SPANS} spans of the {n:,} measured iterations: the most common "
        f"horizon, its range in brackets; --json has every one): {'; '.join(spans)}"
    )


def _recent(data: MemorySection, module: str, latest: dict[str, Any]) -> str:
    """Where the last measured iteration's horizon is not the most common of the recent measured iterations: that
    one, so that one iteration's outlier is not read as the run's ('; ~4 at 3 of the last 4 measured iterations');
    else nothing. The recent iterations are the last of :data:`SPANS` spans of the measured ones, the text's last
    span where it shows spans (:func:`_by_iteration`); nothing where that span is one iteration."""
    words = [_horizon_words(h) for h in data.horizons if h["module"] == module]
    tail = words[cut_spans(len(words), SPANS)[-1][0] :] if words else []
    if len(tail) < 2:
        return ""
    common, counts = _common(tail)
    if common == _horizon_words(latest) or counts[common] * 2 <= len(tail):
        return ""
    reach = "unused" if common == "unused" else f"{common}" if common.startswith(">") else f"~{common}"
    return f"; {reach} at {counts[common]:,} of the last {len(tail):,} measured iterations"


def _common(words: list[str]) -> tuple[str, Counter[str]]:
    """The most common of a span's horizons in words (ties: the shorter horizon), and how often each is."""
    counts = Counter(words)
    return max(counts, key=lambda w: (counts[w], -_order(w))), counts


def _order(words: str) -> float:
    """A horizon's words as a number to sort by: unused 0, k, '> K' past K, unmeasured ('-') last."""
    if words == "unused":
        return 0.0
    if words.startswith("> "):
        return float(words[2:].replace(",", "")) + 0.5
    try:
        return float(words.replace(",", ""))
    except ValueError:
        return float("inf")


def _episodes_words(data: MemorySection, every: str) -> str:
    """The episodes beside the horizons: the log's completed episodes (the sequences section's figures), or those
    the measurement saw, said as such."""
    e = data.episode_length
    figures = f"median {fmt_steps(e.get('median'))}, max {fmt_steps(e.get('max'))}"
    count = e.get("count")
    n = f"{int(count):,}, " if isinstance(count, int | float) and not isinstance(count, bool) else ""
    if n == "0, ":  # no length to give: not 'median -, max -'
        figures, n = "none ended", ""
    if data.episodes_from == "log":
        under = f" ({under_way_words(data.episodes_under_way)})" if data.episodes_under_way else ""
        return f"episodes completed: {n}{figures}{under}"
    whole = " (those whole within one chunk)" if data.chunks is not None else ""
    return f"episodes seen by the memory measurement{every}{whole}: {n}{figures}"


def _rollout_words(data: MemorySection) -> str:
    """The length of the rollouts the measurement reads: an env's rollout, or how far episode chunks are read."""
    cap, cut = (data.sampling.get(k) for k in ("max_chunk_steps", "cut_updates"))
    if data.chunks is not None and cap is not None:  # each update's chunks read whole, up to a bound
        cut = cut if is_count(cut) and is_count(cap) else 0  # a log's (a user's file): counts, or no cut said
        return (
            f"each update's chunks read whole (the longest {fmt(data.rollout_length)} steps, its appended bootstrap "
            "step included)"
            + (f"; {cut:,} update(s) had longer chunks, read to their first {cap:,} steps" if cut else "")
        )
    if data.chunks is not None:  # a log from before: the first update's longest chunk bounded every update's
        return (
            f"chunks read to their first {fmt(data.rollout_length)} steps (the first update's longest chunk, its "
            "appended bootstrap step included)"
        )
    return f"rollout {fmt(data.rollout_length)} steps"


def _bptt_label(data: MemorySection, kept: str) -> str:
    """What the BPTT figures are of: the training sequences, or the stretches between the episode starts inside
    them where the state is reset there."""
    if not data.starts_inside:
        return f"training sequences (BPTT){kept}"
    starts = "the one episode start" if data.starts_inside == 1 else f"the {data.starts_inside:,} episode starts"
    if data.cut_by_resets is False:
        return f"training sequences (BPTT){kept}, across {starts} inside them (the state is not reset there)"
    return f"BPTT{kept} (the training sequences cut at {starts} inside them, where the state is reset)"


def _kept(data: MemorySection) -> str:
    """The env columns the log keeps rows of, in words, as the calls section says them (per env runner where
    several)."""
    return kept_columns(data.kept_envs, data.run_envs or data.n_envs, data.env_runners)


def _envs(data: MemorySection) -> str:
    """'all 64 envs' (the envs the horizons and episode lengths are of); 'every env' where the count is unknown or
    the rollouts are episode chunks."""
    return f"all {data.n_envs:,} envs" if data.n_envs else "every env"


def _horizon_words(h: dict[str, Any]) -> str:
    if h.get("uncollected"):
        return "not run in collection"
    if h.get("unused"):
        return "unused"
    if h.get("beyond"):
        return f"> {h.get('max_k')}"
    return fmt(h.get("horizon"))
