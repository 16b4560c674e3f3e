"""``arch`` and ``--capture-obs`` for rsl_rl and TorchRL, on real tiny models: the measured gradient flow of
each loss term (exact answers), the user's modules never seen by the analysis, the CLI's arch on each
framework; rollout rows' observations equal the ones the framework stored for those env steps, and a
``--capture-obs`` log's report has its probes section."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import lstm_probe

pytest.importorskip("rsl_rl")
pytest.importorskip("torchrl")

from lstm_probe.integrations.rsl_rl import attach, train_cfg
from lstm_probe.integrations.rsl_rl.envs import GymVecEnv
from lstm_probe.integrations.rsl_rl.train import arch as rsl_arch
from lstm_probe.integrations.rsl_rl.train import build_runner
from lstm_probe.integrations.torchrl.train import arch as torchrl_arch
from lstm_probe.integrations.torchrl.train import build


def _runner(n_envs: int = 2, steps: int = 8, rnn: str = "lstm"):
    torch.manual_seed(0)
    env = GymVecEnv("Pendulum-v1", n_envs, seed=0, device="cpu")
    cfg = train_cfg(
        num_steps_per_env=steps,
        num_mini_batches=1,
        num_learning_epochs=1,
        learning_rate=1e-3,
        rnn_type=rnn,
        rnn_layers=1,
        hidden_size=8,
        mlp=(8,),
    )
    return build_runner(env, cfg)


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
def test_rsl_rl_actor_and_critic_rnns_are_separate_and_each_loss_reaches_its_own(rnn):
    a = rsl_arch("Pendulum-v1", hidden_size=8, rnn_type=rnn, lstm_layers=2)
    assert a.shared == []
    assert "actor.rnn.rnn" in a.actor_path and "critic.rnn.rnn" in a.critic_path
    table = a.table()
    assert table == {n: ("policy" if n.startswith("actor.") else "value") for n in table}
    flows = {p.name: p for p in a.params}
    assert {p.value_loss for n, p in flows.items() if n.startswith("actor.")} == {"no"}
    assert {p.policy_loss for n, p in flows.items() if n.startswith("critic.")} == {"no"}
    assert flows["actor.distribution.std_param"].entropy_loss == "yes"  # the Gaussian's entropy: its std only
    assert flows["actor.rnn.rnn.weight_hh_l1"].entropy_loss == "no"
    assert a.verdict == (
        f"actor and critic have separate {rnn.upper()}s: actor.rnn.rnn is trained by the policy loss only, "
        "critic.rnn.rnn by the value loss only."
    )


def test_rsl_rl_arch_leaves_the_users_runner_alone():
    runner = _runner()
    runner.learn(1)
    alg = runner.alg
    seen = []
    handles = [m.register_forward_hook(lambda *a: seen.append(1)) for m in alg.actor.modules()]
    before = {n: p.detach().clone() for n, p in alg.actor.named_parameters()}
    grads = {n: p.grad for n, p in alg.actor.named_parameters()}
    state = [s.clone() for s in alg.actor.rnn.hidden_state]
    rng = torch.get_rng_state()
    a = rsl_arch(runner)
    assert a.table() == {n: ("policy" if n.startswith("actor.") else "value") for n in a.table()}
    assert seen == []  # the user's hooks never saw the analysis
    assert all(torch.equal(p, before[n]) and p.grad is grads[n] for n, p in alg.actor.named_parameters())
    assert all(torch.equal(s, t) for s, t in zip(alg.actor.rnn.hidden_state, state, strict=True))
    assert torch.equal(torch.get_rng_state(), rng)
    for h in handles:
        h.remove()


def test_torchrl_shared_lstm_is_reached_by_both_losses():
    a = torchrl_arch("CartPole-v1", hidden_size=8)
    lstm = "actor.module.0.module.0.lstm"
    assert a.shared == [lstm]
    table = a.table()
    assert {n: by for n, by in table.items() if n.startswith(lstm + ".")} == {
        f"{lstm}.{w}": "both" for w in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
    }
    assert table["actor.module.0.module.1.module.weight"] == "policy"  # the logits head
    assert table["critic.module.1.module.weight"] == "value"  # the value head
    assert a.verdict.startswith("policy and value module share one LSTM")


def test_torchrl_separate_modules_each_trained_by_its_own_loss():
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import LSTMModule, ValueOperator

    _, actor, _, rnn = build("CartPole-v1", n_envs=1, hidden_size=8, seed=0)
    own = LSTMModule(input_size=4, hidden_size=8, in_key="observation", out_key="embed_v")
    critic = TensorDictSequential(own, ValueOperator(torch.nn.Linear(8, 1), in_keys=["embed_v"]))
    seen = []
    rnn.lstm.register_forward_hook(lambda *a: seen.append(1))
    a = torchrl_arch((actor, critic))
    table = a.table()
    assert a.shared == []
    assert {by for n, by in table.items() if n.startswith("actor.")} == {"policy"}
    assert {by for n, by in table.items() if n.startswith("critic.")} == {"value"}
    assert seen == []


@pytest.mark.parametrize(("framework", "env"), [("rsl_rl", "Pendulum-v1"), ("torchrl", "CartPole-v1")])
def test_cli_arch(tmp_path, framework, env):
    args = [sys.executable, "-m", "lstm_probe", "arch", env, "--framework", framework, "--hidden-size", "8"]
    r = subprocess.run([*args, "--json", "--dot", str(tmp_path / "a.dot")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    by = {p["name"]: p["trained_by"] for p in d["params"]}
    if framework == "rsl_rl":
        assert d["shared"] == [] and by["actor.rnn.rnn.weight_hh_l0"] == "policy"
        assert by["critic.rnn.rnn.weight_hh_l0"] == "value"
    else:
        assert by["actor.module.0.module.0.lstm.weight_hh_l0"] == "both"
    assert (tmp_path / "a.dot").read_text().startswith("digraph")
    r = subprocess.run([*args, "--rnn-type", "gru"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "separate GRUs" in r.stdout if framework == "rsl_rl" else "share one GRU" in r.stdout


def _rollout_obs(path, iteration=None):
    t = pq.read_table(path, columns=["phase", "module", "iteration", "env", "env_step", "obs"]).to_pandas()
    t = t[(t.phase == "rollout") & (t.module == t.module.iloc[0])]
    if iteration is not None:
        t = t[t.iteration == iteration]
    return t.sort_values(["env_step", "env"])


def test_rsl_rl_capture_obs_rows_hold_the_stored_observations(tmp_path):
    runner = _runner(n_envs=3, steps=8)
    with attach(runner, tmp_path / "r.parquet", capture_obs=True) as probe:
        runner.learn(2)
        stored = runner.alg.storage.observations["policy"].clone().numpy()  # (T, N, 3): the last rollout's
    rows = _rollout_obs(probe.path if hasattr(probe, "path") else tmp_path / "r.parquet", iteration=1)
    got = np.stack(rows.obs.to_numpy()).reshape(8, 3, 3)  # env step, then env
    assert np.array_equal(got, stored.astype(np.float32))
    assert lstm_probe.read_info(tmp_path / "r.parquet").metadata["obs_size"] == 3


def test_rsl_rl_capture_obs_cli_report_has_probes(tmp_path):
    cmd = [sys.executable, "-m", "lstm_probe"]
    run = [*cmd, "run", "Pendulum-v1", "--framework", "rsl_rl", "--capture-obs", "-q"]
    r = subprocess.run([*run, "--steps", "800", "--n-envs", "2", "--hidden-size", "8"], cwd=tmp_path, timeout=300)
    assert r.returncode == 0
    r = subprocess.run([*cmd, "report", "run.parquet", "--json"], cwd=tmp_path, capture_output=True, text=True)
    probes = json.loads(r.stdout)["probes"]
    assert probes["targets"] == ["obs:0", "obs:1", "obs:2"] and probes["rows"]


def test_torchrl_capture_obs_rows_hold_the_collected_observations(tmp_path):
    from torchrl.collectors import Collector

    from lstm_probe.integrations.torchrl import probe

    env, actor, _, _ = build("CartPole-v1", n_envs=2, hidden_size=8, seed=0)
    collector = Collector(env, actor, frames_per_batch=32, total_frames=64)
    seen = []
    with probe(actor, tmp_path / "t.parquet", capture_obs=True):
        for data in collector:
            seen.append(data["observation"].clone().numpy())  # (2 envs, 16 steps, 4)
    collector.shutdown()
    expected = np.concatenate(seen, axis=1)  # (env, step, 4)
    rows = _rollout_obs(tmp_path / "t.parquet")
    got = np.stack(rows.obs.to_numpy()).reshape(-1, 2, 4).transpose(1, 0, 2)
    assert np.array_equal(got, expected)
    rep = lstm_probe.summarize(tmp_path / "t.parquet").to_dict()
    assert rep["probes"]["targets"] == ["obs:0", "obs:1", "obs:2", "obs:3"]


def test_torchrl_arch_of_a_policy_with_an_encoder_before_its_lstm():
    """An encoder of the observation before the LSTM (its input key is the encoder's output): the synthetic batch
    cannot make up the observation, so arch asks for an example in one line (was a bare KeyError 'observation'),
    and with ``example`` (a TensorDict as env.reset() gives) the encoder is found trained by both losses."""
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.modules import LSTMModule, OneHotCategorical, ProbabilisticActor, ValueOperator

    torch.manual_seed(0)
    encoder = TensorDictModule(torch.nn.Linear(4, 6), in_keys=["observation"], out_keys=["features"])
    lstm = LSTMModule(input_size=6, hidden_size=8, in_key="features", out_key="embed")
    head = TensorDictModule(torch.nn.Linear(8, 2), in_keys=["embed"], out_keys=["logits"])
    actor = ProbabilisticActor(
        TensorDictSequential(encoder, lstm, head),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    own = LSTMModule(input_size=6, hidden_size=8, in_key="features", out_key="embed_v")
    critic = TensorDictSequential(encoder, own, ValueOperator(torch.nn.Linear(8, 1), in_keys=["embed_v"]))
    with pytest.raises(lstm_probe.BadInput, match=r"reads 'observation' before its RNN.*example=env.reset\(\)"):
        torchrl_arch((actor, critic))
    example = TensorDict({"observation": torch.zeros(4)}, batch_size=[])
    a = torchrl_arch((actor, critic), example=example)
    table = a.table()
    assert table["actor.module.0.module.0.module.weight"] == "both"  # the encoder, shared by actor and critic
    assert table["actor.module.0.module.1.lstm.weight_hh_l0"] == "policy"
    assert table["critic.module.1.lstm.weight_hh_l0"] == "value"
    assert "other shared modules: actor.module.0.module.0.module" in a.verdict
