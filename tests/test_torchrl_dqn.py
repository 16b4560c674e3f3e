"""TorchRL's recurrent DQN (its tutorial ``dqn_with_rnn.py``, on CartPole's state): an encoder before an
``LSTMModule`` whose in_key is its out_key ("embed"), a ``QValueModule`` and ``EGreedyModule``, a replay buffer
of whole collector batches, ``DQNLoss(delay_value=True)`` in recurrent mode and ``SoftUpdate``. Probed as
docs/torchrl.md says (``probe([policy, ...])``, ``p.tag(...)`` around the loss)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torchrl")

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import Compose, DoubleToFloat, GymEnv, InitTracker, StepCounter, TransformedEnv, step_mdp
from torchrl.modules import MLP, EGreedyModule, LSTMModule, QValueModule, set_recurrent_mode
from torchrl.objectives import DQNLoss, SoftUpdate

import lstm_probe
from lstm_probe.integrations.torchrl import probe

DISTRIBUTION_CHECKS = False  # what TorchRL sets for the process (see conftest.py)
FRAMES, BATCHES, UTD = 20, 3, 2


def _dqn(hidden: int = 8) -> dict[str, Any]:
    torch.manual_seed(0)
    env = TransformedEnv(GymEnv("CartPole-v1"), Compose(StepCounter(), InitTracker(), DoubleToFloat()))
    env.set_seed(0)
    feature = TensorDictModule(MLP(in_features=4, out_features=8, num_cells=[8]), ["observation"], ["embed"])
    lstm = LSTMModule(input_size=8, hidden_size=hidden, in_key="embed", out_key="embed")  # the tutorial's keys
    env.append_transform(lstm.make_tensordict_primer())
    head = TensorDictModule(MLP(in_features=hidden, out_features=2, num_cells=[8]), ["embed"], ["action_value"])
    policy = TensorDictSequential(feature, lstm, head, QValueModule(spec=env.action_spec))
    explore = TensorDictSequential(policy, EGreedyModule(spec=env.action_spec, eps_init=0.2))
    loss = DQNLoss(policy, action_space=env.action_spec, delay_value=True)
    return {"env": env, "policy": policy, "explore": explore, "loss": loss, "lstm": lstm}


def _train(parts: dict[str, Any], out: Path, before_loss: Any = None, batches: int = BATCHES) -> Any:
    """The tutorial's loop, tiny; ``before_loss(s)`` runs before each loss call. Returns the last sample."""
    torch.set_num_threads(1)
    loss, policy = parts["loss"], parts["policy"]
    updater = SoftUpdate(loss, eps=0.95)
    optim = torch.optim.Adam(policy.parameters(), lr=1e-2)
    collector = Collector(parts["env"], parts["explore"], frames_per_batch=FRAMES, total_frames=FRAMES * batches)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), batch_size=2)
    s = None
    with probe([parts["explore"], policy], out, force=True) as p:
        for data in collector:
            rb.extend(data.unsqueeze(0).to_tensordict())
            for k in range(UTD):
                s = rb.sample()
                if before_loss is not None:
                    before_loss(s)
                with p.tag(epoch=0, minibatch=k), set_recurrent_mode(True):
                    losses = loss(s)
                losses["loss"].backward()
                optim.step()
                optim.zero_grad()
            updater.step()
    collector.shutdown()
    return s


def test_an_lstm_whose_in_key_is_its_out_key_is_re_run_on_its_input(tmp_path):
    """The tutorial's ``in_key="embed", out_key="embed"``: the call's TensorDict holds the LSTM's output under
    its input key once it returns; the training states are the ones TorchRL computed from its input, so the
    provenance check holds (every sample of the first minibatch is the first batch's: drift 0)."""
    _train(_dqn(), tmp_path / "dqn.parquet")
    df = lstm_probe.load(tmp_path / "dqn.parquet", vectors=False)
    first = df[(df.phase == "train") & ~df.padding & (df.iteration == 0) & (df.minibatch == 0)]
    assert len(first) == 2 * FRAMES and first.env_step.notna().all()
    assert first.drift_h.max() < 1e-5 and first.drift_c.max() < 1e-5
    assert lstm_probe.summarize(tmp_path / "dqn.parquet").staleness.provenance_ok is True


def test_a_target_network_call_is_re_run_with_the_target_weights(tmp_path):
    """DQNLoss's target pass runs the module with ``target_value_network_params`` put in (``to_module``): the
    rows of that call are the states TorchRL computed with them, not with the module's own weights."""
    parts = _dqn()
    loss = parts["loss"]
    target = loss.target_value_network_params
    expected: list[np.ndarray] = []

    def before_loss(s: Any) -> None:
        if not expected:  # a target network well apart from the online one
            target.apply_(lambda t: t.data.add_(0.2))
        with torch.no_grad(), set_recurrent_mode(True):  # DQNLoss.forward's two passes, TorchRL's own
            td = s.clone(False)
            with loss.value_network_params.to_module(loss.value_network):
                loss.value_network(td)
            nxt = step_mdp(td, keep_other=False)
            with target.to_module(loss.value_network):
                loss.value_network(nxt)
        expected.append(nxt["embed"].reshape(-1, 8).numpy())  # the top layer's h at every step

    _train(parts, tmp_path / "dqn.parquet", before_loss=before_loss)
    torchrl_h = expected[-1]
    df = lstm_probe.load(tmp_path / "dqn.parquet")
    value = df[(df.phase == "value") & ~df.padding]
    last = value[value.call == value.call.max()]
    assert len(last) == len(torchrl_h)
    logged = lstm_probe.states(last, "h")
    err = np.linalg.norm(logged[:, None, :] - torchrl_h[None, :, :], axis=-1).min(axis=1)
    assert err.max() < 1e-5 * np.linalg.norm(torchrl_h, axis=-1).max()


def test_the_probe_does_not_show_a_once_shown_warning_again(tmp_path):
    """A warning the user's code shows once (the 'default' action: once per place) stays shown once while
    the probe traces: the probe's hooks do not reset the warnings module's record of what was shown."""
    parts = _dqn()
    collector = Collector(parts["env"], parts["explore"], frames_per_batch=FRAMES, total_frames=FRAMES * BATCHES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        with probe(parts["explore"], tmp_path / "w.parquet", force=True):
            for _ in collector:
                warnings.warn("the user's warning", UserWarning, stacklevel=1)
    collector.shutdown()
    assert [str(w.message) for w in caught].count("the user's warning") == 1


def test_the_target_pass_is_linked_to_its_next_samples_and_its_zero_starts_found(tmp_path):
    """DQNLoss's target pass (``value_estimate`` -> ``_next_value``: the value network on
    ``step_mdp(td_copy)``) runs on the batch's next samples: its rows are those samples (env step one on), and
    it starts from the ("next", state) the online pass just wrote over (zeros except at each trajectory's
    end, rnn.py), not from the collected states: the doctor says so, naming the value phase."""
    _train(_dqn(), tmp_path / "dqn.parquet")
    df = lstm_probe.load(tmp_path / "dqn.parquet", vectors=False)
    value = df[(df.phase == "value") & ~df.padding]
    assert value.env_step.notna().all() and not value[value.t == 0].episode_start.any()  # (episode starts: below)
    first = value[(value.iteration == 0) & (value.minibatch == 0)]
    assert sorted(set(first.env_step.astype(int))) == list(range(1, FRAMES + 1))  # the next samples of batch 0
    problems = lstm_probe.summarize(tmp_path / "dqn.parquet").doctor.problems
    zeros = [p for p in problems if p.kind == "train_from_zeros"]
    assert zeros and zeros[0].phase == "value" and "value-estimator sequences" in zeros[0].text


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """One run of eight collector batches: most samples of the later updates are of earlier batches. With the
    trajectory ids of every sample the loss was given, and the next samples' is_init, in loss order."""
    log = tmp_path_factory.mktemp("dqn") / "dqn.parquet"
    seen: list[tuple[np.ndarray, np.ndarray]] = []

    def before_loss(s: Any) -> None:
        seen.append((s["collector", "traj_ids"].numpy().copy(), s["next", "is_init"].numpy().copy()))

    _train(_dqn(), log, batches=8, before_loss=before_loss)
    return log, lstm_probe.summarize(log), seen


def test_the_target_pass_running_on_into_the_next_episode_is_named(replayed):
    """DQNLoss's target pass runs the value network on ``step_mdp(td)``: the next samples, whose is_init is all
    false, so TorchRL runs each 20-step sample row as one sequence, its state carried from one episode into the
    next wherever the row crosses an episode's end (its trajectory id changes). The log marks each such next
    observation an episode start (never a sequence's first step), and the doctor names them in the value phase:
    as many episode starts, in as many sequences, as the samples hold; the verdict counts them in words."""
    log, report, seen = replayed
    assert not any(init.any() for _, init in seen)  # TorchRL splits none of the next pass's rows
    crossings = [traj[:, 1:] != traj[:, :-1] for traj, _ in seen]  # (rows, steps - 1) per loss call
    starts = sum(int(c.sum()) for c in crossings)
    rows = sum(int(c.any(axis=1).sum()) for c in crossings)
    assert 0 < rows and starts > rows  # some rows cross more than one episode's end
    df = lstm_probe.load(log, vectors=False)
    value = df[(df.phase == "value") & ~df.padding & (df.layer == 0)]
    marked = value[value.episode_start]
    assert len(marked) == starts and (marked.t > 0).all() and (marked.episode_step == 1).all()
    assert marked.groupby(["call", "seq"]).ngroups == rows
    episode = value.set_index(["call", "seq", "t"]).episode  # each marked row's episode is not the step before's
    before = episode.loc[list(zip(marked.call, marked.seq, marked.t - 1, strict=True))].to_numpy()
    assert (before >= 0).all() and (before != marked.episode.to_numpy()).all()
    train = df[(df.phase == "train") & ~df.padding & (df.layer == 0)]
    assert not train[train.t > 0].episode_start.any()  # the online pass splits at is_init: no start inside
    (across,) = [p for p in report.doctor.problems if p.kind == "across_episodes"]
    assert across.phase == "value" and across.count == starts
    assert across.text.startswith(
        f"an episode starts inside a value-estimator sequence (GAE's passes or a loss's target network, phase "
        f"value) {starts} times (in {rows} sequences): the state runs on across the episode boundary"
    )
    assert across.text in report.findings
    (line,) = [x for x in report.verdict.lines if x.startswith("not all clear: the doctor reports 2 problems")]
    assert f"the value phase's episode starts inside a sequence the state runs on across, {starts:,} times" in line


def _words(report: Any) -> list[str]:
    """Every line the text report shows (the verdict, each section's lines and panels, what the log lacks, the
    findings)."""
    from lstm_probe.report.section import Line, Panel, Table

    out: list[str] = []
    for blocks in report.text():
        for b in blocks:
            out += [b.text] if isinstance(b, Line) else list(b.lines) if isinstance(b, Panel) else []
            out += [b.title] if isinstance(b, Table) else []
    return out


def test_train_rows_without_a_drift_are_counted_and_left_unjudged(replayed):
    """A replay buffer's samples of earlier collector batches have no drift (the probe holds the current batch's
    rollout states only): the staleness section counts them and the verdict says they are not judged, rather than
    concluding from the measured rows alone that no stored state went stale."""
    log, report, _ = replayed
    df = lstm_probe.load(log, vectors=False)
    train = df[(df.phase == "train") & ~df.padding & (df.layer == 0)]
    missing = int(train.drift_h.isna().sum())
    assert 0 < missing < len(train) and missing > len(train) / 2  # most rows unmeasured, as in the trial
    st = report.staleness
    assert st.unmeasured_rows == missing and st.train_rows == len(train)
    share = f"{100 * (len(train) - missing) / len(train):.0f}%"
    said = [line for line in report.verdict.lines if line.startswith(f"drift measured on {share} of train rows")]
    assert said and "no longer holds" in said[0] and said[0].endswith("not judged")
    assert not any("so no stored state went stale" in line for line in report.verdict.lines)
    assert said[0] in _words(report)  # the staleness section says it too
    assert report.to_dict()["staleness"]["unmeasured_rows"] == missing


def test_the_verdict_points_at_the_doctors_training_side_problem(replayed):
    """The doctor finds the target pass starting from zeros (phase value): the verdict does not read as all clear."""
    _, report, _ = replayed
    assert any(p.kind == "train_from_zeros" and p.phase == "value" for p in report.doctor.problems)
    (line,) = [x for x in report.verdict.lines if x.startswith("not all clear: the doctor reports")]
    count = next(p.count for p in report.doctor.problems if p.kind == "train_from_zeros")
    assert f"(the value phase's sequences that start from zeros, {count:,} times; " in line
    assert "train_from_zeros" not in line and "across_episodes" not in line  # words only


def test_what_if_is_not_suggested_for_a_loss_it_cannot_re_run(replayed):
    """What-if and memory re-run a ClipPPOLoss: a DQNLoss run's log declares neither (the loss is found on the
    stack, no loss= given) and says why, and no line of the report suggests --what-if or --memory."""
    log, report, _ = replayed
    assert report.capabilities.replay is False and report.capabilities.respond is False
    why = lstm_probe.log.reader.read_info(log).metadata["not_measurable"]
    assert set(why) == {"what_if", "memory"} and "DQNLoss" in why["what_if"]
    words = _words(report)
    assert not any("--what-if" in w and "not available" not in w for w in words)
    assert not any("--memory" in w for w in words)
    assert sum("not available for this run" in w and "DQNLoss" in w for w in words) == 3  # verdict, what-if, memory


def test_a_loop_of_updates_is_not_worded_as_epochs(replayed):
    """Every train row is of epoch 0 (``p.tag(epoch=0, minibatch=k)``): the drift is said by the last minibatch of
    an update, from that minibatch's rows, not "in epoch 0", "by the last epoch" or "epoch x N + minibatch"."""
    _, report, _ = replayed
    words = _words(report)
    for ppo in ("in epoch 0", "by the last epoch", "epoch x "):
        assert not any(ppo in w for w in words), ppo
    last = max(r["minibatch"] for r in report.staleness.by_update)
    assert report.verdict.lines[0].startswith(f"training states drifted: by the last minibatch of an update ({last})")
    at = [r for r in report.staleness.by_update if r["minibatch"] == last]
    assert report.verdict.drift == {"lstm": at[0]["drift_h_mean"]}
    assert any(f.startswith(f"by the last minibatch of an update ({last}) lstm states drift") for f in report.findings)
