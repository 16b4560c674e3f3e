"""How long the `lstm-probe` command takes to start and answer: `report` on each sample log (text and
--json), `probe`, `--help` and `--version`, each in a fresh process, two source trees side by side.

"before" is another checkout of lstm-probe (e.g. `git worktree add --detach DIR <commit>`), "after" this one
(or --after DIR);
each runs the installed `lstm-probe` script with PYTHONPATH set to its tree, in the order A B A B ... so
that other load on the machine falls on both alike. Wall time is what a user waits for; CPU time (the child's
user + system, from RUSAGE_CHILDREN) is less disturbed by other processes. Prints medians with min-max and
the after/before ratio of the medians.

    python benchmarks/startup.py --before DIR              # 9 repeats of every command
    python benchmarks/startup.py --before DIR --repeats 15 --only report
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_runs"


def commands() -> list[tuple[str, list[str]]]:
    """(label, argv after `lstm-probe`): report on each sample log, as text and as JSON; probe; --help;
    --version."""
    found: list[tuple[str, list[str]]] = []
    for log in sorted(SAMPLES.iterdir()):
        if log.suffix == ".parquet" or log.is_dir():
            found.append((f"report {log.name}", ["report", str(log)]))
            found.append((f"report {log.name} --json", ["report", str(log), "--json"]))
    probed = SAMPLES / "pendulum-1env.parquet"
    found.append((f"probe {probed.name} --lags 0,1", ["probe", str(probed), "--lags", "0,1"]))
    found += [("--help", ["--help"]), ("--version", ["--version"])]
    return found


def entry() -> list[str]:
    """The installed `lstm-probe` script beside this interpreter (what a user runs), else `python -m`."""
    script = Path(sys.executable).with_name("lstm-probe")
    return [str(script)] if script.exists() else [sys.executable, "-m", "lstm_probe.cli"]


def once(tree: Path, argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh `lstm-probe ARGV` running the code in ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "COLUMNS": "100"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run([*entry(), *argv], cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise SystemExit(f"lstm-probe {' '.join(argv)} failed in {tree}: {r.stderr.decode()[-400:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="the source tree to compare against")
    ap.add_argument("--after", type=Path, default=ROOT, help="the source tree measured (default: this one)")
    ap.add_argument("--repeats", type=int, default=9, help="runs of each command on each side (>= 7)")
    ap.add_argument("--only", default="", help="only the commands whose label contains this")
    args = ap.parse_args()
    for flag, tree in (("--before", args.before), ("--after", args.after)):
        if not (tree / "lstm_probe" / "__init__.py").exists():
            raise SystemExit(f"{flag} {tree}: no lstm_probe package there")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    todo = [(label, argv) for label, argv in commands() if args.only in label]
    for _, argv in todo:  # warm the file cache and the bytecode caches of both trees
        for tree in trees.values():
            once(tree, argv)
    print(f"lstm-probe start-up, {args.repeats} fresh processes per side, interleaved; seconds: median [min-max]")
    head = f"{'command':44s} {'wall before':>21s} {'wall after':>21s} {'ratio':>6s} {'CPU before':>21s}"
    print(f"{head} {'CPU after':>21s} {'ratio':>6s}")
    for label, argv in todo:
        wall: dict[str, list[float]] = {side: [] for side in trees}
        cpu: dict[str, list[float]] = {side: [] for side in trees}
        for _ in range(args.repeats):
            for side, tree in trees.items():
                w, c = once(tree, argv)
                wall[side].append(w)
                cpu[side].append(c)
        ratio_wall = statistics.median(wall["after"]) / statistics.median(wall["before"])
        ratio_cpu = statistics.median(cpu["after"]) / statistics.median(cpu["before"])
        print(
            f"{label:44s} {spread(wall['before']):>21s} {spread(wall['after']):>21s} {ratio_wall:6.2f} "
            f"{spread(cpu['before']):>21s} {spread(cpu['after']):>21s} {ratio_cpu:6.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
