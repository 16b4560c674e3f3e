"""``lstm-probe export MODEL.zip OUT.onnx|OUT.pt`` (``lstm_probe.export``): a RecurrentPPO policy as one
ONNX or TorchScript file with its LSTM state as explicit inputs and outputs (the framework's
``Policy.module``: sb3's is ``integrations/sb3/deployed.py``'s ``Deployed``), verified before it is written.

Verification: the file, as written to a temporary name beside ``out`` and read back (onnxruntime, or
``torch.jit.load``), and the PyTorch policy (the framework's own step, ``Policy.reference``: sb3-contrib's
``RecurrentActorCriticPolicy.forward`` with ``deterministic=True`` and ``predict``'s clipping, on a private
copy) each run its own loop, state fed back,
over recorded episodes back to back (episode_start 1 at each first step): the observations of a
``--capture-obs`` log, or fresh episodes of an env driven by the PyTorch policy's actions. At every step the
action, the value and each state must agree within ``tolerance``, relative to the PyTorch output's scale
(:func:`compare`; discrete actions exactly). The first step that does not (a NaN
included) is refused in one line, and nothing is written; a verified file is renamed to ``out`` (an existing
``out`` only with ``force``).

ONNX: ``torch.onnx.export``'s default exporter (``dynamo=True``, opset 18) with a dynamic batch axis and
the weights inside the file. TorchScript: ``torch.jit.trace`` of the same module.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from lstm_probe.deploy.runtime import Pace, interrupt_behind, load_file
from lstm_probe.deploy.spec import META_KEY, Policy, Spec, Step
from lstm_probe.errors import BadInput, one_line
from lstm_probe.extras import require
from lstm_probe.log import budget
from lstm_probe.log.layout import check_writable
from lstm_probe.options import CaptureOptions, check_env_id, default

TOLERANCE = 1e-5
"""Default relative tolerance (float32 runtimes agree to ~1e-7 on these networks)."""
MAX_EPISODE_STEPS = 1000
"""An episode of ``--env`` or of ``--log`` is cut here (its time limit usually ends it first)."""
SYNTHETIC_STEPS = 200
"""The length of each ``--synthetic`` episode."""
MAX_EPISODES = 1000
"""The most ``--episodes`` export verifies on: a few tell a faulty export (the default is 5); 1,000 episodes of
1,000 steps already take the 10 minutes verification may."""
MAX_TRACE_ROWS = 1_000_000
"""The most rows a ``--trace`` may hold (its first episodes are kept: verification takes a few thousand steps)."""

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: what export is doing, called as each stage starts (``done`` 0) and as it
goes. The stages, in order (each a fixed phrase, no string from a file): ``reading the policy``, ``recording
episodes`` (``--env``: done and total in episodes) or ``reading the log's episodes`` (``--log``), ``writing
the file``, ``verifying`` (done and total in the episodes' steps, each step one of the file's and one of the
PyTorch policy's, so ``total`` is the ``steps`` export reports: called every step, so keep it cheap)."""


def _quiet_progress(stage: str, done: int, total: int) -> None:
    """No progress shown."""


@dataclass
class Exported:
    """What :func:`export` wrote and how it verified it."""

    path: Path
    format: str
    """'onnx' or 'torchscript'."""
    spec: Spec
    episodes: int
    steps: int
    tolerance: float
    errors: dict[str, float] = field(default_factory=dict)
    """The largest relative error seen per output (action, value, h_out, ...)."""
    source: str = ""
    """Where the episodes came from."""
    exporter: str = ""
    notes: tuple[str, ...] = ()
    """What the framework's loader says a user of the file must know (``Policy.notes``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "format": self.format,
            "variant": self.spec.variant,
            "inputs": [{"name": n, "shape": s, "dtype": d} for n, s, d in self.spec.inputs()],
            "outputs": [{"name": n, "shape": s, "dtype": d} for n, s, d in self.spec.outputs()],
            "episodes": self.episodes,
            "steps": self.steps,
            "tolerance": self.tolerance,
            "max_relative_error": self.errors,
            "source": self.source,
            "exporter": self.exporter,
            "notes": list(self.notes),
        }


def export(
    model: Any,
    out: str | os.PathLike[str],
    *,
    log: str | os.PathLike[str] | None = None,
    env_id: str | None = None,
    trace: str | os.PathLike[str] | None = None,
    synthetic: bool = False,
    episodes: int = 5,
    tolerance: float = TOLERANCE,
    trust_model: bool = False,
    env_seed: int = 0,
    force: bool = default(CaptureOptions, "force"),
    progress: Progress | None = None,
) -> Exported:
    """Export ``model`` (a RecurrentPPO, or the path of its model.zip, read as ``lstm-probe arch`` reads it:
    nothing unpickled unless ``trust_model``; an rsl_rl checkpoint ``.pt`` or ``OnPolicyRunner``: its loader,
    ``integrations/rsl_rl/deployed.py``; a TorchRL run's ``.pt`` or ``(actor, critic)``:
    ``integrations/torchrl/deployed.py``) to ``out`` (``.onnx`` or ``.pt``), verified over ``episodes``
    episodes of ``log`` (a ``--capture-obs`` log), of ``env_id`` (seeded ``env_seed``, ``env_seed + 1``, ...), of
    ``trace`` (a recorded run, as replay reads it) or, with ``synthetic``, of standard normal observations (for a
    policy whose env is elsewhere, e.g. an Isaac Lab checkpoint; seeded ``env_seed``). An
    existing ``out`` is refused unless ``force``; ``progress`` (:data:`Progress`) hears what it is doing. See
    the module docstring."""
    out = Path(out)
    fmt = {".onnx": "onnx", ".pt": "torchscript"}.get(out.suffix)
    if fmt is None:
        raise BadInput(f"{out}: name the output OUT.onnx (ONNX) or OUT.pt (TorchScript)")
    if not out.parent.exists():
        raise BadInput(f"{out}: its directory {out.parent} does not exist; create it first")
    if out.is_dir():
        raise BadInput(f"{out} is a directory; name the file to write, e.g. {out / ('policy' + out.suffix)}")
    for given, what in ((model, "the model to export"), (log, "the --log"), (trace, "the --trace")):
        if isinstance(given, str | os.PathLike) and _same_file(Path(given), out):  # --force would destroy it
            raise BadInput(f"{out} is {what}: writing it would destroy it; choose another OUT, e.g. policy{out.suffix}")
    if out.exists() and not force:
        raise BadInput(f"{out} already exists; pass --force (force=True) to overwrite it, or choose another OUT")
    check_writable(out.parent, "choose another OUT")  # before minutes of verification, not after
    if fmt == "onnx":
        require("export", "lstm-probe export")  # the exporter and the runtime that verifies the file
    if sum(x is not None for x in (log, env_id, trace)) + bool(synthetic) != 1:
        raise BadInput(
            "export verifies on episodes: pass one of --env ENV_ID, --log LOG (a run with --capture-obs), "
            "--trace TRACE (a recorded run) or --synthetic (normal draws, when the policy's env is elsewhere)"
        )
    if isinstance(episodes, bool) or not isinstance(episodes, int) or not 1 <= episodes <= MAX_EPISODES:
        got = "a number beyond int64" if isinstance(episodes, int) and episodes.bit_length() > 63 else repr(episodes)
        raise BadInput(
            f"--episodes must be an integer from 1 to {MAX_EPISODES:,} (a few episodes tell a faulty export; the "
            f"default is 5), got {got[:40]}; pass --episodes {MAX_EPISODES} or fewer"
        )
    if not (isinstance(tolerance, int | float) and 0 < tolerance < 1):
        raise BadInput(f"--tolerance must be a relative error in (0, 1), e.g. 1e-5, got {tolerance!r}")
    source = str(model) if isinstance(model, str | os.PathLike) else type(model).__name__
    from lstm_probe.integrations import deploy_policy

    tell = progress or _quiet_progress
    tell("reading the policy", 0, 1)
    policy = deploy_policy(model, trust_model, env_id)
    spec, reference = policy.spec, policy.reference
    if log is not None:
        tell("reading the log's episodes", 0, 1)
        obs, starts = episodes_from_log(log, spec, episodes)
        where = f"{_count(episodes, 'episode')} of {log}"
    elif trace is not None:
        tell("reading the trace's episodes", 0, 1)
        obs, starts = episodes_from_trace(trace, spec, episodes)
        where = f"{_count(int(starts.sum()), 'episode')} of {trace}"
    elif synthetic and any(k.space != "box" for k in spec.obs_keys):  # normal draws are no one-hot
        raise BadInput(
            "--synthetic draws normal values, which a Dict observation's Discrete, MultiDiscrete or MultiBinary keys "
            "never hold; verify on --env ENV_ID or --trace TRACE"
        )
    elif synthetic:
        budget.refuse(episodes * SYNTHETIC_STEPS * _step_bytes(spec), "verifying on the synthetic episodes", _FEWER)
        rng = np.random.default_rng(env_seed)
        obs = rng.standard_normal((episodes * SYNTHETIC_STEPS, *spec.obs_shape)).astype(np.float32)
        starts = np.arange(len(obs)) % SYNTHETIC_STEPS == 0
        where = f"{_count(episodes, 'episode')} of {SYNTHETIC_STEPS} synthetic observations"
        where += f" (standard normal, seed {env_seed})"
    else:
        tell("recording episodes", 0, episodes)
        obs, starts = episodes_from_env(str(env_id), spec, reference, episodes, env_seed, tell)
        where = f"{_count(episodes, 'fresh episode')} of {env_id} (seeds {env_seed}..{env_seed + episodes - 1})"
    # a new file of a name no one can guess, made by this call alone (O_EXCL: never through a link planted
    # there), written through its descriptor, renamed over OUT once verified (a link at OUT is replaced,
    # never followed); read back by its suffix
    fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem}.", suffix=f".tmp{out.suffix}")
    tmp = Path(name)
    try:
        tell("writing the file", 0, 1)
        with os.fdopen(fd, "wb") as f:
            _readable(f)
            with _quiet():
                exporter = _write_onnx(policy, f, source) if fmt == "onnx" else _write_torchscript(policy, f, source)
        with _quiet():
            _, step, _ = load_file(tmp)
        errors = compare(step, reference, spec, obs, starts, tolerance, fmt, tell)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    steps = int(starts.sum()), len(obs)
    return Exported(out, fmt, spec, *steps, float(tolerance), errors, where, exporter, policy.notes)


_FEWER = "pass a smaller --episodes"


def _count(n: int, noun: str) -> str:
    """``1 episode``, ``2 episodes``."""
    return f"{n:,} {noun}{'s' * (n != 1)}"


def _step_bytes(spec: Spec) -> int:
    """Bytes export holds per recorded step: the observation (recorded, then stacked) and both loops' outputs
    (float64, kept for the comparison)."""
    outputs = sum(int(np.prod([d for d in shape if d != "batch"])) for _, shape, _ in spec.outputs())
    return 2 * 4 * int(np.prod(spec.obs_shape)) + 2 * 8 * outputs


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporters' warnings (deprecations, the LSTM's flat weights, torchvision's absent operators, which
    torch.onnx logs) are not the user's business here: the verification says whether the file is right."""
    import logging

    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _readable(f: Any) -> None:
    """The new file's permissions as any file the user writes has them (``mkstemp`` makes it owner-only)."""
    if hasattr(os, "fchmod"):
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(f.fileno(), 0o666 & ~mask)


def _meta(policy: Policy, source: str, exporter: str) -> str:
    normalized = {"normalized": True} if policy.normalized else {}  # (files of other models: as before)
    return policy.spec.to_json(
        source=Path(source).name,
        framework=policy.framework,
        exporter=exporter,
        batch="any number of envs",
        **normalized,
    )


def _write_onnx(policy: Policy, f: BinaryIO, source: str) -> str:

    spec = policy.spec
    batch = torch.export.Dim("batch")
    shapes = ({0: batch}, {0: batch}, tuple({1: batch} for _ in spec.state_names))  # forward(obs, start, *state)
    exporter = f"torch.onnx.export (dynamo, torch {torch.__version__})"
    try:
        program = torch.onnx.export(
            policy.module,
            spec.example(),
            input_names=[n for n, _, _ in spec.inputs()],
            output_names=[n for n, _, _ in spec.outputs()],
            dynamo=True,
            dynamic_shapes=shapes,
            verbose=False,
        )
    except Exception as exc:
        interrupt_behind(exc)
        raise BadInput(f"torch.onnx.export could not export this policy: {one_line(exc, kind=False)[:300]}") from None
    assert program is not None
    proto = program.model_proto
    entry = proto.metadata_props.add()
    entry.key, entry.value = META_KEY, _meta(policy, source, exporter)
    f.write(proto.SerializeToString())  # the weights inside the one file (onnx.save_model's own default)
    return exporter


def _write_torchscript(policy: Policy, f: BinaryIO, source: str) -> str:
    exporter = f"torch.jit.trace (torch {torch.__version__})"
    try:
        traced = torch.jit.trace(policy.module, policy.spec.example(), check_trace=False)
    except Exception as exc:
        interrupt_behind(exc)
        raise BadInput(f"torch.jit.trace could not trace this policy: {one_line(exc, kind=False)[:300]}") from None
    torch.jit.save(traced, f, _extra_files={f"{META_KEY}.json": _meta(policy, source, exporter)})
    return exporter


def compare(
    step: Step,
    reference: Step,
    spec: Spec,
    obs: np.ndarray,
    starts: np.ndarray,
    tolerance: float,
    what: str,
    progress: Progress = _quiet_progress,
) -> dict[str, float]:
    """Both loops over the episodes, each feeding back its own state; the largest relative error per output,
    or BadInput at the first step over ``tolerance``. An output's error at a step is ``max|a - b|`` over its
    values divided by the largest ``|b|`` of that output over all the steps (its scale in these episodes: an
    action near 0 at one step is not compared relative to that tiny value); discrete actions agree exactly."""
    names = [n for n, _, _ in spec.outputs()]
    mine, theirs = spec.zero_state(), spec.zero_state()
    got: list[list[np.ndarray]] = [[] for _ in names]
    want: list[list[np.ndarray]] = [[] for _ in names]
    pace = Pace(2 * len(obs), f"verifying the exported {what} file", "pass a smaller --episodes")
    progress("verifying", 0, len(obs))
    for i in range(len(obs)):
        o, s = obs[i : i + 1], starts[i : i + 1].astype(np.float32)
        a, v, mine = step(o, s, mine)
        ra, rv, theirs = reference(o, s, theirs)
        pace.tick(2)
        progress("verifying", i + 1, len(obs))
        for k, (x, y) in enumerate(zip((a, v, *mine), (ra, rv, *theirs), strict=True)):
            got[k].append(np.asarray(x, np.float64).ravel())
            want[k].append(np.asarray(y, np.float64).ravel())
    errors: dict[str, np.ndarray] = {}
    for k, name in enumerate(names):
        x, y = np.stack(got[k]), np.stack(want[k])
        if spec.action == "discrete" and name == "action":
            errors[name] = (x != y).any(axis=1).astype(np.float64)
        else:
            scale = float(np.abs(y[np.isfinite(y)]).max(initial=0.0)) or 1.0
            errors[name] = np.abs(x - y).max(axis=1) / scale  # NaN where either is NaN
    # a NaN error is a divergence: ~(e <= tolerance), not e > tolerance, which NaN passes
    over = [(int(np.argmax(~(e <= tolerance))), name) for name, e in errors.items() if (~(e <= tolerance)).any()]
    if over:
        i, name = min(over)
        k = names.index(name)
        episode = int(starts[: i + 1].sum()) - 1
        t = i - int(np.flatnonzero(starts[: i + 1])[-1])
        err = float(errors[name][i])
        how = "a NaN, not within" if np.isnan(err) else f"{err:.2e} relative, over"
        raise BadInput(
            f"the exported {what} file parts from the PyTorch policy at episode {episode} step {t}: {name} "
            f"{got[k][i][:3].tolist()} vs {want[k][i][:3].tolist()} ({how} the tolerance {tolerance:g}); "
            "nothing was written"
        )
    return {name: float(e.max(initial=0.0)) for name, e in errors.items()}


def episodes_from_trace(trace: str | os.PathLike[str], spec: Spec, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The observations of the first ``count`` episodes of a recorded run (``replay``'s trace, read as replay reads
    it: ``deploy/trace.py``), env by env; an env's first row starts an episode whatever it says."""
    from lstm_probe.deploy.trace import read_trace

    rec = read_trace(trace, spec, MAX_TRACE_ROWS)
    starts = np.asarray(rec.start, bool).copy()
    starts[np.r_[True, rec.env[1:] != rec.env[:-1]]] = True
    first = np.flatnonzero(starts)
    end = len(starts) if len(first) <= count else int(first[count])
    return np.asarray(rec.obs[:end], np.float32), starts[:end]


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (a link or another spelling of the path included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # either does not exist (yet): the same path, spelt alike once resolved
        pass
    resolved = []
    for path in (b, a):
        try:
            resolved.append(path.resolve())
        except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
            raise BadInput(f"{path} is a symlink loop; choose another path") from None
    return resolved[0] == resolved[1]


def _obs_module(meta: dict[str, Any]) -> str:
    """The module whose layer-0 rollout rows the observations are read from (each module's rows hold the same
    observations): the actor where the log has one, else its first module (TorchRL's shared 'lstm')."""
    modules = (meta.get("architecture") or {}).get("modules") if isinstance(meta.get("architecture"), dict) else None
    names = [str(n) for n in modules] if isinstance(modules, dict) else []
    return "actor" if "actor" in names or not names else names[0]


def episodes_from_log(log: str | os.PathLike[str], spec: Spec, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The observations of the first ``count`` episodes of a ``--capture-obs`` log (by env, then episode), each
    cut at :data:`MAX_EPISODE_STEPS` steps, back to back, and the episode starts.

    A log from elsewhere can hold millions of rows in a few KB, so the obs vectors' width is checked against
    the policy's from the schema first, and the log is streamed twice within the memory budget: the keys
    (env, episode, env_step) of its rollout rows, keeping the first ``count`` episodes' first steps; then the
    observations of those steps alone, as numpy arrays (never a Python object per row)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from lstm_probe.log import budget, reader

    data, info = reader.dataset(log)
    size = int(np.prod(spec.obs_shape))
    if info.metadata.get("obs_size") is None or "obs" not in data.schema.names:
        raise BadInput(
            f"{log} holds no observations: record one with `lstm-probe run ENV_ID --capture-obs` (capture_obs=True "
            "in code, e.g. ProbeCallback(..., capture_obs=True)), or verify on --env ENV_ID"
        )
    typ = data.schema.field("obs").type
    width = typ.list_size if pa.types.is_fixed_size_list(typ) else None
    if width != size:
        raise BadInput(f"{log}'s observations hold {width} values, the policy takes {size}: another env's log?")
    rows = ds.field("phase").isin(["rollout"]) & ds.field("module").isin([_obs_module(info.metadata)])
    rows = rows & (ds.field("layer") == 0)
    keys = ["env", "episode", "env_step"]
    for name in keys:
        rows = rows & ds.field(name).is_valid()
    budget.check_stream(data, keys, f"reading the episodes of {log}")
    best = np.empty((0, 3), np.int64)  # (env, episode, its first env_step), the first `count`
    for batch in data.to_batches(columns=keys, filter=rows):
        best = _first_episodes(np.concatenate([best, _ints(batch)]), count)
    if not len(best):
        what = "no rollout step with its episode"
        raise BadInput(f"{log} holds {what}: record one with `lstm-probe run ENV_ID --capture-obs`")
    if len(best) < count:
        fix = f"pass --episodes {len(best)}, or record a longer run"
        raise BadInput(f"{log} holds {_count(len(best), 'episode')}, fewer than --episodes {count}: {fix}")
    most = count * MAX_EPISODE_STEPS
    budget.refuse(3 * 4 * size * most, f"reading the observations of {count} episodes of {log}")
    budget.check_stream(data, [*keys, "obs"], f"reading the observations of {log}")
    near = rows & ds.field("env").isin(np.unique(best[:, 0])) & ds.field("episode").isin(np.unique(best[:, 1]))
    near = near & (ds.field("env_step") >= int(best[:, 2].min()))
    near = near & (ds.field("env_step") < int(best[:, 2].max()) + MAX_EPISODE_STEPS)
    got_keys, got_obs, held = [], [], 0
    for batch in data.to_batches(columns=[*keys, "obs"], filter=near):
        k = _ints(batch)
        keep = _in_window(k, best)
        if not keep.any():
            continue
        col = batch.column(3).filter(pa.array(keep))
        held += len(col)
        if col.null_count or held > most:
            why = "a step without its observation" if col.null_count else "a step in more than one row"
            raise BadInput(f"{log} holds {why} in its first {count} episodes: not a --capture-obs log lstm-probe wrote")
        got_keys.append(k[keep])
        got_obs.append(np.asarray(col.flatten().to_numpy(zero_copy_only=False), np.float32).reshape(-1, size))
    k, obs = np.concatenate(got_keys), np.concatenate(got_obs)
    order = np.lexsort((k[:, 2], k[:, 1], k[:, 0]))
    k, obs = k[order], obs[order]
    if (k[1:] == k[:-1]).all(axis=1).any():
        raise BadInput(
            f"{log} holds a step in more than one row in its first {count} episodes: not a --capture-obs log"
        )
    first = np.r_[True, (k[1:, :2] != k[:-1, :2]).any(axis=1)]
    return obs.reshape((-1, *spec.obs_shape)), first


def _ints(batch: Any) -> np.ndarray:
    """A record batch's integer columns as one (rows, columns) int64 array."""
    return np.column_stack([np.asarray(c.to_numpy(zero_copy_only=False), np.int64) for c in batch.columns[:3]])


def _first_episodes(keys: np.ndarray, count: int) -> np.ndarray:
    """(env, episode, first env_step) of the first ``count`` episodes among ``keys`` rows (env, episode, env_step)."""
    keys = keys[np.lexsort((keys[:, 2], keys[:, 1], keys[:, 0]))]
    first = np.r_[True, (keys[1:, :2] != keys[:-1, :2]).any(axis=1)] if len(keys) else np.zeros(0, bool)
    return keys[first][:count]


def _in_window(keys: np.ndarray, best: np.ndarray) -> np.ndarray:
    """Which ``keys`` rows (env, episode, env_step) are among the first :data:`MAX_EPISODE_STEPS` steps of one
    of the episodes ``best`` names (env, episode, first env_step): each (env, episode) as one code, looked up
    in ``best``'s sorted codes (linear in the rows, but for the sorts of ``best``)."""
    envs, episodes = np.unique(best[:, 0]), np.unique(best[:, 1])
    e = np.minimum(np.searchsorted(envs, keys[:, 0]), len(envs) - 1)
    p = np.minimum(np.searchsorted(episodes, keys[:, 1]), len(episodes) - 1)
    known = (envs[e] == keys[:, 0]) & (episodes[p] == keys[:, 1])
    codes = np.searchsorted(envs, best[:, 0]) * len(episodes) + np.searchsorted(episodes, best[:, 1])
    order = np.argsort(codes)
    code = e * len(episodes) + p
    j = np.minimum(np.searchsorted(codes[order], code), len(codes) - 1)
    keep = known & (codes[order][j] == code)
    begin = best[order[j], 2]
    return keep & (keys[:, 2] >= begin) & (keys[:, 2] < begin + MAX_EPISODE_STEPS)


def _dict_layout(space: Any, spec: Spec, env_id: str) -> Callable[[Any], np.ndarray]:
    """``gymnasium.spaces.flatten`` of the env's Dict observations, where its keys are the policy's
    (``Spec.obs_keys``: each key's name, shape and width, in order); BadInput otherwise."""
    from gymnasium import spaces

    have = list(space.spaces.items()) if isinstance(space, spaces.Dict) else []
    mine = [(k.key, k.shape, k.stop - k.start) for k in spec.obs_keys]
    theirs = [(str(k), tuple(s.shape or ()), int(spaces.flatdim(s))) for k, s in have]
    if mine != theirs:
        raise BadInput(
            f"{env_id}'s observations are {str(space)[:120]}, the policy's a Dict of "
            f"{', '.join(f'{k} {list(s)}' for k, s, _ in mine)[:120]}; pass the env the policy was trained on"
        )
    return lambda obs: np.asarray(spaces.flatten(space, obs), np.float32)


def episodes_from_env(
    env_id: str, spec: Spec, policy: Step, count: int, seed: int, progress: Progress = _quiet_progress
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` fresh episodes of ``env_id`` (seeded ``seed``, ``seed + 1``, ...), acted on by ``policy``;
    ``progress('recording episodes', done, count)`` after each."""
    import gymnasium as gym

    check_env_id(env_id)
    env = gym.make(env_id)
    shape = tuple(env.observation_space.shape or ())
    # the env's own frames where the framework rearranges them (sb3: channel-last images; Spec.frame_axes)
    transpose = shape != spec.obs_shape and shape == spec.frame_shape
    flat = _dict_layout(env.observation_space, spec, env_id) if spec.obs_keys else None
    if flat is not None:
        shape = spec.obs_shape
    if shape != spec.obs_shape and not transpose:
        env.close()
        raise BadInput(
            f"{env_id}'s observations have the shape {shape}, the policy's {spec.obs_shape}; pass the env the "
            "policy was trained on"
        )
    obs_list, starts = [], []
    what = f"recording {_count(count, 'episode')} of {env_id}"
    pace = Pace(count, what, _FEWER)  # the same 10 minutes as verification, measured from the first second on
    per_step = _step_bytes(spec)
    try:
        for e in range(count):
            o, _ = env.reset(seed=seed + e)
            state = spec.zero_state()
            for t in range(MAX_EPISODE_STEPS):
                o = np.asarray(o if flat is None else flat(o), np.float32)
                o = spec.from_frames(o[None]) if transpose else o[None]
                obs_list.append(o[0])
                starts.append(t == 0)
                action, _, state = policy(o, np.array([float(t == 0)], np.float32), state)
                o, _, terminated, truncated, _ = env.step(action[0])
                if terminated or truncated:
                    break
            progress("recording episodes", e + 1, count)
            budget.refuse(len(obs_list) * per_step, what, _FEWER)  # what the episodes hold, as they grow
            pace.tick(1)
    finally:
        env.close()
    return np.stack(obs_list), np.array(starts)
