"""What the probe costs an rsl_rl run at Isaac Lab widths: OnPolicyRunner PPO on 1,024 torch-native Pendulums
(no velocity; LSTM 64, actor and critic), unprobed and probed (summary capture, vectors of --trace-envs 16;
the other envs' columns as summary rows, --other-envs summary, or never off the device, none; both: each)
side by side in one process, alternating. Total CPU counts this process and its finished children (the
writer process). Usage: python benchmarks/rsl_rl_overhead.py [--envs 1024] [--iterations 5] [--reps 2]
[--other-envs summary|none|both] [--writer process|thread] [--before DIR] [--profile FILE]

``--before DIR``: also the probed runs with another checkout's lstm_probe (e.g. a `git worktree` of an earlier
commit), interleaved (unprobed, before, this checkout); every run then in a fresh process of its own (after a
one-iteration warm-up there). ``--profile FILE``: one probed run under cProfile (CPU time, this process only:
not the writer process), its stats written to FILE and the probe's share printed; no comparison."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg
from lstm_probe.integrations.rsl_rl.train import build_runner


def cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


Run = tuple[float, float, int, float, float]
"""One run: wall and total CPU seconds, the log's bytes, the probe's own seconds on the training thread (its
hooks and callbacks, the log's ``probe_cost``) and the writer process's CPU seconds (0, 0 unprobed)."""


WRITER = ["process"]
"""``--writer``: where the probed runs' rows are made and written (process: a writer process; thread: a thread of
the training process, which takes the summary rows' arithmetic off the training thread where a core is free)."""


def once(envs: int, iterations: int, out: str | None, other_envs: str = "summary") -> Run:
    torch.manual_seed(0)
    env = TorchPendulumVecEnv(envs, seed=0)
    cfg = train_cfg(learning_rate=1e-3, rnn_type="lstm", rnn_layers=1, hidden_size=64)
    runner = build_runner(env, cfg)
    w, c = time.perf_counter(), cpu()
    if out is None:
        runner.learn(iterations)
        size = 0
    else:
        with attach(runner, out, capture="summary", trace_envs=16, other_envs=other_envs, writer=WRITER[0], force=True):
            runner.learn(iterations)
        size = os.path.getsize(out)
    wall, total = time.perf_counter() - w, cpu() - c
    if out is None:
        return wall, total, 0, 0.0, 0.0
    import lstm_probe

    cost = lstm_probe.read_info(out).metadata.get("probe_cost", {})
    own = cost.get("hook_seconds", 0.0) + cost.get("integration_seconds", 0.0)
    return wall, total, size, own, cost.get("writer_cpu_seconds", 0.0)


def child(checkout: str | None, envs: int, iterations: int, other: str | None) -> Run:
    """One run in a fresh process (``checkout``'s lstm_probe first on its path; None: this one), after a warm-up."""
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join([checkout, env.get("PYTHONPATH", "")])
    args = [sys.executable, __file__, "--envs", str(envs), "--iterations", str(iterations)]
    args += ["--writer", WRITER[0], "--one", other or "unprobed"]
    done = subprocess.run(args, env=env, check=True, capture_output=True, text=True)
    wall, total, size, own, writer = json.loads(done.stdout.strip().splitlines()[-1])
    return wall, total, size, own, writer


def one(envs: int, iterations: int, other: str) -> None:
    """``--one``: a warm-up, then one measured run; prints [wall, cpu, log bytes] as JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        once(envs, 1, None)
        out = None if other == "unprobed" else os.path.join(tmp, "run.parquet")
        print(json.dumps(once(envs, iterations, out, other)))


def profile(envs: int, iterations: int, other: str, path: str) -> None:
    """``--profile``: one probed run under cProfile, CPU time of this process (the writer process's not counted)."""
    import cProfile
    import pstats

    with tempfile.TemporaryDirectory() as tmp:
        once(envs, 1, None)
        prof = cProfile.Profile(time.process_time)
        prof.enable()
        wall, total, *_ = once(envs, iterations, os.path.join(tmp, "run.parquet"), other)
        prof.disable()
    prof.dump_stats(path)
    stats = pstats.Stats(prof)
    print(f"probed ({other}): wall {wall:.2f} s, cpu {total:.2f} s (writer process included); profile: {path}")
    stats.sort_stats("cumulative").print_stats("lstm_probe", 25)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", type=int, default=1024)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--other-envs", choices=("summary", "none", "both"), default="both")
    ap.add_argument("--before", metavar="DIR", help="also the probed runs with DIR's lstm_probe, interleaved")
    ap.add_argument("--profile", metavar="FILE", help="one probed run (--other-envs, not both) under cProfile")
    ap.add_argument("--writer", choices=("process", "thread"), default="process", help="the probed runs' writer")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    WRITER[0] = a.writer
    torch.set_num_threads(1)
    if a.one:
        one(a.envs, a.iterations, a.one)
        return
    if a.profile:
        profile(a.envs, a.iterations, "summary" if a.other_envs == "both" else a.other_envs, a.profile)
        return
    others = ("summary", "none") if a.other_envs == "both" else (a.other_envs,)
    if a.before:
        compare(a.envs, a.iterations, a.reps, others, a.before)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.parquet")
        once(a.envs, 1, None)  # warm-up
        rows: dict[str, list[Run]] = {"unprobed": []}
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
    print(
        f"({a.envs} envs, {a.iterations} iterations of 24 steps, the faster of {a.reps} runs each, writer {a.writer})"
    )


def _median(runs: list[Run], i: int) -> float:
    return sorted(r[i] for r in runs)[len(runs) // 2]


def compare(envs: int, iterations: int, reps: int, others: tuple[str, ...], before: str) -> None:
    """Unprobed, then each probed configuration with ``before``'s code and this checkout's, each run a process."""
    names = ["unprobed"] + [f"{who} {o}" for o in others for who in ("before", "after")]
    rows: dict[str, list[Run]] = {n: [] for n in names}
    for _ in range(reps):
        rows["unprobed"].append(child(None, envs, iterations, None))
        for o in others:
            rows[f"before {o}"].append(child(before, envs, iterations, o))
            rows[f"after {o}"].append(child(None, envs, iterations, o))
    u = rows["unprobed"]
    u_wall, u_cpu = min(r[0] for r in u), min(r[1] for r in u)
    for name, runs in rows.items():
        wall, total = min(r[0] for r in runs), min(r[1] for r in runs)
        med_cpu = sorted(r[1] for r in runs)[len(runs) // 2]
        ratio = "" if runs is u else f"  wall x{wall / u_wall:.2f}, cpu x{total / u_cpu:.2f}"
        own = "" if runs is u else f"  probe {_median(runs, 3):.2f} s + writer {_median(runs, 4):.2f} s"
        print(f"{name:16s} wall {wall:6.2f} s  cpu {total:6.2f} s (median {med_cpu:.2f}){own}{ratio}")
    print(f"({envs} envs, {iterations} iterations of 24 steps, the faster of {reps} runs each, one process a run;")
    print(" probe: its own seconds on the training thread, writer: the writer process's CPU, medians)")


if __name__ == "__main__":
    main()
