"""A deployed policy's :data:`~lstm_probe.deploy.spec.Step` whatever its form: a torch module (a framework's
``Policy.module``, or TorchScript), an ONNX file (onnxruntime); an exported file read back with its
:class:`~lstm_probe.deploy.spec.Spec` (:func:`open_file`: a regular file, its metadata checked, an ONNX graph
checked before it runs, ``checks.py``; an ONNX file lstm-probe did not write, its spec inferred from its graph,
``foreign.py``); the float16 runtime emulated (:func:`rounded`); and the time the
steps may take (:class:`Pace`)."""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lstm_probe.deploy import checks, foreign, foreign_script
from lstm_probe.deploy.spec import META_KEY, Spec, State, Step
from lstm_probe.errors import BadInput, one_line
from lstm_probe.log import budget

TIME_LIMIT = 600.0
"""Seconds a command's policy steps may take (export's verification, replay's loops): past it, or as soon as
the pace measured from the first second on says the rest would take longer, the command is refused in one
line."""
FILE_COPIES = 4
"""Copies of a policy file's bytes held while it is read (the bytes, the parsed model, its serialized form
handed to onnxruntime, the float16 copy)."""


def interrupt_behind(exc: BaseException) -> None:
    """Raise the KeyboardInterrupt (Ctrl-C, or the CLI's SIGTERM) that ``exc`` was raised from, if any: a library
    that meets one in its own code may answer with an error of its own (onnxruntime's module, interrupted as it
    loads, raises ImportError 'initialization failed' from it), which is no fault of the file or the policy."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            raise cause from None
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__


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


def ort_step(session: Any, spec: Spec, where: str = "the ONNX file") -> Step:
    """:data:`Step` of an onnxruntime session of an exported file; each output's shape and type checked (a
    file from elsewhere could answer anything), a failure of the run one line."""
    names = [n for n, _, _ in spec.inputs()]
    wanted = spec.outputs()

    def step(obs: np.ndarray, start: np.ndarray, state: State) -> tuple[np.ndarray, np.ndarray, State]:
        feed = dict(zip(names, [np.asarray(obs, np.float32), np.asarray(start, np.float32), *state], strict=True))
        try:
            out = session.run(None, feed)
        except Exception as exc:  # onnxruntime's own exception classes
            raise BadInput(f"{where} fails to run a step: {one_line(exc, kind=False)[:300]}") from None
        batch = len(obs)
        for got, (name, shape, dtype) in zip(out, wanted, strict=True):
            want = tuple(batch if d == "batch" else int(d) for d in shape)
            if not isinstance(got, np.ndarray) or got.shape != want or got.dtype != np.dtype(dtype):
                raise BadInput(f"{where} answers its output {name} not as {dtype} of shape {list(want)}")
        return out[0], out[1], tuple(out[2:])

    return step


def rounded(step: Step) -> Step:
    """A float16 runtime's step, computed the same on every CPU: the step's observations, states in and
    states out rounded to float16 (round to nearest even), the arithmetic in float32. Pass it a step over
    weights rounded too (:func:`half_weights`, ``open_file(...).step(half=True)``). A runtime that runs an
    LSTM in half precision stores weights, inputs and states in float16 and accumulates in float32 (cuDNN's
    and TensorRT's half-precision RNNs, onnxruntime's float16 kernels); this emulation is that, without the
    CPU's float16 kernels, which many CPUs lack (oneDNN refuses an LSTM under ``torch.autocast("cpu",
    torch.float16)`` on a CPU without avx512_fp16)."""

    def half(a: np.ndarray) -> np.ndarray:
        return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)

    def run(obs: np.ndarray, start: np.ndarray, state: State) -> tuple[np.ndarray, np.ndarray, State]:
        action, value, new = step(half(obs), start, tuple(half(s) for s in state))
        return action, value, tuple(half(s) for s in new)

    return run


def _half_initializers(proto: Any) -> None:
    """Round an ONNX graph's float32 initializers (and constants) to float16, stored back as float32 (in place)."""
    from onnx import TensorProto, numpy_helper

    constants = [a.t for n in proto.graph.node if n.op_type == "Constant" for a in n.attribute if a.type == 4]
    for init in [*proto.graph.initializer, *constants]:  # constants: a foreign file's (checks.FOREIGN_OPS)
        if init.data_type == TensorProto.FLOAT:
            arr = numpy_helper.to_array(init).astype(np.float16).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(arr, init.name))


def session(proto: Any) -> Any:
    """An onnxruntime session of a checked graph, on the CPU, its own log silenced: onnxruntime writes
    warnings to stderr itself (an unused initializer, a node it drops), names from the file included as they
    are, escape sequences and all; its errors come back as exceptions, made one line by the caller."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # before any session: the environment's logger, then each session's
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


@dataclass
class PolicyFile:
    """An exported file read and checked (:func:`open_file`); :meth:`step` runs it."""

    path: Path
    spec: Spec
    torchscript: bool
    per_env: int
    """Bytes one env's step holds (ONNX: from the checked graph; TorchScript: its state and observation)."""
    proto: Any = None
    raw: bytes = b""
    roles: foreign.Foreign | None = None
    """An ONNX file lstm-probe did not write: which of its inputs and outputs plays which role."""
    stateful: bool = False
    """A TorchScript file lstm-probe did not write, its state in its buffers (``foreign_script``)."""
    framework: str = ""
    """The framework the policy was exported from, as its metadata states it ('' for a file from elsewhere;
    a file written before the metadata stated it: 'sb3' where its source is a model.zip or RecurrentPPO)."""
    normalized: bool = False
    """Its metadata says the model was trained on observations normalised outside the policy (``Policy.normalized``)."""

    def step(self, half: bool = False) -> Step:
        """Its :data:`Step`; ``half``: its weights rounded to float16 (:func:`rounded` says why)."""
        where = str(self.path)
        if not self.torchscript:
            proto = self.proto
            if half:
                import onnx

                proto = onnx.ModelProto()
                proto.CopyFrom(self.proto)
                _half_initializers(proto)
            try:
                sess = session(proto)
            except Exception as exc:
                interrupt_behind(exc)
                raise BadInput(f"cannot run {where} with onnxruntime: {one_line(exc, kind=False)[:300]}") from None
            if self.roles is not None:
                return foreign.step(sess, self.spec, self.roles, where)
            return ort_step(sess, self.spec, where)
        module = torch.jit.load(io.BytesIO(self.raw), map_location="cpu").eval()
        if half:
            half_weights(module)
        return foreign_script.step(module, self.spec, where) if self.stateful else torch_step(module)

    def batch(self, envs: int, most: int) -> int:
        """How many envs one step may run at once (at most ``most``): within a quarter of the memory budget,
        and for an ONNX file, its graph measured again at that batch (a graph whose values grow faster than
        the batch is refused)."""
        if self.roles is not None and self.roles.batch is not None:
            return self.roles.batch  # measured at that batch by open_file
        size = max(1, min(envs, most, budget.limit() // (4 * max(self.per_env, 1))))
        io = None if self.roles is None else self.roles.io
        if size > 1 and not self.torchscript:
            need, _ = checks.measure(self.proto, self.spec, size, str(self.path), io)
            budget.refuse(2 * need, f"running {self.path} on {size:,} envs at once")
        return size


def open_file(path: Path, names: dict[str, str] | None = None) -> PolicyFile:
    """An exported file (``.onnx``, else TorchScript) read and checked: a regular file within the memory
    budget, lstm-probe's metadata (:meth:`Spec.from_json`), and an ONNX graph as :func:`checks.check` has it,
    before anything of it runs (TorchScript is code: the caller asked the user to trust it). An ONNX file
    without lstm-probe's metadata (rsl_rl's or Isaac Lab's export) has its spec inferred from its graph
    (:func:`foreign.infer`; ``names``: ``--name ROLE=NAME``, the inputs and outputs whose names say nothing)."""
    fix = f"pass a policy exported with `lstm-probe export MODEL.zip {path.name}`"
    if not path.exists() and not path.is_symlink():
        raise BadInput(f"{path} does not exist; export a policy with `lstm-probe export MODEL.zip {path.name}`")
    raw = budget.read_regular(path, fix, copies=FILE_COPIES)
    where = str(path)
    if path.suffix == ".onnx":
        import onnx

        try:
            proto = onnx.load_model_from_string(raw)
        except Exception as exc:
            raise BadInput(f"cannot read {path} as an ONNX file: {one_line(exc, kind=False)[:200]}") from None
        if not proto.graph.input and not proto.graph.node:  # an empty file parses as an empty model
            raise BadInput(f"cannot read {path} as an ONNX file: it holds no graph ({len(raw):,} bytes); {fix}")
        meta = {p.key: p.value for p in proto.metadata_props}
        if META_KEY not in meta:  # a file from elsewhere: its spec from its graph, its weights perhaps beside it
            foreign.inline(proto, path, FILE_COPIES)
            spec, found = foreign.infer(proto, where, names)
            graph = checks.check(proto, spec, where, found.io)
            return PolicyFile(path, spec, False, graph.per_env, proto=proto, roles=found)
        _own(path, names)
        spec = Spec.from_json(meta[META_KEY], where)
        graph = checks.check(proto, spec, where)
        text = meta[META_KEY]
        return PolicyFile(
            path, spec, False, graph.per_env, proto=proto, framework=framework(text), normalized=normalized(text)
        )
    extra = {f"{META_KEY}.json": ""}
    try:
        module = torch.jit.load(io.BytesIO(raw), map_location="cpu", _extra_files=extra)
    except Exception as exc:
        raise BadInput(f"cannot read {path} as a TorchScript file: {one_line(exc, kind=False)[:200]}") from None
    _own(path, names)
    if not extra[f"{META_KEY}.json"]:  # rsl_rl's or Isaac Lab's policy.pt: the state in its buffers
        spec = foreign_script.infer(module.eval(), where)
        return PolicyFile(path, spec, True, per_env_bytes(spec), raw=raw, stateful=True)
    spec = Spec.from_json(extra[f"{META_KEY}.json"], where)
    text = extra[f"{META_KEY}.json"]
    return PolicyFile(
        path, spec, True, per_env_bytes(spec), raw=raw, framework=framework(text), normalized=normalized(text)
    )


def framework(meta: str) -> str:
    """The framework an export's metadata (checked by :meth:`Spec.from_json`) names: its ``framework``, or for
    a file written before it was stated, 'sb3' where its ``source`` is a model.zip or a RecurrentPPO."""
    import json

    doc = json.loads(meta)
    named = doc.get("framework")
    if isinstance(named, str):
        return named[:40]
    source = doc.get("source")
    return "sb3" if isinstance(source, str) and (source.endswith(".zip") or source == "RecurrentPPO") else ""


def normalized(meta: str) -> bool:
    """Whether an export's metadata (checked by :meth:`Spec.from_json`) says its model was trained on observations
    normalised outside the policy (``"normalized": true``; absent from every other file)."""
    import json

    return json.loads(meta).get("normalized") is True


def _own(path: Path, names: dict[str, str] | None) -> None:
    if names:
        raise BadInput(
            f"{foreign.FLAG} names the inputs and outputs of an ONNX file lstm-probe did not write; {path} was "
            f"exported by lstm-probe, its names in its metadata: drop {foreign.FLAG}"
        )


def per_env_bytes(spec: Spec) -> int:
    """An estimate of the bytes one env's step of a torch module holds: its observation and states, times 16
    (the activations between them, in and out)."""
    state = spec.layers * spec.hidden * len(spec.state_names)
    return 16 * 4 * (math.prod(spec.obs_shape) + state + spec.hidden)


def load_file(path: Path, half: bool = False, names: dict[str, str] | None = None) -> tuple[Spec, Step, bool]:
    """An exported file's spec and :data:`Step`, and whether it is TorchScript (else ONNX); ``half``: its
    weights rounded to float16 (:func:`rounded` says why); ``names``: as :func:`open_file` takes them."""
    opened = open_file(path, names)
    return opened.spec, opened.step(half), opened.torchscript


class Pace:
    """The time ``total`` policy steps may take: :meth:`tick` after each refuses (one line) as soon as the
    pace measured from the first second on says the whole would take over ``limit`` seconds, or it has."""

    def __init__(self, total: int, what: str, fix: str, limit: float = TIME_LIMIT) -> None:
        self.total, self.what, self.fix, self.limit = max(total, 1), what, fix, limit
        self.done = 0
        self.start = time.monotonic()

    def tick(self, steps: int) -> None:
        self.done += steps
        spent = time.monotonic() - self.start
        if spent < 1.0:
            return
        whole = spent / self.done * self.total
        if whole > self.limit or spent > self.limit:
            raise BadInput(
                f"{self.what}: its {self.total:,} policy steps would take ~{whole / 60:,.0f} min at the "
                f"{self.done / spent:,.0f} steps a second measured, over the {self.limit / 60:,.0f} min lstm-probe "
                f"gives them; {self.fix}"
            )
