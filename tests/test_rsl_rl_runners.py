"""rsl_rl (rsl-rl-lib 5.5) set-ups beyond OnPolicyRunner's defaults, run for real at tiny scale: a
DistillationRunner with a recurrent student and teacher (refused in one line: distillation is not traced);
export of a runner right after learn()."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

import lstm_probe

rsl_rl = pytest.importorskip("rsl_rl")
DISTRIBUTION_CHECKS = False  # what the framework sets for the process (see conftest.py)

from rsl_rl.runners import DistillationRunner  # noqa: E402

from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg  # noqa: E402
from lstm_probe.integrations.rsl_rl.train import build_runner  # noqa: E402


def test_a_distillation_runner_is_refused_in_one_line(tmp_path):
    """A DistillationRunner (recurrent student and teacher, the teacher loaded from a PPO checkpoint) is refused
    with BadInput naming the algorithm, nothing wrapped and no log written: its training still runs."""
    torch.manual_seed(0)
    env = TorchPendulumVecEnv(4, seed=0, max_steps=10)
    cfg = train_cfg(
        num_steps_per_env=8,
        num_mini_batches=2,
        learning_rate=1e-3,
        rnn_type="gru",
        rnn_layers=1,
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
        "algorithm": {"class_name": "rsl_rl.algorithms.Distillation", "num_learning_epochs": 1, "gradient_length": 4},
    }
    with contextlib.redirect_stdout(io.StringIO()):
        runner = DistillationRunner(env, dcfg, log_dir=None)
    runner.load(str(tmp_path / "teacher.pt"))
    with pytest.raises(lstm_probe.BadInput, match="algorithm is Distillation, which it does not trace"):
        attach(runner, tmp_path / "run.parquet")
    assert not (tmp_path / "run.parquet").exists()
    assert "step" not in vars(env) and "act" not in vars(runner.alg)
    runner.learn(1)


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
