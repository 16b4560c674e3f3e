"""A deployed policy's :data:`~lstm_probe.deploy.spec.Step` whatever its form: a torch module (a framework's
``Policy.module``, or TorchScript), an ONNX file (onnxruntime); an exported file read back with its
:class:`~lstm_probe.deploy.spec.Spec`; the float16 runtime emulated (:func:`rounded`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from lstm_probe.deploy.spec import META_KEY, Spec, State, Step
from lstm_probe.errors import BadInput, one_line


def torch_step(module: Any) -> Step:
    """:data:`Step` of a torch module (a :attr:`Policy.module <lstm_probe.deploy.spec.Policy.module>` or a
    TorchScript one), in float32."""

    def step(obs: np.ndarray, start: np.ndarray, state: State) -> tuple[np.ndarray, np.ndarray, State]:
        with torch.no_grad():
            args = [torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(start, dtype=torch.float32)]
            out = module(*args, *(torch.as_tensor(s, dtype=torch.float32) for s in state))
        arrays = [o.numpy() for o in out]
        return arrays[0], arrays[1], tuple(arrays[2:])

    return step


def half_weights(module: Any) -> Any:
    """``module`` (a ``Policy.module`` or TorchScript, a private copy) with its floating-point parameters and
    buffers rounded to float16 and stored back as float32, in place (see :func:`rounded`)."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            if t.is_floating_point():
                t.copy_(t.to(torch.float16).to(t.dtype))
    return module


def ort_step(session: Any, spec: Spec) -> Step:
    """:data:`Step` of an onnxruntime session of an exported file."""
    names = [n for n, _, _ in spec.inputs()]

    def step(obs: np.ndarray, start: np.ndarray, state: State) -> tuple[np.ndarray, np.ndarray, State]:
        feed = dict(zip(names, [np.asarray(obs, np.float32), np.asarray(start, np.float32), *state], strict=True))
        out = session.run(None, feed)
        return out[0], out[1], tuple(out[2:])

    return step


def rounded(step: Step) -> Step:
    """A float16 runtime's step, computed the same on every CPU: the step's observations, states in and
    states out rounded to float16 (round to nearest even), the arithmetic in float32. Pass it a step over
    weights rounded too (:func:`half_weights`, ``load_file(..., half=True)``). A runtime that runs an LSTM in
    half precision stores weights, inputs and states in float16 and accumulates in float32 (cuDNN's and
    TensorRT's half-precision RNNs, onnxruntime's float16 kernels); this emulation is that, without the
    CPU's float16 kernels, which many CPUs lack (oneDNN refuses an LSTM under ``torch.autocast("cpu",
    torch.float16)`` on a CPU without avx512_fp16)."""

    def half(a: np.ndarray) -> np.ndarray:
        return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)

    def run(obs: np.ndarray, start: np.ndarray, state: State) -> tuple[np.ndarray, np.ndarray, State]:
        action, value, new = step(half(obs), start, tuple(half(s) for s in state))
        return action, value, tuple(half(s) for s in new)

    return run


def _half_initializers(proto: Any) -> None:
    """Round an ONNX graph's float32 initializers to float16, stored back as float32 (in place)."""
    from onnx import TensorProto, numpy_helper

    for init in proto.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            arr = numpy_helper.to_array(init).astype(np.float16).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(arr, init.name))


def load_file(path: Path, half: bool = False) -> tuple[Spec, Step, bool]:
    """An exported file's spec and :data:`Step`, and whether it is TorchScript (else ONNX); ``half``: its
    weights rounded to float16 (:func:`rounded` says why)."""
    if not path.is_file():
        raise BadInput(f"{path} does not exist; export a policy with `lstm-probe export MODEL.zip {path.name}`")
    if path.suffix == ".onnx":
        import onnx
        import onnxruntime as ort

        try:
            proto = onnx.load(str(path), load_external_data=False)
            meta = {p.key: p.value for p in proto.metadata_props}
            if half:
                _half_initializers(proto)
            session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise BadInput(f"cannot read {path} as an ONNX file: {one_line(exc, kind=False)[:200]}") from None
        if META_KEY not in meta:
            raise BadInput(f"{path} was not exported by lstm-probe (no {META_KEY} metadata); export it again")
        spec = Spec.from_json(meta[META_KEY], str(path))
        return spec, ort_step(session, spec), False
    extra = {f"{META_KEY}.json": ""}
    try:
        module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
    except Exception as exc:
        raise BadInput(f"cannot read {path} as a TorchScript file: {one_line(exc, kind=False)[:200]}") from None
    if not extra[f"{META_KEY}.json"]:
        raise BadInput(f"{path} was not exported by lstm-probe (no {META_KEY}.json); export it again")
    module = half_weights(module.eval()) if half else module.eval()
    return Spec.from_json(extra[f"{META_KEY}.json"], str(path)), torch_step(module), True
