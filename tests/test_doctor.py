"""The Doctor (issue 30): bugs planted on purpose in real loops are named, with their first occurrence, and
correct loops (and sb3's own training) raise nothing."""

import numpy as np
import pytest
import torch
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env

import lstm_probe
from lstm_probe import ProbeCallback, summarize

N, H = 4, 8
SHUFFLED: list[int] = []


def _loop(tmp_path, bug, steps=40):
    """A CleanRL-style loop over N toy envs (episodes end at random), one LSTM, two iterations of a rollout
    of ``steps`` env steps and a per-step training pass from the rollout's first state; ``bug`` plants one
    mistake."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    lstm = torch.nn.LSTM(3, H)
    out = tmp_path / f"{bug}.parquet"
    xs = torch.randn(2 * steps, N, 3)
    zeros = (torch.zeros(1, N, H), torch.zeros(1, N, H))
    with lstm_probe.trace(lstm, out, force=True, writer="thread", reference_window=steps) as probe, torch.no_grad():
        h, done = zeros, np.zeros(N, bool)
        for it in range(2):
            first = it * steps
            initial = zeros if h is None else (h[0].clone(), h[1].clone())
            dones = np.zeros((N, steps), bool)
            for step in range(first, first + steps):
                if bug == "shuffled" and step >= 45 and not SHUFFLED and not done[:2].any():
                    SHUFFLED.append(step)  # envs 0 and 1 swap states (neither was just reset)
                    h = (h[0][:, [1, 0, 2, 3]], h[1][:, [1, 0, 2, 3]])
                dones[:, step - first] = done
                with probe.tag(phase="rollout", iteration=it, env=np.arange(N), env_step=step, episode_start=done):
                    _, h = lstm(xs[step : step + 1], h)
                done = rng.random(N) < 0.1
                if bug in ("ok", "shuffled", "train_zeros", "train_mis_indexed"):
                    h[0][:, done] = 0
                    h[1][:, done] = 0
                elif bug == "wrong_column":
                    j = (np.flatnonzero(done) + 1) % N
                    h[0][:, j] = 0
                    h[1][:, j] = 0
                elif bug == "no_state":
                    h = None
            # CleanRL's get_states: one step at a time from the rollout's first state, masked by the dones
            state = zeros if bug == "train_zeros" else initial
            env_step = np.broadcast_to(np.arange(first, first + steps), (N, steps))
            if bug == "train_mis_indexed":  # minibatches of envs [0, 1] and [2, 3], both from states [:, :2]
                for mb, envs in enumerate((np.arange(2), np.arange(2, N))):
                    s = (initial[0][:, :2], initial[1][:, :2])  # by position, not initial[0][:, envs]
                    tags = dict(env=envs, env_step=env_step[envs], episode_start=dones[envs])
                    with probe.tag(phase="train", iteration=it, epoch=0, minibatch=mb, **tags):
                        for t in range(steps):
                            keep = torch.tensor(1.0 - dones[envs, t], dtype=torch.float32).view(1, -1, 1)
                            _, s = lstm(xs[first + t : first + t + 1, envs], (keep * s[0], keep * s[1]))
                continue
            # "noreset_train_*": tagged as one minibatch of epoch 0 (the doctor's per-step check reads those)
            first_minibatch = {"epoch": 0, "minibatch": 0} if bug.startswith("noreset_train") else {}
            tags = dict(env=np.arange(N), env_step=env_step, episode_start=dones, **first_minibatch)
            with probe.tag(phase="train", iteration=it, **tags):
                for t in range(steps):
                    keep = torch.tensor(1.0 - dones[:, t], dtype=torch.float32).view(1, -1, 1)
                    if bug == "noreset_train_carries":  # the training loop ignores the dones as well
                        keep = torch.ones_like(keep)
                    _, state = lstm(xs[first + t : first + t + 1], (keep * state[0], keep * state[1]))
    return summarize(out)


def test_correct_loop_raises_nothing(tmp_path):
    rep = _loop(tmp_path, "ok")
    assert rep.doctor.findings == []
    assert set(rep.doctor.sources["root/rollout"]) == {"previous", "reset"}
    assert set(rep.doctor.sources["root/train"]) <= {"stored", "reset"}
    assert rep.doctor.sources["root/train"].get("stored", 0) > 0


@pytest.mark.parametrize(
    "bug,kind,first",
    [
        ("no_state", "not_passed_back", {"call": 1, "env": 0, "env_step": 1}),
        ("noreset", "not_reset", {"call": 1, "env": 2, "env_step": 1}),
        ("wrong_column", "wrong_column", {"call": 1, "env": 2, "env_step": 1, "reset_env": 0}),
        ("shuffled", "other_env", {"env": 0}),
        ("train_zeros", "train_from_zeros", {"env_step": 40}),
    ],
)
def test_each_planted_bug_is_named_with_its_first_occurrence(tmp_path, bug, kind, first):
    SHUFFLED.clear()
    rep = _loop(tmp_path, bug)
    problems = rep.doctor.problems
    if bug == "shuffled":
        first = {**first, "env_step": SHUFFLED[0], "call": SHUFFLED[0] + 40}  # 40 train calls before it
    assert [p.kind for p in problems] == [kind], rep.doctor.findings
    for key, value in first.items():
        assert problems[0].first[key] == value, problems[0].first
    assert rep.findings.count(problems[0].text) == 1  # in the report's findings, once


@pytest.mark.parametrize("train", ["resets", "carries"])
def test_a_rollout_that_never_resets_names_the_training_loop_where_it_carries_the_state_too(tmp_path, train):
    """The rollout never resets its state: where the per-step training loop does not either (its train states
    still equal the rollout's at an episode start inside a sequence), it is named too, since fixing the rollout
    alone would leave it carrying the state across; where it resets (and so departs from the rollout's unreset
    state there) it is not."""
    rep = _loop(tmp_path, f"noreset_train_{train}")
    kinds = [(p.kind, p.phase) for p in rep.doctor.problems]
    if train == "resets":
        assert kinds == [("not_reset", "rollout")], rep.doctor.findings
        return
    assert kinds == [("not_reset", "rollout"), ("carried_in_training", "train")], rep.doctor.findings
    p = rep.doctor.problems[1]
    assert "nor does the rollout" in p.text and rep.findings.count(p.text) == 1
    # its first row: an episode start after the sequence's first step, the train state the rollout's there
    df = lstm_probe.load(tmp_path / "noreset_train_carries.parquet", phase="train", vectors=False)
    at = df[(df.call == p.first["call"]) & (df.env == p.first["env"])]
    assert bool(at.episode_start.iloc[0]) and int(at.t.iloc[0]) > 0 and at.drift_h.iloc[0] == 0


def test_training_from_another_env_columns_stored_state_is_named(tmp_path):
    """A minibatch's initial states taken by position (``initial[:, :2]`` for envs 2 and 3) rather than by env:
    the doctor said "no problem found" (its train sequences started from 'other' states), and where the wrong
    minibatch is not the first, the provenance check passes. Each is bit-equal to the state another env column
    stored at that step: other_env, in training, first at iteration 1's first step of env 2 or 3 (iteration 0
    starts from zeros: a reset)."""
    rep = _loop(tmp_path, "train_mis_indexed")
    problems = rep.doctor.problems
    assert [(p.kind, p.phase) for p in problems] == [("other_env", "train")], rep.doctor.findings
    assert problems[0].first["env"] in (2, 3) and problems[0].first["env_step"] == 40
    sources = rep.doctor.sources["root/train"]
    assert sources.get("other_env", 0) + sources.get("reset", 0) >= 2 and "other" not in sources
    assert rep.staleness.provenance_ok is True  # it checks minibatch 0 (envs 0 and 1): only the doctor sees this


def test_watch_names_a_predict_loop_that_drops_the_state():
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    model = RecurrentPPO("MlpLstmPolicy", env, seed=0, n_steps=16, batch_size=16, policy_kwargs={"lstm_hidden_size": 8})
    for bug in (True, False):
        obs, state, starts = env.reset(), None, np.ones(2, bool)
        with pytest.warns(UserWarning) if bug else _no_warning():
            with lstm_probe.watch(model) as w:
                for _ in range(60):
                    if bug:
                        action, _ = model.predict(obs)
                    else:
                        action, state = model.predict(obs, state=state, episode_start=starts)
                    obs, _, starts, _ = env.step(action)
        if bug:
            assert [p.kind for p in w.doctor.problems] == ["not_passed_back"]
            assert "model.predict(obs, state=..., episode_start=...)" in w.findings[0]
            assert w.doctor.problems[0].first == {
                "call": 1,
                "module": "actor",
                "phase": "predict",
                "env": 0,
                "env_step": 1,
            }
        else:
            assert w.findings == []
            assert set(w.doctor.sources["actor/predict"]) == {"previous", "reset"}
    assert "predict" not in vars(model.policy)  # the wrapper is gone


class _no_warning:
    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"shared_lstm": True, "enable_critic_lstm": False},
        {"enable_critic_lstm": False},
        {"n_lstm_layers": 2},
        {"n_envs": 2},
    ],
)
def test_no_false_alarm_over_sb3_training(tmp_path, variant):
    kw = dict(variant)
    n_envs = kw.pop("n_envs", 1)
    env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=0)
    model = RecurrentPPO(
        "MlpLstmPolicy", env, seed=0, n_steps=64, batch_size=32, n_epochs=1, policy_kwargs={"lstm_hidden_size": 8, **kw}
    )
    out = tmp_path / "run.parquet"
    model.learn(2000, callback=ProbeCallback(out))
    doc = summarize(out).doctor
    assert doc.findings == []
    for key, sources in doc.sources.items():
        allowed = {"stored", "reset"} if key.endswith("/train") else {"previous", "reset"}
        assert set(sources) <= allowed, (key, sources)
    assert any(s.get("stored") for k, s in doc.sources.items() if k.endswith("/train"))
    paths = doc.minibatch_paths
    assert paths["stepwise"]["minibatches"] + paths["sequence"]["minibatches"] > 0
    assert doc.facts and "per-step path" in doc.facts[0]
