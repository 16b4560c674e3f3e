"""An RLlib recurrent policy as a deployed loop runs it: one step of RLlib's default PPO RLModule
(``DefaultModelConfig(use_lstm=True)``), the LSTM state passed in and out explicitly; RLlib's
:data:`~lstm_probe.deploy.spec.Loader` (:func:`loader`) for the deploy layer (``lstm-probe export
run.model.pt policy.onnx --env CartPole-v1``, ``lstm-probe replay TRACE --policy run.model.pt``).

What it reads: the ``run.model.pt`` ``lstm-probe run --framework rllib`` saves (:func:`checkpoint`:
``{"lstm_probe": "rllib", "config": the spaces and DefaultModelConfig fields, "module": the state dict}``),
loaded with ``torch.load(weights_only=True)`` after its size is checked against the memory budget
(``deploy/saved.py``: ``read_checkpoint``); or an RLModule in memory (the learner's, with the critic's
encoder; an ``inference_only`` one holds no critic when ``vf_share_layers=False``), or a PPO ``Algorithm``
(its learner's weights, ``LearnerGroup.get_weights``, in a module built from its spaces and model config).
``Algorithm.get_module()`` is the env runner's module, whose critic RLlib never syncs (docs/rllib.md): given it,
the file's actions are the trained policy's, its value and critic state that untrained critic's.
From a file, the sizes (observation width, layer widths, LSTM cell size, actions) are taken from the weights,
the configuration's types checked and its sizes checked against them, and only RLlib's
``DefaultPPOTorchRLModule`` is built (``RLModuleSpec.build``), never a class the file names.

The step (:class:`Deployed`) is RLlib's own (ray 2.60), cited by file:function:

- the encoder: ``core/models/torch/encoder.py:TorchLSTMEncoder._forward``: the tokenizer (an MLP,
  ``TorchMLPEncoder``) on the observation, then the batch-first ``nn.LSTM`` (its state ``STATE_IN``:
  ``{"h", "c"}``, each ``(batch, layers, hidden)``, transposed to layers first around the call); here a
  sequence-first ``nn.LSTM`` on the same weights (``measure/copies.py:twin``), the state ``(layers, batch,
  hidden)``. With ``vf_share_layers=False`` the actor and the critic each have an encoder and a state
  (``core/models/base.py:StatefulActorCriticEncoder``: ``STATE_IN`` ``{"actor": ..., "critic": ...}``): the
  ``separate`` variant (``h``, ``c``, ``h_critic``, ``c_critic``); else one encoder, ``shared`` (``h``, ``c``);
- the reset: ``connectors/common/add_states_from_episodes_to_batch.py:AddStatesFromEpisodesToBatch.__call__``
  (the env runner's env-to-module pipeline) gives a new episode the module's ``get_initial_state()`` (zeros:
  ``TorchLSTMEncoder.get_initial_state``), an ongoing one its last ``STATE_OUT``: here the state times
  ``1 - episode_start``;
- the action: ``algorithms/ppo/torch/default_ppo_torch_rl_module.py:DefaultPPOTorchRLModule._forward``
  (what ``forward_inference`` runs) gives ``pi``'s ``ACTION_DIST_INPUTS``; the env runner's
  ``connectors/module_to_env/get_actions.py:GetActions._get_actions`` without exploration takes
  ``get_inference_action_dist_cls().from_logits(...).to_deterministic().sample()``: a ``TorchCategorical``'s
  argmax (exported as the index, int64, ``Spec.action == 'discrete'``), a ``TorchDiagGaussian``'s mean (the
  first half of the logits); ``connectors/module_to_env/normalize_and_clip_actions.py`` then maps a Box action
  onto the space's bounds (``utils/spaces/space_utils.py:unsquash_action``, ``normalize_actions=True``, RLlib's
  default: ``low + (a + 1) * (high - low) / 2``, clipped) or clips it (``clip_action``, ``clip_actions=True``);
- the value: ``DefaultPPOTorchRLModule.compute_values``: ``vf`` on the critic's encoder output.

:func:`reference_step` is the same policy as RLlib runs it: ``forward_inference`` of a private copy of the
module on a batch with ``Columns.OBS`` (a time axis of one, as ``AddTimeDimToBatchAndZeroPad`` adds it) and
``Columns.STATE_IN`` (the initial state at episode starts), the action as ``GetActions`` and
``NormalizeAndClipActions`` make it, the value from ``compute_values``. What an exported file is verified
against.
"""

from __future__ import annotations

import copy
import logging
import os
import re
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.deploy import saved
from lstm_probe.deploy.spec import MAX_HIDDEN, MAX_SIZE, Policy, Spec, State, Step
from lstm_probe.errors import BadInput, one_line
from lstm_probe.measure.copies import private_copy, twin

MARK = "rllib"
"""The checkpoint's ``saved.MARK`` entry: an RLlib run's ``run.model.pt``."""
_FIX = "pass the run.model.pt `lstm-probe run --framework rllib` saved"
ACTIVATIONS = ("tanh", "relu", "swish", "silu", "elu", "linear")
"""The activations (RLlib's names, ``fcnet_activation`` / ``head_fcnet_activation``) a file may state."""
LAYERS = (nn.Linear, nn.Tanh, nn.ReLU, nn.SiLU, nn.ELU, nn.Identity)
"""The classes an MLP of the module (tokenizer, ``pi``, ``vf``) may hold: what the default config builds."""
CONFIG = {
    "obs": int,
    "action": str,
    "actions": int,
    "lstm_cell_size": int,
    "vf_share_layers": bool,
    "fcnet_hiddens": list,
    "fcnet_activation": str,
    "head_fcnet_hiddens": list,
    "head_fcnet_activation": str,
    "normalize_actions": bool,
    "clip_actions": bool,
}
"""The configuration :func:`checkpoint` saves, each entry's type (a Box's also ``low`` and ``high``)."""
MAX_LIST = 64
"""Most hidden layers a file's ``fcnet_hiddens`` / ``head_fcnet_hiddens`` may state."""


def loader(model: Any, trust_model: bool = False, env_id: str | None = None) -> Policy:
    """RLlib's :data:`~lstm_probe.deploy.spec.Loader`: the deploy layer's :class:`Policy` of a checkpoint path,
    an RLModule or a PPO Algorithm (see the module docstring)."""
    module, act = module_of(model)
    step = Deployed(module, act).eval()
    return Policy(step.spec, step, reference_step(module, act))


class Actions:
    """How the env runner turns the module's deterministic action into the env's (``NormalizeAndClipActions``)."""

    def __init__(self, space: Any, normalize: bool = True, clip: bool = False) -> None:
        self.space, self.normalize, self.clip = space, normalize, clip


def module_of(model: Any) -> tuple[Any, Actions]:
    """A private CPU copy of the full RLModule (critic included), in eval mode, without gradients; and how its
    actions reach the env."""
    if isinstance(model, str | os.PathLike):
        module, act = _from_checkpoint(os.fspath(model))
    elif hasattr(model, "learner_group") and hasattr(model, "get_module"):  # a PPO Algorithm
        from ray.rllib.core import DEFAULT_MODULE_ID

        live = model.get_module()
        if live is None:
            raise BadInput("export takes a PPO Algorithm with one (single-agent) RLModule")
        weights = model.learner_group.get_weights([DEFAULT_MODULE_ID])[DEFAULT_MODULE_ID]
        module = build(live.observation_space, live.action_space, dict(live.model_config))
        module.set_state(weights)
        cfg = model.config
        act = Actions(live.action_space, bool(cfg.normalize_actions), bool(cfg.clip_actions))
    elif isinstance(model, nn.Module) and hasattr(model, "forward_inference"):
        if getattr(model, "inference_only", False) and not _shared(model):
            raise BadInput(
                "export takes the learner's RLModule (with the critic's encoder), not an inference_only one: "
                "pass the Algorithm, or algo.learner_group's module"
            )
        module = private_copy(model)
        act = Actions(model.action_space)  # RLlib's defaults: normalize_actions=True, clip_actions=False
    else:
        raise BadInput(
            f"export takes an RLlib run.model.pt, an RLModule or a PPO Algorithm, not {type(model).__name__[:60]}"
        )
    module.to("cpu").eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module, act


def _shared(module: Any) -> bool:
    return not hasattr(module.encoder, "actor_encoder")


def build(obs_space: Any, action_space: Any, model_config: dict[str, Any]) -> Any:
    """RLlib's default PPO RLModule (torch, not inference_only) for these spaces and model config."""
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    spec = RLModuleSpec(
        module_class=DefaultPPOTorchRLModule,
        observation_space=obs_space,
        action_space=action_space,
        model_config=model_config,
        inference_only=False,
    )
    # RLlib's own deprecation notice on every build (ray 2.60: RLModule.__init__'s RLModuleConfig): not the user's
    notices = logging.getLogger("ray._common.deprecation")
    level = notices.level
    notices.setLevel(logging.ERROR)
    try:
        return spec.build()
    finally:
        notices.setLevel(level)


def checkpoint(module: Any, normalize_actions: bool = True, clip_actions: bool = False) -> dict[str, Any]:
    """What ``run`` saves of a trained (full) RLModule: plain tensors, numbers, strings and lists."""
    import gymnasium as gym

    mc = dict(module.model_config)
    obs, space = module.observation_space, module.action_space
    box = isinstance(space, gym.spaces.Box)
    config: dict[str, Any] = {
        "obs": int(np.prod(obs.shape)),
        "action": "box" if box else "discrete",
        "actions": int(np.prod(space.shape)) if box else int(space.n),
        "lstm_cell_size": int(mc.get("lstm_cell_size", 256)),
        "vf_share_layers": bool(mc.get("vf_share_layers", True)),
        "fcnet_hiddens": [int(n) for n in mc.get("fcnet_hiddens", [256, 256])],
        "fcnet_activation": str(mc.get("fcnet_activation", "tanh")),
        "head_fcnet_hiddens": [int(n) for n in mc.get("head_fcnet_hiddens", [])],
        "head_fcnet_activation": str(mc.get("head_fcnet_activation", "relu")),
        "normalize_actions": bool(normalize_actions),
        "clip_actions": bool(clip_actions),
    }
    if box:
        config["low"], config["high"] = space.low.tolist(), space.high.tolist()
    state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    return {saved.MARK: MARK, "config": config, "module": state}


def _linears(state: dict[str, torch.Tensor], prefix: str, path: str) -> list[tuple[int, int]]:
    """(out, in) of each linear layer of the MLP at ``prefix`` (``...net.mlp.``), in order."""
    found = sorted(
        (int(m.group(1)), tuple(v.shape))
        for k, v in state.items()
        if (m := re.fullmatch(re.escape(prefix) + r"(\d{1,4})\.weight", k)) is not None
    )
    if not found or any(len(s) != 2 for _, s in found):
        raise BadInput(f"{path}: its module has no MLP at {prefix[:60]!r} (RLlib's default PPO module); {_FIX}")
    return [(int(s[0]), int(s[1])) for _, s in found]


def _config(doc: Any, path: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get(saved.MARK) != MARK:
        raise BadInput(f"{path} is not an RLlib checkpoint (no {saved.MARK!r}: {MARK!r} entry); {_FIX}")
    config = doc.get("config")
    if not isinstance(config, dict) or any(type(config.get(k)) is not t for k, t in CONFIG.items()):
        want = ", ".join(f"{k} ({t.__name__})" for k, t in CONFIG.items())
        raise BadInput(f"{path}: its config is not what `run` saves ({want}); {_FIX}")
    for key in ("fcnet_hiddens", "head_fcnet_hiddens"):
        sizes = config[key]
        if len(sizes) > MAX_LIST or not all(type(n) is int and 1 <= n <= MAX_SIZE for n in sizes):
            raise BadInput(f"{path}: its config's {key} is not a list of at most {MAX_LIST} widths; {_FIX}")
    if not config["fcnet_hiddens"]:
        raise BadInput(f"{path}: its config's fcnet_hiddens is empty (RLlib's LSTM needs a tokenizer); {_FIX}")
    for key in ("fcnet_activation", "head_fcnet_activation"):
        if config[key] not in ACTIVATIONS:
            raise BadInput(f"{path}: its config's {key} is {config[key][:40]!r}, not one of {ACTIVATIONS}; {_FIX}")
    if config["action"] not in ("discrete", "box"):
        raise BadInput(f"{path}: its config's action is {config['action'][:40]!r}, not 'discrete' or 'box'; {_FIX}")
    if not 1 <= config["lstm_cell_size"] <= MAX_HIDDEN or not 1 <= config["obs"] <= MAX_SIZE:
        raise BadInput(f"{path}: its config's lstm_cell_size or obs is out of range; {_FIX}")
    if not 1 <= config["actions"] <= MAX_SIZE:
        raise BadInput(f"{path}: its config's actions is out of range; {_FIX}")
    return config


def _from_checkpoint(path: str) -> tuple[Any, Actions]:
    """The RLModule of an RLlib run's checkpoint, read as hostile (see the module docstring)."""
    import gymnasium as gym

    doc: Any = saved.read_checkpoint(path, _FIX)
    config = _config(doc, path)
    state = doc.get("module")
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise BadInput(f"{path}: its module is not a state dict (names to tensors); {_FIX}")
    shared = config["vf_share_layers"]
    cell, actions, box = config["lstm_cell_size"], config["actions"], config["action"] == "box"
    want = [*config["fcnet_hiddens"]]
    encoders = ["encoder.encoder."] if shared else ["encoder.actor_encoder.", "encoder.critic_encoder."]
    for enc in encoders:  # the sizes come from the weights; the config must state the same
        tok = _linears(state, f"{enc}tokenizer.net.mlp.", path)
        ih, hh = state.get(f"{enc}lstm.weight_ih_l0"), state.get(f"{enc}lstm.weight_hh_l0")
        got = {
            "obs": tok[0][1],
            "fcnet_hiddens": [o for o, _ in tok],
            "lstm_cell_size": None if hh is None or hh.dim() != 2 else int(hh.shape[1]),
        }
        if ih is None or hh is None or f"{enc}lstm.weight_ih_l1" in state:
            raise BadInput(f"{path}: its module has no one-layer LSTM at {enc}lstm (use_lstm=True); {_FIX}")
        stated = {"obs": config["obs"], "fcnet_hiddens": want, "lstm_cell_size": cell}
        bad = next((k for k in stated if got[k] != stated[k]), None)
        if bad is not None:
            raise BadInput(
                f"{path}: its config's {bad} ({str(stated[bad])[:60]}) is not what its weights hold "
                f"({str(got[bad])[:60]}); {_FIX}"
            )
    heads = {"pi": 2 * actions if box else actions, "vf": 1}
    for head, out in heads.items():
        got_sizes = [o for o, _ in _linears(state, f"{head}.net.mlp.", path)]
        if got_sizes != [*config["head_fcnet_hiddens"], out]:
            raise BadInput(
                f"{path}: its {head} head's widths {got_sizes[:8]} are not the config's "
                f"{[*config['head_fcnet_hiddens'], out][:8]}; {_FIX}"
            )
    if box:
        low, high = saved.bounds(config, actions, path, _FIX)
        space: Any = gym.spaces.Box(np.array(low, np.float32), np.array(high, np.float32), dtype=np.float32)
    else:
        space = gym.spaces.Discrete(actions)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (config["obs"],), np.float32)
    model_config = {
        "use_lstm": True,
        "lstm_cell_size": cell,
        "vf_share_layers": shared,
        "fcnet_hiddens": want,
        "fcnet_activation": config["fcnet_activation"],
        "head_fcnet_hiddens": list(config["head_fcnet_hiddens"]),
        "head_fcnet_activation": config["head_fcnet_activation"],
    }
    try:
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

        module = build(obs_space, space, DefaultModelConfig(**model_config))  # type: ignore[arg-type]
        module.load_state_dict(state, strict=True)
    except Exception as exc:
        raise BadInput(
            f"{path}: its weights do not load into RLlib's default PPO module: {one_line(exc, kind=False)[:200]}"
        ) from None
    return module, Actions(space, config["normalize_actions"], config["clip_actions"])


def _mlp(owner: Any, what: str) -> nn.Sequential:
    """The ``nn.Sequential`` of an RLlib MLP (``TorchMLPEncoder``/``TorchMLPHead``: ``.net.mlp``), its classes
    checked (:data:`LAYERS`)."""
    mlp = getattr(getattr(owner, "net", None), "mlp", None)
    if not isinstance(mlp, nn.Sequential) or not all(isinstance(m, LAYERS) for m in mlp):
        names = sorted({type(m).__name__ for m in mlp} - {c.__name__ for c in LAYERS}) if mlp is not None else []
        raise BadInput(
            f"export takes RLlib's default PPO module (use_lstm=True): its {what} must be an MLP of linear layers "
            f"and tanh/relu/silu/elu activations, not {names[:3] or type(owner).__name__}"
        )
    return mlp


class Encoder(nn.Module):
    """One ``TorchLSTMEncoder`` step: the tokenizer's MLP, then the LSTM sequence first (see the module docstring)."""

    def __init__(self, encoder: Any, what: str) -> None:
        super().__init__()
        lstm = getattr(encoder, "lstm", None)
        if not isinstance(lstm, nn.LSTM):
            raise BadInput(f"export takes RLlib's default LSTM encoder (use_lstm=True); its {what} has no nn.LSTM")
        tok = getattr(encoder, "tokenizer", None)
        self.tokenizer = _mlp(tok, f"{what}'s tokenizer") if tok is not None else nn.Identity()
        self.lstm = twin(lstm, batch_first=False)

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, (h, c) = self.lstm(self.tokenizer(obs).unsqueeze(0), (h, c))
        return out.squeeze(0), h, c


class Deployed(nn.Module):
    """One step of RLlib's default PPO RLModule with explicit state (see the module docstring)."""

    spread: torch.Tensor
    minus_mid: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor

    def __init__(self, module: Any, act: Actions) -> None:
        import gymnasium as gym

        super().__init__()
        self.separate = not _shared(module)
        enc = module.encoder
        self.actor = Encoder(enc.actor_encoder if self.separate else enc.encoder, "actor's encoder")
        self.critic = Encoder(enc.critic_encoder, "critic's encoder") if self.separate else None
        self.pi, self.vf = _mlp(module.pi, "pi head"), _mlp(module.vf, "vf head")
        obs_space, space = module.observation_space, module.action_space
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise BadInput(f"export takes an RLlib module of flat Box observations, not {obs_space}")
        lstm = self.actor.lstm
        self.discrete = isinstance(space, gym.spaces.Discrete)
        if self.discrete:
            if int(space.start) != 0:
                raise BadInput("export takes a Discrete action space starting at 0")
            shape: tuple[int, ...] = ()
        elif isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
            shape = (int(space.shape[0]),)
        else:
            raise BadInput(f"export takes an RLlib module of Discrete or flat Box actions, not {space}")
        self.width = shape[0] if shape else 0
        low = np.asarray(getattr(space, "low", 0.0), np.float32)
        high = np.asarray(getattr(space, "high", 0.0), np.float32)
        self.unsquash = not self.discrete and act.normalize and bool(np.isfinite(low).all() and np.isfinite(high).all())
        self.clip = not self.discrete and not self.unsquash and act.clip
        # low + (a + 1) * (high - low) / 2 written a * spread - (-mid): no Add (deploy/checks.py: OPS)
        self.register_buffer("spread", torch.as_tensor((high - low) / 2))
        self.register_buffer("minus_mid", torch.as_tensor(-(high + low) / 2))
        self.register_buffer("low", torch.as_tensor(low))
        self.register_buffer("high", torch.as_tensor(high))
        self.spec = Spec(
            "separate" if self.separate else "shared",
            (int(obs_space.shape[0]),),
            "discrete" if self.discrete else "box",
            shape,
            int(lstm.num_layers),
            int(lstm.hidden_size),
            choices=int(space.n) if self.discrete else 0,
        )

    def forward(self, obs: torch.Tensor, episode_start: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        keep = (1.0 - episode_start).view(1, -1, 1)  # a new episode starts from get_initial_state(): zeros
        x = obs.float()
        emb, h, c = self.actor(x, state[0] * keep, state[1] * keep)
        new = [h, c]
        if self.critic is not None:
            value_emb, hc, cc = self.critic(x, state[2] * keep, state[3] * keep)
            new += [hc, cc]
        else:
            value_emb = emb
        logits = self.pi(emb)
        if self.discrete:
            action = torch.argmax(logits, dim=-1)  # TorchCategorical.to_deterministic: the argmax
        else:
            action = logits[..., : self.width]  # TorchDiagGaussian.to_deterministic: the mean
            if self.unsquash:
                action = torch.clamp(action * self.spread - self.minus_mid, self.low, self.high)
            elif self.clip:
                action = torch.clamp(action, self.low, self.high)
        return (action, self.vf(value_emb), *new)


def reference_step(module: Any, act: Actions) -> Step:
    """:data:`Step` of the module as RLlib's env runner steps it (see the module docstring), on a private copy."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action

    module = copy.deepcopy(module)
    separate = not _shared(module)
    initial = module.get_initial_state()
    roles = ("actor", "critic") if separate else (None,)
    discrete = Deployed(module, act).discrete

    def step(obs: np.ndarray, start: np.ndarray, state: State) -> tuple[np.ndarray, np.ndarray, State]:
        o = torch.as_tensor(np.asarray(obs, np.float32))
        batch = o.shape[0]
        fresh = torch.as_tensor(np.asarray(start) != 0).view(batch, 1, 1)
        state_in: dict[str, Any] = {}
        for i, role in enumerate(roles):
            init = initial if role is None else initial[role]
            leaves = {}
            for j, key in enumerate(("h", "c")):
                s = torch.as_tensor(np.asarray(state[2 * i + j], np.float32)).transpose(0, 1)  # batch first
                leaves[key] = torch.where(fresh, init[key].expand_as(s), s)  # AddStatesFromEpisodesToBatch
            if role is None:
                state_in = leaves
            else:
                state_in[role] = leaves
        batch_in = {Columns.OBS: o[:, None], Columns.STATE_IN: state_in}  # (B, T=1, ...)
        with torch.no_grad():
            out = module.forward_inference(batch_in)
            values = module.compute_values(batch_in)
            dist = module.get_inference_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS][:, 0])
            action = dist.to_deterministic().sample().numpy()
        if not discrete:
            if act.normalize:
                action = np.stack([unsquash_action(a, act.space) for a in action])
            elif act.clip:
                action = np.stack([clip_action(a, act.space) for a in action])
        outs = out[Columns.STATE_OUT]
        new = tuple(
            (outs if role is None else outs[role])[key].transpose(0, 1).contiguous().numpy()
            for role in roles
            for key in ("h", "c")
        )
        return action, values.reshape(batch, 1).numpy(), new

    return step
