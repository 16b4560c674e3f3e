"""The lines `lstm-probe export` and `replay` print (a user trial): export's progress counts the steps it
says it verified on, on a terminal as in plain lines; Ctrl-C (SIGINT) during export or replay ends in one
line on stderr saying it was interrupted and what was (not) written, exit 130, no traceback, OUT never half
written; replay's verdict shows the largest action difference beside the tolerance, so a float16 runtime
(~1e-3 of the action scale) is told from a float32 one (~1e-7) even where both are within it. A real (tiny)
RecurrentPPO, real files, the CLI in a subprocess as a user runs it."""

from __future__ import annotations

import io
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from sb3_contrib import RecurrentPPO

import lstm_probe
from lstm_probe.deploy.replay import Loop, Replay

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "NO_COLOR": "1"}
WAIT = 240
"""Seconds a test waits at most for a condition (a guard against a hang: the condition ends the wait)."""


def cli(*args, cwd):
    cmd = [sys.executable, "-m", "lstm_probe", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory):
    """A RecurrentPPO on Pendulum-v1 (hidden 8, 64 steps of training), saved and exported to ONNX."""
    d = tmp_path_factory.mktemp("lines")
    torch.set_num_threads(1)
    model = RecurrentPPO(
        "MlpLstmPolicy", "Pendulum-v1", n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu",
        policy_kwargs={"lstm_hidden_size": 8},
    ).learn(64)  # fmt: skip
    model.save(d / "pendulum.zip")
    lstm_probe.export(d / "pendulum.zip", d / "pendulum.onnx", synthetic=True, episodes=1)
    return d, model


def test_export_counts_the_steps_it_verifies(pendulum):
    """1 synthetic episode is 200 steps, each one of the file's and one of the PyTorch policy's: the progress
    says 0/200 steps (it said 0/400, with no unit), as the summary says 200 steps."""
    d, _ = pendulum
    r = cli("export", "pendulum.zip", "counted.onnx", "--synthetic", "--episodes", "1", cwd=d)
    assert r.returncode == 0 and not r.stderr.strip(), r.stdout + r.stderr
    lines = [re.sub(r", \d+:\d\d elapsed$", "", x) for x in r.stdout.splitlines() if x.startswith("export: ")]
    assert lines[:3] == ["export: reading the policy", "export: writing the file", "export: verifying 0/200 steps"]
    assert all(re.fullmatch(r"export: verifying [\d,]+/200 steps", x) for x in lines[3:]), lines
    assert "verified on 200 steps of 1 episode of 200 synthetic observations" in r.stdout


def test_the_terminal_line_counts_as_the_plain_line():
    from rich.console import Console

    from lstm_probe.cli.render import _ExportDisplay

    buf = io.StringIO()
    with _ExportDisplay(False, console=Console(file=buf, force_terminal=True, width=200)) as display:
        display.update("verifying", 0, 1000)
        display.due = 0.0  # a redraw due
        display.update("verifying", 250, 1000)
        display.bar.refresh()
    assert re.search(r"export: verifying .* 250/1,000 steps", buf.getvalue()), buf.getvalue()


def _interrupted(args, cwd, ready):
    """``lstm-probe ARGS`` in a subprocess, sent SIGINT once ``ready(process, stdout so far)`` holds (checked as
    each stdout line comes, and every 50 ms): (exit code, stdout, stderr). Fails if it ends first."""
    p = subprocess.Popen(
        [sys.executable, "-m", "lstm_probe", *map(str, args)],
        cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, p.stdout), lines.put(None)], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + WAIT
    try:
        while not ready(p, "".join(seen)):
            assert time.monotonic() < deadline, f"not ready in {WAIT} s: {''.join(seen)}"
            try:
                line = lines.get(timeout=0.05)
            except queue.Empty:
                continue
            assert line is not None, f"ended before it was interrupted:\n{''.join(seen)}{p.stderr.read()}"
            seen.append(line)
        p.send_signal(signal.SIGINT)
        code = p.wait(timeout=WAIT)
    finally:
        if p.poll() is None:
            p.kill()
    while (line := lines.get(timeout=WAIT)) is not None:
        seen.append(line)
    return code, "".join(seen), p.stderr.read()


def _verifying(p, stdout):
    return "export: verifying 0/" in stdout


@pytest.mark.parametrize("earlier", [False, True])
def test_ctrl_c_during_export_says_so_and_leaves_no_file(pendulum, earlier):
    """1,000 synthetic episodes (200,000 steps: minutes of verification), SIGINT as the progress says it
    verifies: one line, exit 130, no OUT (or, with --force, the file there before, unchanged), no temporary."""
    d, _ = pendulum
    out = d / f"long-{earlier}.onnx"
    if earlier:
        out.write_bytes(b"an earlier export")
    force = ["--force"] if earlier else []
    code, stdout, stderr = _interrupted(
        ["export", "pendulum.zip", out.name, "--synthetic", "--episodes", "1000", *force], d, _verifying
    )
    assert code == 130, stdout + stderr
    assert "Traceback" not in stdout + stderr
    lines = stderr.strip().splitlines()
    if earlier:
        want = f"interrupted (signal SIGINT): nothing was written, the {out.name} there before is left as it was"
    else:
        want = f"interrupted (signal SIGINT): {out.name} was not written"
    assert lines == [f"{want} (stopped while verifying)"], stderr
    assert out.read_bytes() == b"an earlier export" if earlier else not out.exists()
    assert not [p.name for p in d.iterdir() if p.name.startswith(f".{out.stem}.")]  # the temporary removed


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="waits on /proc/PID/maps (Linux)")
def test_ctrl_c_during_replay_says_so(pendulum):
    """A trace of 150,000 steps (750,000 policy steps over replay's 5 loops: a minute or more); SIGINT once
    replay has loaded onnxruntime to read the policy (it prints nothing until its verdict)."""
    d, _ = pendulum
    n = 150_000
    rng = np.random.default_rng(0)
    obs = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(3 * n).astype(np.float32)), 3)
    rows = {"step": np.arange(n), "obs": obs, "action": np.zeros(n, np.float32), "episode_start": np.arange(n) == 0}
    pq.write_table(pa.table(rows), d / "long.parquet")

    def loading(p, stdout):
        try:
            return "onnxruntime" in Path(f"/proc/{p.pid}/maps").read_text()
        except OSError:  # it ended: the wait fails on its end of output
            return False

    code, stdout, stderr = _interrupted(["replay", "long.parquet", "--policy", "pendulum.onnx"], d, loading)
    assert code == 130 and "Traceback" not in stdout + stderr, stdout + stderr
    assert stderr.strip().splitlines() == ["interrupted (signal SIGINT): no verdict (replay writes no file)"]
    assert "verdict" not in stdout


def _half(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def _record(model, half, episodes=2, steps=60):
    """A correct deployment loop (sb3's own predict, state fed back, reset at episode starts), in float32 or
    as a half-precision runtime runs it: weights, observations and states rounded to float16."""
    policy = model.policy
    if half:
        policy = model.policy_class(
            model.observation_space, model.action_space, model.lr_schedule, **model.policy_kwargs
        )
        policy.load_state_dict(model.policy.state_dict())
        policy.set_training_mode(False)
        with torch.no_grad():
            for p in policy.parameters():
                p.copy_(p.half().float())
    env, rows, state = gym.make("Pendulum-v1"), [], None
    for e in range(episodes):
        raw, _ = env.reset(seed=e)
        for t in range(steps):
            obs = raw[None].astype(np.float32)
            if half:
                obs = _half(obs)
                state = None if state is None else tuple(_half(s) for s in state)
            action, state = policy.predict(obs, state=state, episode_start=np.array([t == 0]), deterministic=True)
            rows.append({"step": e * steps + t, "obs": raw.tolist(), "action": action[0].tolist()})
            rows[-1]["episode_start"] = t == 0
            raw, *_ = env.step(action[0])
    return pd.DataFrame(rows)


VERDICT = re.compile(
    r"verdict: (?P<verdict>[^;]+); (?P<whose>the correct loop's )?largest action difference (?P<diff>\S+) of the "
    r"action scale, (?P<ratio>\S+)x the tolerance (?P<tolerance>\S+)"
)


def test_the_verdict_shows_the_largest_action_difference_beside_the_tolerance(pendulum):
    """float32 and float16 recordings of a correct loop: at the default tolerance (1e-4) the float16 one is
    named, its difference shown; at 1e-2 both are 'correct', and the line shows ~1e-3 beside ~1e-7."""
    d, model = pendulum
    for name, half in (("f32", False), ("f16", True)):
        _record(model, half).to_parquet(d / f"{name}.parquet")
    found = {}
    for trace, tolerance in (("f32", "1e-4"), ("f16", "1e-4"), ("f32", "1e-2"), ("f16", "1e-2")):
        r = cli("replay", f"{trace}.parquet", "--policy", "pendulum.onnx", "--tolerance", tolerance, cwd=d)
        assert r.returncode == 0, r.stderr
        line = next(x for x in r.stdout.splitlines() if x.startswith("verdict: "))
        m = VERDICT.fullmatch(line)
        assert m, line
        assert float(m["tolerance"]) == float(tolerance), line
        assert float(m["ratio"]) == pytest.approx(float(m["diff"]) / float(tolerance), rel=0.1), line
        found[trace, tolerance] = m
    for tolerance in ("1e-4", "1e-2"):
        m = found["f32", tolerance]
        assert m["verdict"].startswith("correct") and not m["whose"] and float(m["diff"]) < 1e-5, m[0]
    assert found["f16", "1e-4"]["verdict"] == "float16" and found["f16", "1e-4"]["whose"], found["f16", "1e-4"][0]
    assert found["f16", "1e-2"]["verdict"].startswith("correct"), found["f16", "1e-2"][0]  # within a loose one
    for tolerance in ("1e-4", "1e-2"):
        half, full = float(found["f16", tolerance]["diff"]), float(found["f32", tolerance]["diff"])
        assert 1e-4 < half < 2e-2 and half > 100 * full, (half, full)


def test_discrete_actions_and_verdicts_naming_no_loop_show_no_difference():
    from lstm_probe.cli.render import _difference

    loops = [Loop("correct", 10, 10, None, 0.0), Loop("float16", 10, 10, None, 0.0)]
    assert _difference(Replay("correct", [], None, loops, 10, 1, 1e-4, action="discrete")) == ""
    assert _difference(Replay("not this policy", [], (0, 0), loops, 10, 1, 1e-4)) == ""
    assert _difference(Replay("correct", [], None, loops, 10, 1, 1e-4)).startswith("; largest action difference 0.0e")


def test_an_error_raised_from_a_ctrl_c_is_the_ctrl_c():
    """onnxruntime's module, interrupted as it loads, raises ImportError('initialization failed') from the
    KeyboardInterrupt (seen in the replay test above): the Ctrl-C goes on, never 'cannot run the file'."""
    from lstm_probe.deploy.runtime import interrupt_behind

    try:
        try:
            raise KeyboardInterrupt("signal SIGINT")
        except KeyboardInterrupt as ki:
            raise ImportError("initialization failed") from ki
    except ImportError as exc:
        with pytest.raises(KeyboardInterrupt, match="signal SIGINT"):
            interrupt_behind(exc)
        interrupt_behind(ValueError("not from a Ctrl-C"))  # returns: the caller's own error goes on
