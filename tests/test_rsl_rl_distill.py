"""rsl_rl's DistillationRunner beyond the default set-up, run for real at tiny scale (rsl-rl-lib 5.5): gradient windows
that run across an epoch's end, an MLP teacher and a teacher of another hidden size, ``capture_obs`` with a teacher
that reads privileged observations, and the teacher's state rsl_rl zeroes at every rollout's start."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import lstm_probe

rsl_rl = pytest.importorskip("rsl_rl")
DISTRIBUTION_CHECKS = False  # what the framework sets for the process (see conftest.py)

from rsl_rl.runners import DistillationRunner  # noqa: E402

from lstm_probe.integrations.rsl_rl import TorchPendulumVecEnv, attach, train_cfg  # noqa: E402
from lstm_probe.integrations.rsl_rl.train import build_runner  # noqa: E402
from lstm_probe.report.html import build_html  # noqa: E402

STEPS, EPOCHS = 8, 2


class PrivilegedPendulum(TorchPendulumVecEnv):
    """The torch Pendulum with a privileged group 'critic' (the episode step / 10), which only the teacher reads."""

    def get_observations(self):
        obs = super().get_observations()
        obs["critic"] = self.pendulum.steps[:, None].float() * 0.1
        return obs


def _distillation(tmp_path, *, g=4, teacher="lstm", hidden=8, env_class=TorchPendulumVecEnv, privileged=False):
    """A DistillationRunner with an LSTM student (``hidden`` units), 4 envs, 8 steps, 2 epochs, gradient_length ``g``,
    10-step episodes; its teacher (an RNNModel of cell ``teacher`` and 16 units where ``hidden`` is 16, else 8, or
    'mlp': an MLPModel) loaded from a PPO runner's checkpoint; ``privileged``: the teacher also reads 'critic'."""
    torch.manual_seed(0)
    groups = ["policy", "critic"] if privileged else ["policy"]
    cell = "gru" if teacher == "mlp" else teacher
    cfg = train_cfg(
        num_steps_per_env=STEPS,
        num_mini_batches=2,
        learning_rate=1e-3,
        rnn_type=cell,
        rnn_layers=1,
        hidden_size=16 if teacher == "gru16" or hidden == 16 else 8,
        mlp=(8,),
    )
    cfg["actor"]["rnn_type"] = cfg["critic"]["rnn_type"] = "gru" if teacher == "gru16" else cell
    cfg["obs_groups"] = {"actor": groups, "critic": groups}
    if teacher == "mlp":
        dist = cfg["actor"]["distribution_cfg"]
        mlp = {"class_name": "rsl_rl.models.MLPModel", "hidden_dims": [8], "activation": "elu"}
        cfg["actor"], cfg["critic"] = {**mlp, "distribution_cfg": dist}, mlp
    env = env_class(4, seed=0, max_steps=10)
    build_runner(env, cfg).save(str(tmp_path / "teacher.pt"))
    student = {**train_cfg(learning_rate=1e-3, rnn_type="lstm", rnn_layers=1, hidden_size=hidden, mlp=(8,))["actor"]}
    dcfg = {
        "num_steps_per_env": STEPS,
        "save_interval": 10**9,
        "obs_groups": {"student": ["policy"], "teacher": groups},
        "student": student,
        "teacher": cfg["actor"],
        "algorithm": {
            "class_name": "rsl_rl.algorithms.Distillation",
            "num_learning_epochs": EPOCHS,
            "gradient_length": g,
        },
    }
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rsl_rl's warning of the steps never backpropagated (g 3, 5)
        runner = DistillationRunner(env, dcfg, log_dir=None)
    runner.load(str(tmp_path / "teacher.pt"))
    return runner


def _report(log, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "400"}
    cmd = [sys.executable, "-m", "lstm_probe", "report", str(log), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout


def _optimizer_steps(alg):
    """Where ``Distillation.update`` steps the optimizer: (update, epoch, storage step) of the student call after which
    it stepped, from a forward hook counting the update's student calls and the optimizer's own step hook."""
    seen = {"update": -1, "calls": 0, "training": False}
    steps = []
    inner = alg.update

    def update(*args, **kwargs):
        seen.update(update=seen["update"] + 1, calls=0, training=True)
        try:
            return inner(*args, **kwargs)
        finally:
            seen["training"] = False

    def count(module, args, out):
        seen["calls"] += seen["training"]

    alg.update = update
    alg.student.rnn.rnn.register_forward_hook(count)
    alg.optimizer.register_step_post_hook(lambda *a: steps.append((seen["update"], *divmod(seen["calls"] - 1, STEPS))))
    return steps


@pytest.mark.parametrize(("g", "lengths"), [(3, [[3, 3, 2], [1, 3, 3, 1]]), (5, [[5, 3], [2, 5, 1]])])
def test_gradient_windows_across_an_epochs_end(tmp_path, g, lengths):
    """gradient_length 3 or 5 with 8 steps: rsl_rl's counter (``Distillation.update``'s local ``cnt``) runs across
    the update's epochs and starts again at the next update, so a window runs on from epoch 0's last steps into epoch
    1's first (the state restarted there) and the update's last steps are never backpropagated. The log's sequences
    are cut exactly where rsl_rl steps the optimizer and where an epoch restarts (seq_len 3,3,2 | 1,3,3,1 for g 3),
    numbered within their epoch; a window's first step inside an epoch is a 'gradient_window' start (it was
    'minibatch_cut', worded 'the previous minibatch ended there'), said so by the calls section and by the doctor,
    which names no problem; the BPTT horizon is g, the provenance check OK."""
    runner = _distillation(tmp_path, g=g)
    steps = _optimizer_steps(runner.alg)
    log = tmp_path / "run.parquet"
    with attach(runner, log):
        runner.learn(2)
    # rsl_rl: an optimizer step after every g-th call of the update (counted across epochs), none after its tail
    assert steps == [(u, *divmod(k - 1, STEPS)) for u in (0, 1) for k in range(g, EPOCHS * STEPS + 1, g)]
    rows = lstm_probe.load(log, vectors=False)
    train = rows[(rows.phase == "train") & (rows.layer == 0)]
    first = train[train.t == 0].sort_values(["iteration", "epoch", "minibatch", "env"])
    for it in (0, 1):
        here = first[(first.iteration == it) & (first.env == 0)]
        assert [here[here.epoch == e].seq_len.tolist() for e in range(EPOCHS)] == lengths
        numbers = [here[here.epoch == e].minibatch.tolist() for e in range(EPOCHS)]
        assert numbers == [list(range(len(x))) for x in lengths]
        # every sequence after an epoch's first starts right after one of rsl_rl's optimizer steps, and each of
        # those steps (but the one at the epoch's end) starts a sequence
        starts = {(e, s) for e, s in zip(here.epoch, here.env_step - 8 * it, strict=True) if s}
        assert starts == {(e, s + 1) for u, e, s in steps if u == it and s + 1 < STEPS}
    mid = first[(first.env_step % STEPS) != 0]
    assert set(mid.seq_reason) <= {"gradient_window", "episode_start"} and "gradient_window" in set(mid.seq_reason)
    assert (mid.seq_reason == np.where(mid.episode_start, "episode_start", "gradient_window")).all()
    # a sequence: one env's steps of one window in one epoch, t counted from its first
    key = train.groupby(["iteration", "epoch", "minibatch", "env"]).env_step
    assert (train.t == train.env_step - key.transform("min")).all() and (train.seq_len == key.transform("size")).all()
    text = " ".join(_report(log).split())
    assert "a gradient window's first step (the state goes on from the pass's previous step, detached" in text
    assert "minibatch cut" not in text and "provenance check OK" in text and "problem:" not in text
    assert "student/train sequences started at a gradient window's first step, from the state their pass's" in text
    doc = json.loads(_report(log, "--json"))
    assert doc["sequences"]["gradient_length"]["max"] == g and doc["staleness"]["provenance_ok"] is True
    assert doc["doctor"]["problems"] == []
    # the window starts that did not start from a stored rollout state (their state computed after an optimizer step)
    windows = int(((mid.seq_reason == "gradient_window") & (mid.init == "other")).sum())
    assert doc["doctor"]["train_other"]["student/train"]["gradient_window"] == windows > 0
    page = build_html(log, tmp_path / "run.html")  # the minibatch layout's legend names the window starts' marker
    assert page.markers == ["episode start", "env boundary", "gradient window"]


@pytest.mark.parametrize("teacher", ["mlp", "gru16"])
def test_a_teacher_the_log_cannot_hold(tmp_path, teacher):
    """An MLPModel teacher (no state) and a GRU teacher of 16 units beside an 8-unit LSTM student (a log holds one
    hidden size: attach refused the run, telling the user to 'pass modules=[...]', which attach does not take): the
    student alone is traced, the metadata and the report's Architecture section say which model is left out and
    why, and the student's rows are as with a traced teacher (provenance OK, no problem)."""
    runner = _distillation(tmp_path, teacher=teacher)
    log = tmp_path / "run.parquet"
    with attach(runner, log):
        runner.learn(2)
    meta = lstm_probe.read_info(log).metadata
    assert list(meta["architecture"]["modules"]) == ["student"]
    why = {
        "mlp": {"class": "MLPModel", "why": "no recurrent state"},
        "gru16": {"kind": "GRU", "hidden_size": 16, "num_layers": 1, "input_size": 2},
    }[teacher]
    assert meta["architecture"]["untraced"]["teacher"].items() >= why.items()
    assert "rollout_zeroed" not in meta["capabilities"]  # no teacher rows to word
    rows = lstm_probe.load(log, vectors=False)
    assert set(rows.module) == {"student"} and len(rows) == 2 * (STEPS + EPOCHS * STEPS) * 4
    text = " ".join(_report(log).split())
    said = {
        "mlp": "not traced: teacher (MLPModel: no recurrent state)",
        "gru16": "not traced: teacher (GRU hidden 16 x 1 layer(s): a log holds one hidden size, the student's 8)",
    }
    assert said[teacher] in text and "provenance check OK" in text and "problem:" not in text


def test_capture_obs_with_a_privileged_teacher_and_its_zeroed_state(tmp_path):
    """``capture_obs`` on a distillation whose teacher also reads a privileged group: the rollout rows of student and
    teacher keep the student's observation (its groups, what the deployed policy reads), equal to what act was given;
    train rows keep none; ``lstm-probe probe`` reads the log. And the teacher: rsl_rl zeroes its state at every
    rollout's start after the first (``Distillation.update``: ``reset(hidden_state=last_hidden_states[1])``, None),
    which changes the targets the student copies there (a teacher copy whose state is kept gives others): the
    doctor says so as rsl_rl's design with that consequence, a finding and no problem (it was the problem 'a state was
    reset where no episode started')."""
    runner = _distillation(tmp_path, hidden=16, teacher="gru", env_class=PrivilegedPendulum, privileged=True)
    alg = runner.alg
    kept, seen = copy.deepcopy(alg.teacher), []  # a teacher whose state only episode ends reset
    act, process = alg.act, alg.process_env_step

    def acting(obs):
        out = act(obs)
        with torch.no_grad():
            seen.append((obs["policy"].clone(), (alg.transition.privileged_actions - kept(obs)).abs().max().item()))
        return out

    def processing(obs, rewards, dones, extras):
        process(obs, rewards, dones, extras)
        kept.reset(dones)

    alg.act, alg.process_env_step = acting, processing
    log = tmp_path / "run.parquet"
    with attach(runner, log, capture_obs=True):
        runner.learn(3)
    changed = [d > 1e-3 for _, d in seen]
    assert not any(changed[:STEPS]) and changed[STEPS] and changed[2 * STEPS]  # each later rollout's first step
    meta = lstm_probe.read_info(log).metadata
    assert meta["obs_size"] == 2 and meta["capabilities"]["rollout_zeroed"] == {"teacher": "targets"}
    rows = lstm_probe.load(log)
    roll = rows[(rows.phase == "rollout") & (rows.layer == 0)]
    assert set(roll.module) == {"student", "teacher"} and rows[rows.phase == "train"].obs.isna().all()
    for module in ("student", "teacher"):
        mine = roll[roll.module == module].sort_values(["env_step", "env"])
        expected = torch.cat([o for o, _ in seen]).numpy()
        assert np.array_equal(np.stack(mine.obs.to_numpy()), expected)
    teacher = roll[(roll.module == "teacher") & (roll.env_step % STEPS == 0) & (roll.env_step > 0)]
    assert set(teacher.init) == {"zero"} and not teacher.episode_start.any()  # episodes go on
    text = " ".join(_report(log).split())
    assert "problem:" not in text
    assert (
        "8 teacher/rollout columns started their rollout's first step from zeros while their episodes went on: the "
        "framework zeroes the teacher module's state at every rollout's start (its integration declares it), so until "
        "each env's next episode start its outputs (the training targets another module learns to copy) are computed "
        "without the episode so far"
    ) in text
    doc = json.loads(_report(log, "--json"))
    assert doc["doctor"]["zeroed"] == {"teacher/rollout": 8} and doc["doctor"]["problems"] == []
    assert any("zeroes the teacher module's state" in f for f in doc["findings"])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "400"}
    probe = [sys.executable, "-m", "lstm_probe", "probe", str(log), "--target", "obs:0"]
    out = subprocess.run(probe, capture_output=True, text=True, env=env, check=True).stdout
    assert "student" in out and "teacher" in out


def test_capture_obs_of_several_observation_groups_names_each_group(tmp_path):
    """An actor reading two observation groups (Isaac Lab's policy and a privileged one): the ``obs`` column holds
    them concatenated in the actor's group order, the ``obs_keys`` metadata says which slice is which group, and the
    probes name ``obs:GROUP[i]`` (was: ``obs:2``: a user counted widths). One group: no ``obs_keys``, as before."""
    torch.manual_seed(0)
    cfg = train_cfg(
        num_steps_per_env=STEPS,
        num_mini_batches=2,
        learning_rate=1e-3,
        hidden_size=8,
        mlp=(8,),
        rnn_type="lstm",
        rnn_layers=1,
    )
    cfg["obs_groups"] = {"actor": ["policy", "critic"], "critic": ["policy"]}
    runner = build_runner(PrivilegedPendulum(4, seed=0, max_steps=10), cfg)
    log = tmp_path / "groups.parquet"
    with attach(runner, log, capture_obs=True):
        runner.learn(2)
    meta = lstm_probe.read_info(log).metadata
    assert meta["obs_size"] == 3  # the torch Pendulum's policy group: (angle, velocity)
    assert [(p["key"], p["start"], p["size"]) for p in meta["obs_keys"]] == [("policy", 0, 2), ("critic", 2, 1)]
    rows = lstm_probe.load(log, phase="rollout")
    first = rows[(rows.module == "actor") & (rows.layer == 0)]
    privileged = np.stack(first.obs.to_numpy())[:, 2]
    assert np.allclose(privileged, first.episode_step.to_numpy() * 0.1)  # the 'critic' group: episode step / 10
    from lstm_probe.report.probes import obs_names

    assert obs_names(meta) == ["obs:policy[0]", "obs:policy[1]", "obs:critic[0]"]
    r2 = lstm_probe.probe(log, "obs:critic[0]")
    assert len(r2) and r2["r2"].notna().any()
    one = tmp_path / "one.parquet"
    cfg["obs_groups"] = {"actor": ["policy"], "critic": ["policy"]}
    runner = build_runner(TorchPendulumVecEnv(4, seed=0, max_steps=10), cfg)
    with attach(runner, one, capture_obs=True):
        runner.learn(1)
    meta = lstm_probe.read_info(one).metadata
    assert meta["obs_size"] == 2 and "obs_keys" not in meta


def test_a_gradient_length_over_the_updates_calls_steps_no_optimizer_and_states_no_horizon(tmp_path):
    """gradient_length 20 over 2 epochs x 8 steps: ``Distillation.update``'s ``cnt`` never reaches it, so rsl_rl
    never steps the optimizer (the student's weights stay as they were). The log counts the steps
    (``optimizer_steps`` 0), and the report says no optimizer step happened and states no BPTT horizon (it stated
    the stretches between the episode starts, 8 steps at most)."""
    runner = _distillation(tmp_path, g=20)
    steps = _optimizer_steps(runner.alg)
    before = copy.deepcopy(runner.alg.student.state_dict())
    log = tmp_path / "run.parquet"
    with attach(runner, log):
        runner.learn(2)
    assert steps == []
    after = runner.alg.student.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if "rnn" in k)
    assert lstm_probe.read_info(log).metadata["optimizer_steps"] == 0
    text = " ".join(_report(log).split())
    said = "no optimizer step happened in training (the log's optimizer_steps is 0)"
    assert f"{said}: the gradients were never applied, so there is no truncated-BPTT horizon" in text
    assert "truncated-BPTT horizon)" not in text and "gradients flow back" not in text
    doc = json.loads(_report(log, "--json"))
    assert doc["sequences"]["gradient_length"] == {} and doc["sequences"]["optimizer_steps"] == 0
    assert any(f.startswith(said) for f in doc["findings"]), doc["findings"]


def test_the_log_counts_rsl_rls_optimizer_steps(tmp_path):
    """gradient_length 4: rsl_rl steps 2 epochs x 8 steps / 4 = 4 times an update; the log says the 8 of 2 updates,
    and the horizon is stated as before."""
    runner = _distillation(tmp_path, g=4)
    steps = _optimizer_steps(runner.alg)
    log = tmp_path / "run.parquet"
    with attach(runner, log):
        runner.learn(2)
    assert lstm_probe.read_info(log).metadata["optimizer_steps"] == len(steps) == 8
    doc = json.loads(_report(log, "--json"))
    assert doc["sequences"]["gradient_length"]["max"] == 4 and doc["sequences"]["optimizer_steps"] == 8


KILLED = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from tests.test_rsl_rl_distill import _distillation
from lstm_probe.integrations.rsl_rl import attach

runner = _distillation(Path({tmp!r}), g=4)
inner, seen = runner.alg.update, []


def update(*args, **kwargs):
    seen.append(1)
    if len(seen) == 3:  # two updates done: killed as the third begins
        os.kill(os.getpid(), signal.SIGKILL)
    return inner(*args, **kwargs)


runner.alg.update = update
with attach(runner, {out!r}, part_iterations=1):
    runner.learn(5)
"""


def test_a_killed_distillation_run_keeps_its_optimizer_steps(tmp_path):
    """A distillation run killed with SIGKILL after two updates: the optimizer-step count rides every part's metadata
    (``metadata_keys.LIVE_KEYS``; it was written at close only, so the killed run's report stated a horizon without
    it): its log says the 8 steps of the 2 updates (4 each), and the report states the horizon, 4."""
    from tests.test_reliability import wait_for

    out = tmp_path / "run"
    script = KILLED.format(repo=os.getcwd(), tmp=str(tmp_path), out=f"{out}/")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == -9, proc.stderr
    wait_for(lambda: lstm_probe.log.reader.writing(out) is None, "the writer never published the killed run's parts")
    meta = lstm_probe.read_info(out).metadata
    assert meta["completed"] is not True and meta["optimizer_steps"] == 8
    doc = json.loads(_report(out, "--json"))
    assert doc["sequences"]["optimizer_steps"] == 8 and doc["sequences"]["gradient_length"]["max"] == 4


def test_a_distillation_log_without_the_count_states_no_horizon(tmp_path):
    """A distillation log without ``optimizer_steps`` (a run killed before its first update ended, an older log's):
    rsl_rl may have stepped no optimizer, so the report states no BPTT horizon and says why (it stated one)."""
    import pyarrow.parquet as pq

    from lstm_probe.log.schema import META_RUN_KEY
    from lstm_probe.log.writer import META_FINAL_KEY

    runner = _distillation(tmp_path, g=4)
    log = tmp_path / "run.parquet"
    with attach(runner, log):
        runner.learn(2)
    table = pq.read_table(log)
    kv = dict(table.schema.metadata)
    for key in (META_RUN_KEY, META_FINAL_KEY):
        if key in kv:
            doc = json.loads(kv[key])
            assert doc.pop("optimizer_steps", None) in (None, 8)
            kv[key] = json.dumps(doc).encode()
    old = tmp_path / "old.parquet"
    pq.write_table(table.replace_schema_metadata(kv), old)
    assert "optimizer_steps" not in lstm_probe.read_info(old).metadata
    text = " ".join(_report(old).split())
    said = "the log does not count the optimizer steps training took"
    assert said in text and "gradients flow back" not in text and "truncated-BPTT horizon)" not in text
    doc = json.loads(_report(old, "--json"))
    assert doc["sequences"]["gradient_length"] == {} and doc["sequences"]["steps_uncounted"] is True
    assert "optimizer_steps" not in doc["sequences"]
    assert any(f.startswith(said) for f in doc["findings"]), doc["findings"]


@pytest.mark.parametrize(("g", "tail"), [(3, 1), (5, 1), (6, 4)])
def test_the_horizon_leaves_out_the_never_applied_tail(tmp_path, g, tail):
    """gradient_length 3, 5 or 6 over 2 epochs x 8 steps: the update's last 16 % g student calls come after its last
    optimizer step (rsl_rl's step hook says where), so their loss is dropped with the update and never trains. The
    BPTT horizon is the stretches (between episode starts) of the sequences before that step alone (it counted the
    tail's too), and says so; the sequence lengths are still every sequence's."""
    runner = _distillation(tmp_path, g=g)
    steps = _optimizer_steps(runner.alg)
    log = tmp_path / "run.parquet"
    with attach(runner, log):
        runner.learn(2)
    last = {u: e * STEPS + s for u, e, s in steps}  # each update's last optimizer step: after this call (0-based)
    assert all(EPOCHS * STEPS - 1 - at == tail for at in last.values())
    rows = lstm_probe.load(log, vectors=False)
    train = rows[(rows.phase == "train") & (rows.layer == 0) & (rows.module == "student")]
    stretches, everything = [], []
    for (it, epoch, _, _), seq in train.groupby(["iteration", "epoch", "minibatch", "env"]):
        seq = seq.sort_values("t")
        calls = epoch * STEPS + seq.env_step.to_numpy() - STEPS * it  # the update's student calls
        cuts = [0, *seq.t[seq.episode_start & (seq.t > 0)].tolist(), len(seq)]
        pieces = np.diff(cuts).tolist()
        everything += pieces
        if calls.max() <= last[it]:
            stretches += pieces
    assert len(stretches) < len(everything)
    doc = json.loads(_report(log, "--json"))
    got = doc["sequences"]["gradient_length"]
    want = (len(stretches), min(stretches), float(np.median(stretches)), float(np.mean(stretches)), max(stretches))
    assert (got["count"], got["min"], got["median"], got["mean"], got["max"]) == pytest.approx(want)
    assert doc["sequences"]["unapplied_tail"] == tail and doc["sequences"]["length"]["count"] == len(
        train[train.t == 0]
    )
    words = "last student call," if tail == 1 else f"last {tail} student calls,"
    assert f"leaving out each update's {words} whose gradients rsl_rl never applies" in " ".join(_report(log).split())
