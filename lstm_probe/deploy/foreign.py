"""An ONNX recurrent policy lstm-probe did not write (``lstm-probe replay TRACE --policy policy.onnx``): the
file rsl_rl's or Isaac Lab's exporter writes, read without metadata of ours.

What those exporters write (one step of a batch of envs, the state explicit, no reset input: the caller
zeroes the state where an episode starts):

- rsl_rl 5.5, ``OnPolicyRunner.export_policy_to_onnx`` of ``RNNModel.as_onnx`` (``rsl_rl/models/rnn_model.py``,
  ``_OnnxRNNModel``): inputs ``obs`` [1, obs], ``h_in`` [layers, 1, hidden], ``c_in`` (LSTM only); outputs
  ``actions`` [1, actions], ``h_out``, ``c_out`` (LSTM only); the observation normaliser inside;
- Isaac Lab, ``isaaclab_rl/rsl_rl/exporter.py``, ``_OnnxPolicyExporter.export`` (``forward_lstm``): the same
  names (``obs``, ``h_in``, ``c_in``; ``actions``, ``h_out``, ``c_out``), opset 11, ``dynamic_axes={}``.

Both fix the batch at 1 (no dynamic axes) and have no value output (the actor alone). torch's default
exporter (``dynamo=True`` from torch 2.9 on) stores the weights beside the file (``policy.onnx.data``, ONNX
external data): :func:`inline` reads them in, from that one regular file in the same directory only, within
the memory budget, each tensor's place in it checked. :func:`infer` finds each
role by its name (:data:`ROLES`), or by the name ``--name ROLE=NAME`` states for it, and takes the sizes from
the shapes: layers and hidden from the state input's, the observation from ``obs``'s, the action from the
action output's (float32: a Box; int64 of shape [batch]: Discrete), the batch fixed or free. Every input and
output must have a role, and a role one input or output: anything else (two candidates, none, a shape that
does not fit) is refused in one line naming the flag that states it. The spec is the ``no critic LSTM``
variant's (states ``h``, ``c``; a GRU's ``h`` alone); :func:`step` runs it as replay's loops expect: the state
zeroed where ``episode_start`` is 1, a fixed batch filled up, no value (zeros). ``checks.py`` checks the graph
before anything runs, as it checks ours, with no metadata to trust.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lstm_probe.deploy import checks
from lstm_probe.deploy.checks import inert
from lstm_probe.deploy.spec import MAX_DIMS, MAX_HIDDEN, MAX_LAYERS, MAX_SIZE, Spec, State, Step
from lstm_probe.errors import BadInput, one_line
from lstm_probe.log import budget

INPUTS = ("obs", "h", "c")
OUTPUTS = ("action", "h_out", "c_out", "value")
ROLES: dict[str, tuple[str, ...]] = {
    "obs": ("obs", "observations", "observation"),
    "h": ("h_in", "h", "hidden_in"),
    "c": ("c_in", "c", "cell_in"),
    "action": ("actions", "action"),
    "h_out": ("h_out", "hidden_out"),
    "c_out": ("c_out", "cell_out"),
    "value": ("value", "values"),
}
"""Each role's names, as the exporters write them (rsl_rl and Isaac Lab: obs, h_in, c_in; actions, h_out,
c_out) and as lstm-probe's own files name them."""
FLAG = "--name"
MAX_BATCH = 1 << 16
"""Largest fixed batch read (the exporters fix 1)."""


@dataclass(frozen=True)
class Foreign:
    """Which input or output of the graph plays which role, and its fixed batch (None: free)."""

    names: dict[str, str]
    batch: int | None
    io: checks.Interface


def inline(proto: Any, path: Path, copies: int) -> None:
    """The weights ``proto`` (the graph of ``path``) stores in a file beside it (ONNX external data, as torch's
    exporter writes it: ``policy.onnx.data``) read into it, in place: the file a plain name in ``path``'s
    directory (no directory part, no link), regular, within the memory budget held ``copies`` times, each
    tensor's offset and length inside it and its length the tensor's shape's; BadInput (one line) otherwise.
    Nothing else of the file is read."""
    external = [t for t in proto.graph.initializer if t.data_location == 1]
    if not external:
        return
    fix = "keep the weights file the exporter wrote beside the .onnx file, or save both as one file (docs/deploy.md)"
    files: dict[str, bytes] = {}
    for t in external:
        info = {e.key: e.value for e in t.external_data}
        name = info.get("location", "")
        if not re.fullmatch(r"[A-Za-z0-9_.+-]{1,200}", name) or name in (".", ".."):
            raise BadInput(
                f"{path}: its weight {inert(t.name)} is stored in {inert(name)}, not a file name in its "
                f"directory; {fix}"
            )
        if name not in files:
            data = path.parent / name
            if data.is_symlink() or not data.exists():
                what = "a link" if data.is_symlink() else "missing"
                raise BadInput(f"{path}: its weights are stored in {data}, which is {what}; {fix}")
            files[name] = budget.read_regular(data, fix, copies=copies)
        raw = files[name]
        try:
            offset, length = int(info.get("offset", "0")), int(info.get("length", str(len(raw))))
        except ValueError:
            offset = length = -1
        item = checks.ITEM_BYTES.get(t.data_type, 0)
        want = math.prod(t.dims) * item if item and all(d >= 0 for d in t.dims) else -1
        if offset < 0 or length != want or offset + length > len(raw):
            raise BadInput(
                f"{path}: its weight {inert(t.name)} is not {max(want, 0):,} bytes at offset {offset:,} of {name} "
                f"({len(raw):,} bytes); {fix}"
            )
        t.raw_data = raw[offset : offset + length]
        del t.external_data[:]
        t.data_location = 0  # DEFAULT: inside the model


def parse_names(items: Sequence[str] | None) -> dict[str, str]:
    """``--name ROLE=NAME`` (repeatable) as a dict; BadInput (one line) for a malformed one or an unknown role."""
    out: dict[str, str] = {}
    for item in items or ():
        role, eq, name = str(item).partition("=")
        if not eq or not name or role not in ROLES:
            raise BadInput(
                f"{FLAG} takes ROLE=NAME, ROLE one of {', '.join(ROLES)} (e.g. {FLAG} h=hidden); got {inert(str(item))}"
            )
        if role in out:
            raise BadInput(f"{FLAG} states {role} twice")
        out[role] = name
    return out


def infer(proto: Any, where: str, names: Mapping[str, str] | None = None) -> tuple[Spec, Foreign]:
    """The spec and interface of a graph lstm-probe did not write (see the module docstring)."""
    given = dict(names or {})
    unknown = sorted(set(given) - set(ROLES))
    if unknown:
        raise BadInput(f"{FLAG}: no role {inert(unknown[0])}; the roles are {', '.join(ROLES)}")
    graph = proto.graph
    weights = {t.name for t in graph.initializer}
    inputs = {v.name: v for v in graph.input if v.name not in weights}
    outputs = {v.name: v for v in graph.output}
    if len(inputs) > 8 or len(outputs) > 8:
        raise BadInput(f"{where}: its graph has {len(inputs)} inputs and {len(outputs)} outputs; {checks.FOREIGN_FIX}")
    found = {}
    for kind, roles, values in (("input", INPUTS, inputs), ("output", OUTPUTS, outputs)):
        for role in roles:
            name = _find(role, kind, values, given, where)
            if name is not None:
                found[role] = name
        for name in values:
            if name not in found.values():
                raise BadInput(
                    f"{where} was not exported by lstm-probe, and its {kind} {inert(name)} is none of "
                    f"{', '.join(r for r in roles)}: state its role with {FLAG} ROLE={inert(name)[1:-1]} "
                    f"({_listing(kind, values)})"
                )
    if ("c" in found) != ("c_out" in found):
        has, lacks = ("c", "c_out") if "c" in found else ("c_out", "c")
        raise BadInput(
            f"{where}: its graph has a {has} ({inert(found[has])}) but no {lacks}: an LSTM has both, a GRU "
            f"neither; state it with {FLAG} {lacks}=NAME"
        )
    cell = "lstm" if "c" in found else "gru"
    state = _shape(inputs[found["h"]], "h", where, 3, float_only=True)
    layers, batch, hidden = state
    if layers is None or hidden is None or not (1 <= layers <= MAX_LAYERS and 1 <= hidden <= MAX_HIDDEN):
        raise BadInput(
            f"{where}: its input {inert(found['h'])} (h) is not [layers, batch, hidden] with layers 1 to "
            f"{MAX_LAYERS:,} and hidden 1 to {MAX_HIDDEN:,}; state the hidden state with {FLAG} h=NAME"
        )
    if batch is not None and not 1 <= batch <= MAX_BATCH:
        raise BadInput(f"{where}: its state's batch axis is {batch:,}, not 1 to {MAX_BATCH:,}; {checks.FOREIGN_FIX}")
    for role in ("c", "h_out", "c_out"):
        if role in found:
            v = inputs[found[role]] if role == "c" else outputs[found[role]]
            if _shape(v, role, where, 3, float_only=True) != state:
                raise BadInput(
                    f"{where}: its {inert(found[role])} ({role}) is not of h's shape {_shown(state)}; state "
                    f"which is {role} with {FLAG} {role}=NAME"
                )
    obs = _shape(inputs[found["obs"]], "obs", where, 0, float_only=True)
    obs_shape = _sizes(obs, batch, "obs", found, where)
    act = _shape(outputs[found["action"]], "action", where, 0, float_only=False)
    elem = outputs[found["action"]].type.tensor_type.elem_type
    action = "box" if elem == 1 else "discrete"
    action_shape = _sizes(act, batch, "action", found, where, fewest=0)
    if action == "discrete" and action_shape:
        raise BadInput(
            f"{where}: its {inert(found['action'])} (action) is int64 of shape {_shown(act)}, not [batch]; "
            f"state the action with {FLAG} action=NAME"
        )
    b: Any = "batch" if batch is None else batch
    shapes: dict[str, tuple[list[Any], str]] = {
        "obs": ([b, *obs_shape], "float32"),
        "action": ([b, *action_shape], "float32" if action == "box" else "int64"),
    }
    for role in ("h", "c", "h_out", "c_out"):
        shapes[role] = ([layers, b, hidden], "float32")
    if "value" in found:  # not run (replay compares actions), but checked as the rest
        value = _shape(outputs[found["value"]], "value", where, 0, float_only=True)
        if value[:1] != [batch] or value[1:] not in ([], [1]):
            raise BadInput(f"{where}: its {inert(found['value'])} (value) is not [batch, 1]; {checks.FOREIGN_FIX}")
        shapes["value"] = ([b, *value[1:]], "float32")
    spec = Spec("no critic LSTM", obs_shape, action, action_shape, layers, hidden, cell)
    role_of = {name: role for role, name in found.items()}
    io = checks.Interface(
        [(n, *shapes[role_of[n]]) for n in inputs],
        [(n, *shapes[role_of[n]]) for n in outputs],
        foreign=True,
        fix=checks.FOREIGN_FIX,
    )
    return spec, Foreign(found, batch, io)


def _listing(kind: str, values: Mapping[str, Any]) -> str:
    return f"its {kind}s: {', '.join(inert(n) for n in list(values)[:8])}"


def _find(role: str, kind: str, values: Mapping[str, Any], given: Mapping[str, str], where: str) -> str | None:
    """The name of the input or output playing ``role``: the one ``--name`` states, else the one of
    :data:`ROLES`; None for an optional role (c, c_out, value) none plays."""
    if role in given:
        if given[role] not in values:
            raise BadInput(
                f"{FLAG} {role}={inert(given[role])[1:-1]}: {where} has no {kind} of that name "
                f"({_listing(kind, values)})"
            )
        return given[role]
    hits = [n for n in ROLES[role] if n in values and n not in given.values()]
    if len(hits) > 1:
        raise BadInput(
            f"{where}: both its {kind}s {inert(hits[0])} and {inert(hits[1])} could be {role}: state "
            f"which with {FLAG} {role}=NAME"
        )
    if hits:
        return hits[0]
    if role in ("c", "c_out", "value"):
        return None
    names = ", ".join(ROLES[role])
    raise BadInput(
        f"{where} was not exported by lstm-probe, and its graph has no {kind} named {names} "
        f"({_listing(kind, values)}): state which {kind} is {role} with {FLAG} {role}=NAME"
    )


def _shape(v: Any, role: str, where: str, rank: int, float_only: bool) -> list[int | None]:
    """``v``'s dimensions (None: a free one), a tensor of float32 (or int64 where not ``float_only``) of ``rank``
    dimensions (0: any, up to :data:`MAX_DIMS` + 1)."""
    t = v.type.tensor_type
    allowed = (1,) if float_only else (1, 7)
    ok = v.type.HasField("tensor_type") and t.HasField("shape") and t.elem_type in allowed
    dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] if ok else []
    if not ok or not 1 <= len(dims) <= MAX_DIMS + 1 or (rank and len(dims) != rank):
        kind = "float32" if float_only else "float32 or int64"
        raise BadInput(
            f"{where}: its {inert(v.name)} ({role}) is not a {kind} tensor of "
            f"{rank or 'known'} dimensions; state which is {role} with {FLAG} {role}=NAME"
        )
    return dims


def _sizes(
    dims: list[int | None], batch: int | None, role: str, found: Mapping[str, str], where: str, fewest: int = 1
) -> tuple[int, ...]:
    """The sizes after the batch axis (each fixed, within the spec's bounds); the batch axis h's."""
    rest = dims[1:]
    fits = dims[:1] == [batch] and len(rest) >= fewest and all(d is not None and 1 <= d <= MAX_SIZE for d in rest)
    sizes = tuple(d or 0 for d in rest)
    if not fits or math.prod(sizes) > MAX_SIZE:
        raise BadInput(
            f"{where}: its {inert(found[role])} ({role}) is {_shown(dims)}, not [batch, sizes...] with h's "
            f"batch ({'free' if batch is None else batch}) and fixed sizes; state the {role} with {FLAG} {role}=NAME"
        )
    return sizes


def _shown(dims: Sequence[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def step(session: Any, spec: Spec, foreign: Foreign, where: str) -> Step:
    """:data:`Step` of an onnxruntime session of a foreign file: the state zeroed where ``episode_start`` is 1
    (as rsl_rl's ``RNN.reset(dones)`` and Isaac Lab's ``reset_memory`` do), a fixed batch filled up with zeros
    (its rows dropped), each output's shape and type checked; no value output: zeros."""
    n = foreign.names
    ins = [n["obs"], n["h"], *([n["c"]] if spec.cell == "lstm" else [])]
    outs = [n["action"], n["h_out"], *([n["c_out"]] if spec.cell == "lstm" else [])]
    act_dtype = np.dtype(np.float32 if spec.action == "box" else np.int64)

    def run(obs: np.ndarray, start: np.ndarray, state: State) -> tuple[np.ndarray, np.ndarray, State]:
        count = len(obs)
        keep = (1.0 - np.asarray(start, np.float32))[None, :, None]
        state = tuple(np.asarray(s, np.float32) * keep for s in state)
        obs = np.asarray(obs, np.float32)
        size = foreign.batch or max(count, 1)
        actions: list[np.ndarray] = []
        new: list[list[np.ndarray]] = [[] for _ in state]
        for lo in range(0, count, size):
            part = [obs[lo : lo + size], *(s[:, lo : lo + size] for s in state)]
            k = len(part[0])
            if k < size:  # a fixed batch: filled up with zeros
                part[0] = np.concatenate([part[0], np.zeros((size - k, *part[0].shape[1:]), np.float32)])
                part[1:] = [
                    np.concatenate([s, np.zeros((s.shape[0], size - k, s.shape[2]), np.float32)], 1) for s in part[1:]
                ]
            try:
                out = session.run(outs, dict(zip(ins, part, strict=True)))
            except Exception as exc:  # onnxruntime's own exception classes
                raise BadInput(f"{where} fails to run a step: {one_line(exc, kind=False)[:300]}") from None
            want = [((size, *spec.action_shape), act_dtype)] + [
                ((spec.layers, size, spec.hidden), np.dtype(np.float32))
            ] * len(state)
            for got, name, (shape, dtype) in zip(out, outs, want, strict=True):
                if not isinstance(got, np.ndarray) or got.shape != shape or got.dtype != dtype:
                    raise BadInput(f"{where} answers its output {inert(name)} not as {dtype} of shape {list(shape)}")
            actions.append(out[0][:k])
            for i, s in enumerate(out[1:]):
                new[i].append(s[:, :k])
        value = np.zeros((count, 1), np.float32)
        return np.concatenate(actions), value, tuple(np.concatenate(s, 1) for s in new)

    return run
