"""How far back gradients flow (the truncated-BPTT horizon). A per-step training loop (CleanRL's ``(1 - done) * h``,
examples/cleanrl_lstm.py run as a real script at tiny size) resets the state where an episode starts inside a
training sequence, and the product with zero cuts the gradient there: the horizon is the stretch since the last
reset, not the sequence's length. Where the doctor finds the state carried across those starts (``--bug
no-reset-in-train``, ``--bug no-reset``) the gradient runs on across them: the horizon is the sequences' length,
and the report says why. Multi-step calls (sb3's sequence path, rsl_rl, TorchRL, RLlib) cannot reset inside a call
and sb3's per-step path splits its sequences at episode starts: their report is unchanged."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import probed_run

from lstm_probe import summarize
from lstm_probe.report.scan import Chunk, Frame
from lstm_probe.report.section import fmt_steps
from lstm_probe.report.sections.sequences import gradient_segments

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cleanrl_lstm.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TINY = ["--iterations", "2", "--num-envs", "2", "--num-steps", "48"]
SEQ_LEN = 48


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """The example's logs, made once: as written (with the memory horizon), and with each planted reset bug."""
    out = tmp_path_factory.mktemp("bptt")
    made = {}
    for name, args in {"ok": ["--memory"], "no-reset-in-train": ["--bug", "no-reset-in-train"]}.items():
        made[name] = out / f"{name}.parquet"
        r = subprocess.run(
            [sys.executable, str(EXAMPLE), *TINY, *args, "--out", str(made[name])],
            cwd=out,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
    return made


def stretches_from(log: Path) -> tuple[np.ndarray, int]:
    """Independently of the report: each training sequence of the log (layer 0) cut at its episode starts at t > 0,
    the lengths of the pieces, and how many cuts."""
    columns = ["phase", "layer", "path", "iteration", "epoch", "minibatch", "seq", "t", "seq_len", "padding"]
    df = pd.read_parquet(log, columns=[*columns, "episode_start"])
    train = df[(df.phase == "train") & (df.layer == 0)]
    assert set(train.path) == {"stepwise"}
    pieces, cuts = [], 0
    for _, rows in train.groupby(["iteration", "epoch", "minibatch", "seq"], dropna=False):
        at = sorted(rows.t[rows.episode_start.fillna(False).astype(bool) & ~rows.padding & (rows.t > 0)])
        cuts += len(at)
        edges = [0, *at, int(rows.seq_len.iloc[0])]
        pieces += np.diff(edges).tolist()
    return np.array(pieces, float), cuts


def test_a_per_step_loop_that_resets_cuts_the_gradient_at_the_episode_starts_inside_its_sequences(logs):
    rep = summarize(logs["ok"])
    s = rep.sequences
    pieces, cuts = stretches_from(logs["ok"])
    assert cuts > 0 and s.starts_inside == cuts and s.cut_by_resets is True and s.carried_by is None
    assert s.length["max"] == SEQ_LEN and s.gradient_length["max"] == pieces.max() < SEQ_LEN
    assert s.gradient_length["median"] == np.median(pieces) and s.gradient_length["count"] == len(pieces)
    assert s.gradient_length["min"] == pieces.min()
    said = (
        f"training sequences are {SEQ_LEN} steps, but the state is reset at the {cuts} episode starts inside them, "
        f"so gradients flow back at most {fmt_steps(pieces.max())} steps "
        f"(median {fmt_steps(np.median(pieces))}), while completed episodes last"
    )
    assert any(f.startswith(said) for f in rep.findings), rep.findings
    assert not any(f"at most {SEQ_LEN} steps" in f for f in rep.findings)
    # 2 envs in 2 minibatches: one sequence each, said in the singular
    assert "training minibatches hold 1 sequence: that is the batch dimension" in " ".join(rep.findings)
    doc = rep.to_dict()["sequences"]
    assert doc["gradient_length"]["max"] == pieces.max() and doc["starts_inside"] == cuts and doc["cut_by_resets"]
    # the memory section's BPTT figures are the same stretches
    m = rep.memory
    assert m.measured and m.bptt == s.gradient_length and m.starts_inside == cuts and m.cut_by_resets is True
    words = "\n".join(str(b) for blocks in rep.text() for b in blocks)
    assert f"BPTT (the training sequences cut at the {cuts} episode starts inside them" in words
    assert f"the state is reset at the {cuts} episode starts inside them, cutting the gradient" in words


def test_where_the_training_loop_carries_the_state_across_episode_starts_the_gradient_runs_on(logs):
    rep = summarize(logs["no-reset-in-train"])
    s = rep.sequences
    _, cuts = stretches_from(logs["no-reset-in-train"])
    assert any(p.kind == "carried_in_training" for p in rep.doctor.problems)
    assert cuts > 0 and s.starts_inside == cuts
    assert s.cut_by_resets is False and s.carried_by == "carried_in_training"
    assert s.gradient_length == s.length and s.gradient_length["max"] == SEQ_LEN
    said = [f for f in rep.findings if f.startswith(f"gradients flow back at most {SEQ_LEN} steps")]
    assert len(said) == 1, rep.findings
    assert f"across the {cuts} episode starts inside them" in said[0]
    assert said[0].endswith(
        "the state is not reset there (the doctor finds the per-step training loop carrying it across episode starts)"
    )


def test_a_rollout_that_never_resets_leaves_the_gradient_uncut(tmp_path):
    log = tmp_path / "r.parquet"
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), *TINY, "--bug", "no-reset", "--out", str(log)],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rep = summarize(log)
    s = rep.sequences
    # neither loop resets: the doctor names the training loop itself (its train states stay on the rollout's
    # unreset ones across the episode starts), which says why the gradient runs on
    kinds = {(p.kind, p.phase) for p in rep.doctor.problems}
    assert {("not_reset", "rollout"), ("carried_in_training", "train")} <= kinds
    assert s.starts_inside > 0 and s.cut_by_resets is False and s.carried_by == "carried_in_training"
    assert s.gradient_length == s.length
    said = [f for f in rep.findings if f.startswith("gradients flow back at most")]
    assert len(said) == 1 and said[0].endswith(
        "(the doctor finds the per-step training loop carrying it across episode starts)"
    )


@pytest.mark.parametrize("log", ["cartpole-4env.parquet", "pendulum-1env.parquet", "cartpole-rllib"])
def test_logs_without_resets_inside_their_sequences_read_as_before(log):
    """sb3 (its per-step path splits sequences at episode starts) and RLlib (multi-step calls): no start inside a
    sequence cuts anything, and the finding is the sequences' length, worded as it always was."""
    rep = summarize(ROOT / "sample_runs" / log)
    s = rep.sequences
    assert s.starts_inside == 0 and s.cut_by_resets is None and s.gradient_length == s.length
    said = f"gradients flow back at most {s.length['max']:.0f} steps (median {s.length['median']:.0f}) through"
    assert any(f.startswith(said) for f in rep.findings), rep.findings
    assert not any("episode starts inside" in f for f in rep.findings)


def test_a_recurrent_ppo_run_is_unchanged(runs_dir):
    """A real RecurrentPPO run with episodes ending mid-rollout (its per-step path then runs): every episode start on
    a train row is at t = 0."""
    rep = summarize(probed_run(runs_dir, "CartPole-v1", n_envs=2).path)
    df = pd.read_parquet(rep.path, columns=["phase", "path", "t", "episode_start"])
    train = df[df.phase == "train"]
    assert "stepwise" in set(train.path) and train.episode_start.fillna(False).astype(bool).any()
    s = rep.sequences
    assert s.starts_inside == 0 and s.cut_by_resets is None and s.gradient_length == s.length


def _chunk(path: list[str], t: list[int], start: list[bool], padding: list[bool]) -> Chunk:
    """One training sequence of len(t) steps, as the scan hands it to the sections."""
    n = len(t)
    paths = sorted(set(path))
    columns = {
        "phase": np.zeros(n, np.int8),
        "module": np.zeros(n, np.int8),
        "path": np.array([paths.index(p) for p in path], np.int8),
        "t": np.array(t, np.int64),
        "seq_len": np.full(n, n, np.float32),
        "episode_start": np.array(start),
        "padding": np.array(padding),
        **{k: np.zeros(n, np.float32) for k in ("iteration", "epoch", "minibatch", "seq")},
    }
    return Chunk(Frame(columns, {"phase": ["train"], "module": ["lstm"], "path": paths}), 0, "lstm", None)


def test_only_a_per_step_loops_unpadded_starts_after_t0_cut():
    t = list(range(8))
    start = [True, False, False, True, False, True, False, False]
    lengths, owner, cuts = gradient_segments(_chunk(["stepwise"] * 8, t, start, [False] * 8))
    assert sorted(lengths.tolist()) == [2.0, 3.0, 3.0] and cuts == 2 and owner.tolist() == [0, 0, 0]  # one sequence
    # the same starts in one multi-step call: nothing resets inside the call
    lengths, owner, cuts = gradient_segments(_chunk(["sequence"] * 8, t, start, [False] * 8))
    assert lengths.tolist() == [8.0] and cuts == 0
    # a start on a padding row cuts nothing
    lengths, owner, cuts = gradient_segments(_chunk(["stepwise"] * 8, t, start, [False] * 5 + [True] * 3))
    assert sorted(lengths.tolist()) == [3.0, 5.0] and cuts == 1
