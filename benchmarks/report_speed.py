"""How fast `lstm-probe report` reads a large log, and how much memory it takes.

Builds a large log from a real one: a short real probed run, whose rows are repeated with shifted
call, iteration, env_step and episode numbers into a dataset directory (the same schema and writer settings),
then times `summarize` in a fresh process and prints rows/s and peak RSS: once as the report reads a log
(runs of whole iterations of up to REPORT_CHUNK_ROWS rows) and once in one read, side by side.

    python benchmarks/report_speed.py --rows 10000000 --hidden 32
    python benchmarks/report_speed.py --rows 36000000 --hidden 256 --capture summary   # a 1M-step run's rows
    python benchmarks/report_speed.py --rows 10000000 --cli --compare BEFORE --repeats 3
        # `lstm-probe report LOG --json` end to end (start-up included), this checkout against BEFORE
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lstm_probe.log.layout import row_capacity
from lstm_probe.log.parts import column_encodings

CHILD = """
import json, sys, time
t, cpu = time.perf_counter(), time.process_time()


def hwm():  # this process's peak RSS (MB); ru_maxrss would also count the parent's RSS at fork time
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) / 1024


import lstm_probe
print(json.dumps({"code": lstm_probe.__file__}), file=sys.stderr)
if "sections" in sys.argv[3:]:  # --sections: each step's time, and the process's RSS and peak after it
    from lstm_probe.report import scan
    from lstm_probe.report.sections import calls

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

    def timed(name, f):
        def wrapped(*a, **k):
            s = time.perf_counter()
            out = f(*a, **k)
            peak = hwm()
            took = time.perf_counter() - s
            print(f"  {name:20s} {took:6.1f} s   RSS {rss():6.0f} MB   peak {peak:6.0f} MB", file=sys.stderr)
            return out
        return wrapped

    for owner, name in ((scan, "read_scalars"), (scan, "duplicates"), (scan, "chunks"), (calls, "per_call"),
                        (calls, "minibatches")):
        setattr(owner, name, timed(name, getattr(owner, name)))
    from lstm_probe.report import registry
    for sec in registry.SECTIONS:  # each section's share of every run, and its own reads after the scan
        acc = sec.accumulator()
        if acc is not None:
            type(acc).add = timed(sec.key + ".add", type(acc).add)
        type(sec).compute = timed(sec.key + ".compute", type(sec).compute)
rep = lstm_probe.summarize(sys.argv[1], chunk_rows=int(sys.argv[2]))
print(json.dumps({"seconds": time.perf_counter() - t, "cpu": time.process_time() - cpu, "rss_mb": hwm(),
                  "rows": rep.run.rows, "findings": len(rep.findings)}))
"""


WRAP = """
import hashlib, json, resource, subprocess, sys, time
start = time.perf_counter()
r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
wall = time.perf_counter() - start
use = resource.getrusage(resource.RUSAGE_CHILDREN)
sys.stderr.buffer.write(r.stderr)
if not r.returncode:
    json.loads(r.stdout)  # the report's JSON
cpu = use.ru_utime + use.ru_stime
print(json.dumps({"seconds": wall, "cpu": cpu, "user": use.ru_utime, "sys": use.ru_stime,
                  "rss_mb": use.ru_maxrss / 1024, "rc": r.returncode, "json": hashlib.sha256(r.stdout).hexdigest()}))
"""
"""Runs one command and prints its wall, CPU (user + system) seconds, peak RSS and a hash of its output: a
small process of its own whose only child is the command, so ``ru_maxrss`` is the command's (not the
builder's, nor an earlier run's)."""


def _cli_report(log: Path, env: dict[str, str], here: Path) -> dict[str, float]:
    """Wall and CPU seconds and peak RSS (MB) of one fresh `lstm-probe report LOG --json` running the code on
    ``env``'s PYTHONPATH (this checkout's when unset)."""
    script = Path(sys.executable).with_name("lstm-probe")
    entry = [str(script)] if script.exists() else [sys.executable, "-m", "lstm_probe.cli"]
    env = {**env, "PYTHONPATH": env.get("PYTHONPATH", str(here))}
    r = subprocess.run(
        [sys.executable, "-c", WRAP, *entry, "report", str(log), "--json"], env=env, capture_output=True, text=True
    )
    if r.returncode or json.loads(r.stdout)["rc"]:
        raise SystemExit(r.stderr[-400:])
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument(
        "--capture",
        choices=["full", "summary"],
        default="full",
        help="capture of the real run the log is built from (summary: a 1M-step run's 36M rows fit)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the generated log")
    ap.add_argument("--log", type=Path, help="time this log (file or directory) instead of building one")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repeats of the two reads")
    ap.add_argument("--sections", action="store_true", help="print each step of summarize: time, RSS, peak RSS")
    ap.add_argument(
        "--layout",
        choices=["phase", "mixed"],
        default="phase",
        help="phase: train rows and all other rows in separate row groups (the writer's layout); "
        "mixed: row groups in call order, phases mixed (logs written before it)",
    )
    ap.add_argument(
        "--compare",
        type=Path,
        metavar="CHECKOUT",
        help="time the report of this checkout (e.g. a git worktree of an earlier commit) against "
        "this one's, both reading in runs of iterations, instead of runs against one read",
    )
    ap.add_argument(
        "--cli",
        action="store_true",
        help="time `lstm-probe report LOG --json` end to end in a fresh process (start-up, read, JSON) instead "
        "of summarize alone",
    )
    ap.add_argument("--build-only", type=Path, help="build the log into this (new) directory, keep it, time nothing")
    args = ap.parse_args()
    tmp = None
    if args.log is not None:
        from lstm_probe.log.reader import read_info

        out, rows = args.log, read_info(args.log).rows
    else:
        tmp = Path(tempfile.mkdtemp())
        from lstm_probe import run

        base = run(
            "Pendulum-v1",
            tmp / "base.parquet",
            steps=4096,
            n_envs=4,
            hidden_size=args.hidden,
            seed=0,
            torch_threads=1,
            capture=args.capture,
        )
        table = pq.read_table(base.path)
        meta = table.schema.metadata
        out = args.build_only or tmp / "big"
        out.mkdir()
        calls = pc.max(table["call"]).as_py() + 1
        iters = pc.max(table["iteration"]).as_py() + 1
        steps = pc.max(table["env_step"]).as_py() + 1
        episodes = pc.max(table["episode"]).as_py() + 1
        copies = max(1, args.rows // table.num_rows)
        start = time.perf_counter()
        final = pq.ParquetFile(base.path).metadata.metadata[b"lstm_probe.final"]
        for k in range(copies):
            t = table.set_column(table.schema.get_field_index("call"), "call", pc.add(table["call"], k * calls))
            t = t.set_column(
                t.schema.get_field_index("iteration"),
                "iteration",
                pc.cast(pc.add(t["iteration"], k * iters), pa.int32()),
            )
            t = t.set_column(t.schema.get_field_index("env_step"), "env_step", pc.add(t["env_step"], k * steps))
            # each copy's episodes are new ones (episode ids are unique per env in a real log)
            t = t.set_column(t.schema.get_field_index("episode"), "episode", pc.add(t["episode"], k * episodes))
            w = pq.ParquetWriter(
                out / f"part-{k:05d}.parquet",
                t.schema.with_metadata(meta),
                compression="zstd",
                use_dictionary=["module", "phase", "path", "bootstrap", "seq_reason"],
                write_statistics=[n for n in t.schema.names if n not in ("h", "c")],
                column_encoding=column_encodings(t.schema),
            )
            group = row_capacity(args.hidden, args.capture == "full")  # a real log's row groups
            if args.layout == "mixed":
                w.write_table(t, row_group_size=group)
            else:  # phase-pure row groups: each write_table call starts new row groups
                train = pc.equal(t["phase"], "train").fill_null(False)
                w.write_table(t.filter(pc.invert(train)), row_group_size=group)
                w.write_table(t.filter(train), row_group_size=group)
            if k == copies - 1:
                w.add_key_value_metadata({"lstm_probe.final": final.decode()})
            w.close()
        size = sum(f.stat().st_size for f in out.iterdir())
        rows = copies * table.num_rows
        print(
            f"log: {rows:,} rows (hidden {args.hidden}, {args.capture}, {args.layout} row groups), "
            f"{size / 2**20:.0f} MB, built in {time.perf_counter() - start:.0f} s"
        )
        if args.build_only:
            shutil.rmtree(tmp)
            print(f"kept {out}")
            return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    from lstm_probe.report import REPORT_CHUNK_ROWS

    results: dict[str, list[dict]] = {}
    reads: tuple[tuple[str, int, dict[str, str]], ...] = (
        ("in runs of iterations (default)", REPORT_CHUNK_ROWS, env),
        ("in one read", rows + 1, env),
    )
    here = Path(__file__).resolve().parent.parent
    if args.compare is not None:
        reads = (
            ("this checkout", REPORT_CHUNK_ROWS, env),
            (str(args.compare), REPORT_CHUNK_ROWS, {**env, "PYTHONPATH": str(args.compare.resolve())}),
        )
    for k in range(args.repeats):  # interleaved: A B A B ...
        for label, chunk, child_env in reads:
            if args.cli:
                results.setdefault(label, []).append(_cli_report(out, child_env, here))
                res = results[label][-1]
                print(
                    f"  [{k + 1}] {label}: {res['seconds']:.1f} s ({res['cpu']:.1f} s CPU: {res['user']:.1f} user, "
                    f"{res['sys']:.1f} system), peak RSS {res['rss_mb']:.0f} MB"
                )
                continue
            flags = ["sections"] if args.sections else []
            r = subprocess.run(
                [sys.executable, "-c", CHILD, str(out), str(chunk), *flags],
                capture_output=True,
                text=True,
                env=child_env,
                # the checkout's own directory: `python -c` puts the working directory first on sys.path
                cwd=child_env.get("PYTHONPATH", here),
            )
            if r.returncode:
                raise SystemExit(r.stderr)
            code, *steps = r.stderr.splitlines(keepends=True)
            if args.sections:
                print("".join(steps), end="")
            res = json.loads(r.stdout.strip().splitlines()[-1])
            res["code"] = json.loads(code)["code"]
            results.setdefault(label, []).append(res)
            print(
                f"  [{k + 1}] {label}: {res['seconds']:.1f} s ({res['cpu']:.1f} s CPU), peak RSS {res['rss_mb']:.0f} MB"
                f"  ({Path(res['code']).parent.parent})"
            )
    for label, runs in results.items():
        secs = statistics.median(x["seconds"] for x in runs)
        cpus = [x["cpu"] for x in runs]
        print(
            f"summarize {label}: {secs:.1f} s (median of {len(runs)}; {min(x['seconds'] for x in runs):.1f}-"
            f"{max(x['seconds'] for x in runs):.1f}), CPU {statistics.median(cpus):.1f} s "
            f"({min(cpus):.1f}-{max(cpus):.1f}), {rows / secs:,.0f} rows/s, "
            f"peak RSS {min(x['rss_mb'] for x in runs):.0f}-{max(x['rss_mb'] for x in runs):.0f} MB"
        )
    a, b = ([x["seconds"] for x in v] for v in results.values())
    if args.cli:
        ratios = [x / y for x, y in zip(a, b, strict=True)]
        ma, mb = (max(x["rss_mb"] for x in v) for v in results.values())
        outputs = {x["json"] for v in results.values() for x in v}
        print(
            f"{' / '.join(results)}: report --json time {statistics.median(ratios):.2f}x (pairs), "
            f"peak RSS {ma / mb:.2f}x; JSON {'byte-identical' if len(outputs) == 1 else 'DIFFERENT'} in every run"
        )
        _cleanup(tmp, args.keep, out)
        return
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    ma, mb = (max(x["rss_mb"] for x in v) for v in results.values())
    print(
        f"{' / '.join(results)}: time {statistics.median(ratios):.2f}x "
        f"({min(ratios):.2f}-{max(ratios):.2f}, pairs), peak RSS {ma / mb:.2f}x"
    )
    _cleanup(tmp, args.keep, out)


def _cleanup(tmp: Path | None, keep: bool, out: Path) -> None:
    """The generated log removed (a 100M-row log is ~1 GB), unless kept."""
    if tmp is not None and not keep:
        shutil.rmtree(tmp)
    elif tmp is not None:
        print(f"kept {out}")


if __name__ == "__main__":
    main()
