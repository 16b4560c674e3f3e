"""The public surface and the options' declarations: the same objects whatever the import order, what the
README documents importable from ``lstm_probe``, and every option's default declared once."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lstm_probe
from lstm_probe import BadInput
from lstm_probe.integrations import FRAMEWORKS, group_classes
from lstm_probe.options import CaptureOptions, TrainOptions, capture_options

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lstm_probe"
SUBMODULES = ["lstm_probe.integrations.sb3.run", "lstm_probe.integrations.sb3.commands", "lstm_probe.options"]

PROBE = """
import importlib, json, sys
for m in sys.argv[1:]:
    importlib.import_module(m)
import lstm_probe
print(json.dumps({n: f"{getattr(lstm_probe, n).__module__}.{getattr(lstm_probe, n).__name__}"
                  for n in ("run", "arch", "Tracer", "trace", "probe", "load_model", "watch")}))
"""


@pytest.mark.parametrize("first", [[], SUBMODULES, list(reversed(SUBMODULES)), ["lstm_probe.cli.app"]])
def test_public_names_are_the_same_objects_whatever_was_imported_first(first):
    got = subprocess.run([sys.executable, "-c", PROBE, *first], capture_output=True, text=True, check=True)
    names = json.loads(got.stdout)
    assert names == {
        "run": "lstm_probe.integrations.sb3.run.run",
        "arch": "lstm_probe.integrations.sb3.commands.arch",
        "Tracer": "lstm_probe.integrations.generic.Tracer",
        "trace": "lstm_probe.integrations.generic.trace",
        "probe": "lstm_probe.report.probes.probe",
        "load_model": "lstm_probe.integrations.sb3.commands.load_model",
        "watch": "lstm_probe.integrations.sb3.watch.watch",
    }


def test_no_public_name_is_also_a_submodule():
    submodules = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    assert not (set(lstm_probe.__all__) & submodules)


def test_all_lists_every_public_name_and_each_imports():
    lazy = set(lstm_probe._LAZY)
    errors = {"BadInput", "BadLog", "Interrupted", "OutputError", "ProbeError", "__version__"}
    assert set(lstm_probe.__all__) == lazy | errors
    for name in lstm_probe.__all__:
        if name != "rllib" or _has_ray():
            assert getattr(lstm_probe, name) is not None


def _has_ray() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def test_what_the_readme_and_docs_call_is_public():
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    used = set(re.findall(r"lstm_probe\.([A-Za-z_]\w*)\(", text))
    used |= {n.strip() for m in re.findall(r"from lstm_probe import ([\w, ]+)", text) for n in m.split(",")}
    assert used, "the docs show library calls"
    assert used <= set(lstm_probe.__all__), sorted(used - set(lstm_probe.__all__))


def _groups() -> list[type]:
    """Every option group, once (a group several frameworks take, as Measure, is one declaration)."""
    groups = [CaptureOptions, TrainOptions, *(g for fw in FRAMEWORKS.values() for _, g in group_classes(fw))]
    return list(dict.fromkeys(groups))


def test_each_option_is_declared_by_one_group():
    names = [f.name for g in _groups() for f in dataclasses.fields(g)]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_no_signature_in_the_package_restates_an_options_default():
    """A parameter named like a declared option never carries a literal default: entry points take the
    option objects (and keyword overrides), internal code reads ``options.default(...)``."""
    declared = {f.name for g in _groups() for f in dataclasses.fields(g)} - {"out"}  # numpy's out= too
    # the same names meaning something else: a sampler's batch_size, a synthetic batch's steps, an env's own
    # device and seed
    other = {
        ("lstm_probe/integrations/sb3/callback.py", "get"),
        ("lstm_probe/integrations/sb3/arch.py", "_synthetic_batch"),
        ("lstm_probe/torch_env.py", "__init__"),
    }
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            for arg, value in pairs:
                if (str(path.relative_to(ROOT)), node.name) in other:
                    continue
                if arg.arg in declared and isinstance(value, ast.Constant):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({arg.arg}={value.value!r})")
    assert not found, found


def test_the_part_seconds_literal_appears_once():
    hits = [p for p in PACKAGE.rglob("*.py") for line in p.read_text().splitlines() if re.search(r"\b60\.0\b", line)]
    assert len(hits) == 1, hits


def test_keywords_override_the_options_object_and_are_checked(tmp_path):
    base = CaptureOptions(tmp_path / "a.parquet", capture="summary")
    got = capture_options(base, None, force=True)
    assert (got.out, got.capture, got.force) == (base.out, "summary", True)
    with pytest.raises(BadInput, match="--every must be >= 1"):
        capture_options(base, None, every=0)
    with pytest.raises(BadInput, match="did you mean part_seconds"):
        capture_options(None, None, part_second=3.0)
    with pytest.raises(BadInput, match="run has no option 'stepz': did you mean steps"):
        lstm_probe.run("CartPole-v1", out=tmp_path / "x.parquet", stepz=3)
