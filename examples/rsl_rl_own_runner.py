"""Your own rsl_rl runner, probed: an OnPolicyRunner you configure as in Isaac Lab (here on the torch-native
Pendulum as rsl_rl's VecEnv, no velocity in the observation), the probe attached for training and for a
play loop that resets the policy's memory where episodes end, then the report's findings.

    python examples/rsl_rl_own_runner.py --envs 256 --iterations 3 --out rsl.parquet
"""

import argparse
import contextlib
import io

import torch
from rsl_rl.runners import OnPolicyRunner

import lstm_probe
from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach

parser = argparse.ArgumentParser()
parser.add_argument("--envs", type=int, default=256)
parser.add_argument("--iterations", type=int, default=3)
parser.add_argument("--out", default="rsl.parquet")
parser.add_argument("--device", default="cpu")
args = parser.parse_args()
torch.manual_seed(0)

env = TorchPendulumVecEnv(args.envs, device=args.device, max_steps=100)
rnn = {"class_name": "rsl_rl.models.RNNModel", "hidden_dims": [64, 64], "rnn_type": "lstm", "rnn_hidden_dim": 64}
train_cfg = {
    "num_steps_per_env": 24,
    "save_interval": 50,
    "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
    "actor": {**rnn, "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0}},
    "critic": rnn,
    "algorithm": {"class_name": "rsl_rl.algorithms.PPO", "num_learning_epochs": 5, "num_mini_batches": 4},
}
with contextlib.redirect_stdout(io.StringIO()):  # rsl_rl prints both models
    runner = OnPolicyRunner(env, train_cfg, log_dir=None, device=args.device)

# one line: attach to the runner you built (summary capture, full vectors for 8 env columns), then train
with attach(runner, args.out, capture="summary", trace_envs=8, force=True):
    runner.learn(args.iterations)
    # a play loop (as Isaac Lab's play.py): the inference policy is the actor; reset its memory at dones
    policy = runner.get_inference_policy(device=args.device)
    obs = env.get_observations()
    with torch.inference_mode():
        for _ in range(50):
            obs, _, dones, _ = env.step(policy(obs))
            policy.reset(dones)

report = lstm_probe.summarize(args.out)
for finding in report.findings:
    print("-", finding)
