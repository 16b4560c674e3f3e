"""The oldest pyarrow lstm-probe declares writes and reads back every log it may write: null fixed-size lists
(``obs`` on the rows of a ``--capture-obs`` log that saw no observation, h and c on the summary rows of a
``--trace-envs`` log). pyarrow 17-24 refuse to write them and 25 cannot read them back (apache/arrow#35692);
``.ci/oldest`` runs this file on the declared floor, ``pyarrow==26.0.0``."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import tomllib

from lstm_probe.log.layout import ARROW_MIN, arrow_too_old

ROOT = Path(__file__).resolve().parents[1]


def test_the_declared_floor_is_the_one_the_code_checks():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d for d in deps if d.startswith("pyarrow")]
    floor = re.fullmatch(r"pyarrow>=(\d+)(?:\.(\d+))?", pin.split(";")[0].strip())
    assert floor, pin
    assert (int(floor[1]), int(floor[2] or 0)) == ARROW_MIN
    assert arrow_too_old() is None  # this pyarrow (the floor itself under .ci/oldest) is new enough


def test_null_vectors_are_written_and_read_back_whole(tmp_path):
    from lstm_probe import run

    out = tmp_path / "obs.parquet"
    run(
        "CartPole-v1", out, seed=0, force=True, steps=64, n_steps=32, batch_size=32, n_epochs=1,
        n_envs=2, hidden_size=8, capture="summary", trace_envs=1, capture_obs=True,
    )  # fmt: skip
    table = pq.read_table(out)  # every column, the vectors included: what pandas.read_parquet reads
    for name, width in (("obs", 4), ("h", 8), ("c", 8)):
        col = table.column(name)
        assert col.type == pa.list_(pa.float32(), width)
        assert 0 < col.null_count < table.num_rows, name  # null and non-null entries side by side
    rows = table.select(["phase", "env", "obs", "h"]).to_pylist()
    rollout = [r for r in rows if r["phase"] == "rollout"]
    assert rollout and all(r["obs"] is not None and len(r["obs"]) == 4 for r in rollout)
    assert all(r["obs"] is None for r in rows if r["phase"] == "train")
    assert {r["env"] for r in rollout if r["h"] is None} == {1}  # the untraced env's rows: summary rows
    assert all(len(r["h"]) == 8 for r in rollout if r["env"] == 0)
    frame = pq.read_table(out, columns=["obs"]).to_pandas()
    assert frame["obs"].isna().sum() == table.column("obs").null_count


def test_the_floor_check_reads_a_pyarrow_without_distribution_metadata(monkeypatch):
    """pyarrow not yet imported (a writer process's training side) and found without distribution metadata
    (a build on sys.path): the check asks the module rather than raise PackageNotFoundError."""
    import importlib.metadata
    import sys

    def no_metadata(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.delitem(sys.modules, "pyarrow")
    monkeypatch.setattr(importlib.metadata, "version", no_metadata)
    assert arrow_too_old() is None
