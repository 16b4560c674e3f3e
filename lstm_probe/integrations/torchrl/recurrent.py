"""A TorchRL recurrent-mode call (the loss's, a value estimator's), staged on its device and replayed later.

A recurrent-mode call's pieces (its (B, T) rows split where ``is_init`` is set after their first step,
samples.pieces) shape the packed call the shadow re-runs: their number and lengths must be on the host. So
that no call waits for the device, the hook only stages what the call was given, on its device
(:class:`StagedRecurrent`: copies of its input, stored states and the weights it ran with, and its is_init,
step counts, trajectory ids, mask and a value estimator's pass flags as int64); the hooks replay the staged
calls in call order at the next settlement (hooks.py ``TorchRLProbe._settle``: the next sequential call,
before any later call reaches the core, or the probe's close), all of them and the staged collection calls
with one host copy per device (samples.host). The replay is the call as the hook saw it: the same pieces,
provenance and packed call on the shadow, the shadow holding the staged weights while it runs (an optimizer
step since has changed the module's own in place), so the core gets the same calls, ids and rows in the
same order as when each call was replayed at once.

TorchRL writes a recurrent-mode call's TensorDict anew per call (torchrl/modules/tensordict_module/rnn.py
``LSTMModule.forward``: ``tensordict.update`` of the outputs and, under the "pad" backend, the in_keys written
back from ``_inv_pad_for_reset``) and computes is_init afresh for each (an identity match across calls
fails), and a collector made with ``return_same_td=True`` writes its next batch into the TensorDict it yielded
last (torchrl/collectors/_single.py ``Collector.iterator``): what is staged is copied, never referenced.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from lstm_probe.contract import SEQ_REASON, Grid, Tags
from lstm_probe.integrations.torchrl.samples import Envs, gae_pass, not_repeated, pieces, pieces_on_device
from lstm_probe.log.schema import COLUMN

STAGED_BYTES = {"cpu": 32 << 20}
"""The most a probe's staged recurrent-mode calls hold (copies of their inputs, states and weights) before the
next is replayed at once, per device type: on the CPU the writer's backlog bound (a host copy costs nothing
there but the count). On an accelerator (not listed): :data:`ACCELERATOR_SHARE` of its memory, at most
:data:`ACCELERATOR_BYTES`; 2 GiB hold a batch's calls (a value estimator's two passes and the loss's, every
epoch) up to about 7 full passes over a 1,024-env x 24-step batch at hidden 256."""
ACCELERATOR_BYTES = 2 << 30
ACCELERATOR_SHARE = 0.05
"""The share of an accelerator's memory the staged calls may hold: what training has is the user's, and a run
that fits a GPU without the probe fits it with the probe (past the budget each call replays at once: one copy
each, no memory held)."""


def staged_budget(device: torch.device) -> int:
    """The budget of staged copies on ``device``: :data:`STAGED_BYTES`, or an accelerator's (its total memory
    read from its properties, no wait for the device)."""
    if device.type in STAGED_BYTES:
        return STAGED_BYTES[device.type]
    total = ACCELERATOR_BYTES / ACCELERATOR_SHARE
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    return int(min(ACCELERATOR_BYTES, ACCELERATOR_SHARE * total))


def _ints(t: torch.Tensor | None, copy: bool) -> torch.Tensor | None:
    """``t`` flat as int64, a copy where it is (no wait for the device) unless not ``copy``."""
    if t is None:
        return None
    flat = t.detach().reshape(-1)
    return flat.clone() if flat.dtype == torch.int64 and copy else flat.long()


def _copy(t: torch.Tensor | None, shape: tuple[int, ...], copy: bool) -> torch.Tensor | None:
    if t is None:
        return None
    return t.detach().reshape(shape).clone() if copy else t.detach().reshape(shape)


def staged_bytes(rnn: nn.LSTM | nn.GRU, td: Any, keys: list[Any]) -> int:
    """What staging a call copies (its input, stored states and the shadow's weights), in bytes."""
    given = [td.get(k, None) for k in keys[: 3 if isinstance(rnn, nn.LSTM) else 2]]
    return sum(t.numel() * t.element_size() for t in [*given, *rnn._flat_weights] if t is not None)


class StagedRecurrent:
    """A recurrent-mode call as its hook saw it, copied on its device: ``tensors`` (is_init, step counts,
    trajectory ids, mask, a value estimator's pass flags: int64, None where absent) for the host copy, the
    input ``x`` (N, F), the stored states (N, layers, hidden), the shadow's weights, and the call's tags,
    phase and TensorDict shape (``n`` samples, ``steps`` per row). ``copy=False``: references, for a call
    replayed at once (nothing can change them first)."""

    __slots__ = (
        "gae",
        "hidden",
        "layers",
        "lstm",
        "n",
        "name",
        "phase",
        "states",
        "steps",
        "tags",
        "tensors",
        "weights",
        "x",
    )

    def __init__(
        self,
        name: str,
        rnn: nn.LSTM | nn.GRU,
        td: Any,
        keys: list[Any],
        tags: Tags,
        gae: Any,
        copy: bool = True,
        weights_of: nn.Module | None = None,
    ) -> None:
        self.name, self.tags, self.phase = name, tags, tags.phase
        self.lstm = isinstance(rnn, nn.LSTM)
        self.layers, self.hidden = layers, hidden = int(rnn.num_layers), int(rnn.hidden_size)
        x = td.get(keys[0])
        self.steps = int(td.shape[-1]) if td.ndim else 1
        self.n = n = td.numel()
        self.x = _copy(x, (n, int(x.shape[-1])), copy)
        given = (td.get(keys[1], None), td.get(keys[2], None)) if self.lstm else (td.get(keys[1], None),)
        self.states = [_copy(s, (n, layers, hidden), copy) for s in given]
        # a value estimator's call: its samples' step counts, trajectory ids and mask are its batch's (samples.py)
        self.gae = gae is not None
        source = gae[0] if gae is not None else td
        ints = [td.get(keys[-1]), source.get("step_count", None), source.get(("collector", "traj_ids"), None)]
        ints += [source.get(("collector", "mask"), None), gae[1] if gae is not None else None]
        self.tensors = [_ints(t, copy) for t in ints]
        # the weights the call ran with (``weights_of``'s, the user's module, where given: a functional call
        # such as a target network's swaps others in): an optimizer step changes them in place before the replay
        source = rnn if weights_of is None else weights_of
        own = [getattr(source, w).detach() for w in rnn._flat_weights_names]
        self.weights = [w.clone() for w in own] if copy else own

    @property
    def device(self) -> torch.device:
        assert self.x is not None
        return self.x.device

    def replay(self, arrays: list[np.ndarray | None], envs: Envs) -> tuple[Any, Any] | None:
        """The call's pieces from its values on the host (``arrays``, as :attr:`tensors`): its grid set on its
        tags, and the shadow's arguments (a PackedSequence of the pieces longest first, their start states).
        None where every sample is padding (nothing TorchRL computed is a state)."""
        init, sc, tr, mask, same = arrays
        assert init is not None and self.x is not None
        rows, steps = self.n // self.steps, self.steps
        is_init, sc_t, traj_t, mask_t, _ = self.tensors
        nxt = gae_pass(same) if same is not None else None
        if self.gae and nxt is None:  # neither pass over the batch (its mask holds for both)
            sc = tr = None
        valid = mask.astype(bool) if mask is not None else None
        if valid is None and tr is not None and sc is not None and steps > 1:
            valid = not_repeated(tr, sc, rows, steps)
            if valid is not None:  # the same mask where the pieces' indices are built (no host copy)
                assert traj_t is not None and sc_t is not None
                t_d, s_d = (v.reshape(rows, steps) for v in (traj_t, sc_t))
                again = (t_d[:, 1:] == t_d[:, :-1]) & (s_d[:, 1:] == s_d[:, :-1])
                mask_t = torch.cat([torch.ones_like(again[:, :1]), ~again], dim=1)
        first, lengths = pieces(init, rows, steps, valid)
        if not len(first):
            return None
        longest = int(lengths[0])
        at = np.where(
            np.arange(longest)[None, :] < lengths[:, None], first[:, None] + np.arange(longest), first[:, None]
        )
        x = self.x
        assert is_init is not None
        first_d, at_d = pieces_on_device(
            is_init if is_init.device == x.device else is_init.to(x.device),
            rows,
            steps,
            len(first),
            longest,
            mask_t if valid is not None else None,
        )
        xs = x[at_d]  # (S, T', F): pack_padded_sequence skips the padding
        states = [
            torch.zeros(self.layers, len(first), self.hidden, dtype=x.dtype, device=x.device)
            if s is None
            else s[first_d].transpose(0, 1).contiguous()
            for s in self.states
        ]
        # known: a loss call's own samples, either pass of an estimator over its batch, or a value call
        # outside one on samples that carry their trajectory ids
        value = self.phase == "value"
        known = not value or nxt is not None or (not self.gae and tr is not None)
        self.tags.grid = provenance(envs, init, sc, tr, valid, known, bool(nxt), first, at, steps)
        # sorted already, lengths on the host: packing makes no device-to-host or host-to-device copy
        packed = nn.utils.rnn.pack_padded_sequence(xs, lengths, batch_first=True)  # type: ignore[arg-type]
        return packed, tuple(states) if self.lstm else states[0]


def cudnn_quiet(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """cuDNN's warning that a shadow's weights are not one contiguous chunk silenced, on a CUDA device only:
    ``warnings.catch_warnings`` resets every module's record of the warnings it has shown (its filters
    change on entry and exit), so a user's once-shown warning (gymnasium's, say) would be shown again after
    every traced call; the CPU never emits this one."""
    return _quiet_block() if device.type == "cuda" else contextlib.nullcontext()


@contextlib.contextmanager
def _quiet_block() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@contextlib.contextmanager
def holding(rnn: nn.LSTM | nn.GRU, weights: list[torch.Tensor]) -> Iterator[None]:
    """The shadow ``rnn`` computing with ``weights`` (a staged call's) while the block runs, its own (the
    user's parameter tensors) put back after. Only the shadow's attributes change: the user's module and
    its parameters are never touched (``RNNBase.__setattr__`` refreshes the shadow's ``_flat_weights``)."""
    names = list(rnn._flat_weights_names)
    own = [getattr(rnn, w) for w in names]
    try:
        for w, t in zip(names, weights, strict=True):
            setattr(rnn, w, nn.Parameter(t, requires_grad=False))
        with cudnn_quiet(weights[0].device if weights else torch.device("cpu")):
            yield
    finally:
        for w, p in zip(names, own, strict=True):
            setattr(rnn, w, p)


def provenance(
    envs: Envs,
    init: np.ndarray,
    sc: np.ndarray | None,
    tr: np.ndarray | None,
    valid: np.ndarray | None,
    known: bool,
    nxt: bool,
    first: np.ndarray,
    at: np.ndarray,
    steps: int,
) -> Grid:
    """The provenance of a recurrent-mode call's pieces (``at``: each piece's samples, flat indices).

    A sample's env, episode and env step: from its trajectory id and step count (``Envs.lookup``).
    The samples of a value estimator's pass over ``data["next"]`` (``nxt``) are next observations: the
    same env and episode, the next env step and episode step. A next observation is never an episode's
    first (after a done the reset observation is the next sample's own, torchrl/collectors/_single.py
    ``Collector.rollout``), so such a pass holds no episode's first step: its episode starts are where a
    piece enters an episode after its first step, the sample's episode (trajectory id; without ids, a step
    count of 0) not the previous sample's (:func:`entered`). Where the samples' batch is not
    ``known`` (a value estimator's call that is neither of its passes over the whole batch) every
    provenance column is null. Without trajectory ids a sample's env is null: a batch row is not an env
    (a minibatch of some of the collector's rows, or of its rows shuffled, holds other envs' rows there)."""
    found = envs.lookup(tr, sc)
    start = np.full(len(init), -1, np.int8)
    if known:
        start = np.zeros(len(init), np.int8) if nxt else ((sc == 0) if sc is not None else init).astype(np.int8)
    # next observations: where a piece enters another episode (no piece starts one: start is 0 there)
    starts = entered(tr, sc, len(init), first, at, steps).astype(np.int8) if known and nxt else start[at]
    columns: dict[str, np.ndarray | None] = {"episode_start": starts}
    if sc is not None and known:
        columns["episode_step"] = (sc + nxt)[at]
    if found is not None and known:
        env, episode, env_step = found
        columns.update(env=env[at], episode=episode[at], env_step=np.where(env_step >= 0, env_step + nxt, -1)[at])
    # why each piece starts where it does: an episode start, the row's (or real samples') first step,
    # else TorchRL's split at is_init (a slice's start, or the step after an episode start in
    # GAE's pass over next observations); null where the samples' batch is not known
    after_padding = np.zeros(len(first), bool)
    if valid is not None:
        after_padding = (first % steps > 0) & ~valid[np.maximum(first - 1, 0)]
    boundary = (first % steps == 0) | after_padding
    code = np.where(start[first] == 1, "episode_start", np.where(boundary, "env_boundary", "split"))
    grid = Grid.of({k: v.astype(COLUMN[k].dtype) for k, v in columns.items() if v is not None}, train=True)
    reasons = np.array([SEQ_REASON[r] for r in code.tolist()], COLUMN["seq_reason"].dtype)
    grid.seq_reason = reasons if known else np.full(len(first), -1, COLUMN["seq_reason"].dtype)
    return grid


def entered(
    tr: np.ndarray | None, sc: np.ndarray | None, n: int, first: np.ndarray, at: np.ndarray, steps: int
) -> np.ndarray:
    """(pieces, longest) bool: where a piece of next observations enters another episode after its first step
    (a value estimator's pass over ``data["next"]`` run as one sequence across an episode's end: all-false
    ``is_init`` there, as DQNLoss's target pass, ``step_mdp``, leaves it). The sample at a piece's step t > 0 is
    the one after its step t - 1 in the batch row; it is of another episode where its trajectory id differs
    (a collector gives each episode its own), or, without ids, where its step count is 0 (its own observation
    an episode's first, so its next one that episode's second). Never at a piece's first step, nor on its padding
    (``at`` repeats the piece's first sample there). ``n``: the batch's samples, ``steps`` a row's."""
    new = np.zeros(n, bool)
    if tr is not None:
        new[1:] = tr[1:] != tr[:-1]
    elif sc is not None:
        new = sc == 0
    new &= np.arange(n) % steps > 0
    return new[at] & (at != first[:, None])
