"""sb3-contrib RecurrentPPO runs (``lstm-probe run``): build a gymnasium env and a RecurrentPPO, train it with
the probe attached (``lstm_probe.run`` is :func:`run`), and save the trained model beside the log
(``run.parquet`` -> ``run.model.zip``: ``deploy/saved.py``)."""

from __future__ import annotations

import ast
import difflib
import inspect
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from lstm_probe.capture import life
from lstm_probe.deploy import saved
from lstm_probe.errors import BadInput, ProbeError, one_line
from lstm_probe.integrations import devices
from lstm_probe.integrations.sb3.options import Build, Measure
from lstm_probe.log.layout import check_output
from lstm_probe.options import (
    CaptureOptions,
    Placement,
    Progress,
    RunResult,
    TrainOptions,
    check_env_id,
    check_envs,
    check_size,
    route,
    settle,
)


def parse_hyperparams(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings to RecurrentPPO keyword arguments (values as Python literals when they parse)."""
    from sb3_contrib import RecurrentPPO

    allowed = [p for p in inspect.signature(RecurrentPPO.__init__).parameters if p not in ("self", "policy", "env")]
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise BadInput(f"--hyperparam {item!r} is not KEY=VALUE, e.g. --hyperparam gamma=0.98")
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else f"; RecurrentPPO takes {', '.join(allowed)}"
            raise BadInput(f"--hyperparam {key}: RecurrentPPO has no such argument{hint}")
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            out[key] = raw
    return out


def _int(value: Any, default: int) -> int:
    """A positive integer setting from --hyperparam, else ``default`` (RecurrentPPO refuses a bad one itself)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def policy_for(observation_space: Any) -> str:
    """The RecurrentPPO policy class that fits an observation space."""
    from gymnasium import spaces
    from stable_baselines3.common.preprocessing import is_image_space

    if isinstance(observation_space, spaces.Dict):
        return "MultiInputLstmPolicy"
    if isinstance(observation_space, spaces.Box) and is_image_space(observation_space, check_channels=False):
        return "CnnLstmPolicy"
    if isinstance(observation_space, spaces.Box | spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary):
        return "MlpLstmPolicy"
    raise BadInput(
        f"RecurrentPPO cannot take {type(observation_space).__name__} observations; "
        "use an env with Box, Discrete, MultiDiscrete, MultiBinary or Dict observations"
    )


def build(
    env_id: str,
    train: TrainOptions | None = None,
    build_options: Build | None = None,
    placement: Placement | None = None,
) -> Any:
    """The RecurrentPPO that ``run`` trains: env, policy class by observation space, sb3-contrib defaults, on
    ``placement``'s device."""
    check_env_id(env_id)
    t, b, device = train or TrainOptions(), build_options or Build(), (placement or Placement()).device
    hyperparams = b.hyperparams
    if hyperparams is not None and not isinstance(hyperparams, Mapping):
        hyperparams = parse_hyperparams(hyperparams)
    kwargs = dict(hyperparams or {})
    seed, n_envs, hidden_size, lstm_layers = t.seed, t.n_envs, t.hidden_size, b.lstm_layers
    shared_lstm, critic_lstm, torch_threads = t.shared_lstm, b.critic_lstm, t.torch_threads
    if shared_lstm and critic_lstm:
        critic_lstm = False  # sb3-contrib asserts against both; --shared-lstm means the critic reads the actor's LSTM

    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env

    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    if device != "auto":
        devices.checked(device)  # sb3 resolves "auto" itself
    given_pk = kwargs.get("policy_kwargs")
    pk: dict[str, Any] = given_pk if isinstance(given_pk, dict) else {}
    check_size(  # before the envs are made (65,536 of them take a minute)
        t,
        n_steps=t.n_steps or _int(kwargs.get("n_steps"), 128),
        hidden_size=hidden_size or _int(pk.get("lstm_hidden_size"), 256),
        layers=lstm_layers or _int(pk.get("n_lstm_layers"), 1),
        lstms=2 if critic_lstm else 1,
    )
    try:
        env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    except Exception as exc:
        msg = one_line(exc, kind=False)
        raise BadInput(f"cannot make env {env_id!r}: {msg}") from None
    try:
        policy = policy_for(env.observation_space)
    except BadInput:
        env.close()
        raise
    policy_kwargs = kwargs.pop("policy_kwargs", None) or {}
    if not isinstance(policy_kwargs, dict):
        env.close()
        raise BadInput(
            "--hyperparam policy_kwargs must be a dict literal, e.g. policy_kwargs=\"{'net_arch': [64]}\", "
            f"not {str(policy_kwargs)[:60]!r}"
        )
    policy_kwargs = dict(policy_kwargs)
    if hidden_size is not None:
        policy_kwargs["lstm_hidden_size"] = hidden_size
    if lstm_layers is not None:
        policy_kwargs["n_lstm_layers"] = lstm_layers
    policy_kwargs["shared_lstm"] = shared_lstm
    policy_kwargs["enable_critic_lstm"] = critic_lstm
    given: dict[str, Any] = {
        "n_steps": t.n_steps,
        "batch_size": t.batch_size,
        "n_epochs": t.n_epochs,
        "learning_rate": t.learning_rate,
    }
    kwargs.update({k: v for k, v in given.items() if v is not None})
    try:
        model = RecurrentPPO(policy, env, seed=seed, device=device, policy_kwargs=policy_kwargs, **kwargs)
    except ProbeError:
        raise
    except Exception as exc:
        env.close()
        msg = one_line(exc, kind=False)
        raise BadInput(f"RecurrentPPO cannot be built with these options: {msg}") from None
    if model.verbose == 0 and model.tensorboard_log is None:
        # sb3 would make an empty SB3-<time> directory in the temp dir on every learn() for a logger that
        # writes nowhere (stable_baselines3/common/logger.py:configure); the same logger, without it
        from stable_baselines3.common.logger import Logger

        model.set_logger(Logger(folder=None, output_formats=[]))
    return model


def run(
    env_id: str,
    out: str | Path | None = None,
    *,
    options: CaptureOptions | None = None,
    train: TrainOptions | None = None,
    build_options: Build | None = None,
    placement: Placement | None = None,
    measure: Measure | None = None,
    command: str | None = None,
    progress: Progress | None = None,
    **overrides: Any,
) -> RunResult:
    """Train RecurrentPPO on ``env_id`` with the probe attached; write the log to ``out`` [run.parquet] and,
    once training completed, the model beside it (``RecurrentPPO.save``: ``run.model.zip``, the result's ``model``).

    The settings come as objects, each declared once with its defaults and checks: ``options``
    (:class:`~lstm_probe.options.CaptureOptions`: the log), ``train``
    (:class:`~lstm_probe.options.TrainOptions`: steps [250], envs, rollout, ...), ``build_options``
    (:class:`~lstm_probe.integrations.sb3.options.Build`: layers, critic LSTM, ``hyperparams``), ``placement``
    (:class:`~lstm_probe.options.Placement`: the device) and
    ``measure`` (:class:`~lstm_probe.integrations.sb3.options.Measure`: what-if, memory, observations).
    Keyword arguments of any of their fields' names override them (``run("Pendulum-v1", steps=4096,
    what_if=True)``); an unknown name is refused. Every option is checked before training starts; those
    left None take sb3-contrib's defaults. ``hyperparams``: RecurrentPPO keyword arguments, as a dict or as
    ``KEY=VALUE`` strings (the CLI's ``--hyperparam``).
    """
    cap, tr, bo, pl, me = route(overrides, (CaptureOptions, TrainOptions, Build, Placement, Measure), "run")
    if out is not None:
        cap["out"] = out
    opts = settle(CaptureOptions, options, cap)
    t = settle(TrainOptions, train, tr)
    b = settle(Build, build_options, bo)
    p = settle(Placement, placement, pl)
    m = settle(Measure, measure, me)
    check_envs(opts, t)
    check_output(Path(os.fspath(opts.out)), force=opts.force, is_dir=opts.directory)
    saved_as = saved.beside(opts.out, "model.zip")  # the trained model, for `lstm-probe export`
    saved.check_free(saved_as, opts.force)
    model = build(env_id, t, b, p)
    env = model.get_env()

    from stable_baselines3.common.callbacks import BaseCallback, CallbackList

    from lstm_probe.integrations.sb3.callback import ProbeCallback

    callbacks: list[BaseCallback] = []
    probe = ProbeCallback(options=opts, measure=m, metadata={"command": command, "env_id": env_id})
    callbacks.append(probe)
    if progress is not None:
        callbacks.append(_ProgressCallback(progress, t.steps))

    def loop() -> Iterator[int]:
        model.learn(t.steps, callback=CallbackList(callbacks))  # progress: every env step (_ProgressCallback)
        yield int(model.num_timesteps)

    def close(completed: bool, stop_reason: str | None, done: int) -> Path | None:
        return probe.close(completed, stop_reason)  # closed as learn() ended, unless it raised

    def save() -> Path:
        return saved.write(saved_as, model.save)  # RecurrentPPO.save: what `lstm-probe export` reads

    from lstm_probe.integrations.sb3.exportable import refusal

    refused = refusal(model.policy)
    return life.train(loop(), close, out=opts.out, total=t.steps, cleanup=env.close, save=save, unexportable=refused)


class _ProgressCallback:  # built lazily so that importing run.py does not import sb3
    def __new__(cls, progress: Progress, total: int) -> Any:
        from stable_baselines3.common.callbacks import BaseCallback

        class _Cb(BaseCallback):
            def _on_step(self) -> bool:
                progress(int(self.model.num_timesteps), total)
                return True

        return _Cb()
