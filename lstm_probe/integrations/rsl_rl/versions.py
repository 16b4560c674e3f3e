"""An rsl_rl checkpoint of any release, as the state dicts and configurations of rsl_rl 5's ``RNNModel`` actor and
critic that :mod:`~lstm_probe.integrations.rsl_rl.deployed` builds (:func:`models`).

Where the configuration comes from: the checkpoint ``lstm-probe run --framework rsl_rl`` saved holds it
(``infos["lstm_probe"]["cfg"]``); a checkpoint Isaac Lab (or any rsl_rl runner) saved holds none, and its
configuration is the ``params/agent.yaml`` Isaac Lab writes in the run's folder beside ``model_*.pt``
(``isaaclab/utils/io/yaml.py:dump_yaml``: ``yaml.dump`` of the runner configuration; a tuple there is
``!!python/tuple``). Sizes always come from the weights; the configuration gives what the weights do not say
(the activation), and its RNN type is checked against them.

The layouts read (each release's ``OnPolicyRunner.save``; tests/data/rsl_rl_versions/ holds one of each, made
with that release's own code, and the actions and values it computed):

- rsl_rl 5 (``actor_state_dict``, ``critic_state_dict``; ``RNNModel``: ``rnn.rnn.*``, ``mlp.*``,
  ``obs_normalizer.*``, ``distribution.std_param`` or ``log_std_param``); configuration ``actor``/``critic``;
- rsl_rl 4 (the same models, the action noise ``std`` or ``log_std`` on the model itself, ``stochastic``,
  ``init_noise_std``, ``noise_std_type`` in the configuration): ``std`` becomes ``distribution.std_param``;
- rsl_rl 2 and 3 (``model_state_dict`` of ``ActorCriticRecurrent``: ``memory_a.rnn.*``, ``actor.*``,
  ``memory_c.rnn.*``, ``critic.*``, ``std``/``log_std``, rsl_rl 3's ``actor_obs_normalizer.*`` and
  ``critic_obs_normalizer.*``; rsl_rl 2's runner-level normalisers in ``obs_norm_state_dict`` and
  ``privileged_obs_norm_state_dict``); configuration ``policy`` (``class_name: ActorCriticRecurrent``).
  ``ActorCriticRecurrent.act_inference`` is ``Memory`` (one ``nn.LSTM``/``nn.GRU`` step, ``reset(dones)``
  zeroing the done envs' state) then the MLP's output, the Gaussian's mean: rsl_rl 5's ``RNNModel`` with
  ``stochastic_output=False``, on the same weights renamed (``memory_a.rnn`` -> ``rnn.rnn``, ``actor`` ->
  ``mlp``). A state-dependent std (rsl_rl 3-4's ``state_dependent_std``) is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from lstm_probe.errors import BadInput
from lstm_probe.log.budget import read_regular

MODEL = "rsl_rl.models.RNNModel"
AGENT = ("params/agent.yaml", "agent.yaml")
"""Where a checkpoint's configuration is looked for, relative to its folder (Isaac Lab's run folder layout)."""
AGENT_BYTES = 1 << 20
"""An agent.yaml larger than this is refused before it is parsed (Isaac Lab's are a few KB)."""
ACTIVATIONS = ("elu", "selu", "relu", "crelu", "lrelu", "tanh", "sigmoid", "softplus", "gelu", "swish", "mish")
"""``rsl_rl/utils/utils.py:resolve_nn_activation``'s names (``identity`` aside)."""
_NORMALISER = ("_mean", "_var", "_std", "count")
LEGACY = {
    "memory_a": ("actor", "rnn"),
    "actor": ("actor", "mlp"),
    "actor_obs_normalizer": ("actor", "obs_normalizer"),
    "memory_c": ("critic", "rnn"),
    "critic": ("critic", "mlp"),
    "critic_obs_normalizer": ("critic", "obs_normalizer"),
}
"""rsl_rl 2-3's ActorCriticRecurrent entries: which rsl_rl 5 model and part each becomes."""


def models(saved: dict[str, Any], path: str, fix: str) -> tuple[dict[str, Any], dict[str, Any], Any, Any]:
    """``(actor_cfg, critic_cfg, actor_state, critic_state)`` of a checkpoint ``saved`` (read from ``path``):
    rsl_rl 5's configuration entries and state dicts, whatever release wrote it (see the module docstring)."""
    infos = saved.get("infos")
    ours = infos.get("lstm_probe") if isinstance(infos, dict) else None
    cfg = ours.get("cfg") if isinstance(ours, dict) else None
    if isinstance(cfg, dict):
        if not isinstance(cfg.get("actor"), dict) or not isinstance(cfg.get("critic"), dict):
            raise BadInput(f"{path}: its configuration (infos['lstm_probe']['cfg']) has no actor and critic; {fix}")
        return cfg["actor"], cfg["critic"], saved.get("actor_state_dict"), saved.get("critic_state_dict")
    if "actor_state_dict" in saved and "critic_state_dict" in saved:
        agent = _agent(path, fix)
        actor, critic = agent.get("actor"), agent.get("critic")
        if not isinstance(actor, dict) or not isinstance(critic, dict):
            raise BadInput(f"{path}: its agent.yaml has no actor and critic entries (rsl_rl 4 and 5); {fix}")
        actor_state, actor_cfg = _v4(saved["actor_state_dict"], actor, path)
        return actor_cfg, _model_cfg(critic, path, who="critic"), actor_state, saved["critic_state_dict"]
    if "model_state_dict" in saved:
        policy = _agent(path, fix).get("policy")
        if not isinstance(policy, dict) or _name(policy.get("class_name")) != "ActorCriticRecurrent":
            raise BadInput(
                f"{path}: its agent.yaml's policy is not an ActorCriticRecurrent (rsl_rl 2-3); export takes "
                "recurrent policies"
            )
        return _legacy(saved, policy, path)
    raise BadInput(f"{path} is not an rsl_rl checkpoint (OnPolicyRunner.save: actor_state_dict or model_state_dict)")


def arch_flags(path: str) -> str:
    """The ``lstm-probe arch --framework rsl_rl`` flags that rebuild the actor's RNN of the checkpoint at ``path``
    (read as data: ``deploy/saved.py:read_checkpoint``), from its weights (any release's layout: rsl_rl 5's
    ``actor_state_dict`` ``rnn.rnn.*``, 2-3's ``model_state_dict`` ``memory_a.rnn.*``): the gates of
    ``weight_hh_l0`` (4 an LSTM's, 3 a GRU's), its width, the layers; '' where the file does not say."""
    from lstm_probe.deploy.saved import read_checkpoint

    saved = read_checkpoint(path, "")
    state = saved.get("actor_state_dict", saved.get("model_state_dict")) if isinstance(saved, dict) else None
    if not isinstance(state, dict):
        return ""
    prefix = "rnn.rnn." if "rnn.rnn.weight_hh_l0" in state else "memory_a.rnn."
    hh = state.get(prefix + "weight_hh_l0")
    if not isinstance(hh, torch.Tensor) or hh.dim() != 2 or hh.shape[0] not in (3 * hh.shape[1], 4 * hh.shape[1]):
        return ""
    kind = "lstm" if hh.shape[0] == 4 * hh.shape[1] else "gru"
    layers = sum(1 for k in state if k.startswith(prefix + "weight_hh_l") and k[len(prefix) + 11 :].isdigit())
    return f"--rnn-type {kind} --hidden-size {int(hh.shape[1])} --lstm-layers {layers}"


def _agent(path: str, fix: str) -> dict[str, Any]:
    """The ``agent.yaml`` beside checkpoint ``path`` (:data:`AGENT`), read as hostile: a regular file of at
    most :data:`AGENT_BYTES`, plain YAML (a ``!!python/tuple`` read as a list, any other Python tag as
    nothing: no object is built, no name imported)."""
    folder = Path(os.fspath(path)).parent
    where = next((folder / a for a in AGENT if os.path.lexists(folder / a)), None)
    if where is None:
        raise BadInput(
            f"{path} holds no policy configuration, and no params/agent.yaml (the one Isaac Lab writes in the run's "
            f"folder) sits beside it; copy the run's params/agent.yaml beside it, or {fix}"
        )
    if os.path.isfile(where) and os.path.getsize(where) > AGENT_BYTES:  # a FIFO or device: read_regular says
        raise BadInput(f"{where} is larger than {AGENT_BYTES >> 20} MiB, not an agent configuration; {fix}")
    try:
        import yaml
    except ImportError:
        raise BadInput("reading Isaac Lab's agent.yaml needs PyYAML: pip install 'lstm-probe[rsl-rl]'") from None

    class Loader(yaml.SafeLoader):
        pass

    def python(loader: Any, suffix: str, node: Any) -> Any:
        if suffix == "tuple" and isinstance(node, yaml.SequenceNode):
            return loader.construct_sequence(node)
        return None

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", python)
    text = read_regular(where, fix, copies=8)
    try:
        agent = yaml.load(text, Loader=Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadInput(f"{where} is not valid YAML{at}; {fix}") from None
    if not isinstance(agent, dict):
        raise BadInput(f"{where} is not an agent configuration (a mapping); {fix}")
    return agent


def _name(value: Any) -> str:
    """A class name as a configuration writes it (``RNNModel``, ``rsl_rl.models.RNNModel``,
    ``rsl_rl.models:RNNModel``): its last part, or "" for a name outside rsl_rl or not a string."""
    if not isinstance(value, str) or len(value) > 200:
        return ""
    module, _, last = value.replace(":", ".").rpartition(".")
    return last if not module or module.split(".")[0] == "rsl_rl" else ""


def _activation(cfg: dict[str, Any], path: str) -> str:
    value = cfg.get("activation", "elu")
    if not isinstance(value, str) or value.lower() not in ACTIVATIONS:
        raise BadInput(f"{path}: its configuration's activation is not one of rsl_rl's ({', '.join(ACTIVATIONS)})")
    return value.lower()


def _rnn(cfg: dict[str, Any]) -> str:
    value = cfg.get("rnn_type", "lstm")
    return value.lower() if isinstance(value, str) and value.lower() in ("lstm", "gru") else "?"


def _model_cfg(
    cfg: dict[str, Any], path: str, distribution: dict[str, Any] | None = None, who: str = "actor"
) -> dict[str, Any]:
    """Our configuration entry of an rsl_rl 4-5 model entry (its class checked by name, never imported)."""
    name = _name(cfg.get("class_name"))
    if name != "RNNModel":
        raise BadInput(
            f"{path}: its agent.yaml's {who} {f'is {name}, not an RNNModel' if name else 'is not an rsl_rl RNNModel'}; "
            "export writes the actor's and the critic's RNN and takes runs whose actor and critic are both recurrent"
        )
    out: dict[str, Any] = {"class_name": MODEL, "activation": _activation(cfg, path), "rnn_type": _rnn(cfg)}
    dist = cfg.get("distribution_cfg") if distribution is None else distribution
    if isinstance(dist, dict):
        out["distribution_cfg"] = {**dist, "class_name": _name(dist.get("class_name"))}
    return out


def _std_type(state: dict[str, Any], path: str) -> dict[str, Any]:
    if "std" in state:
        return {"class_name": "GaussianDistribution", "std_type": "scalar"}
    if "log_std" in state:
        return {"class_name": "GaussianDistribution", "std_type": "log"}
    raise BadInput(f"{path}: its actor has no std or log_std (a state-dependent std is not supported)")


def _v4(state: Any, cfg: dict[str, Any], path: str) -> tuple[Any, dict[str, Any]]:
    """An actor of rsl_rl 4 (``std``/``log_std`` on the model) or 5 (a ``distribution_cfg``)."""
    if not isinstance(state, dict) or "distribution_cfg" in cfg or not cfg.get("stochastic", True):
        return state, _model_cfg(cfg, path)
    if cfg.get("state_dependent_std"):
        raise BadInput(f"{path}: its actor's std is state-dependent, which export does not support")
    distribution = _std_type(state, path)
    renamed = {_renamed(k): v for k, v in state.items()}
    return renamed, _model_cfg(cfg, path, distribution)


def _renamed(key: str) -> str:
    return {"std": "distribution.std_param", "log_std": "distribution.log_std_param"}.get(key, key)


def _legacy(saved: dict[str, Any], policy: dict[str, Any], path: str) -> tuple[Any, Any, Any, Any]:
    """rsl_rl 2-3's ``ActorCriticRecurrent`` as an rsl_rl 5 actor and critic (see the module docstring)."""
    state = saved["model_state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BadInput(f"{path}: its model_state_dict is not a dict of tensors")
    if policy.get("state_dependent_std"):
        raise BadInput(f"{path}: its actor's std is state-dependent, which export does not support")
    actor: dict[str, Any] = {}
    critic: dict[str, Any] = {}
    models = {"actor": actor, "critic": critic}
    for key, value in state.items():
        head, _, rest = key.partition(".")
        if head in LEGACY:
            who, part = LEGACY[head]
            models[who][f"{part}.{rest}"] = value
        elif key in ("std", "log_std"):
            actor[_renamed(key)] = value
        else:
            raise BadInput(f"{path}: its model_state_dict has an entry an ActorCriticRecurrent does not")
    for which, target in (("obs_norm_state_dict", actor), ("privileged_obs_norm_state_dict", critic)):
        norm = saved.get(which)  # rsl_rl 2's runner-level normalisers (empirical_normalization)
        if isinstance(norm, dict) and set(norm) == set(_NORMALISER):
            target.update({f"obs_normalizer.{k}": v for k, v in norm.items()})
    common = {"class_name": MODEL, "activation": _activation(policy, path), "rnn_type": _rnn(policy)}
    distribution = _std_type(state, path)
    return {**common, "distribution_cfg": distribution}, dict(common), actor, critic
