"""A probe's life, the same for every framework: start, close, ``with``, user tags, and a run's training.

- :class:`Scope`: ``with probe:`` starts the probe (unless it runs) and closes it with how the block ended.
- :class:`Probe`: a probe over the core's :class:`~lstm_probe.capture.tracer.CoreTracer`. ``start()`` puts the
  integration's own attachments on (hooks, wrappers: :meth:`Probe._attach`) and opens the log, undoing both
  when either fails; ``close(completed, stop_reason, **extra)`` takes them off (:meth:`Probe._detach`) and
  finishes the log with the integration's own outcome (:meth:`Probe._final`). An integration writes only those
  three: where its calls come from, and what they mean.
- :class:`Tagged`: ``tag(**tags)`` blocks, for the probes that let the user say what a call is.
- :func:`train`: every framework's ``run`` once its run is built: the training loop with progress, the probe
  closed with how it ended (completed, or the exception's :func:`stop_reason`: also on Ctrl-C, whose partial
  log is kept), then the finished log's :class:`~lstm_probe.options.RunResult`.

:func:`stop_reason` words how a run ended, once for every framework's log.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from lstm_probe.capture.tracer import CoreTracer
from lstm_probe.errors import BadInput, OutputError, one_line
from lstm_probe.options import Progress, RunResult

S = TypeVar("S", bound="Scope")
P = TypeVar("P", bound="Probe")


def stop_reason(exc: BaseException) -> str:
    """How a run that raised ``exc`` ended, as every log words it: ``"Type: first line of the message"``
    (:func:`~lstm_probe.errors.one_line`); a bare Ctrl-C (a KeyboardInterrupt without a message) is
    ``"KeyboardInterrupt: interrupted"``."""
    if isinstance(exc, KeyboardInterrupt) and not str(exc):
        exc = KeyboardInterrupt("interrupted")
    return one_line(exc)


class Scope:
    """``with probe:`` for every probe, defined once: the block starts the probe unless it runs already, and
    closes it with how the block ended: completed, or not with the exception's :func:`stop_reason` (the
    exception goes on)."""

    @property
    def running(self) -> bool:
        """Whether the probe is started and its log open."""
        raise NotImplementedError

    def start(self: S) -> S:
        raise NotImplementedError

    def close(self, completed: bool = True, stop_reason: str | None = None) -> Path | None:
        raise NotImplementedError

    def __enter__(self: S) -> S:
        return self if self.running else self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.close(completed=exc is None, stop_reason=None if exc is None else stop_reason(exc))


class Probe(Scope):
    """A probe over a :class:`~lstm_probe.capture.tracer.CoreTracer` (``tracer``): started, closed and used with
    ``with`` the same way for every framework. An integration overrides what is its own: :meth:`_attach`,
    :meth:`_detach` and :meth:`_final`."""

    tracer: CoreTracer
    started_once: bool = False
    """Whether :meth:`start` ever opened this probe's log (a tag block before it records nothing)."""

    def _core(self) -> CoreTracer:
        """The core tracer this probe runs (the generic tracer is its own)."""
        return self.tracer

    def _attach(self) -> None:
        """Put the integration's own hooks and wrappers on (before the log opens)."""

    def _detach(self) -> None:
        """Take them off (idempotent; also after a failed :meth:`_attach`, which may have put some on)."""

    def _final(self) -> dict[str, Any]:
        """What the integration adds to the log's outcome, after :meth:`_detach`."""
        return {}

    @property
    def running(self) -> bool:
        return self._core().writer is not None

    def start(self: P) -> P:
        """Attach, then open the log and hook the recurrent modules; on a failure of either, nothing stays on
        and no log is opened. Returns the probe."""
        try:
            self._attach()
            # the core's own start, also where the probe is a CoreTracer (the generic tracer)
            CoreTracer.start(self._core())
        except BaseException:
            self._detach()
            raise
        # the process's exit closes a log left open; only this process's (a forked child inherits the hook) and
        # with the exception that ends it, not one the interpreter kept from before (sys.last_value)
        self._exit_owner, self._exit_before = os.getpid(), getattr(sys, "last_value", None)
        atexit.register(self._at_exit)
        self.started_once = True
        return self

    def close(self, completed: bool = True, stop_reason: str | None = None, **extra: Any) -> Path | None:
        """Detach, then finish the log with how the run ended (``extra``: more of its outcome); returns the
        log's path (None when it was not open)."""
        atexit.unregister(self._at_exit)
        self._detach()
        return CoreTracer.close(self._core(), completed, stop_reason, **{**self._final(), **extra})

    def _at_exit(self) -> None:
        """The process ends with the log open: ``start()`` without ``close()`` and an exception or Ctrl-C that
        nothing caught (``with`` closes the log itself). The log is closed as not completed, with the exception
        that ended the process where the interpreter kept it (``sys.last_value``), so its rows stay readable."""
        if os.getpid() != getattr(self, "_exit_owner", None) or not self.running:
            return
        exc = getattr(sys, "last_value", None)
        fresh = isinstance(exc, BaseException) and exc is not getattr(self, "_exit_before", None)
        why = f" ({stop_reason(exc)})" if fresh and isinstance(exc, BaseException) else ""
        writer = self._core().writer
        failed = writer is not None and writer.error is not None
        try:
            self.close(completed=False, stop_reason=f"the process exited before close(){why}")
        except OutputError:
            if not failed:  # new at exit: say it; a writer error was already raised where it happened
                raise
        except Exception:  # anything else at exit (a device error while settling): the crash journal keeps the rows
            pass


def refuse_unstarted(probe: object) -> None:
    """:class:`BadInput` for a tag block of a probe never started (nothing would be recorded); after ``close()``
    a tag block is harmless (nothing is hooked). An object that is no :class:`Probe` passes."""
    if not getattr(probe, "started_once", True):
        raise BadInput(
            "probe.tag(...) before probe.start(): nothing would be recorded; call probe.start() first, or use "
            "`with probe:`"
        )


class Tagged:
    """``tag(**tags)`` blocks, for the probes that let the user say what each call inside is (the generic
    tracer's integration; TorchRL's own loss loop). ``_user`` holds the open blocks, each merged over the
    enclosing ones: the innermost is what ``resolve`` reads; ``_epochs``: a block gave an epoch (the log's
    capabilities say so)."""

    tag_keys: ClassVar[tuple[str, ...]] = ()
    """The keys :meth:`tag` takes."""
    tag_refusal: ClassVar[str] = ""
    """What an unknown key's refusal says after its name: which keys the probe takes."""
    _user: list[dict[str, Any]]
    _epochs: bool

    def _check_tags(self, tags: dict[str, Any]) -> None:
        """An integration's own checks of a block's values (BadInput)."""

    @contextlib.contextmanager
    def tag(self, **tags: Any) -> Iterator[None]:
        """Tag every call inside the block; nested blocks add to and override the outer ones."""
        unknown = set(tags) - set(self.tag_keys)
        if unknown:
            raise BadInput(f"unknown tag {sorted(unknown)[0]!r}; {self.tag_refusal}")
        refuse_unstarted(self)
        self._check_tags(tags)
        if tags.get("epoch") is not None:
            self._epochs = True
        self._user.append({**(self._user[-1] if self._user else {}), **tags})
        try:
            yield
        finally:
            self._user.pop()


def train(
    loop: Iterable[int],
    close: Callable[[bool, str | None, int], Path | None],
    *,
    out: str | os.PathLike[str],
    total: int,
    progress: Progress | None = None,
    cleanup: Callable[[], object] | None = None,
    started: float | None = None,
    save: Callable[[], Path] | None = None,
    verify: str | None = "env",
    unexportable: str | None = None,
) -> RunResult:
    """Train with the probe on and say what it wrote: every framework's ``run`` once its run is built.

    ``loop`` trains, yielding the env steps done so far after each piece of training (an iteration, a
    collector batch); each count goes to ``progress(done, total)``. Then ``close(completed, stop_reason,
    done)`` closes the probe (or every process's) and returns the log's path (None: ``out``): completed when
    the loop ran to its end; when it raised (an error, Ctrl-C's KeyboardInterrupt), not completed, with the
    exception's :func:`stop_reason`, and the exception goes on (the log keeps the rows up to it). ``cleanup``
    (the envs' close, the algorithm's stop) runs after the close, whatever happened. Returns the finished
    log's :class:`~lstm_probe.options.RunResult`: its path, rows and bytes, whether the log says the run
    completed, the env steps done, and the seconds from ``started`` (a ``time.perf_counter()``; default: now)
    to the close. ``save`` saves the trained model once the loop ran to its end and the envs are cleaned up
    (not after a failure or Ctrl-C) and returns where: the result's ``model``; ``verify``: how ``export`` can
    verify it (:attr:`~lstm_probe.options.RunResult.verify`); ``unexportable``: why ``export`` refuses it
    (:attr:`~lstm_probe.options.RunResult.unexportable`).
    """
    from lstm_probe.log.reader import read_info

    start = time.perf_counter() if started is None else started
    done = 0
    completed, reason = False, None
    try:
        for done in loop:
            if progress is not None:
                progress(done, total)
        completed = True
    except BaseException as exc:
        reason = stop_reason(exc)
        raise
    finally:
        try:
            path = close(completed, reason, done)
        finally:
            if cleanup is not None:
                cleanup()
    seconds = time.perf_counter() - start
    info = read_info(path if path is not None else os.fspath(out))
    model = save() if save is not None else None
    return RunResult(info.path, info.rows, info.bytes, info.completed, done, seconds, model, verify, unexportable)
