"""Drift is computed once, in the training process (drift.Drift), against the rollout states the probe holds
for the `init` columns (inputs.Inputs): the log's drift columns must be their definition, computed here from
the log's own vectors, for every way rollout states reach that store (one-step blocks, every step of a
multi-step rollout call) and every way train rows come (a multi-step call, its t = -1 initial rows)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import lstm_probe


class Net(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.lstm = nn.LSTM(3, 8, num_layers=layers)


def expected(df: pd.DataFrame) -> pd.DataFrame:
    """Each train row's drift by its definition: ||s_train - s_rollout|| / ||s_rollout|| against the rollout
    row of the same (layer, env, env step), from the log's own vectors (float64)."""
    rollout = df[df.phase == "rollout"].set_index(["layer", "env", "env_step"])
    train = df[(df.phase == "train") & ~df.padding].copy()
    for s in ("h", "c"):
        ref = np.stack(
            rollout.loc[list(zip(train.layer, train.env, train.env_step, strict=True)), s].to_numpy()
        ).astype(np.float64)
        got = np.stack(train[s].to_numpy()).astype(np.float64)
        train[f"want_{s}"] = np.linalg.norm(got - ref, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-12)
    return train


def traced(out, layers: int, one_step_rollout: bool, capture: str) -> pd.DataFrame:
    """Rollout calls (one step at a time, or one multi-step call), a weight change, then a train call over
    the same env steps, traced into ``out``."""
    torch.manual_seed(0)
    net = Net(layers)
    n_envs, steps = 3, 10
    x = torch.randn(steps, n_envs, 3)
    zeros = (torch.zeros(layers, n_envs, 8), torch.zeros(layers, n_envs, 8))
    env = np.repeat(np.arange(n_envs)[:, None], steps, axis=1)
    env_step = np.repeat(np.arange(steps)[None, :], n_envs, axis=0)
    tracer = lstm_probe.trace(net, out, capture=capture, reference_window=steps)
    with tracer, torch.no_grad():
        if one_step_rollout:
            state = zeros
            for t in range(steps):
                with tracer.tag(phase="rollout", iteration=0, env=np.arange(n_envs), env_step=t):
                    _, state = net.lstm(x[t : t + 1], state)
        else:
            with tracer.tag(phase="rollout", iteration=0, env=env, env_step=env_step):
                net.lstm(x, zeros)
        net.lstm.weight_hh_l0.add_(0.05)  # an optimizer step: the train states drift from the rollout's
        with tracer.tag(phase="train", iteration=0, epoch=0, minibatch=0, env=env, env_step=env_step):
            net.lstm(x, zeros)
    return lstm_probe.load(out, vectors=capture == "full")


@pytest.mark.parametrize("one_step_rollout", [True, False], ids=["one-step rollout", "multi-step rollout"])
@pytest.mark.parametrize("layers", [1, 2])
def test_drift_columns_are_their_definition(tmp_path, layers, one_step_rollout):
    df = traced(tmp_path / "full.parquet", layers, one_step_rollout, "full")
    train = expected(df)
    assert len(train) == layers * 3 * 10 and train.drift_h.notna().all()
    assert train.drift_h.max() > 1e-3  # the perturbed weights moved every layer's states
    np.testing.assert_allclose(train.drift_h, train.want_h, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(train.drift_c, train.want_c, rtol=1e-5, atol=1e-7)
    # a summary log's rows reach the sink as their figures (drift.reduced): the same figures, bit for bit
    summary = traced(tmp_path / "summary.parquet", layers, one_step_rollout, "summary")
    columns = ["phase", "layer", "env", "env_step", "h_norm", "c_norm", "drift_h", "drift_c", "init", "init_norm"]
    pd.testing.assert_frame_equal(df[columns].reset_index(drop=True), summary[columns].reset_index(drop=True))


def test_a_restarted_tracer_drifts_against_its_own_logs_rollout_only(tmp_path):
    """A tracer started again writes a new log: its train rows never drift against the earlier log's rollout
    states (the states held are each log's own)."""
    torch.manual_seed(0)
    net = Net(1)
    x = torch.randn(4, 2, 3)
    env = np.repeat(np.arange(2)[:, None], 4, axis=1)
    env_step = np.repeat(np.arange(4)[None, :], 2, axis=0)
    tracer = lstm_probe.trace(net, tmp_path / "r.parquet", capture="summary", reference_window=4, force=True)
    with torch.no_grad():
        with tracer:
            with tracer.tag(phase="rollout", iteration=0, env=env, env_step=env_step):
                net.lstm(x)
            with tracer.tag(phase="train", iteration=0, epoch=0, minibatch=0, env=env, env_step=env_step):
                net.lstm(x)
        first = lstm_probe.load(tmp_path / "r.parquet", vectors=False)
        with tracer:  # the same env steps again, without their rollout
            with tracer.tag(phase="train", iteration=0, epoch=0, minibatch=0, env=env, env_step=env_step):
                net.lstm(x)
        second = lstm_probe.load(tmp_path / "r.parquet", vectors=False)
    assert first[first.phase == "train"].drift_h.notna().all()
    assert len(second) == 8 and second.drift_h.isna().all()


def test_rollout_columns_without_an_env_leave_the_others_as_references(tmp_path):
    """A rollout call some of whose columns carry no env: the others' states are still the rollout states
    train rows drift from."""
    torch.manual_seed(0)
    net = Net(1)
    x = torch.randn(3, 3, 3)
    with lstm_probe.trace(net, tmp_path / "p.parquet", reference_window=3) as tracer, torch.no_grad():
        state = None
        for t in range(3):
            with tracer.tag(phase="rollout", iteration=0, env=np.array([0, 1, -1]), env_step=t):
                _, state = net.lstm(x[t : t + 1], state)
        env = np.repeat(np.arange(2)[:, None], 3, axis=1)
        env_step = np.repeat(np.arange(3)[None, :], 2, axis=0)
        with tracer.tag(phase="train", iteration=0, epoch=0, minibatch=0, env=env, env_step=env_step):
            net.lstm(x[:, :2])
    train = lstm_probe.load(tmp_path / "p.parquet", phase="train", vectors=False)
    assert len(train) == 6 and train.drift_h.notna().all() and train.drift_h.max() < 1e-6


def test_the_provenance_bound_allows_for_tf32_only_where_cudnn_computed_in_it():
    """On a GPU, cuDNN computes LSTMs in TF32 by default (10-bit mantissa): the rollout's one-step calls and
    training's multi-step calls then differ by ~1e-4..1e-3, and a 1e-4 bound calls every such run a provenance
    bug. The log says where that was so (``cudnn_tf32``); a CPU log says nothing and keeps 1e-4."""
    from torch import nn

    from lstm_probe.capture.modules import numerics
    from lstm_probe.report.sections.staleness import (
        PROVENANCE_TOLERANCE,
        TF32_PROVENANCE_TOLERANCE,
        provenance_tolerance,
    )

    assert numerics({"actor": nn.LSTM(3, 4)}) == {}  # weights on the CPU: no entry, the log is unchanged
    assert provenance_tolerance({}) == PROVENANCE_TOLERANCE == 1e-4
    assert provenance_tolerance({"cudnn_tf32": True}) == TF32_PROVENANCE_TOLERANCE == 1e-2
    assert provenance_tolerance({"cudnn_tf32": "yes"}) == PROVENANCE_TOLERANCE  # a hostile value: no looser bound
