"""Does an RLlib policy use its LSTM, and how far back? RLlib's adapter of the memory-horizon engine
(``lstm_probe/measure/memory.py``, whose docstring says what is measured; ``probe_config(config, out,
memory=True)``, ``lstm-probe run --framework rllib --memory``). It runs in each learner process, once per update,
when the learner connector sees the update's episode chunks (``chunks.py``): the weights are then those the
env runners sampled with (synced before sampling).

The rollout the engine reads is the update's chunks, a chunk per "env" (RLlib keeps no env-major rollout: each chunk
is one episode's steps of one env runner's fragment), padded to the update's longest (the lags and sampled steps
reach that far: each update its own, at most :data:`MAX_STEPS`); a padded step counts as an episode start, so no
sampled step or ablation window reaches into it. The states before each step are the *refreshed* ones: the copy's
LSTMs re-run over each chunk from the state stored before its first step (zero at an episode start). For the actor
they equal the stored ones (its env-runner weights are the learner's); RLlib's env runners never receive the critic
encoder's weights (``whatif.py`` says where), so the critic's stored states would mix another critic's state into
the unablated reference. The values' spread is the copy's values over the chunks' steps. Episode lengths are those
of the chunks that hold a whole episode.

The heads (``algorithms/ppo/torch/default_ppo_torch_rl_module.py``): ``pi`` on the actor's LSTM output, its
distribution from ``get_train_action_dist_cls().from_logits`` (the torch distribution in ``_dist``); ``vf`` on
the critic's LSTM output (with ``vf_share_layers=True``: on the one LSTM's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lstm_probe.integrations.rllib.chunks import Chunks, Replica
from lstm_probe.measure import memory as engine
from lstm_probe.measure.memory import DEFAULT_EVERY, SAMPLES, Out, Rollout

MAX_STEPS = 1024
"""The steps of a chunk the measurement reads at most (a fragment bounds a chunk, its appended bootstrap step
included; a batch of whole episodes has no such bound): a longer chunk is read to its first MAX_STEPS steps, and the
log counts the updates so cut (``sampling.cut_updates``)."""


def settings(memory: bool, every: int | None) -> dict[str, Any] | None:
    """The settings of :class:`Memory` (None when ``--memory`` is off)."""
    if not memory:
        return None
    return {"every": DEFAULT_EVERY if every is None else every}


def _cut(d: Any, ok: np.ndarray) -> Any:
    """The distribution ``d`` at the pairs ``ok`` (a torch distribution does not index)."""
    if isinstance(d, torch.distributions.Categorical):
        return torch.distributions.Categorical(logits=d.logits[ok])
    if isinstance(d, torch.distributions.Normal):
        return torch.distributions.Normal(d.loc[ok], d.scale[ok])
    return None


class Memory:
    """The memory-horizon measurement of one RLlib learner: :meth:`on_update` once per update."""

    def __init__(self, replica: Replica, *, every: int = DEFAULT_EVERY):
        self.replica = replica
        self.modules = list(replica.rnns)
        self.engine: engine.Memory | None = None
        self.every = every
        self.longest = 0  # the longest chunk read, over the measured updates
        self.cut = 0  # the measured updates whose longest chunk was longer than MAX_STEPS

    def on_update(self, iteration: int, chunks: Chunks) -> None:
        n_chunks, length = chunks.shape
        read = min(length, MAX_STEPS)
        if self.engine is None:
            self.engine = engine.Memory(
                n_envs=n_chunks,
                n_steps=read,
                modules=self.modules,
                critic="shared" if self.replica.shared else "lstm",
                every=self.every,
            )
        eng = self.engine
        whole = chunks.episode_start & chunks.ended
        eng.completed([int(n) - 1 for n in chunks.lengths[whole]])  # less the appended bootstrap step
        if not eng.wants(iteration) or n_chunks == 0:
            return
        eng.n_envs = n_chunks
        if read != eng.n_steps:  # this update's own chunks: lags and sampled steps up to its longest
            eng.n_steps, eng.lags, eng.steps = read, engine.lags(read), engine.sample_steps(read, SAMPLES)
        self.longest, self.cut = max(self.longest, read), self.cut + (length > read)
        device = next(self.replica.copy.parameters()).device
        eng.measure(lambda: self._rollout(iteration, chunks, eng.n_steps), device)

    def metadata(self) -> dict[str, Any] | None:
        """The engine's record; ``rollout_length`` and ``lags``: the longest chunk read and its lags (each update
        reads its own chunks: ``sampling.chunks`` says so, ``steps_per_env`` are the last measured update's)."""
        if self.engine is None:
            return None
        meta = self.engine.metadata()
        if self.longest:
            meta["rollout_length"], meta["lags"] = self.longest, engine.lags(self.longest)
        meta["sampling"] |= {"chunks": "each update's own", "max_chunk_steps": MAX_STEPS, "cut_updates": self.cut}
        return meta

    def _rollout(self, iteration: int, chunks: Chunks, n_steps: int) -> Rollout:
        rep = self.replica
        rep.sync()
        rep.copy.eval()
        n_chunks, length = chunks.shape
        steps = min(length, n_steps)
        real = np.arange(n_steps)[:, None] < np.minimum(chunks.lengths, n_steps)[None, :]  # (T, C)
        starts = ~real
        starts[0] = chunks.episode_start | ~real[0]
        obs = chunks.obs[:, :steps].transpose(0, 1)  # (T', C, ...)
        flat = obs.reshape(steps * n_chunks, *obs.shape[2:])
        inputs, stored, outputs = {}, {}, {}
        for role, rnn in rep.rnns.items():
            x = rep.inputs(role, flat).reshape(steps, n_chunks, -1)
            if steps < n_steps:
                x = torch.cat([x, x.new_zeros(n_steps - steps, *x.shape[1:])])
            inputs[role] = x
            first = tuple(
                torch.as_tensor(s.reshape(n_chunks, length, *s.shape[1:])[:, 0], dtype=x.dtype).transpose(0, 1)
                for s in chunks.stored[role]
            )  # (layers, C, hidden) before each chunk's first step
            keep = torch.as_tensor(~chunks.episode_start, dtype=x.dtype)[None, :, None]
            state = tuple(f.contiguous() * keep for f in first)
            hs, cs, ys = [], [], []
            for t in range(n_steps):  # refreshed: the copy's LSTM over each chunk, states before each step kept
                hs.append(state[0])
                cs.append(state[1])
                y, out = rnn(x[t : t + 1], state)
                state = tuple(out)
                ys.append(y[0])
            stored[role] = (torch.stack(hs), torch.stack(cs))  # (T, layers, C, hidden)
            outputs[role] = torch.stack(ys)  # (T, C, hidden)
        value_role = "actor" if rep.shared else "critic"
        copy = rep.copy
        dist_cls = copy.get_train_action_dist_cls()
        mask = torch.as_tensor(real)
        values = copy.vf(outputs[value_role][mask]).squeeze(-1)

        def heads(latent: dict[str, torch.Tensor], t: np.ndarray, env: np.ndarray) -> Out:
            d = getattr(dist_cls.from_logits(copy.pi(latent["actor"])), "_dist", None)
            v = copy.vf(latent[value_role]).squeeze(-1)
            return Out(v, lambda ok: _cut(d, ok))

        return Rollout(
            iteration=iteration,
            starts=starts,
            rnns=rep.rnns,
            inputs=inputs,
            stored=stored,
            heads=heads,
            values=values,
            value_modules=[value_role],
        )
