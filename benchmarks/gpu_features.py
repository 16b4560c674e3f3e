"""Every capability once on a GPU, every warning kept (prepared on CPU; run it where CUDA is).

1. sb3 through the CLI, as a user runs it: ``run --device cuda`` with what-if, memory and observations, one
   and two LSTM layers (the two-layer run recovers the lower layer's per-step c on the device), a summary
   run with traced envs (the device path), then ``report --json`` of each. Any stderr line that is not a
   progress line is printed: a warning the user would see is a finding.
2. rsl_rl in this process on a torch-native env on the device (``attach`` with what-if, memory and
   observations; a summary run on the device path), with every warning recorded, then ``report --json``.
3. Where the probe's own time goes at Isaac Lab width: cProfile of the training thread, rsl_rl at
   ``--profile-envs`` [4,096] envs, summary rows of every env on the device path; the top functions by
   their own time and by cumulative time.

    python benchmarks/gpu_features.py                 # CUDA
    python benchmarks/gpu_features.py --device cpu    # a smoke run on CPU

Writes the reports, the profile and ``features.json`` under ``$OUT`` when it is set.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lstm_probe", *args], capture_output=True, text=True, timeout=300)


def noise(stderr: str) -> list[str]:
    """stderr lines a user would read as something wrong (progress lines left out)."""
    return [line for line in stderr.splitlines() if line.strip() and "steps" not in line and "%" not in line]


def report(path: Path, out: Path | None, name: str) -> dict[str, Any]:
    done = cli("report", str(path), "--json")
    found: dict[str, Any] = {"rc": done.returncode, "stderr": noise(done.stderr)}
    if done.returncode == 0:
        text = done.stdout
        if out is not None:
            (out / f"{name}.report.json").write_text(text)
        data = json.loads(text)
        found["warnings"] = data.get("warnings", data.get("findings", ""))
        verdict = data.get("verdict") or {}
        found["verdict"] = {k: verdict.get(k) for k in ("provenance_ok", "stale", "matters")}
        staleness = data.get("staleness") or {}
        found["provenance"] = {k: v for k, v in staleness.items() if k.startswith("provenance") and "layer" not in k}
    return found


def sb3_cli(device: str, tmp: Path, out: Path | None) -> dict[str, Any]:
    runs = {
        "sb3_full_1layer": ["--what-if", "--memory", "--capture-obs"],
        "sb3_summary_trace2_2layers": ["--capture", "summary", "--trace-envs", "2", "--lstm-layers", "2"],
    }
    results: dict[str, Any] = {}
    for name, extra in runs.items():
        path = tmp / f"{name}.parquet"
        start = time.perf_counter()
        done = cli(
            "run", "Pendulum-v1", "--steps", "1024", "--n-envs", "4", "--hidden-size", "64", "--device", device,
            "-o", str(path), "--force", *extra,
        )  # fmt: skip
        found: dict[str, Any] = {"rc": done.returncode, "seconds": round(time.perf_counter() - start, 1)}
        found["stderr"] = noise(done.stderr)[-20:]
        found["stdout_tail"] = done.stdout.splitlines()[-8:]
        if done.returncode == 0:
            found["report"] = report(path, out, name)
        results[name] = found
        print(name, json.dumps(found, indent=1)[:3000], flush=True)
    return results


def rsl_rl_run(
    device: str, tmp: Path, out: Path | None, name: str, envs: int, tf32: bool = True, path: str = "", **capture: Any
) -> dict[str, Any]:
    """One probed rsl_rl run (2 LSTM layers of 64) and its report; ``tf32``: cuDNN's TF32 for the run (PyTorch's
    default: on), ``path`` "host": summary rows on the host path (``OnDevice._engage = "never"``)."""
    from lstm_probe.capture.ondevice import OnDevice

    allowed, engage = torch.backends.cudnn.allow_tf32, OnDevice._engage
    torch.backends.cudnn.allow_tf32 = tf32
    OnDevice._engage = "never" if path == "host" else engage
    try:
        return _rsl_rl_run(device, tmp, out, name, envs, **capture)
    finally:
        torch.backends.cudnn.allow_tf32, OnDevice._engage = allowed, engage


def _rsl_rl_run(device: str, tmp: Path, out: Path | None, name: str, envs: int, **capture: Any) -> dict[str, Any]:
    from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg
    from lstm_probe.integrations.rsl_rl.train import build_runner

    torch.manual_seed(0)
    env = TorchPendulumVecEnv(envs, seed=0, device=device)
    runner = build_runner(env, train_cfg(learning_rate=1e-3, rnn_type="lstm", rnn_layers=2, hidden_size=64))
    path = tmp / f"{name}.parquet"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with attach(runner, path, force=True, **capture):
            runner.learn(3)
    seen = sorted({f"{w.category.__name__}: {str(w.message)[:160]} ({w.filename}:{w.lineno})" for w in caught})
    found: dict[str, Any] = {"warnings": seen, "report": report(path, out, name)}
    print(name, json.dumps(found, indent=1)[:3000], flush=True)
    return found


def profile(device: str, envs: int, out: Path | None) -> str:
    from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg
    from lstm_probe.integrations.rsl_rl.train import build_runner

    torch.manual_seed(0)
    env = TorchPendulumVecEnv(envs, seed=0, device=device)
    runner = build_runner(env, train_cfg(learning_rate=1e-3, rnn_type="lstm", rnn_layers=1, hidden_size=256))
    runner.learn(1)  # warm-up
    with tempfile.TemporaryDirectory() as tmp:
        prof = cProfile.Profile()
        start = time.perf_counter()
        with attach(runner, Path(tmp) / "run.parquet", capture="summary", trace_envs=16, force=True):
            prof.enable()
            runner.learn(3)
            prof.disable()
        wall = time.perf_counter() - start
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    text.write(f"rsl_rl {envs} envs, 3 iterations, summary rows on the device path: {wall:.2f} s with close\n")
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats("lstm_probe", 40)
    if out is not None:
        stats.dump_stats(str(out / "rsl_rl.prof"))
    return text.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile-envs", type=int, default=4096)
    args = ap.parse_args()
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    results: dict[str, Any] = {"device": args.device, "torch": torch.__version__}

    def save() -> None:
        if out is not None:
            (out / "features.json").write_text(json.dumps(results, indent=1, default=str))

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for part, fn in (
            ("sb3", lambda: sb3_cli(args.device, tmp, out)),
            ("rsl_rl_full", lambda: rsl_rl_run(args.device, tmp, out, "rsl_full", 16, what_if=True, memory=True,
                                               capture_obs=True)),
            ("rsl_rl_summary", lambda: rsl_rl_run(args.device, tmp, out, "rsl_summary", 256, capture="summary",
                                                  trace_envs=4)),
            ("rsl_rl_summary_no_tf32", lambda: rsl_rl_run(args.device, tmp, out, "rsl_summary_no_tf32", 256,
                                                          tf32=False, capture="summary", trace_envs=4)),
            ("rsl_rl_summary_host", lambda: rsl_rl_run(args.device, tmp, out, "rsl_summary_host", 256, path="host",
                                                       capture="summary", trace_envs=4)),
            ("rsl_rl_full_no_tf32", lambda: rsl_rl_run(args.device, tmp, out, "rsl_full_no_tf32", 16, tf32=False)),
            *([("profile", lambda: profile(args.device, args.profile_envs, out))] if args.profile_envs else []),
        ):  # fmt: skip
            start = time.perf_counter()
            try:
                results[part] = fn()
            except Exception as e:  # one broken part must not cost the others their turn
                import traceback

                results[part] = f"failed: {e!r}\n{traceback.format_exc()[-3000:]}"
            print(f"[{part}: {time.perf_counter() - start:.1f} s]", flush=True)
            if part == "profile":
                print(results[part][:9000], flush=True)
            save()


if __name__ == "__main__":
    main()
