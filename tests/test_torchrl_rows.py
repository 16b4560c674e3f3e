"""TorchRL: every row's provenance true in every collector mode, checked against what the collector itself
recorded (step counts, trajectory ids, masks), never against the probe's own bookkeeping.

The expected (env, env step, episode, episode step, episode start) of every sample is computed here from the
collected batches: env steps count each env's samples across batches, episodes count its step-0 samples.
GAE's two passes over a batch: the first over ``data`` (each sample as collected), the second over
``data["next"]`` (each sample's next observation: the same env and episode, the next env step and episode
step, never an episode start). Samples TorchRL pads (``split_trajs=True``) are no rows at all. The probe runs
with its defaults: no ``reference_window``, so the staleness columns and the provenance check come from the
collector's own batch length.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("torchrl")

import torch
from torchrl.collectors import Collector
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import lstm_probe
from lstm_probe.integrations.torchrl.hooks import probe
from lstm_probe.integrations.torchrl.train import build

DISTRIBUTION_CHECKS = False  # what TorchRL sets for the process (see conftest.py)
N_ENVS, STEPS, BATCHES = 2, 32, 2
ROW = ["env", "env_step", "episode", "episode_step", "episode_start"]
KEPT = ("is_init", "step_count", ("collector", "traj_ids"), ("collector", "mask"))


def _loop(out: Path, *, split_trajs: bool = False, python_based: bool = False, cell: str = "lstm") -> list[Any]:
    """A small recurrent PPO loop, TorchRL's way, probed with its defaults; returns each collected batch as
    the loss saw it (its step counts, trajectory ids, masks)."""
    torch.set_num_threads(1)
    env, actor, critic, rnn = build("CartPole-v1", n_envs=N_ENVS, hidden_size=8, seed=0, cell=cell)
    if python_based:
        rnn.make_python_based()  # torchrl's own LSTM/GRU (rnn.py LSTMModule.make_python_based)
    frames = STEPS * N_ENVS
    collector = Collector(env, actor, frames_per_batch=frames, total_frames=frames * BATCHES, split_trajs=split_trajs)
    adv = GAE(gamma=0.99, lmbda=0.95, value_network=critic, deactivate_vmap=True)
    loss_module = ClipPPOLoss(actor, critic)
    optim = torch.optim.Adam(loss_module.parameters(), lr=1e-2)
    batches = []
    with probe([actor, critic], out, force=True) as p:
        try:
            for data in collector:
                batches.append(data.select(*KEPT, strict=False).clone())
                with torch.no_grad(), set_recurrent_mode(True):
                    adv(data)
                for epoch in range(2):
                    with p.tag(epoch=epoch, minibatch=0), set_recurrent_mode(True):
                        losses = loss_module(data)
                    loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                    optim.zero_grad()
                    loss.backward()
                    optim.step()
                collector.update_policy_weights_()
        finally:
            collector.shutdown()
    return batches


def _expected(batches: list[Any]) -> list[pd.DataFrame]:
    """Per batch, one row per real sample: env, env_step, episode, episode_step, episode_start, and whether
    it starts its batch row (``row_start``). A split batch (``("collector", "mask")``) holds each env's
    trajectories in env order (torchrl/collectors/utils.py split_trajectories: the rollout flattened env
    by env, cut where the trajectory id changes), so a sample's env and env step follow from the valid
    samples before it."""
    out = []
    episode = np.full(N_ENVS, -1)
    for i, data in enumerate(batches):
        sc = data["step_count"].squeeze(-1).numpy()
        mask = data.get(("collector", "mask"), None)
        valid = np.ones(sc.shape, bool) if mask is None else mask.numpy()
        flat = np.cumsum(valid.reshape(-1)).reshape(valid.shape) - 1  # order among the batch's real samples
        env, step = flat // STEPS, flat % STEPS
        rows = []
        for e in range(N_ENVS):  # episodes counted in env-step order
            at = np.argwhere(valid & (env == e))
            at = at[np.argsort(step[valid & (env == e)], kind="stable")]
            for r, t in at.tolist():
                episode[e] += sc[r, t] == 0
                rows.append((e, i * STEPS + step[r, t], episode[e], sc[r, t], sc[r, t] == 0, t == 0))
        out.append(
            pd.DataFrame(rows, columns=["env", "env_step", "episode", "episode_step", "episode_start", "row_start"])
        )
    return out


def _calls(df: pd.DataFrame, phase: str, iteration: int) -> list[pd.DataFrame]:
    """The real (non-padding) layer-0 rows of each call of ``phase`` in ``iteration``, in call order."""
    rows = df[(df["phase"] == phase) & (df["iteration"] == iteration) & (df["layer"] == 0) & (df["t"] >= 0)]
    return [g[~g["padding"]] for _, g in sorted(rows.groupby("call"), key=lambda kv: kv[0])]


def _tuples(rows: pd.DataFrame) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r) for r in rows[ROW].astype(object).where(rows[ROW].notna(), None).itertuples(index=False))


def _want(expected: pd.DataFrame, nxt: bool = False) -> Counter[tuple[Any, ...]]:
    e = expected[ROW].copy()
    if nxt:  # the next observation: same env and episode, one env step and episode step on, no episode start
        e["env_step"] += 1
        e["episode_step"] += 1
        e["episode_start"] = False
    return Counter(
        tuple(int(v) if not isinstance(v, bool | np.bool_) else bool(v) for v in r) for r in e.itertuples(index=False)
    )


def _load(out: Path) -> pd.DataFrame:
    df = lstm_probe.load(out, vectors=False)
    for k in ("env", "env_step", "episode", "episode_step"):
        df[k] = df[k].astype("Int64")
    df["episode_start"] = df["episode_start"].astype("boolean")
    return df


def test_gae_first_pass_rows_carry_env_step_and_episode(tmp_path: Path) -> None:
    """Class 4: GAE's first pass (over ``data``) selects only the value network's in_keys, so its TensorDict
    has no step counts or trajectory ids; its rows still carry each sample's env, env step and episode."""
    out = tmp_path / "gae.parquet"
    expected = _expected(_loop(out))
    df = _load(out)
    for i, want in enumerate(expected):
        first, _ = _calls(df, "value", i)
        assert first["env_step"].notna().all() and first["episode"].notna().all()
        assert _tuples(first) == _want(want)
        assert _tuples(_calls(df, "train", i)[0]) == _want(want)


def test_gae_next_pass_marks_no_episode_start(tmp_path: Path) -> None:
    """Class 1: GAE's pass over ``data["next"]`` splits where the sample's own ``is_init`` is set (it ORs it
    in, advantages.py _call_value_nets), one step after the new episode's first observation, which that
    pass never sees: no row is an episode start, and those pieces start at a split, not an episode start."""
    out = tmp_path / "next.parquet"
    expected = _expected(_loop(out))
    df = _load(out)
    for i, want in enumerate(expected):
        _, nxt = _calls(df, "value", i)
        assert not nxt["episode_start"].any()
        assert _tuples(nxt) == _want(want, nxt=True)
        firsts = nxt[nxt["t"] == 0]
        at_row_start = (firsts["env_step"] - 1) % STEPS == 0
        assert (firsts["seq_reason"][at_row_start] == "env_boundary").all()
        assert (firsts["seq_reason"][~at_row_start] == "split").all()
        # a piece starts at every new episode's step 1 that the batch holds (is_init at the step before)
        starts = want[want["episode_start"] & ~want["row_start"]]
        assert sorted(firsts[~at_row_start]["env_step"].tolist()) == sorted((starts["env_step"] + 1).tolist())
        assert (firsts[~at_row_start]["episode_step"] == 1).all()


def test_split_trajs_padding_is_not_logged(tmp_path: Path) -> None:
    """Class 2: with ``split_trajs=True`` the collector's batch is (trajectories, longest) zero-padded
    (``("collector", "mask")`` False on padding: step count 0, trajectory id 0). No padded sample is a row;
    every real one, in the loss and in both GAE passes, carries its own env, env step and episode (not the
    trajectory's row number), and the doctor sees no episode start inside a sequence."""
    out = tmp_path / "split.parquet"
    batches = _loop(out, split_trajs=True)
    assert all(not b[("collector", "mask")].all() for b in batches)  # padding there
    expected = _expected(batches)
    df = _load(out)
    for i, want in enumerate(expected):
        assert len(want) == STEPS * N_ENVS
        for call in _calls(df, "train", i):
            assert _tuples(call) == _want(want)
        first, nxt = _calls(df, "value", i)
        assert _tuples(first) == _want(want)
        assert _tuples(nxt) == _want(want, nxt=True)
    report = lstm_probe.summarize(out)
    assert [p.kind for p in report.doctor.problems] == []
    assert report.staleness.provenance_ok is True


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_python_based_rollout_init_is_previous(tmp_path: Path, cell: str) -> None:
    """Class 3: with torchrl's python-based LSTM/GRU (make_python_based) each collection call's input state
    is the state that module returned at the env's previous step: ``init`` is 'previous' (or 'reset' at an
    episode start), never 'other'; training sequences start from the stored states, and the provenance
    check passes."""
    out = tmp_path / "python.parquet"
    _loop(out, python_based=True, cell=cell)
    df = _load(out)
    init = df[df["init"].notna() & (df["layer"] == 0)]
    assert set(init[init["phase"] == "rollout"]["init"]) == {"reset", "previous"}
    assert set(init[init["phase"].isin(["train", "value"])]["init"]) <= {"reset", "stored"}
    report = lstm_probe.summarize(out)
    assert report.staleness.provenance_ok is True and report.staleness.provenance_check_rows > 0
    assert [p.kind for p in report.doctor.problems] == []


def test_default_probe_checks_provenance(tmp_path: Path) -> None:
    """No hidden option: a default probe keeps the collector's batch of rollout states (its frames_per_batch
    per env), so train rows carry drift and the report's provenance check runs and passes."""
    out = tmp_path / "default.parquet"
    _loop(out)
    df = _load(out)
    train = df[(df["phase"] == "train") & ~df["padding"] & (df["t"] >= 0)]
    assert train["drift_h"].notna().all() and train["drift_c"].notna().all()
    report = lstm_probe.summarize(out)
    st = report.staleness
    assert st.provenance_ok is True and st.provenance_check_rows == 2 * BATCHES * STEPS * N_ENVS
    assert st.provenance_max_drift_h < 1e-6
    assert lstm_probe.read_info(out).metadata["progress"]["num_timesteps"] == BATCHES * STEPS * N_ENVS


def test_cli_run_report_box_and_provenance(tmp_path: Path) -> None:
    """``lstm-probe run --framework torchrl`` with its defaults: the report's run box is filled from the
    framework (env, algorithm, policy, envs, seed, steps, hyperparameters, torchrl and tensordict versions)
    and its provenance check passes."""
    out = tmp_path / "cli.parquet"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "lstm_probe", "run", "CartPole-v1", "--framework", "torchrl", "--out", str(out)]
    cmd += ["--steps", "64", "--n-steps", "32", "--n-envs", "2", "--hidden-size", "8", "--seed", "5"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "report", str(out), "--json"], capture_output=True, text=True, env=env
    )
    assert rep.returncode == 0, rep.stderr
    data = json.loads(rep.stdout)
    run = data["run"]
    assert run["env_id"] == "CartPole-v1" and run["n_envs"] == 2 and run["seed"] == 5
    assert run["algorithm"] == "PPO" and run["policy"]
    assert run["steps_done"] == 64 and run["steps_asked"] == 64
    assert {"n_steps", "n_epochs", "learning_rate", "gamma", "gae_lambda", "clip_range"} <= set(run["hyperparameters"])
    import tensordict
    import torchrl

    assert run["versions"]["torchrl"] == torchrl.__version__
    assert run["versions"]["tensordict"] == tensordict.__version__
    assert "stable_baselines3" not in run["versions"]
    assert data["staleness"]["provenance_ok"] is True
    assert data["doctor"]["problems"] == []


def test_slice_sampler_rows_and_repeated_padding(tmp_path: Path) -> None:
    """The loss on SliceSampler slices of a replay buffer holding two batches: every row is the collection
    row of its (env, env step), same episode and episode step; the copies of a short slice's last step
    that ``pad_output=True`` appends (their mask does not reach a plain ReplayBuffer's sample) are no rows;
    samples of the earlier batch get no drift, and the provenance check on the rest passes."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler

    torch.set_num_threads(1)
    env, actor, critic, _ = build("CartPole-v1", n_envs=N_ENVS, hidden_size=8, seed=0)
    frames = STEPS * N_ENVS
    collector = Collector(env, actor, frames_per_batch=frames, total_frames=frames * 3)
    adv = GAE(gamma=0.99, lmbda=0.95, value_network=critic, deactivate_vmap=True)
    loss_module = ClipPPOLoss(actor, critic)
    optim = torch.optim.Adam(loss_module.parameters(), lr=1e-2)
    sampler = SliceSampler(slice_len=8, traj_key=("collector", "traj_ids"), strict_length=False, pad_output=True)
    rb = ReplayBuffer(storage=LazyTensorStorage(2 * frames), sampler=sampler, batch_size=32)
    torch.manual_seed(0)
    out, repeated = tmp_path / "slices.parquet", 0
    with probe([actor, critic], out, force=True) as p:
        try:
            for data in collector:
                with torch.no_grad(), set_recurrent_mode(True):
                    adv(data)
                rb.extend(data.reshape(-1))
                for epoch in range(3):
                    sample = rb.sample().reshape(4, -1)
                    key = torch.stack([sample["collector", "traj_ids"], sample["step_count"].squeeze(-1)], -1)
                    repeated += int((key[:, 1:] == key[:, :-1]).all(-1).sum())
                    with p.tag(epoch=epoch, minibatch=0), set_recurrent_mode(True):
                        losses = loss_module(sample)
                    loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                    optim.zero_grad()
                    loss.backward()
                    optim.step()
        finally:
            collector.shutdown()
    assert repeated  # pad_output padded some slice
    df = _load(out)
    roll = df[(df["phase"] == "rollout") & (df["layer"] == 0)]
    train = df[(df["phase"] == "train") & (df["layer"] == 0) & ~df["padding"] & (df["t"] >= 0)]
    # two calls (actor, critic) per epoch, 32 samples each, less the repeated copies
    assert len(train) == 3 * 3 * 2 * 32 - 2 * repeated
    m = train.merge(roll, on=["env", "env_step"], suffixes=("", "_r"))
    assert len(m) == len(train)
    assert (m["episode"] == m["episode_r"]).all() and (m["episode_step"] == m["episode_step_r"]).all()
    # only the current batch's samples have a drift (the window is the collector's batch)
    batch_of = m["env_step"] // STEPS
    assert (m["drift_h"].notna() == (batch_of == m["iteration"])).all()
    st = lstm_probe.summarize(out).staleness
    assert st.provenance_ok is True and st.provenance_check_rows > 0
