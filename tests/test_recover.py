"""Per-step states recovered from one multi-step call equal a step-by-step run of the same module."""

import threading
import time

import numpy as np
import pytest
import torch
from torch import nn

import lstm_probe
from lstm_probe.capture.recover import gru_sequence_states, lstm_sequence_states


def stepwise(module, x, h0, c0=None):
    hs, cs = [], []
    h, c = h0, c0
    for t in range(x.shape[0]):
        if isinstance(module, nn.LSTM):
            _, (h, c) = module(x[t : t + 1], (h, c))
            cs.append(c.numpy().copy())
        else:
            _, h = module(x[t : t + 1], h)
        hs.append(h.numpy().copy())
    hs = np.stack(hs, 1)  # (L, T, N, H)
    return hs, (np.stack(cs, 1) if cs else None)


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_lstm_sequence_states_exact(layers):
    torch.manual_seed(0)
    m = nn.LSTM(5, 7, num_layers=layers)
    x = torch.randn(13, 4, 5)
    h0, c0 = torch.randn(layers, 4, 7), torch.randn(layers, 4, 7)
    with torch.no_grad():
        y, (_hn, cn) = m(x, (h0, c0))
        hs, cs = lstm_sequence_states(m, x, h0, c0, y)
        ref_h, ref_c = stepwise(m, x, h0, c0)
    assert np.abs(hs - ref_h).max() < 1e-6
    assert np.abs(cs - ref_c).max() < 1e-6
    assert np.abs(cs[:, -1] - cn.numpy()).max() < 1e-6


@pytest.mark.parametrize("layers", [1, 2])
def test_gru_sequence_states_exact(layers):
    torch.manual_seed(1)
    m = nn.GRU(3, 6, num_layers=layers)
    x = torch.randn(9, 2, 3)
    h0 = torch.randn(layers, 2, 6)
    with torch.no_grad():
        y, _ = m(x, h0)
        hs = gru_sequence_states(m, x, h0, y)
        ref_h, _ = stepwise(m, x, h0)
    assert np.abs(hs - ref_h).max() < 1e-6


class CellPolicy(nn.Module):
    """An r2l-style policy: nn.LSTMCell called one step at a time."""

    def __init__(self, lstm: nn.LSTM):
        super().__init__()
        self.cell = nn.LSTMCell(lstm.input_size, lstm.hidden_size)
        with torch.no_grad():
            self.cell.weight_ih.copy_(lstm.weight_ih_l0)
            self.cell.weight_hh.copy_(lstm.weight_hh_l0)
            self.cell.bias_ih.copy_(lstm.bias_ih_l0)
            self.cell.bias_hh.copy_(lstm.bias_hh_l0)


def test_generic_tracer_cell_loop_equals_sequence_call(tmp_path):
    """Same weights, same inputs: an LSTMCell loop and one nn.LSTM call log identical h and c rows."""
    torch.manual_seed(2)
    lstm = nn.LSTM(4, 8, batch_first=True)
    cells = CellPolicy(lstm)
    x = torch.randn(3, 11, 4)  # (N, T, F) batch_first
    with torch.no_grad(), lstm_probe.trace(lstm, tmp_path / "seq.parquet") as probe:
        with probe.tag(phase="train", env=np.arange(3)):
            lstm(x)
    with torch.no_grad(), lstm_probe.trace(cells, tmp_path / "cell.parquet") as probe:
        h = c = torch.zeros(3, 8)
        for t in range(11):
            with probe.tag(phase="rollout", env=np.arange(3), env_step=t):
                h, c = cells.cell(x[:, t], (h, c))
    seq = lstm_probe.load(tmp_path / "seq.parquet")
    cell = lstm_probe.load(tmp_path / "cell.parquet")
    assert len(seq) == len(cell) == 33
    assert set(seq.path) == {"sequence"} and set(cell.path) == {"step"}
    seq = seq.sort_values(["env", "t"]).reset_index(drop=True)
    cell = cell.sort_values(["env", "env_step"]).reset_index(drop=True)
    assert list(seq.t) == list(cell.env_step)
    for col in ("h", "c"):
        assert np.abs(lstm_probe.states(seq, col) - lstm_probe.states(cell, col)).max() < 1e-6
    assert seq.module.iloc[0] == "root" and cell.module.iloc[0] == "cell"


def test_untagged_calls_say_where_each_row_sits_in_its_call(tmp_path):
    """Without provenance (no env), rows still carry their batch column (seq) and step in the call (t):
    a 2-layer sequence call, a per-step loop of one-step calls on one batch, one-step calls of varying
    batch side by side. Each row's h is the matching slice of what the module returned."""
    torch.manual_seed(4)
    m = nn.LSTM(3, 5, num_layers=2, batch_first=True)
    x = torch.randn(4, 6, 3)
    with torch.no_grad(), lstm_probe.trace(m, tmp_path / "u.parquet"):
        y, _ = m(x)  # call 0: (N=4, T=6)
        outs = [m(x[:n, :1])[0] for n in (1, 3, 2)]  # calls 1-3: one step each
    df = lstm_probe.load(tmp_path / "u.parquet")
    top = df[df.layer == 1]
    seq0 = top[top.call == 0]
    assert sorted(zip(seq0.seq, seq0.t, strict=True)) == [(n, t) for n in range(4) for t in range(6)]
    for row in seq0.itertuples():
        assert np.abs(row.h - y[row.seq, row.t].numpy()).max() < 1e-6
    for call, (n, out) in enumerate(zip((1, 3, 2), outs, strict=True), start=1):
        rows = top[top.call == call]
        assert list(rows.seq) == list(range(n)) and set(rows.t) == {0}
        for row in rows.itertuples():
            assert np.abs(row.h - out[row.seq, 0].numpy()).max() < 1e-6
    assert df.env.isna().all() and df.seq_len.isna().all()


def test_generic_tracer_gru_and_drift(tmp_path):
    """GRU rows carry no c; with a reference window, train rows get drift against rollout rows."""
    torch.manual_seed(3)
    gru = nn.GRU(2, 5)
    x = torch.randn(6, 1, 2)
    with torch.no_grad(), lstm_probe.trace(gru, tmp_path / "g.parquet", reference_window=16) as probe:
        h = torch.zeros(1, 1, 5)
        for t in range(6):
            with probe.tag(phase="rollout", iteration=0, env=0, env_step=t):
                _, h = gru(x[t : t + 1], h)
        with probe.tag(phase="train", iteration=0, epoch=0, minibatch=0, env=0, env_step=np.arange(6)[None, :]):
            gru(x, torch.zeros(1, 1, 5))
    df = lstm_probe.load(tmp_path / "g.parquet")
    assert df.c.isna().all() and df.c_norm.isna().all()
    train = df[df.phase == "train"]
    assert len(train) == 6 and train.drift_h.max() < 1e-6


def test_tracer_removes_hooks_on_exception(tmp_path):
    lstm = nn.LSTM(2, 3)
    with pytest.raises(RuntimeError, match="user error"):
        with lstm_probe.trace(lstm, tmp_path / "x.parquet"):
            lstm(torch.randn(4, 1, 2))
            raise RuntimeError("user error")
    assert not lstm._forward_hooks
    info = lstm_probe.read_info(tmp_path / "x.parquet")
    assert info.rows == 4 and not info.completed and "user error" in info.metadata["stop_reason"]


def test_calls_larger_than_a_buffer_never_stall_the_writer(tmp_path):
    """A call with more rows than one buffer holds gets a one-off buffer; the pool keeps its size."""
    lstm = nn.LSTM(3, 256)
    with torch.no_grad(), lstm_probe.trace(lstm, tmp_path / "big.parquet") as probe:
        capacity = probe.writer.capacity
        for _ in range(6):  # more one-offs than the pool has buffers
            lstm(torch.randn(capacity // 50 + 1, 50, 3))
            lstm(torch.randn(1, 2, 3))
    info = lstm_probe.read_info(tmp_path / "big.parquet")
    assert info.completed and info.rows == 6 * ((capacity // 50 + 1) * 50 + 2)


def _hold_writer(probe):
    """Keep the writer thread busy until the returned event is set (jobs queue up behind it); returns once
    the writer thread is in the holding job."""
    release, holding = threading.Event(), threading.Event()

    def hold():
        holding.set()
        release.wait()

    probe.writer.submit(hold, 0)
    wait_for(holding.is_set, "the writer thread never took the holding job")
    return release


def wait_for(condition, what, timeout=60.0):
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds (a deadline for a
    loaded machine, never a delay the test relies on)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.parametrize("writer", ["thread", "process"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_deferred_recovery_uses_the_weights_and_inputs_of_the_call(tmp_path, kind, writer):
    """An optimizer step and in-place changes of the input and initial state made right after the call
    must not change what the log holds: the writer thread recovers states later (from copies), the
    writer process's hand-over runs inside the hook (from the call's own tensors)."""
    torch.manual_seed(3)
    m = nn.LSTM(4, 6, num_layers=2) if kind == "lstm" else nn.GRU(4, 6, num_layers=2)
    x = torch.randn(7, 3, 4)
    h0, c0 = torch.randn(2, 3, 6), torch.randn(2, 3, 6)
    with torch.no_grad():
        ref_h, ref_c = stepwise(m, x, h0, c0 if kind == "lstm" else None)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    with lstm_probe.trace(m, tmp_path / "d.parquet", writer=writer) as probe:
        release = _hold_writer(probe) if writer == "thread" else threading.Event()
        try:
            y, _ = m(x, (h0, c0)) if kind == "lstm" else m(x, h0)
            y.pow(2).sum().backward()
            opt.step()  # changes every weight in place before the writer thread gets to the call
            x.zero_(), h0.zero_(), c0.zero_()
        finally:
            release.set()
    df = lstm_probe.load(tmp_path / "d.parquet")
    hs = np.stack(df.h.to_numpy()).reshape(2, 3, 7, 6).transpose(0, 2, 1, 3)  # rows: layer, column, t
    assert np.abs(hs - ref_h).max() < 1e-6
    if kind == "lstm":
        cs = np.stack(df.c.to_numpy()).reshape(2, 3, 7, 6).transpose(0, 2, 1, 3)
        assert np.abs(cs - ref_c).max() < 1e-6


def test_writer_queue_is_bounded_and_loses_nothing(tmp_path):
    """While the writer thread is held, training blocks once the queued states exceed the budget; every
    row arrives once it is released, in call order."""
    lstm = nn.LSTM(3, 64)
    with torch.no_grad(), lstm_probe.trace(lstm, tmp_path / "q.parquet", writer="thread") as probe:
        probe.writer._queue_bytes = 64 * 1024  # a small budget: about 40 sequence calls of 5 steps
        release = _hold_writer(probe)
        done = threading.Event()

        def train():
            for _ in range(200):
                lstm(torch.randn(5, 2, 3))
            done.set()

        worker = threading.Thread(target=train)
        worker.start()
        try:
            # Training waits on the queue's condition (the writer thread is in its holding job, not waiting
            # there): from then on its wait is counted. Held 2 s more, it must not move on.
            wait_for(lambda: probe.writer._cond._waiters or done.is_set(), "training neither waited nor finished")
            assert not done.wait(2.0), "the queue kept growing while the writer was held"
            # one call's job (its states and a copy of the weights) is larger than this budget: the first
            # is queued, the second waits
            assert probe.calls == 2 and probe.writer._queued_bytes > 0
        finally:
            release.set()
            worker.join()
        assert probe.writer.wait_seconds > 1.5
    df = lstm_probe.load(tmp_path / "q.parquet")
    assert len(df) == 200 * 5 * 2 and df.call.is_monotonic_increasing and df.call.nunique() == 200
    cost = lstm_probe.read_info(tmp_path / "q.parquet").metadata["probe_cost"]
    assert cost["calls"] == 200 and cost["wait_seconds"] > 1.5 and cost["hook_seconds"] > 0


def test_a_failing_writer_job_stops_training_with_the_error(tmp_path):
    lstm = nn.LSTM(3, 8)
    probe = lstm_probe.trace(lstm, tmp_path / "e.parquet", writer="thread").start()

    def boom():
        raise OSError(28, "No space left on device")

    probe.writer.submit(boom, 0)
    wait_for(lambda: probe.writer.error is not None, "the writer thread never ran the failing job")
    with pytest.raises(lstm_probe.errors.OutputError, match="No space left"):
        lstm(torch.randn(4, 1, 3))
    with pytest.raises(lstm_probe.errors.OutputError, match="No space left"):
        probe.close()
