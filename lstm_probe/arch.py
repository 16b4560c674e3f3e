"""``lstm-probe arch``: a RecurrentPPO to analyse (built from an env id, or loaded from a model.zip) and
the Graphviz rendering of its architecture.

The analysis itself (actor and critic paths, measured gradient flow) is sb3's and lives in
``lstm_probe.integrations.sb3_arch``; its names are re-exported here.
"""

from __future__ import annotations

from typing import Any

from lstm_probe.integrations.sb3_arch import (
    Architecture,
    ModuleInfo,
    ParamFlow,
    arch,
    summary,
    to_dot,
)

__all__ = ["Architecture", "ModuleInfo", "ParamFlow", "arch", "load_model", "render", "summary", "to_dot"]


def load_model(
    target: str, *, env_id: str | None = None, trust_model: bool = False, **options: Any
) -> tuple[Any, bool]:
    """A RecurrentPPO from an env id (built as ``run`` builds it) or a model.zip; and whether a real
    rollout is possible (an env is attached).

    A model.zip is read without unpickling anything (``integrations/sb3_zip.py``); what that reader
    cannot build is refused with one line. ``trust_model=True`` uses SB3's full load instead
    (``RecurrentPPO.load``, which unpickles the zip's objects and so runs any code stored in it)."""
    from pathlib import Path

    from lstm_probe.errors import BadInput
    from lstm_probe.run import build

    if target.endswith(".zip") or Path(target).is_file():
        if not Path(target).is_file():
            raise BadInput(f"{target} does not exist; pass a saved RecurrentPPO model.zip or an env id")
        env = None
        if env_id is not None:
            from stable_baselines3.common.env_util import make_vec_env

            from lstm_probe.run import check_env_id

            check_env_id(env_id)
            env = make_vec_env(env_id, n_envs=1, seed=0)
        if not trust_model:
            from lstm_probe.integrations import sb3_zip

            return sb3_zip.load(target, env), env is not None
        from sb3_contrib import RecurrentPPO

        try:
            model = RecurrentPPO.load(target, env=env, device="cpu")
        except Exception as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise BadInput(f"cannot load {target} as a RecurrentPPO model: {msg}") from None
        return model, env is not None
    return build(target, n_steps=64, batch_size=64, **options), True


def render(source: str, path: Any, fmt: str) -> None:
    """Render DOT with Graphviz's ``dot``; a clear error when it is not installed."""
    import shutil
    import subprocess

    from lstm_probe.errors import BadInput

    exe = shutil.which("dot")
    if exe is None:
        raise BadInput(f"--{fmt} needs Graphviz's `dot` (apt-get install graphviz); --dot FILE writes the source")
    r = subprocess.run([exe, f"-T{fmt}", "-o", str(path)], input=source, text=True, capture_output=True)
    if r.returncode:
        raise BadInput(f"dot failed: {r.stderr.strip().splitlines()[0] if r.stderr.strip() else r.returncode}")
