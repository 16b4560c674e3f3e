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
) -> tuple[Any, Any]:
    """A small recurrent PPO loop, TorchRL's way; ``plant`` changes the batch before the loss, and
    ``zero_collection`` puts a module before the LSTM that zeroes its input state at some steps."""
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
    collector = Collector(env, policy, frames_per_batch=steps * n_envs, total_frames=steps * n_envs * batches)
    adv = GAE(gamma=0.99, lmbda=0.95, value_network=critic, deactivate_vmap=True)
    loss_module = ClipPPOLoss(actor, critic)
    optim = torch.optim.Adam(loss_module.parameters(), lr=1e-2)
    p = probe([actor, critic], out, force=True) if out is not None else None
    if p is not None:
        p.start()
    try:
        for data in collector:
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
    finally:
        if p is not None:
            p.close()
        collector.shutdown()
    return actor, critic


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def _vectors(s: pd.Series) -> np.ndarray:
    return np.stack(s.to_numpy())


def _oracle(path: Path) -> tuple[float, int, pd.DataFrame]:
    """Max |loss-time - collection-time| over h and c of every (env, env step) the first epoch's loss
    computed (the epoch-0 minibatch runs before that batch's first optimizer step), and the rows compared."""
    df = lstm_probe.load(path)
    train = df[(df["phase"] == "train") & (df["epoch"] == 0) & ~df["padding"]]
    roll = df[df["phase"] == "rollout"]
    m = train.merge(roll, on=KEYS, suffixes=("", "_r"))
    m = m[m["iteration"] == m["iteration_r"]]
    err = 0.0
    for which in ("h", "c"):
        if m[which].notna().all():
            err = max(err, float(np.abs(_vectors(m[which]) - _vectors(m[f"{which}_r"])).max()))
    return err, len(m), train


ERRORS: dict[str, float] = {}


@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("backend", ["pad", "scan"])
def test_loss_states_equal_collection_states(tmp_path: Path, backend: str, cell: str, layers: int, n_envs: int) -> None:
    out = tmp_path / "run.parquet"
    _loop(out, n_envs=n_envs, layers=layers, cell=cell, backend=backend, steps=24, batches=2)
    err, n, train = _oracle(out)
    ERRORS[f"{backend}/{cell}/{layers}L/{n_envs}env"] = err
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


SHADOW_ERRORS: dict[str, float] = {}


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
    SHADOW_ERRORS[f"{backend}/{cell}/{layers}L"] = err
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
    def state() -> tuple[list[torch.Tensor], torch.Tensor]:
        torch.manual_seed(0)
        actor, critic = _loop(tmp_path / "p.parquet" if probed else None, steps=16)
        return [p.detach().clone() for p in [*actor.parameters(), *critic.parameters()]], torch.get_rng_state()

    probed = False
    plain, rng_plain = state()
    probed = True
    traced, rng_traced = state()
    assert all(torch.equal(a, b) for a, b in zip(plain, traced, strict=True))
    assert torch.equal(rng_plain, rng_traced)


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


def test_zz_print_oracle_errors() -> None:
    """The oracle's and the shadow check's measured errors (pytest -s prints them)."""
    for k, v in sorted(ERRORS.items()):
        print(f"oracle {k}: {v:.3g}")
    for k, v in sorted(SHADOW_ERRORS.items()):
        print(f"shadow vs torchrl {k}: {v:.3g}")
