"""An r2l-style policy made of nn.LSTMCell layers, stepped by hand; lstm_probe.trace() records each
cell's h and c per step and layer.

    python examples/lstmcell_policy.py --steps 50 --out cells.parquet
"""

import argparse

import gymnasium as gym
import torch
from torch import nn

import lstm_probe

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=50)
parser.add_argument("--out", default="cells.parquet")
args = parser.parse_args()
torch.manual_seed(0)


class CellPolicy(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 16, layers: int = 2):
        super().__init__()
        self.cells = nn.ModuleList([nn.LSTMCell(obs_dim if i == 0 else hidden, hidden) for i in range(layers)])
        self.head = nn.Linear(hidden, act_dim)

    def forward(self, x, states):
        new = []
        for cell, (h, c) in zip(self.cells, states, strict=True):
            h, c = cell(x, (h, c))
            new.append((h, c))
            x = h
        return torch.tanh(self.head(x)), new


env = gym.make("Pendulum-v1")
policy = CellPolicy(env.observation_space.shape[0], env.action_space.shape[0])
obs, _ = env.reset(seed=0)
states = [(torch.zeros(1, 16), torch.zeros(1, 16)) for _ in policy.cells]
with lstm_probe.trace(policy, out=args.out, force=True) as probe, torch.no_grad():
    for t in range(args.steps):
        with probe.tag(phase="rollout", iteration=0, env=0, env_step=t, episode=0, episode_step=t):
            action, states = policy(torch.tensor(obs).unsqueeze(0), states)
        obs, *_ = env.step(2 * action[0].numpy())
print(f"wrote {args.out}")
