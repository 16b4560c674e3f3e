"""RLlib on Ray: real PPO (use_lstm=True) on CartPole-v1 with a tiny model, locally and with Ray actors.

The oracle, RLlib's version: every learner chunk that continues an episode starts from exactly the
state the env runner produced one step earlier (rows with t = -1, joined across the processes' part
files by worker, env and env step), and before the first optimizer step the learner recomputes the
actor's rollout states of the same weights version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("ray.rllib")

import lstm_probe
from lstm_probe.integrations import rllib

pytestmark = pytest.mark.rllib

SMALL = dict(n_envs=2, n_steps=32, batch_size=32, n_epochs=2, hidden_size=16, max_seq_len=8, seed=0)
KEYS = ["module", "layer", "worker", "env", "env_step"]
KEYS_R = ("iteration", "episodes", "return_sum", "return_min", "return_max", "length_sum")


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    import ray

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rllib") / "cp/"
    # one iteration per part file (part_iterations=1): every test below reads the log across them
    rllib.run("CartPole-v1", f"{out}/", steps=192, shared_lstm=False, part_iterations=1, **SMALL)
    return out


def test_an_updates_training_calls_cross_the_writer_pipe_together(tmp_path: Path, monkeypatch) -> None:
    """The local learner batches an update's training calls (``LearnerProbe.new_update``): one message crosses
    the writer pipe an update, not one per call."""
    from tests.transfers import pipe_sends

    seen = pipe_sends(monkeypatch)
    rllib.run("CartPole-v1", f"{tmp_path}/cp/", steps=128, shared_lstm=False, **SMALL)
    updates = lstm_probe.load(tmp_path / "cp", columns=["phase", "iteration"], vectors=False)
    updates = updates[updates["phase"] == "train"]["iteration"].nunique()
    assert updates >= 2 and seen["train"] >= 2 * updates, (seen, updates)
    assert seen["train_sends"] <= updates, (seen, updates)


def test_part_files_hold_one_iteration_each(local_run: Path) -> None:
    import pyarrow.parquet as pq

    seen: dict[str, set[int]] = {}
    for part in sorted(local_run.glob("part-*.parquet")):
        its = set(pq.read_table(part, columns=["iteration"]).column("iteration").drop_null().to_pylist())
        assert len(its) <= 1, (part.name, its)
        shard = part.name.rsplit("-", 1)[0]
        assert not its & seen.get(shard, set()) or its <= {max(seen[shard])}, part.name  # in iteration order
        seen.setdefault(shard, set()).update(its)
    assert len(seen) >= 2 and all(len(v) == 3 for v in seen.values())  # env runner and learner, 3 iterations


def _vectors(col: pd.Series) -> np.ndarray:
    return np.stack(col.to_numpy())


def _pairs(df: pd.DataFrame, sel: pd.DataFrame) -> pd.DataFrame:
    roll = df[df["phase"] == "rollout"]
    assert not roll.duplicated(KEYS).any(), "two rollout rows for one (module, layer, worker, env, env_step)"
    return sel.merge(roll, on=KEYS, suffixes=("", "_r"))


def test_chunks_start_from_the_env_runners_stored_states(local_run: Path) -> None:
    df = lstm_probe.load(local_run)
    start = df[(df["t"] == -1) & ~df["padding"]]
    continuing = start[start["env_step"].notna()]
    assert len(continuing) > 20
    for module in ("actor", "critic"):
        m = _pairs(df, continuing[continuing["module"] == module])
        assert len(m) == (continuing["module"] == module).sum(), "every continuing chunk finds its rollout row"
        assert np.abs(_vectors(m["h"]) - _vectors(m["h_r"])).max() == 0.0
        assert np.abs(_vectors(m["c"]) - _vectors(m["c_r"])).max() == 0.0
        # the partner is the step before the chunk's first step, in the same episode
        assert (m["episode"] == m["episode_r"]).all()
    fresh = start[start["env_step"].isna()]
    assert len(fresh) and (fresh["h_norm"] == 0).all() and (fresh["c_norm"] == 0).all()
    assert set(fresh["seq_reason"]) == {"episode_start"}
    assert set(continuing["seq_reason"]) <= {"env_boundary", "max_seq_len"}


def test_actor_recomputed_before_the_first_step_equals_rollout(local_run: Path) -> None:
    df = lstm_probe.load(local_run)
    first = df[(df["phase"] == "train") & (df["minibatch"] == 0) & (df["t"] >= 0) & df["env"].notna()]
    m = _pairs(df, first[first["module"] == "actor"])
    m = m[m["iteration"] == m["iteration_r"]]
    assert len(m) > 20
    assert np.abs(_vectors(m["h"]) - _vectors(m["h_r"])).max() < 1e-5
    assert np.abs(_vectors(m["c"]) - _vectors(m["c_r"])).max() < 1e-5
    # the same rows with the wrong env step are far apart: the check can fail
    shifted = first[first["module"] == "actor"].assign(env_step=lambda d: d["env_step"] + 1)
    s = _pairs(df, shifted)
    assert np.abs(_vectors(s["h"]) - _vectors(s["h_r"])).max() > 1e-2


def test_rows_match_what_rllib_did(local_run: Path) -> None:
    df = lstm_probe.load(local_run, vectors=False)
    info = lstm_probe.read_info(local_run)
    assert info.metadata["framework"] == "rllib"
    # the training settings in one place (hyperparameters); the rllib block holds RLlib's layout alone
    assert info.metadata["rllib"] == {
        "env_runners": 0,
        "learners": 0,
        "envs_per_env_runner": 2,
        "lstm_cell_size": 16,
        "vf_share_layers": False,
    }
    assert info.metadata["hyperparameters"]["max_seq_len"] == info.metadata["capabilities"]["max_seq_len"] == 8
    assert lstm_probe.summarize(local_run).capabilities.max_seq_len == 8
    assert set(info.metadata["shards"]) == {"runner0", "learner0"}
    cost = info.metadata["probe_cost"]  # summed over the shards
    assert 0 < cost["integration_seconds"] < cost["seconds"] and 0 < cost["hook_seconds"] < cost["seconds"]
    roll = df[df["phase"] == "rollout"]
    acted = roll[roll["bootstrap"].isna()]
    # one fragment of 32 steps per env per iteration (RLlib stops at >= 64 env steps, counting acted steps
    # only, so an env may act once more while the other makes its extra pass on a terminal observation)
    per_iter = acted.groupby(["iteration", "module"]).size().unstack()
    assert (per_iter["actor"] == per_iter["critic"]).all()
    assert per_iter["actor"].between(64, 65).all() and len(per_iter) == 3
    # episodes are numbered per env and their steps run 0, 1, 2, ... without gaps
    for _, ep in acted[acted["module"] == "actor"].groupby(["env", "episode"]):
        steps = np.sort(ep["episode_step"].to_numpy())
        assert (steps == np.arange(steps[0], steps[0] + len(steps))).all()
    # the value pass sees every acted step of its iteration once, plus one appended step per episode chunk
    value = df[(df["phase"] == "value") & (df["t"] >= 0) & ~df["padding"]]
    for it, g in value.groupby("iteration"):
        real = g[g["bootstrap"].isna()]
        assert len(real) == per_iter.loc[it, "critic"], it
        assert len(g) - len(real) == len(g[g["bootstrap"].notna()].groupby(["worker", "env", "episode"]))
    train = df[(df["phase"] == "train") & (df["t"] >= 0)]
    assert train["epoch"].isna().all() and train["learner"].eq(0).all()
    assert (train["seq_len"] <= 8).all() and (train["t"] < 8).all()
    assert (train.loc[train["padding"], "env"].isna()).all()
    assert roll["learner"].isna().all() and roll["worker"].eq(0).all()


def test_report_prints_the_cross_process_check(local_run: Path) -> None:
    from test_report import same

    report = lstm_probe.summarize(local_run)
    # read one iteration at a time (the report's memory bound), episodes across iterations: the same report
    same(lstm_probe.summarize(local_run, chunk_rows=1).to_dict(), report.to_dict())
    x = report.cross_process
    assert x is not None
    assert x.state_in_ok is True and x.zero_starts_ok is True and x.unpaired == 0
    assert max(r["max_drift_h"] for r in x.first_pass if r["module"] == "actor") < 1e-4
    assert any(f.startswith("RLlib oracle:") and "OK" in f for f in report.findings)
    train = lstm_probe.load(local_run, phase="train", vectors=False)
    pairs = train[["iteration", "minibatch"]].drop_duplicates()
    assert report.calls.minibatches == len(pairs)
    for _, g in pairs.groupby("iteration"):  # numbered 0, 1, ... within each update
        assert sorted(g["minibatch"]) == list(range(len(g)))
    # RLlib cycles minibatches through the batch: at least epochs x batch / minibatch of them
    assert (pairs.groupby("iteration").size() >= 2 * 64 // 32).all()
    assert not any("FAILED" in w for w in report.warnings)
    # vf_share_layers=False on the new API stack: two towers, each trained by one loss only
    flow = report.architecture.gradient_flow
    assert flow and all(
        v == ("policy" if k.startswith(("encoder.actor_encoder.", "pi.")) else "value") for k, v in flow.items()
    )
    assert any(k.startswith("encoder.critic_encoder.tokenizer") for k in flow)  # not shared, unlike the old stack
    assert report.architecture.shared_lstm is False


def test_the_hyperparameters_are_rllibs_config(local_run: Path) -> None:
    """The log records the AlgorithmConfig's training settings under ``hyperparameters`` (as sb3's, rsl_rl's and
    TorchRL's logs do theirs), read from the config, and the Run panel shows them (it had no hyperparameters line)."""
    from ray.rllib.algorithms.ppo import PPOConfig

    from lstm_probe.report.sections.run import Run

    hp = lstm_probe.read_info(local_run).metadata["hyperparameters"]
    default = PPOConfig()
    fragment, envs = SMALL["n_steps"], SMALL["n_envs"]
    assert hp == {
        "rollout_fragment_length": fragment,
        "train_batch_size_per_learner": fragment * envs,
        "minibatch_size": SMALL["batch_size"],
        "num_epochs": SMALL["n_epochs"],
        "max_seq_len": SMALL["max_seq_len"],
        **{k: getattr(default, k) for k in ("lr", "gamma", "clip_param", "vf_clip_param", "entropy_coeff")},
        **{k: getattr(default, k) for k in ("vf_loss_coeff", "grad_clip", "use_kl_loss", "kl_coeff", "kl_target")},
        "lambda": default.lambda_,
    }
    report = lstm_probe.summarize(local_run)
    (panel,) = Run().text(report.run, report.capabilities)
    assert (
        f"hyperparameters: rollout_fragment_length={fragment}, train_batch_size_per_learner={fragment * envs}, "
        f"minibatch_size={SMALL['batch_size']}, num_epochs={SMALL['n_epochs']}, max_seq_len={SMALL['max_seq_len']}, "
        f"lr={default.lr:g}, gamma={default.gamma:g}, lambda={default.lambda_:g}, clip_param={default.clip_param:g}"
    ) in panel.lines


def test_probe_does_not_change_training(tmp_path: Path) -> None:
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    def final(probed: bool) -> dict[str, torch.Tensor]:
        config = (
            PPOConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=0, rollout_fragment_length=32, num_envs_per_env_runner=2)
            .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=2)
            .rl_module(model_config=DefaultModelConfig(use_lstm=True, max_seq_len=8, lstm_cell_size=16))
            .debugging(seed=0)
        )
        if probed:
            rllib.probe_config(config, f"{tmp_path}/log/")
        algo = config.build_algo()
        for _ in range(2):
            algo.train()
        if probed:
            assert rllib.close(algo) == 2
        state = {k: v.clone() for k, v in algo.learner_group._learner.module["default_policy"].state_dict().items()}
        algo.stop()
        return state

    torch.set_num_threads(1)
    plain, probed = final(False), final(True)
    assert plain.keys() == probed.keys()
    assert all(torch.equal(plain[k], probed[k]) for k in plain)
    # vf_share_layers=True (the default): one LSTM, traced as 'actor'; its chunks start from stored states
    report = lstm_probe.summarize(tmp_path / "log")
    assert report.cross_process is not None and report.cross_process.state_in_ok is True
    assert set(report.architecture.modules) == {"actor"}
    flow = report.architecture.gradient_flow
    assert {v for k, v in flow.items() if k.startswith("encoder.encoder.lstm.")} == {"both"}
    assert {flow[k] for k in flow if k.startswith("pi.")} == {"policy"}
    assert {flow[k] for k in flow if k.startswith("vf.")} == {"value"}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "lstm_probe", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def test_cli_with_ray_actors(tmp_path: Path) -> None:
    """One remote env runner and one remote learner, through the CLI; each writes its own part files."""
    r = _cli(
        "run",
        "CartPole-v1",
        "--framework",
        "rllib",
        "--env-runners",
        "1",
        "--learners",
        "1",
        "--steps",
        "128",
        "--n-envs",
        "2",
        "--n-steps",
        "32",
        "--batch-size",
        "32",
        "--n-epochs",
        "2",
        "--hidden-size",
        "16",
        "--max-seq-len",
        "8",
        "--out",
        "cp/",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "wrote" in r.stdout and "lstm-probe report cp/" in r.stdout
    names = sorted(p.name for p in (tmp_path / "cp").glob("part-*.parquet"))
    assert names and {n.split("-")[1] for n in names} == {"runner1", "learner0"}
    rep = _cli("report", "cp/", "--json", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout)
    x = doc["cross_process"]
    assert x["state_in_ok"] is True and x["zero_starts_ok"] is True and x["unpaired"] == 0
    assert doc["run"]["framework"] == "rllib" and doc["run"]["completed"] is True
    df = lstm_probe.load(tmp_path / "cp", vectors=False)
    assert set(df.loc[df["phase"] == "rollout", "worker"]) == {1}
    # load(worker=...): one env runner's rows (each runner's envs are 0..N-1 of its own)
    runner = lstm_probe.load(tmp_path / "cp", worker=1, env=0, vectors=False)
    assert len(runner) == ((df["worker"] == 1) & (df["env"] == 0)).sum() > 0
    assert set(df.loc[df["phase"] == "train", "learner"]) == {0}
    # call ids are unique across processes: learner ids live in their own block
    assert df.loc[df["phase"] == "train", "call"].min() >= rllib.LEARNER_BLOCK * rllib.CALL_BLOCK


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "x.parquet"], "end --out with '/'"),
        (["--learners", "2"], "--learners above 1"),
        (["--lstm-layers", "2"], "--lstm-layers applies to --framework sb3 only"),
        (["--framework", "tf"], "--framework must be sb3 or rllib"),
        (["--n-epochs", "0"], "--n-epochs must be >= 1, got 0"),
        (["--max-seq-len", "0"], "--max-seq-len must be >= 1, got 0"),
    ],
)
def test_cli_rllib_bad_options(tmp_path: Path, args: list[str], message: str) -> None:
    base = ["run", "CartPole-v1"] + ([] if "--framework" in args else ["--framework", "rllib"])
    r = _cli(*base, *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_pair_and_html_read_rllib_logs(local_run: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from lstm_probe.report.html import build_html

    p = lstm_probe.pair(local_run, phase="value")
    assert len(p) and "worker" in p.columns
    starts = p[p["t"] == -1]
    assert len(starts) and starts["max_abs_h"].max() == 0.0 and starts["max_abs_c"].max() == 0.0
    page = build_html(local_run, tmp_path / "r.html")
    assert {"Minibatch layout", "Hidden and cell states"} <= set(page.figures)
    assert any("env runner 0" in n for n in page.notes)


LONG = ["run", "CartPole-v1", "--framework", "rllib", "--steps", "1000000", "--n-envs", "2", "--n-steps", "32"]
LONG += ["--batch-size", "32", "--n-epochs", "1", "--hidden-size", "8", "--max-seq-len", "8", "--part-seconds", "0.3"]


def _start_long(tmp_path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "lstm_probe", *LONG, "--out", "cp/"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the SIGKILL test kills Ray's helpers with it
    )


def _wait_for_shards(log: Path, names: set[str], timeout: float = 240) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if {p.name.split("-")[1] for p in log.glob("part-*.parquet")} >= names:
            return
        time.sleep(0.1)
    raise AssertionError(f"no part files from {names} in {log}")


def test_ctrl_c_closes_every_process_log(tmp_path: Path) -> None:
    import signal

    proc = _start_long(tmp_path)
    _wait_for_shards(tmp_path / "cp", {"runner0", "learner0"})
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    info = lstm_probe.read_info(tmp_path / "cp")
    assert not info.completed and info.rows > 0
    assert all(not s["completed"] for s in info.metadata["shards"].values())
    assert not list((tmp_path / "cp").glob(".*.tmp"))  # every open part was published at the close
    report = lstm_probe.summarize(tmp_path / "cp")
    assert any("did not complete" in w for w in report.warnings)


def test_a_run_that_fails_mid_training_ends_every_process_log_the_same_way(tmp_path: Path) -> None:
    """The stop reason every framework's log gives a failed run (tests/test_life.py), in each process's shard."""

    def progress(done: int, total: int) -> None:
        raise RuntimeError("training broke after the first iteration\nand a second line the log never shows")

    with pytest.raises(RuntimeError, match="training broke"):
        rllib.run("CartPole-v1", f"{tmp_path}/cp/", steps=192, progress=progress, **SMALL)
    info = lstm_probe.read_info(tmp_path / "cp")
    assert not info.completed and info.rows > 0
    assert info.metadata["stop_reason"] == "RuntimeError: training broke after the first iteration"
    assert {"runner0", "learner0"} <= set(info.metadata["shards"])
    assert all(not s["completed"] for s in info.metadata["shards"].values())


def test_sigkill_leaves_readable_shards(tmp_path: Path) -> None:
    proc = _start_long(tmp_path)
    _wait_for_shards(tmp_path / "cp", {"runner0", "learner0"})
    import signal

    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    # Ray's worker processes are not in the driver's process group: each notices the driver is gone and
    # exits, and until then its shard's lock says the log is still being written (as it should)
    from lstm_probe.log.reader import writing

    deadline = time.monotonic() + 120
    while writing(tmp_path / "cp") is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert writing(tmp_path / "cp") is None, "a Ray worker kept writing the log 120 s after the driver was killed"
    info = lstm_probe.read_info(tmp_path / "cp")
    assert not info.completed and info.rows > 0
    assert "never closed" in info.metadata["stop_reason"]
    df = lstm_probe.load(tmp_path / "cp", vectors=False)
    assert len(df) == info.rows
    # what was published is whole: every learner call has all its rows (sequences x (steps + initial row))
    train = df[(df["phase"] == "train")]
    per_call = train.groupby(["call", "module"]).agg(
        rows=("t", "size"), seqs=("seq", "nunique"), steps=("t", "nunique")
    )
    assert (per_call["rows"] == per_call["seqs"] * per_call["steps"]).all()
    report = lstm_probe.summarize(tmp_path / "cp")
    assert report.cross_process is not None and report.cross_process.state_in_ok is not False


@pytest.mark.parametrize("shared", [False, True])
def test_arch_command_for_rllib(tmp_path: Path, shared: bool) -> None:
    r = _cli(
        "arch",
        "CartPole-v1",
        "--framework",
        "rllib",
        "--hidden-size",
        "8",
        "--json",
        *(["--shared-lstm"] * shared),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    flow = doc["gradient_flow"]
    if shared:
        assert set(doc["modules"]) == {"actor"}
        assert {v for k, v in flow.items() if k.startswith("encoder.encoder.")} == {"both"}
        assert "share one LSTM" in doc["verdict"]
    else:
        assert set(doc["modules"]) == {"actor", "critic"}
        assert {v for k, v in flow.items() if k.startswith("encoder.critic_encoder.")} == {"value"}
        assert {v for k, v in flow.items() if k.startswith("encoder.actor_encoder.")} == {"policy"}
    assert {flow[k] for k in flow if k.startswith("pi.")} == {"policy"}
    assert doc["shapes"]["encoder." + ("encoder" if shared else "actor_encoder") + ".lstm.weight_hh_l0"] == [32, 8]


@pytest.fixture(scope="module")
def runners_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict], int]:
    """Two remote env runners (each its own writer process and part files) and one evaluation runner, three
    iterations; RLlib's own per-iteration metrics of the training runners' episodes kept."""
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("rllib-runners")
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_env_runners=2, num_cpus_per_env_runner=0.5, rollout_fragment_length=16, num_envs_per_env_runner=2
        )
        .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=1)
        .rl_module(model_config=DefaultModelConfig(use_lstm=True, max_seq_len=8, lstm_cell_size=8))
        .evaluation(evaluation_interval=1, evaluation_num_env_runners=1, evaluation_duration=2)
        .debugging(seed=0)
    )
    rllib.probe_config(config, f"{out}/log/")
    algo = config.build_algo()
    try:
        results = [algo.train() for _ in range(3)]
        closed = rllib.close(algo)
    finally:
        algo.stop()
    return out / "log", results, closed


def test_evaluation_runners_get_their_own_shard(runners_run) -> None:
    log, _, closed = runners_run
    assert closed == 4  # two training runners, the learner, the evaluation runner
    shards = {p.name.split("-")[1] for p in log.glob("part-*.parquet")}
    assert shards == {"runner1", "runner2", "learner0", "evalrunner1"}
    df = lstm_probe.load(log, vectors=False)
    evaluation = df[df["worker"] == rllib.EVAL_WORKER + 1]
    assert len(evaluation) and set(evaluation["phase"]) == {"predict"}
    assert set(df.loc[df["phase"] == "rollout", "worker"]) == {1, 2}
    assert lstm_probe.summarize(log).cross_process.state_in_ok is True


def test_returns_of_several_runners_are_rllibs_metrics(runners_run) -> None:
    """Each runner's record (``by_shard``) holds RLlib's own figures of its episodes, and the report adds them up:
    RLlib's per-iteration episodes, min and max; its mean is the mean of the runners' means (RLlib's
    ``MeanStats`` merge), the report's the mean of the iteration's episodes. The evaluation runner's episodes are
    not training returns, and its rows' later weights version is not a training iteration."""
    from lstm_probe.log.reader import read_info

    log, results, _ = runners_run
    record = read_info(log).metadata["returns"]
    assert set(record["by_shard"]) == {"runner1", "runner2", "evalrunner1"}
    assert record["by_shard"]["evalrunner1"]["evaluation"] is True  # counted apart (tests/test_rllib_trend.py)
    shards = [
        {it: (n, s, lo, hi, ln) for it, n, s, lo, hi, ln in zip(*(r["by_iteration"][k] for k in KEYS_R), strict=True)}
        for name, r in record["by_shard"].items()
        if name != "evalrunner1"
    ]
    returns = lstm_probe.summarize(log).returns
    by = returns.by_iteration
    ours = {it: i for i, it in enumerate(by["iteration"])}
    ended = 0
    for it, result in enumerate(results):
        r = result["env_runners"]
        if not int(r.get("num_episodes", 0)):
            assert it not in ours
            continue
        mine = [s[it] for s in shards if it in s]
        i = ours.pop(it)
        assert by["episodes"][i] == int(r["num_episodes"]) == sum(m[0] for m in mine)
        assert (by["return_min"][i], by["return_max"][i]) == (r["episode_return_min"], r["episode_return_max"])
        assert by["return_mean"][i] == pytest.approx(sum(m[1] for m in mine) / by["episodes"][i], rel=1e-12)
        means = [m[1] / m[0] for m in mine]
        assert sum(means) / len(means) == pytest.approx(r["episode_return_mean"], rel=1e-12)
        assert sum(m[4] / m[0] for m in mine) / len(mine) == pytest.approx(r["episode_len_mean"], rel=1e-12)
        ended += 1
    assert not ours and ended >= 2 and any(len([s for s in shards if it in s]) == 2 for it in range(3))
    assert returns.episodes == results[-1]["env_runners"]["num_episodes_lifetime"]
    evaluated = sum(int(r["evaluation"]["env_runners"].get("num_episodes", 0)) for r in results)
    assert evaluated >= 2 and returns.evaluation["episodes"] == evaluated  # none of them counted above
    # the run's three training iterations: the evaluation runner's rows run one weights version further (3)
    assert returns.iterations == 3 and returns.last_tenth.first == 2 and returns.last_tenth.episodes


def test_the_gradient_flow_runs_on_a_copy_in_training_mode_and_never_calls_the_users_module(monkeypatch) -> None:
    """The learner's architecture record is measured on a private copy: the user's hooks and wrappers never
    see its synthetic batch, the user's module keeps its mode and the RNGs stay as they were; the copy runs
    in training mode, as RLlib's learner runs the module (cuDNN has no RNN backward in eval mode)."""
    import gymnasium as gym
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    import lstm_probe.integrations.rllib.model as model

    env = gym.make("CartPole-v1")
    config = PPOConfig().environment("CartPole-v1")
    config = config.rl_module(model_config=DefaultModelConfig(use_lstm=True, lstm_cell_size=8, vf_share_layers=False))
    module = config.get_rl_module_spec(env=env).build()
    env.close()
    module.eval()
    calls: list[str] = []
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.LSTM):
            m.register_forward_hook(lambda *_, name=name: calls.append(name))
    users = module.forward_train
    module.forward_train = lambda batch, **kw: (calls.append("forward_train"), users(batch, **kw))[1]
    seen = []
    measured = model._measured

    def spy(copy, shape, device):
        seen.append({name: m.training for name, m in copy.named_modules() if isinstance(m, torch.nn.LSTM)})
        return measured(copy, shape, device)

    monkeypatch.setattr(model, "_measured", spy)
    rng = torch.get_rng_state()
    flow = model.gradient_flow(module)
    assert calls == [] and not module.training
    assert seen and all(all(modes.values()) and modes for modes in seen), seen
    assert torch.equal(torch.get_rng_state(), rng)
    assert "separate LSTMs" in flow["verdict"]
    assert {v for k, v in flow["gradient_flow"].items() if k.startswith("encoder.actor_encoder.")} == {"policy"}


def test_the_device_path_writes_the_host_paths_log(tmp_path: Path, monkeypatch) -> None:
    """Issue #50's device path (summary rows computed where the states are), forced on the CPU for RLlib's
    learner as tests/test_ondevice.py forces it for rsl_rl, RecurrentPPO and TorchRL: the learner's training
    and value calls take it, and so do the local env runner's rollout blocks, and the log is the host path's
    (rows, keys, call ids, `init` and `found` exactly; norms and drifts within 1e-5)."""
    from lstm_probe.capture.ondevice import OnDevice
    from tests.test_ondevice import device_calls, same_log
    from tests.test_ondevice_inputs import Watch

    run = dict(SMALL, steps=128, shared_lstm=False, capture="summary", trace_envs=1)
    rllib.run("CartPole-v1", f"{tmp_path}/host/", **run)
    taken = device_calls(monkeypatch)
    blocks = Watch(monkeypatch)  # the env runner's rollout blocks (a local runner: this process)
    assert OnDevice._engage == "always"
    rllib.run("CartPole-v1", f"{tmp_path}/dev/", **run)
    host, dev = lstm_probe.load(tmp_path / "host"), lstm_probe.load(tmp_path / "dev")
    # the learner's multi-step calls: its training calls and its value calls (GAE's)
    learner = host[host["phase"].isin(["train", "value"])].groupby("phase")["call"].nunique()
    assert learner["train"] > 0 and learner["value"] > 0 and len(taken) == learner.sum(), (len(taken), learner)
    same_log(host, dev)
    assert len(blocks.blocks) > 0
    blocks.o_of_columns(layers=1, hidden=SMALL["hidden_size"])
    assert dev["c_norm"].notna().all() and (dev["h"].notna() == (dev["env"] == 0)).all()
