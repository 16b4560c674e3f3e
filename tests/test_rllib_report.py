"""The report's cross-process check (RLlib logs) without Ray: the RLlib sample log and altered copies of its
part files (real Parquet in tmp_path), against oracles computed row by row in Python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lstm_probe.log.reader import dataset
from lstm_probe.report.sections.cross_process import CROSS_ITERATIONS, CROSS_KEYS, cross_process

SAMPLE = Path(__file__).resolve().parents[1] / "sample_runs" / "cartpole-rllib"


def copy(tmp_path: Path, runner=lambda t: t) -> Path:
    """The sample log with its env runner's part file passed through ``runner``."""
    out = tmp_path / "log"
    out.mkdir()
    for f in sorted(SAMPLE.glob("*.parquet")):
        t = pq.read_table(f)
        pq.write_table(runner(t) if "runner" in f.name else t, out / f.name)
    return out


def is_rollout(t: pa.Table) -> np.ndarray:
    return pc.equal(t["phase"], "rollout").to_numpy(zero_copy_only=False)


def test_the_sample_logs_check_exactly():
    """Values of the sample log (pinned: the drift means in float32, as the report has always given them)."""
    data, _ = dataset(SAMPLE)
    x = cross_process(data, vectors=True)
    assert (x.state_in_rows, x.zero_starts, x.unpaired) == (317, 136, 0)
    assert x.state_in_max_abs == {"actor": 0.0, "critic": 0.0} and x.state_in_ok and x.zero_starts_ok
    assert [(r["module"], r["iteration"], r["rows"]) for r in x.first_pass] == [
        *(("actor", i, n) for i, n in enumerate([65, 63, 62, 57])),
        *(("critic", i, n) for i, n in enumerate([201, 197, 196, 190])),
    ]
    assert x.by_minibatch[0] == {
        "module": "actor",
        "minibatch": 0,
        "rows": 247,
        "drift_h_mean": 2.1826035379035602e-07,
        "drift_h_max": 4.640100996766705e-07,
        "drift_c_mean": 2.1355029389269475e-07,
        "l2_rows": 247,
    }
    assert [(r["module"], r["minibatch"]) for r in x.by_minibatch] == [
        (m, mb) for m in ("actor", "critic") for mb in range(5)
    ]
    norms = cross_process(data, vectors=False)  # summary logs: the norms
    assert (norms.state_in_rows, norms.unpaired, norms.state_in_ok) == (317, 0, True)


def test_learner_rows_without_a_rollout_row_are_counted(tmp_path):
    """Every third rollout row gone: the learner rows whose (module, layer, worker, env, env_step) no remaining
    rollout row has are unpaired, 'last' bootstrap steps left out."""
    log = copy(tmp_path, lambda t: t.filter(pa.array(~(is_rollout(t) & (np.arange(t.num_rows) % 3 == 0)))))
    data, _ = dataset(log)
    rows = data.to_table(columns=[*CROSS_KEYS, "phase", "iteration", "bootstrap"]).to_pylist()
    rows = [r for r in rows if r["env_step"] is not None and r["iteration"] < CROSS_ITERATIONS]
    rollout = {tuple(r[k] for k in CROSS_KEYS) for r in rows if r["phase"] == "rollout"}
    want = sum(
        tuple(r[k] for k in CROSS_KEYS) not in rollout and r["bootstrap"] != "last"
        for r in rows
        if r["phase"] in ("train", "value")
    )
    x = cross_process(data, vectors=True)
    assert x.unpaired == want > 0
    assert cross_process(data, vectors=True, last_iteration=3).unpaired == want  # none past the runner's end
    assert x.state_in_rows < 317 and x.state_in_ok


@pytest.mark.parametrize("changed_last", [True, False])
def test_a_repeated_rollout_row_pairs_with_the_last_one(tmp_path, changed_last):
    """Rollout rows written twice, once with other states: the learner's rows meet the one written last."""

    def repeat(t: pa.Table) -> pa.Table:
        again = t.filter(pa.array(is_rollout(t)))
        h = again["h"].combine_chunks()
        other = pa.FixedSizeListArray.from_arrays(pc.add(h.flatten(), pa.scalar(0.5, pa.float32())), h.type.list_size)
        again = again.set_column(again.schema.get_field_index("h"), again.schema.field("h"), other)
        return pa.concat_tables([t, again] if changed_last else [again, t])

    x = cross_process(dataset(copy(tmp_path, repeat))[0], vectors=True)
    assert x.state_in_rows == 317 and x.unpaired == 0
    if changed_last:
        assert not x.state_in_ok and x.state_in_max_abs["actor"] == pytest.approx(0.5, abs=1e-6)
    else:
        assert x.state_in_ok and x.state_in_max_abs == {"actor": 0.0, "critic": 0.0}


@pytest.mark.parametrize("tf32", [True, False])
def test_the_first_pass_bound_allows_for_tf32_where_the_log_says_cudnn_ran_in_it(tmp_path, tf32):
    """A learner on a GPU computes in TF32 (metadata ``cudnn_tf32``): its states before the first optimizer
    step differ from the rollout's by ~1e-4..1e-3, which the staleness section's bound allows there, and so must
    the cross-process check's; a log without the entry keeps 1e-4 and calls that drift a difference."""
    import json

    import lstm_probe

    out = tmp_path / "log"
    out.mkdir()
    for f in sorted(SAMPLE.glob("*.parquet")):
        t = pq.read_table(f)
        if "learner" in f.name:  # the learner's states 5e-4 (relative) off the runner's, as TF32 rounds them
            steps = pc.greater_equal(pc.fill_null(t["t"], -1), 0)
            for name in ("h", "c"):
                col = t[name].combine_chunks()
                scaled = pa.FixedSizeListArray.from_arrays(
                    pc.multiply(col.flatten(), pa.scalar(1 + 5e-4, pa.float32())),
                    col.type.list_size,
                    mask=col.is_null(),
                )
                t = t.set_column(t.schema.get_field_index(name), t.schema.field(name), pc.if_else(steps, scaled, col))
            meta = dict(t.schema.metadata)
            run = json.loads(meta[b"lstm_probe.run"])
            if tf32:
                run["cudnn_tf32"] = True
            meta[b"lstm_probe.run"] = json.dumps(run).encode()
            t = t.replace_schema_metadata(meta)
        pq.write_table(t, out / f.name)
    report = lstm_probe.summarize(out)
    x = report.cross_process
    assert x is not None and x.state_in_ok  # the chunks' initial states (t = -1) untouched
    actor = [r["max_drift_h"] for r in x.first_pass if r["module"] == "actor"]
    assert 2e-4 < max(actor) < 1e-3  # (the sample's critic differs anyway: RLlib never syncs the runners' copy)
    assert x.provenance_tolerance == (1e-2 if tf32 else 1e-4)
    (actor_finding,) = [f for f in report.findings if f.startswith("actor: ")]
    assert ("recomputes the rollout states exactly" in actor_finding) == tf32, actor_finding


@pytest.mark.parametrize("off", [1.0, 1.1])
def test_rows_without_vectors_are_checked_by_their_norms(tmp_path, off):
    """A full-capture log whose rows do not all hold vectors (``--trace-envs 1``: env 1's rows are summary rows;
    ``--every K``: the other iterations' rows): those rows are compared by their norms, not read as zero vectors
    that always agree. Env 1's learner states 10% off the runner's are found; untouched, the check passes."""
    import json

    import lstm_probe

    out = tmp_path / "log"
    out.mkdir()
    for f in sorted(SAMPLE.glob("*.parquet")):
        t = pq.read_table(f)
        traced = pc.equal(pc.fill_null(t["env"], -1), 0).to_numpy(zero_copy_only=False)
        for name in ("h", "c"):  # env 0 keeps its vectors, the other rows are summary rows
            col = t[name].combine_chunks()
            kept = pa.FixedSizeListArray.from_arrays(col.flatten(), col.type.list_size, mask=pa.array(~traced))
            t = t.set_column(t.schema.get_field_index(name), t.schema.field(name), kept)
        if "learner" in f.name:  # env 1's learner states `off` times the runner's
            for name in ("h_norm", "c_norm"):
                norms = t[name].to_numpy().copy()
                norms[~traced] *= off
                t = t.set_column(t.schema.get_field_index(name), t.schema.field(name), pa.array(norms))
        meta = dict(t.schema.metadata)
        run = json.loads(meta[b"lstm_probe.run"])
        run["capture"] = dict(run["capture"], trace_envs=1)
        meta[b"lstm_probe.run"] = json.dumps(run).encode()
        pq.write_table(t.replace_schema_metadata(meta), out / f.name)
    x = lstm_probe.summarize(out).cross_process
    assert x is not None and x.vectors and x.state_in_rows == 317 and x.unpaired == 0
    if off == 1.0:
        assert x.state_in_ok and x.state_in_max_abs == {"actor": 0.0, "critic": 0.0}
    else:  # env 1's chunks start from states 10% off (their norms say so)
        assert not x.state_in_ok
        assert max(x.state_in_max_relative.values()) == pytest.approx(0.1, rel=1e-3)
        actor = [r["max_drift_h"] for r in x.first_pass if r["module"] == "actor"]
        assert max(actor) == pytest.approx(0.1, rel=1e-3)  # (the sample's critic differs anyway)


def test_a_summary_logs_traced_envs_are_compared_by_their_vectors(tmp_path):
    """``--capture summary --trace-envs 1``: env 0's rows keep their vectors, the others are summary rows.
    Env 0's learner h reversed (same norm, other vector) is found by L2 (a norms-only check saw 0), and the
    findings say which rows were compared how."""
    import json

    import lstm_probe

    out = tmp_path / "log"
    out.mkdir()
    for f in sorted(SAMPLE.glob("*.parquet")):
        t = pq.read_table(f)
        traced = pc.equal(pc.fill_null(t["env"], -1), 0).to_numpy(zero_copy_only=False)
        for name in ("h", "c"):
            col = t[name].combine_chunks()
            width = col.type.list_size
            values = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
            if "learner" in f.name and name == "h":
                values = values[:, ::-1]
            kept = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), width, mask=pa.array(~traced))
            t = t.set_column(t.schema.get_field_index(name), t.schema.field(name), kept)
        meta = dict(t.schema.metadata)
        run = json.loads(meta[b"lstm_probe.run"])
        run["capture"] = dict(run["capture"], mode="summary", trace_envs=1)
        meta[b"lstm_probe.run"] = json.dumps(run).encode()
        pq.write_table(t.replace_schema_metadata(meta), out / f.name)
    report = lstm_probe.summarize(out)
    x = report.cross_process
    assert x is not None
    actor = [r for r in x.first_pass if r["module"] == "actor"]
    assert max(r["max_drift_h"] for r in actor) > 0.1  # env 0's reversed vectors
    l2, rows = sum(r["l2_rows"] for r in actor), sum(r["rows"] for r in actor)
    assert 0 < l2 < rows
    assert 0 < x.state_in_l2_rows < x.state_in_rows
    (finding,) = [f for f in report.findings if f.startswith("actor: ")]
    assert f"mixed: {l2:,} rows by relative L2" in finding, finding


def test_env_columns_and_envs_are_per_env_runner_where_several():
    from lstm_probe.report.section import env_runners, kept_columns
    from lstm_probe.report.sections.run import RunSection, envs_words

    meta = {"n_envs": 32, "rllib": {"env_runners": 2, "envs_per_env_runner": 32}}
    assert env_runners(meta) == 2 and env_runners({"rllib": {"env_runners": 1}}) is None
    assert kept_columns(4, 32, 2) == "env columns 0..3 of each runner's 32"
    assert kept_columns(4, 32, None) == "env columns 0..3 of 32"
    r = RunSection(*([None] * 5), None, {}, {}, None, None, 2, True, None, 0, 1, 0, None, {}, None, env_runners=2)
    r.n_envs = 32
    assert envs_words(r) == "32 per env runner, 2 env runners"


def test_terminal_rows_past_the_runners_last_step_are_not_unpaired(tmp_path):
    """The learner's 'last' bootstrap rows of the last iteration turned into 'terminal' rows one env step later
    (as a run that stops right after an episode ends writes them: the runner's forward for that step never
    ran): counted apart, not as unpaired rows, and no finding names them (rows of the last iteration that lost
    their rollout row within the runner's steps stay unpaired:
    :func:`test_learner_rows_without_a_rollout_row_are_counted`)."""
    iteration = 3
    import lstm_probe

    out = tmp_path / "log"
    out.mkdir()
    moved = 0
    for f in sorted(SAMPLE.glob("*.parquet")):
        t = pq.read_table(f)
        if "learner" in f.name:
            it = pc.fill_null(pc.equal(t["iteration"], iteration), False)
            last = pc.and_(it, pc.fill_null(pc.equal(t["bootstrap"].cast(pa.string()), "last"), False))
            moved = int(pc.sum(last).as_py() or 0)
            boot = pc.if_else(last, pa.scalar("terminal"), t["bootstrap"].cast(pa.string()))
            step = pc.if_else(last, pc.add(t["env_step"], pa.scalar(1, t["env_step"].type)), t["env_step"])
            for name, col in (("bootstrap", boot.cast(t.schema.field("bootstrap").type)), ("env_step", step)):
                t = t.set_column(t.schema.get_field_index(name), t.schema.field(name), col)
        pq.write_table(t, out / f.name)
    assert moved
    report = lstm_probe.summarize(out)
    x = report.cross_process
    assert x is not None
    lone = [f for f in report.findings if "found no rollout row" in f]
    assert (x.unpaired, x.after_end, lone) == (0, moved, [])


def test_terminal_rows_of_a_runner_without_rollout_rows_stay_unpaired(tmp_path):
    """A runner none of whose rollout rows are in the log (its part files lost): its learner rows, the last
    iteration's terminal ones too, are unpaired (the join missed them), not rows past its last step."""
    import lstm_probe

    out = tmp_path / "log"
    out.mkdir()
    for f in sorted(SAMPLE.glob("*.parquet")):
        t = pq.read_table(f)
        if "learner" not in f.name:  # the runners' rows without their rollout rows
            t = t.filter(pc.invert(pc.fill_null(pc.equal(t["phase"].cast(pa.string()), "rollout"), False)))
        pq.write_table(t, out / f.name)
    x = lstm_probe.summarize(out).cross_process
    assert x is not None and x.after_end == 0 and x.unpaired > 0


def _alone(data, columns, filt) -> tuple[int, int]:
    """What one filtered read is checked for (``budget.check_filtered``): the rows it keeps, held twice, and
    the row groups it decodes, computed here from the footer and the rows the filter keeps."""
    from lstm_probe.log import budget

    sizes = budget.groups(data, columns)
    total, rows = sum(s for s, _ in sizes), sum(n for _, n in sizes)
    kept = data.count_rows(filter=filt)
    return budget.DECODE * (total * kept // max(rows, 1)), sum(sorted((s for s, _ in sizes), reverse=True)[:4])


def test_the_cross_process_reads_are_checked_together_against_the_budget():
    """The check holds its rollout rows, learner rows and episode starts at once: a budget each read fits
    alone but not their sum is refused in one line (it read all three, 2-4x the budget at wider logs)."""
    import pyarrow.dataset as ds

    from lstm_probe.errors import BadLog
    from lstm_probe.log import budget
    from lstm_probe.log.reader import narrow

    data, _ = dataset(SAMPLE)
    cols = [*CROSS_KEYS, "phase", "iteration", "minibatch", "t", "bootstrap", "h", "c", "h_norm", "c_norm"]
    base = ds.field("env_step").is_valid() & (ds.field("iteration") < CROSS_ITERATIONS)
    part = narrow(data, iteration=(0, CROSS_ITERATIONS - 1))
    roll, learn = base & (ds.field("phase") == "rollout"), base & ds.field("phase").isin(["train", "value"])
    fresh = (ds.field("t") == -1) & ds.field("env_step").is_null() & (ds.field("padding") == False)  # noqa: E712
    needs = [
        _alone(budget.prune(part, roll), cols, roll),
        _alone(budget.prune(part, learn), cols, learn),
        _alone(data, ["h_norm", "c_norm"], fresh),
    ]
    alone = max(held + decoding for held, decoding in needs)
    together = sum(held for held, _ in needs) + max(decoding for _, decoding in needs)
    assert together > alone * 1.1 and alone >= 1 << 20
    limit = (alone + together) // 2
    budget.set_limit(limit)
    try:
        with pytest.raises(BadLog, match=r"the cross-process check's reads .* over the .* memory budget") as err:
            cross_process(data, vectors=True)
        assert "\n" not in str(err.value) and "--max-memory" in str(err.value)
        budget.set_limit(together)  # the sum fits: the check as without a budget
        assert cross_process(data, vectors=True).state_in_rows == 317
    finally:
        budget.set_limit(None)
    # the CLI's report: the same one-line refusal, exit 2
    from refusals import ENV, one_line_error

    cmd = [sys.executable, "-m", "lstm_probe.cli", "report", str(SAMPLE), "--max-memory", str(limit)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    one_line_error(r, "the cross-process check's reads", "memory budget", "--max-memory")
