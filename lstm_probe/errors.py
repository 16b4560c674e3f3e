"""The few exceptions users see. Each message says what is wrong and how to fix it."""


class ProbeError(Exception):
    """Base class: a problem the user can fix; the CLI prints it as one line and exits 2."""


class BadInput(ProbeError):
    """An option, argument or environment that cannot work; raised before training starts."""


class BadLog(ProbeError):
    """A file that is not a readable lstm-probe log (missing, foreign, truncated or too new)."""


class OutputError(ProbeError):
    """The log could not be written (disk full, path vanished); what was written stays readable."""


class Interrupted(ProbeError):
    """Training was interrupted (Ctrl-C, SIGTERM); the log was closed with completed = false."""


def one_line(exc: BaseException, *, kind: bool = True) -> str:
    """An exception as one line: ``"Type: first line of its message"``; with ``kind=False`` the first line
    alone (the type's name when the message is empty). For stop reasons and the CLI's error line."""
    text = str(exc)
    first = text.splitlines()[0] if text else ""
    if kind:
        return f"{type(exc).__name__}: {first}"
    return first or type(exc).__name__
