"""The sb3 framework's ``run``, ``arch`` and ``live`` as the CLI calls them (see
``lstm_probe.integrations.FRAMEWORKS``); ``arch`` and ``load_model`` are also ``lstm_probe``'s."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from lstm_probe.errors import BadInput
from lstm_probe.integrations.sb3 import run as training
from lstm_probe.integrations.sb3.arch import Architecture
from lstm_probe.integrations.sb3.arch import arch as analyse
from lstm_probe.integrations.sb3.options import Build
from lstm_probe.log.budget import open_regular
from lstm_probe.options import Placement, RunResult, TrainOptions, route, settle

__all__ = ["arch", "default_threads", "load_model", "run"]


def run(
    env_id: str,
    *,
    train: TrainOptions | None = None,
    placement: Placement | None = None,
    **kwargs: Any,
) -> RunResult:
    """``lstm_probe.run`` with the CLI's thread default: ``torch_threads`` None takes
    :func:`default_threads`. Takes what ``lstm_probe.run`` takes."""
    tr, pl, rest = route(kwargs, (TrainOptions, Placement), "run", rest=True)
    t, p = settle(TrainOptions, train, tr), settle(Placement, placement, pl)
    if t.torch_threads is None:
        t = dataclasses.replace(t, torch_threads=default_threads(env_id, p.device))
    return training.run(env_id, train=t, placement=p, **rest)


def default_threads(env_id: str, device: str) -> int | None:
    """1 when training runs on the CPU with an MLP-sized policy (no image observations): SB3's advice for
    small policies on CPU, where torch's default team of threads costs more in hand-overs than it computes
    (and a 1-thread run is reproducible). None (torch's own) on a GPU or for image observations."""
    import torch

    if device != "cpu" and (device != "auto" or torch.cuda.is_available()):
        return None
    try:
        import gymnasium as gym

        env = gym.make(env_id)
        space = env.observation_space
        env.close()
    except Exception:  # an unknown or broken env: run() says what is wrong with it
        return None
    from gymnasium import spaces
    from stable_baselines3.common.preprocessing import is_image_space

    subspaces = space.spaces.values() if isinstance(space, spaces.Dict) else [space]
    if any(isinstance(s, spaces.Box) and is_image_space(s, check_channels=False) for s in subspaces):
        return None
    return 1


def arch(
    target: Any,
    *,
    rollout: bool | None = None,
    env_id: str | None = None,
    trust_model: bool = False,
    train: TrainOptions | None = None,
    build_options: Build | None = None,
    **overrides: Any,
) -> Architecture:
    """Architecture and measured gradient flow (``lstm_probe.arch``, ``lstm-probe arch``) of ``target``:

    - a RecurrentPPO model: analysed as it is (``rollout=True``: on a real rollout of its env, on copies);
    - an env id: the RecurrentPPO ``run`` would build (``train``, ``build_options`` and keyword overrides of
      their fields: ``shared_lstm``, ``hidden_size``, ``critic_lstm``, ``lstm_layers``, ``hyperparams``);
    - a saved model.zip, read without unpickling anything (``trust_model=True``: SB3's full load, which
      unpickles it); ``env_id`` gives it an env for a real rollout.
    """
    if not isinstance(target, str | os.PathLike):
        return analyse(target, rollout=bool(rollout))
    target = os.fspath(target)
    _refuse_non_recurrent(target)
    tr, bo = route(overrides, (TrainOptions, Build), "arch")
    model, real = load_model(
        target,
        env_id=env_id,
        trust_model=trust_model,
        train=settle(TrainOptions, train, tr),
        build_options=settle(Build, build_options, bo),
    )
    policy = getattr(model, "policy", None)
    if not hasattr(policy, "lstm_actor"):
        raise BadInput(f"{target} holds the policy {type(policy).__name__}, which has no LSTM; {_NO_LSTM}")
    return analyse(model, rollout=real if rollout is None else rollout and real)


def load_model(
    target: str,
    *,
    env_id: str | None = None,
    trust_model: bool = False,
    train: TrainOptions | None = None,
    build_options: Build | None = None,
) -> tuple[Any, bool]:
    """A RecurrentPPO from an env id (built as ``run`` builds it, with 64-step rollouts) or a model.zip; and
    whether a real rollout is possible (an env is attached).

    A model.zip is read without unpickling anything (``integrations/sb3/model_zip.py``); what that reader
    cannot build is refused with one line. ``trust_model=True`` uses SB3's full load instead
    (``RecurrentPPO.load``, which unpickles the zip's objects and so runs any code stored in it)."""
    from pathlib import Path

    if target.endswith(".zip") or Path(target).is_file():
        if not Path(target).exists():
            raise BadInput(f"{target} does not exist; pass a saved RecurrentPPO model.zip or an env id")
        # a FIFO, socket or device is refused without being waited on, in one line that says so
        open_regular(target, "pass a saved RecurrentPPO model.zip or an env id").close()
        env = None
        if env_id is not None:
            from stable_baselines3.common.env_util import make_vec_env

            training.check_env_id(env_id)
            env = sb3_env(make_vec_env(env_id, n_envs=1, seed=0))
        if not trust_model:
            from lstm_probe.integrations.sb3 import model_zip

            return model_zip.load(target, env), env is not None
        from sb3_contrib import RecurrentPPO

        try:
            model = RecurrentPPO.load(target, env=env, device="cpu")
        except Exception as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise BadInput(f"cannot load {target} as a RecurrentPPO model: {msg}") from None
        from lstm_probe.integrations.sb3 import model_zip

        model_zip.runnable(target, dict(getattr(model, "policy_kwargs", None) or {}))
        model_zip.check_weights(target, model.policy.state_dict())
        return model, env is not None
    t = dataclasses.replace(train or TrainOptions(), n_steps=64, batch_size=64)
    return training.build(target, t, build_options), True


_NO_LSTM = (
    "lstm-probe arch reads sb3-contrib RecurrentPPO models (MlpLstmPolicy, CnnLstmPolicy, MultiInputLstmPolicy): "
    "train one with sb3_contrib.RecurrentPPO or `lstm-probe run`"
)


def sb3_env(env: Any) -> Any:
    """``env`` as RecurrentPPO sees it once given to the algorithm (``RecurrentPPO(env=...)`` and
    ``RecurrentPPO.load(env=...)`` both call ``_wrap_env``): a channel-last image observation (its own or a
    Dict's) transposed to channel-first by ``VecTransposeImage``, the space the model's policy was built on."""
    from sb3_contrib import RecurrentPPO

    return RecurrentPPO._wrap_env(env, verbose=0, monitor_wrapper=False)


def _refuse_non_recurrent(target: str) -> None:
    """A model.zip of a policy without an LSTM (SB3's PPO, say) is refused in one line that says what
    ``arch`` reads, before either loader tries it (SB3's would fail on the missing ``lstm_actor``)."""
    import re

    from lstm_probe.integrations.sb3.model_zip import read_data

    try:  # within the safe reader's bounds (zip directory, data's size and JSON items)
        entry = read_data(target).get("policy_class")
    except Exception:  # not a zip, no data, not JSON, over a bound: the loaders say what is wrong
        return
    if not isinstance(entry, dict) or str(entry.get("__module__", "")).startswith("sb3_contrib."):
        return
    m = re.match(r"<function (\w+)\.", str(entry.get("__init__", "")))
    name = m.group(1) if m else "policy"
    raise BadInput(f"{target} holds the policy {name} ({entry.get('__module__')}), which has no LSTM; {_NO_LSTM}")
