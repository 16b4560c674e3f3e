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
        why = dict_refusal(obs)
        if why is not None:
            return why
    elif not isinstance(obs, spaces.Box):
        return f"export takes a Box or Dict observation space, not {obs}; flatten the observations with a wrapper"
    if isinstance(act, spaces.Box):
        if policy.squash_output:
            return "export does not take squashed (gSDE) actions yet; train without use_sde to export"
    elif not isinstance(act, spaces.Discrete):
        return f"export takes Box or Discrete actions, not {act}"
    return None


def dict_refusal(obs: Any) -> str | None:
    """Why export refuses a Dict observation space (a MultiInputLstmPolicy's), or None: its keys must be Box
    (not images, which sb3 rescales and may transpose), Discrete, MultiDiscrete or MultiBinary spaces, each laid
    out in the one flat input as ``gymnasium.spaces.flatten`` lays it out (``Spec.obs_keys``)."""
    import numpy as np
    from gymnasium import spaces

    if not obs.spaces:
        return "export takes a Dict observation space with at least one key, not an empty Dict"
    for key, space in obs.spaces.items():
        if isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3:  # sb3's images
            return (
                f"export does not take a Dict observation with an image (key {str(key)[:40]!r}: {space}) yet; "
                "train on a Box image space (CnnLstmPolicy), or on the image flattened, for a policy export takes"
            )
        if not isinstance(space, spaces.Box | spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary):
            return (
                f"export takes a Dict observation of Box, Discrete, MultiDiscrete or MultiBinary keys, not key "
                f"{str(key)[:40]!r}: {str(space)[:80]}"
            )
        starts = np.asarray(getattr(space, "start", 0))
        if isinstance(space, spaces.Discrete | spaces.MultiDiscrete) and (starts.any() or starts.ndim > 1):
            return (
                f"export takes Discrete and flat MultiDiscrete keys starting at 0, not key {str(key)[:40]!r}: {space}"
            )
    return None
