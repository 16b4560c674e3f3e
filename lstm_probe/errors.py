"""The few exceptions users see. Each message says what is wrong and how to fix it."""


class ProbeError(Exception):
    """Base class: a problem the user can fix. The CLI prints it as one line and exits with its kind's
    code: 2 for :class:`BadInput` and :class:`BadLog`, 1 for :class:`OutputError`, 130 for
    :class:`Interrupted` (cli.py's ``Exit``)."""


class BadInput(ProbeError):
    """An option, argument or environment that cannot work; raised before training starts (exit 2)."""


class BadLog(ProbeError):
    """A file that is not a readable lstm-probe log (missing, foreign, truncated or too new; exit 2)."""


class OutputError(ProbeError):
    """The log could not be written (disk full, path vanished); what was written stays readable (exit 1)."""


class Interrupted(ProbeError):
    """A command was interrupted (Ctrl-C, SIGTERM; exit 130): training's log closed with completed = false,
    export's OUT not written (or left as it was)."""


def one_line(exc: BaseException, *, kind: bool = True) -> str:
    """An exception as one line: ``"Type: first line of its message"``; with ``kind=False`` the first line
    alone (the type's name when the message is empty). For stop reasons and the CLI's error line."""
    text = str(exc)
    first = text.splitlines()[0] if text else ""
    if kind:
        return f"{type(exc).__name__}: {first}"
    return first or type(exc).__name__
