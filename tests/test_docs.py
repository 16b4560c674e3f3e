"""Every code block in README.md, sample_runs/README.md and docs/*.md runs, or at least parses.

Fenced blocks only (an indented code block fails :func:`test_every_code_block_is_fenced`):

- ```python: run as written in a directory holding ``run.parquet`` (a copy of a sample log) and
  ``sample_runs/``;
- ```bash: each command (``lstm-probe ...`` or ``python ...``) run there as a subprocess;
- ```python no-test / ```bash no-test (training, installing, benchmarks): the imports run and every
  attribute the block takes from an imported name exists; each command's flags appear in that command's
  ``--help``; each pip extra exists in pyproject.toml;
- ```text: output, shown only.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = [ROOT / "README.md", ROOT / "sample_runs" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", flags=re.S | re.M)
LANGS = {"python", "bash", "text"}
SUBCOMMANDS = ("run", "report", "arch", "schema", "probe", "export", "replay")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "NO_COLOR": "1"}


@dataclass(frozen=True)
class Block:
    doc: str  # path relative to the repository root
    line: int  # line of the opening fence
    lang: str
    tested: bool
    code: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def _blocks() -> list[Block]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            info = m.group(1).split()
            out.append(
                Block(
                    str(doc.relative_to(ROOT)),
                    text.count("\n", 0, m.start()) + 1,
                    info[0] if info else "",
                    "no-test" not in info[1:],
                    m.group(2),
                )
            )
    return out


BLOCKS = _blocks()


def _of(lang: str, tested: bool) -> list[Block]:
    return [b for b in BLOCKS if b.lang == lang and b.tested == tested]


def _commands(code: str) -> list[list[str]]:
    """Shell commands of a block: continuation lines (a trailing backslash, or an indented synopsis line)
    joined, comments dropped, ``a && b`` split."""
    lines: list[str] = []
    for raw in code.splitlines():
        if lines and (lines[-1].endswith("\\") or (raw[:1].isspace() and raw.strip())):
            lines[-1] = lines[-1].rstrip("\\") + " " + raw.strip()
        elif raw.strip():
            lines.append(raw.strip())
    out = []
    for line in lines:
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append(words[:cut])
            words = words[cut + 1 :]
    return out


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "sample_runs" / "pendulum-1env.parquet", tmp_path / "run.parquet")
    (tmp_path / "sample_runs").symlink_to(ROOT / "sample_runs", target_is_directory=True)
    return tmp_path


@functools.cache
def _help(*command: str) -> str:
    r = subprocess.run([sys.executable, *command, "--help"], capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 0, f"{' '.join(command)} --help: {r.stderr}"
    return r.stdout


def test_every_code_block_is_fenced_and_labelled():
    for doc in DOCS:
        text = FENCE.sub("", doc.read_text())
        for i, line in enumerate(text.splitlines()[1:], 1):
            prev = text.splitlines()[i - 1]
            assert not (line.startswith("    ") and not prev.strip()), f"{doc.name}: indented code block {line!r}"
    for b in BLOCKS:
        assert b.lang in LANGS, f"{b}: fence language {b.lang!r}; use one of {sorted(LANGS)} (+ no-test)"
    assert _of("python", True) and _of("bash", True)


@pytest.mark.parametrize("block", _of("python", True), ids=str)
def test_python_blocks_run_on_a_sample_log(workdir, block):
    r = subprocess.run(
        [sys.executable, "-c", block.code], cwd=workdir, capture_output=True, text=True, timeout=300, env=ENV
    )
    assert r.returncode == 0, f"{block}:\n{r.stderr}"
    assert r.stdout.strip() or "print(" not in block.code


@pytest.mark.parametrize("block", _of("bash", True), ids=str)
def test_shell_blocks_run_on_a_sample_log(workdir, block):
    for words in _commands(block.code):
        if words[0] == "lstm-probe":
            argv = [sys.executable, "-m", "lstm_probe", *words[1:]]
        elif words[0] == "python":
            argv = [sys.executable, *words[1:]]
        else:
            pytest.fail(f"{block}: {words[0]!r} cannot run here; mark the block `bash no-test`")
        r = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=300, env=ENV)
        assert r.returncode == 0, f"{block}: {' '.join(words)}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        assert r.stdout.strip()


def test_untested_python_blocks_import_and_name_what_exists():
    """Blocks that train: their imports run and every ``name.attr`` of an imported name exists."""
    checks = []
    for b in _of("python", False):
        if importlib.util.find_spec("ray") is None and re.search(r"\bray\b|import rllib", b.code):
            continue  # the rllib extra is not installed
        tree = ast.parse(b.code)  # a syntax error fails here
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.asname or a.name.split(".")[0] for n in imports for a in n.names}
        attrs = sorted(
            {
                (n.value.id, n.attr)
                for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in names
            }
        )
        checks.append(f"# {b}\n" + "\n".join(ast.unparse(n) for n in imports))
        checks += [f"assert hasattr({name}, {attr!r}), '{b}: {name}.{attr}'" for name, attr in attrs]
    r = subprocess.run(
        [sys.executable, "-c", "\n".join(checks)], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV
    )
    assert r.returncode == 0, r.stderr[-3000:]


def test_untested_shell_commands_parse():
    """Commands that train, install or benchmark: each flag is one the command's --help lists."""
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for b in _of("bash", False):
        for words in _commands(b.code):
            while re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # an environment setting: the command follows
                words = words[1:]
            bare = [w.strip("[]") for w in words]
            flags = {w.split("=")[0] for w in bare if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", w)}
            if words[0] == "lstm-probe":
                assert words[1] in SUBCOMMANDS, f"{b}: no command {words[1]!r}"
                text = _help("-m", "lstm_probe", words[1])
            elif words[0] == "python" and words[1].startswith("benchmarks/"):
                text = _help(str(ROOT / words[1]))
            elif words[:2] == ["pip", "install"]:
                for spec in words[2:]:
                    if m := re.fullmatch(r"\.\[(.*)\]", spec):
                        assert set(m.group(1).split(",")) <= extras, f"{b}: {spec} names an extra pyproject lacks"
                continue
            elif words[:3] in (["python3", "-m", "venv"], ["python", "-m", "pytest"]) or words[0] == ".":
                continue
            else:
                pytest.fail(f"{b}: no check for {' '.join(words)!r}")
            missing = sorted(f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", text))
            assert not missing, f"{b}: {' '.join(words[:2])} --help lists no {missing}"


def test_links_between_docs_resolve():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", doc.read_text())):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            assert path.exists(), f"{doc.name}: link to {target} (no such file)"
            if anchor:
                slugs = {
                    re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                    for h in re.findall(r"^#+ (.*)$", FENCE.sub("", path.read_text()), flags=re.M)
                }
                assert anchor in slugs, f"{doc.name}: link to {target} (no such heading)"


def test_readme_is_short_and_its_picture_small():
    assert len(README.encode()) < 12_000
    for image in re.findall(r"!\[[^]]*\]\(([^)]+)\)", README):
        assert (ROOT / image).stat().st_size < 150_000, image


def test_readme_set_up_commands_match_ci():
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(line.strip() for line in README.splitlines() if "python -m pytest" in line)
    assert test_command in ci
    assert "lstm-probe run Pendulum-v1 --steps 250" in README and "lstm-probe report run.parquet" in README
    assert re.search(r"about \d+ minutes on a 2-core machine", README)


def test_readme_episode_is_in_its_run_and_integers_stay_integers():
    """The README's ``load(env=, episode=)`` returns rows: Pendulum-v1's episodes last 200 steps, so the
    set-up command's 250 steps (256 with sb3's rollouts) hold episodes 0 and 1, as the sample log does."""
    import pandas as pd

    import lstm_probe

    env, episode = map(int, re.search(r'load\("run.parquet", env=(\d+), episode=(\d+)\)', README).groups())
    sample = ROOT / "sample_runs" / "pendulum-1env.parquet"
    ep = lstm_probe.load(sample, env=env, episode=episode, vectors=False)
    assert set(ep["phase"]) >= {"rollout", "train"}
    df = lstm_probe.load(sample, vectors=False)
    for col in ("call", "layer", "iteration", "epoch", "seq", "t", "env", "env_step", "episode", "episode_step"):
        assert isinstance(df[col].dtype, pd.api.extensions.ExtensionDtype) and pd.api.types.is_integer_dtype(df[col]), (
            col,
            df[col].dtype,
        )
    assert df["env"].isna().any() and df.loc[df["padding"], "env"].isna().all()
    assert str(df["padding"].dtype) == "boolean"


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_command_has_help(command):
    text = _help("-m", "lstm_probe", command)
    assert "Usage" in text and len(text) > 200
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
