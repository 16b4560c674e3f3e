"""What ``ProbeCallback`` puts on a RecurrentPPO while learn() runs, and how it all comes off.

A probe attaches forward hooks (the tracer's on the LSTMs, its own on the policy) and instance-attribute
wrappers of a few entry points (the rollout buffer's ``get`` / ``_get_samples``, the policy's
``predict_values`` / ``predict`` and its staticmethod ``_process_sequence``). An :class:`Attachment` holds
them and the tracer, and takes them off in :meth:`Attachment.finish`: when learn() ends
(``_on_training_end``), when the probe is closed (its ``with`` block, ``close()``), when the next probe
attaches to the same model, at process exit, and when the probe object itself is gone.

That last one covers learn() raising without a ``with``: sb3 calls no callback then. Nothing the probe
puts on the model refers to the probe itself (hooks and wrappers reach it through weak references, the
tracer through :class:`WeakIntegration`), so once learn()'s frame is gone and the user holds no
reference to the probe, the probe is collected and its finalizer finishes the attachment. Nothing is
stored in learn()'s frame and no call stack is read.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import types
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lstm_probe.capture.returns import Live
from lstm_probe.capture.tracer import CoreTracer
from lstm_probe.contract import Capabilities, Tags
from lstm_probe.errors import OutputError

ACTIVE: weakref.WeakKeyDictionary[Any, Attachment] = weakref.WeakKeyDictionary()
"""The attachment on each model: a new probe on the same model finishes a stale one."""


def weak(method: Callable[..., Any]) -> Callable[..., Any]:
    """A function that calls the bound ``method`` through a weak reference to its object (and does
    nothing once that object is gone): a hook or wrapper made from it does not keep the probe alive."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        m = ref()
        return m(*args) if m is not None else None

    return call


class WeakIntegration:
    """A probe as the tracer's :class:`~lstm_probe.contract.Integration`, held weakly (the tracer lives as
    long as its hooks on the policy's LSTMs; the probe must not). Capabilities and metadata are fixed
    when the tracer is made; calls after the probe is gone are untagged."""

    name = "sb3"

    def __init__(self, probe: Any):
        self._capabilities: Capabilities = probe.capabilities()
        self._metadata: dict[str, Any] = probe.metadata()
        ref = weakref.ref(probe)

        def resolve(module: str, steps: int, batch: int) -> Tags:
            p = ref()
            return p.resolve(module, steps, batch) if p is not None else Tags()

        self.resolve = resolve

    def capabilities(self) -> Capabilities:
        return self._capabilities

    def metadata(self) -> dict[str, Any]:
        return self._metadata


class _Static:
    """The instance attribute that routes a staticmethod ``cls.<name>`` through ``around(inner, *args,
    **kwargs)`` (:meth:`Attachment.wrap`). A deep copy or a pickle of the object gets the class's own
    function in its place: a copy never carries the wrapper (nor what it references)."""

    def __init__(self, cls: type, name: str, around: Callable[..., Any]):
        self.inner = getattr(cls, name)
        self.cls, self.name, self.around = cls, name, around
        functools.update_wrapper(self, self.inner)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.around(self.inner, *args, **kwargs)

    def __deepcopy__(self, memo: Any) -> Any:
        return self.inner

    def __reduce__(self) -> tuple[Any, ...]:
        return getattr, (self.cls, self.name)


class Attachment:
    """The hooks, instance wrappers and tracer of one probed learn() (see the module docstring). Holds
    no reference to its probe."""

    def __init__(self, model: Any):
        self.model = weakref.ref(model)
        self.handles: list[Any] = []
        self.restore: list[tuple[Any, str, bool, Any, Any]] = []  # (object, name, had, previous, installed)
        self.tracer: CoreTracer | None = None
        self.iterations = 0
        self.path: Path | None = None
        self.finalizer: weakref.finalize[Any, Any] | None = None
        self.extra: dict[str, Callable[[], Any]] = {}  # metadata key -> its value at close (memory.py, ...)
        self.live: dict[str, Live] = {}  # what_if, memory: kept up to date in the writer's progress (publish)

    def open(self, probe: Any, tracer: CoreTracer) -> None:
        """Own ``tracer`` (started) from now on; finish when the process exits or ``probe`` is collected."""
        self.tracer = tracer
        atexit.register(self.at_exit)
        self.finalizer = weakref.finalize(probe, self.orphaned)
        self.finalizer.atexit = False  # at exit, at_exit says why

    def publish(self) -> None:
        """The records kept up to date while the run goes (returns, what_if, memory) into the writer's progress,
        which every part written from then on carries: a killed run's log keeps them (``capture/returns.py``)."""
        for key, make in self.extra.items():
            if key == "returns":
                make()  # Sb3Returns.publish puts its own
            elif key in ("what_if", "memory"):
                self.live.setdefault(key, Live(key, make)).publish(self.tracer)

    def wrap(self, obj: Any, name: str, around: Callable[..., Any]) -> None:
        """Route ``obj.<name>(...)`` through ``around(inner, *args, **kwargs)`` until :meth:`finish`, with
        an instance attribute that looks like what it wraps (``functools.wraps``). A user's own instance
        attribute is wrapped, and put back as it was; ``copy.deepcopy(obj)`` meanwhile gives a copy that
        runs its class's method, unwrapped. A staticmethod is wrapped by a :class:`_Static` (``around``
        sees no object then: a shallow copy of ``obj`` calls the same wrapper)."""
        own = vars(obj)
        had, previous = name in own, own.get(name)
        installed: Any
        if not had and isinstance(inspect.getattr_static(type(obj), name, None), staticmethod):
            installed = _Static(type(obj), name, around)
        elif had:

            @functools.wraps(previous)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return around(previous, *args, **kwargs)

            installed = wrapper
        else:
            func = getattr(type(obj), name)

            @functools.wraps(func)
            def method(this: Any, *args: Any, **kwargs: Any) -> Any:
                if this is not obj:  # bound to a deep copy of obj
                    return func(this, *args, **kwargs)
                return around(func.__get__(this), *args, **kwargs)

            installed = types.MethodType(method, obj)  # deepcopy binds a copy's to the copy
        own[name] = installed
        self.restore.append((obj, name, had, previous, installed))

    def finish(self, completed: bool, reason: str | None) -> Path | None:
        """Take everything off and close the log (idempotent). Returns the log's path."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        for obj, name, had, previous, installed in reversed(self.restore):
            own = vars(obj)
            if own.get(name) is installed:  # a user's attribute set meanwhile stays
                if had:
                    own[name] = previous
                else:
                    del own[name]
        self.restore.clear()
        model = self.model()
        if model is not None and ACTIVE.get(model) is self:
            del ACTIVE[model]
        if self.finalizer is not None:
            self.finalizer.detach()
        tracer, self.tracer = self.tracer, None
        if tracer is not None:
            atexit.unregister(self.at_exit)
            extra: dict[str, Any] = {}
            if model is not None:
                extra["progress_num_timesteps"] = int(model.num_timesteps)
            extra["iterations"] = self.iterations
            for key, make in self.extra.items():
                extra[key] = make()
            self.path = tracer.close(completed=completed, stop_reason=reason, **extra)
        return self.path

    def orphaned(self) -> None:
        """The probe was collected before learn() ended: learn() raised (sb3 calls no callback then)."""
        try:
            self.finish(False, "learn() ended with an exception")
        except Exception:
            pass

    def at_exit(self) -> None:
        tracer = self.tracer
        failed = tracer is not None and tracer.writer is not None and tracer.writer.error is not None
        try:
            self.finish(False, "the process exited before learn() finished")
        except OutputError:
            if not failed:  # new at exit: say it; a writer error was already raised inside learn()
                raise
