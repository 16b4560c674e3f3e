"""RLlib's learners keep the measurements' records (``--what-if``, ``--memory``) in every part's metadata as the other
integrations do (``metadata_keys.LIVE_KEYS``): a real RLlib run killed with SIGKILL keeps them, the reader takes the
learner's (the most authoritative shard, as the close would), and the report shows both panels. The run is a CLI
process in a session of its own that starts its own ray; what of ray outlives the driver's SIGKILL (its agents) is
killed with the session's process group at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("ray.rllib")

import lstm_probe
from lstm_probe.log.reader import read_info, writing
from tests.live_parts import carried
from tests.test_reliability import wait_for

pytestmark = pytest.mark.rllib

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ARGS = ["run", "CartPole-v1", "--framework", "rllib", "--steps", "1000000", "--n-envs", "2", "--n-steps", "32"]
ARGS += ["--batch-size", "32", "--n-epochs", "2", "--hidden-size", "8", "--max-seq-len", "8", "--torch-threads", "1"]
ARGS += ["--part-seconds", "0.2", "--capture", "summary", "--what-if", "--memory"]


def test_a_killed_rllib_run_keeps_its_what_if_and_memory_records(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lstm_probe", *ARGS, "--out", f"{out}/"],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its ray processes in its process group: killed with it at the end
    )
    try:
        _check_killed(out, proc)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _check_killed(out, proc):
    try:

        def two_iterations():
            assert proc.poll() is None, proc.communicate()
            held = carried(out, "part-learner0-*.parquet")
            return len(held.get("what_if", ())) >= 2 and len(held.get("memory", ())) >= 2

        wait_for(two_iterations, "no learner part carried two iterations of what-if and memory records")
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -9
    wait_for(lambda: writing(out) is None, "a writer never published the killed run's last part")
    last = carried(out, "part-learner0-*.parquet")  # the learner's last part's: what the reader takes
    info = read_info(out)
    assert not info.metadata["completed"]
    assert set(info.metadata["shards"]) == {"runner0", "learner0"}
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
