"""The deploy layer's interface: what a deployed policy takes and returns (:class:`Spec`), one step of it
(:data:`Step`), and what a framework hands the layer for a policy of its own (:class:`Policy`, made by a
:data:`Loader`; sb3's is ``integrations/sb3/deployed.py``, found through ``integrations.deploy_policy``).

:class:`Spec` names the inputs and outputs, with their shapes; it is stored in each exported file's metadata
and read back from it (``lstm-probe replay --policy OUT.onnx``). ``runtime.py`` steps a policy whatever its
form: the PyTorch module, a TorchScript file (``torch.jit.load``) or an ONNX file (onnxruntime).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.errors import BadInput

META_KEY = "lstm_probe.deploy"
"""The metadata key (ONNX ``metadata_props``; TorchScript extra file ``lstm_probe.deploy.json``)."""

State = tuple[np.ndarray, ...]
Step = Callable[[np.ndarray, np.ndarray, State], tuple[np.ndarray, np.ndarray, State]]
"""(obs, episode_start, state) -> (action, value, new state): one step of a batch of envs."""


@dataclass(frozen=True)
class ObsKey:
    """One key of a Dict observation: its name, its subspace ('box', 'discrete', 'multi_discrete' or
    'multi_binary'), its shape in the env, and its slice ``[start, stop)`` of the flat ``obs`` input."""

    key: str
    space: str
    shape: tuple[int, ...]
    start: int
    stop: int


@dataclass(frozen=True)
class Spec:
    """What a deployed policy takes and returns (``batch`` is the number of envs stepped at once)."""

    variant: str
    """'separate' (actor and critic RNNs, each with its state), 'shared' (one LSTM), 'no critic LSTM'."""
    obs_shape: tuple[int, ...]
    action: str
    """'box' (float32 actions, clipped to the bounds) or 'discrete' (int64 actions)."""
    action_shape: tuple[int, ...]
    layers: int
    hidden: int
    cell: str = "lstm"
    """'lstm' (states h and c) or 'gru' (h alone)."""
    choices: int = 0
    """A discrete action's count (``Discrete(choices)``: the indices 0 to choices - 1); 0 where unknown (a box
    action, a file from elsewhere, or one exported before the count was stored)."""
    frame_axes: tuple[int, ...] = ()
    """Where the framework rearranges an env's frames before its policy sees them, the axes that do it:
    ``np.transpose(frame, frame_axes)`` has ``obs_shape`` (sb3 turns a channel-last image env's (H, W, C)
    frames into its policy's (C, H, W): ``(2, 0, 1)``; the loader says so). Export and replay then take the
    env's frames in either layout. () where the policy takes the env's observations as they come (every file
    from elsewhere, and one exported before this was stored)."""
    obs_keys: tuple[ObsKey, ...] = ()
    """A policy of a gymnasium ``Dict`` observation space (sb3's MultiInputLstmPolicy): each key's part of the
    one flat ``obs`` input, in the Dict's order, as ``gymnasium.spaces.flatten(space, obs)`` lays them out (a
    Box's values in C order, a Discrete's one-hot, a MultiDiscrete's one-hots, a MultiBinary's bits);
    ``obs_shape`` is then (total width,). () for every other policy."""

    @property
    def frame_shape(self) -> tuple[int, ...] | None:
        """The env's frame shape that :attr:`frame_axes` rearranges into ``obs_shape``; None without one."""
        if not self.frame_axes:
            return None
        shape = [0] * len(self.obs_shape)
        for i, axis in enumerate(self.frame_axes):
            shape[axis] = self.obs_shape[i]
        return tuple(shape)

    def from_frames(self, frames: np.ndarray) -> np.ndarray:
        """A batch of env frames, (n, *frame_shape), as the policy takes them, (n, *obs_shape)."""
        return np.ascontiguousarray(np.transpose(frames, (0, *(1 + a for a in self.frame_axes))))

    @property
    def critic_state(self) -> bool:
        return self.variant == "separate"

    @property
    def state_names(self) -> list[str]:
        own = ["h", "c"] if self.cell == "lstm" else ["h"]
        return [*own, *(f"{n}_critic" for n in own)] if self.critic_state else own

    def inputs(self) -> list[tuple[str, list[Any], str]]:
        """(name, shape, dtype) of each input, in order."""
        state = [self.layers, "batch", self.hidden]
        return [
            ("obs", ["batch", *self.obs_shape], "float32"),
            ("episode_start", ["batch"], "float32"),
            *((n, state, "float32") for n in self.state_names),
        ]

    def outputs(self) -> list[tuple[str, list[Any], str]]:
        """(name, shape, dtype) of each output, in order: the new states are the inputs' names + ``_out``."""
        state = [self.layers, "batch", self.hidden]
        act = ("action", ["batch", *self.action_shape], "float32" if self.action == "box" else "int64")
        return [act, ("value", ["batch", 1], "float32"), *((f"{n}_out", state, "float32") for n in self.state_names)]

    def zero_state(self, batch: int = 1) -> State:
        return tuple(np.zeros((self.layers, batch, self.hidden), np.float32) for _ in self.state_names)

    def example(self, batch: int = 2) -> tuple[torch.Tensor, ...]:
        """Inputs for tracing a :attr:`Policy.module`: zeros, episode starts on."""
        obs = torch.zeros((batch, *self.obs_shape))
        state = (torch.zeros(self.layers, batch, self.hidden) for _ in self.state_names)
        return (obs, torch.ones(batch), *state)

    def to_json(self, **extra: Any) -> str:
        own = asdict(self)
        if not self.obs_keys:  # (every other policy's metadata: as before)
            del own["obs_keys"]
        doc = {
            **own,
            "inputs": [dict(zip(("name", "shape", "dtype"), i, strict=True)) for i in self.inputs()],
            "outputs": [dict(zip(("name", "shape", "dtype"), o, strict=True)) for o in self.outputs()],
            **extra,
        }
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str, where: str) -> Spec:
        """The spec a file's metadata states, each field checked (a file from elsewhere can state anything: a
        hidden size of 2^28, a million layers, -1): what a spec lstm-probe writes holds, within
        :data:`MAX_LAYERS`, :data:`MAX_HIDDEN`, :data:`MAX_DIMS` and :data:`MAX_SIZE`; BadInput otherwise."""
        if len(text) > MAX_METADATA:
            raise BadInput(f"{where}: its {META_KEY} metadata is {len(text):,} characters, not lstm-probe's (a few KB)")
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict):
            raise BadInput(f"{where}: its {META_KEY} metadata is not lstm-probe's (not a JSON object); export it again")
        variant, action = doc.get("variant"), doc.get("action")
        if variant not in VARIANTS or action not in ("box", "discrete"):
            raise BadInput(
                f"{where}: its {META_KEY} metadata states the variant {str(variant)[:40]!r} and action "
                f"{str(action)[:40]!r}, not one lstm-probe writes; export it again"
            )
        obs = _dims(doc.get("obs_shape"), "obs_shape", where, 1)
        act = _dims(doc.get("action_shape"), "action_shape", where, 0)
        if action == "discrete" and act:
            raise BadInput(
                f"{where}: its {META_KEY} metadata states a discrete action of shape {list(act)}; export it again"
            )
        layers = _count(doc.get("layers"), "layers", where, MAX_LAYERS)
        hidden = _count(doc.get("hidden"), "hidden", where, MAX_HIDDEN)
        cell = doc.get("cell", "lstm")  # files written before GRUs were exported state none
        if cell not in CELLS:
            raise BadInput(f"{where}: its {META_KEY} metadata states the cell {str(cell)[:40]!r}; export it again")
        choices = doc.get("choices", 0)  # files written before the count was stored state none
        choices = 0 if choices == 0 and not isinstance(choices, bool) else _count(choices, "choices", where, MAX_SIZE)
        axes = doc.get("frame_axes", [])  # files written before frame_axes was stored state none
        if not isinstance(axes, list) or (axes and not _permutation(axes, len(obs))):
            raise BadInput(
                f"{where}: its {META_KEY} metadata states frame_axes {str(axes)[:60]}, not a permutation of the "
                f"obs_shape's {len(obs)} axes; export it again"
            )
        named, normalized = doc.get("framework", ""), doc.get("normalized", False)  # either absent from old files
        if not isinstance(named, str) or not re.fullmatch(r"[a-z0-9_]{0,40}", named):
            raise BadInput(f"{where}: its {META_KEY} metadata states the framework {_shown(named)}; export it again")
        if not isinstance(normalized, bool):
            raise BadInput(
                f"{where}: its {META_KEY} metadata states normalized {_shown(normalized)}, not true or false; export "
                "it again"
            )
        keys = _obs_keys(doc.get("obs_keys", []), obs, where)  # files written before Dict policies state none
        frame = tuple(int(a) for a in axes)
        return cls(str(variant), obs, str(action), act, layers, hidden, str(cell), choices, frame, keys)


VARIANTS = ("separate", "shared", "no critic LSTM")
CELLS = ("lstm", "gru")
MAX_METADATA = 1 << 20
"""Longest metadata document read (lstm-probe writes ~1 KB)."""
MAX_KEYS = 256
"""Most keys of a Dict observation a spec may state."""
MAX_KEY_NAME = 200
"""Longest key name a spec may state."""
KEY_SPACES = ("box", "discrete", "multi_discrete", "multi_binary")
MAX_LAYERS = 1024
"""Most LSTM layers a spec may state (the model.zip reader's bound on n_lstm_layers)."""
MAX_HIDDEN = 1 << 16
"""Widest LSTM a spec may state (the log reader's bound on h and c vectors)."""
MAX_DIMS = 32
"""Most dimensions of an observation or action."""
MAX_SIZE = 1 << 24
"""Most values in one observation or action (16,777,216: an 84 x 84 x 4 Atari frame holds 28,224)."""


def _shown(value: Any) -> str:
    """A metadata value in a message: its repr, cut to 40 characters (control characters escaped)."""
    return repr(value)[:40]


def _count(value: Any, name: str, where: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise BadInput(
            f"{where}: its {META_KEY} metadata states {name} {str(value)[:40]}, not an integer from 1 to {most:,}; "
            "export it again"
        )
    return value


def _obs_keys(value: Any, obs: tuple[int, ...], where: str) -> tuple[ObsKey, ...]:
    """A Dict policy's keys as its metadata states them: at most :data:`MAX_KEYS`, each a short name, a known
    subspace, a shape, and a slice that begins where the last ended; together they cover the flat ``obs``."""
    if value == []:
        return ()
    fix = "export it again"
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_KEYS or len(obs) != 1:
        raise BadInput(
            f"{where}: its {META_KEY} metadata states obs_keys {str(value)[:60]}, not up to {MAX_KEYS} keys of "
            f"a flat obs; {fix}"
        )
    keys, start = [], 0
    for item in value:
        ok = isinstance(item, dict) and isinstance(item.get("key"), str) and 0 < len(item["key"]) <= MAX_KEY_NAME
        if not ok or item.get("space") not in KEY_SPACES or item.get("start") != start:
            raise BadInput(f"{where}: its {META_KEY} metadata states the obs key {str(item)[:80]}; {fix}")
        shape = _dims(item.get("shape"), "an obs key's shape", where, 0)
        stop = item.get("stop")
        if isinstance(stop, bool) or not isinstance(stop, int) or not start < stop <= obs[0]:
            raise BadInput(f"{where}: its {META_KEY} metadata states the obs key {str(item)[:80]}; {fix}")
        keys.append(ObsKey(item["key"], item["space"], shape, start, stop))
        start = stop
    if start != obs[0] or len({k.key for k in keys}) != len(keys):
        raise BadInput(
            f"{where}: its {META_KEY} metadata states obs keys covering {start} of the obs's {obs[0]} values (or "
            f"a key twice); {fix}"
        )
    return tuple(keys)


def _permutation(axes: list[Any], n: int) -> bool:
    """Whether ``axes`` (JSON) is a permutation of 0..n-1."""
    return len(axes) == n and all(type(a) is int for a in axes) and sorted(axes) == list(range(n))


def _dims(value: Any, name: str, where: str, fewest: int) -> tuple[int, ...]:
    if not isinstance(value, list) or not fewest <= len(value) <= MAX_DIMS:
        raise BadInput(
            f"{where}: its {META_KEY} metadata states {name} {str(value)[:60]}, not a shape; export it again"
        )
    dims = tuple(_count(d, name, where, MAX_SIZE) for d in value)
    if math.prod(dims) > MAX_SIZE:
        raise BadInput(
            f"{where}: its {META_KEY} metadata states {name} {list(dims)}, over {MAX_SIZE:,} values; export it again"
        )
    return dims


@dataclass(frozen=True)
class Policy:
    """A framework's policy as the deploy layer takes it: all that export and replay need of the framework."""

    spec: Spec
    module: nn.Module
    """One step with the LSTM state explicit: ``forward(obs, episode_start, *state) -> (action, value,
    *new_state)``, the states in ``spec.state_names``' order (shapes: ``spec.inputs()``, ``spec.outputs()``).
    A private copy of the policy's parts, on the CPU, in eval mode, without gradients: the exporters trace
    it (``torch.onnx.export``, ``torch.jit.trace``) and replay runs it (and a float16-rounded deep copy)."""
    reference: Step
    """The framework's own step of the same policy (its own forward, deterministic): what export verifies
    the written file against."""
    framework: str = ""
    """The framework's name (``integrations.FRAMEWORKS``), set by ``integrations.deploy_policy``; stored in an
    exported file's metadata (``replay`` tells from it whether ``--vecnormalize``, sb3's, applies)."""
    notes: tuple[str, ...] = ()
    """What the loader read of the model that a user of the exported file must know (sb3: trained under
    VecNormalize, so the file takes normalized observations); ``export`` says each."""
    normalized: bool = False
    """The framework normalised the observations outside the policy while it trained (sb3's VecNormalize): the
    file takes them normalized and does not normalise them itself. Stored in an exported file's metadata
    (``normalized``); ``replay`` without the statistics says what that means for its verdict."""


Loader = Callable[[Any, bool, str | None], Policy]
"""A framework's ``(model, trust_model, env_id) -> Policy``: ``model`` is a model object or the path of a
saved model (read without running its code unless ``trust_model``); ``env_id``: the env whose spaces a
saved model's reader may take. Named by its framework's ``integrations.FRAMEWORKS`` entry (``deploy``)."""
