"""Tiny envs with image and Dict observations, for the Cnn and MultiInput policy variants."""

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class TinyImageEnv(gym.Env):
    observation_space = spaces.Box(0, 255, (36, 36, 3), np.uint8)  # NatureCNN's smallest input
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(action), self.t >= 10, False, {}


class TinyDictEnv(gym.Env):
    observation_space = spaces.Dict({"pos": spaces.Box(-1, 1, (3,), np.float32), "flag": spaces.Discrete(2)})
    action_space = spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(action[0]), False, self.t >= 12, {}


class TinyConstantEnv(gym.Env):
    """Box observations whose last component never moves (as an image's border pixel never does)."""

    observation_space = spaces.Box(-10, 10, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.x = 0, 0.0
        return np.array([self.x, 0.0, 0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        self.x += 1.0 if action else -1.0
        obs = np.array([self.x, self.t / 10, 0.0], np.float32)
        return obs, float(action), False, self.t >= 10, {}


for _cls in (TinyImageEnv, TinyDictEnv, TinyConstantEnv):  # for `lstm-probe run tiny_envs:TinyDictEnv-v0`
    if f"{_cls.__name__}-v0" not in gym.registry:
        gym.register(f"{_cls.__name__}-v0", entry_point=_cls)
