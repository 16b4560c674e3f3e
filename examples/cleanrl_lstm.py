"""CleanRL's ppo_atari_lstm.py on CartPole-v1, traced with lstm_probe.trace() and the fewest tags that give a
true report (docs/own-loops.md). The loop is CleanRL's: rollout one step at a time with the ``(1 - done) *
state`` reset inside ``get_states``, a bootstrap value call after the rollout, GAE, then several epochs over
minibatches of whole envs, each re-run step by step from the state stored at the rollout's start. The probe
is started and closed around the flat loop (no ``with``, nothing re-indented); the lines marked
``# lstm-probe``, the run's metadata and the tags are all that was added.

    python examples/cleanrl_lstm.py --iterations 4 --out cleanrl.parquet
    lstm-probe report cleanrl.parquet

``--bug`` plants a classic recurrent-PPO bug for the report's doctor to name:

- no-reset-in-train: the training loop ignores the stored dones (the state runs on across episode starts);
- no-reset: get_states never resets the state (rollout and training), the ``h[:, done] = 0`` forgotten;
- no-reset-in-rollout: the rollout's calls (under no_grad) ignore the dones, training resets as it should;
- reset-every-step: the LSTM gets no state, so every step starts from zeros (the state is not passed back);
- bootstrap-zero-state: the bootstrap value call starts from zeros instead of the rollout's last state;
- zero-train-start: training starts from zeros instead of the state stored at the rollout's start;
- global-step: env_step tagged with CleanRL's ``global_step`` (all envs' steps together: it advances by the
  number of envs each step) instead of each env's own step counter;
- next-step-autoreset: gymnasium >= 1.1's default NEXT_STEP autoreset (the step after an episode's end returns
  the reset observation and ignores the action), which CleanRL's loop was not written for.

``--tags bare`` tags as lstm-probe's README did before (phase, iteration, env, env_step; bootstrap untagged):
the report then says which tags are missing instead of guessing.

``--what-if`` also measures whether the stored states matter (the report's "What if" section): before each
minibatch's loss, ``probe.measure_batch`` gets the rollout, the minibatch and ``evaluate``, the minibatch's
forward and loss written against the agent it is given (the probe's private copy of it). ``--memory`` measures
how far back the policy remembers (the "Memory" section), from the same call and ``heads``: the policy's
outputs from the LSTM's.
"""

import argparse

import gymnasium as gym
import numpy as np
import torch
from torch import nn, optim
from torch.distributions.categorical import Categorical

import lstm_probe

BUGS = ("no-reset-in-train", "no-reset", "no-reset-in-rollout", "reset-every-step", "bootstrap-zero-state")
BUGS += ("zero-train-start", "global-step", "next-step-autoreset")
parser = argparse.ArgumentParser()
parser.add_argument("--iterations", type=int, default=4)
parser.add_argument("--num-envs", type=int, default=4)
parser.add_argument("--num-steps", type=int, default=32)
parser.add_argument("--num-minibatches", type=int, default=2)
parser.add_argument("--update-epochs", type=int, default=2)
parser.add_argument("--hidden", type=int, default=32)
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--out", default="cleanrl.parquet")
parser.add_argument("--bug", choices=BUGS)
parser.add_argument("--tags", choices=("fewest", "bare"), default="fewest")
parser.add_argument("--what-if", action="store_true")
parser.add_argument("--memory", action="store_true")
args = parser.parse_args()
bare = args.tags == "bare"
torch.manual_seed(args.seed)
np.random.seed(args.seed)
torch.set_num_threads(1)
# the env step tagged for step s of an env (--bug global-step: CleanRL's global_step there, num_envs a step)
step_of = (lambda s: (s + 1) * args.num_envs) if args.bug == "global-step" else (lambda s: s)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        self.network = nn.Sequential(layer_init(nn.Linear(envs.single_observation_space.shape[0], 64)), nn.Tanh())
        self.lstm = nn.LSTM(64, args.hidden)
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0)
            elif "weight" in name:
                nn.init.orthogonal_(param, 1.0)
        self.actor = layer_init(nn.Linear(args.hidden, envs.single_action_space.n), std=0.01)
        self.critic = layer_init(nn.Linear(args.hidden, 1), std=1)

    def get_states(self, x, lstm_state, done):
        hidden = self.network(x)
        # LSTM logic
        batch_size = lstm_state[0].shape[1]
        hidden = hidden.reshape((-1, batch_size, self.lstm.input_size))
        done = done.reshape((-1, batch_size))
        if args.bug == "no-reset" or (args.bug == "no-reset-in-rollout" and not torch.is_grad_enabled()):
            done = torch.zeros_like(done)
        new_hidden = []
        for h, d in zip(hidden, done, strict=True):
            if args.bug == "reset-every-step":
                h, lstm_state = self.lstm(h.unsqueeze(0))
            else:
                h, lstm_state = self.lstm(
                    h.unsqueeze(0),
                    (
                        (1.0 - d).view(1, -1, 1) * lstm_state[0],
                        (1.0 - d).view(1, -1, 1) * lstm_state[1],
                    ),
                )
            new_hidden += [h]
        new_hidden = torch.flatten(torch.cat(new_hidden), 0, 1)
        return new_hidden, lstm_state

    def get_value(self, x, lstm_state, done):
        hidden, _ = self.get_states(x, lstm_state, done)
        return self.critic(hidden)

    def get_action_and_value(self, x, lstm_state, done, action=None):
        hidden, lstm_state = self.get_states(x, lstm_state, done)
        logits = self.actor(hidden)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden), lstm_state


def ppo_loss(newlogprob, entropy, newvalue, mb_inds):
    """The minibatch's PPO loss and its terms: CleanRL's lines, in a function that training and the probe's
    evaluate share."""
    logratio = newlogprob - b_logprobs[mb_inds]
    ratio = logratio.exp()
    mb_advantages = b_advantages[mb_inds]
    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
    v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb_inds]) ** 2).mean()
    loss = pg_loss - ent_coef * entropy.mean() + v_loss * vf_coef
    clip_fraction = ((ratio - 1.0).abs() > clip_coef).float().mean()
    return {"loss": loss, "policy_loss": pg_loss, "value_loss": v_loss, "clip_fraction": clip_fraction}


def evaluate(agent, state, mb_inds):  # lstm-probe: the minibatch from `state`, on the agent given (the probe's copy)
    hidden, _ = agent.get_states(b_obs[mb_inds], state, b_dones[mb_inds])  # lstm-probe
    dist = Categorical(logits=agent.actor(hidden))  # lstm-probe
    newlogprob, entropy = dist.log_prob(b_actions.long()[mb_inds]), dist.entropy()  # lstm-probe
    newvalue = agent.critic(hidden)  # lstm-probe
    out = {"values": newvalue, "log_prob": newlogprob, "entropy": entropy, "dist": dist}  # lstm-probe
    return out | ppo_loss(newlogprob, entropy, newvalue, mb_inds) | {"returns": b_returns[mb_inds]}  # lstm-probe


def heads(agent, hidden):  # lstm-probe: the policy's outputs from the LSTM's, on the agent given (--memory)
    return {"dist": Categorical(logits=agent.actor(hidden)), "values": agent.critic(hidden)}  # lstm-probe


# gymnasium >= 1.1 resets an env on the step after its episode ends unless asked otherwise; CleanRL's gym
# reset it in the same step (the next observation is the new episode's first)
modes = getattr(gym.vector, "AutoresetMode", None)
mode = {"autoreset_mode": modes.NEXT_STEP if args.bug == "next-step-autoreset" else modes.SAME_STEP} if modes else {}
envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(args.num_envs)], **mode)
agent = Agent(envs)
optimizer = optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
gamma, gae_lambda, clip_coef, ent_coef, vf_coef = 0.99, 0.95, 0.1, 0.01, 0.5

obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape)
actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape)
logprobs = torch.zeros((args.num_steps, args.num_envs))
rewards = torch.zeros((args.num_steps, args.num_envs))
dones = torch.zeros((args.num_steps, args.num_envs))
values = torch.zeros((args.num_steps, args.num_envs))

next_obs = torch.Tensor(envs.reset(seed=args.seed)[0])
next_done = torch.zeros(args.num_envs)
next_lstm_state = (
    torch.zeros(agent.lstm.num_layers, args.num_envs, agent.lstm.hidden_size),
    torch.zeros(agent.lstm.num_layers, args.num_envs, agent.lstm.hidden_size),
)
batch_size = args.num_envs * args.num_steps
env_ids = np.arange(args.num_envs)  # lstm-probe: the batch column of each env
finished = 0
meta = {"env_id": "CartPole-v1", "algorithm": "PPO (CleanRL ppo_atari_lstm)", "n_envs": args.num_envs}
meta |= {"seed": args.seed, "hyperparameters": {"n_steps": args.num_steps, "n_epochs": args.update_epochs}}
measure = {"optimizer": optimizer, "epochs": args.update_epochs, "minibatches": args.num_minibatches}  # lstm-probe
measure |= {"what_if": args.what_if, "memory": args.memory, "heads": heads}  # lstm-probe
measure["inputs"] = lambda agent, x: agent.network(x)  # lstm-probe: the LSTM's input from observations
measure |= {"envs": envs} if modes else {}  # lstm-probe: its autoreset mode (gymnasium >= 1.1) into the log
probe = lstm_probe.trace(agent, out=args.out, force=True, metadata=meta, **measure)  # lstm-probe
probe.start()  # lstm-probe

for iteration in range(args.iterations):
    initial_lstm_state = (next_lstm_state[0].clone(), next_lstm_state[1].clone())
    first_step = iteration * args.num_steps  # lstm-probe: the env step of the rollout's first step
    for step in range(0, args.num_steps):
        obs[step] = next_obs
        dones[step] = next_done

        # ALGO LOGIC: action logic
        tags = dict(phase="rollout", iteration=iteration, env=env_ids, env_step=step_of(first_step + step))
        with torch.no_grad(), probe.tag(**tags, **({} if bare else {"episode_start": next_done.numpy()})):
            action, logprob, _, value, next_lstm_state = agent.get_action_and_value(
                next_obs, next_lstm_state, next_done
            )
            values[step] = value.flatten()
        actions[step] = action
        logprobs[step] = logprob

        next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
        next_done = np.logical_or(terminations, truncations)
        probe.rewards(reward, next_done, iteration=iteration)  # lstm-probe: episode returns (the report's returns line)
        finished += int(next_done.sum())
        rewards[step] = torch.tensor(reward).view(-1)
        next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)

    # bootstrap value if not done
    tags = dict(phase="bootstrap", iteration=iteration, env=env_ids, env_step=step_of(first_step + args.num_steps))
    with torch.no_grad(), probe.tag() if bare else probe.tag(**tags, episode_start=next_done.numpy()):
        state = next_lstm_state
        if args.bug == "bootstrap-zero-state":
            state = (torch.zeros_like(state[0]), torch.zeros_like(state[1]))
        next_value = agent.get_value(next_obs, state, next_done).reshape(1, -1)
        advantages = torch.zeros_like(rewards)
        lastgaelam = 0
        for t in reversed(range(args.num_steps)):
            if t == args.num_steps - 1:
                nextnonterminal = 1.0 - next_done
                nextvalues = next_value
            else:
                nextnonterminal = 1.0 - dones[t + 1]
                nextvalues = values[t + 1]
            delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        returns = advantages + values

    # flatten the batch
    b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
    b_logprobs = logprobs.reshape(-1)
    b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
    b_dones = dones.reshape(-1)
    if args.bug == "no-reset-in-train":
        b_dones = torch.zeros_like(b_dones)
    b_advantages = advantages.reshape(-1)
    b_returns = returns.reshape(-1)

    # Optimizing the policy and value network
    envsperbatch = args.num_envs // args.num_minibatches
    envinds = np.arange(args.num_envs)
    flatinds = np.arange(batch_size).reshape(args.num_steps, args.num_envs)
    steps = step_of(np.arange(first_step, first_step + args.num_steps))[None, :]  # lstm-probe: (1, T) env steps
    rollout = {"obs": obs, "episode_start": dones, "rollout_states": initial_lstm_state, "values": values}  # lstm-probe
    for epoch in range(args.update_epochs):
        np.random.shuffle(envinds)
        for mb, start in enumerate(range(0, args.num_envs, envsperbatch)):
            end = start + envsperbatch
            mbenvinds = envinds[start:end]
            mb_inds = flatinds[:, mbenvinds].ravel()  # be really careful about the index
            init = (initial_lstm_state[0][:, mbenvinds], initial_lstm_state[1][:, mbenvinds])
            if args.bug == "zero-train-start":
                init = (torch.zeros_like(init[0]), torch.zeros_like(init[1]))

            tags = dict(phase="train", iteration=iteration, epoch=epoch, minibatch=mb, env=mbenvinds, env_step=steps)
            with probe.tag(**tags, **({} if bare else {"episode_start": dones[:, mbenvinds].T.numpy()})):
                probe.measure_batch(lambda agent, s: evaluate(agent, s, mb_inds), states=init, **rollout)  # lstm-probe
                _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(
                    b_obs[mb_inds], init, b_dones[mb_inds], b_actions.long()[mb_inds]
                )
            loss = ppo_loss(newlogprob, entropy, newvalue, mb_inds)["loss"]
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            optimizer.step()

probe.close()  # lstm-probe
envs.close()
print(f"wrote {args.out}: {finished} episodes finished")
