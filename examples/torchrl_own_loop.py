"""Your own TorchRL loop with the probe: a recurrent PPO on CartPole-v1 (LSTMModule, GAE, ClipPPOLoss).

Run: python examples/torchrl_own_loop.py && lstm-probe report torchrl_run.parquet
Needs: pip install '.[torchrl]' (lstm-probe's extra torchrl)
"""

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.collectors import Collector
from torchrl.envs import Compose, DoubleToFloat, GymEnv, InitTracker, StepCounter, TransformedEnv
from torchrl.modules import LSTMModule, OneHotCategorical, ProbabilisticActor, ValueOperator, set_recurrent_mode
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from lstm_probe.integrations.torchrl import probe

torch.manual_seed(0)
# InitTracker sets is_init; StepCounter gives the probe each step's place in its episode
env = TransformedEnv(GymEnv("CartPole-v1"), Compose(InitTracker(), StepCounter(), DoubleToFloat()))
lstm = LSTMModule(input_size=4, hidden_size=32, in_key="observation", out_key="embed", recurrent_backend="pad")
env.append_transform(lstm.make_tensordict_primer())
head = TensorDictModule(torch.nn.Linear(32, 2), in_keys=["embed"], out_keys=["logits"])
actor = ProbabilisticActor(
    TensorDictSequential(lstm, head),
    in_keys=["logits"],
    spec=env.action_spec,
    distribution_class=OneHotCategorical,
    return_log_prob=True,
)
critic = TensorDictSequential(lstm, ValueOperator(torch.nn.Linear(32, 1), in_keys=["embed"]))
collector = Collector(env, actor, frames_per_batch=128, total_frames=512)
advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic, deactivate_vmap=True)
loss_module = ClipPPOLoss(actor, critic)
optim = torch.optim.Adam(loss_module.parameters(), lr=3e-4)

with probe([actor, critic], "torchrl_run.parquet", force=True) as p:
    for data in collector:  # collection: phase 'rollout', one iteration per collector batch
        with torch.no_grad(), set_recurrent_mode(True):
            advantage(data)  # phase 'value'
        for epoch in range(4):
            with p.tag(epoch=epoch, minibatch=0), set_recurrent_mode(True):
                losses = loss_module(data)  # phase 'train'
            loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
            optim.zero_grad()
            loss.backward()
            optim.step()
        collector.update_policy_weights_()
collector.shutdown()
