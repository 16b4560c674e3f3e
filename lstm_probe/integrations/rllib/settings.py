"""What the log's metadata says about an RLlib run, read from its AlgorithmConfig (``probe_config`` records it for
``run``'s config and a user's own script's alike): :func:`config_metadata`. Imports no Ray."""

from __future__ import annotations

from typing import Any

HYPERPARAMETERS: dict[str, str | None] = {
    **dict.fromkeys(("rollout_fragment_length", "train_batch_size_per_learner", "minibatch_size", "num_epochs")),
    **dict.fromkeys(("lr", "gamma", "clip_param", "vf_clip_param", "entropy_coeff", "vf_loss_coeff", "grad_clip")),
    **dict.fromkeys(("use_kl_loss", "kl_coeff", "kl_target")),
    "lambda": "lambda_",
}
"""The AlgorithmConfig's training settings the log records under ``hyperparameters`` (key: RLlib's name in
its config dict; value: the attribute, where another); ``max_seq_len`` comes from the model config."""


def config_metadata(config: Any) -> dict[str, Any]:
    """What the log's metadata says about an RLlib run, read from its AlgorithmConfig (a user's own script's
    as ``run``'s): the algorithm, env and seed, the run's layout (``rllib``: env runners, learners, envs per
    runner, the LSTM's size and sharing) and the training settings (``hyperparameters``, as RLlib names them:
    :data:`HYPERPARAMETERS`; the one place they are, which the report reads)."""
    model = getattr(config, "model_config", None) or {}
    get = model.get if isinstance(model, dict) else lambda k, d=None: getattr(model, k, d)
    env = config.env if isinstance(config.env, str) else getattr(config.env, "__name__", repr(config.env))
    hyper = {k: getattr(config, HYPERPARAMETERS[k] or k, None) for k in HYPERPARAMETERS}
    hyper["max_seq_len"] = get("max_seq_len")
    return {
        "algorithm": getattr(getattr(config, "algo_class", None), "__name__", None),
        "env_id": env,
        "seed": config.seed,
        "hyperparameters": {k: v for k, v in hyper.items() if _plain(v)},
        "rllib": {  # the facts of RLlib's layout alone: its training settings are under hyperparameters
            "env_runners": config.num_env_runners,
            "learners": config.num_learners,
            "envs_per_env_runner": config.num_envs_per_env_runner,
            "lstm_cell_size": get("lstm_cell_size"),
            "vf_share_layers": get("vf_share_layers"),
        },
    }


def _plain(v: Any) -> bool:
    """Whether ``v`` is a JSON value as it is (a schedule's list of [timestep, value] pairs included)."""
    if isinstance(v, list | tuple):
        return all(_plain(x) for x in v)
    return v is None or isinstance(v, bool | int | float | str)
