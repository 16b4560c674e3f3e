"""A plain ``nn.LSTM``/``nn.GRU`` on the weights of a TorchRL ``LSTMModule``/``GRUModule``: what the probe's hooks
re-run each call on (hooks.py, batch first) and what the what-if and memory engines run (whatif.py, memory.py,
sequence first, on the private copy's weights)."""

from __future__ import annotations

from torch import nn

from lstm_probe.errors import BadInput


def shadow(rnn: nn.Module, batch_first: bool = True) -> nn.LSTM | nn.GRU:
    """An ``nn.LSTM``/``nn.GRU`` (batch first unless ``batch_first=False``, no dropout) holding ``rnn``'s own
    parameter tensors: it computes with the current weights and changes nothing of them (the caller runs it
    without autograd). ``rnn``: torch's or torchrl's python-based ``LSTM``/``GRU`` (an ``nn.RNNBase``)."""
    mode = getattr(rnn, "mode", None)
    cls: type[nn.LSTM] | type[nn.GRU] = nn.LSTM if mode == "LSTM" else nn.GRU
    if mode not in ("LSTM", "GRU") or getattr(rnn, "bidirectional", False) or getattr(rnn, "proj_size", 0):
        raise BadInput(f"lstm-probe traces unidirectional LSTMs/GRUs without proj_size, not {rnn!r}")
    copy = cls(
        int(rnn.input_size),  # type: ignore[arg-type]
        int(rnn.hidden_size),  # type: ignore[arg-type]
        int(rnn.num_layers),  # type: ignore[arg-type]
        bias=bool(rnn.bias),
        batch_first=batch_first,
        device="meta",
    )
    for name in copy._flat_weights_names:
        setattr(copy, name, getattr(rnn, name))  # RNNBase.__setattr__ refreshes _flat_weights
    return copy


def inner_rnn(m: nn.Module) -> nn.Module:
    """The ``nn.RNNBase`` inside an ``LSTMModule`` (``.lstm``) or ``GRUModule`` (``.gru``)."""
    inner = getattr(m, "lstm", None) or getattr(m, "gru", None)
    if not isinstance(inner, nn.Module):
        raise BadInput(f"{type(m).__name__} holds no .lstm or .gru module")
    return inner
