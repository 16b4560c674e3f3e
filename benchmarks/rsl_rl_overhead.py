"""What the probe costs an rsl_rl run at Isaac Lab widths: OnPolicyRunner PPO on 1,024 torch-native Pendulums
(no velocity; LSTM 64, actor and critic), unprobed and probed (summary capture, vectors of --trace-envs 16)
side by side in one process, alternating. Total CPU counts this process and its finished children (the
writer process). Usage: python benchmarks/rsl_rl_overhead.py [--envs 1024] [--iterations 5] [--reps 2]"""

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


def once(envs: int, iterations: int, out: str | None) -> tuple[float, float, int]:
    torch.manual_seed(0)
    env = TorchPendulumVecEnv(envs, seed=0)
    cfg = train_cfg(learning_rate=1e-3, rnn_type="lstm", rnn_layers=1, hidden_size=64)
    runner = build_runner(env, cfg)
    w, c = time.perf_counter(), cpu()
    if out is None:
        runner.learn(iterations)
        size = 0
    else:
        with attach(runner, out, capture="summary", trace_envs=16, force=True):
            runner.learn(iterations)
        size = os.path.getsize(out)
    return time.perf_counter() - w, cpu() - c, size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", type=int, default=1024)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.parquet")
        once(a.envs, 1, None)  # warm-up
        rows: dict[str, list[tuple[float, float, int]]] = {"unprobed": [], "probed": []}
        for _ in range(a.reps):
            rows["unprobed"].append(once(a.envs, a.iterations, None))
            rows["probed"].append(once(a.envs, a.iterations, out))
    steps = a.envs * 24 * a.iterations
    for name, runs in rows.items():
        wall = min(r[0] for r in runs)
        total = min(r[1] for r in runs)
        rate = f"{steps / wall:,.0f} env steps/s"
        print(f"{name:9s} wall {wall:6.2f} s  cpu {total:6.2f} s  ({rate})  log {runs[-1][2]:,} B")
    u, p = rows["unprobed"], rows["probed"]
    wall = min(r[0] for r in p) / min(r[0] for r in u)
    total = min(r[1] for r in p) / min(r[1] for r in u)
    print(f"probed/unprobed: wall x{wall:.2f}, cpu x{total:.2f} ({a.envs} envs, {a.iterations} iterations of 24 steps)")


if __name__ == "__main__":
    main()
