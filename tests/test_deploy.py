"""lstm-probe export and replay (issue #41): every RecurrentPPO variant exported to ONNX and TorchScript, read
back with onnxruntime / torch.jit and run beside sb3-contrib's own policy over 5 recorded episodes; recordings
of deployment loops with planted bugs, each named. Real RecurrentPPO models, real files, the CLI as a user
runs it."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from sb3_contrib import RecurrentPPO
from sb3_contrib.common.recurrent.type_aliases import RNNStates
from stable_baselines3.common.torch_layers import FlattenExtractor
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

import lstm_probe
from lstm_probe import BadInput
from tests.refusals import one_line_error

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
VARIANTS = {  # name: (env, policy_kwargs)
    "separate": ("Pendulum-v1", {}),
    "shared": ("Pendulum-v1", {"shared_lstm": True, "enable_critic_lstm": False}),
    "no critic LSTM": ("CartPole-v1", {"enable_critic_lstm": False}),
    "two layers": ("Pendulum-v1", {"n_lstm_layers": 2}),
}


def cli(*args):
    cmd = [sys.executable, "-m", "lstm_probe", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)


def _train(env, seed=0, steps=128, **kw):
    torch.set_num_threads(1)
    m = RecurrentPPO(
        "MlpLstmPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=seed, device="cpu",
        policy_kwargs={"lstm_hidden_size": 16, **kw},
    )  # fmt: skip
    return m.learn(steps) if steps else m


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """One trained model.zip per variant; the CartPole one trained with the probe, so its log holds the
    episodes it was trained on (--capture-obs)."""
    d = tmp_path_factory.mktemp("deploy")
    out = {}
    for name, (env, kw) in VARIANTS.items():
        m = _train(env, **kw)
        m.save(d / f"{name}.zip")
        out[name] = (m, d / f"{name}.zip")
    log = d / "cartpole.parquet"
    m = out["no critic LSTM"][0]
    m.learn(256, callback=lstm_probe.ProbeCallback(log, capture_obs=True), reset_num_timesteps=False)
    m.save(d / "no critic LSTM.zip")
    return d, out, log


def _episodes(log):
    """The first 5 episodes of a --capture-obs log: (obs, episode_start), read with pandas, not lstm-probe."""
    df = pd.read_parquet(log)
    df = df[(df.phase == "rollout") & (df.module == "actor") & (df.layer == 0)].sort_values(
        ["env", "episode", "env_step"]
    )
    keys = df[["env", "episode"]].drop_duplicates().head(5)
    df = df.merge(keys)
    starts = np.r_[True, (df[["env", "episode"]].to_numpy()[1:] != df[["env", "episode"]].to_numpy()[:-1]).any(1)]
    return np.stack(df.obs.to_numpy()).astype(np.float32), starts


def _pendulum_episodes(model):
    """5 episodes of Pendulum-v1 (seeds 0..4) acted on by sb3's own predict, state fed back."""
    env, obs, starts = gym.make("Pendulum-v1"), [], []
    for seed in range(5):
        o, _ = env.reset(seed=seed)
        state = None
        for t in range(200):
            obs.append(o.astype(np.float32))
            starts.append(t == 0)
            a, state = model.predict(o, state=state, episode_start=np.array([t == 0]), deterministic=True)
            o, *_ = env.step(a)
    return np.stack(obs), np.array(starts)


def _sb3_loop(model, obs, starts, critic):
    """sb3-contrib's RecurrentActorCriticPolicy.forward over the episodes, deterministic, its state fed back;
    the action clipped as predict clips it."""
    p = model.policy
    zeros = torch.zeros(p.lstm_actor.num_layers, 1, p.lstm_actor.hidden_size)
    states = RNNStates((zeros, zeros), (zeros, zeros))
    rows = []
    for o, s in zip(obs, starts, strict=True):
        with torch.no_grad():
            a, v, _, states = p(torch.as_tensor(o[None]), states, torch.tensor([float(s)]), deterministic=True)
        a = a.numpy()
        if hasattr(p.action_space, "low"):
            a = np.clip(a, p.action_space.low, p.action_space.high)
        vf = [states.vf[0].numpy(), states.vf[1].numpy()] if critic else []
        rows.append([a, v.numpy(), states.pi[0].numpy(), states.pi[1].numpy(), *vf])
    return rows


def _file_loop(path, obs, starts, n_states, layers, hidden):
    """The exported file, read back with onnxruntime or torch.jit, over the same episodes."""
    state = [np.zeros((layers, 1, hidden), np.float32) for _ in range(n_states)]
    if path.suffix == ".onnx":
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        run = lambda *xs: sess.run(None, dict(zip(names, xs, strict=True)))  # noqa: E731
    else:
        mod = torch.jit.load(str(path))
        run = lambda *xs: [t.numpy() for t in mod(*map(torch.as_tensor, xs))]  # noqa: E731
    rows = []
    for o, s in zip(obs, starts, strict=True):
        out = run(o[None], np.array([s], np.float32), *state)
        state = out[2:]
        rows.append(out)
    return rows


def _relative(got, want):
    """Per output: max over steps of max|a - b|, over the largest |b| of that output in the episodes."""
    errs = []
    for k in range(len(want[0])):
        a = np.stack([np.ravel(r[k]) for r in got]).astype(np.float64)
        b = np.stack([np.ravel(r[k]) for r in want]).astype(np.float64)
        errs.append(float(np.abs(a - b).max() / (np.abs(b).max() or 1.0)))
    return errs


@pytest.mark.parametrize("suffix", [".onnx", ".pt"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_exports_and_agrees_with_the_pytorch_policy(models, variant, suffix):
    d, trained, log = models
    model, zip_path = trained[variant]
    out = d / f"{variant}{suffix}".replace(" ", "_")
    env_id = VARIANTS[variant][0]
    where = {"log": log} if env_id == "CartPole-v1" else {"env_id": env_id}
    r = lstm_probe.export(zip_path, out, **where)
    critic = variant in ("separate", "two layers")
    names = ["obs", "episode_start", "h", "c", *(["h_critic", "c_critic"] if critic else [])]
    assert [n for n, _, _ in r.spec.inputs()] == names
    assert [n for n, _, _ in r.spec.outputs()] == ["action", "value", *(f"{n}_out" for n in names[2:])]
    assert r.spec.variant == variant.replace("two layers", "separate") and r.episodes == 5
    layers = 2 if variant == "two layers" else 1
    assert r.spec.inputs()[2][1] == [layers, "batch", 16]
    assert max(r.errors.values()) <= 1e-5
    obs, starts = _episodes(log) if env_id == "CartPole-v1" else _pendulum_episodes(model)
    assert starts.sum() == 5
    got = _file_loop(out, obs, starts, len(names) - 2, layers, 16)
    want = _sb3_loop(model, obs, starts, critic)
    errs = _relative(got, want)
    assert max(errs) <= 1e-5, dict(zip(["action", "value", *names[2:]], errs, strict=True))
    if suffix == ".onnx":  # names, shapes and the spec in the file's metadata
        import onnx

        proto = onnx.load(str(out))
        meta = json.loads({p.key: p.value for p in proto.metadata_props}["lstm_probe.deploy"])
        assert [i["name"] for i in meta["inputs"]] == names and meta["layers"] == layers
        assert [i.name for i in proto.graph.input] == names
    else:
        extra = {"lstm_probe.deploy.json": ""}
        torch.jit.load(str(out), _extra_files=extra)
        assert json.loads(extra["lstm_probe.deploy.json"])["outputs"][0]["name"] == "action"


def test_export_refuses_with_the_first_divergence_and_writes_nothing(models):
    d, trained, _ = models
    out = d / "strict.onnx"
    r = cli("export", trained["separate"][1], out, "--env", "Pendulum-v1", "--episodes", "1", "--tolerance", "1e-12")
    line = one_line_error(
        r, "parts from the PyTorch policy at episode 0 step", "tolerance 1e-12", "nothing was written"
    )
    assert not out.exists() and not list(d.glob(".strict*")), line
    one_line_error(cli("export", trained["separate"][1], d / "x.onnx"), "--log LOG", "--env ENV_ID")
    with pytest.raises(BadInput, match=r"OUT\.onnx"):
        lstm_probe.export(trained["separate"][1], d / "x.txt", env_id="Pendulum-v1")


def test_export_cli_prints_names_shapes_and_the_error(models):
    d, trained, log = models
    r = cli("export", trained["no critic LSTM"][1], d / "cli.onnx", "--log", log)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if not line.startswith("export: ")]  # its progress
    assert lines[:4] == [
        "in  obs             float32  [batch, 4]",
        "in  episode_start   float32  [batch]",
        "in  h               float32  [1, batch, 16]",
        "in  c               float32  [1, batch, 16]",
    ]
    assert lines[4] == "out action          int64    [batch]"
    assert "verified on" in r.stdout and ", tolerance 1e-05" in r.stdout and (d / "cli.onnx").is_file()
    assert "max relative error: action 0.0e+00, value " in r.stdout  # a Discrete action: equal at every step


def test_export_refuses_a_policy_that_gives_nan(models):
    """A NaN is a divergence: a NaN error is not over the tolerance (NaN > tol is False), nor within it."""
    d, _, _ = models
    model = _train("Pendulum-v1", steps=0)
    with torch.no_grad():
        model.policy.value_net.bias.fill_(float("nan"))
    out = d / "nan.pt"
    with pytest.raises(BadInput, match=r"at episode 0 step 0: value \[nan\] vs \[nan\] \(a NaN, not within the") as e:
        lstm_probe.export(model, out, env_id="Pendulum-v1", episodes=1)
    assert "nothing was written" in str(e.value) and "\n" not in str(e.value)
    assert not out.exists() and not list(d.glob(".nan*"))


class _Untraceable(FlattenExtractor):
    """A features extractor that torch.jit.trace cannot trace, failing with an empty message."""

    def forward(self, observations):
        if torch.jit.is_tracing():
            raise ValueError()
        return super().forward(observations)


def test_export_refuses_an_untraceable_policy_in_one_line(models):
    d, _, _ = models
    model = _train("Pendulum-v1", steps=0, features_extractor_class=_Untraceable)
    with pytest.raises(BadInput, match=r"^torch\.jit\.trace could not trace this policy: ValueError$"):
        lstm_probe.export(model, d / "untraceable.pt", env_id="Pendulum-v1", episodes=1)
    assert not (d / "untraceable.pt").exists()


def test_export_refuses_an_existing_out_unless_forced(models):
    d, trained, log = models
    out = d / "existing.pt"
    out.write_bytes(b"the user's file")
    zip_path = trained["no critic LSTM"][1]
    line = one_line_error(cli("export", zip_path, out, "--log", log, "--episodes", "1"), "already exists", "--force")
    assert out.read_bytes() == b"the user's file", line
    with pytest.raises(BadInput, match="already exists; pass --force"):
        lstm_probe.export(zip_path, out, log=log, episodes=1)
    r = cli("export", zip_path, out, "--log", log, "--episodes", "1", "--force")
    assert r.returncode == 0, r.stderr
    extra = {"lstm_probe.deploy.json": ""}
    torch.jit.load(str(out), _extra_files=extra)  # the exported policy replaced the user's file
    assert json.loads(extra["lstm_probe.deploy.json"])["variant"] == "no critic LSTM"
    r2 = lstm_probe.export(zip_path, out, log=log, episodes=1, force=True)
    assert r2.path == out and out.is_file()


# -- replay ---------------------------------------------------------------------------------------------
BUGS = {  # the planted loop: the verdict replay must give
    "correct": "correct",
    "not fed": "state not fed back",
    "every step": "reset every step",
    "no reset": "not reset at episode starts",
    "swapped": "h and c swapped",
    "no norm": "observation normalisation missing",
    "float16": "float16",
}


@pytest.fixture(scope="module")
def normalised(tmp_path_factory):
    """A RecurrentPPO trained under VecNormalize, its statistics saved as .npz, exported to ONNX; and a
    model of the same shape with other weights."""
    d = tmp_path_factory.mktemp("replay")
    venv = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    m = _train(venv, steps=256)
    m.save(d / "vn.zip")
    rms = venv.obs_rms
    np.savez(d / "vn.npz", mean=rms.mean, var=rms.var, clip_obs=venv.clip_obs, epsilon=venv.epsilon)
    lstm_probe.export(d / "vn.zip", d / "vn.onnx", env_id="Pendulum-v1", episodes=1)
    return d, m, venv, _train("Pendulum-v1", seed=1, steps=0)


def _half(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def _half_policy(model):
    """A copy of the model's policy as a float16 runtime holds it: every weight rounded to float16."""
    # built as RecurrentPPO._setup_model builds it (a deepcopy fails on the distribution's graph tensors)
    policy = model.policy_class(model.observation_space, model.action_space, model.lr_schedule, **model.policy_kwargs)
    policy.load_state_dict(model.policy.state_dict())
    policy.set_training_mode(False)
    with torch.no_grad():
        for p in policy.parameters():
            p.copy_(p.half().float())
    return policy


def _record(bug, model, venv, episodes=2, steps=60):
    """A deployment loop written with sb3's own predict, with one planted bug; the trace it records (raw
    env observations, as the runtime saw them). The float16 loop is a half-precision runtime: weights,
    observations and states in float16, the arithmetic in float32 (no CPU float16 kernel needed)."""
    env, rows, state = gym.make("Pendulum-v1"), [], None
    policy = _half_policy(model) if bug == "float16" else model.policy
    for e in range(episodes):
        raw, _ = env.reset(seed=e)
        for t in range(steps):
            obs = (raw if bug == "no norm" else venv.normalize_obs(raw))[None].astype(np.float32)
            if bug == "float16":
                obs = _half(obs)
                state = None if state is None else tuple(_half(s) for s in state)
            kw = {"state": state, "episode_start": np.array([t == 0]), "deterministic": True}
            if bug == "not fed":
                kw["state"] = None
            elif bug == "every step":
                kw["episode_start"] = np.array([True])
            elif bug == "no reset":
                kw["episode_start"] = np.array([False])
            action, state = policy.predict(obs, **kw)
            if bug == "swapped":
                state = (state[1], state[0])
            rows.append({"env": 0, "step": e * steps + t, "obs": raw.tolist(), "action": action[0].tolist()})
            rows[-1]["episode_start"] = t == 0
            raw, *_ = env.step(action[0])
    return pd.DataFrame(rows)


@pytest.mark.parametrize("bug", list(BUGS))
def test_replay_names_each_planted_bug(normalised, bug):
    d, model, venv, _ = normalised
    path = d / f"{bug}.parquet"
    _record(bug, model, venv).to_parquet(path)
    r = lstm_probe.replay(path, d / "vn.zip", vecnormalize=d / "vn.npz")
    assert BUGS[bug] in [r.verdict, *r.also], (r.verdict, r.also)
    if bug == "correct":
        assert r.verdict == "correct" and r.also == [] and r.parted is None
    elif bug in ("not fed", "every step"):  # the same computation for RecurrentPPO: both named
        assert (r.verdict, r.also) == ("state not fed back", ["reset every step"])
        assert r.parted == (0, 1)  # step 0 starts from zeros in every loop
    elif bug == "no reset":  # identical through the first episode, parts at the second's first step
        assert r.verdict == "not reset at episode starts" and r.parted == (0, 60)
    else:
        assert r.verdict == BUGS[bug] and r.also == []
    by_name = {lp.name: lp for lp in r.loops}
    assert by_name[BUGS[bug]].agree == by_name[BUGS[bug]].steps == 120


def test_replay_with_the_onnx_file_and_other_weights(normalised):
    d, model, venv, other = normalised
    for bug in ("correct", "swapped", "no norm", "float16"):
        _record(bug, model, venv).to_parquet(d / f"o-{bug}.parquet")
        r = lstm_probe.replay(d / f"o-{bug}.parquet", d / "vn.onnx", vecnormalize=d / "vn.npz")
        assert r.verdict == BUGS[bug] and r.also == [], (bug, r.verdict, r.also)
        assert {lp.name: lp.agree for lp in r.loops}[BUGS[bug]] == 120  # the file's weights rounded too
    _record("correct", other, venv).to_parquet(d / "other.parquet")
    r = lstm_probe.replay(d / "other.parquet", d / "vn.onnx", vecnormalize=d / "vn.npz")
    assert r.verdict == "not this policy" and r.parted == (0, 0)
    assert max(lp.agree for lp in r.loops) == 0


def test_replay_cli_reads_csv_and_refuses_unsafe_files(normalised):
    d, model, venv, _ = normalised
    df = _record("swapped", model, venv)
    wide = pd.DataFrame({"env": df.env, "step": df.step, "episode_start": df.episode_start.astype(int)})
    for i in range(3):
        wide[f"obs_{i}"] = [o[i] for o in df.obs]
    wide["action_0"] = [a[0] for a in df.action]
    wide.iloc[::-1].to_csv(d / "swapped.csv", index=False)  # rows in any order: sorted by env, step
    r = cli("replay", d / "swapped.csv", "--policy", d / "vn.onnx", "--vecnormalize", d / "vn.npz")
    assert r.returncode == 0, r.stderr
    assert "verdict: h and c swapped" in r.stdout
    assert "the correct loop and the recording part at env 0 step 1" in r.stdout
    pt = d / "vn.pt"
    lstm_probe.export(d / "vn.zip", pt, env_id="Pendulum-v1", episodes=1)
    one_line_error(cli("replay", d / "swapped.csv", "--policy", pt), "TorchScript", "--trust-model")
    (d / "vn.pkl").write_bytes(b"not read")
    one_line_error(
        cli("replay", d / "swapped.csv", "--policy", d / "vn.onnx", "--vecnormalize", d / "vn.pkl"), "pickle"
    )


def test_a_nan_in_the_recording_is_a_divergence(normalised):
    d, model, venv, _ = normalised
    df = _record("correct", model, venv)
    df.at[30, "action"] = [float("nan")]
    df.to_parquet(d / "null.parquet")  # pandas writes a NaN in a list as a null: refused
    one_line_error(cli("replay", d / "null.parquet", "--policy", d / "vn.onnx"), "action has nulls")
    pq.write_table(pa.table({c: pa.array(df[c].tolist()) for c in df.columns}), d / "nan.parquet")  # NaN kept
    r = lstm_probe.replay(d / "nan.parquet", d / "vn.onnx", vecnormalize=d / "vn.npz")
    assert r.verdict != "correct" and r.parted == (0, 30), (r.verdict, r.parted)
    correct = r.loops[0]
    assert correct.name == "correct" and correct.agree == correct.steps - 1 == 119


def test_replay_refuses_repeated_and_missing_steps(normalised):
    """Each env's steps, sorted, must run one by one: a repeated or missing step would be replayed as the next
    one, the state carried to the wrong observation."""
    d, model, venv, _ = normalised
    df = _record("correct", model, venv, episodes=2, steps=10)
    pd.concat([df, df.iloc[[4]]]).to_parquet(d / "repeated.parquet")
    line = one_line_error(cli("replay", d / "repeated.parquet", "--policy", d / "vn.onnx"), "env 0 step 4")
    assert "more than one row" in line
    per_episode = df.assign(step=df.step % 10)  # steps counted from 0 in each episode: each step twice
    per_episode.to_parquet(d / "per-episode.parquet")
    with pytest.raises(BadInput, match="env 0 step 0 is in more than one row"):
        lstm_probe.replay(d / "per-episode.parquet", d / "vn.onnx")
    df.drop(index=[4, 5]).to_parquet(d / "gap.parquet")
    with pytest.raises(BadInput, match=r"env 0 goes from step 3 to step 6 \(steps 4\.\.5 are missing\)"):
        lstm_probe.replay(d / "gap.parquet", d / "vn.onnx")
    two = pd.concat([df, df.assign(env=1).drop(index=[12])])
    two.to_parquet(d / "gap-env1.parquet")
    with pytest.raises(BadInput, match=r"env 1 goes from step 11 to step 13 \(step 12 is missing\)"):
        lstm_probe.replay(d / "gap-env1.parquet", d / "vn.onnx")


def test_replay_reads_within_the_memory_budget(normalised):
    """A small Parquet file that decodes huge (constant columns compress to almost nothing) is refused from
    its footer, before a row is read."""
    d = normalised[0]
    n, width = 20_000, 100
    zeros = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n * width)), width)
    table = pa.table({"env": np.zeros(n, np.int64), "step": np.zeros(n, np.int64), "obs": zeros})
    table = table.append_column("action", pa.array(np.zeros(n))).append_column("episode_start", pa.array([0] * n))
    pq.write_table(table, d / "huge.parquet")
    assert (d / "huge.parquet").stat().st_size < 64 << 10  # 16 MB of obs once decoded
    r = cli("--max-memory", "4M", "replay", d / "huge.parquet", "--policy", d / "vn.onnx")
    one_line_error(r, "huge.parquet", "over the 4 MiB memory budget", "--max-memory")


def test_export_and_replay_leave_the_users_model_as_it_was(normalised):
    """Both work on a private copy: the user's parameters, hooks, modes and gradients are as they were."""
    d, model, venv, _ = normalised
    _record("correct", model, venv, episodes=1, steps=20).to_parquet(d / "untouched.parquet")
    policy = model.policy
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    calls = []
    handle = policy.lstm_actor.register_forward_hook(lambda *_: calls.append(1))
    hooks, training = _hooks(policy), policy.training
    grads = [p.requires_grad for p in policy.parameters()]
    grad_values = [None if p.grad is None else p.grad.clone() for p in policy.parameters()]
    try:
        lstm_probe.export(model, d / "untouched.pt", env_id="Pendulum-v1", episodes=1)
        r = lstm_probe.replay(d / "untouched.parquet", model, vecnormalize=d / "vn.npz")
        assert _hooks(policy) == hooks  # the user's hook still there, and no other added
    finally:
        handle.remove()
    # one episode of 20 steps: the correct loop agrees (the never-resetting one too: 'cannot tell'); the hook never
    # ran: export and replay ran copies
    assert "correct" in [r.verdict, *r.also] and r.parted is None and calls == []
    after = policy.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert policy.training == training and [p.requires_grad for p in policy.parameters()] == grads
    assert all(_same(p.grad, g) for p, g in zip(policy.parameters(), grad_values, strict=True))
    copy.deepcopy(model)  # still copyable


def _hooks(module):
    """Every hook on ``module`` and its submodules, by module name."""
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return {name: [dict(getattr(m, k)) for k in kinds] for name, m in module.named_modules()}


def _same(a, b):
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
