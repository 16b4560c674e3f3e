"""Hostile or unlucky inputs that must cost little and delete nothing: each case crafts its input in
tmp_path and runs the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from refusals import one_line_error

import lstm_probe
from lstm_probe.errors import BadInput, BadLog

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "100"}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lstm_probe.cli", *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=600
    )


TRAIN = ["--steps", "32", "--n-steps", "16", "--batch-size", "16", "--hidden-size", "8", "-q"]


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_a_users_partial_path_is_never_deleted_without_force(tmp_path: Path, kind: str) -> None:
    journal = tmp_path / "run.parquet.partial"
    if kind == "directory":
        journal.mkdir()
        (journal / "notes.txt").write_text("mine")
        (journal / "part-00000.parquet").write_bytes(b"")  # one of ours beside it changes nothing
    else:
        journal.write_text("mine")
    r = cli("run", "Pendulum-v1", *TRAIN, cwd=tmp_path)
    one_line_error(r, "run.parquet.partial", "did not write", "--force")
    assert (journal / "notes.txt").read_text() == "mine" if kind == "directory" else journal.read_text() == "mine"
    assert not (tmp_path / "run.parquet").exists()
    r = cli("run", "Pendulum-v1", *TRAIN, "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run.parquet").is_file() and not journal.exists()


def test_n_envs_has_an_upper_bound_checked_before_anything_is_built(tmp_path: Path) -> None:
    r = cli("run", "CartPole-v1", "--n-envs", "10000000", cwd=tmp_path)
    one_line_error(r, "--n-envs 10000000", "at most 65,536")
    assert not list(tmp_path.iterdir())


# -- the memory budget: small files that declare big reads ---------------------------------------------
SAMPLE = Path(__file__).resolve().parents[1] / "sample_runs" / "pendulum-1env.parquet"

PEAK = """
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(r.stderr)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
"""


def peak(*args: str, cwd: Path) -> tuple[int, int, str]:
    """Exit code, peak RSS in MB and stderr of one fresh ``lstm-probe ARGS`` (its own wrapper process, so no
    other child's peak is counted)."""
    cmd = [sys.executable, "-c", PEAK, sys.executable, "-m", "lstm_probe.cli", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=ENV, timeout=600)
    code, mb = r.stdout.split()
    return int(code), int(mb), r.stderr


def _null_vectors(n: int, width: int, stored_every: int = 0) -> pa.Array:
    """``n`` null vectors of ``width`` floats without touching memory for them (calloc'd zeros); with
    ``stored_every`` K, every K-th row holds a vector of zeros (so the column is not all null)."""
    child = pa.Array.from_buffers(pa.float32(), n * width, [None, pa.py_buffer(np.zeros(n * width, np.float32))])
    null = np.ones(n, bool)
    if stored_every:
        null[::stored_every] = False
    return pa.FixedSizeListArray.from_arrays(child, width, mask=pa.array(null))


def _wide_log(path: Path, width: int, *, columns: tuple[str, ...], rows_per_group: int, stored_every: int = 0) -> Path:
    src = pq.read_table(SAMPLE)
    meta = dict(src.schema.metadata)
    t = src
    for name in columns:
        field = pa.field(name, pa.list_(pa.float32(), width))
        if name in t.schema.names:
            t = t.set_column(t.schema.get_field_index(name), field, _null_vectors(t.num_rows, width, stored_every))
        else:
            t = t.append_column(field, _null_vectors(t.num_rows, width, stored_every))
    if "h" in columns:  # the vectors as wide as the metadata says, as the reader requires
        run = json.loads(meta[b"lstm_probe.run"])
        run["hidden_size"] = width
        meta[b"lstm_probe.run"] = json.dumps(run).encode()
    pq.write_table(t.replace_schema_metadata(meta), path, row_group_size=rows_per_group, compression="zstd")
    return path


def test_null_vectors_65536_wide_in_six_row_groups_stay_within_the_budget(tmp_path: Path) -> None:
    log = _wide_log(tmp_path / "wide.parquet", 1 << 16, columns=("h", "c"), rows_per_group=518)
    assert log.stat().st_size < 2 << 20  # a small file
    code, mb, err = peak("--max-memory", "256M", "report", str(log), cwd=tmp_path)
    assert code == 2 and "memory budget" in err and "--max-memory" in err and len(err.strip().splitlines()) == 1
    code, mb, err = peak("report", str(log), "--json", cwd=tmp_path)
    assert code == 0, err
    assert mb < 2600, f"report peaked at {mb} MB; the budget is 2 GiB"  # was 3-4 GB with the read-ahead unbounded


def test_a_wide_info_column_is_refused_by_load_before_it_is_read(tmp_path: Path) -> None:
    # one stored vector per row group, the rest null: the column is read, each row at its full width
    log = _wide_log(tmp_path / "info.parquet", 200_000, columns=("info",), rows_per_group=600, stored_every=600)
    code = f"import lstm_probe; lstm_probe.load({str(log)!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 1 and "BadLog" in r.stderr and "memory budget" in r.stderr, r.stderr[-500:]
    df = _load(log, vectors=False)  # the rest of the log still loads
    assert len(df) == pq.read_metadata(SAMPLE).num_rows


def _load(log: Path, **kw: object):
    import lstm_probe

    return lstm_probe.load(log, **kw)


def test_a_huge_string_in_a_dictionary_page_is_held_once(tmp_path: Path) -> None:
    src = pq.read_table(SAMPLE)
    word = "x" * 600_000
    i = src.schema.get_field_index("seq_reason")
    t = src.set_column(i, src.schema.field(i), pa.array([word] * src.num_rows, pa.string()))
    log = tmp_path / "word.parquet"
    pq.write_table(t, log, compression="zstd")  # dictionary-encoded: the word is stored once
    assert log.stat().st_size < 2 << 20
    del t
    # the peak from /proc (VmHWM starts anew at exec; ru_maxrss would count this process's RSS at fork)
    code = (
        f"import lstm_probe; df = lstm_probe.load({str(log)!r}, vectors=False); "
        "assert df.seq_reason.map(id).nunique() == 1; "
        "print(next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM')) // 1024)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-500:]
    assert int(r.stdout.split()[-1]) < 800  # each row's string was a copy: 1.9 GB for 3,107 rows


def test_zero_row_parts_cost_nothing_and_footer_counts_are_checked(tmp_path: Path) -> None:
    d = tmp_path / "many"
    d.mkdir()
    table = pq.read_table(SAMPLE)
    pq.write_table(table, d / "part-00000.parquet")
    empty = d / "part-00001.parquet"
    pq.ParquetWriter(empty, table.schema).close()
    for k in range(2, 3001):
        shutil.copyfile(empty, d / f"part-{k:05d}.parquet")
    code, mb, err = peak("report", f"{d}/", "--json", cwd=tmp_path)
    assert code == 0, err
    assert mb < 400, mb  # every empty part was a dataset fragment: 3,000 of them took 0.8 GB (5.7 s)


def test_a_fifo_named_like_a_part_is_refused_not_waited_on(tmp_path: Path) -> None:
    d = tmp_path / "log"
    d.mkdir()
    shutil.copyfile(SAMPLE, d / "part-00000.parquet")
    os.mkfifo(d / "part-00001.parquet")
    r = cli("report", f"{d}/", cwd=tmp_path)  # blocked forever before (the timeout would fail the test)
    one_line_error(r, "not a regular file")
    os.mkfifo(tmp_path / "pipe.parquet")
    one_line_error(cli("report", str(tmp_path / "pipe.parquet"), cwd=tmp_path), "not a regular file")


def test_duplicate_column_names_are_a_one_line_error(tmp_path: Path) -> None:
    t = pq.read_table(SAMPLE)
    dup = t.append_column(pa.field("env", pa.int32()), pa.array(np.zeros(t.num_rows, np.int32)))
    pq.write_table(dup, tmp_path / "dup.parquet")
    one_line_error(cli("report", str(tmp_path / "dup.parquet"), cwd=tmp_path), "'env' more than once")


# -- every failure a file or an argument causes is a one-line exit 2 ----------------------------------
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cuts=st.lists(st.tuples(st.floats(0.0, 1.0), st.binary(min_size=1, max_size=8)), min_size=1, max_size=4),
    truncate=st.none() | st.floats(0.0, 1.0),
)
def test_damaged_bytes_are_a_refusal_or_a_report_never_a_crash(tmp_path: Path, cuts, truncate) -> None:
    """Bytes overwritten anywhere (footer, pages, metadata) or the file cut short: every reader returns or
    raises BadLog / BadInput (the CLI's one-line exit 2), nothing else."""
    from lstm_probe import load, probe, read_info, summarize
    from lstm_probe.errors import BadInput, BadLog

    raw = bytearray(SAMPLE.read_bytes())
    tail = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")  # the footer: where damage matters most
    for where, junk in cuts:
        at = int(tail + where * (len(raw) - tail - 1)) if where < 0.5 else int(where * (len(raw) - 1))
        raw[at : at + len(junk)] = junk
    if truncate is not None:
        raw = raw[: int(truncate * len(raw))]
    log = tmp_path / "damaged.parquet"
    log.write_bytes(bytes(raw))
    for read in (read_info, summarize, lambda p: load(p, vectors=False), lambda p: probe(p, "episode_step")):
        try:
            read(log)
        except (BadLog, BadInput):
            pass


@pytest.mark.parametrize(
    "args",
    [
        ["run", "Pendulum-v1", "--steps", "0"],
        ["run", "Pendulum-v1", "--capture", "most"],
        ["run", "Pendulum-v1", "--every", "-3"],
        ["run", "Pendulum-v1", "--part-seconds", "nan"],
        ["run", "Pendulum-v1", "--learning-rate", "-1"],
        ["run", "Pendulum-v1", "--hyperparam", "policy_kwargs=abc"],
        ["run", "Pendulum-v1", "--hyperparam", "nosuch=1"],
        ["run", "NoSuchEnv-v9"],
        ["run", "Pendulum-v1", "--framework", "jax"],
        ["run", "Pendulum-v1", "--out", "x/"],
        ["--max-memory", "lots", "report", "x.parquet"],
        ["report", "no-such.parquet"],
        ["report", "README.md"],
        ["report", "/dev/null"],
        ["report", "x" * 5000],
        ["probe", "SAMPLE", "--lags", "a,b"],
        ["probe", "SAMPLE", "--target", "obs:99999"],
        ["report", "SAMPLE", "--iteration", "999", "--html", "out.html"],
        ["arch", "no-such.zip"],
    ],
)
def test_bad_arguments_are_a_one_line_exit_2(tmp_path: Path, args: list[str]) -> None:
    args = [str(SAMPLE) if a == "SAMPLE" else a for a in args]
    (tmp_path / "README.md").write_text("# not a log\n")
    if args[-1] == "x/":
        (tmp_path / "x").write_text("a file where the directory would go")
    r = cli(*args, cwd=tmp_path)
    one_line_error(r)


def test_max_memory_bounds_the_model_zip_reader_too(tmp_path: Path) -> None:
    from sb3_contrib import RecurrentPPO

    RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", n_steps=16, batch_size=16, device="cpu").save(tmp_path / "m.zip")
    r = cli("--max-memory", "4M", "arch", str(tmp_path / "m.zip"), cwd=tmp_path)
    one_line_error(r, "4 MiB memory budget", "--max-memory")
    assert cli("--max-memory", "1G", "arch", str(tmp_path / "m.zip"), "--json", cwd=tmp_path).returncode == 0


# -- a review's findings: the budget counts what a filtered read keeps; arguments are not blamed on files -----
CARTPOLE = SAMPLE.with_name("cartpole-4env.parquet")


def test_a_filtered_read_is_counted_by_the_rows_it_keeps():
    from lstm_probe import load, pair
    from lstm_probe.log import budget

    budget.set_limit("10M")
    try:
        with pytest.raises(BadLog, match="memory budget"):
            load(CARTPOLE)  # the whole log: 7 MiB, held twice, and its row groups while they decode
        df = load(CARTPOLE, iteration=0, phase="rollout")  # 256 rows, 0.15 MB
        assert len(df) == 256 and set(df.phase) == {"rollout"}
        assert len(pair(CARTPOLE, iteration=0))
    finally:
        budget.set_limit(None)


@pytest.mark.parametrize(
    "kwargs",
    [{"iteration": "5"}, {"env": "0"}, {"phase": 1}, {"columns": "h"}, {"layer": True}],
)
def test_a_wrong_argument_is_named_not_blamed_on_the_file(kwargs):
    from lstm_probe import load, probe

    with pytest.raises(BadInput, match=f"load\\({next(iter(kwargs))}="):
        load(CARTPOLE, **kwargs)
    with pytest.raises(BadInput, match="lags must be integers"):
        probe(CARTPOLE, "episode_step", lags=["a"])


def test_max_memory_anywhere_on_the_line_and_flags_typed_at_their_default(tmp_path: Path) -> None:
    wide = _wide_log(tmp_path / "wide.parquet", 1 << 16, columns=("h", "c"), rows_per_group=518)
    one_line_error(cli("report", str(wide), "--max-memory", "256M", cwd=tmp_path), "256 MiB memory budget")
    assert cli("report", str(SAMPLE), "--max-memory=1G", cwd=tmp_path).returncode == 0
    r = cli("run", "CartPole-v1", "--framework", "rllib", "--out", "run.parquet", cwd=tmp_path)
    one_line_error(r, "end --out with '/'")
    one_line_error(cli("run", "Pendulum-v1", "--part-seconds", "inf", cwd=tmp_path), "--part-seconds")
    long = tmp_path / ("d" * 240) / "x.parquet"
    r = cli("report", str(long), cwd=tmp_path)
    one_line_error(r)
    assert str(long) in r.stderr  # a path in an error is never cut


def test_a_summary_logs_null_vectors_are_not_read(tmp_path: Path) -> None:
    """A summary log stores no h or c: load() does not read them (Arrow would allocate their full width for
    every null row: 716 MB per row group at hidden 256) and returns them as None."""
    import lstm_probe
    from lstm_probe.log import budget

    res = lstm_probe.run(
        "Pendulum-v1",
        tmp_path / "s.parquet",
        steps=128,
        n_steps=64,
        batch_size=32,
        hidden_size=1024,
        capture="summary",
        torch_threads=1,
    )
    budget.set_limit("16M")  # the null vectors alone, read: 2 x 1024 x 4 B x rows x 2 > 100 MB
    try:
        df = lstm_probe.load(res.path)
    finally:
        budget.set_limit(None)
    assert len(df) == res.rows and df["h"].isna().all() and df["c"].isna().all()
    assert df["h_norm"].notna().all()


def test_epochs_and_minibatches_far_apart_are_reported_not_a_crash(tmp_path: Path) -> None:
    """Staleness groups drifts by (module, layer, epoch, minibatch) in one int64 key; a file's epoch and minibatch
    as far apart as int32 allows did not fit it, and the report stopped on an assertion. Now grouped on their
    distinct rows: the same figures under the file's labels."""
    src = pq.read_table(SAMPLE)
    big = np.iinfo(np.int32).max
    t = src
    for name in ("epoch", "minibatch"):
        values = t.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        values = np.where(values == 1, big, values)  # epoch 1 and minibatch 1 become int32's largest
        arr = pa.array(np.nan_to_num(values, nan=0).astype(np.int64), t.schema.field(name).type, mask=np.isnan(values))
        t = t.set_column(t.schema.get_field_index(name), t.schema.field(name), arr)
    log = tmp_path / "far.parquet"
    pq.write_table(t, log)
    rep = lstm_probe.summarize(log)
    epochs = {row["epoch"] for row in rep.staleness.by_epoch}  # the scan holds them as float32: 2**31 here
    assert 0 in epochs and max(epochs) >= big - 1
    assert any(row["epoch"] >= big - 1 and row["minibatch"] >= big - 1 for row in rep.staleness.by_update)
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "report", str(log)], capture_output=True, text=True, env=ENV
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
