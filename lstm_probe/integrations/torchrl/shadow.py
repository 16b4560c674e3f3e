"""A plain ``nn.LSTM``/``nn.GRU`` on the weights of a TorchRL ``LSTMModule``/``GRUModule``: what the probe's hooks
re-run each call on (hooks.py, batch first) and what the what-if and memory engines run (whatif.py, memory.py,
sequence first, on the private copy's weights)."""

from __future__ import annotations

from torch import nn

from lstm_probe.errors import BadInput
from lstm_probe.measure import copies


def shadow(rnn: nn.Module, batch_first: bool = True) -> nn.LSTM | nn.GRU:
    """An ``nn.LSTM``/``nn.GRU`` holding ``rnn``'s own parameter tensors (``measure/copies.py:twin``)."""
    return copies.twin(rnn, batch_first)


def inner_rnn(m: nn.Module) -> nn.Module:
    """The ``nn.RNNBase`` inside an ``LSTMModule`` (``.lstm``) or ``GRUModule`` (``.gru``)."""
    inner = getattr(m, "lstm", None) or getattr(m, "gru", None)
    if not isinstance(inner, nn.Module):
        raise BadInput(f"{type(m).__name__} holds no .lstm or .gru module")
    return inner
