"""A RecurrentPPO policy as a deployed loop runs it: one step, the LSTM state passed in and out explicitly;
sb3's :data:`~lstm_probe.deploy.spec.Loader` (:func:`loader`) for the deploy layer (``lstm-probe export``,
``lstm-probe replay --policy MODEL.zip``).

:class:`Deployed` is a small module holding a private copy of the policy's parts (``arch.private_policy``:
no hooks of the user's, never the user's object). Its one step is sb3-contrib's own, with the state made
explicit:

- the features: ``policy.extract_features`` (sb3's ``preprocess_obs``; a tuple when the actor and critic
  have their own features extractors); a MultiInputLstmPolicy's one flat input (``Spec.obs_keys``) split into
  its keys as ``preprocess_obs`` makes them (:func:`split_obs`) and handed to its features extractor(s);
- the reset: ``common/recurrent/policies.py:RecurrentActorCriticPolicy._process_sequence`` multiplies the
  state by ``1 - episode_start`` before the LSTM call (its loop branch; the branch without starts is the
  same call with the factor 1);
- the critic (``RecurrentActorCriticPolicy.forward``): its own LSTM (``lstm_critic``), the actor's latent
  (``shared_lstm``) or a linear layer (``critic``, ``enable_critic_lstm=False``); only the first has a state;
- the action: the distribution's deterministic action (``get_actions(deterministic=True)``: the Gaussian's
  mean, the Categorical's argmax), clipped to a Box's bounds as ``RecurrentActorCriticPolicy.predict`` clips.

:func:`reference_step` is the same policy as sb3-contrib runs it (``RecurrentActorCriticPolicy.forward``),
what an exported file is verified against.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.deploy.spec import ObsKey, Policy, Spec, State, Step
from lstm_probe.errors import BadInput
from lstm_probe.integrations.sb3.exportable import refusal
from lstm_probe.log.budget import open_regular


def loader(model: Any, trust_model: bool = False, env_id: str | None = None) -> Policy:
    """sb3's :data:`~lstm_probe.deploy.spec.Loader`: the deploy layer's :class:`Policy` of a RecurrentPPO or
    of its model.zip (see :func:`policy_of`)."""
    module = deployed(policy_of(model, trust_model, env_id))
    normalized = trained_normalized(model)
    notes = (NORMALIZED,) if normalized else ()
    return Policy(module.spec, module, reference_step(module), notes=notes, normalized=normalized)


NORMALIZED = (
    "the model was trained under VecNormalize: the file takes observations as its policy saw them, normalized "
    "where VecNormalize normalized them (norm_obs, the default: clip((obs - obs_rms.mean) / sqrt(obs_rms.var + "
    "epsilon), -clip_obs, clip_obs), with the statistics VecNormalize.save wrote, or your env's own VecNormalize "
    "loaded with training=False), and does not normalize them itself; `lstm-probe replay --vecnormalize STATS` "
    "checks that a loop does"
)
"""The note on a model trained under VecNormalize (where it normalized observations: ``norm_obs``, the default)."""


def trained_normalized(model: Any) -> bool:
    """Whether a RecurrentPPO or its model.zip was trained under VecNormalize: ``BaseAlgorithm._setup_learn`` sets
    ``_last_original_obs`` (saved in the zip's ``data``, not excluded like ``_vec_normalize_env``) only where the
    env is one. Of a zip, only whether that entry is null is read (nothing unpickled, within the reader's bounds)."""
    if isinstance(model, str | os.PathLike):
        from lstm_probe.integrations.sb3.model_zip import read_data

        try:
            return read_data(os.fspath(model)).get("_last_original_obs") is not None
        except Exception:  # the loader already read this data; a zip it could not is refused before here
            return False
    return getattr(model, "_vec_normalize_env", None) is not None or (
        getattr(model, "_last_original_obs", None) is not None
    )


def policy_of(model: Any, trust_model: bool, env_id: str | None = None) -> Any:
    """The policy of a RecurrentPPO or of its model.zip (read as ``lstm-probe arch`` reads it: nothing
    unpickled unless ``trust_model``; ``env_id``: the env whose spaces the zip's reader takes, where the zip
    does not state them in full as text)."""
    if isinstance(model, str | os.PathLike):
        from lstm_probe.integrations.sb3.commands import _refuse_non_recurrent, load_model

        target = os.fspath(model)
        if os.path.lexists(target):  # a FIFO or device named model.zip: refused, never waited on
            open_regular(target, "pass a saved RecurrentPPO model.zip").close()
        _refuse_non_recurrent(target)
        model, _ = load_model(target, env_id=env_id, trust_model=trust_model)
    policy = getattr(model, "policy", model)
    if not hasattr(policy, "lstm_actor"):
        raise BadInput(f"export takes a RecurrentPPO (sb3-contrib) model, not {type(policy).__name__}")
    return policy


def variant(policy: Any) -> str:
    if policy.lstm_critic is not None:
        return "separate"
    return "shared" if policy.shared_lstm else "no critic LSTM"


def spec_of(policy: Any) -> Spec:
    """The spec of a RecurrentPPO policy; BadInput for what :class:`Deployed` does not export."""
    from gymnasium import spaces

    why = refusal(policy)
    if why is not None:
        raise BadInput(why)
    obs, act = policy.observation_space, policy.action_space
    kind = "box" if isinstance(act, spaces.Box) else "discrete"
    lstm = policy.lstm_actor
    choices = int(act.n) if isinstance(act, spaces.Discrete) else 0
    shape = tuple(act.shape)
    lstm_shape = (lstm.num_layers, lstm.hidden_size)
    if isinstance(obs, spaces.Dict):  # MultiInputLstmPolicy: one flat input, each key's slice in the spec
        keys = obs_keys(obs)
        return Spec(variant(policy), (keys[-1].stop,), kind, shape, *lstm_shape, "lstm", choices, (), keys)
    return Spec(variant(policy), tuple(obs.shape), kind, shape, *lstm_shape, "lstm", choices, _frame_axes(obs))


KEY_SPACES = {"Box": "box", "Discrete": "discrete", "MultiDiscrete": "multi_discrete", "MultiBinary": "multi_binary"}


def obs_keys(obs: Any) -> tuple[ObsKey, ...]:
    """Each key of a Dict space (checked by ``exportable.refusal``) and its slice of the flat input, in the Dict's
    order, as ``gymnasium.spaces.flatten`` lays it out (its ``flatdim`` values each)."""
    from gymnasium.spaces import flatdim

    keys, start = [], 0
    for key, space in obs.spaces.items():
        stop = start + int(flatdim(space))
        keys.append(ObsKey(str(key), KEY_SPACES[type(space).__name__], tuple(space.shape), start, stop))
        start = stop
    return tuple(keys)


def split_obs(obs: torch.Tensor, keys: tuple[ObsKey, ...]) -> dict[str, torch.Tensor]:
    """A batch of flat observations (batch, width) as sb3's ``preprocess_obs`` makes a Dict's: each key's slice,
    a Box's and a MultiBinary's in its own shape (float), a Discrete's and a MultiDiscrete's already one-hot."""
    out = {}
    for k in keys:
        part = obs[:, k.start : k.stop]
        out[k.key] = part.reshape((-1, *k.shape)) if k.space in ("box", "multi_binary") else part
    return out


def _frame_axes(space: Any) -> tuple[int, ...]:
    """(2, 0, 1) where the policy takes channel-first images (C, H, W) that sb3 makes of a channel-last env's
    (H, W, C) frames (``BaseAlgorithm._wrap_env`` wraps such an env in ``VecTransposeImage``, whose
    ``transpose_space`` gives (C, H, W)), so the env's own frames come channel-last; () otherwise."""
    import warnings

    from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first

    if not is_image_space(space):
        return ()
    c, h, w = space.shape
    frame = type(space)(low=0, high=255, shape=(h, w, c), dtype=space.dtype)
    with warnings.catch_warnings():  # sb3 warns where the second axis is the smallest
        warnings.simplefilter("ignore")
        transposed = is_image_space_channels_first(space) and not is_image_space_channels_first(frame)
    return (2, 0, 1) if transposed else ()


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
        if self.spec.obs_keys:  # preprocess_obs's Dict, made of the flat input (gymnasium's flatten already one-hots)
            parts = split_obs(obs, self.spec.obs_keys)
            if p.share_features_extractor:
                features = p.features_extractor(parts)
            else:
                features = (p.pi_features_extractor(parts), p.vf_features_extractor(parts))
        else:
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


def deployed(policy: Any) -> Deployed:
    """A :class:`Deployed` over a private copy of ``policy`` (the user's object and hooks untouched), in eval
    mode, without gradients."""
    from lstm_probe.integrations.sb3.arch import private_policy

    copy = private_policy(policy).to("cpu")
    copy.set_training_mode(False)
    for p in copy.parameters():
        p.requires_grad_(False)
    return Deployed(copy).eval()


def reference_step(module: Deployed) -> Step:
    """:data:`Step` of the PyTorch policy as sb3-contrib runs it: ``RecurrentActorCriticPolicy.forward``
    (deterministic) on the module's private copy, the action clipped as ``predict`` clips a Box's."""
    from sb3_contrib.common.recurrent.type_aliases import RNNStates

    policy, spec = module.policy, module.spec

    def step(obs: np.ndarray, start: np.ndarray, state: State) -> tuple[np.ndarray, np.ndarray, State]:
        t = [torch.as_tensor(s) for s in state]
        pi = (t[0], t[1])
        vf = (t[2], t[3]) if spec.critic_state else pi
        with torch.no_grad():
            obs_t = (
                _sb3_obs(policy.observation_space, obs)
                if spec.obs_keys
                else torch.as_tensor(np.asarray(obs, np.float32))
            )
            actions, values, _, states = policy(obs_t, RNNStates(pi, vf), torch.as_tensor(start), deterministic=True)
        action = actions.numpy()
        if spec.action == "box":
            action = np.clip(action, policy.action_space.low, policy.action_space.high)
        new = [states.pi[0], states.pi[1], *((states.vf[0], states.vf[1]) if spec.critic_state else ())]
        return action, values.numpy(), tuple(s.numpy() for s in new)

    return step


def _sb3_obs(space: Any, obs: np.ndarray) -> Any:
    """Flat observations (batch, width) as sb3 takes a Dict's: ``gymnasium.spaces.unflatten`` of each row (a
    Discrete's index from its one-hot), stacked per key, as tensors."""
    from gymnasium.spaces import unflatten

    rows = [unflatten(space, np.asarray(row)) for row in obs]
    return {key: torch.as_tensor(np.stack([r[key] for r in rows])) for key in space.spaces}
