"""The core's contract: provenance of every row, proven by the rollout/train oracle."""

import json
from datetime import datetime

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import probed_run

import lstm_probe
from lstm_probe.log.schema import COLUMN_NAMES, SCHEMA_VERSION

VARIANTS = [
    pytest.param("Pendulum-v1", {}, id="pendulum-1env"),
    pytest.param("Pendulum-v1", {"n_envs": 4}, id="pendulum-4env"),
    pytest.param("CartPole-v1", {}, id="cartpole-1env"),
    pytest.param("CartPole-v1", {"n_envs": 4}, id="cartpole-4env"),
    pytest.param("Pendulum-v1", {"shared_lstm": True}, id="shared-lstm"),
    pytest.param("CartPole-v1", {"critic_lstm": False}, id="no-critic-lstm"),
    pytest.param("Pendulum-v1", {"lstm_layers": 2, "n_envs": 2}, id="two-layers"),
]


def expected_modules(opts):
    if opts.get("shared_lstm") or opts.get("critic_lstm") is False:
        return {"actor"}
    return {"actor", "critic"}


@pytest.mark.parametrize("env_id,opts", VARIANTS)
def test_oracle_first_minibatch_equals_rollout(runs_dir, env_id, opts):
    """Before the first optimizer step of an update, recomputed train states == rollout states."""
    result = probed_run(runs_dir, env_id, **opts)
    df = lstm_probe.load(result.path)
    assert set(df["module"]) == expected_modules(opts)
    layers = opts.get("lstm_layers", 1)
    assert set(df["layer"]) == set(range(layers))
    roll = df[df.phase == "rollout"]
    train = df[(df.phase == "train") & ~df.padding]
    keys = ["module", "layer", "env", "env_step"]
    assert not roll.duplicated(keys).any()
    first = train[(train.epoch == 0) & (train.minibatch == 0)]
    iterations = sorted(roll.iteration.unique())
    assert sorted(first.iteration.unique()) == iterations  # every iteration has a first minibatch
    merged = first.merge(roll, on=keys, suffixes=("", "_r"), how="left", indicator=True)
    assert (merged["_merge"] == "both").all(), "every first-minibatch train row finds its rollout partner"
    for col in ("h", "c"):
        a = lstm_probe.states(merged, col)
        b = lstm_probe.states(merged.drop(columns=[col]).rename(columns={f"{col}_r": col}), col)
        assert (np.abs(a - b) <= 1e-5 * np.maximum(1.0, np.abs(b))).all()  # relative where |c| is large
    # the in-probe drift says the same
    assert first.drift_h.notna().all() and first.drift_h.max() < 1e-5 and first.drift_c.max() < 1e-5
    # later minibatches ran on moved weights: they differ
    later = train[(train.epoch > 0)]
    assert later.drift_h.max() > 1e-4
    # provenance is consistent: the train row's episode bookkeeping equals the rollout's
    m = train.merge(roll, on=keys, suffixes=("", "_r"))
    assert len(m) == len(train)
    assert (m.episode == m.episode_r).all() and (m.episode_start == m.episode_start_r).all()
    assert (m.episode_step.fillna(-1) == m.episode_step_r.fillna(-1)).all()


def test_both_train_paths_are_exercised_and_exact(runs_dir):
    """The one-call 'sequence' path recovers per-step c exactly; the 'stepwise' path is read directly."""
    result = probed_run(runs_dir, "Pendulum-v1", n_envs=4)
    df = lstm_probe.load(result.path, phase="train", vectors=False)
    assert {"sequence", "stepwise"} <= set(df["path"])
    first = df[(df.epoch == 0) & (df.minibatch == 0) & ~df.padding]
    for path in ("sequence", "stepwise"):
        rows = df[(df.path == path) & (df.epoch == 0) & ~df.padding]
        assert len(rows)
    assert first.drift_c.max() < 1e-5


def test_rollout_rows_and_counters(runs_dir):
    result = probed_run(runs_dir, "Pendulum-v1", n_envs=4)
    df = lstm_probe.load(result.path, vectors=False)
    roll = df[(df.phase == "rollout") & (df.module == "actor")]
    n_envs, n_steps = 4, 32
    per_env = 2 * n_steps  # learn(192) with 4 envs x 32 steps per rollout runs 2 full rollouts
    assert len(roll) == n_envs * per_env  # one row per env per rollout step
    assert sorted(roll.env.unique()) == [0, 1, 2, 3]
    for env in range(n_envs):
        r = roll[roll.env == env].sort_values("env_step")
        assert list(r.env_step) == list(range(per_env))
        assert list(r.episode_step) == list(range(per_env))  # no episode ends within 64 steps of Pendulum
        assert r.episode_start.tolist() == [True] + [False] * (per_env - 1)
        assert set(r.episode) == {0}
    # every rollout call has batch n_envs and one step
    assert (roll.groupby("call").size() == n_envs).all()
    assert set(roll.path) == {"step"}
    assert (roll.iteration == roll.env_step // 32).all()


def test_seed_question_one_env_pendulum(runs_dir):
    """With one env: rollout calls of batch 1, train calls with 2+ sequences, each explained by its rows."""
    result = probed_run(runs_dir, "Pendulum-v1", steps=256, n_steps=128, batch_size=128, n_epochs=2)
    df = lstm_probe.load(result.path, vectors=False)
    roll = df[df.phase == "rollout"]
    assert (roll.groupby("call").size() == 1).all()
    train = df[df.phase == "train"]
    seqs = train.groupby("call").seq.nunique()
    assert seqs.max() >= 2
    starts = train[(train.t == 0)].drop_duplicates(["iteration", "epoch", "minibatch", "seq"])
    assert set(starts.seq_reason) <= {"split", "episode_start", "env_boundary", "minibatch_cut"}
    assert starts.seq_reason.notna().all()
    # Pendulum truncates at 200 steps: the second iteration holds an episode start at env_step 200
    it1 = starts[starts.iteration == 1]
    assert (it1[it1.seq_reason == "episode_start"].env_step == 200).all()
    assert 200 in set(it1.env_step)
    # unpadded lengths of a minibatch's sequences add up to the minibatch size
    sizes = starts.groupby(["iteration", "epoch", "minibatch"]).seq_len.sum()
    assert (sizes == 128).all()


def test_bootstrap_rows(runs_dir):
    result = probed_run(runs_dir, "Pendulum-v1", steps=256, n_steps=128, batch_size=128, n_epochs=2)
    df = lstm_probe.load(result.path)
    boot = df[df.phase == "bootstrap"].sort_values("call")
    assert list(boot.bootstrap) == ["last", "terminal", "last"]
    assert list(boot.env_step) == [128, 200, 256]
    assert list(boot.episode_step) == [128, 200, 56]
    assert list(boot.episode) == [0, 0, 1]
    assert set(boot.module) == {"critic"}
    # the 'last' value call evaluates the observation the next rollout starts from, with the weights
    # of before the update: the same (env, env_step) as the next rollout's first critic row
    nxt = df[(df.phase == "rollout") & (df.module == "critic") & (df.env_step == 128)]
    assert len(nxt) == 1 and nxt.iteration.iloc[0] == 1 and boot.iteration.iloc[0] == 0


def test_metadata_and_plain_pandas(runs_dir):
    result = probed_run(runs_dir, "CartPole-v1")
    df = pd.read_parquet(result.path)  # no lstm_probe needed
    assert list(df.columns) == COLUMN_NAMES
    assert len(df) == result.rows
    meta = pq.ParquetFile(result.path).schema_arrow.metadata
    assert int(meta[b"lstm_probe.schema_version"]) == SCHEMA_VERSION
    run = json.loads(meta[b"lstm_probe.run"])
    assert run["env_id"] == "CartPole-v1" and run["n_envs"] == 1 and run["seed"] == 0
    assert run["hyperparameters"]["n_steps"] == 32 and run["hyperparameters"]["batch_size"] == 16
    assert run["architecture"]["modules"]["actor"]["hidden_size"] == 16
    assert run["architecture"]["critic"] == "lstm"
    info = lstm_probe.read_info(result.path)
    assert info.completed and info.metadata["end_time"] and info.rows == len(df)
    # to the millisecond: the Run section's wall of a run under a second read "0 s"
    start, end = (datetime.fromisoformat(info.metadata[k]) for k in ("start_time", "end_time"))
    assert start.microsecond % 1000 == 0 and lstm_probe.summarize(result.path).run.wall_seconds == pytest.approx(
        (end - start).total_seconds()
    )
    assert 0 < (end - start).total_seconds() < 600 and "." in info.metadata["end_time"]
    assert info.metadata["versions"]["sb3_contrib"]
    # floats byte-stream-split, integers delta-encoded (standard Parquet encodings; ~25% smaller logs)
    group = pq.ParquetFile(result.path).metadata.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
    for column in ("h.list.element", "c.list.element", "h_norm", "drift_c"):
        assert "BYTE_STREAM_SPLIT" in encodings[column], column
    for column in ("call", "env_step", "episode_step"):
        assert "DELTA_BINARY_PACKED" in encodings[column], column


def test_hidden_state_shapes(runs_dir):
    result = probed_run(runs_dir, "Pendulum-v1", n_envs=2)
    df = lstm_probe.load(result.path, phase="rollout")
    h = lstm_probe.states(df, "h")
    assert h.shape == (len(df), 16) and h.dtype == np.float32
    assert np.allclose(np.linalg.norm(h, axis=1), df.h_norm, rtol=1e-5)


@pytest.mark.parametrize("env_cls,policy", [("TinyImageEnv", "CnnLstmPolicy"), ("TinyDictEnv", "MultiInputLstmPolicy")])
def test_policy_follows_observation_space_and_oracle_holds(tmp_path, env_cls, policy):
    import gymnasium as gym
    import tiny_envs

    from lstm_probe import run

    env_id = f"{env_cls}-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=getattr(tiny_envs, env_cls))
    result = run(env_id, tmp_path / "t.parquet", steps=64, n_steps=32, batch_size=16, n_epochs=2, hidden_size=8)
    info = lstm_probe.read_info(result.path)
    assert info.metadata["architecture"]["modules"]["actor"]["hidden_size"] == 8
    assert (
        info.metadata["policy"]
        == {
            "CnnLstmPolicy": "RecurrentActorCriticCnnPolicy",
            "MultiInputLstmPolicy": "RecurrentMultiInputActorCriticPolicy",
        }[policy]
    )
    df = lstm_probe.load(result.path, vectors=False)
    first = df[(df.phase == "train") & ~df.padding & (df.epoch == 0) & (df.minibatch == 0)]
    assert len(first) and first.drift_h.max() < 1e-5 and first.drift_c.max() < 1e-5


def test_run_leaves_no_sb3_logger_directory(tmp_path, monkeypatch):
    """sb3 makes an empty SB3-<time> directory in the temp dir on every learn(); `lstm-probe run` does not."""
    import tempfile

    from sb3_contrib import RecurrentPPO

    from lstm_probe import run

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.delenv("SB3_LOGDIR", raising=False)  # conftest points it elsewhere
    RecurrentPPO("MlpLstmPolicy", "CartPole-v1", n_steps=16, batch_size=16, n_epochs=1).learn(16)
    assert len(list(scratch.glob("SB3-*"))) == 1  # what plain sb3 leaves behind
    run("CartPole-v1", tmp_path / "r.parquet", steps=32, n_steps=16, batch_size=16, n_epochs=1, hidden_size=8)
    assert len(list(scratch.glob("SB3-*"))) == 1
