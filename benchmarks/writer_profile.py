"""The writer's CPU per row beside the log's bytes per row, for encoding choices, on identical input.

Records once what a real run hands its writer (every ``Sink`` message of a probed RecurrentPPO run,
Pendulum-v1, sb3-contrib defaults), then replays the recording in this process through a fresh
``Sink`` per variant, interleaved (A B C A B C ...), timing the replay's CPU (``time.process_time``:
row making and norms, Arrow arrays, Parquet encoding, zstd, the file write; a multi-step call's per-step
c and every drift come computed in the recorded messages).

    python benchmarks/writer_profile.py record --steps 1024 --n-envs 1 --capture full --rec full.rec
    python benchmarks/writer_profile.py footer LOG      # the assembly's time per row group, both routes
    python benchmarks/writer_profile.py record --rsl-rl --n-envs 1024 --hidden 256 --rec wide.rec
                                                       # rsl_rl at width: summary rows, --trace-envs 16
    python benchmarks/writer_profile.py replay full.rec --variants current zstd1 --repeats 5
    python benchmarks/writer_profile.py replay full.rec --profile      # cProfile of one replay
    python benchmarks/writer_profile.py replay full.rec --stages       # CPU per stage of one replay
    python benchmarks/writer_profile.py pipe wide.rec --threads 1 2 --repeats 3
                                 # through a real writer process, with 1 and 2 encoding threads (log/parts.py)

A variant sets ``lstm_probe.log.parts``' encoding knobs (``ENCODING``) for its replays; the log written
is read back and compared value by value with the first variant's (only encodings may differ).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import os
import pickle
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS: dict[str, dict[str, Any]] = {
    "current": {},
    "zstd1": {"compression_level": 1},
    "zstd3": {"compression_level": 3},
    "zstd-1": {"compression_level": -1},
    "vec-plain": {"vector_bss": False},
    "vec-lz4": {"vector_compression": "lz4"},
    "vec-none": {"vector_compression": "none"},
    "scal-lz4": {"scalar_compression": "lz4"},
    "scal-none": {"scalar_compression": "none"},
    "int-lz4": {"scalar_compression": "lz4", "float_compression": "zstd"},
    "int-none": {"scalar_compression": "none", "float_compression": "zstd"},
}
"""Encoding variants: overrides of ``lstm_probe.log.parts.ENCODING`` (see there)."""


def record(args: argparse.Namespace) -> None:
    """Run a probed training with a writer thread and keep every message its sink gets, in order."""
    import torch

    torch.set_num_threads(1)
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    from lstm_probe import ProbeCallback
    from lstm_probe.log.logwriter import LogWriter

    messages: list[bytes] = []
    config: dict[str, Any] = {}  # the writer's WriterConfig, as "writer"
    original_init = LogWriter.__init__
    original = LogWriter._to_sink

    def init(self: LogWriter, *a: Any, **k: Any) -> None:
        original_init(self, *a, **k)
        config["writer"] = self.config

    def to_sink(self: LogWriter, message: Any) -> None:
        messages.append(pickle.dumps(message, protocol=5))  # a copy: the arrays as they are now
        original(self, message)

    LogWriter.__init__ = init  # type: ignore[method-assign]
    LogWriter._to_sink = to_sink  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory(prefix="writer-profile-") as tmp:
        if args.rsl_rl:  # a wide run: rsl_rl on torch-native Pendulums, summary rows of every env, 16 traced
            from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg
            from lstm_probe.integrations.rsl_rl.train import build_runner

            torch.manual_seed(0)
            cfg = train_cfg(learning_rate=1e-3, rnn_type="lstm", rnn_layers=1, hidden_size=args.hidden)
            runner = build_runner(TorchPendulumVecEnv(args.n_envs, seed=0), cfg)
            out = os.path.join(tmp, "log.parquet")
            with attach(runner, out, capture="summary", trace_envs=16, force=True, writer="thread"):
                runner.learn(args.iterations)
        else:
            env = make_vec_env(args.env, n_envs=args.n_envs, seed=0)
            model = RecurrentPPO("MlpLstmPolicy", env, seed=0)
            cb = ProbeCallback(os.path.join(tmp, "log.parquet"), capture=args.capture, force=True, writer="thread")
            model.learn(args.steps, callback=cb)
    with open(args.rec, "wb") as f:
        pickle.dump({"config": config["writer"], "messages": messages}, f, protocol=5)
    print(f"{len(messages)} messages, {sum(map(len, messages)) / 1e6:.1f} MB -> {args.rec}")


def replay_once(rec: dict[str, Any], out: str, overrides: dict[str, Any], stages: bool = False) -> dict[str, Any]:
    """One replay into ``out`` with ``overrides`` of the writer's encoding: CPU seconds, rows, bytes."""
    from lstm_probe.log import sink

    encoding: dict[str, Any] = getattr(_knobs(), "ENCODING", {})  # absent before the knobs existed
    if overrides and not encoding:
        raise SystemExit("this lstm_probe has no encoding knobs (parts.ENCODING): replay the current variant only")
    saved = dict(encoding)
    encoding.update(overrides)
    try:
        messages = [pickle.loads(m) for m in rec["messages"]]  # unpickled before the clock starts
        config = dataclasses.replace(rec["config"], out=out)
        timers = _Stages() if stages else None
        cpu0 = time.process_time()
        s = sink.Sink(config)
        if timers is not None:
            timers.install(s)
        for message in messages:
            s.take(message)
        cost = {"probe_cost": {"writer_cpu_seconds": 0.0, "writer_busy_seconds": 0.0}}
        s.close({"completed": True, **cost})
        cpu = time.process_time() - cpu0
    finally:
        encoding.clear()
        encoding.update(saved)
    size = (
        sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
        if os.path.isdir(out)
        else os.path.getsize(out)
    )
    result = {"cpu": cpu, "rows": s.log.rows_written, "bytes": size}
    if timers is not None:
        result["stages"] = timers.seconds
    return result


def _knobs() -> Any:
    """The module of the writer's Parquet settings (``lstm_probe.log.parts``; ``writer`` in older checkouts)."""
    try:
        from lstm_probe.log import parts

        return parts
    except ImportError:
        from lstm_probe.log import writer

        return writer


class _Stages:
    """CPU time per stage of a replay, by wrapping the sink's and the writer's functions on the instance."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, obj: Any, name: str, label: str) -> None:
        fn = getattr(obj, name)

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.process_time() - t0

        setattr(obj, name, timed)

    def install(self, s: Any) -> None:
        # (the c recovery and the drifts come computed with the messages: drift.Drift, the job's second half)
        self.wrap(s, "_states", "states into row buffers, norms")
        self.wrap(s.log.encoder, "encode", "arrow arrays")
        self.wrap(s.log.parts, "write", "parquet write (encode, zstd, file)")
        self.wrap(s.log.parts, "close_part", "part close")
        knobs = _knobs()
        make = knobs._parquet_writer

        def parquet_writer(path: Any, schema: Any) -> Any:
            w = make(path, schema)
            self.wrap(w, "write_batch", "  of which Parquet (encode, zstd, file)")
            return w

        knobs._parquet_writer = parquet_writer
        if s.log.parts.assembly is not None:
            self.wrap(s.log.parts.assembly, "append", "  of which the single file's copy")


def compare(a: str, b: str) -> str:
    """'same' when two logs hold the same rows with the same values in the same order (a replay's variants
    write identical rows; only encodings differ). Read in batches: a wide log's null vectors still take
    their full width in memory once read whole."""
    import pyarrow.parquet as pq

    fa, fb = pq.ParquetFile(a), pq.ParquetFile(b)
    if fa.metadata.num_rows != fb.metadata.num_rows:
        return f"rows differ: {fa.metadata.num_rows} vs {fb.metadata.num_rows}"
    at = 0
    for ba, bb in zip(fa.iter_batches(batch_size=65536), fb.iter_batches(batch_size=65536), strict=True):
        for name in ba.schema.names:
            if not ba.column(name).equals(bb.column(name)):
                return f"column {name} differs in rows {at}-{at + ba.num_rows}"
        at += ba.num_rows
    return "same"


def replay(args: argparse.Namespace) -> None:
    from lstm_probe.log.writer_process import _NoPandas

    sys.meta_path.insert(0, _NoPandas)  # type: ignore[arg-type]  # as in the writer process
    with open(args.rec, "rb") as f:
        rec = pickle.load(f)
    names = args.variants or list(VARIANTS)
    tmp = tempfile.mkdtemp(prefix="writer-profile-")
    try:
        replay_once(rec, os.path.join(tmp, "warm.parquet"), {})  # imports and first-use costs, not timed
        if args.profile or args.stages:
            out = os.path.join(tmp, "p.parquet")
            if args.profile:
                prof = cProfile.Profile()
                with prof:
                    r = replay_once(rec, out, VARIANTS[names[0]])
                pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
                pstats.Stats(prof).sort_stats("cumulative").print_stats(args.top)
            else:
                r = replay_once(rec, out, VARIANTS[names[0]], stages=True)
                print(f"{r['rows']} rows, {r['cpu']:.3f} s CPU in all ({1e6 * r['cpu'] / r['rows']:.2f} us/row)")
                for k, v in r["stages"].items():
                    print(f"  {k:<40} {v:7.3f} s  {1e6 * v / r['rows']:6.2f} us/row  {100 * v / r['cpu']:5.1f}%")
            return
        results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        first = os.path.join(tmp, f"{names[0]}.parquet")
        for rep in range(args.repeats):
            for n in names:
                out = os.path.join(tmp, f"{n}.parquet")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(out)
                results[n].append(replay_once(rec, out, VARIANTS[n]))
                if rep == 0 and n != names[0]:
                    results[n][0]["same"] = compare(first, out)
        base = statistics.median(r["cpu"] for r in results[names[0]])
        print(f"{results[names[0]][0]['rows']} rows, {args.repeats} interleaved repeats; CPU of the whole replay")
        print(f"{'variant':<12} {'us/row':>7} {'spread':>13} {'vs first':>8} {'B/row':>8} {'values':>8}")
        for n in names:
            rs = results[n]
            us = [1e6 * r["cpu"] / r["rows"] for r in rs]
            ratio = statistics.median(r["cpu"] for r in rs) / base
            print(
                f"{n:<12} {statistics.median(us):7.2f} {min(us):6.2f}-{max(us):<6.2f} {ratio:8.3f} "
                f"{rs[0]['bytes'] / rs[0]['rows']:8.1f} {rs[0].get('same', '-'):>8}"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write(args: argparse.Namespace) -> None:
    """Replay once into ``out`` (a file, or a dataset directory when it ends in /) and keep the log."""
    from lstm_probe.log.writer_process import _NoPandas

    sys.meta_path.insert(0, _NoPandas)  # type: ignore[arg-type]
    with open(args.rec, "rb") as f:
        rec = pickle.load(f)
    r = replay_once(rec, args.out, {})
    print(f"{r['rows']} rows, {1e6 * r['cpu'] / r['rows']:.2f} us/row CPU, {r['bytes'] / r['rows']:.1f} B/row")


def pipe_once(rec: dict[str, Any], out: str, times: int = 1, threads: int | None = None) -> dict[str, Any]:
    """One replay through a real writer process (the pipe, unpickling, the process's loop): its own CPU
    (``probe_cost.writer_cpu_seconds``: from the open message to the close), the whole process's CPU
    (``RUSAGE_CHILDREN``: its start and imports too), its peak private memory, the log's bytes."""
    import resource

    import lstm_probe
    from lstm_probe.log.writer_process import Child

    config = dataclasses.replace(rec["config"], out=out, pid=None)  # no lock of this run's to free
    if threads is not None:  # the writer's encoding threads (log/parts.py)
        config = dataclasses.replace(config, encode_threads=threads)
    messages = [pickle.loads(m) for m in rec["messages"]]
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    child = Child.start(config)
    for _ in range(times):  # the same messages again: more rows into the same log (memory over GBs)
        for message in messages:
            child.send(message, 32 << 20)
    child.close({"completed": True, "probe_cost": {"writer_cpu_seconds": 0.0, "writer_busy_seconds": 0.0}})
    wall = time.perf_counter() - start  # the sender never waits but for room in the pipe: the writer's pace
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    info = lstm_probe.read_info(out)
    cost = info.metadata["probe_cost"]
    return {
        "cpu": cost["writer_cpu_seconds"],
        "wall": wall,
        "process_cpu": after.ru_utime + after.ru_stime - kids.ru_utime - kids.ru_stime,
        "private_mb": cost.get("writer_peak_private_mb", 0.0),
        "rows": info.rows,
        "bytes": info.bytes,
    }


def pipe(args: argparse.Namespace) -> None:
    """Replays through a real writer process, ``--repeats`` times: medians and spreads."""
    from lstm_probe.log import writer_process

    for item in args.env or []:
        key, _, value = item.partition("=")
        writer_process.WRITER_ENV[key] = value or None
    with open(args.rec, "rb") as f:
        rec = pickle.load(f)
    tmp = tempfile.mkdtemp(prefix="writer-profile-")
    try:
        out = os.path.join(tmp, "log/" if args.dir else "log.parquet")
        runs: dict[int | None, list[dict[str, Any]]] = {t: [] for t in args.threads or [None]}
        for _ in range(args.repeats):
            for threads, rs in runs.items():  # interleaved: A B A B ...
                shutil.rmtree(os.path.join(tmp, "log"), ignore_errors=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(tmp, "log.parquet"))
                rs.append(pipe_once(rec, out, args.times, threads))
        for threads, rs in runs.items():
            _pipe_line(rs, threads)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pipe_line(rs: list[dict[str, Any]], threads: int | None) -> None:
    """One line of :func:`pipe`'s figures: medians and spreads of ``rs``."""
    n = rs[0]["rows"]
    us = [1e6 * r["cpu"] / n for r in rs]
    whole = [1e6 * r["process_cpu"] / n for r in rs]
    mb = [r["private_mb"] for r in rs]
    walls = [r["wall"] for r in rs]
    print(
        ("" if threads is None else f"{threads} encoding thread(s): ")
        + f"{n} rows: writer CPU {statistics.median(us):.2f} us/row ({min(us):.2f}-{max(us):.2f}), whole process "
        f"{statistics.median(whole):.2f} ({min(whole):.2f}-{max(whole):.2f}), {rs[0]['bytes'] / n:.1f} B/row, "
        f"peak private {statistics.median(mb):.1f} MB ({min(mb)}-{max(mb)}), wall {statistics.median(walls):.2f} s "
        f"({min(walls):.2f}-{max(walls):.2f}) from start to closed"
    )


def footer(args: argparse.Namespace) -> None:
    """How long a single-file log's assembly takes per row group to move a part's row-group metadata: decoded,
    moved and encoded (``assemble._row_group``, the route before) against byte for byte
    (``assemble.moved_row_group``), interleaved, on the row groups of a real log (a part, or a whole log)."""
    from pathlib import Path

    from lstm_probe.log.assemble import Encoded, _row_group, encode, moved_row_group, read_footer

    path = Path(args.log)

    def decoded() -> int:
        moved: list[Encoded] = []
        read_footer(path, lambda rg: moved.append(Encoded(encode(_row_group(rg, 100, len(moved))))))
        return len(moved)

    def raw() -> int:
        moved: list[Encoded] = []

        def row_group(buf: bytes, pos: int) -> int:
            metadata, end = moved_row_group(buf, pos, 100, len(moved))
            moved.append(metadata)
            return end

        read_footer(path, raw_row_group=row_group)
        return len(moved)

    times: dict[str, list[float]] = {"decoded": [], "byte for byte": []}
    groups = 0
    for _ in range(args.repeats):
        for label, fn in (("decoded", decoded), ("byte for byte", raw)):
            start = time.perf_counter()
            groups = fn()
            times[label].append((time.perf_counter() - start) / max(groups, 1))
    ms = {label: 1e3 * statistics.median(t) for label, t in times.items()}
    print(
        f"{groups} row groups: decoded {ms['decoded']:.2f} ms per row group, byte for byte "
        f"{ms['byte for byte']:.2f} ms ({ms['decoded'] / ms['byte for byte']:.2f}x), medians of {args.repeats}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--env", default="Pendulum-v1")
    r.add_argument("--steps", type=int, default=1024)
    r.add_argument("--n-envs", type=int, default=1)
    r.add_argument("--capture", default="full", choices=["full", "summary"])
    r.add_argument("--rec", required=True)
    r.add_argument("--rsl-rl", action="store_true", help="record a wide rsl_rl run instead (--n-envs, --hidden)")
    r.add_argument("--hidden", type=int, default=256)
    r.add_argument("--iterations", type=int, default=3)
    p = sub.add_parser("replay")
    p.add_argument("rec")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--stages", action="store_true")
    p.add_argument("--top", type=int, default=25)
    w = sub.add_parser("write")
    w.add_argument("rec")
    w.add_argument("out")
    q = sub.add_parser("pipe")
    q.add_argument("rec")
    q.add_argument("--repeats", type=int, default=3)
    q.add_argument("--dir", action="store_true", help="write a dataset directory instead of a single file")
    q.add_argument("--times", type=int, default=1, help="send the recorded messages this many times (one log)")
    q.add_argument("--threads", type=int, nargs="+", help="the writer's encoding threads, each count in turn")
    q.add_argument("--env", nargs="+", help="KEY=VALUE for the writer process (KEY= : unset)")
    f = sub.add_parser("footer")
    f.add_argument("log")
    f.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    {"record": record, "replay": replay, "write": write, "pipe": pipe, "footer": footer}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
