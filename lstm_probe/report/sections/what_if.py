"""The "What if" section: do stale stored states matter for learning? Counterfactual initial states and burn-in,
measured during the run (``--what-if``).

The records come from the log's ``what_if`` metadata (written by ``integrations/sb3/whatif.py``): for sampled
minibatches, with the weights that minibatch was trained with, the same minibatch evaluated from other initial
states at each sequence start (stored: what sb3 trained with; zero; burn-in k: zero k steps earlier, run over the
stored inputs; burn-in k from stored: the stored state k steps earlier, run the same way, R2D2's variant), each
against *refreshed* states (the LSTMs re-run with the current weights over the rollout). Here they are summarized
by epoch as medians over the sampled minibatches (one outlier minibatch cannot carry an epoch's figure; the spread
and the outliers, by iteration and minibatch, are shown beside them), checked against the exact oracle (minibatch
0 of epoch 0 runs on the rollout's own weights, so refreshed equals stored), and the shortest burn-in of each kind
that brings values and policy within 1% of refreshed is named: none (0 steps) where the stored states already are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from lstm_probe.contract import Capabilities
from lstm_probe.log.schema import WHAT_IF_METRICS
from lstm_probe.report.section import Block, Line, Log, Panel, Section, Table, fmt, fmt_cos, kept_columns, module_label
from lstm_probe.report.sections.what_if_noise import gap, grad_noise, noise_line

WITHIN = 0.01
"""'Within 1%': the value difference at most this fraction of the minibatch's return spread (standard deviation
of the returns), and the PPO ratio moved by at most this much on average (mean |exp(Δ log p) - 1|)."""
CHECK_TOLERANCE = 1e-4
"""The oracle's float tolerance: refreshed and stored at minibatch 0 of epoch 0 are the same computation up to
rounding (a batched pass against sb3's one), so every relative difference stays far below this."""
TF32_CHECK_TOLERANCE = 1e-2
"""The same bound for a log whose LSTMs ran on cuDNN in TF32 (metadata ``cudnn_tf32``; as
``staleness.TF32_PROVENANCE_TOLERANCE``: a 10-bit mantissa in the matrix products, and the two passes may round
differently)."""
AVERAGED = (*WHAT_IF_METRICS, "reached", "clipped")
SHARES = ("reached", "clipped")
"""Shares of sequences (in [0, 1]): their epoch figure stays the mean over the minibatches, the share of all the
sequences measured; every other figure is the median."""
OUTLIER = 10.0
"""A minibatch is named as an outlier where its value difference, KL or ratio change is more than this many times
its epoch's median and beyond :data:`FLOOR` (rounding-sized figures are never named)."""
FLOOR = {"value_rel": WITHIN, "ratio_change": WITHIN, "kl": WITHIN**2 / 2}
"""The least figure named as an outlier: 1% of the return spread, a 1% ratio change, and the KL of about a 1%
change in the log-probabilities (Δ²/2)."""
HEADLINE = ("value_rel", "ratio_change", "kl")
"""The figures whose outliers the text names."""
SHOWN_OUTLIERS = 5
"""Outliers named under the tables (the largest against their medians); the JSON's ``outliers`` keeps them all."""
ZERO, STORED = "burn_in_", "stored_burn_in_"
"""The alternatives' name prefixes of burn-ins from zero and from stored states (the length follows)."""
ROLLOUT_START_NOTE = (
    "a burn-in from zero whose window is cut at the rollout's first step (the rollout keeps no earlier inputs, and no "
    "episode start lies in between) starts from zero there, while refreshed states start from the stored state of "
    "that step: its state Δ never reaches 0, however long the burn-in"
)
STORED_NOTE = (
    "burn-in from stored (R2D2's stored-state burn-in) starts from the stored state of the step where the burn-in "
    "begins (the rollout's first stored state where the window would reach before the rollout start, zero at an "
    "episode start) and runs the burn-in steps from it: equal to refreshed wherever its window reaches the rollout "
    "start or an episode start"
)


@dataclass
class WhatIfSection:
    """Counterfactual initial states against refreshed ones, by epoch (absent: ``measured`` false)."""

    measured: bool
    modules: list[str] = field(default_factory=list)
    """The recurrent modules by their roles ('actor', 'critic'), as the records' ``state_<module>`` columns name
    them."""
    labels: dict[str, str] = field(default_factory=dict)
    """Role -> what the text calls the module (``section.module_label``: the name the log's rows give it, with the
    role beside it where it differs: 'lstm (actor)')."""
    critic: str | None = None
    """'lstm' (its own LSTM), 'shared' (reads the actor's LSTM), 'mlp' (no LSTM: values have no state)."""
    kind: str = "LSTM"
    """What the text calls the recurrent modules ('LSTM', 'GRU': ``Log.kind``)."""
    burn_in: list[int] = field(default_factory=list)
    """Burn-in lengths measured from zero (``burn_in_<k>``)."""
    stored_burn_in: list[int] = field(default_factory=list)
    """Burn-in lengths measured from stored states (``stored_burn_in_<k>``; empty in logs written before them)."""
    sampling: dict[str, Any] = field(default_factory=dict)
    minibatches: int = 0
    """Minibatches measured."""
    iterations: int = 0
    seconds: float | None = None
    by_epoch: list[dict[str, Any]] = field(default_factory=list)
    """Per (epoch, alternative): medians over the measured minibatches of each metric (``reached`` and
    ``clipped``: means, see :data:`SHARES`); beside them ``mean``, ``p10``, ``p90`` (metric -> figure over the
    minibatches) and ``furthest`` (metric -> the minibatch furthest from the median: ``value``, ``iteration``,
    ``minibatch``). The metrics (``state_<module>``: relative
    L2 distance of the initial states from refreshed; ``value_rel``: mean |Δ value| / return spread; ``kl``:
    KL(refreshed || alternative); ``ratio_change``: mean |exp(Δ log p) - 1|; ``*_delta``: alternative - refreshed;
    ``grad_cos_*``: cosine of the loss gradient training stepped with (stored only) against refreshed's; ``reached``:
    share of sequences whose burn-in equals refreshed exactly: its window reaches back to an episode start, or, from
    stored states, to the rollout start; ``clipped``: share of sequences whose burn-in window is cut at the rollout's
    first step with no episode start in it)."""
    within: list[dict[str, Any]] = field(default_factory=list)
    """Per epoch: ``burn_in``, the burn-in from zero needed to bring the median value and policy differences within
    :data:`WITHIN` of refreshed (:func:`burn_in_needed`, the verdict's rule): 0 where that epoch's stored states
    already are (``stored_within`` true: no burn-in needed), else the shortest measured one that is (None: none
    measured is)."""
    within_stored: list[dict[str, Any]] = field(default_factory=list)
    """As ``within``, for the burn-ins from stored states."""
    outliers: list[dict[str, Any]] = field(default_factory=list)
    """Minibatches whose value difference, KL or ratio change is more than :data:`OUTLIER` times its epoch's
    median (:func:`outliers`): ``epoch``, ``alternative``, ``metric``, ``value``, ``iteration``, ``minibatch``,
    ``median``, ``mean``; the largest against their medians first."""
    notes: list[str] = field(default_factory=list)
    """What to know reading the table: why a burn-in from zero never reaches refreshed where the rollout start cuts
    its window (with the share of such sequences), and what the burn-in from stored states starts from."""
    unsynced: dict[str, str] = field(default_factory=dict)
    """Modules whose stored states come from other weights than the trained ones (module -> why): checked in
    the first sampled iteration only."""
    check: dict[str, Any] = field(default_factory=dict)
    """The oracle at minibatch 0 of epoch 0: ``minibatches`` checked, the largest differences, ``ok``
    (``grad_cos_gap``: the gradient cosine's gap to 1 beyond its sampling noise, ``what_if_noise.gap``)."""
    grad_noise: dict[str, Any] | None = None
    """Where the loss samples: the stored gradient cosines against their sampling spread (``what_if_noise``)."""
    kept_envs: int | None = None
    """K where the log keeps the rows of env columns 0..K-1 alone (``--trace-envs K --other-envs none``): the
    figures here are still of every env's columns of the sampled minibatches (the probe measures them on the
    whole minibatch during training), not of those K; None where every column has rows."""
    n_envs: int | None = None
    """The run's envs, where its metadata says (per env runner where ``env_runners``)."""
    env_runners: int | None = None
    """RLlib: the env runners, where more than one, that stepped ``n_envs`` envs each."""
    scope: str | None = None
    """Where the log keeps only some env columns (``kept_envs``): what the figures are of, in words; None where
    every column has rows."""


WHOLE = "every env's columns of the sampled minibatches"
"""What the what-if figures are of (the probe re-runs whole minibatches), said where a log keeps some columns alone."""
NO_KL = "the integration cannot compare this kind of action distribution"
"""Why a KL divergence is missing (a distribution the integration does not flatten)."""


def no_state(kind: str) -> str:
    """What stored states do to values where the critic has no recurrent module of ``kind`` (the verdict and
    the findings)."""
    return f"values have no state: the critic has no {kind}"


def what_if_scope(kept: int | None, n_envs: int | None, runners: int | None = None) -> str | None:
    """The what-if figures' scope where a log keeps env columns 0..``kept``-1 alone (of ``n_envs``, per env runner
    where ``runners``); None where ``kept`` is None."""
    if kept is None:
        return None
    cols = kept_columns(kept, n_envs, runners)
    return f"{WHOLE} (re-run during training), not only {cols} that the log keeps rows of"


def _figures(group: list[dict[str, Any]], col: str) -> dict[str, Any] | None:
    """A metric over an epoch's minibatches: ``median``, ``mean``, ``p10``, ``p90`` and ``furthest`` (the
    minibatch furthest from the median); None where none measured it."""
    got = [(float(g[col]), g) for g in group if g.get(col) is not None]
    if not got:
        return None
    xs = np.array([x for x, _ in got])
    median = float(np.median(xs))
    x, g = max(got, key=lambda xg: abs(xg[0] - median))
    return {
        "median": _round(median),
        "mean": _round(float(xs.mean())),
        "p10": _round(float(np.percentile(xs, 10))),
        "p90": _round(float(np.percentile(xs, 90))),
        "furthest": {"value": x, "iteration": int(g["iteration"]), "minibatch": int(g["minibatch"])},
    }


def _round(v: float) -> float:
    """Six significant digits, as the records keep them."""
    return float(f"{v:.6g}")


def outliers(data: WhatIfSection) -> list[dict[str, Any]]:
    """The minibatches whose value difference, KL or ratio change (:data:`HEADLINE`) is more than :data:`OUTLIER`
    times its epoch's median and beyond :data:`FLOOR`, the largest against their medians first."""
    out = []
    for r in data.by_epoch:
        for col in HEADLINE:
            far, median = r.get("furthest", {}).get(col), r.get(col)
            if far is None or median is None or far["value"] <= max(OUTLIER * median, FLOOR[col]):
                continue
            out.append(
                {
                    "epoch": r["epoch"],
                    "alternative": r["alternative"],
                    "metric": col,
                    **far,
                    "median": median,
                    "mean": r["mean"].get(col),
                }
            )
    return sorted(out, key=lambda o: -o["value"] / o["median"] if o["median"] > 0 else -math.inf)


def within(row: dict[str, Any], critic: str | None) -> bool:
    """Whether an alternative's values and policy are within :data:`WITHIN` of refreshed states."""
    value = row.get("value_rel")
    policy = row.get("ratio_change")
    value_ok = critic == "mlp" or (value is not None and value <= WITHIN)
    return value_ok and policy is not None and policy <= WITHIN


def summarize_what_if(meta: dict[str, Any], *, tf32: bool = False) -> WhatIfSection:
    """The section's data from the log's ``what_if`` metadata; ``tf32``: the log's LSTMs ran on cuDNN in TF32
    (the oracle's bound is then :data:`TF32_CHECK_TOLERANCE`)."""
    records = meta.get("records") or {}
    n = len(records.get("alternative") or [])
    rows: list[dict[str, Any]] = [{c: v[i] if i < len(v) else None for c, v in records.items()} for i in range(n)]
    modules = [str(m) for m in meta.get("modules") or []]
    data = WhatIfSection(
        measured=True,
        modules=modules,
        labels={m: module_label(m, meta.get("module_names")) for m in modules},
        critic=meta.get("critic"),
        burn_in=[int(k) for k in meta.get("burn_in") or []],
        stored_burn_in=[int(k) for k in meta.get("stored_burn_in") or []],
        sampling=dict(meta.get("sampling") or {}),
        minibatches=len({(r["iteration"], r["epoch"], r["minibatch"]) for r in rows}),
        iterations=len({r["iteration"] for r in rows}),
        seconds=meta.get("seconds"),
    )
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((int(r["epoch"]), str(r["alternative"])), []).append(r)
    order = ["stored", "zero", *(f"{ZERO}{k}" for k in data.burn_in), *(f"{STORED}{k}" for k in data.stored_burn_in)]
    for (epoch, alt), group in sorted(groups.items(), key=lambda kv: (kv[0][0], _rank(order, kv[0][1]))):
        row: dict[str, Any] = {"epoch": epoch, "alternative": alt, "minibatches": len(group)}
        spread: dict[str, dict[str, Any]] = {"mean": {}, "p10": {}, "p90": {}, "furthest": {}}
        for col in [f"state_{m}" for m in modules] + list(AVERAGED):
            figures = _figures(group, col)
            row[col] = None if figures is None else figures["mean" if col in SHARES else "median"]
            for key, by in spread.items():
                by[col] = None if figures is None else figures[key]
        data.by_epoch.append({**row, **spread})
    data.outliers = outliers(data)
    for epoch in sorted({e for e, _ in groups}):
        ok = stored_within(data, epoch)
        data.within.append({"epoch": epoch, "burn_in": burn_in_needed(data, epoch, ZERO), "stored_within": ok})
        if data.stored_burn_in:
            need = burn_in_needed(data, epoch, STORED)
            data.within_stored.append({"epoch": epoch, "burn_in": need, "stored_within": ok})
    data.notes = _notes(data)
    oracle = [r for r in rows if r["epoch"] == 0 and r["minibatch"] == 0 and r["alternative"] == "stored"]
    # a module whose stored states the framework computes with other weights than it trains (meta "unsynced")
    # equals refreshed in the first sampled iteration only (both still the initial weights), and so do the
    # values it feeds
    given = meta.get("unsynced")
    unsynced: dict[Any, Any] = given if isinstance(given, dict) else {}
    data.unsynced = {str(k): str(v) for k, v in unsynced.items()}
    first = min((int(r["iteration"]) for r in oracle), default=0)
    off = {f"state_{m}" for m in data.unsynced}
    if "critic" in data.unsynced:
        off |= {"value_rel", "grad_cos_value"}

    def checked(r: dict[str, Any], c: str) -> bool:
        return r.get(c) is not None and (c not in off or int(r["iteration"]) == first)

    worst = {
        c: max((float(r[c]) for r in oracle if checked(r, c)), default=0.0)
        for c in [f"state_{m}" for m in modules] + ["value_rel", "ratio_change", "kl"]
    }
    gaps = [gap(r, c) for r in oracle for c in ("grad_cos_policy", "grad_cos_value") if checked(r, c)]
    worst["grad_cos_gap"] = max((x for x in gaps if x is not None), default=0.0)
    data.grad_noise = grad_noise(rows)
    bound = TF32_CHECK_TOLERANCE if tf32 else CHECK_TOLERANCE
    data.check = {
        "minibatches": len(oracle),
        "max": worst,
        "ok": all(v <= bound for v in worst.values()) if oracle else None,
    }
    return data


def shortest(data: WhatIfSection, epoch: int, prefix: str) -> int | None:
    """The shortest burn-in of this kind (``prefix``) within :data:`WITHIN` in ``epoch`` (None: none is)."""
    burn = [r for r in data.by_epoch if r["epoch"] == epoch and r["alternative"].startswith(prefix)]
    burn.sort(key=lambda r: int(r["alternative"].removeprefix(prefix)))
    hit = next((r for r in burn if within(r, data.critic)), None)
    return None if hit is None else int(hit["alternative"].removeprefix(prefix))


def stored_within(data: WhatIfSection, epoch: int) -> bool:
    """Whether ``epoch``'s stored states bring values and policy within :data:`WITHIN` of refreshed states
    (:func:`within`): then no burn-in is needed there, whatever the burn-ins measure (so too where nothing is
    stale: a sequence that starts at its rollout's start or at an episode start starts from refreshed states)."""
    stored = next((r for r in data.by_epoch if r["epoch"] == epoch and r["alternative"] == "stored"), None)
    return stored is not None and within(stored, data.critic)


def burn_in_needed(data: WhatIfSection, epoch: int, prefix: str) -> int | None:
    """The burn-in of this kind (``prefix``) ``epoch`` needs to bring values and policy within :data:`WITHIN` of
    refreshed states: 0 where its stored states already are (:func:`stored_within`), else the shortest measured
    one that is (:func:`shortest`; None: none is). The footer, the JSON's ``within`` and the verdict all say this."""
    return 0 if stored_within(data, epoch) else shortest(data, epoch, prefix)


def _footer(data: WhatIfSection) -> str:
    """The line under the tables: the burn-in each epoch needs (:func:`burn_in_needed`)."""
    if data.within and all(w["stored_within"] for w in data.within):
        return (
            f"no burn-in needed (0 steps): stored states are within {_pct(WITHIN)} of refreshed (values and policy) "
            "in every epoch measured"
        )

    def needed(within: list[dict[str, Any]]) -> str:
        return "; ".join(
            f"epoch {w['epoch']}: "
            + (
                "0 steps (stored states are within)"
                if w["stored_within"]
                else "none measured"
                if w["burn_in"] is None
                else f"{w['burn_in']} steps"
            )
            for w in within
        )

    line = f"burn-in needed to bring values and policy within {_pct(WITHIN)} of refreshed: {needed(data.within)}"
    return line + (f"; from stored: {needed(data.within_stored)}" if data.within_stored else "")


def _notes(data: WhatIfSection) -> list[str]:
    """The notes beside the table (see :attr:`WhatIfSection.notes`)."""
    if not data.burn_in:
        return []
    note = ROLLOUT_START_NOTE
    longest = f"{ZERO}{max(data.burn_in)}"
    cut = [r["clipped"] for r in data.by_epoch if r["alternative"] == longest and r.get("clipped") is not None]
    if cut:
        note += f" ({_pct(sum(cut) / len(cut))} of the sequences measured at burn-in {max(data.burn_in)})"
    return [note, STORED_NOTE] if data.stored_burn_in else [note]


def _label(alt: str) -> str:
    """An alternative's name as the table shows it: 'burn-in 16', 'burn-in 16 from stored'."""
    if alt.startswith(STORED):
        return f"burn-in {alt.removeprefix(STORED)} from stored"
    return alt.replace(ZERO, "burn-in ")


def _rank(order: list[str], alt: str) -> int:
    return order.index(alt) if alt in order else len(order)


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * float(v):.3g}%"


class WhatIf(Section[WhatIfSection]):
    key = "what_if"
    needs: ClassVar[str | None] = "replay"  # the measurement re-runs minibatches on a copy of the policy
    says_when_absent: ClassVar[bool] = True  # an integration without the capability: the line says what would
    findings_rank: ClassVar[int] = 35  # right after staleness: how stale, then whether it matters

    def applies(self, caps: Capabilities) -> bool:
        return True  # computed for every log, so that one without ``replay`` says what it would need

    def compute(self, log: Log, acc: Any) -> WhatIfSection:
        meta = log.meta.get("what_if")
        if not isinstance(meta, dict) or not isinstance(meta.get("records"), dict):
            return WhatIfSection(measured=False)
        data = summarize_what_if(meta, tf32=log.meta.get("cudnn_tf32") is True)
        data.kept_envs, data.n_envs, data.env_runners = log.kept_envs, log.n_envs, log.env_runners
        data.kind = log.kind
        data.scope = what_if_scope(log.kept_envs, log.n_envs, log.env_runners)
        return data

    def to_json(self, data: WhatIfSection) -> Any:
        return super().to_json(data) if data.measured else None

    def unavailable(self, data: WhatIfSection | None, log: Log) -> list[str]:
        if data is not None and data.measured:
            return []
        if not log.caps.replay and (why := log.not_measurable.get("what_if")):
            return [f"what if (counterfactual initial states, burn-in): not available for this run ({why})"]
        if log.caps.replay:
            return [
                "what if (counterfactual initial states, burn-in): not measured in this run; lstm-probe run "
                "--what-if (what_if=True in code) adds it"
            ]
        return [
            "what if (counterfactual initial states, burn-in): needs an integration that keeps the rollout's "
            "inputs and can re-run a minibatch on a copy of the policy (sb3, rsl_rl, TorchRL and RLlib: lstm-probe "
            "run --what-if; in code, what_if=True where the probe is attached; an own loop: trace(..., what_if=True) "
            "and probe.measure_batch(evaluate, ...) before each minibatch's loss, docs/own-loops.md)"
        ]

    def warnings(self, data: WhatIfSection, log: Log) -> list[str]:
        if not data.measured or data.check.get("ok") is not False:
            return []
        worst = max(data.check["max"].values())
        return [
            "what-if check FAILED: at minibatch 0 of epoch 0 (the rollout's own weights) refreshed states should "
            f"equal stored ones, but differ by up to {worst:.3g}: the what-if numbers of this log cannot be trusted"
        ]

    def findings(self, data: WhatIfSection) -> list[str]:
        if not data.measured or not data.by_epoch:
            return []
        last = max(r["epoch"] for r in data.by_epoch)
        at = {r["alternative"]: r for r in data.by_epoch if r["epoch"] == last}
        stored, zero = at.get("stored"), at.get("zero")
        if stored is None:
            return []
        where = "by the last epoch" if last > 0 else "in epoch 0"
        policy = (
            f"the policy by KL {fmt(stored['kl'])} (PPO ratio {_pct(stored['ratio_change'])}"
            if stored.get("kl") is not None
            else f"the PPO ratio by {_pct(stored['ratio_change'])} (KL not measured: {NO_KL}"
        )
        scope = f"; measured on {WHOLE}, not only the env columns with rows)" if data.scope else ")"
        if data.critic == "mlp":  # no value moves: the sentence is the policy's alone
            alone = no_state(data.kind)
            msg = f"{where} (epoch {last}), stored states move {policy}{scope} against refreshed states ({alone})"
        else:
            values = f"move values by {_pct(stored['value_rel'])} of the return spread"
            msg = f"{where} (epoch {last}), stored states {values} against refreshed states and {policy}{scope}"
        unsynced = [
            f"{data.labels.get(m, m)}'s stored states come from other weights than it is trained with ({why}): "
            f"by epoch {last} they are {fmt(stored.get(f'state_{m}'))} (relative) off refreshed states"
            for m, why in data.unsynced.items()
        ]
        if stored_within(data, last):  # no burn-in is needed, whatever the burn-ins measure
            return [
                *unsynced,
                msg + f"; that is within {_pct(WITHIN)}: no burn-in needed",
                *_outlier_finding(data, last),
            ]
        hit = next((w["burn_in"] for w in data.within if w["epoch"] == last), None)
        burn = ", ".join(str(k) for k in data.burn_in)
        msg += (
            f"; a {hit}-step burn-in brings both within {_pct(WITHIN)}"
            if hit is not None
            else f"; none of the burn-ins measured ({burn} steps) brings both within {_pct(WITHIN)}"
        )
        if data.stored_burn_in:
            hit = next((w["burn_in"] for w in data.within_stored if w["epoch"] == last), None)
            msg += (
                f"; from stored states a {hit}-step burn-in does"
                if hit is not None
                else f"; from stored states none does ({', '.join(str(k) for k in data.stored_burn_in)} steps)"
            )
        if zero is not None:
            msg += (
                (
                    f"; zero states would move the policy by KL {fmt(zero['kl'])}"
                    if zero.get("kl") is not None
                    else f"; zero states would move the PPO ratio by {_pct(zero['ratio_change'])}"
                )
                if data.critic == "mlp"
                else f"; zero states would move values by {_pct(zero['value_rel'])}"
            )
        out = [*unsynced, msg]
        out += _outlier_finding(data, last)
        cp, cv = stored.get("grad_cos_policy"), stored.get("grad_cos_value")
        if cp is not None or cv is not None:
            out.append(
                f"the gradient training stepped with (stored states) against refreshed states' in epoch {last}: cosine "
                f"{fmt(cp)} (policy parameters), {fmt(cv)} (value parameters)"
            )
            out += [x for x in [noise_line(data.grad_noise)] if x]
        return out

    def text(self, data: WhatIfSection, caps: Capabilities) -> list[Block]:
        if not data.measured:
            return []
        s = data.sampling
        sb3 = caps.rollout_buffer  # sb3's option names, on sb3's logs alone
        critic = {
            "lstm": f"the critic has its own {data.kind}",
            "shared": f"one {data.kind}{' (shared_lstm)' if sb3 else ''} for actor and critic: the critic reads the "
            "actor's, so actor states move values too",
            "mlp": f"the critic has no {data.kind}{' (enable_critic_lstm=False)' if sb3 else ''}: its values have no "
            "state to vary",
        }.get(str(data.critic), f"critic: {fmt(data.critic)}")
        check = data.check
        verdict = {True: "OK", False: "[red]FAILED[/]", None: "not sampled"}[check.get("ok")]
        lines = (
            f"{data.minibatches} minibatches of {data.iterations} iterations (first and last minibatch of epochs "
            f"{', '.join(fmt(e) for e in s.get('epochs') or [])}, every {fmt(s.get('every'))} iteration(s)), each "
            f"evaluated on a copy of the policy with the weights it was trained with; {fmt(data.seconds)} s\n"
            f"against refreshed states (the {data.kind}s re-run over the rollout with those weights); {critic}\n"
            f"check: minibatch 0 of epoch 0 (the rollout's weights): stored = refreshed: {verdict} "
            f"({fmt(check.get('minibatches', 0))} minibatches)"
            + "".join(
                f"; {fmt(data.labels.get(m, m))}: first iteration only ({why})" for m, why in data.unsynced.items()
            )
            + (f"\nmeasured on {data.scope}" if data.scope else "")
            + "".join(f"\n{x}" for x in [noise_line(data.grad_noise)] if x)
        )
        header = (
            "states",
            f"state Δ {' / '.join(fmt(data.labels.get(m, m)) for m in data.modules)}",
            "value Δ/spread",
            "KL",
            "ratio Δ",
            "ratio Δ p90",
            "grad cos π / V",
            "reach",
        )
        tables: dict[int, list[tuple[str, ...]]] = {}  # one table per epoch: no epoch column, narrower
        for r in data.by_epoch:
            states = " / ".join(fmt(r.get(f"state_{m}")) for m in data.modules)
            tables.setdefault(int(r["epoch"]), []).append(
                (
                    fmt(_label(str(r["alternative"]))),
                    states,
                    _pct(r["value_rel"]),
                    fmt(r["kl"]),
                    _pct(r["ratio_change"]),
                    _pct(r.get("p90", {}).get("ratio_change")),
                    " / ".join(fmt_cos(r.get(c)) for c in ("grad_cos_policy", "grad_cos_value")),
                    _pct(r["reached"]) if r["reached"] is not None else "-",
                )
            )

        reach = "reach: sequences whose burn-in reaches back to an episode start"
        reach += (
            " (from stored, or to the rollout start), where it equals refreshed"
            if data.stored_burn_in
            else " (equal to refreshed there)"
        )
        return [
            Panel("What if: other initial states", (lines,)),
            *(
                Table(
                    f"What if, epoch {e}: against refreshed states, median over the measured minibatches",
                    header,
                    tuple(t),
                )
                for e, t in tables.items()
            ),
            *_outlier_lines(data),
            Line(f"{_footer(data)}; {reach}"),
            Line(COLUMNS_LEGEND),
            *(Line(f"note: {n}") for n in data.notes),
        ]


NAMES = {"value_rel": "value Δ/spread", "ratio_change": "ratio Δ", "kl": "KL"}
COLUMNS_LEGEND = (
    "columns: state Δ: the initial states' relative L2 distance from refreshed; value Δ/spread: the value change over "
    "the minibatch's return spread (the std of its returns); KL: KL(refreshed || these) of the action distribution; "
    "ratio Δ: the mean change of the PPO ratio, |exp(Δ log p) - 1| (p90: the 90th percentile over minibatches); "
    "grad cos π / V: cosine between the loss gradient trained with and refreshed states' (policy-side / value-side)"
)
"""What the what-if tables' columns are, under them."""


def _outlier_finding(data: WhatIfSection, epoch: int) -> list[str]:
    """The largest outlier of ``epoch``'s stored or zero states, where one is: the findings' figures are medians,
    which leave it out."""
    far = [o for o in data.outliers if o["epoch"] == epoch and o["alternative"] in ("stored", "zero")]
    if not far:
        return []
    o = far[0]
    show = fmt if o["metric"] == "kl" else _pct
    return [
        f"the what-if figures are medians over the sampled minibatches: in epoch {epoch}, {o['alternative']} states "
        f"at iteration {o['iteration']}, minibatch {o['minibatch']} move {NAMES[o['metric']]} by {show(o['value'])} "
        f"(median {show(o['median'])}, mean {show(o['mean'])})"
    ]


def _outlier_lines(data: WhatIfSection) -> list[Line]:
    """The outliers the medians leave out (:func:`outliers`), named by iteration and minibatch."""
    if not data.outliers:
        return []

    def say(o: dict[str, Any]) -> str:
        show = fmt if o["metric"] == "kl" else _pct
        return (
            f"epoch {o['epoch']}, {_label(o['alternative'])}: {NAMES[o['metric']]} {show(o['value'])} at iteration "
            f"{o['iteration']}, minibatch {o['minibatch']} (median {show(o['median'])}, mean {show(o['mean'])})"
        )

    shown = data.outliers[:SHOWN_OUTLIERS]
    more = len(data.outliers) - len(shown)
    return [
        Line(
            f"outliers (more than {OUTLIER:g}x their epoch's median; the medians above leave them out): "
            + "; ".join(say(o) for o in shown)
            + (f"; and {more} more (JSON: what_if.outliers)" if more else "")
        )
    ]
