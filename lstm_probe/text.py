"""Text helpers shared by the CLI and the report: strings from files (log metadata, column values, model
zips) made safe to print on a terminal, and sizes in words."""

from __future__ import annotations

import math
import re
from typing import Any

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(value: Any) -> str:
    """``str(value)`` without control characters (escape sequences could retitle or clear a terminal):
    each becomes ``\\xNN``. Newlines and tabs are kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def safe(value: Any) -> str:
    """:func:`plain`, with rich markup escaped: a string from a file printed through rich reads as
    written, never as styling."""
    from rich.markup import escape

    return escape(plain(value))


def human_bytes(n: float) -> str:
    """A size in bytes as people read it: '512 B', '18.7 KB', '3.2 MB', '1.4 GB'."""
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float (nested in dicts, lists, tuples) made None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def strict_json(value: Any, indent: int | None = None) -> str:
    """JSON as the standard has it: NaN and infinities as null (Python's json writes bare NaN, which no
    JSON parser but Python's reads); numpy scalars and other objects as their str."""
    import json

    return json.dumps(finite(value), indent=indent, allow_nan=False, default=_plain)


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        out = item()
        return finite(out) if isinstance(out, float) else out
    return str(value)
