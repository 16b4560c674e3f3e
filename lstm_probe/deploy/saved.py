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


MARK = "lstm_probe"
"""The key of a saved checkpoint's top-level dict naming the framework whose ``run`` wrote it (TorchRL's
``run.model.pt``: ``"torchrl"``); rsl_rl's checkpoint keeps ``OnPolicyRunner.save``'s own layout, without it.
``integrations.deploy_policy`` reads it where several frameworks' loaders take one suffix (``.pt``)."""


def read_checkpoint(path: str | os.PathLike[str], fix: str) -> object:
    """What ``torch.save`` wrote at ``path``, read as hostile: a regular file (a FIFO or device refused, never
    waited on), its size within the memory budget (twice: its tensors, and the models they are loaded into),
    and ``torch.load(weights_only=True)``: tensors, containers and numbers, never a pickled object or code.
    Anything else is refused in one line, ending with ``fix``."""
    import warnings

    import torch

    from lstm_probe.log import budget

    with budget.open_regular(os.fspath(path), fix) as f:
        budget.refuse(2 * os.fstat(f.fileno()).st_size, f"reading {path}")
        _check_crcs(f, path, fix)
        try:
            with warnings.catch_warnings():  # torch.load's note on a pickle protocol: the refusal says it all
                warnings.simplefilter("ignore")
                return torch.load(f, map_location="cpu", weights_only=True)  # type: ignore[no-any-return]
        except Exception as exc:
            raise BadInput(
                f"{path} is not a checkpoint torch.load reads without unpickling code ({type(exc).__name__}); {fix}"
            ) from None


def _check_crcs(f: BinaryIO, path: str | os.PathLike[str], fix: str) -> None:
    """A ``torch.save`` zip's records against their CRC-32s (``torch.load`` does not check them: flipped bytes in
    the weights load without a word, and a later check blames the export). Within the memory budget first (the
    records' sizes as the zip states them); a file that is no zip (torch's legacy format) is left to ``torch.load``.
    The file is read back from its start."""
    import zipfile

    from lstm_probe.log import budget

    try:
        if not zipfile.is_zipfile(f):
            f.seek(0)
            if f.read(4) == b"PK\x03\x04":  # a zip's first record, but no directory at its end: cut short
                size = os.fstat(f.fileno()).st_size
                raise BadInput(
                    f"{path} is truncated: a zip (as torch.save writes) whose end is missing ({size:,} bytes); "
                    "copy it again whole"
                )
            return
        f.seek(0)
        with zipfile.ZipFile(f) as z:
            budget.refuse(sum(i.file_size for i in z.infolist()), f"checking {path}'s records")
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError) as exc:
        raise BadInput(f"{path} is not a readable checkpoint ({type(exc).__name__}); {fix}") from None
    finally:
        f.seek(0)
    if bad is not None:
        raise BadInput(f"{path} is corrupted: its record {bad!r} fails its CRC-32 check; {fix}")


def mark(path: str | os.PathLike[str], fix: str) -> str | None:
    """The framework a checkpoint names under :data:`MARK` (read by :func:`read_checkpoint`); None where it
    names none."""
    saved = read_checkpoint(path, fix)
    value = saved.get(MARK) if isinstance(saved, dict) else None
    return value if isinstance(value, str) else None


def bounds(config: dict[str, object], actions: int, where: str, fix: str) -> tuple[list[float], list[float]]:
    """A saved continuous policy's action bounds, its config's ``low`` and ``high``: finite numbers, one per
    action, low below high; anything else refused in one line ending with ``fix``."""
    import math

    def numbers(b: object) -> list[float] | None:
        if not isinstance(b, list) or len(b) != actions:
            return None
        return b if all(type(v) in (int, float) and math.isfinite(v) for v in b) else None

    low, high = numbers(config.get("low")), numbers(config.get("high"))
    if low is None or high is None or not all(a < b for a, b in zip(low, high, strict=True)):
        raise BadInput(f"{where}: its config's low and high are not {actions} finite bounds, low below high; {fix}")
    return low, high
