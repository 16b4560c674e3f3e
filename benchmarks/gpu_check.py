"""The probe on a GPU, in one run (prepared on CPU; run it where CUDA is): does any hook wait for the device,
and what does the probe cost at 1, 16, 256 and 1,024 envs?

1. Syncs inside hooks: a probed RecurrentPPO on CUDA, with ``torch.cuda.set_sync_debug_mode("warn")`` turned
   on only while the probe's own code runs (every forward hook of the tracer, the integration's answers
   included, and every hand-over to the writer, ``LogWriter.submit``, from hooks or callbacks), so SB3's
   own transfers (actions to numpy) are not counted ("warn" rather than "error": one run lists them all).
   Prints the synchronizing calls
   the hooks made, per phase, with the first place each comes from.
   It runs with every env traced, with ``--trace-envs 4 --other-envs none`` (the column selection), with live
   metrics, and with ``--capture summary --trace-envs 4`` (the other envs' summary rows: the device path).
2. Overhead: unprobed and probed runs (summary, full, and summary with ``--trace-envs 16 --other-envs
   none``) side by side, interleaved, on the
   torch-native Pendulum (``lstm_probe/integrations/sb3/torch_env.py``, no gymnasium loop hiding the probe),
   wall-time medians and their ratios.
3. Where per-step c of a multi-step call is cheapest: ``benchmarks/c_recovery.py`` on the GPU (host numpy
   after one copy, as the probe does, against a torch recompute on the device).
4. rsl_rl at Isaac Lab widths (``--rsl-envs``, default 1,024 and 4,096 torch-native Pendulums on the device,
   LSTM ``--rsl-hidden`` [256] in actor and critic): unprobed, and probed with ``--capture summary
   --trace-envs 16 --other-envs summary`` on the device path (``capture/ondevice.py``: the summary rows'
   c, norms and drifts computed on the GPU; ``capture/ondevice_inputs.py``: the rollout blocks' norms and
   input-state answers too, O(envs) figures crossing per block) and on the host path (``OnDevice._engage =
   "never"``: every block's and training call's states copied to the host and reduced there, as on a CPU),
   interleaved; wall medians, their
   ratios, and the probe's own training-thread seconds (the log's ``probe_cost``).

    python benchmarks/gpu_check.py                       # CUDA: every part
    python benchmarks/gpu_check.py --device cpu --steps 1024 --envs 1 16 --rsl-envs 64 --rsl-iterations 1
                                                         # a smoke run on CPU (parts 2 and 4; part 4's
                                                         # "device" path forced on the CPU)

With ``$OUT`` set, the results are also written to ``$OUT/gpu_check.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

import lstm_probe
from lstm_probe.capture.tracer import CoreTracer
from lstm_probe.integrations.sb3.torch_env import TorchPendulumVecEnv
from lstm_probe.log.logwriter import LogWriter


def model(n_envs: int, device: str, seed: int = 0) -> Any:
    from sb3_contrib import RecurrentPPO

    env = TorchPendulumVecEnv(n_envs, device=device, seed=seed, observe_velocity=False)
    return RecurrentPPO("MlpLstmPolicy", env, n_steps=128, batch_size=128 * min(n_envs, 8), seed=seed, device=device)


def syncs(device: str, n_envs: int, steps: int, **capture: Any) -> dict[str, Any]:
    """Run a probed learn() with sync warnings on inside the tracer's hooks only; count them by phase."""
    seen: collections.Counter[str] = collections.Counter()
    where: dict[str, str] = {}
    calls = collections.Counter()
    make_hook = CoreTracer._make_hook

    def patched(self: CoreTracer, name: str) -> Any:
        hook = make_hook(self, name)

        def guarded(*args: Any) -> Any:
            phase = "train" if torch.is_grad_enabled() else "rollout"  # sb3 collects rollouts under no_grad
            return patched_call(phase, lambda: hook(*args))

        return guarded

    submit = LogWriter.submit

    def guarded_submit(self: LogWriter, job: Any, nbytes: int, batch: bool = False) -> None:  # from callbacks too
        return patched_call("hand-over", lambda: submit(self, job, nbytes, batch))

    def patched_call(phase: str, fn: Any) -> Any:
        calls[phase] += 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                return fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
                for w in caught:
                    if "synchroniz" in str(w.message).lower():
                        key = f"{phase}: {str(w.message).splitlines()[0][:80]}"
                        seen[key] += 1
                        where.setdefault(key, "".join(traceback.format_stack(limit=6)[:-2]))

    CoreTracer._make_hook = patched  # type: ignore[method-assign]
    LogWriter.submit = guarded_submit  # type: ignore[method-assign]
    try:
        m = model(n_envs, device)
        with tempfile.TemporaryDirectory() as tmp:
            with lstm_probe.ProbeCallback(Path(tmp) / "sync.parquet", **capture) as probe:
                m.learn(steps, callback=probe)
    finally:
        CoreTracer._make_hook = make_hook  # type: ignore[method-assign]
        LogWriter.submit = submit  # type: ignore[method-assign]
    return {"hook_calls": dict(calls), "syncs": dict(seen), "first_seen": where}


CAPTURES: dict[str, dict[str, Any]] = {
    "summary": {"capture": "summary"},
    "full": {"capture": "full"},
    "summary, trace 16, others none": {"capture": "summary", "trace_envs": 16, "other_envs": "none"},
}


def timed(n_envs: int, device: str, steps: int, capture: str | None) -> float:
    m = model(n_envs, device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    if capture is None:
        m.learn(steps)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            options = dict(CAPTURES[capture])
            if "trace_envs" in options:  # at most the envs there are
                options["trace_envs"] = min(options["trace_envs"], n_envs)
            with lstm_probe.ProbeCallback(Path(tmp) / "run.parquet", **options) as probe:
                m.learn(steps, callback=probe)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


RSL_PATHS = ("device", "device1", "host", "none")
"""Part 4's probed runs: summary rows of every env on the device path or on the host path
(``OnDevice._engage``), or ``--other-envs none`` (the 16 traced envs only); ``device1``: the device path with
one thread encoding the writer's row groups (the others: as many as the machine gives, ``log/parts.py``)."""


def rsl_rl_timed(
    n_envs: int, device: str, iterations: int, hidden: int, path: str | None
) -> tuple[float, dict[str, float]]:
    """One rsl_rl run (part 4): wall seconds and the log's ``probe_cost`` (the probe's own seconds on the
    training thread, the writer process's CPU and busy seconds, the training thread's waits for it); ``path``:
    None unprobed, else one of :data:`RSL_PATHS`."""
    from lstm_probe.capture.ondevice import OnDevice
    from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg
    from lstm_probe.integrations.rsl_rl.train import build_runner

    torch.manual_seed(0)
    env = TorchPendulumVecEnv(n_envs, seed=0, device=device)
    runner = build_runner(env, train_cfg(learning_rate=1e-3, rnn_type="lstm", rnn_layers=1, hidden_size=hidden))
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    cost: dict[str, float] = {}
    if path is None:
        runner.learn(iterations)
    else:
        engage = OnDevice._engage
        OnDevice._engage = "never" if path == "host" else "always"
        others = "none" if path == "none" else "summary"
        threads = 1 if path == "device1" else 0  # 0: the writer's own choice
        try:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "run.parquet"
                kw = {"writer_threads": threads, "force": True}
                with attach(runner, out, capture="summary", trace_envs=16, other_envs=others, **kw):
                    runner.learn(iterations)
                info = lstm_probe.read_info(out)
                raw = info.metadata.get("probe_cost", {})
                cost = {k: float(v) for k, v in raw.items() if isinstance(v, int | float)}
                cost["probe_s"] = cost.get("hook_seconds", 0.0) + cost.get("integration_seconds", 0.0)
                cost["rows"] = float(info.rows)
        finally:
            OnDevice._engage = engage
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, cost


def rsl_rl_paths(
    device: str,
    envs: list[int],
    iterations: int,
    hidden: int,
    repeats: int,
    budget: Any = None,
    paths: tuple[str, ...] = ("device", "host"),
) -> list[dict[str, Any]]:
    """Part 4: rsl_rl unprobed, and probed on each of ``paths`` (:data:`RSL_PATHS`), interleaved."""
    rows: list[dict[str, Any]] = []
    for n in envs:
        if budget is not None and rows and budget.left() < rows[-1]["spent_s"] * n / rows[-1]["envs"] / 2:
            rows.append({"envs": n, "skipped": f"{budget.left():.0f} s of the budget left"})
            continue
        start = time.perf_counter()
        rsl_rl_timed(n, device, 1, hidden, None)  # warm-up: kernels, imports
        walls: dict[str, list[float]] = {"unprobed": [], **{p: [] for p in paths}}
        costs: dict[str, list[dict[str, float]]] = {p: [] for p in paths}
        for _ in range(repeats):
            for label in walls:
                wall, cost = rsl_rl_timed(n, device, iterations, hidden, None if label == "unprobed" else label)
                walls[label].append(wall)
                if label in costs:
                    costs[label].append(cost)
        base = statistics.median(walls["unprobed"])
        row: dict[str, Any] = {"envs": n, "iterations": iterations, "hidden": hidden, "unprobed_s": base}
        row["walls"], row["costs"] = walls, costs
        said = []
        for label in paths:
            row[f"{label}_s"] = statistics.median(walls[label])
            row[f"{label} ratio"] = row[f"{label}_s"] / base
            for key in ("probe_s", "wait_seconds", "writer_cpu_seconds", "writer_busy_seconds"):
                row[f"{label} {key}"] = statistics.median(c.get(key, float("nan")) for c in costs[label])
            said.append(
                f"{label} {row[f'{label} ratio']:.2f}x (probe {row[f'{label} probe_s']:.2f} s, waits "
                f"{row[f'{label} wait_seconds']:.2f} s, writer CPU {row[f'{label} writer_cpu_seconds']:.2f} s)"
            )
        row["spent_s"] = time.perf_counter() - start
        rows.append(row)
        print(
            f"rsl_rl {n:5d} envs, LSTM {hidden}, {iterations} iterations: unprobed {base:6.2f} s; " + "; ".join(said),
            flush=True,
        )
        if budget is not None:
            budget.results["rsl_rl_summary_paths"] = rows
            budget.save()
    return rows


class Budget:
    """Wall seconds left for the whole check: a device lease is short, so each part runs in priority order and
    the results so far are written after every step (``$OUT/gpu_check.json``); a part that would start past
    the budget is skipped and says so."""

    def __init__(self, seconds: float, results: dict[str, Any]) -> None:
        self.end = time.perf_counter() + seconds
        self.results = results

    def left(self) -> float:
        return self.end - time.perf_counter()

    def save(self) -> None:
        out = os.environ.get("OUT")
        if out:
            Path(out, "gpu_check.json").write_text(json.dumps(self.results, indent=2, default=str))

    def part(self, name: str, fn: Any, need: float = 0.0) -> None:
        if self.left() < need:
            self.results[name] = f"skipped: {self.left():.0f} s of the budget left, {need:.0f} s needed"
            print(f"{name}: {self.results[name]}", flush=True)
            self.save()
            return
        start = time.perf_counter()
        try:
            self.results[name] = fn()
        except Exception:  # a broken part must not cost the others their turn
            self.results[name] = "failed: " + traceback.format_exc()[-3000:]
            print(f"{name}: {self.results[name]}", flush=True)
        print(f"[{name}: {time.perf_counter() - start:.1f} s; {self.left():.0f} s of the budget left]", flush=True)
        self.save()


def sync_part(device: str) -> dict[str, Any]:
    """Part 1: synchronizing calls inside the probe's hooks and hand-overs, four capture settings."""
    found_all: dict[str, Any] = {}
    for label, capture in (
        ("sync", {}),
        ("sync_other_envs_none", {"trace_envs": 4, "other_envs": "none"}),
        # live metrics on: they read the tracer's messages and wait only where figures are recorded
        # (LogWriter.drain, twice an iteration, outside the hooks counted here)
        ("sync_live_metrics", {"live_metrics": True}),
        # summary rows of the other envs: the training calls on the device path (capture/ondevice.py)
        ("sync_summary_device_path", {"capture": "summary", "trace_envs": 4}),
    ):
        found_all[label] = found = syncs(device, 16, 16 * 128 * 2, **capture)
        print(f"{label}: hook calls and hand-overs: {found['hook_calls']}")
        for key, n in sorted(found["syncs"].items(), key=lambda kv: -kv[1]):
            print(f"  {n:6d} x {key}\n{found['first_seen'][key]}")
        if not found["syncs"]:
            print("  no synchronizing call inside a hook or a hand-over")
    return found_all


def overhead_part(device: str, envs: list[int], steps: int | None, updates: int, repeats: int, budget: Budget):
    """Part 2: unprobed and probed RecurrentPPO runs side by side, per width, while the budget lasts."""
    rows: list[dict[str, Any]] = []
    for n in envs:
        if rows and "spent_s" in rows[-1] and budget.left() < rows[-1]["spent_s"] * n / rows[-1]["envs"] / 2:
            rows.append({"envs": n, "skipped": f"{budget.left():.0f} s of the budget left"})
            continue
        start = time.perf_counter()
        n_steps = steps or n * 128 * updates
        times: dict[str, list[float]] = {"none": [], **{label: [] for label in CAPTURES}}
        timed(n, device, n * 128, None)  # warm-up: CUDA context, kernels, imports
        for _ in range(repeats):
            for label in times:
                times[label].append(timed(n, device, n_steps, None if label == "none" else label))
        base = statistics.median(times["none"])
        row: dict[str, Any] = {"envs": n, "steps": n_steps, "base_s": base, "times": times}
        row["spent_s"] = time.perf_counter() - start
        for label in CAPTURES:
            row[f"{label} ratio"] = statistics.median(times[label]) / base
        rows.append(row)
        ratios = ", ".join(f"{label} {row[f'{label} ratio']:.3f}x" for label in CAPTURES)
        print(f"{n:5d} envs, {n_steps:7d} steps: unprobed {base:7.2f} s, {ratios}", flush=True)
        budget.results["overhead"] = rows
        budget.save()
    return rows


def c_recovery_part(device: str) -> str:
    """Part 3: where per-step c is cheapest: on the device, or on the host as now."""
    import subprocess

    here = Path(__file__).with_name("c_recovery.py")
    done = subprocess.run([sys.executable, str(here), "--device", device], capture_output=True, text=True)
    print(done.stdout + done.stderr[-2000:], flush=True)
    return done.stdout + done.stderr[-2000:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--envs", type=int, nargs="*", default=[1, 16, 256, 1024], help="part 2's widths (none: skip it)")
    ap.add_argument("--steps", type=int, default=None, help="env steps per run [envs x 128 x --updates]")
    ap.add_argument("--updates", type=int, default=8, help="part 2's PPO updates per run")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rsl-envs", type=int, nargs="*", default=[1024, 4096], help="part 4's widths (none: skip it)")
    ap.add_argument("--rsl-iterations", type=int, default=5)
    ap.add_argument("--rsl-hidden", type=int, default=256)
    ap.add_argument(
        "--rsl-paths", nargs="+", default=["device", "host"], choices=RSL_PATHS, help="part 4's probed runs"
    )
    ap.add_argument("--parts", default="1432", help="which parts, in which order [1432: syncs, rsl_rl, c, sb3]")
    ap.add_argument("--budget", type=float, default=1e9, help="wall seconds for everything; later parts are skipped")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA here: pass --device cpu for a smoke run")
    results: dict[str, Any] = {"device": args.device, "torch": torch.__version__, "cpus": os.cpu_count()}
    if args.device.startswith("cuda"):
        results["gpu"] = torch.cuda.get_device_name()
    budget = Budget(args.budget, results)
    for part in args.parts:
        if part == "1" and args.device.startswith("cuda"):
            budget.part("syncs", lambda: sync_part(args.device), need=30)
        elif part == "4" and args.rsl_envs:
            budget.part(
                "rsl_rl_summary_paths",
                lambda: rsl_rl_paths(
                    args.device,
                    args.rsl_envs,
                    args.rsl_iterations,
                    args.rsl_hidden,
                    args.repeats,
                    budget,
                    tuple(args.rsl_paths),
                ),
                need=30,
            )
        elif part == "3" and args.device.startswith("cuda"):
            budget.part("c_recovery", lambda: c_recovery_part(args.device), need=20)
        elif part == "2" and args.envs:
            budget.part(
                "overhead",
                lambda: overhead_part(args.device, args.envs, args.steps, args.updates, args.repeats, budget),
                need=20,
            )


if __name__ == "__main__":
    main()
