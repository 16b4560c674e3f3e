"""What the probe costs an rsl_rl run at Isaac Lab widths: OnPolicyRunner PPO on 1,024 torch-native Pendulums
(no velocity; LSTM 64, actor and critic), unprobed and probed (summary capture, vectors of --trace-envs 16;
the other envs' columns as summary rows, --other-envs summary, or never off the device, none; both: each)
side by side in one process, alternating. Total CPU counts this process and its finished children (the
writer process). Usage: python benchmarks/rsl_rl_overhead.py [--envs 1024] [--iterations 5] [--reps 2]
[--other-envs summary|none|both]"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg
from lstm_probe.integrations.rsl_rl.train import build_runner


def cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def once(envs: int, iterations: int, out: str | None, other_envs: str = "summary") -> tuple[float, float, int]:
    torch.manual_seed(0)
    env = TorchPendulumVecEnv(envs, seed=0)
    cfg = train_cfg(learning_rate=1e-3, rnn_type="lstm", rnn_layers=1, hidden_size=64)
    runner = build_runner(env, cfg)
    w, c = time.perf_counter(), cpu()
    if out is None:
        runner.learn(iterations)
        size = 0
    else:
        with attach(runner, out, capture="summary", trace_envs=16, other_envs=other_envs, force=True):
            runner.learn(iterations)
        size = os.path.getsize(out)
    return time.perf_counter() - w, cpu() - c, size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", type=int, default=1024)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--other-envs", choices=("summary", "none", "both"), default="both")
    a = ap.parse_args()
    torch.set_num_threads(1)
    others = ("summary", "none") if a.other_envs == "both" else (a.other_envs,)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.parquet")
        once(a.envs, 1, None)  # warm-up
        rows: dict[str, list[tuple[float, float, int]]] = {"unprobed": []}
        rows.update({f"probed, other envs {o}": [] for o in others})
        for _ in range(a.reps):
            rows["unprobed"].append(once(a.envs, a.iterations, None))
            for o in others:
                rows[f"probed, other envs {o}"].append(once(a.envs, a.iterations, out, o))
    steps = a.envs * 24 * a.iterations
    u = rows["unprobed"]
    u_wall, u_cpu = min(r[0] for r in u), min(r[1] for r in u)
    for name, runs in rows.items():
        wall = min(r[0] for r in runs)
        total = min(r[1] for r in runs)
        rate = f"{steps / wall:,.0f} env steps/s"
        ratio = "" if runs is u else f"  wall x{wall / u_wall:.2f}, cpu x{total / u_cpu:.2f}"
        print(f"{name:27s} wall {wall:6.2f} s  cpu {total:6.2f} s  ({rate})  log {runs[-1][2]:,} B{ratio}")
    print(f"({a.envs} envs, {a.iterations} iterations of 24 steps, the faster of {a.reps} runs each)")


if __name__ == "__main__":
    main()
