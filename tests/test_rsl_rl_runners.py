"""rsl_rl (rsl-rl-lib 5.5) set-ups beyond OnPolicyRunner's defaults, run for real at tiny scale: a
DistillationRunner with a recurrent student and teacher (traced: rollout and per-step training rows);
export of a runner right after learn(), of an asymmetric actor-critic and of an MLP critic (refused, named); the
what-if words of a GRU run."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest
import torch

import lstm_probe

rsl_rl = pytest.importorskip("rsl_rl")
DISTRIBUTION_CHECKS = False  # what the framework sets for the process (see conftest.py)

from rsl_rl.runners import DistillationRunner  # noqa: E402

from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg  # noqa: E402
from lstm_probe.integrations.rsl_rl.train import build_runner  # noqa: E402


def _distillation(tmp_path, cell, layers=1):
    """A DistillationRunner (recurrent student and teacher, the teacher loaded from a PPO checkpoint): 4 envs, 8 steps,
    2 epochs, gradient_length 4, episodes of 10 steps."""
    torch.manual_seed(0)
    env = TorchPendulumVecEnv(4, seed=0, max_steps=10)
    cfg = train_cfg(
        num_steps_per_env=8,
        num_mini_batches=2,
        learning_rate=1e-3,
        rnn_type=cell,
        rnn_layers=layers,
        hidden_size=8,
        mlp=(8,),
    )
    teacher = build_runner(env, cfg)
    teacher.save(str(tmp_path / "teacher.pt"))
    actor = cfg["actor"]
    dcfg = {
        "num_steps_per_env": 8,
        "save_interval": 10**9,
        "obs_groups": {"student": ["policy"], "teacher": ["policy"]},
        "student": actor,
        "teacher": actor,
        "algorithm": {"class_name": "rsl_rl.algorithms.Distillation", "num_learning_epochs": 2, "gradient_length": 4},
    }
    with contextlib.redirect_stdout(io.StringIO()):
        runner = DistillationRunner(env, dcfg, log_dir=None)
    runner.load(str(tmp_path / "teacher.pt"))
    return runner


@pytest.mark.parametrize(("cell", "layers"), [("gru", 1), ("lstm", 2)])
def test_a_distillation_runner_is_traced(tmp_path, cell, layers):
    """A DistillationRunner (it was refused): student and teacher rollout rows, the student's training replay as train
    rows by epoch and gradient window (one 4-step sequence per env), the provenance check OK before the first optimizer
    step, the BPTT horizon gradient_length, and the doctor's words on the rollout that starts from training's state."""
    runner = _distillation(tmp_path, cell, layers)
    log = tmp_path / "run.parquet"
    with attach(runner, log):
        runner.learn(2)
    rows = lstm_probe.load(log)
    rollout, train = rows[rows.phase == "rollout"], rows[rows.phase == "train"]
    assert sorted(rows.phase.unique()) == ["rollout", "train"]
    assert len(rollout) == 2 * 2 * 8 * 4 * layers  # (student, teacher) x iterations x steps x envs x layers
    assert (rollout.groupby("module").size() == 2 * 8 * 4 * layers).all()
    assert len(train) == 2 * 2 * 8 * 4 * layers and set(train.module) == {"student"}  # iterations x epochs x ...
    assert set(train.path) == {"stepwise"} and set(train.seq_len) == {4}
    layer0 = train[train.layer == 0]
    keys = layer0.groupby(["iteration", "epoch", "minibatch"]).size()
    assert keys.to_dict() == {(i, e, m): 16 for i in (0, 1) for e in (0, 1) for m in (0, 1)}
    assert (layer0.t == layer0.env_step % 8 % 4).all() and (layer0.seq == layer0.env).all()
    # each train row keyed to the rollout row of the same storage step: env step, episode, episode step
    roll = rollout[(rollout.module == "student") & (rollout.layer == 0)].set_index(["env", "env_step"])
    paired = layer0.join(roll[["episode", "episode_step"]], on=["env", "env_step"], rsuffix="_r")
    assert (paired.episode == paired.episode_r).all() and (paired.episode_step == paired.episode_step_r).all()
    first = train[(train.epoch == 0) & (train.minibatch == 0)]
    assert len(first) == 2 * 4 * 4 * layers and first.drift_h.max() < 1e-6
    assert train[train.epoch == 1].drift_h.min() > 0  # after optimizer steps
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "400"}
    cmd = [sys.executable, "-m", "lstm_probe", "report", str(log)]
    text = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    assert "provenance check OK" in text
    # each epoch restarts from the state the rollout began from, which the previous rollout did not end with
    assert "the first step of its env's rollout (the state the rollout began from)" in " ".join(text.split())
    assert (
        "4 student/rollout columns started their rollout's first step from the state training's last pass over the "
        "previous rollout ended with"
    ) in text and "no provenance bug" in text
    doc = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, check=True).stdout)
    assert doc["staleness"]["provenance_ok"] is True
    assert doc["sequences"]["gradient_length"]["max"] == 4  # gradient_length
    assert doc["doctor"]["rolled"] == {"student/rollout": 4}
    meta = lstm_probe.read_info(log).metadata
    assert meta["capabilities"]["rollout_start"] == "training" and meta["rsl_rl"]["gradient_length"] == 4
    assert meta["algorithm"] == "Distillation"


def test_distillation_refuses_what_if(tmp_path):
    """What-if and memory re-run PPO's stored minibatches: refused in one line for a DistillationRunner, nothing
    wrapped."""
    runner = _distillation(tmp_path, "gru")
    with pytest.raises(lstm_probe.BadInput, match="--what-if is not built for rsl_rl's distillation"):
        attach(runner, tmp_path / "run.parquet", what_if=True)
    assert "act" not in vars(runner.alg)


class PrivilegedPendulum(TorchPendulumVecEnv):
    """The torch Pendulum with a second observation group, 'critic' (the velocity the actor does not see): an
    asymmetric actor-critic as Isaac Lab configures them (``obs_groups``: critic ['policy', 'critic'])."""

    def get_observations(self):
        obs = super().get_observations()
        obs["critic"] = self.pendulum.observe()[:, :1] * 0.0 + self.pendulum.steps[:, None].float()
        return obs


def _runner(env, critic_groups=("policy",), critic_rnn=True):
    torch.manual_seed(0)
    cfg = train_cfg(
        num_steps_per_env=8,
        num_mini_batches=2,
        learning_rate=1e-3,
        rnn_type="gru",
        rnn_layers=2,
        hidden_size=8,
        mlp=(8,),
    )
    cfg["obs_groups"] = {"actor": ["policy"], "critic": list(critic_groups)}
    if not critic_rnn:
        cfg["critic"] = {"class_name": "rsl_rl.models.MLPModel", "hidden_dims": [8]}
    return build_runner(env, cfg), cfg


def test_export_of_an_asymmetric_actor_critic_names_both_widths(tmp_path):
    """A critic that reads more observations than the actor (privileged 'critic' group): export feeds one
    observation to both, and says so in one line (it was torch.export's own error, cut after its first line)."""
    runner, _ = _runner(PrivilegedPendulum(4, seed=0, max_steps=10), critic_groups=("policy", "critic"))
    runner.learn(1)
    with pytest.raises(
        lstm_probe.BadInput, match=r"this critic reads 3 values \(its observation groups\), the actor 2$"
    ):
        lstm_probe.export(runner, tmp_path / "policy.onnx", synthetic=True, episodes=1)
    assert not (tmp_path / "policy.onnx").exists()


def test_export_of_an_mlp_critic_checkpoint_names_the_critic(tmp_path):
    """An Isaac Lab run folder (model_*.pt, params/agent.yaml) whose critic is an MLPModel: the refusal names the
    critic and its class (it said the run's 'models are not RNNModels', the recurrent actor among them)."""
    yaml = pytest.importorskip("yaml")
    runner, cfg = _runner(TorchPendulumVecEnv(4, seed=0, max_steps=10), critic_rnn=False)
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "agent.yaml").write_text(yaml.dump(cfg))
    runner.save(str(tmp_path / "model_0.pt"))
    with pytest.raises(lstm_probe.BadInput, match=r"agent\.yaml.s critic is MLPModel, not an RNNModel; export writes"):
        lstm_probe.export(tmp_path / "model_0.pt", tmp_path / "policy.onnx", synthetic=True, episodes=1)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_export_of_a_runner_right_after_learn(tmp_path, cell):
    """``lstm_probe.export(runner, ...)`` after ``runner.learn()``, as a training script ends: the actor's
    distribution still holds the last minibatch's graph, which a deep copy refused (RuntimeError); the file is
    written and verified against rsl_rl's own policy."""
    torch.manual_seed(0)
    cfg = train_cfg(
        num_steps_per_env=8,
        num_mini_batches=2,
        learning_rate=1e-3,
        rnn_type=cell,
        rnn_layers=2,
        hidden_size=8,
        mlp=(8,),
    )
    runner = build_runner(TorchPendulumVecEnv(4, seed=0, max_steps=10), cfg)
    runner.learn(1)
    done = lstm_probe.export(runner, tmp_path / "policy.onnx", synthetic=True, episodes=1)
    assert (tmp_path / "policy.onnx").exists() and done.errors["action"] < 1e-5 and done.steps > 0


def test_what_if_of_a_gru_run_says_gru(tmp_path):
    """A GRU actor and critic measured with what_if: the report's What-if section and the verdict's words name the
    GRU (they said 'the critic has its own LSTM', 'the LSTMs re-run'); an MLP critic 'has no GRU'."""
    for critic_rnn in (True, False):
        runner, _ = _runner(TorchPendulumVecEnv(4, seed=0, max_steps=10), critic_rnn=critic_rnn)
        log = tmp_path / f"{critic_rnn}.parquet"
        with attach(runner, log, capture="summary", what_if=True):
            runner.learn(1)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
        cmd = [sys.executable, "-m", "lstm_probe", "report", str(log)]
        text = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
        assert "the GRUs re-run over the rollout" in text and "LSTM" not in text
        assert ("the critic has its own GRU" if critic_rnn else "the critic has no GRU: its values") in text
        doc = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, check=True).stdout)
        assert doc["what_if"]["kind"] == "GRU" and doc["what_if"]["critic"] == ("lstm" if critic_rnn else "mlp")


class CountedPendulum(TorchPendulumVecEnv):
    """The torch Pendulum that keeps what ``OnPolicyRunner.learn(init_at_random_ep_len=True)`` set its
    ``episode_length_buf`` to (each env's step in its first episode)."""

    randomized: torch.Tensor | None = None

    @TorchPendulumVecEnv.episode_length_buf.setter  # type: ignore[attr-defined]
    def episode_length_buf(self, value):
        self.randomized = value.clone()
        self.pendulum.steps = value


def test_random_initial_episode_lengths_go_on_from_the_envs_count(tmp_path):
    """``learn(init_at_random_ep_len=True)`` (Isaac Lab's train.py) puts env e k_e steps into its first episode
    (10-step episodes: it ends after 10 - k_e steps). The rollout rows say episode step (k_e + s) % 10 at env step
    s, an episode start only where that is 0, and the report counts as complete only the episodes whose first
    step is in the log (env e's first only where k_e == 0), all 10 steps long; the oracle and the doctor agree."""
    torch.manual_seed(3)  # counts [9, 0, 7, 9, 7, 1, 0, 6]: fresh starts, and ends at the log's last steps
    env = CountedPendulum(8, seed=0, max_steps=10)
    cfg = train_cfg(
        num_steps_per_env=16, num_mini_batches=2, learning_rate=1e-3, rnn_type="lstm", rnn_layers=1, hidden_size=8
    )
    cfg["algorithm"]["num_learning_epochs"] = 2
    runner = build_runner(env, cfg)
    path = tmp_path / "random-lengths.parquet"
    with attach(runner, path):
        runner.learn(2, init_at_random_ep_len=True)
    k = env.randomized.numpy()
    assert k.tolist() == [9, 0, 7, 9, 7, 1, 0, 6]
    df = lstm_probe.load(path, vectors=False)
    roll = df[(df.phase == "rollout") & (df.module == "actor")]
    assert len(roll) == 8 * 32
    at = k[roll.env.to_numpy()] + roll.env_step.to_numpy()
    assert (roll.episode_step.to_numpy() == at % 10).all() and (roll.episode.to_numpy() == at // 10).all()
    assert (roll.episode_start.to_numpy() == (at % 10 == 0)).all()
    # complete: episodes whose first step (env step 10 j - k_e) is in the log and whose last (9 more) is not
    # the log's last step (31: the report cannot see it end)
    complete = sum(1 for ke in k for j in range(5) if 10 * j - ke >= 0 and 10 * j - ke + 9 < 31)
    seq = lstm_probe.summarize(path).sequences
    assert seq.episodes_completed == complete == 20  # 3 each at k 0 and k 9 (the third: 21-30), else 2
    assert seq.episode_length["min"] == seq.episode_length["max"] == 10
    train = df[(df.phase == "train") & (df.module == "actor") & ~df.padding & (df.epoch == 0) & (df.minibatch == 0)]
    m = train.merge(roll, on=["module", "env", "env_step"], suffixes=("", "_r"))
    assert len(m) == len(train) and (m.episode_step == m.episode_step_r).all()
    assert {p.kind for p in lstm_probe.summarize(path).doctor.problems} == set()


@pytest.mark.parametrize("framework", [(), ("--framework", "rsl_rl")], ids=["sb3-default", "rsl_rl"])
def test_arch_of_an_rsl_rl_checkpoint_says_how_to_see_it(tmp_path, framework):
    """``lstm-probe arch model_0.pt`` (the checkpoint OnPolicyRunner.save writes): one line, exit 2, that gives the
    command showing its architecture, the sizes read from its weights (was: 'cannot load ... as a RecurrentPPO
    model: it is not an SB3 model.zip', or with --framework rsl_rl 'unknown env id')."""
    torch.manual_seed(0)
    cfg = train_cfg(
        num_steps_per_env=8, num_mini_batches=2, learning_rate=1e-3, rnn_type="gru", rnn_layers=2, hidden_size=12
    )
    runner = build_runner(TorchPendulumVecEnv(4, seed=0, max_steps=10), cfg)
    path = tmp_path / "model_0.pt"
    runner.save(str(path))
    cmd = [sys.executable, "-m", "lstm_probe", "arch", str(path), *framework]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr == (
        f"error: {path} is a checkpoint of rsl_rl, which arch does not read: arch builds the policy from the env id "
        "the run trained on, `lstm-probe arch ENV_ID --framework rsl_rl --rnn-type gru --hidden-size 12 "
        "--lstm-layers 2` (export reads the checkpoint itself)\n"
    )


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_tracing_a_distillation_runner_changes_nothing(tmp_path, cell):
    """The probe wraps the runner's storage generator and hooks the student and teacher: the same final student
    and teacher weights, torch RNG, env state and iteration count with and without it."""

    def state(runner):
        alg = runner.alg
        params = [p.detach().clone() for p in [*alg.student.parameters(), *alg.teacher.parameters()]]
        env = runner.env.pendulum
        rng = (torch.get_rng_state(), env.generator.get_state(), env.theta.clone())
        return params, rng, runner.current_learning_iteration

    runs = []
    for probe in (False, True):
        (tmp_path / str(probe)).mkdir()
        runner = _distillation(tmp_path / str(probe), cell)
        if probe:
            with attach(runner, tmp_path / "p.parquet"):
                runner.learn(2)
        else:
            runner.learn(2)
        runs.append(state(runner))
    (a, ra, ia), (b, rb, ib) = runs
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(ra, rb, strict=True)) and ia == ib
