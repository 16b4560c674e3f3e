"""The settings of a saved RecurrentPPO model.zip, read as plain data and sized before anything is built.

:mod:`model_zip` reads the zip within its bounds; this module turns its ``data`` JSON into a :class:`Plan` (the
policy class by name, ``policy_kwargs``, the spaces from the plain-text fields SB3 writes beside each pickled
one, the hyperparameters), counts in exact integer arithmetic what the network it describes takes
(:func:`needs`: features extractor, LSTMs, net_arch, action net, rollout buffer), and builds the model from
the plan and checked weights (:func:`build_model`). Whatever it cannot read as plain data raises :class:`Unsafe`,
which :mod:`model_zip` turns into its one-line refusal. It imports nothing of :mod:`model_zip`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from lstm_probe.errors import BadInput

MAX_COUNT = 1 << 20
"""Largest integer accepted in the settings that size what gets allocated (n_steps, batch_size,
layer widths in policy_kwargs): built before the weights can be checked against them."""
MAX_LAYERS = 1024
"""Most layers in net_arch (pi and vf each) and in n_lstm_layers (each is a module of its own)."""
MAX_DIMS = 32
"""Most dimensions in a space's shape."""
MAX_TEXT = 1 << 20
"""Longest printed array (a Box's bounds, a MultiDiscrete's nvec) parsed: numpy prints at most 1,000
numbers in full (more are summarised with ``...``, which is refused)."""

FLOAT = 4
"""Bytes per parameter (float32, as SB3 builds every policy)."""
HELD = 6
"""Copies of the parameters counted for reading and analysing a model: the built policy; the state dict
loaded from policy.pth, or orthogonal init's scratch; ``arch``'s private copy of the policy; its gradients.
Measured: ``lstm-probe arch`` on zips of 8.6 M to 34 M parameters peaks at 3.0 to 4.7 times their float32
bytes above the interpreter's ~350 MB."""
PER_TENSOR = 4096
"""Bytes counted for each parameter tensor besides its data (module and tensor objects, zip framing)."""
PTH_FRAMING = 1 << 20
"""Bytes of policy.pth beyond the tensors' data (torch's zip records, pickle, names): SB3's are ~10 KB."""

POLICY_MODULE = "sb3_contrib.common.recurrent.policies"
POLICIES = ("RecurrentActorCriticPolicy", "RecurrentActorCriticCnnPolicy", "RecurrentMultiInputActorCriticPolicy")
"""The policies sb3-contrib's ``ppo_recurrent.py:RecurrentPPO.policy_aliases`` names (Mlp/Cnn/MultiInput)."""
_EXTRACTOR = dict(zip(POLICIES, ("FlattenExtractor", "NatureCNN", "CombinedExtractor"), strict=True))
"""Each policy's default ``features_extractor_class``."""
_ALIASES = {"MlpLstmPolicy": POLICIES[0], "CnnLstmPolicy": POLICIES[1], "MultiInputLstmPolicy": POLICIES[2]}

HYPERPARAMETERS = {
    "n_steps": int,
    "batch_size": int,
    "n_epochs": int,
    "gamma": float,
    "gae_lambda": float,
    "ent_coef": float,
    "vf_coef": float,
    "max_grad_norm": float,
    "normalize_advantage": bool,
    "use_sde": bool,
    "sde_sample_freq": int,
}
"""Plain-JSON fields of ``data`` passed to ``RecurrentPPO(...)`` when present with that type."""

_CLASSES: dict[str, tuple[str, str]] = {
    "activation_fn": ("torch.nn.modules.activation.", "torch.nn"),
    "optimizer_class": ("torch.optim.", "torch.optim"),
    "features_extractor_class": ("stable_baselines3.common.torch_layers.", "stable_baselines3.common.torch_layers"),
}
"""policy_kwargs entries that may name a class: the printed module prefix, and where it is looked up."""
_ALLOWED = {
    "activation_fn": {"ReLU", "Tanh", "ELU", "LeakyReLU", "GELU", "SiLU", "Sigmoid", "Softplus", "Mish", "Identity"},
    "optimizer_class": {"Adam", "AdamW", "SGD", "RMSprop"},
    "features_extractor_class": {"FlattenExtractor", "NatureCNN", "CombinedExtractor"},
}
_LSTM_KWARGS = {"bias", "dropout", "bidirectional", "proj_size", "batch_first"}
"""lstm_kwargs this reader sizes (``nn.LSTM``'s others, device and dtype, are refused)."""


class Unsafe(Exception):
    """What the zip does not state as plain data; the caller turns it into the one-line refusal."""


def first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:120] if str(exc) else ""
    return text or type(exc).__name__


# -- the settings, sized before anything is built ---------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """A space as sizes only (no array): what :func:`needs` counts. Made from the zip's text
    (:func:`_shape_of_text`) or from a gymnasium space (:func:`shape_of`)."""

    kind: str
    """Box, Discrete, MultiDiscrete, MultiBinary, Dict (or another gymnasium space's class name)."""
    shape: tuple[int, ...]
    itemsize: int
    flat: int
    """Features a FlattenExtractor gives (gymnasium's flatdim; SB3's sum(nvec) for MultiDiscrete)."""
    actions: int
    """SB3's action dim (rollout buffer columns)."""
    logits: int
    """Outputs of the action net (Box: its size; Discrete: n; MultiDiscrete: sum(nvec); MultiBinary: n)."""
    image: bool = False
    """SB3's ``is_image_space`` (CombinedExtractor puts a NatureCNN on it)."""
    parts: tuple[tuple[str, Shape], ...] = ()
    text: str = ""
    """How messages name it, e.g. ``Box(20000, 20000)``."""

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def stored(self) -> int:
        """Bytes one observation of it takes in the rollout buffer."""
        if self.parts:
            return sum(p.stored() for _, p in self.parts)
        return max(1, self.size) * self.itemsize


def _dim(value: Any, what: str, *, text: bool = False) -> int:
    """A size of at least 1: a JSON integer (or, with ``text``, one printed as text)."""
    if isinstance(value, bool) or not isinstance(value, int | str) or (isinstance(value, str) and not text):
        raise Unsafe(f"its {what} is not stated as an integer")
    try:
        n = int(value)
    except ValueError:
        raise Unsafe(f"its {what} is not stated as an integer") from None
    if n < 1:
        raise Unsafe(f"its {what} is out of range ({n:,})")
    return n


def _ints(text: Any, what: str) -> list[int]:
    """A 1-D integer array printed by numpy (``[2 3 4]``)."""
    text = str(text)
    if "..." in text or len(text) > MAX_TEXT:
        raise Unsafe(f"its {what} is not stated in full as text")
    return [_dim(t, what, text=True) for t in text.strip("[]").split()]


def _shape_of_text(entry: Any, what: str) -> Shape:
    """The sizes of a space stated in the text SB3 writes beside its pickle, checked before any array is
    made (see :func:`_space`)."""
    if not isinstance(entry, dict):
        raise Unsafe(f"its {what} is not stated")
    kind = entry.get(":type:")
    try:
        if kind == "<class 'gymnasium.spaces.box.Box'>":
            dims = entry["_shape"]
            if not isinstance(dims, list) or len(dims) > MAX_DIMS:
                raise Unsafe(f"its {what}'s shape is not a list of at most {MAX_DIMS} dimensions")
            shape = tuple(_dim(d, f"{what}'s shape") for d in dims)
            dtype = np.dtype(str(entry["dtype"]))
            if dtype.kind not in "biuf" or dtype.itemsize > 8:
                raise Unsafe(f"its {what}'s dtype {dtype} is not a number type")
            size = math.prod(shape)
            return Shape("Box", shape, dtype.itemsize, size, size, size, text=f"Box{shape}")
        if kind == "<class 'gymnasium.spaces.discrete.Discrete'>":
            n = _dim(entry["n"], f"{what}'s n", text=True)
            return Shape("Discrete", (), 8, n, 1, n, text=f"Discrete({n:,})")
        if kind == "<class 'gymnasium.spaces.multi_discrete.MultiDiscrete'>":
            nvec = _ints(entry["nvec"], f"{what}'s nvec")
            total = sum(nvec)
            return Shape(
                "MultiDiscrete", (len(nvec),), 8, total, len(nvec), total, text=f"MultiDiscrete(sum {total:,})"
            )
        if kind == "<class 'gymnasium.spaces.multi_binary.MultiBinary'>":
            n = _dim(entry["n"], f"{what}'s n", text=True)
            return Shape("MultiBinary", (n,), 1, n, n, n, text=f"MultiBinary({n:,})")
    except (KeyError, TypeError, ValueError) as exc:
        raise Unsafe(f"its {what} is not stated in plain text ({type(exc).__name__})") from None
    raise Unsafe(f"its {what} ({str(kind)[:60]}) is not stated in plain text (--env ENV_ID takes it from an env)")


def shape_of(space: Any) -> Shape:
    """The sizes of a gymnasium space (an env's: its arrays exist already)."""
    from gymnasium import spaces
    from stable_baselines3.common.preprocessing import get_action_dim, get_flattened_obs_dim, is_image_space

    name = type(space).__name__
    if isinstance(space, spaces.Dict):
        parts = tuple((str(k), shape_of(s)) for k, s in space.spaces.items())
        flat = sum(p.flat for _, p in parts)
        return Shape("Dict", (), 0, flat, 0, 0, parts=parts, text=f"Dict({', '.join(k for k, _ in parts)[:60]})")
    shape = tuple(int(d) for d in (space.shape or ()))
    itemsize = int(np.dtype(space.dtype).itemsize) if getattr(space, "dtype", None) is not None else 8
    try:
        flat = int(get_flattened_obs_dim(space))
    except Exception:
        flat = math.prod(shape)
    try:
        actions = int(get_action_dim(space))
    except Exception:
        actions = math.prod(shape)
    logits = {
        "Discrete": int(getattr(space, "n", 1)),
        "MultiDiscrete": int(np.sum(getattr(space, "nvec", 0))),
    }.get(name, math.prod(shape))
    image = isinstance(space, spaces.Box) and is_image_space(space, check_channels=False)
    return Shape(name, shape, itemsize, flat, actions, logits, image=image, text=f"{name}{shape}")


@dataclass
class Plan:
    """What the zip's plain settings will build, checked but not yet built."""

    policy: type
    kwargs: dict[str, Any]
    policy_kwargs: dict[str, Any]
    obs: Shape
    act: Shape
    n_envs: int
    data: dict[str, Any]
    with_env: bool
    params: int = 0
    """Parameters of the policy the settings describe (set by :func:`needs`)."""
    pth_bytes: int = 0
    """The most bytes policy.pth may take: the network's weights and torch's framing."""


def make_plan(data: dict[str, Any], env: Any) -> Plan:
    """The policy class, hyperparameters and sizes the zip states, each checked (:class:`Unsafe`)."""
    policy = _policy_class(data.get("policy_class"))
    kwargs: dict[str, Any] = {k: data[k] for k, t in HYPERPARAMETERS.items() if isinstance(data.get(k), t)}
    if any(not 0 < kwargs.get(k, 1) <= MAX_COUNT for k in ("n_steps", "batch_size", "n_epochs")):
        raise Unsafe(f"its n_steps, batch_size or n_epochs is out of range (1..{MAX_COUNT:,})")
    for key, alt in (("clip_range", "clip_range"), ("learning_rate", "lr_schedule")):
        value = _constant(data.get(key))
        value = _constant(data.get(alt)) if value is None else value
        if value is not None:
            kwargs[key] = value
    policy_kwargs = _policy_kwargs(data.get("policy_kwargs"))
    if env is None:
        obs = _shape_of_text(data.get("observation_space"), "observation space")
        act = _shape_of_text(data.get("action_space"), "action space")
        n_envs = data.get("n_envs", 1)
        n_steps = kwargs.get("n_steps", 128)
        if not isinstance(n_envs, int) or isinstance(n_envs, bool) or not 0 < n_envs * n_steps <= MAX_COUNT:
            raise Unsafe(f"its n_envs * n_steps is out of range (1..{MAX_COUNT:,})")
    else:
        obs, act, n_envs = shape_of(env.observation_space), shape_of(env.action_space), int(env.num_envs)
        for what, given, key in (("observation", obs, "observation_space"), ("action", act, "action_space")):
            try:
                stated = _shape_of_text(data.get(key), what)
            except Unsafe:
                continue  # not stated in plain text: the env's space, checked by the weights below
            if stated.shape != given.shape or stated.kind != given.kind:
                raise BadInput(
                    f"the env's {what} space {given.text} differs from the model's {stated.text}; pass the env "
                    "the policy was trained on (where a VecEnv wrapper such as VecFrameStack made its space, leave "
                    "--env out: export verifies on --log LOG of a run with --capture-obs, or --synthetic)"
                )
    return Plan(policy, kwargs, policy_kwargs, obs, act, n_envs, data, env is not None)


def _widths(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_LAYERS:
        raise Unsafe(f"its {what} is not a list of at most {MAX_LAYERS:,} layer widths")
    return [_dim(w, what) for w in value]


def _net_arch(value: Any, cnn: bool) -> tuple[list[int], list[int]]:
    """net_arch as MlpExtractor reads it (``torch_layers.py``): pi and vf layer widths."""
    if value is None:
        return ([], []) if cnn else ([64, 64], [64, 64])
    if isinstance(value, list) and value and isinstance(value[0], dict):
        value = value[0]  # SB3 < 1.8's [dict(pi=..., vf=...)], still read (with a warning)
    if isinstance(value, dict):
        return _widths(value.get("pi", []), "net_arch pi"), _widths(value.get("vf", []), "net_arch vf")
    both = _widths(value, "net_arch")
    return both, both


def _lstm(inputs: int, hidden: int, layers: int, kw: dict[str, Any]) -> tuple[int, int, int]:
    """Parameters of ``nn.LSTM(inputs, hidden, layers, **kw)``: those fed by the input, the rest, tensors."""
    bias = kw.get("bias", True) is not False
    dirs = 2 if kw.get("bidirectional") else 1
    proj = kw.get("proj_size") or 0
    if isinstance(proj, bool) or not isinstance(proj, int) or not 0 <= proj < hidden:
        raise Unsafe("its lstm_kwargs proj_size is out of range")
    out = proj or hidden
    first = dirs * 4 * hidden * inputs
    rest = 0
    for layer in range(layers):
        rest += dirs * (4 * hidden * out + (8 * hidden if bias else 0) + proj * hidden)
        if layer:
            rest += dirs * 4 * hidden * out * dirs
    tensors = layers * dirs * (2 + 2 * bias + (proj > 0))
    return first, rest, tensors


def _nature(obs: Shape, features: int) -> tuple[int, int, int]:
    """NatureCNN on ``obs`` (C, H, W) with ``features`` outputs: parameters, the bytes its shape-finding
    forward pass holds (a sampled observation, as float64 scratch and float32, and each conv's output and
    unfolded input), the largest weight matrix (orthogonal init's scratch)."""
    if len(obs.shape) != 3:
        return 0, 0, 0  # SB3's NatureCNN refuses it (is_image_space) before building anything
    c, h, w = obs.shape
    sizes = [(h, w)]
    for k, s in ((8, 4), (4, 2), (3, 1)):
        h, w = (h - k) // s + 1, (w - k) // s + 1
        if h < 1 or w < 1:
            raise Unsafe(f"its observation space {obs.text} is too small for NatureCNN's 8x8, 4x4 and 3x3 convolutions")
        sizes.append((h, w))
    flat = 64 * h * w
    params = (c * 64 * 32 + 32) + (32 * 16 * 64 + 64) + (64 * 9 * 64 + 64) + flat * features + features
    (h1, w1), (h2, w2) = sizes[1], sizes[2]
    unfolded = 64 * c * h1 * w1 + 16 * 32 * h2 * w2 + 9 * 64 * h * w
    forward = obs.size * (48 + FLOAT) + FLOAT * (32 * h1 * w1 + 64 * h2 * w2 + flat + unfolded)
    return params, forward, flat * features


def needs(plan: Plan) -> list[tuple[int, str]]:
    """The bytes reading and analysing the model will hold, in parts, each with the settings that make it
    (for the refusal to name); sets ``plan.params`` and ``plan.pth_bytes``. Exact integer arithmetic, nothing allocated.

    Counted: the spaces' arrays (text-stated Box bounds), the features extractor, the actor's and critic's
    LSTMs, net_arch, the action and value nets (parameters times :data:`HELD` copies, plus
    :data:`PER_TENSOR` each), orthogonal init's scratch for the largest matrix, NatureCNN's shape-finding
    forward pass, and the rollout buffer ``_setup_model`` allocates (three times with an env: ``arch``
    copies it and its minibatch)."""
    pk = plan.policy_kwargs
    hidden = _dim(pk.get("lstm_hidden_size", 256), "lstm_hidden_size")
    layers = _dim(pk.get("n_lstm_layers", 1), "n_lstm_layers")
    if layers > MAX_LAYERS:
        raise Unsafe(f"its n_lstm_layers is over {MAX_LAYERS:,}")
    lstm_kwargs = pk.get("lstm_kwargs") or {}
    if not isinstance(lstm_kwargs, dict) or set(lstm_kwargs) - _LSTM_KWARGS:
        raise Unsafe(f"its lstm_kwargs hold more than {', '.join(sorted(_LSTM_KWARGS))}")
    extractor = pk.get("features_extractor_class", _EXTRACTOR[plan.policy.__name__])
    extractor = getattr(extractor, "__name__", extractor)
    if extractor not in _ALLOWED["features_extractor_class"]:
        raise Unsafe("its features_extractor_class is not one of SB3's own")
    fkw = pk.get("features_extractor_kwargs") or {}
    if not isinstance(fkw, dict):
        raise Unsafe("its features_extractor_kwargs are not a dict")
    obs, act = plan.obs, plan.act

    # the features extractor: parameters, features, forward scratch, largest matrix
    ex_params, ex_forward, ex_largest, features = 0, 0, 0, obs.flat
    if extractor == "NatureCNN":
        features = _dim(fkw.get("features_dim", 512), "features_extractor_kwargs features_dim")
        ex_params, ex_forward, ex_largest = _nature(obs, features)
    elif extractor == "CombinedExtractor":
        cnn_out = _dim(fkw.get("cnn_output_dim", 256), "features_extractor_kwargs cnn_output_dim")
        normalized = fkw.get("normalized_image", False) is True  # then any 3-D Box is an image (is_image_space)
        features = 0
        for _, part in obs.parts or (("", obs),):
            if part.image or (normalized and part.kind == "Box" and len(part.shape) == 3):
                p, f, m = _nature(part, cnn_out)
                ex_params, ex_forward, ex_largest = ex_params + p, max(ex_forward, f), max(ex_largest, m)
                features += cnn_out
            else:
                features += part.flat
    copies = 1 if pk.get("share_features_extractor", True) is not False else 2
    ex_params *= copies

    first, rest, lstm_tensors = _lstm(features, hidden, layers, lstm_kwargs)
    lstms = 2 if pk.get("enable_critic_lstm", True) is not False else 1
    critic = features * hidden + hidden if lstms == 1 and not pk.get("shared_lstm", False) else 0

    pi, vf = _net_arch(pk.get("net_arch"), extractor == "NatureCNN")
    mlp, largest, dims = 0, ex_largest, 0
    for widths in (pi, vf):
        last = hidden
        for w in widths:
            mlp += last * w + w
            largest, dims = max(largest, last * w), max(dims, min(last, w))
            last = w
    latent_pi, latent_vf = (pi or [hidden])[-1], (vf or [hidden])[-1]
    head = latent_pi * act.logits + act.logits + latent_vf + 1
    if act.kind == "Box":  # log_std: (action_dim,), or (latent, action_dim) with gSDE's full_std
        sde = plan.kwargs.get("use_sde", False)
        head += (latent_pi * (act.logits if pk.get("full_std", True) is not False else 1)) if sde else act.logits
    largest, dims = max(largest, latent_pi * act.logits), max(dims, min(latent_pi, act.logits))

    tensors = lstms * lstm_tensors + 4 * (len(pi) + len(vf)) + 8 + (16 if ex_params else 0)
    params = {
        f"the observation space {obs.text} ({features:,} features into the LSTM)": ex_params + lstms * first + critic,
        f"lstm_hidden_size {hidden:,} x n_lstm_layers {layers}": lstms * rest,
        f"net_arch {_short(pi, vf)}": mlp,
        f"the action space {act.text}": head,
    }
    plan.params = sum(params.values())
    plan.pth_bytes = FLOAT * plan.params + PTH_FRAMING + 1024 * tensors
    parts = [(HELD * FLOAT * n, what) for what, n in params.items()]
    ortho = FLOAT * (2 * largest + dims * dims) if pk.get("ortho_init", True) is not False else 0
    parts.append((ortho + ex_forward + PER_TENSOR * tensors, "orthogonal init and the features extractor's scratch"))
    if not plan.with_env and obs.kind == "Box":  # the bounds' arrays, parsed from text and in the Box
        parts.append((obs.size * (16 + 4 * obs.itemsize), f"the observation space {obs.text}'s bounds"))
    if not plan.with_env and act.kind == "Box":
        parts.append((act.size * (16 + 4 * act.itemsize), f"the action space {act.text}'s bounds"))
    steps = plan.kwargs.get("n_steps", 128) * plan.n_envs
    row = obs.stored() + act.actions * act.itemsize + 6 * 4 + 4 * layers * hidden * 4
    held = 3 if plan.with_env else 1
    parts.append((held * steps * row, f"the rollout buffer (n_steps x n_envs {steps:,} rows of {row:,} bytes)"))
    return parts


def _short(pi: list[int], vf: list[int]) -> str:
    def one(w: list[int]) -> str:
        return str(w) if len(w) <= 4 else f"[{w[0]}, {w[1]}, ... {len(w)} layers]"

    return one(pi) if pi == vf else f"pi {one(pi)} vf {one(vf)}"


# -- the settings as SB3 objects --------------------------------------------------------------------------
def _policy_class(entry: Any) -> type:
    from sb3_contrib.common.recurrent import policies

    if isinstance(entry, str) and entry in _ALIASES:
        cls: type = getattr(policies, _ALIASES[entry])
        return cls
    if not isinstance(entry, dict) or entry.get("__module__") != POLICY_MODULE:
        raise Unsafe("its policy class is not one of sb3-contrib's recurrent policies")
    # SB3 prints the class's own functions beside the pickle: "<function NAME.__init__ at 0x...>"
    m = re.fullmatch(r"<function (\w+)\.__init__ at 0x[0-9a-f]+>", str(entry.get("__init__", "")))
    if m is None or m.group(1) not in POLICIES:
        raise Unsafe("its policy class is not one of sb3-contrib's recurrent policies")
    cls = getattr(policies, m.group(1))
    return cls


def _policy_kwargs(entry: Any) -> dict[str, Any]:
    if entry is None:
        return {}
    if isinstance(entry, dict) and ":serialized:" not in entry:
        return _sized(dict(entry))
    if not isinstance(entry, dict) or entry.get(":type:") != "<class 'dict'>":
        raise Unsafe("its policy_kwargs are not a dict")
    import importlib

    out: dict[str, Any] = {}
    for key, value in entry.items():
        if key.startswith(":"):
            continue
        prefix, where = _CLASSES.get(key, ("", ""))
        m = re.fullmatch(r"<class '([\w.]+)\.(\w+)'>", value) if isinstance(value, str) and prefix else None
        if m and (m.group(1) + ".").startswith(prefix) and m.group(2) in _ALLOWED[key]:
            out[key] = getattr(importlib.import_module(where), m.group(2))
        elif isinstance(value, str) and value.startswith("<"):
            raise Unsafe(f"its policy_kwargs[{key!r}] is a pickled object ({value[:80]})")
        else:
            out[key] = value
    return _sized(out)


def _sized(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` when no integer in it (net_arch widths, lstm_hidden_size...) is out of range."""
    stack: list[Any] = [kwargs]
    while stack:
        v = stack.pop()
        if isinstance(v, dict | list):
            stack.extend(v.values() if isinstance(v, dict) else v)
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_COUNT:
            raise Unsafe(f"its policy_kwargs hold a size out of range ({v:,})")
    return kwargs


def _floats(text: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray | float:
    """An array printed by numpy (``str(arr)``), or the one number it is when every element is equal."""
    if not isinstance(text, str) or "..." in text or len(text) > MAX_TEXT:
        raise Unsafe("its spaces are not stated in full as text")
    tokens = text.replace("[", " ").replace("]", " ").split()
    try:
        values = np.array([float(t) for t in tokens])
    except ValueError:
        raise Unsafe("its spaces are not stated as numbers") from None
    if values.size == 1:
        return float(values[0])  # gymnasium's Box fills its shape with it
    if values.size != math.prod(shape):
        raise Unsafe("its space bounds do not match its shape")
    return values.reshape(shape).astype(dtype)


def _bound(entry: dict[str, Any], name: str, what: str) -> Any:
    """A Box bound's text: gymnasium's short form (``low_repr``: one number when all are equal) where the
    zip states it; else the array as numpy prints it. gymnasium < 1.3 writes ``low_repr`` at construction;
    1.3 and newer write it as null until the space is printed (``Box.__repr__`` fills it). A Box of over
    1,000 numbers (an image) whose bounds differ (any version), or any such Box (1.3+), is stated only as
    numpy's summary ('...'): refused, naming ``--env``."""
    short = entry.get(f"{name}_repr")
    text = short if isinstance(short, str) else entry.get(name)
    if isinstance(text, str) and "..." in text:
        raise Unsafe(
            f"its {what}'s bounds are stated in part only (a large Box is saved as numpy's summary where its "
            "bounds differ or gymnasium is 1.3 or newer): pass --env ENV_ID to take the spaces from the env"
        )
    return text


def _space(entry: Any, what: str) -> Any:
    """A gymnasium space from the plain text SB3 writes beside its pickle (Box, Discrete,
    MultiDiscrete, MultiBinary); its sizes checked first (:func:`_shape_of_text`)."""
    from gymnasium import spaces

    sized = _shape_of_text(entry, what)
    try:
        if sized.kind == "Box":
            dtype = np.dtype(str(entry["dtype"]))
            low = _floats(_bound(entry, "low", what), sized.shape, dtype)
            high = _floats(_bound(entry, "high", what), sized.shape, dtype)
            return spaces.Box(low, high, sized.shape, dtype)  # type: ignore[arg-type]
        if sized.kind == "Discrete":
            return spaces.Discrete(int(entry["n"]), start=int(entry.get("start", 0)))
        if sized.kind == "MultiDiscrete":
            nvec = _ints(entry["nvec"], f"{what}'s nvec")
            text = str(entry.get("start", ""))
            if len(text) > MAX_TEXT:
                raise Unsafe(f"its {what}'s start is not stated in full as text")
            start = [int(x) for x in text.strip("[]").split()] or None
            return spaces.MultiDiscrete(nvec, start=start)
        return spaces.MultiBinary(int(entry["n"]))
    except (KeyError, TypeError, ValueError, AssertionError, OverflowError) as exc:
        raise Unsafe(f"its {what} is not stated in plain text ({type(exc).__name__})") from None


def _constant(entry: Any) -> float | None:
    """A schedule's value when plain JSON or SB3's ``ConstantSchedule(val=...)``; else None."""
    if isinstance(entry, int | float) and not isinstance(entry, bool):
        return float(entry)
    text = entry.get("value_schedule") if isinstance(entry, dict) else None
    m = re.fullmatch(r"ConstantSchedule\(val=([-+0-9.eE]+)\)", str(text)[:100])
    return float(m.group(1)) if m else None


def build_model(plan: Plan, state: dict[str, Any], env: Any) -> Any:
    from sb3_contrib import RecurrentPPO

    if env is None:
        obs = _space(plan.data.get("observation_space"), "observation space")
        act = _space(plan.data.get("action_space"), "action space")
    storages = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes() for v in state.values()}
    weights = sum(storages.values())  # a shared features extractor's tensors are stored once, named thrice
    if weights > plan.pth_bytes:
        raise Unsafe(f"its policy.pth holds {weights:,} bytes of tensors, more than its settings' network")
    try:
        model = RecurrentPPO(
            plan.policy, env, device="cpu", policy_kwargs=plan.policy_kwargs, _init_setup_model=False, **plan.kwargs
        )
        if env is None:
            model.observation_space, model.action_space = obs, act
            model.n_envs = plan.n_envs
        model._setup_model()
    except (TypeError, ValueError, AssertionError, KeyError, AttributeError, RuntimeError, OverflowError) as exc:
        raise Unsafe(f"its settings do not build a policy ({first_line(exc)})") from None
    try:
        model.policy.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
        raise Unsafe(f"its weights do not fit the policy its plain settings describe ({first[:120]})") from None
    return model
