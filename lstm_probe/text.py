"""Strings from files (log metadata, column values, model zips) made safe to print on a terminal."""

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
