"""The README's examples run as written, and every command documents itself."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


@pytest.mark.parametrize("index", [0, 1], ids=["pandas", "library"])
def test_readme_log_snippets_run_on_a_sample_log(tmp_path, index):
    shutil.copy(ROOT / "sample_runs" / "pendulum-1env.parquet", tmp_path / "run.parquet")
    r = subprocess.run([sys.executable, "-c", BLOCKS[index]], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_readme_set_up_commands_match_ci():
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(line.strip() for line in README.splitlines() if "python -m pytest" in line)
    assert test_command in ci
    assert "lstm-probe run Pendulum-v1 --steps 250" in README and "lstm-probe report run.parquet" in README


@pytest.mark.parametrize("command", ["run", "report", "arch", "schema"])
def test_every_command_has_help(command):
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", command, "--help"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "Usage" in r.stdout and len(r.stdout) > 200
    assert f"lstm-probe {command}" in README


def test_sample_runs_are_documented_and_readable():
    import lstm_probe

    doc = (ROOT / "sample_runs" / "README.md").read_text()
    logs = sorted((ROOT / "sample_runs").glob("*.parquet")) + [
        p for p in sorted((ROOT / "sample_runs").iterdir()) if p.is_dir()
    ]
    assert len(logs) >= 3
    for log in logs:
        assert log.name in doc
        assert lstm_probe.read_info(log).completed
