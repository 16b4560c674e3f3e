"""A TorchRL actor and critic with an LSTMModule each (states under keys of their own), on 2 CartPole-v1 envs with
InitTracker, StepCounter (unless left out) and the modules' primers: the set-up the TorchRL tests share."""

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.envs import Compose, DoubleToFloat, GymEnv, InitTracker, SerialEnv, StepCounter, TransformedEnv
from torchrl.modules import LSTMModule, OneHotCategorical, ProbabilisticActor, ValueOperator


def two_lstms(step_counter: bool = True):
    """(env, actor, critic), seeded: an actor (a ProbabilisticActor over its LSTM's 'ea') and a critic over its own
    LSTM's 'ec'."""
    torch.manual_seed(0)
    env = TransformedEnv(
        SerialEnv(2, lambda: GymEnv("CartPole-v1")),
        Compose(InitTracker(), *([StepCounter()] if step_counter else []), DoubleToFloat()),
    )
    env.set_seed(0)
    rnns = {
        r: LSTMModule(
            input_size=4,
            hidden_size=8,
            in_keys=["observation", f"h{r}", f"c{r}"],
            out_keys=[f"e{r}", ("next", f"h{r}"), ("next", f"c{r}")],
        )
        for r in "ac"
    }
    for rnn in rnns.values():
        env.append_transform(rnn.make_tensordict_primer())
    head = TensorDictModule(torch.nn.Linear(8, 2), in_keys=["ea"], out_keys=["logits"])
    actor = ProbabilisticActor(
        TensorDictSequential(rnns["a"], head),
        in_keys=["logits"],
        spec=env.action_spec,
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    critic = TensorDictSequential(rnns["c"], ValueOperator(torch.nn.Linear(8, 1), in_keys=["ec"]))
    return env, actor, critic
