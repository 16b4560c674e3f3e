"""Dataset directories split by iteration (``part_iterations``): real runs, real part files."""

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from conftest import TINY, probed_run
from torch import nn

import lstm_probe
from lstm_probe import run
from lstm_probe.errors import BadInput


def spans_of(directory, n):
    """The span of iterations (iteration // n) of each part file, in file order; None for a part whose
    rows carry no iteration."""
    out = []
    for part in sorted(directory.glob("part-*.parquet")):
        it = pq.read_table(part, columns=["iteration"]).column("iteration").drop_null().to_numpy()
        spans = set((it // n).tolist())
        assert len(spans) <= 1, (part.name, spans)  # never two spans in one file
        out.append(spans.pop() if spans else None)
    return out


@pytest.mark.parametrize("n", [1, 2, 4])
def test_sb3_directory_parts_never_span_two_ranges(runs_dir, tmp_path, n):
    single = probed_run(runs_dir, "Pendulum-v1")  # TINY: 6 iterations of 32 steps
    res = run("Pendulum-v1", f"{tmp_path}/d/", seed=0, part_iterations=n, **TINY)
    assert res.completed
    spans = [s for s in spans_of(tmp_path / "d", n) if s is not None]
    assert spans == sorted(spans) and set(spans) == set(range((6 + n - 1) // n))
    # the same rows as the single-file log of the same run, vectors included, in the same order by call
    # (row groups are phase-pure: rows are in call order within each phase, and a directory split by
    # iteration writes its lanes at each span's end, so the two files interleave the phases differently)
    a, b = (
        lstm_probe.load(p).sort_values("call", kind="stable").reset_index(drop=True)
        for p in (single.path, tmp_path / "d")
    )
    assert len(a) == len(b) == single.rows
    for col in ("call", "module", "layer", "phase", "iteration", "epoch", "minibatch", "seq", "t", "env_step"):
        assert a[col].equals(b[col]), col
    assert np.array_equal(lstm_probe.states(a, "c"), lstm_probe.states(b, "c"), equal_nan=True)
    rep = lstm_probe.summarize(tmp_path / "d")
    assert rep.staleness.provenance_ok is True and rep.run.files == len(spans_of(tmp_path / "d", n))


def test_generic_tracer_parts_split_mid_buffer(tmp_path):
    """Rows of several iterations in one row buffer are split across files at span boundaries; rows
    without an iteration stay with the rows before them."""
    torch.manual_seed(0)
    m = nn.LSTM(2, 4)
    x = torch.randn(1, 3, 2)
    with torch.no_grad(), lstm_probe.trace(m, f"{tmp_path}/g/", part_iterations=3) as probe:
        m(x)  # no iteration: the first part takes it
        for it in range(7):
            with probe.tag(phase="rollout", iteration=it):
                m(x)
        m(x)  # no iteration: joins iteration 6's part
    spans = spans_of(tmp_path / "g", 3)
    assert spans[:3] == [0, 1, 2]  # the last part (the outcome) may be empty
    counts = [pq.read_metadata(p).num_rows for p in sorted((tmp_path / "g").glob("part-*.parquet"))]
    assert counts[:3] == [3 * 3 + 3, 3 * 3, 3 + 3] and sum(counts) == 9 * 3
    assert lstm_probe.read_info(tmp_path / "g").completed


def test_part_iterations_needs_a_directory(tmp_path):
    with pytest.raises(BadInput, match="directory"):
        run("Pendulum-v1", tmp_path / "r.parquet", steps=32, n_steps=16, part_iterations=2)
    with pytest.raises(BadInput, match="part-iterations must be >= 1"):
        run("Pendulum-v1", f"{tmp_path}/d/", steps=32, n_steps=16, part_iterations=0)
    with (
        pytest.raises(BadInput, match="directory"),
        lstm_probe.trace(nn.LSTM(2, 4), tmp_path / "t.parquet", part_iterations=2),
    ):
        pass
    assert not (tmp_path / "r.parquet").exists() and not (tmp_path / "t.parquet").exists()


def test_load_one_episode_from_a_directory(tmp_path):
    """load(env=, episode=) reads the row groups that can hold them and returns exactly their rows."""
    run("CartPole-v1", f"{tmp_path}/d/", seed=0, part_iterations=1, **{**TINY, "n_envs": 2})
    whole = lstm_probe.load(tmp_path / "d")
    last = whole.groupby("env")["episode"].max().astype(int).to_dict()
    assert min(last.values()) >= 2  # several episodes in each env
    for env, episode in ((0, last[0]), (1, [0, last[1]]), ([0, 1], 1), (None, 2)):
        got = lstm_probe.load(tmp_path / "d", env=env, episode=episode, phase=["rollout", "train"])
        keep = whole["phase"].isin(["rollout", "train"]) & whole["episode"].isin(np.atleast_1d(episode))
        if env is not None:
            keep &= whole["env"].isin(np.atleast_1d(env))
        want = whole[keep].reset_index(drop=True)
        assert len(got) == len(want) > 0, (env, episode)
        for col in ("call", "module", "layer", "phase", "env", "episode", "episode_step", "t"):
            # no nulls left in env and episode: integers here, floats in the whole log
            pd.testing.assert_series_equal(got[col], want[col], check_dtype=False, check_categorical=False)
        assert np.array_equal(lstm_probe.states(got, "c"), lstm_probe.states(want, "c"), equal_nan=True)


def _shard_copy(src, dst, run=None, final=None):
    """A shard file made from a real part: the same rows, its run (and final) metadata edited."""
    import json

    from lstm_probe.log.schema import META_RUN_KEY
    from lstm_probe.log.writer import META_FINAL_KEY

    pf = pq.ParquetFile(src)
    meta = dict(pf.schema_arrow.metadata)
    doc = json.loads(meta[META_RUN_KEY])
    if run:
        doc.update(run)
    meta[META_RUN_KEY] = json.dumps(doc).encode()
    fin = json.loads((pf.metadata.metadata or {})[META_FINAL_KEY])
    if final:
        fin.update(final)
    meta[META_FINAL_KEY] = json.dumps(fin).encode()
    pq.write_table(pf.read().replace_schema_metadata(meta), dst)
    return fin


def test_rllib_shard_metadata_each_key_from_its_authoritative_shard(tmp_path):
    """An evaluation runner's shard sorts first by name but never wins over training processes: the
    learner's architecture (its gradient-flow verdict) and the env runner's rollout facts stand."""
    from pathlib import Path

    sample = Path(__file__).parent.parent / "sample_runs" / "cartpole-rllib"
    d = tmp_path / "log"
    d.mkdir()
    _shard_copy(sample / "part-learner0-00000.parquet", d / "part-learner0-00000.parquet")
    runner = _shard_copy(
        sample / "part-runner1-00000.parquet",
        d / "part-runner1-00000.parquet",
        final={"progress": {"num_timesteps": 512}},
    )
    _shard_copy(
        sample / "part-runner1-00000.parquet",
        d / "part-evalrunner1-00000.parquet",
        run={"n_envs": 7, "architecture": {"modules": {}}, "seed": 99},
        final={"progress": {"num_timesteps": 3}, "end_time": "eval"},
    )
    info = lstm_probe.read_info(d)
    meta = info.metadata
    assert "gradient_flow" in meta["architecture"]  # the learner's
    assert meta["n_envs"] == 2 and meta["seed"] == 0  # training processes', not the evaluation runner's
    assert meta["progress"] == runner["progress"]  # a rollout fact: the env runner's
    assert meta["end_time"] != "eval"
    assert set(meta["shards"]) == {"learner0", "runner1", "evalrunner1"}
    rep = lstm_probe.summarize(d)
    assert rep.run.n_envs == 2
