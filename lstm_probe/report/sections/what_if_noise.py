"""The what-if section's gradient cosine against its own sampling spread: where the framework's loss draws random
numbers (TorchRL's ``ClipPPOLoss`` estimates a TanhNormal's entropy from a sample), the gradient training stepped
with and the copy's differ however equal the states, and the records hold that spread beside each cosine
(``log.schema.WHAT_IF_NOISE``: the least cosine between two draws of the copy's own gradient). A cosine whose gap
to 1 is within :data:`NOISE_FACTOR` times the spread's cannot be told from 1."""

from __future__ import annotations

from typing import Any

from lstm_probe.log.schema import WHAT_IF_NOISE
from lstm_probe.report.section import fmt

NOISE_FACTOR = 2.0
"""A cosine ``c`` is within the sampling noise where ``1 - c`` is at most this many times ``1 - n``, ``n`` the
least cosine of the draws beside it: both are cosines between two independent draws, and the least of a few
draws is no bound on another."""
SIDES = (("policy", "grad_cos_policy", WHAT_IF_NOISE[0]), ("value", "grad_cos_value", WHAT_IF_NOISE[1]))


def gap(row: dict[str, Any], column: str) -> float | None:
    """The gap to 1 of ``row``'s cosine ``column`` beyond its sampling noise (the gap itself where the record
    holds no noise); None where not measured."""
    cos = row.get(column)
    if cos is None:
        return None
    noise = row.get(dict((c, n) for _, c, n in SIDES)[column])
    return 1 - float(cos) if noise is None else max(0.0, 1 - float(cos) - NOISE_FACTOR * (1 - float(noise)))


def grad_noise(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Over the stored records: per side, the least cosine measured (``cos``), the least of the draws beside
    them (``noise``: the widest spread) and whether every cosine is within its noise (``within``); None where no
    record holds a spread (the loss draws no random numbers, or a log from before it was measured)."""
    stored = [r for r in rows if r.get("alternative") == "stored"]
    if not any(r.get(n) is not None for r in stored for n in WHAT_IF_NOISE):
        return None
    out: dict[str, Any] = {}
    for side, column, noise in SIDES:
        got = [r for r in stored if r.get(column) is not None and r.get(noise) is not None]
        if got:
            out[side] = {
                "cos": min(float(r[column]) for r in got),
                "noise": min(float(r[noise]) for r in got),
                "within": all(gap(r, column) == 0 for r in got),
            }
    return out or None


def cosine(v: float) -> str:
    """A cosine as the text shows it: near 1 by its gap (``1 - 3e-05``), which three significant digits would hide."""
    return f"1 - {1 - v:.2g}" if v < 1 and fmt(v) == "1" else fmt(v)


def noise_line(noise: dict[str, Any] | None) -> str | None:
    """The section's words on the gradient cosine where the loss samples (None where it does not): per side with
    a spread, whether the cosines measured can be told from 1; a side whose draws agree is said apart."""
    if not noise:
        return None
    sides = [s for s, _, _ in SIDES if s in noise]
    noisy = [s for s in sides if noise[s]["noise"] < 1]
    text = "gradient cosine (stored): the loss samples random numbers"
    for s in noisy:
        verdict = "cannot be told from 1 within that spread" if noise[s]["within"] else "goes beyond that spread"
        text += (
            f"; {s} parameters: two draws of the copy's own gradient from the same states agree to cosine "
            f"{cosine(noise[s]['noise'])}, the cosine measured (down to {cosine(noise[s]['cos'])}) {verdict}"
        )
    for s in (s for s in sides if s not in noisy):
        text += f"; {s} parameters: its draws agree (cosine measured down to {cosine(noise[s]['cos'])})"
    return text
