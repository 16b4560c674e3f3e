"""`lstm-probe run` saves the trained model beside its log (issue #49), and `run` -> `export` -> a deployed
loop's recording -> `replay` works from docs/deploy.md's commands alone, each run as a user runs it (real
subprocesses, real files). rsl_rl's checkpoint and TorchRL's state dicts load back into the framework's own
objects."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sb3_contrib import RecurrentPPO

import lstm_probe
from lstm_probe import BadInput

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "NO_COLOR": "1"}
FAST = {  # what makes the documented commands quick here; a later flag wins over the documented one
    "run": ["--steps", "256", "--hidden-size", "16", "--n-steps", "64", "--n-epochs", "1", "-q"],
    "export": ["--episodes", "1"],
}


def _documented() -> tuple[list[list[str]], str]:
    """The commands of docs/deploy.md's "From `run` to a checked deployment", its record.py run between them."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    section = text.split("## From `run` to a checked deployment", 1)[1].split("\n## ", 1)[0]
    before, python, after = re.findall(r"^```(?:bash|python) no-test\n(.*?)^```", section, flags=re.S | re.M)
    lines = [*before.splitlines(), "python record.py", *after.splitlines()]
    return [shlex.split(line, comments=True) for line in lines if line.strip()], python


def test_run_export_record_replay_as_docs_deploy_writes_it(tmp_path: Path) -> None:
    commands, record = _documented()
    assert [c[:2] for c in commands] == [
        ["lstm-probe", "run"],
        ["lstm-probe", "export"],
        ["python", "record.py"],
        ["lstm-probe", "replay"],
    ]
    (tmp_path / "record.py").write_text(record)
    said = []
    for words in commands:
        if words[0] == "lstm-probe":
            argv = [sys.executable, "-m", "lstm_probe", *words[1:], *FAST.get(words[1], [])]
        else:
            argv = [sys.executable, *words[1:]]
        r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=300)
        assert r.returncode == 0, f"{' '.join(words)}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        said.append(r.stdout)
        if words[1] == "export":  # its progress, a line as each stage starts (stderr: a refusal's line alone)
            assert not r.stderr.strip(), r.stderr
            stages = [line.split(",")[0] for line in r.stdout.splitlines() if line.startswith("export: ")]
            assert stages == [
                "export: reading the policy",
                "export: recording episodes",  # a count where there is more than one
                "export: writing the file",
                "export: verifying 0/200 steps",  # the 200 steps of the episode, each taken by both loops
            ], r.stdout
    assert "saved the trained model in run.model.zip" in said[0]
    assert "lstm-probe export run.model.zip policy.onnx --env Pendulum-v1" in said[0]
    assert "wrote policy.onnx" in said[1]
    assert "verdict: correct" in said[3]
    assert {"run.parquet", "run.model.zip", "policy.onnx", "robot.parquet"} <= {p.name for p in tmp_path.iterdir()}
    # the documented loop with a planted bug: the state never fed back
    (tmp_path / "record.py").write_text(record.replace("action, value, *state = ", "action, value, *_ = "))
    r = subprocess.run([sys.executable, "record.py"], cwd=tmp_path, capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    argv = [sys.executable, "-m", "lstm_probe", "replay", "robot.parquet", "--policy", "policy.onnx"]
    r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0 and "verdict: state not fed back" in r.stdout, r.stdout + r.stderr


def test_a_saved_model_is_not_overwritten_without_force(tmp_path: Path) -> None:
    (tmp_path / "run.model.zip").write_bytes(b"an earlier run's model")
    with pytest.raises(BadInput, match=r"run.model.zip already exists \(where this run saves its model\)"):
        lstm_probe.run("Pendulum-v1", tmp_path / "run.parquet", steps=64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.model.zip"]  # refused before training


def test_rsl_rl_run_saves_the_runners_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("rsl_rl")
    from lstm_probe.integrations.rsl_rl.train import build_runner, make_env
    from lstm_probe.integrations.rsl_rl.train import run as rsl_run

    result = rsl_run(
        "Pendulum-v1", tmp_path / "r.parquet", steps=64, n_envs=4, n_steps=8, hidden_size=8, n_epochs=1, torch_env=True
    )
    assert result.model == tmp_path / "r.model.pt"
    saved = torch.load(result.model, weights_only=True)  # no pickled code: plain state dicts and numbers
    assert {"actor_state_dict", "critic_state_dict", "iter", "infos"} <= set(saved)
    ours = saved["infos"]["lstm_probe"]
    assert ours["env_id"] == "Pendulum-v1" and ours["cfg"]["actor"]["rnn_hidden_dim"] == 8
    # rsl_rl's own load takes it into a runner built from the configuration it holds
    runner = build_runner(make_env("Pendulum-v1", 4, seed=1, torch_env=True, device="cpu"), ours["cfg"])
    runner.load(str(result.model), strict=True)
    for name, value in runner.alg.get_policy().state_dict().items():
        assert torch.equal(value, saved["actor_state_dict"][name]), name


def test_torchrl_run_saves_the_policys_state_dicts(tmp_path: Path) -> None:
    pytest.importorskip("torchrl")
    from lstm_probe.integrations.torchrl.train import build
    from lstm_probe.integrations.torchrl.train import run as torchrl_run

    result = torchrl_run("CartPole-v1", tmp_path / "t.parquet", steps=32, n_steps=32, hidden_size=8, n_epochs=1)
    assert result.model == tmp_path / "t.model.pt"
    saved = torch.load(result.model, weights_only=True)
    assert saved["lstm_probe"] == "torchrl" and saved["config"]["hidden_size"] == 8
    config = saved["config"]
    env, actor, critic, _ = build(
        config["env_id"], n_envs=1, hidden_size=config["hidden_size"], seed=1, num_layers=config["num_layers"]
    )
    actor.load_state_dict(saved["actor"], strict=True)
    critic.load_state_dict(saved["critic"], strict=True)
    for name, value in actor.state_dict().items():
        assert torch.equal(value, saved["actor"][name]), name
    env.close()


def test_export_tells_its_progress(tmp_path: Path) -> None:
    """``lstm_probe.export(progress=...)``: every stage, in order, and every verified step."""
    torch.set_num_threads(1)
    model = RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", n_steps=64, seed=0, policy_kwargs={"lstm_hidden_size": 8})
    heard: list[tuple[str, int, int]] = []
    r = lstm_probe.export(
        model, tmp_path / "p.pt", env_id="Pendulum-v1", episodes=2, progress=lambda *a: heard.append(a)
    )
    stages = [s for i, (s, _, _) in enumerate(heard) if i == 0 or heard[i - 1][0] != s]
    assert stages == ["reading the policy", "recording episodes", "writing the file", "verifying"]
    assert [h for h in heard if h[0] == "recording episodes"] == [("recording episodes", d, 2) for d in range(3)]
    verified = [d for s, d, t in heard if s == "verifying" and t == r.steps]  # each step taken by both loops
    assert verified == list(range(r.steps + 1))


@pytest.mark.parametrize("capture_obs", [True, False])
def test_the_export_line_after_a_torch_env_run_is_a_command_that_works(tmp_path: Path, capture_obs: bool) -> None:
    """rsl_rl's --torch-env has no gymnasium id to record episodes from (its Pendulum has no angular velocity):
    the line `run` prints verifies on the log's own observations, or says to run again with --capture-obs."""
    run = [sys.executable, "-m", "lstm_probe", "run", "Pendulum-v1", "--framework", "rsl_rl", "--torch-env"]
    small = ["--steps", "480", "--n-envs", "2", "--hidden-size", "8", "--out", "r.parquet"]
    done = subprocess.run(
        [*run, *small, *(["--capture-obs"] if capture_obs else [])],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("export it:"))
    if not capture_obs:
        assert "run again with --capture-obs" in line and "--env" not in line
        return
    command = shlex.split(line.removeprefix("export it: "))
    assert command[:2] == ["lstm-probe", "export"] and "--log" in command
    exported = subprocess.run(
        [sys.executable, "-m", "lstm_probe", *command[1:], "--episodes", "2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=ENV,
    )
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "policy.onnx").is_file() and "verified on" in exported.stdout


def test_export_log_of_a_torchrl_run_reads_its_shared_modules_observations(tmp_path: Path) -> None:
    """A TorchRL `--capture-obs` log's rows are its shared module's ('lstm'): `export --log` read the actor's
    alone and said "holds no observations; ... record with --capture-obs" of a log that held them. A log with
    fewer episodes than asked names how many it holds and says to pass that many."""
    pytest.importorskip("torchrl")
    run = [sys.executable, "-m", "lstm_probe", "run", "Pendulum-v1", "--framework", "torchrl", "--capture-obs"]
    small = ["--steps", "256", "--hidden-size", "8", "--n-steps", "128", "--n-epochs", "1", "-q", "--out", "t.parquet"]
    done = subprocess.run([*run, *small], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert done.returncode == 0, done.stderr
    export = [sys.executable, "-m", "lstm_probe", "export", "t.model.pt", "p.onnx", "--log", "t.parquet"]
    r = subprocess.run([*export, "--episodes", "1"], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p.onnx").is_file() and "verified on 200 steps" in r.stdout
    r = subprocess.run([*export, "--force"], capture_output=True, text=True, cwd=tmp_path, env=ENV)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: t.parquet holds 2 episodes, fewer than --episodes 5: pass --episodes 2, or record a longer run"
    ]


def test_export_never_writes_over_its_own_model_or_log(tmp_path: Path) -> None:
    """`export run.model.pt run.model.pt --force` (a slip for policy.pt, with the --force the "already exists"
    line asks for) replaced the trained checkpoint by the exported file. OUT naming the model, the --log or the
    --trace (by any path: a link, another spelling) is refused in one line, force or not, and the file stays."""
    model = tmp_path / "m.pt"
    model.write_bytes(b"the trained model, whatever it holds")
    (tmp_path / "link.pt").symlink_to(model)
    for given, out, extra in [
        (model, tmp_path / "sub" / ".." / "m.pt", ["--env", "Pendulum-v1"]),
        (tmp_path / "link.pt", model, ["--env", "Pendulum-v1"]),
    ]:
        (tmp_path / "sub").mkdir(exist_ok=True)
        r = subprocess.run(
            [sys.executable, "-m", "lstm_probe", "export", str(given), str(out), *extra, "--force"],
            capture_output=True,
            text=True,
            env=ENV,
        )
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines() == [
            f"error: {out} is the model to export: writing it would destroy it; choose another OUT, e.g. policy.pt"
        ]
    log = tmp_path / "run.onnx"
    log.write_bytes(b"a log")
    with pytest.raises(BadInput, match="is the --log: writing it would destroy it"):
        lstm_probe.export(model, log, log=log, force=True)
    assert model.read_bytes() == b"the trained model, whatever it holds" and log.read_bytes() == b"a log"
    (tmp_path / "loop.pt").symlink_to(tmp_path / "loop.pt")  # resolving it raised RuntimeError: exit 1, a traceback
    with pytest.raises(BadInput, match=r"loop\.pt is a symlink loop; choose another path"):
        lstm_probe.export(model, tmp_path / "loop.pt", synthetic=True)
