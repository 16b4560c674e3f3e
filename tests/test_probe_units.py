"""The probes' held-out units where episodes are too few (``probes._units``): runs of 16, 8 or 4 env steps of one
episode, where a run cut short by an episode's (or the rollout's) start or end to fewer than MIN_SEGMENT steps joins
the episode's run beside it instead of counting as a unit of its own."""

import numpy as np
import torch
from torch import nn

import lstm_probe
from lstm_probe.report.probes import MIN_SEGMENT, _merged, _units, score, split


def sizes(units):
    return np.unique(units, return_counts=True)[1].tolist()


def test_fragments_join_the_run_beside_them():
    M = 1_000_000
    runs = np.array(
        [0, 0, 1, 1, 1] + [M] * 3 + [M + 1] * 4 + [M + 2] + [2 * M + 5] * 2 + [3 * M] * 4 + [4 * M, *[4 * M + 1] * 4]
    )
    got = _merged(runs)
    # unit 0: two fragments, no full run: one unit; unit 1: the leading fragment joins the run after it, the
    # trailing one the run before it; unit 2: a whole short episode stays; unit 4's leading fragment joins its own
    # next run, not unit 3's full run before it
    want = [0] * 5 + [M + 1] * 8 + [2 * M + 5] * 2 + [3 * M] * 4 + [4 * M + 1] * 5
    assert got.tolist() == want
    assert _merged(np.repeat([0, 1, 2], MIN_SEGMENT)).tolist() == np.repeat([0, 1, 2], MIN_SEGMENT).tolist()


def test_runs_cut_by_an_episode_end_are_no_unit_of_their_own():
    env, step = np.zeros(64, np.int64), np.arange(64)
    episode = np.where(step < 37, 0.0, 1.0)  # episode 1 starts at step 37: its first 8-step run holds 3 (37-39)
    units = _units(env, episode, step, 0.25)
    assert sizes(units) == [8, 8, 8, 8, 5, 11, 8, 8]  # was 9 units, one of 3 steps
    assert len(np.unique(units[split(units, 0.25)])) == 2
    # two episodes of 10 and 12 steps, 4-step runs: 2-step fragments at both ends of episode 1 and the end of 0
    env, step = np.zeros(22, np.int64), np.arange(22)
    episode = np.where(step < 10, 0.0, 1.0)
    units = _units(env, episode, step, 0.3)
    assert sizes(units) == [4, 6, 6, 6]  # was [4, 4, 2, 2, 4, 4, 2]
    held = split(units, 0.3)
    assert step[held].tolist() == list(range(10, 16))  # episode 1's steps 10-15: one unit
    got = score(step[:, None].astype(float), step * 2.0, held, 1e-9, units)
    # one held-out unit: no R² (the old units held out steps 8-9 and 16-19, two 'units', and scored an R²)
    assert (got["n_test"], got["n_test_units"], got["too_few"], got["r2"]) == (6, 1, True, None)


def test_a_real_own_loop_log(tmp_path):
    """One env, two 50-step rollouts inside one episode: the first rollout's 8-step runs end in a 2-step fragment
    (steps 48-49), which joins the run before it; the second's runs (50-55 ... 96-99) hold none, as before."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    lstm, T = nn.LSTM(2, 8), 50
    state = (torch.zeros(1, 1, 8), torch.zeros(1, 1, 8))
    out = tmp_path / "one.parquet"
    with lstm_probe.trace(lstm, out=out) as probe, torch.no_grad():
        for it in range(2):
            for t in range(T):
                step = it * T + t
                x = torch.tensor([[[step / 50.0, rng.normal()]]], dtype=torch.float32)
                tags = dict(phase="rollout", iteration=it, env=np.arange(1), env_step=step, episode_start=[step == 0])
                with probe.tag(**tags):
                    _, state = lstm(x, state)
    res = lstm_probe.probe(out, "episode_step")
    got = [(r.iteration, r.n_fit, r.n_test, r.n_test_units) for r in res.itertuples()]
    assert got == [(0, 32, 18, 2), (1, 34, 16, 2)]  # iteration 0 was (34, 16, 2): the fragment fitted
    assert (res["r2"] > 0.5).all() and not res["too_few"].any(), res
