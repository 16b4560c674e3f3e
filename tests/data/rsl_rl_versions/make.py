"""Makes the checkpoints in this folder with rsl_rl's own code of each release, as Isaac Lab trains and saves
them: a ``model_10.pt`` as that release's ``OnPolicyRunner.save`` writes it, the ``params/agent.yaml`` Isaac Lab
writes beside it (``isaaclab/utils/io/yaml.py:dump_yaml``: ``yaml.dump`` of the runner configuration), and
``recording.npz``: 40 steps of 3 envs run by that release's inference (observations, dones, the deterministic
actions and the values), what ``tests/test_rsl_rl_versions.py`` checks lstm-probe's reading against.

Each release's package comes from rsl_rl's repository at its tag, put first on the path (the tests use only the
files written here):

    git -C RSL_RL archive v2.3.3 rsl_rl | tar -x -C /tmp/rsl/v2.3.3     # and v3.3.0, v4.0.1
    PYTHONPATH=/tmp/rsl/v2.3.3 python tests/data/rsl_rl_versions/make.py v2.3.3

Sizes are small (3 observations, as Pendulum-v1's, 1 action, hidden 8), weights random (the normaliser's
statistics and the action noise included) so that no part is an identity.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import yaml

VERSIONS = {
    # release: (RNN type, layers, std type, observation normalisation)
    "v2.3.3": ("lstm", 1, "scalar", True),
    "v3.3.0": ("gru", 2, "log", True),
    "v4.0.1": ("lstm", 2, "scalar", True),
}
OBS, ACTIONS, HIDDEN, DIMS, ENVS, STEPS = 3, 1, 8, [16, 16], 3, 40


def randomize(module: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, t in module.state_dict().items():
            if not t.is_floating_point():
                continue
            if name.endswith(("_std", "_var", "std")) and "log" not in name:
                t.copy_(0.5 + torch.rand(t.shape, generator=gen))  # positive: a std
            else:
                t.copy_(torch.randn(t.shape, generator=gen) * 0.5)


def main(version: str) -> None:
    import rsl_rl

    assert version in Path(rsl_rl.__file__).as_posix(), f"put rsl_rl {version} first on PYTHONPATH"
    rnn_type, layers, std_type, norm = VERSIONS[version]
    out = Path(__file__).parent / version
    (out / "params").mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(int(version[1]))
    policy_cfg = {
        "class_name": "ActorCriticRecurrent",
        "init_noise_std": 0.7,
        "noise_std_type": std_type,
        # a tuple, as a configclass may hold: yaml.dump writes it as !!python/tuple
        "actor_hidden_dims": tuple(DIMS) if version == "v2.3.3" else DIMS,
        "critic_hidden_dims": list(DIMS),
        "activation": "elu",
        "rnn_type": rnn_type,
        "rnn_hidden_dim": HIDDEN,
        "rnn_num_layers": layers,
    }
    agent: dict = {"seed": 42, "device": "cpu", "num_steps_per_env": 24, "max_iterations": 10}
    if version == "v2.3.3":
        from rsl_rl.modules import ActorCriticRecurrent, EmpiricalNormalization

        policy = ActorCriticRecurrent(OBS, OBS, ACTIONS, **{k: v for k, v in policy_cfg.items() if k != "class_name"})
        normalizers = [EmpiricalNormalization(shape=[OBS], until=1.0e8) for _ in range(2)]
        for n in normalizers:
            randomize(n, gen)
        randomize(policy, gen)
        agent["empirical_normalization"] = norm
        agent["policy"] = policy_cfg
        # rsl_rl/runners/on_policy_runner.py:OnPolicyRunner.save (v2.3.3)
        saved = {"model_state_dict": policy.state_dict(), "optimizer_state_dict": {}, "iter": 10, "infos": None}
        saved["obs_norm_state_dict"] = normalizers[0].state_dict()
        saved["privileged_obs_norm_state_dict"] = normalizers[1].state_dict()
        policy.eval()
        for n in normalizers:
            n.eval()

        def step(obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # OnPolicyRunner.get_inference_policy: act_inference(obs_normalizer(obs)); the critic as in training
            return policy.act_inference(normalizers[0](obs)), policy.evaluate(normalizers[1](obs))

        reset = policy.reset
    elif version == "v3.3.0":
        from rsl_rl.modules import ActorCriticRecurrent
        from tensordict import TensorDict

        cfg = {**policy_cfg, "actor_obs_normalization": norm, "critic_obs_normalization": norm}
        groups = {"policy": ["policy"], "critic": ["policy"]}
        td = TensorDict({"policy": torch.zeros(1, OBS)}, batch_size=[1])
        policy = ActorCriticRecurrent(td, groups, ACTIONS, **{k: v for k, v in cfg.items() if k != "class_name"})
        randomize(policy, gen)
        agent["obs_groups"] = groups
        agent["policy"] = cfg
        # rsl_rl/runners/on_policy_runner.py:OnPolicyRunner.save (v3.3.0)
        saved = {"model_state_dict": policy.state_dict(), "optimizer_state_dict": {}, "iter": 10, "infos": None}
        policy.eval()

        def step(obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            o = TensorDict({"policy": obs}, batch_size=[obs.shape[0]])
            return policy.act_inference(o), policy.evaluate(o)

        reset = policy.reset
    else:
        from rsl_rl.models import RNNModel
        from tensordict import TensorDict

        groups = {"actor": ["policy"], "critic": ["policy"]}
        td = TensorDict({"policy": torch.zeros(1, OBS)}, batch_size=[1])
        common = {
            "hidden_dims": DIMS,
            "activation": "elu",
            "obs_normalization": norm,
            "rnn_type": rnn_type,
            "rnn_hidden_dim": HIDDEN,
            "rnn_num_layers": layers,
        }
        actor_cfg = {"class_name": "RNNModel", **common, "stochastic": True, "init_noise_std": 0.7}
        actor_cfg["noise_std_type"] = std_type
        critic_cfg = {"class_name": "RNNModel", **common, "stochastic": False}
        actor = RNNModel(td, groups, "actor", ACTIONS, **{k: v for k, v in actor_cfg.items() if k != "class_name"})
        critic = RNNModel(td, groups, "critic", 1, **{k: v for k, v in critic_cfg.items() if k != "class_name"})
        for m in (actor, critic):
            randomize(m, gen)
            m.eval()
        agent["obs_groups"] = groups
        agent["actor"], agent["critic"] = actor_cfg, critic_cfg
        # rsl_rl/algorithms/ppo.py:PPO.save and OnPolicyRunner.save (v4.0.1)
        saved = {
            "actor_state_dict": actor.state_dict(),
            "critic_state_dict": critic.state_dict(),
            "optimizer_state_dict": {},
            "iter": 10,
            "infos": None,
        }

        def step(obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            o = TensorDict({"policy": obs}, batch_size=[obs.shape[0]])
            return actor(o), critic(o)

        def reset(dones: torch.Tensor) -> None:
            actor.reset(dones)
            critic.reset(dones)

    torch.save(saved, out / "model_10.pt")
    with open(out / "params" / "agent.yaml", "w") as f:
        yaml.dump(agent, f, default_flow_style=False, sort_keys=False)
    rng = np.random.default_rng(int(version[1]))
    obs = rng.normal(0.0, 2.0, (STEPS, ENVS, OBS)).astype(np.float32)
    dones = (rng.random((STEPS, ENVS)) < 0.1).astype(np.int64)
    actions, values = [], []
    with torch.no_grad():
        for t in range(STEPS):
            a, v = step(torch.as_tensor(obs[t]))
            actions.append(a.numpy().copy())
            values.append(v.numpy().copy())
            reset(torch.as_tensor(dones[t]))  # as Isaac Lab's play.py: policy_nn.reset(dones) after each step
    np.savez(out / "recording.npz", obs=obs, dones=dones, actions=np.stack(actions), values=np.stack(values))
    print(version, sorted(saved), [k for k in saved.get("model_state_dict", saved.get("actor_state_dict", {}))][:6])


if __name__ == "__main__":
    torch.manual_seed(0)
    main(sys.argv[1])
