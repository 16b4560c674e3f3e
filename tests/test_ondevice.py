"""The device path of a summary log's multi-step training calls (issue #50, capture/ondevice.py), forced on the
CPU (``OnDevice._engage``; never a GPU-only test): real rsl_rl and RecurrentPPO runs under ``--capture
summary --trace-envs K`` write the host path's log (rows, keys, call ids, `init` answers and `found` exactly;
the norms and drifts within 1e-5 relative, 1e-6 absolute: the device recovers c with torch, the host with
numpy, so a drift of c that is rounding noise, ~1e-7, differs in full), the provenance check holds on it, and
each of its calls crosses to the host in one copy. A packed call (padding steps) through the generic tracer,
and TorchRL's recurrent-mode and value calls, too. Without the switch, on the CPU, nothing changes
(``benchmarks/log_digest.py``: all equal)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

import lstm_probe
from lstm_probe.capture import calls
from lstm_probe.capture.ondevice import OnDevice, _Ring
from tests.transfers import counting

FIGURES = ("h_norm", "c_norm", "drift_h", "drift_c")
RTOL, ATOL = 1e-5, 1e-6
"""The figures' tolerance: relative, with an absolute floor for drifts that are the recoveries' rounding."""


def device_calls(monkeypatch) -> list[int]:
    """Forces the device path on the CPU; the list counts the calls that took it."""
    taken: list[int] = []
    on_device = calls._on_device

    def counted(*args, **kwargs):
        taken.append(1)
        return on_device(*args, **kwargs)

    monkeypatch.setattr(OnDevice, "_engage", "always")
    monkeypatch.setattr(calls, "_on_device", counted)
    return taken


def same_log(host: pd.DataFrame, dev: pd.DataFrame) -> None:
    """The device path's log is the host path's: every column but the figures and c exactly (row order,
    keys, call ids, `init`, h), the figures within RTOL/ATOL with the same nulls (`found`), c within RTOL."""
    assert list(host.columns) == list(dev.columns) and len(host) == len(dev) > 0
    for col in host.columns:
        if col in FIGURES or col == "c":
            continue
        if col == "h":
            assert np.array_equal(lstm_probe.states(host, "h"), lstm_probe.states(dev, "h"), equal_nan=True)
        else:
            assert host[col].equals(dev[col]), col
    for col in FIGURES:
        a, b = host[col].to_numpy(np.float64), dev[col].to_numpy(np.float64)
        assert np.array_equal(np.isnan(a), np.isnan(b)), col  # drift: `found` exactly
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL, err_msg=col)
    a, b = lstm_probe.states(host, "c"), lstm_probe.states(dev, "c")
    assert np.array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)


def first_minibatch_drift(df: pd.DataFrame) -> tuple[float, float]:
    first = df[(df.phase == "train") & (df.epoch == 0) & (df.minibatch == 0) & ~df.padding]
    assert len(first) and first.drift_h.notna().all()
    return float(first.drift_h.max()), float(first.drift_c.max())


# -- rsl_rl --------------------------------------------------------------------------------------------------


@pytest.fixture
def rsl():
    pytest.importorskip("rsl_rl")
    from tests import test_rsl_rl  # its runner, probe and provenance oracle

    saved = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)  # what rsl_rl sets for the process
    yield test_rsl_rl
    torch.distributions.Distribution.set_default_validate_args(saved)


@pytest.mark.parametrize("layers", [1, 2])
def test_rsl_rl_device_path_writes_the_host_paths_log(tmp_path, monkeypatch, rsl, layers):
    """8 envs, --capture summary --trace-envs 3: the same log on both paths; the provenance oracle on the kept
    envs' vectors, and the first minibatch's drifts ~0 on every env (< 1e-6)."""
    capture = {"capture": "summary", "trace_envs": 3}
    rsl.probed(tmp_path / "host.parquet", 8, layers=layers, **capture)
    taken = device_calls(monkeypatch)
    copies: list[int] = []
    of = _Ring.of
    monkeypatch.setattr(_Ring, "of", staticmethod(lambda *a: copies.append(1) or of(*a)))
    rsl.probed(tmp_path / "dev.parquet", 8, layers=layers, **capture)
    host, dev = lstm_probe.load(tmp_path / "host.parquet"), lstm_probe.load(tmp_path / "dev.parquet")
    # every training call of both iterations (actor and critic, 2 epochs x 4 minibatches) took the device path
    assert len(taken) == 2 * 2 * 2 * 4
    # the device rings copied from the host's once per module (its first training call), then fed on the device
    assert len(copies) == 2
    same_log(host, dev)
    stored = dev.h.notna()
    assert (stored == (dev.env.isin(range(3)) & ~dev.padding)).all()
    assert rsl.oracle(dev[stored]) < 1e-5
    assert max(first_minibatch_drift(dev)) < 1e-6
    assert dev[(dev.phase == "train") & (dev.epoch > 0)].drift_h.max() > 1e-4  # later ones drift


def test_rsl_rl_device_path_one_host_copy_per_call(tmp_path, monkeypatch, rsl):
    """Each training call on the device path crosses to the host once (its figures, input and returned states
    in one ``Staged``); its first half and its second half make no other host transfer."""
    taken = device_calls(monkeypatch)

    def who() -> str:
        f = sys._getframe(2)
        while f is not None:
            code = f.f_code
            if code.co_filename.endswith(os.path.join("capture", "ondevice.py")) or code.co_qualname.startswith(
                "_on_device"
            ):
                return "device"
            if code.co_name == "__call__" and code.co_filename.endswith("transfer.py"):
                finish = getattr(f.f_locals.get("self"), "finish", None)
                if finish is not None and finish.__qualname__.startswith("_on_device"):
                    return "device"
            f = f.f_back
        return "other"

    runner = rsl.make_runner(16)
    with counting(who) as counts, rsl.attach(runner, tmp_path / "t.parquet", capture="summary", trace_envs=4):
        runner.learn(2)
    assert len(taken) == 32
    assert counts["device"] == len(taken)  # one per call, none more


# -- sb3 RecurrentPPO ----------------------------------------------------------------------------------------


def test_sb3_device_path_writes_the_host_paths_log(tmp_path, monkeypatch):
    """RecurrentPPO, 4 envs, --capture summary --trace-envs 2: its sequence training calls on the device path
    (its stepwise loops stay the host's), the same log; the first minibatch's drifts ~0."""
    pytest.importorskip("sb3_contrib")
    from tests.conftest import TINY

    opts = {**TINY, "n_envs": 4, "capture": "summary", "trace_envs": 2, "steps": 256}
    host = lstm_probe.run("Pendulum-v1", tmp_path / "host.parquet", seed=0, force=True, **opts)
    taken = device_calls(monkeypatch)
    dev = lstm_probe.run("Pendulum-v1", tmp_path / "dev.parquet", seed=0, force=True, **opts)
    assert len(taken) > 0
    a, b = lstm_probe.load(host.path), lstm_probe.load(dev.path)
    assert {"sequence", "stepwise"} <= set(b[b.phase == "train"].path)
    same_log(a, b)
    assert max(first_minibatch_drift(b)) < 1e-6


# -- a packed call (padding steps), through the generic tracer -------------------------------------------------


def packed_run(path, layers: int, writer: str, window: int | None = None) -> None:
    """Two iterations of 4 envs x 12 rollout steps of one-step calls, each followed by a PackedSequence
    training call on each env's two pieces of it (lengths differ: padding steps), before any weight changes.
    (The device ring is made at the first training call: the second rollout feeds it on the device.)"""
    torch.manual_seed(0)
    m = nn.LSTM(3, 8, num_layers=layers)
    h = c = torch.zeros(layers, 4, 8)
    options = {"capture": "summary", "trace_envs": 2, "writer": writer, "force": True}
    if window is not None:  # a ring shorter than the rollout: slots written twice in one block
        options["reference_window"] = window
    with torch.no_grad(), lstm_probe.trace(m, path, **options) as probe:
        for it in range(2):
            xs = torch.randn(12, 4, 3)
            starts = []
            for t in range(12):
                starts.append((h, c))
                with probe.tag(phase="rollout", iteration=it, env=np.arange(4), env_step=np.full(4, 12 * it + t)):
                    _, (h, c) = m(xs[t : t + 1], (h, c))
            cut = [5, 7, 3, 9][it:] + [5, 7, 3, 9][:it]  # env e's pieces: steps 0..cut-1 and cut..11
            pieces = [(e, 0, cut[e]) for e in range(4)] + [(e, cut[e], 12 - cut[e]) for e in range(4)]
            seqs = [xs[a : a + n, e] for e, a, n in pieces]
            h0 = torch.stack([starts[a][0][:, e] for e, a, _ in pieces], 1)
            c0 = torch.stack([starts[a][1][:, e] for e, a, _ in pieces], 1)
            width = max(n for _, _, n in pieces)
            steps = np.array([[12 * it + a + min(t, n - 1) for t in range(width)] for _, a, n in pieces])
            env = np.array([e for e, _, _ in pieces])
            with probe.tag(phase="train", iteration=it, epoch=0, minibatch=0, env=env, env_step=steps):
                m(pack_sequence(seqs, enforce_sorted=False), (h0, c0))


@pytest.mark.parametrize(("layers", "writer", "window"), [(1, "process", None), (2, "thread", None), (1, "process", 3)])
def test_packed_call_device_path_writes_the_host_paths_log(tmp_path, monkeypatch, layers, writer, window):
    """Padding steps (zero h and c there), drift through a packed call, a writer thread (the job's halves run
    there), a ring of 3 + 2 steps (rows found for the last 5 steps of each env only; slots written twice in
    one block)."""
    packed_run(tmp_path / "host.parquet", layers, writer, window)
    taken = device_calls(monkeypatch)
    copies: list[int] = []
    of = _Ring.of
    monkeypatch.setattr(_Ring, "of", staticmethod(lambda *a: copies.append(1) or of(*a)))
    packed_run(tmp_path / "dev.parquet", layers, writer, window)
    assert len(taken) == 2 and len(copies) == 1  # the second rollout fed the device ring on the device
    host, dev = lstm_probe.load(tmp_path / "host.parquet"), lstm_probe.load(tmp_path / "dev.parquet")
    same_log(host, dev)
    train = dev[dev.phase == "train"]
    assert train.padding.any() and (train[train.padding].h_norm == 0).all() and (train[train.padding].c_norm == 0).all()
    real = train[~train.padding]
    if window is None:
        assert max(first_minibatch_drift(dev)) < 1e-6
    else:
        assert (real.drift_h.notna() == (real.env_step % 12 >= 12 - window - 2)).all()
        assert real.drift_h.max() < 1e-6


# -- TorchRL (recurrent-mode calls replayed by its shadow; GAE's value passes) ----------------------------------


def test_torchrl_device_path_writes_the_host_paths_log(tmp_path, monkeypatch):
    pytest.importorskip("torchrl")
    from lstm_probe.integrations.torchrl.train import run

    opts = {"n_envs": 4, "capture": "summary", "trace_envs": 2, "steps": 256, "n_steps": 32, "hidden_size": 8}
    host = run("CartPole-v1", tmp_path / "host.parquet", seed=0, force=True, **opts)
    taken = device_calls(monkeypatch)
    dev = run("CartPole-v1", tmp_path / "dev.parquet", seed=0, force=True, **opts)
    a, b = lstm_probe.load(host.path), lstm_probe.load(dev.path)
    assert len(taken) > 0 and {"train", "value"} <= set(b.phase)
    same_log(a, b)
    assert b[b.phase == "train"].drift_h.notna().any()


def test_the_device_path_engages_on_cuda_only():
    """Another accelerator keeps the host path: MPS has no float64 (the rows' norms are float64 sums), so the
    device path would fail its writer there. (torch.device objects only: no device is touched.)"""
    assert OnDevice._engage == "accelerator"
    assert OnDevice.on(torch.device("cuda", 0))
    for kind in ("cpu", "mps", "xpu", "meta"):
        assert not OnDevice.on(torch.device(kind)), kind


def autocast_run(path, layers: int) -> None:
    """4 envs x 6 rollout steps of one-step calls, then a training call over them under CPU autocast (bfloat16:
    its matmuls run in lower precision there), as a mixed-precision training loop would call the module."""
    torch.manual_seed(0)
    m = nn.LSTM(3, 8, num_layers=layers)
    h = c = torch.zeros(layers, 4, 8)
    xs = torch.randn(6, 4, 3)
    with torch.no_grad(), lstm_probe.trace(m, path, capture="summary", trace_envs=2, force=True) as probe:
        for t in range(6):
            with probe.tag(phase="rollout", iteration=0, env=np.arange(4), env_step=np.full(4, t)):
                _, (h, c) = m(xs[t : t + 1], (h, c))
        steps = np.tile(np.arange(6), (4, 1))
        with probe.tag(phase="train", iteration=0, epoch=0, minibatch=0, env=np.arange(4), env_step=steps):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                m(xs, (torch.zeros(layers, 4, 8), torch.zeros(layers, 4, 8)))


@pytest.mark.parametrize("layers", [1, 2])
def test_the_device_paths_figures_are_float32_under_autocast(tmp_path, monkeypatch, layers):
    """A training call under autocast: the device path recovers c and the figures in float32, as the host path
    does (numpy), not in the autocast dtype its hook runs under."""
    autocast_run(tmp_path / "host.parquet", layers)
    taken = device_calls(monkeypatch)
    autocast_run(tmp_path / "dev.parquet", layers)
    assert len(taken) == 1
    same_log(lstm_probe.load(tmp_path / "host.parquet"), lstm_probe.load(tmp_path / "dev.parquet"))
