"""TorchRL's hooks copy no provenance to the host per LSTM call (issue #50): a real tiny
``lstm-probe run --framework torchrl`` (collection, GAE, ClipPPOLoss) with the Tensor methods that move data to
the host counted as tests/test_transfer.py counts them, each transfer put down to the innermost lstm-probe
frame that made it: the TorchRL integration (hooks.py, samples.py, recurrent.py), the capture core and writer
(one per block or multi-step call handed over), or TorchRL itself (the run's own loop)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torchrl")

import torch

import lstm_probe
from tests.transfers import counting, pipe_sends

PACKAGE = str(Path(lstm_probe.__file__).parent)
INTEGRATION = tuple(f"integrations/torchrl/{m}.py" for m in ("hooks", "samples", "recurrent"))
MOST_PER_CALL = 0.05
"""The TorchRL integration's host transfers per LSTM call (issue #50's goal), over every run below. Before
issue #50 its hooks made 5.26 counted transfers per LSTM call over the 1-env run (one real copy per call,
counted once per ``.to(int64)``, ``.cpu()`` and ``.numpy()``), then 0.072 (one per recurrent-mode call); now
one per collector batch for all of its calls."""


def _maker() -> str:
    """Who made the transfer being counted: the innermost lstm-probe frame's part ("integration": the
    TorchRL hooks; "returns": the returns capability's copy of a batch's episodes (capture/returns.py, for the
    integration); "core": capture/ and log/; "torchrl": no probe frame but the run's own loop)."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(PACKAGE):
            rel = name[len(PACKAGE) + 1 :]
            if rel.endswith(INTEGRATION):
                return "integration"
            if rel == "capture/returns.py":
                return "returns"
            if rel.startswith(("capture/", "log/")):
                return "core"
            return "torchrl"  # the run's loop (train.py): TorchRL's own work below it
        frame = frame.f_back
    return "torchrl"


@pytest.mark.parametrize(
    ("n_envs", "steps", "capture"),
    [
        (1, 512, {"capture": "full"}),
        (2, 512, {"capture": "summary"}),
        (4, 1024, {"trace_envs": 2, "other_envs": "none", "capture_obs": True}),
    ],
    ids=["1env-full", "2envs-summary", "4envs-other-none"],
)
def test_torchrl_hooks_copy_to_the_host_per_batch_not_per_call(tmp_path, n_envs, steps, capture):
    """Every LSTM call, collection and recurrent-mode (the loss's, GAE's) alike: the staged calls' values
    cross in bulk, at a block's hand-over or at the first collection call after training (the recurrent-mode
    calls replayed then); under --other-envs none with more envs than kept as well (the core's grid of the
    kept columns is a view the values fill later)."""
    from lstm_probe.integrations.torchrl.train import run

    torch.set_num_threads(1)
    out = tmp_path / "run.parquet"
    with counting(_maker) as counts:
        run("CartPole-v1", str(out), steps=steps, n_steps=128, hidden_size=16, n_envs=n_envs, seed=3, **capture)
    calls = lstm_probe.read_info(out).metadata["probe_cost"]["calls"]
    phases = lstm_probe.load(out, columns=["call", "phase"]).drop_duplicates("call")["phase"].value_counts()
    assert phases["rollout"] >= 2 * 128 // min(n_envs, 2) and phases["train"] + phases.get("value", 0) > 0, phases
    seen = (dict(counts), calls, dict(phases))
    assert (counts["integration"] + counts["returns"]) / calls <= MOST_PER_CALL, seen
    # one settlement per collector batch and one at close, each one copy (two where observations are kept)
    per, batches = 2 if capture.get("capture_obs") else 1, steps // (128 * n_envs)
    assert counts["integration"] <= per * (batches + 1), seen
    # the returns: one copy of a batch's episodes (counted twice: .cpu() and .numpy()), and the sums' start
    assert counts["returns"] <= 2 * (batches + 1) + 1, seen
    assert counts["core"] <= 2 * counts["submits"], seen


def test_the_replayed_training_calls_cross_the_writer_pipe_together(tmp_path, monkeypatch):
    """The recurrent-mode calls replayed at a collector batch (the loss's, GAE's) cross the writer pipe as one
    message per settlement, not one per call (``CoreTracer.batch_jobs``, as sb3's and rsl_rl's updates)."""
    from lstm_probe.integrations.torchrl.train import run

    torch.set_num_threads(1)
    seen = pipe_sends(monkeypatch)
    run("CartPole-v1", str(tmp_path / "run.parquet"), steps=256, n_steps=64, hidden_size=8, n_envs=2, seed=3)
    assert seen["train"] >= 8, seen  # several epochs' calls a batch
    assert seen["train_sends"] <= 256 // (64 * 2) + 1, seen  # one settlement a collector batch, one at close


def test_other_envs_none_writes_the_kept_envs_rows_unchanged(tmp_path):
    """--other-envs none on TorchRL, the kept envs' grids taken before their provenance reached the host:
    their rows (provenance and kept observations included) are the full log's, bit for bit."""
    from lstm_probe.integrations.torchrl.train import run

    torch.set_num_threads(1)
    kw = {"steps": 512, "n_steps": 64, "hidden_size": 8, "n_envs": 4, "seed": 5, "capture_obs": True}
    run("CartPole-v1", str(tmp_path / "full.parquet"), **kw)
    run("CartPole-v1", str(tmp_path / "some.parquet"), trace_envs=2, other_envs="none", **kw)
    a, b = lstm_probe.load(tmp_path / "full.parquet"), lstm_probe.load(tmp_path / "some.parquet")
    a, b = a[a["phase"] == "rollout"], b[b["phase"] == "rollout"]
    chosen = a[a["env"].isin([0, 1])].reset_index(drop=True)
    b = b.reset_index(drop=True)
    assert len(b) == len(chosen) > 0 and set(b["env"].unique()) == {0, 1}
    cols = ["call", "env", "env_step", "episode", "episode_step", "episode_start", "init", "h_norm", "c_norm"]
    assert b[cols].equals(chosen[cols])
    for col in ("h", "c"):
        assert np.array_equal(lstm_probe.states(b, col), lstm_probe.states(chosen, col), equal_nan=True), col
    kept, full = (np.stack([np.asarray(v, np.float32) for v in df["obs"]]) for df in (b, chosen))
    assert kept.shape == (len(b), 4) and np.array_equal(kept, full) and not np.isnan(kept).any()


def test_recurrent_calls_replayed_later_write_the_same_log(tmp_path, monkeypatch):
    """A recurrent-mode call replayed at once (its staged copies over the budget: recurrent.STAGED_BYTES) and
    one replayed at the next collector batch, after the optimizer steps that changed the module's weights in
    place, write the same log: the same calls, ids, provenance and states, bit for bit."""
    from lstm_probe.integrations.torchrl import recurrent
    from lstm_probe.integrations.torchrl.train import run

    torch.set_num_threads(1)
    kw = {"steps": 384, "n_steps": 64, "hidden_size": 8, "n_envs": 2, "seed": 7, "n_epochs": 2}
    run("CartPole-v1", str(tmp_path / "later.parquet"), **kw)
    monkeypatch.setattr(recurrent, "STAGED_BYTES", {"cpu": 0})
    with counting(_maker) as counts:
        run("CartPole-v1", str(tmp_path / "now.parquet"), **kw)
    later, now = lstm_probe.load(tmp_path / "later.parquet"), lstm_probe.load(tmp_path / "now.parquet")
    recurrent_calls = now[now["phase"] != "rollout"]["call"].nunique()
    assert counts["integration"] >= recurrent_calls > 0  # each replayed at once: one copy each
    assert (later["phase"] == "train").any() and len(later) == len(now)
    for col in later.columns:
        a, b = later[col], now[col]
        if a.dtype == object and any(isinstance(x, np.ndarray) for x in a):  # the vector columns
            assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b, strict=True)), col
        else:
            assert a.equals(b), col
