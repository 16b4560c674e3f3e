"""Strings from files (and paths) reach the terminal as plain, bounded text (issue #37): no control characters
or bidi overrides, never read as rich markup, never long enough to make the text report slow.

Real subprocesses of the CLI on inputs crafted in tmp_path (a sample log rewritten with pyarrow, a dataset
directory with a hostilely named part), and unit tests of the one function every such string goes through
(:func:`lstm_probe.text.safe`).
"""

import io
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lstm_probe.text import LIMIT, WORD, safe

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_runs" / "pendulum-1env.parquet"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "100"}

ESCAPES = "\x1b]0;pwned\x07\x1b[2J"  # retitles the terminal, then clears it
BIDI = "\u202e"  # right-to-left override: what follows is shown reversed
WORD_60K = "w" * 60_000


def _children_cpu_seconds():
    """CPU seconds of this process's ended children, user and system (wall time where there is no resource
    module: Windows)."""
    try:
        import resource
    except ImportError:
        return time.monotonic()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cli(*args, cwd=None, timeout=300):
    """``lstm-probe ARGS`` in a subprocess; stdout and stderr as bytes, and the CPU seconds it used (what a
    quadratic renderer burns; a busy machine stretches wall time, not that)."""
    start = _children_cpu_seconds()
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", *map(str, args)], capture_output=True, cwd=cwd, env=ENV, timeout=timeout
    )
    return r, _children_cpu_seconds() - start


def no_terminal_controls(data: bytes) -> None:
    assert b"\x1b" not in data and b"\x07" not in data, data[:2000]
    assert BIDI.encode() not in data, data[:2000]


# --- the one function ---------------------------------------------------------------------------------------------


def _rendered(markup: str) -> str:
    """What rich prints for ``markup`` (no terminal: no styling codes)."""
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=10_000, highlight=False).print(markup)
    return buf.getvalue().rstrip("\n")


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x08", "\x0d", "\x1b", "\x7f", "\x85", "\x9b", "\n", "\t"])
def test_safe_shows_control_characters_as_codes(char):
    shown = safe(f"a{char}b")
    assert shown == f"a\\x{ord(char):02x}b"
    assert all(c.isprintable() for c in shown)


@pytest.mark.parametrize("char", [*map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A)), "\u200f"])
def test_safe_shows_bidi_controls_as_codes(char):
    assert safe(f"a{char}b") == f"a\\u{ord(char):04x}b"


@pytest.mark.parametrize("text", ["[red]x[/red]", "[/]", "a [bold]b", "[link=file:///etc]x[/link]", "x\\", "[x]\\"])
def test_safe_escapes_markup(text):
    assert _rendered(f"[bold]{safe(text)}[/]") == text  # inside our own markup
    if not text.endswith("\\"):  # (rich's escape doubles a trailing backslash, for the markup after it)
        assert _rendered(safe(text)) == text
    assert safe(text, markup=False) == text  # for text printed with markup=False


def test_safe_keeps_ordinary_text():
    for text in ("Pendulum-v1", "lstm_actor", "a b, c; d (e)", "héllo wörld ✓", "R² ≥ 0", ""):
        assert safe(text) == text
    assert safe(None) == "None" and safe(3) == "3"


def test_safe_bounds_a_long_word():
    shown = safe("w" * 60_000)
    assert shown == "w" * WORD + "… (59,800 more)"


def test_safe_bounds_a_long_string():
    text = "ab " * 10_000  # words short, the whole long
    shown = safe(text)
    assert len(shown) < LIMIT + 30
    assert shown.endswith(f"… ({len(text) - LIMIT:,} more)") and text.startswith(shown[:LIMIT])


def test_safe_marks_a_word_cut_by_the_limit_once():
    text = "a " * 900 + "y" * 5_000 + " tail"
    shown = safe(text)
    assert shown == "a " * 900 + "y" * WORD + f"… ({len(text) - 1800 - WORD:,} more)"
    assert shown.count("more)") == 1


def test_safe_limit():
    assert safe("abcdef", limit=3) == "abc… (3 more)"
    path = "runs/" + "d" * 5_000 + "/[red]x[/red].parquet"
    assert _rendered(safe(path, limit=None)) == path  # a path is never cut


def test_safe_is_linear():
    start = time.thread_time()  # this thread's CPU time: a busy machine stretches wall time, not that
    for text in ("x" * (16 << 20), "x " * (8 << 20), "\x1b" * (1 << 20)):
        assert len(safe(text)) < 10 * LIMIT
    assert time.thread_time() - start < 5


# --- paths printed as written -------------------------------------------------------------------------------------


@pytest.mark.parametrize("out", ["tmp/[red]x[/red].parquet", "tmp/[/] y.parquet"])
def test_run_names_its_out_path_as_written(tmp_path, out):
    """A bracketed --out was read as markup: the 'wrote'/'next:' lines named another path ('tmp/x.parquet'), or
    the print failed after the log was closed and the run was reported as failed ('completed: false')."""
    r, _ = cli(
        "run", "Pendulum-v1", "--steps", 64, "--n-steps", 32, "--batch-size", 32, "--out", out, "-q", cwd=tmp_path
    )
    stdout, stderr = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, stdout + stderr
    assert "completed: false" not in stdout + stderr
    wrote = [line for line in stdout.splitlines() if line.startswith("wrote ")]
    after = [line for line in stdout.splitlines() if line.startswith("next: ")]
    assert len(wrote) == 1 and wrote[0].startswith(f"wrote {out}: "), stdout
    assert len(after) == 1 and shlex.split(after[0]) == ["next:", "lstm-probe", "report", out], stdout
    rep, _ = cli("report", "--json", out, cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr.decode()
    assert json.loads(rep.stdout)["run"]["completed"] is True


# --- hostile strings in a log -------------------------------------------------------------------------------------


def _hostile_log(path: Path) -> Path:
    """The sample log with terminal escapes, a bidi override, markup and a 60,000-character word in its
    env_id, command and stop_reason (a run that did not complete)."""
    table = pq.read_table(SAMPLE)
    meta = dict(table.schema.metadata)
    run = json.loads(meta[b"lstm_probe.run"])
    evil = f"{ESCAPES}{BIDI}[red]x[/red]"
    run.update(env_id=evil + WORD_60K, command=f"{evil} {WORD_60K}", stop_reason=f"{evil} {WORD_60K} end")
    meta[b"lstm_probe.run"] = json.dumps(run).encode()
    final = {"final": True, "completed": False, "stop_reason": f"{evil} {WORD_60K} end", "iterations": 4}
    meta[b"lstm_probe.final"] = json.dumps(final).encode()
    pq.write_table(table.replace_schema_metadata(meta), path)
    return path


def test_report_of_hostile_metadata_is_fast_and_plain(tmp_path):
    """rich's highlighter took 40+ s on one 60,000-character word; a bidi override reached the terminal."""
    log = _hostile_log(tmp_path / "hostile.parquet")
    r, seconds = cli("report", log, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[:2000]
    assert seconds < 15, f"report used {seconds:.1f} s of CPU"
    no_terminal_controls(r.stdout + r.stderr)
    text = r.stdout.decode()
    assert "NOT completed" in text and "… (" in text and "more)" in text
    assert len(r.stdout) < 40_000 and len(r.stderr) < 5_000  # cut, not 60,000 characters a string
    assert "\\x1b]0;pwned" in text  # shown as codes, not dropped
    # the JSON report keeps the strings whole (JSON escapes control characters itself)
    j, _ = cli("report", "--json", log, cwd=tmp_path, timeout=120)
    assert j.returncode == 0 and b"\x1b" not in j.stdout
    assert json.loads(j.stdout)["run"]["env_id"] == f"{ESCAPES}{BIDI}[red]x[/red]{WORD_60K}"


# --- errors -------------------------------------------------------------------------------------------------------


def test_error_naming_a_hostile_part_file_is_one_plain_line(tmp_path):
    """The one-line error escaped markup but printed a part file's name with its escape sequences raw."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "part-000.parquet").write_bytes(SAMPLE.read_bytes())
    (run / f"part-001-{ESCAPES}{BIDI}[red]x.parquet").write_bytes(b"not parquet")
    r, _ = cli("report", run, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    no_terminal_controls(r.stdout + r.stderr)
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "part-001-\\x1b]0;pwned\\x07\\x1b[2J\\u202e[red]x.parquet" in lines[0]


def test_error_with_a_long_hostile_word_is_bounded(tmp_path):
    """An error line holding a 60,000-character word (a path here: a file system keeps file names far
    shorter) prints cut, on one line, at once; a newline in it is shown as a code."""
    missing = tmp_path / f"{ESCAPES}{'n' * 60_000}"
    r, seconds = cli("report", f"{missing}\n{ESCAPES}", cwd=tmp_path)
    assert r.returncode in (1, 2), r.stderr[:2000]
    no_terminal_controls(r.stdout + r.stderr)
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "more)" in lines[0], lines
    assert len(lines[0]) < 3 * LIMIT
    assert seconds < 15


# --- warnings -----------------------------------------------------------------------------------------------------


def test_a_stale_locks_host_and_command_are_printed_inert_on_one_line(tmp_path):
    """A planted lock file (no process holds it) named a host and a command with escape sequences and a
    newline: the run took it over and said so in a Python warning (file, line number, source line) with the
    escapes raw. Now: one plain ``warning:`` line, the strings shown as codes, and the run goes on."""
    evil = f"{ESCAPES}{BIDI}[red]x[/red]\nsecond line"
    planted = {"pid": 2**22 + 7, "host": f"host{evil}", "started": f"2020{evil}", "command": f"cmd {evil}"}
    (tmp_path / "run.parquet.lock").write_text(json.dumps(planted))
    r, _ = cli(
        "run", "Pendulum-v1", "--steps", 32, "--n-steps", 16, "--batch-size", 16, "--hidden-size", 8, "-q", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr.decode()[:2000]
    no_terminal_controls(r.stdout + r.stderr)
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: took over the stale lock"), lines
    assert "pid 4194311 on host\\x1b]0;pwned\\x07\\x1b[2J\\u202e[red]x[/red]\\x0asecond line" in lines[0], lines
    assert "cmd \\x1b]0;pwned" in lines[0] and "warnings.warn" not in lines[0]
    assert (tmp_path / "run.parquet").is_file() and not (tmp_path / "run.parquet.lock").exists()
