"""What-if and the memory horizon on TorchRL (the engines of lstm_probe/measure/ through torchrl/whatif.py and
memory.py): real Collector, GAE and ClipPPOLoss on CartPole, the loop of ``run --framework torchrl`` with
``measure_batch`` before each loss. Training is untouched (both on, LSTM and GRU); the oracle holds (TorchRL
re-runs each segment from the state stored at its first step, an episode start or the batch's first step: stored
= refreshed, and the copy's gradient from refreshed states is the very gradient the optimizer steps with: cosine
1); planted weights give the answers they must (an LSTM that ignores its state: no alternative moves anything,
memory "unused"; one that integrates: zero states move values, memory "beyond"); the CLI writes a report with
What-if, Memory and probe sections."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torchrl")

import torch
from torchrl.collectors import Collector
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import lstm_probe
from lstm_probe.errors import BadInput
from lstm_probe.integrations.torchrl.hooks import probe
from lstm_probe.integrations.torchrl.train import build
from lstm_probe.report.section import Table, module_label
from lstm_probe.report.sections.memory import Memory
from lstm_probe.report.sections.what_if import WhatIf

EPOCHS = 2


def _plant(rnn, integrate: bool) -> None:
    """The LSTM either ignores its state (no recurrent weights, forget gate shut: h reads the current input only)
    or is a clock that never forgets (c_t = c_{t-1} + sigmoid(-4), whatever the input; as tests/test_memory.py's)."""
    lstm = rnn.lstm
    h = lstm.hidden_size
    with torch.no_grad():
        lstm.weight_hh_l0.zero_()
        lstm.bias_hh_l0.zero_()
        lstm.bias_ih_l0.zero_()
        lstm.bias_ih_l0[h : 2 * h] = 1e4 if integrate else -50.0  # forget gate
        lstm.bias_ih_l0[3 * h :] = 1e4  # output gate open
        if integrate:
            lstm.weight_ih_l0.zero_()
            lstm.bias_ih_l0[:h] = -4.0  # input gate: sigmoid(-4) a step
            lstm.bias_ih_l0[2 * h : 3 * h] = 1e4  # cell input: 1
        else:
            lstm.bias_ih_l0[:h] = 20.0  # input gate open


def train(out, *, cell="lstm", measured=True, plant=None, lr=1e-3, batches=3, loss_kw=None, env_id="CartPole-v1", **kw):
    """The loop of run --framework torchrl (2 envs, 16 steps each, 2 epochs of the whole batch), the probe on."""
    env, actor, critic, rnn = build(env_id, n_envs=2, hidden_size=8, seed=0, cell=cell)
    if plant is not None:
        _plant(rnn, plant)
    collector = Collector(env, actor, frames_per_batch=32, total_frames=32 * batches)
    adv = GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=True, deactivate_vmap=True)
    loss_module = ClipPPOLoss(actor, critic, clip_epsilon=0.2, **(loss_kw or {}))
    optim = torch.optim.Adam(loss_module.parameters(), lr=lr)
    if measured:
        kw |= {"what_if": True, "memory": True, "loss": loss_module, "optimizer": optim, "epochs": EPOCHS}
    last = None
    with probe([actor, critic], out, capture="summary", **kw) as p:
        for data in collector:
            with torch.no_grad(), set_recurrent_mode(True):
                adv(data)
            for epoch in range(EPOCHS):
                p.measure_batch(data, epoch=epoch)
                with p.tag(epoch=epoch, minibatch=0), set_recurrent_mode(True):
                    losses = loss_module(data)
                loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                optim.zero_grad()
                loss.backward()
                optim.step()
            collector.update_policy_weights_()
            last = data
    collector.shutdown()
    assert not optim._optimizer_step_pre_hooks  # the step hook came off
    params = [q.detach().clone() for q in loss_module.parameters()]
    return params, torch.get_rng_state(), last["observation"].clone()


def records(path) -> list[dict]:
    cols = lstm_probe.read_info(path).metadata["what_if"]["records"]
    return [dict(zip(cols, row, strict=True)) for row in zip(*cols.values(), strict=True)]


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_training_untouched_and_the_oracle_holds(tmp_path, cell):
    (pa, ra, oa), (pb, rb, ob) = (train(tmp_path / f"{m}.parquet", cell=cell, measured=m) for m in (False, True))
    assert all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))
    assert torch.equal(ra, rb) and torch.equal(oa, ob)
    log = tmp_path / "True.parquet"
    meta = lstm_probe.read_info(log).metadata
    assert meta["capabilities"]["replay"] is True and meta["capabilities"]["respond"] is True
    assert set(meta["memory"]["records"]["iteration"]) == {0, 1, 2} and meta["memory"]["modules"] == ["actor"]
    assert meta["what_if"]["critic"] == meta["memory"]["critic"] == "shared"
    rows = records(log)
    assert {r["iteration"] for r in rows} == {0, 1, 2}
    assert {(r["epoch"], r["minibatch"]) for r in rows} == {(0, 0), (1, 0)}
    stored = [r for r in rows if r["alternative"] == "stored"]
    assert len(stored) == 6
    for r in stored:  # every segment starts at an episode start or the batch's first step: stored = refreshed
        assert r["state_actor"] == 0 and r["value_abs"] == 0 and r["kl"] == 0, r
        assert r["grad_cos_policy"] == pytest.approx(1, abs=1e-5)
        assert r["grad_cos_value"] == pytest.approx(1, abs=1e-5)
    report = lstm_probe.summarize(log).to_dict()
    assert report["what_if"]["check"]["ok"] is True and report["memory"]["measured"]
    # named as the rows name the module (find_modules: one module, called by its kind), its role beside it; the
    # what-if and memory section had called it "actor" ("critic (the actor's LSTM)")
    traced = set(lstm_probe.load(log, columns=["module"], vectors=False)["module"])
    assert traced == {cell} and meta["what_if"]["module_names"] == meta["memory"]["module_names"]
    assert meta["what_if"]["module_names"] == {"actor": cell, "critic": cell}
    assert report["what_if"]["labels"] == {"actor": f"{cell} (actor)"}
    assert module_label("critic", meta["memory"]["module_names"], "shared") == f"{cell} (critic, shared)"
    rep = lstm_probe.summarize(log)
    headers = [b.columns for b in WhatIf().text(rep.what_if, rep.capabilities) if isinstance(b, Table)]
    assert headers and all(h[1] == f"state Δ {cell} (actor)" for h in headers)
    # the memory table and its horizons by iteration name it the same way
    blocks = Memory().text(rep.memory, rep.capabilities)
    named = [row[0] for b in blocks if isinstance(b, Table) for row in b.rows]
    assert named == [f"{cell} (actor)", f"{cell} (critic, shared)"], named


def test_a_critic_with_its_own_lstm(tmp_path):
    """Actor and critic each with an LSTMModule (states under keys of their own; the collector runs both): both
    modules vary, the oracle holds, memory has an actor (KL) and a critic (value) horizon."""
    from tensordict.nn import TensorDictSequential

    from tests.torchrl_policies import two_lstms

    env, actor, critic = two_lstms()
    collector = Collector(env, TensorDictSequential(actor, critic), frames_per_batch=32, total_frames=96)
    adv = GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=True, deactivate_vmap=True)
    loss_module = ClipPPOLoss(actor, critic, clip_epsilon=0.2)
    optim = torch.optim.Adam(loss_module.parameters(), lr=1e-3)
    log = tmp_path / "two.parquet"
    kw = {"what_if": True, "memory": True, "loss": loss_module, "optimizer": optim, "epochs": EPOCHS}
    with probe([actor, critic], log, capture="summary", **kw) as p:
        for collected in collector:
            data = collected.exclude("state_value", "ec")  # GAE computes them again (its two passes stack)
            with torch.no_grad(), set_recurrent_mode(True):
                adv(data)
            for epoch in range(EPOCHS):
                p.measure_batch(data, epoch=epoch)
                with p.tag(epoch=epoch, minibatch=0), set_recurrent_mode(True):
                    losses = loss_module(data)
                optim.zero_grad()
                (losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]).backward()
                optim.step()
    collector.shutdown()
    meta = lstm_probe.read_info(log).metadata
    assert meta["what_if"]["modules"] == meta["memory"]["modules"] == ["actor", "critic"]
    assert meta["what_if"]["critic"] == "lstm"
    names = meta["what_if"]["module_names"]  # each role's module as the rows name it
    traced = lstm_probe.load(log, columns=["module"], vectors=False)["module"]
    assert set(names) == {"actor", "critic"} and set(names.values()) == set(traced) and len(set(traced)) == 2
    labels = lstm_probe.summarize(log).what_if.labels
    assert labels == {r: f"{names[r]} ({r})" for r in ("actor", "critic")}
    rows = records(log)
    for r in (r for r in rows if r["alternative"] == "stored"):
        assert r["state_actor"] == r["state_critic"] == r["value_abs"] == 0, r
        assert r["grad_cos_policy"] == pytest.approx(1, abs=1e-5) and r["grad_cos_value"] == pytest.approx(1, abs=1e-5)
    assert max(r["state_critic"] for r in rows if r["alternative"] == "zero") == pytest.approx(1.0)
    horizons = lstm_probe.summarize(log).to_dict()["memory"]["horizons"]
    assert {(h["module"], h["metric"]) for h in horizons} == {("actor", "kl"), ("critic", "value_rel")}


def test_separate_losses_leave_out_the_gradient(tmp_path):
    """separate_losses=True: the user's critic loss does not reach the shared LSTM, the copy's would; the values
    still agree, the gradient comparison is left out."""
    log = tmp_path / "s.parquet"
    train(log, batches=2, loss_kw={"separate_losses": True})
    stored = [r for r in records(log) if r["alternative"] == "stored"]
    assert stored and all(r["value_abs"] == 0 and r["grad_cos_policy"] is None for r in stored)


@pytest.mark.parametrize("integrate", [False, True])
def test_planted_weights(tmp_path, integrate):
    log = tmp_path / "p.parquet"
    train(log, plant=integrate, lr=0.0, batches=5)
    memory = lstm_probe.summarize(log).to_dict()["memory"]
    late = [h for h in memory["horizons"] if h["iteration"] >= 1]
    assert late and {(h["module"], h["metric"]) for h in late} == {("actor", "kl"), ("critic", "value_rel")}
    for h in late:  # a clock remembers past every k measured; a shut forget gate and no recurrence: nothing
        assert (h["beyond"], h["unused"]) == ((True, False) if integrate else (False, True)), h
    zero = [r for r in records(log) if r["alternative"] == "zero" and r["episode_starts"] < r["sequences"]]
    assert zero  # some state carried into a batch
    moved = max(r["value_abs"] for r in zero)
    if integrate:
        assert moved > 1e-3 and max(r["state_actor"] for r in zero) == pytest.approx(1.0)
    else:
        assert moved == pytest.approx(0, abs=1e-6) and max(r["kl"] for r in zero) == pytest.approx(0, abs=1e-9)


def test_measures_need_the_loss(tmp_path):
    env, actor, critic, _ = build("CartPole-v1", n_envs=1, hidden_size=8, seed=0)
    env.close()
    with pytest.raises(BadInput, match="loss="):
        probe([actor, critic], tmp_path / "x.parquet", what_if=True)
    with pytest.raises(BadInput, match="ClipPPOLoss"):
        probe([actor, critic], tmp_path / "x.parquet", memory=True, loss=torch.nn.Linear(1, 1))


def test_cli_run_what_if_and_report(tmp_path):
    log = tmp_path / "r.parquet"
    run = [sys.executable, "-m", "lstm_probe", "run", "CartPole-v1", "--framework", "torchrl", "--steps", "128"]
    size = ["--n-envs", "2", "--n-steps", "32", "--n-epochs", "2", "--hidden-size", "8"]
    args = [*run, *size, "--what-if", "--memory", "--capture-obs", "--out", str(log), "-q"]
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
    # --batch-size: the run trains each collector batch whole; it was taken and ignored
    refused = subprocess.run(
        [*run, "--batch-size", "64", "--out", str(tmp_path / "b.parquet")], capture_output=True, text=True
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--batch-size" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "b.parquet").exists()
