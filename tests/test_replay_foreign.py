"""`lstm-probe replay TRACE --policy policy.onnx` for a recurrent policy lstm-probe did not write (issue #49):
the files rsl_rl's own exporter (``OnPolicyRunner.export_policy_to_onnx`` of ``RNNModel.as_onnx``: inputs obs,
h_in, c_in; outputs actions, h_out, c_out; weights beside it in ``.onnx.data``) and Isaac Lab's
``_OnnxPolicyExporter`` (isaaclab_rl/rsl_rl/exporter.py: the same names, opset 11, TorchScript-based exporter)
write, of tiny rsl_rl RNNModels. Each deployed loop is recorded with onnxruntime alone (as Isaac Lab's play
script steps the file), correct or with a planted bug, and replay names it; a hostile or ambiguous foreign
graph is refused in one line (exit 2), its strings inert."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("rsl_rl")
ort = pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import lstm_probe  # noqa: E402
from lstm_probe import BadInput  # noqa: E402
from lstm_probe.deploy.runtime import open_file  # noqa: E402
from lstm_probe.integrations.rsl_rl.train import build_runner, make_env, train_cfg  # noqa: E402
from tests.refusals import bounded_cli, one_line_error, refused_within  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
EPISODES, STEPS, HIDDEN = 3, 25, 8
TITLE = "u\x1b]0;PWNED\x07\x1b[2J"
"""A name that retitles and clears a terminal printed raw."""


class IsaacLabExporter(torch.nn.Module):
    """Isaac Lab's ``_OnnxPolicyExporter`` (isaaclab_rl/rsl_rl/exporter.py) for a recurrent policy: its
    ``forward_lstm`` and ``export`` as written there (the normaliser, the RNN, the actor's MLP; opset 11, no
    dynamic axes, torch's TorchScript-based exporter as on the torch versions Isaac Lab ships), on the parts of
    rsl_rl 5.5's ``RNNModel``. ``names``: other input and output names, for the flags."""

    def __init__(self, model, names=(("obs", "h_in", "c_in"), ("actions", "h_out", "c_out"))):
        super().__init__()
        self.rnn = copy.deepcopy(model.rnn.rnn)
        self.actor = copy.deepcopy(model.mlp)
        self.normalizer = copy.deepcopy(model.obs_normalizer)
        self.names = names

    def forward(self, x_in, h_in, c_in):
        x_in = self.normalizer(x_in)
        x, (h, c) = self.rnn(x_in.unsqueeze(0), (h_in, c_in))
        x = x.squeeze(0)
        return self.actor(x), h, c

    def export(self, path):
        obs = torch.zeros(1, self.rnn.input_size)
        h_in = torch.zeros(self.rnn.num_layers, 1, self.rnn.hidden_size)
        c_in = torch.zeros(self.rnn.num_layers, 1, self.rnn.hidden_size)
        torch.onnx.export(
            self.eval(), (obs, h_in, c_in), str(path), export_params=True, opset_version=11,
            input_names=list(self.names[0]), output_names=list(self.names[1]), dynamic_axes={}, dynamo=False,
        )  # fmt: skip


def _runner(cell, seed, layers=1, normalise=False):
    torch.manual_seed(seed)
    cfg = train_cfg(learning_rate=1e-3, rnn_type=cell, rnn_layers=layers, hidden_size=HIDDEN, mlp=(16,))
    cfg["actor"]["obs_normalization"] = normalise
    runner = build_runner(make_env("Pendulum-v1", 1, seed=0, torch_env=False, device="cpu"), cfg)
    model = runner.alg.get_policy()
    if normalise:  # statistics of their own, so that the graph's normaliser matters
        model.obs_normalizer.train()
        model.obs_normalizer.update(torch.randn(256, 3) * torch.tensor([0.5, 0.5, 3.0]) + 0.2)
    return runner


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("foreign")
    torch.set_num_threads(1)
    with warnings.catch_warnings():  # the exporters' own (deprecations, tracer warnings)
        warnings.simplefilter("ignore")
        _export(d)
    return d


def _export(d):
    lstm = _runner("lstm", 0, layers=2, normalise=True)
    lstm.export_policy_to_onnx(str(d), "rsl_lstm.onnx")  # rsl_rl's own exporter
    _runner("gru", 1).export_policy_to_onnx(str(d), "rsl_gru.onnx")
    _runner("lstm", 2, layers=2, normalise=True).export_policy_to_onnx(str(d), "other.onnx")
    IsaacLabExporter(lstm.alg.get_policy()).export(d / "isaac.onnx")
    names = (("x", "hx", "cx"), ("y", "hy", "cy"))
    IsaacLabExporter(lstm.alg.get_policy(), names).export(d / "renamed.onnx")


def record(d, policy, bug, name, norm=None):
    """A deployed loop of ``policy`` (onnxruntime alone, one env, episodes back to back), correct or with
    ``bug``, written as a trace ``name``; ``norm``: the observation normalisation the loop applies."""
    sess = ort.InferenceSession(str(d / policy))
    obs_name, *states = [i.name for i in sess.get_inputs()]
    shapes = [i.shape for i in sess.get_inputs()[1:]]

    def half(a):
        return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)

    if bug == "float16":  # a half-precision runtime: weights, observations and states in float16
        proto = onnx.load(str(d / policy))
        for t in proto.graph.initializer:
            if t.data_type == TensorProto.FLOAT:
                t.CopyFrom(numpy_helper.from_array(half(numpy_helper.to_array(t)), t.name))
        sess = ort.InferenceSession(proto.SerializeToString())
    env, rows = gym.make("Pendulum-v1"), []
    state = [np.zeros(s, np.float32) for s in shapes]
    for episode in range(EPISODES):
        obs, _ = env.reset(seed=episode)
        if bug != "no reset":  # Isaac Lab's play script never resets (IsaacLab #3837/#3838)
            state = [np.zeros(s, np.float32) for s in shapes]
        for t in range(STEPS):
            if bug == "not fed":
                state = [np.zeros(s, np.float32) for s in shapes]
            fed = obs if norm is None or bug == "no norm" else norm(obs)
            feed = {obs_name: np.asarray(fed, np.float32)[None], **dict(zip(states, state, strict=True))}
            if bug == "float16":
                feed = {k: half(v) for k, v in feed.items()}
            action, *new = sess.run(None, feed)
            state = [half(s) for s in new] if bug == "float16" else new
            if bug == "swapped":
                state = state[::-1]
            rows.append({"step": len(rows), "obs": obs.tolist(), "action": action[0].tolist(), "episode_start": t == 0})
            obs, *_ = env.step(action[0])
    pq.write_table(pa.Table.from_pylist(rows), d / name)
    return d / name


def cli(*args, cwd):
    cmd = [sys.executable, "-m", "lstm_probe", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120, cwd=cwd)


def test_the_exporters_files_are_read_by_their_names(files):
    d = files
    for name, cell, layers in (("rsl_lstm", "lstm", 2), ("rsl_gru", "gru", 1), ("isaac", "lstm", 2)):
        opened = open_file(d / f"{name}.onnx")
        spec, roles = opened.spec, opened.roles
        assert (spec.cell, spec.layers, spec.hidden, spec.obs_shape, spec.action_shape) == (
            cell, layers, HIDDEN, (3,), (1,)
        )  # fmt: skip
        assert roles is not None and roles.batch == 1 and "value" not in roles.names  # actor alone, batch fixed
        assert roles.names["h"] == "h_in" and roles.names["action"] == "actions"
    assert (d / "rsl_lstm.onnx.data").exists()  # rsl_rl's weights beside its file: read from there
    assert "Constant" in {n.op_type for n in onnx.load(str(d / "isaac.onnx")).graph.node}


BUGS = {
    "correct": "correct",
    "no reset": "not reset at episode starts",
    "not fed": "state not fed back",
    "swapped": "h and c swapped",
    "float16": "float16",
}


@pytest.mark.parametrize("policy", ["rsl_lstm.onnx", "rsl_gru.onnx", "isaac.onnx"])
def test_replay_names_each_planted_bug(files, policy):
    d = files
    for bug, want in BUGS.items():
        if bug == "swapped" and "gru" in policy:
            continue  # a GRU has no c
        trace = record(d, policy, bug, f"{policy}-{bug}.parquet")
        r = lstm_probe.replay(trace, d / policy)
        assert r.verdict == want, (bug, [(lp.name, lp.agree) for lp in r.loops])
        assert r.also == (["reset every step"] if bug == "not fed" else [])
    assert "h and c swapped" not in [lp.name for lp in r.loops] or "gru" not in policy
    other = record(d, "other.onnx", "correct", "other.parquet")
    assert lstm_probe.replay(other, d / policy).verdict == "not this policy"


def test_normalisation_missing_with_the_statistics(files, tmp_path):
    """A file without the normaliser (rsl_rl's GRU, obs_normalization off), the loop normalising outside it."""
    d = files
    mean, var = np.array([0.2, -0.1, 0.5]), np.array([0.3, 0.4, 4.0])
    np.savez(tmp_path / "stats.npz", mean=mean, var=var, clip_obs=10.0, epsilon=1e-8)

    def norm(obs):
        return np.clip((obs - mean) / np.sqrt(var + 1e-8), -10, 10)

    for bug, want in (("correct", "correct"), ("no norm", "observation normalisation missing")):
        trace = record(d, "rsl_gru.onnx", bug, f"norm-{bug}.parquet", norm=norm)
        r = lstm_probe.replay(trace, d / "rsl_gru.onnx", vecnormalize=tmp_path / "stats.npz")
        assert r.verdict == want, [(lp.name, lp.agree) for lp in r.loops]


def test_the_cli_names_a_play_script_that_never_resets(files):
    """The headline: Isaac Lab's play script never resets the memory between episodes."""
    d = files
    trace = record(d, "isaac.onnx", "no reset", "play.parquet")
    r = cli("replay", trace, "--policy", "isaac.onnx", cwd=d)
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert "verdict: not reset at episode starts" in r.stdout


def test_names_stated_with_flags(files):
    d = files
    trace = record(d, "isaac.onnx", "correct", "renamed.parquet")  # the same weights as renamed.onnx
    line = one_line_error(cli("replay", trace, "--policy", "renamed.onnx", cwd=d), "--name obs=NAME", "'x'")
    assert "not exported by lstm-probe" in line
    flags = [f"--name={role}={name}" for role, name in zip(("obs", "h", "c"), ("x", "hx", "cx"), strict=True)]
    flags += [
        f"--name={role}={name}" for role, name in zip(("action", "h_out", "c_out"), "y hy cy".split(), strict=True)
    ]
    r = cli("replay", trace, "--policy", "renamed.onnx", *flags, cwd=d)
    assert r.returncode == 0 and "verdict: correct" in r.stdout, r.stderr
    names = dict(f.removeprefix("--name=").split("=") for f in flags)
    assert lstm_probe.replay(trace, d / "renamed.onnx", names=names).verdict == "correct"
    one_line_error(cli("replay", trace, "--policy", "renamed.onnx", "--name", "bogus", cwd=d), "ROLE=NAME")
    with pytest.raises(BadInput, match="names the inputs and outputs of an ONNX file lstm-probe did not write"):
        lstm_probe.replay(trace, d / "model.zip", names={"obs": "obs"})


def test_an_ambiguous_file_is_refused_naming_the_flag(files, tmp_path):
    d = files
    proto = onnx.load(str(d / "isaac.onnx"))
    proto.graph.input.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 1, HIDDEN]))
    onnx.save(proto, str(tmp_path / "two.onnx"))
    trace = record(d, "isaac.onnx", "correct", "amb.parquet")
    one_line_error(cli("replay", trace, "--policy", tmp_path / "two.onnx", cwd=d), "could be h", "--name h=NAME")
    # an LSTM's c_in without its c_out
    proto = onnx.load(str(d / "isaac.onnx"))
    proto.graph.output[2].name = "cell"
    for node in proto.graph.node:
        node.output[:] = ["cell" if o == "c_out" else o for o in node.output]
    onnx.save(proto, str(tmp_path / "noc.onnx"))
    one_line_error(cli("replay", trace, "--policy", tmp_path / "noc.onnx", cwd=d), "'cell'", "--name")


# -- hostile foreign graphs: refused before they run, one line, strings inert --------------------------------
def _foreign(path, nodes, inits=()):
    """A graph with the exporters' names (obs [1, 3], h_in and c_in [1, 1, 8]; actions, h_out, c_out)."""
    state = [1, 1, HIDDEN]
    inputs = [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, 3])]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, state) for n in ("h_in", "c_in")]
    outputs = [helper.make_tensor_value_info("actions", TensorProto.FLOAT, [1, 1])]
    outputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, state) for n in ("h_out", "c_out")]
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def _outputs_from(tensor):
    return [
        helper.make_node("Slice", ["obs", "zero", "one", "one"], ["first"]),
        helper.make_node("Mul", ["first", tensor], ["actions"]),
        helper.make_node("Mul", ["h_in", tensor], ["h_out"]),
        helper.make_node("Mul", ["c_in", tensor], ["c_out"]),
    ]


SLICES = [numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([1]), "one")]


def test_hostile_foreign_graphs_are_refused_in_one_line(files, tmp_path):
    d = files
    trace = record(d, "isaac.onnx", "correct", "hostile.parquet")
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in_"], ["c_out_"]), helper.make_node("Add", ["v_in", "inc"], ["v_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in_", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("c_out_", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1]),
        ],
        [numpy_helper.from_array(np.ones(1, np.float32), "inc")],
    )
    inits = [
        numpy_helper.from_array(np.array(1 << 40, np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "cond"),
    ]
    inits += [numpy_helper.from_array(np.zeros(1, np.float32), "v0"), *SLICES]
    nodes = [helper.make_node("Loop", ["trips", "cond", "v0"], ["v"], body=body), *_outputs_from("v")]
    loop = _foreign(tmp_path / "loop.onnx", nodes, inits)
    refused_within(bounded_cli("replay", trace, "--policy", loop, cwd=d), "'Loop'", "replay does not run")
    unknown = [helper.make_node("Pwn", ["h_in"], ["w"], name=TITLE), *_outputs_from("w")]
    path = _foreign(tmp_path / "unknown.onnx", unknown, SLICES)
    refused_within(bounded_cli("replay", trace, "--policy", path, cwd=d), "'Pwn'", "\\x1b]0;PWNED\\x07")
    big = [helper.make_node("ConstantOfShape", ["shape"], ["w"]), *_outputs_from("w")]
    inits = [numpy_helper.from_array(np.array([1 << 28], np.int64), "shape"), *SLICES]
    big_file = _foreign(tmp_path / "big.onnx", big, inits)
    refused_within(bounded_cli("replay", trace, "--policy", big_file, cwd=d), "'ConstantOfShape'")


def test_weights_beside_the_file_are_read_only_from_there(files, tmp_path):
    d = files
    proto = onnx.load(str(d / "rsl_gru.onnx"), load_external_data=False)
    trace = record(d, "rsl_gru.onnx", "correct", "gru.parquet")
    for location, words in (("../rsl_gru.onnx.data", "not a file name in its directory"), ("gone.data", "missing")):
        edited = onnx.ModelProto()
        edited.CopyFrom(proto)
        for t in edited.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = location
        onnx.save(edited, str(tmp_path / "moved.onnx"))
        with pytest.raises(BadInput, match=words):
            lstm_probe.replay(trace, tmp_path / "moved.onnx")
    (tmp_path / "rsl_gru.onnx.data").write_bytes(b"\0" * 8)  # too short for the weights it should hold
    onnx.save(proto, str(tmp_path / "rsl_gru.onnx"))
    with pytest.raises(BadInput, match="bytes at offset"):
        lstm_probe.replay(trace, tmp_path / "rsl_gru.onnx")
