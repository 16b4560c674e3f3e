"""The verdict at the top of every report: did the stored states go stale, does it matter for values and
actions, and which burn-in would suffice (the question lstm-probe exists for; docs/report.md, "Verdict").

Made from the sections' data, never from rows: the staleness section's drift by epoch and provenance check, and
the what-if section's counterfactuals where the run measured them. What a log cannot answer is said as
"unmeasured", with the option that measures it, never guessed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from lstm_probe.contract import Capabilities
from lstm_probe.report.section import kept_columns, span_words
from lstm_probe.report.sections.cross_process import kinds, unsynced
from lstm_probe.report.sections.staleness import StalenessSection, last_update, unmeasured
from lstm_probe.report.sections.staleness_trend import last_span
from lstm_probe.report.sections.what_if import (
    STORED,
    WHOLE,
    WITHIN,
    ZERO,
    WhatIfSection,
    burn_in_needed,
    no_state,
    stored_within,
)

STALE = 0.01
"""Stored states are called stale when, by the last epoch, the mean relative L2 drift of some module's training
states from the rollout states of the same env step (layer 0, ||train - rollout|| / ||rollout||) is above this."""
MID_ROLLOUT = ("split", "minibatch_cut", "max_seq_len")
"""The start reasons (``seq_reason``) of training sequences that start mid-rollout, from a state the rollout
stored there with older weights: the only states that can go stale. A sequence that starts at its rollout's start
('env_boundary') or at an episode start starts from the state refreshed states start from too."""


@dataclass
class Verdict:
    """The report's verdict (its JSON: ``verdict``)."""

    stale: bool | None
    """The drift is above :data:`STALE` by the last epoch; None: unmeasured. Where ``stored_starts`` is False no
    stored state is involved: the drift is then the training pass recomputing the states with the updated weights,
    not stale stored states (the lines say which)."""
    stored_starts: bool | None = None
    """Some training sequence starts mid-rollout from a state the rollout stored there (its start reason is one of
    :data:`MID_ROLLOUT`, or the what-if found stored initial states away from refreshed ones): a drift above
    :data:`STALE` is of stored states gone stale. False: every sequence starts at its rollout's start or at an
    episode start (the start reasons say so, or the what-if's stored states equal refreshed ones), where stored
    states are refreshed states by construction. None: the log says neither."""
    drift: dict[str, float] = field(default_factory=dict)
    """Module -> mean relative drift of its layer-0 training states in the last epoch; where every train row is of
    one epoch over several minibatches (a loop of updates), at the last minibatch of an update."""
    unsynced: dict[str, str] = field(default_factory=dict)
    """Modules whose rollout-time copy runs other weights than training's (module -> why, as the log says it: the
    what-if's ``unsynced``, or the cross-process check's first pass: :func:`~lstm_probe.report.sections.
    cross_process.unsynced`): their drift is already there before any optimizer step, so it is not staleness;
    ``stale`` is judged on the other modules alone (None where none is left)."""
    epoch: int | None = None
    """The last epoch the drift and the what-if figures are from."""
    provenance_ok: bool | None = None
    matters: bool | None = None
    """Stored states move values or actions by more than :data:`~lstm_probe.report.sections.what_if.WITHIN`
    against refreshed states (what-if); None: unmeasured."""
    value_rel: float | None = None
    ratio_change: float | None = None
    burn_in: int | None = None
    """The shortest measured burn-in that brings values and actions within 1%; 0: none needed (stored states are
    within); None: unmeasured, or none measured suffices (``burn_in_measured`` then lists them). The what-if
    section's footer and its ``within`` say the same for each epoch (``what_if.burn_in_needed``)."""
    burn_in_from: str | None = None
    """'zero' or 'stored': where that burn-in starts."""
    burn_in_measured: list[int] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    """The verdict as the text report and the HTML page show it."""
    scope: dict[str, str] = field(default_factory=dict)
    """Where the log keeps the rows of some env columns alone (``--trace-envs K --other-envs none``): what the
    figures are of, under ``drift`` (the kept columns, read from the rows) and ``matters`` (the what-if's whole
    minibatches, measured during training); empty where every column has rows."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pct(x: float) -> str:
    """Two significant digits, never in exponent form: 0.000087%, 0.37%, 4%, 130%, 2400% (``:.2g`` wrote
    1.3e+02% and 8.7e-05%)."""
    p = float(f"{100 * x:.2g}")
    if not math.isfinite(p):
        return f"{p}%"
    return f"{p:.0f}%" if abs(p) >= 100 else f"{np.format_float_positional(p, trim='-')}%"


def _drifts(st: StalenessSection | None) -> tuple[int | None, dict[str, float]]:
    if st is None:
        return None, {}
    rows = [r for r in st.by_epoch if r.get("layer") == 0 and r.get("drift_h_mean") is not None]
    if not rows:
        return None, {}
    last = max(int(r["epoch"]) for r in rows)
    return last, {str(r["module"]): float(r["drift_h_mean"]) for r in rows if int(r["epoch"]) == last}


def _minibatch_drifts(cross: Any) -> tuple[int | None, dict[str, float], str]:
    """The drift by the last minibatch of an update, from a sharded log's cross-process section (RLlib: its
    minibatches cycle across epochs, so the last one stands for the last epoch), and how it was measured where
    not every row by its vectors (``cross_process.kinds``)."""
    rows = [r for r in getattr(cross, "by_minibatch", None) or [] if r.get("drift_h_mean") is not None]
    if not rows:
        return None, {}, ""
    last = max(int(r["minibatch"]) for r in rows)
    rows = [r for r in rows if int(r["minibatch"]) == last]
    how = kinds(sum(int(r.get("l2_rows", r["rows"])) for r in rows), sum(int(r["rows"]) for r in rows))
    return last, {str(r["module"]): float(r["drift_h_mean"]) for r in rows}, how


def verdict(
    staleness: StalenessSection | None,
    what_if: WhatIfSection | None,
    caps: Capabilities,
    cross: Any = None,
    *,
    kept_envs: int | None = None,
    run_envs: int | None = None,
    runners: int | None = None,
    reasons: dict[str, int] | None = None,
    mid_rollout: int | None = None,
    problems: list[Any] | None = None,
    not_measurable: dict[str, str] | None = None,
) -> Verdict:
    """The verdict of one log from its staleness and what-if sections (either may be None: not computed) and,
    for a sharded log whose drift is paired across processes, its cross-process section. ``kept_envs``: K where
    the log keeps the rows of env columns 0..K-1 alone (``Log.kept_envs``; ``run_envs``: the run's, per env runner
    where ``runners``): the drift is then of those columns, the what-if of whole minibatches, and each line
    says which. ``reasons``: why the training sequences start where they do, counted (the calls section's
    ``sequence_start_reasons``): with the what-if's stored states, whether any starts from a stored mid-rollout
    state (``Verdict.stored_starts``), and so what the drift is; ``mid_rollout``: where the log records no start
    reason (an own loop), how many training sequences start mid-rollout by their env steps (the sequences
    section's ``mid_rollout_starts``). ``problems``: the doctor's (``DoctorSection.problems``): those of training-side
    calls get a line pointing at them; ``not_measurable``: what the integration says it cannot measure for this run,
    and why (the log's metadata: ``what_if``, ``staleness``), said in place of the option that would measure it."""
    epoch, drift = _drifts(staleness)
    minibatch, how = None, ""
    update = last_update(staleness) if staleness is not None and epoch == 0 else None
    if update is not None:  # one epoch over several minibatches: by the end of an update
        minibatch, drift = update
    if not drift:
        minibatch, drift, how = _minibatch_drifts(cross)
    v = Verdict(stale=None, drift=drift, epoch=epoch)
    v.unsynced = _unsynced(what_if, cross, drift)
    judged = {m: d for m, d in drift.items() if m not in v.unsynced}
    v.stale = None if not judged else max(judged.values()) > STALE
    v.stored_starts = _stored_starts(reasons, what_if, mid_rollout)
    kept = kept_columns(kept_envs, run_envs, runners)
    if kept:
        v.scope = {
            "drift": f"{kept} alone (the only env columns with rows in this log)",
            "matters": f"{WHOLE} (re-run during training)",
        }
    v.provenance_ok = staleness.provenance_ok if staleness is not None else None
    if v.provenance_ok is False and staleness is not None and staleness.provenance_dropout:
        v.lines.append(
            f"the provenance check FAILED on the layers above the first alone: {staleness.provenance_dropout}"
        )
    elif v.provenance_ok is False:
        v.lines.append(
            "the provenance check FAILED: before any optimizer step training states differ from the rollout "
            "states they were paired with (the train rows name other env steps, or training starts or resets its "
            "state unlike the rollout), so the drifts below compare unlike states (the doctor and the staleness "
            "section say where)"
        )
    if not judged:
        untagged = staleness is not None and bool(staleness.by_position) and not staleness.by_epoch
        why = (
            "its training sequences do not start from stored rollout states"
            if not caps.stored_states
            else "its train rows carry drifts but no epoch, so none is known to be of the last epoch or minibatch "
            "(tag the training calls with epoch and minibatch; a loop of updates: epoch 0, minibatch k)"
            if not drift and untagged
            else "no training row of this log carries a drift against the rollout state of its env step"
            + (f" ({unlinked})" if (unlinked := (not_measurable or {}).get("staleness")) else "")
            if not drift
            else f"the drift of {' and '.join(drift)} is of a rollout-time copy that is not synced (below)"
        )
        v.lines.append(f"staleness unmeasured: {why}")
    else:
        ranked = sorted(judged.items(), key=lambda kv: -kv[1])
        by = " and ".join(f"{_pct(d)} ({m})" for m, d in ranked)
        of = f" of {kept} (the only env columns with rows)" if kept else ""
        where = f"by the last epoch ({epoch})" if epoch else "in epoch 0"
        measure = f"relative L2 drift; {how}" if how else "relative L2 drift"
        if minibatch is not None:
            where = f"by the last minibatch of an update ({minibatch})"
        lie = f"{where} training states{of} lie on average {by} from the rollout states of the same env step"
        partial = unmeasured(staleness) if staleness is not None else None
        if partial:  # some train rows have no drift: every figure is of the others
            measure = measure.replace("relative L2 drift", "relative L2 drift of the train rows measured", 1)
        if v.stored_starts or (v.stored_starts is None and caps.stored_states):
            said = "stored states went stale" if v.stale else "stored states stayed fresh"
            v.lines.append(f"{said}: {lie} ({measure}; stale above {_pct(STALE)})")
        else:
            said = "training states drifted" if v.stale else "training states stayed close"
            bound = f"{'above' if v.stale else 'within'} {_pct(STALE)}"
            why = (
                "no training sequence starts mid-rollout from a stored state, but the provenance check FAILED: "
                "training starts or resets its states unlike the rollout, so the drift is not the recomputation "
                "alone (the doctor says where)"
                if v.stored_starts is False and v.provenance_ok is False
                else "no training sequence starts mid-rollout from a stored state (each starts at its rollout's start "
                f"or at an episode start), so {'on the rows measured ' if partial else ''}no stored state went stale: "
                "the drift is the training pass recomputing the states with the updated weights"
                if v.stored_starts is False
                else "the training pass recomputes the states with the updated weights, and sequences that start "
                "mid-rollout start from stored states that may have gone stale; where the training sequences start "
                "is not recorded, so which of the two it is, is not known"
            )
            v.lines.append(f"{said}: {lie} ({measure}; {bound}): {why}")
        if minibatch is None and not how and staleness is not None:
            _over_run(v, staleness, judged, [m for m, _ in ranked])
        if partial:
            v.lines.append(partial)
    for m, why in v.unsynced.items():
        v.lines.append(
            f"{m}: not judged stale: {why}; its {_pct(drift[m])} drift from the rollout states comes from that, not "
            "from stored states going stale"
        )
    _doctor(v, problems or [])
    _matters(v, what_if, caps, (not_measurable or {}).get("what_if"), staleness)
    return v


def _over_run(v: Verdict, st: StalenessSection, judged: dict[str, float], order: list[str]) -> None:
    """A line where the run-wide figures hide a change over training: each module's figure in the run's last span of
    iterations (the staleness section's trend), where some module's differs from its run-wide figure by 2x or more."""
    tail = last_span(st.trend, judged, v.epoch, STALE)
    if tail is None:
        return
    span, n = tail["span"], tail["iterations"]
    which = span_words(span["iteration_first"], span["iteration_last"])
    by = " and ".join(f"{_pct(tail['drift'][m])} ({m})" for m in order if m in tail["drift"])
    these = "that figure is" if len(tail["drift"]) == 1 else "those figures are"
    v.lines.append(
        f"{these} over the run's {n:,} iterations; in its last {span['iterations']:,} iterations "
        f"({which}) the last epoch's drift is {by} (the staleness section has it by iteration)"
    )


TRAINING_SIDE = ("train", "value")
"""The phases of the doctor's problems the verdict points at: the calls its drift and what-if are of."""


WHAT = {
    "train_from_zeros": "sequences that start from zeros",
    "train_from_states": "sequences that start from non-zero states",
    "across_episodes": "episode starts inside a sequence the state runs on across",
    "carried_in_training": "episode starts the training loop carries the state across",
    "other_env": "sequences that start from another env column's state",
}
"""What each kind of the doctor's training-side problems counts, in words (else: "calls")."""


def _doctor(v: Verdict, problems: list[Any]) -> None:
    """A line pointing at the doctor's problems of training-side calls (by kind and phase), which no figure above
    shows (where the provenance check failed its line already points at the doctor)."""
    found = [p for p in problems if getattr(p, "phase", None) in TRAINING_SIDE]
    if not found or v.provenance_ok is False:
        return
    kinds = "; ".join(f"the {p.phase} phase's {WHAT.get(p.kind, 'calls')}, {p.count:,} times" for p in found)
    v.lines.append(
        f"not all clear: the doctor reports {'a problem' if len(found) == 1 else f'{len(found)} problems'} in "
        f"training-side calls that the lines above do not judge ({kinds}); the doctor's section says what and where"
    )


def _unsynced(wi: WhatIfSection | None, cross: Any, drift: dict[str, float]) -> dict[str, str]:
    """The modules of ``drift`` whose rollout-time copy is not synced with the trained weights, as the log says:
    the what-if's ``unsynced`` (the integration declares it), or the cross-process check's first pass (its states
    already differ from the rollout's before any optimizer step, while the other modules' and the provenance agree)."""
    declared = wi.unsynced if wi is not None and wi.measured else {}
    first = unsynced(cross)
    out = {}
    for m in drift:
        seen = first.get(m)
        before = (
            f" (before any optimizer step its states already lie up to {seen['drift']:.2g}, relative, from the "
            "rollout's)"
            if seen
            else ""
        )
        if m in declared or (seen and seen["never_synced"]):
            out[m] = f"its rollout-time copy is never synced with the weights training updates{before}"
        elif seen:
            out[m] = f"its rollout-time copy runs other weights than training's{before}"
    return out


def _stored_starts(
    reasons: dict[str, int] | None, wi: WhatIfSection | None, mid_rollout: int | None = None
) -> bool | None:
    """Whether some training sequence starts mid-rollout from a stored state (``Verdict.stored_starts``): from the
    sequences' start reasons where the log records them, else from their env steps (``mid_rollout``), and the
    what-if's stored initial states where it measured them (any away from refreshed: True; every one equal:
    False)."""
    mid = None if not reasons else any(n > 0 for r, n in reasons.items() if r in MID_ROLLOUT)
    if mid is None and mid_rollout is not None:
        mid = mid_rollout > 0
    moved = None
    if wi is not None and wi.measured and wi.check.get("ok") is not False:  # a failed check's states say nothing
        rows = [r for r in wi.by_epoch if r.get("alternative") == "stored"]
        states = [float(x) for r in rows for k, x in r.items() if k.startswith("state_") and x is not None]
        moved = any(x != 0 for x in states) if states else None
    if mid or moved:
        return True
    return None if mid is None and moved is None else False


def _matters(
    v: Verdict,
    wi: WhatIfSection | None,
    caps: Capabilities,
    refused: str | None = None,
    st: StalenessSection | None = None,
) -> None:
    if v.provenance_ok is False and v.stored_starts is False and (wi is None or not wi.measured):
        v.lines.append(
            "whether it matters for values and actions: not judged: the provenance check FAILED (training does not "
            "start from the states the rollout had)"
        )
        return
    if wi is None or not wi.measured or not wi.by_epoch:
        not_here = f"--what-if is not available for this run ({refused})" if refused and not caps.replay else None
        if v.stored_starts is False:
            how = not_here or (
                "run with --what-if to measure what the state carried into each rollout is worth (zero states) "
                "and how long a history would do (burn-ins)"
                if caps.replay
                else "--what-if measures what the state carried into each rollout is worth (zero states)"
            )
            stale = (
                "none of the stored states measured is stale, so none to matter there (no training sequence starts "
                "mid-rollout from one); the train rows without a measured drift are not judged"
                if st is not None and unmeasured(st) and v.stale is not None
                else "no stored state is stale here, so none to matter (no training sequence starts mid-rollout from "
                "one)"
            )
            v.lines.append(f"whether it matters for values and actions: {stale}; {how}")
            return
        if not_here:
            how = not_here
        elif caps.replay:
            how = (
                "run with --what-if (lstm-probe run ... --what-if; in code, what_if=True where the probe is attached) "
                "to measure it and the burn-in that would suffice"
            )
        else:  # the integration cannot re-run a minibatch on a copy of the policy (yet): say so, not a flag it refuses
            how = (
                f"this log's integration ({caps.framework}) re-ran no training minibatch from other states; "
                "--what-if measures it on sb3, rsl_rl, TorchRL and RLlib runs, and an own loop with "
                "trace(..., what_if=True) and probe.measure_batch(evaluate, ...) (docs/own-loops.md)"
            )
        v.lines.append(f"whether it matters for values and actions: unmeasured; {how}")
        return
    checks = (("what-if", wi.check.get("ok") is False), ("provenance", v.provenance_ok is False))
    failed = [name for name, bad in checks if bad]
    if failed:  # the what-if's states or the rows' pairing are wrong: its figures would answer a wrong question
        v.lines.append(
            f"whether it matters for values and actions: not judged: the {' and the '.join(failed)} "
            f"check{'s' if len(failed) > 1 else ''} FAILED, "
            "so the what-if's counterfactuals start from other states than training's (the warnings say how far)"
        )
        return
    last = max(int(r["epoch"]) for r in wi.by_epoch)
    at = {r["alternative"]: r for r in wi.by_epoch if r["epoch"] == last}
    stored = at.get("stored")
    if stored is None:
        v.lines.append("whether it matters for values and actions: unmeasured (no stored-state record in the log)")
        return
    # the what-if section's footer says the same (one rule: 0 steps where stored states are within)
    need = {"zero": burn_in_needed(wi, last, ZERO), "stored": burn_in_needed(wi, last, STORED)}
    v.matters = not stored_within(wi, last)
    v.value_rel, v.ratio_change = stored.get("value_rel"), stored.get("ratio_change")
    on = f"; measured on {WHOLE}, not only the env columns with rows" if v.scope else ""
    ratio = _pct(v.ratio_change or 0.0)
    # the section's one rule reads medians over the sampled minibatches: one outlier carries no epoch
    med = f", median of {stored['minibatches']} minibatches" if stored.get("minibatches", 0) > 1 else ""
    if wi.critic == "mlp":  # no value moves: the sentence is the policy's alone
        effect = f"the PPO ratio moves by {ratio} against refreshed states (epoch {last}{med}{on}; {no_state(wi.kind)})"
    else:
        values = f"values move by {_pct(v.value_rel or 0.0)} of the return spread"
        effect = f"{values} and the PPO ratio by {ratio} against refreshed states (epoch {last}{med}{on})"
    v.burn_in_measured = sorted({*wi.burn_in, *wi.stored_burn_in})
    if not v.matters and v.stored_starts is False:
        v.burn_in = need["zero"]  # 0
        v.lines.append(
            "nothing stale to matter: where every training sequence starts, stored states are refreshed states by "
            f"construction (from stored states {effect}); no burn-in needed"
        )
        return
    if not v.matters:
        v.burn_in = need["zero"]  # 0
        v.lines.append(
            f"it does not matter here: from stored states {effect}, within {_pct(WITHIN)}; no burn-in needed"
        )
        return
    v.lines.append(f"it matters: from stored states {effect}, beyond {_pct(WITHIN)}")
    hits = [(k, kind) for kind, k in need.items() if k is not None]
    if hits:
        v.burn_in, v.burn_in_from = min(hits)
        start = "from zero" if v.burn_in_from == "zero" else "from the stored state"
        v.lines.append(f"a {v.burn_in}-step burn-in ({start}) would suffice: it brings both within {_pct(WITHIN)}")
    else:
        steps = ", ".join(str(k) for k in v.burn_in_measured) or "none"
        v.lines.append(
            f"none of the burn-ins measured ({steps} steps) brings both within {_pct(WITHIN)}: recompute stored "
            "states between epochs, or measure longer ones (--burn-in K)"
        )
