"""Where a log lives on disk, the checks before one is written, and how many rows a row group holds;
imports neither torch nor pyarrow (the training process uses it; with a writer process it never loads
pyarrow).

A log is a Parquet file (``run.parquet``) or a dataset directory of part files (``runs/x/``). While a
single-file log is being written, its parts wait in ``run.parquet.partial/`` (its crash journal), which
the readers salvage when the run was killed.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from lstm_probe.errors import BadInput
from lstm_probe.log.lock import lock_path, refuse_if_held
from lstm_probe.log.schema import scalar_row_bytes

PARTIAL_SUFFIX = ".partial"

BUFFER_BYTES = 16 << 20
"""Bytes of one row buffer, i.e. of one row group before compression. The writer's memory is a few
times this (the buffer, its Arrow arrays, the Parquet writers' pages). Smaller buffers cost less memory
up front but more row groups, whose footer metadata an open file keeps until it closes."""


SCALAR_ROW_BYTES = scalar_row_bytes()
"""Bytes one row's scalar columns (and row flags) take in a row buffer."""

KEPT_BYTES = 16 << 20
"""Bytes of kept rows' vectors a row buffer of a log where few rows keep theirs (``--trace-envs K
--other-envs summary``) holds before it is written as a row group, besides its scalar columns."""

ARROW_MIN = (26, 0)
"""The oldest pyarrow that writes and reads what every log may hold: fixed-size lists with null entries (the
``obs`` column of ``--capture-obs``, the h and c of ``--trace-envs``' summary rows). pyarrow 17-24 refuse to
write them ("Lists with non-zero length null components are not supported") and 25 writes what it cannot
read back (apache/arrow#35692, fixed in 26)."""


def arrow_too_old() -> str | None:
    """What is wrong when this pyarrow is older than :data:`ARROW_MIN`, and how to fix it; None when it is not."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    # read from the installed distribution where pyarrow is not loaded: with a writer process, training
    # never imports it
    found = getattr(sys.modules.get("pyarrow"), "__version__", None)
    if found is None:
        try:
            found = version("pyarrow")
        except PackageNotFoundError:  # no distribution metadata (a build on sys.path): ask the module
            import pyarrow

            found = str(pyarrow.__version__)
    try:
        have = tuple(int(p) for p in [*found.split("."), "0"][:2])
    except ValueError:  # a development build: trusted
        return None
    if have >= ARROW_MIN:
        return None
    need = ".".join(map(str, ARROW_MIN))
    return (
        f"lstm-probe needs pyarrow>={need} (this is {found}, which cannot write or read back the null "
        f"vectors logs hold); upgrade it: pip install -U 'pyarrow>={need}'"
    )


def row_capacity(hidden_size: int, vectors: bool = True, sparse: bool = False) -> int:
    """Rows per row buffer (and row group) at this hidden size (the train rows' lane; the other rows' lane
    holds a quarter of it once train rows came, ``writer.FileLog``). A log that never stores vectors
    (``--capture summary``) keeps no vector columns in its buffer, so its row groups hold ~40x more rows
    in the same memory: fewer row groups, a smaller footer (which the writer keeps in memory until the
    file closes) and faster reads. A log where few rows keep their vectors (``sparse``: ``--trace-envs K
    --other-envs summary``) holds the kept rows' vectors apart (:data:`KEPT_BYTES`): its row groups hold up to
    65,536 rows whatever the hidden size."""
    if sparse:  # the cap as a full log's: the scalar buffers' size held the writer's memory at +35 MB
        return min(65536, BUFFER_BYTES // SCALAR_ROW_BYTES)
    if not vectors:
        return BUFFER_BYTES // SCALAR_ROW_BYTES
    row_bytes = 2 * hidden_size * 4 + SCALAR_ROW_BYTES
    return int(max(256, min(65536, BUFFER_BYTES // row_bytes)))


def partial_dir(path: Path) -> Path:
    """Where a single-file log keeps its parts while the run is going."""
    return path.with_name(path.name + PARTIAL_SUFFIX)


def journal_rows(journal: Path) -> int:
    """Rows in the finished parts of a crash journal (read from their footers; pyarrow is imported only
    here, when a journal is found)."""
    parts = sorted(journal.glob("part-*.parquet"))
    if not parts:
        return 0
    import pyarrow.parquet as pq

    rows = 0
    for part in parts:
        try:
            rows += pq.read_metadata(part).num_rows
        except Exception:  # an unreadable part: its rows count as one, so the journal is kept
            rows += 1
    return rows


_OURS = re.compile(r"(part-[A-Za-z0-9_.]*\d{5}\.parquet|\.part-[A-Za-z0-9_.]*\d{5}\.parquet\.tmp)")
"""The names the writer gives a crash journal's entries (``parts.PartWriter``)."""


def others(journal: Path, show: int = 3) -> str | None:
    """What in ``journal`` the writer did not put there (entries not named as its parts, or anything not a
    plain file), in words; None when it holds only the writer's parts. A journal path that is not a
    directory is itself someone else's."""
    if not journal.is_dir() or journal.is_symlink():
        return f"a {'link' if journal.is_symlink() else 'file'} of that name"
    names = _not_named(journal, _OURS, show)
    return None if names is None else f"files ({names})"


def _not_named(directory: Path, ours: re.Pattern[str], show: int) -> str | None:
    """The entries of ``directory`` not named as ``ours`` (or not plain files), the first ``show`` of them in
    words; None where there is none."""
    found = []
    for entry in directory.iterdir():
        if not ours.fullmatch(entry.name) or entry.is_symlink() or not entry.is_file():
            found.append(entry.name)
            if len(found) > show:
                break
    if not found:
        return None
    from lstm_probe.text import plain

    return ", ".join(plain(n)[:80] for n in found[:show]) + (", ..." if len(found) > show else "")


_A_LOGS = re.compile(r"\.?part-(?:[A-Za-z0-9_.]+-)?\d{5}\.parquet(?:\.tmp)?|\.lstm-probe(?:-[A-Za-z0-9_.]+)?\.lock")
"""The names of what a dataset directory's log keeps there: its part files (published, or hidden while written,
``parts.PartWriter``; one series per shard) and its locks (``lock.py``)."""


def strangers(directory: Path, show: int = 3) -> str | None:
    """What in the dataset directory ``directory`` is not a log's own (:data:`_A_LOGS`; anything not a plain file
    counts), in words; None when it holds nothing else."""
    return _not_named(directory, _A_LOGS, show)


def check_output(path: Path, *, force: bool, is_dir: bool, shard: str | None = None) -> None:
    """Refuse to clobber a log without ``force`` and fail early on an unwritable location. A log another
    live run is writing is refused even with ``force`` (its lock, ``lock.py``); so is, without ``force``,
    a killed run's crash journal (``NAME.partial/``) that holds rows: they are never deleted unasked."""
    refuse_if_held(lock_path(path, is_dir=is_dir, shard=shard), path)
    if is_dir:
        # a shard (one worker of a multi-process run) owns only its own part files
        pattern = f"part-{shard}-*.parquet" if shard else "part-*.parquet"
        other = strangers(path) if path.is_dir() else None
        if other:  # a log's part files would land among someone else's files
            raise BadInput(
                f"{path}/ holds files that are not a log's ({other}); name a new or empty directory for --out "
                "(or a file: run.parquet)"
            )
        if path.exists() and any(path.glob(pattern)):
            if not force:
                raise BadInput(
                    f"{path}/ already holds a log; pass --force (force=True in code) to overwrite it or choose "
                    "another --out"
                )
            for old in path.glob(pattern):
                old.unlink()
        parent = path
    else:
        if path.exists():
            if path.is_dir():
                raise BadInput(f"{path} is a directory; end --out with '/' to write a dataset directory there")
            if not force:
                raise BadInput(
                    f"{path} already exists; pass --force (force=True in code) to overwrite it or choose another --out"
                )
        journal = partial_dir(path)
        if not force and journal.exists():
            foreign = others(journal)
            if foreign:
                raise BadInput(
                    f"{journal} is where this log's crash journal goes, and it holds {foreign} that lstm-probe did "
                    "not write; move it away or choose another --out (--force deletes it)"
                )
            rows = journal_rows(journal)  # a directory of the writer's parts (others() said so)
            if rows:
                raise BadInput(
                    f"{journal}/ holds {rows:,} rows a killed run left (read them: lstm-probe report {journal}/); "
                    "pass --force to delete them or choose another --out"
                )
        parent = path.parent if str(path.parent) else Path(".")
    check_writable(parent)


def fingerprint(path: str | Path) -> Any:
    """What is at ``path``, to tell later whether a run changed it (a failed run must not describe an
    earlier log as its own): a file's identity, size and time; a directory's entries with theirs; None
    when nothing is there."""

    def one(p: Path) -> tuple[int, int, int, int] | None:
        try:
            st = p.stat()
        except OSError:
            return None
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    p = Path(path)
    if p.is_dir():
        try:
            return sorted((e.name, one(e)) for e in p.iterdir())
        except OSError:
            return None
    return one(p)


def output_dir(out: Path, *, is_dir: bool) -> Path:
    """The directory a log at ``out`` is written into (``out`` itself for a dataset directory)."""
    return out if is_dir else (out.parent if str(out.parent) else Path("."))


def check_writable(directory: Path, fix: str = "choose another --out") -> None:
    """Refuse (BadInput, one line ending in ``fix``) unless a file can be written in ``directory``, or, where
    it does not exist yet, made in the nearest part of its path that does (the writer makes the rest): a path
    under a regular file, a read-only mount, a directory without write permission. Creates nothing that
    stays; cheap and torch-free: checked before any work, not found when the log is first written."""
    above = directory
    while not above.exists() and above != above.parent:  # the nearest part of the path that exists
        above = above.parent
    if above.exists() and not above.is_dir():
        raise BadInput(f"cannot write to {directory}: {above} is a file, not a directory; {fix}")
    try:  # a real write: permission bits say little to root, and nothing about read-only mounts
        with tempfile.NamedTemporaryFile(dir=above, prefix=".lstm-probe-check-"):
            pass
    except OSError as exc:
        raise BadInput(
            f"cannot write to {directory}: {exc.strerror or exc}; the directory is not writable, {fix}"
        ) from None


PART_ROWS = 2_000_000
"""A part file is published after this many rows at most (besides every ``part_seconds``)."""
