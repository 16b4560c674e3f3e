"""Section 2: the recurrent modules and what actor and critic share, from the log's metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lstm_probe.contract import Capabilities
from lstm_probe.report.section import Block, Log, Panel, Section
from lstm_probe.text import safe


@dataclass
class ArchitectureSection:
    """Section 2: the recurrent modules and what actor and critic share."""

    modules: dict[str, dict[str, Any]]
    gradient_flow: dict[str, str]
    """Parameter tensor -> the losses that train it ('policy' | 'value' | 'both' | ...), when recorded."""
    hidden_size: int | None
    shared_lstm: bool | None
    critic: str | None
    verdict: str
    untraced: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The models the integration left out of the log, each with why (``architecture.untraced``)."""


def verdict(arch: dict[str, Any], modules: dict[str, Any]) -> str:
    """Who trains what, in one sentence: measured gradient flow where the log has it, else the declared layout."""
    critic = arch.get("critic")
    if critic == "lstm":
        text = "actor and critic have separate LSTMs (lstm_actor, lstm_critic); neither reads the other's state"
    elif critic == "shared":
        text = (
            "actor and critic share one LSTM (shared_lstm): the critic reads the actor's LSTM output "
            "detached, so only the policy loss trains the LSTM"
        )
    elif critic == "mlp":
        text = "only the actor has an LSTM; the critic is feed-forward (enable_critic_lstm=False)"
    else:
        text = f"traced modules: {', '.join(modules) or 'none'}"
    flow = arch.get("gradient_flow") or {}
    if flow.get("verdict"):
        return f"{flow['verdict'].rstrip('.')} (gradient flow measured on {flow.get('batch', 'one minibatch')})"
    if arch.get("share_features_extractor") is not None:
        text += (
            "; the features extractor is shared"
            if arch["share_features_extractor"]
            else "; actor and critic have their own features extractors"
        )
    return text


class Architecture(Section[ArchitectureSection]):
    key = "architecture"

    def compute(self, log: Log, acc: Any) -> ArchitectureSection:
        arch = log.meta.get("architecture") or {}
        modules = arch.get("modules") or {}
        return ArchitectureSection(
            modules=modules,
            gradient_flow=(arch.get("gradient_flow") or {}).get("gradient_flow") or {},
            hidden_size=log.meta.get("hidden_size"),
            shared_lstm=arch.get("shared_lstm"),
            critic=arch.get("critic"),
            verdict=verdict(arch, modules),
            untraced={str(k): v for k, v in (arch.get("untraced") or {}).items() if isinstance(v, dict)},
        )

    def text(self, data: ArchitectureSection, caps: Capabilities) -> list[Block]:
        mods = ", ".join(
            f"{safe(n)}: {safe(m.get('kind'))} hidden {safe(m.get('hidden_size'))} x "
            f"{safe(m.get('num_layers'))} layer(s)"
            for n, m in data.modules.items()
        )
        lines = [mods, safe(data.verdict)]
        lines += [f"not traced: {safe(n)} ({_untraced(m)})" for n, m in data.untraced.items()]
        return [Panel("Architecture", ("\n".join(lines),))]


def _untraced(m: dict[str, Any]) -> str:
    """A model the log leaves out: what it is, and why."""
    what = m.get("class") or f"{m.get('kind')} hidden {m.get('hidden_size')} x {m.get('num_layers')} layer(s)"
    return safe(f"{what}: {m.get('why')}")
