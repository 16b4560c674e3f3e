"""Text helpers shared by the CLI and the report: strings from files (log metadata, column values, model
zips) made safe to print on a terminal, and sizes in words."""

from __future__ import annotations

import math
import re
from typing import Any

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""What a terminal would act on rather than show: C0 and C1 control characters (ESC starts an escape sequence,
BEL ends one), DEL, and the bidirectional marks, embeddings, overrides and isolates that reorder what is
shown around them. Newline and tab are not among them."""

_LINE_CONTROL = re.compile(_CONTROL.pattern[:-1] + r"\n\t]")
""":data:`_CONTROL`, newline and tab: what :func:`safe` shows as codes."""

WORD = 200
"""The most characters of one word (a run without whitespace) that :func:`safe` shows."""

LIMIT = 2000
"""The most characters of one string that :func:`safe` shows by default: every line the report writes fits."""


def _code(match: re.Match[str]) -> str:
    n = ord(match.group())
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def plain(value: Any) -> str:
    """``str(value)`` without control characters (escape sequences could retitle or clear a terminal) or
    bidirectional controls: each becomes ``\\xNN`` or ``\\uNNNN``. Newlines and tabs are kept."""
    return _CONTROL.sub(_code, str(value))


def safe(value: Any, limit: int | None = LIMIT, markup: bool = True, word: int = WORD) -> str:
    """The one way a string from a file (log metadata, column values, part file names, Arrow field names,
    model zips) or a path reaches the terminal, errors included: :func:`plain` (no control characters; here
    newline and tab become ``\\x0a`` and ``\\x09`` too, so a value prints as one line), cut to ``limit``
    characters with no word over :data:`WORD` (each cut marked ``… (N more)``: what rich draws stays small
    and linear in the file, whatever the file holds), with rich markup escaped (printed through rich it
    reads as written, never as styling). ``limit=None``: nothing is cut (a path to copy). ``markup=False``:
    markup left as it is, for text printed with ``markup=False`` (the CLI's one-line errors)."""
    text = str(value)
    if limit is not None:
        text = _cut(text, limit, word)
    text = _LINE_CONTROL.sub(_code, text)
    if not markup:
        return text
    from rich.markup import escape

    return escape(text)  # (a trailing backslash is doubled, so that markup after it stays markup)


def _cut(text: str, limit: int, longest: int = WORD) -> str:
    """``text`` cut to ``limit`` characters and each word to :data:`WORD` (``… (N more)`` where cut). A
    word that the cut at ``limit`` ends is marked once, with everything left out after it."""
    word = min(longest, limit)
    left = len(text) - limit
    head = text[:limit] if left > 0 else text
    marked = False

    def mark(match: re.Match[str]) -> str:
        nonlocal marked
        more = len(match.group()) - word
        if left > 0 and match.end() == len(head):
            more, marked = more + left, True
        return f"{match.group()[:word]}… ({more:,} more)"

    head = re.sub(rf"\S{{{word + 1},}}", mark, head)
    return head if left <= 0 or marked else f"{head}… ({left:,} more)"


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
