"""``lstm-probe run --framework rsl_rl``: rsl_rl's OnPolicyRunner (PPO, a small recurrent actor-critic) trained
with the probe attached; its checkpoint saved beside the log (``run.parquet`` -> ``run.model.pt``)."""

from __future__ import annotations

import contextlib
import io
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from lstm_probe.capture import life
from lstm_probe.deploy import saved
from lstm_probe.errors import BadInput
from lstm_probe.integrations import devices
from lstm_probe.integrations.rsl_rl import arch as analysis
from lstm_probe.integrations.rsl_rl.envs import GymVecEnv, TorchPendulumVecEnv
from lstm_probe.integrations.rsl_rl.options import RslRl
from lstm_probe.integrations.rsl_rl.runners import attach
from lstm_probe.log.layout import check_output
from lstm_probe.options import (
    CaptureOptions,
    Measure,
    Placement,
    RunResult,
    TrainOptions,
    check_env_count,
    check_envs,
    check_size,
    default,
    route,
    settle,
)

__all__ = ["arch", "make_env", "run", "train_cfg"]

TORCH_ENV = "Pendulum-v1"
MAX_GYM_ENVS = 8192
"""Most gymnasium envs an rsl_rl run makes (one Python object each, in a SyncVectorEnv: 4,096 Pendulums take
5 s to make); --torch-env's batched Pendulum takes up to ``options.MAX_ENVS``."""


def make_env(env_id: str, num_envs: int, *, seed: int, torch_env: bool, device: str) -> Any:
    """``env_id`` as rsl_rl's VecEnv: gymnasium's envs, or (``torch_env``, Pendulum-v1 only) the torch-native
    batched Pendulum without the angular velocity."""
    if torch_env:
        if env_id != TORCH_ENV:
            raise BadInput(f"--torch-env is the torch-native {TORCH_ENV}; got {env_id!r}")
        return TorchPendulumVecEnv(num_envs, seed=seed, device=device)
    return GymVecEnv(env_id, num_envs, seed=seed, device=device)


def train_cfg(
    *,
    num_steps_per_env: int = 24,
    num_mini_batches: int = 4,
    num_learning_epochs: int = 5,
    learning_rate: float,
    rnn_type: str,
    rnn_layers: int,
    hidden_size: int,
    mlp: tuple[int, ...] = (64, 64),
) -> dict[str, Any]:
    """An OnPolicyRunner configuration (rsl-rl-lib 5.5) with a recurrent actor and critic (``RNNModel``)."""
    model = {
        "class_name": "rsl_rl.models.RNNModel",
        "hidden_dims": list(mlp),
        "activation": "elu",
        "rnn_type": rnn_type,
        "rnn_hidden_dim": hidden_size,
        "rnn_num_layers": rnn_layers,
    }
    return {
        "num_steps_per_env": num_steps_per_env,
        "save_interval": 10**9,
        "check_for_nan": True,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "actor": {**model, "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0}},
        "critic": model,
        "algorithm": {
            "class_name": "rsl_rl.algorithms.PPO",
            "num_learning_epochs": num_learning_epochs,
            "num_mini_batches": num_mini_batches,
            "learning_rate": learning_rate,
            "schedule": "adaptive",
            "desired_kl": 0.01,
        },
    }


def build_runner(env: Any, cfg: dict[str, Any]) -> Any:
    """rsl_rl's OnPolicyRunner on the env's device, no log directory (no TensorBoard), its model printout swallowed."""
    from rsl_rl.runners import OnPolicyRunner

    with contextlib.redirect_stdout(io.StringIO()):  # construct_algorithm prints both models
        return OnPolicyRunner(env, cfg, log_dir=None, device=str(env.device))


ARCH_OPTIONS = ("shared_lstm", "hidden_size", "rnn_type", "lstm_layers")
"""The keywords :func:`arch` takes (the CLI's arch flags that apply to rsl_rl)."""


def arch(target: Any, **options: Any) -> Any:
    """Architecture and measured gradient flow (``lstm-probe arch --framework rsl_rl``) of ``target``: an env id
    (the runner ``run`` builds: ``rnn_type`` lstm or gru, ``lstm_layers`` [1], ``hidden_size`` [64]), or an
    ``OnPolicyRunner`` or its algorithm, analysed as it is (``rsl_rl/arch.py``). rsl_rl gives actor and
    critic their own RNN: ``shared_lstm=True`` is refused."""
    unknown = sorted(set(options) - set(ARCH_OPTIONS))
    if unknown:
        raise BadInput(f"arch --framework rsl_rl has no option {unknown[0]!r}; it takes {', '.join(ARCH_OPTIONS)}")
    hidden_size, lstm_layers = options.get("hidden_size"), options.get("lstm_layers")
    rnn_type = options.get("rnn_type") or default(RslRl, "rnn_type")
    if options.get("shared_lstm"):
        raise BadInput("--shared-lstm: rsl_rl's actor and critic each have their own RNN")
    if not isinstance(target, str | os.PathLike):
        return analysis.arch(target)
    RslRl(rnn_type=rnn_type, rnn_layers=lstm_layers or 1)  # checks both
    n = analysis.SEQUENCES
    with analysis._rng_kept(torch.device("cpu")):
        env = make_env(os.fspath(target), n, seed=0, torch_env=False, device="cpu")
        try:
            cfg = train_cfg(
                learning_rate=1e-3, rnn_type=rnn_type, rnn_layers=lstm_layers or 1, hidden_size=hidden_size or 64
            )
            runner = build_runner(env, cfg)
        finally:
            close = getattr(env, "close", None)
            if close is not None:
                close()
    return analysis.arch(runner)


def run(
    env_id: str,
    out: str | os.PathLike[str] | None = None,
    *,
    options: CaptureOptions | None = None,
    train: TrainOptions | None = None,
    rsl_rl: RslRl | None = None,
    placement: Placement | None = None,
    measure: Measure | None = None,
    command: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    **overrides: Any,
) -> RunResult:
    """Train rsl_rl PPO (recurrent actor and critic) on ``env_id`` with the probe; returns a RunResult.

    Settings: ``options`` (:class:`~lstm_probe.options.CaptureOptions`), ``train``
    (:class:`~lstm_probe.options.TrainOptions`), ``rsl_rl`` (:class:`~lstm_probe.integrations.rsl_rl.options.RslRl`),
    ``placement`` (:class:`~lstm_probe.options.Placement`: the runner's and the env's device; ``auto``: CUDA where
    torch sees one),
    ``measure`` (:class:`~lstm_probe.options.Measure`: what-if);
    keyword arguments of their fields' names override them. Defaults: rsl_rl's own where it has them (24 steps
    per env, 5 epochs, learning rate 1e-3 with the adaptive schedule), a 64-unit RNN and (64, 64) heads;
    minibatches of ``batch_size`` timesteps (whole envs: rsl_rl cuts minibatches by env), else 4 (at most
    ``n_envs``). ``steps`` is rounded up to whole iterations of n_envs x n_steps.
    """
    groups = (CaptureOptions, TrainOptions, RslRl, Placement, Measure)
    cap, tr, own, pl, me = route(overrides, groups, "run --framework rsl_rl")
    if out is not None:
        cap["out"] = out
    opts = settle(CaptureOptions, options, cap)
    t = settle(TrainOptions, train, tr)
    r = settle(RslRl, rsl_rl, own)
    p = settle(Placement, placement, pl)
    m = settle(Measure, measure, me)
    check_envs(opts, t)
    check_output(Path(os.fspath(opts.out)), force=opts.force, is_dir=opts.directory)  # before anything is built
    saved_as = saved.beside(opts.out, "model.pt")  # the runner's checkpoint, for `lstm-probe export`
    saved.check_free(saved_as, opts.force)
    if t.shared_lstm:
        raise BadInput("--shared-lstm: rsl_rl's actor and critic each have their own RNN")
    n_envs, n_steps = t.n_envs, t.n_steps or 24
    per_batch = t.batch_size or max(1, n_envs * n_steps // 4)
    mini_batches = min(n_envs, max(1, n_envs * n_steps // per_batch))
    iterations = math.ceil(t.steps / (n_envs * n_steps))
    device = devices.checked(p.device)  # the runner and the env on it (build_runner: the env's device)
    torch.set_num_threads(t.torch_threads or 1)
    if t.seed is not None:
        torch.manual_seed(t.seed)
    if not r.torch_env:
        what = "gymnasium envs for --framework rsl_rl (one Python object each); --torch-env takes more"
        check_env_count(n_envs, MAX_GYM_ENVS, what)
    check_size(t, n_steps=n_steps, hidden_size=t.hidden_size or 64, layers=r.rnn_layers)  # before any env is made
    env = make_env(env_id, n_envs, seed=t.seed or 0, torch_env=r.torch_env, device=device)
    cfg = train_cfg(
        num_steps_per_env=n_steps,
        num_mini_batches=mini_batches,
        num_learning_epochs=t.n_epochs or 5,
        learning_rate=t.learning_rate or 1e-3,
        rnn_type=r.rnn_type,
        rnn_layers=r.rnn_layers,
        hidden_size=t.hidden_size or 64,
    )
    runner = build_runner(env, cfg)
    meta = {
        "command": command,
        "env_id": env_id,
        "total_timesteps": t.steps,  # as asked (sb3, TorchRL and RLlib say the same); trained: whole iterations
        "n_envs": n_envs,
        "seed": t.seed,
    }
    started = time.perf_counter()
    probe = attach(runner, options=opts, measure=m, metadata={**meta, "torch_env": r.torch_env})

    def loop() -> Iterator[int]:
        for i in range(iterations):
            runner.learn(1)
            yield (i + 1) * n_envs * n_steps

    def close(completed: bool, stop_reason: str | None, done: int) -> Path | None:
        return probe.close(completed=completed, stop_reason=stop_reason)  # its own count of env steps

    def save() -> Path:
        # rsl_rl's own checkpoint (OnPolicyRunner.save: model_*.pt's format), its configuration in `infos`
        infos = {"lstm_probe": {"env_id": env_id, "cfg": cfg, "torch_env": r.torch_env}}
        return saved.write(saved_as, lambda f: _checkpoint(runner, f, infos))

    total = iterations * n_envs * n_steps
    cleanup = getattr(env, "close", None)
    # the torch-native env has no gymnasium id whose episodes export could record: it verifies on the log
    verify = "env" if not r.torch_env else ("log" if m.capture_obs else None)
    return life.train(
        loop(),
        close,
        out=opts.out,
        total=total,
        progress=progress,
        cleanup=cleanup,
        started=started,
        save=save,
        verify=verify,
    )


def _checkpoint(runner: Any, f: Any, infos: dict[str, Any]) -> None:
    """What ``rsl_rl/runners/on_policy_runner.py:OnPolicyRunner.save(path, infos)`` writes (``alg.save()`` with
    ``iter`` and ``infos``), into an open file (``save`` takes a path; its upload to an external logger is
    for the runner's own log directory, which this run has none of)."""
    saved_dict = runner.alg.save()
    saved_dict["iter"] = runner.current_learning_iteration
    saved_dict["infos"] = infos
    torch.save(saved_dict, f)
