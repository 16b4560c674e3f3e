"""sb3's own options, declared once (see ``lstm_probe.options``): how ``lstm-probe run`` builds the
RecurrentPPO (:class:`Build`) and what the probe measures beyond the states (:class:`Measure`,
``ProbeCallback``'s own settings). Imports neither torch nor sb3: the CLI builds its flags from them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lstm_probe.errors import BadInput
from lstm_probe.options import at_least, option


@dataclass(frozen=True)
class Build:
    """The RecurrentPPO ``lstm-probe run`` builds beyond :class:`~lstm_probe.options.TrainOptions`."""

    lstm_layers: int | None = option(None, "LSTM layers.", shown="1")
    critic_lstm: bool = option(True, "Give the critic its own LSTM.")
    device: str = option("auto", "Torch device: auto, cpu, cuda, cuda:1...")
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


@dataclass(frozen=True)
class Measure:
    """What the probe measures beyond the states (``ProbeCallback``'s keyword arguments of these names)."""

    what_if: bool = option(
        False,
        "Do stale stored states matter? Re-evaluate sampled minibatches from refreshed, zero and burn-in initial "
        "states on a copy of the policy (the report's 'What if' section).",
    )
    what_if_every: int = option(1, "--what-if: measure every K-th iteration.")
    burn_in: tuple[int, ...] = option(
        (), "--what-if: another burn-in length to measure (repeatable).", shown="4, 16, 64", cli=list[int] | None
    )
    memory: bool = option(
        False,
        "Does the policy use its LSTM, and how far back? Zero the state k steps back at sampled steps on a copy "
        "of the policy (the report's 'Memory' section).",
    )
    memory_every: int | None = option(None, "--memory: measure every K-th iteration.", shown="1")
    capture_obs: bool = option(False, "Store the observation the policy saw in rollout rows (probe targets obs:i).")
    info_keys: tuple[str, ...] = option(
        (),
        "Store info[KEY] of each step in rollout rows (probe target info:KEY; repeatable).",
        flags=("--info",),
        shown="none",
        cli=list[str] | None,
    )

    def __post_init__(self) -> None:
        # lists (the CLI's, a user's) kept as tuples: the object is frozen and hashable
        keys = (self.info_keys,) if isinstance(self.info_keys, str) else self.info_keys
        object.__setattr__(self, "burn_in", tuple(sorted({int(k) for k in self.burn_in or ()})))
        object.__setattr__(self, "info_keys", tuple(str(k) for k in keys or ()))
        for name in ("what_if_every", "memory_every"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise BadInput(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        if any(k < 1 for k in self.burn_in):
            raise BadInput(f"--burn-in lengths must be >= 1, got {list(self.burn_in)}")
        if not self.what_if and (self.what_if_every != 1 or self.burn_in):
            raise BadInput("--what-if-every and --burn-in need --what-if (ProbeCallback(what_if=True))")
        if not self.memory and self.memory_every is not None:
            raise BadInput("--memory-every needs --memory (ProbeCallback(memory=True))")
        if len(set(self.info_keys)) != len(self.info_keys):
            raise BadInput(f"info keys repeat: {list(self.info_keys)}")
