"""An ONNX file checked before onnxruntime runs it (``lstm-probe replay --policy FILE.onnx``, and export's
own file read back): a file from elsewhere is a program for onnxruntime, and a few hundred bytes can ask it
for gigabytes (``ConstantOfShape``) or for a loop of 2^40 iterations (``Loop``). So before a session is
made, the graph must be the kind lstm-probe's exporter writes, within the memory budget:

- only the operators of :data:`OPS`, from the standard domain: what ``torch.onnx.export`` writes for every
  policy ``lstm-probe export`` takes (no ``Loop``, ``Scan`` or ``If``, which it never writes, and no
  operator that makes a tensor of a size its input data states); no functions, subgraphs or tensors in
  attributes, no external or sparse weights, at most :data:`MAX_NODES` nodes;
- its inputs and outputs the ones its metadata's :class:`~lstm_probe.deploy.spec.Spec` states, in order,
  with the same shapes (a free batch axis); for a file lstm-probe did not write (``foreign.py``: an rsl_rl or
  Isaac Lab export), the ones inferred from its graph (:class:`Interface`), and besides :data:`OPS` only
  :data:`FOREIGN_OPS` (``Constant``, which torch's TorchScript-based exporter writes, its tensor counted as a
  weight; still no ``Loop``, ``Scan`` or ``If``);
- every value's size known from the input shapes (ONNX shape inference at the batch a step runs with), the
  weights (held :data:`HELD` times) and a step's values and workspace within the memory budget
  (``--max-memory``), and a step's work within :data:`MAX_STEP_MACS` multiply-adds per env.

Anything else is refused in one line (BadInput, exit 2). Names from the file reach messages only as
``repr`` of their first characters: control characters written out, never sent to a terminal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lstm_probe.deploy.spec import Spec
from lstm_probe.errors import BadInput, one_line
from lstm_probe.log import budget

OPS = frozenset(
    {
        "LSTM", "GRU", "Gemm", "Conv", "Mul", "Sub", "Div", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice",
        "Concat", "Shape", "Clip", "Max", "Min", "ArgMax", "Greater", "Where", "Tanh", "Relu", "Elu",
        "LeakyRelu", "Gelu", "Sigmoid", "Softplus", "Mish",
    }
)  # fmt: skip
"""The operators ``torch.onnx.export`` (dynamo, opset 18+) writes for the policies ``lstm-probe export``
takes (measured on every variant: separate, shared and no critic LSTM, 1 to 3 layers, Box and Discrete
actions, MlpLstmPolicy with each activation SB3's reader allows, CnnLstmPolicy on images): the LSTM, the
linear and convolution layers, the reset, the clipping, the argmax, the activations and the reshaping
around them. Each runs in time and memory set by the shapes of its inputs."""
FOREIGN_OPS = frozenset({"Constant", "Add", "Identity"})
"""What else a recurrent policy lstm-probe did not write may run: ``torch.onnx.export(..., dynamo=False)``
(rsl_rl's ``OnPolicyRunner.export_policy_to_onnx`` and Isaac Lab's ``_OnnxPolicyExporter.export`` on the
torch versions they ship with) writes ``Constant`` nodes for the LSTM's slices and squeezes, and an
observation normaliser may add its epsilon; a ``Constant`` holds its tensor in the file (counted as a weight),
each runs in time and memory set by its inputs."""
MAX_NODES = 1 << 16
"""Most nodes in a graph (an export writes ~30 per LSTM layer: ~60 for two layers, ~31,000 for 1,024)."""
MAX_STEP_MACS = 1 << 30
"""Most multiply-adds (each elementwise operation counted as one) of one env's step: ~1 s of a CPU core.
An Atari CnnLstmPolicy's step takes ~10 M, lstm_hidden_size 1024 with net_arch [1024, 1024] ~13 M."""
HELD = 6
"""Copies of the weights counted for a replay: the file's bytes, the parsed model, its float16 copy, the
two onnxruntime sessions (and the weights they pre-pack)."""
_FIX = "export the policy again with `lstm-probe export`"
FOREIGN_FIX = "replay takes a recurrent policy as rsl_rl's and Isaac Lab's exporters write it (docs/deploy.md)"
_NUMERIC = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}
"""ONNX tensor types a graph may hold, and their bytes per value (float32, ints, bool, float16, double,
bfloat16): no strings, no complex numbers."""
ITEM_BYTES = _NUMERIC
_ATTRIBUTES = {1, 2, 3, 6, 7, 8}
"""Attribute types a node may carry: float, int, string, and lists of each (no graphs, no tensors)."""


IO = list[tuple[str, list[Any], str]]
"""(name, shape, dtype) of each input or output, in the graph's order (``"batch"``: the free batch axis)."""


@dataclass(frozen=True)
class Interface:
    """The inputs and outputs a graph must have: its metadata's spec's (:meth:`of`), or those inferred from a
    graph lstm-probe did not write (``foreign.py``, ``foreign=True``)."""

    inputs: IO
    outputs: IO
    foreign: bool = False
    fix: str = field(default=_FIX, compare=False)

    @classmethod
    def of(cls, spec: Spec) -> Interface:
        return cls(spec.inputs(), spec.outputs())

    @property
    def source(self) -> str:
        return "replay inferred from it" if self.foreign else "its metadata states"


@dataclass(frozen=True)
class Graph:
    """What a checked graph holds and costs."""

    weights: int
    """Bytes of its initializers."""
    per_env: int
    """Bytes one env's step holds: its inputs, every value it computes and the operators' workspace."""
    macs: int
    """Multiply-adds of one env's step."""


def _name(text: str) -> str:
    """A name from the file as it may appear in a message: ``repr`` (control characters written out) of its
    first 60 characters."""
    return repr(text[:60])


inert = _name
"""A name from a file (or a flag naming one) as a message shows it (``foreign.py``'s refusals)."""


def check(proto: Any, spec: Spec, where: str, io: Interface | None = None) -> Graph:
    """Refuse (BadInput, one line) what :mod:`this module <lstm_probe.deploy.checks>` says a file must not be;
    ``io``: the inputs and outputs it must have (default: ``spec``'s)."""
    io = io or Interface.of(spec)
    fix = io.fix
    _structure(proto, where, io)
    weights = _weights(proto, where, fix)
    _interface(proto, io, where)
    per_env, macs = measure(proto, spec, 1, where, io)
    budget.refuse(HELD * weights + per_env, f"running {where} (its weights and one step)", fix)
    if macs > MAX_STEP_MACS:
        raise BadInput(
            f"{where}: one step of its graph takes {macs:,} multiply-adds, over the {MAX_STEP_MACS:,} lstm-probe "
            f"runs (a recurrent policy's step takes millions); {fix}"
        )
    return Graph(weights, per_env, macs)


def _structure(proto: Any, where: str, io: Interface) -> None:
    """Only standard operators of :data:`OPS` (and :data:`FOREIGN_OPS` in a foreign file), no functions,
    subgraphs, tensors in attributes (but a foreign ``Constant``'s value) or sparse weights."""
    import onnx

    fix = io.fix
    ops = OPS | FOREIGN_OPS if io.foreign else OPS
    who = "replay does not run (it runs" if io.foreign else "lstm-probe's exports never write (they use"
    if len(proto.functions):
        raise BadInput(f"{where}: its model defines functions of its own, which lstm-probe's exports never do; {fix}")
    newest = onnx.defs.onnx_opset_version()
    for op in proto.opset_import:
        if op.domain not in ("", "ai.onnx") or not 1 <= op.version <= newest:
            raise BadInput(
                f"{where}: it imports the operator set {_name(op.domain or 'ai.onnx')} version {op.version}, not "
                f"the standard one (1 to {newest}); {fix}"
            )
    graph = proto.graph
    if len(graph.sparse_initializer):
        raise BadInput(f"{where}: it holds sparse weights, which lstm-probe's exports never write; {fix}")
    if len(graph.node) > MAX_NODES:
        raise BadInput(
            f"{where}: its graph has {len(graph.node):,} nodes, over the {MAX_NODES:,} lstm-probe reads; {fix}"
        )
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ops:
            raise BadInput(
                f"{where}: its graph runs the operator {_name(node.op_type)} (node {_name(node.name)}), which "
                f"{who} {', '.join(sorted(ops))}); {fix}"
            )
        for attr in node.attribute:
            if node.op_type == "Constant" and attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                _tensor(attr.t, where, f"node {_name(node.name)}'s value", fix)
                continue
            if attr.type not in _ATTRIBUTES:
                raise BadInput(
                    f"{where}: its node {_name(node.name)} carries the attribute {_name(attr.name)} of a kind "
                    f"(a graph or a tensor) lstm-probe's exports never write; {fix}"
                )


def _tensor(t: Any, where: str, what: str, fix: str) -> int:
    """Bytes of a tensor held in the file, from its shape (not from the bytes stored: onnxruntime allocates the
    shape): a tensor of numbers stored inside the file, or refused."""
    if t.data_location == 1:  # EXTERNAL
        raise BadInput(f"{where}: its {what} is stored outside the file; {fix}")
    if t.data_type not in _NUMERIC or len(t.dims) > 32 or any(d < 0 for d in t.dims):
        raise BadInput(f"{where}: its {what} is not a tensor of numbers; {fix}")
    return math.prod(t.dims) * _NUMERIC[t.data_type]


def _weights(proto: Any, where: str, fix: str = _FIX) -> int:
    """Bytes of the initializers and of the constants' values, from their shapes."""
    total = sum(_tensor(t, where, f"weight {_name(t.name)}", fix) for t in proto.graph.initializer)
    for node in proto.graph.node:
        if node.op_type == "Constant":  # a foreign file's (checked by _structure); the value is held as a weight
            total += sum(
                _tensor(a.t, where, f"node {_name(node.name)}'s value", fix) for a in node.attribute if a.type == 4
            )
    return total


def _interface(proto: Any, io: Interface, where: str) -> None:
    """The graph's inputs and outputs are ``io``'s, in order, with its shapes (and a free or fixed batch axis)."""
    graph = proto.graph
    fix = io.fix
    weights = {t.name for t in graph.initializer}
    inputs = [v for v in graph.input if v.name not in weights]
    for kind, values, wanted in (("inputs", inputs, io.inputs), ("outputs", list(graph.output), io.outputs)):
        names = [v.name for v in values]
        if names != [n for n, _, _ in wanted]:
            shown = ", ".join(_name(n) for n in names[:8])
            raise BadInput(
                f"{where}: its graph's {kind} are {shown}, not the {', '.join(n for n, _, _ in wanted)} "
                f"{io.source}; {fix}"
            )
        for v, (name, shape, dtype) in zip(values, wanted, strict=True):
            t = v.type.tensor_type
            elem = {"float32": 1, "int64": 7}[dtype]
            dims = list(t.shape.dim) if t.HasField("shape") else None
            fits = dims is not None and len(dims) == len(shape)
            if fits and dims is not None:
                for d, want in zip(dims, shape, strict=True):
                    static = d.HasField("dim_value")
                    fits = fits and (static and d.dim_value == want if isinstance(want, int) else not static)
            if not v.type.HasField("tensor_type") or t.elem_type != elem or not fits:
                shown = _name(name) if io.foreign else name  # a foreign file's names are its own
                raise BadInput(
                    f"{where}: its graph's {shown} is not {dtype} of shape [{', '.join(map(str, shape))}] as "
                    f"{io.source}; {fix}"
                )


def measure(proto: Any, spec: Spec, batch: int, where: str, io: Interface | None = None) -> tuple[int, int]:
    """(bytes, multiply-adds) of one step of ``batch`` envs: every value's size from ONNX shape inference with
    the inputs' shapes at that batch (a value whose size the shapes do not fix is refused; a Reshape keeps its
    input's size), plus the operators' workspace (a convolution's unrolled input, an LSTM's gates)."""
    import onnx
    from onnx import shape_inference

    io = io or Interface.of(spec)
    fix = io.fix
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    graph = model.graph
    del graph.value_info[:]
    weights = {t.name for t in graph.initializer}
    inputs = [v for v in graph.input if v.name not in weights]
    for values, wanted in ((inputs, io.inputs), (graph.output, io.outputs)):
        for v, (_, shape, _) in zip(values, wanted, strict=True):  # the spec's shapes at this batch
            for d, want in zip(v.type.tensor_type.shape.dim, shape, strict=True):
                d.Clear()
                d.dim_value = batch if want == "batch" else int(want)
    try:
        onnx.checker.check_model(model)
        inferred = shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:  # onnx's checker and inference errors, whatever their class
        raise BadInput(f"{where}: its graph does not check ({one_line(exc)[:300]}); {fix}") from None
    g = inferred.graph
    shapes: dict[str, tuple[int, list[int | None]]] = {}
    for v in [*g.input, *g.value_info, *g.output]:
        t = v.type.tensor_type
        if v.type.HasField("tensor_type") and t.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            shapes[v.name] = (t.elem_type, dims)
    for t in g.initializer:
        shapes[t.name] = (t.data_type, list(t.dims))
    counts: dict[str, int] = {}

    def count(name: str) -> int | None:
        if name in counts:
            return counts[name]
        dims = shapes.get(name, (0, [None]))[1]
        return None if any(d is None for d in dims) else math.prod(d for d in dims if d is not None)

    total = sum(4 * math.prod(batch if d == "batch" else int(d) for d in shape) for _, shape, _ in io.inputs)
    macs = 0
    for node in g.node:
        for out in node.output:
            if not out:
                continue
            n = count(out)
            if n is None and node.op_type == "Reshape":
                n = count(node.input[0])
            elem = shapes.get(out, (0, []))[0]
            if n is None or elem not in _NUMERIC:
                raise BadInput(
                    f"{where}: the size of its value {_name(out)} (node {_name(node.op_type)}) is not set by the "
                    f"inputs' shapes; {fix}"
                )
            counts[out] = n
            total += n * _NUMERIC[elem]
        work, space = _cost(node, count, shapes)
        if work is None:
            raise BadInput(f"{where}: the work of its node {_name(node.name)} is not set by the inputs' shapes; {fix}")
        macs += work
        total += space
    return total, macs


def _cost(node: Any, count: Any, shapes: dict[str, tuple[int, list[int | None]]]) -> tuple[int | None, int]:
    """(multiply-adds, workspace bytes) of one node: a product's inner dimension times its outputs, an LSTM's
    gates, a convolution's kernel times its outputs (and its unrolled input); one per output value otherwise."""
    out = count(node.output[0]) if node.output and node.output[0] else 0
    if out is None:
        return None, 0

    def dims(i: int) -> list[int | None]:
        return shapes.get(node.input[i], (0, [None]))[1] if len(node.input) > i and node.input[i] else [None]

    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "Gemm":
        a, b = dims(0), dims(1)
        trans_a = bool(attrs["transA"].i) if "transA" in attrs else False
        trans_b = bool(attrs["transB"].i) if "transB" in attrs else False
        k = (a[0] if trans_a else a[-1]) if len(a) == 2 else None
        if k is None and len(b) == 2:
            k = b[1] if trans_b else b[0]
        return (None, 0) if k is None else (out * k, 0)
    if node.op_type == "Conv":
        w, y = dims(1), shapes.get(node.output[0], (0, [None]))[1]
        if len(w) < 3 or any(d is None for d in w) or any(d is None for d in y):
            return None, 0
        kernel = math.prod(d for d in w[1:] if d is not None)
        spatial = math.prod(d for d in y[2:] if d is not None)
        return out * kernel, 4 * kernel * spatial
    if node.op_type == "LSTM":
        w, x = dims(1), count(node.input[0])
        if len(w) != 3 or any(d is None for d in w) or x is None or not w[2]:
            return None, 0
        dirs, gates, width = (d or 0 for d in w)
        hidden = gates // 4
        steps = x // width  # sequence x batch
        return steps * dirs * gates * (width + hidden), 8 * steps * dirs * gates
    return out, 0
