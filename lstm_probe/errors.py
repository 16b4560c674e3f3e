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
