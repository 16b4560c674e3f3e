"""A CleanRL-shaped own loop (examples/cleanrl_lstm.py, run as a real script at tiny size) tagged with the
fewest tags docs/own-loops.md documents: its report holds no false finding, and each planted bug is named by
its finding. Tagged only as far as phase, iteration, env and env_step (bootstrap untagged), the report says
once which tags are missing instead of guessing. And the reference window: lstm_probe.trace() keeps as many
rollout steps as the rollout holds, however long; an explicit reference_window still wins."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import lstm_probe
from lstm_probe import summarize
from lstm_probe.errors import BadInput
from lstm_probe.report.probes import probe_targets

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cleanrl_lstm.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TINY = ["--iterations", "3", "--num-envs", "4", "--num-steps", "32"]
# the notes every own loop's report has
WHAT_IF = ("what if (counterfactual initial states", "the memory horizon", "linear probes")


def run(tmp_path: Path, *args: str) -> tuple[Path, int]:
    """The example's log and the episodes it says finished."""
    out = tmp_path / "run.parquet"
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), *TINY, *args, "--out", str(out)],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    found = re.search(r"(\d+) episodes finished", r.stdout)
    assert found, r.stdout
    return out, int(found.group(1))


def test_correct_loop_gives_a_true_report(tmp_path):
    out, finished = run(tmp_path)
    rep = summarize(out)
    assert rep.doctor.problems == []
    assert rep.warnings == []
    assert rep.staleness.provenance_ok is True and rep.staleness.provenance_check_rows > 0  # no option needed
    assert {r["epoch"] for r in rep.staleness.by_epoch} == {0, 1}
    assert finished > 0 and rep.sequences.episodes_completed == finished
    assert rep.sequences.episodes_from == "episode_start"
    assert [u for u in rep.unavailable if not u.startswith(WHAT_IF)] == []
    assert set(rep.doctor.sources["lstm/train"]) <= {"stored", "reset"}
    assert set(rep.doctor.sources["lstm/rollout"]) == {"previous", "reset"}
    assert set(rep.doctor.sources["lstm/bootstrap"]) <= {"previous", "reset"}
    assert rep.run.env_id == "CartPole-v1" and rep.run.n_envs == 4  # metadata= fills the run box
    assert "seq_reason tag" not in rep.calls.explanation  # no tag asked for that tag() refuses
    assert "env_step_stride" not in rep.to_dict()["sequences"]
    assert rep.staleness.global_pairing is None and rep.doctor.facts[0].startswith("the vector env autoresets in SAME")


@pytest.mark.parametrize(
    "bug,kinds",
    [
        ("no-reset-in-train", {("carried_in_training", "train")}),
        # get_states resets nowhere: the training loop carries the state across episode starts too
        ("no-reset", {("not_reset", "rollout"), ("not_reset", "bootstrap"), ("carried_in_training", "train")}),
        ("reset-every-step", {("not_passed_back", "rollout"), ("not_passed_back", "bootstrap")}),
        ("bootstrap-zero-state", {("not_passed_back", "bootstrap")}),
        ("zero-train-start", {("train_from_zeros", "train")}),
        # the rollout alone forgets the reset: training resets, so its gradient is cut at the episode starts
        ("no-reset-in-rollout", {("not_reset", "rollout"), ("not_reset", "bootstrap")}),
        # env_step tagged with CleanRL's global_step (4 a step at 4 envs): its episode lengths would read 4x too long
        ("global-step", {("global_env_step", "rollout")}),
        # gymnasium's NEXT_STEP autoreset: each episode start the loop tags is a no-op step on a terminal observation
        ("next-step-autoreset", {("next_step_autoreset", "rollout")}),
    ],
)
def test_each_planted_bug_is_named(tmp_path, bug, kinds):
    out, _ = run(tmp_path, "--bug", bug)
    rep = summarize(out)
    assert {(p.kind, p.phase) for p in rep.doctor.problems} == kinds, rep.doctor.findings
    for p in rep.doctor.problems:
        assert rep.findings.count(p.text) == 1
    if bug == "no-reset":  # the training loop is named too: fixing the rollout alone would leave it carrying
        (train,) = [p for p in rep.doctor.problems if p.phase == "train"]
        assert "nor does the rollout" in train.text and "reset it in both loops" in train.text
        df = lstm_probe.load(out, phase="train", vectors=False)
        at = df[(df.call == train.first["call"]) & (df.env == train.first["env"]) & (df.layer == 0)]
        assert bool(at.episode_start.iloc[0]) and int(at.t.iloc[0]) > 0 and at.drift_h.iloc[0] == 0
    if bug == "no-reset-in-rollout":
        (rollout,) = [p for p in rep.doctor.problems if p.phase == "rollout"]
        assert "the per-step training loop does reset it" in rollout.text and "rollout alone" in rollout.text
        assert rep.sequences.cut_by_resets is True
        # the training loop's resets counted over the same scope as the rollout's count, the whole run: the
        # rollout's episode starts that lie inside training sequences (each env step once), of which those in each
        # iteration's first minibatch of epoch 0 are the ones checked
        roll = lstm_probe.load(out, phase="rollout", vectors=False)
        roll = roll[(roll.layer == 0) & roll.episode_start.astype(bool)]
        train = lstm_probe.load(out, phase="train", vectors=False)
        train = train[(train.layer == 0) & train.episode_start.astype(bool) & (train.t > 0)]
        inside = set(zip(train.env, train.env_step, strict=True))
        first = train[(train.epoch == 0) & (train.minibatch == 0)]
        assert rollout.count == len(roll) > len(inside) == rep.doctor.train_resets > len(first) > 0
        assert rep.doctor.train_resets_checked == (len(first), len(first))
        assert f"{len(inside)} of those episode starts lie inside training sequences" in rollout.text
        assert f"at all {len(first)} of them it can check" in rollout.text
        assert rep.sequences.gradient_length["median"] < rep.sequences.length["median"]
        assert not any("not reset there" in f for f in rep.findings)
    if bug == "global-step":  # the episodes counted from such env steps are withheld, and the panel says why
        (p,) = rep.doctor.problems
        assert p.first["stride"] == 4 and "env_step=first + step" in p.text and "global_step" in p.text
        assert rep.sequences.env_step_stride == 4 and rep.sequences.episode_length == {}
        assert not any("completed episodes last" in f for f in rep.findings)
        (panel,) = [b for blocks in rep.text() for b in blocks if getattr(b, "title", "") == "Sequences"]
        assert "episodes: not counted (the rollout's env_step advances by 4 a step" in " ".join(panel.lines)
        # the provenance check passes (train and rollout carry the same counter), said with what it compared
        ok = [f for f in rep.findings if f.startswith("provenance check")]
        assert rep.staleness.provenance_ok is True and len(ok) == 1
        assert ok[0].startswith("provenance check OK, but on a global env_step:") and "advances by 4 a step" in ok[0]
        lines = [b.text for blocks in rep.text() for b in blocks if getattr(b, "text", "").startswith("provenance")]
        assert any("[yellow]OK[/] (allowed 0.0001): but its pairs are matched by env_step" in t for t in lines)
    if bug == "next-step-autoreset":  # the autoreset steps are the rollout's episode starts past env step 0
        df = lstm_probe.load(out, phase="rollout", vectors=False)
        starts = df[(df.layer == 0) & df.episode_start.astype(bool) & (df.env_step > 0)]
        (p,) = rep.doctor.problems
        assert p.count == len(starts) > 0 and "SAME_STEP" in p.text
    if rep.staleness.provenance_ok is False:  # the failure names what to check, not the log
        (warning,) = rep.warnings
        assert "cannot be trusted" not in warning and "env_step" in warning and "resets" in warning


def test_carried_state_is_named_where_it_departs(tmp_path):
    out, _ = run(tmp_path, "--bug", "no-reset-in-train")
    rep = summarize(out)
    (p,) = rep.doctor.problems
    df = lstm_probe.load(out, phase="train", vectors=False)
    at = df[(df.call == p.first["call"]) & (df.env == p.first["env"])]
    assert bool(at.episode_start.iloc[0]) and int(at.t.iloc[0]) > 0  # an episode start inside the sequence
    assert "per-step training loop carried the state across an episode start" in p.text


def test_missing_tags_are_said_once_never_guessed(tmp_path):
    out, finished = run(tmp_path, "--tags", "bare")
    rep = summarize(out)
    assert rep.doctor.problems == [] and rep.warnings == []
    assert rep.staleness.provenance_ok is True
    notes = [u for u in rep.unavailable if not u.startswith(WHAT_IF)]
    starts = [u for u in notes if u.startswith("episode starts:")]
    assert len(starts) == 1 and "rollout calls" in starts[0] and "train calls" in starts[0]
    assert sum("phase='bootstrap'" in u for u in notes) == 1  # the untagged value call
    assert sum(u.startswith("episode lengths:") for u in notes) == 1
    assert len(notes) == 3, notes
    assert rep.sequences.episodes_completed == 0 and finished > 0  # not counted, and said so


def _loop(path: Path, steps: int, **capture) -> None:
    """2 envs, a rollout of ``steps`` one-step calls, then the whole rollout re-run step by step from the
    state stored at its start (twice: two iterations)."""
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 8)
    xs = torch.randn(2 * steps, 2, 3)
    state = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
    with lstm_probe.trace(lstm, path, force=True, **capture) as probe, torch.no_grad():
        for it in range(2):
            first = it * steps
            initial = state
            for t in range(steps):
                with probe.tag(phase="rollout", iteration=it, env=[0, 1], env_step=first + t):
                    _, state = lstm(xs[first + t : first + t + 1], state)
            s = initial
            with probe.tag(
                phase="train",
                iteration=it,
                epoch=0,
                minibatch=0,
                env=[0, 1],
                env_step=np.arange(first, first + steps)[None],
            ):
                for t in range(steps):
                    _, s = lstm(xs[first + t : first + t + 1], s)


def test_reference_window_follows_the_rollout(tmp_path):
    """A 100-step rollout (the ring starts at 16 steps and grows while it is kept): every train row is paired
    with its rollout state, the stored start state recognised."""
    _loop(tmp_path / "long.parquet", 100)
    df = lstm_probe.load(tmp_path / "long.parquet", phase="train", vectors=False)
    assert len(df) == 2 * 2 * 100 and df.drift_h.notna().all() and df.drift_h.max() == 0
    starts = df[df.t == 0]
    assert set(starts[starts.iteration == 1]["init"]) == {"stored"}


def test_an_explicit_reference_window_wins(tmp_path):
    _loop(tmp_path / "none.parquet", 20, reference_window=0)
    df = lstm_probe.load(tmp_path / "none.parquet", phase="train", vectors=False)
    assert df.drift_h.isna().all()
    rep = summarize(tmp_path / "none.parquet")
    assert rep.staleness.provenance_ok is None
    assert sum(u.startswith("staleness and the provenance check") for u in rep.unavailable) == 1
    _loop(tmp_path / "short.parquet", 20, reference_window=5)  # fewer steps than the rollout: the last ones
    df = lstm_probe.load(tmp_path / "short.parquet", phase="train", vectors=False)
    assert df.drift_h.notna().sum() == 2 * 2 * 7  # the last 5 + 2 steps of each rollout


def test_own_values_probe_an_own_loops_log(tmp_path):
    """An own loop keeps no observations beside its rows; linear probes take the user's values (a DataFrame of
    env, env_step, value) on a log whose episodes come from episode_start alone: an exact linear map of h scores 1,
    and episode_step is probed beside it."""
    out, _ = run(tmp_path)
    df = lstm_probe.load(out, phase="rollout", layer=0, vectors=True).reset_index(drop=True)
    h = lstm_probe.states(df, "h").astype(np.float64)
    target = pd.DataFrame({"env": df["env"], "env_step": df["env_step"], "value": h @ np.linspace(-1, 1, h.shape[1])})
    res = lstm_probe.probe(out, target, alpha=1e-9)
    assert set(res["iteration"]) == {0, 1, 2} and (res["r2"] > 0.9999).all(), res
    both = probe_targets(out, ["episode_step", target], alpha=1e-9)
    assert (both[both["target"] != "episode_step"]["r2"] > 0.9999).all() and len(both) == 6


def test_refusals_of_untagged_columns_say_the_tag(tmp_path):
    """A log whose loop tags no episode numbers (episode_start alone): loading, drawing or probing what it lacks is
    refused in one line that names the tag or the way in."""
    out, _ = run(tmp_path)
    with pytest.raises(BadInput, match=r"every row leaves episode null \(an own loop's rows hold it where its "):
        lstm_probe.load(out, env=0, episode=1)
    cli = [sys.executable, "-m", "lstm_probe"]
    r = subprocess.run([*cli, "report", str(out), "--html", str(tmp_path / "r.html"), "--env", "1", "--episode", "2"],
                       capture_output=True, text=True, env=ENV, timeout=300)  # fmt: skip
    assert r.returncode == 2 and "carry no episode numbers" in r.stderr and "episode=" in r.stderr, r.stderr
    r = subprocess.run([*cli, "probe", str(out), "--target", "obs:0"], capture_output=True, text=True, env=ENV)
    assert r.returncode == 2 and "DataFrame with env, env_step, value" in r.stderr, r.stderr
