"""``lstm-probe run --framework rllib``: train RLlib PPO (use_lstm=True) with the probe in every process."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from lstm_probe.capture import life
from lstm_probe.deploy import saved
from lstm_probe.errors import BadInput
from lstm_probe.integrations.rllib.model import arch
from lstm_probe.integrations.rllib.options import Rllib
from lstm_probe.integrations.rllib.probe import _directory, _out, close, probe_config
from lstm_probe.options import (
    CaptureOptions,
    Measure,
    RunResult,
    TrainOptions,
    check_env_id,
    check_envs,
    check_size,
    route,
    settle,
)

__all__ = ["arch", "run"]


def run(
    env_id: str,
    out: str | None = None,
    *,
    options: CaptureOptions | None = None,
    train: TrainOptions | None = None,
    rllib: Rllib | None = None,
    measure: Measure | None = None,
    command: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    **overrides: Any,
) -> RunResult:
    """Train RLlib PPO (use_lstm=True) on ``env_id`` with the probe in every process; returns a RunResult.

    ``options`` (:class:`~lstm_probe.options.CaptureOptions`), ``train``
    (:class:`~lstm_probe.options.TrainOptions`) and ``rllib`` (:class:`~lstm_probe.integrations.rllib.options.Rllib`)
    hold the settings, ``measure`` (:class:`~lstm_probe.options.Measure`) what-if; keyword arguments of their
    fields' names override them (``steps=4000``). ``out`` is a directory [run/]. Defaults follow the sb3 CLI
    where RLlib has no single answer: a rollout fragment of
    ``n_steps`` [128] per env, a train batch of one fragment from every env of every runner, minibatches of
    ``batch_size`` [128] timesteps, ``n_epochs`` [10]; the model is RLlib's default LSTM (lstm_cell_size 256,
    max_seq_len 20) unless ``hidden_size`` / ``max_seq_len`` are given.
    """
    import logging

    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    cap, tr, own, me = route(overrides, (CaptureOptions, TrainOptions, Rllib, Measure), "run --framework rllib")
    if out is not None or options is None:
        cap["out"] = _out(out, options)
    opts = settle(CaptureOptions, options, cap)
    t = settle(TrainOptions, train, tr)
    r = settle(Rllib, rllib, own)
    m = settle(Measure, measure, me)
    check_envs(opts, t)
    steps, n_envs, n_steps = t.steps, t.n_envs, t.n_steps
    env_runners, learners = r.env_runners, r.learners
    check_env_id(env_id)
    saved_as = saved.beside(opts.out, "model.pt")  # the trained RLModule, for `lstm-probe export`
    saved.check_free(saved_as, opts.force)
    fragment = n_steps or 128
    check_size(t, n_steps=fragment, hidden_size=t.hidden_size or 256, lstms=1)  # before ray starts
    training: dict[str, Any] = {} if t.learning_rate is None else {"lr": t.learning_rate}
    model: dict[str, Any] = {"use_lstm": True, "vf_share_layers": t.shared_lstm}
    if t.hidden_size:
        model["lstm_cell_size"] = t.hidden_size
    if r.max_seq_len:
        model["max_seq_len"] = r.max_seq_len
    config = (
        PPOConfig()
        .environment(env_id)
        .env_runners(num_env_runners=env_runners, num_envs_per_env_runner=n_envs, rollout_fragment_length=fragment)
        .learners(num_learners=learners)
        .training(
            train_batch_size_per_learner=fragment * n_envs * max(1, env_runners),
            minibatch_size=t.batch_size or 128,
            num_epochs=t.n_epochs or 10,
            **training,
        )
        .rl_module(model_config=DefaultModelConfig(**model))
        .debugging(seed=t.seed)
    )
    threads = t.torch_threads or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))  # RLlib sets it for actors, not for the driver
    torch.set_num_threads(threads)
    probe_config(
        config, options=opts, measure=m, metadata={"command": command, "total_timesteps": steps, "n_envs": n_envs}
    )
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")
    # RLlib's own warnings (new API stack notice, deprecations) would bury the CLI's one-line output
    logging.getLogger("ray.rllib").setLevel(logging.ERROR)
    if not ray.is_initialized():
        # Each env runner and learner actor reserves one logical CPU; with fewer, Ray would wait for them
        # forever. Logical CPUs may exceed the cores (the actors then share them), so ask for enough.
        cpus = max(os.cpu_count() or 1, env_runners + learners)
        ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR, num_cpus=cpus)
    else:
        have = int(ray.cluster_resources().get("CPU", 0))
        if env_runners + learners > have:
            raise BadInput(
                f"{env_runners} env runner(s) and {learners} learner(s) need {env_runners + learners} CPUs in "
                f"the running Ray cluster, which has {have}; use fewer or start Ray with more (ray.init(num_cpus=N))"
            )
    started = time.perf_counter()
    algo = config.build_algo()

    trained: dict[str, Any] = {}

    def loop() -> Iterator[int]:
        done = 0
        while done < steps:
            result = algo.train()
            done = int(result.get("env_runners", {}).get("num_env_steps_sampled_lifetime", done + 1))
            yield done
        trained["doc"] = _checkpoint(algo)  # training completed: the learner's weights, before algo.stop()

    def close_all(completed: bool, stop_reason: str | None, done: int) -> None:
        close(algo, completed=completed, stop_reason=stop_reason, num_timesteps=done)  # every process's probe

    def save() -> Path:
        return saved.write(saved_as, lambda f: torch.save(trained["doc"], f))

    log = _directory(opts.out) or os.fspath(opts.out)
    return life.train(
        loop(), close_all, out=log, total=steps, progress=progress, cleanup=algo.stop, started=started, save=save
    )


def _checkpoint(algo: Any) -> dict[str, Any]:
    """What ``run`` saves beside its log (``run/`` -> ``run.model.pt``): the learner's RLModule
    (``deployed.py``: :func:`~lstm_probe.integrations.rllib.deployed.checkpoint`), read by ``lstm-probe export``."""
    from lstm_probe.integrations.rllib import deployed

    module, act = deployed.module_of(algo)
    return deployed.checkpoint(module, act.normalize, act.clip)
