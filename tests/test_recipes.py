"""docs/architecture.md's recipes, followed to the letter on a copy of the package: a throwaway column
declared in schema.py and filled by the integration that knows it (here the generic tracer's tags), and a
throwaway report section (one module plus one registry line). Both must reach the Parquet file and the
JSON report, with nothing else edited. And the column lists kept by hand, which the column recipe names:
each names declared columns only, and the recipe names exactly these."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]

COLUMN = """    Column(
        "room",
        "int32",
        True,
        "Throwaway: the room the agent stood in (a recipe test).",
        "grid",
        since=SCHEMA_VERSION,
        user=True,
    ),
"""

SECTION = '''"""Throwaway section: rows per room (a recipe test)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from lstm_probe.contract import Capabilities
from lstm_probe.report.section import Block, Line, Log, Section


@dataclass
class RoomsSection:
    rows_per_room: dict[str, int]


class Rooms(Section[RoomsSection]):
    key = "rooms"

    def compute(self, log: Log, acc: Any) -> RoomsSection:
        rooms = log.data.to_table(columns=["room"], filter=pc.field("layer") == 0).column("room")
        counts = pc.value_counts(rooms.drop_null()).to_pylist()
        return RoomsSection({str(c["values"]): int(c["counts"]) for c in sorted(counts, key=lambda c: c["values"])})

    def findings(self, data: RoomsSection) -> list[str]:
        return [f"the agent visited {len(data.rows_per_room)} rooms"]

    def text(self, data: RoomsSection, caps: Capabilities) -> list[Block]:
        return [Line(f"rooms: {data.rows_per_room}")]
'''

SCRIPT = """
import json, sys
import numpy as np, torch
import lstm_probe
from lstm_probe.report import summarize

torch.manual_seed(0)
lstm = torch.nn.LSTM(3, 4)
out = sys.argv[1]
with lstm_probe.trace(lstm, out, writer=sys.argv[2]) as probe:
    h = None
    for step in range(6):
        with probe.tag(phase="rollout", iteration=0, env=[0, 1], env_step=step, episode=0, room=[step % 3, 7]):
            _, h = lstm(torch.randn(1, 2, 3), h)
print(json.dumps(summarize(out).to_dict()))
"""


def _copy_with_recipes(dest: Path) -> Path:
    pkg = dest / "lstm_probe"
    shutil.copytree(ROOT / "lstm_probe", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    # Recipe "add a column", step 1: declare it (before the state columns), bump the version.
    schema = (pkg / "log" / "schema.py").read_text()
    version = int(re.search(r"^SCHEMA_VERSION = (\d+)$", schema, flags=re.M).group(1))
    schema = schema.replace(f"SCHEMA_VERSION = {version}\n", f"SCHEMA_VERSION = {version + 1}\n", 1)
    anchor = '    Column("h_norm"'
    assert anchor in schema
    schema = schema.replace(anchor, COLUMN + anchor, 1)
    (pkg / "log" / "schema.py").write_text(schema)
    # Step 2: the generic tracer's tags fill a user grid column by itself; nothing else to edit.
    # Recipe "add a report section": one module, one registry line.
    (pkg / "report" / "sections" / "rooms.py").write_text(SECTION)
    registry = (pkg / "report" / "registry.py").read_text()
    registry = registry.replace(
        "from lstm_probe.report.section import Section\n",
        "from lstm_probe.report.section import Section\nfrom lstm_probe.report.sections.rooms import Rooms\n",
        1,
    )
    registry = re.sub(r"\n\]\s*$", "\n    Rooms(),\n]\n", registry)
    assert "Rooms()," in registry
    (pkg / "report" / "registry.py").write_text(registry)
    return pkg


def _changed_files(pkg: Path) -> set[str]:
    changed = set()
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg)
        original = ROOT / "lstm_probe" / rel
        if not original.exists() or original.read_text() != path.read_text():
            changed.add(str(rel))
    return changed


def test_a_new_column_and_a_new_section_through_the_documented_recipes(tmp_path):
    pkg = _copy_with_recipes(tmp_path / "copy")
    assert _changed_files(pkg) == {"log/schema.py", "report/registry.py", "report/sections/rooms.py"}
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "copy"), "OMP_NUM_THREADS": "1"}
    for writer in ("process", "thread"):
        out = tmp_path / f"rooms-{writer}.parquet"
        r = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(out), writer],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        table = pq.read_table(out)
        assert "room" in table.column_names
        rows = table.to_pandas()
        assert rows["room"].tolist() == [step % 3 if env == 0 else 7 for step in range(6) for env in (0, 1)]
        report = json.loads(r.stdout.strip().splitlines()[-1])
        assert report["rooms"] == {"rows_per_room": {"0": 2, "1": 2, "2": 2, "7": 6}}
        assert "the agent visited 4 rooms" in report["findings"]
        # the copy's schema documents it too
        md = subprocess.run(
            [sys.executable, "-m", "lstm_probe", "schema", "--markdown"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert "| `room` | int32 | yes | Throwaway" in md.stdout


HAND_KEPT = {
    ("report/scan.py", "COLUMNS"),
    ("report/scan.py", "SMALL_INTS"),
    ("report/sections/staleness.py", "STALENESS_COLUMNS"),
    ("report/sections/doctor.py", "COLUMNS"),
    ("log/paired.py", "PAIR_COLUMNS"),
    ("report/html.py", "START_COLUMNS"),
}
"""The column lists kept by hand: deliberate subsets, each of the columns one reader needs (the column
recipe, step 4). The lists derived from the schema (row buffers, encoder, null filling, Grid's columns,
tag keys) need no entry."""


def _column_recipe() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("## Recipe: add a column")
    return text[start : text.index("\n## ", start + 1)]


def test_the_column_recipe_names_every_hand_kept_column_list():
    named = set(re.findall(r"`([\w/]+\.py)`\s+`([A-Z_]+)`", _column_recipe()))
    assert named == HAND_KEPT


def test_hand_kept_column_lists_name_declared_columns():
    from lstm_probe.log.schema import COLUMN

    for path, name in sorted(HAND_KEPT):
        module = importlib.import_module("lstm_probe." + path.removesuffix(".py").replace("/", "."))
        columns = getattr(module, name)
        unknown = [c for c in columns if c not in COLUMN]
        assert not unknown, f"{path} {name} names {unknown}, which schema.COLUMNS does not declare"
        assert len(set(columns)) == len(columns), f"{path} {name} names a column twice"
    from lstm_probe.report.scan import COLUMNS, SMALL_INTS

    # read as float32 (NaN = null): nullable integer counters the scan reads
    assert all(c in COLUMNS and COLUMN[c].kind == "int" and COLUMN[c].nullable for c in SMALL_INTS)
