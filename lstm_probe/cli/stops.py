"""Ctrl-C and SIGTERM as one line: a command stopped by either ends with ``interrupted (...): NOTE``, exit 130
(typer's own handling exits 130 and says nothing), NOTE saying what was or was not written."""

from __future__ import annotations

import contextlib
import functools
import signal
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from lstm_probe.errors import Interrupted

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def interrupted(note: Callable[[], str]) -> Iterator[None]:
    """Ctrl-C, SIGTERM: one line ending with what ``note()`` says was (not) written (typer's exit 130 says none)."""
    try:
        yield
    except KeyboardInterrupt as exc:
        raise Interrupted(f"interrupted ({str(exc) or 'Ctrl-C'}): {note()}") from None


def stops(note: str) -> Callable[[F], F]:
    """A command whose Ctrl-C ends in one line, ``interrupted (...): note`` (exit 130), as run's and export's."""

    def wrap(command: F) -> F:
        @functools.wraps(command)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with interrupted(lambda: note):
                return command(*args, **kwargs)

        return cast(F, inner)

    return wrap


def on_signal(signum: int, frame: Any) -> None:
    """SIGINT and SIGTERM as a KeyboardInterrupt naming the signal (main installs it for both)."""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")
