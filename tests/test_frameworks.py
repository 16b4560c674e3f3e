"""Every framework is declared once (``integrations.FRAMEWORKS``: name, title, extra, docs page, arch) and
what names the frameworks is built from or checked against that declaration (issue #47): the CLI's help,
the install lines, the README's list; each declared framework has its package, extra, docs page and tests."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from lstm_probe.extras import EXTRAS
from lstm_probe.integrations import FRAMEWORKS

ROOT = Path(__file__).resolve().parent.parent
EXTRAS_DECLARED = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def cli(*args, cwd=None):
    cmd = [sys.executable, "-m", "lstm_probe", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=cwd, timeout=120)


@pytest.mark.parametrize("name", list(FRAMEWORKS))
def test_each_declared_framework_has_its_files(name):
    fw = FRAMEWORKS[name]
    assert fw.title, f"{name}: no title for the CLI's help"
    assert importlib.util.find_spec(fw.module.rpartition(".")[0]) is not None, f"{name}: no package {fw.module}"
    assert (ROOT / fw.docs).is_file(), f"{name}: no docs page {fw.docs}"
    assert (ROOT / "tests" / f"test_{name}.py").is_file(), f"{name}: no tests/test_{name}.py"
    if fw.extra is not None:
        assert fw.extra in EXTRAS_DECLARED and fw.extra in EXTRAS, f"{name}: extra {fw.extra} not declared"
        assert fw.extra in EXTRAS_DECLARED["dev"][0], f"{name}: the dev extra (the tests' install) lacks {fw.extra}"
        assert f"pip install '.[{fw.extra}]'" in (ROOT / fw.docs).read_text(), f"{fw.docs} shows no install line"


@pytest.mark.parametrize("name", list(FRAMEWORKS))
def test_each_declaration_names_what_exists(name):
    # every "module:name" a framework declares (its live figures, deploy loader, option groups) imports
    from lstm_probe.integrations import declared

    fw = FRAMEWORKS[name]
    if fw.extra is not None and any(importlib.util.find_spec(m) is None for m in EXTRAS[fw.extra]):
        pytest.skip(f"{name} is not installed")
    for where in [fw.live, fw.deploy, *(w for _, w in fw.groups)]:
        if where is not None:
            assert declared(where) is not None, f"{name}: {where} names nothing"
    assert callable(declared(fw.module + ":run")), f"{name}: {fw.module} has no run"


def test_the_readme_and_the_help_name_exactly_the_declared_frameworks():
    readme = (ROOT / "README.md").read_text()
    assert f"--framework {'|'.join(FRAMEWORKS)}" in readme
    run_help = " ".join(cli("run", "--help").stdout.split())
    for fw in FRAMEWORKS.values():
        assert f"{fw.name} ({fw.title})" in run_help
        if fw.extra:
            assert f"{fw.name} '.[{fw.extra}]'" in run_help
    arch_help = " ".join(cli("arch", "--help").stdout.split())
    for fw in FRAMEWORKS.values():
        assert (f"{fw.name} ({fw.title})" in arch_help) == fw.arch, fw.name


def test_arch_of_a_framework_without_it_is_refused_in_one_line(monkeypatch):
    """Every framework has arch today; one declared without it is refused, naming those that have it."""
    import dataclasses

    from lstm_probe import integrations
    from lstm_probe.errors import BadInput

    monkeypatch.setitem(FRAMEWORKS, "torchrl", dataclasses.replace(FRAMEWORKS["torchrl"], arch=False))
    with pytest.raises(BadInput) as err:
        integrations.framework("torchrl", "arch")
    takes = " or ".join(n for n, fw in FRAMEWORKS.items() if fw.arch)
    assert str(err.value) == f"lstm-probe arch --framework torchrl is not built yet (arch takes --framework {takes})"
