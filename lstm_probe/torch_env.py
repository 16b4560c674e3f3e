"""Pendulum-v1 for many envs at once, as torch tensors on any device: wide runs without gymnasium's
per-env Python loop hiding what the probe costs (issue: capture core; rsl_rl's VecEnv works on tensors too).

:class:`TorchPendulum` is the batched dynamics: gymnasium's ``PendulumEnv.step`` (``gymnasium/envs/
classic_control/pendulum.py``) on an (N,) state, with the ``TimeLimit`` of 200 steps and an automatic reset of
every env whose episode ended (on the device, no host transfer). ``observe_velocity=False`` drops the
angular velocity from the observation, so a policy has to remember (a partially observable task for an
LSTM). Knows no RL framework: ``integrations/sb3/torch_env.py`` adapts it to stable-baselines3's VecEnv.
"""

from __future__ import annotations

import math

import torch

G, M, L, DT = 10.0, 1.0, 1.0, 0.05  # gymnasium's PendulumEnv(g=10.0): mass, length, time step
MAX_SPEED, MAX_TORQUE = 8.0, 2.0
MAX_STEPS = 200  # gymnasium's registered TimeLimit for Pendulum-v1


class TorchPendulum:
    """``num_envs`` pendulums stepped together on ``device``; each env resets itself when its episode ends."""

    def __init__(
        self,
        num_envs: int,
        *,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_steps: int = MAX_STEPS,
        observe_velocity: bool = True,
    ):
        if num_envs < 1 or max_steps < 1:
            raise ValueError(f"num_envs and max_steps must be >= 1, got {num_envs}, {max_steps}")
        self.num_envs, self.max_steps, self.observe_velocity = num_envs, max_steps, observe_velocity
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.theta = torch.zeros(num_envs, device=self.device)
        self.theta_dot = torch.zeros(num_envs, device=self.device)
        self.steps = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.reset(torch.ones(num_envs, dtype=torch.bool, device=self.device))

    @property
    def obs_dim(self) -> int:
        return 3 if self.observe_velocity else 2

    def observe(self) -> torch.Tensor:
        """(N, 3): cos, sin, angular velocity (N, 2 without the velocity)."""
        parts = [torch.cos(self.theta), torch.sin(self.theta)]
        if self.observe_velocity:
            parts.append(self.theta_dot)
        return torch.stack(parts, dim=1)

    def reset(self, which: torch.Tensor) -> torch.Tensor:
        """Start a new episode in the envs ``which`` (a bool mask): angle in [-pi, pi], velocity in [-1, 1]
        (gymnasium's reset bounds). Returns every env's observation."""
        u = torch.rand(2, self.num_envs, generator=self.generator, device=self.device) * 2 - 1
        self.theta = torch.where(which, u[0] * math.pi, self.theta)
        self.theta_dot = torch.where(which, u[1], self.theta_dot)
        self.steps = torch.where(which, torch.zeros_like(self.steps), self.steps)
        return self.observe()

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of every env with torques ``action`` (N,) or (N, 1). Returns (observation after the
        step, with ended episodes already reset; reward; truncated (the time limit; a pendulum never
        terminates); the observation each env reached before any reset)."""
        u = action.reshape(self.num_envs).to(self.theta).clamp(-MAX_TORQUE, MAX_TORQUE)
        th, thdot = self.theta, self.theta_dot
        normalized = torch.remainder(th + math.pi, 2 * math.pi) - math.pi
        cost = normalized**2 + 0.1 * thdot**2 + 0.001 * u**2
        thdot = (thdot + (3 * G / (2 * L) * torch.sin(th) + 3.0 / (M * L**2) * u) * DT).clamp(-MAX_SPEED, MAX_SPEED)
        self.theta, self.theta_dot = th + thdot * DT, thdot
        self.steps = self.steps + 1
        final = self.observe()
        truncated = self.steps >= self.max_steps
        return self.reset(truncated), -cost, truncated, final
