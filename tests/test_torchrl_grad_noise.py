"""TorchRL's what-if gradient cosine where ClipPPOLoss samples its entropy (a TanhNormal on Pendulum: no analytic
entropy, one draw per element): TorchRL re-runs each segment from its stored state, so stored = refreshed and the
gradient training steps with differs from the copy's by the entropy's draws alone. The records hold that spread
(two draws of the copy's own gradient), the check counts the gap beyond it, and the report says the cosine cannot
be told from 1 within it (the check had failed on the sampling noise, the table read 1); CartPole's analytic
entropy draws nothing and its records hold no spread."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrl")

import torch

import lstm_probe
from lstm_probe.report.sections.what_if import WhatIf
from tests.test_torchrl_measure import records, train


def test_sampled_entropy_gradient_within_its_noise(tmp_path):
    log = tmp_path / "p.parquet"
    saved = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)  # TanhNormal.support fails validation
    try:
        train(log, env_id="Pendulum-v1", batches=2, loss_kw={"entropy_coeff": 1.0})
    finally:
        torch.distributions.Distribution.set_default_validate_args(saved)
    stored = [r for r in records(log) if r["alternative"] == "stored"]
    assert len(stored) == 4
    for r in stored:  # stored = refreshed; the policy side's gradient moves with the entropy's draws alone
        assert r["state_actor"] == 0 and r["value_abs"] == 0, r
        assert r["grad_noise_policy"] < 1 - 1e-4 and r["grad_cos_policy"] < 1 - 1e-4, r
        assert r["grad_noise_value"] == 1.0 and r["grad_cos_value"] == pytest.approx(1, abs=1e-6), r
    rep = lstm_probe.summarize(log)
    data = rep.what_if
    assert data.check["ok"] is True and data.check["max"]["grad_cos_gap"] == 0
    noise = data.grad_noise
    assert noise["policy"]["within"] is True and noise["value"] == {"cos": 1.0, "noise": 1.0, "within": True}
    assert noise["policy"]["noise"] == min(r["grad_noise_policy"] for r in stored)
    panel = WhatIf().text(data, rep.capabilities)[0].lines[0]
    assert "policy parameters: two draws of the copy's own gradient from the same states agree to cosine " in panel
    assert "cannot be told from 1 within that spread; value parameters: its draws agree" in panel


def test_analytic_entropy_holds_no_spread(tmp_path):
    log = tmp_path / "c.parquet"
    train(log, batches=1)
    stored = [r for r in records(log) if r["alternative"] == "stored"]
    assert stored and all("grad_noise_policy" not in r for r in stored)
    assert lstm_probe.summarize(log).what_if.grad_noise is None
