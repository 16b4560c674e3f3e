"""The device path of a summary log's rollout blocks (issue #50, capture/ondevice_inputs.py), forced on the CPU
(``OnDevice._engage``; never a GPU-only test): real rsl_rl and RecurrentPPO runs and a CleanRL-style loop under
``--capture summary --trace-envs K`` (K below the env count) write the host path's log (rows, keys, call ids,
every `init` code exactly; norms and drifts within test_ondevice.py's tolerances), with `init` answers of every
kind the path computes on the device (previous, reset, stored, other_env), one host copy per rollout block, and
O(columns) floats crossing for the columns the log keeps no vectors of."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import lstm_probe
from lstm_probe.capture import blocks
from lstm_probe.capture.ondevice import OnDevice
from lstm_probe.capture.ondevice_inputs import DeviceInputs
from lstm_probe.capture.transfer import Staged
from tests.test_ondevice import same_log
from tests.transfers import counting


class Watch:
    """The device path forced on the CPU, its rollout blocks counted (each one's floats staged for the host and
    its column count), and the host store's pulls of the device's values."""

    def __init__(self, monkeypatch):
        self.blocks: list[tuple[int, int, int]] = []  # (floats staged, columns, floats of traced rows' vectors)
        self.pulls = 0
        monkeypatch.setattr(OnDevice, "_engage", "always")
        device_block, pull, watch = blocks._device_block, DeviceInputs.pull, self

        class Recorded(Staged):
            def __init__(self, tensors, private=False):
                super().__init__(tensors, private)
                watch._staged = self.shapes

        def counted(emitter, writer, name, tags, sent, states, per_col, envs):
            later = device_block(emitter, writer, name, tags, sent, states, per_col, envs)
            shapes = watch._staged
            traced = sum(int(np.prod(s)) for s in shapes if len(s) == 2)  # the kept rows' (k, H) vectors
            watch.blocks.append((sum(int(np.prod(s)) for s in shapes), int(states.shape[2]), traced))
            return later

        def pulled(self_, name, store):
            watch.pulls += 1
            return pull(self_, name, store)

        monkeypatch.setattr(blocks, "Staged", Recorded)
        monkeypatch.setattr(blocks, "_device_block", counted)
        monkeypatch.setattr(DeviceInputs, "pull", pulled)

    def o_of_columns(self, layers: int, hidden: int) -> None:
        """Every block staged at most (4L + L + 5) floats per column besides the traced rows' vectors (norms as
        float64 pairs, input norms, the answers' flags), far below its states' 2 * 2L * H per column."""
        assert self.blocks
        for floats, columns, traced in self.blocks:
            assert floats - traced <= (5 * layers + 5) * columns < 2 * 2 * layers * hidden * columns


def codes(df) -> set[str]:
    return set(df.init.dropna().astype(str))


# -- rsl_rl ----------------------------------------------------------------------------------------------------


@pytest.fixture
def rsl():
    pytest.importorskip("rsl_rl")
    from tests import test_rsl_rl

    saved = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    yield test_rsl_rl
    torch.distributions.Distribution.set_default_validate_args(saved)


@pytest.mark.parametrize(("rnn", "layers"), [("lstm", 1), ("lstm", 2), ("gru", 1)])
def test_rsl_rl_rollout_blocks_on_the_device_path(tmp_path, monkeypatch, rsl, rnn, layers):
    """8 envs, --trace-envs 3: every rollout block on the device path, the same log (`init` previous, reset and
    stored exactly), O(columns) crossing; an LSTM's host never needs the device's values (no pull)."""
    capture = {"capture": "summary", "trace_envs": 3}
    rsl.probed(tmp_path / "host.parquet", 8, rnn, layers=layers, **capture)
    watch = Watch(monkeypatch)
    rsl.probed(tmp_path / "dev.parquet", 8, rnn, layers=layers, **capture)
    host, dev = lstm_probe.load(tmp_path / "host.parquet"), lstm_probe.load(tmp_path / "dev.parquet")
    same_log(host, dev)
    assert {"previous", "reset", "stored"} <= codes(dev)
    # an LSTM's training calls read the device's states there; a GRU's (the host path) bring them over, once per
    # iteration and module (actor, critic)
    assert len(watch.blocks) > 0 and watch.pulls == (0 if rnn == "lstm" else 2 * 2)
    hidden = int(np.asarray(lstm_probe.states(dev[dev.h.notna()].head(1), "h")).shape[-1])
    watch.o_of_columns(layers if rnn == "lstm" else layers / 2, hidden)


def test_rsl_rl_rollout_block_one_host_copy(tmp_path, monkeypatch, rsl):
    """Each rollout block on the device path crosses to the host once (its figures, flags and traced rows in
    one ``Staged``), its first and second halves making no other host transfer."""
    watch = Watch(monkeypatch)

    def who() -> str:
        f = sys._getframe(2)
        while f is not None:
            code = f.f_code
            if code.co_qualname.startswith(("_device_block", "DeviceInputs")):
                return "block"
            if code.co_name == "__call__" and code.co_filename.endswith("transfer.py"):
                finish = getattr(f.f_locals.get("self"), "finish", None)
                if finish is not None and finish.__qualname__.startswith("_device_block"):
                    return "block"
            if code.co_filename.endswith(os.path.join("capture", "ondevice_inputs.py")):
                return "block"
            f = f.f_back
        return "other"

    runner = rsl.make_runner(16)
    with counting(who) as counts, rsl.attach(runner, tmp_path / "t.parquet", capture="summary", trace_envs=4):
        runner.learn(2)
    assert len(watch.blocks) > 0
    assert counts["block"] == len(watch.blocks)  # one per block, none more


# -- sb3 RecurrentPPO ------------------------------------------------------------------------------------------


def test_sb3_rollout_blocks_on_the_device_path(tmp_path, monkeypatch):
    """RecurrentPPO, 4 envs, --trace-envs 2: rollout blocks on the device path, the same log; its per-step
    training loops (the host path) read the rollout states the device holds: brought over (pulled) first."""
    pytest.importorskip("sb3_contrib")
    from tests.conftest import TINY

    opts = {**TINY, "n_envs": 4, "capture": "summary", "trace_envs": 2, "steps": 256}
    host = lstm_probe.run("Pendulum-v1", tmp_path / "host.parquet", seed=0, force=True, **opts)
    watch = Watch(monkeypatch)
    dev = lstm_probe.run("Pendulum-v1", tmp_path / "dev.parquet", seed=0, force=True, **opts)
    a, b = lstm_probe.load(host.path), lstm_probe.load(dev.path)
    assert "stepwise" in set(b[b.phase == "train"].path) and watch.pulls > 0
    same_log(a, b)
    assert {"previous", "reset", "stored"} <= codes(b)
    assert len(watch.blocks) > 0


# -- a CleanRL-style loop: one env fed another's state (other_env) ----------------------------------------------

N, H = 4, 8


def loop(path, observed: list | None = None, sequence: bool = True, window: int | None = 24) -> None:
    """4 toy envs, episodes ending at random (their states zeroed), envs 0 and 1 swapping states once (other_env);
    two iterations of a 24-step rollout, each followed by a multi-step training call from the rollout's first
    states (stored on the device path) and a per-step training pass (the host path)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    lstm = torch.nn.LSTM(3, H)
    steps = 24
    xs = torch.randn(2 * steps, N, 3)
    opts = {"capture": "summary", "trace_envs": 1, "force": True, "writer": "thread"}
    if window is not None:  # else the ring sized by the rollout (it grows from 16 steps while the rollout runs)
        opts["reference_window"] = window
    with lstm_probe.trace(lstm, path, **opts) as probe, torch.no_grad():
        if observed is not None:
            probe.observers.append(lambda m, layers, states: observed.append((m, states)))
        h = (torch.zeros(1, N, H), torch.zeros(1, N, H))
        done = np.zeros(N, bool)
        for it in range(2):
            first = it * steps
            initial = (h[0].clone(), h[1].clone())
            for step in range(first, first + steps):
                if step in (10, 30):  # envs 0 and 1 swap states
                    h = (h[0][:, [1, 0, 2, 3]], h[1][:, [1, 0, 2, 3]])
                with probe.tag(phase="rollout", iteration=it, env=np.arange(N), env_step=step, episode_start=done):
                    _, h = lstm(xs[step : step + 1], h)
                done = rng.random(N) < 0.15
                h[0][:, done] = 0
                h[1][:, done] = 0
            last = first + steps
            with probe.tag(phase="bootstrap", iteration=it, env=np.arange(N), env_step=last):
                lstm(xs[last - 1 : last], h)  # a one-step bootstrap block (previous, on the device)
            with probe.tag(phase="bootstrap", iteration=it, env=np.arange(N), env_step=np.full((N, 2), last)):
                lstm(xs[last - 2 : last], h)  # a multi-step one (its answers the host's)
            env_step = np.broadcast_to(np.arange(first, first + steps), (N, steps))
            if sequence:
                with probe.tag(phase="train", iteration=it, epoch=0, minibatch=0, env=np.arange(N), env_step=env_step):
                    lstm(xs[first : first + steps], initial)
            with probe.tag(phase="train", iteration=it, epoch=1, minibatch=0, env=np.arange(N), env_step=env_step):
                state = initial
                for t in range(steps):
                    _, state = lstm(xs[first + t : first + t + 1], state)


@pytest.mark.parametrize("grows", [False, True])
def test_loop_other_env_on_the_device_path(tmp_path, monkeypatch, grows):
    """The swapped envs' inputs answered other_env, the resets reset, the training call's stored, as on the host;
    the per-step training pass pulls the device's rollout states once per iteration. ``grows``: blocks of 4
    calls and a ring sized by the rollout, which outgrows its first 16 steps mid-rollout (the host brings the
    device's states over before it re-lays its ring, the device ring is rebuilt from it)."""
    window = None if grows else 24
    if grows:
        monkeypatch.setattr(blocks, "MAX_PENDING", 4)
    loop(tmp_path / "host.parquet", window=window)
    watch = Watch(monkeypatch)
    loop(tmp_path / "dev.parquet", window=window)
    host, dev = lstm_probe.load(tmp_path / "host.parquet"), lstm_probe.load(tmp_path / "dev.parquet")
    same_log(host, dev)
    roll = dev[dev.phase == "rollout"]
    assert {"previous", "reset", "other_env"} <= codes(roll)
    swapped = roll[roll.env_step.isin([10, 30]) & roll.env.isin([0, 1])].init.astype(str)
    assert (swapped[swapped != "zero"] == "other_env").sum() >= 3  # (an env just reset starts from zeros)
    assert "stored" in codes(dev[dev.phase == "train"])
    assert "previous" in codes(dev[dev.phase == "bootstrap"]) <= {"previous", "zero"}
    assert watch.pulls == (3 if grows else 2)
    if grows:
        assert len(watch.blocks) > 2 * 24 // 4  # the rollout's blocks, and the bootstrap's
    watch.o_of_columns(1, H)


def test_live_metrics_observers_still_get_the_rollout_states(tmp_path, monkeypatch):
    """Observers (sb3's live metrics) of a rollout block on the device path get its states, as on the host path."""
    seen_host: list = []
    loop(tmp_path / "host.parquet", seen_host, sequence=False)
    seen_dev: list = []
    Watch(monkeypatch)
    loop(tmp_path / "dev.parquet", seen_dev, sequence=False)
    roll_host = [s for m, s in seen_host if m.tags.phase == "rollout"]
    roll_dev = [s for m, s in seen_dev if m.tags.phase == "rollout"]
    assert len(roll_host) == len(roll_dev) > 0
    for a, b in zip(roll_host, roll_dev, strict=True):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_row_hashes_are_the_rows_bits(monkeypatch):
    """Equal bits, equal hash; -0 and 0 (equal values, different bits) differ, as the host's bytes do; NaNs of one
    pattern are equal; the chunks change nothing."""
    from lstm_probe.capture import ondevice_inputs

    torch.manual_seed(0)
    rows = torch.randn(300, 16)
    rows[7] = rows[3]
    rows[9, 2] = 0.0
    rows[10] = rows[9]
    rows[10, 2] = -0.0
    rows[11, 0] = rows[12, 0] = float("nan")
    rows[12, 1:] = rows[11, 1:]
    hashes = ondevice_inputs.row_hashes(rows)
    assert hashes[7] == hashes[3] and hashes[9] != hashes[10] and hashes[11] == hashes[12]
    assert len(set(hashes.tolist())) == 300 - 2
    monkeypatch.setattr(ondevice_inputs, "HASH_CHUNK", 5 * 16 + 3)
    assert torch.equal(ondevice_inputs.row_hashes(rows), hashes)


def test_torchrl_rollout_blocks_on_the_device_path(tmp_path, monkeypatch):
    """TorchRL's collection calls (replayed into blocks at the batch's end) on the device path: the same log."""
    pytest.importorskip("torchrl")
    from lstm_probe.integrations.torchrl.train import run

    opts = {"n_envs": 4, "capture": "summary", "trace_envs": 2, "steps": 256, "n_steps": 32, "hidden_size": 8}
    host = run("CartPole-v1", tmp_path / "host.parquet", seed=0, force=True, **opts)
    watch = Watch(monkeypatch)
    dev = run("CartPole-v1", tmp_path / "dev.parquet", seed=0, force=True, **opts)
    a, b = lstm_probe.load(host.path), lstm_probe.load(dev.path)
    same_log(a, b)
    assert len(watch.blocks) > 0 and {"previous", "reset"} <= codes(b[b.phase == "rollout"])
    assert "stored" in codes(b[b.phase == "train"])
    watch.o_of_columns(1, 8)
