"""RLlib's own options for ``lstm-probe run --framework rllib``, declared once (see ``lstm_probe.options``).
Imports nothing of Ray: the CLI builds its flags from them."""

from __future__ import annotations

from dataclasses import dataclass

from lstm_probe.errors import BadInput
from lstm_probe.options import at_least, option


@dataclass(frozen=True)
class Rllib:
    """How ``run`` lays out RLlib's processes and training chunks."""

    env_runners: int = option(0, "Remote env runners (0 = sample in the driver).")
    learners: int = option(0, "Remote learners (0 = learn in the driver; at most 1).")
    max_seq_len: int | None = option(None, "max_seq_len of training chunks.", shown="20")

    def __post_init__(self) -> None:
        at_least("env_runners", self.env_runners, 0)
        at_least("learners", self.learners, 0)
        at_least("max_seq_len", self.max_seq_len, 1)
        if self.learners > 1:
            raise BadInput("--learners above 1 (DDP across learners) is not traced yet; use --learners 0 or 1")
