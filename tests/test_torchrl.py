"""TorchRL: real collectors, GAE and ClipPPOLoss on CartPole-v1 (gymnasium through TorchRL's GymEnv), tiny nets.

The oracle, TorchRL's version: before the first optimizer step, the states the loss (recurrent mode, every
backend) computes for each (env, env step) equal the states collection computed for it (sequential mode),
for LSTM and GRU, 1 and 2 layers, 1 and several envs. Then each planted bug is named by the doctor, a
correct loop has no finding, the probe leaves training as it was, and the CLI runs through a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torchrl")

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.collectors import Collector
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import lstm_probe
from lstm_probe.integrations.torchrl.hooks import probe
from lstm_probe.integrations.torchrl.train import build

DISTRIBUTION_CHECKS = False  # what the framework sets for the process (see conftest.py)
KEYS = ["module", "layer", "env", "env_step"]


def _loop(
    out: Path | None,
    *,
    n_envs: int = 2,
    layers: int = 1,
    cell: str = "lstm",
    backend: str = "pad",
    steps: int = 24,
    batches: int = 2,
    zero_collection: bool = False,
    plant: Callable[[Any], None] | None = None,
    evaluate: int = 0,
    probe_first: bool = False,
) -> tuple[Any, Any, dict[str, Any]]:
    """A small recurrent PPO loop, TorchRL's way; ``plant`` changes the batch before the loss, and
    ``zero_collection`` puts a module before the LSTM that zeroes its input state at some steps.
    ``evaluate``: after each batch's training, an evaluation ``env.rollout(evaluate, actor)`` on an env of
    as many envs as the collector's; ``probe_first``: the probe starts before the collector is built (whose
    constructor runs the policy once). Returns the actor, the critic and what the envs did: the collector's
    frame and batch counts, and per collected batch and evaluation its step counts, observations, actions."""
    torch.set_num_threads(1)
    env, actor, critic, rnn = build(
        "CartPole-v1", n_envs=n_envs, hidden_size=8, seed=0, num_layers=layers, cell=cell, recurrent_backend=backend
    )
    policy = actor
    if zero_collection:  # the #1406 class: the state zeroed where no episode started
        keys = [k for k in rnn.in_keys[1:-1]]

        def zero(step: torch.Tensor, *states: torch.Tensor) -> tuple[torch.Tensor, ...]:
            keep = (step % 5 != 3).to(states[0].dtype).reshape(*step.shape[:-1], 1, 1)
            return tuple(s * keep for s in states)

        policy = TensorDictSequential(TensorDictModule(zero, in_keys=["step_count", *keys], out_keys=keys), actor)
    p = probe([actor, critic], out, force=True) if out is not None else None
    if p is not None and probe_first:
        p.start()
    collector = Collector(env, policy, frames_per_batch=steps * n_envs, total_frames=steps * n_envs * batches)
    adv = GAE(gamma=0.99, lmbda=0.95, value_network=critic, deactivate_vmap=True)
    loss_module = ClipPPOLoss(actor, critic)
    optim = torch.optim.Adam(loss_module.parameters(), lr=1e-2)
    evaluation = _eval_env(rnn, n_envs) if evaluate else None
    seen: dict[str, Any] = {"batches": [], "evaluations": []}
    if p is not None and not probe_first:
        p.start()
    try:
        for data in collector:
            seen["batches"].append(data.select(*RECORDED).clone())
            if plant is not None:
                plant(data)
            with torch.no_grad(), set_recurrent_mode(True):
                adv(data)
            for epoch in range(2):
                with p.tag(epoch=epoch, minibatch=0) if p is not None else _null(), set_recurrent_mode(True):
                    losses = loss_module(data)
                loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                optim.zero_grad()
                loss.backward()
                optim.step()
            collector.update_policy_weights_()
            if evaluation is not None:  # sequential mode outside the collector: phase "other"
                with torch.no_grad():
                    ev = evaluation.rollout(evaluate, actor, break_when_any_done=False)
                seen["evaluations"].append(ev.select(*RECORDED).clone())
        state = collector.state_dict()
        seen["frames"], seen["iter"] = state["frames"], state["iter"]
    finally:
        if p is not None:
            p.close()
        collector.shutdown()
        if evaluation is not None:
            evaluation.close()
    return actor, critic, seen


RECORDED = ("step_count", "observation", "action", ("next", "step_count"), ("next", "observation"))


def _eval_env(rnn: Any, n_envs: int) -> Any:
    """An evaluation env like the training one (its own envs, as many, another seed)."""
    from torchrl.envs import Compose, DoubleToFloat, GymEnv, InitTracker, SerialEnv, StepCounter, TransformedEnv

    base = SerialEnv(n_envs, lambda: GymEnv("CartPole-v1")) if n_envs > 1 else GymEnv("CartPole-v1")
    env = TransformedEnv(base, Compose(InitTracker(), StepCounter(), DoubleToFloat()))
    env.append_transform(rnn.make_tensordict_primer())
    env.set_seed(1)
    return env


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def _vectors(s: pd.Series) -> np.ndarray:
    return np.stack(s.to_numpy())


def _oracle(path: Path, cell: str) -> tuple[float, int, pd.DataFrame]:
    """Max |loss-time - collection-time| over h (and c, an LSTM's: present in every row on both sides) of
    every (env, env step) the first epoch's loss computed (the epoch-0 minibatch runs before that batch's
    first optimizer step), and the rows compared."""
    df = lstm_probe.load(path)
    train = df[(df["phase"] == "train") & (df["epoch"] == 0) & ~df["padding"]]
    roll = df[df["phase"] == "rollout"]
    m = train.merge(roll, on=KEYS, suffixes=("", "_r"))
    m = m[m["iteration"] == m["iteration_r"]]
    assert len(m)
    compared = ("h", "c") if cell == "lstm" else ("h",)
    for which in ("h", "c"):
        present = (m[which].notna() & m[f"{which}_r"].notna()).to_numpy()
        assert present.all() if which in compared else not present.any(), (cell, which)
    err = max(float(np.abs(_vectors(m[which]) - _vectors(m[f"{which}_r"])).max()) for which in compared)
    return err, len(m), train


@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("backend", ["pad", "scan"])
def test_loss_states_equal_collection_states(tmp_path: Path, backend: str, cell: str, layers: int, n_envs: int) -> None:
    out = tmp_path / "run.parquet"
    _loop(out, n_envs=n_envs, layers=layers, cell=cell, backend=backend, steps=24, batches=2)
    err, n, train = _oracle(out, cell)
    # every layer of every loss-time sample of both batches (two calls each: actor and critic share the
    # LSTM) found its collection row
    assert n == len(train) == 2 * 2 * layers * 24 * n_envs
    assert err < 1e-6
    df = lstm_probe.load(out, vectors=False)
    assert set(df["phase"]) == {"rollout", "train", "value"}
    assert sorted(df["iteration"].dropna().unique()) == [0, 1]
    info = lstm_probe.read_info(out)
    assert info.metadata["framework"] == "torchrl"
    assert info.metadata["torchrl"]["modules"]["lstm" if cell == "lstm" else "gru"]["recurrent_backend"] == backend
    assert info.metadata["capabilities"]["stored_states"] is True
    # the rollout's provenance: one row per env column and collection step, env steps counted per env
    roll = df[(df["phase"] == "rollout") & (df["layer"] == 0)]
    assert len(roll) == 2 * 24 * n_envs
    assert (roll.groupby("env")["env_step"].agg(lambda s: list(s)) == [list(range(48))] * n_envs).all()
    # loss-time sequences start where torchrl splits them: at each batch row's start and at every is_init
    first = df[(df["phase"] == "train") & (df["t"] == 0) & (df["layer"] == 0)]
    assert set(first["seq_reason"]) <= {"episode_start", "env_boundary"}
    assert (first[first["seq_reason"] == "episode_start"]["episode_step"] == 0).all()
    if cell == "lstm":  # the wrong env step is far off: the check can fail
        shifted = _oracle_shift(out)
        assert shifted > 1e-3


def _logged(df: pd.DataFrame, which: str, shape: tuple[int, ...]) -> np.ndarray:
    """The log's ``which`` vectors on a (env, env step, layer, hidden) grid, NaN where no row."""
    grid = np.full(shape, np.nan)
    idx = tuple(df[k].to_numpy(np.int64) for k in ("env", "env_step", "layer"))
    grid[idx] = lstm_probe.states(df, which)
    return grid


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("backend", ["pad", "scan"])
def test_logged_states_equal_torchrl_outputs(tmp_path: Path, backend: str, cell: str, layers: int) -> None:
    """The shadow against TorchRL itself: the probe's states of a recurrent-mode call (its own re-run) equal
    what TorchRL's backend computed in that call, on a collected batch whose rows cross episodes: the
    top layer's h at every step equals the module's per-step output (out_key, the LSTM's y), and every
    layer's h (and c) equals the ("next", state) TorchRL returns at each trajectory's last step."""
    torch.set_num_threads(1)
    n_envs, steps = 2, 48
    env, actor, critic, rnn = build(
        "CartPole-v1", n_envs=n_envs, hidden_size=4, seed=0, num_layers=layers, cell=cell, recurrent_backend=backend
    )
    collector = Collector(env, actor, frames_per_batch=steps * n_envs, total_frames=steps * n_envs)
    out = tmp_path / "run.parquet"
    with probe([actor, critic], out, force=True):
        try:
            (data,) = list(collector)
        finally:
            collector.shutdown()
        is_init = data["is_init"].squeeze(-1).numpy()
        assert is_init[:, 1:].any()  # episodes end inside the rows: TorchRL splits them
        td = data.clone()
        with set_recurrent_mode(True):
            rnn(td)
    y = td[rnn.out_keys[0]].detach().numpy()  # (env, step, hidden): the top layer's h of every step
    returned = {k: td[k].detach().numpy() for k in rnn.out_keys[1:]}  # (env, step, layer, hidden)
    df = lstm_probe.load(out, phase=["train", "value"])
    df = df[~df["padding"]]
    assert set(df["call"]) == {df["call"].iloc[0]}  # the one recurrent-mode call
    shape = (n_envs, steps, layers, y.shape[-1])
    logged = [_logged(df, which, shape) for which in (("h", "c") if cell == "lstm" else ("h",))]
    assert len(df) == n_envs * steps * layers and not np.isnan(logged[0]).any()  # every (env, step, layer)
    err = float(np.abs(logged[0][:, :, -1] - y).max() / np.abs(y).max())
    # the trajectory ends (the next step is_init, or the row ends): where TorchRL returns the final states
    end = np.c_[is_init[:, 1:], np.ones((n_envs, 1), bool)]
    for state, ours in zip(returned.values(), logged, strict=True):
        assert ((np.abs(state).max(axis=(-2, -1)) > 0) == end).all()  # zeros elsewhere: nothing to compare
        err = max(err, float(np.abs(ours[end] - state[end]).max() / np.abs(state[end]).max()))
    assert err < 1e-6


def _oracle_shift(path: Path) -> float:
    df = lstm_probe.load(path)
    train = df[(df["phase"] == "train") & (df["epoch"] == 0) & ~df["padding"]].assign(
        env_step=lambda d: d["env_step"] + 1
    )
    m = train.merge(df[df["phase"] == "rollout"], on=KEYS, suffixes=("", "_r"))
    return float(np.abs(_vectors(m["h"]) - _vectors(m["h_r"])).max())


def _problems(path: Path) -> list[str]:
    report = lstm_probe.summarize(path)
    return [p.kind for p in report.doctor.problems]


def test_correct_loop_has_no_finding(tmp_path: Path) -> None:
    out = tmp_path / "ok.parquet"
    _loop(out, steps=40)
    assert _problems(out) == []
    df = lstm_probe.load(out, vectors=False)
    init = df[df["init"].notna() & (df["layer"] == 0)]
    assert set(init[init["phase"] == "rollout"]["init"]) == {"reset", "previous"}
    assert set(init[init["phase"] == "train"]["init"]) <= {"reset", "stored"}


def test_state_zeroed_where_is_init_is_false(tmp_path: Path) -> None:
    out = tmp_path / "zeroed.parquet"
    _loop(out, steps=40, zero_collection=True)
    assert "reset_without_start" in _problems(out)


def test_all_false_is_init_over_a_batch_that_crosses_episodes(tmp_path: Path) -> None:
    def plant(data: Any) -> None:
        data["is_init"] = torch.zeros_like(data["is_init"])

    out = tmp_path / "all_false.parquet"
    _loop(out, steps=40, plant=plant)
    assert "across_episodes" in _problems(out)


def test_loss_states_zero_where_collection_carried_them(tmp_path: Path) -> None:
    def plant(data: Any) -> None:  # the #3711 class: a row's stored state lost before the loss
        for key in ("recurrent_state_h", "recurrent_state_c"):
            data[key][..., 0, :, :] = 0

    out = tmp_path / "lost.parquet"
    _loop(out, steps=40, plant=plant)
    assert "train_from_zeros" in _problems(out)


def test_probe_does_not_change_training(tmp_path: Path) -> None:
    """With and without the probe (started before the collector is built, an evaluation rollout after each
    batch): the same parameters, torch RNG, collector frame and batch counts, and env steps (every
    collected batch's and evaluation's step counts, observations and actions)."""

    def run(probed: bool) -> tuple[list[torch.Tensor], torch.Tensor, dict[str, Any]]:
        torch.manual_seed(0)
        out = tmp_path / "p.parquet" if probed else None
        actor, critic, seen = _loop(out, steps=16, evaluate=10, probe_first=True)
        params = [p.detach().clone() for p in [*actor.parameters(), *critic.parameters()]]
        return params, torch.get_rng_state(), seen

    plain, rng_plain, seen_plain = run(False)
    traced, rng_traced, seen_traced = run(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, traced, strict=True))
    assert torch.equal(rng_plain, rng_traced)
    assert (seen_traced["frames"], seen_traced["iter"]) == (seen_plain["frames"], seen_plain["iter"]) == (64, 1)
    for kind, count in (("batches", 2), ("evaluations", 2)):
        assert len(seen_plain[kind]) == len(seen_traced[kind]) == count
        for a, b in zip(seen_plain[kind], seen_traced[kind], strict=True):
            assert a.shape == b.shape
            assert all(torch.equal(a[k], b[k]) for k in RECORDED), kind
    # the step counts say the envs ran on across episodes (the comparison covers resets too)
    assert int(seen_plain["evaluations"][0]["step_count"].max()) >= 9
    assert lstm_probe.load(tmp_path / "p.parquet", vectors=False)["phase"].eq("other").any()


@pytest.mark.parametrize("probe_first", [False, True])
def test_evaluation_between_collections_keeps_provenance(tmp_path: Path, probe_first: bool) -> None:
    """An evaluation env.rollout(policy) after each batch (phase "other", as many envs as the collector),
    and (probe_first) the probe started before the collector is built (its constructor runs the policy
    once): neither advances the collection's env steps or episodes, the oracle holds, and the evaluation
    has its own."""
    out = tmp_path / "eval.parquet"
    n_envs, steps, evaluate = 3, 24, 12
    _, _, seen = _loop(out, n_envs=n_envs, steps=steps, batches=2, evaluate=evaluate, probe_first=probe_first)
    err, n, train = _oracle(out, "lstm")
    assert n == len(train) == 2 * 2 * steps * n_envs and err < 1e-6
    df = lstm_probe.load(out, vectors=False)
    df = df[df["layer"] == 0]
    roll = df[df["phase"] == "rollout"].sort_values(["env", "env_step"])
    assert len(roll) == 2 * steps * n_envs
    collected = torch.cat([b["step_count"] for b in seen["batches"]], dim=1).squeeze(-1).numpy()  # (env, step)
    for e, rows in roll.groupby("env"):
        assert rows["env_step"].tolist() == list(range(2 * steps))
        assert rows["episode_step"].tolist() == collected[e].tolist()
        assert rows["episode"].tolist() == (np.cumsum(collected[e] == 0) - 1).tolist()
    # the evaluation's calls: their own env steps (after the collector's construction call), its step counts
    other = df[df["phase"] == "other"].sort_values(["env", "env_step"])
    built = int(probe_first)
    assert len(other) == n_envs * (built + 2 * evaluate)
    evaluated = torch.cat([e["step_count"] for e in seen["evaluations"]], dim=1).squeeze(-1).numpy()
    for e, rows in other.groupby("env"):
        assert rows["env_step"].tolist() == list(range(built + 2 * evaluate))
        assert rows["episode_step"].tolist()[built:] == evaluated[e].tolist()
    assert _problems(out) == []


def test_recurrent_pieces_on_device_equal_the_host_pieces() -> None:
    """The device-side indices of a recurrent-mode call's pieces (no host round trip) are the host's."""
    from lstm_probe.integrations.torchrl.samples import pieces, pieces_on_device

    gen = np.random.default_rng(0)
    cases = [(3, 5, 0.3), (2, 7, 0.0), (4, 1, 0.5), (2, 6, 1.0), (5, 9, 0.15)]
    for rows, steps, p in cases:
        init = gen.random(rows * steps) < p
        first, lengths = pieces(init, rows, steps)
        assert lengths.sum() == rows * steps and (np.diff(lengths) <= 0).all()
        longest = int(lengths[0])
        at = np.where(np.arange(longest) < lengths[:, None], first[:, None] + np.arange(longest), first[:, None])
        first_d, at_d = pieces_on_device(
            torch.from_numpy(init).reshape(rows, steps, 1), rows, steps, len(first), longest
        )
        assert first_d.tolist() == first.tolist() and at_d.tolist() == at.tolist(), (rows, steps, p)


def test_recurrent_call_is_packed_sorted(tmp_path: Path) -> None:
    """The shadow's packed call comes sorted, without a permutation: the tracer's pad_packed_sequence has
    none to copy to the host (a sync per call on a GPU)."""
    torch.set_num_threads(1)
    env, actor, critic, rnn = build("CartPole-v1", n_envs=2, hidden_size=4, seed=0)
    collector = Collector(env, actor, frames_per_batch=96, total_frames=96)
    try:
        (data,) = list(collector)
    finally:
        collector.shutdown()
    assert data["is_init"][:, 1:].any()  # pieces of several lengths
    seen: list[Any] = []
    with probe([actor, critic], tmp_path / "r.parquet", force=True) as p:
        (shadow_module,) = p.shadows.values()
        shadow_module.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
        with set_recurrent_mode(True):
            rnn(data.clone())
    (packed,) = seen
    assert isinstance(packed, torch.nn.utils.rnn.PackedSequence)
    assert packed.sorted_indices is None and packed.unsorted_indices is None


def test_cli_run_and_report(tmp_path: Path) -> None:
    out = tmp_path / "cli.parquet"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "lstm_probe", "run", "CartPole-v1", "--framework", "torchrl", "--out", str(out)]
    cmd += ["--steps", "64", "--n-steps", "32", "--n-envs", "2", "--hidden-size", "8", "--n-epochs", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "report", str(out), "--json"], capture_output=True, text=True, env=env
    )
    assert rep.returncode == 0, rep.stderr
    data = json.loads(rep.stdout)
    assert data["doctor"]["problems"] == []
    info = lstm_probe.read_info(out)
    assert info.metadata["framework"] == "torchrl" and info.metadata["completed"] is True
