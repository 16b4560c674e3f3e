"""rsl_rl's own options for ``lstm-probe run --framework rsl_rl``, declared once (see ``lstm_probe.options``).
Imports nothing of rsl_rl or torch: the CLI builds its flags from them."""

from __future__ import annotations

from dataclasses import dataclass

from lstm_probe.errors import BadInput
from lstm_probe.options import at_least, option

RNN_TYPES = ("lstm", "gru")


@dataclass(frozen=True)
class RslRl:
    """The recurrent actor-critic ``run`` builds, and the env it trains on."""

    rnn_type: str = option("lstm", "lstm or gru: the recurrent layer of actor and critic.")
    rnn_layers: int = option(1, "Recurrent layers of actor and critic.")
    torch_env: bool = option(
        False,
        "Pendulum-v1 as the torch-native batched env (no Python loop per env; for wide runs), without the "
        "angular velocity in the observation (partially observable).",
    )

    def __post_init__(self) -> None:
        if self.rnn_type not in RNN_TYPES:
            raise BadInput(f"--rnn-type must be lstm or gru, not {self.rnn_type!r}")
        at_least("rnn_layers", self.rnn_layers, 1)
