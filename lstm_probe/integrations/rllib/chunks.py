"""What RLlib's measurements on copies share (what-if: ``whatif.py``; the memory horizon: ``memory.py``): one
private copy of a learner's RLModule (:class:`Replica`) and the update's episode chunks as a rollout
(:class:`Chunks`), read once per update in the learner connector.

What it relies on (RLlib 2.60), cited by file:function:

- ``core/models/torch/encoder.py:TorchLSTMEncoder._forward``: the LSTM's input is the tokenizer's output (or
  the observations), its states batch-first (``STATE_IN``: ``{"h", "c"}``; per encoder ``{"actor": ...,
  "critic": ...}`` when ``vf_share_layers=False``, ``core/models/base.py:StatefulActorCriticEncoder``); the
  LSTM's output is the encoder's output, which ``pi`` and ``vf`` read
  (``algorithms/ppo/torch/default_ppo_torch_rl_module.py``).
- ``connectors/common/add_states_from_episodes_to_batch.py:AddStatesFromEpisodesToBatch.__call__`` (learner
  side): a chunk's step starts from the state stored before it: the module's initial state at an episode's
  first step (``t_started == 0``), else the ``STATE_OUT`` of the step before (the lookback buffer holds the
  previous chunk's last one at the chunk's first step).
- ``env/single_agent_episode.py:SingleAgentEpisode``: ``get_observations`` and ``get_extra_model_outputs``
  (numpy once the env runner sent it), ``t_started``, ``custom_data`` (the probe's provenance entry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.errors import BadInput
from lstm_probe.measure import copies

ENCODERS = {
    "encoder.encoder.lstm": ("actor", None),
    "encoder.actor_encoder.lstm": ("actor", "actor"),
    "encoder.critic_encoder.lstm": ("critic", "critic"),
}
"""RLlib's default LSTM encoders: the LSTM's name -> (the probe's module name, its key in ``STATE_IN``; None:
the one shared encoder's states are ``STATE_IN`` itself)."""


def leaves(state: Any, key: str | None) -> tuple[Any, ...]:
    """(h, c) of one encoder from a (nested) state dict."""
    s = state if key is None else state[key]
    return (s["h"], s["c"])


class Replica:
    """A private copy of a learner's RLModule (``measure/copies.py``: none of the user's code runs on it), with
    its LSTMs by the probe's module names."""

    def __init__(self, module: Any, what: str):
        found = {n: m for n, m in module.named_modules() if isinstance(m, nn.LSTM | nn.GRU)}
        unknown = sorted(set(found) - set(ENCODERS))
        if unknown or not found:
            raise BadInput(f"{what} follows RLlib's default LSTM encoders (use_lstm=True); this RLModule has {unknown}")
        self.module = module
        self.copy = copies.private_copy(module)
        self._pairs = copies.pairs(self.copy, module)
        copied = dict(self.copy.named_modules())
        self.encoders = {ENCODERS[n][0]: (n[: -len(".lstm")], ENCODERS[n][1]) for n in sorted(found)}
        self.rnns: dict[str, nn.Module] = {
            role: copies.twin(copied[f"{path}.lstm"], batch_first=False) for role, (path, _) in self.encoders.items()
        }
        """Each LSTM of the copy as the engines take it: sequence-first (RLlib's are batch-first), its parameters
        the copy's own (one sync updates both)."""
        self.shared = "critic" not in self.rnns

    def sync(self) -> None:
        """The user's current weights into the copy, and its train/eval mode."""
        copies.sync(self._pairs)
        self.copy.train(self.module.training)

    def inputs(self, role: str, obs: torch.Tensor) -> torch.Tensor:
        """The LSTM's input for ``obs`` (N, ...) on the copy (``TorchLSTMEncoder._forward``: the tokenizer, if any)."""
        from ray.rllib.core.columns import Columns
        from ray.rllib.core.models.base import tokenize

        encoder = dict(self.copy.named_modules())[self.encoders[role][0]]
        x = obs.to(next(self.copy.parameters()).device)
        if encoder.tokenizer is None:
            return x.float()
        out: Any = tokenize(encoder.tokenizer, {Columns.OBS: x[:, None]}, framework="torch")  # (N, T=1, F)
        return out[:, 0]


@dataclass
class Chunks:
    """An update's episode chunks, a chunk per row, padded to the longest (C chunks, L steps)."""

    obs: torch.Tensor
    """(C, L, ...) float32 observations (zero past a chunk's end)."""
    lengths: np.ndarray
    """(C,) each chunk's steps (the appended bootstrap step included)."""
    episode_start: np.ndarray
    """(C,) bool: the chunk begins its episode (its first step starts from the initial state)."""
    ended: np.ndarray
    """(C,) bool: the chunk's episode ended in it."""
    stored: dict[str, tuple[np.ndarray, ...]]
    """Per module, (h, c) stored before each step, each (C * L, layers, hidden) (chunk-major)."""
    index: dict[tuple[int, int, int, int], int]
    """(worker, env, episode, chunk start) -> chunk row, for the chunks the probe's callbacks saw."""

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.lengths), int(self.obs.shape[1]) if self.obs.dim() > 1 else 1


def _size(rnn: nn.Module, name: str) -> int:
    return int(getattr(rnn, name))


def read(episodes: list[Any], key: str, replica: Replica) -> Chunks:
    """The update's chunks (``key``: the probe's entry in each chunk's ``custom_data``)."""
    from ray.rllib.core.columns import Columns

    n_chunks = len(episodes)
    length = max((len(sa) for sa in episodes), default=1)
    obs: np.ndarray | None = None
    rnns = replica.rnns
    stored = {
        r: tuple(
            np.zeros((n_chunks * length, _size(rnns[r], "num_layers"), _size(rnns[r], "hidden_size")), np.float32)
            for _ in range(2)
        )
        for r in rnns
    }
    lengths = np.zeros(n_chunks, np.int64)
    start = np.zeros(n_chunks, bool)
    ended = np.zeros(n_chunks, bool)
    initial = replica.copy.get_initial_state()
    index: dict[tuple[int, int, int, int], int] = {}
    for c, sa in enumerate(episodes):
        n = lengths[c] = len(sa)
        info = sa.custom_data.get(key)
        if info is not None:
            index[(info["worker"], info["env"], info["episode"], int(sa.t_started))] = c
            ended[c] = bool(info.get("ended"))
        o = np.asarray(sa.get_observations(slice(0, n)), np.float32)
        if obs is None:
            obs = np.zeros((n_chunks, length, *o.shape[1:]), np.float32)
        obs[c, :n] = o
        start[c] = sa.t_started == 0
        has = Columns.STATE_OUT in sa.extra_model_outputs
        first = (
            sa.get_extra_model_outputs(key=Columns.STATE_OUT, indices=-1, neg_index_as_lookback=True)
            if has and sa.t_started != 0
            else initial
        )
        outs = sa.get_extra_model_outputs(key=Columns.STATE_OUT) if has else None
        for role, (_, sub) in replica.encoders.items():
            for i, leaf in enumerate(leaves(first, sub)):
                stored[role][i][c * length] = np.asarray(leaf, np.float32)
            if outs is not None and n > 1:
                for i, leaf in enumerate(leaves(outs, sub)):
                    stored[role][i][c * length + 1 : c * length + n] = np.asarray(leaf, np.float32)[: n - 1]
    observations = torch.from_numpy(obs if obs is not None else np.zeros((0, length), np.float32))
    return Chunks(observations, lengths, start, ended, stored, index)
