"""sb3's own options, declared once (see ``lstm_probe.options``): how ``lstm-probe run`` builds the
RecurrentPPO (:class:`Build`); what the probe measures beyond the states (:class:`Measure`) is declared in
``lstm_probe.options``, shared by every framework. Imports neither torch nor sb3: the CLI builds its flags from them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lstm_probe.errors import BadInput
from lstm_probe.options import Measure as Measure  # declared beside the other options: every framework takes it
from lstm_probe.options import at_least, option


@dataclass(frozen=True)
class Build:
    """The RecurrentPPO ``lstm-probe run`` builds beyond :class:`~lstm_probe.options.TrainOptions`."""

    lstm_layers: int | None = option(None, "LSTM layers.", shown="1")
    critic_lstm: bool = option(True, "Give the critic its own LSTM.")
    hyperparams: Mapping[str, Any] | Sequence[str] | None = option(
        None,
        "KEY=VALUE passed to RecurrentPPO; repeatable.",
        flags=("--hyperparam",),
        shown="none",
        cli=list[str] | None,
    )

    def __post_init__(self) -> None:
        at_least("lstm_layers", self.lstm_layers, 1)
        if isinstance(self.hyperparams, str):
            raise BadInput(f"hyperparams must be a dict or a list of KEY=VALUE strings, not {self.hyperparams!r}")
