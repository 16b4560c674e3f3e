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
- ``h and c swapped``: the new h fed back as c and the new c as h (critic's too);
- ``observation normalisation missing``: with ``vecnormalize`` (the model was trained under VecNormalize),
  every other loop normalises the trace's observations as ``VecNormalize.normalize_obs`` does, this one not;
- ``float16``: the policy run as a half-precision runtime runs it: its weights, observations and states
  rounded to float16, the arithmetic in float32 (``runtime.rounded``: the same on every CPU, no
  float16 kernel needed; a runtime doing the arithmetic in float16 too lands within ``HALF`` of it).

The recorded actions are compared with each loop's, step by step, within ``tolerance`` relative to the
largest recorded action (discrete actions exactly). The verdict is the loop that agrees at every step
(``correct`` first when several do: a trace too short to tell them apart); else ``float16`` when the
correct loop agrees to half precision only; else ``not this policy`` when no loop agrees on half the
steps (other weights, another env), or ``unrecognised`` naming the closest.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lstm_probe.deploy.runtime import half_weights, load_file, rounded, torch_step
from lstm_probe.deploy.spec import Spec, State, Step
from lstm_probe.deploy.trace import Trace, read_trace
from lstm_probe.errors import BadInput

TOLERANCE = 1e-4
"""Default: float32 runtimes agree to ~1e-6 of the action scale; a float16 loop parts by ~1e-3."""
HALF = 2e-2
"""The correct loop agreeing within this, but not ``tolerance``: a float16 loop (half precision, ~1e-3)."""
CORRECT = "correct"
NOT_FED, EVERY_STEP = "state not fed back", "reset every step"
NO_RESET, SWAPPED = "not reset at episode starts", "h and c swapped"
NO_NORM, FLOAT16 = "observation normalisation missing", "float16"
OTHER, UNKNOWN = "not this policy", "unrecognised"


@dataclass
class Loop:
    """How one loop's actions compare with the recording."""

    name: str
    agree: int
    steps: int
    first_diff: tuple[int, int] | None
    """(env, step) of the first row where it parts from the recording."""
    max_error: float


@dataclass
class Replay:
    """What :func:`replay` found."""

    verdict: str
    also: list[str]
    """Other loops that agree at every step too (indistinguishable on this recording)."""
    parted: tuple[int, int] | None
    """(env, step) where the correct loop and the recording first part; None: they never do."""
    loops: list[Loop]
    steps: int
    envs: int
    tolerance: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "also": self.also,
            "parted": None if self.parted is None else {"env": self.parted[0], "step": self.parted[1]},
            "loops": [
                {**vars(lp), "first_diff": None if lp.first_diff is None else list(lp.first_diff)} for lp in self.loops
            ],
            "steps": self.steps,
            "envs": self.envs,
            "tolerance": self.tolerance,
            "notes": self.notes,
        }


def replay(
    trace: str | os.PathLike[str],
    policy: Any,
    *,
    vecnormalize: str | os.PathLike[str] | None = None,
    trust_model: bool = False,
    tolerance: float = TOLERANCE,
) -> Replay:
    """Which loop recorded ``trace`` (see the module docstring). ``policy``: an exported ``.onnx`` or ``.pt``
    file (``.pt``, TorchScript, holds code: it needs ``trust_model``), a model.zip (read as ``lstm-probe arch``
    reads it: nothing unpickled unless ``trust_model``) or a RecurrentPPO. ``vecnormalize``: the model's
    VecNormalize statistics (``.npz`` with ``mean``, ``var`` and optionally ``clip_obs``, ``epsilon``; or
    SB3's pickle, ``.pkl``, with ``trust_model``)."""
    if not (isinstance(tolerance, int | float) and 0 < tolerance < HALF):
        raise BadInput(f"--tolerance must be a relative error in (0, {HALF:g}), e.g. 1e-4, got {tolerance!r}")
    spec, step, half = _policy(policy, trust_model)
    rec = read_trace(trace, spec)
    norm = None if vecnormalize is None else _normaliser(Path(vecnormalize), trust_model)
    obs = rec.obs if norm is None else norm(rec.obs)
    zeros = _run(step, spec, rec, obs, "zeros")
    runs: dict[str, np.ndarray] = {
        CORRECT: _run(step, spec, rec, obs, "correct"),
        NOT_FED: zeros,
        EVERY_STEP: zeros,
        NO_RESET: _run(step, spec, rec, obs, "no reset"),
        SWAPPED: _run(step, spec, rec, obs, "swapped"),
    }
    notes = []
    if norm is not None:
        runs[NO_NORM] = _run(step, spec, rec, rec.obs, "correct")
    else:
        notes.append(f"'{NO_NORM}' not checked: pass --vecnormalize STATS if the model was trained under VecNormalize")
    runs[FLOAT16] = _run(half, spec, rec, obs, "correct")
    loops = [_compare(name, actions, rec, spec, tolerance) for name, actions in runs.items()]
    verdict, also = _verdict(loops, tolerance)
    correct = loops[0]
    return Replay(verdict, also, correct.first_diff, loops, len(rec.env), len(np.unique(rec.env)), tolerance, notes)


def _policy(policy: Any, trust_model: bool) -> tuple[Spec, Step, Step]:
    """The spec, the float32 step and the float16 step of a policy file, model.zip or model."""
    if isinstance(policy, str | os.PathLike) and Path(policy).suffix in (".onnx", ".pt"):
        path = Path(policy)
        if path.suffix == ".pt" and not trust_model:
            raise BadInput(
                f"{path} is TorchScript, which holds code that torch.jit.load runs: pass --trust-model if you "
                "exported it (or replay the .onnx file, which is data)"
            )
        import warnings

        with warnings.catch_warnings():  # torch.jit.load's deprecation: the file is what it is
            warnings.simplefilter("ignore", DeprecationWarning)
            spec, step, _ = load_file(path)
            half = rounded(load_file(path, half=True)[1])
        return spec, step, half
    from lstm_probe.integrations import deploy_policy

    found = deploy_policy(policy, trust_model)  # the framework's Policy: its spec and its step as a torch module
    module = found.module
    return found.spec, torch_step(module), rounded(torch_step(half_weights(copy.deepcopy(module))))


def _run(step: Step, spec: Spec, rec: Trace, obs: np.ndarray, how: str) -> np.ndarray:
    """The actions of one loop over the trace, env by env (rows already in (env, step) order)."""
    actions: list[np.ndarray] = []
    for env in np.unique(rec.env):
        state: State = spec.zero_state()
        for i in np.flatnonzero(rec.env == env):
            start = np.array([0.0 if how == "no reset" else float(rec.start[i])], np.float32)
            if how == "zeros":
                state = spec.zero_state()
            action, _, new = step(obs[i : i + 1], start, state)
            actions.append(np.asarray(action, np.float64).ravel())
            state = tuple(new[k ^ 1] for k in range(len(new))) if how == "swapped" else new
    return np.stack(actions)


def _compare(name: str, actions: np.ndarray, rec: Trace, spec: Spec, tolerance: float) -> Loop:
    if spec.action == "discrete":
        err = (actions != rec.action).any(axis=1).astype(np.float64)
    else:
        scale = float(np.abs(rec.action[np.isfinite(rec.action)]).max(initial=0.0)) or 1.0
        err = np.abs(actions - rec.action).max(axis=1) / scale  # NaN where either is NaN
    bad = ~(err <= tolerance)  # a NaN is a divergence (NaN > tolerance is False)
    first = int(np.argmax(bad))
    diff = (int(rec.env[first]), int(rec.step[first])) if bad.any() else None
    return Loop(name, int((~bad).sum()), len(err), diff, float(err.max(initial=0.0)))


def _verdict(loops: list[Loop], tolerance: float) -> tuple[str, list[str]]:
    full = [lp.name for lp in loops if lp.agree == lp.steps]
    if full:
        return full[0], full[1:]
    correct = loops[0]
    if correct.max_error <= HALF:
        return FLOAT16, []
    best = max(loops, key=lambda lp: lp.agree)
    return (OTHER if best.agree < best.steps / 2 else UNKNOWN), []


def _normaliser(path: Path, trust_model: bool) -> Any:
    """``VecNormalize.normalize_obs`` from saved statistics: clip((obs - mean) / sqrt(var + eps), +-clip)."""
    if not path.is_file():
        raise BadInput(f"{path} does not exist; pass the VecNormalize statistics saved with the model")
    if path.suffix == ".pkl":
        if not trust_model:
            raise BadInput(
                f"{path} is a pickle (VecNormalize.save), which can run code when loaded: pass --trust-model if you "
                "trust it, or save its statistics with numpy.savez(mean=..., var=..., clip_obs=..., epsilon=...)"
            )
        import pickle

        with path.open("rb") as f:
            vn = pickle.load(f)  # --trust-model: the user vouches for the file
        mean, var, clip, eps = vn.obs_rms.mean, vn.obs_rms.var, vn.clip_obs, vn.epsilon
    else:
        try:
            with np.load(path, allow_pickle=False) as z:
                mean, var = z["mean"], z["var"]
                clip = float(z["clip_obs"]) if "clip_obs" in z else 10.0
                eps = float(z["epsilon"]) if "epsilon" in z else 1e-8
        except Exception as exc:
            raise BadInput(f"cannot read {path} as .npz statistics with mean and var: {exc}") from None
    mean, std = np.asarray(mean, np.float64), np.sqrt(np.asarray(var, np.float64) + eps)

    def norm(obs: np.ndarray) -> np.ndarray:
        flat = obs.reshape(len(obs), -1)
        if flat.shape[1] != mean.size:
            raise BadInput(f"the VecNormalize statistics hold {mean.size} values, the observations {flat.shape[1]}")
        out = np.clip((flat - mean.ravel()) / std.ravel(), -clip, clip)
        return out.astype(np.float32).reshape(obs.shape)

    return norm
