"""Private copies of a user's modules, for measurements that need a forward pass (what-if, memory): the copy runs
none of the user's code, so their hooks never see a measurement, and training never feels one.

:func:`private_copy` deep-copies a module without the hooks on its submodules (torch's own weight and
spectral-norm hooks, which compute weights, stay), without instance attributes that shadow its methods (a
user's wrappers, a probe's own), and without what a module keeps of its last call (a distribution, tensors that
are part of an autograd graph: those cannot be deep-copied, and are rebuilt by the copy's next call).
:func:`sync` copies the user's current parameter and buffer values into the copy (its RNNs' weights kept in
one block, :func:`flattened`, as cuDNN wants them); :func:`twin` is an
``nn.LSTM``/``nn.GRU`` of another layout (sequence- or batch-first) on a module's own parameter tensors.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from lstm_probe.errors import BadInput

M = TypeVar("M", bound=nn.Module)


def _kept_of_last_call(value: Any) -> bool:
    """A value a module holds from its last call, not part of its state: a torch distribution, or a tensor that
    belongs to an autograd graph (neither can be deep-copied)."""
    if isinstance(value, torch.distributions.Distribution):
        return True
    if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
        return value.grad_fn is not None
    if isinstance(value, tuple | list):
        return any(_kept_of_last_call(v) for v in value)
    return False


def private_copy(module: M, drop: Callable[[Any], bool] = _kept_of_last_call) -> M:
    """A deep copy of ``module`` that runs none of the caller's code (see the module's docstring); ``drop``:
    which instance attributes are left behind (None in the copy), beyond hooks and wrappers."""
    memo: dict[int, Any] = {}
    for m in module.modules():
        for name, value in vars(m).items():
            if "hooks" in name and isinstance(value, dict) and value:
                kept = {k: h for k, h in value.items() if type(h).__module__.startswith("torch.nn.utils")}
                memo[id(value)] = type(value)(kept) if kept else type(value)()
            elif drop(value):
                memo[id(value)] = None
    fresh = copy.deepcopy(module, memo)
    for m in fresh.modules():
        own = vars(m)
        for name, value in list(own.items()):
            if callable(value) and not isinstance(value, type | nn.Module) and callable(getattr(type(m), name, None)):
                del own[name]
    return flattened(fresh)


def flattened(module: M) -> M:
    """``module`` with each of its RNNs' weights in one contiguous block (``nn.RNNBase.flatten_parameters``,
    which acts on CUDA only). A deep copy's RNN weights are separate tensors, which cuDNN copies into one
    block at every call, with a warning the caller would see; call this on copies only, never on the
    caller's own modules."""
    for m in module.modules():
        if isinstance(m, nn.RNNBase):
            m.flatten_parameters()
    return module


def pairs(mine: nn.Module, theirs: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The copy's parameters and buffers beside the user's, by name."""
    a = dict(mine.named_parameters()) | dict(mine.named_buffers())
    b = dict(theirs.named_parameters()) | dict(theirs.named_buffers())
    return [(a[n], b[n]) for n in a if n in b]


def sync(copied: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy the user's values into the copy (:func:`pairs`)."""
    with torch.no_grad():
        for mine, theirs in copied:
            mine.copy_(theirs)


def twin(rnn: nn.Module, batch_first: bool = True) -> nn.LSTM | nn.GRU:
    """An ``nn.LSTM``/``nn.GRU`` (batch first unless ``batch_first=False``, no dropout) holding ``rnn``'s own
    parameter tensors: it computes with the current weights and changes nothing of them (the caller runs it
    without autograd). ``rnn``: an ``nn.RNNBase`` LSTM or GRU (torch's, TorchRL's python-based one, RLlib's)."""
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


def cell_twin(cell: nn.Module) -> nn.LSTM | nn.GRU:
    """A one-layer sequence-first ``nn.LSTM`` (of an ``nn.LSTMCell``) or ``nn.GRU`` (of an ``nn.GRUCell``) with
    weights of its own in one block, on the cell's device and dtype: a loop of cell calls re-run as one module
    (its (N, hidden) states are the twin's (1, N, hidden)). :func:`cell_pairs` gives it the cell's values: the
    cell's weight_ih, weight_hh, bias_ih and bias_hh are its layer 0's, gate for gate."""
    cls: type[nn.LSTM] | type[nn.GRU] = nn.LSTM if isinstance(cell, nn.LSTMCell) else nn.GRU
    if not isinstance(cell, nn.LSTMCell | nn.GRUCell):
        raise BadInput(f"a cell twin is made of an nn.LSTMCell or nn.GRUCell, not {type(cell).__name__}")
    weight = cell.weight_ih
    twin = cls(cell.input_size, cell.hidden_size, bias=cell.bias, device=weight.device, dtype=weight.dtype)
    return flattened(twin.requires_grad_(False))


def cell_pairs(twin: nn.Module, cell: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The twin's layer-0 parameters beside the cell's (:func:`sync` copies the cell's values in)."""
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    return [(getattr(twin, f"{n}_l0"), getattr(cell, n)) for n in names if getattr(cell, n, None) is not None]
