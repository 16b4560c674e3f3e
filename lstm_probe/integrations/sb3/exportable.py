"""Whether ``lstm-probe export`` takes a RecurrentPPO policy, from its spaces alone: asked by ``export`` (through
``deployed.spec_of``) and by ``run``, which says so after training instead of printing an export command that
would be refused. Torch-free; imports gymnasium only when asked."""

from __future__ import annotations

from typing import Any


def refusal(policy: Any) -> str | None:
    """Why export refuses ``policy`` (one line), or None."""
    from gymnasium import spaces

    obs, act = policy.observation_space, policy.action_space
    if isinstance(obs, spaces.Dict):
        return (
            f"export takes a Box observation space, not {obs}: a MultiInputLstmPolicy is not exported (train on "
            "flattened observations, gymnasium's FlattenObservation, for a policy export takes)"
        )
    if not isinstance(obs, spaces.Box):
        return f"export takes a Box observation space, not {obs}; flatten the observations with a wrapper"
    if isinstance(act, spaces.Box):
        if policy.squash_output:
            return "export does not take squashed (gSDE) actions yet; train without use_sde to export"
    elif not isinstance(act, spaces.Discrete):
        return f"export takes Box or Discrete actions, not {act}"
    return None
