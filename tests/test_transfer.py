"""The capture path never waits for the device per call (issue #38): every host transfer the probe makes is
one per block (or multi-step call) handed to the writer, and holding a block's second half back to the next
hand-over (the CUDA path's order of work) changes nothing in the log."""

import numpy as np
import pandas as pd
import pytest
import torch
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env

import lstm_probe
from lstm_probe import ProbeCallback
from lstm_probe.capture.transfer import Staged, host_arrays
from lstm_probe.log.logwriter import LogWriter
from tests.transfers import counting, pipe_sends


def learn(out, n_envs, lstm_layers=1, **capture):
    env = make_vec_env("Pendulum-v1", n_envs=n_envs, seed=0)
    kw = {"lstm_hidden_size": 16, "n_lstm_layers": lstm_layers}
    ppo = {"n_steps": 256 // n_envs, "batch_size": 64, "n_epochs": 1, "policy_kwargs": kw}
    model = RecurrentPPO("MlpLstmPolicy", env, seed=0, **ppo)
    probe = ProbeCallback(out, force=True, **capture) if out is not None else None
    with counting() as counts:
        model.learn(256, callback=probe)  # one 256-step rollout, one training iteration
    return counts, probe


@pytest.mark.parametrize(
    ("n_envs", "lstm_layers", "capture"),
    [(1, 1, {}), (4, 2, {}), (1, 1, {"capture": "summary"}), (4, 1, {"writer": "thread"})],
    ids=["1env", "4envs-2layers", "summary", "thread-writer"],
)
def test_host_transfers_are_one_per_block_never_one_per_call(tmp_path, n_envs, lstm_layers, capture):
    plain, _ = learn(None, n_envs, lstm_layers)
    probed, probe = learn(tmp_path / "run.parquet", n_envs, lstm_layers, **capture)
    made = probed["transfers"] - plain["transfers"]  # sb3's own transfers are the same in both runs
    calls = lstm_probe.read_info(probe.path).metadata["probe_cost"]["calls"]
    assert calls >= 2 * 256 // n_envs  # the actor's and the critic's rollout calls at least
    assert probed["submits"] > 0
    assert made <= probed["submits"], (made, probed["submits"], calls)
    assert probed["submits"] * 8 < calls  # blocks, not calls: a block holds many one-step calls


def test_held_back_second_halves_write_the_same_log(tmp_path, monkeypatch):
    """The CUDA path reads a block's host copy at the next hand-over (LogWriter.submit): forced on the CPU,
    the log holds the same rows, bit for bit."""
    learn(tmp_path / "now.parquet", 2, 2)
    monkeypatch.setattr(LogWriter, "defer_always", True)
    learn(tmp_path / "later.parquet", 2, 2)
    a = pd.read_parquet(tmp_path / "now.parquet")
    b = pd.read_parquet(tmp_path / "later.parquet")
    assert len(a) == len(b) > 0
    for col in ("call", "phase", "env", "env_step", "t", "init", "drift_h"):
        assert a[col].equals(b[col]), col
    for col in ("h", "c"):
        assert np.array_equal(lstm_probe.states(a, col), lstm_probe.states(b, col), equal_nan=True)


def test_staged_reads_tensors_of_any_dtype_and_shape_in_one_buffer():
    a = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    b = torch.ones(4, dtype=torch.float16)
    c = torch.arange(24.0).reshape(2, 3, 4).transpose(0, 2)  # not contiguous
    x, y, z = host_arrays(a, b, c)
    assert x.dtype == y.dtype == z.dtype == np.float32
    assert np.array_equal(x, a.numpy()) and np.array_equal(y, np.ones(4)) and np.array_equal(z, c.numpy())
    assert x.base is y.base is z.base  # views of one host buffer
    t = torch.zeros(3)
    staged = Staged([t])
    t += 1  # a snapshot: later in-place changes are not read
    assert staged.ready and np.array_equal(staged.arrays()[0], np.zeros(3))


def _train_sends(monkeypatch, out, **kw):
    """A 1-env run of 2 updates (4 epochs of one minibatch each: 8 training calls an update), counting what
    crosses the writer pipe (tests/transfers.py: ``pipe_sends``)."""
    seen = pipe_sends(monkeypatch)
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0)
    ppo = {"n_steps": 128, "batch_size": 128, "n_epochs": 4, "policy_kwargs": {"lstm_hidden_size": 16}}
    model = RecurrentPPO("MlpLstmPolicy", env, seed=0, **ppo)
    model.learn(256, callback=ProbeCallback(out, force=True, **kw))
    return seen


def test_an_updates_training_calls_cross_the_writer_pipe_as_one_message(tmp_path, monkeypatch):
    """Issue #50: at 1 env each training call is small, and its fixed costs (a pickled message, the writer's
    read) were paid call by call; batched (LogWriter.submit), an update's training calls cross as one."""
    seen = _train_sends(monkeypatch, tmp_path / "run.parquet", capture="summary")
    assert seen["train"] >= 16  # actor and critic, 4 epochs, 2 updates
    assert seen["train_sends"] <= 2, seen  # one send an update


def test_an_rsl_rl_updates_training_calls_cross_the_writer_pipe_together(tmp_path, monkeypatch):
    """rsl_rl's integration batches its update's training calls as sb3's does (its minibatch generator)."""
    pytest.importorskip("rsl_rl")
    from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg
    from lstm_probe.integrations.rsl_rl.train import build_runner

    seen = pipe_sends(monkeypatch)
    torch.manual_seed(0)
    cfg = train_cfg(
        num_mini_batches=2, num_learning_epochs=2, learning_rate=1e-3, rnn_type="lstm", rnn_layers=1, hidden_size=8
    )
    runner = build_runner(TorchPendulumVecEnv(4, seed=0), cfg)
    with attach(runner, tmp_path / "run.parquet", capture="summary", force=True):
        runner.learn(2)
    assert seen["train"] >= 16, seen  # actor and critic, 2 epochs of 2 minibatches, 2 updates
    assert seen["train_sends"] <= 2, seen  # one send an update


def test_a_full_batch_is_sent_early_and_the_log_keeps_every_row_in_order(tmp_path, monkeypatch):
    """A batch sent once it holds BATCH_JOBS jobs (the bound on what it keeps) writes the log a writer
    thread (no batches) writes, row for row."""
    from lstm_probe.log import logwriter

    monkeypatch.setattr(logwriter, "BATCH_JOBS", 3)
    seen = _train_sends(monkeypatch, tmp_path / "batched.parquet")
    assert seen["train_sends"] >= 2 * 3, seen  # 8 training calls an update, 3 a send at most
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0)
    ppo = {"n_steps": 128, "batch_size": 128, "n_epochs": 4, "policy_kwargs": {"lstm_hidden_size": 16}}
    model = RecurrentPPO("MlpLstmPolicy", env, seed=0, **ppo)
    model.learn(256, callback=ProbeCallback(tmp_path / "thread.parquet", force=True, writer="thread"))
    a = pd.read_parquet(tmp_path / "batched.parquet")
    b = pd.read_parquet(tmp_path / "thread.parquet")
    assert len(a) == len(b) > 0
    for col in ("call", "phase", "epoch", "env", "env_step", "t", "init", "drift_h", "drift_c", "path"):
        assert a[col].equals(b[col]), col
    for col in ("h", "c"):
        assert np.array_equal(lstm_probe.states(a, col), lstm_probe.states(b, col), equal_nan=True)


@pytest.mark.parametrize("how", ["process", "held-back", "thread"])
def test_hand_overs_forced_by_age_write_the_same_rows(tmp_path, monkeypatch, how):
    """What waits on the training side (rollout blocks, the update's batched jobs, a held-back second half) is
    handed over once a quarter of --part-seconds old (capture/held.py): with a tiny part_seconds nearly every
    call hands over what came before it, in many more, smaller messages. The rows are the same as the same
    seeded run's without, row for row (sorted by phase and call: the order within each)."""
    if how == "held-back":  # the CUDA path's order of work: second halves held to the next hand-over, aged too
        monkeypatch.setattr(LogWriter, "defer_always", True)
    writer = {"writer": "thread"} if how == "thread" else {}
    plain, _ = learn(tmp_path / "plain.parquet", 2, 2, **writer)
    aged, _ = learn(tmp_path / "aged.parquet", 2, 2, part_seconds=0.0004, **writer)  # a share of 0.1 ms
    assert aged["submits"] > 2 * plain["submits"]  # the blocks and batches went by age, not by size
    a, b = (
        pd.read_parquet(tmp_path / f"{name}.parquet").sort_values(["phase", "call"], kind="stable")
        for name in ("plain", "aged")
    )
    a, b = a.reset_index(drop=True), b.reset_index(drop=True)
    assert list(a.columns) == list(b.columns) and len(a) == len(b) > 0
    for col in a.columns:
        if a[col].dtype == object:  # vectors (h, c) and strings: compared value by value
            same = all(_same(x, y) for x, y in zip(a[col], b[col], strict=True))
        else:
            same = a[col].equals(b[col])
        assert same, col


def _same(x, y) -> bool:
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        x, y = np.asarray(x), np.asarray(y)
        return x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")
    return x == y or (x is None and y is None) or bool(pd.isna(x) and pd.isna(y))
