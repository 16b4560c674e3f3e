"""Where the samples of a TorchRL recurrent-mode call come from, and how TorchRL splits them.

- :func:`pieces` / :func:`pieces_on_device`: a (B, T) call's rows split where ``is_init`` is set after
  their first step (torchrl/modules/tensordict_module/rnn.py ``LSTMModule.forward``: the "pad" backend's
  ``_split_and_pad_for_reset``, the "scan" backend's ``where(is_init, stored, carry)``), leaving out the
  samples TorchRL marks as padding (``("collector", "mask")`` False: ``split_trajs=True``,
  torchrl/collectors/utils.py ``split_trajectories``; ``SliceSampler(pad_output=True)``);
- :func:`gae_batch` / :func:`gae_pass`: which samples of its batch a value estimator's call holds. GAE and
  the TD estimators call the value network on ``data.select(*in_keys)`` and on
  ``data["next"].select(*in_keys)`` (torchrl/objectives/value/advantages.py
  ``ValueEstimatorBase._call_value_nets``), which drops the step counts and trajectory ids the provenance
  needs; the batch they were taken from is that frame's ``data``.
- :func:`not_repeated`: the samples a sampler repeated as padding where the batch has no mask;
- :class:`Envs`, :class:`StagedCall`: a module's provenance of sequential calls (env steps, episodes, the
  collection's trajectory ids), each call's staged on the device until its values reach the host;
- :func:`host`: small integer tensors on the host, in one copy per device (the staged sequential and
  recurrent-mode call's provenance, hooks.py ``TorchRLProbe._settle``).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

from lstm_probe.contract import Grid
from lstm_probe.log.schema import COLUMN

GAE_FRAME = "_call_value_nets"
"""torchrl/objectives/value/advantages.py ``ValueEstimatorBase._call_value_nets``: every value estimator's
(GAE, TD(0), TD(1), TD(lambda)) calls of the value network in its ``forward`` go through it."""
NEXT_FRAME = "_next_value"
"""advantages.py ``ValueEstimatorBase._next_value``: an estimator's ``value_estimate`` (a loss's target, DQN's
with ``target_params``) runs the value network on ``step_td = step_mdp(tensordict, keep_other=False)``
alone: the pass over the batch's next samples."""


def host(tensors: list[torch.Tensor | None]) -> list[np.ndarray | None]:
    """Small integer tensors (is_init, step counts, trajectory ids, masks) on the host as flat int64 arrays,
    in one copy per device: concatenated where they are, then copied into one host buffer (on a GPU the one
    wait of the copy; on the CPU no copy at all but the concatenation)."""
    out: list[np.ndarray | None] = [None] * len(tensors)
    devices: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        if t is not None:
            devices.setdefault(t.device, []).append(i)
    for idx in devices.values():
        flat = [tensors[i].detach().reshape(-1).long() for i in idx]  # type: ignore[union-attr]
        joined = torch.cat(flat)
        if joined.device.type != "cpu":
            buf = torch.empty(joined.shape, dtype=joined.dtype, pin_memory=joined.device.type == "cuda")
            joined = buf.copy_(joined)
        values = joined.numpy()
        at = 0
        for i, f in zip(idx, flat, strict=True):
            out[i] = values[at : at + f.numel()]
            at += f.numel()
    return out


def rows_on_host(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """Float32 (N, width) tensors of one device (the staged calls' kept observations) on the host, in one copy:
    stacked along N where they are, then copied into one host buffer."""
    joined = torch.cat(tensors)
    if joined.device.type != "cpu":
        buf = torch.empty(joined.shape, dtype=joined.dtype, pin_memory=joined.device.type == "cuda")
        joined = buf.copy_(joined)
    values = joined.numpy()
    out, at = [], 0
    for t in tensors:
        out.append(values[at : at + t.shape[0]])
        at += int(t.shape[0])
    return out


def not_repeated(tr: np.ndarray, sc: np.ndarray, rows: int, steps: int) -> np.ndarray | None:
    """Where a batch has no padding mask: False on each sample that repeats the one before it in its row
    (the same trajectory and step: ``SliceSampler(pad_output=True)`` pads a short slice with copies of its
    last step, and writes the mask that says so, ``("collector", "mask")``, into the sample only through a
    TensorDictReplayBuffer, torchrl/data/replay_buffers/samplers/slice.py ``SliceSampler``). None where no
    sample repeats."""
    t, s = tr.reshape(rows, steps), sc.reshape(rows, steps)
    again = np.zeros((rows, steps), bool)
    again[:, 1:] = (t[:, 1:] == t[:, :-1]) & (s[:, 1:] == s[:, :-1])
    return ~again.reshape(-1) if again.any() else None


def _cuts(init: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
    """(rows, steps) bool: where a piece starts. A row's first step and every ``is_init`` start one; with
    ``valid`` (TorchRL's padding mask), padded samples start none and belong to none, and a real sample
    after padding starts one."""
    cut = init.astype(bool).copy()
    cut[:, 0] = True
    if valid is not None:
        before = np.c_[np.zeros((len(valid), 1), bool), valid[:, :-1]]
        cut = valid & (cut | ~before)
    return cut


def pieces(init: np.ndarray, rows: int, steps: int, valid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A recurrent-mode call's pieces on the host: ``init`` (rows * steps,) is_init, each row split where it
    is set after the row's first step; ``valid`` (rows * steps,), where given, leaves TorchRL's padded
    samples out. Returns each piece's flat index of its first sample and its length, longest first (ties
    in batch order: a PackedSequence needs them sorted, and sorting here leaves the shadow's packed call no
    permutation for the core to undo). No piece at all where every sample is padding."""
    ok = valid.reshape(rows, steps).astype(bool) if valid is not None else None
    cut = _cuts(init.reshape(rows, steps), ok).reshape(-1)
    first = np.flatnonzero(cut)
    piece = np.cumsum(cut) - 1
    real = ok.reshape(-1) if ok is not None else np.ones(rows * steps, bool)
    lengths = np.bincount(piece[real], minlength=len(first))[: len(first)]
    order = np.argsort(-lengths, kind="stable")
    return first[order], lengths[order]


def pieces_on_device(
    is_init: torch.Tensor, rows: int, steps: int, count: int, longest: int, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pieces` computed where ``is_init`` is, with torch ops that never wait for the device (the
    piece count and the longest length, from the host copy, fix the shapes): each piece's first flat
    index (count,) and the (count, longest) flat indices of its samples, the padding repeating the
    first. The same pieces in the same order as :func:`pieces`."""
    dev = is_init.device
    n = rows * steps
    cut = is_init.detach().reshape(rows, steps).bool().clone()
    cut[:, 0] = True
    real = torch.ones(n, dtype=torch.bool, device=dev)
    if valid is not None:
        ok = valid.detach().reshape(rows, steps)
        ok = (ok if ok.device == dev else ok.to(dev)).bool()
        before = torch.cat([torch.zeros_like(ok[:, :1]), ok[:, :-1]], dim=1)
        cut = ok & (cut | ~before)
        real = ok.reshape(n)
    piece = cut.reshape(n).cumsum(0) - 1
    piece = torch.where(real, piece, count)  # padding: a slot past the pieces, dropped
    pos = torch.arange(n, device=dev)
    first = torch.full((count + 1,), n, dtype=torch.int64, device=dev).scatter_reduce_(0, piece, pos, "amin")
    lengths = torch.zeros(count + 1, dtype=torch.int64, device=dev).scatter_add_(0, piece, real.long())
    first, lengths = first[:count], lengths[:count]
    order = torch.sort(lengths, descending=True, stable=True).indices
    first, lengths = first[order], lengths[order]
    t = torch.arange(longest, device=dev)
    at = torch.where(t[None, :] < lengths[:, None], first[:, None] + t[None, :], first[:, None])
    return first, at


def _estimator_locals() -> dict[str, Any] | None:
    """The locals of the innermost value estimator's :data:`GAE_FRAME` on the stack (``data``, ``data_root``,
    ``data_next``), or of its :data:`NEXT_FRAME` as the same names (its batch ``tensordict`` as ``data`` and
    ``data_root``, ``step_td`` as ``data_next``); None outside both."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_name
        if name in (GAE_FRAME, NEXT_FRAME) and frame.f_globals.get("__name__", "").startswith(
            "torchrl.objectives.value"
        ):
            found = dict(frame.f_locals)
            if name == GAE_FRAME:
                return found
            batch = found.get("tensordict")
            return {"data": batch, "data_root": batch, "data_next": found.get("step_td")}
        frame = frame.f_back
    return None


def estimator_batch() -> Any:
    """The batch the innermost value estimator on the stack was given (its ``data``), None outside one."""
    found = _estimator_locals()
    return None if found is None else found.get("data")


def gae_batch(state: torch.Tensor | None, key: Any) -> tuple[Any, torch.Tensor] | None:
    """For a call a value estimator makes (phase "value"): the batch its samples were taken from (the
    estimator's ``data``, with their step counts, trajectory ids and mask) and, on the call's device, two
    flags for :func:`gae_pass`: whether the call's stored states (``state``, the module's ``key``) equal
    the batch's own, and whether they equal its next samples' (``data["next"]``). None outside an
    estimator, or where the call is not one pass over the whole batch (a chunked call).

    ``_call_value_nets`` runs the value network on ``data_root = data.select(*in_keys)`` and on
    ``data_next = data["next"].select(*in_keys)``, in that order (with ``deactivate_vmap=True`` on each
    half of their stack, torchrl/objectives/utils.py ``_pseudo_vmap``). The call's TensorDict holds copies
    by the time the probe sees it (the "pad" backend writes its in_keys back unpadded: rnn.py
    ``LSTMModule.forward``), so which half it is is told by the values of its input states: the state
    stored before each step (the first pass) and after it (the second) differ wherever the module ran."""
    found = _estimator_locals()
    if found is None or state is None:
        return None
    data, root, nxt = found.get("data"), found.get("data_root"), found.get("data_next")
    if data is None or root is None or nxt is None:  # the shifted=True path: one call over both, scattered
        return None
    sides = [td.get(key, None) if hasattr(td, "get") else None for td in (root, nxt)]
    if not all(isinstance(s, torch.Tensor) and s.shape == state.shape for s in sides):
        return None
    same = torch.stack([(state == (s if s.device == state.device else s.to(state.device))).all() for s in sides])  # type: ignore[union-attr]
    return data, same


def gae_pass(same: np.ndarray) -> bool | None:
    """Whether a value estimator's call is its pass over ``data["next"]`` (True) or over ``data`` (False),
    from :func:`gae_batch`'s flags on the host; None where its states equal both or neither."""
    root, nxt = bool(same[0]), bool(same[1])
    return None if root == nxt else nxt


class Counts:
    """Per env column of one kind of sequential call: its step count, episode and episode step. The env step
    is the probe's own count (known at call time, :meth:`advance`); the episode and episode step follow
    from the call's episode starts, read on the host later (:meth:`settle`, in call order)."""

    def __init__(self) -> None:
        self.env_step = np.zeros(0, np.int64)
        self.episode = np.full(0, -1, np.int64)
        self.episode_step = np.zeros(0, np.int64)

    def advance(self, n: int) -> np.ndarray:
        """The env step of each of a call's ``n`` columns, and the count advanced."""
        if n > len(self.env_step):
            self.env_step = np.r_[self.env_step, np.zeros(n - len(self.env_step), np.int64)]
        env_step = self.env_step[:n].copy()
        self.env_step[:n] += 1
        return env_step

    def settle(self, start: np.ndarray, step_count: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(episode, episode step) of each column of one call, and the counts advanced."""
        n = len(start)
        if n > len(self.episode):
            extra = n - len(self.episode)
            self.episode = np.r_[self.episode, np.full(extra, -1, np.int64)]
            self.episode_step = np.r_[self.episode_step, np.zeros(extra, np.int64)]
        first = self.episode[:n] < 0
        new = start | first
        self.episode[:n] += new
        ep_step = step_count if step_count is not None else np.where(new, 0, self.episode_step[:n] + 1)
        self.episode_step[:n] = ep_step
        return self.episode[:n].copy(), ep_step


class StagedCall:
    """A sequential call whose provenance waits for its values on the host: its grid (the env and env step
    set, the episode columns and kept observation to fill, in place) and, on the device, its is_init, step
    counts and trajectory ids (``values``, one int64 tensor, a snapshot) and kept observation (``obs``)."""

    __slots__ = ("cells", "counts", "env_step", "envs", "grid", "has_sc", "has_traj", "n", "obs", "phase", "values")

    def __init__(self, envs: Envs, phase: str, n: int, tensors: list[torch.Tensor | None], obs: Any) -> None:
        counts = envs.counts.get((phase, n))
        if counts is None:
            counts = envs.counts[(phase, n)] = Counts()
        self.envs, self.counts, self.phase, self.n = envs, counts, phase, n
        self.env_step = counts.advance(n)
        self.has_sc, self.has_traj = tensors[1] is not None, tensors[2] is not None
        self.values = torch.cat([t.detach().reshape(-1).long() for t in tensors if t is not None])
        self.obs = obs
        # the columns the values decide: arrays of the grid's dtypes, which it holds views of, filled by settle()
        self.cells = {k: np.zeros(n, COLUMN[k].dtype) for k in ("episode", "episode_step", "episode_start")}
        self.grid = Grid.one_step(np.arange(n), self.env_step, *self.cells.values())
        if obs is not None:  # filled by settle() as well (a grid taken of its kept columns holds a view of it)
            self.grid.obs = np.full((n, 1, int(obs.shape[-1])), np.nan, np.float32)

    @property
    def tensors(self) -> list[torch.Tensor | None]:
        """What crosses to the host for this call (one tensor: ``values``)."""
        return [self.values]

    def settle(self, values: np.ndarray, obs: np.ndarray | None) -> None:
        """Fill the grid from the call's values on the host (``Envs.collect``'s work, in call order)."""
        n = self.n
        init, values = values[:n], values[n:]
        sc = tr = None
        if self.has_sc:
            sc, values = values[:n], values[n:]
        if self.has_traj:
            tr = values[:n]
        start = ((sc == 0) if sc is not None else init.astype(bool)).astype(bool)
        episode, ep_step = self.counts.settle(start, sc)
        for name, v in (("episode", episode), ("episode_step", ep_step), ("episode_start", start)):
            self.cells[name][...] = v
        kept = self.grid.obs
        if obs is not None and kept is not None:
            kept[...] = obs[:, None, :]
        self.envs.collected(self.phase, tr, episode, self.env_step - ep_step)


class Envs:
    """One module's provenance of sequential calls: counts per (phase, batch size), so that only the
    collector's own calls advance the collection's env steps and episodes (an evaluation
    ``env.rollout(policy)``, phase "other", or a batch of another size counts apart), and per collector
    trajectory id the env column, episode and the env step of the episode's step 0 (collection only)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], Counts] = {}
        # traj id -> (env, episode, env step of episode step 0); -1: not collected under the probe
        self.traj = np.full((1, 3), -1, np.int64)
        self.collecting = False
        """Whether a collection call of the module has recorded trajectory ids (a module the collector's policy
        does not run, a critic with an LSTM of its own, records none)."""

    def collected(self, phase: str, traj: np.ndarray | None, episode: np.ndarray, first_step: np.ndarray) -> None:
        """A collection call's trajectory ids: their env columns, episodes and episodes' first env steps."""
        n = len(episode)
        if phase == "rollout" and traj is not None and len(traj) and traj.min() >= 0:
            top = int(traj.max()) + 1
            if top > len(self.traj):
                self.traj = np.r_[self.traj, np.full((max(top, 2 * len(self.traj)) - len(self.traj), 3), -1, np.int64)]
            self.traj[traj, 0] = np.arange(n)
            self.traj[traj, 1] = episode
            self.traj[traj, 2] = first_step
            self.collecting = True

    def lookup(self, traj: np.ndarray | None, step_count: np.ndarray | None) -> tuple[np.ndarray, ...] | None:
        """(env, episode, env step) of loss-time samples, from their trajectory ids and step counts; without step
        counts (no ``StepCounter``) the env and episode all the same (a trajectory id names both), the env step
        unknown (-1). None without trajectory ids."""
        if traj is None:
            return None
        known = (traj >= 0) & (traj < len(self.traj))
        row = self.traj[np.where(known, traj, 0)]
        known &= row[:, 0] >= 0
        env = np.where(known, row[:, 0], -1)
        episode = np.where(known, row[:, 1], -1)
        env_step = np.where(known, row[:, 2] + step_count, -1) if step_count is not None else np.full_like(env, -1)
        return env, episode, env_step
