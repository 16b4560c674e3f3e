"""The probe's training-thread cost with sb3's per-step training loops recorded whole, side by side with
call by call (issue #28 item 3).

The same probed RecurrentPPO run twice per repeat, interleaved (A B A B ...): once with each per-step loop
recorded as one block (the default), once call by call (``ProbeCallback._loop_blocks = False``, the path
before). ``--before DIR`` adds a third variant: the same run on another checkout of lstm-probe (put first
on PYTHONPATH), e.g. a ``git worktree`` of an older commit. Per configuration it prints medians and
min-max spreads of the probe's own time on the training thread (the log's ``probe_cost.hook_seconds`` +
``integration_seconds``) and of the training process's CPU seconds (``time.process_time``; the writer
process is not counted here, see benchmarks/overhead.py for total CPU). ``--variants`` picks the runs
(ratios are to the first one named). ``--phases`` prints instead where that time goes: the training
thread's CPU per phase of the probe (rollout-step hooks and callbacks, per-step loop hooks, stacking, the
hand-over's host copies, init answers, pickling and pipe, live metrics), per run and per call.

    python benchmarks/hook_calls.py --steps 2048 --n-envs 1 8 --capture summary full --repeats 3
    python benchmarks/hook_calls.py --per-call --repeats 5   # the hook alone, per loop step
    python benchmarks/hook_calls.py --steps 2048 --capture summary --variants before loops --before DIR
    python benchmarks/hook_calls.py --phases --steps 2048 --capture summary --variants before loops --before DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
cfg = json.loads(sys.argv[1])
import torch
torch.set_num_threads(1)
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env
from lstm_probe import ProbeCallback, read_info
env = make_vec_env(cfg["env"], n_envs=cfg["n_envs"], seed=0)
model = RecurrentPPO("MlpLstmPolicy", env, seed=0)
cb = ProbeCallback(cfg["out"], capture=cfg["capture"], force=True)
if cfg["variant"] == "calls":
    cb._loop_blocks = False
cpu0, wall0 = time.process_time(), time.perf_counter()
model.learn(cfg["steps"], callback=cb)
cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
meta = read_info(cb.path).metadata
cost, paths = meta["probe_cost"], meta.get("minibatch_paths", {})
print(json.dumps({
    "probe": cost["hook_seconds"] + cost["integration_seconds"], "cpu": cpu, "wall": wall, "calls": cost["calls"],
    "stepwise": paths.get("stepwise", {}).get("minibatches", 0),
    "minibatches": sum(p["minibatches"] for p in paths.values()),
}))
"""

PER_CALL = r"""
import json, sys, time
import numpy as np, torch
from torch import nn
from lstm_probe.contract import Capabilities, Grid, Tags
from lstm_probe.options import capture_options
from lstm_probe.capture.tracer import CoreTracer
torch.set_num_threads(1)
cfg = json.loads(sys.argv[1])
hidden, n, steps = cfg["hidden"], cfg["batch"], 128
lstm = nn.LSTM(3, hidden)

class Fixed:  # an integration whose every call is the next step of one per-step training loop
    name = "bench"
    def capabilities(self): return Capabilities("bench")
    def metadata(self): return {}
    tags = Tags()
    def resolve(self, name, steps_, batch): return self.tags

zero = np.zeros((n, steps), np.int64)
grid = Grid(env=zero.astype(np.int32), env_step=zero, episode=zero, episode_step=zero,
            episode_start=zero.astype(np.int8), padding=zero.astype(bool), train=True,
            seq_len=np.full(n, steps, np.int32), seq_reason=np.zeros(n, np.int8))
fixed = Fixed()
tracer = CoreTracer({"actor": lstm}, capture_options(None, cfg["out"], capture="summary", force=True), fixed).start()
tracer.writer.submit = lambda *a, **k: None  # hand-overs are neither made nor timed: the hook alone is
hook = tracer._make_hook("actor")
x, h = torch.randn(1, n, 3), torch.zeros(1, n, hidden)
with torch.no_grad():
    out = lstm(x, (h, h))  # (through the tracer's hook too: one untagged call)
args = (x, (h, h))
whole = cfg["variant"] == "loops"

def block():  # one minibatch's loop of `steps` steps: new tags, then every step's hook
    fixed.tags = Tags("train", 0, 0, 0, grid=grid, path="stepwise")
    loop = tracer.loop_begin(lstm, n) if whole else None
    for _ in range(steps):
        hook(lstm, args, out)
    if loop is not None:
        tracer.loop_end(loop)  # its torch.stack is timed here (call by call: in the hand-over, not timed)
    else:
        tracer.flush_pending()

block()
blocks = 150
cpu = time.process_time()
for _ in range(blocks):
    block()
cpu = time.process_time() - cpu
print(json.dumps({"us": cpu / blocks / steps * 1e6}))
tracer.close()
"""


PHASES = r"""
import collections, json, sys, time
cfg = json.loads(sys.argv[1])
import torch
torch.set_num_threads(1)
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env
from lstm_probe import ProbeCallback, read_info
from lstm_probe.capture import inputs
from lstm_probe.log import logwriter
from lstm_probe.capture import tracer
from lstm_probe.integrations.sb3 import callback, metrics

clock = time.thread_time  # the training thread's CPU time (the writer process is not counted)
spent = collections.defaultdict(float)  # phase -> CPU seconds, exclusive of the phases nested inside
count = collections.Counter()
stack = [0.0]  # per open phase: the CPU time its nested phases took
probe = []

def timed(phase, fn):
    def run(*args, **kwargs):
        name = phase(args) if callable(phase) else phase
        stack.append(0.0)
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            took = clock() - start
            spent[name] += took - stack.pop()
            stack[-1] += took
            count[name] += 1
    return run

def lstm_phase(args):
    p = probe[0]
    if p.tracer is not None and p.tracer._loop is not None:
        return "train: loop step, LSTM hook"
    if p.entry == "bootstrap":
        return "bootstrap: LSTM hook (job inline)"
    if p.in_rollout:
        return "rollout step: LSTM hooks"
    return "train: LSTM hook of a sequence call (job inline)"

def metrics_phase(args):
    return "rollout step: live-metrics hooks" if probe[0].in_rollout else "train: live-metrics hooks"

for owner, name, phase in [
    (callback.ProbeCallback, "_rollout_step_begin", "rollout step: callbacks"),
    (callback.ProbeCallback, "_rollout_step_end", "rollout step: callbacks"),
    (callback.ProbeCallback, "_on_step", "rollout step: callbacks"),
    (callback.ProbeCallback, "_train_tags", "train: minibatch tags"),
    (tracer.CoreTracer, "flush_pending", "hand-over: rollout blocks (host copies, grids)"),
    (tracer.CoreTracer, "loop_begin", "train: loop begin/end (stack)"),
    (tracer.CoreTracer, "loop_end", "train: loop begin/end (stack)"),
    (tracer.CoreTracer, "_write_block", "hand-over: jobs (host copies, grids)"),
    (inputs.Inputs, "answer", "hand-over: init answers (inputs.py)"),
    (logwriter.LogWriter, "_to_sink", "hand-over: pickle + pipe"),
    (tracer.CoreTracer, "batch_jobs", "train: batched jobs' second halves"),
    (metrics.LiveMetrics, "_minibatch_end", "live metrics: figures"),  # before: hooks of their own
    (metrics.LiveMetrics, "observe", "live metrics: figures"),  # now: the tracer's messages
    (metrics.LiveMetrics, "_rollout_end", "live metrics: figures"),
    (metrics.LiveMetrics, "_train_end", "live metrics: figures"),
]:
    if hasattr(owner, name):  # the --before checkout may lack a newer name, or the other way round
        setattr(owner, name, timed(phase, getattr(owner, name)))
make_hook = tracer.CoreTracer._make_hook
tracer.CoreTracer._make_hook = lambda self, name: timed(lstm_phase, make_hook(self, name))
if hasattr(metrics.LiveMetrics, "_hook"):  # live metrics' own hooks (the --before checkout)
    metrics_hook = metrics.LiveMetrics._hook
    metrics.LiveMetrics._hook = lambda self, name: timed(metrics_phase, metrics_hook(self, name))

env = make_vec_env(cfg["env"], n_envs=cfg["n_envs"], seed=0)
model = RecurrentPPO("MlpLstmPolicy", env, seed=0)
cb = ProbeCallback(cfg["out"], capture=cfg["capture"], force=True)
probe.append(cb)
model.learn(cfg["steps"], callback=cb)
print(json.dumps({"spent": spent, "count": count}))
"""

VARIANTS = {"loops": "recorded whole (now)", "calls": "call by call", "before": "the --before checkout"}


def one(cfg: dict, before: str | None, script: str = CHILD) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cwd = None
    if cfg["variant"] == "before":
        assert before is not None
        env["PYTHONPATH"] = before + os.pathsep + env.get("PYTHONPATH", "")
        cwd = before  # `python -c` puts its working directory first on sys.path: a checkout there would win
        cfg = {**cfg, "variant": "loops"}  # an older checkout has no switch: it runs its own path
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(cfg)], env=env, capture_output=True, text=True, cwd=cwd
    )
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def per_call(repeats: int, hidden: int, batch: int, tmp: str) -> None:
    """The hook's own CPU time per step of a per-step loop (128 steps a block; the hand-over of the kept
    steps apart), call by call (sb3's path before: tags asked, states copied per call) against recorded
    whole (the block's one torch.stack included)."""
    got: dict[str, list[float]] = {"calls": [], "loops": []}
    for r in range(repeats):
        for v in ("calls", "loops") if r % 2 == 0 else ("loops", "calls"):
            cfg = {"variant": v, "hidden": hidden, "batch": batch, "out": os.path.join(tmp, f"{v}.parquet")}
            out = subprocess.run([sys.executable, "-c", PER_CALL, json.dumps(cfg)], capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(out.stderr[-3000:])
            got[v].append(json.loads(out.stdout.strip().splitlines()[-1])["us"])
    print(
        f"hook CPU per loop step, hidden {hidden}, {batch} sequences, {repeats} interleaved repeats: median (min-max)"
    )
    for v, us in got.items():
        print(f"{VARIANTS[v]:>22} {statistics.median(us):6.2f} us ({min(us):.2f}-{max(us):.2f})")


def phases(args: argparse.Namespace, variants: list[str], tmp: str) -> None:
    """The training thread's CPU time per phase (exclusive of the phases nested inside it), per run and per
    call, for each variant: where the probe's time goes. The phases' own timers add ~1 us a call."""
    for n_envs in args.n_envs:
        for capture in args.capture:
            got: dict[str, list[dict]] = {v: [] for v in variants}
            for r in range(args.repeats):
                for v in variants if r % 2 == 0 else variants[::-1]:
                    cfg = {"env": args.env, "n_envs": n_envs, "steps": args.steps, "capture": capture}
                    cfg.update(variant=v, out=os.path.join(tmp, f"{v}.parquet"))
                    got[v].append(one(cfg, args.before, PHASES))
            print(f"\n{n_envs} env(s), {capture}: training-thread CPU per phase, median of {args.repeats} (min-max)")
            names = sorted({k for runs in got.values() for run in runs for k in run["spent"]})
            print(f"{'phase':>52} " + " ".join(f"{VARIANTS[v]:>34}" for v in variants))
            for name in [*names, "all"]:
                cells = []
                for v in variants:
                    if name == "all":
                        ms = [1e3 * sum(run["spent"].values()) for run in got[v]]
                        calls = 0
                    else:
                        ms = [1e3 * run["spent"].get(name, 0.0) for run in got[v]]
                        calls = got[v][0]["count"].get(name, 0)
                    per = f" {1e3 * statistics.median(ms) / calls:7.1f} us x{calls}" if calls else ""
                    cells.append(f"{statistics.median(ms):7.1f} ms ({min(ms):.0f}-{max(ms):.0f}){per}")
                print(f"{name:>52} " + " ".join(f"{c:>34}" for c in cells), flush=True)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="Pendulum-v1")
    ap.add_argument("--steps", type=int, default=2048)
    ap.add_argument("--n-envs", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--capture", nargs="+", default=["summary", "full"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", help="another lstm-probe checkout to run as a third variant")
    ap.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        help="the variants to run (default: calls and loops, and before with --before); ratios are to the first",
    )
    ap.add_argument("--phases", action="store_true", help="the training thread's CPU per phase of the probe")
    ap.add_argument("--per-call", action="store_true", help="time the hook alone per loop step (no training)")
    ap.add_argument("--hidden", type=int, default=256, help="with --per-call: the LSTM's hidden size")
    ap.add_argument("--batch", type=int, default=4, help="with --per-call: sequences per minibatch")
    args = ap.parse_args()
    if args.per_call:
        with tempfile.TemporaryDirectory() as tmp:
            per_call(args.repeats, args.hidden, args.batch, tmp)
        return
    variants = args.variants or ["calls", "loops"] + (["before"] if args.before else [])
    if "before" in variants and not args.before:
        raise SystemExit("--variants before needs --before DIR")
    if args.phases:
        with tempfile.TemporaryDirectory() as tmp:
            phases(args, [v for v in variants if v != "calls"] or variants, tmp)
        return
    print(f"{args.env}, {args.steps} steps, one torch thread, {args.repeats} interleaved repeats; medians (min-max)")
    print("probe s: hook_seconds + integration_seconds (training thread); cpu s: training process")
    header = f"{'n_envs':>6} {'capture':>8} {'variant':>22} {'calls':>7} {'stepwise mb':>11} {'probe s':>22}"
    print(header + f" {'cpu s':>22} {'probe ratio':>11} {'cpu ratio':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for n_envs in args.n_envs:
            for capture in args.capture:
                runs: dict[str, list[dict]] = {v: [] for v in variants}
                for r in range(args.repeats):
                    order = variants if r % 2 == 0 else variants[::-1]
                    for v in order:
                        cfg = {"env": args.env, "n_envs": n_envs, "steps": args.steps, "capture": capture}
                        cfg.update(variant=v, out=os.path.join(tmp, f"{v}.parquet"))
                        runs[v].append(one(cfg, args.before))
                base = runs[variants[0]]
                for v in variants:
                    got = runs[v]
                    probe, cpu = [x["probe"] for x in got], [x["cpu"] for x in got]
                    # ratios per repeat (the runs of one repeat ran next to each other), then their median
                    pr = [g["probe"] / b["probe"] for g, b in zip(got, base, strict=True)]
                    cr = [g["cpu"] / b["cpu"] for g, b in zip(got, base, strict=True)]
                    row = f"{n_envs:>6} {capture:>8} {VARIANTS[v]:>22} {got[0]['calls']:>7} "
                    row += (
                        f"{got[0]['stepwise']:>4} of {got[0]['minibatches']:<4} {spread(probe):>22} {spread(cpu):>22} "
                    )
                    print(row + f"{statistics.median(pr):>11.3f} {statistics.median(cr):>9.3f}", flush=True)


if __name__ == "__main__":
    main()
