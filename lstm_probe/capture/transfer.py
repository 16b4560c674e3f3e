"""Device-to-host copies in bulk: what one block (or one multi-step call) hands to the writer crosses to
the host in one copy, never one copy per tensor or per call.

:class:`Staged` takes the block's tensors (states, input states, a recovery's inputs and weights), lays
them into one flat float32 buffer on their own device (one ``torch.cat``: the block's snapshot, ordered on
the device's stream after the kernels that made them) and, on CUDA, starts one asynchronous copy into
pinned host memory and records an event. :meth:`Staged.arrays` waits for that event (on the CPU there is
nothing to wait for) and returns numpy views of the buffer in the tensors' shapes: the one host transfer.

A writer job that builds a :class:`Staged` and returns its continuation lets the writer read it at the next
block boundary instead of now (``LogWriter.submit``): on a GPU the copy then overlaps the next block's
training steps. tests/test_transfer.py counts host transfers (``Tensor.cpu/numpy/item/tolist/to``) over
a probed rollout and training iteration: at most one per block handed over.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch


class Staged:
    """Tensors bound for the host, moved in one copy (see the module docstring)."""

    __slots__ = ("_event", "_flat", "shapes")

    def __init__(self, tensors: Sequence[torch.Tensor], private: bool = False):
        """``private``: the tensors are the probe's own copies that nothing changes any more (a block's
        buffer): a single contiguous one is then read in place, without a snapshot."""
        self.shapes = [tuple(int(d) for d in t.shape) for t in tensors]
        parts = [t.detach().reshape(-1) for t in tensors]
        parts = [p if p.dtype == torch.float32 else p.float() for p in parts]
        if len(parts) != 1:
            flat = torch.cat(parts)  # the snapshot: one allocation for the block
        elif private or parts[0].data_ptr() != tensors[0].data_ptr() or parts[0].dtype != tensors[0].dtype:
            flat = parts[0]  # the probe's own copy, or already a new tensor (reshape or float made one)
        else:
            flat = parts[0].clone()
        self._event: torch.cuda.Event | None = None
        if flat.device.type == "cuda":
            pinned = torch.empty(flat.shape, dtype=torch.float32, pin_memory=True)  # the caching host allocator
            pinned.copy_(flat, non_blocking=True)
            self._event = torch.cuda.Event()
            # on the copy's stream: that of the tensors' device, which need not be the thread's current one
            self._event.record(torch.cuda.current_stream(flat.device))
            flat = pinned
        elif flat.device.type != "cpu":  # another accelerator: a plain (synchronous) copy, still one
            flat = flat.to("cpu")
        self._flat = flat

    @property
    def nbytes(self) -> int:
        """The bytes its buffer holds."""
        return int(self._flat.nelement()) * 4

    @property
    def ready(self) -> bool:
        """Whether :meth:`arrays` returns without waiting for the device."""
        return self._event is None or bool(self._event.query())

    def arrays(self) -> list[np.ndarray]:
        """The tensors as numpy float32 arrays (views of one host buffer), once the copy is complete."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        flat = self._flat.numpy()
        out, at = [], 0
        for shape in self.shapes:
            n = int(np.prod(shape))
            out.append(flat[at : at + n].reshape(shape))
            at += n
        return out


def host_arrays(*tensors: torch.Tensor, private: bool = False) -> list[np.ndarray]:
    """The tensors on the host now, in one copy (:class:`Staged` read at once)."""
    return Staged(tensors, private).arrays()


class Later:
    """A writer job's second half (``LogWriter.submit``): ``finish`` reads ``staged`` on the host and hands
    the rows to the sink. ``ready``: whether its copy is complete (it may then run at once)."""

    __slots__ = ("finish", "staged")

    def __init__(self, staged: Staged, finish: Callable[[list[np.ndarray]], None]):
        self.staged, self.finish = staged, finish

    @property
    def ready(self) -> bool:
        return self.staged.ready

    def __call__(self) -> None:
        self.finish(self.staged.arrays())
