"""The sb3 framework's ``run`` and ``arch`` as the CLI calls them (see ``lstm_probe.integrations.FRAMEWORKS``)."""

from __future__ import annotations

from collections.abc import Sequence

from lstm_probe.integrations.sb3_arch import Architecture
from lstm_probe.integrations.sb3_arch import arch as analyse
from lstm_probe.integrations.sb3_run import parse_hyperparams, run

__all__ = ["arch", "run"]


def arch(
    target: str,
    *,
    env_id: str | None = None,
    trust_model: bool = False,
    shared_lstm: bool = False,
    critic_lstm: bool = True,
    hidden_size: int | None = None,
    lstm_layers: int | None = None,
    hyperparams: Sequence[str] | None = None,
) -> Architecture:
    """Architecture and measured gradient flow of the RecurrentPPO ``run`` would build for an env id, or of
    a saved model.zip (a real rollout when an env is at hand; ``trust_model``: SB3's full load, which
    unpickles the zip)."""
    from lstm_probe.arch import load_model

    model, rollout = load_model(
        target,
        env_id=env_id,
        trust_model=trust_model,
        shared_lstm=shared_lstm,
        critic_lstm=critic_lstm,
        hidden_size=hidden_size,
        lstm_layers=lstm_layers,
        hyperparams=parse_hyperparams(hyperparams or []),
    )
    return analyse(model, rollout=rollout)
