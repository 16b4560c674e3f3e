"""TorchRL's own options for ``lstm-probe run --framework torchrl``, declared once (see ``lstm_probe.options``).
Imports nothing of TorchRL or torch: the CLI builds its flags from them."""

from __future__ import annotations

from dataclasses import dataclass

from lstm_probe.options import option


@dataclass(frozen=True)
class TorchRL:
    """What the probe keeps beside the rows of a TorchRL run."""

    capture_obs: bool = option(False, "Store the observation the policy saw in rollout rows (probe targets obs:i).")
