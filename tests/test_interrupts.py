"""Ctrl-C in `report`, `arch` and `probe` ends in one line saying what was (not) written, exit 130, as in `run`,
`export` and `replay` (tests/test_reliability.py, tests/test_deploy_lines.py send real signals to those): typer
turns a KeyboardInterrupt into a silent exit 130, so each command says it itself (cli/stops.py). The interrupt is
raised from inside the command's library call, as a Ctrl-C there would; a report's page is written whole or not
at all."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

import lstm_probe.integrations
import lstm_probe.report
import lstm_probe.report.probes
from lstm_probe.cli import main

SAMPLE = Path(__file__).resolve().parent.parent / "sample_runs" / "pendulum-1env.parquet"


def _ctrl_c(*args, **kwargs):
    raise KeyboardInterrupt


def _load(_fw):
    return SimpleNamespace(arch=_ctrl_c)


@pytest.mark.parametrize(
    ("args", "where", "note"),
    [
        (
            ["report", str(SAMPLE)],
            (lstm_probe.report, "summarize", _ctrl_c),
            "no report (report writes a page with --html only, and wrote none)",
        ),
        (
            ["report", str(SAMPLE), "--json"],
            (lstm_probe.report, "summarize", _ctrl_c),
            "no report (report writes a page with --html only, and wrote none)",
        ),
        (
            ["probe", str(SAMPLE)],
            (lstm_probe.report.probes, "probe_rows", _ctrl_c),
            "no probes (probe writes no file)",
        ),
        (
            ["arch", "CartPole-v1"],
            (lstm_probe.integrations, "load", _load),
            "no analysis (a --dot, --svg or --png file not finished may be missing)",
        ),
    ],
    ids=["report", "report-json", "probe", "arch"],
)
def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys, args, where, note):
    monkeypatch.setattr(*where)
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 130
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [f"interrupted (Ctrl-C): {note}"]


def test_a_page_is_written_whole_and_readable(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "page.html"
    out.write_text("the page before")
    mask = os.umask(0o022)
    try:
        main(["report", str(SAMPLE), "--html", str(out)])
    finally:
        os.umask(mask)
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # as any file the user writes (mkstemp's is 0o600)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]  # no temporary page left beside it


def test_a_page_interrupted_while_written_leaves_the_page_before(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    import lstm_probe.report.html as html

    out = tmp_path / "page.html"
    out.write_text("the page before")

    def replace(src, dst):
        raise KeyboardInterrupt  # between the page written in full and its rename

    monkeypatch.setattr(html.os, "replace", replace)
    with pytest.raises(SystemExit) as stop:
        main(["report", str(SAMPLE), "--html", str(out)])
    assert stop.value.code == 130
    assert out.read_text() == "the page before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]
