"""Damaged policy files a user really ends up with (a checkpoint copied half-way, an empty policy.onnx left by
a failed download, a tampered spec) are refused in one line that says what is wrong with the file, never with
advice that does not apply (``--trust-model`` for a checkpoint, ``--name`` for an empty file)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lstm_probe import BadInput
from lstm_probe.deploy.spec import Spec
from tests.refusals import bounded_cli, refused_within

CHECKPOINT = Path(__file__).parent / "data" / "rsl_rl_versions" / "v4.0.1" / "model_10.pt"


def _trace(d: Path) -> Path:
    path = d / "robot.parquet"
    rows = [{"step": t, "obs": [0.1] * 3, "action": [0.0], "episode_start": t == 0} for t in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("command", ["replay", "export"])
def test_a_truncated_checkpoint_is_called_truncated_not_torchscript(tmp_path, command):
    raw = CHECKPOINT.read_bytes()
    (tmp_path / "model.pt").write_bytes(raw[: len(raw) // 2])  # a copy cut short
    if command == "replay":
        run = bounded_cli("replay", _trace(tmp_path), "--policy", "model.pt", cwd=tmp_path)
    else:
        run = bounded_cli("export", "model.pt", "out.onnx", "--synthetic", "--episodes", "1", cwd=tmp_path)
    line = refused_within(run, "model.pt", "truncated")
    assert "TorchScript" not in line and "--trust-model" not in line, line
    assert not (tmp_path / "out.onnx").exists()


def test_the_whole_checkpoint_still_exports_and_replays(tmp_path):
    """The same checkpoint whole is read as before (the route above changed only for a .pt that is no zip)."""
    shutil.copy(CHECKPOINT, tmp_path / "model.pt")
    shutil.copytree(CHECKPOINT.parent / "params", tmp_path / "params")  # its Isaac Lab configuration
    r = bounded_cli("export", "model.pt", "out.onnx", "--synthetic", "--episodes", "1", "--quiet", cwd=tmp_path)[0]
    assert r.returncode == 0 and (tmp_path / "out.onnx").exists(), r.stderr[-2000:]
    obs = json.loads(onnx.load(str(tmp_path / "out.onnx")).metadata_props[0].value)["obs_shape"][0]
    rows = [{"step": t, "obs": [0.1] * obs, "action": [0.0], "episode_start": t == 0} for t in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "robot.parquet")
    r = bounded_cli("replay", "robot.parquet", "--policy", "model.pt", cwd=tmp_path)[0]
    assert r.returncode == 0 and b"verdict: " in r.stdout, r.stderr[-2000:]


@pytest.mark.parametrize("content", ["empty", "no graph"])
def test_an_onnx_file_without_a_graph_says_so(tmp_path, content):
    """An empty file parses as an empty ONNX model (protobuf's empty message): replay told its user to name its
    (absent) inputs with --name."""
    import onnx

    raw = b"" if content == "empty" else onnx.ModelProto(ir_version=10).SerializeToString()
    (tmp_path / "policy.onnx").write_bytes(raw)
    line = refused_within(
        bounded_cli("replay", _trace(tmp_path), "--policy", "policy.onnx", cwd=tmp_path), "policy.onnx", "no graph"
    )
    assert "--name" not in line, line


SPEC = Spec("shared", (3,), "box", (1,), 1, 16)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("normalized", "yes", "normalized 'yes'"),
        ("normalized", 1, "normalized 1"),
        ("framework", "\x1b[31msb3", "framework '\\x1b[31msb3'"),
        ("framework", 3, "framework 3"),
    ],
)
def test_a_spec_stating_framework_or_normalized_of_the_wrong_kind_is_refused(key, value, words):
    """``normalized: "yes"`` was read as false (replay then told a normalized model's user nothing) and any
    framework string was taken."""
    text = json.loads(SPEC.to_json(framework="sb3"))
    text[key] = value
    with pytest.raises(BadInput) as err:
        Spec.from_json(json.dumps(text), "p.onnx")
    assert words in str(err.value) and "\x1b" not in str(err.value), str(err.value)


@pytest.mark.parametrize("extra", [{}, {"framework": "rsl_rl"}, {"framework": "sb3", "normalized": True}])
def test_the_specs_export_writes_still_read(extra):
    assert Spec.from_json(SPEC.to_json(**extra), "p.onnx") == SPEC
