"""The optional extras, declared once: what each provides and the line that installs it.

An extra's name is written as pip writes it in the package metadata (``rsl-rl``, never ``rsl_rl``): pip
23.2 (what ``python3.11 -m venv`` ships) matches a requested extra to the metadata's name without
normalising it, so ``'.[rsl_rl]'`` installed nothing there. The pins are read from the installed
package's own metadata (pyproject.toml's ``[project.optional-dependencies]``), not written twice.
"""

from __future__ import annotations

import re
from importlib import metadata
from importlib.util import find_spec

from lstm_probe.errors import BadInput

EXTRAS: dict[str, tuple[str, ...]] = {
    "html": ("matplotlib",),
    "export": ("onnx", "onnxruntime", "onnxscript"),
    "rllib": ("ray",),
    "rsl-rl": ("rsl_rl", "yaml"),
    "torchrl": ("torchrl", "tensordict"),
}
"""Extra -> the top-level modules it installs."""

_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def extra_of(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name: its top level is looked up), or None."""
    top = (module or "").partition(".")[0]
    return next((extra for extra, mods in EXTRAS.items() if top in mods), None)


def pins(extra: str) -> list[str]:
    """The requirements the installed lstm-probe declares for ``extra`` (empty when its metadata is
    unreadable: a source tree that was never installed)."""
    try:
        declared = metadata.requires("lstm-probe") or []
    except metadata.PackageNotFoundError:
        return []
    out = []
    for req in declared:
        spec, _, marker = req.partition(";")
        m = _MARKER.search(marker)
        if m and re.sub(r"[-_.]+", "-", m.group(1)).lower() == extra:
            out.append(spec.strip().replace(" ", ""))
    return out


def install_line(extra: str) -> str:
    """How to install ``extra``: the framework's own pins (works with any pip, any install of lstm-probe),
    and the extra itself from lstm-probe's source."""
    source = f"pip install '.[{extra}]' in lstm-probe's source"
    found = pins(extra)
    return f"pip install {' '.join(repr(p) for p in found)} (or {source})" if found else source


def missing(module: str | None, what: str) -> str | None:
    """The one line for ``what`` needing ``module``, not installed; None when no extra installs it."""
    extra = extra_of(module)
    if extra is None:
        return None
    top = str(module).partition(".")[0]
    if module != top and find_spec(top) is not None:  # installed, but not the version the extra pins
        return (
            f"{what} needs {module}, which the installed {top} lacks (lstm-probe's extra {extra} pins the "
            f"version it is tested with): {install_line(extra)}"
        )
    return f"{what} needs {top}, which is not installed (lstm-probe's extra {extra}): {install_line(extra)}"


def require(extra: str, what: str) -> None:
    """:class:`BadInput` with the install line where a module ``extra`` installs is missing (checked
    before any work that needs it)."""
    for name in EXTRAS[extra]:
        if find_spec(name) is None:
            raise BadInput(str(missing(name, what)))
