"""The measurements' records (``--what-if``, ``--memory``) ride every part's metadata as the returns do
(``metadata_keys.LIVE_KEYS``): a run killed with SIGKILL keeps them, and its report shows their panels."""

from __future__ import annotations

import os
import subprocess
import sys

import lstm_probe
from lstm_probe.log.reader import read_info, writing
from tests.live_parts import carried
from tests.test_reliability import wait_for

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ARGS = [
    "run",
    "CartPole-v1",
    "--steps",
    "1000000",
    "--n-envs",
    "2",
    "--n-steps",
    "32",
    "--batch-size",
    "32",
    "--n-epochs",
    "2",
    "--hidden-size",
    "8",
    "--torch-threads",
    "1",
    "--part-seconds",
    "0.2",
    "--capture",
    "summary",
    "--what-if",
    "--memory",
]


def test_a_killed_run_keeps_its_what_if_and_memory_records(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lstm_probe", *ARGS, "--out", f"{out}/"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def two_iterations():
            assert proc.poll() is None, proc.communicate()
            held = carried(out)
            return len(held.get("what_if", ())) >= 2 and len(held.get("memory", ())) >= 2

        wait_for(two_iterations, "no part carried two iterations of what-if and memory records")
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -9
    wait_for(lambda: writing(out) is None, "the writer process never published the killed run's last part")
    last = carried(out)  # the last part's: what the reader takes
    info = read_info(out)
    assert not info.metadata["completed"]
    assert set(info.metadata["what_if"]["records"]["iteration"]) == last["what_if"]
    assert set(info.metadata["memory"]["records"]["iteration"]) == last["memory"]
    rep = lstm_probe.summarize(out)
    assert rep.what_if.measured and rep.memory.measured
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "report", str(out)], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert "What if: other initial states" in r.stdout, r.stdout
    assert "Memory: effect(k) at the last measured iteration" in r.stdout, r.stdout
