"""What a user reads across sections must agree, on real tiny runs of each framework (`lstm-probe run` and the
CleanRL-shaped example): the Memory panel shows every measured iteration; a median reads the same in
the panels and the findings (20.5, never 20); the Memory panel's episodes are the Sequences panel's where the log
holds every env column (the measurement's own count misses the episode that ends at the last rollout's end, and
RLlib's episodes split over two chunks), else said as the measurement's; the share of sequences that start from a
stored state says where it comes from (the rollout's start, or mid-rollout: the only ones that can go stale), so
it never reads against the verdict; RLlib's memory rollouts are episode chunks, said as such."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import probed_run

import lstm_probe
from lstm_probe.report.section import fmt_steps
from lstm_probe.report.sections.sequences import SequencesSection, episodes_in_words, horizon_in_words

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lstm_probe", *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=600
    )


def _words(log: Path) -> str:
    done = _cli("report", str(log))
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.replace("│", " ").split())  # the panels' words, unwrapped


@pytest.fixture(scope="module")
def rsl_rl(tmp_path_factory) -> Path:
    """rsl_rl, Pendulum, 2 envs, 10 iterations of 24 steps, --memory: every sequence starts at its rollout's start
    or at an episode start (the reasons 'env_boundary' and 'episode_start')."""
    pytest.importorskip("rsl_rl")
    log = tmp_path_factory.mktemp("rsl") / "r.parquet"
    done = _cli(
        "run", "Pendulum-v1", "--framework", "rsl_rl", "--steps", "480", "--n-envs", "2", "--hidden-size", "8",
        "--memory", "--out", str(log), "-q",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return log


@pytest.fixture(scope="module")
def own_loop(tmp_path_factory) -> Path:
    """The CleanRL-shaped example at its default size with --memory: an episode of env 2 ends at the last rollout's
    last step (its next episode starts at the bootstrap step), which the measurement's own count never sees."""
    log = tmp_path_factory.mktemp("own") / "own.parquet"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "cleanrl_lstm.py"), "--memory", "--out", str(log)],
        capture_output=True,
        text=True,
        cwd=log.parent,
        env=ENV,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return log


def test_memory_shows_every_measured_iteration(rsl_rl):
    rep = lstm_probe.summarize(rsl_rl)
    assert rep.memory.measured and rep.memory.sampling["iterations_measured"] == 10
    assert len([h for h in rep.memory.horizons if h["module"] == "actor"]) == 10  # the JSON keeps every one
    words = _words(rsl_rl)
    assert "horizon by iteration, actor: 0" in words and "the last 8 of" not in words


def test_stored_starts_say_where_the_state_comes_from_and_agree_with_the_verdict(rsl_rl):
    rep = lstm_probe.summarize(rsl_rl)
    s = rep.sequences
    assert rep.calls.sequence_start_reasons.keys() <= {"env_boundary", "episode_start"}
    assert s.stored_state_share and s.stored_rollout_start_share == s.stored_state_share
    assert s.stored_mid_rollout_share == 0 and rep.verdict.stored_starts is False
    words = _words(rsl_rl)
    n = s.stored_starts
    assert n["mid_rollout"] == 0 and n["rollout_start"] == round(s.stored_state_share * n["with_reason"])
    share = (
        f"{s.stored_state_share:.1%} of sequences ({n['rollout_start']} of {n['with_reason']}) start from a stored "
        "mid-episode state rather than a reset"
    )
    assert f"{share}: all at their rollout's start (the state the rollout itself began from)" in words
    assert "no training sequence starts mid-rollout from a stored state" in words  # the verdict, now not contradicted
    assert any("rather than a reset: all at their rollout's start" in f for f in rep.findings), rep.findings


def test_sb3_splits_its_stored_starts_the_same_way(runs_dir):
    """sb3's buffer splits sequences at a random point and at minibatch cuts: those start mid-rollout."""
    path = probed_run(runs_dir, "CartPole-v1", n_envs=2).path
    rep = lstm_probe.summarize(path)
    s, reasons = rep.sequences, rep.calls.sequence_start_reasons
    known = sum(reasons.values())
    mid = sum(n for r, n in reasons.items() if r in ("split", "minibatch_cut"))
    assert mid and s.stored_mid_rollout_share == pytest.approx(mid / known)
    assert s.stored_rollout_start_share == pytest.approx(reasons.get("env_boundary", 0) / known)
    assert s.stored_rollout_start_share + s.stored_mid_rollout_share == pytest.approx(s.stored_state_share)
    doc = rep.to_dict()["sequences"]
    assert {"stored_state_share", "stored_rollout_start_share", "stored_mid_rollout_share"} <= doc.keys()
    n = doc["stored_starts"]
    assert n == {"with_reason": known, "rollout_start": reasons.get("env_boundary", 0), "mid_rollout": mid}
    words = _words(path)
    stored = n["rollout_start"] + n["mid_rollout"]
    assert f"{s.stored_state_share:.1%} of sequences ({stored} of {known}) start from a stored" in words
    assert f": {n['rollout_start']} at their rollout's start (the state the rollout itself began from), {mid} " in words
    assert f"{mid} mid-rollout (a state the rollout stored there, with the weights it ran with)" in words


def test_one_answer_to_how_long_episodes_are(own_loop):
    rep = lstm_probe.summarize(own_loop)
    s, m = rep.sequences, rep.memory
    measured = m.measured_episode_length
    assert measured["count"] == s.episodes_completed - 1  # the episode ending at the last rollout's end: unseen
    assert m.episodes_from == "log" and m.episode_length["count"] == s.episodes_completed
    assert m.episode_length["median"] == s.episode_length["median"]
    words = _words(own_loop)
    median, top = fmt_steps(s.episode_length["median"]), fmt_steps(s.episode_length["max"])
    assert f"episodes completed: {s.episodes_completed}, length median {median}, max {top}" in words  # Sequences
    assert f"episodes completed: {s.episodes_completed}, median {median}, max {top}" in words  # Memory
    assert any(f"episodes last {median}" in f for f in rep.findings if f.startswith("critic:")), rep.findings
    assert rep.to_dict()["memory"]["measured_episode_length"] == measured


def test_medians_read_as_the_panels_say_them(own_loop):
    """A median of x.5 steps is said as such in the findings, as the panels say it (it read as x)."""
    rep = lstm_probe.summarize(own_loop)
    g, e = rep.sequences.gradient_length, rep.sequences.episode_length
    words = _words(own_loop)
    assert f"median {fmt_steps(g['median'])}" in words  # the panels' median of the gradient's stretches
    for f in rep.findings:
        if "gradients flow back" in f:
            assert f"(median {fmt_steps(g['median'])})" in f, f
        if "episodes last" in f:
            assert f"last {fmt_steps(e['median'])}" in f, f
    s = SequencesSection(4, {"min": 1.0, "median": 20.5, "max": 48.0}, {}, {"median": 15.5}, 26, 0.0, None)
    said = horizon_in_words(s, "")[0] + ", while " + episodes_in_words(s.episode_length, s.episodes_completed)
    assert "(median 20.5)" in said and "last 15.5 steps (the median of 26 episodes)" in said, said
    assert fmt_steps(1000.0) == "1,000" and fmt_steps(12345.5) == "12,346" and fmt_steps(None) == "-"


def test_rllib_memory_says_its_rollouts_are_episode_chunks(tmp_path):
    pytest.importorskip("ray")
    small = ["--steps", "400", "--n-steps", "100", "--batch-size", "100", "--n-epochs", "2", "--hidden-size", "8"]
    done = _cli("run", "CartPole-v1", "--framework", "rllib", *small, "--memory", "--out", "r/", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rep = lstm_probe.summarize(tmp_path / "r")
    m, s = rep.memory, rep.sequences
    assert m.chunks and m.n_envs is None and m.episodes_from == "log"
    assert m.episode_length["count"] == s.episodes_completed  # the measurement counts only chunks that hold one
    assert m.measured_episode_length["count"] <= s.episodes_completed
    words = _words(tmp_path / "r")
    assert (
        f"at up to 16 steps per episode chunk (an episode's steps within one rollout fragment; {m.chunks:,} " in words
    )
    said = f"each update's chunks read whole (the longest {m.rollout_length} steps, its appended bootstrap step"
    assert said + " included)" in words and "update(s) had longer chunks" not in words
    assert "steps per env" not in words and f"rollout {m.rollout_length} steps" not in words
