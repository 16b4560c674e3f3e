"""Own loops written the other ways users write them, with what-if and the memory horizon on: a ``batch_first=True``
LSTM (the loop feeds (N, 1, F) one step at a time) measures exactly what the same loop's sequence-first LSTM
does, and a loop trained under ``torch.autocast(dtype=torch.bfloat16)`` (its states come out in bfloat16) is
measured under its autocast: stored = refreshed at minibatch 0 of epoch 0. Training is untouched in both."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributions import Categorical

import lstm_probe

N, T, OBS, HID = 4, 12, 3, 8


class Agent(nn.Module):
    def __init__(self, batch_first: bool, cell: bool = False) -> None:
        super().__init__()
        self.batch_first, self.cell = batch_first, cell
        self.enc = nn.Sequential(nn.Linear(OBS, 6), nn.Tanh())
        self.lstm = nn.LSTMCell(6, HID) if cell else nn.LSTM(6, HID, num_layers=2, batch_first=batch_first)
        self.actor = nn.Linear(HID, 2)
        self.critic = nn.Linear(HID, 1)

    def forward(self, x: torch.Tensor, state: tuple, done: torch.Tensor) -> tuple:
        """x (T, B, OBS), done (T, B): one LSTM call a step, the state reset where done (CleanRL's get_states); an
        LSTMCell's (B, HID) states stepped by hand."""
        out = []
        for h, d in zip(self.enc(x), done, strict=True):
            keep = (1.0 - d).view(*([-1, 1] if self.cell else [1, -1, 1])).to(state[0].dtype)
            given = (keep * state[0], keep * state[1])
            if self.cell:
                state = self.lstm(h, given)
                out.append(state[0])
                continue
            o, state = self.lstm(h.unsqueeze(1 if self.batch_first else 0), given)
            out.append(o.squeeze(1 if self.batch_first else 0))
        return torch.stack(out), state


def heads(agent: nn.Module, hidden: torch.Tensor) -> dict:
    return {"dist": Categorical(logits=agent.actor(hidden).float()), "values": agent.critic(hidden).float()}


def ppo(model: nn.Module, s: tuple, envs: np.ndarray, data: dict, amp: Any) -> dict:
    """The minibatch of whole envs ``envs`` from states ``s``: forward (under the loop's ``amp``) and PPO loss."""
    d = {k: v[:, envs] for k, v in data.items()}
    with amp:
        out, _ = model(d["obs"], s, d["dones"])
        dist = Categorical(logits=model.actor(out).float())
        v = model.critic(out).float().squeeze(-1)
    logp = dist.log_prob(d["actions"])
    ratio = (logp - d["logps"]).exp()
    adv = d["ret"] - d["values"]
    loss = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean() + ((v - d["ret"]) ** 2).mean()
    return {"values": v, "log_prob": logp, "loss": loss, "returns": d["ret"], "dist": dist}


def loop(
    path: Path | None, *, batch_first: bool = False, bf16: bool = False, cell: bool = False
) -> tuple[list[torch.Tensor], Any]:
    """Two iterations of a CleanRL-shaped PPO loop on random observations; ``path`` None: no probe; ``cell``: an
    LSTMCell stepped by hand. Returns the final parameters and torch's RNG state."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    agent = Agent(batch_first, cell)
    opt = torch.optim.Adam(agent.parameters(), lr=1e-2)
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    probe: Any = None
    if path is not None:
        probe = lstm_probe.trace(
            agent, out=path, force=True, capture="summary", what_if=True, memory=True, heads=heads, optimizer=opt,
            inputs=lambda a, x: a.enc(x), epochs=2, minibatches=2,
        )  # fmt: skip
        probe.start()
    tag = probe.tag if probe is not None else (lambda **_: contextlib.nullcontext())
    state = (torch.zeros(N, HID), torch.zeros(N, HID)) if cell else (torch.zeros(2, N, HID), torch.zeros(2, N, HID))
    done = torch.zeros(N)
    for it in range(2):
        first = (state[0].clone(), state[1].clone())
        obs, dones = torch.randn(T, N, OBS), torch.zeros(T, N)
        actions, logps, values = torch.zeros(T, N, dtype=torch.long), torch.zeros(T, N), torch.zeros(T, N)
        with torch.no_grad():
            for t in range(T):
                dones[t] = done
                with amp, tag(phase="rollout", iteration=it, env=np.arange(N), env_step=it * T + t,
                              episode_start=done.numpy()):  # fmt: skip
                    out, state = agent(obs[t : t + 1], state, done[None])
                    dist, value = Categorical(logits=agent.actor(out[0]).float()), agent.critic(out[0]).float()
                actions[t] = dist.sample()
                logps[t], values[t] = dist.log_prob(actions[t]), value.view(-1)
                done = torch.from_numpy(rng.random(N) < 0.15).float()
        returns = values + torch.randn(T, N)

        data = {"obs": obs, "dones": dones, "actions": actions, "logps": logps, "values": values, "ret": returns}
        rollout = {"obs": obs, "episode_start": dones, "rollout_states": first, "values": values}
        steps = np.arange(it * T, it * T + T)[None, :]
        for epoch in range(2):
            order = rng.permutation(N)
            for mb, envs in enumerate([order[: N // 2], order[N // 2 :]]):
                init = (first[0][envs], first[1][envs]) if cell else (first[0][:, envs], first[1][:, envs])
                with tag(phase="train", iteration=it, epoch=epoch, minibatch=mb, env=envs, env_step=steps,
                         episode_start=dones[:, envs].T.numpy()):  # fmt: skip
                    if probe is not None:
                        evaluate = functools.partial(ppo, envs=envs, data=data, amp=amp)
                        probe.measure_batch(evaluate, states=init, **rollout)
                    loss = ppo(agent, init, envs, data, amp)["loss"]
                opt.zero_grad()
                loss.backward()
                opt.step()
    if probe is not None:
        probe.close()
    return [p.detach().clone() for p in agent.parameters()], torch.get_rng_state()


def measured(path: Path) -> tuple[dict, dict]:
    meta = lstm_probe.read_info(path).metadata
    return meta["what_if"]["records"], meta["memory"]["records"]


@pytest.mark.parametrize("bf16", [False, True])
def test_batch_first_and_autocast_loops_are_measured(tmp_path, bf16):
    plain, plain_rng = loop(None, bf16=bf16)
    for batch_first in (False, True):
        path = tmp_path / f"{batch_first}.parquet"
        params, rng = loop(path, batch_first=batch_first, bf16=bf16)
        assert all(torch.equal(a, b) for a, b in zip(plain, params, strict=True)) and torch.equal(rng, plain_rng)
        rep = lstm_probe.summarize(path)
        assert rep.warnings == [] and rep.staleness.provenance_ok is True
        report = rep.to_dict()
        assert report["what_if"]["check"]["ok"] is True and report["memory"]["measured"]
    whatif, memory = measured(tmp_path / "True.parquet")
    assert (whatif, memory) == measured(tmp_path / "False.parquet")  # batch-first measures as sequence-first
    columns = list(whatif)
    rows = [dict(zip(columns, r, strict=True)) for r in zip(*whatif.values(), strict=True)]
    stored = [r for r in rows if r["alternative"] == "stored" and (r["epoch"], r["minibatch"]) == (0, 0)]
    assert {r["iteration"] for r in stored} == {0, 1}
    for r in stored:  # the rollout's weights: the copy's refreshed states are the stored ones, in bfloat16 too
        assert r["state_lstm"] == 0 and r["value_abs"] == 0 and r["kl"] == 0


@pytest.mark.parametrize("bf16", [False, True])
def test_lstmcell_loops_are_measured(tmp_path, bf16):
    """An LSTMCell stepped by hand ((N, hidden) states), under autocast too: measured on a one-layer nn.LSTM holding
    the cell's weights (never the user's cell: training untouched), stored = refreshed at
    minibatch 0 of epoch 0."""
    plain, plain_rng = loop(None, bf16=bf16, cell=True)
    path = tmp_path / "cell.parquet"
    params, rng = loop(path, bf16=bf16, cell=True)
    assert all(torch.equal(a, b) for a, b in zip(plain, params, strict=True)) and torch.equal(rng, plain_rng)
    rep = lstm_probe.summarize(path)
    assert rep.warnings == [] and rep.staleness.provenance_ok is True
    report = rep.to_dict()
    assert report["what_if"]["check"]["ok"] is True and report["memory"]["measured"]
    whatif, memory = measured(path)
    rows = [dict(zip(whatif, r, strict=True)) for r in zip(*whatif.values(), strict=True)]
    stored = [r for r in rows if r["alternative"] == "stored" and (r["epoch"], r["minibatch"]) == (0, 0)]
    assert {r["iteration"] for r in stored} == {0, 1}
    for r in stored:
        assert r["state_lstm"] == 0 and r["value_abs"] == 0 and r["kl"] == 0
    assert set(memory["iteration"]) == {0, 1}
