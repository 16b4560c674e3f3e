"""The probe only observes: the user's hooks, parameters, counters, RNGs and callbacks see what they see
without it (issue 23 items 1, 4 and 7)."""

import random
import threading

import numpy as np
import pytest
import torch
from sb3_contrib import RecurrentPPO
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.env_util import make_vec_env

import lstm_probe
from lstm_probe import ProbeCallback, arch

KW = {"n_steps": 32, "batch_size": 16, "n_epochs": 2}
VARIANTS = [
    pytest.param({}, 1, id="default"),
    pytest.param({"shared_lstm": True, "enable_critic_lstm": False}, 1, id="shared-lstm"),
    pytest.param({"enable_critic_lstm": False}, 1, id="no-critic-lstm"),
    pytest.param({"n_lstm_layers": 2}, 1, id="two-layers"),
    pytest.param({}, 2, id="two-envs"),
]


def make(policy_kwargs=None, n_envs=1, env_id="Pendulum-v1", **kw):
    env = make_vec_env(env_id, n_envs=n_envs, seed=0)
    pk = {"lstm_hidden_size": 16, **(policy_kwargs or {})}
    return RecurrentPPO("MlpLstmPolicy", env, seed=0, policy_kwargs=pk, **{**KW, **kw})


def rng_state():
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def assert_same_rng(a, b):
    assert torch.equal(a[0], b[0])
    assert a[1][0] == b[1][0] and np.array_equal(a[1][1], b[1][1]) and a[1][2:] == b[1][2:]
    assert a[2] == b[2]


def seed_hook(calls):
    """The seed question's own hook on policy.lstm_actor (it printed step, h's shape and training mode)."""

    def fw_hook(module, input_, output):
        hidden = output[1][0]
        calls.append((tuple(hidden.shape), module.training, torch.is_grad_enabled()))

    return fw_hook


def train(probe, policy_kwargs, n_envs, out=None, **capture):
    model = make(policy_kwargs, n_envs)
    calls = []
    model.policy.lstm_actor.register_forward_hook(seed_hook(calls))
    model.learn(128, callback=ProbeCallback(out, **capture) if probe else None)
    return model, calls, rng_state()


def test_trace_envs_is_invisible_too(tmp_path):
    """--trace-envs selects in the writer: training, the user's hook and the RNGs as without a probe."""
    a, calls_a, rng_a = train(False, {}, 2)
    b, calls_b, rng_b = train(True, {}, 2, tmp_path / "t.parquet", trace_envs=1)
    assert calls_b == calls_a and a.num_timesteps == b.num_timesteps
    sa, sb = a.policy.state_dict(), b.policy.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert_same_rng(rng_a, rng_b)
    df = lstm_probe.load(tmp_path / "t.parquet")
    assert (df["h"].notna() == ((df["env"] == 0) & ~df["padding"]).fillna(False)).all()


@pytest.mark.parametrize("policy_kwargs,n_envs", VARIANTS)
def test_seed_users_hook_sees_the_same_training(tmp_path, policy_kwargs, n_envs):
    """Item 1: same calls in the same order with the same shapes, same parameters, counters and RNGs."""
    a, calls_a, rng_a = train(False, policy_kwargs, n_envs)
    b, calls_b, rng_b = train(True, policy_kwargs, n_envs, tmp_path / "p.parquet")
    assert calls_b == calls_a
    assert a.num_timesteps == b.num_timesteps == 128
    sa, sb = a.policy.state_dict(), b.policy.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    oa, ob = a.policy.optimizer.state_dict()["state"], b.policy.optimizer.state_dict()["state"]
    assert all(torch.equal(oa[k][s], ob[k][s]) for k in oa for s in ("exp_avg", "exp_avg_sq"))
    assert_same_rng(rng_a, rng_b)
    # the user's hook is the only one left
    assert len(b.policy.lstm_actor._forward_hooks) == 1 and not b.policy._forward_pre_hooks
    # and the log holds what the hook saw: one row set per actor call
    actor = lstm_probe.load(tmp_path / "p.parquet", module="actor", layer=0, vectors=False)
    assert actor.call.nunique() == len(calls_a)
    # the oracle: before an update's first optimizer step, train states equal the rollout's (relative)
    df = lstm_probe.load(tmp_path / "p.parquet")
    keys = ["module", "layer", "env", "env_step"]
    roll = df[df.phase == "rollout"]
    first = df[(df.phase == "train") & ~df.padding & (df.epoch == 0) & (df.minibatch == 0)]
    merged = first.merge(roll, on=keys, suffixes=("", "_r"))
    assert len(merged) == len(first) > 0 and first.iteration.nunique() == roll.iteration.nunique()
    for col in ("h", "c"):
        a = lstm_probe.states(merged, col)
        b = lstm_probe.states(merged.drop(columns=[col]).rename(columns={f"{col}_r": col}), col)
        assert (np.abs(a - b) <= 1e-6 * np.maximum(np.abs(b), 1.0)).all(), np.abs(a - b).max()


def env_state(model):
    env = model.env.envs[0]
    return (
        np.array(env.unwrapped.state, copy=True),
        env._elapsed_steps if hasattr(env, "_elapsed_steps") else env.env._elapsed_steps,
        np.array(model._last_obs, copy=True),
        model.num_timesteps,
        model._episode_num,
        len(model.ep_info_buffer),
        np.array(model.rollout_buffer.observations, copy=True),
        [t.clone() for t in model._last_lstm_states.pi + model._last_lstm_states.vf],
    )


@pytest.mark.parametrize("policy_kwargs", [{}, {"shared_lstm": True, "enable_critic_lstm": False}])
def test_arch_rollout_leaves_the_model_alone(policy_kwargs):
    """Item 1: arch(rollout=True) measures on copies: the caller's counters, env, RNGs and hooks are
    untouched, and training continues exactly as it would have."""
    plain = make(policy_kwargs)  # the global RNGs are seeded when a model is made: one model at a time
    plain.learn(64)
    plain.learn(64, reset_num_timesteps=False)
    probed = make(policy_kwargs)
    probed.learn(64)
    calls = []
    probed.policy.lstm_actor.register_forward_hook(seed_hook(calls))
    before, rng = env_state(probed), rng_state()
    a = arch(probed, rollout=True)
    assert a.batch.startswith("a real rollout minibatch")
    after = env_state(probed)
    assert not calls
    assert_same_rng(rng, rng_state())
    for x, y in zip(before, after, strict=True):
        if isinstance(x, list):
            assert all(torch.equal(p, q) for p, q in zip(x, y, strict=True))
        else:
            assert np.array_equal(x, y)
    assert len(probed.policy.lstm_actor._forward_hooks) == 1 and not probed.policy._forward_pre_hooks
    probed.policy.lstm_actor._forward_hooks.clear()
    probed.learn(64, reset_num_timesteps=False)
    sa, sb = plain.policy.state_dict(), probed.policy.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_path_is_the_branch_sb3_took(tmp_path, monkeypatch):
    """Item 4 (`lstm-probe run CartPole-v1 --n-envs 4 --n-steps 2 --batch-size 2 --n-epochs 2`): every
    sequence has length 1, and each train call's path still names sb3's branch."""
    from sb3_contrib import RecurrentPPO

    from lstm_probe import run

    branches = []  # (module, one call over the sequences?) of every train-time _process_sequence
    original = RecurrentActorCriticPolicy._process_sequence
    training = []  # inside RecurrentPPO.train (not the probe's gradient pass on its copy, which runs before)
    train = RecurrentPPO.train

    def in_train(self):
        training.append(True)
        try:
            return train(self)
        finally:
            training.pop()

    def spy(features, lstm_states, episode_starts, lstm):
        if training and torch.is_grad_enabled():
            branches.append(bool(torch.all(episode_starts == 0.0)))
        return original(features, lstm_states, episode_starts, lstm)

    monkeypatch.setattr(RecurrentActorCriticPolicy, "_process_sequence", staticmethod(spy))
    monkeypatch.setattr(RecurrentPPO, "train", in_train)
    result = run("CartPole-v1", tmp_path / "r.parquet", n_envs=4, n_steps=2, batch_size=2, n_epochs=2, seed=0)
    df = lstm_probe.load(result.path, phase="train", layer=0, vectors=False)
    keys = ["iteration", "epoch", "minibatch", "module"]
    per_mb = (
        df.groupby(keys)
        .agg(
            path=("path", "first"),
            paths=("path", "nunique"),
            start=("episode_start", "max"),
            longest=("seq_len", "max"),
            call=("call", "min"),
        )
        .sort_values("call")
    )
    assert (per_mb.paths == 1).all()
    # sb3's calls in order: each minibatch's actor call(s), then its critic call(s) (evaluate_actions)
    want = ["sequence" if one_call else "stepwise" for one_call in branches]
    assert list(per_mb.path) == want
    # stepwise exactly where the minibatch (in the buffer) held an episode start
    assert ((per_mb.path == "stepwise") == per_mb.start.astype(bool)).all()
    # both branches ran with sequences of length 1 only (the case that said 'step')
    assert set(per_mb[per_mb.longest == 1].path) == {"sequence", "stepwise"}
    assert "step" not in set(df.path)
    # the report counts minibatches (one module's calls) by path
    calls = lstm_probe.summarize(result.path).calls
    actor = per_mb.xs("actor", level="module")
    assert calls.minibatches_by_path == actor.path.value_counts().to_dict()
    held = int((actor.path == "stepwise").sum())
    assert f"{held} of {len(actor)} minibatches held an episode start" in calls.explanation


class Predicting(BaseCallback):
    """EvalCallback-style: model.predict inside on_step (actor only), with its own states; records the
    keys of learn()'s locals it is handed."""

    def __init__(self):
        super().__init__()
        self.keys = []
        self.starts = []

    def _on_training_start(self):
        self.keys.append(sorted(self.locals))

    def _on_step(self):
        self.keys.append(sorted(self.locals))
        if self.n_calls % 8 == 0:
            obs = np.zeros((1, *self.model.observation_space.shape), np.float32)
            start = np.array([self.n_calls % 16 == 0])
            self.model.predict(obs, None, episode_start=start, deterministic=True)
            self.starts.append(bool(start[0]))
        return True


def learn_from(where, model, callback):
    if where == "thread":
        errors = []

        def target():
            try:
                model.learn(96, callback=callback)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        t = threading.Thread(target=target)
        t.start()
        t.join()
        assert not errors, errors
    else:

        def nested():
            def learn(callback):  # a user's own function named learn, holding a local named callback
                return model.learn(96, callback=callback)

            return learn(callback)

        nested()


@pytest.mark.parametrize("where", ["thread", "nested"])
def test_predict_and_bootstrap_tagged_by_entry_points(tmp_path, where):
    """Item 7: predict inside on_step is phase predict with its episode_start, bootstrap calls are exact,
    learn()'s locals are what sb3 put there, and nothing of the probe stays on the instances."""
    plain_cb = Predicting()
    plain = make(n_envs=2)
    learn_from(where, plain, plain_cb)
    cb = Predicting()
    model = make(n_envs=2)
    out = tmp_path / "p.parquet"
    learn_from(where, model, CallbackList([ProbeCallback(out), cb]))
    assert cb.keys == plain_cb.keys  # no key of the probe's among learn()'s locals
    assert set(model.policy.__dict__) == set(plain.policy.__dict__)  # the instances hold what sb3 put there
    assert set(model.rollout_buffer.__dict__) == set(plain.rollout_buffer.__dict__)
    assert not model.policy._forward_pre_hooks and not model.policy.lstm_actor._forward_hooks
    assert lstm_probe.read_info(out).completed
    df = lstm_probe.load(out, layer=0, vectors=False)
    pred = df[df.phase == "predict"].sort_values("call")
    assert set(pred.module) == {"actor"} and len(pred) == len(cb.starts) == 8
    assert pred.episode_start.astype(bool).tolist() == cb.starts
    assert pred.env_step.isna().all()
    boot = df[df.phase == "bootstrap"]
    assert set(boot.module) == {"critic"} and set(boot.bootstrap) == {"last"}
    assert sorted(boot.env_step.unique()) == [32, 64] and len(boot) == 2 * 2  # 2 iterations, 2 envs
    roll = df[(df.phase == "rollout") & (df.module == "actor")]
    assert sorted(roll.env_step.unique()) == list(range(64))


def test_user_instance_attribute_is_left_as_it_was(tmp_path):
    """Item 7: a user's own instance attribute on an entry point is wrapped while learn() runs and put
    back (the very object) afterwards; the wrappers look like the methods they wrap."""
    model = make({"shared_lstm": True, "enable_critic_lstm": False})
    seen = []
    original = model.policy.predict_values

    def predict_values(*args, **kwargs):
        seen.append(1)
        return original(*args, **kwargs)

    model.policy.predict_values = predict_values
    names = []

    class Look(BaseCallback):
        def _on_step(self):
            p = self.model.policy
            names.append((p.predict.__name__, p.predict.__doc__ == RecurrentActorCriticPolicy.predict.__doc__))
            return True

    model.learn(64, callback=CallbackList([ProbeCallback(tmp_path / "p.parquet"), Look()]))
    assert model.policy.predict_values is predict_values
    assert "predict" not in model.policy.__dict__
    assert seen and set(names) == {("predict", True)}
    boot = lstm_probe.load(tmp_path / "p.parquet", phase="bootstrap", vectors=False)
    assert len(boot) == len(seen) == 2  # the shared LSTM's last-value calls, through the user's attribute


def test_stepwise_loops_recorded_whole_are_invisible(tmp_path):
    """#28: while learn() runs, the probe records sb3's per-step training loops whole (an instance wrapper
    of ``_process_sequence``); the LSTMs are called exactly as before: the user's hooks on both see every
    call with the same shapes, and training, counters and RNGs are the same as without the probe."""

    def train(probe):
        model = make({}, 2, env_id="CartPole-v1")  # CartPole's episodes end often: most minibatches step
        calls = {"actor": [], "critic": []}
        model.policy.lstm_actor.register_forward_hook(seed_hook(calls["actor"]))
        model.policy.lstm_critic.register_forward_hook(seed_hook(calls["critic"]))
        model.learn(128, callback=ProbeCallback(tmp_path / "p.parquet", force=True) if probe else None)
        return model, calls, rng_state()

    a, calls_a, rng_a = train(False)
    b, calls_b, rng_b = train(True)
    assert calls_b == calls_a
    assert a.num_timesteps == b.num_timesteps == 128
    sa, sb = a.policy.state_dict(), b.policy.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    oa, ob = a.policy.optimizer.state_dict()["state"], b.policy.optimizer.state_dict()["state"]
    assert all(torch.equal(oa[k][s], ob[k][s]) for k in oa for s in ("exp_avg", "exp_avg_sq"))
    assert_same_rng(rng_a, rng_b)
    assert "_process_sequence" not in vars(b.policy)
    info = lstm_probe.read_info(tmp_path / "p.parquet")
    assert info.metadata["minibatch_paths"]["stepwise"]["minibatches"] > 0
    assert info.metadata["probe_cost"]["calls"] == sum(len(c) for c in calls_a.values())


def test_other_envs_none_is_invisible_too(tmp_path):
    """--other-envs none selects columns where the states are (index_select on copies): training, the user's
    hook and the RNGs as without a probe; rows for env 0 only (and its sequences' padding)."""
    a, calls_a, rng_a = train(False, {}, 2)
    b, calls_b, rng_b = train(True, {}, 2, tmp_path / "n.parquet", trace_envs=1, other_envs="none")
    assert calls_b == calls_a and a.num_timesteps == b.num_timesteps
    sa, sb = a.policy.state_dict(), b.policy.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert_same_rng(rng_a, rng_b)
    df = lstm_probe.load(tmp_path / "n.parquet")
    assert set(df["env"].dropna().unique()) == {0} and (df["env"].isna() == df["padding"]).all()
