"""The staleness section's trend over training, on real tiny sb3 runs long in iterations (hidden 4, 8-step
rollouts): each iteration's last-epoch drift in the JSON (``staleness.by_iteration``: per iteration, or at most 100
spans of iterations), a line of 8 spans in the text (the largest named), the verdict's line where its run-wide figure
hides a change, and a figure in the HTML page; every figure checked against pandas on the log. And the counts of
the calls' shapes, the start reasons and the length histogram with thousands separators."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import lstm_probe
from lstm_probe.report.html import build_html

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
ITERATIONS = 40
WIDE_ITERATIONS = 150


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lstm_probe", *args], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600
    )


def _run(path: Path, iterations: int, envs: int, *extra: str) -> Path:
    done = _cli(
        "run", "Pendulum-v1", "--steps", str(8 * envs * iterations), "--n-envs", str(envs), "--n-steps", "8",
        "--hidden-size", "4", "--out", str(path), "-q", *extra,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture(scope="module")
def long_log(tmp_path_factory) -> Path:
    """1 env, 40 iterations of 8 steps, 3 epochs of 2 minibatches; a learning rate that moves the drift over the run."""
    path = tmp_path_factory.mktemp("trend") / "long.parquet"
    return _run(path, ITERATIONS, 1, "--batch-size", "4", "--n-epochs", "3", "--learning-rate", "0.003")


@pytest.fixture(scope="module")
def wide_log(tmp_path_factory) -> Path:
    """4 envs, 150 iterations of 8 steps, 2 epochs of 2 minibatches: more iterations than the JSON keeps, and
    counts past 1,000."""
    path = tmp_path_factory.mktemp("trend") / "wide.parquet"
    return _run(path, WIDE_ITERATIONS, 4, "--batch-size", "16", "--n-epochs", "2")


def _last_epochs(log: Path) -> pd.DataFrame:
    """Per module, layer and iteration: its last epoch with a drift, the rows of it, their summed drifts."""
    df = pd.read_parquet(
        log, columns=["module", "layer", "phase", "iteration", "epoch", "padding", "drift_h", "drift_c"]
    )
    t = df[(df.phase == "train") & ~df.padding.astype(bool) & df.drift_h.notna()].copy()
    t["drift_h"] = t.drift_h.astype("float64")
    t["drift_c"] = t.drift_c.astype("float64")
    last = t.groupby(["module", "layer", "iteration"]).epoch.transform("max")
    t = t[t.epoch == last]
    g = t.groupby(["module", "layer", "iteration"]).agg(
        epoch=("epoch", "first"), rows=("drift_h", "size"), h=("drift_h", "sum"), c=("drift_c", "sum")
    )
    return g.reset_index()


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    k = min(n, parts)
    return [(i * n // k, (i + 1) * n // k) for i in range(k)]


def _words(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_by_iteration_matches_pandas_in_json_text_verdict_and_html(long_log, tmp_path):
    expect = _last_epochs(long_log)
    done = _cli("report", str(long_log), "--json")
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)
    got = rep["staleness"]["by_iteration"]
    assert len(got) == len(expect) == 2 * ITERATIONS  # actor and critic, one entry per iteration
    for e, (_, x) in zip(got, expect.iterrows(), strict=True):
        assert (e["module"], e["layer"]) == (x.module, x.layer)
        assert e["iteration_first"] == e["iteration_last"] == x.iteration
        assert e["iterations"] == 1
        assert e["epoch"] == x.epoch == 2 and e["rows"] == x.rows
        assert e["drift_h_mean"] == pytest.approx(x.h / x.rows, rel=1e-9)
        assert e["drift_c_mean"] == pytest.approx(x.c / x.rows, rel=1e-9)
    # the same whatever runs of iterations the report reads the log in
    again = lstm_probe.summarize(long_log, chunk_rows=300).staleness.by_iteration
    assert [(r["module"], r["iteration_first"], r["rows"]) for r in again] == [
        (r["module"], r["iteration_first"], r["rows"]) for r in got
    ]
    assert [r["drift_h_mean"] for r in again] == pytest.approx([r["drift_h_mean"] for r in got], rel=1e-12)

    text = _cli("report", str(long_log))
    assert text.returncode == 0, text.stderr
    words = _words(text.stdout)
    expected_lines = []
    tails = {}
    for module, x in expect.groupby("module"):
        x = x.sort_values("iteration").reset_index(drop=True)
        spans = []
        for a, b in _split(len(x), 8):
            part = x.iloc[a:b]
            spans.append((int(part.iteration.iloc[0]), int(part.iteration.iloc[-1]), part.h.sum() / part.rows.sum()))
        top = max(spans, key=lambda s: s[2])
        line = (
            f"mean h drift of {module} in the last epoch (2) by iteration, 8 spans of its {ITERATIONS} iterations "
            "(--json has each): " + ", ".join(f"{a}-{b}: {v:.3g}" for a, b, v in spans) + f"; largest in "
            f"iterations {top[0]}-{top[1]}"
        )
        assert line in words, (line, words)
        expected_lines.append(line)
        tails[module] = spans[-1]

    # the verdict: the run-wide figure is the last epoch's over every iteration; the last span's differs 2x or more
    df = pd.read_parquet(long_log, columns=["module", "layer", "phase", "epoch", "padding", "drift_h"])
    t = df[(df.phase == "train") & ~df.padding.astype(bool) & df.drift_h.notna() & (df.layer == 0)]
    run = t[t.epoch == t.epoch.max()].groupby("module").drift_h.apply(lambda s: s.astype("float64").mean())
    moved = [m for m in run.index if max(run[m], tails[m][2]) > 0.01 and not 0.5 < tails[m][2] / run[m] < 2]
    assert moved  # this run's drift falls over training: the verdict says so
    order = sorted(run.index, key=lambda m: -run[m])
    pct = {m: f"{np.format_float_positional(float(f'{100 * tails[m][2]:.2g}'), trim='-')}%" for m in order}
    a, b, _ = tails[order[0]]
    verdict = (
        f"those figures are over the run's {ITERATIONS} iterations; in its last {b - a + 1} iterations ({a}-{b}) the "
        f"last epoch's drift is {' and '.join(f'{pct[m]} ({m})' for m in order)} (the staleness section has it by "
        "iteration)"
    )
    assert verdict in rep["verdict"]["lines"] and verdict in words

    page = build_html(long_log, tmp_path / "r.html")
    assert "Staleness over iterations" in page.figures
    body = (tmp_path / "r.html").read_text()
    for line in expected_lines:
        assert html.escape(line) in body
    assert "in each iteration&#x27;s last epoch, by iteration (h solid, c dashed" in body


def test_by_iteration_keeps_100_spans_of_a_longer_run_and_counts_read_with_separators(wide_log):
    expect = _last_epochs(wide_log)
    rep = lstm_probe.summarize(wide_log)
    got = rep.staleness.by_iteration
    for module in ("actor", "critic"):
        mine = [r for r in got if r["module"] == module]
        x = expect[expect.module == module].sort_values("iteration").reset_index(drop=True)
        assert len(x) == WIDE_ITERATIONS and len(mine) == 100
        for r, (a, b) in zip(mine, _split(WIDE_ITERATIONS, 100), strict=True):
            part = x.iloc[a:b]
            assert (r["iteration_first"], r["iteration_last"]) == (part.iteration.iloc[0], part.iteration.iloc[-1])
            assert r["epoch"] == 1 and r["rows"] == part.rows.sum() and r["iterations"] == b - a
            assert r["drift_h_mean"] == pytest.approx(part.h.sum() / part.rows.sum(), rel=1e-9)
    done = _cli("report", str(wide_log))
    assert done.returncode == 0, done.stderr
    words = _words(done.stdout)
    assert "--json has 100 spans" in words
    # counts past 1,000: the calls' shapes, the start reasons, the length histogram
    rollout = WIDE_ITERATIONS * 8
    assert f"1 x 4 ({rollout:,})" in words
    reasons = rep.calls.sequence_start_reasons
    assert reasons["env_boundary"] >= 1000
    assert f"anew): {reasons['env_boundary']:,};" in words
    hist = rep.sequences.length_histogram
    big = {k: v for k, v in hist.items() if v >= 1000}
    assert big, hist
    assert "histogram: " + ", ".join(f"{k}: {v:,}" for k, v in hist.items()) in words
