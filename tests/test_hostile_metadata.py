"""A log is a user's file: the metadata keys the report reads from it (optimizer_steps, autoreset_mode,
training_mode, the architecture's dropout and num_layers, memory.sampling's max_chunk_steps and cut_updates) are
checked before use. A real log whose metadata holds a string (with terminal escapes) or a float where lstm-probe
writes a count reports cleanly (the value ignored, never a crash, a refusal or raw escapes), and says nothing false
about it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import lstm_probe

ROOT = Path(__file__).resolve().parents[1]
ESC = "\x1b[31mRED\x1b]0;title\x07"
FINAL = "lstm_probe.final"  # each part's key-value document (the live records, the close's metadata)


def rewrite(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """``src`` (a log file or a directory of parts) copied to ``dst`` with ``edit`` applied to each part's run
    metadata and final document."""
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy(src, dst)
    for f in sorted(dst.glob("*.parquet")) if dst.is_dir() else [dst]:
        pf = pq.ParquetFile(f)
        kv = {k.decode(): v for k, v in (pf.metadata.metadata or {}).items()}
        table = pf.read()
        meta = {k: v for k, v in table.schema.metadata.items() if k != FINAL.encode()}
        run = json.loads(meta[b"lstm_probe.run"])
        edit(run)
        meta[b"lstm_probe.run"] = json.dumps(run).encode()
        table = table.replace_schema_metadata(meta)
        final = json.loads(kv[FINAL]) if FINAL in kv else None
        if final is not None:
            edit(final)
        f.unlink()
        with pq.ParquetWriter(f, table.schema) as w:
            w.write_table(table)
            if final is not None:
                w.add_key_value_metadata({FINAL: json.dumps(final)})
    return dst


def report(log: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "report", str(log), *args], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0 and "\x1b" not in r.stdout and "Traceback" not in r.stderr, r.stdout + r.stderr
    return r


def test_counts_and_modes_of_the_wrong_type_are_ignored_with_a_warning(tmp_path: Path) -> None:
    """optimizer_steps 0.0 (a float) in an sb3 log made the Sequences panel say no optimizer step happened and
    state no BPTT horizon; a string was passed on as the count. Now both are dropped with the reader's warning."""
    sample = ROOT / "sample_runs" / "cartpole-4env.parquet"
    for value in (0.0, ESC):
        log = rewrite(sample, tmp_path / f"{type(value).__name__}.parquet", lambda m, v=value: m.update(
            optimizer_steps=v, autoreset_mode=[v], training_mode=v, what_if=v, memory=v
        ))  # fmt: skip
        info = lstm_probe.read_info(log)
        for key in ("optimizer_steps", "autoreset_mode", "training_mode", "what_if", "memory"):
            assert key not in info.metadata
            assert any(w.startswith(f"metadata {key!r} is a ") for w in info.warnings)
        text = report(log).stdout
        assert "optimizer_steps" not in text and "gradients flow back at most" in " ".join(text.split())
        seqs = json.loads(report(log, "--json").stdout)["sequences"]
        assert "optimizer_steps" not in seqs and "steps_uncounted" not in seqs


def test_dropout_entries_of_the_wrong_type_are_not_read(tmp_path: Path) -> None:
    """num_layers 'two' (int('two') refused the whole log) and training_mode counts that are strings (the same) or
    NaN: the report is made; a module whose num_layers is no count is no dropout cause, and counts that are no
    counts are not said (the cause in the words of a log without the record)."""
    pytest.importorskip("torchrl")
    log = tmp_path / "run.parquet"
    from tests.torchrl_policies import dropout_run  # (torchrl imported only where installed)

    dropout_run(log)
    meta = lstm_probe.read_info(log).metadata
    assert meta["training_mode"] == {"lstm": {"rollout": [32, 32], "train": [1, 1]}}
    cause = "dropout between the LSTM layers (nn.LSTM dropout: lstm 0.5"
    assert f"{cause}; in rollout, 32 of 32 calls in training mode; in train, 1 of 1 calls" in report(log).stdout

    def layers(m: dict[str, Any]) -> None:
        if "architecture" in m:
            m["architecture"]["modules"]["lstm"]["num_layers"] = "two"

    out = report(rewrite(log, tmp_path / "layers.parquet", layers), "--json").stdout
    staleness = json.loads(out)["staleness"]
    assert staleness["provenance_ok"] is False and "provenance_dropout" not in staleness
    for value in (ESC, float("nan"), 40):  # 40 of 32 calls: no count lstm-probe writes either

        def modes(m: dict[str, Any], v: Any = value) -> None:
            if "training_mode" in m:
                m["training_mode"]["lstm"]["rollout"] = [v, 32]

        bad = rewrite(log, tmp_path / f"modes-{value!r:.3}.parquet", modes)
        said = json.loads(report(bad, "--json").stdout)["staleness"]["provenance_dropout"]
        assert said.startswith(f"{cause}): the states of the layers above the first")
        assert f"{cause}): " in " ".join(report(bad).stdout.split())


def test_memory_sampling_counts_of_the_wrong_type_are_not_read(tmp_path: Path) -> None:
    """A real RLlib --memory log whose memory.sampling max_chunk_steps and cut_updates are strings (the panel's
    int() and format crashed the report) or a list (dict() of it refused the log): the panel says no bound."""
    pytest.importorskip("ray.rllib")
    from tests.test_rllib_memory_chunks import _run

    log = tmp_path / "log"
    _run(log, iterations=2)
    sampling = lstm_probe.read_info(log).metadata["memory"]["sampling"]
    assert (sampling["max_chunk_steps"], sampling["cut_updates"]) == (1024, 0)
    assert "each update's chunks read whole" in " ".join(report(log).stdout.split())

    for name, values in {"both": (ESC, ESC), "cut": (1024, ESC), "cap": (ESC, 2), "float": (1024, 2.5)}.items():

        def counts(m: dict[str, Any], v: tuple[Any, Any] = values) -> None:
            if isinstance(m.get("memory"), dict):
                m["memory"]["sampling"].update(max_chunk_steps=v[0], cut_updates=v[1])

        text = " ".join(report(rewrite(log, tmp_path / name, counts)).stdout.split())
        assert "each update's chunks read whole" in text and "had longer chunks" not in text

    def listed(m: dict[str, Any]) -> None:
        if isinstance(m.get("memory"), dict):
            m["memory"]["sampling"] = [1, 2]

    assert "state zeroed k steps back" in " ".join(report(rewrite(log, tmp_path / "list", listed)).stdout.split())
