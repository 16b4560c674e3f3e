"""``lstm_probe.run``: train sb3-contrib's RecurrentPPO with the probe attached (``lstm-probe run``).

The sb3 building and training live in ``lstm_probe.integrations.sb3_run`` and the framework-neutral
pieces (``RunResult``, ``validate``) in ``lstm_probe.options``; this module keeps their old import path.
"""

from __future__ import annotations

from lstm_probe.integrations.sb3_run import build, check_env_id, parse_hyperparams, policy_for, run
from lstm_probe.options import Progress, RunResult, validate

__all__ = ["Progress", "RunResult", "build", "check_env_id", "parse_hyperparams", "policy_for", "run", "validate"]
