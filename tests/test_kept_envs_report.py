"""What a report says where its log keeps only some env columns' rows (``--trace-envs K --other-envs none``):
the calls and sequences sections and their findings say their shapes and counts are of env columns 0..K-1 of
N, no finding states the batch dimension from those columns as the run's, and counts that are the run's (sb3's
minibatches per path) are not contradicted. And the doctor's line under a table without problems is true of
every column the table shows: 'other' columns are said, with why the doctor names no problem for them."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import numpy as np
import pytest
import torch

import lstm_probe
from lstm_probe.report.sections.calls import span

RUN = dict(n_envs=8, steps=256, n_steps=16, batch_size=64, n_epochs=2, hidden_size=8, seed=0, torch_threads=1)
CLEAN = "no problem found: every call started from its previous state, a reset or a stored state"


def _words(path) -> str:
    r = subprocess.run([sys.executable, "-m", "lstm_probe.cli", "report", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return " ".join(r.stdout.replace("│", " ").split())


def test_sb3_other_envs_none_report_says_its_shapes_are_the_kept_columns(tmp_path):
    """8 envs, env 0 kept: the log's minibatches hold 1 to 3 sequences where the run's hold 4 or 5 (the full
    run's report); the calls and sequences sections say whose they are, the batch-dimension finding becomes a
    line of what the log cannot show, and the stepwise count is the run's, as the doctor's fact has it."""
    full = lstm_probe.run("Pendulum-v1", tmp_path / "full.parquet", capture="summary", trace_envs=1, **RUN)
    none = lstm_probe.run(
        "Pendulum-v1", tmp_path / "none.parquet", capture="summary", trace_envs=1, other_envs="none", **RUN
    )
    a, b = lstm_probe.summarize(full.path), lstm_probe.summarize(none.path)
    run_spm, kept_spm = a.calls.sequences_per_minibatch, b.calls.sequences_per_minibatch
    assert max(kept_spm) < min(run_spm)  # the kept columns' sequences are not the minibatch's
    assert a.calls.kept_envs is None and "training minibatches hold" in " ".join(a.findings)  # unchanged
    assert b.calls.kept_envs == 1 and b.calls.n_envs == 8
    assert not any("batch dimension" in f or "training minibatches hold" in f for f in b.findings), b.findings
    [line] = [u for u in b.unavailable if "batch dimension" in u]
    assert "env column 0 of 8" in line and f"{span(min(kept_spm), max(kept_spm))} of their sequences" in line
    # the run's minibatches: sb3's metadata counts them whatever the log keeps; the log's are fewer
    paths = b.doctor.minibatch_paths
    total, stepwise = (
        paths["sequence"]["minibatches"] + paths["stepwise"]["minibatches"],
        paths["stepwise"]["minibatches"],
    )
    assert total == a.calls.minibatches > b.calls.minibatches
    assert f"{stepwise} of the run's {total} minibatches held an episode start" in b.calls.explanation
    assert "env column 0 of 8" in b.calls.explanation
    assert f"{stepwise} of {total} minibatches held an episode start" in b.doctor.facts[0]  # the same count
    # sequences: counts of the kept columns, said so
    assert b.sequences.kept_envs == 1
    seq = [f for f in b.findings if "gradients flow back" in f or "mid-episode" in f]
    assert len(seq) == 2 and all("env column 0 of 8" in f for f in seq), seq
    words = _words(none.path)
    assert "Calls with rows of env column 0 of 8" in words
    assert f"({b.calls.minibatches} minibatches of the run's {total} hold rows of them)" in words
    assert "training sequences of actor (layer 0), of env column 0 of 8 alone" in words
    assert f"{CLEAN} (of env column 0 of 8: the log keeps no other rows)" in words


def test_rsl_rl_other_envs_none_report_says_its_shapes_are_the_kept_columns(tmp_path):
    """rsl_rl, 16 envs in 4 minibatches of 4 sequences, envs 0..1 kept: the log's minibatches hold 2 sequences
    and only one of each epoch's 4 holds any; the report says so and never calls 2 the batch dimension (an own
    runner's log names no n_envs: the kept columns are named without it)."""
    pytest.importorskip("rsl_rl")
    from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg
    from lstm_probe.integrations.rsl_rl.train import build_runner

    torch.manual_seed(0)
    env = TorchPendulumVecEnv(16, seed=0, max_steps=100)  # no episode ends inside a rollout
    cfg = train_cfg(
        num_steps_per_env=8,
        num_mini_batches=4,
        num_learning_epochs=2,
        learning_rate=1e-3,
        rnn_type="lstm",
        rnn_layers=1,
        hidden_size=8,
        mlp=(8,),
    )
    runner = build_runner(env, cfg)
    out = tmp_path / "none.parquet"
    with attach(runner, out, capture="summary", trace_envs=2, other_envs="none"):
        runner.learn(2)
    rep = lstm_probe.summarize(out)
    assert rep.run.n_envs == 16  # attach() to an own runner: the env's count
    assert rep.calls.sequences_per_minibatch == {2: 2 * 2}  # 2 iterations x 2 epochs, one minibatch each
    shapes = {k for g in rep.calls.groups if g.phase == "train" for k in g.shapes}
    assert shapes == {"8 x 2"}
    assert not any("batch dimension" in f for f in rep.findings), rep.findings
    assert any("batch dimension" in u and "env columns 0..1" in u for u in rep.unavailable)
    assert "Rollout calls have batch 2 here: the log keeps the rows of env columns 0..1" in rep.calls.explanation
    assert "(the other envs' have no rows); 4 minibatches hold rows of them;" in rep.calls.explanation
    words = _words(out)
    assert "Calls with rows of env columns 0..1" in words
    assert "sequences of env columns 0..1 per training minibatch (4 minibatches hold rows of them): 2 seq: 4" in words
    # the staleness findings: the drifts and the provenance check are of the kept columns, and say so
    stale = [f for f in rep.findings if "from their rollout states" in f or f.startswith("provenance check")]
    assert len(stale) == 2, rep.findings
    of = "of env columns 0..1 of 16 (the only env columns with rows)"
    assert all(of in f for f in stale), stale
    assert any(
        f.startswith((f"by the last epoch critic states {of} are", f"by the last epoch actor states {of} are"))
        for f in stale
    ), stale
    assert all(" ".join(f.split()) in words for f in stale)
    assert rep.staleness.kept_envs == 2 and rep.staleness.n_envs == 16


def test_doctor_says_what_a_play_loops_other_columns_are(tmp_path):
    """An rsl_rl runner trained, then a play loop (as Isaac Lab's play.py) on the same envs: each env column's
    first predict call starts from the state the rollout left ('other': the predict phase's own store holds
    none yet), at no episode start. The doctor names no problem, and its line says what those columns are
    rather than that every call started from its previous state, a reset or a stored state."""
    pytest.importorskip("rsl_rl")
    from rsl_rl.runners import OnPolicyRunner

    from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach

    torch.manual_seed(0)
    n = 8
    env = TorchPendulumVecEnv(n, max_steps=100)
    rnn = {"class_name": "rsl_rl.models.RNNModel", "hidden_dims": [8], "rnn_type": "lstm", "rnn_hidden_dim": 8}
    cfg = {
        "num_steps_per_env": 8,
        "save_interval": 50,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "actor": {**rnn, "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0}},
        "critic": rnn,
        "algorithm": {"class_name": "rsl_rl.algorithms.PPO", "num_learning_epochs": 2, "num_mini_batches": 2},
    }
    with contextlib.redirect_stdout(io.StringIO()):
        runner = OnPolicyRunner(env, cfg, log_dir=None, device="cpu")
    out = tmp_path / "own.parquet"
    with attach(runner, out, capture="summary", trace_envs=2, force=True):
        runner.learn(1)
        policy = runner.get_inference_policy(device="cpu")
        obs = env.get_observations()
        with torch.inference_mode():
            for _ in range(5):
                obs, _, dones, _ = env.step(policy(obs))
                policy.reset(dones)
    doc = lstm_probe.summarize(out).doctor
    assert doc.problems == [] and doc.sources["actor/predict"]["other"] == n
    assert doc.entered == {"actor/predict": n} and doc.inside == {}
    words = _words(out)
    assert CLEAN not in words
    assert f"{n} actor/predict columns ('other') started from a state the doctor cannot place" in words
    assert f"{n} at the first predict call of their env column" in words


@pytest.mark.parametrize("iterations", [False, True])
def test_doctor_says_a_state_changed_between_calls(tmp_path, iterations):
    """An own loop whose state one env column's is changed between two rollout calls (noise added, no episode
    start): an 'other' column at a later call of its phase, which the doctor names no problem for and says so;
    a loop without it keeps the plain line. Also where the changed state is a new iteration's first step: the
    same words (they said "1 with no env or env step to tell" where the log declares no rollout start)."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 8)
    xs = torch.randn(6, 4, 3)
    lines = {}
    for noisy in (False, True):
        out = tmp_path / f"{noisy}.parquet"
        with lstm_probe.trace(lstm, out, force=True, writer="thread") as probe, torch.no_grad():
            h = None
            for step in range(6):
                start = np.full(4, step == 0)
                it = step // 3 if iterations else 0
                with probe.tag(phase="rollout", iteration=it, env=np.arange(4), env_step=step, episode_start=start):
                    _, h = lstm(xs[step : step + 1], h)
                if noisy and step == 2:
                    h = (h[0].clone(), h[1])
                    h[0][:, 1] += 0.5  # env 1's h changed between its calls
        doc = lstm_probe.summarize(out).doctor
        assert doc.problems == []
        lines[noisy] = _words(out)
        if noisy:
            assert doc.sources["root/rollout"]["other"] == 1 and doc.inside == {"root/rollout": 1}
            assert doc.rolled == ({"root/rollout": 1} if iterations else {})
    assert CLEAN in lines[False]
    assert CLEAN not in lines[True] and "1 at a later rollout call" in lines[True]


def test_what_if_and_memory_say_they_measured_every_env_where_the_log_keeps_some(tmp_path):
    """CartPole, 8 envs, env 0 kept, --what-if --memory: the what-if figures are of whole minibatches and the
    memory horizons and episode lengths of all 8 envs (the probe measures them during training), while the BPTT
    lengths and the drift are read from env column 0's rows. Each section (text and JSON), its findings and the
    verdict say which figure is of which; a log that keeps every column says nothing of the kind."""
    kw = dict(RUN, capture="summary", trace_envs=1, what_if=True, memory=True)
    full = lstm_probe.run("CartPole-v1", tmp_path / "full.parquet", **kw)
    none = lstm_probe.run("CartPole-v1", tmp_path / "none.parquet", other_envs="none", **kw)
    a, b = lstm_probe.summarize(full.path), lstm_probe.summarize(none.path)
    assert a.what_if.measured and b.what_if.measured and a.memory.measured and b.memory.measured
    # a log with every column: unchanged
    assert a.what_if.scope is None and a.memory.scope == {} and a.verdict.scope == {}
    assert not any("every env's columns" in x or "all 8 envs" in x for x in [*a.findings, *a.verdict.lines])
    # the what-if: whole minibatches, said in its JSON, text and finding
    assert b.what_if.kept_envs == 1 and b.what_if.n_envs == 8
    assert b.what_if.scope.startswith("every env's columns of the sampled minibatches")
    assert "not only env column 0 of 8" in b.what_if.scope
    assert b.to_dict()["what_if"]["scope"] == b.what_if.scope
    [wi] = [f for f in b.findings if "stored states move" in f or "stored states leave" in f]
    assert "measured on every env's columns of the sampled minibatches" in wi
    # the memory: horizons and episodes of all 8 envs, BPTT of env column 0
    assert b.memory.sampling["n_envs"] == 8 and b.memory.n_envs == 8 and b.memory.kept_envs == 1
    scope = b.to_dict()["memory"]["scope"]
    assert scope["horizons"].startswith("all 8 envs") and scope["episode_length"].startswith("all 8 envs")
    assert scope["bptt"].startswith("env column 0 of 8")
    mem = [f for f in b.findings if "depend on the last" in f or "depend further back" in f]
    assert mem and all("measured on all 8 envs" in f for f in mem), b.findings
    assert all("training sequences of env column 0 of 8" in f for f in mem if "gradients flow back" in f)
    assert all("(median over all 8 envs)" in f for f in mem if "episodes last" in f)
    # the verdict: the drift of env column 0, the what-if of whole minibatches
    assert set(b.verdict.scope) == {"drift", "matters"}
    [drift, matters] = b.verdict.lines[:2]
    assert "training states of env column 0 of 8 (the only env columns with rows)" in drift
    assert "measured on every env's columns of the sampled minibatches" in matters
    words = _words(none.path)
    assert "steps per env of all 8 envs" in words
    assert "training sequences (BPTT) of env column 0 of 8 (the only env columns with rows)" in words
    assert "episodes seen by the memory measurement of all 8 envs: " in words  # not the log's: of env column 0
    assert b.memory.episodes_from == "measurement" and a.memory.episodes_from == "log"
    assert "measured on every env's columns of the sampled minibatches (re-run during training), not only env " in words
