"""RLlib logs in the report, on a real tiny run (PPO, use_lstm=True, CartPole-v1, an evaluation runner): the
staleness trend over training (each iteration's last minibatch, from the cross-process check: the log declares
``cycling_minibatches``) against an oracle computed from the log's rows, and the evaluation runner's episodes
counted apart in the returns record and line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

import lstm_probe
from lstm_probe.integrations import rllib
from lstm_probe.log.reader import read_info
from lstm_probe.log.schema import relative_l2
from lstm_probe.report.section import fmt
from lstm_probe.report.sections.returns import returns_line

pytestmark = pytest.mark.rllib

KEYS = ["module", "layer", "worker", "env", "env_step"]
SAMPLE = Path(__file__).resolve().parents[1] / "sample_runs" / "cartpole-rllib"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """Three iterations, two epochs of minibatches cycling through each update's batch, an evaluation runner in the
    driver after each iteration; ray started here and shut down after (as tests/test_returns.py does)."""
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("rllib-trend") / "log"
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, rollout_fragment_length=32, num_envs_per_env_runner=2)
        .training(train_batch_size_per_learner=64, minibatch_size=32, num_epochs=2)
        .rl_module(
            model_config=DefaultModelConfig(use_lstm=True, max_seq_len=8, lstm_cell_size=8, vf_share_layers=False)
        )
        .evaluation(evaluation_interval=1, evaluation_num_env_runners=0, evaluation_duration=2)
        .debugging(seed=0)
    )
    rllib.probe_config(config, f"{out}/")
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", num_cpus=2)
    try:
        algo = config.build_algo()
        try:
            results = [algo.train() for _ in range(3)]
            rllib.close(algo)
        finally:
            algo.stop()
    finally:
        ray.shutdown()
    return out, results


def _oracle(log: Path) -> dict[tuple[str, int], tuple[int, int, float, float]]:
    """(module, iteration) -> (last minibatch, rows, mean relative L2 drift of h, of c): the learner's train rows
    (not padding, t >= 0) of each iteration's last minibatch, each against the env runner's rollout row of the same
    module, layer, worker, env and env step of the same iteration (the weights version the learner trains)."""
    df = lstm_probe.load(log)
    roll = df[(df["phase"] == "rollout") & df["env_step"].notna()]
    assert not roll.duplicated(KEYS).any()
    train = df[(df["phase"] == "train") & (df["t"] >= 0) & ~df["padding"] & df["env_step"].notna()]
    pairs = train.merge(roll, on=KEYS, suffixes=("", "_r"))
    pairs = pairs[pairs["iteration"] == pairs["iteration_r"]]
    out = {}
    for (module, it), g in pairs.groupby(["module", "iteration"]):
        last = g[g["minibatch"] == g["minibatch"].max()]
        drift = [relative_l2(np.stack(last[name].to_numpy()), np.stack(last[f"{name}_r"].to_numpy())) for name in "hc"]
        out[(module, int(it))] = (int(last["minibatch"].iloc[0]), len(last), *(float(d.mean()) for d in drift))
    return out


def test_the_trend_is_each_iterations_last_minibatch_drift(run, tmp_path: Path) -> None:
    log, _ = run
    assert read_info(log).metadata["capabilities"]["cycling_minibatches"] is True
    expected = _oracle(log)
    assert {it for _, it in expected} == {0, 1, 2} and {m for m, _ in expected} == {"actor", "critic"}
    rep = lstm_probe.summarize(log)
    got = rep.staleness.by_iteration
    assert [(r["module"], r["iteration_first"]) for r in got] == sorted(expected)
    for r in got:
        mb, rows, h, c = expected[(r["module"], r["iteration_first"])]
        assert (r["layer"], r["iteration_last"], r["iterations"], r["epoch"]) == (0, r["iteration_first"], 1, None)
        assert (r["minibatch"], r["rows"]) == (mb, rows)
        assert r["drift_h_mean"] == pytest.approx(h, rel=1e-5) and r["drift_c_mean"] == pytest.approx(c, rel=1e-5)
    assert all(r["minibatch"] >= 3 for r in got)  # two epochs of 64+ timesteps in minibatches of 32
    # the text: one line per module, in the cross-process section
    text = "\n".join(str(getattr(b, "text", "")) for blocks in rep.text() for b in blocks)
    for module in ("actor", "critic"):
        mbs = {expected[(module, it)][0] for it in range(3)}
        which = f"the last minibatch ({mbs.pop()})" if len(mbs) == 1 else "each iteration's last minibatch"
        # the figures printed are the reported ones (equal to the oracle's above, to float32 rounding)
        mine = {r["iteration_first"]: r["drift_h_mean"] for r in got if r["module"] == module}
        parts = ", ".join(f"{it}: {fmt(mine[it])}" for it in range(3))
        top = max(range(3), key=lambda it: expected[(module, it)][2])
        line = f"mean h drift of {module} in {which} by iteration: {parts}; largest in iteration {top}"
        assert line in text, text
    # the JSON: the staleness section's by_iteration (as for a log whose train rows carry their drift), once
    doc = json.loads(json.dumps(rep.to_dict()))
    assert [r["drift_h_mean"] for r in doc["staleness"]["by_iteration"]] == [r["drift_h_mean"] for r in got]
    assert "by_iteration" not in doc["cross_process"]
    # the HTML page: its figure over iterations
    pytest.importorskip("matplotlib")
    from lstm_probe.report.html import build_html

    page = build_html(log, tmp_path / "r.html", report=rep)
    assert "Staleness over iterations" in page.figures
    assert "in each iteration&#x27;s last minibatch" in (tmp_path / "r.html").read_text()


def test_a_log_that_does_not_declare_cycling_minibatches_has_no_trend() -> None:
    """The sample log (written before the capability): its report as before, no trend."""
    rep = lstm_probe.summarize(SAMPLE)
    assert not rep.capabilities.cycling_minibatches
    assert rep.staleness.by_iteration == [] and rep.cross_process.by_iteration == []
    text = "\n".join(str(getattr(b, "text", "")) for blocks in rep.text() for b in blocks)
    assert "last minibatch" not in text and "max h drift of actor before the first optimizer step" in text


def test_evaluation_episodes_are_counted_apart(run) -> None:
    """The evaluation runner's record is marked and kept beside the training runner's; the report counts its
    episodes apart (RLlib's own evaluation metrics), training's as RLlib's training metrics."""
    log, results = run
    record = read_info(log).metadata["returns"]
    assert set(record["by_shard"]) == {"runner0", "evalrunner0"}
    assert record["by_shard"]["evalrunner0"]["evaluation"] is True
    assert "evaluation" not in record["by_shard"]["runner0"]
    rep = lstm_probe.summarize(log)
    r = rep.returns
    assert r.episodes == results[-1]["env_runners"]["num_episodes_lifetime"]  # training's alone
    assert r.iterations == 3
    evaluated = [res["evaluation"]["env_runners"] for res in results]
    n = sum(int(e["num_episodes"]) for e in evaluated)
    mean = sum(int(e["num_episodes"]) * float(e["episode_return_mean"]) for e in evaluated) / n
    assert n >= 3 and r.evaluation["episodes"] == n
    assert r.evaluation["return_mean"] == pytest.approx(mean, rel=1e-12)
    assert r.evaluation["return_min"] == min(e["episode_return_min"] for e in evaluated)
    assert r.evaluation["return_max"] == max(e["episode_return_max"] for e in evaluated)
    line = returns_line(r)
    assert line.startswith(f"returns (RLlib's episode returns): {r.episodes} episodes ended")
    assert line.endswith(f"; evaluation: {n} episodes, mean {mean:.4g}")
    assert rep.to_dict()["returns"]["evaluation"]["episodes"] == n


def test_a_returns_record_without_evaluation_reports_as_before() -> None:
    """Records without an evaluation's: no ``evaluation`` in the JSON, the line as before; an evaluation's record
    alone: no training episode."""
    from lstm_probe.capture.returns import Returns
    from lstm_probe.report.sections.returns import Returns as Section
    from lstm_probe.report.sections.returns import summarize_returns

    train, ev = Returns("rllib"), Returns("rllib", evaluation=True)
    train.ended(0, [10.0, 20.0], [10, 20])
    ev.ended(1, [30.0], [30])
    alone = summarize_returns(train.record(), 1)
    assert alone.evaluation is None and "evaluation" not in Section().to_json(alone)
    assert returns_line(alone) == (
        "returns (RLlib's episode returns): 2 episodes ended; mean return 15 in the first tenth of iterations "
        "(iteration 0, 2 episodes), 15 in the last (iteration 0, 2 episodes); best 20 (iteration 0)"
    )
    both = summarize_returns({"by_shard": {"runner0": train.record(), "evalrunner0": ev.record()}}, 1)
    assert returns_line(both) == returns_line(alone) + "; evaluation: 1 episode, mean 30"
    assert (both.episodes, both.best) == (2, {"return": 20.0, "iteration": 0})
    only = summarize_returns(ev.record(), 1)
    assert only.episodes == 0 and only.evaluation["episodes"] == 1
