"""Opening someone else's model or log never runs their code, and a hostile log is refused in one line.

Model zips: a real RecurrentPPO.save zip with one ``:serialized:`` entry replaced by a pickle that
creates a file when loaded. Logs: a real tiny log rewritten with pyarrow into each hostile shape.
"""

import base64
import json
import os
import pickle
import subprocess
import sys
import zipfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from refusals import one_line_error

import lstm_probe
from lstm_probe import arch, load_model
from lstm_probe.log import reader

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def cli(*args, cwd=None, prelude=""):
    """``lstm-probe ARGS`` in a subprocess; ``prelude`` runs first in that process."""
    code = f"{prelude}\nfrom lstm_probe.cli.app import main\nmain()"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=300
    )


# --- model zips ---------------------------------------------------------------------------------


class Touch:
    """Unpickling this opens ``path`` for writing: the file appears when a loader runs the pickle."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from sb3_contrib import RecurrentPPO

    d = tmp_path_factory.mktemp("zips")
    tiny = {"n_steps": 16, "batch_size": 16, "n_epochs": 1, "seed": 0, "policy_kwargs": {"lstm_hidden_size": 8}}
    model = RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", **tiny)
    model.save(d / "model.zip")
    return d / "model.zip"


def rewrite(src, dst, edit):
    """A copy of the zip ``src`` with its ``data`` JSON passed through ``edit``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            raw = zin.read(item)
            if item.filename == "data":
                doc = json.loads(raw)
                edit(doc)
                raw = json.dumps(doc).encode()
            zout.writestr(item, raw)
    return dst


def evil(saved, tmp_path, entry):
    marker = tmp_path / f"pwned-{entry}"
    payload = base64.b64encode(pickle.dumps(Touch(str(marker)))).decode()
    return rewrite(saved, tmp_path / "evil.zip", lambda d: d[entry].__setitem__(":serialized:", payload)), marker


@pytest.mark.parametrize("entry", ["lr_schedule", "policy_class", "observation_space"])
@pytest.mark.parametrize("env", [[], ["--env", "Pendulum-v1"]], ids=["no-env", "env"])
def test_arch_runs_no_pickle_from_the_zip(saved, tmp_path, entry, env):
    zip_path, marker = evil(saved, tmp_path, entry)
    r = cli("arch", zip_path, *env, "--json", cwd=tmp_path)
    assert not marker.exists(), "lstm-probe arch ran code from the model.zip"
    if r.returncode == 0:
        assert json.loads(r.stdout)["policy"] == "RecurrentActorCriticPolicy"
    else:
        one_line_error(r, "--trust-model")


def test_trust_model_is_sb3s_full_load(saved, tmp_path):
    """The opt-in does what it says: SB3's load runs the zip's pickles (the crafted zip is live)."""
    zip_path, marker = evil(saved, tmp_path, "lr_schedule")
    r = cli("arch", zip_path, "--trust-model", "--json", cwd=tmp_path)
    assert marker.exists(), r.stderr
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("env_id", [None, "Pendulum-v1"])
def test_safe_load_equals_trusted_load(saved, env_id):
    safe, rollout = load_model(str(saved), env_id=env_id)
    trusted, _ = load_model(str(saved), env_id=env_id, trust_model=True)
    a, b = safe.policy.state_dict(), trusted.policy.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert safe.observation_space == trusted.observation_space and safe.action_space == trusted.action_space
    assert rollout is (env_id is not None)
    assert arch(safe, rollout=False).to_dict() == arch(trusted, rollout=False).to_dict()


def test_what_the_text_does_not_state_is_refused(saved, tmp_path):
    """A space SB3 states only as a pickle: one line naming --trust-model (and --env takes it from an env)."""

    def hide(doc):
        doc["observation_space"] = {":type:": "<class 'gymnasium.spaces.dict.Dict'>", ":serialized:": "AAAA"}

    zip_path = rewrite(saved, tmp_path / "dict.zip", hide)
    one_line_error(cli("arch", zip_path, cwd=tmp_path), "--trust-model", "observation space")
    with pytest.raises(lstm_probe.BadInput, match="--trust-model"):
        load_model(str(zip_path))
    assert load_model(str(zip_path), env_id="Pendulum-v1")[1] is True


def test_a_foreign_policy_class_is_refused(saved, tmp_path):
    zip_path = rewrite(saved, tmp_path / "foreign.zip", lambda d: d["policy_class"].__setitem__("__module__", "evil"))
    with pytest.raises(lstm_probe.BadInput, match=r"not one of sb3-contrib's recurrent policies.*--trust-model"):
        load_model(str(zip_path))


# --- logs ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    from lstm_probe import run

    path = tmp_path_factory.mktemp("log") / "tiny.parquet"
    run("Pendulum-v1", path, steps=64, n_steps=32, batch_size=32, hidden_size=8, writer="thread", force=True)
    return path


def hostile(log, dst, *, run=None, table=None):
    """The log rewritten with its run metadata replaced by ``run`` (bytes) and its rows by ``table``."""
    t = pq.read_table(log) if table is None else table
    meta = dict(pq.read_schema(log).metadata)
    if run is not None:
        meta[b"lstm_probe.run"] = run
    pq.write_table(t.replace_schema_metadata(meta), dst)
    return dst


def refused(path, *words, prelude=""):
    with pytest.raises(lstm_probe.BadLog) as exc:
        lstm_probe.summarize(path)
    assert "\n" not in str(exc.value)
    for w in words:
        assert w in str(exc.value)
    return one_line_error(cli("report", path, prelude=prelude), *words)


def test_the_tiny_log_reads(log):
    assert lstm_probe.read_info(log).rows > 0


def test_huge_metadata_json(log, tmp_path):
    doc = json.loads(pq.read_schema(log).metadata[b"lstm_probe.run"])
    doc["env_id"] = "x" * (20 << 20)
    refused(hostile(log, tmp_path / "big.parquet", run=json.dumps(doc).encode()), "run metadata of 20 MiB")


def test_huge_footer(log, tmp_path):
    doc = json.loads(pq.read_schema(log).metadata[b"lstm_probe.run"])
    doc["env_id"] = "x" * (40 << 20)  # stored twice (JSON and the Arrow schema): a ~90 MB footer
    refused(hostile(log, tmp_path / "footer.parquet", run=json.dumps(doc).encode()), "Parquet footer of")


@pytest.mark.parametrize("depth", [100, 200_000])
def test_deeply_nested_metadata(log, tmp_path, depth):
    doc = json.loads(pq.read_schema(log).metadata[b"lstm_probe.run"])
    text = json.dumps(doc)[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"
    refused(hostile(log, tmp_path / "deep.parquet", run=text.encode()), "run metadata")


def test_vectors_wider_than_the_declared_hidden_size(log, tmp_path):
    t = pq.read_table(log)
    n, width = t.num_rows, 64
    wide = pa.FixedSizeListArray.from_arrays(pa.array([0.5] * (n * width), pa.float32()), width)
    for name in ("h", "c"):
        t = t.set_column(t.schema.get_field_index(name), name, wide)
    refused(hostile(log, tmp_path / "wide.parquet", table=t), "h vectors of 64", "hidden_size 8")


def test_row_group_that_reads_far_larger_than_its_file(log, tmp_path):
    """Null h and c vectors take no room on disk but all of it once read: 4096 rows of 1024-float vectors
    are ~10 KB in the file and 34 MB in Arrow. The reader's bound (4 GiB, :data:`reader.MAX_ROW_GROUP_BYTES`)
    is lowered to 16 MiB here so that the file stays small to build (a real 4 GiB bomb would cost this
    test as much as it costs the reader)."""
    width, n = 1024, 4096
    src = pq.read_table(log)
    doc = json.loads(src.schema.metadata[b"lstm_probe.run"])
    doc["hidden_size"] = width
    cols = {name: pa.concat_arrays([src.column(name).combine_chunks()] * 3)[:n] for name in src.schema.names}
    for name in ("h", "c"):
        cols[name] = pa.nulls(n, pa.list_(pa.float32(), width))
    t = pa.table(cols)
    path = hostile(log, tmp_path / "bomb.parquet", run=json.dumps(doc).encode(), table=t)
    assert path.stat().st_size < 1 << 20
    limit = 16 << 20
    old = reader.MAX_ROW_GROUP_BYTES
    reader.MAX_ROW_GROUP_BYTES = limit
    try:
        lower = f"import lstm_probe.log.reader as r; r.MAX_ROW_GROUP_BYTES = {limit}"
        refused(path, "row group of 4,096 rows", prelude=lower)
    finally:
        reader.MAX_ROW_GROUP_BYTES = old
