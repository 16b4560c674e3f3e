"""sb3-contrib RecurrentPPO: who shares what between actor and critic, and which loss trains which parameter.

Paths are found by running them: forward pre-hooks on every leaf module record what
``policy.get_distribution`` (the actor path: observation -> action distribution) and
``policy.predict_values`` (the critic path: observation -> value) actually call, so sharing is by
module identity, not by name. Gradient flow is measured: sb3-contrib's policy, value and entropy
losses (as ``ppo_recurrent.py:RecurrentPPO.train`` computes them) are built on one minibatch and
differentiated separately with ``torch.autograd.grad`` (no ``.grad`` is touched, no optimizer step).

Everything runs on a private copy of the policy, made without its hooks (:func:`private_policy`): the
caller's modules are never called, so a user's forward hook sees nothing and no module attribute,
buffer or gradient of theirs changes. The minibatch is a short real rollout when an env is at hand
(``arch(model, rollout=True)``), run by a shallow copy of the model on deep copies of its env and
rollout buffer (only an env that runs in this process is copied; otherwise the minibatch is synthetic).
Inside a probed run it is a synthetic one drawn from a local RNG with deterministic actions. The
global torch, NumPy and ``random`` RNG states are restored afterwards (:func:`_rng_kept`): the caller's
counters, env, RNGs and training stay as they were, bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.errors import BadInput
from lstm_probe.measure.copies import flattened


@dataclass
class ParamFlow:
    """One parameter tensor: where it sits and which losses reach it."""

    name: str
    module: str
    shape: list[int]
    numel: int
    actor_path: bool
    critic_path: bool
    policy_loss: str
    """'yes' (non-zero gradient), 'zero' (connected, zero on this batch) or 'no' (not connected)."""
    value_loss: str
    entropy_loss: str

    @property
    def trained_by(self) -> str:
        p, v = self.policy_loss != "no", self.value_loss != "no"
        return (
            "both"
            if p and v
            else "policy"
            if p
            else "value"
            if v
            else "entropy"
            if self.entropy_loss != "no"
            else "neither"
        )


@dataclass
class ModuleInfo:
    name: str
    kind: str
    params: int
    actor_path: bool
    critic_path: bool


@dataclass
class Architecture:
    """What ``lstm-probe arch`` shows; ``to_dict`` is its JSON."""

    policy: str
    actor_path: list[str]
    critic_path: list[str]
    shared: list[str]
    modules: list[ModuleInfo]
    params: list[ParamFlow]
    batch: str
    verdict: str
    lstm: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for p, src in zip(d["params"], self.params, strict=True):
            p["trained_by"] = src.trained_by
        return d

    def table(self) -> dict[str, str]:
        """Parameter name -> trained_by, the gradient-flow table in one line per tensor."""
        return {p.name: p.trained_by for p in self.params}


@contextlib.contextmanager
def _recording(policy: nn.Module, calls: list[str]) -> Iterator[None]:
    names = {m: n for n, m in policy.named_modules() if n}
    handles = []
    for m, n in names.items():
        if not list(m.children()) or isinstance(m, nn.LSTM):
            handles.append(m.register_forward_pre_hook(lambda mod, args, _n=n: calls.append(_n)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


_GLOBAL_HOOKS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_forward_hooks_always_called",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
)
"""torch.nn.modules.module's hooks on every module (``register_module_forward_hook`` and the like)."""


def private_policy(policy: Any) -> Any:
    """A copy of ``policy`` that runs none of the caller's code: without the hooks on its modules (torch's
    own weight/spectral-norm hooks, which compute weights, stay), without instance attributes that shadow
    its methods (a user's wrappers), without its optimizer. A deep copy; a policy that cannot be
    deep-copied is rebuilt as sb3 loads one (``common/policies.py:BaseModel.load``) and given the very
    parameter and buffer values. The RNG draws of a rebuild are the caller's to undo (:func:`_rng_kept`)."""
    try:
        fresh = _deep_copy(policy)
    except Exception:
        fresh = _rebuilt(policy)
    fresh.optimizer = None
    for m in fresh.modules():
        own = vars(m)
        for name, value in list(own.items()):
            if "hooks" in name and isinstance(value, dict):
                kept = {k: h for k, h in value.items() if type(h).__module__.startswith("torch.nn.utils")}
                value.clear()
                value.update(kept)
            elif callable(value) and not isinstance(value, type) and callable(getattr(type(m), name, None)):
                del own[name]
    return fresh


def _deep_copy(policy: Any) -> Any:
    memo: dict[int, Any] = {}
    skip = [getattr(policy, "optimizer", None)]  # its state: not needed, and as large as the parameters
    dist = getattr(policy, "action_dist", None)
    if dist is not None:  # the last distribution and latents it keeps hold non-leaf tensors (no deepcopy)
        skip += [v for v in vars(dist).values() if not isinstance(v, int | float | bool | str | nn.Module)]
    for obj in skip:
        if obj is not None:
            memo[id(obj)] = None
    for m in policy.modules():
        for name, hooks in vars(m).items():
            if "hooks" in name and isinstance(hooks, dict) and hooks:
                memo[id(hooks)] = type(hooks)()  # not copied: the caller's hooks and what they hold
    return flattened(copy.deepcopy(policy, memo))


def _rebuilt(policy: Any) -> Any:
    kwargs = dict(policy._get_constructor_parameters())
    if hasattr(policy, "lstm_actor"):  # RecurrentActorCriticPolicy leaves its own out (policies.py)
        kwargs.update(
            lstm_hidden_size=policy.lstm_actor.hidden_size,
            n_lstm_layers=policy.lstm_actor.num_layers,
            shared_lstm=policy.shared_lstm,
            enable_critic_lstm=policy.enable_critic_lstm,
            lstm_kwargs=policy.lstm_kwargs,
        )
    fresh = type(policy)(**kwargs).to(policy.device)
    source = dict(itertools.chain(policy.named_parameters(), policy.named_buffers()))
    with torch.no_grad():
        for name, tensor in itertools.chain(fresh.named_parameters(), fresh.named_buffers()):
            tensor.copy_(source[name])
            if isinstance(tensor, nn.Parameter):
                tensor.requires_grad_(source[name].requires_grad)
    return fresh


@contextlib.contextmanager
def _rng_kept(device: torch.device) -> Iterator[None]:
    """Restore the global torch (CPU and ``device``), NumPy and ``random`` RNG states on the way out, and
    keep torch's global module hooks (a user's) out of the calls made meanwhile."""
    import torch.nn.modules.module as torch_module

    np_state, py_state = np.random.get_state(), random.getstate()
    saved = {}
    for name in _GLOBAL_HOOKS:
        hooks = getattr(torch_module, name, None)
        if isinstance(hooks, dict) and hooks:
            saved[name] = dict(hooks)
            hooks.clear()
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
        for name, kept in saved.items():
            getattr(torch_module, name).update(kept)


def _dedupe(seq: list[str]) -> list[str]:
    return list(dict.fromkeys(seq))


def _synthetic_batch(policy: Any, n_seq: int = 2, steps: int = 4) -> dict[str, Any]:
    """A minibatch drawn from the spaces with a local RNG: no global RNG, no env step."""
    from gymnasium import spaces

    rng = np.random.default_rng(0)

    def sample(space: spaces.Space, n: int) -> Any:
        if isinstance(space, spaces.Dict):
            return {k: sample(s, n) for k, s in space.spaces.items()}
        if isinstance(space, spaces.Box):
            low = np.where(np.isfinite(space.low), space.low, -1.0)
            high = np.where(np.isfinite(space.high), space.high, 1.0)
            return rng.uniform(low, high, size=(n, *space.shape)).astype(space.dtype)
        if isinstance(space, spaces.Discrete):
            start, count = int(space.start), int(space.n)
            return rng.integers(start, start + count, size=(n,))
        if isinstance(space, spaces.MultiDiscrete):
            return rng.integers(0, space.nvec, size=(n, *space.nvec.shape))
        if isinstance(space, spaces.MultiBinary):
            return rng.integers(0, 2, size=(n, *np.atleast_1d(space.n)))
        raise TypeError(f"unsupported space {space}")

    n = n_seq * steps
    obs, _ = policy.obs_to_tensor(sample(policy.observation_space, n))
    shape = (policy.lstm_actor.num_layers, n_seq, policy.lstm_actor.hidden_size)
    zeros = torch.zeros(shape, device=policy.device)
    from sb3_contrib.common.recurrent.type_aliases import RNNStates

    states = RNNStates((zeros, zeros), (zeros.clone(), zeros.clone()))
    starts = torch.zeros(n, device=policy.device)
    with torch.no_grad():
        dist, _ = policy.get_distribution(obs, states.pi, starts)
        actions = dist.get_actions(deterministic=True)
    return {
        "observations": obs,
        "actions": actions,
        "lstm_states": states,
        "episode_starts": starts,
        "advantages": torch.as_tensor(rng.normal(size=n), dtype=torch.float32, device=policy.device),
        "returns": torch.as_tensor(rng.normal(size=n), dtype=torch.float32, device=policy.device),
        "old_log_prob": None,
        "mask": torch.ones(n, dtype=torch.bool, device=policy.device),
    }


def _in_process(env: Any) -> bool:
    """Whether a VecEnv (under its wrappers) steps its envs in this process, so a deep copy is its own."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    while hasattr(env, "venv"):  # VecEnvWrapper
        env = env.venv
    return isinstance(env, DummyVecEnv)


def _rollout_batch(model: Any, policy: Any) -> dict[str, Any] | None:
    """One minibatch of a short real rollout, exactly as RecurrentPPO.train would see it, collected by a
    copy of ``model`` (its own env, buffer, counters and logger; ``policy`` the private copy). None when
    the env cannot be copied."""
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import unwrap_vec_normalize

    if model.env is None or not _in_process(model.env):
        return None
    try:
        env = copy.deepcopy(model.env)
        buffer = copy.deepcopy(model.rollout_buffer)
    except Exception:
        return None
    clone = copy.copy(model)  # attributes are rebound on the clone, never changed in place (ppo_recurrent.py)
    clone.env, clone._vec_normalize_env = env, unwrap_vec_normalize(env)
    clone.policy, clone.rollout_buffer = policy, buffer
    clone._custom_logger, clone._logger = True, Logger(folder=None, output_formats=[])
    # reset_num_timesteps (the default) gives the clone new episode-info buffers and resets its env
    _, callback = clone._setup_learn(clone.n_steps * clone.n_envs, None)
    callback.on_training_start(locals(), globals())
    clone.collect_rollouts(env, callback, buffer, n_rollout_steps=clone.n_steps)
    data = next(iter(buffer.get(clone.batch_size)))
    return {
        "observations": data.observations,
        "actions": data.actions,
        "lstm_states": data.lstm_states,
        "episode_starts": data.episode_starts,
        "advantages": data.advantages,
        "returns": data.returns,
        "old_log_prob": data.old_log_prob,
        "mask": data.mask > 1e-8,
    }


def _losses(model: Any, policy: Any, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """sb3-contrib's three loss terms, computed as ppo_recurrent.py:RecurrentPPO.train does (on ``policy``)."""
    from gymnasium import spaces

    actions = batch["actions"]
    if isinstance(policy.action_space, spaces.Discrete):
        actions = actions.long().flatten()
    values, log_prob, entropy = policy.evaluate_actions(
        batch["observations"], actions, batch["lstm_states"], batch["episode_starts"]
    )
    mask = batch["mask"]
    old = batch["old_log_prob"] if batch["old_log_prob"] is not None else log_prob.detach()
    adv = batch["advantages"]
    if getattr(model, "normalize_advantage", True) and mask.sum() > 1:
        adv = (adv - adv[mask].mean()) / (adv[mask].std() + 1e-8)
    ratio = torch.exp(log_prob - old)
    clip = 0.2
    try:
        clip = float(model.clip_range(1.0))
    except Exception:
        pass
    policy_loss = -torch.mean(torch.min(adv * ratio, adv * torch.clamp(ratio, 1 - clip, 1 + clip))[mask])
    value_loss = torch.mean(((batch["returns"] - values.flatten()) ** 2)[mask])
    entropy_loss = -torch.mean(entropy[mask]) if entropy is not None else -torch.mean(-log_prob[mask])
    return {"policy": policy_loss, "value": value_loss, "entropy": entropy_loss}


def arch(model: Any, *, rollout: bool = False) -> Architecture:
    """Architecture and measured gradient flow of a RecurrentPPO model (see the module docstring)."""
    with _rng_kept(model.policy.device):
        return _arch(model, rollout)


def _arch(model: Any, rollout: bool) -> Architecture:
    policy = private_policy(model.policy)
    policy.set_training_mode(False)
    real = _rollout_batch(model, policy) if rollout else None
    batch = real if real is not None else _synthetic_batch(policy)
    note = "" if real is not None or not rollout else " (the env could not be copied)"
    n = int(batch["mask"].sum())
    actor_calls: list[str] = []
    critic_calls: list[str] = []
    obs = batch["observations"]
    one = (lambda x: x[:1]) if not isinstance(obs, dict) else (lambda x: {k: v[:1] for k, v in x.items()})
    shape = (policy.lstm_actor.num_layers, 1, policy.lstm_actor.hidden_size)
    z = torch.zeros(shape, device=policy.device)
    start = torch.zeros(1, device=policy.device)
    with torch.no_grad():
        with _recording(policy, actor_calls):
            policy.get_distribution(one(obs), (z, z), start)
        with _recording(policy, critic_calls):
            policy.predict_values(one(obs), (z, z), start)
    # in training mode, as RecurrentPPO.train runs the policy (sb3_contrib ppo_recurrent.py:train): cuDNN
    # computes no RNN backward in eval mode (the copy's RNG draws are undone by the caller, _rng_kept)
    policy.set_training_mode(True)
    losses = _losses(model, policy, batch)
    named = [(n_, p) for n_, p in policy.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    flows = {}
    for key, loss in losses.items():
        grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
        flows[key] = ["no" if g is None else "yes" if bool(g.abs().sum() > 0) else "zero" for g in grads]
    actor, critic = _dedupe(actor_calls), _dedupe(critic_calls)
    modules = dict(policy.named_modules())
    owner = {}
    for mname, m in modules.items():
        for pname, _ in m.named_parameters(recurse=False):
            owner[f"{mname}.{pname}" if mname else pname] = mname
    rows = []
    for i, (pname, p) in enumerate(named):
        mname = owner.get(pname, "")
        rows.append(
            ParamFlow(
                pname,
                mname,
                list(p.shape),
                p.numel(),
                mname in actor or mname == "",
                mname in critic,
                flows["policy"][i],
                flows["value"][i],
                flows["entropy"][i],
            )
        )
    infos = [
        ModuleInfo(
            n_, type(modules[n_]).__name__, sum(p.numel() for p in modules[n_].parameters()), n_ in actor, n_ in critic
        )
        for n_ in _dedupe(actor + critic)
    ]
    shared = [n_ for n_ in actor if n_ in critic]
    result = Architecture(
        policy=type(policy).__name__,
        actor_path=actor,
        critic_path=critic,
        shared=shared,
        modules=infos,
        params=rows,
        batch=f"{'a real rollout' if real is not None else 'a synthetic'} minibatch of {n} steps{note}",
        verdict="",
        lstm=_lstm_info(policy),
    )
    result.verdict = _verdict(result)
    return result


def _lstm_info(policy: Any) -> dict[str, Any]:
    a = policy.lstm_actor
    return {
        "hidden_size": a.hidden_size,
        "num_layers": a.num_layers,
        "critic": "lstm" if policy.lstm_critic is not None else ("shared" if policy.shared_lstm else "mlp"),
    }


def _trained(rows: list[ParamFlow], prefix: str) -> str:
    kinds = {r.trained_by for r in rows if r.module == prefix or r.module.startswith(prefix + ".")}
    if not kinds:
        return "no loss (no trainable parameters)"
    if kinds == {"both"}:
        return "both losses"
    if kinds == {"policy"}:
        return "the policy loss only"
    if kinds == {"value"}:
        return "the value loss only"
    return " and ".join(sorted(kinds)) + " losses"


def _verdict(a: Architecture) -> str:
    crit = a.lstm["critic"]
    if crit == "lstm":
        text = (
            f"actor and critic have separate LSTMs: lstm_actor is trained by {_trained(a.params, 'lstm_actor')}, "
            f"lstm_critic by {_trained(a.params, 'lstm_critic')}"
        )
    elif crit == "shared":
        text = (
            f"actor and critic share one LSTM (lstm_actor); the critic reads its output detached, so it is "
            f"trained by {_trained(a.params, 'lstm_actor')}"
        )
    else:
        text = f"only the actor has an LSTM (trained by {_trained(a.params, 'lstm_actor')}); the critic is feed-forward"

    def extractor(path: list[str]) -> str:
        names = [m for m in path if "features_extractor" in m]
        return names[0].split(".")[0] if names else ""

    fa, fc = extractor(a.actor_path), extractor(a.critic_path)
    if fa and fa == fc:
        text += f"; the features extractor is shared and trained by {_trained(a.params, fa)}"
    elif fa or fc:
        text += (
            f"; actor and critic have their own features extractors ({fa}: {_trained(a.params, fa)}; "
            f"{fc}: {_trained(a.params, fc)})"
        )
    others = [m for m in a.shared if "features_extractor" not in m and not m.startswith("lstm")]
    if others:
        text += f"; other shared modules: {', '.join(others)}"
    return text + "."


def to_dot(a: Architecture) -> str:
    """Graphviz DOT: actor path and critic path from the observation; shared modules in both colours."""

    def q(s: str) -> str:
        return '"' + s.replace('"', '\\"') + '"'

    info = {m.name: m for m in a.modules}
    lines = [
        "digraph policy {",
        "  rankdir=TB;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica"];',
        '  obs [label="observation", fillcolor="#eeeeee"];',
        '  dist [label="action distribution", fillcolor="#cfe2ff"];',
        '  value [label="value", fillcolor="#ffe5b4"];',
    ]
    for m in a.modules:
        color = "#d9f2d9" if m.actor_path and m.critic_path else "#cfe2ff" if m.actor_path else "#ffe5b4"
        label = q(m.name + "\\n" + f"{m.kind}, {m.params:,} params")
        lines.append(f'  {q(m.name)} [label={label}, fillcolor="{color}"];')
    for path, end, color in ((a.actor_path, "dist", "#1f5fbf"), (a.critic_path, "value", "#c06000")):
        chain = ["obs", *[p for p in path if p in info], end]
        for x, y in itertools.pairwise(chain):
            lines.append(
                f"  {q(x) if x not in ('obs', 'dist', 'value') else x} -> "
                f'{q(y) if y not in ("obs", "dist", "value") else y} [color="{color}"];'
            )
    lines.append("}")
    return "\n".join(lines) + "\n"


def summary(model: Any) -> dict[str, Any]:
    """The compact architecture record stored in every run log's metadata (synthetic batch, RNG-free)."""
    a = arch(model, rollout=False)
    return {
        "actor_path": a.actor_path,
        "critic_path": a.critic_path,
        "shared": a.shared,
        "verdict": a.verdict,
        "gradient_flow": a.table(),
        "batch": a.batch,
    }


def render(source: str, path: Any, fmt: str) -> None:
    """Render DOT with Graphviz's ``dot``; a clear error when it is not installed."""
    import shutil
    import subprocess

    exe = shutil.which("dot")
    if exe is None:
        raise BadInput(f"--{fmt} needs Graphviz's `dot` (apt-get install graphviz); --dot FILE writes the source")
    r = subprocess.run([exe, f"-T{fmt}", "-o", str(path)], input=source, text=True, capture_output=True)
    if r.returncode:
        raise BadInput(f"dot failed: {r.stderr.strip().splitlines()[0] if r.stderr.strip() else r.returncode}")
