"""A multi-process log's ``training_mode`` (whether dropout acted, per module, per phase) adds up each writing
process's counts: RLlib's env runners count the rollout calls, the learner the train calls (``log/shards.py``).

RLlib's LSTM takes no dropout (its ``RecurrentEncoderConfig`` builds ``nn.LSTM`` of one layer without a dropout
argument, and ``DefaultModelConfig`` has none), so no RLlib run records ``training_mode``: the log is a real tiny
multi-process RLlib run's (an env runner actor and the learner), each shard's last part given the entry its process
would write."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytest.importorskip("ray.rllib")

from lstm_probe.log.reader import read_info
from lstm_probe.log.shards import shard_of
from lstm_probe.log.writer import META_FINAL_KEY

pytestmark = pytest.mark.rllib


def _rllib_run(out: Path) -> None:
    """Two iterations of PPO with an LSTM, one env runner actor (its own process and shard) and the learner in the
    driver; ray started here and shut down after (as tests/test_rllib_trend.py does)."""
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from lstm_probe.integrations import rllib

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1, rollout_fragment_length=32, num_envs_per_env_runner=1)
        .training(train_batch_size_per_learner=32, minibatch_size=32, num_epochs=1)
        .rl_module(model_config=DefaultModelConfig(use_lstm=True, max_seq_len=8, lstm_cell_size=8))
        .debugging(seed=0)
    )
    rllib.probe_config(config, f"{out}/")
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", num_cpus=2)
    try:
        algo = config.build_algo()
        try:
            for _ in range(2):
                algo.train()
            rllib.close(algo)
        finally:
            algo.stop()
    finally:
        ray.shutdown()


def _give(part: Path, training_mode: dict) -> None:
    """The shard's last part (its final metadata) with the ``training_mode`` its process would write."""
    pf = pq.ParquetFile(part)
    table = pf.read()
    meta = dict(table.schema.metadata or {})
    final = json.loads((pf.metadata.metadata or {})[META_FINAL_KEY])
    meta[META_FINAL_KEY] = json.dumps({**final, "training_mode": training_mode}).encode()
    pq.write_table(table.replace_schema_metadata(meta), part)


def test_training_mode_adds_up_over_the_writing_processes(tmp_path: Path) -> None:
    out = tmp_path / "log"
    _rllib_run(out)
    last = {shard_of(p): p for p in sorted(out.glob("part-*.parquet"))}
    assert set(last) == {"runner1", "learner0"}
    info = read_info(out)
    assert info.metadata["completed"] and "training_mode" not in info.metadata
    _give(last["runner1"], {"actor": {"rollout": [64, 64]}})
    _give(last["learner0"], {"actor": {"train": [0, 8]}})
    assert read_info(out).metadata["training_mode"] == {"actor": {"rollout": [64, 64], "train": [0, 8]}}
    # the same module's counts of one phase from two processes: added (an evaluation runner's own phase apart)
    _give(last["runner1"], {"actor": {"rollout": [64, 64], "train": [1, 2]}, "other": {"predict": [0, 3]}})
    assert read_info(out).metadata["training_mode"] == {
        "actor": {"rollout": [64, 64], "train": [1, 10]},
        "other": {"predict": [0, 3]},
    }
