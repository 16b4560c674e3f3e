"""ProbeCallback inside real RecurrentPPO training: never changes it, never leaks into it."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.callbacks import CallbackList, EvalCallback
from stable_baselines3.common.env_util import make_vec_env

import lstm_probe
from lstm_probe import ProbeCallback

KW = {"n_steps": 32, "batch_size": 16, "n_epochs": 2, "policy_kwargs": {"lstm_hidden_size": 16}}


def make(env_id="Pendulum-v1", n_envs=1, seed=0, **kw):
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    return RecurrentPPO("MlpLstmPolicy", env, seed=seed, **{**KW, **kw})


def params(model):
    return {k: v.clone() for k, v in model.policy.state_dict().items()}


@pytest.mark.parametrize(
    "policy_kwargs",
    [{"lstm_hidden_size": 16}, {"lstm_hidden_size": 16, "shared_lstm": True, "enable_critic_lstm": False}],
)
def test_probe_never_changes_training(tmp_path, policy_kwargs):
    a = make(policy_kwargs=policy_kwargs)
    a.learn(160)
    b = make(policy_kwargs=policy_kwargs)
    b.learn(160, callback=ProbeCallback(tmp_path / "p.parquet"))
    pa_, pb = params(a), params(b)
    assert pa_.keys() == pb.keys()
    for k in pa_:
        assert torch.equal(pa_[k], pb[k]), k
    # the optimizer state too
    sa, sb = a.policy.optimizer.state_dict()["state"], b.policy.optimizer.state_dict()["state"]
    for k in sa:
        assert torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"])


def test_probe_never_changes_training_on_two_torch_threads(tmp_path):
    """The writer thread runs its own torch ops on one thread; training keeps its two (and its numbers)."""
    torch.set_num_threads(2)
    try:
        kw = {"policy_kwargs": {"lstm_hidden_size": 128}, "n_steps": 64, "batch_size": 64}
        a = make(**kw)
        a.learn(192)
        b = make(**kw)
        b.learn(192, callback=ProbeCallback(tmp_path / "p.parquet"))
        assert torch.get_num_threads() == 2
        pa_, pb = params(a), params(b)
        for k in pa_:
            assert torch.equal(pa_[k], pb[k]), k
    finally:
        torch.set_num_threads(1)


def test_hooks_and_wrappers_removed_after_learn(tmp_path):
    model = make()
    model.learn(64, callback=ProbeCallback(tmp_path / "p.parquet"))
    p = model.policy
    assert not p.lstm_actor._forward_hooks and not p.lstm_critic._forward_hooks
    assert not p._forward_hooks and not p._forward_pre_hooks
    assert "get" not in model.rollout_buffer.__dict__ and "_get_samples" not in model.rollout_buffer.__dict__


class Boom(gym.Wrapper):
    def __init__(self, env, at=50):
        super().__init__(env)
        self.n, self.at = 0, at

    def step(self, action):
        self.n += 1
        if self.n == self.at:
            raise RuntimeError("env exploded")
        return self.env.step(action)


def test_hooks_removed_and_log_closed_when_learn_raises(tmp_path):
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0, wrapper_class=Boom)
    model = RecurrentPPO("MlpLstmPolicy", env, seed=0, **KW)
    out = tmp_path / "boom.parquet"
    with pytest.raises(RuntimeError, match="env exploded"):  # the user's error, unchanged
        with ProbeCallback(out) as probe:
            model.learn(200, callback=probe)
    assert not model.policy.lstm_actor._forward_hooks and not model.policy._forward_pre_hooks
    info = lstm_probe.read_info(out)
    assert not info.completed and "env exploded" in info.metadata["stop_reason"]
    df = lstm_probe.load(out, vectors=False)
    # the policy acted at env steps 0..49; the 50th env.step (after step 49) raised
    assert df[df.phase == "rollout"].env_step.max() == 49


def test_save_is_clean_and_reloaded_model_trains(tmp_path):
    import zipfile

    model = make()
    plain = make()
    plain.learn(96)
    plain.save(tmp_path / "plain.zip")

    class SaveMidway(ProbeCallback):
        def _on_rollout_end(self):
            super()._on_rollout_end()
            if self.iteration == 0:
                self.model.save(tmp_path / "mid.zip")

    model.learn(96, callback=SaveMidway(tmp_path / "p.parquet"))
    model.save(tmp_path / "after.zip")
    size = (tmp_path / "plain.zip").stat().st_size
    assert abs((tmp_path / "after.zip").stat().st_size - size) < 0.02 * size
    for name in ("mid.zip", "after.zip"):
        with zipfile.ZipFile(tmp_path / name) as z:
            for member in z.namelist():
                assert b"lstm_probe" not in z.read(member), member
        loaded = RecurrentPPO.load(tmp_path / name, env=make_vec_env("Pendulum-v1", n_envs=1, seed=0))
        loaded.learn(64)
        loaded.learn(64, callback=ProbeCallback(tmp_path / f"again-{name}.parquet"))
        assert lstm_probe.read_info(tmp_path / f"again-{name}.parquet").completed


def test_learn_twice_and_one_callback_per_learn(tmp_path):
    model = make()
    model.learn(64, callback=ProbeCallback(tmp_path / "a.parquet"))
    model.learn(64, callback=ProbeCallback(tmp_path / "b.parquet"), reset_num_timesteps=False)
    b = lstm_probe.load(tmp_path / "b.parquet", phase="rollout", module="actor", vectors=False)
    # learn() continued mid-episode: episode_step is unknown (null) until the next reset, env_step restarts at 0
    assert b.env_step.min() == 0 and b.episode_step.isna().all()
    model.learn(64, callback=ProbeCallback(tmp_path / "c.parquet"), reset_num_timesteps=True)
    c = lstm_probe.load(tmp_path / "c.parquet", phase="rollout", module="actor", vectors=False)
    assert c.episode_step.iloc[0] == 0 and bool(c.episode_start.iloc[0])
    cb = ProbeCallback(tmp_path / "d.parquet")
    model.learn(32, callback=cb)
    with pytest.raises(lstm_probe.BadInput, match="new ProbeCallback"):
        model.learn(32, callback=cb)


def test_eval_callback_predict_calls_are_tagged_predict(tmp_path):
    model = make(n_envs=2)
    eval_env = make_vec_env("Pendulum-v1", n_envs=1, seed=5)
    ev = EvalCallback(eval_env, eval_freq=20, n_eval_episodes=1, verbose=0)
    model.learn(128, callback=CallbackList([ev, ProbeCallback(tmp_path / "e.parquet")]))
    df = lstm_probe.load(tmp_path / "e.parquet", vectors=False)
    pred = df[df.phase == "predict"]
    assert len(pred) >= 200 and set(pred.module) == {"actor"} and pred.env_step.isna().all()
    roll = df[(df.phase == "rollout") & (df.module == "actor")]
    assert sorted(roll.env_step.unique()) == list(range(64))  # eval steps did not move the counters
    train = df[(df.phase == "train") & ~df.padding & (df.epoch == 0) & (df.minibatch == 0)]
    assert train.drift_h.max() < 1e-5  # the oracle still holds


def test_vecnormalize_three_envs_oracle(tmp_path):
    from stable_baselines3.common.vec_env import VecNormalize

    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=3, seed=0))
    model = RecurrentPPO("MlpLstmPolicy", env, seed=0, **KW)
    model.learn(200, callback=ProbeCallback(tmp_path / "v.parquet"))
    df = lstm_probe.load(tmp_path / "v.parquet", vectors=False)
    first = df[(df.phase == "train") & ~df.padding & (df.epoch == 0) & (df.minibatch == 0)]
    assert first.drift_h.notna().all() and first.drift_h.max() < 1e-5 and first.drift_c.max() < 1e-5
    assert sorted(df.env.dropna().unique()) == [0, 1, 2]


def test_subproc_vecenv_custom_extractor_progress_bar(tmp_path):
    import torch.nn as tnn
    from stable_baselines3.common.callbacks import CheckpointCallback
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from stable_baselines3.common.vec_env import SubprocVecEnv

    class Extractor(BaseFeaturesExtractor):
        def __init__(self, space, features_dim=12):
            super().__init__(space, features_dim)
            self.net = tnn.Sequential(tnn.Linear(space.shape[0], features_dim), tnn.ReLU())

        def forward(self, x):
            return self.net(x)

    env = make_vec_env("Pendulum-v1", n_envs=2, seed=0, vec_env_cls=SubprocVecEnv)
    try:
        model = RecurrentPPO(
            "MlpLstmPolicy",
            env,
            seed=0,
            **{**KW, "policy_kwargs": {"lstm_hidden_size": 16, "features_extractor_class": Extractor}},
        )
        cbs = CallbackList([CheckpointCallback(64, str(tmp_path / "ck")), ProbeCallback(tmp_path / "s.parquet")])
        model.learn(128, callback=cbs, progress_bar=True)
    finally:
        env.close()
    df = lstm_probe.load(tmp_path / "s.parquet", vectors=False)
    first = df[(df.phase == "train") & ~df.padding & (df.epoch == 0) & (df.minibatch == 0)]
    assert first.drift_h.max() < 1e-5 and len(first)
    meta = lstm_probe.read_info(tmp_path / "s.parquet").metadata
    assert meta["architecture"]["features_extractor"] == "Extractor"
    assert meta["architecture"]["modules"]["actor"]["input_size"] == 12


def test_callback_log_equals_cli_log(tmp_path):
    """ProbeCallback in a user's script writes exactly the log `lstm-probe run` writes (one code path)."""
    from lstm_probe.run import run as cli_run

    cli = cli_run(
        "CartPole-v1", tmp_path / "cli.parquet", steps=64, seed=0, n_steps=32, batch_size=16, n_epochs=2, hidden_size=16
    )
    model = RecurrentPPO(
        "MlpLstmPolicy",
        make_vec_env("CartPole-v1", n_envs=1, seed=0),
        seed=0,
        **{**KW, "policy_kwargs": {"lstm_hidden_size": 16, "shared_lstm": False, "enable_critic_lstm": True}},
    )
    model.learn(64, callback=ProbeCallback(tmp_path / "cb.parquet"))
    a = lstm_probe.load(cli.path)
    b = lstm_probe.load(tmp_path / "cb.parquet")
    assert a.drop(columns=["h", "c"]).equals(b.drop(columns=["h", "c"]))
    assert np.array_equal(lstm_probe.states(a, "h"), lstm_probe.states(b, "h"))
    assert np.array_equal(lstm_probe.states(a, "c"), lstm_probe.states(b, "c"))


def test_probe_without_with_is_closed_by_the_next_probe(tmp_path):
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0, wrapper_class=Boom)
    model = RecurrentPPO("MlpLstmPolicy", env, seed=0, **KW)
    with pytest.raises(RuntimeError, match="env exploded"):
        model.learn(200, callback=ProbeCallback(tmp_path / "a.parquet"))  # no `with`: sb3 gives no signal
    model.env = make_vec_env("Pendulum-v1", n_envs=1, seed=0)
    model.learn(32, callback=ProbeCallback(tmp_path / "b.parquet"))
    assert not model.policy.lstm_actor._forward_hooks and not model.policy._forward_pre_hooks
    info = lstm_probe.read_info(tmp_path / "a.parquet")
    assert not info.completed and "ended with an exception" in info.metadata["stop_reason"]
    assert lstm_probe.read_info(tmp_path / "b.parquet").completed


class NaNObs(gym.ObservationWrapper):
    """Observations turn to NaN after 40 steps: the policy's outputs go NaN and torch raises."""

    def __init__(self, env):
        super().__init__(env)
        self.n = 0

    def observation(self, obs):
        self.n += 1
        return obs * np.nan if self.n > 40 else obs


def test_nan_observations_are_recorded_and_the_error_reaches_the_user(tmp_path):
    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0, wrapper_class=NaNObs)
    model = RecurrentPPO("MlpLstmPolicy", env, seed=0, **KW)
    out = tmp_path / "nan.parquet"
    with pytest.raises(ValueError, match="constraint"):  # torch's own error, unchanged
        with ProbeCallback(out) as probe:
            model.learn(200, callback=probe)
    df = lstm_probe.load(out, phase="rollout", module="actor")
    h = lstm_probe.states(df, "h")
    assert np.isfinite(h[:40]).all() and np.isnan(h[-1]).all()  # NaN is data: the last rows hold it
    info = lstm_probe.read_info(out)
    assert not info.completed and "ValueError" in info.metadata["stop_reason"]
    rep = lstm_probe.summarize(out)
    assert any("NaN or inf" in f for f in rep.findings)


def test_probe_without_with_is_closed_when_the_exception_is_handled(tmp_path):
    import gc

    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0, wrapper_class=Boom)
    model = RecurrentPPO("MlpLstmPolicy", env, seed=0, **KW)
    try:
        model.learn(200, callback=ProbeCallback(tmp_path / "g.parquet"))
    except RuntimeError as exc:
        assert "env exploded" in str(exc)
    gc.collect()
    assert not model.policy.lstm_actor._forward_hooks and not model.policy._forward_pre_hooks
    assert "_get_samples" not in model.rollout_buffer.__dict__
    info = lstm_probe.read_info(tmp_path / "g.parquet")
    assert not info.completed and "ended with an exception" in info.metadata["stop_reason"]
