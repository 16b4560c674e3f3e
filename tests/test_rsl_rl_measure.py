"""What-if and the memory horizon on rsl_rl (the engines of lstm_probe/measure/ through rsl_rl's adapters): real
OnPolicyRunner PPO on the torch-native Pendulum. Training is untouched (both on); the oracle holds (at minibatch 0
of epoch 0 stored = refreshed, and the copy's gradient from refreshed states is the very gradient rsl_rl steps
with: cosine 1, for 1 env per minibatch too, where rsl_rl's own loss broadcasts (T, T)); planted weights give the
answers they must (an RNN that ignores its state: no alternative moves anything, memory "unused"; one that
integrates: zero states move values, memory "beyond" the rollout); the CLI writes a report with What-if, Memory
and probe sections."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import lstm_probe

rsl_rl = pytest.importorskip("rsl_rl")

from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg  # noqa: E402
from lstm_probe.integrations.rsl_rl.train import build_runner  # noqa: E402


def make_runner(n_envs: int, rnn: str = "lstm", minibatches: int = 2, lr: float = 1e-3, seed: int = 0):
    torch.manual_seed(seed)
    env = TorchPendulumVecEnv(n_envs, seed=seed, max_steps=10)
    cfg = train_cfg(
        num_steps_per_env=16,
        num_mini_batches=minibatches,
        num_learning_epochs=2,
        learning_rate=lr,
        rnn_type=rnn,
        rnn_layers=1,
        hidden_size=8,
        mlp=(8,),
    )
    return build_runner(env, cfg)


def records(path) -> list[dict]:
    meta = lstm_probe.read_info(path).metadata["what_if"]
    cols = meta["records"]
    return [dict(zip(cols, row, strict=True)) for row in zip(*cols.values(), strict=True)]


def _state(runner):
    alg = runner.alg
    params = [p.detach().clone() for p in [*alg.actor.parameters(), *alg.critic.parameters()]]
    return params, torch.get_rng_state(), runner.env.pendulum.generator.get_state(), alg.learning_rate


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
def test_training_untouched_and_the_oracle_holds(tmp_path, rnn):
    runs = []
    for what_if in (False, True):
        runner = make_runner(4, rnn)
        with attach(runner, tmp_path / f"{what_if}.parquet", capture="summary", what_if=what_if, memory=what_if):
            runner.learn(3)
        runs.append(_state(runner))
        assert not runner.alg.optimizer._optimizer_step_pre_hooks  # the step hook came off
    (pa, ra, ga, la), (pb, rb, gb, lb) = runs
    assert all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))
    assert torch.equal(ra, rb) and torch.equal(ga, gb) and la == lb
    memory = lstm_probe.read_info(tmp_path / "True.parquet").metadata["memory"]
    assert set(memory["records"]["iteration"]) == {0, 1, 2} and memory["modules"] == ["actor", "critic"]
    rows = records(tmp_path / "True.parquet")
    assert {r["iteration"] for r in rows} == {0, 1, 2}
    assert {(r["epoch"], r["minibatch"]) for r in rows} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    for r in rows:
        if r["alternative"] == "stored":  # rsl_rl re-runs each trajectory from its own start: stored = refreshed
            assert r["state_actor"] == 0 and r["state_critic"] == 0 and r["value_abs"] == 0 and r["kl"] == 0
            assert r["grad_cos_policy"] == pytest.approx(1, abs=1e-5)
            assert r["grad_cos_value"] == pytest.approx(1, abs=1e-5)
    info = lstm_probe.read_info(tmp_path / "True.parquet")
    assert info.metadata["capabilities"]["replay"] is True
    report = lstm_probe.summarize(tmp_path / "True.parquet").to_dict()
    assert report["what_if"]["check"]["ok"] is True


def test_one_env_per_minibatch_follows_rsl_rls_own_loss(tmp_path):
    """With one env per minibatch PPO.update's squeezes broadcast its surrogate to (T, T); the copy's loss
    follows it verbatim, so the gradients still agree."""
    runner = make_runner(2, minibatches=2)
    with attach(runner, tmp_path / "w.parquet", capture="summary", what_if=True):
        runner.learn(2)
    stored = [r for r in records(tmp_path / "w.parquet") if r["alternative"] == "stored"]
    assert stored and all(r["grad_cos_policy"] == pytest.approx(1, abs=1e-5) for r in stored)


def _plant(runner, integrate: bool):
    """Every RNN either ignores its state (no recurrent weights, forget gate shut) or integrates its input
    (forget gate open, input gate open)."""
    for model in (runner.alg.actor, runner.alg.critic):
        rnn = model.rnn.rnn
        h = rnn.hidden_size
        with torch.no_grad():
            rnn.weight_hh_l0.zero_()
            rnn.bias_hh_l0.zero_()
            rnn.bias_ih_l0.zero_()
            rnn.bias_ih_l0[h : 2 * h] = 20.0 if integrate else -50.0  # forget gate
            rnn.bias_ih_l0[:h] = 20.0  # input gate open
            rnn.bias_ih_l0[3 * h :] = 20.0  # output gate open


@pytest.mark.parametrize("integrate", [False, True])
def test_planted_weights(tmp_path, integrate):
    runner = make_runner(4, minibatches=2, lr=0.0)
    _plant(runner, integrate)
    with attach(runner, tmp_path / "p.parquet", capture="summary", what_if=True, memory=True):
        runner.learn(2)
    memory = lstm_probe.summarize(tmp_path / "p.parquet").to_dict()["memory"]
    last = [h for h in memory["horizons"] if h["iteration"] == 1]
    assert {(h["module"], h["metric"]) for h in last} == {("actor", "kl"), ("critic", "value_rel")}
    for h in last:  # an integrator remembers past the rollout; a shut forget gate and no recurrence: nothing
        assert (h["beyond"], h["unused"]) == ((True, False) if integrate else (False, True)), h
    zero = [r for r in records(tmp_path / "p.parquet") if r["alternative"] == "zero" and r["iteration"] == 1]
    assert zero and all(r["episode_starts"] < r["sequences"] for r in zero)  # some state carried into the rollout
    moved = max(r["value_abs"] for r in zero)
    if integrate:
        assert moved > 1e-3 and max(r["state_actor"] for r in zero) == pytest.approx(1.0)
    else:
        assert moved == pytest.approx(0, abs=1e-6) and max(r["kl"] for r in zero) == pytest.approx(0, abs=1e-9)


def test_cli_run_what_if_and_report(tmp_path):
    log = tmp_path / "r.parquet"
    run = [sys.executable, "-m", "lstm_probe", "run", "Pendulum-v1", "--framework", "rsl_rl", "--steps", "96"]
    args = [*run, "--n-envs", "2", "--what-if", "--memory", "--capture-obs", "--out", str(log), "-q"]
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rep = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "report", str(log), "--json"], capture_output=True, text=True
    )
    assert rep.returncode == 0, rep.stderr
    data = json.loads(rep.stdout)
    assert data["what_if"]["measured"] and data["what_if"]["check"]["ok"] is True
    assert data["memory"]["measured"] and data["probes"]["rows"]
    refused = subprocess.run(
        [*run, "--info", "x", "--out", str(tmp_path / "m.parquet")], capture_output=True, text=True
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--info" in refused.stderr
