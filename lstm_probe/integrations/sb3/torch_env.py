"""sb3's view of the torch-native Pendulum (``lstm_probe/torch_env.py``): a stable-baselines3 ``VecEnv``, numpy in
and out as SB3 wants, with ``terminal_observation`` and ``TimeLimit.truncated`` in the infos of truncated
episodes, as ``sb3_contrib/ppo_recurrent/ppo_recurrent.py:collect_rollouts`` reads them to bootstrap their
values (the log's bootstrap calls)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.vec_env import VecEnv

from lstm_probe.torch_env import MAX_SPEED, MAX_TORQUE, TorchPendulum


class TorchPendulumVecEnv(VecEnv):
    """:class:`TorchPendulum` as stable-baselines3's ``VecEnv`` (RecurrentPPO trains on it as on any)."""

    def __init__(self, num_envs: int, **kwargs: Any):
        self.env = TorchPendulum(num_envs, **kwargs)
        high = np.array([1.0, 1.0, MAX_SPEED][: self.env.obs_dim], dtype=np.float32)
        obs_space = spaces.Box(-high, high, dtype=np.float32)
        act_space = spaces.Box(-MAX_TORQUE, MAX_TORQUE, shape=(1,), dtype=np.float32)
        super().__init__(num_envs, obs_space, act_space)
        self._actions: torch.Tensor | None = None

    def reset(self) -> np.ndarray:
        seed = next((s for s in getattr(self, "_seeds", []) if s is not None), None)
        if seed is not None:  # VecEnv.seed(): the next reset starts from it
            self.env.generator.manual_seed(int(seed))
            self._reset_seeds()
        obs = self.env.reset(torch.ones(self.num_envs, dtype=torch.bool, device=self.env.device))
        return obs.cpu().numpy()

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = torch.as_tensor(actions, dtype=torch.float32, device=self.env.device)

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        assert self._actions is not None, "step_async first"
        obs, reward, truncated, final = self.env.step(self._actions)
        obs_np, final_np = obs.cpu().numpy(), final.cpu().numpy()
        dones = truncated.cpu().numpy()
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for i in np.flatnonzero(dones):
            infos[i] = {"terminal_observation": final_np[i], "TimeLimit.truncated": True}
        return obs_np, reward.cpu().numpy().astype(np.float32), dones, infos

    def close(self) -> None:
        pass

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [getattr(self.env, attr_name, None)] * len(self._indices(indices))

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        setattr(self.env, attr_name, value)

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
        raise AttributeError(f"TorchPendulumVecEnv has no per-env method {method_name!r}")

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
        return [False] * len(self._indices(indices))

    def _indices(self, indices: Any) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        return [indices] if isinstance(indices, int) else list(indices)
