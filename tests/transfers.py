"""The host-transfer counter the tests of the capture path share (issues #38 and #50): calls of the Tensor
methods that move data to the host (or may: ``to``), and of LogWriter.submit (the blocks and multi-step
calls handed to the writer)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator

import torch

from lstm_probe.log.logwriter import LogWriter

TRANSFERS = ("cpu", "numpy", "item", "tolist", "to")
"""The Tensor methods counted."""


@contextlib.contextmanager
def counting(who: Callable[[], str] | None = None) -> Iterator[Counter[str]]:
    """Counts transfers under "transfers", or under ``who()`` (who made it, asked at each transfer), and
    submits under "submits", while the block runs; the methods are put back after."""
    counts: Counter[str] = Counter()
    saved = {name: getattr(torch.Tensor, name) for name in TRANSFERS}
    submit = LogWriter.submit

    def wrap(fn):
        def counted(self, *args, **kwargs):
            counts[who() if who is not None else "transfers"] += 1
            return fn(self, *args, **kwargs)

        return counted

    def counted_submit(self, job, nbytes, batch=False, since=None):
        counts["submits"] += 1
        return submit(self, job, nbytes, batch, since)

    for name, fn in saved.items():
        setattr(torch.Tensor, name, wrap(fn))
    LogWriter.submit = counted_submit  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        LogWriter.submit = submit  # type: ignore[method-assign]


def pipe_sends(monkeypatch) -> dict[str, int]:
    """What crosses the writer pipe from now on: {messages, train messages, sends carrying train messages}."""
    from lstm_probe.log import messages
    from lstm_probe.log.writer_process import Child

    seen = {"messages": 0, "train": 0, "train_sends": 0}
    send = Child.send

    def counted(self, message, budget):
        if not isinstance(message, tuple):  # data, not control
            batch = getattr(messages, "Batch", ())  # (the code before batches had none)
            each = message.messages if isinstance(message, batch) else [message]
            train = [m for m in each if not isinstance(m, messages.Progress) and m.tags.phase == "train"]
            seen["messages"] += len(each)
            seen["train"] += len(train)
            seen["train_sends"] += bool(train)
        return send(self, message, budget)

    monkeypatch.setattr(Child, "send", counted)
    return seen
