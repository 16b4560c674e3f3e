"""The one-line contract everywhere (issue #46): a bad argument or file is refused early (before envs, a
network or a framework are built), with one line on stderr, exit 2, no traceback and no warning lines beside
it; a failed run never describes another run's log as its own.

Real subprocesses of ``python -m lstm_probe`` on inputs made in tmp_path; tiny training where a run must
get going."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from refusals import one_line_error

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "100"}
TINY = ["--steps", "32", "--n-steps", "16", "--batch-size", "16", "--hidden-size", "8", "-q"]
FRAMEWORKS = {"sb3": "sb3_contrib", "torchrl": "torchrl", "rsl_rl": "rsl_rl"}
ENV_OF = {"sb3": "Pendulum-v1", "torchrl": "CartPole-v1", "rsl_rl": "Pendulum-v1"}


def cli(*args: object, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lstm_probe", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=ENV,
        timeout=timeout,
    )


def framework(name: str) -> list[str]:
    """``--framework NAME`` (skipped when its package is not installed)."""
    if importlib.util.find_spec(FRAMEWORKS[name]) is None:
        pytest.skip(f"{FRAMEWORKS[name]} is not installed")
    return ["--framework", name]


# -- an OUT that cannot be written: refused before anything is built ------------------------------------------
@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_an_out_under_a_regular_file_is_refused_up_front(tmp_path: Path, fw: str) -> None:
    """torchrl and rsl_rl built their envs and policy, then failed taking the lock (exit 1, a
    FileExistsError); sb3 said 'File exists'."""
    (tmp_path / "notes.txt").write_text("mine")
    r = cli("run", ENV_OF[fw], *framework(fw), *TINY, "--out", "notes.txt/x.parquet", cwd=tmp_path)
    one_line_error(r, "cannot write to notes.txt", "notes.txt is a file, not a directory", "--out")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_a_refused_run_leaves_no_directory_behind(tmp_path: Path, fw: str) -> None:
    """The check that OUT can be written made OUT's directories (sb3's before its env id was checked)."""
    r = cli("run", "NoSuchEnv-v0", *framework(fw), *TINY, "--out", "new/sub/x.parquet", cwd=tmp_path)
    one_line_error(r, "NoSuchEnv-v0")
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(
    not Path("/proc/self").is_dir(), reason="needs /proc (a directory nobody, root included, writes in)"
)
@pytest.mark.parametrize("fw", ["torchrl", "rsl_rl"])
def test_an_out_in_a_directory_nobody_can_write_is_refused_up_front(tmp_path: Path, fw: str) -> None:
    r = cli("run", ENV_OF[fw], *framework(fw), *TINY, "--out", "/proc/lstm-probe-test.parquet", cwd=tmp_path)
    one_line_error(r, "cannot write to /proc", "choose another --out")


@pytest.fixture(scope="module")
def model_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A RecurrentPPO zip saved right after construction (no training)."""
    from sb3_contrib import RecurrentPPO

    path = tmp_path_factory.mktemp("model") / "model.zip"
    tiny = {"n_steps": 16, "batch_size": 16, "n_epochs": 1, "seed": 0, "policy_kwargs": {"lstm_hidden_size": 8}}
    RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", device="cpu", **tiny).save(path)
    return path


@pytest.mark.parametrize("where", ["file", "proc"])
def test_an_export_out_that_cannot_be_written_is_refused_before_verifying(
    tmp_path: Path, model_zip: Path, where: str
) -> None:
    """The exported file was written after the verification episodes: an unwritable OUT failed only then."""
    if where == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("needs /proc")
    (tmp_path / "notes.txt").write_text("mine")
    out = "notes.txt/policy.onnx" if where == "file" else "/proc/lstm-probe-test.onnx"
    r = cli("export", model_zip, out, "--env", "Pendulum-v1", "--episodes", 1, cwd=tmp_path)
    one_line_error(r, "cannot write to", "choose another OUT")


# -- settings that bound each other ----------------------------------------------------------------------------
@pytest.mark.parametrize("fw", ["sb3", "torchrl", "rsl_rl", "rllib"])
def test_tracing_more_envs_than_the_run_has_is_refused(tmp_path: Path, fw: str) -> None:
    """--trace-envs 5 --n-envs 2 was not refused (sb3 trained and wrote its log as if nothing was wrong)."""
    out = "run/" if fw == "rllib" else "run.parquet"
    args = ["--trace-envs", 5, "--n-envs", 2, "--out", out]
    r = cli("run", ENV_OF.get(fw, "CartPole-v1"), "--framework", fw, *TINY, *args, cwd=tmp_path)
    one_line_error(r, "--trace-envs 5", "--n-envs 2")
    assert not list(tmp_path.iterdir())


def test_the_library_refuses_it_too(tmp_path: Path) -> None:
    import lstm_probe
    from lstm_probe.errors import BadInput

    with pytest.raises(BadInput, match="--trace-envs 3 is more envs than the run has"):
        lstm_probe.run("Pendulum-v1", tmp_path / "x.parquet", trace_envs=3, n_envs=2, steps=32)
    assert not list(tmp_path.iterdir())


# -- sizes no machine can build: refused before the envs or the network are made -----------------------------
PEAK = """
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(r.stderr)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
"""
PEAK_MB = 700
"""Peak RSS of a refused run: the interpreter with torch and a framework takes 250-450 MB."""


def peak(*args: object, cwd: Path) -> tuple[subprocess.CompletedProcess[str], int]:
    """One fresh ``lstm-probe ARGS`` (in its own wrapper process, so no other child's peak counts) and its
    peak RSS in MB (the result's stdout left empty: the wrapper's own)."""
    cmd = [sys.executable, "-c", PEAK, sys.executable, "-m", "lstm_probe", *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=ENV, timeout=300)
    code, mb = r.stdout.split()
    return subprocess.CompletedProcess(cmd, int(code), "", r.stderr), int(mb)


@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_n_envs_at_its_cap_is_refused_before_the_envs_are_made(tmp_path: Path, fw: str) -> None:
    """--n-envs 65,536 passed the cap: sb3 made 65,536 envs, then took 15 GB for the rollout's states
    (65,536 x 128 steps) before it was killed; torchrl and rsl_rl would spend minutes making 65,536
    gymnasium envs (1,024 take torchrl 13 s, 4,096 take rsl_rl 5 s)."""
    r, mb = peak("run", ENV_OF[fw], *framework(fw), "--n-envs", 65536, "-q", cwd=tmp_path)
    # sb3: 65,536 x 128 steps of LSTM states; torchrl and rsl_rl: more envs than they make in seconds
    why = {
        "sb3": ("env steps in one rollout", "fewer --n-envs"),
        "torchrl": ("at most 1,024 envs for --framework torchrl",),
        "rsl_rl": ("at most 8,192 gymnasium envs", "--torch-env"),
    }[fw]
    one_line_error(r, "--n-envs 65,536", *why)
    assert mb < PEAK_MB, f"peak RSS {mb} MB"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("fw", ["torchrl", "rsl_rl"])
@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--hidden-size", 100_000], ["--hidden-size 100000", "at most 65,536"]),
        (["--n-steps", 1_000_000_000], ["--n-steps 1,000,000,000", "fewer --n-envs or a shorter --n-steps"]),
        (["--n-envs", 4096, "--n-steps", 4096], ["--n-envs 4,096 x --n-steps 4,096", "env steps in one rollout"]),
        (["--hidden-size", "1e5"], ["--hidden-size", "valid integer"]),
    ],
)
def test_absurd_sizes_are_refused_before_anything_is_built(tmp_path: Path, fw: str, flags: list, named: list) -> None:
    """torchrl and rsl_rl took --hidden-size 100000 and failed with exit 1 (torch could not allocate 160 GB) after
    making their envs; sb3 refused it only as its allocation failed."""
    r = cli("run", ENV_OF[fw], *framework(fw), *flags, "-q", cwd=tmp_path)
    one_line_error(r, *named)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_a_network_over_the_machines_memory_is_refused_before_it_is_built(tmp_path: Path, fw: str) -> None:
    """A hidden size a log can hold (65,536) but whose recurrent weights alone, with gradients and Adam's
    moments, take 256 to 512 GiB: refused naming it, before any env or tensor is made."""
    from lstm_probe.options import physical_memory

    if (physical_memory() or 0) > 250 << 30:
        pytest.skip("this machine has the memory for it")
    r, mb = peak("run", ENV_OF[fw], *framework(fw), "--hidden-size", 65536, "-q", cwd=tmp_path)
    one_line_error(r, "--hidden-size 65,536", "more than this machine's", "a smaller --hidden-size")
    assert mb < PEAK_MB, f"peak RSS {mb} MB"
    assert not list(tmp_path.iterdir())


# -- a failed --force run and the earlier log ------------------------------------------------------------------
CRASHING_ENV = '''
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Crash(gym.Env):
    """Its reset fails: a run fails as training starts, before its probe has written anything."""

    metadata = {"render_modes": ["rgb_array"]}
    observation_space = spaces.Box(-1, 1, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        raise RuntimeError("the simulator is down")

    def step(self, action):
        raise RuntimeError("the simulator is down")


gym.register("Crash-v0", entry_point=Crash)
'''


def test_a_failed_force_run_does_not_describe_the_earlier_log_as_its_own(tmp_path: Path) -> None:
    """A --force run that failed before writing anything said 'the log old.parquet holds 958 rows up to env
    step 32 (completed: true)': the earlier run's log, still at OUT, described as this run's."""
    r = cli("run", "Pendulum-v1", *TINY, "--out", "old.parquet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    before = (tmp_path / "old.parquet").read_bytes()
    (tmp_path / "crash_env.py").write_text(CRASHING_ENV)
    r = cli("run", "crash_env:Crash-v0", *TINY, "--out", "old.parquet", "--force", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: RuntimeError: the simulator is down"), r.stderr
    assert "this run wrote no log; old.parquet is an earlier run's log, left as it was" in lines[0]
    assert "rows" not in lines[0] and "completed" not in lines[0]
    assert (tmp_path / "old.parquet").read_bytes() == before


def test_a_probe_on_a_users_model_refuses_it_too(tmp_path: Path) -> None:
    """ProbeCallback(trace_envs=3) on a user's 2-env RecurrentPPO traced both envs as if asked to."""
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    import lstm_probe
    from lstm_probe.errors import BadInput

    env = make_vec_env("Pendulum-v1", n_envs=2, seed=0)
    model = RecurrentPPO("MlpLstmPolicy", env, n_steps=16, batch_size=16, device="cpu")
    with pytest.raises(BadInput, match="trace_envs 3 is more envs than the model has"):
        model.learn(32, callback=lstm_probe.ProbeCallback(tmp_path / "x.parquet", trace_envs=3))
    env.close()
    assert not (tmp_path / "x.parquet").exists()
