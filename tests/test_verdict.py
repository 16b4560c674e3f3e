"""The verdict at the top of every report (issue #48): stale or not, whether it matters, which burn-in would
suffice, and "unmeasured" with the option that measures it where the log cannot say. The section data here are
the report's own dataclasses, filled as their compute() fills them; tests/test_what_if.py checks the verdict of
real --what-if runs against their what-if sections."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lstm_probe.contract import Capabilities
from lstm_probe.report.section import Line
from lstm_probe.report.sections.staleness import StalenessSection
from lstm_probe.report.sections.what_if import WhatIf, WhatIfSection, summarize_what_if
from lstm_probe.report.verdict import STALE, verdict

SB3 = Capabilities("sb3", epochs=True, rollout_buffer=True, stored_states=True, replay=True)
ROOT = Path(__file__).resolve().parent.parent


def staleness(actor: float, critic: float, ok: bool = True) -> StalenessSection:
    rows = [
        {"module": m, "layer": 0, "epoch": e, "rows": 10, "drift_h_mean": d * (e + 1) / 4}
        for e in range(4)
        for m, d in (("actor", actor), ("critic", critic))
    ]
    return StalenessSection(10, 1e-7, 1e-7, ok, rows, [], [])


def what_if(stored: float, burn: dict[int, float], stored_burn: dict[int, float] | None = None) -> WhatIfSection:
    rows = [{"epoch": 1, "alternative": "stored", "value_rel": stored, "ratio_change": stored / 2}]
    rows += [{"epoch": 1, "alternative": f"burn_in_{k}", "value_rel": v, "ratio_change": v} for k, v in burn.items()]
    rows += [
        {"epoch": 1, "alternative": f"stored_burn_in_{k}", "value_rel": v, "ratio_change": v}
        for k, v in (stored_burn or {}).items()
    ]
    return WhatIfSection(
        measured=True, critic="lstm", burn_in=list(burn), stored_burn_in=list(stored_burn or {}), by_epoch=rows
    )


def test_stale_is_the_last_epochs_mean_drift_above_the_threshold():
    v = verdict(staleness(0.002, STALE * 1.01), None, SB3)
    assert v.stale is True and v.epoch == 3 and v.drift == {"actor": 0.002, "critic": STALE * 1.01}
    assert v.lines[0].startswith("stored states went stale: by the last epoch (3)")
    assert "1% (critic) and 0.2% (actor)" in v.lines[0]  # the staler module first
    v = verdict(staleness(0.002, STALE), None, SB3)
    assert v.stale is False and v.lines[0].startswith("stored states stayed fresh")
    assert v.matters is None and v.burn_in is None
    assert "unmeasured; run with --what-if" in v.lines[-1]


def test_a_failed_provenance_check_comes_first():
    v = verdict(staleness(0.5, 0.5, ok=False), None, SB3)
    assert v.provenance_ok is False and v.lines[0].startswith("the provenance check FAILED")


def test_what_if_figures_are_not_judged_where_a_check_failed():
    """An own loop training from zeros where its rollout carried the state (the provenance and what-if checks both
    fail) was told "it does not matter here ... no burn-in needed" from the what-if figures its report called
    untrustworthy: whether it matters is not judged where either check failed."""
    for ok, checked, words in [
        (False, {"ok": True}, "the provenance check FAILED"),
        (True, {"ok": False, "max": {"actor": 0.3}}, "the what-if check FAILED"),
        (False, {"ok": False, "max": {"actor": 0.3}}, "the what-if and the provenance checks FAILED"),
    ]:
        wi = what_if(0.005, {4: 0.001})
        wi.check = checked
        v = verdict(staleness(0.05, 0.05, ok=ok), wi, SB3)
        assert v.matters is None and v.burn_in is None, words
        assert v.lines[-1].startswith(f"whether it matters for values and actions: not judged: {words}")
    wi = what_if(0.005, {4: 0.001})
    wi.check = {"ok": True}
    assert verdict(staleness(0.05, 0.05), wi, SB3).matters is False


def test_a_failed_provenance_check_is_never_explained_as_recomputation():
    """CleanRL's loop with a planted training bug (no reset inside training, a zero start): every sequence starts
    at a rollout or episode start, and the verdict said "the drift is the training pass recomputing the states"
    and "none to matter" of a 210% drift the bug made. With the provenance check failed it says neither."""
    generic = Capabilities("generic")
    v = verdict(staleness(2.1, 2.1, ok=False), None, generic, reasons={"env_boundary": 4, "episode_start": 2})
    assert v.stored_starts is False and v.lines[0].startswith("the provenance check FAILED")
    assert "but the provenance check FAILED" in v.lines[1] and "recomputation alone" in v.lines[1]
    assert "so no stored state went stale" not in v.lines[1]
    assert v.lines[2].startswith("whether it matters for values and actions: not judged: the provenance check")
    ok = verdict(staleness(2.1, 2.1), None, generic, reasons={"env_boundary": 4})
    assert "the drift is the training pass recomputing the states" in ok.lines[0]


def test_no_drift_is_unmeasured_never_fresh():
    empty = StalenessSection(0, None, None, None, [], [], [])
    assert verdict(empty, None, SB3).stale is None
    assert verdict(empty, None, SB3).lines[0].startswith("staleness unmeasured: no training row")
    none = verdict(None, None, Capabilities("generic"))
    assert none.stale is None and "do not start from stored rollout states" in none.lines[0]
    # a framework that cannot re-run a minibatch is not told to pass a flag its run refuses
    rllib = verdict(staleness(0.05, 0.05), None, Capabilities("rllib", stored_states=True))
    assert "unmeasured; this log's integration (rllib) re-ran no training minibatch" in rllib.lines[-1]
    assert "run with --what-if" not in rllib.lines[-1]


def test_stored_states_within_need_no_burn_in():
    v = verdict(staleness(0.05, 0.05), what_if(0.005, {4: 0.001}), SB3)
    assert v.matters is False and v.burn_in == 0 and v.lines[-1].endswith("no burn-in needed")


def test_the_shortest_burn_in_that_suffices_from_zero_or_stored():
    v = verdict(staleness(0.05, 0.05), what_if(0.2, {4: 0.5, 16: 0.009, 64: 0.001}, {2: 0.05, 8: 0.002}), SB3)
    assert v.matters is True and (v.burn_in, v.burn_in_from) == (8, "stored")
    assert v.lines[-1].startswith("a 8-step burn-in (from the stored state) would suffice")
    v = verdict(staleness(0.05, 0.05), what_if(0.2, {4: 0.5, 16: 0.3}), SB3)
    assert v.matters is True and v.burn_in is None and v.burn_in_measured == [4, 16]
    assert "none of the burn-ins measured (4, 16 steps)" in v.lines[-1]


def test_the_what_if_footer_names_the_burn_in_the_verdict_does():
    """One rule for both: an epoch whose stored states are within 1% needs no burn-in (0 steps), whatever the
    burn-ins measure; one whose stored states are not needs the shortest burn-in that is. Epoch 0 here: stored
    within, burn-ins of 4 within too; epoch 1: stored 20% away, from zero 16 steps, from stored 4 steps."""
    figures = {
        0: {"stored": 0.0, "burn_in_4": 0.001, "burn_in_16": 0.001, "stored_burn_in_4": 0.0, "stored_burn_in_16": 0.0},
        1: {"stored": 0.2, "burn_in_4": 0.5, "burn_in_16": 0.005, "stored_burn_in_4": 0.002, "stored_burn_in_16": 0.0},
    }
    rows = [(e, alt, x) for e, alts in figures.items() for alt, x in alts.items()]
    records = {
        "iteration": [0] * len(rows),
        "epoch": [e for e, _, _ in rows],
        "minibatch": [0] * len(rows),
        "alternative": [alt for _, alt, _ in rows],
        "value_rel": [x for _, _, x in rows],
        "ratio_change": [x / 2 for _, _, x in rows],
    }
    meta = {"records": records, "modules": ["actor"], "critic": "lstm", "burn_in": [4, 16], "stored_burn_in": [4, 16]}
    wi = summarize_what_if(meta)
    assert [(w["epoch"], w["burn_in"], w["stored_within"]) for w in wi.within] == [(0, 0, True), (1, 16, False)]
    assert [(w["epoch"], w["burn_in"]) for w in wi.within_stored] == [(0, 0), (1, 4)]
    footer = " ".join(b.text for b in WhatIf().text(wi, SB3) if isinstance(b, Line) and "burn-in" in b.text[:30])
    assert "epoch 0: 0 steps (stored states are within); epoch 1: 16 steps" in footer
    assert "from stored: epoch 0: 0 steps (stored states are within); epoch 1: 4 steps" in footer
    v = verdict(staleness(0.05, 0.05), wi, SB3)
    assert v.matters is True and (v.burn_in, v.burn_in_from) == (4, "stored")
    # stored states within in every epoch (here: epoch 1 as epoch 0): no burn-in, in the footer as in the verdict
    figures[1] = dict(figures[0])
    records["value_rel"] = [figures[e][alt] for e, alt, _ in rows]
    records["ratio_change"] = [x / 2 for x in records["value_rel"]]
    wi = summarize_what_if(meta)
    assert all(w["burn_in"] == 0 and w["stored_within"] for w in wi.within + wi.within_stored)
    footer = " ".join(b.text for b in WhatIf().text(wi, SB3) if isinstance(b, Line))
    assert "no burn-in needed (0 steps): stored states are within 1% of refreshed" in footer
    # every column of the tables is said under them (a newcomer reads 'ratio Δ' or 'grad cos π / V' there)
    assert "ratio Δ: the mean change of the PPO ratio, |exp(Δ log p) - 1| (p90: the 90th percentile" in footer
    assert "grad cos π / V: cosine between the loss gradient trained with and refreshed states'" in footer
    v = verdict(staleness(0.05, 0.05), wi, SB3)
    assert v.matters is False and v.burn_in == 0 and v.lines[-1].endswith("no burn-in needed")


def test_every_report_opens_with_the_verdict(tmp_path):
    # a real log of the repository's samples, through the CLI: the text's first panel and the JSON's key
    log = ROOT / "sample_runs" / "pendulum-1env.parquet"
    cmd = [sys.executable, "-m", "lstm_probe", "report", str(log)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "200"})
    assert text.stdout.lstrip().startswith("╭") and text.stdout.index("Verdict") < text.stdout.index("1. Run")
    doc = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True).stdout)
    assert doc["verdict"]["stale"] is True and doc["verdict"]["matters"] is None
    # sb3 cuts sequences mid-rollout and starts them from stored states: those went stale, as the verdict says
    assert {"split", "minibatch_cut"} <= set(doc["calls"]["sequence_start_reasons"])
    assert doc["verdict"]["stored_starts"] is True
    assert doc["verdict"]["lines"][0].startswith("stored states went stale: by the last epoch")
    assert list(doc)[:4] == ["path", "schema_version", "warnings", "verdict"]


def test_percentages_are_never_in_exponent_form():
    """A drift of 1.26 (a stale critic at width) read "1.3e+02%", a change of 8.7e-7 "8.7e-05%"; two significant
    digits stay, in plain form."""
    from lstm_probe.report.verdict import _pct

    cases = {0.0037: "0.37%", 0.04: "4%", 0.999: "100%", 1.26: "130%", 24.0: "2400%", -2.0: "-200%"}
    cases |= {8.7e-7: "0.000087%", 0.0: "0%", 1.2345e-5: "0.0012%"}  # a tiny run's ratio change read "8.7e-05%"
    assert {x: _pct(x) for x in cases} == cases


def _report(log: Path) -> tuple[dict, str]:
    """The report of ``log`` through the CLI: its JSON and its text, in words (box lines dropped)."""
    cmd = [sys.executable, "-m", "lstm_probe", "report", str(log)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    doc = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True, env=env).stdout)
    text = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return doc, " ".join(text.replace("│", " ").split())


def _made(args: list[str], cwd: Path) -> None:
    done = subprocess.run(args, capture_output=True, text=True, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]


RUNS = {
    "rsl_rl": ["Pendulum-v1", "--framework", "rsl_rl", "--steps", "96", "--n-envs", "2"],
    "torchrl": ["CartPole-v1", "--framework", "torchrl", "--steps", "128", "--n-envs", "2", "--n-steps", "32"],
}


@pytest.mark.parametrize("framework", ["rsl_rl", "torchrl", "own"])
def test_a_log_whose_sequences_start_at_rollout_or_episode_starts_has_no_stale_stored_states(tmp_path, framework):
    """rsl_rl, TorchRL and CleanRL's loop start each training sequence at its rollout's start or at an episode
    start: no stored mid-rollout state to go stale, the what-if's stored states are refreshed ones (0 by
    construction), and the drift is the training pass recomputing the states with the new weights. The verdict
    says that, never "stored states went stale" (read from the start reasons the log records, and for an own loop,
    which records none, from the what-if's stored states)."""
    pytest.importorskip({"rsl_rl": "rsl_rl", "torchrl": "torchrl", "own": "torch"}[framework])
    log = tmp_path / "r.parquet"
    if framework == "own":
        args = [sys.executable, str(ROOT / "examples" / "cleanrl_lstm.py"), "--iterations", "2", "--num-envs", "2"]
        _made([*args, "--num-steps", "32", "--what-if", "--out", str(log)], tmp_path)
    else:
        run = [sys.executable, "-m", "lstm_probe", "run", *RUNS[framework], "--hidden-size", "8", "--what-if"]
        _made([*run, "--out", str(log), "-q"], tmp_path)
    doc, words = _report(log)
    v = doc["verdict"]
    reasons = doc["calls"]["sequence_start_reasons"]
    assert set(reasons) <= {"env_boundary", "episode_start"} and (framework == "own") == (not reasons)
    assert v["stored_starts"] is False and v["drift"] and v["matters"] is False and v["burn_in"] == 0
    drift, matters = v["lines"]
    assert drift.startswith("training states drifted: " if v["stale"] else "training states stayed close: ")
    assert "no training sequence starts mid-rollout from a stored state" in drift
    assert "the drift is the training pass recomputing the states with the updated weights" in drift
    assert matters.startswith("nothing stale to matter: where every training sequence starts, stored states are")
    assert "by construction (from stored states values move by 0% of the return spread" in matters
    assert not any("stored states went stale" in x or "it does not matter here" in x for x in v["lines"])
    assert drift in words and matters in words
    if framework != "own":  # the calls section's line gives the run's minibatch count, as sb3's does
        n = doc["calls"]["minibatches"]
        assert n > 1 and f"sequence per minibatch, over {n} minibatches;" in doc["calls"]["explanation"].replace(
            "sequences per", "sequence per"
        )


def test_an_own_loop_that_records_no_start_reason_is_judged_by_its_env_steps(tmp_path):
    """CleanRL's loop without --what-if records no start reason; its train rows' env steps say each sequence starts
    at its env's first rollout step of the iteration (or an episode start): no stored state, the drift is the
    recomputation (``mid_rollout_starts`` 0)."""
    log = tmp_path / "r.parquet"
    args = [sys.executable, str(ROOT / "examples" / "cleanrl_lstm.py"), "--iterations", "2", "--num-envs", "2"]
    _made([*args, "--num-steps", "32", "--out", str(log)], tmp_path)
    doc = _report(log)[0]
    v = doc["verdict"]
    assert doc["sequences"]["mid_rollout_starts"] == 0 and v["stored_starts"] is False and v["drift"]
    assert "no training sequence starts mid-rollout from a stored state" in v["lines"][0]
    assert not any("stored states went stale" in x or "stored states stayed fresh" in x for x in v["lines"])


def _chunked_loop(path, chunk, starts=True, zeros=False):
    """An own loop of 2 envs, 2 iterations of 8 rollout steps (every env's step 0 an episode start, no other),
    trained in chunks of ``chunk`` steps, each from the state the rollout stored before its first step, tagged
    with ``episode_start`` on the train rows (``starts``) or without."""
    import numpy as np
    import torch
    from torch import nn

    import lstm_probe

    torch.manual_seed(0)
    n, steps, lstm = 2, 8, nn.LSTM(3, 4)
    opt = torch.optim.SGD(lstm.parameters(), lr=0.5)
    state = (torch.zeros(1, n, 4), torch.zeros(1, n, 4))
    with lstm_probe.trace(lstm, out=path) as probe:
        for it in range(2):
            xs, before = torch.randn(steps, n, 3), []
            with torch.no_grad():
                for t in range(steps):
                    before.append(state)
                    tags = dict(env=np.arange(n), env_step=it * steps + t, episode_start=np.full(n, it + t == 0))
                    with probe.tag(phase="rollout", iteration=it, **tags):
                        _, state = lstm(xs[t : t + 1], state)
            for mb, lo in enumerate(range(0, steps, chunk)):
                tags = dict(env=np.arange(n), env_step=np.arange(it * steps + lo, it * steps + lo + chunk)[None])
                if starts:
                    tags["episode_start"] = np.zeros((n, chunk), bool) | (it + lo == 0)
                with probe.tag(phase="train", iteration=it, epoch=0, minibatch=mb, **tags):
                    y, _ = lstm(xs[lo : lo + chunk], None if zeros else before[lo])
                opt.zero_grad()
                y.pow(2).mean().backward()
                opt.step()


def test_an_own_loop_whose_chunks_start_mid_rollout_has_stored_states_that_can_go_stale(tmp_path):
    """A chunked own loop (training from the states its rollout stored mid-rollout) was told "where the training
    sequences start is not recorded": its env steps say so. Chunks of 4 of 8 steps: per iteration and env, the
    chunk at step 4 starts mid-rollout (2 envs x 2 iterations = 4 of 8 sequences); whole sequences: none. A log
    whose train rows carry no episode_start cannot say (None)."""
    for chunk, mid in ((4, 4), (8, 0)):
        log = tmp_path / f"c{chunk}.parquet"
        _chunked_loop(log, chunk)
        doc = _report(log)[0]
        assert (doc["sequences"]["sequences"], doc["sequences"]["mid_rollout_starts"]) == (16 // chunk * 2, mid)
        assert doc["verdict"]["stored_starts"] is (mid > 0)
        first = doc["verdict"]["lines"][0]
        assert first.startswith("stored states") if mid else "no training sequence starts mid-rollout" in first, first
    log = tmp_path / "zeros.parquet"  # chunks from zeros (the review's case): mid-rollout, but from no stored state
    _chunked_loop(log, 4, zeros=True)
    assert _report(log)[0]["sequences"]["mid_rollout_starts"] == 0
    log = tmp_path / "untagged.parquet"
    _chunked_loop(log, 4, starts=False)
    doc = _report(log)[0]
    assert doc["sequences"]["mid_rollout_starts"] is None and doc["verdict"]["stored_starts"] is None


def test_a_module_whose_rollout_copy_is_not_synced_is_not_called_stale():
    """RLlib's env runners never receive the critic's weights: its drift (170% on the RLlib sample log) is there
    before any optimizer step, as the cross-process check finds. The verdict called it staleness; it now says why
    it is not, and judges staleness on the actor alone."""
    from lstm_probe import summarize

    rep = summarize(ROOT / "sample_runs" / "cartpole-rllib")
    v = rep.verdict
    assert set(v.drift) == {"actor", "critic"} and v.drift["critic"] > 1 > v.drift["actor"] > STALE
    assert set(v.unsynced) == {"critic"} and v.stale is True  # the actor's 17%
    assert v.lines[0].startswith("stored states went stale") and "(actor)" in v.lines[0]
    assert "critic" not in v.lines[0]
    (line,) = [x for x in v.lines if x.startswith("critic: ")]
    assert line.startswith(
        "critic: not judged stale: its rollout-time copy runs other weights than training's (before any optimizer "
        "step its states already lie up to 2.7, relative, from the rollout's); its 170% drift"
    )
    assert any("the env runners ran this module with other weights" in f for f in rep.findings)  # as the findings
    # the integration's own word (RLlib's what-if: ``unsynced``) alone does it too, and a fresh actor is fresh
    wi = what_if(0.005, {4: 0.001})
    wi.unsynced = {"critic": "RLlib's env runners never receive the critic encoder's weights"}
    v = verdict(staleness(0.002, 0.39), wi, SB3)
    assert v.stale is False and v.drift["critic"] == 0.39 and list(v.unsynced) == ["critic"]
    assert v.lines[0].startswith("stored states stayed fresh") and "critic" not in v.lines[0]
    assert v.lines[1] == (
        "critic: not judged stale: its rollout-time copy is never synced with the weights training updates; its "
        "39% drift from the rollout states comes from that, not from stored states going stale"
    )
    wi.unsynced = {"actor": "x", "critic": "y"}  # nothing left to judge: unmeasured, never fresh
    v = verdict(staleness(0.002, 0.39), wi, SB3)
    assert v.stale is None and v.lines[0].startswith("staleness unmeasured: the drift of actor and critic is of")


def test_drifts_that_carry_no_epoch_are_not_called_missing():
    """Train rows with drifts but no epoch tag (a loop of updates tagged ``minibatch=k`` alone) were told "no
    training row of this log carries a drift": the verdict says they carry drifts, and which tag is missing."""
    position = [{"module": "lstm", "layer": 0, "position": "first", "rows": 4, "drift_h_mean": 0.1}]
    st = StalenessSection(0, None, None, None, [], [], position, train_rows=8)
    v = verdict(st, None, Capabilities("torchrl", stored_states=True), reasons={"env_boundary": 2})
    assert v.stale is None and v.lines[0].startswith("staleness unmeasured: its train rows carry drifts but no epoch")
    assert "tag the training calls with epoch and minibatch" in v.lines[0]
