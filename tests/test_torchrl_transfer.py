"""TorchRL's hooks copy no provenance to the host per collection call (issue #50): a real tiny
``lstm-probe run --framework torchrl`` (collection, GAE, ClipPPOLoss) with the Tensor methods that move data to
the host counted as tests/test_transfer.py counts them, each transfer put down to the innermost lstm-probe
frame that made it: the TorchRL integration (hooks.py, samples.py), the capture core and writer (one per block
or multi-step call handed over), or TorchRL itself (the run's own loop)."""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchrl")

import torch

import lstm_probe
from lstm_probe.log.logwriter import LogWriter

TRANSFERS = ("cpu", "numpy", "item", "tolist", "to")
PACKAGE = str(Path(lstm_probe.__file__).parent)
INTEGRATION = ("integrations/torchrl/hooks.py", "integrations/torchrl/samples.py")
MOST_PER_CALL = 0.05
"""The TorchRL integration's host transfers per collection (sequential-mode) call. Before issue #50 its hooks
made 5.26 counted transfers per LSTM call over the run below (one real copy per call, counted once per
``.to(int64)``, ``.cpu()`` and ``.numpy()``); now 0 per collection call and 1 per recurrent-mode call."""


def _maker() -> str:
    """Who made the transfer being counted: the innermost lstm-probe frame's part ("integration": the
    TorchRL hooks; "core": capture/ and log/; "torchrl": no probe frame but the run's own loop)."""
    frame: Any = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(PACKAGE):
            rel = name[len(PACKAGE) + 1 :]
            if rel.endswith(INTEGRATION):
                return "integration"
            if rel.startswith(("capture/", "log/")):
                return "core"
            return "torchrl"  # the run's loop (train.py): TorchRL's own work below it
        frame = frame.f_back
    return "torchrl"


@contextlib.contextmanager
def counting():
    """Counts calls of the Tensor methods that move data to the host (or may: ``to``), by who made them,
    and LogWriter.submit (the blocks and multi-step calls handed to the writer)."""
    counts: Counter[str] = Counter()
    saved = {name: getattr(torch.Tensor, name) for name in TRANSFERS}
    submit = LogWriter.submit

    def wrap(fn):
        def counted(self, *args, **kwargs):
            counts[_maker()] += 1
            return fn(self, *args, **kwargs)

        return counted

    def counted_submit(self, job, nbytes):
        counts["submits"] += 1
        return submit(self, job, nbytes)

    for name, fn in saved.items():
        setattr(torch.Tensor, name, wrap(fn))
    LogWriter.submit = counted_submit
    try:
        yield counts
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        LogWriter.submit = submit


@pytest.mark.parametrize(
    ("n_envs", "capture"),
    [(1, {"capture": "full"}), (2, {"capture": "summary"}), (4, {"trace_envs": 2, "other_envs": "none"})],
    ids=["1env-full", "2envs-summary", "4envs-other-none"],
)
def test_torchrl_hooks_copy_to_the_host_per_block_not_per_call(tmp_path, n_envs, capture):
    from lstm_probe.integrations.torchrl.train import run

    torch.set_num_threads(1)
    out = tmp_path / "run.parquet"
    with counting() as counts:
        run("CartPole-v1", str(out), steps=512, n_steps=128, hidden_size=16, n_envs=n_envs, seed=3, **capture)
    info = lstm_probe.read_info(out).metadata
    calls = info["probe_cost"]["calls"]
    phases = lstm_probe.load(out, columns=["call", "phase"]).drop_duplicates("call")["phase"].value_counts()
    assert phases["rollout"] >= 512 // n_envs and phases["train"] + phases.get("value", 0) > 0, phases
    print(dict(counts), calls, dict(phases))
    # every LSTM call, collection and recurrent-mode (the loss's, GAE's) alike: their provenance crosses in bulk
    assert counts["integration"] / calls <= MOST_PER_CALL, (dict(counts), calls, dict(phases))
    assert counts["integration"] <= counts["submits"], (dict(counts), calls, dict(phases))
