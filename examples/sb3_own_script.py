"""Probe your own RecurrentPPO script: your env, wrappers, callbacks; one line added.

python examples/sb3_own_script.py --steps 2000 --out own.parquet
"""

import argparse

from sb3_contrib import RecurrentPPO
from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

from lstm_probe import ProbeCallback

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2000)
parser.add_argument("--out", default="own.parquet")
parser.add_argument("--checkpoints", default="checkpoints")
args = parser.parse_args()

env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=3, seed=0))
eval_env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=1), training=False)
model = RecurrentPPO(
    "MlpLstmPolicy", env, n_steps=64, batch_size=64, n_epochs=2, seed=0, policy_kwargs={"lstm_hidden_size": 32}
)
callbacks = CallbackList(
    [
        EvalCallback(eval_env, eval_freq=50, n_eval_episodes=1, verbose=0),
        CheckpointCallback(save_freq=100, save_path=args.checkpoints, verbose=0),
    ]
)
with ProbeCallback(args.out, force=True) as probe:  # the one added line (and `callback=` below)
    model.learn(args.steps, callback=CallbackList([callbacks, probe]))
print(f"wrote {probe.path}")
