"""ProbeCallback inside real RecurrentPPO training: never changes it, never leaks into it."""

import gc
import weakref

import gymnasium as gym
import numpy as np
import pytest
import torch
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, EvalCallback
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
@pytest.mark.parametrize(
    "probe_kw",
    # the default; a summary log (its per-step loops reduced in the training process) with live metrics on
    [{}, {"capture": "summary", "live_metrics": True}],
    ids=["full", "summary-live"],
)
def test_probe_never_changes_training(tmp_path, policy_kwargs, probe_kw):
    a = make(policy_kwargs=policy_kwargs)
    a.learn(160)
    rng_a = (torch.get_rng_state(), np.random.get_state()[1].copy(), a.num_timesteps)
    b = make(policy_kwargs=policy_kwargs)
    b.learn(160, callback=ProbeCallback(tmp_path / "p.parquet", **probe_kw))
    rng_b = (torch.get_rng_state(), np.random.get_state()[1].copy(), b.num_timesteps)
    assert torch.equal(rng_a[0], rng_b[0]) and np.array_equal(rng_a[1], rng_b[1]) and rng_a[2] == rng_b[2]
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
    assert "_process_sequence" not in p.__dict__


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
    from lstm_probe import run as cli_run

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


def _rows(path):
    """Every column of every row of a log, NaN-safe (NaN as a string), in the order it was written."""
    import math

    import pyarrow.parquet as pq

    table = pq.read_table(path)

    def plain(v):
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        return [plain(x) for x in v] if isinstance(v, list) else v

    return {name: plain(table.column(name).to_pylist()) for name in table.column_names}


# the sample logs' sb3 configurations (sample_runs/README.md), shortened; Pendulum's episodes end every 200
# steps and CartPole's often: minibatches hold episode starts, and sb3 trains them one step per call
LOOP_CONFIGS = [
    pytest.param("Pendulum-v1", {"steps": 256, "n_steps": 64, "batch_size": 32, "n_epochs": 4}, id="pendulum-1env"),
    pytest.param(
        "CartPole-v1", {"steps": 256, "n_envs": 4, "n_steps": 32, "batch_size": 64, "n_epochs": 2}, id="cartpole"
    ),
    pytest.param("Pendulum-v1", {"steps": 512, "n_steps": 256, "n_epochs": 1, "lstm_layers": 2}, id="two-layers"),
    pytest.param(
        "Pendulum-v1",
        {"steps": 256, "n_steps": 128, "n_epochs": 2, "shared_lstm": True, "critic_lstm": False},
        id="shared",
    ),
]


@pytest.mark.parametrize("capture", ["full", "summary"])
@pytest.mark.parametrize("env_id,kw", LOOP_CONFIGS)
def test_stepwise_loops_recorded_whole_write_the_same_log(tmp_path, monkeypatch, env_id, kw, capture):
    """#28: sb3's per-step training loops, recorded whole (one block per loop), give the very rows the
    call-by-call path gives: every column, vectors included."""
    from lstm_probe import run

    def log(name, whole):
        monkeypatch.setattr(ProbeCallback, "_loop_blocks", whole)
        out = tmp_path / f"{name}.parquet"
        run(env_id, out, seed=0, hidden_size=16, capture=capture, torch_threads=1, **kw)
        return out

    old, new = log("calls", False), log("loops", True)
    a, b = _rows(old), _rows(new)
    assert a["path"].count("stepwise") > len(a["path"]) // 8  # the loops are a good part of the log
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name
    ia, ib = lstm_probe.read_info(old), lstm_probe.read_info(new)
    assert ia.metadata["probe_cost"]["calls"] == ib.metadata["probe_cost"]["calls"]
    assert ia.metadata["minibatch_paths"]["stepwise"]["minibatches"] > 0


@pytest.mark.parametrize("writer", ["process", "thread"])
@pytest.mark.parametrize("env_id,kw", LOOP_CONFIGS)
def test_summary_loops_reduced_in_the_tracer_write_the_same_log(tmp_path, monkeypatch, env_id, kw, writer):
    """#28, #38: a summary log's rows reduced to norms and drifts in the training process (drift.reduced: its
    rollout blocks, sequence calls and per-step training loops; the drifts from drift.Drift, against the
    rollout states Inputs holds) give the very rows the sink gives from their states: every column, bit for
    bit, through a writer process and a writer thread."""
    from lstm_probe import run
    from lstm_probe.capture import emitter
    from lstm_probe.capture.tracer import CoreTracer

    reduced = []
    original = emitter.reduced

    def counted(hs, cs, drift, per_step=False):
        reduced.append(drift is not None and bool(drift[2].any()))
        return original(hs, cs, drift, per_step)

    monkeypatch.setattr(emitter, "reduced", counted)

    def log(name, here):
        monkeypatch.setattr(CoreTracer, "_reduce_here", here)
        reduced.clear()
        out = tmp_path / f"{name}.parquet"
        run(env_id, out, seed=0, hidden_size=16, capture="summary", torch_threads=1, writer=writer, **kw)
        return out, list(reduced)

    (old, none), (new, blocks_) = log("sink", False), log("tracer", True)
    assert none == [] and sum(blocks_) > 0  # every block reduced; the train blocks with drifts found
    a, b = _rows(old), _rows(new)
    assert a["path"].count("stepwise") > len(a["path"]) // 8
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name


def test_copies_and_pickles_during_learn_carry_no_loop_wrapper(tmp_path):
    """#28: the _process_sequence wrapper is an instance attribute while learn() runs: a deep copy, a
    pickle, model.save() and the probe's own private copies made meanwhile get sb3's function, never the
    wrapper (nor the probe it reaches)."""
    import copy
    import pickle

    from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy

    from lstm_probe.integrations.sb3.arch import private_policy

    sb3_function = RecurrentActorCriticPolicy._process_sequence
    seen = {}

    class Copying(ProbeCallback):
        def _on_rollout_end(self):
            super()._on_rollout_end()
            if self.iteration == 1:  # iteration 0 trained already: the wrapper has run
                policy = self.model.policy
                seen["wrapped"] = vars(policy).get("_process_sequence")
                seen["deep"] = copy.deepcopy(policy)
                # (the policy itself does not pickle while hooks are on it: the wrapper alone does)
                seen["pickled"] = pickle.loads(pickle.dumps(seen["wrapped"]))
                seen["private"] = private_policy(policy)
                self.model.save(tmp_path / "mid.zip")

    model = make("CartPole-v1", n_envs=2)
    model.learn(96, callback=Copying(tmp_path / "p.parquet"))
    assert seen["wrapped"] is not None and seen["wrapped"] is not sb3_function
    assert seen["wrapped"].__name__ == "_process_sequence"
    assert vars(seen["deep"]).get("_process_sequence", sb3_function) is sb3_function
    assert seen["pickled"] is sb3_function
    assert "_process_sequence" not in vars(seen["private"])
    assert "_process_sequence" not in vars(model.policy)
    loaded = RecurrentPPO.load(tmp_path / "mid.zip", env=make_vec_env("CartPole-v1", n_envs=2, seed=0))
    loaded.learn(64, callback=ProbeCallback(tmp_path / "again.parquet"))
    assert lstm_probe.read_info(tmp_path / "again.parquet").completed
    # the copies train as sb3 does (no probe left in them)
    deep = seen["deep"]
    obs, starts = torch.zeros(4, 4), torch.tensor([0.0, 1.0, 0.0, 0.0])
    states = (torch.zeros(1, 2, 16), torch.zeros(1, 2, 16))
    assert torch.equal(
        deep._process_sequence(obs, states, starts, deep.lstm_actor)[0],
        sb3_function(obs, states, starts, deep.lstm_actor)[0],
    )


def test_two_probes_and_a_second_learn_with_loops_recorded_whole(tmp_path):
    """Two ProbeCallbacks in one learn() (the second closes the first, as before) and a second learn()
    on the same model: each wraps and unwraps _process_sequence, and the logs hold sb3's stepwise rows."""
    model = make("CartPole-v1", n_envs=2)
    first, second = ProbeCallback(tmp_path / "a.parquet"), ProbeCallback(tmp_path / "b.parquet")
    model.learn(64, callback=CallbackList([first, second]))
    assert "_process_sequence" not in vars(model.policy)
    model.learn(64, callback=ProbeCallback(tmp_path / "c.parquet"), reset_num_timesteps=True)
    assert "_process_sequence" not in vars(model.policy)
    assert not lstm_probe.read_info(tmp_path / "a.parquet").completed  # closed by the second probe
    for name in ("b", "c"):  # reset_num_timesteps: the episodes start anew (an episode start in minibatch 0)
        info = lstm_probe.read_info(tmp_path / f"{name}.parquet")
        assert info.completed and info.metadata["minibatch_paths"]["stepwise"]["minibatches"] > 0
        df = lstm_probe.load(tmp_path / f"{name}.parquet", phase="train", vectors=False)
        assert (df.path == "stepwise").any()


def recording():
    """An SB3 Logger (no output format) that keeps every lstm_probe/ figure recorded, in order, in ``seen``."""
    from stable_baselines3.common.logger import Logger

    class Recording(Logger):
        def __init__(self):
            super().__init__(None, [])
            self.seen = []

        def record(self, key, value, exclude=None):
            if key.startswith("lstm_probe/"):
                self.seen.append((key, value))
            super().record(key, value, exclude)

    return Recording()


def test_live_metrics_are_the_same_with_loops_recorded_whole(tmp_path, monkeypatch):
    """The figures sb3/metrics.py records through SB3's logger take a loop's outputs whole: the same values."""
    from lstm_probe.integrations.sb3 import metrics

    def figures(whole):
        monkeypatch.setattr(ProbeCallback, "_loop_blocks", whole)
        model = make("CartPole-v1", n_envs=2)
        model.set_logger(recording())
        model.learn(128, callback=ProbeCallback(tmp_path / f"{whole}.parquet"))
        return model.logger.seen, metrics.live()["rows"]

    (a, rows_a), (b, rows_b) = figures(False), figures(True)
    assert a == b and rows_a == rows_b
    assert any(key == "lstm_probe/stepwise_share" and value > 0 for key, value in a)


def test_live_metrics_only_where_the_logger_writes_somewhere(tmp_path, monkeypatch):
    """SB3's own logger at verbose=0 without tensorboard_log writes nowhere: the probe records no figure there,
    and live() still counts every row of the log exactly. A logger with an
    output format (CSV here) gets the figures in its file, as does live_metrics=True on the silent logger."""
    from stable_baselines3.common.logger import Logger, configure

    from lstm_probe.integrations.sb3 import metrics

    recorded: list[str] = []
    original = Logger.record

    def record(self, key, value, exclude=None):
        recorded.append(key)
        original(self, key, value, exclude)

    monkeypatch.setattr(Logger, "record", record)  # the class itself: type(logger) stays Logger

    def run(name, logger=None, **kw):
        recorded.clear()
        model = make("CartPole-v1", n_envs=2)
        if logger is not None:
            model.set_logger(logger)
        probe = ProbeCallback(tmp_path / f"{name}.parquet", capture="summary", **kw)
        hooks = []

        class Count(BaseCallback):
            def _on_rollout_start(self):
                hooks.append(len(model.policy.lstm_actor._forward_hooks))
                tracers.append(weakref.ref(probe.tracer))

            def _on_step(self):
                return True

        model.learn(256, callback=CallbackList([probe, Count()]))
        return probe, hooks, sorted({k for k in recorded if k.startswith("lstm_probe/")})

    tracers: list = []
    probe, hooks, keys = run("silent")
    assert not metrics.seen(probe.model.logger) and keys == [] and set(hooks) == {1}  # the tracer's hook only
    gc.collect()
    assert tracers and all(t() is None for t in tracers)  # the closed tracer is not kept for live()
    live = metrics.live()
    assert live["rows"] == lstm_probe.read_info(probe.path).rows > 0 and live["iteration"] == probe.iteration > 0

    probe, hooks, keys = run("csv", configure(str(tmp_path / "csv"), ["csv"]))
    assert set(hooks) == {1} and "lstm_probe/actor_drift_first_epoch" in keys  # live metrics: no hooks of their own
    header = (tmp_path / "csv" / "progress.csv").read_text().splitlines()[0].split(",")
    assert "lstm_probe/padding_share" in header and "lstm_probe/critic_h_norm" in header

    probe, hooks, forced = run("forced", live_metrics=True)
    assert set(hooks) == {1} and forced == keys
    assert metrics.live()["rows"] == lstm_probe.read_info(probe.path).rows

    class Later(BaseCallback):  # gives the model a logger that writes somewhere after the probe started
        def _on_training_start(self):
            self.model.set_logger(configure(str(tmp_path / "later"), ["csv"]))

        def _on_step(self):
            return True

    recorded.clear()
    model = make("CartPole-v1", n_envs=2)
    model.learn(256, callback=CallbackList([ProbeCallback(tmp_path / "later.parquet", capture="summary"), Later()]))
    assert sorted({k for k in recorded if k.startswith("lstm_probe/")}) == keys
    assert "lstm_probe/actor_h_norm" in (tmp_path / "later" / "progress.csv").read_text().splitlines()[0]


def test_exception_inside_a_recorded_loop_writes_the_steps_that_ran(tmp_path, monkeypatch):
    """A user's hook raising in the middle of a per-step training loop: the exception reaches the user,
    the wrapper comes off, and the log holds the same rows as call by call (the loop's steps that ran)."""

    def log(name, whole):
        monkeypatch.setattr(ProbeCallback, "_loop_blocks", whole)
        model = make("CartPole-v1", n_envs=2)
        seen = []

        def raising(module, args, output):
            if torch.is_grad_enabled() and args[0].shape[0] == 1 and args[0].shape[1] < 2 * 16:  # train, one step
                seen.append(1)
                if len(seen) == 40:
                    raise RuntimeError("user hook failed")

        model.policy.lstm_actor.register_forward_hook(raising)
        with pytest.raises(RuntimeError, match="user hook failed"):
            with ProbeCallback(tmp_path / f"{name}.parquet") as probe:
                model.learn(128, callback=probe)
        assert "_process_sequence" not in vars(model.policy)
        return tmp_path / f"{name}.parquet"

    old, new = log("calls", False), log("loops", True)
    assert not lstm_probe.read_info(new).completed
    a, b = _rows(old), _rows(new)
    assert "stepwise" in a["path"]
    for name in a:
        assert a[name] == b[name], name


@pytest.mark.parametrize("whole", [True, False])
def test_live_drift_figures_match_the_logs_drift_of_the_top_layer(tmp_path, monkeypatch, whole):
    """sb3/metrics.py's drift figures are the log's own drift column, computed once (drift.Drift): per iteration and
    module, the mean of drift_h over the first epoch's train rows of the top layer that have a drift (a rollout
    reference), with loops recorded whole and call by call."""
    from stable_baselines3.common.logger import Logger

    class Recording(Logger):
        def __init__(self):
            super().__init__(None, [])
            self.seen: dict[str, list[float]] = {}

        def record(self, key, value, exclude=None):
            self.seen.setdefault(key, []).append(value)
            super().record(key, value, exclude)

    monkeypatch.setattr(ProbeCallback, "_loop_blocks", whole)
    model = make("CartPole-v1", n_envs=2, policy_kwargs={"lstm_hidden_size": 16, "n_lstm_layers": 2})
    model.set_logger(Recording())
    probe = ProbeCallback(tmp_path / "run.parquet", capture="summary")
    model.learn(384, callback=probe)
    df = lstm_probe.load(probe.path, phase="train", vectors=False)
    df = df[(df.layer == 1) & (df.epoch == 0) & ~df.padding & df.drift_h.notna()]
    compared = 0
    for module in ("actor", "critic"):
        figures = model.logger.seen[f"lstm_probe/{module}_drift_first_epoch"]  # iteration 0, 1, ...
        assert len(figures) >= 2 and max(figures) > 0
        for iteration, figure in enumerate(figures):
            rows = df[(df.module == module) & (df.iteration == iteration)]
            assert len(rows) > 0
            assert figure == pytest.approx(float(rows.drift_h.astype(np.float64).mean()), rel=1e-9, abs=1e-12)
            compared += 1
    assert compared >= 4


def test_live_metrics_change_no_row_and_agree_across_writers(tmp_path):
    """Live metrics read the tracer's messages (no hooks of their own): figures on or off, the log is the same
    bit for bit, and a writer process and a writer thread (whose jobs run on another thread, drained at the
    two points of each iteration the figures are recorded) record the same figures."""

    def run(name, writer, live):
        model = make("CartPole-v1", n_envs=2, policy_kwargs={"lstm_hidden_size": 16, "n_lstm_layers": 2})
        model.set_logger(recording())
        probe = ProbeCallback(tmp_path / f"{name}.parquet", live_metrics=live, writer=writer)
        model.learn(256, callback=probe)
        return _rows(probe.path), model.logger.seen

    off, none = run("off", "process", False)
    on, figures = run("on", "process", True)
    threaded, figures_thread = run("thread", "thread", True)
    assert none == [] and len(figures) > 20
    assert {k for k, _ in figures} >= {"lstm_probe/actor_c_norm", "lstm_probe/critic_drift_last_epoch"}
    assert figures == figures_thread
    for name in off:
        assert off[name] == on[name] == threaded[name], name


@pytest.mark.parametrize("float16", [False, True], ids=["float32", "float16"])
def test_trace_envs_summary_rows_reduced_in_the_tracer_write_the_same_log(tmp_path, monkeypatch, float16):
    """#50: under --capture summary --trace-envs K the rows cross to the sink reduced (norms, drifts), with the
    vectors of the K traced envs only (drift.reduced's ``kept``): every column of every row, bit for bit, as
    when every row's states crossed and the sink reduced them; float16 too."""
    from lstm_probe import run
    from lstm_probe.capture import emitter
    from lstm_probe.capture.tracer import CoreTracer

    kept = []
    original = emitter.reduced

    def counted(hs, cs, drift, per_step=False, keep=None):
        kept.append(None if keep is None else (int(keep.sum()), keep.size))
        return original(hs, cs, drift, per_step, keep)

    monkeypatch.setattr(emitter, "reduced", counted)

    def log(name, here):
        monkeypatch.setattr(CoreTracer, "_reduce_here", here)
        kept.clear()
        out = tmp_path / f"{name}.parquet"
        kw = {"steps": 256, "n_envs": 4, "n_steps": 32, "batch_size": 64, "n_epochs": 2}
        run("CartPole-v1", out, seed=0, hidden_size=16, capture="summary", trace_envs=2, float16=float16, **kw)
        return out, list(kept)

    (old, none), (new, parts) = log("sink", False), log("tracer", True)
    assert none == [] and parts and all(k is not None for k in parts)
    assert 0 < sum(k for k, _ in parts) < sum(n for _, n in parts)  # some rows keep vectors, most do not
    a, b = _rows(old), _rows(new)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name
    assert any(v != "None" and v is not None for v in a["h"])
