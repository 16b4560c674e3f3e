"""What a user trial of TorchRL's recurrent PPO pattern (LSTMModule, InitTracker, the primer, SerialEnv) found the
report saying wrong, on a real small PPO on CartPole-v1.

Without ``StepCounter``, a loss minibatch of some of the collector's env rows: each sample's env is the env its
trajectory id was collected in (never the row's index in the minibatch); without trajectory ids, null.

A critic with an LSTM of its own that the collector's policy does not run: its memory is not "unused", it was
never run in collection (the states stored for it are the primer's zeros), and the memory panel says so."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchrl")

import torch
from torchrl.collectors import Collector
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import lstm_probe
from lstm_probe.integrations.torchrl.hooks import probe
from tests.torchrl_policies import dropout_run, two_lstms

ACTOR, CRITIC = "lstm_actor", "lstm_critic"  # the LSTMModules as find_modules names them (names.py: by role)


def _run(out: Path, rows: list[list[int]], *, drop_traj: bool = False, memory: bool = False) -> None:
    """Two batches of 2 envs x 32 steps, no StepCounter; the loss runs on the batch rows ``rows[m]`` as minibatch
    m; ``drop_traj``: the minibatches without their trajectory ids."""
    torch.set_num_threads(1)
    env, actor, critic = two_lstms(step_counter=False)
    collector = Collector(env, actor, frames_per_batch=64, total_frames=128)
    adv = GAE(gamma=0.99, lmbda=0.95, value_network=critic, deactivate_vmap=True)
    loss_module = ClipPPOLoss(actor, critic)
    optim = torch.optim.Adam(loss_module.parameters(), lr=1e-2)
    kw = {"memory": True, "loss": loss_module, "optimizer": optim} if memory else {}
    with probe([actor, critic], out, force=True, capture="summary", **kw) as p:
        for data in collector:
            data = data.exclude("state_value", "ec")
            with torch.no_grad(), set_recurrent_mode(True):
                adv(data)
            if memory:
                p.measure_batch(data, epoch=0)
            for m, picked in enumerate(rows):
                batch = data[picked]
                if drop_traj:
                    batch = batch.exclude(("collector", "traj_ids"))
                with p.tag(epoch=0, minibatch=m), set_recurrent_mode(True):
                    losses = loss_module(batch)
                optim.zero_grad()
                (losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]).backward()
                optim.step()
    collector.shutdown()


def test_minibatches_of_env_rows_without_step_counter_name_each_samples_env(tmp_path: Path) -> None:
    log = tmp_path / "run.parquet"
    _run(log, [[1], [0], [1, 0]])
    roll = lstm_probe.load(log, phase="rollout", module=ACTOR, vectors=False)
    for module in (ACTOR, CRITIC):
        train = lstm_probe.load(log, phase="train", module=module, vectors=False)
        train = train[~train.padding.astype(bool)]
        assert len(train) == 2 * (32 + 32 + 64)
        # minibatch 0 is env 1's row alone, minibatch 1 env 0's, minibatch 2 both envs, env 1 first
        for m, envs in enumerate([[1], [0], [1, 0]]):
            rows = train[train.minibatch == m]
            assert sorted(rows.env.unique().tolist()) == sorted(envs)
            assert (rows.groupby(["iteration", "env"]).size() == 32).all()
        # each sample's episode is the one its env's rollout rows carry (no env step without step_count)
        assert train.env_step.isna().all()
        for it in (0, 1):
            episodes = {e: set(roll[(roll.iteration == it) & (roll.env == e)].episode) for e in (0, 1)}
            for e in (0, 1):
                got = set(train[(train.iteration == it) & (train.env == e)].episode)
                assert got and got <= episodes[e]


def test_minibatches_without_trajectory_ids_leave_env_null(tmp_path: Path) -> None:
    log = tmp_path / "run.parquet"
    _run(log, [[1], [0]], drop_traj=True)
    for module in (ACTOR, CRITIC):
        train = lstm_probe.load(log, phase="train", module=module, vectors=False)
        train = train[~train.padding.astype(bool)]
        assert len(train) == 2 * 64 and train.env.isna().all() and train.episode.isna().all()


def test_memory_of_a_critic_the_collection_never_runs_is_not_unused(tmp_path: Path) -> None:
    log = tmp_path / "run.parquet"
    _run(log, [[0, 1]], memory=True)
    summary = lstm_probe.summarize(log)
    memory = summary.to_dict()["memory"]
    critic = memory["latest"]["critic"]
    # its stored states are the primer's zeros: zeroing one step back changes nothing
    assert critic["effect"][0] == 0.0
    assert critic["uncollected"] is True and critic["unused"] is False and critic["horizon"] is None
    assert "uncollected" not in memory["latest"]["actor"] and memory["latest"]["actor"]["horizon"] == 4
    assert all(h["uncollected"] for h in memory["horizons"] if h["module"] == "critic")
    from lstm_probe.report.sections.memory import UNCOLLECTED

    assert f"{CRITIC} (critic): memory not measured (iteration 1): {UNCOLLECTED}" in summary.findings
    assert not any("do not depend on its recurrent state" in f for f in summary.findings)
    (panel,) = [b for blocks in summary.text() for b in blocks if getattr(b, "title", "") == "Memory"]
    assert f"horizon by iteration, {CRITIC} (critic): 0-1: not run in collection" in panel.lines[0]
    (table,) = [b for blocks in summary.text() for b in blocks if getattr(b, "title", "").startswith("Memory: ")]
    assert [r[:3] for r in table.rows] == [
        (f"{ACTOR} (actor)", "kl", "4"),
        (f"{CRITIC} (critic)", "value_rel", "not run in collection"),
    ]


def test_dropout_between_layers_is_named_where_the_provenance_check_fails_above_layer_0(tmp_path: Path) -> None:
    """A 2-layer LSTMModule with dropout 0.5, collected and trained in training mode: the states collection stored
    for layer 1 carry its dropout masks, so the check fails there by construction; layer 0 agrees. The log records
    the dropout and the report names it as the cause (in the warning, the finding, the panel and the verdict)."""

    from lstm_probe.report.sections.staleness_trend import dropout_cause

    log = tmp_path / "run.parquet"
    dropout_run(log)
    meta = lstm_probe.read_info(log).metadata
    (entry,) = meta["architecture"]["modules"].values()
    assert entry == {"kind": "LSTM", "hidden_size": 8, "num_layers": 2, "input_size": 4, "dropout": 0.5}
    # whether dropout acted: every call of the module in training mode (32 collection steps, one loss call)
    assert meta["training_mode"] == {"lstm": {"rollout": [32, 32], "train": [1, 1]}}
    summary = lstm_probe.summarize(log)
    st = summary.staleness
    assert st.provenance_ok is False
    layer0, layer1 = st.provenance_by_layer
    assert layer0["max_drift_h"] <= st.provenance_tolerance and layer1["max_drift_h"] > st.provenance_tolerance
    cause = dropout_cause(meta, st.provenance_by_layer, st.provenance_tolerance)
    assert cause is not None and cause.startswith("dropout between the LSTM layers (nn.LSTM dropout: ")
    assert cause.endswith("layer 0 agrees: no provenance bug")
    assert (
        "(nn.LSTM dropout: lstm 0.5; in rollout, 32 of 32 calls in training mode; in train, 1 of 1 calls in " in cause
    )
    assert st.provenance_dropout == cause and summary.to_dict()["staleness"]["provenance_dropout"] == cause
    assert f"provenance check FAILED on the layers above the first alone: {cause}" in summary.warnings
    assert any(f.startswith("provenance check FAILED") and f.endswith(f": {cause}") for f in summary.findings)
    assert f"the provenance check FAILED on the layers above the first alone: {cause}" in summary.verdict.lines
    # a failure on layer 0 is a provenance bug whatever the dropout; a log without the entry: as before
    assert dropout_cause(meta, [dict(layer0, max_drift_h=1.0), layer1], st.provenance_tolerance) is None
    old = {"architecture": {"modules": {"lstm": {k: v for k, v in entry.items() if k != "dropout"}}}}
    assert dropout_cause(old, st.provenance_by_layer, st.provenance_tolerance) is None
    # the module in eval mode throughout: dropout acted nowhere, so it is not the cause; a log without the record
    # (written before it) keeps the wording it had
    evaluated = dict(meta, training_mode={"lstm": {"rollout": [0, 32], "train": [0, 1]}})
    assert dropout_cause(evaluated, st.provenance_by_layer, st.provenance_tolerance) is None
    unrecorded = {k: v for k, v in meta.items() if k != "training_mode"}
    said = dropout_cause(unrecorded, st.provenance_by_layer, st.provenance_tolerance)
    assert said is not None and said.startswith("dropout between the LSTM layers (nn.LSTM dropout: lstm 0.5): ")
