"""The generic tracer's oracle: a CleanRL-style loop on a real vector env (CartPole-v1) that resets its
states in place (``h[:, done] = 0``, r2l-style) and trains on episodes fed as PackedSequence. Every logged
h and c equals a step-by-step re-run of the module with the weights of the call."""

import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

import lstm_probe

N_ENVS = 3
STEPS = 150  # rollout steps per iteration
ITERATIONS = 2
HIDDEN = 16
OBS = 4  # CartPole-v1's observation size


def assert_close(a: np.ndarray, b: np.ndarray) -> None:
    """|a - b| <= 1e-5 * max(1, |b|) elementwise: relative where values are large (|c| grows past 10 at
    large hidden sizes, where an absolute 1e-5 is near float32 rounding)."""
    assert a.shape == b.shape
    err = np.abs(a.astype(np.float64) - b) / np.maximum(1.0, np.abs(b))
    assert err.max() <= 1e-5, f"max relative error {err.max():.2e}"


def make(kind: str, layers: int) -> nn.Module:
    torch.manual_seed(0)
    cls = {"lstm": nn.LSTM, "gru": nn.GRU}[kind]
    m = cls(OBS, HIDDEN, num_layers=layers)
    with torch.no_grad():  # larger weights: states far from zero, c well past 1
        for p in m.parameters():
            p.mul_(4.0)
    return m


def rerun(module: nn.Module, xs: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor | None, resets=None):
    """Step-by-step re-run of ``module``'s weights on a fresh module without hooks: per-step (h, c) of
    every layer, (T, L, N, H) float64. ``resets`` (T, N) bool: zero the state before that step."""
    ref = type(module)(module.input_size, module.hidden_size, num_layers=module.num_layers)
    ref.load_state_dict(module.state_dict())
    hs, cs = [], []
    h, c = h0.clone(), c0.clone() if c0 is not None else None
    with torch.no_grad():
        for t in range(xs.shape[0]):
            if resets is not None:
                keep = (~resets[t]).float().view(1, -1, 1)
                h = h * keep
                c = c * keep if c is not None else None
            if c is not None:
                _, (h, c) = ref(xs[t : t + 1], (h, c))
                cs.append(c.double().numpy())
            else:
                _, h = ref(xs[t : t + 1], h)
            hs.append(h.double().numpy())
    return np.stack(hs), (np.stack(cs) if cs else None)


def segments(dones: np.ndarray) -> list[tuple[int, int, int]]:
    """(env, first step, length) of each piece of a rollout between episode starts."""
    out = []
    steps, envs = dones.shape
    for env in range(envs):
        starts = [0] + [t for t in range(1, steps) if dones[t, env]] + [steps]
        out += [(env, a, b - a) for a, b in itertools.pairwise(starts) if b > a]
    return out


@pytest.mark.parametrize("kind,layers", [("lstm", 1), ("lstm", 2), ("gru", 1), ("gru", 2)])
def test_in_place_resets_and_packed_episodes_log_true_states(tmp_path, kind, layers):
    m = make(kind, layers)
    is_lstm = kind == "lstm"
    head = nn.Linear(HIDDEN, 2)
    opt = torch.optim.SGD(list(m.parameters()) + list(head.parameters()), lr=0.05)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(N_ENVS)])
    obs, _ = envs.reset(seed=0)
    h = torch.zeros(layers, N_ENVS, HIDDEN)
    c = torch.zeros(layers, N_ENVS, HIDDEN)
    done = np.zeros(N_ENVS, bool)
    episode = np.zeros(N_ENVS, np.int64)
    env_step = 0
    roll_expected = {}  # (iteration, env, env_step) -> (h (L, H), c (L, H) or None)
    train_expected = []  # per train call: (lengths, h (T, L, N, H), c or None, returned h_n, c_n)
    rng = np.random.default_rng(0)
    with lstm_probe.trace(m, tmp_path / "g.parquet") as probe:
        for it in range(ITERATIONS):
            h_start, c_start = h.clone(), c.clone()
            xs, resets = [], []
            for _ in range(STEPS):
                x = torch.tensor(obs, dtype=torch.float32)
                with (
                    torch.no_grad(),
                    probe.tag(
                        phase="rollout",
                        iteration=it,
                        env=np.arange(N_ENVS),
                        env_step=env_step,
                        episode=episode.copy(),
                        episode_start=done.copy(),
                    ),
                ):
                    h[:, done] = 0.0  # r2l-style: reset the states the module returned, in place
                    c[:, done] = 0.0
                    if is_lstm:
                        y, (h, c) = m(x[None], (h, c))
                    else:
                        y, h = m(x[None], h)
                    action = torch.distributions.Categorical(logits=head(y[0])).sample()
                xs.append(x)
                resets.append(done.copy())
                obs, _, term, trunc, _ = envs.step(action.numpy())
                done = np.logical_or(term, trunc)
                episode += done
                env_step += 1
            xs_t, resets_np = torch.stack(xs), np.stack(resets)
            base = env_step - STEPS
            ref_h, ref_c = rerun(m, xs_t, h_start, c_start if is_lstm else None, torch.tensor(resets_np))
            for t in range(STEPS):
                for env in range(N_ENVS):
                    roll_expected[(it, env, base + t)] = (
                        ref_h[t, :, env],
                        ref_c[t, :, env] if ref_c is not None else None,
                    )
            # training: the rollout's pieces between episode starts as variable-length sequences (a
            # PackedSequence, caller's order unsorted), each from the state the rollout entered it with
            pieces = segments(resets_np)
            order = rng.permutation(len(pieces))
            assert len(pieces) > 2 * N_ENVS  # CartPole's episodes end inside a rollout
            for mb, chunk in enumerate(np.array_split(order, 3)):
                sel = [pieces[i] for i in chunk]
                seqs = [xs_t[a : a + n, env] for env, a, n in sel]
                h0 = torch.stack([_state_in(h_start, ref_h, resets_np, env, a) for env, a, _ in sel], 1)
                c0 = (
                    torch.stack([_state_in(c_start, ref_c, resets_np, env, a) for env, a, _ in sel], 1)
                    if is_lstm
                    else None
                )
                lengths = np.array([n for _, _, n in sel])
                width = int(lengths.max())
                steps_tag = np.array([[base + a + min(t, n - 1) for t in range(width)] for _, a, n in sel])
                packed = pack_sequence(seqs, enforce_sorted=False)
                with probe.tag(
                    phase="train",
                    iteration=it,
                    epoch=0,
                    minibatch=mb,
                    env=np.array([env for env, _, _ in sel]),
                    env_step=steps_tag,
                ):
                    out, state = m(packed, (h0, c0) if is_lstm else h0)
                hn, cn = state if is_lstm else (state, None)
                exp_h, exp_c = [], []
                for k, (_, _, n) in enumerate(sel):  # step-by-step, with the weights of this call
                    rh, rc = rerun(m, seqs[k][:, None], h0[:, k : k + 1], c0[:, k : k + 1] if is_lstm else None)
                    exp_h.append(np.pad(rh[:, :, 0], ((0, width - n), (0, 0), (0, 0))))
                    if rc is not None:
                        exp_c.append(np.pad(rc[:, :, 0], ((0, width - n), (0, 0), (0, 0))))
                train_expected.append(
                    (
                        lengths,
                        np.stack(exp_h, 2),
                        np.stack(exp_c, 2) if exp_c else None,
                        hn.detach().double().numpy(),
                        cn.detach().double().numpy() if cn is not None else None,
                    )
                )
                loss = head(out.data).logsumexp(-1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            h, c = h.detach(), c.detach()
    envs.close()

    df = lstm_probe.load(tmp_path / "g.parquet")
    roll = df[df.phase == "rollout"]
    assert len(roll) == ITERATIONS * STEPS * N_ENVS * layers
    for col in ("h", "c") if is_lstm else ("h",):
        got = lstm_probe.states(roll, col)
        want = np.stack([roll_expected[k][col == "c"][layer] for k, layer in zip(_keys(roll), roll.layer, strict=True)])
        assert_close(got, want)
    if not is_lstm:
        assert df.c.isna().all()
    assert roll[roll.layer == 0].h_norm.groupby(roll.env).min().gt(0).all()  # no env's states were zeroed

    train = df[df.phase == "train"]
    calls = sorted(train.call.unique())
    assert len(calls) == len(train_expected) == 3 * ITERATIONS
    for call, (lengths, exp_h, exp_c, hn, cn) in zip(calls, train_expected, strict=True):
        rows = train[train.call == call]
        width, n = exp_h.shape[0], exp_h.shape[2]
        assert len(rows) == layers * n * width and set(rows.path) == {"sequence"}
        seq, t, layer = rows.seq.to_numpy(), rows.t.to_numpy(), rows.layer.to_numpy()
        real = t < lengths[seq]
        assert (rows.padding.to_numpy() == ~real).all()
        assert rows.env[~real].isna().all() and rows.env_step[~real].isna().all()
        assert (rows.seq_len.to_numpy() == lengths[seq]).all()
        assert rows.env[real].notna().all()
        for col, exp, last in (("h", exp_h, hn), ("c", exp_c, cn)):
            if exp is None:
                continue
            got = lstm_probe.states(rows, col)
            assert_close(got[real], exp[t[real], layer[real], seq[real]])
            assert not got[~real].any()  # padding rows: zeros, as pad_packed_sequence pads
            ends = real & (t == lengths[seq] - 1)  # after each sequence's last real step: the returned h_n/c_n
            assert_close(got[ends], last[layer[ends], seq[ends]])
    report = lstm_probe.summarize(tmp_path / "g.parquet")
    assert not any("no LSTM call" in w or "not traced" in w for w in report.warnings)


def _state_in(start: torch.Tensor, ref: np.ndarray, resets: np.ndarray, env: int, a: int) -> torch.Tensor:
    """The state a rollout piece started from: zeros after a reset, the iteration's start state at step 0."""
    if resets[a, env]:
        return torch.zeros(start.shape[0], start.shape[2])
    if a == 0:
        return start[:, env].clone()
    return torch.tensor(ref[a - 1, :, env], dtype=torch.float32)


def _keys(rows):
    return zip(rows.iteration, rows.env.astype(int), rows.env_step.astype(int), strict=True)


@pytest.mark.parametrize("cell", [nn.LSTMCell, nn.GRUCell])
def test_cell_loop_with_in_place_resets(tmp_path, cell):
    """One-step cells whose returned states the loop zeroes in place: the log keeps what was returned."""
    torch.manual_seed(1)
    m = cell(OBS, HIDDEN)
    is_lstm = cell is nn.LSTMCell
    xs = torch.randn(40, N_ENVS, OBS) * 2
    resets = torch.rand(40, N_ENVS) < 0.2
    h = torch.zeros(N_ENVS, HIDDEN)
    c = torch.zeros(N_ENVS, HIDDEN)
    want_h, want_c = [], []
    with torch.no_grad(), lstm_probe.trace(m, tmp_path / "c.parquet") as probe:
        for t in range(40):
            with probe.tag(phase="rollout", env=np.arange(N_ENVS), env_step=t):
                h[resets[t]] = 0.0
                c[resets[t]] = 0.0
                if is_lstm:
                    h, c = m(xs[t], (h, c))
                    want_c.append(c.clone())
                else:
                    h = m(xs[t], h)
                want_h.append(h.clone())
        h.zero_(), c.zero_()  # the last call's states too
    df = lstm_probe.load(tmp_path / "c.parquet").sort_values(["env_step", "env"])
    assert_close(lstm_probe.states(df, "h"), torch.stack(want_h).reshape(-1, HIDDEN).double().numpy())
    if is_lstm:
        assert_close(lstm_probe.states(df, "c"), torch.stack(want_c).reshape(-1, HIDDEN).double().numpy())


def test_untagged_packed_call_batch_first(tmp_path):
    """A PackedSequence call outside any tag block: rows per (sequence, step) in the caller's order, padding
    rows after each sequence's end, each sequence's last c the module's c_n."""
    from torch.nn.utils.rnn import pad_packed_sequence

    torch.manual_seed(5)
    m = nn.LSTM(3, 6, num_layers=2, batch_first=True)
    lengths = [4, 7, 2]  # unsorted: the packing sorts, the log keeps the caller's order
    packed = pack_sequence([torch.randn(n, 3) for n in lengths], enforce_sorted=False)
    h0, c0 = torch.randn(2, 3, 6), torch.randn(2, 3, 6)
    with torch.no_grad(), lstm_probe.trace(m, tmp_path / "p.parquet") as probe:
        out, (hn, cn) = m(packed, (h0, c0))
    assert probe.unsupported_calls == 0
    y = pad_packed_sequence(out, batch_first=True)[0].numpy()  # (N, T, H)
    df = lstm_probe.load(tmp_path / "p.parquet")
    assert len(df) == 2 * 3 * 7 and set(df.path) == {"sequence"}
    seq, t = df.seq.to_numpy(), df.t.to_numpy()
    real = t < np.array(lengths)[seq]
    assert (df.padding.to_numpy() == ~real).all() and (df.seq_len.to_numpy() == np.array(lengths)[seq]).all()
    top = (df.layer == 1).to_numpy()
    assert_close(lstm_probe.states(df, "h")[top], y[seq[top], t[top]].astype(np.float64))
    ends = real & (t == np.array(lengths)[seq] - 1)
    layer = df.layer.to_numpy()
    for col, last in (("h", hn), ("c", cn)):
        assert_close(lstm_probe.states(df, col)[ends], last.double().numpy()[layer[ends], seq[ends]])


def test_report_says_when_calls_were_not_traced(tmp_path):
    m = nn.LSTM(3, 4)
    with torch.no_grad(), lstm_probe.trace(m, tmp_path / "u.parquet") as probe:
        m(torch.randn(2, 1, 3))
        probe.unsupported_calls = 2  # calls on an input the tracer cannot lay out (none is known today)
    warnings = lstm_probe.summarize(tmp_path / "u.parquet").warnings
    assert any("2 LSTM call(s)" in w and "not in the log" in w for w in warnings)


def test_a_model_that_is_no_module_is_refused_in_one_line(tmp_path):
    """A dict or list of modules (an actor and a critic kept apart) raised AttributeError ('dict' object has no
    attribute 'named_modules'); it is refused in one line that says to put them in an nn.ModuleDict, which traces."""
    modules = {"actor": nn.LSTM(3, 4), "critic": nn.GRU(3, 4)}
    for model in (modules, list(modules.values()), 3):
        with pytest.raises(lstm_probe.BadInput, match=r"must be a torch nn\.Module, not (dict|list|int)"):
            lstm_probe.trace(model, out=tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()
    probe = lstm_probe.trace(nn.ModuleDict(modules), out=tmp_path / "x.parquet")
    with probe:
        with probe.tag(phase="rollout", iteration=0, env=[0], env_step=[0]):
            modules["actor"](torch.zeros(1, 1, 3))
            modules["critic"](torch.zeros(1, 1, 3))
    assert sorted(lstm_probe.load(tmp_path / "x.parquet").module.unique()) == ["actor", "critic"]


def test_a_tag_block_before_start_is_refused_and_after_close_is_harmless(tmp_path):
    """A tag block and a traced call before ``start()`` recorded nothing, silently (no log at all); it is refused
    in one line naming the fix. After ``close()`` a tag block is harmless (nothing is hooked) and stays allowed."""
    lstm = nn.LSTM(3, 4)
    probe = lstm_probe.trace(lstm, out=tmp_path / "x.parquet")
    with pytest.raises(lstm_probe.BadInput, match=r"before probe\.start\(\): nothing would be recorded"):
        with probe.tag(phase="rollout", iteration=0, env=[0], env_step=[0]):
            lstm(torch.zeros(1, 1, 3))
    with probe:
        with probe.tag(phase="rollout", iteration=0, env=[0], env_step=[0]):
            lstm(torch.zeros(1, 1, 3))
    with probe.tag(phase="rollout", iteration=1, env=[0], env_step=[1]):
        lstm(torch.zeros(1, 1, 3))
    assert len(lstm_probe.load(tmp_path / "x.parquet", vectors=False)) == 1  # the one call inside start..close
