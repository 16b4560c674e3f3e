"""Exact per-step h and c for multi-step calls, which expose only the top layer's h per step.

A forward hook on ``nn.LSTM`` sees ``y`` (T, N, H): the top layer's h at every step, and
``(h_n, c_n)`` (L, N, H): every layer, after the last step only. The probe must not call the
module's forward again (a user's own hooks would see a call sb3 never made), so the missing states
are computed from the module's weights:

- lower layers (l < L-1): their per-step h comes from one fused single-layer ``torch.lstm`` /
  ``torch.gru`` call on that layer's weights (the same kernel, so the same numbers);
- every layer: the i, f, g gates in one batched matmul from (x_t, h_{t-1}), where h_{t-1} is known
  for every step, then c_t = f_t * c_{t-1} + i_t * g_t as an elementwise scan. This part runs in the
  sink (``sink.lstm_cells``, numpy), off the training thread.

Measured on sb3-sized LSTMs this costs about one extra forward, against 7-10x for re-running the
module step by step, and matches the step-by-step result to ~1e-7 (tests/test_recover.py).
No random numbers are drawn and no dropout runs, so training is untouched.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from lstm_probe.sink import Cells, lstm_cells


def _layer_weights(module: nn.LSTM | nn.GRU, layer: int) -> list[torch.Tensor]:
    names = [f"weight_ih_l{layer}", f"weight_hh_l{layer}"]
    if module.bias:
        names += [f"bias_ih_l{layer}", f"bias_hh_l{layer}"]
    return [getattr(module, n).detach() for n in names]


def snapshot_weights(module: nn.LSTM | nn.GRU, top: bool = True) -> list[list[torch.Tensor]]:
    """Copies of each layer's weights as they are now (an optimizer step changes them in place), for a
    recovery that runs later (on the writer thread). ``top=False`` leaves out the top layer (GRU needs
    only the lower layers' weights)."""
    layers = int(module.num_layers) if top else int(module.num_layers) - 1
    with torch.no_grad():
        return [[w.clone() for w in _layer_weights(module, layer)] for layer in range(layers)]


def lstm_sequence_io(
    module: nn.LSTM,
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    y: torch.Tensor,
    weights: list[list[torch.Tensor]] | None = None,
) -> tuple[np.ndarray, Cells]:
    """The torch part of the recovery for one multi-step LSTM call: the per-step h of every layer, and
    what :func:`lstm_probe.sink.lstm_cells` needs for the per-step c (each layer's input, the i, f, g
    rows of its weights, the initial states), as host arrays.

    x: (T, N, F) sequence-first input, h0/c0: (L, N, H) initial states, y: (T, N, H) the call's
    output; ``weights`` from :func:`snapshot_weights` (default: the module's current weights).
    Only the lower layers of a multi-layer module cost a computation here (one fused kernel call each);
    the gates and the scan run in the sink, off the training thread.
    """
    with torch.no_grad():
        steps, batch, _ = x.shape
        layers, hidden = module.num_layers, module.hidden_size
        hs = np.empty((layers, steps, batch, hidden), np.float32)
        inputs: list[np.ndarray] = []
        gate_weights: list[list[np.ndarray]] = []
        layer_in = x.detach()
        g3 = 3 * hidden  # PyTorch's gate order is i, f, g, o; c needs no o
        for layer in range(layers):
            w = _layer_weights(module, layer) if weights is None else weights[layer]
            if layer == layers - 1:
                out = y.detach()
            else:
                # single fused layer, eval semantics: dropout=0, train=False (no RNG is touched)
                h0_l, c0_l = h0[layer : layer + 1].detach(), c0[layer : layer + 1].detach()
                out = torch.lstm(layer_in, (h0_l, c0_l), w, module.bias, 1, 0.0, False, False, False)[0]
            inputs.append(_np(layer_in))
            gate_weights.append(
                [_np(w[0][:g3]), _np(w[1][:g3])] + ([_np(w[2][:g3] + w[3][:g3])] if module.bias else [])
            )
            hs[layer] = _np(out)
            layer_in = out
        return hs, (inputs, gate_weights, _np(h0), _np(c0))


def _np(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    return (t if t.dtype == torch.float32 else t.float()).cpu().numpy()


def lstm_sequence_states(
    module: nn.LSTM,
    x: torch.Tensor,
    h0: torch.Tensor,
    c0: torch.Tensor,
    y: torch.Tensor,
    weights: list[list[torch.Tensor]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-step (h, c) of every layer for one multi-step call (arguments as :func:`lstm_sequence_io`):
    two float32 arrays of shape (L, T, N, H)."""
    hs, cells = lstm_sequence_io(module, x, h0, c0, y, weights)
    return hs, lstm_cells(hs, *cells)


def gru_sequence_states(
    module: nn.GRU,
    x: torch.Tensor,
    h0: torch.Tensor,
    y: torch.Tensor,
    weights: list[list[torch.Tensor]] | None = None,
) -> np.ndarray:
    """Per-step h of every layer for one multi-step GRU call: (L, T, N, H) float32."""
    with torch.no_grad():
        steps, batch, _ = x.shape
        layers, hidden = module.num_layers, module.hidden_size
        hs = np.empty((layers, steps, batch, hidden), np.float32)
        layer_in = x.detach()
        for layer in range(layers):
            if layer == layers - 1:
                out = y.detach()
            else:
                w = _layer_weights(module, layer) if weights is None else weights[layer]
                h0_l = h0[layer : layer + 1].detach()
                out = torch.gru(layer_in, h0_l, w, module.bias, 1, 0.0, False, False, False)[0]
            hs[layer] = out.cpu().numpy()
            layer_in = out
        return hs
