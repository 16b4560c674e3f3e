"""The package's shape, as docs/architecture.md states it: every module named in its layer diagram, who may
import whom, no import cycles (imports inside functions and type-only ones count), who prints, and modules
small enough to read in one sitting."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lstm_probe"
DOC = PACKAGE.parent / "docs" / "architecture.md"

CLI_LAYER = {"cli", "cli.app", "cli.flags", "cli.render", "cli.startup", "cli.__main__", "__main__"}
"""The command line: parses, calls the library, prints. May import anything."""
INTEGRATION_IMPORTS = {
    "contract",
    "measure",
    "capture.tracer",
    "capture.life",
    "options",
    "capture.modules",
    "capture.returns",
    "errors",
    "log.schema",
    "log.layout",
    "log.lock",
    "report",
    "log.budget",
    "torch_env",
    "log.messages",
    "extras",
}
"""The core modules an integration may import (docs/architecture.md names the same list)."""
DEPLOY_IMPORTS = {"errors", "log.layout", "options", "log.reader", "log.budget", "extras"}
"""The core modules the deploy layer may import (docs/architecture.md names the same list)."""
FRAMEWORK_PACKAGES = ("stable_baselines3", "sb3_contrib", "ray", "rsl_rl", "torchrl", "tensordict")
"""What the deploy layer never imports, not even inside a function: it reaches a framework through
``integrations.deploy_policy``."""
READ_ROOTS = {"log.reader", "report"}
"""Reading a log needs no torch: these, and every module they import."""
PRINTERS = {"cli.app", "cli.render"}
EXITERS = PRINTERS | {"log.writer_process"}  # a program of its own (python -m lstm_probe.log.writer_process)
MAX_LINES = 600


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["lstm_probe", *parts])


def _imports(path: Path, for_types: bool = False) -> set[str]:
    """Every lstm_probe module ``path`` imports, at the top or inside a function; ``for_types``: also those
    imported under ``if TYPE_CHECKING:`` (for the checker only: they never run)."""
    tree = ast.parse(path.read_text())
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    if not for_types:
        for block in [n for n in ast.walk(tree) if isinstance(n, ast.If) and _type_checking(n)]:
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


def _type_checking(node: ast.If) -> bool:
    return ast.unparse(node.test).endswith("TYPE_CHECKING")


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def _path(module: str) -> Path:
    """The file of ``module`` (``lstm_probe.x.y``): a package's ``__init__.py``, or the module's own."""
    rel = PACKAGE.joinpath(*module.split(".")[1:])
    return rel / "__init__.py" if (rel / "__init__.py").exists() else rel.with_suffix(".py")


def _graph(for_types: bool = False) -> dict[str, set[str]]:
    return {_module_name(p): _imports(p, for_types) for p in PACKAGE.rglob("*.py")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per edge that closes one (depth first, in name order), each as the modules around it."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append([*stack[stack.index(d) :], d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def test_no_import_cycles_even_inside_functions_or_for_types_only():
    """No two modules import each other, directly or around a longer loop, counting imports inside functions
    and under ``if TYPE_CHECKING:`` (a type one module needs of another lives in the lower of the two). An
    import of a package (its ``__init__``: the version, its lazy names) is no edge: importing any module
    imports its packages first."""
    graph = _graph(for_types=True)
    packages = {m for m in graph if _path(m).name == "__init__.py"}
    edges = {m: deps - packages for m, deps in graph.items()}
    cycles = _cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(map(_short, c)) for c in cycles)
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]  # the check sees one
    assert "lstm_probe.capture.emitter" in graph["lstm_probe.capture.blocks"]  # and type-only imports (blocks' Emitter)


def _short(module: str) -> str:
    return module.removeprefix("lstm_probe").removeprefix(".")


LAYERS = ("capture", "log", "cli")
"""Folders of the layers whose modules the rules name one by one (``capture.tracer``, ``log.reader``); a module of
any other folder is named by its folder (``report``: every module of report/)."""


def _unit(module: str) -> str:
    """How the rules below name ``module``: ``capture.tracer``, ``log.reader``, ``report``, ``options``."""
    parts = _short(module).split(".")
    return ".".join(parts[:2]) if parts[0] in LAYERS and len(parts) > 1 else parts[0]


def _is_core(module: str) -> bool:
    short = _short(module)
    return bool(short) and not short.startswith(("integrations", "deploy")) and short not in CLI_LAYER


def _doc_section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_core_never_imports_an_integration():
    graph = _graph()
    core = [m for m in sorted(graph) if _is_core(m)]
    assert "lstm_probe.capture.tracer" in core and "lstm_probe.report.sections.doctor" in core
    for name in core:
        bad = sorted(d for d in graph[name] if d.startswith(("lstm_probe.integrations", "lstm_probe.deploy")))
        assert not bad, f"{name} imports {bad}: the core speaks to frameworks only through lstm_probe.contract"


DEPLOY_INTERFACE = ("lstm_probe.deploy.spec", "lstm_probe.deploy.saved")
"""What an integration may import of the deploy layer: the interface of a policy, and where `run` saves one."""


def test_integrations_import_only_the_documented_core_modules():
    section = _doc_section("Who may import whom")
    rule = re.search(r"- An integration imports, of the core, (.*?),\s+and no other module", section, re.S)
    assert rule, "docs/architecture.md states which core modules an integration may import"
    assert set(re.findall(r"`([\w.]+)`", rule.group(1))) == INTEGRATION_IMPORTS
    graph = _graph()
    used: set[str] = set()
    for name in sorted(graph):
        if not _short(name).startswith("integrations"):
            continue
        core = {_unit(d) for d in graph[name] if _is_core(d)}
        bad = sorted(core - INTEGRATION_IMPORTS)
        assert not bad, f"{name} imports {bad}: an integration imports only {sorted(INTEGRATION_IMPORTS)} of the core"
        deploy = sorted(d for d in graph[name] if _short(d).startswith("deploy") and d not in DEPLOY_INTERFACE)
        assert not deploy, (
            f"{name} imports {deploy}: of the deploy layer, an integration imports only {DEPLOY_INTERFACE}"
        )
        used |= core
    unused = sorted(INTEGRATION_IMPORTS - used)
    assert not unused, f"no integration imports {unused}: drop it from the rule (here and in docs/architecture.md)"


def _all_imports(path: Path) -> set[str]:
    """Every module ``path`` imports (any package), at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return found


def test_the_deploy_layer_imports_only_the_documented_modules_and_no_framework():
    section = _doc_section("Who may import whom")
    rule = re.search(
        r"- The deploy layer \(`deploy/`\) imports, of the core, (.*?),\s+and no other module", section, re.S
    )
    assert rule, "docs/architecture.md states which core modules the deploy layer may import"
    assert set(re.findall(r"`([\w.]+)`", rule.group(1))) == DEPLOY_IMPORTS
    assert all(f in section for f in FRAMEWORK_PACKAGES), "docs/architecture.md names what deploy/ never imports"
    graph = _graph()
    deploy = [m for m in sorted(graph) if _short(m).startswith("deploy")]
    assert "lstm_probe.deploy.export" in deploy and "lstm_probe.deploy.replay" in deploy
    used: set[str] = set()
    for name in deploy:
        core = {_unit(d) for d in graph[name] if _is_core(d)}
        bad = sorted(core - DEPLOY_IMPORTS)
        assert not bad, f"{name} imports {bad}: the deploy layer imports only {sorted(DEPLOY_IMPORTS)} of the core"
        used |= core
        integrations = sorted(d for d in graph[name] if d.startswith("lstm_probe.integrations."))
        assert not integrations, (
            f"{name} imports {integrations}: it finds a framework through integrations.deploy_policy"
        )
        frameworks = sorted(m for m in _all_imports(_path(name)) if m.split(".")[0] in FRAMEWORK_PACKAGES)
        assert not frameworks, f"{name} imports {frameworks}: the deploy layer imports no framework"
    unused = sorted(DEPLOY_IMPORTS - used)
    assert not unused, f"no deploy module imports {unused}: drop it from the rule (here and in docs/architecture.md)"
    assert any(d == "lstm_probe.integrations" for m in deploy for d in graph[m]), "deploy_policy: the documented way"


def _read_side(graph: dict[str, set[str]]) -> set[str]:
    todo = [m for m in graph if _unit(m) in READ_ROOTS]
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph[m]
    return seen


def test_read_side_needs_no_torch():
    graph = _graph()
    read_side = _read_side(graph)
    stated = re.search(r"- The read side \((.*?)\) never imports torch", _doc_section("Who may import whom"), re.S)
    assert stated, "docs/architecture.md names the read side"
    named = set(re.findall(r"[a-z_.]*[a-z_]", stated.group(1).partition("transitively:")[2]))
    assert named == {_unit(m) for m in read_side} - READ_ROOTS, "the read side the doc names"
    for name in sorted(read_side):
        tree = ast.parse(_path(name).read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n == "torch" or n.startswith("torch.") for n in names), f"{name} imports torch"


def _prints_and_exits(tree: ast.AST) -> tuple[list[int], list[int]]:
    """Lines that print (print(), a console's .print(), sys.stdout/stderr.write) and lines that exit
    (sys.exit, os._exit, exit(), quit(), raise SystemExit / typer.Exit)."""
    prints: list[int] = []
    exits: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = ast.unparse(node.func)
            if f in ("print", "pprint") or f.endswith(".print") or re.fullmatch(r"sys\.std(out|err)\.write", f):
                prints.append(node.lineno)
            elif f in ("sys.exit", "os._exit", "exit", "quit"):
                exits.append(node.lineno)
        elif isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if ast.unparse(exc) in ("SystemExit", "typer.Exit", "typer.Abort"):
                exits.append(node.lineno)
    return prints, exits


def test_only_the_cli_prints_or_exits():
    seen = {"print": set(), "exit": set()}
    for path in PACKAGE.rglob("*.py"):
        short = _short(_module_name(path))
        prints, exits = _prints_and_exits(ast.parse(path.read_text()))
        assert short in PRINTERS or not prints, f"{short} prints (lines {prints}): return data, cli.py renders it"
        assert short in EXITERS or not exits, f"{short} exits (lines {exits}): raise BadInput/BadLog/OutputError"
        seen["print"] |= {short} if prints else set()
        seen["exit"] |= {short} if exits else set()
    assert seen["print"] == PRINTERS, seen  # the checks see what they check
    assert "log.writer_process" in seen["exit"]


_NAME = re.compile(r"[\w*]+(?:/[\w*]+)*(?:\.py|/)")


def _diagram_modules() -> list[str]:
    """The module paths (relative to lstm_probe/) the layer diagram names: the name that starts a line of
    the diagram (or several, comma-separated), in the package whose name, ending in '/', was last written
    to its left; ``*.py``: every module of that folder."""
    section = _doc_section("The layers")
    diagram = section.split("```text\n", 1)[1].split("```", 1)[0]
    names: list[str] = []
    packages: list[tuple[int, str]] = []  # (column of its name, its path)
    for line in diagram.splitlines():
        m = re.match(r"[\s│├└─]*", line)
        col = m.end() if m else 0
        field = re.match(rf"({_NAME.pattern}(?:, {_NAME.pattern})*)(?=\s|$)", line[col:])
        if field is None:
            continue  # a description continued from the line above
        while packages and packages[-1][0] >= col:
            packages.pop()
        prefix = packages[-1][1] if packages else ""
        for name in field.group(1).split(", "):
            if name.endswith("/"):
                packages.append((col, prefix + name))
            else:
                names.append(prefix + name)
    return names


def test_the_layer_diagram_names_every_module():
    names = _diagram_modules()
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    named: set[str] = set()
    for name in names:
        matched = {str(p.relative_to(PACKAGE)) for p in PACKAGE.glob(name)}
        assert matched, f"docs/architecture.md names {name}, which is not in lstm_probe/"
        named |= matched
    assert len(names) == len(set(names)), f"named twice: {sorted(n for n in names if names.count(n) > 1)}"
    missing = sorted(modules - named)
    assert not missing, f"docs/architecture.md's layer diagram does not name {missing}"
    assert "integrations/rllib/train.py" in named and "report/sections/doctor.py" in named


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
LIGHT = ("lstm_probe", "lstm_probe.cli.app", "lstm_probe.integrations")
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
        imports = _top_level_imports(_path(name))
        heavy = sorted(m for m in imports if m.split(".")[0] in HEAVY)
        assert not heavy, f"{name} imports {heavy} when imported: import it inside the function that needs it"
        todo += [m for m in imports if m.startswith("lstm_probe") and _exists(m)]
    assert "lstm_probe.cli.render" in seen and not any(m.startswith("lstm_probe.integrations.") for m in seen)
