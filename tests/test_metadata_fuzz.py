"""Every metadata key the reader knows (``METADATA_KEYS``, the live records), and one level into the records the
report reads (what_if and memory's settings, sampling and records columns; returns' by_iteration, by_shard and
best; architecture.modules' entries; capabilities, hyperparameters, capture, progress, probe_cost), replaced with
hostile values in real logs: the report (text, JSON, HTML) is made or refused in one line, never crashes, never
prints a raw terminal escape, and refuses no log for one malformed entry."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import lstm_probe
from lstm_probe.errors import BadLog
from lstm_probe.log.metadata_keys import LIVE_KEYS, METADATA_KEYS
from lstm_probe.report import Line, Panel, Table, summarize
from lstm_probe.text import strict_json
from tests.test_hostile_metadata import rewrite

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
ESC = "\x1b[31mX"
HOSTILE: dict[str, Any] = {
    "esc": ESC,
    "nan": float("nan"),
    "neg": -1,
    "huge": 1e308,
    "bool": True,
    "list": [ESC, -1],
    "dict": {ESC: ESC},
    "null": None,
}
REFUSED = {("hidden_size",)}
"""Where a refusal is right: h vectors of another width than the metadata declares (two logs' parts, or none)."""
NESTED = ("capabilities", "hyperparameters", "capture", "progress", "probe_cost", "rllib", "architecture")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real sb3 run with --what-if and --memory into a directory of parts (as tests/test_live_records.py)."""
    out = tmp_path_factory.mktemp("live") / "run"
    args = "--steps 256 --n-envs 2 --n-steps 32 --batch-size 32 --n-epochs 2 --hidden-size 8 --torch-threads 1"
    cmd = [sys.executable, "-m", "lstm_probe", "run", "CartPole-v1", *args.split(), "--capture", "summary"]
    r = subprocess.run([*cmd, "--what-if", "--memory", "--out", f"{out}/"], env=ENV, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    meta = lstm_probe.read_info(out).metadata
    assert {"returns", "what_if", "memory"} <= set(meta)
    return out


def places(meta: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Where to put a hostile value in a log of metadata ``meta``: every top-level key, and the records the report
    reads that the log holds, each as a path (``"*"``: every key of that record at once; 0: a column's first)."""
    out: list[tuple[Any, ...]] = [(k,) for k in dict.fromkeys([*METADATA_KEYS, *LIVE_KEYS])]
    for key in ("what_if", "memory"):
        if isinstance(meta.get(key), dict):
            out += [(key, k) for k in meta[key]]
            out += [(key, "sampling", "*"), (key, "records", "*"), (key, "records", "*", 0)]
            out += [(key, "episode_lengths", "*")] if key == "memory" else []
    if isinstance(meta.get("returns"), dict):
        out += [("returns", k) for k in meta["returns"]]
        out += [("returns", "by_iteration", "*"), ("returns", "by_iteration", "*", 0), ("returns", "best", "*")]
        out += [("returns", "by_shard", "*"), ("returns", "by_shard", "*", "partial")]
    out += [(key, "*") for key in NESTED]
    out += [("architecture", "modules", m) for m in meta["architecture"]["modules"]]
    out += [("architecture", "modules", "*", "*"), ("architecture", "gradient_flow", "*")]
    return out


def put(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit of a metadata document that sets ``path`` to ``value`` where its parent is there (a top-level key
    also where it is not)."""

    def edit(doc: Any, at: tuple[Any, ...] = path) -> None:
        head, rest = at[0], at[1:]
        if isinstance(doc, dict):
            keys = list(doc) if head == "*" else [head] if head in doc or len(path) == 1 else []
        elif isinstance(doc, list) and isinstance(head, int):
            keys = [head] if head < len(doc) else []
        else:
            return
        for k in keys:
            if rest:
                edit(doc[k], rest)
            else:
                doc[k] = copy.deepcopy(value)

    return edit


def made(log: Path, refusable: bool) -> None:
    """The report of ``log`` made in-process (text, JSON): nothing but a one-line refusal where ``refusable``,
    no raw escape in any string it shows."""
    try:
        rep = summarize(log)
    except BadLog as e:
        assert refusable and "\n" not in str(e), str(e)
        return
    shown: list[str] = list(rep.warnings)
    for blocks in rep.text():
        for b in blocks:
            if isinstance(b, Line):
                shown.append(b.text)
            elif isinstance(b, Panel):
                shown += [b.title, *b.lines]
            elif isinstance(b, Table):
                shown += [b.title, *b.columns, *(c for row in b.rows for c in row)]
    assert not [s for s in shown if "\x1b" in s]
    assert "\x1b" not in strict_json(rep.to_dict())


def test_every_metadata_key_with_a_hostile_value_is_reported(live: Path, tmp_path: Path) -> None:
    """A crash in any section (int() of a string, len() of a float, .get() on a module entry that is no dict),
    a refusal of the whole log for one entry, or an escape reaching the text fails this."""
    failed = []
    for src in (live, ROOT / "sample_runs" / "cartpole-rllib"):
        for path in places(lstm_probe.read_info(src).metadata):
            for name, value in HOSTILE.items():
                log = rewrite(src, tmp_path / "log", put(path, value))
                try:
                    made(log, path in REFUSED)
                except Exception as e:  # (every failure named at once)
                    failed.append(f"{src.name} {path} = {name}: {type(e).__name__}: {e}"[:300])
                shutil.rmtree(log)
    Path(os.environ.get("FUZZ_OUT", os.devnull)).write_text("\n".join(failed))
    assert not failed, "\n".join(failed)


def report(log: Path, *args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "report", str(log), *args], capture_output=True, text=True, env=ENV
    )
    assert r.returncode in (0, 2) and "Traceback" not in r.stderr and "\x1b" not in r.stdout, r.stdout + r.stderr
    assert r.returncode == 0 or len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r


def test_the_cli_reports_the_reviewers_known_cases(live: Path, tmp_path: Path) -> None:
    """memory.lags holding strings refused the log; steps_per_env a string counted its characters as steps;
    returns.partial true counted as 1 episode under way. Text, JSON and HTML: the entry dropped with a warning."""

    def edit(m: dict[str, Any]) -> None:
        if isinstance(m.get("memory"), dict):
            m["memory"]["lags"] = [ESC, "2"]
            m["memory"]["sampling"]["steps_per_env"] = "abcdefghijklmnop"
        if isinstance(m.get("returns"), dict):
            m["returns"]["partial"] = True

    log = rewrite(live, tmp_path / "log", edit)
    text = report(log)
    assert "metadata 'memory.lags' is a list, not a list of counts: ignored" in text.stderr
    assert "16 steps per env" not in " ".join(text.stdout.split())
    assert "under way when the probe started" not in text.stdout
    assert json.loads(report(log, "--json").stdout)["returns"]["partial"] == 0
    pytest.importorskip("matplotlib")
    report(log, "--html", str(tmp_path / "page.html"))


def test_a_records_value_of_the_wrong_type_drops_its_record_or_reads_as_null(live: Path, tmp_path: Path) -> None:
    """what_if/memory records (columnar): a key column's wrong value drops that record, another column's reads as
    null, each said once; the panels report the rest (the old code's int() of them refused the log)."""
    before = summarize(live)
    old = before.to_dict()

    def edit(m: dict[str, Any]) -> None:
        if isinstance(m.get("what_if"), dict):
            m["what_if"]["records"]["iteration"][0] = ESC  # epoch 0, stored, the oracle's minibatch
            m["what_if"]["records"]["kl"][1] = "0.5"
        if isinstance(m.get("memory"), dict):
            m["memory"]["records"]["k"][0] = None  # iteration 0, the actor's k = 1
            m["memory"]["records"]["pairs"][1] = True

    rep = summarize(rewrite(live, tmp_path / "log", edit))
    new = rep.to_dict()
    assert [w for w in rep.warnings if w not in before.warnings] == [
        "metadata 'what_if.records.iteration' holds 1 value(s) of the wrong type: those records ignored",
        "metadata 'what_if.records.kl' holds 1 value(s) of the wrong type: read as null",
        "metadata 'memory.records.k' holds 1 value(s) of the wrong type: those records ignored",
        "metadata 'memory.records.pairs' holds 1 value(s) of the wrong type: read as null",
    ]
    stored = [(r["epoch"], r["alternative"], r["minibatches"]) for r in new["what_if"]["by_epoch"]]
    was = [(r["epoch"], r["alternative"], r["minibatches"]) for r in old["what_if"]["by_epoch"]]
    assert stored == [(e, a, n - int((e, a) == (0, "stored"))) for e, a, n in was]
    assert new["what_if"]["check"]["minibatches"] == old["what_if"]["check"]["minibatches"] - 1
    first = new["memory"]["horizons"][0]
    assert (first["iteration"], first["module"], first["horizon"]) == (0, "actor", None)  # no k = 1 left
    assert new["memory"]["latest"] == old["memory"]["latest"]


def test_a_records_column_of_the_wrong_type_or_length_drops_the_records(live: Path, tmp_path: Path) -> None:
    def edit(m: dict[str, Any]) -> None:
        if isinstance(m.get("what_if"), dict):
            m["what_if"]["records"]["kl"] = "abc"
        if isinstance(m.get("memory"), dict):
            m["memory"]["records"]["kl"].pop()

    rep = summarize(rewrite(live, tmp_path / "log", edit))
    assert "metadata 'what_if.records': its column 'kl' is a str, not a list: ignored" in rep.warnings
    assert "metadata 'memory.records': its columns differ in length: ignored" in rep.warnings
    assert rep.to_dict()["what_if"] is None and rep.to_dict()["memory"]["measured"] is False


def test_info_keys_in_a_log_without_an_info_column_are_dropped(tmp_path: Path) -> None:
    """The RLlib sample has no info column: info_keys naming keys refused the report (the probes' BadInput)."""
    log = rewrite(ROOT / "sample_runs" / "cartpole-rllib", tmp_path / "log", put(("info_keys",), ["x"]))
    assert "info_keys" not in lstm_probe.read_info(log).metadata
    rep = summarize(log)
    assert "metadata 'info_keys' names info keys, but the log has no info column: ignored" in rep.warnings
