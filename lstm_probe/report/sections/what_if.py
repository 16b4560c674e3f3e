"""The "What if" section: do stale stored states matter for learning? Counterfactual initial states and burn-in,
measured during the run (``--what-if``).

The records come from the log's ``what_if`` metadata (written by ``integrations/sb3_whatif.py``): for sampled
minibatches, with the weights that minibatch was trained with, the same minibatch evaluated from other initial
states at each sequence start (stored: what sb3 trained with; zero; burn-in k: zero k steps earlier, run over the
stored inputs), each against *refreshed* states (the LSTMs re-run with the current weights over the rollout).
Here they are averaged by epoch, checked against the exact oracle (minibatch 0 of epoch 0 runs on the rollout's
own weights, so refreshed equals stored), and the shortest burn-in that brings values and policy within 1% of
refreshed is named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from lstm_probe.contract import Capabilities
from lstm_probe.report.section import Block, Line, Log, Panel, Section, Table, fmt
from lstm_probe.schema import WHAT_IF_METRICS

WITHIN = 0.01
"""'Within 1%': the value difference at most this fraction of the minibatch's return spread (standard deviation
of the returns), and the PPO ratio moved by at most this much on average (mean |exp(Δ log p) - 1|)."""
CHECK_TOLERANCE = 1e-4
"""The oracle's float tolerance: refreshed and stored at minibatch 0 of epoch 0 are the same computation up to
rounding (a batched pass against sb3's one), so every relative difference stays far below this."""
AVERAGED = (*WHAT_IF_METRICS, "reached")


@dataclass
class WhatIfSection:
    """Counterfactual initial states against refreshed ones, by epoch (absent: ``measured`` false)."""

    measured: bool
    modules: list[str] = field(default_factory=list)
    critic: str | None = None
    """'lstm' (its own LSTM), 'shared' (reads the actor's LSTM), 'mlp' (no LSTM: values have no state)."""
    burn_in: list[int] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    minibatches: int = 0
    """Minibatches measured."""
    iterations: int = 0
    seconds: float | None = None
    by_epoch: list[dict[str, Any]] = field(default_factory=list)
    """Per (epoch, alternative): means over the measured minibatches of each metric (``state_<module>``: relative
    L2 distance of the initial states from refreshed; ``value_rel``: mean |Δ value| / return spread; ``kl``:
    KL(refreshed || alternative); ``ratio_change``: mean |exp(Δ log p) - 1|; ``*_delta``: alternative - refreshed;
    ``grad_cos_*``: cosine of the loss gradient sb3 stepped with (stored only) against refreshed's; ``reached``:
    share of sequences whose burn-in reaches back to an episode start, where it equals refreshed exactly)."""
    within: list[dict[str, Any]] = field(default_factory=list)
    """Per epoch: the shortest burn-in whose mean value and policy differences are within :data:`WITHIN` (None:
    none measured is)."""
    check: dict[str, Any] = field(default_factory=dict)
    """The oracle at minibatch 0 of epoch 0: ``minibatches`` checked, the largest differences, ``ok``."""


def _mean(values: list[Any]) -> float | None:
    xs = [float(v) for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def _within(row: dict[str, Any], critic: str | None) -> bool:
    value = row.get("value_rel")
    policy = row.get("ratio_change")
    value_ok = critic == "mlp" or (value is not None and value <= WITHIN)
    return value_ok and policy is not None and policy <= WITHIN


def summarize_what_if(meta: dict[str, Any]) -> WhatIfSection:
    """The section's data from the log's ``what_if`` metadata."""
    records = meta.get("records") or {}
    n = len(records.get("alternative") or [])
    rows: list[dict[str, Any]] = [{c: v[i] if i < len(v) else None for c, v in records.items()} for i in range(n)]
    modules = [str(m) for m in meta.get("modules") or []]
    data = WhatIfSection(
        measured=True,
        modules=modules,
        critic=meta.get("critic"),
        burn_in=[int(k) for k in meta.get("burn_in") or []],
        sampling=dict(meta.get("sampling") or {}),
        minibatches=len({(r["iteration"], r["epoch"], r["minibatch"]) for r in rows}),
        iterations=len({r["iteration"] for r in rows}),
        seconds=meta.get("seconds"),
    )
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((int(r["epoch"]), str(r["alternative"])), []).append(r)
    order = ["stored", "zero", *(f"burn_in_{k}" for k in data.burn_in)]
    for (epoch, alt), group in sorted(groups.items(), key=lambda kv: (kv[0][0], _rank(order, kv[0][1]))):
        row: dict[str, Any] = {"epoch": epoch, "alternative": alt, "minibatches": len(group)}
        for col in [f"state_{m}" for m in modules] + list(AVERAGED):
            row[col] = _mean([g.get(col) for g in group])
        data.by_epoch.append(row)
    for epoch in sorted({e for e, _ in groups}):
        burn = [r for r in data.by_epoch if r["epoch"] == epoch and r["alternative"].startswith("burn_in_")]
        burn.sort(key=lambda r: int(r["alternative"].removeprefix("burn_in_")))
        hit = next((r for r in burn if _within(r, data.critic)), None)
        data.within.append(
            {"epoch": epoch, "burn_in": None if hit is None else int(hit["alternative"].removeprefix("burn_in_"))}
        )
    oracle = [r for r in rows if r["epoch"] == 0 and r["minibatch"] == 0 and r["alternative"] == "stored"]
    worst = {
        c: max((float(r[c]) for r in oracle if r.get(c) is not None), default=0.0)
        for c in [f"state_{m}" for m in modules] + ["value_rel", "ratio_change", "kl"]
    }
    cos = [float(r[c]) for r in oracle for c in ("grad_cos_policy", "grad_cos_value") if r.get(c) is not None]
    worst["grad_cos_gap"] = max((1 - x for x in cos), default=0.0)
    data.check = {
        "minibatches": len(oracle),
        "max": worst,
        "ok": all(v <= CHECK_TOLERANCE for v in worst.values()) if oracle else None,
    }
    return data


def _rank(order: list[str], alt: str) -> int:
    return order.index(alt) if alt in order else len(order)


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * float(v):.3g}%"


class WhatIf(Section[WhatIfSection]):
    key = "what_if"
    needs: ClassVar[str | None] = "replay"  # the measurement re-runs minibatches on a copy of the policy
    findings_rank: ClassVar[int] = 35  # right after staleness: how stale, then whether it matters

    def applies(self, caps: Capabilities) -> bool:
        return True  # computed for every log, so that one without ``replay`` says what it would need

    def compute(self, log: Log, acc: Any) -> WhatIfSection:
        meta = log.meta.get("what_if")
        if not isinstance(meta, dict) or not isinstance(meta.get("records"), dict):
            return WhatIfSection(measured=False)
        return summarize_what_if(meta)

    def to_json(self, data: WhatIfSection) -> Any:
        return super().to_json(data) if data.measured else None

    def unavailable(self, data: WhatIfSection, log: Log) -> list[str]:
        if data.measured or log.caps.replay:
            return []
        return [
            "what if (counterfactual initial states, burn-in): needs an integration that keeps the rollout's "
            "inputs and can re-run a minibatch on a copy of the policy (sb3: ProbeCallback(what_if=True), "
            "lstm-probe run --what-if)"
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
        if data.critic == "mlp":
            values = "leave values alone (the critic has no LSTM)"
        else:
            values = f"move values by {_pct(stored['value_rel'])} of the return spread"
        msg = (
            f"{where} (epoch {last}), stored states {values} against refreshed states and the policy by KL "
            f"{fmt(stored['kl'])} (PPO ratio {_pct(stored['ratio_change'])})"
        )
        hit = next((w["burn_in"] for w in data.within if w["epoch"] == last), None)
        burn = ", ".join(str(k) for k in data.burn_in)
        msg += (
            f"; a {hit}-step burn-in brings both within {_pct(WITHIN)}"
            if hit is not None
            else f"; none of the burn-ins measured ({burn} steps) brings both within {_pct(WITHIN)}"
        )
        if zero is not None:
            msg += (
                f"; zero states would move the policy by KL {fmt(zero['kl'])}"
                if data.critic == "mlp"
                else f"; zero states would move values by {_pct(zero['value_rel'])}"
            )
        out = [msg]
        cp, cv = stored.get("grad_cos_policy"), stored.get("grad_cos_value")
        if cp is not None or cv is not None:
            out.append(
                f"the gradient sb3 stepped with (stored states) against refreshed states' in epoch {last}: cosine "
                f"{fmt(cp)} (policy parameters), {fmt(cv)} (value parameters)"
            )
        return out

    def text(self, data: WhatIfSection, caps: Capabilities) -> list[Block]:
        if not data.measured:
            return []
        s = data.sampling
        critic = {
            "lstm": "the critic has its own LSTM",
            "shared": "one LSTM (shared_lstm): the critic reads the actor's, so actor states move values too",
            "mlp": "the critic has no LSTM (enable_critic_lstm=False): its values have no state to vary",
        }.get(str(data.critic), f"critic: {fmt(data.critic)}")
        check = data.check
        verdict = {True: "OK", False: "[red]FAILED[/]", None: "not sampled"}[check.get("ok")]
        lines = (
            f"{data.minibatches} minibatches of {data.iterations} iterations (first and last minibatch of epochs "
            f"{', '.join(str(e) for e in s.get('epochs') or [])}, every {fmt(s.get('every'))} iteration(s)), each "
            f"evaluated on a copy of the policy with the weights it was trained with; {fmt(data.seconds)} s\n"
            f"against refreshed states (the LSTMs re-run over the rollout with those weights); {critic}\n"
            f"check: minibatch 0 of epoch 0 (the rollout's weights): stored = refreshed: {verdict} "
            f"({check.get('minibatches', 0)} minibatches)"
        )
        rows = []
        for r in data.by_epoch:
            states = " / ".join(fmt(r.get(f"state_{m}")) for m in data.modules)
            rows.append(
                (
                    str(r["epoch"]),
                    fmt(str(r["alternative"]).replace("burn_in_", "burn-in ")),
                    states,
                    _pct(r["value_rel"]),
                    fmt(r["kl"]),
                    _pct(r["ratio_change"]),
                    " / ".join(fmt(r.get(c)) for c in ("grad_cos_policy", "grad_cos_value")),
                    _pct(r["reached"]) if r["reached"] is not None else "-",
                )
            )
        within = "; ".join(
            f"epoch {w['epoch']}: {'none measured' if w['burn_in'] is None else str(w['burn_in']) + ' steps'}"
            for w in data.within
        )
        return [
            Panel("What if: other initial states", (lines,)),
            Table(
                "What if: against refreshed states, mean over the measured minibatches",
                (
                    "epoch",
                    "states",
                    f"state Δ {' / '.join(data.modules)}",
                    "value Δ/spread",
                    "KL",
                    "ratio Δ",
                    "grad cos π / V",
                    "reach",
                ),
                tuple(rows),
            ),
            Line(
                f"burn-in within {_pct(WITHIN)} of refreshed (values and policy): {within}; reach: sequences whose "
                "burn-in reaches back to an episode start (equal to refreshed there)"
            ),
        ]
