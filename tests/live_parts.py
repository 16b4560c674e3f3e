"""What the newest finished part of a dataset-directory log carries of the measurements' records while its run
goes (``metadata_keys.LIVE_KEYS``): shared by the kill tests of tests/test_live_records.py and test_rllib_live.py."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from lstm_probe.log.writer import META_FINAL_KEY


def carried(out: Path, pattern: str = "part-*.parquet") -> dict[str, set[int]]:
    """The iterations the what-if and memory records of the newest finished part named ``pattern`` hold (empty:
    none yet)."""
    for part in sorted(out.glob(pattern), reverse=True):
        try:
            kv = pq.ParquetFile(part).metadata.metadata or {}
        except OSError:  # (renamed into place whole: only a vanished file)
            continue
        doc = json.loads(kv.get(META_FINAL_KEY, b"{}"))
        return {k: set(doc[k]["records"]["iteration"]) for k in ("what_if", "memory") if doc.get(k)}
    return {}
