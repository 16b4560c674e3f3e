"""A RecurrentPPO policy as a deployed loop runs it: one step, the LSTM state passed in and out explicitly.

:class:`Deployed` is a small module holding a private copy of the policy's parts (``sb3_arch.private_policy``:
no hooks of the user's, never the user's object). Its one step is sb3-contrib's own, with the state made
explicit:

- the features: ``policy.extract_features`` (sb3's ``preprocess_obs``; a tuple when the actor and critic
  have their own features extractors);
- the reset: ``common/recurrent/policies.py:RecurrentActorCriticPolicy._process_sequence`` multiplies the
  state by ``1 - episode_start`` before the LSTM call (its loop branch; the branch without starts is the
  same call with the factor 1);
- the critic (``RecurrentActorCriticPolicy.forward``): its own LSTM (``lstm_critic``), the actor's latent
  (``shared_lstm``) or a linear layer (``critic``, ``enable_critic_lstm=False``); only the first has a state;
- the action: the distribution's deterministic action (``get_actions(deterministic=True)``: the Gaussian's
  mean, the Categorical's argmax), clipped to a Box's bounds as ``RecurrentActorCriticPolicy.predict`` clips.

:class:`Spec` names the inputs and outputs, with their shapes; it is stored in each exported file's metadata
and read back from it (``lstm-probe replay --policy OUT.onnx``). :func:`runner` steps a policy whatever its
form: the PyTorch module, a TorchScript file (``torch.jit.load``) or an ONNX file (onnxruntime).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.errors import BadInput, one_line

META_KEY = "lstm_probe.deploy"
"""The metadata key (ONNX ``metadata_props``; TorchScript extra file ``lstm_probe.deploy.json``)."""

State = tuple[np.ndarray, ...]
Step = Callable[[np.ndarray, np.ndarray, State], tuple[np.ndarray, np.ndarray, State]]
"""(obs, episode_start, state) -> (action, value, new state): one step of a batch of envs."""


@dataclass(frozen=True)
class Spec:
    """What a deployed policy takes and returns (``batch`` is the number of envs stepped at once)."""

    variant: str
    """'separate' (actor and critic LSTMs), 'shared' (one LSTM), 'no critic LSTM'."""
    obs_shape: tuple[int, ...]
    action: str
    """'box' (float32 actions, clipped to the bounds) or 'discrete' (int64 actions)."""
    action_shape: tuple[int, ...]
    layers: int
    hidden: int

    @property
    def critic_state(self) -> bool:
        return self.variant == "separate"

    @property
    def state_names(self) -> list[str]:
        return ["h", "c", "h_critic", "c_critic"] if self.critic_state else ["h", "c"]

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

    def to_json(self, **extra: Any) -> str:
        doc = {
            **asdict(self),
            "inputs": [dict(zip(("name", "shape", "dtype"), i, strict=True)) for i in self.inputs()],
            "outputs": [dict(zip(("name", "shape", "dtype"), o, strict=True)) for o in self.outputs()],
            **extra,
        }
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str, where: str) -> Spec:
        try:
            doc = json.loads(text)
            return cls(
                variant=str(doc["variant"]),
                obs_shape=tuple(int(d) for d in doc["obs_shape"]),
                action=str(doc["action"]),
                action_shape=tuple(int(d) for d in doc["action_shape"]),
                layers=int(doc["layers"]),
                hidden=int(doc["hidden"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInput(f"{where}: its {META_KEY} metadata is not lstm-probe's ({exc}); export it again") from None


def variant(policy: Any) -> str:
    if policy.lstm_critic is not None:
        return "separate"
    return "shared" if policy.shared_lstm else "no critic LSTM"


def spec_of(policy: Any) -> Spec:
    """The spec of a RecurrentPPO policy; BadInput for what :class:`Deployed` does not export."""
    from gymnasium import spaces

    obs, act = policy.observation_space, policy.action_space
    if not isinstance(obs, spaces.Box):
        raise BadInput(f"export takes a Box observation space, not {obs}; flatten the observations with a wrapper")
    if isinstance(act, spaces.Box):
        if policy.squash_output:
            raise BadInput("export does not take squashed (gSDE) actions yet; train without use_sde to export")
        kind = "box"
    elif isinstance(act, spaces.Discrete):
        kind = "discrete"
    else:
        raise BadInput(f"export takes Box or Discrete actions, not {act}")
    lstm = policy.lstm_actor
    return Spec(variant(policy), tuple(obs.shape), kind, tuple(act.shape), lstm.num_layers, lstm.hidden_size)


class Deployed(nn.Module):
    """One step of a RecurrentPPO policy with explicit state (see the module docstring)."""

    low: torch.Tensor
    high: torch.Tensor

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.spec = spec_of(policy)
        self.policy = policy
        act = policy.action_space
        if self.spec.action == "box":
            self.register_buffer("low", torch.as_tensor(np.asarray(act.low, np.float32)))
            self.register_buffer("high", torch.as_tensor(np.asarray(act.high, np.float32)))

    def forward(self, obs: torch.Tensor, episode_start: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = self.policy
        features = p.extract_features(obs)
        if p.share_features_extractor:
            pi_features = vf_features = features
        else:
            pi_features, vf_features = features
        keep = (1.0 - episode_start).view(1, -1, 1)  # _process_sequence's reset
        latent_pi, (h, c) = p.lstm_actor(pi_features.unsqueeze(0), (state[0] * keep, state[1] * keep))
        latent_pi = latent_pi.squeeze(0)
        new = [h, c]
        if p.lstm_critic is not None:
            latent_vf, (hv, cv) = p.lstm_critic(vf_features.unsqueeze(0), (state[2] * keep, state[3] * keep))
            latent_vf = latent_vf.squeeze(0)
            new += [hv, cv]
        elif p.shared_lstm:
            latent_vf = latent_pi
        else:
            latent_vf = p.critic(vf_features)
        value = p.value_net(p.mlp_extractor.forward_critic(latent_vf))
        out = p.action_net(p.mlp_extractor.forward_actor(latent_pi))
        if self.spec.action == "box":
            action = torch.maximum(torch.minimum(out, self.high), self.low)
            action = action.reshape((-1, *self.spec.action_shape))
        else:
            action = torch.argmax(out, dim=1)
        return (action, value, *new)

    def example(self, batch: int = 2) -> tuple[torch.Tensor, ...]:
        """Inputs for tracing: zeros, episode starts on."""
        s = self.spec
        obs = torch.zeros((batch, *s.obs_shape))
        return (obs, torch.ones(batch), *(torch.zeros(s.layers, batch, s.hidden) for _ in s.state_names))


def deployed(policy: Any) -> Deployed:
    """A :class:`Deployed` over a private copy of ``policy`` (the user's object and hooks untouched), in eval
    mode, without gradients."""
    from lstm_probe.integrations.sb3_arch import private_policy

    copy = private_policy(policy).to("cpu")
    copy.set_training_mode(False)
    for p in copy.parameters():
        p.requires_grad_(False)
    return Deployed(copy).eval()


def torch_step(module: Any) -> Step:
    """:data:`Step` of a torch module (:class:`Deployed` or a TorchScript one), in float32."""

    def step(obs: np.ndarray, start: np.ndarray, state: State) -> tuple[np.ndarray, np.ndarray, State]:
        with torch.no_grad():
            args = [torch.as_tensor(obs, dtype=torch.float32), torch.as_tensor(start, dtype=torch.float32)]
            out = module(*args, *(torch.as_tensor(s, dtype=torch.float32) for s in state))
        arrays = [o.numpy() for o in out]
        return arrays[0], arrays[1], tuple(arrays[2:])

    return step


def half_weights(module: Any) -> Any:
    """``module`` (:class:`Deployed` or TorchScript, a private copy) with its floating-point parameters and
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
