"""The what-if table's "grad cos π / V" cell never shows a cosine below 1 as 1: three significant digits, more where
three would round to 1 (0.99995), '1 - 3e-09' closer still, exactly '1' only for 1 (``section.fmt_cos``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lstm_probe
from lstm_probe.contract import Capabilities
from lstm_probe.report.section import Table, fmt_cos
from lstm_probe.report.sections.what_if import WhatIf

SB3 = Capabilities("sb3", epochs=True, rollout_buffer=True, stored_states=True, replay=True)


@pytest.mark.parametrize(
    "cos,text",
    [
        (1.0, "1"),
        (0.99995, "0.99995"),
        (0.9995, "0.9995"),
        (0.99949, "0.999"),
        (0.987, "0.987"),
        (0.9999996, "1 - 4e-07"),
        (1 - 3e-9, "1 - 3e-09"),
        (-0.99995, "-0.99995"),
        (-1.0, "-1"),
        (1 + 2**-52, "1 + 2.2e-16"),
        (None, "-"),
    ],
)
def test_a_cosine_below_1_never_reads_1(cos, text):
    assert fmt_cos(cos) == text


def test_the_what_if_table_cell(tmp_path: Path) -> None:
    """A real RecurrentPPO run's what-if section: its stored row's cell as fmt_cos makes it, and cosines of 0.99995
    and 1 in it read '0.99995 / 1' (they read '1 / 1')."""
    from sb3_contrib import RecurrentPPO

    torch.set_num_threads(1)
    model = RecurrentPPO(
        "MlpLstmPolicy", "CartPole-v1", n_steps=32, batch_size=32, n_epochs=1, policy_kwargs={"lstm_hidden_size": 8}
    )
    with lstm_probe.ProbeCallback(tmp_path / "w.parquet", what_if=True) as probe:
        model.learn(64, callback=probe)
    data = lstm_probe.summarize(probe.path).what_if

    def cell() -> str:
        (table,) = [b for b in WhatIf().text(data, SB3) if isinstance(b, Table)]
        col = table.columns.index("grad cos π / V")
        (row,) = [r for r in table.rows if r[0] == "stored"]
        return row[col]

    stored = next(r for r in data.by_epoch if r["alternative"] == "stored")
    assert cell() == f"{fmt_cos(stored['grad_cos_policy'])} / {fmt_cos(stored['grad_cos_value'])}"
    stored.update(grad_cos_policy=0.99995, grad_cos_value=1.0)
    assert cell() == "0.99995 / 1"
    stored.update(grad_cos_policy=1 - 3e-9, grad_cos_value=0.9995)
    assert cell() == "1 - 3e-09 / 0.9995"
