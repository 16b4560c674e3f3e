"""Hostile ONNX files, traces, statistics and logs handed to ``lstm-probe replay`` and ``export`` (a red team's
findings, each a test): every file is built here, in a temporary directory, and the real CLI runs on it in a
subprocess, its heap capped. Each is refused with one line (exit 2) within 20 s and 1.5 GB of peak RSS, or
gets a correct verdict; no escape sequence (ESC, BEL) from a file reaches stdout or stderr."""

from __future__ import annotations

import json
import os
import time
import zipfile

import gymnasium as gym
import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from sb3_contrib import RecurrentPPO

import lstm_probe
from lstm_probe import BadInput
from lstm_probe.deploy import checks, replay, runtime
from lstm_probe.deploy.spec import META_KEY, Spec
from tests.refusals import PEAK_MB, SECONDS, bounded_cli

ESCAPES = (b"\x1b", b"\x07", b"\x9b")
TITLE = "u\x1b]0;PWNED\x07\x1b[2J"
"""An initializer's name that retitles and clears a terminal printed raw."""
LINK = "\x1b]8;;https://example.com/x\x1b\\click\x1b]8;;\x1b\\"
"""A node name carrying an OSC 8 hyperlink."""
SHARED = Spec("shared", (3,), "box", (1,), 1, 16)
"""The interface of the hostile graphs built from nothing (a Pendulum policy with one shared LSTM)."""


cli = bounded_cli


def _inert(r) -> None:
    for esc in ESCAPES:
        assert esc not in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]


def refused(run, *words: str) -> str:
    """``run`` (:func:`cli`'s answer) is a one-line refusal naming ``words``, fast and small; the line."""
    r, took, peak = run
    _inert(r)
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    for w in words:
        assert w in lines[0], lines[0]
    assert took < SECONDS and peak < PEAK_MB, (took, peak, lines[0])
    return lines[0]


def verdict(run) -> str:
    """``run`` answered (exit 0) fast and small, nothing on stderr; its verdict line."""
    r, took, peak = run
    _inert(r)
    assert r.returncode == 0 and not r.stderr, r.stderr.decode("utf-8", "replace")[-3000:]
    assert took < SECONDS and peak < PEAK_MB, (took, peak)
    out = r.stdout.decode()
    line = next(line for line in out.splitlines() if line.startswith("verdict: "))
    return line.removeprefix("verdict: ").split(";")[0]  # the verdict, without its largest action difference


# -- a genuine policy, its exported file and a trace of its correct loop ------------------------------------
def _record(model, episodes=2, steps=60, zero=False):
    """A correct deployment loop with sb3's own predict, as a trace (``zero``: the actions recorded as 0)."""
    env, rows = gym.make("Pendulum-v1"), []
    for e in range(episodes):
        obs, _ = env.reset(seed=e)
        state = None
        for t in range(steps):
            action, state = model.predict(obs, state=state, episode_start=np.array([t == 0]), deterministic=True)
            rows.append((e * steps + t, obs.tolist(), [0.0] if zero else action.tolist(), t == 0))
            obs, *_ = env.step(action)
    step, obs, act, start = zip(*rows, strict=True)
    return pa.table({"env": [0] * len(rows), "step": step, "obs": obs, "action": act, "episode_start": start})


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    torch.set_num_threads(1)
    model = RecurrentPPO(
        "MlpLstmPolicy", "Pendulum-v1", n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu",
        policy_kwargs={"lstm_hidden_size": 16},
    ).learn(128)  # fmt: skip
    model.save(d / "model.zip")
    lstm_probe.export(d / "model.zip", d / "policy.onnx", env_id="Pendulum-v1", episodes=1)
    pq.write_table(_record(model), d / "trace.parquet")
    return d, model


def _spec_of(path) -> Spec:
    proto = onnx.load(str(path))
    return Spec.from_json({p.key: p.value for p in proto.metadata_props}[META_KEY], "x")


def _edit(src, dst, edit):
    proto = onnx.load(str(src))
    edit(proto)
    onnx.save(proto, str(dst))
    return dst


# -- strings from the file: inert on every path ----------------------------------------------------------
def test_names_with_escape_sequences_never_reach_the_terminal(pendulum):
    """onnxruntime's own logger would print an unused initializer's name raw (retitling and clearing the
    terminal) and node names with OSC 8 links: it is silenced, and replay's verdict stands."""
    d, _ = pendulum

    def plant(proto):
        proto.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), TITLE))
        for node in proto.graph.node:
            node.name = LINK + node.name

    policy = _edit(d / "policy.onnx", d / "escapes.onnx", plant)
    assert verdict(cli("replay", d / "trace.parquet", "--policy", policy, cwd=d)) == "correct"
    r, took, peak = cli("replay", d / "trace.parquet", "--policy", policy, "--json", cwd=d)
    _inert(r)
    assert r.returncode == 0 and not r.stderr and json.loads(r.stdout)["verdict"] == "correct"
    assert took < SECONDS and peak < PEAK_MB

    def refused_op(proto):  # the name in the refusal: written out, never sent
        proto.graph.node[0].op_type = "ConstantOfShape"
        proto.graph.node[0].name = TITLE

    line = refused(cli("replay", d / "trace.parquet", "--policy", _edit(policy, d / "named.onnx", refused_op), cwd=d))
    assert "ConstantOfShape" in line and "\\x1b]0;PWNED\\x07" in line
    with pytest.raises(BadInput) as e:  # the library's message holds no control character either
        lstm_probe.replay(d / "trace.parquet", d / "named.onnx")
    assert "\x1b" not in str(e.value) and "\x07" not in str(e.value)


def test_a_tiny_foreign_onnx_file_with_escapes_is_refused_before_it_runs(pendulum):
    d, _ = pendulum
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    init = numpy_helper.from_array(np.zeros(1, np.float32), TITLE)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name=LINK)], "g", [x], [y], [init])
    path = d / "foreign.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    assert path.stat().st_size < 1024
    refused(cli("replay", d / "trace.parquet", "--policy", path, cwd=d), "not exported by lstm-probe")
    refused(cli("replay", d / "trace.parquet", "--policy", path, "--json", cwd=d), "not exported by lstm-probe")


# -- a graph checked before it runs -----------------------------------------------------------------------
def _graph(path, nodes, inits=(), spec=SHARED, opset=18, meta=None):
    """An ONNX file with ``spec``'s inputs and outputs, ``nodes`` computing them, and lstm-probe's metadata."""
    kinds = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}
    inputs = [helper.make_tensor_value_info(n, kinds[t], s) for n, s, t in spec.inputs()]
    outputs = [helper.make_tensor_value_info(n, kinds[t], s) for n, s, t in spec.outputs()]
    model = helper.make_model(
        helper.make_graph(nodes, "hostile", inputs, outputs, list(inits)),
        opset_imports=[helper.make_opsetid("", opset)],
    )
    entry = model.metadata_props.add()
    entry.key, entry.value = META_KEY, meta if meta is not None else spec.to_json()
    onnx.save(model, str(path))
    return path


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _outputs_from(tensor):
    """Nodes making the spec's outputs from ``tensor`` (a [1] float) and the inputs: the graph runs."""
    return [
        helper.make_node("Slice", ["obs", "zero", "one", "one"], ["first"]),
        helper.make_node("Mul", ["first", tensor], ["action"]),
        helper.make_node("Mul", ["first", tensor], ["value"]),
        helper.make_node("Mul", ["h", tensor], ["h_out"]),
        helper.make_node("Mul", ["c", tensor], ["c_out"]),
    ]


SLICES = [_ints("zero", [0]), _ints("one", [1])]


def test_a_graph_that_asks_for_gigabytes_is_refused(pendulum):
    """ConstantOfShape of 2^28 floats (1 GiB at every step; onnxruntime folds it when the session is made)."""
    d, _ = pendulum
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["big"]),
        helper.make_node("ReduceSum", ["big"], ["sum"], keepdims=1),
        *_outputs_from("sum"),
    ]
    path = _graph(d / "constant.onnx", nodes, [_ints("shape", [1 << 28]), *SLICES])
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)  # a valid model onnxruntime would run
    assert path.stat().st_size < 2048  # ~1 KB of it lstm-probe's metadata
    refused(cli("replay", d / "trace.parquet", "--policy", path, cwd=d), "'ConstantOfShape'", "export")


def test_a_loop_of_2_to_the_40_iterations_is_refused(pendulum):
    d, _ = pendulum
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "inc"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1]),
        ],
        [numpy_helper.from_array(np.ones(1, np.float32), "inc")],
    )
    nodes = [helper.make_node("Loop", ["trips", "cond", "v0"], ["v"], body=body), *_outputs_from("v")]
    inits = [_ints("trips", 1 << 40), numpy_helper.from_array(np.array(True), "cond")]
    inits.append(numpy_helper.from_array(np.zeros(1, np.float32), "v0"))
    path = _graph(d / "loop.onnx", nodes, [*inits, *SLICES])
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    assert path.stat().st_size < 4096
    refused(cli("replay", d / "trace.parquet", "--policy", path, cwd=d), "'Loop'")


def test_allowed_operators_asking_for_a_huge_tensor_are_refused(pendulum):
    """Only allowed operators, but a broadcast Mul of two 100,000-value weights makes 10^10 values (40 GB)."""
    d, _ = pendulum
    n = 100_000
    inits = [
        numpy_helper.from_array(np.ones((n, 1), np.float32), "a"),
        numpy_helper.from_array(np.ones((1, n), np.float32), "b"),
        _ints("corner", [1, 1]),
        _ints("origin", [0, 0]),
        _ints("flat", [1]),
        *SLICES,
    ]
    nodes = [
        helper.make_node("Mul", ["a", "b"], ["square"]),
        helper.make_node("Slice", ["square", "origin", "corner"], ["cell"]),
        helper.make_node("Reshape", ["cell", "flat"], ["one_value"]),
        *_outputs_from("one_value"),
    ]
    path = _graph(d / "broadcast.onnx", nodes, inits)
    refused(cli("replay", d / "trace.parquet", "--policy", path, cwd=d), "memory budget")


def test_a_graph_that_grows_faster_than_the_envs_is_refused(pendulum):
    """At one env every value is small; at 1,024 envs stepped together one is [envs, envs, envs, envs]."""
    d, _ = pendulum
    inits = [_ints("column", [-1, 1, 1, 1]), _ints("pair", [-1, 1]), _ints("far", [1 << 40, 1, 1, 1])]
    inits += [_ints("origin", [0, 0, 0, 0]), *SLICES]
    nodes = [
        helper.make_node("Slice", ["obs", "zero", "one", "one"], ["x"]),
        helper.make_node("Reshape", ["x", "column"], ["t1"]),
        helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0, 2, 3]),
        helper.make_node("Transpose", ["t1"], ["t3"], perm=[1, 2, 0, 3]),
        helper.make_node("Transpose", ["t1"], ["t4"], perm=[1, 2, 3, 0]),
        helper.make_node("Mul", ["t1", "t2"], ["m2"]),
        helper.make_node("Mul", ["m2", "t3"], ["m3"]),
        helper.make_node("Mul", ["m3", "t4"], ["m4"]),
        helper.make_node("Slice", ["m4", "origin", "far"], ["edge"]),
        helper.make_node("Reshape", ["edge", "pair"], ["action"]),
        helper.make_node("Mul", ["x", "x"], ["value"]),
        helper.make_node("Mul", ["h", "x"], ["h_out"]),
        helper.make_node("Mul", ["c", "x"], ["c_out"]),
    ]
    path = _graph(d / "growing.onnx", nodes, inits)
    envs = _long_trace(d / "2000-envs.parquet", 2000, envs=2000)
    refused(cli("replay", envs, "--policy", path, cwd=d), "envs at once", "memory budget")
    assert lstm_probe.replay(d / "trace.parquet", path).verdict  # one env at a time: it runs


@pytest.mark.parametrize(
    "field, value",
    [("hidden", 1 << 28), ("layers", 1e6), ("hidden", -1), ("variant", "\x1b[2J"), ("obs_shape", [1 << 30])],
)
def test_metadata_stating_an_impossible_spec_is_refused(pendulum, field, value):
    d, _ = pendulum

    def lie(proto):
        entry = next(p for p in proto.metadata_props if p.key == META_KEY)
        entry.value = json.dumps({**json.loads(entry.value), field: value})

    path = _edit(d / "policy.onnx", d / "meta.onnx", lie)
    refused(cli("replay", d / "trace.parquet", "--policy", path, cwd=d), "metadata", "export")


def test_metadata_that_does_not_match_the_graph_or_is_not_json_is_refused(pendulum):
    d, _ = pendulum

    def narrower(proto):
        entry = next(p for p in proto.metadata_props if p.key == META_KEY)
        entry.value = json.dumps({**json.loads(entry.value), "hidden": 8})

    path = _edit(d / "policy.onnx", d / "narrow.onnx", narrower)
    refused(cli("replay", d / "trace.parquet", "--policy", path, cwd=d), "its graph's h is not float32 of shape")

    def deep(proto):
        next(p for p in proto.metadata_props if p.key == META_KEY).value = "[" * 200_000

    path = _edit(d / "policy.onnx", d / "deep.onnx", deep)
    refused(cli("replay", d / "trace.parquet", "--policy", path, cwd=d), "not a JSON object")


# -- replay's work bounded --------------------------------------------------------------------------------
def _long_trace(path, rows, envs=1, group=1_000_000, action=0.0):
    """A trace of ``rows`` rows over ``envs`` envs (zero obs, constant actions): a few KB on disk."""
    per = -(-rows // envs)
    schema = pa.schema(
        [("env", pa.int64()), ("step", pa.int64()), ("obs", pa.list_(pa.float32(), 3)), ("action", pa.float64())]
    ).append(pa.field("episode_start", pa.bool_()))
    opts = {"use_dictionary": ["obs", "action", "episode_start"], "column_encoding": {}}
    opts["column_encoding"] = {"env": "DELTA_BINARY_PACKED", "step": "DELTA_BINARY_PACKED"}
    obs = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(3 * group, np.float32)), 3)
    with pq.ParquetWriter(path, schema, compression="zstd", **opts) as w:
        for lo in range(0, rows, group):
            i = np.arange(lo, min(rows, lo + group))
            cols = [i // per, i % per, obs.slice(0, len(i)), np.full(len(i), action), i % per == 0]
            w.write_table(pa.table(cols, schema=schema))
    return path


@pytest.mark.parametrize("rows", [3_000_000, 15_900_000])
def test_a_trace_of_millions_of_rows_is_refused_from_its_footer(pendulum, rows):
    d, _ = pendulum
    path = _long_trace(d / f"rows-{rows}.parquet", rows)
    assert path.stat().st_size < 1 << 20
    refused(cli("replay", path, "--policy", d / "policy.onnx", cwd=d), f"{rows:,} rows", "replay a part of it")


def test_a_trace_over_the_steps_replay_runs_is_refused_up_front(pendulum):
    """500,000 steps of one env: under the rows replay reads, over the policy steps it runs (5 loops)."""
    d, _ = pendulum
    path = _long_trace(d / "one-env.parquet", 500_000)
    line = refused(cli("replay", path, "--policy", d / "policy.onnx", cwd=d), "2,500,000 policy steps")
    assert f"{replay.MAX_STEPS:,}" in line


def test_two_hundred_thousand_envs_are_replayed_in_seconds(pendulum):
    """One step of each of 200,000 envs (a few KB): each env's rows found in one pass, the envs stepped
    1,024 at a time; the recorded actions are the policy's, and one step from a zero state cannot tell the loops
    apart, so the verdict is 'cannot tell', the correct loop first among those that agree."""
    d, _ = pendulum
    spec, step, _ = runtime.load_file(d / "policy.onnx")
    action = float(step(np.zeros((1, 3), np.float32), np.ones(1, np.float32), spec.zero_state(1))[0][0, 0])
    path = _long_trace(d / "envs.parquet", 200_000, envs=200_000, action=action)
    assert path.stat().st_size < 64 << 10
    assert verdict(cli("replay", path, "--policy", d / "policy.onnx", cwd=d)).startswith("cannot tell: loops correct")


def test_a_slow_pace_is_refused_once_measured():
    pace = runtime.Pace(10_000, "replaying t.parquet", "replay a part of it", limit=2.0)
    with pytest.raises(BadInput, match=r"replaying t\.parquet: its 10,000 policy steps would take .* a part of it"):
        for _ in range(10_000):
            time.sleep(0.01)
            pace.tick(1)
    assert pace.done < 200  # refused after about a second, not after the whole


def test_all_zero_recorded_actions_are_not_judged_with_an_absolute_tolerance(pendulum):
    """Zero actions recorded: the tolerance stays relative (to the loop's own actions), so no loop of the
    policy agrees, and no 'float16' for a loop that agrees on a few steps."""
    d, model = pendulum
    pq.write_table(_record(model, zero=True), d / "zeros.parquet")
    r = lstm_probe.replay(d / "zeros.parquet", d / "policy.onnx")
    assert r.verdict == "not this policy", (r.verdict, [(lp.name, lp.agree) for lp in r.loops])
    assert max(lp.agree for lp in r.loops) < 60
    assert lstm_probe.replay(d / "trace.parquet", d / "policy.onnx").verdict == "correct"


# -- statistics and logs read within the budget, before they allocate --------------------------------------
def _npz_bomb(path, values):
    """An .npz whose mean.npy is ``values`` float64 zeros, deflated (~2.3 MB per 512 MB)."""
    from numpy.lib import format as npy

    header = {"descr": "<f8", "fortran_order": False, "shape": (values,)}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("mean.npy", "w", force_zip64=True) as f:
            npy.write_array_header_1_0(f, header)
            chunk = bytes(1 << 20)
            for _ in range(values * 8 >> 20):
                f.write(chunk)
        z.writestr("var.npy", _npy(np.ones(3)))
    return path


def _npy(a):
    import io

    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_vecnormalize_statistics_are_checked_before_they_are_read(pendulum):
    d, _ = pendulum
    bomb = _npz_bomb(d / "bomb.npz", 64 << 20)  # 512 MB once inflated
    assert bomb.stat().st_size < 4 << 20
    run = ("replay", d / "trace.parquet", "--policy", d / "policy.onnx", "--vecnormalize")
    refused(cli(*run, bomb, cwd=d), "bomb.npz")
    np.savez(d / "strings.npz", mean=np.array(["a", "b", "c"]), var=np.ones(3))
    refused(cli(*run, d / "strings.npz", cwd=d), "not 3 numbers")
    np.savez(d / "wide.npz", mean=np.zeros(5), var=np.ones(5))
    refused(cli(*run, d / "wide.npz", cwd=d), "not 3 numbers")
    np.savez(d / "stats.npz", mean=np.zeros(3), var=np.ones(3), clip_obs=10.0, epsilon=1e-8)
    assert lstm_probe.replay(d / "trace.parquet", d / "policy.onnx", vecnormalize=d / "stats.npz").verdict


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    """A CartPole model and its --capture-obs log; a log of one episode of 4,000,000 steps made of its first
    row (~10 MB), and one whose obs vectors are 50,000 wide (a few KB)."""
    d = tmp_path_factory.mktemp("log")
    model = RecurrentPPO(
        "MlpLstmPolicy", "CartPole-v1", n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu",
        policy_kwargs={"lstm_hidden_size": 8, "enable_critic_lstm": False},
    )  # fmt: skip
    model.learn(128, callback=lstm_probe.ProbeCallback(d / "run.parquet", capture_obs=True))
    model.save(d / "model.zip")
    src = pq.read_table(d / "run.parquet")
    rows = 250_000
    base = src.take(pa.array(np.zeros(rows, np.int64)))
    i = base.schema.get_field_index("env_step")
    step = base.schema.field(i)
    with pq.ParquetWriter(d / "long.parquet", base.schema, column_encoding={"env_step": "DELTA_BINARY_PACKED"},
                          use_dictionary=[n for n in base.schema.names if n != "env_step"]) as w:  # fmt: skip
        for lo in range(0, 4_000_000, rows):
            w.write_table(base.set_column(i, step, pa.array(np.arange(lo, lo + rows))))
    k = base.schema.get_field_index("obs")
    wide = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(100 * 50_000, np.float32)), 50_000)
    obs = base.schema.field(k).with_type(wide.type)
    pq.write_table(base.slice(0, 100).set_column(k, obs, wide), d / "wide.parquet")
    return d


def test_export_reads_a_hostile_log_within_the_budget(cartpole):
    d = cartpole
    export = ("export", d / "model.zip")
    refused(cli(*export, d / "w.onnx", "--log", d / "wide.parquet", cwd=d), "hold 50000 values, the policy takes 4")
    line = refused(cli(*export, d / "l.onnx", "--log", d / "long.parquet", cwd=d), "holds 1 episode, fewer than")
    assert "--episodes 5: pass --episodes 1, or record a longer run" in line
    assert "--capture-obs" not in line  # the log has observations
    r, took, peak = cli(*export, d / "long.pt", "--log", d / "long.parquet", "--episodes", "1", cwd=d)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert b"verified on 1,000 steps" in r.stdout and took < SECONDS and peak < PEAK_MB, (took, peak)


# -- files written and read safely -----------------------------------------------------------------------
def test_export_writes_through_no_planted_link(pendulum):
    """The temporary file has a name no one can guess, made exclusively, and is renamed over OUT: a link
    planted at the old predictable name, or at OUT itself, never has its target overwritten."""
    d, _ = pendulum
    victim = d / "victim.txt"
    victim.write_text("the user's file")
    work = d / "links"
    work.mkdir()
    out = work / "policy.onnx"
    (work / f".policy.{os.getpid()}.tmp.onnx").symlink_to(victim)
    out.symlink_to(victim)
    lstm_probe.export(d / "model.zip", out, env_id="Pendulum-v1", episodes=1, force=True)
    assert victim.read_text() == "the user's file"
    assert out.is_file() and not out.is_symlink() and _spec_of(out).hidden == 16
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask
    assert sorted(p.name for p in work.iterdir()) == [f".policy.{os.getpid()}.tmp.onnx", "policy.onnx"]


def test_fifos_and_devices_are_refused_as_model_files(pendulum, tmp_path):
    d, _ = pendulum
    fifo = tmp_path / "model.zip"
    os.mkfifo(fifo)
    device = tmp_path / "device.zip"
    device.symlink_to("/dev/zero")
    refused(cli("arch", fifo, cwd=tmp_path), "not a regular file")
    refused(cli("export", fifo, tmp_path / "out.onnx", "--env", "Pendulum-v1", cwd=tmp_path), "not a regular file")
    refused(cli("replay", d / "trace.parquet", "--policy", fifo, cwd=tmp_path), "not a regular file")
    refused(cli("replay", d / "trace.parquet", "--policy", device, cwd=tmp_path), "not a regular file")
    for name in ("policy.onnx", "trace.parquet", "stats.npz"):
        os.mkfifo(tmp_path / name)
    refused(cli("replay", d / "trace.parquet", "--policy", tmp_path / "policy.onnx", cwd=tmp_path), "not a regular")
    refused(cli("replay", tmp_path / "trace.parquet", "--policy", d / "policy.onnx", cwd=tmp_path), "not a regular")
    run = ("replay", d / "trace.parquet", "--policy", d / "policy.onnx", "--vecnormalize", tmp_path / "stats.npz")
    refused(cli(*run, cwd=tmp_path), "not a regular file")


def test_the_allow_list_is_what_an_export_writes(pendulum):
    """Every operator of a genuine export is allowed, and the check measures it as small."""
    d, _ = pendulum
    proto = onnx.load(str(d / "policy.onnx"))
    assert {n.op_type for n in proto.graph.node} <= checks.OPS
    graph = checks.check(proto, _spec_of(d / "policy.onnx"), "policy.onnx")
    assert graph.per_env < 64 << 10 and graph.macs < 100_000 and graph.weights < 1 << 20


def test_a_checkpoint_with_flipped_bytes_is_refused_as_corrupted(tmp_path):
    """torch.load does not check a checkpoint's CRC-32s: bytes flipped inside the weights loaded without a word
    and the export then failed its own check ("the exported onnx file parts from the PyTorch policy"), blaming
    the export. The records are checked first: one line naming the record, exit 2."""
    from lstm_probe.deploy import saved

    good = tmp_path / "good.pt"
    torch.save({"lstm_probe": "torchrl", "w": torch.arange(4096, dtype=torch.float32)}, good)
    assert saved.read_checkpoint(good, "fix")["w"][7] == 7
    data = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as z:
        record = next(i for i in z.infolist() if i.filename.endswith("data/0"))
    start = record.header_offset + 30 + len(record.filename.encode())  # its local header, then (extra,) data
    data[start + 2000 : start + 2300] = bytes(b ^ 0xFF for b in data[start + 2000 : start + 2300])
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    with pytest.raises(BadInput, match=r"bad\.pt is corrupted: its record '.*data/0' fails its CRC-32 check"):
        saved.read_checkpoint(bad, "fix")
    out = tmp_path / "p.onnx"
    refused(bounded_cli("export", bad, out, "--synthetic", cwd=tmp_path), "is corrupted", "fails its CRC-32 check")
    assert not out.exists()
