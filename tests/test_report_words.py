"""What a user of each framework reads: real tiny runs of `lstm-probe run` (TorchRL on a Box env, CleanRL's LSTM
loop with what-if and memory) and their reports. A continuous TorchRL policy (a TanhNormal on the bounds) gets
its KL divergence measured (what-if and the memory horizon of the actor); sb3's option names stay on sb3's logs;
start reasons read as words on every framework; the Run panel shows no '-' where an own loop records no policy
or step count; the report's --html options are refused without --html."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

import lstm_probe
from lstm_probe.report.sections.what_if import WhatIf
from tests.conftest import probed_run

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lstm_probe", *args], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def torchrl_box(tmp_path_factory) -> Path:
    pytest.importorskip("torchrl")
    log = tmp_path_factory.mktemp("torchrl-box") / "r.parquet"
    size = ["--steps", "128", "--n-envs", "2", "--n-steps", "32", "--n-epochs", "2", "--hidden-size", "8"]
    done = _cli("run", "Pendulum-v1", "--framework", "torchrl", *size, "--what-if", "--memory", "--out", str(log), "-q")
    assert done.returncode == 0, done.stderr
    return log


@pytest.fixture(scope="module")
def own_loop(tmp_path_factory) -> Path:
    log = tmp_path_factory.mktemp("own-loop") / "own.parquet"
    args = ["--iterations", "2", "--num-envs", "2", "--num-steps", "16", "--hidden", "8", "--what-if", "--memory"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "cleanrl_lstm.py"), *args, "--out", str(log)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return log


def _text(log: Path) -> str:
    done = _cli("report", str(log))
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.replace("│", " ").split())  # the panels' words, unwrapped


def test_torchrl_tanh_normal_kl_is_measured(torchrl_box):
    """TorchRL's TanhNormal (its run's policy on a Box env) is a bijective transform of a Normal: its KL is the
    base Normals' KL. It was left unmeasured: the actor's memory horizon read '-' at every iteration and the
    what-if's KL column '-' (the finding: 'the policy by KL -')."""
    rep = lstm_probe.summarize(torchrl_box).to_dict()
    actor = [h for h in rep["memory"]["horizons"] if h["module"] == "actor"]
    assert actor and all(h["effect_1"] is not None and h["effect_1"] > 0 for h in actor), actor
    zero = [r for r in rep["what_if"]["by_epoch"] if r["alternative"] == "zero"]
    assert zero and all(r["kl"] is not None and r["kl"] > 0 for r in zero), zero
    stored = [r for r in rep["what_if"]["by_epoch"] if r["alternative"] == "stored"]
    assert all(r["kl"] == pytest.approx(0, abs=1e-9) for r in stored)  # stored = refreshed on TorchRL
    assert "KL -" not in _text(torchrl_box)


def test_every_alternative_draws_alike(torchrl_box):
    """ClipPPOLoss estimates a TanhNormal's entropy by sampling: each alternative's loss drew its own samples, so
    the stored states (here the refreshed ones, bit for bit) showed an entropy-loss delta (-0.033 in a trial) and a
    policy gradient off the refreshed one. Every pass now draws the same numbers (measure.whatif.reseed). The
    gradient cosine compares with the gradient training stepped with, whose samples are the run's own draws (the
    probe never touches the run's generators): it stays within sampling noise of 1."""
    records = lstm_probe.read_info(torchrl_box).metadata["what_if"]["records"]
    rows = [dict(zip(records, values, strict=True)) for values in zip(*records.values(), strict=True)]
    stored = [r for r in rows if r["alternative"] == "stored"]
    assert stored
    for r in stored:
        assert r["entropy_loss_delta"] == 0 and r["policy_loss_delta"] == 0 and r["value_loss_delta"] == 0, r
        assert r["grad_cos_policy"] == pytest.approx(1, abs=1e-4), r


def test_a_missing_kl_is_said_not_shown_as_a_dash(torchrl_box):
    """Where an integration cannot compare the action distributions (KL null in every record), the finding
    names the PPO ratio and says why there is no KL, rather than 'the policy by KL -'."""
    rep = lstm_probe.summarize(torchrl_box)
    data = rep.sections["what_if"]
    data = dataclasses.replace(data, by_epoch=[{**r, "kl": None} for r in data.by_epoch])
    (finding,) = [f for f in WhatIf().findings(data) if "stored states" in f]
    assert "KL -" not in finding and "KL not measured" in finding, finding
    assert "the PPO ratio by" in finding


def test_no_sb3_option_names_outside_sb3(torchrl_box, own_loop):
    """'shared_lstm' is sb3's option: a TorchRL run and an own loop (one LSTM for actor and critic) do not
    have it."""
    for log in (torchrl_box, own_loop):
        text = _text(log)
        assert "one LSTM for actor and critic" in text, text
        assert "shared_lstm" not in text and "enable_critic_lstm" not in text


def test_sb3_keeps_its_option_name(runs_dir):
    log = probed_run(runs_dir, "CartPole-v1", shared_lstm=True, critic_lstm=False, what_if=True).path
    assert "one LSTM (shared_lstm) for actor and critic" in _text(log)


def test_start_reasons_in_words(torchrl_box):
    """rsl_rl, TorchRL and own loops that record start reasons: the calls explanation says them in words, as it
    does for sb3 and RLlib, not as the log's identifiers ('env_boundary: 12')."""
    explanation = json.loads(_cli("report", str(torchrl_box), "--json").stdout)["calls"]["explanation"]
    assert "env_boundary" not in explanation and "episode_start" not in explanation, explanation
    assert "the first step of its env's rollout" in explanation and "an episode start" in explanation


def test_run_panel_without_policy_or_steps(own_loop):
    """An own loop records no policy class and no step counts: the Run panel leaves them out rather than print
    'PPO (...) / -' and 'steps - of - asked'."""
    meta = lstm_probe.read_info(own_loop).metadata
    assert meta.get("policy") is None and meta.get("total_timesteps") is None  # what the example records
    text = _text(own_loop)
    run = text[text.index("1. Run") : text.index("2. Architecture")]
    assert " / -" not in run and "steps -" not in run and "of - asked" not in run, run
    assert "2 iterations, completed" in run


@pytest.mark.parametrize("picked", [["--iteration", "0"], ["--env", "0", "--episode", "0"]])
def test_html_options_need_html(runs_dir, picked):
    """--iteration, --env and --episode pick what --html draws: without --html they were taken and ignored."""
    log = probed_run(runs_dir).path
    done = _cli("report", str(log), *picked)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "--html" in done.stderr and picked[0] in done.stderr and not done.stdout


def test_without_a_critic_lstm_the_stored_state_sentence_is_the_policys(runs_dir):
    """enable_critic_lstm=False: the verdict and the finding say what stored states do to the policy in a
    sentence of its own (was: 'from stored states values have no state (the critic has no LSTM) and the PPO
    ratio by ...'; 'stored states leave values alone (...) against refreshed states and the policy by KL ...')."""
    log = probed_run(runs_dir, "Pendulum-v1", critic_lstm=False, what_if=True).path
    report = json.loads(_cli("report", str(log), "--json").stdout)
    said = " ".join(report["verdict"]["lines"])
    assert "from stored states the PPO ratio moves by " in said, said
    assert "values have no state: the critic has no LSTM)" in said and "have no state (the critic" not in said
    finding = next(f for f in report["findings"] if "stored states move" in f)
    assert finding.startswith("by the last epoch (epoch 1), stored states move the policy by KL "), finding
    assert "against refreshed states (values have no state: the critic has no LSTM); that is within 1%" in finding


def test_run_panel_counts_one_iteration_in_the_singular(tmp_path):
    """A one-iteration own loop: '1 iteration, completed' (was '1 iterations')."""
    log = tmp_path / "one.parquet"
    args = ["--iterations", "1", "--num-envs", "2", "--num-steps", "8", "--hidden", "8", "--out", str(log)]
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "cleanrl_lstm.py"), *args], capture_output=True)
    assert done.returncode == 0, done.stderr
    text = _text(log)
    run = text[text.index("1. Run") : text.index("2. Architecture")]
    assert "1 iteration, completed" in run, run


def test_state_health_says_what_its_columns_count():
    """The health table's 'saturated', 'dead units' and 'constant units' are defined under it, with the thresholds
    the section uses; a log without vectors (its per-unit columns '-') gets no legend."""
    from lstm_probe.contract import Capabilities
    from lstm_probe.report import Line
    from lstm_probe.report.sections.health import Health, HealthSection

    rep = lstm_probe.summarize(ROOT / "sample_runs" / "pendulum-1env.parquet")
    lines = [b.text for section in rep.text() for b in section if isinstance(b, Line)]
    assert (
        "saturated: the share of h values beyond ±0.95 (tanh's flat ends, where gradients vanish); dead units: units "
        "whose |h| never exceeds 0.001; constant units: units whose h never changes; NaN/inf: rows with a NaN or inf "
        "state" in lines
    )
    row = {"module": "actor", "layer": 0, "rows": 8, "nan_or_inf_rows": 0, "c_norm_max": 1.0}
    blocks = Health().text(HealthSection([row], [], False), Capabilities())
    assert not [b for b in blocks if isinstance(b, Line)]


def test_no_completed_episode_reads_as_none_not_dashes():
    """A run whose episodes all outlast it (rsl_rl's 24-step rollouts on Pendulum-v1) says so, not 'length median
    -, max -'; the memory panel's episode words likewise."""
    from types import SimpleNamespace

    from lstm_probe.report.sections.memory import _episodes_words
    from lstm_probe.report.sections.sequences import _episodes_line

    seq = lstm_probe.summarize(ROOT / "sample_runs" / "pendulum-1env.parquet").sequences
    assert _episodes_line(seq) == "episodes completed: 1, length median 200, max 200"
    none = dataclasses.replace(seq, episodes_completed=0, episode_length={})
    assert _episodes_line(none) == "episodes completed: 0 (none ended in the log)"
    measured = SimpleNamespace(episode_length={"count": 0}, episodes_from="measurement", chunks=None)
    assert _episodes_words(measured, "") == "episodes seen by the memory measurement: none ended"
    measured.episode_length = {"count": 3, "median": 12.0, "max": 20}
    assert _episodes_words(measured, "") == "episodes seen by the memory measurement: 3, median 12, max 20"


def test_an_incomplete_logs_warning_gives_the_reason_after_a_colon(tmp_path):
    """'the run did not complete: <stop reason>; ...', as the findings say it: never a reason in parentheses that
    holds parentheses of its own ('(the log was never closed (process killed))')."""
    import torch
    from torch import nn

    lstm, out = nn.LSTM(2, 4), tmp_path / "own.parquet"
    with pytest.raises(RuntimeError, match="boom"):
        with lstm_probe.trace(lstm, out=out) as probe:
            with probe.tag(phase="rollout", iteration=0, env=[0], env_step=0):
                lstm(torch.zeros(1, 1, 2))
            raise RuntimeError("boom")
    info = lstm_probe.read_info(out)
    assert not info.completed
    (warning,) = [w for w in info.warnings if "did not complete" in w]
    assert warning.startswith("the run did not complete: ") and "boom" in warning, warning
    assert warning.endswith("; the log holds the rows up to the interruption"), warning
