"""Who shares what, and which loss trains which parameter: exact tables for every policy variant."""

import json
import shutil
import subprocess
import sys

import pydot
import pytest
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.env_util import make_vec_env
from tiny_envs import TinyDictEnv, TinyImageEnv

import lstm_probe
from lstm_probe.integrations.sb3.arch import arch, to_dot

SMALL = {"n_steps": 16, "batch_size": 16, "n_epochs": 1}


def expected(names, *, shared_extractor_trained_by=None, pi_extractor=None, vf_extractor=None):
    """The gradient-flow table sb3-contrib's code implies, by parameter name."""
    out = {}
    for n in names:
        if n.startswith(("lstm_actor.", "mlp_extractor.policy_net.", "action_net.")) or n == "log_std":
            out[n] = "policy"
        elif n.startswith(("lstm_critic.", "mlp_extractor.value_net.", "value_net.", "critic.")):
            out[n] = "value"
        elif n.startswith("features_extractor."):
            out[n] = shared_extractor_trained_by or pi_extractor
        elif n.startswith("pi_features_extractor."):
            out[n] = pi_extractor
        elif n.startswith("vf_features_extractor."):
            out[n] = vf_extractor
        else:
            raise AssertionError(f"unexpected parameter {n}")
    return out


def model(env, policy="MlpLstmPolicy", **policy_kwargs):
    return RecurrentPPO(
        policy,
        make_vec_env(env, n_envs=1, seed=0),
        seed=0,
        **SMALL,
        policy_kwargs={"lstm_hidden_size": 8, **policy_kwargs},
    )


@pytest.mark.parametrize("rollout", [False, True], ids=["synthetic", "rollout"])
@pytest.mark.parametrize(
    "env,policy,kwargs,lstms,shared",
    [
        ("Pendulum-v1", "MlpLstmPolicy", {}, {"lstm_actor", "lstm_critic"}, ["features_extractor.flatten"]),
        (
            "Pendulum-v1",
            "MlpLstmPolicy",
            {"shared_lstm": True, "enable_critic_lstm": False},
            {"lstm_actor"},
            ["features_extractor.flatten", "lstm_actor"],
        ),
        ("CartPole-v1", "MlpLstmPolicy", {"enable_critic_lstm": False}, {"lstm_actor"}, ["features_extractor.flatten"]),
        (
            "CartPole-v1",
            "MlpLstmPolicy",
            {"n_lstm_layers": 2},
            {"lstm_actor", "lstm_critic"},
            ["features_extractor.flatten"],
        ),
        ("CartPole-v1", "MlpLstmPolicy", {"share_features_extractor": False}, {"lstm_actor", "lstm_critic"}, []),
    ],
)
def test_mlp_variants(env, policy, kwargs, lstms, shared, rollout):
    m = model(env, policy, **kwargs)
    a = arch(m, rollout=rollout)
    names = [n for n, _ in m.policy.named_parameters()]
    assert a.table() == expected(names)
    assert {n.split(".")[0] for n in names if n.startswith("lstm")} == lstms
    assert a.shared == shared
    layers = kwargs.get("n_lstm_layers", 1)
    assert sum(n.startswith("lstm_actor.weight_ih_l") for n in names) == layers
    if kwargs.get("shared_lstm"):
        assert "trained by the policy loss only" in a.verdict and "share one LSTM" in a.verdict
        assert "lstm_actor" in a.critic_path  # the critic reads the actor's LSTM ...
        assert all(p.value_loss == "no" for p in a.params if p.name.startswith("lstm_actor"))  # ... detached


def test_cnn_policy_shared_extractor_is_trained_by_both_losses():
    m = model(TinyImageEnv, "CnnLstmPolicy")
    a = arch(m, rollout=True)
    names = [n for n, _ in m.policy.named_parameters()]
    assert a.table() == expected(names, shared_extractor_trained_by="both")
    assert "features_extractor.cnn.0" in a.shared
    assert "the features extractor is shared and trained by both losses" in a.verdict


def test_cnn_policy_separate_extractors():
    m = model(TinyImageEnv, "CnnLstmPolicy", share_features_extractor=False)
    a = arch(m, rollout=True)
    names = [n for n, _ in m.policy.named_parameters()]
    # sb3 names the actor's extractor both features_extractor and pi_features_extractor (one object)
    assert a.table() == expected(names, pi_extractor="policy", vf_extractor="value")
    assert not [s for s in a.shared if "features_extractor" in s]


def test_multi_input_policy():
    m = model(TinyDictEnv, "MultiInputLstmPolicy")
    a = arch(m, rollout=True)
    assert a.table() == expected([n for n, _ in m.policy.named_parameters()])


def test_saved_model_zip_and_dot(tmp_path):
    m = model("CartPole-v1", shared_lstm=True, enable_critic_lstm=False)
    m.save(tmp_path / "m.zip")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "lstm_probe",
            "arch",
            str(tmp_path / "m.zip"),
            "--json",
            "--dot",
            str(tmp_path / "a.dot"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["batch"].startswith("a synthetic minibatch")  # no env given: spaces only
    assert {p["name"]: p["trained_by"] for p in d["params"]}["lstm_actor.weight_hh_l0"] == "policy"
    graphs = pydot.graph_from_dot_file(str(tmp_path / "a.dot"))
    assert graphs and len(graphs[0].get_nodes()) >= 5
    edges = {(e.get_source().strip('"'), e.get_destination().strip('"')) for e in graphs[0].get_edges()}
    assert ("features_extractor.flatten", "lstm_actor") in edges
    if shutil.which("dot"):
        out = tmp_path / "a.svg"
        assert subprocess.run(["dot", "-Tsvg", str(tmp_path / "a.dot"), "-o", str(out)]).returncode == 0
        assert out.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_run_log_records_gradient_flow(tmp_path):
    from lstm_probe import ProbeCallback

    m = model("CartPole-v1")
    m.learn(32, callback=ProbeCallback(tmp_path / "r.parquet"))
    rep = lstm_probe.summarize(tmp_path / "r.parquet")
    assert rep.architecture.gradient_flow["lstm_critic.weight_hh_l0"] == "value"
    assert rep.architecture.gradient_flow["lstm_actor.weight_hh_l0"] == "policy"
    assert "gradient flow measured on a synthetic minibatch" in rep.architecture.verdict
    assert "lstm_critic by the value loss only" in rep.architecture.verdict


def test_bad_targets(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "arch", "missing.zip"], capture_output=True, text=True, cwd=tmp_path
    )
    assert r.returncode == 2 and "does not exist" in r.stderr
    (tmp_path / "junk.zip").write_text("no")
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "arch", "junk.zip"], capture_output=True, text=True, cwd=tmp_path
    )
    assert r.returncode == 2 and "cannot load" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_dot_is_valid_for_every_variant():
    for kwargs in ({}, {"shared_lstm": True, "enable_critic_lstm": False}):
        src = to_dot(arch(model("CartPole-v1", **kwargs)))
        assert pydot.graph_from_dot_data(src)


def test_the_gradient_pass_runs_the_copy_in_training_mode_as_recurrent_ppo_train_does(monkeypatch):
    """cuDNN computes no RNN backward in eval mode ("cudnn RNN backward can only be called in training mode"):
    with the copy in eval mode every probed RecurrentPPO run on CUDA failed at its first step. The losses run
    with the copy in training mode, as RecurrentPPO.train runs the policy; the user's policy keeps its mode."""
    import lstm_probe.integrations.sb3.arch as arch_module

    seen = []
    losses = arch_module._losses

    def spy(model, policy, batch):
        seen.append({name: m.training for name, m in policy.named_modules() if name.startswith("lstm")})
        return losses(model, policy, batch)

    monkeypatch.setattr(arch_module, "_losses", spy)
    m = model("CartPole-v1", "MlpLstmPolicy")
    m.policy.set_training_mode(False)
    arch(m)
    assert seen and all(all(modes.values()) for modes in seen), seen
    assert not m.policy.training and not m.policy.lstm_actor.training  # the user's policy as it was
