"""The command line's words read before typer parses them: ``--max-memory`` wherever it was given, the
``report LOG --json`` line run without typer, ``run``'s ``--out``. Pure functions of ``argv``."""

from __future__ import annotations


def json_report(args: list[str]) -> tuple[str | None, str] | None:
    """(``--max-memory`` value or None, LOG) where ``args`` (after :func:`global_first`) are exactly
    ``[--max-memory SIZE] report LOG --json`` (``--json`` either side of a LOG that is no option), else None.
    ``app.main`` runs that command without typer's parsing: typer coerces every parameter through a pydantic
    type adapter, and importing pydantic and building the adapters is ~0.2 s of the command's start-up; the
    command's function and the error boundary are the same."""
    option, args = _max_memory(args)
    limit = option[-1].split("=", 1)[-1] if option else None
    if len(args) != 3 or args[0] != "report" or "--json" not in args[1:]:
        return None
    path = args[2] if args[1] == "--json" else args[1]
    return None if path.startswith("-") else (limit, path)


def global_first(args: list[str]) -> list[str]:
    """``--max-memory SIZE`` moved before the command wherever it was given (``lstm-probe report LOG
    --max-memory 8G`` as ``lstm-probe --max-memory 8G report LOG``): it is an option of every command."""
    option, rest = _max_memory(args)
    return [*option, *rest]


def _max_memory(args: list[str]) -> tuple[list[str], list[str]]:
    """(the first ``--max-memory`` option's words: ``[--max-memory, SIZE]``, ``[--max-memory=SIZE]`` or
    none, the other arguments in their order): the one reading of the option, for :func:`global_first`
    and :func:`json_report`."""
    for i, a in enumerate(args):
        if a == "--max-memory" and i + 1 < len(args):
            return [a, args[i + 1]], [*args[:i], *args[i + 2 :]]
        if a.startswith("--max-memory="):
            return [a], [*args[:i], *args[i + 1 :]]
    return [], args


def out_arg(args: list[str]) -> str:
    path = "run.parquet"
    for i, a in enumerate(args):
        if a in ("--out", "-o") and i + 1 < len(args):
            path = args[i + 1]
        elif a.startswith("--out="):
            path = a.split("=", 1)[1]
    return path
