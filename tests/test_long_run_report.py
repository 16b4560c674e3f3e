"""A report of a run long in iterations (tiny in width: hidden 4, 8-step rollouts, 60 iterations) shows trends over
the whole run, not only its last iterations: the Memory panel's horizons by iteration cover every measured
iteration (runs of equal horizons, or spans with their most common horizon and range), and a finding on the last
iteration says where that iteration's horizon is not the recent iterations' usual one; `lstm-probe probe` says which
of the run's iterations its default probes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import lstm_probe

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
ITERATIONS = 60


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lstm_probe", *args], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600
    )


@pytest.fixture(scope="module")
def long_log(tmp_path_factory) -> Path:
    """sb3 Pendulum, 1 env, 60 iterations of 8 steps, one epoch of one minibatch, hidden 4, --memory."""
    log = tmp_path_factory.mktemp("long") / "long.parquet"
    done = _cli(
        "run", "Pendulum-v1", "--steps", str(8 * ITERATIONS), "--n-steps", "8", "--batch-size", "8",
        "--n-epochs", "1", "--hidden-size", "4", "--memory", "--out", str(log), "-q",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return log


def _words(log: Path) -> str:
    done = _cli("report", str(log))
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.replace("│", " ").split())  # the panels' words, unwrapped


def _said(h: dict) -> str:
    if h["unused"]:
        return "unused"
    if h["beyond"]:
        return f"> {h['max_k']}"
    return "-" if h["horizon"] is None else str(h["horizon"])


def _rank(w: str) -> float:
    return 0.0 if w == "unused" else float(w[2:]) + 0.5 if w.startswith(">") else float(w)


def _span(a: int, b: int) -> str:
    return str(a) if a == b else f"{a}-{b}"


def test_memory_horizons_by_iteration_cover_the_whole_run(long_log):
    rep = lstm_probe.summarize(long_log)
    words = _words(long_log)
    assert rep.memory.sampling["iterations_measured"] == ITERATIONS
    assert "the last 8 of" not in words
    spans_seen = 0
    for module in ("actor", "critic"):
        said = [(h["iteration"], _said(h)) for h in rep.memory.horizons if h["module"] == module]
        assert [it for it, _ in said] == list(range(ITERATIONS))  # every iteration measured, in order
        runs: list[list] = []
        for it, w in said:
            if runs and runs[-1][2] == w:
                runs[-1][1] = it
            else:
                runs.append([it, it, w])
        if len(runs) <= 12:
            line = f"horizon by iteration, {module}: " + "; ".join(f"{_span(a, b)}: {w}" for a, b, w in runs)
        else:
            spans_seen += 1
            parts = []
            for i in range(8):
                part = said[i * ITERATIONS // 8 : (i + 1) * ITERATIONS // 8]
                counts = Counter(w for _, w in part)
                common = max(counts, key=lambda w: (counts[w], -_rank(w)))
                ordered = sorted(counts, key=_rank)
                spread = f" ({ordered[0]} to {ordered[-1]})" if len(ordered) > 1 else ""
                parts.append(f"{_span(part[0][0], part[-1][0])}: {common}{spread}")
            line = (
                f"horizon by iteration, {module} (8 spans of the {ITERATIONS} measured iterations: the most common "
                "horizon, its range in brackets; --json has every one): " + "; ".join(parts)
            )
        assert line in words, (line, words)
        # the finding on the last iteration says the last span's usual horizon where that iteration's differs: the
        # text's last span (52-59: 8 iterations, where the old rule counted the last 7)
        tail = [w for _, w in said[7 * ITERATIONS // 8 :]]
        assert len(tail) == 8
        counts = Counter(tail)
        common = max(counts, key=lambda w: (counts[w], -_rank(w)))
        finding = next(f for f in rep.findings if f.startswith(f"{module}: "))
        assert f"(iteration {ITERATIONS - 1}" in finding
        if common != said[-1][1] and counts[common] * 2 > len(tail):
            reach = common if common.startswith(">") or common == "unused" else f"~{common}"
            assert f"; {reach} at {counts[common]} of the last {len(tail)} measured iterations)" in finding
        else:
            assert "of the last" not in finding
    assert spans_seen  # this run's horizons change too often for runs in at least one module


def test_probe_says_it_probes_some_of_the_iterations(long_log):
    done = _cli("probe", str(long_log), "--target", "episode_step")
    assert done.returncode == 0, done.stderr
    words = " ".join(done.stdout.split())
    probed = sorted({int(line.split("│")[1]) for line in done.stdout.splitlines() if line.count("│") > 5})
    assert probed[0] == 0 and probed[-1] == ITERATIONS - 1 and len(probed) == 8
    assert f"8 of the log's {ITERATIONS} iterations, spread over the run (first and last included)" in words
    picked = _cli("probe", str(long_log), "--target", "episode_step", "--iteration", "3")
    assert picked.returncode == 0 and "of the log's" not in picked.stdout  # asked for: nothing left out to say
