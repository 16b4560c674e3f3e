"""The visual report: built from a real tiny run, self-contained, and looked at by a real browser."""

import base64
import re
import shutil
import subprocess
import sys

import pytest
from conftest import probed_run

from lstm_probe.errors import BadInput
from lstm_probe.html import build_html

FIGURES = [
    "Minibatch layout",
    "Hidden and cell states",
    "Staleness",
    "Sequence lengths vs episode lengths",
    "Norms over iterations",
]


@pytest.fixture(scope="module")
def page(runs_dir, tmp_path_factory):
    result = probed_run(runs_dir, "Pendulum-v1", n_envs=2)
    out = tmp_path_factory.mktemp("html") / "report.html"
    return build_html(result.path, out), out, result


def test_every_figure_is_inlined(page):
    p, out, _ = page
    text = out.read_text()
    assert p.figures == FIGURES
    imgs = re.findall(r"<img alt='([^']+)' src='data:image/png;base64,([A-Za-z0-9+/=]+)'>", text)
    assert [a for a, _ in imgs] == FIGURES
    for _, data in imgs:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    # nothing to fetch: no scripts, no external URLs
    assert "<script" not in text and not re.search(r"(src|href)=['\"]https?:", text)
    assert p.bytes < 2_000_000
    assert "provenance check" in text and "Findings" in text


def test_choices_default_and_explicit(page, tmp_path):
    p, _, result = page
    assert p.iteration == 2 and p.env == 0 and p.episode == 0  # 2 envs x 32 steps: 3 iterations in 192 steps
    p2 = build_html(result.path, tmp_path / "x.html", iteration=0, env=1)
    assert p2.iteration == 0 and p2.env == 1
    with pytest.raises(BadInput, match="--iteration 99 is not in the log"):
        build_html(result.path, tmp_path / "y.html", iteration=99)
    with pytest.raises(BadInput, match="--episode 7 is not in the log"):
        build_html(result.path, tmp_path / "y.html", episode=7)


def test_cli_html(page, tmp_path):
    _, _, result = page
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "report", str(result.path), "--html", str(tmp_path / "c.html")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "5 figures" in r.stderr and (tmp_path / "c.html").exists()


def test_real_browser_renders_without_console_errors(page, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium here: apt-get install chromium (.ci/run installs it)")
    _, out, _ = page
    shot = tmp_path / "shot.png"
    r = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1200,2400",
            f"--screenshot={shot}",
            out.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.exists() and shot.stat().st_size > 50_000, r.stderr[-2000:]
    console = [line for line in r.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
