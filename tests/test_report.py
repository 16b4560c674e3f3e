"""summarize() on real logs: numbers recomputed independently from the rows, and bad logs."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset  # pa.dataset
import pyarrow.parquet as pq
import pytest
import torch
from conftest import probed_run
from torch import nn

import lstm_probe
from lstm_probe import summarize
from lstm_probe.log.metadata_types import clean_device


@pytest.mark.parametrize(
    "env_id,opts",
    [
        ("Pendulum-v1", {"n_envs": 4}),
        ("CartPole-v1", {}),
        ("Pendulum-v1", {"shared_lstm": True}),
        ("CartPole-v1", {"critic_lstm": False}),
        ("Pendulum-v1", {"lstm_layers": 2, "n_envs": 2}),
    ],
)
def test_report_numbers_match_rows(runs_dir, env_id, opts):
    result = probed_run(runs_dir, env_id, **opts)
    rep = summarize(result.path)
    df = lstm_probe.load(result.path, vectors=False)
    assert rep.run.rows == len(df) and rep.run.completed and rep.run.env_id == env_id
    n_steps, n_envs = 32, opts.get("n_envs", 1)
    # calls: one rollout call per module per rollout step
    roll_calls = {g.module: g.calls for g in rep.calls.groups if g.phase == "rollout"}
    steps = df[(df.phase == "rollout")].env_step.nunique()
    assert all(v == steps for v in roll_calls.values())
    rollout_shapes = {k for g in rep.calls.groups if g.phase == "rollout" for k in g.shapes}
    assert rollout_shapes == {f"1 x {n_envs}"}
    # sequences per minibatch, recomputed from first principles: 1 + the episode starts and env
    # boundaries strictly inside the minibatch (sb3-contrib create_sequencers)
    t = df[(df.phase == "train") & (df.module == "actor") & (df.layer == 0) & ~df.padding]
    expected: dict[int, int] = {}
    for _, mb in t.groupby(["iteration", "epoch", "minibatch"]):
        firsts = mb[mb.t == 0]
        inner = firsts[firsts.seq > 0]
        cuts = (inner.episode_start.astype(bool) | (inner.env_step % n_steps == 0)).sum()
        assert cuts == len(inner)
        n = 1 + int(cuts)
        expected[n] = expected.get(n, 0) + 1
    assert rep.calls.sequences_per_minibatch == dict(sorted(expected.items()))
    assert rep.calls.minibatches == sum(expected.values())
    # sequence lengths add up to the rollout size per epoch
    starts = t[t.t == 0]
    per_epoch = starts.groupby(["iteration", "epoch"]).seq_len.sum()
    assert (per_epoch == n_steps * n_envs).all()
    assert rep.sequences.sequences == len(starts)
    assert rep.sequences.length["max"] == starts.seq_len.max()
    assert rep.staleness.provenance_ok is True
    assert rep.staleness.provenance_max_drift_h < 1e-5
    assert {r["module"] for r in rep.staleness.by_epoch} == set(df.module)
    # drift per module, layer and epoch / update, recomputed with pandas from the rows of every layer
    tr = df[(df.phase == "train") & ~df.padding & df.drift_h.notna() & (df.t >= 0)]
    g = tr.groupby([tr.module.astype(str), "layer", "epoch"]).agg(
        rows=("drift_h", "size"), h=("drift_h", "mean"), m=("drift_c", "max")
    )
    got = {
        (r["module"], r["layer"], r["epoch"]): (r["rows"], r["drift_h_mean"], r["drift_c_max"])
        for r in rep.staleness.by_epoch
    }
    assert set(got) == set(g.index)
    for key, row in g.iterrows():
        assert got[key][0] == row.rows and got[key][1] == pytest.approx(row.h, rel=1e-5, abs=1e-12)
        assert got[key][2] == pytest.approx(row.m, rel=1e-6, abs=1e-12)
    mb = tr.groupby(["iteration", "epoch", "minibatch"]).ngroup()
    update = mb - mb.groupby(tr.iteration).transform("min")
    counts = tr.groupby([tr.module.astype(str), "layer", update]).size()
    assert {(r["module"], r["layer"], r["update"]): r["rows"] for r in rep.staleness.by_update} == counts.to_dict()
    # the provenance check: the first minibatch of epoch 0, per layer
    first = tr[(tr.epoch == 0) & (tr.minibatch == 0)]
    per_layer = first.groupby("layer").size()
    assert {r["layer"]: r["rows"] for r in rep.staleness.provenance_by_layer} == per_layer.to_dict()
    assert rep.staleness.provenance_check_rows == len(first)
    # calls per (module, phase, path), from the rows; rows per layer
    calls = df[df.layer == 0].groupby(["module", "phase", "path"], observed=True).call.nunique()
    assert {(g.module, g.phase, g.path): g.calls for g in rep.calls.groups} == calls.to_dict()
    rows = df[df.t >= 0].groupby(["module", "phase", "path", "layer"], observed=True).size()
    assert {(g.module, g.phase, g.path, k): n for g in rep.calls.groups for k, n in g.rows_by_layer.items()} == (
        rows.to_dict()
    )
    assert [h["layer"] for h in rep.health.layers if h["module"] == "actor"] == list(range(opts.get("lstm_layers", 1)))
    assert any("provenance check" in f for f in rep.findings)
    json.dumps(rep.to_dict())  # JSON-able


def test_episode_lengths_pendulum(runs_dir):
    result = probed_run(runs_dir, "Pendulum-v1", steps=256, n_steps=128, batch_size=128, n_epochs=2)
    rep = summarize(result.path)
    assert rep.sequences.episodes_completed == 1 and rep.sequences.episode_length["max"] == 200
    assert rep.calls.sequence_start_reasons["split"] == 4  # one per epoch, 2 iterations x 2 epochs
    assert rep.architecture.critic == "lstm"


def same(a, b, path="report"):
    """Equal reports: integers, strings and keys exactly; floats to 1e-12 (sums added in another order)."""
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not float(a).is_integer():
        assert a == pytest.approx(b, rel=1e-12, abs=1e-15), path
    else:
        assert a == b, path


@pytest.mark.parametrize(
    "env_id,opts",
    [
        ("Pendulum-v1", {"n_envs": 4}),
        ("CartPole-v1", {}),
        ("Pendulum-v1", {"lstm_layers": 2, "n_envs": 2}),
        ("Pendulum-v1", {"steps": 256, "n_steps": 128, "batch_size": 128, "n_epochs": 2}),
    ],
)
def test_report_reads_runs_of_iterations(runs_dir, env_id, opts):
    """The report reads a large log in runs of whole iterations (its memory bound): any run size gives the
    same report as one read, episodes that span runs included."""
    from lstm_probe.log.reader import dataset
    from lstm_probe.report.scan import chunks as _chunks

    result = probed_run(runs_dir, env_id, **opts)
    df = lstm_probe.load(result.path, vectors=False)
    per_iteration = df[(df.layer == 0) & (df.t >= 0)].groupby("iteration").size()
    data, _ = dataset(result.path)
    first = (pa.dataset.field("layer") == 0) & (pa.dataset.field("t") >= 0)
    runs = _chunks(data, first, 1)
    assert [n for _, n in runs] == per_iteration.tolist()  # one run per iteration, with its row count
    assert [n for _, n in _chunks(data, first, 10**9)] == [per_iteration.sum()]
    two = _chunks(data, first, int(per_iteration.iloc[:2].sum()))
    assert two[0][1] == per_iteration.iloc[:2].sum() and len(two) < len(runs)
    whole = summarize(result.path).to_dict()
    for rows in (1, int(per_iteration.max()) + 1, int(per_iteration.sum()) - 1):
        same(summarize(result.path, chunk_rows=rows).to_dict(), whole)
    if opts.get("steps") == 256:  # the episode of 200 steps spans iterations 0 and 1
        assert whole["sequences"]["episodes_completed"] == 1
    with pytest.raises(ValueError, match="chunk_rows"):
        summarize(result.path, chunk_rows=0)


def make_log(tmp_path, name="g.parquet", calls=3):
    torch.manual_seed(0)
    m = nn.LSTM(2, 4)
    path = tmp_path / name
    with torch.no_grad(), lstm_probe.trace(m, path):
        for _ in range(calls):
            m(torch.randn(1, 2, 2))
    return path


def test_zero_row_log_reports_with_warning(tmp_path):
    path = make_log(tmp_path, calls=0)
    rep = summarize(path)
    assert rep.run.rows == 0 and any("no rows" in w for w in rep.warnings)


def test_newer_schema_is_refused(tmp_path):
    path = make_log(tmp_path)
    t = pq.read_table(path)
    meta = dict(t.schema.metadata)
    meta[b"lstm_probe.schema_version"] = b"99"
    pq.write_table(t.replace_schema_metadata(meta), tmp_path / "new.parquet")
    with pytest.raises(lstm_probe.BadLog, match="newer than this lstm-probe reads"):
        summarize(tmp_path / "new.parquet")


def test_missing_column_is_refused(tmp_path):
    path = make_log(tmp_path)
    t = pq.read_table(path).drop_columns(["env_step"])
    pq.write_table(t, tmp_path / "cut.parquet")
    with pytest.raises(lstm_probe.BadLog, match="lacks the column"):
        summarize(tmp_path / "cut.parquet")


def test_truncated_file_is_refused(tmp_path):
    path = make_log(tmp_path)
    data = path.read_bytes()
    (tmp_path / "trunc.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(lstm_probe.BadLog, match="not a readable Parquet file"):
        summarize(tmp_path / "trunc.parquet")


def test_log_metadata_is_json_not_pickle(tmp_path):
    path = make_log(tmp_path)
    meta = pq.ParquetFile(path).schema_arrow.metadata
    json.loads(meta[b"lstm_probe.run"])
    assert b"pandas" not in meta  # nothing but our JSON and the version


def test_dataset_directory_output(tmp_path):
    m = nn.LSTM(2, 4)
    out = tmp_path / "ds"
    with torch.no_grad(), lstm_probe.trace(m, str(out) + "/"):
        for _ in range(5):
            m(torch.randn(1, 3, 2))
    parts = sorted(out.glob("part-*.parquet"))
    assert parts
    assert len(lstm_probe.load(out)) == 15
    import pyarrow.dataset as ds

    assert ds.dataset(str(out), format="parquet").count_rows() == 15  # any Arrow engine reads it as one table
    assert summarize(out).run.rows == 15


def test_nan_states_are_data(tmp_path):
    m = nn.LSTM(2, 4)
    with torch.no_grad(), lstm_probe.trace(m, tmp_path / "nan.parquet") as probe, probe.tag(phase="rollout"):
        m(torch.full((1, 1, 2), float("nan")))
        m(torch.randn(1, 1, 2))
    df = lstm_probe.load(tmp_path / "nan.parquet")
    assert np.isnan(lstm_probe.states(df, "h")[0]).all()
    rep = summarize(tmp_path / "nan.parquet")
    assert rep.run.rows == 2
    assert rep.health.layers[0]["nan_or_inf_rows"] == 1
    assert any("NaN" in f for f in rep.findings)


def test_the_first_non_finite_state_is_located(tmp_path):
    """Where NaN or inf first appeared (the run's first bad rollout state, in call order), so that one
    ``load(env=..., episode=...)`` reads it: env 1 of iteration 2, then every env."""
    m = nn.LSTM(2, 4)
    path = tmp_path / "nan.parquet"
    with torch.no_grad(), lstm_probe.trace(m, path) as probe:
        with probe.tag(phase="rollout", iteration=1, env=[0, 1], env_step=[0, 0], episode=[0, 0], episode_step=[0, 0]):
            m(torch.randn(1, 2, 2))
        with probe.tag(phase="rollout", iteration=2, env=[0, 1], env_step=[7, 7], episode=[0, 3], episode_step=[7, 2]):
            x = torch.randn(1, 2, 2)
            x[0, 1] = float("nan")
            m(x)
        with probe.tag(phase="rollout", iteration=2, env=[0, 1], env_step=[8, 8], episode=[0, 3], episode_step=[8, 3]):
            m(torch.full((1, 2, 2), float("nan")))
    layer = summarize(path).health.layers[0]
    assert layer["nan_or_inf_rows"] == 3
    where = {"call": 1, "iteration": 2, "env": 1, "env_step": 7, "episode": 3, "episode_step": 2}
    assert layer["first_nan_or_inf"] == where
    (line,) = [f for f in summarize(path).findings if "NaN" in f]
    assert line.endswith("the first at iteration 2, env 1, env step 7, episode 3, its step 2, call 1")
    # a loop traced without what-if and memory: "not in this log" says what would add each (memory said nothing)
    absent = summarize(path).unavailable
    assert any(u.startswith("the memory horizon") and "trace(..., memory=True" in u for u in absent), absent
    assert any(u.startswith("what if") and "trace(..., what_if=True)" in u for u in absent), absent


def test_foreign_parquet_with_lstm_like_columns(tmp_path):
    t = pa.table({"call": [1], "h": [[0.1]]})
    pq.write_table(t, tmp_path / "f.parquet")
    with pytest.raises(lstm_probe.BadLog, match="not an lstm-probe log"):
        summarize(tmp_path / "f.parquet")


def test_duplicate_rows_warn(tmp_path):
    m = nn.LSTM(2, 4)
    path = tmp_path / "tagged.parquet"
    with torch.no_grad(), lstm_probe.trace(m, path) as probe, probe.tag(phase="rollout", env=[0, 1]):
        for _ in range(3):
            m(torch.randn(1, 2, 2))
    t = pq.read_table(path)
    pq.write_table(pa.concat_tables([t, t]).replace_schema_metadata(t.schema.metadata), tmp_path / "dup.parquet")
    rep = summarize(tmp_path / "dup.parquet")
    assert any("6 duplicate rows" in w for w in rep.warnings)
    assert not any("duplicate" in w for w in summarize(path).warnings)


def test_wrong_column_type_is_refused(tmp_path):
    path = make_log(tmp_path)
    t = pq.read_table(path)
    i = t.schema.get_field_index("env_step")
    t = t.set_column(i, "env_step", t["env_step"].cast(pa.string()))
    pq.write_table(t, tmp_path / "typed.parquet")
    with pytest.raises(lstm_probe.BadLog, match="env_step is string, expected int64"):
        summarize(tmp_path / "typed.parquet")


def test_shards_of_several_processes_read_as_one_log(tmp_path):
    """Each worker process writes its own part files into one directory; readers see one log."""
    import subprocess
    import sys

    script = """
import sys, torch, lstm_probe
from torch import nn
torch.manual_seed(int(sys.argv[2]))
m = nn.LSTM(2, 4)
with torch.no_grad(), lstm_probe.trace(m, sys.argv[1], shard=f"worker{sys.argv[2]}") as probe:
    for t in range(5):
        with probe.tag(phase="rollout", iteration=0, env=[0, 1], env_step=t):
            m(torch.randn(1, 2, 2))
"""
    out = f"{tmp_path}/multi/"
    procs = [subprocess.Popen([sys.executable, "-c", script, out, str(w)]) for w in range(3)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    names = sorted(p.name for p in (tmp_path / "multi").glob("part-*.parquet"))
    assert {n.split("-")[1] for n in names} == {"worker0", "worker1", "worker2"}
    info = lstm_probe.read_info(out)
    assert info.rows == 3 * 10 and info.completed and set(info.metadata["shards"]) == {"worker0", "worker1", "worker2"}
    assert len(lstm_probe.load(out)) == 30
    assert summarize(out).run.rows == 30
    with pytest.raises(lstm_probe.BadInput, match="shards need a directory"):
        lstm_probe.trace(nn.LSTM(2, 4), tmp_path / "x.parquet", shard="w0").start()


def test_row_keys_are_exact_for_large_call_ids():
    """Rows are grouped and checked for duplicates by one int64 key per row; call ids of other processes
    start at multiples of 10**12 (RLlib), beyond float64's exact integers once combined."""
    import pandas as pd

    from lstm_probe.report.numeric import row_key as _key
    from lstm_probe.report.scan import duplicates as _duplicates

    call = np.array([10**15 + 7, 10**15 + 7, 10**15 + 8, 10**12, 10**15 + 7], np.int64)
    col = np.array([21, 20, 21, 0, np.nan], np.float32)
    t = np.array([7, 7, 0, 3, 1], np.int32)
    key = _key([call, col, t])
    assert key is not None and len(set(key.tolist())) == 5
    # orders as the tuples, null (NaN) after every value
    tuples = [(c, np.inf if np.isnan(x) else x, s) for c, x, s in zip(call, col, t, strict=True)]
    assert np.argsort(key, kind="stable").tolist() == sorted(range(5), key=lambda i: tuples[i])
    frame = pd.DataFrame({"call": call, "seq": col, "env": np.float32(np.nan), "t": t})
    assert _duplicates(frame) == 0
    assert _duplicates(pd.concat([frame, frame.iloc[[0, 2]]])) == 2
    assert _key([np.array([0, 2**40]), np.array([0, 2**30]), np.array([0, 2**30])]) is None  # too wide
    # dense_key: the same order whatever the range (ranks of each column, combined two at a time)
    from lstm_probe.report.numeric import dense_key

    wide = [
        np.array([2**40, 0, 2**40, 5, 2**40]),
        np.array([np.nan, 1, 2**30, 2**31, np.nan]),
        np.array([1, 0, 0, 9, 1]),
    ]
    tuples = [tuple(np.inf if np.isnan(x) else x for x in row) for row in zip(*wide, strict=True)]
    key = dense_key(wide)
    assert key.dtype == np.int64 and key[0] == key[4] and len(set(key.tolist())) == 4
    assert np.argsort(key, kind="stable").tolist() == sorted(range(5), key=lambda i: tuples[i])


def test_group_labels_are_read_off_the_keys():
    """labelled_groups: the groups of row_key, each with the values its rows hold (NaN: null), for dense keys
    (counted) and sparse ones (sorted) alike."""
    from lstm_probe.report.numeric import groups, labelled_groups, row_key

    rng = np.random.default_rng(0)
    dense = [rng.integers(-3, 4, 1000).astype(np.int8), rng.integers(0, 5, 1000).astype(np.float32)]
    dense[1][rng.random(1000) < 0.1] = np.nan
    sparse = [np.array([10**9, 5, 10**9, -7, 5]), np.array([np.nan, 2.0, np.nan, 0.0, 3.0])]
    for columns in (dense, sparse):
        got = labelled_groups(columns)
        assert got is not None
        inv, n, labels = got
        key = row_key(columns)
        assert key is not None
        want_inv, want_n = groups(key)
        assert n == want_n and np.array_equal(inv, want_inv)
        for col, label in zip(columns, labels, strict=True):
            assert np.array_equal(label[inv], col.astype(np.float64), equal_nan=True)
    assert labelled_groups([np.array([0, 2**40]), np.array([0, 2**30])]) is None  # too wide for one key


SPOOF = "[bold red on white]SPOOF[/]"
CONTROL = "\x1b]0;title\x07\x1b[2J"
SCRIPT = "<script>alert(1)</script>"


def hostile_log(tmp_path):
    """A real log whose metadata and module names hold rich markup, terminal escape sequences and HTML."""
    from pathlib import Path

    import pyarrow.compute as pc

    src = pq.ParquetFile(Path(__file__).parent.parent / "sample_runs" / "pendulum-1env.parquet")
    t = src.read()
    run = json.loads(t.schema.metadata[b"lstm_probe.run"])
    final = json.loads(src.metadata.metadata[b"lstm_probe.final"])
    name = f"actor{SPOOF}{CONTROL}"
    run["env_id"] = SPOOF + CONTROL + SCRIPT
    run["algorithm"] = SCRIPT + CONTROL
    run["versions"]["torch"] = SPOOF + CONTROL
    run["hyperparameters"]["clip_range"] = SPOOF + CONTROL
    arch = run["architecture"]
    arch["modules"] = {name if k == "actor" else k: v for k, v in arch["modules"].items()}
    arch["gradient_flow"]["verdict"] = f"{SCRIPT}{SPOOF}{CONTROL}"
    final.update(completed=False, stop_reason=CONTROL + SPOOF + SCRIPT)
    module = pc.if_else(pc.equal(t["module"], "actor"), name, t["module"])
    t = t.set_column(t.schema.get_field_index("module"), "module", module)
    meta = {**t.schema.metadata, b"lstm_probe.run": json.dumps(run).encode()}
    path = tmp_path / "hostile.parquet"
    with pq.ParquetWriter(path, t.schema.with_metadata(meta)) as w:
        w.write_table(t)
        w.add_key_value_metadata({"lstm_probe.final": json.dumps(final)})
    return path, name


def test_strings_from_the_log_cannot_drive_the_terminal(tmp_path):
    """Markup in the log's strings prints as written and control characters are written out (\\x1b), in
    every place the text report shows them; --json keeps the exact strings; the HTML page escapes them."""
    import os
    import subprocess
    import sys

    path, name = hostile_log(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    env["COLUMNS"] = "1000"  # no wrapping inside the strings checked below

    def report(*args):
        r = subprocess.run(
            [sys.executable, "-m", "lstm_probe", "report", str(path), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        return r

    r = report()
    written = CONTROL.replace("\x1b", "\\x1b").replace("\x07", "\\x07")
    assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout + r.stderr
    assert f"env {SPOOF}{written}{SCRIPT}," in r.stdout  # Run: env id as written
    assert f"NOT completed: {written}{SPOOF}{SCRIPT}" in r.stdout  # Run: stop reason
    assert f"clip_range={SPOOF}{written}" in r.stdout and f"torch {SPOOF}{written}" in r.stdout
    assert f"{SCRIPT}{SPOOF}{written} (gradient flow measured" in r.stdout  # Architecture verdict
    shown = name.replace(CONTROL, written)
    assert f"{shown}: LSTM hidden" in r.stdout  # Architecture: module names
    assert r.stdout.count(shown) >= 6  # the calls, staleness and health tables, drift lines
    assert f"the run did not complete: {written}{SPOOF}{SCRIPT}" in r.stdout  # Findings

    doc = json.loads(report("--json").stdout)
    assert doc["run"]["env_id"] == SPOOF + CONTROL + SCRIPT
    assert doc["run"]["stop_reason"] == CONTROL + SPOOF + SCRIPT
    assert name in doc["architecture"]["modules"] and name in {g["module"] for g in doc["calls"]["groups"]}
    assert any(f.endswith(CONTROL + SPOOF + SCRIPT) for f in doc["findings"])

    pytest.importorskip("matplotlib")
    page = tmp_path / "hostile.html"
    r = report("--html", str(page))
    assert "\x1b" not in r.stdout + r.stderr
    html = page.read_text()
    assert "\x1b" not in html and "\x07" not in html and "<script" not in html
    escaped = f"{SPOOF}{written}&lt;script&gt;alert(1)&lt;/script&gt;"
    assert escaped in html  # env id
    assert f"&lt;script&gt;alert(1)&lt;/script&gt;{written}" in html  # algorithm
    assert f"the run did not complete: {written}{SPOOF}&lt;script&gt;" in html  # findings
    assert f"&lt;script&gt;alert(1)&lt;/script&gt;{SPOOF}{written}" in html  # architecture verdict


def blocks_of(rep):
    from lstm_probe.report import Line, Panel, Table

    out = {"lines": [], "tables": {}, "panels": {}}
    for section in rep.text():
        for b in section:
            if isinstance(b, Line):
                out["lines"].append(b.text)
            elif isinstance(b, Table):
                out["tables"][b.title.split(" (")[0].split(":")[0]] = b
            elif isinstance(b, Panel):
                out["panels"][b.title] = "\n".join(b.lines)
    return out


def test_two_layer_report_covers_every_layer(runs_dir):
    """With two LSTM layers the calls table, the provenance check and the staleness table count every
    layer's rows, per layer (numbers recomputed with pandas)."""
    result = probed_run(runs_dir, "Pendulum-v1", lstm_layers=2, n_envs=2)
    rep = summarize(result.path)
    df = lstm_probe.load(result.path, vectors=False)
    text = blocks_of(rep)
    calls = text["tables"]["Calls"]
    assert calls.columns == ("module", "phase", "path", "calls", "layers", "rows per layer", "shapes")
    per = df.groupby(["module", "phase", "path", "layer"], observed=True).size()
    assert len(calls.rows) == 7
    for row in calls.rows:
        counts = per.loc[(row[0], row[1], row[2])]
        assert list(counts.index) == [0, 1] and row[4] == "2"
        assert counts.nunique() == 1 and row[5] == f"{counts.iloc[0]:,}"
    tr = df[(df.phase == "train") & ~df.padding & df.drift_h.notna()]
    first = tr[(tr.epoch == 0) & (tr.minibatch == 0)]
    line = next(t for t in text["lines"] if t.startswith("provenance check"))
    for layer in (0, 1):
        mine = first[first.layer == layer]
        assert (
            f"layer {layer}: h {float(mine.drift_h.max()):.2g}, c {float(mine.drift_c.max()):.2g} over "
            f"{len(mine):,} rows" in line
        ), line
    assert "||train - rollout|| / ||rollout||" in line and line.endswith("[green]OK[/] (allowed 0.0001)")
    stale = text["tables"]["Staleness"]
    assert stale.columns[:4] == ("module", "layer", "epoch", "rows")
    expect = tr.groupby([tr.module.astype(str), "layer", "epoch"]).size()
    assert {(r[0], int(r[1]), int(r[2])): int(r[3].replace(",", "")) for r in stale.rows} == expect.to_dict()
    assert "of actor layer 1 by minibatch order" in " ".join(text["lines"])
    health = text["tables"]["State health"]
    assert [(r[0], r[1]) for r in health.rows] == [("actor", "0"), ("actor", "1"), ("critic", "0"), ("critic", "1")]
    assert any("(layers 0 and 1)" in f for f in rep.findings)


def test_gru_report_says_only_what_the_log_holds(tmp_path):
    """A GRU traced by the generic tracer (tagged rollout and train calls, no start reasons, no stored
    states): no cell state, no LSTM, no made-up start reasons or stored-state share."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(3, 8)
            self.head = nn.Linear(8, 1)

        def forward(self, x, h=None):
            y, h = self.gru(x, h)
            return self.head(y), h

    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    path = tmp_path / "gru.parquet"
    with lstm_probe.trace(m, path) as probe:
        for it in range(2):
            h = torch.zeros(1, 2, 8)
            with torch.no_grad():
                for t in range(6):
                    tags = dict(env=[0, 1], env_step=it * 6 + t, episode=[it, it], episode_step=t)
                    with probe.tag(phase="rollout", iteration=it, **tags):
                        _, h = m(torch.randn(1, 2, 3), h)
            for epoch in range(2):
                with probe.tag(phase="train", iteration=it, epoch=epoch, minibatch=0):
                    y, _ = m(torch.randn(6, 2, 3))  # from zeros
                    opt.zero_grad()
                    y.pow(2).mean().backward()
                    opt.step()
    rep = summarize(path)
    text = blocks_of(rep)
    assert rep.calls.explanation == (
        "Rollout calls have batch 2. A training call's batch is the number of sequences in its minibatch: here 2 "
        "sequences per minibatch, over 4 minibatches; why a sequence starts where it does: not recorded (the "
        "integration that wrote this log does not say why a training sequence starts)."
    )
    assert rep.findings == [
        "gradients flow back at most 6 steps (median 6) through the training sequences, while completed episodes "
        "last 6 steps (the median of 2 episodes)",
        "0% of training rows are padding",
        "training minibatches hold 2 sequences: that is the batch dimension of the GRU's training-time hidden state",
    ]
    assert text["panels"]["Sequences"].splitlines()[-1] == (
        "padding 0.0% of train rows; whether sequences start from stored states is not recorded (the log declares "
        "no stored states)"
    )
    health = text["tables"]["State health"]
    assert health.columns == ("module", "layer", "rows", "saturated", "dead units", "constant units", "NaN/inf")
    assert health.rows[0][:3] == ("gru", "0", "24")
    everything = json.dumps(
        [text["lines"], text["panels"], [(t.columns, t.rows) for t in text["tables"].values()], rep.findings]
    )
    assert "LSTM" not in everything and "stored mid-episode" not in everything and "by reason: ." not in everything
    doc = rep.to_dict()
    assert doc["sequences"]["stored_state_share"] is None and doc["health"]["layers"][0]["c_norm_max"] is None
    assert doc["calls"]["kind"] == "GRU"


def test_findings_in_plain_words():
    """Wording on the sb3 sample log: one completed episode is one, not 'a median of 1'; a drift ratio says
    which states are farther from what; the provenance check says what it compares."""
    from pathlib import Path

    rep = summarize(Path(__file__).parent.parent / "sample_runs" / "pendulum-1env.parquet")
    f = rep.findings
    assert f[0] == (
        "gradients flow back at most 32 steps (median 21) through the training sequences, while the one completed "
        "episode lasts 200 steps"
    )
    assert "training minibatches hold 1 to 3 sequences: that is the batch dimension of the LSTM's training-time " in (
        " ".join(f)
    )
    assert (
        "provenance check OK: in the first minibatch (before any optimizer step) train states differ from the "
        "rollout states of the same env step by at most 1.6e-07 (h) and 1.5e-07 (c) relative to the rollout "
        "state's norm, over 256 rows"
    ) in f
    assert (
        "by the last epoch critic states are 18.3x as far from their rollout states as actor states (mean relative "
        "drift actor 0.0026, critic 0.048)"
    ) in f
    assert rep.sequences.stored_state_share == pytest.approx(0.84, abs=0.005)


def test_report_needs_neither_pandas_nor_torch():
    """`lstm-probe report` starts fast: the report's own code imports neither pandas nor torch. pyarrow
    imports pandas by itself where it can (pyarrow.dataset converts a Python scalar on import), so the
    check runs where pandas cannot be imported, and the report is the same there."""
    import subprocess
    import sys
    from pathlib import Path

    sample = Path(__file__).parent.parent / "sample_runs" / "pendulum-1env.parquet"
    script = """
import json, sys

class NoPandas:  # pandas is not installed, as far as this process can tell
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "pandas":
            raise ImportError("no pandas here")

sys.meta_path.insert(0, NoPandas())
import lstm_probe.report

doc = lstm_probe.report.summarize(sys.argv[1]).to_dict()
print(json.dumps({"doc": doc, "modules": [m for m in ("pandas", "torch") if m in sys.modules]}))
"""
    r = subprocess.run([sys.executable, "-c", script, str(sample)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["modules"] == []
    assert out["doc"] == json.loads(json.dumps(summarize(sample).to_dict()))


def test_phase_pure_row_groups_report_the_same(tmp_path):
    """Row groups that hold train rows apart from all other phases (the writer's layout) let the health
    section skip the train row groups by their statistics; the report is the same as on row groups of mixed
    phases, and the same again when strings are read as dictionaries or as strings."""
    from pathlib import Path

    import pyarrow.compute as pc

    from lstm_probe.log.reader import dataset
    from lstm_probe.report.scan import COLUMNS, FIRST_LAYER, read_scalars, with_dictionaries

    src = Path(__file__).parent.parent / "sample_runs" / "pendulum-1env.parquet"
    table = pq.read_table(src)
    train = pc.equal(table["phase"], "train").fill_null(False)
    mixed, pure = tmp_path / "mixed.parquet", tmp_path / "pure.parquet"
    pq.write_table(table, mixed, row_group_size=1000)
    with pq.ParquetWriter(pure, table.schema) as w:
        w.write_table(table.filter(pc.invert(train)), row_group_size=1000)  # each call starts new row groups
        w.write_table(table.filter(train), row_group_size=1000)
    rollout = pa.dataset.field("phase") == "rollout"
    kept = {
        name: sum(len(f.split_by_row_group(rollout)) for f in pa.dataset.dataset(path).get_fragments())
        for name, path in (("mixed", mixed), ("pure", pure))
    }
    groups = pq.ParquetFile(pure).metadata.num_row_groups
    train_groups = (int(pc.sum(train).as_py()) + 999) // 1000
    assert kept["pure"] == groups - train_groups < kept["mixed"]  # every train row group skipped
    a, b = summarize(mixed).to_dict(), summarize(pure).to_dict()
    for doc in (a, b):
        doc.pop("path"), doc["run"].pop("file_bytes")
    assert json.dumps(a) == json.dumps(b)
    data, _ = dataset(pure)
    plain, front = read_scalars(data, COLUMNS, FIRST_LAYER)
    coded, front2 = read_scalars(with_dictionaries(data, COLUMNS), COLUMNS, FIRST_LAYER)
    assert front == front2 and 0 < front < len(plain)
    for name in COLUMNS:
        if name in ("module", "phase", "path", "seq_reason", "bootstrap"):
            words = [plain.words(name)[c] if c >= 0 else None for c in plain[name]]
            assert words == [coded.words(name)[c] if c >= 0 else None for c in coded[name]], name
        else:
            assert np.array_equal(plain[name], coded[name], equal_nan=True), name


def test_runs_selected_in_numpy_equal_arrow_filter():
    """Where every row is a first-layer row, a run's rows are read from the row groups its iterations may be
    in and selected by iteration in numpy: the same rows, in the same order, as Arrow's row filter gives."""
    from pathlib import Path

    from lstm_probe.log.reader import dataset
    from lstm_probe.report.scan import COLUMNS, FIRST_LAYER, _plan, read_scalars, with_dictionaries

    src = Path(__file__).parent.parent / "sample_runs" / "pendulum-1env.parquet"
    table = pq.read_table(src)
    path = Path(src)
    data, _ = dataset(path)
    assert data.count_rows(filter=~FIRST_LAYER) == 0
    strings = with_dictionaries(data, COLUMNS)
    runs = _plan(data, None, 1)  # one run per iteration
    assert len(runs) == len(set(table["iteration"].to_pylist())) > 1 and all(it is not None for *_, it in runs)
    for filt, rows, iterations in runs:
        mine, front = read_scalars(strings, COLUMNS, filt, rows, iterations)
        arrow, front2 = read_scalars(strings, COLUMNS, filt & FIRST_LAYER, rows)
        assert front == front2 and len(mine) == len(arrow) == rows
        for name in COLUMNS:
            assert np.array_equal(mine[name], arrow[name], equal_nan=True), name


def test_report_tables_never_cut_a_number():
    """The CLI's tables at any width: every number whole (rich's own layout cut KL to '1.36e-…' at 80 columns),
    headers and multi-number cells wrapped at spaces, no line wider than the console; where even the longest words
    do not fit, one wrapped line per row. At a width that holds the table, rich's own drawing, unchanged."""
    import io

    from rich.console import Console
    from rich.table import Table as RichTable

    from lstm_probe.cli.render import _table
    from lstm_probe.report import Table

    columns = ("states", "state Δ actor / critic", "value Δ/spread", "KL", "ratio Δ", "grad cos π / V", "reach")
    rows = (
        ("stored", "0.00161 / 0.272", "0.0643%", "0", "0.000133%", "0.999 / 0.987", "-"),
        ("zero", "1 / 1", "0.601%", "1.36e-06", "0.0205%", "- / -", "-"),
        ("burn-in 64 from stored", "1.33e-08 / 9.74e-05", "1.48e-05%", "4.87e-07", "2.33e-08%", "- / -", "83.3%"),
    )
    block = Table("What if, epoch 9: against refreshed states", columns, rows)
    numbers = {w for row in rows for cell in row[1:] for w in cell.split() if w not in ("/", "-")}

    def draw(width, renderables):
        console = Console(width=width, file=io.StringIO(), color_system=None)
        for r in renderables:
            console.print(r)
        return console.file.getvalue()

    for width in (80, 73, 72, 60, 40, 24):
        text = draw(width, _table(block, "10. What if", width))
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= width, text
        words = set(text.replace("│", " ").replace("┃", " ").replace(";", " ").split())
        assert numbers <= words, (width, numbers - words)
        assert ("┃" in text) == (width >= 73), text  # the longest words (51) and 7 columns of borders (22)
    natural = RichTable(title="10. What if")
    for c in columns:
        natural.add_column(c)
    for row in rows:
        natural.add_row(*row)
    assert draw(200, _table(block, "10. What if", 200)) == draw(200, [natural])
    lines = draw(200, _table(block, "10. What if", 40)).splitlines()  # the row form: one line per row
    assert lines[1] == "  states: stored; state Δ actor / critic: 0.00161 / 0.272; value Δ/spread: 0.0643%; KL: 0; " + (
        "ratio Δ: 0.000133%; grad cos π / V: 0.999 / 0.987; reach: -"
    )


def test_the_device_reads_as_torch_names_it(runs_dir):
    """sb3's hyperparameters recorded the device as its repr ("device(type='cpu')"): a new log records 'cpu', and
    an older log's repr reads back as 'cpu' (the report's JSON and read_info alike), the rest of it unchanged."""
    result = probed_run(runs_dir, "Pendulum-v1")
    raw = json.loads(pq.ParquetFile(result.path).schema_arrow.metadata[b"lstm_probe.run"])
    assert raw["hyperparameters"]["device"] == "cpu"
    sample = Path(__file__).parent.parent / "sample_runs" / "pendulum-1env.parquet"
    old = json.loads(pq.ParquetFile(sample).schema_arrow.metadata[b"lstm_probe.run"])["hyperparameters"]
    assert old["device"] == "device(type='cpu')"  # as the sample log recorded it
    assert summarize(sample).run.hyperparameters == {**old, "device": "cpu"}
    assert lstm_probe.read_info(sample).metadata["hyperparameters"]["device"] == "cpu"
    for recorded, shown in [("device(type='cuda', index=1)", "cuda:1"), ("device(type='mps')", "mps"), ("cpu", "cpu")]:
        meta = {"hyperparameters": {"device": recorded, "n_steps": 8}}
        clean_device(meta)
        assert meta["hyperparameters"] == {"device": shown, "n_steps": 8}
