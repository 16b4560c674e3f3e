"""A CleanRL-style loop: nn.LSTM called one step at a time in rollout and over sequences in training,
traced with lstm_probe.trace() and tagged by hand. No sb3 involved.

    python examples/cleanrl_loop.py --iterations 3 --out cleanrl.parquet
"""

import argparse

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import lstm_probe

parser = argparse.ArgumentParser()
parser.add_argument("--iterations", type=int, default=3)
parser.add_argument("--num-envs", type=int, default=4)
parser.add_argument("--num-steps", type=int, default=32)
parser.add_argument("--out", default="cleanrl.parquet")
args = parser.parse_args()
torch.manual_seed(0)


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 32):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh())
        self.lstm = nn.LSTM(32, hidden)
        self.actor = nn.Linear(hidden, n_actions)
        self.critic = nn.Linear(hidden, 1)

    def get_states(self, x, state, done):
        # (steps * envs, obs) -> (steps, envs, hidden); the reset on `done` written out as in CleanRL
        hidden = self.encoder(x)
        batch = state[0].shape[1]
        hidden = hidden.reshape((-1, batch, self.lstm.input_size))
        done = done.reshape((-1, batch))
        out = []
        for h, d in zip(hidden, done, strict=True):
            h, state = self.lstm(
                h.unsqueeze(0), ((1.0 - d).view(1, -1, 1) * state[0], (1.0 - d).view(1, -1, 1) * state[1])
            )
            out += [h]
        return torch.flatten(torch.cat(out), 0, 1), state


envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(args.num_envs)])
agent = Agent(envs.single_observation_space.shape[0], envs.single_action_space.n)
opt = torch.optim.Adam(agent.parameters(), lr=2.5e-4)
obs, _ = envs.reset(seed=0)
obs = torch.tensor(obs, dtype=torch.float32)
done = torch.zeros(args.num_envs)
state = (torch.zeros(1, args.num_envs, 32), torch.zeros(1, args.num_envs, 32))
env_step = 0
episode = np.zeros(args.num_envs, dtype=np.int64)
with lstm_probe.trace(agent, out=args.out, force=True, reference_window=args.num_steps) as probe:
    for it in range(args.iterations):
        start_state = (state[0].clone(), state[1].clone())
        buf_obs, buf_done, buf_act = [], [], []
        for _ in range(args.num_steps):
            with (
                torch.no_grad(),
                probe.tag(
                    phase="rollout",
                    iteration=it,
                    env=np.arange(args.num_envs),
                    env_step=env_step,
                    episode=episode.copy(),
                    episode_start=done.numpy(),
                ),
            ):
                h, state = agent.get_states(obs, state, done)
                action = torch.distributions.Categorical(logits=agent.actor(h)).sample()
            buf_obs.append(obs)
            buf_done.append(done)
            buf_act.append(action)
            nxt, _, term, trunc, _ = envs.step(action.numpy())
            done_np = np.logical_or(term, trunc)
            episode += done_np
            obs, done = torch.tensor(nxt, dtype=torch.float32), torch.tensor(done_np, dtype=torch.float32)
            env_step += 1
        # one full-batch update: the whole rollout as one sequence per env, from the stored start state
        with probe.tag(
            phase="train",
            iteration=it,
            epoch=0,
            minibatch=0,
            env=np.arange(args.num_envs),
            env_step=np.arange(env_step - args.num_steps, env_step)[None, :],
        ):
            h, _ = agent.get_states(torch.cat(buf_obs), start_state, torch.cat(buf_done))
            logp = torch.distributions.Categorical(logits=agent.actor(h)).log_prob(torch.cat(buf_act))
            loss = -logp.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
print(f"wrote {args.out}")
