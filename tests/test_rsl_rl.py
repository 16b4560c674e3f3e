"""rsl_rl (rsl-rl-lib 5.5): real OnPolicyRunner PPO on the torch-native Pendulum (no velocity, short episodes so
rollouts hold dones) with the probe attached. The provenance oracle: before the first optimizer step of an
update (epoch 0, minibatch 0) every training state equals the rollout state of the same (env, env_step),
for LSTM and GRU, 1 and 2 layers, 1 and 64 envs, and at 1,024 envs with --trace-envs (and --other-envs none);
the hooks never wait for the dones. The doctor finds each planted rsl_rl bug class and nothing in a correct
loop; the probe changes nothing in training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import lstm_probe

rsl_rl = pytest.importorskip("rsl_rl")
DISTRIBUTION_CHECKS = False  # what the framework sets for the process (see conftest.py)

from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg  # noqa: E402
from lstm_probe.integrations.rsl_rl.train import build_runner  # noqa: E402

KEYS = ["module", "layer", "env", "env_step"]
STEPS = 16  # per env and rollout; episodes of 10 steps end inside every rollout


def make_runner(n_envs: int, rnn: str = "lstm", layers: int = 1, steps: int = STEPS, seed: int = 0, minibatches=None):
    torch.manual_seed(seed)
    env = TorchPendulumVecEnv(n_envs, seed=seed, max_steps=10)
    cfg = train_cfg(
        num_steps_per_env=steps,
        num_mini_batches=minibatches or min(n_envs, 4),
        num_learning_epochs=2,
        learning_rate=1e-3,
        rnn_type=rnn,
        rnn_layers=layers,
        hidden_size=8,
        mlp=(8,),
    )
    return build_runner(env, cfg)


def probed(path, n_envs, rnn="lstm", layers=1, iterations=2, steps=STEPS, **capture):
    runner = make_runner(n_envs, rnn, layers, steps)
    with attach(runner, path, **capture):
        runner.learn(iterations)
    return runner


def oracle(df) -> float:
    """The largest relative difference between a first-minibatch train state and its rollout state."""
    roll = df[df.phase == "rollout"]
    assert not roll.duplicated(KEYS).any()
    train = df[(df.phase == "train") & ~df.padding]
    first = train[(train.epoch == 0) & (train.minibatch == 0)]
    assert sorted(first.iteration.unique()) == sorted(roll.iteration.unique())
    m = first.merge(roll, on=KEYS, suffixes=("", "_r"), how="left", indicator=True)
    assert len(m) and (m["_merge"] == "both").all(), "every first-minibatch train row finds its rollout row"
    # provenance agrees row by row
    assert (m.episode == m.episode_r).all() and (m.episode_step == m.episode_step_r).all()
    worst = 0.0
    for col in ("h", "c") if df["c"].notna().any() else ("h",):
        a = lstm_probe.states(m, col)
        b = lstm_probe.states(m.drop(columns=[col]).rename(columns={f"{col}_r": col}), col)
        worst = max(worst, float((np.abs(a - b) / np.maximum(1.0, np.abs(b))).max()))
    return worst


VARIANTS = [(rnn, layers, n) for rnn in ("lstm", "gru") for layers in (1, 2) for n in (1, 64)]


@pytest.mark.parametrize("rnn,layers,n_envs", VARIANTS, ids=[f"{r}-{k}layer-{n}env" for r, k, n in VARIANTS])
def test_oracle_train_states_equal_rollout_states(tmp_path, rnn, layers, n_envs):
    probed(tmp_path / "run.parquet", n_envs, rnn, layers)
    df = lstm_probe.load(tmp_path / "run.parquet")
    assert set(df.module) == {"actor", "critic"} and set(df.layer) == set(range(layers))
    assert oracle(df) < 1e-5
    assert df["c"].notna().any() == (rnn == "lstm")
    roll = df[(df.phase == "rollout") & (df.module == "actor") & (df.layer == 0)]
    assert len(roll) == 2 * STEPS * n_envs and set(roll.env) == set(range(n_envs))
    assert roll.groupby("env").env_step.apply(lambda s: sorted(s) == list(range(2 * STEPS))).all()
    # episodes of 10 steps: env e's step k is episode k // 10, step k % 10, a start where k % 10 == 0
    assert (roll.episode == roll.env_step // 10).all() and (roll.episode_step == roll.env_step % 10).all()
    assert (roll.episode_start == (roll.env_step % 10 == 0)).all()
    train = df[(df.phase == "train") & (df.module == "actor") & (df.layer == 0)]
    # trajectories split at the dones: per env and update, sequences of 10 and 6 steps (iteration 0: steps
    # 0-9, 10-15; iteration 1: 16-19, 20-29, 30-31), padded to the rollout's 16 steps
    seqs = train[(train.t == 0) & (train.epoch == 0)]
    assert sorted(seqs[seqs.iteration == 0].seq_len.tolist()) == sorted([10, 6] * n_envs)
    assert sorted(seqs[seqs.iteration == 1].seq_len.tolist()) == sorted([4, 10, 2] * n_envs)
    assert (train.padding == (train.t >= train.seq_len)).all()
    assert (seqs.seq_reason == np.where(seqs.episode_start, "episode_start", "env_boundary")).all()
    # the bootstrap call: the critic on the step after the rollout's last one
    boot = df[df.phase == "bootstrap"]
    assert set(boot.module) == {"critic"} and set(boot.env_step) == {STEPS, 2 * STEPS}


def test_trace_envs_at_1024_envs(tmp_path):
    """1,024 envs, --trace-envs 4: vectors for envs 0..3 only, drift on every row; the oracle holds on the
    chosen envs, and the in-probe drift says the same for every first-minibatch row (envs 0..255)."""
    probed(tmp_path / "wide.parquet", 1024, steps=4, iterations=1, trace_envs=4)
    df = lstm_probe.load(tmp_path / "wide.parquet")
    stored = df.h.notna()
    assert (stored == (df.env.isin(range(4)) & ~df.padding)).all()
    assert oracle(df[stored]) < 1e-5
    first = df[(df.phase == "train") & (df.epoch == 0) & (df.minibatch == 0) & ~df.padding]
    assert set(first.env) == set(range(256)) and first.drift_h.max() < 1e-5 and first.drift_c.max() < 1e-5
    meta = json.loads(pq.read_schema(tmp_path / "wide.parquet").metadata[b"lstm_probe.run"])
    assert meta["framework"] == "rsl_rl" and meta["capture"]["trace_envs"] == 4
    assert meta["capabilities"]["epochs"] and meta["capabilities"]["stored_states"]


def test_other_envs_none_at_1024_envs(tmp_path):
    """1,024 envs, --trace-envs 16 --other-envs none: rows for envs 0..15 only (their sequences' padding, env
    null, aside), every one with its vectors; the oracle holds on them; the rollout and bootstrap rows are
    the kept envs' every step."""
    probed(tmp_path / "none.parquet", 1024, iterations=1, trace_envs=16, other_envs="none")
    df = lstm_probe.load(tmp_path / "none.parquet")
    assert set(df.env.dropna().unique()) == set(range(16))
    assert (df.env.isna() == df.padding).all() and df.padding.any()  # the kept sequences keep their padding
    real = df[~df.padding]
    assert real.h.notna().all() and real.c.notna().all()
    assert oracle(real) < 1e-5
    roll = real[(real.phase == "rollout") & (real.layer == 0)]
    assert len(roll) == 2 * STEPS * 16 and set(roll.env_step) == set(range(STEPS))
    boot = real[real.phase == "bootstrap"]
    assert set(boot.module) == {"critic"} and len(boot) == 16 and set(boot.env_step) == {STEPS}
    first = real[(real.phase == "train") & (real.epoch == 0) & (real.minibatch == 0)]
    assert set(first.env) == set(range(16)) and first.drift_h.max() < 1e-5 and first.drift_c.max() < 1e-5
    meta = json.loads(pq.read_schema(tmp_path / "none.parquet").metadata[b"lstm_probe.run"])
    assert meta["capture"]["trace_envs"] == 16 and meta["capture"]["other_envs"] == "none"


def test_hooks_never_wait_for_the_dones(tmp_path, monkeypatch):
    """Every dones copy still under way when first asked (as on a GPU before anything synced; here on CPU):
    ``resolve`` (asked inside the hooks) never reads one; the act wrapper waits once per env step and a play
    loop's env.step wrapper once per step, so provenance is what it is when every copy is done at once. A
    play-loop call right after env steps taken outside one gets null episode fields, not a guess."""
    from lstm_probe.integrations.rsl_rl import probe as probe_module

    def run(path, late: bool):
        in_resolve = [False]
        resolve, read = probe_module.RslRlProbe.resolve, probe_module._Dones.read

        def watched(self, *args):
            in_resolve[0] = True
            try:
                return resolve(self, *args)
            finally:
                in_resolve[0] = False

        def checked(self):
            assert not in_resolve[0], "resolve waited for a dones copy"
            return read(self)

        with monkeypatch.context() as m:
            if late:
                m.setattr(probe_module._Dones, "ready", lambda self: False)
            m.setattr(probe_module.RslRlProbe, "resolve", watched)
            m.setattr(probe_module._Dones, "read", checked)
            runner = make_runner(4)
            env = runner.env
            with attach(runner, path) as probe:
                runner.learn(2)
                policy = runner.get_inference_policy()
                with torch.inference_mode():
                    obs, _, dones, _ = env.step(torch.zeros(4, 1))  # a step outside any loop, then a play loop
                    policy.reset(dones)
                    for _ in range(12):
                        obs, _, dones, _ = env.step(policy(obs))
                        policy.reset(dones)
        return probe.waits, lstm_probe.load(path, vectors=False)

    waits, late = run(tmp_path / "late.parquet", True)
    none, now = run(tmp_path / "now.parquet", False)
    # a wait per env step: the rollouts' (in act, compute_returns), the step outside and the play loop's 12
    assert none == 0 and waits == 2 * STEPS + 1 + 12
    first = late[(late.phase == "predict") & (late.env_step == 2 * STEPS + 1)]
    assert len(first) == 4 and first.episode.isna().all() and first.episode_start.isna().all()
    keys = ["phase", "module", "layer", "iteration", "epoch", "minibatch", "seq", "t", "env", "env_step"]
    a = late.drop(first.index).sort_values(keys).reset_index(drop=True)
    b = now.drop(now[(now.phase == "predict") & (now.env_step == 2 * STEPS + 1)].index)
    b = b.sort_values(keys).reset_index(drop=True)
    cols = [*keys, "episode", "episode_step", "episode_start", "padding", "seq_len"]
    assert len(a) == len(b) and a[cols].equals(b[cols])


def _state(runner):
    alg = runner.alg
    params = [p.detach().clone() for p in [*alg.actor.parameters(), *alg.critic.parameters()]]
    env = runner.env.pendulum
    return (
        params,
        torch.get_rng_state(),
        env.generator.get_state(),
        env.theta.clone(),
        runner.current_learning_iteration,
    )


def test_the_probe_changes_nothing(tmp_path):
    runs = []
    for probe in (False, True):
        runner = make_runner(4)
        if probe:
            with attach(runner, tmp_path / "p.parquet", capture="summary"):
                runner.learn(2)
        else:
            runner.learn(2)
        runs.append(_state(runner))
        assert "act" not in vars(runner.alg) and "step" not in vars(runner.env)  # the wrappers came off
    (pa, ra, ga, ta, ia), (pb, rb, gb, tb, ib) = runs
    assert all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))
    assert torch.equal(ra, rb) and torch.equal(ga, gb) and torch.equal(ta, tb) and ia == ib


def problems(path) -> dict[str, str]:
    return {p.kind: p.phase for p in lstm_probe.summarize(path).doctor.problems}


def test_a_correct_loop_has_no_finding(tmp_path):
    probed(tmp_path / "ok.parquet", 8)
    assert problems(tmp_path / "ok.parquet") == {}


def test_planted_reset_of_envs_that_were_not_done(tmp_path):
    """IsaacLab #888: every env's state zeroed when any env was done."""
    runner = make_runner(8)
    alg, process = runner.alg, runner.alg.process_env_step

    def buggy(obs, rewards, dones, extras):
        process(obs, rewards, dones, extras)
        if bool(dones.any()):
            alg.actor.reset(torch.ones_like(dones))

    alg.process_env_step = buggy
    with attach(runner, tmp_path / "bug.parquet"):
        runner.learn(2, init_at_random_ep_len=True)  # episodes out of step: most envs are not done
    assert problems(tmp_path / "bug.parquet") == {"reset_without_start": "rollout"}


def test_planted_state_advanced_twice_for_one_observation(tmp_path):
    """The actor called twice at one env step (its state advances twice per observation)."""
    runner = make_runner(8)
    alg, act = runner.alg, runner.alg.act
    alg.act = lambda obs: (alg.actor(obs), act(obs))[1]
    with attach(runner, tmp_path / "twice.parquet"):
        runner.learn(2)
    assert problems(tmp_path / "twice.parquet") == {"advanced_twice": "rollout"}


def test_planted_bootstrap_that_keeps_its_state(tmp_path):
    """rsl_rl #130: the critic evaluated on the last observation and its advanced state kept."""
    runner = make_runner(8)
    alg, returns = runner.alg, runner.alg.compute_returns

    def buggy(obs):
        alg.critic(obs)  # advances the critic's state; compute_returns then restores to this one
        returns(obs)

    alg.compute_returns = buggy
    with attach(runner, tmp_path / "boot.parquet"):
        runner.learn(2)
    assert problems(tmp_path / "boot.parquet") == {"advanced_by_bootstrap": "rollout"}


@pytest.mark.parametrize("reset", [True, False], ids=["resets", "never-resets"])
def test_play_loop(tmp_path, reset):
    """IsaacLab #3837: a play loop that never resets the policy's memory at episode ends."""
    runner = make_runner(4)
    env = runner.env
    with attach(runner, tmp_path / "play.parquet"):
        policy = runner.get_inference_policy()
        obs = env.get_observations()
        with torch.inference_mode():
            for _ in range(25):
                obs, _, dones, _ = env.step(policy(obs))
                if reset:
                    policy.reset(dones)
    df = lstm_probe.load(tmp_path / "play.parquet", vectors=False)
    assert set(df.phase) == {"predict"} and set(df.module) == {"actor"} and len(df) == 25 * 4
    assert lstm_probe.read_info(tmp_path / "play.parquet").num_timesteps == 0  # no training: no run steps
    assert problems(tmp_path / "play.parquet") == ({} if reset else {"not_reset": "predict"})


def test_a_play_loop_after_training_adds_predict_rows_and_no_steps(tmp_path):
    """The run's env steps are training's: 2 iterations of 4 envs x 16 steps, and a 25-step play loop after
    ``learn()`` (its actions from ``get_inference_policy()``) gives 'predict' rows but no steps (the log said
    128 + 100)."""
    runner = make_runner(4)
    env = runner.env
    path = tmp_path / "trained-then-played.parquet"
    with attach(runner, path):
        runner.learn(2)
        policy = runner.get_inference_policy()
        obs = env.get_observations()
        with torch.inference_mode():
            for _ in range(25):
                obs, _, dones, _ = env.step(policy(obs))
                policy.reset(dones)
    trained = 2 * STEPS * 4
    assert lstm_probe.read_info(path).num_timesteps == trained
    rep = lstm_probe.summarize(path)
    assert rep.run.steps_done == trained
    df = lstm_probe.load(path, vectors=False)
    play = df[df.phase == "predict"]
    assert len(play) == 25 * 4 and set(play.module) == {"actor"} and play.iteration.isna().all()
    # the play rows keep counting each env's steps after training's
    assert play.env_step.min() == 2 * STEPS and play.env_step.max() == 2 * STEPS + 24


def test_cli_run_on_a_gymnasium_env_and_report(tmp_path):
    out = tmp_path / "cli.parquet"
    cmd = [sys.executable, "-m", "lstm_probe.cli", "run", "Pendulum-v1", "--framework", "rsl_rl", "--n-envs", "64"]
    # 1,000 steps asked: rounded up to whole iterations of 64 x 8, and the log says what was asked
    cmd += ["--n-steps", "8", "--steps", "1000", "--hidden-size", "8", "--n-epochs", "1", "--out", str(out), "-q"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "1,024 env steps" in r.stdout
    df = lstm_probe.load(out, vectors=False)
    assert set(df.env) == set(range(64)) and sorted(df.iteration.unique()) == [0, 1]
    r = subprocess.run([sys.executable, "-m", "lstm_probe.cli", "report", str(out)], capture_output=True, text=True)
    words = " ".join(r.stdout.replace("│", " ").split())
    assert r.returncode == 0 and "provenance check OK" in words and "steps 1,024 of 1,000 asked" in words


def test_the_example_for_a_users_own_runner(tmp_path):
    script = Path(__file__).resolve().parent.parent / "examples" / "rsl_rl_own_runner.py"
    cmd = [sys.executable, str(script), "--envs", "16", "--iterations", "2", "--out", "ex.parquet"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "provenance check OK" in r.stdout
    df = lstm_probe.load(tmp_path / "ex.parquet", vectors=False)
    assert {"rollout", "bootstrap", "train", "predict"} <= set(df.phase)
    assert not lstm_probe.summarize(tmp_path / "ex.parquet").doctor.problems
    # attach() on a runner the user built: the log says how many envs it has (the report's "env columns 0..7
    # of 16" needs it; it said "0..7")
    assert lstm_probe.read_info(tmp_path / "ex.parquet").metadata["n_envs"] == 16


def test_more_minibatches_than_envs_trains_on_empty_ones_and_the_report_says_so(tmp_path):
    """rsl_rl cuts num_envs // num_mini_batches envs a minibatch: 2 envs in 4 minibatches leave every minibatch
    empty, and its LSTMs are called with no batch column. Such calls have no rows; the log completes, counts
    them, and the report warns (the writer used to fail on them)."""
    out = tmp_path / "empty.parquet"
    runner = make_runner(2, minibatches=4)
    with attach(runner, out, capture="summary"):
        runner.learn(2)
    info = lstm_probe.read_info(out)
    assert info.metadata["completed"] is True
    assert info.metadata["empty_calls"] > 0
    r = subprocess.run([sys.executable, "-m", "lstm_probe.cli", "report", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "had no batch column" in " ".join((r.stdout + r.stderr).replace("│", " ").split())


def test_device_flag_is_checked_before_anything_is_built(tmp_path):
    """rsl_rl's runs take ``--device`` as sb3's do (the env and the runner on it; ``auto``: CUDA where torch sees
    one): a word torch does not take, or CUDA where torch sees none, is refused in one line before any env is made;
    the CPU trains as before."""
    import torch

    from tests.refusals import one_line_error

    run = [sys.executable, "-m", "lstm_probe.cli", "run", "Pendulum-v1", "--framework", "rsl_rl", "--n-envs", "4"]
    run += ["--n-steps", "8", "--steps", "32", "--hidden-size", "8", "--n-epochs", "1", "-q"]
    r = subprocess.run(
        [*run, "--device", "bogus", "--out", str(tmp_path / "b.parquet")], capture_output=True, text=True
    )
    one_line_error(r, "--device 'bogus': Expected one of cpu")
    if not torch.cuda.is_available():
        r = subprocess.run(
            [*run, "--device", "cuda", "--out", str(tmp_path / "c.parquet")], capture_output=True, text=True
        )
        one_line_error(r, "--device cuda: CUDA is not available here; use --device cpu")
    assert not (tmp_path / "b.parquet").exists() and not (tmp_path / "c.parquet").exists()
    r = subprocess.run([*run, "--device", "cpu", "--out", str(tmp_path / "cpu.parquet")], capture_output=True)
    assert r.returncode == 0, r.stderr
    assert lstm_probe.read_info(tmp_path / "cpu.parquet").rows > 0


def test_one_device_option_for_sb3_and_rsl_rl(tmp_path):
    """``--device`` is one declaration (``Placement``) that sb3's and rsl_rl's runs take: the CLI's help names
    both, a keyword ``device=`` reaches each framework's run, and TorchRL's run refuses it in one line."""
    import dataclasses

    from lstm_probe import integrations
    from lstm_probe.options import Placement
    from tests.refusals import one_line_error

    takes = {n for n, f in integrations.FRAMEWORKS.items() if "device" in integrations.run_options(f)}
    assert takes == {"sb3", "rsl_rl"}
    assert [f.name for f in dataclasses.fields(Placement)] == ["device"]
    with pytest.raises(lstm_probe.BadInput, match="--device 'bogus'"):
        lstm_probe.run("Pendulum-v1", steps=8, device="bogus", out=tmp_path / "never.parquet")
    assert not list(tmp_path.iterdir())
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe.cli", "run", "Pendulum-v1", "--framework", "torchrl", "--device", "cpu"],
        capture_output=True,
        text=True,
    )
    one_line_error(r, "--device applies to --framework sb3 and rsl_rl only")
