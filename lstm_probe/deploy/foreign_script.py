"""A TorchScript recurrent policy lstm-probe did not write (``lstm-probe replay TRACE --policy policy.pt
--trust-model``): the ``policy.pt`` rsl_rl's or Isaac Lab's exporter writes, whose state lives inside it.

What those exporters write (``torch.jit.script`` of a module that steps a batch of envs and keeps its state):

- rsl_rl 5.5, ``OnPolicyRunner.export_policy_to_jit`` of ``RNNModel.as_jit`` (``rsl_rl/models/rnn_model.py``,
  ``_TorchLSTMModel`` / ``_TorchGRUModel``): ``forward(x) -> actions``, the state in the buffers
  ``hidden_state`` [layers, 1, hidden] and ``cell_state`` (LSTM only), ``reset()`` zeroing them;
- Isaac Lab, ``isaaclab_rl/rsl_rl/exporter.py``, ``_TorchPolicyExporter`` (``forward_lstm``, ``reset_memory``):
  the same buffers and methods.

TorchScript is code: it is read only when the user passes ``--trust-model`` (replay asks first). The spec
(:func:`infer`) is the ``no critic LSTM`` variant's: layers and hidden from ``hidden_state``'s shape, the cell
from ``cell_state``'s presence, the observation width from the recurrent layer's input weights (the one
parameter named ``*weight_ih_l0``), the action width from one step on zeros. :func:`step` puts each batch's
state in the buffers (a buffer of the batch's size), zeroed where ``episode_start`` is 1 (as ``RNN.reset(dones)``
and ``reset_memory`` do), runs ``forward`` and reads the buffers back; no value output (zeros)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lstm_probe.deploy.spec import MAX_HIDDEN, MAX_LAYERS, MAX_SIZE, Spec, State, Step
from lstm_probe.errors import BadInput, one_line

STATE = ("hidden_state", "cell_state")
"""The buffers the exporters keep the state in (h; c for an LSTM)."""


def infer(module: Any, where: str) -> Spec:
    """The spec of a foreign TorchScript policy (see the module docstring); one line where it is not one."""
    buffers = dict(module.named_buffers())
    h = buffers.get(STATE[0])
    fix = "replay takes the policy.pt rsl_rl's or Isaac Lab's exporter writes (state in hidden_state/cell_state)"
    if not isinstance(h, torch.Tensor) or h.dim() != 3 or not callable(getattr(module, "forward", None)):
        raise BadInput(f"{where} was not exported by lstm-probe and keeps no recurrent state buffer; {fix}")
    layers, _, hidden = (int(d) for d in h.shape)
    c = buffers.get(STATE[1])
    cell = "lstm" if isinstance(c, torch.Tensor) else "gru"
    if isinstance(c, torch.Tensor) and tuple(c.shape) != tuple(h.shape):
        raise BadInput(f"{where}: its cell_state's shape is not its hidden_state's; {fix}")
    inputs = [p for n, p in module.named_parameters() if n.endswith("weight_ih_l0")]
    if len(inputs) != 1 or inputs[0].dim() != 2:
        raise BadInput(f"{where}: not one recurrent layer's input weights (*weight_ih_l0) found; {fix}")
    width = int(inputs[0].shape[1])
    if not (0 < layers <= MAX_LAYERS and 0 < hidden <= MAX_HIDDEN and 0 < width <= MAX_SIZE):
        raise BadInput(f"{where}: a state of {layers} layers of {hidden}, or {width} observations, is out of range")
    spec = Spec("no critic LSTM", (width,), "box", (1,), layers, hidden, cell)
    action, _, _ = step(module, spec, where, probe=True)(
        np.zeros((1, width), np.float32), np.ones(1, np.float32), spec.zero_state()
    )
    if action.ndim != 2 or not 0 < action.shape[1] <= MAX_SIZE:
        raise BadInput(f"{where} answers a step not as actions [batch, n]; {fix}")
    return Spec("no critic LSTM", (width,), "box", (int(action.shape[1]),), layers, hidden, cell)


def step(module: Any, spec: Spec, where: str, probe: bool = False) -> Step:
    """:data:`Step` of a foreign TorchScript policy (see the module docstring); ``probe``: the action's width is
    not known yet (:func:`infer`'s first step), so it is not checked."""
    names = STATE[: len(spec.state_names)]

    def run(obs: np.ndarray, start: np.ndarray, state: State) -> tuple[np.ndarray, np.ndarray, State]:
        keep = torch.as_tensor(1.0 - np.asarray(start, np.float32)).view(1, -1, 1)
        with torch.no_grad():
            for name, s in zip(names, state, strict=True):
                setattr(module, name, torch.as_tensor(np.asarray(s, np.float32)) * keep)
            try:
                out = module(torch.as_tensor(np.asarray(obs, np.float32)))
            except Exception as exc:
                raise BadInput(f"{where} fails to run a step: {one_line(exc, kind=False)[:300]}") from None
            new = tuple(getattr(module, name).clone().numpy() for name in names)
        count = len(obs)
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or out.dim() != 2 or len(out) != count:
            raise BadInput(f"{where} answers a step not as float32 actions [batch, n]")
        if not probe and tuple(out.shape[1:]) != spec.action_shape:
            raise BadInput(f"{where} answers a step not as float32 actions of shape [batch, {spec.action_shape[0]}]")
        if any(s.shape != (spec.layers, count, spec.hidden) for s in new):
            raise BadInput(f"{where} keeps a state not of shape [{spec.layers}, batch, {spec.hidden}]")
        return out.numpy(), np.zeros((count, 1), np.float32), new

    return run
