"""Digests of real logs at a fixed seed, one per framework and capture mode, to check that a refactor
leaves every log unchanged bit for bit.

    python benchmarks/log_digest.py OUT.json              # write the digests
    python benchmarks/log_digest.py NEW.json --compare OLD.json

A digest covers every column of every row (in file order) and the log's metadata, less the keys that
name the time or the machine (start/end time, probe_cost, versions, paths)."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

RUNS = {
    "sb3-full": [
        "Pendulum-v1",
        "--steps",
        "256",
        "--n-steps",
        "64",
        "--batch-size",
        "32",
        "--n-epochs",
        "2",
        "--hidden-size",
        "16",
        "--n-envs",
        "2",
    ],
    "sb3-summary": [
        "Pendulum-v1",
        "--steps",
        "256",
        "--n-steps",
        "64",
        "--batch-size",
        "32",
        "--n-epochs",
        "2",
        "--hidden-size",
        "16",
        "--n-envs",
        "4",
        "--trace-envs",
        "1",
        "--capture",
        "summary",
    ],
    "sb3-shared": [
        "CartPole-v1",
        "--steps",
        "256",
        "--n-steps",
        "64",
        "--batch-size",
        "64",
        "--n-epochs",
        "1",
        "--hidden-size",
        "8",
        "--shared-lstm",
        "--no-critic-lstm",
    ],
    "rsl_rl": [
        "Pendulum-v1",
        "--framework",
        "rsl_rl",
        "--steps",
        "192",
        "--n-steps",
        "24",
        "--n-envs",
        "4",
        "--hidden-size",
        "16",
    ],
    "rsl_rl-gru": [
        "Pendulum-v1",
        "--framework",
        "rsl_rl",
        "--steps",
        "192",
        "--n-steps",
        "24",
        "--n-envs",
        "4",
        "--hidden-size",
        "16",
        "--rnn-type",
        "gru",
        "--trace-envs",
        "2",
    ],
    "torchrl": ["CartPole-v1", "--framework", "torchrl", "--steps", "256", "--n-steps", "64", "--hidden-size", "16"],
}
SCRIPTS = {  # own loops traced with lstm_probe.trace (the generic tracer)
    "cleanrl": ["examples/cleanrl_loop.py", "--iterations", "2", "--num-steps", "16"],
    "lstmcell": ["examples/lstmcell_policy.py", "--steps", "30"],
}
VOLATILE = {"start_time", "end_time", "probe_cost", "versions", "path", "host", "command", "writer", "pid"}


def _clean(value: object) -> object:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def digest(path: Path) -> dict[str, str]:
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    rows = hashlib.sha256()
    meta = {}
    for f in files:
        pf = pq.ParquetFile(f)
        raw = pf.schema_arrow.metadata or {}
        meta = {k.decode(): _clean(json.loads(v)) for k, v in raw.items() if k.startswith(b"lstm_probe")}
        table = pf.read()
        for name in table.column_names:
            col = table.column(name).combine_chunks()
            rows.update(name.encode())
            for buf in col.buffers():
                if buf is not None:
                    rows.update(memoryview(buf))
    return {"rows": rows.hexdigest(), "metadata": json.dumps(meta, sort_keys=True, default=str)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--compare")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in RUNS.items():
            if a.only and name not in a.only:
                continue
            log = Path(tmp) / f"{name}.parquet"
            cmd = [sys.executable, "-m", "lstm_probe", "run", *args, "--seed", "3", "--out", str(log)]
            subprocess.run(cmd, check=True, capture_output=True)
            result[name] = digest(log)
            print(name, result[name]["rows"][:16], flush=True)
        for name, args in SCRIPTS.items():
            if a.only and name not in a.only:
                continue
            log = Path(tmp) / f"{name}.parquet"
            subprocess.run([sys.executable, *args, "--out", str(log)], check=True, capture_output=True)
            result[name] = digest(log)
            print(name, result[name]["rows"][:16], flush=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    if a.compare:
        old = json.loads(Path(a.compare).read_text())
        bad = [n for n in result if n in old and result[n] != old[n]]
        for n in bad:
            which = [k for k in ("rows", "metadata") if result[n][k] != old[n][k]]
            print(f"CHANGED {n}: {', '.join(which)}")
        print("all equal" if not bad else f"{len(bad)} changed")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
