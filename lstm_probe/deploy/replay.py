"""``lstm-probe replay TRACE --policy OUT.onnx|OUT.pt|MODEL.zip`` (``lstm_probe.replay``): which deployment
loop a recorded run shows.

A trace is what a deployed loop recorded, one row per env step (docs/deploy.md has the schema): ``env``,
``step``, ``obs``, ``action``, ``episode_start``; Parquet or CSV. The policy is re-run over the trace's
observations, env by env in step order, as a correct loop runs it and as each classic deployment bug does:

- ``correct``: the new state fed back, reset (``episode_start`` 1) at each episode's first step;
- ``state not fed back`` and ``reset every step``: the LSTM starts from zeros at every step. For a
  RecurrentPPO policy the two are the same computation (the reset multiplies the state by 0,
  ``_process_sequence``), so a recording matching one matches both, and both are named;
- ``not reset at episode starts``: the state carried across episodes;
- ``h and c swapped``: the new h fed back as c and the new c as h (critic's too; an LSTM's alone);
- ``observation normalisation missing``: with ``vecnormalize`` (the model was trained under VecNormalize),
  every other loop normalises the trace's observations as ``VecNormalize.normalize_obs`` does, this one not;
- ``float16``: the policy run as a half-precision runtime runs it: its weights, observations and states
  rounded to float16, the arithmetic in float32 (``runtime.rounded``: the same on every CPU, no
  float16 kernel needed; a runtime doing the arithmetic in float16 too lands within ``HALF`` of it).

The recorded actions are compared with each loop's, step by step, within ``tolerance`` relative to the
largest action, recorded or the loop's (discrete actions exactly): never an absolute tolerance, even where
every recorded action is 0. The verdict is the loop that agrees at every step; ``cannot tell`` when loops
that handle the state differently all do (a trace too short to tell them apart: :func:`tied`; ``correct``
beside ``float16`` alone stays ``correct``, and both of a pair computed alike are named); else ``float16``
when the correct loop agrees to half precision only; else ``not this policy`` when no loop agrees on half the
steps (other weights, another env), or ``unrecognised`` naming the closest.

The work is bounded before it starts: at most :data:`MAX_ROWS` rows (a Parquet trace's from its footer), the
envs stepped together (up to :data:`BATCH` at once, each env's rows found in one pass), at most
:data:`MAX_STEPS` policy steps over all the loops (the pace :data:`STEPS_PER_SECOND` plans with, for
``runtime.TIME_LIMIT``), and ``runtime.Pace`` refuses as soon as the pace measured says the rest would take
longer.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from lstm_probe.deploy.foreign import FLAG
from lstm_probe.deploy.runtime import TIME_LIMIT, Pace, half_weights, open_file, per_env_bytes, rounded, torch_step
from lstm_probe.deploy.spec import Spec, Step
from lstm_probe.deploy.trace import Trace, read_stats, read_trace
from lstm_probe.errors import BadInput, BadLog
from lstm_probe.log import budget

TOLERANCE = 1e-4
"""Default: float32 runtimes agree to ~1e-6 of the action scale; a float16 loop parts by ~1e-3."""
HALF = 2e-2
"""The correct loop agreeing within this, but not ``tolerance``: a float16 loop (half precision, ~1e-3)."""
CORRECT = "correct"
NOT_FED, EVERY_STEP = "state not fed back", "reset every step"
NO_RESET, SWAPPED = "not reset at episode starts", "h and c swapped"
NO_NORM, FLOAT16 = "observation normalisation missing", "float16"
OTHER, UNKNOWN = "not this policy", "unrecognised"
TIE = "cannot tell"
"""The verdict where loops that handle the state differently all agree at every step (:func:`tied`)."""
MAX_ROWS = 2_000_000
"""Most rows of a trace replay reads (a Parquet trace's counted from its footer, before a row is read)."""
STEPS_PER_SECOND = 2_000
"""The pace replay plans with: a model.zip's PyTorch step on one CPU core (an exported ONNX file's runs ~10
times faster, and a step of many envs at once little slower than one env's)."""
MAX_STEPS = int(TIME_LIMIT * STEPS_PER_SECOND)
"""Most policy steps a replay runs over all its loops (1,200,000: ten minutes at :data:`STEPS_PER_SECOND`);
a step runs up to :data:`BATCH` envs at once."""
BATCH = 1024
"""Most envs one policy step runs at once (fewer where one env's step holds much memory)."""


@dataclass
class _Plan:
    """How the loops step through a trace: each env's first row and row count, longest first, and the
    envs stepped at once."""

    first: np.ndarray
    length: np.ndarray
    batch: int

    @classmethod
    def of(cls, env: np.ndarray, batch: Any) -> _Plan:
        cut = np.flatnonzero(env[1:] != env[:-1]) + 1  # rows in (env, step) order: one pass
        first = np.r_[0, cut]
        length = np.diff(np.r_[first, len(env)])
        order = np.argsort(-length, kind="stable")
        return cls(first[order], length[order], batch(len(first)))

    def active(self) -> np.ndarray:
        """How many envs have a row at each position in their run of steps."""
        return len(self.length) - np.searchsorted(self.length[::-1], np.arange(int(self.length[0])), side="right")

    def steps(self) -> int:
        """Policy steps one loop takes."""
        return int((-(-self.active() // self.batch)).sum())


@dataclass
class Loop:
    """How one loop's actions compare with the recording."""

    name: str
    agree: int
    steps: int
    first_diff: tuple[int, int] | None
    """(env, step) of the first row where it parts from the recording."""
    max_error: float
    """The largest difference from the recorded actions, relative to the action scale (Discrete: 1 where any
    step's action differs, else 0)."""


@dataclass
class Replay:
    """What :func:`replay` found."""

    verdict: str
    also: list[str]
    """Other loops that agree at every step too (indistinguishable on this recording); for the verdict
    :data:`TIE`, every loop that does."""
    parted: tuple[int, int] | None
    """(env, step) where the correct loop and the recording first part; None: they never do."""
    loops: list[Loop]
    steps: int
    envs: int
    tolerance: float
    notes: list[str] = field(default_factory=list)
    action: str = "box"
    """The policy's actions: 'box' (each loop's ``max_error`` relative to the action scale) or 'discrete'
    (``max_error`` 1 where any step's action differs)."""
    unnormalized: bool = False
    """The model was trained on normalized observations and replay had no statistics: its observations went to the
    policy as recorded, so a loop that forgets to normalize agrees as the correct one does."""

    @property
    def headline(self) -> str:
        """The verdict as a sentence: the verdict itself, or for :data:`TIE`, which loops agree and what to
        record instead."""
        if self.verdict == CORRECT and self.unnormalized:
            return (
                f"{CORRECT} if the trace's observations are what the policy took (normalized): without --vecnormalize "
                "replay cannot tell a loop that forgets to normalize them"
            )
        if self.verdict != TIE:
            return self.verdict
        names = tied(self.also)
        both = f"{', '.join(names[:-1])} and {names[-1]}"
        return f"{TIE}: loops {both} agree on this trace; record longer episodes / more steps"

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "headline": self.headline,
            "also": self.also,
            "parted": None if self.parted is None else {"env": self.parted[0], "step": self.parted[1]},
            "loops": [
                {**vars(lp), "first_diff": None if lp.first_diff is None else list(lp.first_diff)} for lp in self.loops
            ],
            "steps": self.steps,
            "envs": self.envs,
            "tolerance": self.tolerance,
            "notes": self.notes,
            "action": self.action,
            "unnormalized": self.unnormalized,
        }


def replay(
    trace: str | os.PathLike[str],
    policy: Any,
    *,
    vecnormalize: str | os.PathLike[str] | None = None,
    trust_model: bool = False,
    tolerance: float = TOLERANCE,
    names: Mapping[str, str] | None = None,
) -> Replay:
    """Which loop recorded ``trace`` (see the module docstring). ``policy``: an exported ``.onnx`` or ``.pt``
    file (``.pt``, TorchScript, holds code: it needs ``trust_model``), a model.zip (read as ``lstm-probe arch``
    reads it: nothing unpickled unless ``trust_model``) or a RecurrentPPO, an rsl_rl checkpoint (a ``.pt`` that is
    not TorchScript, read with ``weights_only``: :func:`_exported`) or runner. ``vecnormalize``: the model's
    VecNormalize statistics (``.npz`` with ``mean``, ``var`` and optionally ``clip_obs``, ``epsilon``; or
    SB3's pickle, ``.pkl``, with ``trust_model``). An ``.onnx`` file lstm-probe did not write (rsl_rl's
    ``export_policy_to_onnx``, Isaac Lab's ``export_policy_as_onnx``: inputs ``obs``, ``h_in``, ``c_in``, outputs
    ``actions``, ``h_out``, ``c_out``) is read by its names, or by ``names`` (role -> the graph's name; roles
    ``obs``, ``h``, ``c``, ``action``, ``h_out``, ``c_out``, ``value``: ``deploy/foreign.py``)."""
    if not (isinstance(tolerance, int | float) and 0 < tolerance < HALF):
        raise BadInput(f"--tolerance must be a relative error in (0, {HALF:g}), e.g. 1e-4, got {tolerance!r}")
    loaded = _policy(policy, trust_model, dict(names or {}))
    spec, step, half, batch = loaded.spec, loaded.step, loaded.half, loaded.batch
    rec = read_trace(trace, spec, MAX_ROWS)
    norm = None if vecnormalize is None else _normaliser(Path(vecnormalize), trust_model, spec)
    obs = rec.obs if norm is None else norm(rec.obs)
    plan = _Plan.of(rec.env, batch)
    loops = 4 + (norm is not None) + (spec.cell == "lstm")
    total = loops * plan.steps()
    if total > MAX_STEPS:
        envs = f"{len(plan.first):,} env{'s' * (len(plan.first) > 1)}"
        raise BadInput(
            f"{trace}: replaying its {len(rec.env):,} rows ({envs}, the longest {plan.length[0]:,} steps) takes "
            f"{total:,} policy steps over {loops} loops, over the {MAX_STEPS:,} replay runs (~10 min at "
            f"{STEPS_PER_SECOND:,} steps a second); replay a part of it: fewer steps per env"
        )
    state = len(plan.first) * spec.layers * spec.hidden * len(spec.state_names) * 4
    budget.refuse(2 * state, f"replaying {trace} (the LSTM states of its {len(plan.first):,} envs)")
    pace = Pace(total, f"replaying {trace}", "replay a part of it: fewer steps per env")
    zeros = _run(step, spec, rec, obs, "zeros", plan, pace)
    runs: dict[str, np.ndarray] = {
        CORRECT: _run(step, spec, rec, obs, "correct", plan, pace),
        NOT_FED: zeros,
        EVERY_STEP: zeros,
        NO_RESET: _run(step, spec, rec, obs, "no reset", plan, pace),
    }
    if spec.cell == "lstm":  # a GRU has no c to swap h with
        runs[SWAPPED] = _run(step, spec, rec, obs, "swapped", plan, pace)
    notes = []
    if norm is not None:
        runs[NO_NORM] = _run(step, spec, rec, rec.obs, "correct", plan, pace)
    elif loaded.normalized:  # the file or model says it was trained under VecNormalize
        notes.append(
            f"the model was trained under VecNormalize and no statistics were given: the trace's observations went "
            f"to the policy as recorded, which is right only where they were recorded normalized; pass "
            f"--vecnormalize STATS (what VecNormalize.save wrote) to replay a loop that normalises them and check "
            f"that it does ('{NO_NORM}'): without them such a loop reads as '{OTHER}'"
        )
    elif loaded.framework == "sb3":  # VecNormalize is sb3's: other frameworks normalise inside the policy
        notes.append(f"'{NO_NORM}' not checked: pass --vecnormalize STATS if the model was trained under VecNormalize")
    if not rec.start.any():
        notes.append(
            "the trace marks no episode start (episode_start is 0 at every step, even each env's first): replay "
            "starts each env from a zero state, so a recording begun mid-episode parts at once; record episode_start "
            "1 at each episode's first step"
        )
    runs[FLOAT16] = _run(half, spec, rec, obs, "correct", plan, pace)
    loops_found = [_compare(name, actions, rec, spec, tolerance) for name, actions in runs.items()]
    verdict, also = _verdict(loops_found, tolerance)
    later = rec.start.copy()
    later[plan.first] = False  # each env's first row starts an episode whatever the loop
    if verdict == TIE and NO_RESET in also and not later.any():
        notes.append(
            f"no env's trace goes past an episode's end (no episode start after an env's first step), so "
            f"'{NO_RESET}' runs as the correct loop does: record until an episode ends and the next begins"
        )
    correct = loops_found[0]
    return Replay(
        verdict,
        also,
        correct.first_diff,
        loops_found,
        len(rec.env),
        len(plan.first),
        tolerance,
        notes,
        spec.action,
        unnormalized=norm is None and loaded.normalized,
    )


class Loaded(NamedTuple):
    """A policy as replay runs it (:func:`_policy`)."""

    spec: Spec
    step: Step
    """The float32 step."""
    half: Step
    """The float16 step (``runtime.rounded`` over float16-rounded weights)."""
    batch: Callable[[int], int]
    """How many envs one step may run at once, of a trace's ``envs``."""
    framework: str
    """The framework's name ('' for a file from elsewhere)."""
    normalized: bool
    """The model was trained on observations normalised outside the policy (``Policy.normalized``)."""


def _policy(policy: Any, trust_model: bool, names: dict[str, str]) -> Loaded:
    """A policy file, model.zip or model as replay runs it; ``names``: a foreign ONNX file's (``open_file``)."""
    if isinstance(policy, str | os.PathLike) and Path(policy).suffix in (".onnx", ".pt") and _exported(Path(policy)):
        path = Path(policy)
        if path.suffix == ".pt" and not trust_model:
            raise BadInput(
                f"{path} is TorchScript, which holds code that torch.jit.load runs: pass --trust-model if you "
                "exported it (or replay the .onnx file, which is data)"
            )
        import warnings

        with warnings.catch_warnings():  # torch.jit.load's deprecation: the file is what it is
            warnings.simplefilter("ignore", DeprecationWarning)
            opened = open_file(path, names)
            step, half = opened.step(), rounded(opened.step(half=True))
        return Loaded(
            opened.spec, step, half, lambda envs: opened.batch(envs, BATCH), opened.framework, opened.normalized
        )
    if names:
        raise BadInput(
            f"{FLAG} names the inputs and outputs of an ONNX file lstm-probe did not write; {policy} is not one"
        )
    from lstm_probe.integrations import deploy_policy

    found = deploy_policy(policy, trust_model)  # the framework's Policy: its spec and its step as a torch module
    module, spec = found.module, found.spec
    per_env = per_env_bytes(spec) + 4 * sum(p.numel() for p in module.parameters())  # activations, at most

    def batch(envs: int) -> int:
        return max(1, min(envs, BATCH, budget.limit() // (4 * per_env)))

    half = rounded(torch_step(half_weights(copy.deepcopy(module))))
    return Loaded(spec, torch_step(module), half, batch, found.framework, found.normalized)


def _exported(path: Path) -> bool:
    """Whether ``path`` is a file an export wrote (ONNX, or TorchScript: its zip holds ``code/`` or
    ``constants.pkl``), not a framework's saved model (a ``.pt`` checkpoint of ``torch.save``, which its
    framework's loader reads with ``weights_only``). A ``.pt`` that is no zip is a checkpoint (the loader refuses
    one cut short as such, not as TorchScript); one that cannot be read (or whose directory would hold more than
    the memory budget) is taken as exported, and read (or refused) as such."""
    import zipfile

    if path.suffix == ".onnx":
        return True
    try:
        with budget.open_regular(path, "pass an exported .onnx or .pt file, or a saved model") as f:
            # the zip's directory is read into memory: a few hundred bytes an entry, entries of 30 bytes or more
            budget.refuse(16 * os.fstat(f.fileno()).st_size, f"reading the directory of {path}")
            with zipfile.ZipFile(f) as z:
                names = z.namelist()
    except zipfile.BadZipFile:  # TorchScript is a zip: this is a checkpoint (torch's legacy format, or cut short)
        return False
    except (OSError, BadInput, BadLog):  # read (and refused) as an exported file
        return True
    return any(n.endswith("/constants.pkl") or "/code/" in n for n in names)


def _run(step: Step, spec: Spec, rec: Trace, obs: np.ndarray, how: str, plan: _Plan, pace: Pace) -> np.ndarray:
    """The actions of one loop over the trace: each env's rows in step order, the envs at the same position in
    their runs stepped together (``plan.batch`` at a time), each with its own state."""
    out = np.empty(rec.action.shape, np.float64)
    envs = len(plan.first)
    state = [np.zeros((spec.layers, envs, spec.hidden), np.float32) for _ in spec.state_names]
    for k, active in enumerate(plan.active()):
        for lo in range(0, int(active), plan.batch):
            hi = min(int(active), lo + plan.batch)
            rows = plan.first[lo:hi] + k
            start = np.zeros(hi - lo, np.float32) if how == "no reset" else rec.start[rows].astype(np.float32)
            if how == "zeros":
                given = spec.zero_state(hi - lo)
            else:
                given = tuple(np.ascontiguousarray(s[:, lo:hi]) for s in state)
            action, _, new = step(obs[rows], start, given)
            out[rows] = np.asarray(action, np.float64).reshape(hi - lo, -1)
            if how != "zeros":
                for i, s in enumerate(state):
                    s[:, lo:hi] = new[i ^ 1] if how == "swapped" else new[i]
            pace.tick(1)
    return out


def _compare(name: str, actions: np.ndarray, rec: Trace, spec: Spec, tolerance: float) -> Loop:
    if spec.action == "discrete":
        err = (actions != rec.action).any(axis=1).astype(np.float64)
    else:
        # relative to the largest action, recorded or this loop's: all-zero recorded actions do not make the
        # tolerance absolute (a scale of 0 means both are all 0, and equal)
        scale = max(_largest(rec.action), _largest(actions))
        err = np.abs(actions - rec.action).max(axis=1)  # NaN where either is NaN
        err = err / scale if scale > 0 else err
    bad = ~(err <= tolerance)  # a NaN is a divergence (NaN > tolerance is False)
    first = int(np.argmax(bad))
    diff = (int(rec.env[first]), int(rec.step[first])) if bad.any() else None
    return Loop(name, int((~bad).sum()), len(err), diff, float(err.max(initial=0.0)))


def _largest(a: np.ndarray) -> float:
    return float(np.abs(a[np.isfinite(a)]).max(initial=0.0))


def _verdict(loops: list[Loop], tolerance: float) -> tuple[str, list[str]]:
    full = [lp.name for lp in loops if lp.agree == lp.steps]
    if len(tied(full)) > 1:  # the trace cannot tell these loops' state handling apart
        return TIE, full
    if full:
        return full[0], full[1:]
    correct = loops[0]
    if correct.max_error <= HALF:
        return FLOAT16, []
    best = max(loops, key=lambda lp: lp.agree)
    return (OTHER if best.agree < best.steps / 2 else UNKNOWN), []


def tied(agreeing: list[str]) -> list[str]:
    """The loops among ``agreeing`` (those agreeing at every step) that handle the state differently: 'reset
    every step' is 'state not fed back' (the same computation), and 'float16' the correct loop's state handling
    at half precision (a Discrete policy's float16 loop agrees with the correct one on most traces, however
    long), so neither counts beside its twin."""
    twins = {EVERY_STEP: NOT_FED, FLOAT16: CORRECT}
    return [name for name in agreeing if twins.get(name) not in agreeing]


def _normaliser(path: Path, trust_model: bool, spec: Spec) -> Any:
    """``VecNormalize.normalize_obs`` from saved statistics: clip((obs - mean) / sqrt(var + eps), +-clip)."""
    size = int(np.prod(spec.obs_shape))
    if not path.exists():
        raise BadInput(f"{path} does not exist; pass the VecNormalize statistics saved with the model")
    if path.suffix == ".pkl":
        if not trust_model:
            raise BadInput(
                f"{path} is a pickle (VecNormalize.save), which can run code when loaded: pass --trust-model if you "
                "trust it, or save its statistics with numpy.savez(mean=..., var=..., clip_obs=..., epsilon=...)"
            )
        import pickle

        with budget.open_regular(path, "pass the VecNormalize statistics saved with the model") as f:
            vn = pickle.load(f)  # --trust-model: the user vouches for the file
        if isinstance(getattr(vn, "obs_rms", None), dict):  # a Dict env's: statistics per key
            raise BadInput(
                f"{path} holds VecNormalize statistics per key of a Dict observation; save the flat input's as "
                "numpy.savez(mean=..., var=...) in the policy's obs layout (its metadata's obs_keys)"
            )
        mean, var, clip, eps = vn.obs_rms.mean, vn.obs_rms.var, vn.clip_obs, vn.epsilon
    else:
        mean, var, clip, eps = read_stats(path, size)
    mean, std = np.asarray(mean, np.float64).ravel(), np.sqrt(np.asarray(var, np.float64).ravel() + eps)
    if mean.size != size or std.size != size:
        raise BadInput(f"the VecNormalize statistics hold {mean.size} values, the observations {size}")

    def norm(obs: np.ndarray) -> np.ndarray:
        flat = obs.reshape(len(obs), -1)
        out = np.clip((flat - mean) / std, -clip, clip)
        return out.astype(np.float32).reshape(obs.shape)

    return norm
