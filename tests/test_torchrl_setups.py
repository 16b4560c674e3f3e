"""TorchRL set-ups a user gets wrong or leaves out, on a real small PPO on CartPole-v1 (LSTMModule, GAE, ClipPPOLoss).

A critic with an LSTM of its own that the collector's policy does not run (only GAE and the loss call it): its
recorded states are the primer's zeros, so every training sequence of it that starts mid-episode (at the batch's
first step) starts from zeros. The probe links its loss-time samples to their env steps all the same (the samples'
provenance is the data's, not the module's), the doctor names the zeros and why, and the staleness section does not
take its train rows for a replay buffer's old samples.

An env without ``StepCounter`` (TorchRL's LSTMModule docs show ``InitTracker`` and the primer alone): the loss's
samples cannot be linked to their collection steps, and the verdict and the report say what to add."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchrl")

import torch
from tensordict.nn import TensorDictSequential
from torchrl.collectors import Collector
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import lstm_probe
from lstm_probe.integrations.torchrl.hooks import UNLINKED, probe
from tests.torchrl_policies import two_lstms


def _run(out: Path, *, collect_critic: bool = False, step_counter: bool = True) -> None:
    torch.set_num_threads(1)
    env, actor, critic = two_lstms(step_counter)
    policy = TensorDictSequential(actor, critic) if collect_critic else actor  # the actor alone: the mistake
    collector = Collector(env, policy, frames_per_batch=64, total_frames=128)
    adv = GAE(gamma=0.99, lmbda=0.95, value_network=critic, deactivate_vmap=True)
    loss_module = ClipPPOLoss(actor, critic)
    optim = torch.optim.Adam(loss_module.parameters(), lr=1e-2)
    with probe([actor, critic], out, force=True, capture="summary") as p:
        for data in collector:
            data = data.exclude("state_value", "ec")  # GAE computes them again (its two passes stack)
            with torch.no_grad(), set_recurrent_mode(True):
                adv(data)
            for epoch in range(2):
                with p.tag(epoch=epoch, minibatch=0), set_recurrent_mode(True):
                    losses = loss_module(data)
                optim.zero_grad()
                (losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]).backward()
                optim.step()
    collector.shutdown()


def test_a_critic_lstm_the_collection_does_not_run(tmp_path: Path) -> None:
    log = tmp_path / "run.parquet"
    _run(log)
    critic = "lstm_critic"  # the critic's LSTMModule, as find_modules names it by its role (the actor's: lstm_actor)
    df = lstm_probe.load(log, phase="train", module=critic, vectors=False)
    real = df[~df.padding.astype(bool)]
    # every loss-time sample of the critic is linked to its env step, as the actor's are
    assert real.env.notna().all() and real.env_step.notna().all()
    actor = lstm_probe.load(log, phase="train", module="lstm_actor", vectors=False)
    actor = actor[~actor.padding.astype(bool)]
    keys = ["iteration", "epoch", "env", "env_step", "episode", "episode_step"]
    pd_sorted = real[keys].sort_values(keys).reset_index(drop=True)
    assert pd_sorted.equals(actor[keys].sort_values(keys).reset_index(drop=True))
    # its sequences that start at the second batch's first step, mid-episode, start from zeros: named
    starts = real[(real.t == 0) & (real.seq_reason == "env_boundary") & (real.iteration == 1)]
    assert len(starts) and (starts.init == "zero").all() and (starts.init_norm == 0).all()
    report = lstm_probe.summarize(log).to_dict()
    (problem,) = [q for q in report["doctor"]["problems"] if q["kind"] == "train_from_zeros"]
    assert problem["first"]["module"] == critic and problem["count"] == int((real[real.t == 0].init == "zero").sum())
    assert f"{critic} has no rollout call: the collection does not run it" in problem["text"]
    # the staleness section: no drift for the critic, said as such, not as a replay buffer's older samples
    st = report["staleness"]
    assert st["unmeasured_rows"] == 0 and st["undrifted"] == {critic: len(real)}
    findings = lstm_probe.summarize(log).findings
    assert not any("replay buffer" in f for f in findings)
    assert any(f.startswith(f"no drift for the train rows of {critic} ({len(real):,} rows)") for f in findings)


def test_an_actor_and_critic_lstm_are_named_by_their_roles(tmp_path: Path) -> None:
    """Separate actor and critic LSTMModules are named lstm_actor / lstm_critic (as sb3's), not by their paths
    (module.0.module.0, module.0: hard to tell apart); the paths are kept in the metadata and still select."""
    from lstm_probe.integrations.torchrl import find_modules

    _env, actor, critic = two_lstms()
    found = find_modules([actor, critic])
    assert list(found) == ["lstm_actor", "lstm_critic"] and found["lstm_actor"] is actor.module[0].module[0]
    assert list(find_modules([critic, actor])) == ["lstm_critic", "lstm_actor"]  # by role, not by position
    assert list(find_modules([actor, critic], ["module.0"])) == ["lstm_critic"]  # a path names it too
    assert list(find_modules([actor.module[0], critic.module[0]])) == ["module.0", "LSTMModule"]  # no roles: paths
    log = tmp_path / "run.parquet"
    _run(log, collect_critic=True)
    meta = lstm_probe.read_info(log).metadata
    assert {n: m["path"] for n, m in meta["torchrl"]["modules"].items()} == {
        "lstm_actor": "module.0.module.0",
        "lstm_critic": "module.0",
    }
    assert set(lstm_probe.load(log, columns=["module"], vectors=False)["module"]) == {"lstm_actor", "lstm_critic"}


def test_a_critic_lstm_the_collection_runs_has_no_finding(tmp_path: Path) -> None:
    """The same critic run in the collecting policy: its train rows have drifts, the doctor finds nothing."""
    log = tmp_path / "run.parquet"
    _run(log, collect_critic=True)
    report = lstm_probe.summarize(log).to_dict()
    assert report["doctor"]["problems"] == []
    st = report["staleness"]
    assert st["unmeasured_rows"] == 0 and st["undrifted"] == {} and st["provenance_ok"] is True


def test_without_step_counter_the_report_says_what_to_add(tmp_path: Path) -> None:
    log = tmp_path / "run.parquet"
    _run(log, collect_critic=True, step_counter=False)
    assert lstm_probe.read_info(log).metadata["not_measurable"] == {"staleness": UNLINKED}
    summary = lstm_probe.summarize(log)
    fix = "add torchrl's StepCounter() to the env's transforms, beside InitTracker()"
    assert summary.verdict.lines[0] == (
        "staleness unmeasured: no training row of this log carries a drift against the rollout state of its env "
        f"step (the loss's samples carry no step_count, which links each to its collection step: {fix})"
    )
    (missing,) = [u for u in summary.unavailable if u.startswith("staleness and the provenance check")]
    assert missing.endswith(f"({UNLINKED})") and "an own loop" not in missing


def test_memory_refuses_a_split_trajs_batch_with_the_fix(tmp_path: Path) -> None:
    """``split_trajs=True`` pads each trajectory to the longest: the memory horizon would measure the padding as
    steps (and skip every later batch, whose shape differs): refused in one line naming the fix, before any
    optimizer step; the fix (the collector's batch to ``measure_batch``, its trajectories to the loss) measures
    every batch."""
    from torchrl.collectors.utils import split_trajectories

    from lstm_probe.errors import BadInput
    from lstm_probe.integrations.torchrl.memory import SPLIT
    from lstm_probe.integrations.torchrl.train import build

    for split in (True, False):
        env, actor, critic, _ = build("CartPole-v1", n_envs=2, hidden_size=8, seed=0)
        collector = Collector(env, actor, frames_per_batch=64, total_frames=128, split_trajs=split)
        adv = GAE(gamma=0.99, lmbda=0.95, value_network=critic, deactivate_vmap=True)
        loss_module = ClipPPOLoss(actor, critic)
        optim = torch.optim.Adam(loss_module.parameters(), lr=1e-2)
        kw = {"memory": True, "loss": loss_module, "optimizer": optim}
        log = tmp_path / f"{split}.parquet"
        with probe([actor, critic], log, force=True, capture="summary", **kw) as p:
            for data in collector:
                with torch.no_grad(), set_recurrent_mode(True):
                    adv(data)
                if split:
                    with pytest.raises(BadInput) as refused:
                        p.measure_batch(data, epoch=0)
                    assert str(refused.value) == SPLIT and "split_trajs=False" in SPLIT
                    break
                p.measure_batch(data, epoch=0)
                with p.tag(epoch=0, minibatch=0), set_recurrent_mode(True):
                    losses = loss_module(split_trajectories(data))
                optim.zero_grad()
                (losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]).backward()
                optim.step()
        collector.shutdown()
    memory = lstm_probe.read_info(tmp_path / "False.parquet").metadata["memory"]
    assert memory["sampling"]["iterations_measured"] == 2
