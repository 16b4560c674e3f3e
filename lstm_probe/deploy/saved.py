"""The trained model ``lstm-probe run`` saves beside its log, for ``lstm-probe export`` (every framework's
``run`` names it with :func:`beside`, refuses an existing one with :func:`check_free` before it trains, and
writes it with :func:`write` once training completed; ``RunResult.model`` says where).

The name: the log's, its ``.parquet`` suffix replaced by ``.model.zip`` (sb3's ``RecurrentPPO.save``) or
``.model.pt`` (rsl_rl's ``OnPolicyRunner.save`` checkpoint; TorchRL's state dicts): ``run.parquet`` ->
``run.model.zip``. It is written as ``export`` writes its file: under a new random name in the same
directory, created by this process alone (never through a link planted there), then renamed over the name.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from lstm_probe.errors import BadInput

SUFFIXES = ("model.zip", "model.pt")


def beside(log: str | os.PathLike[str], suffix: str) -> Path:
    """Where a run whose log is ``log`` saves its model: ``run.parquet`` -> ``run.model.zip`` (``suffix``
    one of :data:`SUFFIXES`); a log name without ``.parquet`` takes the suffix after its whole name."""
    assert suffix in SUFFIXES, suffix
    path = Path(os.fspath(log))
    stem = path.name[: -len(".parquet")] if path.name.endswith(".parquet") else path.name
    return path.with_name(f"{stem}.{suffix}")


def check_free(path: Path, force: bool) -> None:
    """Refuse, before training, to overwrite a model saved earlier unless ``force`` (as the log itself)."""
    if path.is_dir():
        raise BadInput(f"{path} is a directory, where this run saves its model; move it away or choose another --out")
    if os.path.lexists(path) and not force:
        raise BadInput(f"{path} already exists (where this run saves its model); pass --force or choose another --out")


def write(path: Path, save: Callable[[BinaryIO], object]) -> Path:
    """``save(f)`` into a new file beside ``path``, renamed over ``path`` once written (a link at ``path`` is
    replaced, never followed); returns ``path``."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):  # as any file the user writes (mkstemp makes it owner-only)
                mask = os.umask(0)
                os.umask(mask)
                os.fchmod(f.fileno(), 0o666 & ~mask)
            save(f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
