"""``lstm-probe run --framework torchrl``: a small PPO with an LSTM policy, built from TorchRL's own
components (GymEnv, InitTracker, StepCounter, LSTMModule and its primer, SyncDataCollector, GAE,
ClipPPOLoss), trained with the probe on the CPU; the policy's state dicts saved beside the log (``run.parquet``
-> ``run.model.pt``: ``{"lstm_probe": "torchrl", "config": build()'s arguments, "actor": ..., "critic": ...}``,
read with ``torch.load(path, weights_only=True)``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lstm_probe.capture import life
from lstm_probe.deploy import saved
from lstm_probe.errors import BadInput
from lstm_probe.integrations.torchrl import arch as analysis
from lstm_probe.log.layout import check_output
from lstm_probe.options import (
    CaptureOptions,
    Measure,
    RunResult,
    TrainOptions,
    check_env_count,
    check_env_id,
    check_envs,
    check_size,
    route,
    settle,
)

__all__ = ["arch", "build", "modules", "run"]

GAMMA, LAMBDA, CLIP = 0.99, 0.95, 0.2
"""The discount, GAE's lambda and PPO's clip range the run trains with (ClipPPOLoss's own default clip)."""
MAX_ENVS = 1024
"""Most envs a torchrl run makes: a SerialEnv of GymEnvs, made and stepped one after another (1,024 CartPoles
take 13 s to make; 65,536 would take a quarter of an hour)."""


def build(
    env_id: str,
    *,
    n_envs: int,
    hidden_size: int,
    seed: int,
    num_layers: int = 1,
    cell: str = "lstm",
    recurrent_backend: str = "pad",
) -> tuple[Any, Any, Any, nn.Module]:
    """(env, actor, critic, recurrent module): ``env_id`` through TorchRL's GymEnv (``n_envs`` of them in a
    SerialEnv) with InitTracker, StepCounter and the module's primer; an actor and a critic sharing one
    ``LSTMModule`` (or ``GRUModule``, ``cell='gru'``) that reads the observation."""
    from torchrl.envs import Compose, DoubleToFloat, GymEnv, InitTracker, SerialEnv, StepCounter, TransformedEnv

    check_env_id(env_id)
    torch.manual_seed(seed)
    base = SerialEnv(n_envs, lambda: GymEnv(env_id)) if n_envs > 1 else GymEnv(env_id)
    env = TransformedEnv(base, Compose(InitTracker(), StepCounter(), DoubleToFloat()))
    env.set_seed(seed)
    obs = int(env.observation_spec["observation"].shape[-1])
    spec = env.action_spec
    if not hasattr(spec.space, "n") and (len(spec.shape) != 1 + (n_envs > 1) or not hasattr(spec.space, "low")):
        raise BadInput(f"{env_id}: the torchrl run trains discrete or flat bounded (Box) action envs only")
    actor, critic, rnn = modules(
        obs, spec, hidden_size=hidden_size, num_layers=num_layers, cell=cell, recurrent_backend=recurrent_backend
    )
    env.append_transform(rnn.make_tensordict_primer())
    return env, actor, critic, rnn


def modules(
    obs: int, spec: Any, *, hidden_size: int, num_layers: int = 1, cell: str = "lstm", recurrent_backend: str = "pad"
) -> tuple[Any, Any, Any]:
    """(actor, critic, recurrent module) of :func:`build`, for ``obs`` observation values and the one-hot
    action spec ``spec``: one ``LSTMModule`` (``GRUModule``, ``cell='gru'``) reading ``observation``, shared by
    a ``ProbabilisticActor`` (a linear head to ``logits``, ``OneHotCategorical``) and a critic (a linear
    ``ValueOperator``). The deploy loader (``deployed.py``) builds a saved policy with it."""
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.modules import GRUModule, LSTMModule, OneHotCategorical, ProbabilisticActor, ValueOperator

    cls = GRUModule if cell == "gru" else LSTMModule
    rnn = cls(
        input_size=obs,
        hidden_size=hidden_size,
        num_layers=num_layers,
        in_key="observation",
        out_key="embed",
        recurrent_backend=recurrent_backend,
    )
    if hasattr(spec.space, "n"):
        head = TensorDictModule(nn.Linear(hidden_size, int(spec.space.n)), in_keys=["embed"], out_keys=["logits"])
        actor = ProbabilisticActor(
            TensorDictSequential(rnn, head),
            in_keys=["logits"],
            spec=spec,
            distribution_class=OneHotCategorical,
            return_log_prob=True,
        )
    else:  # a Box: loc and scale from the head (NormalParamExtractor), a TanhNormal on the action's bounds
        from tensordict.nn import NormalParamExtractor
        from torchrl.modules import TanhNormal

        width = int(spec.shape[-1])
        params = nn.Sequential(nn.Linear(hidden_size, 2 * width), NormalParamExtractor())
        head = TensorDictModule(params, in_keys=["embed"], out_keys=["loc", "scale"])
        low, high = (torch.as_tensor(b, dtype=torch.float32).reshape(-1, width)[0] for b in (spec.low, spec.high))
        actor = ProbabilisticActor(
            TensorDictSequential(rnn, head),
            in_keys=["loc", "scale"],
            spec=spec,
            distribution_class=TanhNormal,
            distribution_kwargs={"low": low, "high": high},
            return_log_prob=True,
        )
    critic = TensorDictSequential(rnn, ValueOperator(nn.Linear(hidden_size, 1), in_keys=["embed"]))
    return actor, critic, rnn


ARCH_OPTIONS = ("shared_lstm", "hidden_size", "rnn_type", "lstm_layers", "example")
"""The keywords :func:`arch` takes (the CLI's arch flags that apply to TorchRL; ``example``: a pair's, see
``torchrl/arch.py``)."""


def arch(target: Any, **options: Any) -> Any:
    """Architecture and measured gradient flow (``lstm-probe arch --framework torchrl``) of ``target``: an env
    id (the actor and critic :func:`run` builds, which share one ``LSTMModule``, or ``GRUModule`` with
    ``rnn_type='gru'``; ``lstm_layers`` [1], ``hidden_size`` [32]; ``shared_lstm`` is not an option: the run
    shares), or a pair ``(actor, critic)`` of the user's modules, analysed as they are (``torchrl/arch.py``)."""
    unknown = sorted(set(options) - set(ARCH_OPTIONS))
    if unknown:
        raise BadInput(f"arch --framework torchrl has no option {unknown[0]!r}; it takes {', '.join(ARCH_OPTIONS)}")
    hidden_size, lstm_layers = options.get("hidden_size"), options.get("lstm_layers")
    rnn_type = options.get("rnn_type") or "lstm"
    if isinstance(target, tuple | list) and len(target) == 2 and all(isinstance(m, nn.Module) for m in target):
        actor, critic = target
        return analysis.arch(actor, critic, example=options.get("example"))
    if not isinstance(target, str | os.PathLike):
        raise BadInput(
            f"arch takes an env id or a pair (actor, critic) of TorchRL modules, not {type(target).__name__}"
        )
    if rnn_type not in ("lstm", "gru"):
        raise BadInput(f"--rnn-type must be lstm or gru, not {rnn_type!r}")
    with analysis._rng_kept(torch.device("cpu")):
        env, actor, critic, _ = build(
            os.fspath(target),
            n_envs=1,
            hidden_size=hidden_size or 32,
            seed=0,
            num_layers=lstm_layers or 1,
            cell=rnn_type,
        )
        env.close()
    return analysis.arch(actor, critic)


def run(
    env_id: str,
    out: str | None = None,
    *,
    options: CaptureOptions | None = None,
    train: TrainOptions | None = None,
    measure: Measure | None = None,
    command: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    **overrides: Any,
) -> RunResult:
    """Train TorchRL PPO with an LSTM policy on ``env_id`` (a gymnasium id) with the probe; returns a
    RunResult. ``n_envs`` envs [1] in a SerialEnv, ``n_steps`` [128] steps each per collector batch,
    ``n_epochs`` [4] passes of the loss over the whole batch (one minibatch: the rows are whole
    trajectories), ``hidden_size`` [32], CPU; ``measure`` (:class:`~lstm_probe.options.Measure`):
    ``capture_obs``, ``what_if`` (with ``what_if_every``, ``burn_in``) and ``memory`` (``memory_every``), measured
    on a copy of the ClipPPOLoss before each epoch's loss (``TorchRLProbe.measure_batch``; whatif.py, memory.py)."""
    from torchrl.collectors import Collector
    from torchrl.modules import set_recurrent_mode
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    from lstm_probe.integrations.torchrl.hooks import TorchRLProbe
    from lstm_probe.integrations.torchrl.names import find_modules

    cap, tr, own = route(overrides, (CaptureOptions, TrainOptions, Measure), "run --framework torchrl")
    if out is not None:
        cap["out"] = out
    opts = settle(CaptureOptions, options, cap)
    t = settle(TrainOptions, train, tr)
    trl = settle(Measure, measure, own)
    if trl.info_keys:
        raise BadInput("--info is not built for --framework torchrl yet (--capture-obs keeps the observations)")
    whole = t.n_envs * (t.n_steps or 128)
    if t.batch_size is not None and t.batch_size != whole:
        raise BadInput(
            f"--batch-size {t.batch_size}: the torchrl run trains on each collector batch whole (n_envs x n_steps "
            f"= {whole:,} here, one minibatch of whole trajectories); drop it, or set --n-steps or --n-envs"
        )
    check_envs(opts, t)
    check_output(Path(os.fspath(opts.out)), force=opts.force, is_dir=opts.directory)  # before anything is built
    saved_as = saved.beside(opts.out, "model.pt")  # the policy's state dicts, for `lstm-probe export`
    saved.check_free(saved_as, opts.force)
    torch.set_num_threads(t.torch_threads or 1)
    what = "envs for --framework torchrl (a SerialEnv makes and steps them one by one); sb3 takes more"
    check_env_count(t.n_envs, MAX_ENVS, what)
    n_steps, hidden = t.n_steps or 128, t.hidden_size or 32
    check_size(t, n_steps=n_steps, hidden_size=hidden, lstms=1)  # before any env is made
    # the train rows' drift and the provenance check against the collector's batch: n_steps per env
    opts = dataclasses.replace(opts, reference_window=opts.reference_window or n_steps)
    seed = t.seed or 0
    env, actor, critic, rnn = build(env_id, n_envs=t.n_envs, hidden_size=hidden, seed=seed)
    frames = n_steps * t.n_envs
    collector = Collector(env, actor, frames_per_batch=frames, total_frames=max(frames, t.steps))
    adv = GAE(gamma=GAMMA, lmbda=LAMBDA, value_network=critic, average_gae=True, deactivate_vmap=True)
    loss_module = ClipPPOLoss(actor, critic, clip_epsilon=CLIP)
    lr = t.learning_rate or 3e-4
    optim = torch.optim.Adam(loss_module.parameters(), lr=lr)
    metadata = {
        "command": command,
        "env_id": env_id,
        "total_timesteps": t.steps,
        "n_envs": t.n_envs,
        "seed": seed,
        "algorithm": "PPO",
        "policy": f"{type(actor).__name__}({type(rnn).__name__})",
        "hyperparameters": {
            "n_steps": n_steps,
            "batch_size": frames,  # the whole collector batch: one minibatch of whole trajectories
            "n_epochs": t.n_epochs or 4,
            "learning_rate": lr,
            "gamma": GAMMA,
            "gae_lambda": LAMBDA,
            "clip_range": CLIP,
            "frames_per_batch": frames,
            "total_frames": collector.total_frames,
            "recurrent_backend": rnn.recurrent_backend,
            "hidden_size": hidden,
        },
    }
    epochs = t.n_epochs or 4
    measured = {"measure": trl, "loss": loss_module, "optimizer": optim, "epochs": epochs, "minibatches": 1}
    probe = TorchRLProbe(find_modules([actor, critic]), opts, metadata, **measured)
    probe.start()

    def loop() -> Iterator[int]:
        done = 0
        for data in collector:
            with torch.no_grad(), set_recurrent_mode(True):
                adv(data)
            for epoch in range(epochs):
                probe.measure_batch(data, epoch=epoch, minibatch=0)  # what-if and memory, on copies (if asked)
                with probe.tag(epoch=epoch, minibatch=0), set_recurrent_mode(True):
                    losses = loss_module(data)
                loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                optim.zero_grad()
                loss.backward()
                optim.step()
            collector.update_policy_weights_()
            done += data.numel()
            yield done

    def close(completed: bool, stop_reason: str | None, done: int) -> Path | None:
        return probe.close(completed=completed, stop_reason=stop_reason, num_timesteps=done)

    def save() -> Path:
        config: dict[str, Any] = {"env_id": env_id, "hidden_size": hidden, "num_layers": 1, "cell": "lstm"}
        bounds = actor.module[-1].distribution_kwargs or {}  # a Box's TanhNormal: the bounds it maps onto
        if "low" in bounds:
            config["low"], config["high"] = bounds["low"].tolist(), bounds["high"].tolist()
        state = {"lstm_probe": "torchrl", "config": config, "actor": actor.state_dict(), "critic": critic.state_dict()}
        return saved.write(saved_as, lambda f: torch.save(state, f))

    return life.train(
        loop(), close, out=opts.out, total=t.steps, progress=progress, cleanup=collector.shutdown, save=save
    )
