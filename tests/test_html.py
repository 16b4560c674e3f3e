"""The visual report: built from a real tiny run, self-contained, and looked at by a real browser."""

import base64
import re
import shutil
import subprocess
import sys

import pytest
from conftest import probed_run

import lstm_probe
from lstm_probe.errors import BadInput
from lstm_probe.report.html import build_html

FIGURES = [
    "Minibatch layout",
    "Hidden and cell states",
    "Staleness",
    "Staleness over iterations",
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
    with pytest.raises(BadInput, match=r"--iteration 99 is not in the log; it holds iterations 0\.\.2 \(drop"):
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
    assert "6 figures" in r.stderr and (tmp_path / "c.html").exists()


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


@pytest.mark.parametrize("env_id, opts", [("CartPole-v1", {}), ("Pendulum-v1", {"n_envs": 2})])
def test_bounded_scans_equal_whole_reads(tmp_path, env_id, opts):
    """The page's scans keep only distinct values, spans and counts; they must equal what a whole read of
    the log gives. One part file per iteration, so episodes that span iterations are merged across files."""
    import pyarrow.dataset as ds
    from conftest import TINY

    import lstm_probe
    from lstm_probe import run
    from lstm_probe.log.reader import dataset, narrow
    from lstm_probe.report.html import ROLLOUT, STARTS, _distinct, _episode_spans, _length_counts

    res = run(env_id, f"{tmp_path}/d/", seed=0, part_iterations=1, **{**TINY, **opts})
    df = lstm_probe.load(tmp_path / "d", vectors=False)
    data, _ = dataset(tmp_path / "d")
    first = ds.field("layer") == 0
    roll = df[(df["layer"] == 0) & (df["phase"] == "rollout")]
    ints = lambda s: sorted(int(v) for v in s.dropna().unique())  # noqa: E731
    assert _distinct(data, ["iteration", "env"], first & ROLLOUT) == {
        "iteration": ints(roll["iteration"]),
        "env": ints(roll["env"]),
    }
    crossing = 0
    for env in ints(roll["env"]):
        mine = roll[roll["env"] == env]
        g = mine.groupby("episode")["episode_step"].agg(["min", "max"])
        expect = {int(e): (int(lo), int(hi)) for e, lo, hi in zip(g.index, g["min"], g["max"], strict=True)}
        assert _episode_spans(data, first & ROLLOUT & (ds.field("env") == env)) == expect
        crossing += int((mine.groupby("episode")["iteration"].nunique() > 1).sum())
    assert crossing > 0  # some episode spans two part files
    starts = df[(df["layer"] == 0) & (df["phase"] == "train") & (df["t"] == 0)]
    one = starts[starts["module"] == starts["module"].iloc[0]]
    counts = _length_counts(data, first & STARTS)
    assert {k: int(v) for k, v in enumerate(counts) if v} == {
        int(k): int(v) for k, v in one["seq_len"].value_counts().items()
    }
    assert res.completed and counts.sum() == len(one) > 6  # 6 iterations, several sequences each
    # narrow: only the row groups that can hold an episode (or env step range), the same rows as a whole scan
    whole = sum(f.num_row_groups for f in data.get_fragments())
    last = int(roll["episode"].max())
    cases = [({"env_step": (40, 70), "env": (0, 0)}, (ds.field("env_step") >= 40) & (ds.field("env_step") <= 70))]
    if env_id == "CartPole-v1":  # Pendulum's episodes (200 steps) outlast these runs: one episode per env
        cases.append(({"episode": (last, last)}, ds.field("episode") == last))
    for kw, filt in cases:
        part = narrow(data, **kw)
        kept = sum(f.num_row_groups for f in part.get_fragments())
        assert 0 < kept < whole, (kw, kept, whole)
        a, b = (d.to_table(columns=["call", "module", "layer", "t", "h"], filter=filt) for d in (part, data))
        assert a.num_rows > 0 and a.equals(b)


def test_long_episode_heat_map_reads_its_first_steps(page, tmp_path, monkeypatch):
    import lstm_probe.report.html as h

    _, _, result = page
    monkeypatch.setattr(h, "MAX_HEAT_EPISODE_STEPS", 40)
    p = build_html(result.path, tmp_path / "long.html", iteration=2, env=0)
    assert "Hidden and cell states" in p.figures
    assert any(n.startswith("heat-maps: the first 40 steps of the episode's 96") for n in p.notes), p.notes


@pytest.mark.parametrize("opts", [{"capture": "summary"}, {"every": 2}])
def test_heat_maps_where_the_log_has_vectors(runs_dir, tmp_path, opts):
    result = probed_run(runs_dir, "Pendulum-v1", n_envs=2, **opts)
    vectorless = "heat-maps: the log holds no state vectors for that episode (summary capture)"
    p = build_html(result.path, tmp_path / "s.html")  # the last iteration (2): every=2 keeps its vectors
    if opts.get("capture") == "summary":
        assert "Hidden and cell states" not in p.figures and vectorless in p.notes
    else:
        assert "Hidden and cell states" in p.figures and vectorless not in p.notes
    assert "Minibatch layout" in p.figures and "Norms over iterations" in p.figures


def test_the_page_carries_every_section_of_the_text_report(page):
    """Issue #48: the verdict and every titled block the text report shows (doctor, health, calls, ...) are on
    the page, in the same order, as is each line of the verdict."""
    import html as html_module

    from lstm_probe.report import Panel, Table, summarize

    _, out, result = page
    text = html_module.unescape(out.read_text())
    rep = summarize(result.path)
    titles = [b.title for blocks in rep.text() for b in blocks if isinstance(b, Panel | Table)]
    assert titles[0] == "Verdict" and "Doctor" in " ".join(titles) and "State health" in " ".join(titles)
    at = [text.index(f"<h2>{t}</h2>") for t in titles]
    assert at == sorted(at)
    for line in rep.verdict.lines:
        assert line in text


def test_page_words_and_markers(page):
    """sb3 pages: no max_seq_len marker (RLlib only); the heat-map's cut lines are said to be epoch 0's; the
    staleness figure says it is drawn on a log scale."""
    p, out, _ = page
    assert p.markers == ["episode start", "env boundary", "buffer split point", "minibatch cut"]
    text = out.read_text()
    assert "dotted: where epoch 0&#x27;s training sequences start" in text
    assert "(log scale: a drift of 0.001 next to 0.4 stays visible)" in text


def test_rllib_page_has_staleness_and_its_marker(tmp_path):
    from pathlib import Path

    p = build_html(Path(__file__).parent.parent / "sample_runs" / "cartpole-rllib", tmp_path / "r.html")
    assert "Staleness" in p.figures and "max_seq_len (8)" in p.markers
    text = (tmp_path / "r.html").read_text()
    assert (
        "Relative L2 drift ||s_train - s_rollout|| / ||s_rollout|| (s = h, c) of the learner&#x27;s states from the "
        "env runners&#x27; rollout states of the same env step, by minibatch of the update (h solid, c dashed; "
        "minibatch 0: before any optimizer step) (log scale" in text
    )


def test_staleness_caption_names_the_states_drawn(page):
    """The figure draws c (dashed) beside h where the report has c drift; the caption says so, and names h
    alone where it has none (GRU)."""
    import dataclasses

    from lstm_probe.report.html import _staleness_caption

    _, out, result = page
    assert (
        "Relative L2 drift ||s_train - s_rollout|| / ||s_rollout|| (s = h, c) of train states from the rollout "
        "states of the same env step, by epoch (h solid, c dashed) and by position in the sequence (h) (log scale"
    ) in out.read_text()
    rep = lstm_probe.summarize(result.path)
    assert any(r["drift_c_mean"] is not None for r in rep.staleness.by_epoch)
    no_c = [{**r, "drift_c_mean": None} for r in rep.staleness.by_epoch]
    rep.sections["staleness"] = dataclasses.replace(rep.staleness, by_epoch=no_c)
    assert _staleness_caption(rep).startswith(
        "Relative L2 drift ||h_train - h_rollout|| / ||h_rollout|| of train states from the rollout states of the "
        "same env step, by epoch (h solid) and by position"
    )


def test_gru_page(tmp_path):
    """A GRU log of the generic tracer (untagged training calls): hidden states only, no layout drawing."""
    import torch
    from torch import nn

    import lstm_probe

    m = nn.GRU(3, 8)
    with torch.no_grad(), lstm_probe.trace(m, tmp_path / "g.parquet") as probe:
        for t in range(5):
            with probe.tag(phase="rollout", iteration=0, env=[0, 1], env_step=t, episode=0, episode_step=t):
                m(torch.randn(1, 2, 3))
        with probe.tag(phase="train", iteration=0, epoch=0, minibatch=0):
            m(torch.randn(5, 2, 3))
    p = build_html(tmp_path / "g.parquet", tmp_path / "g.html")
    assert p.figures == ["Hidden states", "Sequence lengths vs episode lengths", "Norms over iterations"]
    assert "minibatch layout: the training calls carry no env and env_step tags" in p.notes and p.markers == []


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--html", "{tmp}/no/such/dir/r.html"], "cannot write --html {tmp}/no/such/dir/r.html: the directory "),
        (["--html", "{tmp}/r.html", "--env", "5"], "--env 5 is not in the log; it holds envs 0, 1"),
    ],
)
def test_cli_html_errors_are_one_line(page, tmp_path, args, needle):
    """A missing output directory and an env the log lacks: one line with the fix, exit 2, no traceback."""
    _, _, result = page
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "report", str(result.path), *(a.format(tmp=tmp_path) for a in args)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle.format(tmp=tmp_path) in lines[0], lines[0]
    assert not (tmp_path / "r.html").exists()


def test_an_own_loop_tagged_with_episode_start_alone_gets_its_page(tmp_path):
    """docs/own-loops.md's fewest tags (episode_start, no episode numbers): the page stopped on "cannot convert
    float NaN to integer" (the layout coloured each sequence by its episode). The layout's bars are uncoloured
    and a note says why; the CLI's line says the log has no episode numbers."""
    import numpy as np
    import torch
    from torch import nn

    torch.manual_seed(0)
    n, steps = 4, 16
    lstm = nn.LSTM(3, 8)
    state = (torch.zeros(1, n, 8), torch.zeros(1, n, 8))
    done, xs = np.zeros(n, bool), torch.randn(steps, n, 3)
    log = tmp_path / "own.parquet"
    with lstm_probe.trace(lstm, out=log) as probe, torch.no_grad():
        initial, dones = state, np.zeros((steps, n), bool)
        for t in range(steps):
            keep = torch.tensor(1.0 - done, dtype=torch.float32).view(1, n, 1)
            with probe.tag(phase="rollout", iteration=0, env=np.arange(n), env_step=t, episode_start=done):
                _, state = lstm(xs[t : t + 1], (keep * state[0], keep * state[1]))
            dones[t], done = done, np.arange(n) == t % n
        for mb, envs in enumerate([np.arange(0, n // 2), np.arange(n // 2, n)]):
            s = (initial[0][:, envs], initial[1][:, envs])
            tags = dict(env=envs, env_step=np.arange(steps)[None, :], episode_start=dones[:, envs].T)
            with probe.tag(phase="train", iteration=0, epoch=0, minibatch=mb, **tags):
                for t in range(steps):
                    keep = torch.tensor(1.0 - dones[t, envs], dtype=torch.float32).view(1, -1, 1)
                    _, s = lstm(xs[t : t + 1, envs], (keep * s[0], keep * s[1]))
    assert lstm_probe.load(log, vectors=False).episode.isna().all()
    page = tmp_path / "own.html"
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", "report", str(log), "--html", str(page)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "no episode numbers)" in r.stderr and "Traceback" not in r.stderr
    text = page.read_text()
    assert "Minibatch layout" in text and "bars uncoloured" in text
