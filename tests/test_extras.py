"""The extras, named one way everywhere (issue #46): pyproject's names are the ones pip writes (every pip
matches them), every install line in the README, docs, examples and messages names a declared extra, and a
framework or tool that is not installed is one line, exit 2, with its exact install line (the pins
pyproject declares). .ci/extras installs each documented line with a fresh venv's own pip and imports it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from refusals import one_line_error

from lstm_probe.extras import EXTRAS, install_line, missing
from lstm_probe.integrations import FRAMEWORKS

ROOT = Path(__file__).resolve().parent.parent
DECLARED = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
LINE = re.compile(r"pip install (?:-[a-z]+ )*'(?:\.|lstm-probe)\[([a-z0-9_, -]+)\]'")


def _documented() -> list[tuple[str, str]]:
    """(file, extra) for every ``pip install '.[X]'`` line in the README, docs, examples and the package."""
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*.py")]
    files += [*(ROOT / "lstm_probe").rglob("*.py"), ROOT / ".ci" / "run", ROOT / ".ci" / "extras"]
    found = []
    for f in files:
        for m in LINE.finditer(f.read_text()):
            found += [(str(f.relative_to(ROOT)), e.strip()) for e in m.group(1).split(",")]
    return found


def test_extras_are_named_as_pip_writes_them():
    for name in DECLARED:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name), f"{name}: pip 23.2 matches only the normalised name"
    assert set(EXTRAS) <= set(DECLARED)
    assert {fw.extra for fw in FRAMEWORKS.values() if fw.extra} <= set(EXTRAS)


def test_every_documented_install_line_names_a_declared_extra():
    lines = _documented()
    named = {e for _, e in lines}
    assert {"rsl-rl", "torchrl", "rllib", "export", "html", "dev"} <= named, named
    for where, extra in lines:
        assert extra in DECLARED, f"{where}: pip install '.[{extra}]' names no extra of pyproject.toml"


def test_install_lines_carry_pyprojects_pins():
    for extra in EXTRAS:
        pins = " ".join(repr(p.replace(" ", "")) for p in DECLARED[extra])
        assert install_line(extra) == f"pip install {pins} (or pip install '.[{extra}]' in lstm-probe's source)"


def _hidden(modules, argv, cwd):
    """``lstm-probe ARGV`` in a process where ``modules`` cannot be imported (as if not installed)."""
    code = (
        "import sys\n"
        f"for m in {list(modules)!r}: sys.modules[m] = None\n"
        f"sys.argv = ['lstm-probe', *{list(argv)!r}]\n"
        "from lstm_probe.cli.app import main\nmain()"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=300)


@pytest.mark.parametrize("name", [n for n, fw in FRAMEWORKS.items() if fw.extra])
def test_a_missing_framework_is_one_line_with_its_install_line(tmp_path, name):
    fw = FRAMEWORKS[name]
    r = _hidden(EXTRAS[fw.extra], ["run", "CartPole-v1", "--framework", name, "--steps", "64"], tmp_path)
    line = one_line_error(r, f"--framework {name} needs", install_line(fw.extra))
    assert "not installed" in line and not list(tmp_path.iterdir())  # refused before anything was written


def test_a_missing_exporter_is_one_line_with_its_install_line(tmp_path):
    """Refused before the model is read (no model.zip here: the exporter is what the line names)."""
    r = _hidden(EXTRAS["export"], ["export", "model.zip", "policy.onnx", "--env", "Pendulum-v1"], tmp_path)
    one_line_error(r, "lstm-probe export needs onnx, which is not installed", install_line("export"))
    assert not list(tmp_path.iterdir())


def test_a_framework_installed_without_a_module_names_the_version():
    """A submodule missing from an installed package: the installed version lacks it, not 'not installed'."""
    pytest.importorskip("onnx")
    line = missing("onnx.no_such_module", "lstm-probe export")
    assert line.startswith("lstm-probe export needs onnx.no_such_module, which the installed onnx lacks")
    assert line.endswith(install_line("export"))


def test_missing_names_only_what_an_extra_installs():
    assert missing("pandas", "x") is None and missing(None, "x") is None
    assert missing("rsl_rl", "--framework rsl_rl").startswith("--framework rsl_rl needs rsl_rl, which is not installed")
