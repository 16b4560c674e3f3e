"""Does the LSTM learn what the policy cannot see? Pendulum-v1 without its angular velocity.

The observation keeps cos and sin of the angle and drops the angular velocity; the true velocity goes into
``info["velocity"]``. The probe records the observations and that info key (``capture_obs=True``,
``info_keys=["velocity"]``) and measures the memory horizon (``memory=True``). After training, linear probes
read the hidden velocity out of h (R² on held-out episodes, by iteration) and the report gives the horizon.

python examples/pendulum_no_velocity.py --steps 8000 --out pendulum.parquet --png pendulum.png
"""

import argparse
from typing import Any

import gymnasium as gym
import numpy as np
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env

import lstm_probe
from lstm_probe import ProbeCallback


class NoVelocity(gym.Wrapper):
    """cos and sin of the angle only; the angular velocity moves to info["velocity"]."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        box = env.observation_space
        self.observation_space = gym.spaces.Box(box.low[:2], box.high[:2], dtype=np.float32)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return obs[:2], {**info, "velocity": float(obs[2])}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs[:2], float(reward), terminated, truncated, {**info, "velocity": float(obs[2])}


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8000)
parser.add_argument("--n-envs", type=int, default=4)
parser.add_argument("--n-steps", type=int, default=128)
parser.add_argument("--out", default="pendulum.parquet")
parser.add_argument("--png", default=None, help="also draw R² and the memory horizon by iteration")
args = parser.parse_args()

env = make_vec_env("Pendulum-v1", n_envs=args.n_envs, seed=0, wrapper_class=NoVelocity)
model = RecurrentPPO(
    "MlpLstmPolicy",
    env,
    n_steps=args.n_steps,
    batch_size=args.n_steps,
    n_epochs=4,
    learning_rate=1e-3,
    seed=0,
    policy_kwargs={"lstm_hidden_size": 32},
)
with ProbeCallback(args.out, force=True, memory=True, capture_obs=True, info_keys=["velocity"]) as probe:
    model.learn(args.steps, callback=probe)
print(f"wrote {probe.path}")

# R² of the hidden velocity from h (lag 0), per iteration, each module's first layer
r2 = lstm_probe.probe(args.out, "info:velocity", iterations=range(10_000))
r2 = r2[r2["layer"] == 0].pivot(index="iteration", columns="module", values="r2")
horizons = lstm_probe.summarize(args.out).to_dict()["memory"]["horizons"]
horizon = {(h["iteration"], h["module"]): h for h in horizons}


def words(h: dict[str, Any] | None) -> str:
    if h is None:
        return "-"
    return "unused" if h["unused"] else f"> {h['max_k']}" if h["beyond"] else str(h["horizon"])


print("iteration  R² velocity (actor, critic)  memory horizon (actor)")
for it, row in r2.iterrows():
    values = ", ".join(f"{row.get(m, float('nan')):.2f}" for m in r2.columns)
    print(f"{it:9d}  {values:>27}  {words(horizon.get((it, 'actor'))):>22}")

if args.png:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3), dpi=80)
    for module in r2.columns:  # below -0.5 drawn at -0.5
        left.plot(r2.index, r2[module].clip(lower=-0.5), marker="o", label=module)
    left.set(
        xlabel="iteration", ylabel="R² (held-out episodes)", title="hidden velocity read from h", ylim=(-0.55, 1.05)
    )
    left.legend()
    for module in ("actor", "critic"):
        points = [(h["iteration"], h["horizon"]) for h in horizons if h["module"] == module]
        beyond = [(h["iteration"], h["max_k"]) for h in horizons if h["module"] == module and h["beyond"]]
        if points:
            right.plot(
                *zip(*[(i, np.nan if k is None else k) for i, k in points], strict=True), marker="o", label=module
            )
        if beyond:
            right.scatter(*zip(*beyond, strict=True), marker="^", label=f"{module}: beyond")
    right.set(xlabel="iteration", ylabel="steps back", title="memory horizon")
    right.set_yscale("log", base=2)
    right.legend()
    fig.suptitle(f"Pendulum-v1 without velocity, RecurrentPPO, {args.steps} steps", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.png)
    print(f"wrote {args.png}")
