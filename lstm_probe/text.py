"""Text helpers shared by the CLI and the report: strings from files (log metadata, column values, model
zips) made safe to print on a terminal, and sizes in words."""

from __future__ import annotations

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
