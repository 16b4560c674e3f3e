"""A VecEnv wrapper that keeps the rewards and dones ``collect_rollouts`` gets from ``env.step`` (VecNormalize's,
where it wraps this one): what a run's returns are recomputed from."""

from stable_baselines3.common.vec_env import VecEnvWrapper


class Seen(VecEnvWrapper):
    def __init__(self, venv):
        super().__init__(venv)
        self.steps = []

    def reset(self):
        return self.venv.reset()

    def step_wait(self):
        obs, rewards, dones, infos = self.venv.step_wait()
        self.steps.append((rewards.copy(), dones.copy()))
        return obs, rewards, dones, infos
