"""The package's shape, as docs/architecture.md states it: who may import whom, no import cycles (imports
inside functions count), and modules small enough to read in one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lstm_probe"

# Reading a log needs neither torch nor a framework; the core never names a framework.
CORE = {
    "errors",
    "text",
    "schema",
    "contract",
    "options",
    "layout",
    "writer",
    "assemble",
    "sink",
    "recover",
    "logwriter",
    "writer_process",
    "tracer",
    "reader",
    "html",
    "html_figures",
    "lock",
    "inputs",
    "probes",
}
READ_SIDE = {"reader", "html", "html_figures", "probes", "text", "schema", "contract", "layout", "lock", "errors"}
MAX_LINES = 600


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["lstm_probe", *parts])


def _imports(path: Path) -> set[str]:
    """Every lstm_probe module ``path`` imports, at the top or inside a function."""
    tree = ast.parse(path.read_text())
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    # imports under `if TYPE_CHECKING:` never run: they name types for the checker only
    for block in [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test).endswith("TYPE_CHECKING")]:
        block.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("lstm_probe"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            if not mod.startswith("lstm_probe"):
                continue
            for alias in node.names:  # `from lstm_probe import reader` imports a module
                sub = f"{mod}.{alias.name}"
                found.add(sub if _exists(sub) else mod)
    found.discard(me)
    return {m for m in found if _exists(m)}


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def test_no_import_cycles_even_inside_functions():
    graph = _graph()
    # a package's __init__ may re-export lazily from its children; the edge child -> package is what
    # Python resolves first, so only edges between non-package modules count as cycles
    edges = {
        m: {d for d in deps if not (PACKAGE / Path(*d.split(".")[1:]) / "__init__.py").exists()}
        for m, deps in graph.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                cycle = [*stack[stack.index(d) :], d]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)


def test_core_never_imports_an_integration():
    graph = _graph()
    for name in sorted(graph):
        short = name.removeprefix("lstm_probe.")
        if short.split(".")[0] in CORE or short.startswith("report"):
            bad = sorted(d for d in graph[name] if d.startswith("lstm_probe.integrations"))
            assert not bad, f"{name} imports {bad}: the core speaks to frameworks only through lstm_probe.contract"


def test_read_side_needs_no_torch():
    for path in PACKAGE.rglob("*.py"):
        short = _module_name(path).removeprefix("lstm_probe.")
        if short.split(".")[0] not in READ_SIDE and not short.startswith("report"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n == "torch" or n.startswith("torch.") for n in names), f"{short} imports torch"


def test_modules_are_readable_in_one_sitting():
    long = {}
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_LINES and "must be this long" not in text:
            long[str(path.relative_to(PACKAGE))] = lines
    assert not long, f"modules over {MAX_LINES} lines without a docstring saying why: {long}"


# `import lstm_probe` and the CLI's start-up: what runs before a command does loads no framework, pandas or rich
# (each command imports what it needs inside its function: `lstm-probe report` starts in a fraction of a second).
LIGHT = ("lstm_probe", "lstm_probe.cli", "lstm_probe.integrations")
HEAVY = ("torch", "stable_baselines3", "sb3_contrib", "gymnasium", "ray", "pandas", "rich", "matplotlib")


def _top_level_imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it is imported: module-level statements, not function bodies nor
    ``if TYPE_CHECKING:`` blocks."""
    found: set[str] = set()
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and not ast.unparse(node.test).endswith("TYPE_CHECKING"):
            todo += [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            todo += [*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if _exists(f"{node.module}.{a.name}"))
    return found


def test_package_and_cli_start_light():
    seen: set[str] = set()
    todo = list(LIGHT)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        rel = Path(*name.split(".")[1:])
        path = (
            PACKAGE / rel / "__init__.py"
            if (PACKAGE / rel / "__init__.py").exists()
            else (PACKAGE / rel).with_suffix(".py")
        )
        imports = _top_level_imports(path)
        heavy = sorted(m for m in imports if m.split(".")[0] in HEAVY)
        assert not heavy, f"{name} imports {heavy} when imported: import it inside the function that needs it"
        todo += [m for m in imports if m.startswith("lstm_probe") and _exists(m)]
    assert "lstm_probe.cli_render" in seen and not any(m.startswith("lstm_probe.integrations.") for m in seen)
