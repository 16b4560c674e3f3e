"""The sb3 framework's ``run``, ``arch`` and ``live`` as the CLI calls them (see
``lstm_probe.integrations.FRAMEWORKS``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lstm_probe.errors import BadInput
from lstm_probe.integrations import sb3_run
from lstm_probe.integrations.sb3_arch import Architecture
from lstm_probe.integrations.sb3_arch import arch as analyse
from lstm_probe.integrations.sb3_metrics import live
from lstm_probe.integrations.sb3_run import parse_hyperparams
from lstm_probe.options import RunResult

__all__ = ["arch", "default_threads", "live", "run"]


def run(env_id: str, *, torch_threads: int | None = None, device: str = "auto", **kwargs: Any) -> RunResult:
    """``lstm_probe.run`` with the CLI's thread default: ``torch_threads`` None takes
    :func:`default_threads`."""
    if torch_threads is None:
        torch_threads = default_threads(env_id, device)
    return sb3_run.run(env_id, torch_threads=torch_threads, device=device, **kwargs)


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
    target: str,
    *,
    env_id: str | None = None,
    trust_model: bool = False,
    shared_lstm: bool = False,
    critic_lstm: bool = True,
    hidden_size: int | None = None,
    lstm_layers: int | None = None,
    hyperparams: Sequence[str] | None = None,
) -> Architecture:
    """Architecture and measured gradient flow of the RecurrentPPO ``run`` would build for an env id, or of
    a saved model.zip (a real rollout when an env is at hand; ``trust_model``: SB3's full load, which
    unpickles the zip)."""
    from lstm_probe.arch import load_model

    _refuse_non_recurrent(target)
    model, rollout = load_model(
        target,
        env_id=env_id,
        trust_model=trust_model,
        shared_lstm=shared_lstm,
        critic_lstm=critic_lstm,
        hidden_size=hidden_size,
        lstm_layers=lstm_layers,
        hyperparams=parse_hyperparams(hyperparams or []),
    )
    policy = getattr(model, "policy", None)
    if not hasattr(policy, "lstm_actor"):
        raise BadInput(f"{target} holds the policy {type(policy).__name__}, which has no LSTM; {_NO_LSTM}")
    return analyse(model, rollout=rollout)


_NO_LSTM = (
    "lstm-probe arch reads sb3-contrib RecurrentPPO models (MlpLstmPolicy, CnnLstmPolicy, MultiInputLstmPolicy): "
    "train one with sb3_contrib.RecurrentPPO or `lstm-probe run`"
)


def _refuse_non_recurrent(target: str) -> None:
    """A model.zip of a policy without an LSTM (SB3's PPO, say) is refused in one line that says what
    ``arch`` reads, before either loader tries it (SB3's would fail on the missing ``lstm_actor``)."""
    import json
    import re
    import zipfile

    from lstm_probe.integrations.sb3_zip import MAX_DATA_BYTES

    try:
        with zipfile.ZipFile(target) as archive:
            if archive.getinfo("data").file_size > MAX_DATA_BYTES:
                return
            entry = json.loads(archive.read("data")).get("policy_class")
    except Exception:  # not a zip, no data, not JSON: the loaders say what is wrong
        return
    if not isinstance(entry, dict) or str(entry.get("__module__", "")).startswith("sb3_contrib."):
        return
    m = re.match(r"<function (\w+)\.", str(entry.get("__init__", "")))
    name = m.group(1) if m else "policy"
    raise BadInput(f"{target} holds the policy {name} ({entry.get('__module__')}), which has no LSTM; {_NO_LSTM}")
