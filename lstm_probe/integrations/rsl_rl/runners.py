"""``attach``: the probe for an rsl_rl runner's algorithm (PPO: ``probe.RslRlProbe``; Distillation:
``distill.DistillProbe``)."""

from __future__ import annotations

import os
from typing import Any

from lstm_probe.errors import BadInput
from lstm_probe.integrations.rsl_rl import distill
from lstm_probe.integrations.rsl_rl.probe import RslRlProbe, runner_metadata
from lstm_probe.options import CaptureOptions, Measure, capture_options, route, settle


def attach(
    runner: Any,
    out: str | os.PathLike[str] | None = None,
    *,
    env: Any = None,
    metadata: dict[str, Any] | None = None,
    options: CaptureOptions | None = None,
    measure: Measure | None = None,
    **capture: Any,
) -> RslRlProbe:
    """Attach the probe to an rsl_rl ``OnPolicyRunner`` the user built (or to its algorithm, ``runner.alg``,
    with ``env=`` the VecEnv it steps) and start it; returns the probe, a context manager. Call
    ``runner.learn(...)`` (or your own loop over ``alg.act`` / ``env.step`` / ``alg.process_env_step`` /
    ``alg.compute_returns`` / ``alg.update``), then :meth:`RslRlProbe.close`.

    ``out``: the log [run.parquet]. ``options`` (a :class:`~lstm_probe.options.CaptureOptions`) and keyword
    arguments of its fields' names (``capture='summary'``, ``trace_envs=16``, ``float16``, ``force``, ...) are
    the capture settings; ``measure`` (a :class:`~lstm_probe.options.Measure`) and its fields' names
    (``what_if=True``, ``memory=True``, ``capture_obs=True``) what the probe measures on copies of the models
    and keeps beside the rows (``capture_obs``: rollout rows keep the observation, the actor's groups
    flattened, in the ``obs`` column, ``obs_size`` in the metadata, for linear probes). Attach before training
    starts: the probe counts env steps from here.
    """
    alg = getattr(runner, "alg", runner)
    env = env if env is not None else getattr(runner, "env", None)
    if env is None or not hasattr(alg, "storage"):
        raise BadInput("attach(runner): give an rsl_rl OnPolicyRunner, or its algorithm with env=the VecEnv it steps")
    distilling = hasattr(alg, "student") and hasattr(alg, "teacher") and hasattr(alg, "gradient_length")
    if not distilling and (not hasattr(alg, "actor") or not hasattr(alg, "critic")):
        raise BadInput(
            f"lstm-probe traces rsl_rl's PPO (an actor and a critic) and Distillation (a student and a teacher); "
            f"this runner's algorithm is {type(alg).__name__}, which it does not trace"
        )
    if getattr(alg, "is_multi_gpu", False):
        raise BadInput("lstm-probe traces single-process rsl_rl runs; this one is multi-GPU")
    cap, me = route(capture, (CaptureOptions, Measure), "rsl_rl.attach")
    opts = capture_options(options, out, **cap)
    m = settle(Measure, measure, me)
    if m.info_keys:
        raise BadInput("--info is not built for --framework rsl_rl yet (--capture-obs keeps the observations)")
    if distilling:  # rsl_rl's DistillationRunner (distill.py)
        distill.check(m)
        meta = {**distill.distill_metadata(runner, alg), **(metadata or {})}
        return distill.DistillProbe(alg, env, opts, meta, m).start()
    meta = {**runner_metadata(runner, alg), **(metadata or {})}
    return RslRlProbe(alg, env, opts, meta, m).start()
