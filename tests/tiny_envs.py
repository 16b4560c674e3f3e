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


class PendulumDictEnv(gym.Env):
    """Pendulum-v1 with its observation as a Dict (sorted keys: 'angle' (cos, sin), 'phase' (the step mod 4,
    Discrete), 'speed'), episodes of 40 steps: a MultiInputLstmPolicy's env with an episode start every 40 steps."""

    observation_space = spaces.Dict(
        {
            "angle": spaces.Box(-1, 1, (2,), np.float32),
            "phase": spaces.Discrete(4),
            "speed": spaces.Box(-8, 8, (1,), np.float32),
        }
    )
    action_space = spaces.Box(-2, 2, (1,), np.float32)

    def __init__(self):
        self.env = gym.make("Pendulum-v1", max_episode_steps=40)

    def _obs(self, o):
        return {"angle": o[:2].astype(np.float32), "phase": self.t % 4, "speed": o[2:].astype(np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        o, info = self.env.reset(seed=seed)
        return self._obs(o), info

    def step(self, action):
        self.t += 1
        o, r, terminated, truncated, info = self.env.step(action)
        return self._obs(o), r, terminated, truncated, info


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


for _cls in (
    TinyImageEnv,
    TinyDictEnv,
    TinyConstantEnv,
    PendulumDictEnv,
):  # for `lstm-probe run tiny_envs:TinyDictEnv-v0`
    if f"{_cls.__name__}-v0" not in gym.registry:
        gym.register(f"{_cls.__name__}-v0", entry_point=_cls)
