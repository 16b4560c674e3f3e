"""load() and pair() refuse, in one line, a filter value the log cannot hold (by its footer statistics, before any
row is read), and still give an empty frame where the values exist but their combination selects nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import lstm_probe
from lstm_probe.errors import BadInput
from lstm_probe.log import budget

SAMPLE = Path(__file__).resolve().parents[1] / "sample_runs"
ENVS = 4


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> Path:
    """A real 4-env log of an own loop: iterations 0 and 1, each a 3-step rollout of actor and critic and a
    train call of the actor; env 3's episode 1 starts at the second iteration's last step."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("filters") / "own.parquet"
    actor, critic = nn.LSTM(3, 8), nn.LSTM(3, 8)
    envs = list(range(ENVS))
    with torch.no_grad(), lstm_probe.trace(nn.ModuleDict({"actor": actor, "critic": critic}), path) as probe:
        for it in range(2):
            for t in range(3):
                step = 3 * it + t
                episode = [0, 0, 0, int(step == 5)]
                with probe.tag(phase="rollout", iteration=it, env=envs, env_step=[step] * ENVS, episode=episode):
                    actor(torch.randn(1, ENVS, 3))
                    critic(torch.randn(1, ENVS, 3))
            with probe.tag(phase="train", iteration=it, epoch=0, minibatch=0):
                actor(torch.randn(3, ENVS, 3))
    return path


@pytest.mark.parametrize(
    ("asked", "held"),
    [
        ({"env": 5}, "its env values are 0..3"),
        ({"env": [4, 7]}, "its env values are 0..3"),
        ({"phase": "bogus"}, "a phase is one of rollout"),
        ({"phase": "value"}, "its phase values are 'rollout', 'train'"),
        ({"module": "policy"}, "its module values are 'actor'..'critic'"),
        ({"iteration": 2}, "its iteration values are 0..1"),
        ({"layer": 1}, "its layer values are 0"),
        ({"episode": 9}, "its episode values are 0..1"),
        ({"worker": 0}, "every row leaves worker null (one process wrote the log)"),
    ],
)
def test_a_value_the_log_cannot_hold_is_refused_in_one_line(log, asked, held):
    with pytest.raises(BadInput) as err:
        lstm_probe.load(log, **asked)
    (name, value), text = next(iter(asked.items())), str(err.value)
    assert "\n" not in text and text.startswith(f"load({name}={value!r}) selects no row")
    assert held in text


def test_the_refusal_reads_no_row(log):
    """Decided from the footer: a 1 MiB memory budget, under what reading any of its row groups would take
    (a read is refused first where it would go over), still gets the filter's refusal."""
    budget.set_limit("1M")
    try:
        cartpole = SAMPLE / "cartpole-4env.parquet"  # 4 envs, its one row group ~7 MiB once read
        with pytest.raises(BadInput, match=r"load\(env=5\) selects no row.*env values are 0\.\.3"):
            lstm_probe.load(cartpole, env=5)
    finally:
        budget.set_limit(None)


def test_values_the_log_holds_select_their_rows_or_nothing(log):
    whole = lstm_probe.load(log, vectors=False)
    assert set(whole["env"].dropna()) == set(range(ENVS))
    # each value exists; together they select nothing: an empty frame with the log's columns
    none = lstm_probe.load(log, env=3, episode=1, iteration=0, vectors=False)
    assert len(none) == 0 and list(none.columns) == list(whole.columns)
    assert len(lstm_probe.load(log, phase="train", module="critic", vectors=False)) == 0
    # a list some of whose values the log holds selects those
    some = lstm_probe.load(log, env=[3, 9], iteration=list(range(100)), vectors=False)
    assert len(some) == len(whole[whole["env"] == 3]) > 0


def test_rllib_logs_refuse_a_worker_they_lack():
    rllib = SAMPLE / "cartpole-rllib"
    assert len(lstm_probe.load(rllib, worker=1, env=0, vectors=False))
    with pytest.raises(
        BadInput, match=r"load\(worker=2\) selects no row: the log holds no worker 2; its worker values are 1"
    ):
        lstm_probe.load(rllib, worker=2, vectors=False)


def test_pair_refuses_an_iteration_past_the_last():
    cartpole = SAMPLE / "cartpole-4env.parquet"
    assert len(lstm_probe.pair(cartpole, iteration=3))
    with pytest.raises(BadInput, match=r"pair\(iteration=4\) selects no row.*iteration values are 0\.\.3"):
        lstm_probe.pair(cartpole, iteration=4)
    with pytest.raises(BadInput, match=r"pair\(phase='value'\) selects no row"):
        lstm_probe.pair(cartpole, phase="value")
