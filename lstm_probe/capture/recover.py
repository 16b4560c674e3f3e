"""Exact per-step h and c for multi-step calls, which expose only the top layer's h per step.

A forward hook on ``nn.LSTM`` sees ``y`` (T, N, H): the top layer's h at every step, and
``(h_n, c_n)`` (L, N, H): every layer, after the last step only. The probe must not call the
module's forward again (a user's own hooks would see a call sb3 never made), so the missing states
are computed from the module's weights, in two halves:

- the torch half (training process, :func:`lstm_sequence_io`): the lower layers' (l < L-1) per-step h
  from one fused single-layer ``torch.lstm`` / ``torch.gru`` call on that layer's weights (the same
  kernel, so the same numbers), and each layer's input and gate weights as host arrays (:data:`Cells`);
- the numpy half (the job's second half, on the host, :func:`lstm_cells`): every layer's i, f, g gates in
  one batched matmul from (x_t, h_{t-1}), where h_{t-1} is known for every step, then
  c_t = f_t * c_{t-1} + i_t * g_t as an elementwise scan.

torch is imported inside the torch half's functions only: the writer process imports this module for the
numpy half and never loads torch (tests/test_writer_process.py).

Measured on sb3-sized LSTMs this costs about one extra forward, against 7-10x for re-running the
module step by step, and matches the step-by-step result to ~1e-7 (tests/test_recover.py).
No random numbers are drawn and no dropout runs, so training is untouched.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported inside the torch half's functions: the writer process never loads it
    import torch
    from torch import nn


# -- the numpy half: per-step c from the gates (the sink, in the writer process or thread) -------------

Cells = tuple[list[np.ndarray], list[list[np.ndarray]], np.ndarray, np.ndarray, np.ndarray | None]
"""What the per-step c of a multi-step LSTM call is computed from (:func:`lstm_sequence_io`): each
layer's input (T, N, F_l), each layer's i, f, g weight rows [W_ih (3H, F_l), W_hh (3H, H), (b_ih + b_hh)
(3H,) when the module has biases], the initial h0, c0 (L, N, H), and for a call on a PackedSequence the
(T, N) mask of real steps (None: every step is real)."""


class Scratch:
    """Reused work arrays: a fresh multi-MB array costs page faults on every first touch (more so in the
    writer process, whose allocator hands large blocks back to the system), which made the gates of one
    training call cost ~2x their arithmetic. Arrays above ``limit`` bytes are not kept."""

    def __init__(self, limit: int = 16 << 20):
        self.limit = limit
        self.flat: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape))
        if 4 * n > self.limit:
            return np.empty(shape, np.float32)
        flat = self.flat.get(name)
        if flat is None or flat.size < n:
            flat = self.flat[name] = np.empty(n, np.float32)
        return flat[:n].reshape(shape)


def lstm_cells(
    hs: np.ndarray,
    inputs: list[np.ndarray],
    weights: list[list[np.ndarray]],
    h0: np.ndarray,
    c0: np.ndarray,
    valid: np.ndarray | None = None,
    scratch: Scratch | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Per-step c of every layer, (L, T, N, H) float32, from the per-step h ``hs`` (L, T, N, H) and
    :data:`Cells`: the i, f, g gates of all steps in one matmul from (x_t, h_{t-1}), then
    c_t = f_t * c_{t-1} + i_t * g_t as an elementwise scan. With ``scratch`` the result and the work
    arrays live in its reused memory (valid until its next use). ``valid`` (T, N): c is 0 where it is
    False (the steps after a packed sequence's end, which the module never ran; each earlier step's c
    depends only on earlier steps, so a sequence's last real c is the module's c_n). ``out``: an (L, T, N, H)
    float32 array for the result (one the caller keeps beyond the scratch's next use)."""
    work = scratch or Scratch(limit=0)
    layers, steps, batch, hidden = hs.shape
    cs = out if out is not None else work.get("cs", hs.shape)
    rows = steps * batch
    for layer in range(layers):
        out = hs[layer]
        w = weights[layer]
        h_prev = work.get("h_prev", (steps, batch, hidden))  # h_{t-1}
        h_prev[0] = h0[layer]
        h_prev[1:] = out[:-1]
        # as 2-D products into reused memory: one BLAS call each (a 3-D operand is one call per step)
        gates = work.get("gates", (rows, 3 * hidden))
        np.matmul(inputs[layer].reshape(rows, -1), w[0].T, out=gates)
        part = work.get("part", (rows, 3 * hidden))
        np.matmul(h_prev.reshape(rows, hidden), w[1].T, out=part)
        gates += part
        if len(w) > 2:
            gates += w[2]
        g3 = gates.reshape(steps, batch, 3 * hidden)
        i, f, g = g3[..., :hidden], g3[..., hidden : 2 * hidden], g3[..., 2 * hidden :]
        fg = work.get("fg", (steps, batch, hidden))
        ig = work.get("ig", (steps, batch, hidden))
        tg = work.get("tg", (steps, batch, hidden))
        with np.errstate(over="ignore"):  # exp overflow -> sigmoid 0, as it should
            np.negative(f, out=fg)  # fg = 1 / (1 + exp(-f))
            np.exp(fg, out=fg)
            fg += 1.0
            np.divide(1.0, fg, out=fg)
            np.negative(i, out=ig)  # ig = tanh(g) / (1 + exp(-i))
            np.exp(ig, out=ig)
            ig += 1.0
            np.tanh(g, out=tg)
            np.divide(tg, ig, out=ig)
        c, cl = c0[layer], cs[layer]
        for t in range(steps):  # elementwise scan; numpy's per-op cost is lower than torch's here
            np.multiply(fg[t], c, out=cl[t])
            cl[t] += ig[t]
            c = cl[t]
    if valid is not None:
        cs[:, ~valid] = 0.0
    return cs


# -- the torch half: what the numpy half needs, from the module (the training process) ---------------


def _layer_weights(module: nn.LSTM | nn.GRU, layer: int) -> list[torch.Tensor]:
    names = [f"weight_ih_l{layer}", f"weight_hh_l{layer}"]
    if module.bias:
        names += [f"bias_ih_l{layer}", f"bias_hh_l{layer}"]
    return [getattr(module, n).detach() for n in names]


_BLOCKS = threading.local()
"""Per thread, ``.blocks``: per (stream, kind, device, dtype, shapes) one layer's weights in one contiguous
block, the probe's own (see :func:`_in_one_block`). A block is refilled at every call, so two calls share one
only where their kernels run in order: on one thread (no other thread refills it between its copy and its
kernel) and one stream (the copy of a later call waits for the kernels of an earlier one). Two logs' writer
threads, or a hook and a writer thread, each have their own; a thread's die with it."""


def _in_one_block(kind: str, weights: list[torch.Tensor], bias: bool) -> list[torch.Tensor]:
    """``weights`` (one layer's) as cuDNN wants them: in one contiguous block. A layer's weights taken
    apart are separate tensors, which cuDNN would copy into a block of its own at every call, with a
    warning the user would see; here they are copied (device to device) into a block the probe keeps, one
    per layer shape, thread and stream (see :data:`_BLOCKS`). Off CUDA, ``weights`` as they are."""
    import torch
    from torch import nn

    w0 = weights[0]
    if w0.device.type != "cuda" or not torch.backends.cudnn.enabled:
        return weights
    stream = torch.cuda.current_stream(w0.device).cuda_stream
    key = (stream, kind, w0.device, w0.dtype, bias, *(tuple(w.shape) for w in weights))
    blocks: dict[tuple[object, ...], list[torch.Tensor]] | None = getattr(_BLOCKS, "blocks", None)
    if blocks is None:
        blocks = _BLOCKS.blocks = {}
    block = blocks.get(key)
    if block is None:
        hidden, size = int(weights[1].shape[1]), int(w0.shape[1])
        rnn = (nn.LSTM if kind == "LSTM" else nn.GRU)(size, hidden, 1, bias=bias)
        rnn = rnn.to(device=w0.device, dtype=w0.dtype)  # .to() puts the weights in one block
        block = blocks[key] = [p.detach() for p in rnn._flat_weights]  # type: ignore[union-attr]
    for mine, theirs in zip(block, weights, strict=True):
        mine.copy_(theirs)
    return block


def snapshot_weights(module: nn.LSTM | nn.GRU, top: bool = True) -> list[list[torch.Tensor]]:
    """Copies of each layer's weights as they are now (an optimizer step changes them in place), for a
    recovery that runs later (on the writer thread). ``top=False`` leaves out the top layer (GRU needs
    only the lower layers' weights)."""
    import torch

    layers = int(module.num_layers) if top else int(module.num_layers) - 1
    with torch.no_grad():
        return [[w.clone() for w in _layer_weights(module, layer)] for layer in range(layers)]


def lstm_sequence_parts(
    module: nn.LSTM,
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    y: torch.Tensor,
    weights: list[list[torch.Tensor]] | None = None,
) -> list[torch.Tensor]:
    """The torch part of the recovery for one multi-step LSTM call, on the call's device: what
    :func:`lstm_cells` needs, as tensors for one host transfer (``transfer.Staged``; :func:`lstm_assemble`
    turns their host arrays into its arguments): per layer its per-step h (T, N, H), its input (T, N, F_l)
    and its i, f, g weight rows [W_ih, W_hh, (b_ih + b_hh) when the module has biases]; then h0, c0.

    x: (T, N, F) sequence-first input, h0/c0: (L, N, H) initial states, y: (T, N, H) the call's
    output; ``weights`` from :func:`snapshot_weights` (default: the module's current weights). Only the
    lower layers of a multi-layer module cost a computation here (one fused kernel call each)."""
    import torch

    with torch.no_grad():
        layers, hidden = module.num_layers, module.hidden_size
        parts: list[torch.Tensor] = []
        layer_in = x.detach()
        g3 = 3 * hidden  # PyTorch's gate order is i, f, g, o; c needs no o
        for layer in range(layers):
            w = _layer_weights(module, layer) if weights is None else weights[layer]
            if layer == layers - 1:
                out = y.detach()
            else:
                # single fused layer, eval semantics: dropout=0, train=False (no RNG is touched)
                h0_l, c0_l = h0[layer : layer + 1].detach(), c0[layer : layer + 1].detach()
                flat = _in_one_block("LSTM", w, module.bias)
                out = torch.lstm(layer_in, (h0_l, c0_l), flat, module.bias, 1, 0.0, False, False, False)[0]
            parts += [out, layer_in, w[0][:g3], w[1][:g3]] + ([w[2][:g3] + w[3][:g3]] if module.bias else [])
            layer_in = out
        return [*parts, h0.detach(), c0.detach()]


def lstm_assemble(
    arrays: list[np.ndarray], layers: int, bias: bool, valid: np.ndarray | None
) -> tuple[np.ndarray, Cells]:
    """:func:`lstm_sequence_parts`' tensors as host arrays -> the per-step h (L, T, N, H) and :data:`Cells`.
    ``valid`` (T, N): a call on a PackedSequence, padded (x and y zero after each sequence's end); h and c
    are 0 where it is False."""
    per = 5 if bias else 4
    hs = np.stack([arrays[i * per] for i in range(layers)])
    inputs = [arrays[i * per + 1] for i in range(layers)]
    gate_weights = [arrays[i * per + 2 : (i + 1) * per] for i in range(layers)]
    if valid is not None:
        hs[:, ~valid] = 0.0  # the lower layers ran on past a sequence's end; the module did not
    return hs, (inputs, gate_weights, arrays[-2], arrays[-1], valid)


def lstm_sequence_io(
    module: nn.LSTM,
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    y: torch.Tensor,
    weights: list[list[torch.Tensor]] | None = None,
    valid: np.ndarray | None = None,
) -> tuple[np.ndarray, Cells]:
    """:func:`lstm_sequence_parts` moved to the host in one copy and assembled (:func:`lstm_assemble`)."""
    from lstm_probe.capture.transfer import host_arrays

    parts = lstm_sequence_parts(module, x, h0, c0, y, weights)
    return lstm_assemble(host_arrays(*parts), int(module.num_layers), bool(module.bias), valid)


def lstm_sequence_states(
    module: nn.LSTM,
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    y: torch.Tensor,
    weights: list[list[torch.Tensor]] | None = None,
    valid: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-step (h, c) of every layer for one multi-step call (arguments as :func:`lstm_sequence_io`):
    two float32 arrays of shape (L, T, N, H)."""
    hs, cells = lstm_sequence_io(module, x, h0, c0, y, weights, valid)
    return hs, lstm_cells(hs, *cells)


def gru_sequence_parts(
    module: nn.GRU,
    x: torch.Tensor,
    h0: torch.Tensor,
    y: torch.Tensor,
    weights: list[list[torch.Tensor]] | None = None,
) -> list[torch.Tensor]:
    """Per-step h of every layer of one multi-step GRU call, one (T, N, H) tensor per layer on the call's
    device (the lower layers from one fused kernel call each; the top layer is ``y``)."""
    import torch

    with torch.no_grad():
        layers = module.num_layers
        parts: list[torch.Tensor] = []
        layer_in = x.detach()
        for layer in range(layers):
            if layer == layers - 1:
                out = y.detach()
            else:
                w = _layer_weights(module, layer) if weights is None else weights[layer]
                h0_l = h0[layer : layer + 1].detach()
                flat = _in_one_block("GRU", w, module.bias)
                out = torch.gru(layer_in, h0_l, flat, module.bias, 1, 0.0, False, False, False)[0]
            parts.append(out)
            layer_in = out
        return parts


def gru_assemble(arrays: list[np.ndarray], valid: np.ndarray | None) -> np.ndarray:
    """:func:`gru_sequence_parts` as host arrays -> per-step h (L, T, N, H)."""
    hs = np.stack(arrays)
    if valid is not None:
        hs[:, ~valid] = 0.0
    return hs


def gru_sequence_states(
    module: nn.GRU,
    x: torch.Tensor,
    h0: torch.Tensor,
    y: torch.Tensor,
    weights: list[list[torch.Tensor]] | None = None,
    valid: np.ndarray | None = None,
) -> np.ndarray:
    """Per-step h of every layer for one multi-step GRU call: (L, T, N, H) float32 (``valid``: as
    :func:`lstm_sequence_io`), moved to the host in one copy."""
    from lstm_probe.capture.transfer import host_arrays

    return gru_assemble(host_arrays(*gru_sequence_parts(module, x, h0, y, weights)), valid)
