"""Whether dropout acted (the log's ``training_mode``) rides every part as the live records do
(``metadata_keys.LIVE_KEYS``): published at each new iteration's first call where it changed, so that a run killed
with SIGKILL keeps the counts of its finished iterations, and its report names which calls ran in training mode
instead of assuming that dropout acted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

import lstm_probe
from lstm_probe.log.reader import read_info, writing
from lstm_probe.log.writer import META_FINAL_KEY
from tests.test_reliability import wait_for

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ROLLOUT = 32  # env steps per iteration (one env)

SCRIPT = f"""
import sys, torch
from sb3_contrib import RecurrentPPO
from lstm_probe.integrations.sb3 import ProbeCallback
torch.set_num_threads(1)
kwargs = {{"lstm_hidden_size": 8, "n_lstm_layers": 2, "lstm_kwargs": {{"dropout": 0.2}}}}
model = RecurrentPPO("MlpLstmPolicy", "CartPole-v1", n_steps={ROLLOUT}, batch_size={ROLLOUT}, n_epochs=1,
                     policy_kwargs=kwargs, seed=0)
model.learn(10**7, callback=ProbeCallback(sys.argv[1], part_seconds=0.2, capture="summary"))
"""


def _last_part_modes(out: Path) -> dict[str, Any] | None:
    """The training_mode the newest finished part carries (None: none yet)."""
    for part in sorted(out.glob("part-*.parquet"), reverse=True):
        try:
            kv = pq.ParquetFile(part).metadata.metadata or {}
        except OSError:  # (renamed into place whole: only a vanished file)
            continue
        return json.loads(kv.get(META_FINAL_KEY, b"{}")).get("training_mode")
    return None


def test_a_killed_run_keeps_its_training_mode(tmp_path: Path) -> None:
    """sb3-contrib RecurrentPPO (2 layers, dropout 0.2) rolls out in eval mode and trains in training mode; killed
    once a part carries the counts of two iterations: the log keeps them as the last part had them (each iteration's
    32 rollout calls and its value bootstrap in eval mode, its train calls in training mode), and the report's
    dropout cause names them."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, f"{out}/"],
        cwd=tmp_path,
        env={**ENV, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def two_iterations() -> bool:
            assert proc.poll() is None, proc.communicate()
            held = _last_part_modes(out)
            return held is not None and held["actor"].get("rollout", [0, 0])[1] >= 2 * ROLLOUT

        wait_for(two_iterations, "no part carried two iterations' training_mode")
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -9
    wait_for(lambda: writing(out) is None, "the writer process never published the killed run's last part")
    last = _last_part_modes(out)  # the last part's: what the reader takes
    assert last is not None
    info = read_info(out)
    assert not info.metadata["completed"]
    modes = info.metadata["training_mode"]
    assert modes == last
    # published at an iteration's first rollout call: whole iterations, each in its own mode
    iterations = modes["actor"]["rollout"][1] // ROLLOUT
    assert iterations >= 2
    trained = modes["actor"]["train"][1]
    assert modes == {
        "actor": {"rollout": [0, ROLLOUT * iterations], "train": [trained, trained]},
        "critic": {"rollout": [0, ROLLOUT * iterations], "bootstrap": [0, iterations], "train": [trained, trained]},
    }
    said = lstm_probe.summarize(out).staleness.provenance_dropout
    assert said is not None and said.startswith(
        f"dropout between the LSTM layers (nn.LSTM dropout: actor 0.2, critic 0.2; in rollout, 0 of "
        f"{2 * ROLLOUT * iterations:,} calls in training mode; in train, {2 * trained:,} of {2 * trained:,} calls in "
        "training mode)"
    ), said
