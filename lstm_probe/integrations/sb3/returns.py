"""The returns capability for sb3: the episodes that ended in each rollout, from what ``ProbeCallback._on_step``
already sees (host arrays; nothing is copied from a device, nothing of sb3's is called).

``ppo_recurrent.py:RecurrentPPO.collect_rollouts`` runs ``new_obs, rewards, dones, infos = env.step(...)``, then
``callback.update_locals(locals())`` and ``callback.on_step()`` (so ``self.locals`` holds those four), and after it
``self._update_info_buffer(infos, dones)`` (``common/base_class.py``), which extends ``model.ep_info_buffer`` with
every ``info["episode"]`` (Monitor's record of a finished episode: raw rewards, even under VecNormalize). The probe
takes the same ``info["episode"]`` (source 'monitor'); an env without a Monitor gives the sum of the ``rewards``
the algorithm saw (source 'rewards'; 'normalized' where a VecNormalize with ``norm_reward`` wraps the env, whose
normalized rewards those are), before sb3 adds the truncation bootstrap to them (``rewards[idx] += gamma *
terminal_value``, after the callback).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from lstm_probe.capture.returns import Returns, StepSums


def _none() -> None:
    return None


class Sb3Returns:
    """The episodes each rollout step ended, for one probed learn()."""

    def __init__(self, model: Any, tracer: Any = None):
        n = int(model.n_envs) if model is not None else 0
        # an env not at an episode's first step when learn() starts (learn(reset_num_timesteps=False)) is partial
        starts = getattr(model, "_last_episode_starts", None)
        self.sums = StepSums(n, True if starts is None else np.asarray(starts, bool).reshape(-1))
        self.returns: Returns | None = None  # made at the first episode's end, with its source
        # the rewards env.step gives collect_rollouts are VecNormalize's normalized ones where it normalizes them;
        # a VecMonitor above that VecNormalize records those too (a Monitor beneath it, the env's own)
        normalized, above = _normalizes_rewards(model.get_env()) if model is not None else (False, False)
        self.summed = "normalized" if normalized else "rewards"
        self.monitor = "normalized" if above else "monitor"
        self.monitored = False  # whether the returns are the Monitor's episodes (else per-env sums)
        # the CoreTracer whose writer's progress carries the record; weakly: a closed tracer is not kept alive
        self.tracer: Callable[[], Any] = weakref.ref(tracer) if tracer is not None else _none

    def step(self, locals_: dict[str, Any], iteration: int) -> None:
        """One env step of ``collect_rollouts`` (its locals as the callback sees them)."""
        rewards, dones, infos = locals_.get("rewards"), locals_.get("dones"), locals_.get("infos")
        if rewards is None or dones is None or infos is None:
            return
        monitored = [info["episode"] for info in infos if isinstance(info.get("episode"), dict)]
        if self.returns is None and (monitored or np.any(dones)):
            self.returns, self.monitored = Returns(self.monitor if monitored else self.summed), bool(monitored)
        if self.returns is not None and self.monitored:
            if monitored:
                r = [float(e.get("r", np.nan)) for e in monitored]
                self.returns.ended(iteration, r, [float(e.get("l", 0)) for e in monitored])
        else:  # per-env sums, kept from the first step (until the source is known: the first episode's end)
            self.sums.step(rewards, dones, self.returns, iteration)

    def publish(self) -> dict[str, Any] | None:
        """The record into the writer's progress (once per rollout, and at the end); the record, or None."""
        return None if self.returns is None else self.returns.publish(self.tracer())


def _normalizes_rewards(env: Any) -> tuple[bool, bool]:
    """Whether ``env`` (the model's VecEnv) holds a VecNormalize that normalizes rewards
    (``vec_env/vec_normalize.py:VecNormalize.step_wait`` applies ``normalize_reward`` where ``norm_reward``, in
    training and evaluation alike), and whether a VecMonitor sits above it (its ``info["episode"]`` then sums the
    normalized rewards); read as attributes along the wrappers' ``venv`` chain, nothing called."""
    from stable_baselines3.common.vec_env import VecMonitor, VecNormalize

    seen, above = 0, False
    while env is not None and seen < 64:
        if isinstance(env, VecNormalize):
            return bool(env.norm_reward), above and bool(env.norm_reward)
        above = above or isinstance(env, VecMonitor)
        env, seen = getattr(env, "venv", None), seen + 1
    return False, False
