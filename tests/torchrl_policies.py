"""A TorchRL actor and critic with an LSTMModule each (states under keys of their own), on 2 CartPole-v1 envs with
InitTracker, StepCounter (unless left out) and the modules' primers: the set-up the TorchRL tests share."""

from pathlib import Path

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


def dropout_run(log: Path) -> None:
    """A 2-layer LSTMModule with dropout 0.5 collected and trained in training mode, into ``log``: the provenance
    check fails on layer 1 alone, by construction (both dropout tests use it)."""
    import torch
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.envs import Compose, DoubleToFloat, GymEnv, InitTracker, SerialEnv, StepCounter, TransformedEnv
    from torchrl.modules import LSTMModule, OneHotCategorical, ProbabilisticActor, ValueOperator, set_recurrent_mode
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    from lstm_probe.integrations.torchrl.hooks import probe

    torch.set_num_threads(1)
    torch.manual_seed(0)
    env = TransformedEnv(
        SerialEnv(2, lambda: GymEnv("CartPole-v1")), Compose(InitTracker(), StepCounter(), DoubleToFloat())
    )
    env.set_seed(0)
    rnn = LSTMModule(
        input_size=4, hidden_size=8, num_layers=2, dropout=0.5, in_keys=["observation", "h", "c"],
        out_keys=["e", ("next", "h"), ("next", "c")],
    )  # fmt: skip
    env.append_transform(rnn.make_tensordict_primer())
    head = TensorDictModule(torch.nn.Linear(8, 2), in_keys=["e"], out_keys=["logits"])
    actor = ProbabilisticActor(
        TensorDictSequential(rnn, head), in_keys=["logits"], spec=env.action_spec,
        distribution_class=OneHotCategorical, return_log_prob=True,
    )  # fmt: skip
    critic = ValueOperator(torch.nn.Linear(4, 1), in_keys=["observation"])
    collector = Collector(env, actor, frames_per_batch=64, total_frames=64)
    adv = GAE(gamma=0.99, lmbda=0.95, value_network=critic, deactivate_vmap=True)
    loss_module = ClipPPOLoss(actor, critic)
    with probe([actor], log, force=True, capture="summary") as p:
        for data in collector:
            with torch.no_grad():
                adv(data)
            with p.tag(epoch=0, minibatch=0), set_recurrent_mode(True):
                loss_module(data)
    collector.shutdown()
