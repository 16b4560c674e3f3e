"""Envs as rsl_rl's ``VecEnv`` (``rsl_rl/env/vec_env.py``): observations as a TensorDict of groups, actions,
rewards and dones as torch tensors on the env's device, ``extras['time_outs']`` for truncations (what
``rsl_rl/algorithms/ppo.py:PPO.process_env_step`` bootstraps on).

:class:`TorchPendulumVecEnv`: the torch-native batched Pendulum (``lstm_probe/torch_env.py``), any width
and device, no Python loop per env; partially observable by default (no angular velocity), so memory
matters. :class:`GymVecEnv`: any gymnasium env id with a Box action space, stepped by
gymnasium's ``SyncVectorEnv`` (numpy, one Python env object each: for small runs and checks).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from rsl_rl.env import VecEnv
from tensordict import TensorDict

from lstm_probe.errors import BadInput
from lstm_probe.options import check_env_id
from lstm_probe.torch_env import TorchPendulum


class TorchPendulumVecEnv(VecEnv):
    """:class:`~lstm_probe.torch_env.TorchPendulum` as rsl_rl's VecEnv (observation group ``policy``)."""

    def __init__(self, num_envs: int, *, observe_velocity: bool = False, **kwargs: Any):
        """``kwargs``: :class:`~lstm_probe.torch_env.TorchPendulum`'s (device, seed, max_steps)."""
        self.pendulum = TorchPendulum(num_envs, observe_velocity=observe_velocity, **kwargs)
        max_steps = self.pendulum.max_steps
        self.num_envs = num_envs
        self.num_actions = 1
        self.max_episode_length = max_steps
        self.device = self.pendulum.device
        self.cfg: dict[str, Any] = {"env": "TorchPendulum", "observe_velocity": observe_velocity}
        self._obs = self.pendulum.observe()

    @property
    def episode_length_buf(self) -> torch.Tensor:  # type: ignore[override]
        return self.pendulum.steps

    @episode_length_buf.setter
    def episode_length_buf(self, value: torch.Tensor) -> None:
        self.pendulum.steps = value

    def get_observations(self) -> TensorDict:
        return TensorDict({"policy": self._obs}, batch_size=[self.num_envs], device=self.device)

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict[str, Any]]:
        self._obs, reward, truncated, _ = self.pendulum.step(actions)
        dones = truncated.to(torch.long)  # rsl_rl's envs (Isaac Lab) give integer dones
        return self.get_observations(), reward, dones, {"time_outs": truncated}


class GymVecEnv(VecEnv):
    """A gymnasium env id as rsl_rl's VecEnv: ``num_envs`` copies in gymnasium's ``SyncVectorEnv`` (automatic
    reset in the same step), observations flattened to float32 in the group ``policy``."""

    def __init__(self, env_id: str, num_envs: int, *, seed: int, device: str):
        import gymnasium as gym

        check_env_id(env_id)
        makers = [lambda: gym.make(env_id) for _ in range(num_envs)]
        if hasattr(gym.vector, "AutoresetMode"):  # gymnasium >= 1.1: the mode is chosen
            self.envs: Any = gym.vector.SyncVectorEnv(makers, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        elif gym.__version__.startswith("0."):  # 0.29: the same step, always
            self.envs = gym.vector.SyncVectorEnv(makers)
        else:  # 1.0: the next step, always
            raise BadInput(
                f"--framework rsl_rl needs gymnasium 0.29 or >= 1.1 (1.0's vector envs reset a step late), not "
                f"{gym.__version__}: pip install 'gymnasium>=1.1'"
            )
        space = self.envs.single_action_space
        self.action_shape = tuple(space.shape or ())
        if not isinstance(space, gym.spaces.Box):
            raise BadInput(f"--framework rsl_rl trains continuous actions (a Box action space); {env_id} has {space}")
        self.low = torch.as_tensor(space.low, dtype=torch.float32)
        self.high = torch.as_tensor(space.high, dtype=torch.float32)
        self.num_envs = num_envs
        self.num_actions = int(np.prod(space.shape))
        spec = gym.spec(env_id)
        self.max_episode_length = int(spec.max_episode_steps or 1000)
        self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long)
        self.device = device
        self.cfg = {"env_id": env_id}
        obs, _ = self.envs.reset(seed=seed)  # type: ignore[var-annotated]
        self._obs = self._tensor(obs)

    def _tensor(self, obs: Any) -> torch.Tensor:
        return torch.as_tensor(np.asarray(obs, np.float32).reshape(self.num_envs, -1), device=self.device)

    def get_observations(self) -> TensorDict:
        return TensorDict({"policy": self._obs}, batch_size=[self.num_envs], device=self.device)

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict[str, Any]]:
        a = actions.detach().cpu().clamp(self.low, self.high).numpy()
        shape = (self.num_envs, *self.action_shape)
        obs, reward, terminated, truncated, _ = self.envs.step(a.reshape(shape))
        done = np.logical_or(terminated, truncated)
        self.episode_length_buf = torch.where(torch.as_tensor(done), 0, self.episode_length_buf + 1)
        self._obs = self._tensor(obs)
        time_outs = torch.as_tensor(truncated & ~terminated, device=self.device)
        return (
            self.get_observations(),
            torch.as_tensor(reward, dtype=torch.float32, device=self.device),
            torch.as_tensor(done, dtype=torch.long, device=self.device),
            {"time_outs": time_outs},
        )

    def close(self) -> None:
        self.envs.close()
