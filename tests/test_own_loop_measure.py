"""What-if on an own training loop (``trace(..., what_if=True)`` and ``probe.measure_batch``): a CleanRL-shaped
loop on random observations, its minibatches either whole envs from the state stored at the rollout's start
(CleanRL's ppo_atari_lstm) or chunks of 8 steps from the states stored before each step. Training is untouched
(the same final parameters and RNG states); the oracle holds (at minibatch 0 of epoch 0 stored = refreshed, the
copy's gradient from refreshed states is the one the loop steps with: cosine 1); planted weights give the answers
they must (an LSTM that ignores its state: zero states move nothing; one that integrates: they move values);
the example's --what-if writes a report with a What-if section and a measured verdict."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributions import Categorical

import lstm_probe
from lstm_probe.errors import BadInput
from lstm_probe.integrations import own_measure, own_memory

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "cleanrl_lstm.py"
N, T, OBS, HID = 4, 16, 3, 8


def parts(state: Any) -> tuple:
    return state if isinstance(state, tuple) else (state,)


def shaped(pieces: tuple, kind: str) -> Any:
    """The state as the loop keeps it: (h, c) for an LSTM, h for a GRU; each (1, N, HID), a cell's (N, HID)."""
    pieces = tuple(p[0] for p in pieces) if kind.endswith("cell") else pieces
    return pieces if kind.startswith("lstm") else pieces[0]


RNNS = {"lstm": nn.LSTM, "gru": nn.GRU, "lstmcell": nn.LSTMCell, "grucell": nn.GRUCell}


class Agent(nn.Module):
    def __init__(self, kind: str = "lstm") -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(OBS, 6), nn.Tanh())
        self.rnn = RNNS[kind](6, HID)
        self.cell = kind.endswith("cell")
        self.actor = nn.Linear(HID, 3)
        self.critic = nn.Linear(HID, 1)

    def forward(self, x: torch.Tensor, state: Any, done: torch.Tensor) -> tuple:
        """x (T, B, OBS), done (T, B): each step's state reset where done, CleanRL's way (a cell: one call a step
        on (B, ...) inputs and states)."""
        hidden = self.enc(x)
        out = []
        for h, d in zip(hidden, done, strict=True):
            keep = (1.0 - d).view(-1, 1) if self.cell else (1.0 - d).view(1, -1, 1)
            given = tuple(keep * s for s in state) if isinstance(state, tuple) else keep * state
            if self.cell:
                state = self.rnn(h, given)
                o = (state[0] if isinstance(state, tuple) else state).unsqueeze(0)
            else:
                o, state = self.rnn(h.unsqueeze(0), given)
            out.append(o)
        return torch.cat(out), state


def _plant(agent: Agent, integrate: bool) -> None:
    """No recurrent weights; the forget gate shut (the state is ignored) or open (the input integrated)."""
    rnn = agent.rnn
    with torch.no_grad():
        rnn.weight_hh_l0.zero_()
        rnn.bias_hh_l0.zero_()
        rnn.bias_ih_l0.zero_()
        rnn.bias_ih_l0[HID : 2 * HID] = 20.0 if integrate else -50.0
        rnn.bias_ih_l0[:HID] = 20.0
        rnn.bias_ih_l0[3 * HID :] = 20.0


def loop(
    path: Path,
    what_if: bool,
    *,
    chunk: int | None = None,
    lr: float = 3e-3,
    plant: bool | None = None,
    iterations: int = 3,
    done_p: float = 0.1,
    kind: str = "lstm",
) -> tuple[list[torch.Tensor], torch.Tensor, dict]:
    """A CleanRL-shaped PPO loop; ``chunk``: train on chunks of that many steps from the per-step stored states
    (else whole envs from the rollout's first state). Returns the final parameters, torch's RNG state, NumPy's."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    agent = Agent(kind)
    cell = kind.endswith("cell")
    if plant is not None:
        _plant(agent, plant)
    opt = torch.optim.Adam(agent.parameters(), lr=lr)
    extra = {"inputs": lambda a, x: a.enc(x), "memory": what_if, "heads": heads}
    probe = lstm_probe.trace(
        agent, out=path, force=True, capture="summary", what_if=what_if, optimizer=opt, epochs=2, minibatches=2, **extra
    )
    probe.start()
    state = shaped((torch.zeros(1, N, HID), torch.zeros(1, N, HID)), kind)
    done = torch.zeros(N)
    for it in range(iterations):
        first = tuple(p.clone() for p in parts(state))
        obs, dones = torch.randn(T, N, OBS), torch.zeros(T, N)
        saved = tuple(torch.zeros(T, *parts(state)[0].shape) for _ in parts(state))  # the states before each step
        actions, logps, values = torch.zeros(T, N, dtype=torch.long), torch.zeros(T, N), torch.zeros(T, N)
        with torch.no_grad():
            for t in range(T):
                dones[t] = done
                for keep, p in zip(saved, parts(state), strict=True):
                    keep[t] = p
                with probe.tag(
                    phase="rollout", iteration=it, env=np.arange(N), env_step=it * T + t, episode_start=done.numpy()
                ):
                    out, state = agent(obs[t : t + 1], state, done[None])
                dist = Categorical(logits=agent.actor(out[0]))
                actions[t] = dist.sample()
                logps[t], values[t] = dist.log_prob(actions[t]), agent.critic(out[0]).view(-1)
                done = torch.from_numpy(rng.random(N) < done_p).float()
        returns = values + torch.randn(T, N)
        adv = returns - values
        stored = shaped(saved if chunk else first, "lstm" if kind.startswith("lstm") else "gru")
        rollout = {"obs": obs, "episode_start": dones, "rollout_states": stored, "values": values}
        starts = [0] if chunk is None else list(range(0, T, chunk))
        length = T if chunk is None else chunk
        for epoch in range(2):
            order = rng.permutation(N)
            for mb, envs in enumerate([order[: N // 2], order[N // 2 :]]):
                env = np.repeat(envs, len(starts))
                step = np.tile(starts, len(envs))
                cols = (torch.from_numpy(env), torch.from_numpy(step))
                if chunk is None:
                    init = tuple(p[envs] if cell else p[:, envs] for p in parts(first))
                else:
                    init = tuple(p[cols[1], cols[0]] if cell else p[cols[1], :, cols[0]].transpose(0, 1) for p in saved)
                init = init if kind.startswith("lstm") else init[0]
                window = torch.from_numpy(step)[None, :] + torch.arange(length)[:, None]  # (L, B) rollout steps
                e = torch.from_numpy(env)[None, :].expand_as(window)

                data = {"obs": obs, "dones": dones, "actions": actions, "logps": logps, "adv": adv, "ret": returns}
                evaluate = functools.partial(ppo, data=data, at=(window, e))
                steps = (it * T + window.T).numpy()
                with probe.tag(
                    phase="train",
                    iteration=it,
                    epoch=epoch,
                    minibatch=mb,
                    env=env,
                    env_step=steps,
                    episode_start=dones[window, e].T.numpy(),
                ):
                    probe.measure_batch(evaluate, states=init, step=step, **rollout)
                    loss = evaluate(agent, init)["loss"]
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                opt.step()
    probe.close()
    assert not opt._optimizer_step_pre_hooks  # the step hook came off
    return [p.detach().clone() for p in agent.parameters()], torch.get_rng_state(), rng.bit_generator.state


def heads(model: nn.Module, hidden: torch.Tensor) -> dict:
    """The policy's outputs from the LSTM's."""
    return {"dist": Categorical(logits=model.actor(hidden)), "values": model.critic(hidden)}


def ppo(model: nn.Module, s: tuple, data: dict, at: tuple) -> dict:
    """The minibatch ``at`` (rollout steps, envs: each (L, B)) from states ``s``: forward and PPO loss."""
    d = {k: v[at] for k, v in data.items()}
    out, _ = model(d["obs"], s, d["dones"])
    dist = Categorical(logits=model.actor(out))
    logp, v = dist.log_prob(d["actions"]), model.critic(out).squeeze(-1)
    ratio = (logp - d["logps"]).exp()
    a = d["adv"]
    pg = torch.max(-a * ratio, -a * ratio.clamp(0.8, 1.2)).mean()
    vl = ((v - d["ret"]) ** 2).mean()
    ent = dist.entropy()
    loss = pg + 0.5 * vl - 0.01 * ent.mean()
    out_ = {"values": v, "log_prob": logp, "loss": loss, "returns": d["ret"], "dist": dist, "entropy": ent}
    return out_ | {"policy_loss": pg, "value_loss": vl}


def records(path: Path) -> list[dict]:
    cols = lstm_probe.read_info(path).metadata["what_if"]["records"]
    return [dict(zip(cols, row, strict=True)) for row in zip(*cols.values(), strict=True)]


@pytest.mark.parametrize(
    "chunk,kind", [(None, "lstm"), (8, "lstm"), (8, "gru"), (None, "lstmcell"), (8, "lstmcell"), (8, "grucell")]
)
def test_training_untouched_and_the_oracle_holds(tmp_path, chunk, kind):
    """Every kind of recurrent module, a cell's (N, hidden) states included (measured on a one-layer nn.LSTM/GRU
    holding the cell's weights, never on the user's cell: the same parameters and RNG states with or without)."""
    runs = (loop(tmp_path / f"{w}.parquet", w, chunk=chunk, kind=kind) for w in (False, True))
    (pa, ra, na), (pb, rb, nb) = runs
    assert all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))
    assert torch.equal(ra, rb) and na == nb
    rows = records(tmp_path / "True.parquet")
    assert {r["iteration"] for r in rows} == {0, 1, 2}
    assert {(r["epoch"], r["minibatch"]) for r in rows} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    stored = [r for r in rows if r["alternative"] == "stored"]
    for r in stored:
        if (r["epoch"], r["minibatch"]) == (0, 0) or chunk is None:  # CleanRL's: stored = refreshed always
            assert r["state_rnn"] == pytest.approx(0, abs=1e-6) and r["value_abs"] == pytest.approx(0, abs=1e-6)
            assert r["kl"] == pytest.approx(0, abs=1e-7)
            assert r["grad_cos_policy"] == pytest.approx(1, abs=1e-5)
            assert r["grad_cos_value"] == pytest.approx(1, abs=1e-5)
    if chunk:  # chunks from per-step states computed with older weights: stale by the last epoch
        assert max(r["state_rnn"] for r in stored if r["epoch"] == 1) > 1e-4
    info = lstm_probe.read_info(tmp_path / "True.parquet")
    assert info.rows == lstm_probe.read_info(tmp_path / "False.parquet").rows  # no call of the user's modules
    assert info.metadata["capabilities"]["replay"] is True and info.metadata["capabilities"]["respond"] is True
    assert set(info.metadata["memory"]["records"]["iteration"]) == {0, 1, 2}
    assert lstm_probe.read_info(tmp_path / "False.parquet").metadata["capabilities"]["replay"] is False
    report = lstm_probe.summarize(tmp_path / "True.parquet").to_dict()
    assert report["what_if"]["check"]["ok"] is True
    assert not any(u.startswith("what if") for u in report["unavailable"]) and report["memory"]["measured"]
    off = lstm_probe.summarize(tmp_path / "False.parquet").to_dict()["unavailable"]
    assert any(u.startswith("what if") and "measure_batch" in u for u in off)


@pytest.mark.parametrize("integrate", [False, True])
def test_planted_weights(tmp_path, integrate):
    loop(tmp_path / "p.parquet", True, lr=0.0, plant=integrate, done_p=0.02)
    zero = [r for r in records(tmp_path / "p.parquet") if r["alternative"] == "zero" and r["iteration"] >= 1]
    assert zero and all(r["episode_starts"] < r["sequences"] for r in zero)  # some state carried into the rollout
    moved = max(r["value_abs"] for r in zero)
    if integrate:
        assert moved > 1e-3 and max(r["state_rnn"] for r in zero) == pytest.approx(1.0)
    else:
        assert moved == pytest.approx(0, abs=1e-6) and max(r["kl"] for r in zero) == pytest.approx(0, abs=1e-9)
    memory = lstm_probe.summarize(tmp_path / "p.parquet").to_dict()["memory"]
    last = [h for h in memory["horizons"] if h["iteration"] == 2]
    assert {(h["module"], h["metric"]) for h in last} == {("actor", "kl"), ("critic", "value_rel")}
    for h in last:  # an integrator remembers past the rollout; a shut forget gate and no recurrence: nothing
        assert (h["beyond"], h["unused"]) == ((True, False) if integrate else (False, True)), h


def test_replayed_states_are_the_rollouts():
    """With the states at the rollout's first step only, memory re-runs the rollout on the copy: the states
    before each step are the rollout's own (resets at episode starts included)."""
    torch.manual_seed(1)
    lstm, x = nn.LSTM(3, 5), torch.randn(T, N, 3)
    starts = np.random.default_rng(1).random((T, N)) < 0.2
    s = first = (torch.randn(1, N, 5), torch.randn(1, N, 5))
    seen = []
    with torch.no_grad():
        for t in range(T):
            seen.append(s)
            keep = torch.as_tensor(1.0 - starts[t], dtype=torch.float32).view(1, -1, 1)
            _, s = lstm(x[t : t + 1], (keep * s[0], keep * s[1]))
        h, c = own_memory._replay(lstm, x, first, starts)
    assert torch.equal(h, torch.stack([a for a, _ in seen])) and torch.equal(c, torch.stack([b for _, b in seen]))


@pytest.mark.parametrize("kind", ["lstmcell", "grucell"])
def test_a_cells_twin_recomputes_its_states(kind):
    """A cell loop's what-if and memory run on a one-layer nn.LSTM/GRU holding the cell's weights (the copy's:
    ``own_measure.Copy``), its (N, hidden) states as (1, N, hidden): re-run over the rollout from the first states,
    it gives the cell loop's own states before every step (resets included) to 1e-6, and the user's cell never
    runs for it."""
    torch.manual_seed(2)
    agent = Agent(kind)
    x = torch.randn(T, N, 6)
    starts = np.random.default_rng(2).random((T, N)) < 0.2
    first = tuple(torch.randn(N, HID) for _ in range(2 if kind == "lstmcell" else 1))
    s, seen = first, []
    with torch.no_grad():
        for t in range(T):
            seen.append(s)
            keep = torch.as_tensor(1.0 - starts[t], dtype=torch.float32).view(-1, 1)
            s = agent.rnn(x[t], tuple(keep * v for v in s) if len(s) == 2 else keep * s[0])
            s = s if isinstance(s, tuple) else (s,)
    calls = []
    agent.rnn.register_forward_hook(lambda *_: calls.append(1))
    copy = own_measure.Copy(agent, ["rnn"])
    copy.sync(False)
    twin = copy.rnns["rnn"]
    assert isinstance(twin, nn.LSTM if kind == "lstmcell" else nn.GRU) and twin.num_layers == 1
    given = copy.states(first if len(first) == 2 else first[0], "rollout_states")["rnn"]
    assert all(g.shape == (1, N, HID) for g in given)
    with torch.no_grad():
        replayed = own_memory._replay(twin, x, given, starts)
    for i, r in enumerate(replayed):  # (T, 1, N, HID) against the loop's (N, HID) states before each step
        assert (r[:, 0] - torch.stack([v[i] for v in seen])).abs().max() < 1e-6
    back = copy.give({"rnn": given})
    assert all(torch.equal(a, b) for a, b in zip(back if isinstance(back, tuple) else (back,), first, strict=True))
    assert calls == [] and all(p.requires_grad for p in agent.parameters())


def test_refusals(tmp_path):
    agent = Agent()
    with pytest.raises(BadInput, match="heads="):
        lstm_probe.trace(agent, out=tmp_path / "m.parquet", what_if=True, memory=True)
    with pytest.raises(BadInput, match=r"capture_obs.*DataFrame with env, env_step, value"):
        lstm_probe.trace(agent, out=tmp_path / "m.parquet", capture_obs=True)
    probe = lstm_probe.trace(agent, out=tmp_path / "r.parquet", force=True, what_if=True)
    state = (torch.zeros(1, N, HID), torch.zeros(1, N, HID))
    per_step = {"obs": torch.zeros(T, N, OBS), "episode_start": torch.zeros(T, N), "rollout_states": state}
    with probe:
        with pytest.raises(BadInput, match="iteration, epoch, minibatch"):
            probe.measure_batch(lambda m, s: {}, states=state, **per_step)
        with pytest.raises(BadInput, match="one per step"):  # a chunk at step 8 needs the states stored there
            probe.measure_batch(
                lambda m, s: {}, states=state, env=np.arange(N), step=8, iteration=0, epoch=0, minibatch=0, **per_step
            )


def test_example_what_if_memory_report(tmp_path):
    """The example's --what-if --memory: every traced state the same as without (training untouched), and a
    report with both sections and a measured verdict."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    logs = {}
    for name, flags in (("plain", []), ("measured", ["--what-if", "--memory"])):
        logs[name] = tmp_path / f"{name}.parquet"
        args = [sys.executable, str(EXAMPLE), "--iterations", "2", *flags, "--out", str(logs[name])]
        done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    plain, measured = (lstm_probe.load(logs[k]) for k in ("plain", "measured"))
    for col in ("h", "c"):
        assert np.array_equal(np.stack(plain[col].to_numpy()), np.stack(measured[col].to_numpy()))
    report = [sys.executable, "-m", "lstm_probe", "report", str(logs["measured"])]
    rep = subprocess.run([*report, "--json"], capture_output=True, text=True, env=env)
    assert rep.returncode == 0, rep.stderr
    data = json.loads(rep.stdout)
    assert data["what_if"]["measured"] and data["what_if"]["check"]["ok"] is True and data["memory"]["measured"]
    assert data["verdict"]["matters"] is not None and not any("unmeasured" in v for v in data["verdict"]["lines"])
    text = subprocess.run(report, capture_output=True, text=True, env={**env, "COLUMNS": "120"})
    assert "What if" in text.stdout and "Memory" in text.stdout
    # every sequence starts at the rollout's start (stored = refreshed): the verdict says no burn-in is needed,
    # and so do the What-if footer and its JSON, not the shortest burn-in measured (which is within 1% too)
    assert data["verdict"]["matters"] is False and data["verdict"]["burn_in"] == 0
    for key in ("within", "within_stored"):
        assert data["what_if"][key] and all(w["burn_in"] == 0 and w["stored_within"] for w in data["what_if"][key])
    words = " ".join(text.stdout.split())
    assert "no burn-in needed (0 steps): stored states are within 1% of refreshed" in words
    assert "steps; from stored" not in words
