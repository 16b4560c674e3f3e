"""What a wide run's log gives its reader (``--capture summary --trace-envs K``, the setting for hundreds of envs):
the traced envs' vectors wherever the report reads vectors (state health per unit, probes, heat maps), and a
page whose figures stay one page whatever the number of envs."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest

import lstm_probe
from lstm_probe.errors import BadInput
from lstm_probe.report.html import build_html
from lstm_probe.report.html_figures import MAX_LAYOUT_ENVS

RUN = dict(n_envs=4, steps=512, n_steps=64, batch_size=64, n_epochs=2, hidden_size=16, seed=0, torch_threads=1)


def test_summary_capture_reports_from_the_traced_envs_vectors(tmp_path):
    """The traced envs' vectors are the same bits in a summary log as in a full one (test_trace_envs.py), so
    every answer read from them is the same too: state health per unit, the probes, the CLI's probe table."""
    full = lstm_probe.run("Pendulum-v1", tmp_path / "full.parquet", trace_envs=2, capture_obs=True, **RUN)
    summ = lstm_probe.run(
        "Pendulum-v1", tmp_path / "summ.parquet", capture="summary", trace_envs=2, capture_obs=True, **RUN
    )
    a, b = lstm_probe.summarize(full.path).to_dict(), lstm_probe.summarize(summ.path).to_dict()
    layers = b["health"]["layers"]
    assert layers == a["health"]["layers"] and {"dead_units", "constant_units", "saturated_share"} <= set(layers[0])
    assert [(row["rows"], row["vector_rows"]) for row in layers] == [(512, 256), (512, 256)]  # 2 of 4 envs traced
    assert b["probes"] is not None and b["probes"]["rows"] == a["probes"]["rows"] and b["probes"]["rows"]
    assert not any("stores no h" in line for line in b["unavailable"])
    # pair: the traced envs' rows (only they hold vectors), the same in both logs
    pa_, pb = lstm_probe.pair(full.path), lstm_probe.pair(summ.path)
    assert len(pb) and set(pb["env"]) == {0, 1} and pb["drift_h"].notna().all() and pb["drift_c"].notna().all()
    assert pa_.equals(pb)
    text = subprocess.run(
        [sys.executable, "-m", "lstm_probe.cli", "report", str(summ.path)], capture_output=True, text=True
    )
    words = " ".join(text.stdout.split())
    assert "saturated, dead and constant units: from the rows that hold vectors (actor layer 0: 256, critic" in words
    cmd = [sys.executable, "-m", "lstm_probe.cli", "probe", str(summ.path), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    same = subprocess.run([*cmd[:4], str(full.path), "--json"], capture_output=True, text=True)
    assert r.stdout == same.stdout.replace(str(full.path), str(summ.path))
    # without traced envs a summary log has no vectors, and says so in one line
    bare = lstm_probe.run("Pendulum-v1", tmp_path / "bare.parquet", capture="summary", capture_obs=True, **RUN)
    r = subprocess.run([*cmd[:4], str(bare.path)], capture_output=True, text=True)
    assert r.returncode == 2 and "--trace-envs K keeps the vectors" in r.stderr and "Traceback" not in r.stderr
    # and pair, which recomputes drift from the vectors, says so rather than calling every drift 0
    with pytest.raises(BadInput, match="pair recomputes drift from the h and c vectors"):
        lstm_probe.pair(bare.path)


def _png_height(page_text: str, alt: str) -> int:
    import base64
    import re

    data = re.search(rf"<img alt='{alt}' src='data:image/png;base64,([A-Za-z0-9+/=]+)'>", page_text)
    assert data is not None
    return int(struct.unpack(">I", base64.b64decode(data.group(1))[20:24])[0])


def test_the_minibatch_layout_draws_the_first_envs_of_a_wide_run(tmp_path, monkeypatch):
    """One row per env and epoch: a 1,024-env run drawn whole was a figure 200,000 pixels tall (35 s and 2 GB
    of matplotlib for one page). The layout draws the first MAX_LAYOUT_ENVS envs and says so."""
    from lstm_probe.report import html_figures

    n = MAX_LAYOUT_ENVS + 4
    run = lstm_probe.run(
        "Pendulum-v1",
        tmp_path / "wide.parquet",
        n_envs=n,
        steps=n * 16,
        n_steps=16,
        batch_size=64,
        n_epochs=1,
        hidden_size=8,
        capture="summary",
        trace_envs=2,
        seed=0,
        torch_threads=1,
    )
    page = build_html(run.path, tmp_path / "wide.html")
    assert f"minibatch layout: envs 0-{MAX_LAYOUT_ENVS - 1} of {n} drawn" in page.notes
    assert "Minibatch layout" in page.figures and "Hidden and cell states" in page.figures  # env 0 is traced
    capped = _png_height((tmp_path / "wide.html").read_text(), "Minibatch layout")
    monkeypatch.setattr(html_figures, "MAX_LAYOUT_ENVS", n)
    page = build_html(run.path, tmp_path / "whole.html")
    assert not any(note.startswith("minibatch layout: envs") for note in page.notes)
    whole = _png_height((tmp_path / "whole.html").read_text(), "Minibatch layout")
    assert whole - capped > 0.8 * 4 * 0.45 * 90  # four env rows of 0.45 inch at 90 dpi fewer


def test_pair_and_the_report_read_any_trace_envs_a_log_states(tmp_path):
    """``trace_envs`` comes from the log's metadata, which a file may hold anything in: past any env the log can
    hold (int32), or not a count at all (a bool, 0, negative, a float): pair() pairs every env, with no traceback
    and without allocating an env list of that length; not a count, the log reads as a summary log without traced
    envs, which pair() refuses in one line."""
    import json

    import pyarrow.parquet as pq

    summ = lstm_probe.run("Pendulum-v1", tmp_path / "summ.parquet", capture="summary", trace_envs=2, **RUN)
    table = pq.read_table(summ.path)
    every = lstm_probe.pair(summ.path)  # envs 0 and 1
    for k, vectors in ((10**12, True), (2**70, True), (True, False), (0, False), (-3, False), (2.0, False)):
        meta = dict(table.schema.metadata)
        run = json.loads(meta[b"lstm_probe.run"])
        run["capture"] = dict(run["capture"], trace_envs=k)
        meta[b"lstm_probe.run"] = json.dumps(run).encode()
        path = tmp_path / "k.parquet"
        pq.write_table(table.replace_schema_metadata(meta), path)
        if not vectors:
            with pytest.raises(BadInput, match="pair recomputes drift"):
                lstm_probe.pair(path)
        else:  # every env traced: all envs' rows (envs 2 and 3 hold no vectors to recompute drift from)
            paired = lstm_probe.pair(path)
            assert set(paired["env"]) == {0, 1, 2, 3} and paired["drift_h"].isna().sum() == len(paired) - len(every)
        assert lstm_probe.summarize(path).health.vectors_available == vectors


@pytest.fixture(scope="module")
def traced_one(tmp_path_factory):
    """A summary log of 16 envs at LSTM 256 that keeps env 0's vectors (and the rollout rows' obs)."""
    run = dict(RUN, hidden_size=256, n_envs=16, steps=16 * 64 * 2, capture_obs=True)
    out = tmp_path_factory.mktemp("traced") / "summ.parquet"
    return lstm_probe.run("Pendulum-v1", out, capture="summary", trace_envs=1, **run).path


def test_a_summary_log_whose_traced_vectors_do_not_fit_the_budget_is_still_reported(traced_one):
    """A --trace-envs log's row groups hold up to 65,536 rows whatever the width, and a null vector takes its full
    width once read: state health per unit reads every rollout row's h, 2 GiB at hidden 1,024 (over the default
    budget). A summary log was reported before it read vectors at all; where that read does not fit the budget,
    it still is (norms and NaN/inf rows), and the report says why the per-unit health is missing."""
    import pyarrow.dataset as ds

    from lstm_probe.log import budget
    from lstm_probe.log.reader import dataset

    path = traced_one
    rollout = budget.prune(dataset(path)[0], ds.field("phase") == "rollout")
    need = budget.DECODE * sum(sorted(budget.row_groups(rollout, ["h"]), reverse=True)[: budget.HELD])
    assert lstm_probe.summarize(path).health.vectors_available
    try:
        lstm_probe.set_max_memory(max(need // 2, 1 << 20))
        report = lstm_probe.summarize(path)
    finally:
        lstm_probe.set_max_memory(None)
    h = report.health
    assert not h.vectors_available and h.layers and all("dead_units" not in layer for layer in h.layers)
    (line,) = [u for u in report.unavailable if u.startswith("state health per unit")]
    assert "memory budget" in line and "--max-memory" in line
    # the probes read the same vectors: left out too, and said why
    assert report.probes is None or not report.probes.rows
    (line,) = [u for u in report.unavailable if u.startswith("linear probes")]
    assert "memory budget" in line and "--max-memory" in line
    # the page: its heat maps read one episode's rows (here, one row group at its full width, over the budget
    # too): left out, and its note says why (it said "summary capture", which this log is not without vectors)
    try:
        lstm_probe.set_max_memory(max(need // 2, 1 << 20))
        page = build_html(path, path.with_suffix(".html"), report=report)
    finally:
        lstm_probe.set_max_memory(None)
    assert page.env == 0 and "Hidden and cell states" not in path.with_suffix(".html").read_text()
    over = "heat-maps: reading the episode's state vectors would go over the memory budget (--max-memory)"
    assert [note for note in page.notes if "heat-maps" in note] == [over]
    # within the budget, drawn from the traced env's vectors
    page = build_html(path, path.with_suffix(".html"), report=report)
    assert "Hidden and cell states" in path.with_suffix(".html").read_text()
    assert not any("heat-maps" in note for note in page.notes), page.notes
    # an env --trace-envs did not keep: the note says so
    page = build_html(path, path.with_suffix(".html"), env=3, report=report)
    assert "heat-maps: env 3's rows hold no state vectors (--trace-envs keeps env 0's)" in page.notes


def test_load_of_a_wide_log_holds_its_stored_vectors_alone(traced_one):
    """A null vector takes its full width once Arrow reads it, so ``load`` of a 1,024-env ``--trace-envs 16``
    log was refused (3.8 GiB for ~30 MB of vectors). Vector columns that most rows leave null are read
    compacted: the same DataFrame as pyarrow's own read, value for value and bit for bit, within a budget
    the full-width read is refused at."""
    import numpy as np
    import pyarrow.parquet as pq

    from lstm_probe.errors import BadLog
    from lstm_probe.log import budget
    from lstm_probe.log.reader import VECTORS, dataset

    path = traced_one
    whole = pq.read_table(path).to_pandas()
    df = lstm_probe.load(path)
    assert list(df.columns) == list(whole.columns) and len(df) == len(whole)
    for name in ("h", "c", "obs"):
        ours, theirs = df[name].to_numpy(), whole[name].to_numpy()
        assert [v is None for v in ours] == [v is None for v in theirs], name
        assert all(
            np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(ours, theirs, strict=True) if a is not None
        )
    assert (df["h"].notna() == (df["env"] == 0)).all() and 0 < df["h"].notna().sum() < len(df) / 8
    assert (df["obs"].notna() == (df["phase"] == "rollout")).all()
    scalars = [c for c in df.columns if c not in VECTORS]
    assert df[scalars].equals(lstm_probe.load(path, vectors=False)[scalars])
    # filtered: the same rows as the whole read's
    train = lstm_probe.load(path, phase="train", env=[0, 3], columns=["call", "env", "h"])
    rows = whole[(whole["phase"] == "train") & whole["env"].isin([0, 3])]
    assert train["call"].tolist() == rows["call"].tolist()
    assert all((a is None and b is None) or np.array_equal(a, b) for a, b in zip(train["h"], rows["h"], strict=True))
    # states() of an env --trace-envs did not keep: NaN rows as wide as the log's hidden size (it was (rows, 0))
    untraced = lstm_probe.states(lstm_probe.load(path, env=3), "h")
    assert untraced.shape == ((df["env"] == 3).sum(), 256) and np.isnan(untraced).all()
    # within a budget the full-width read does not fit
    data = dataset(path)[0]
    columns = list(df.columns)
    sizes = budget.row_groups(data, columns)
    full = budget.DECODE * sum(sizes) + sum(sorted(sizes, reverse=True)[: budget.HELD])  # check_filtered's count
    try:
        lstm_probe.set_max_memory(full - 1)
        with pytest.raises(BadLog, match="memory budget"):
            budget.check_filtered(data, columns, None, "the full-width read")
        assert len(lstm_probe.load(path)) == len(df)
        lstm_probe.set_max_memory(1 << 20)
        with pytest.raises(BadLog, match="memory budget"):
            lstm_probe.load(path)
    finally:
        lstm_probe.set_max_memory(None)


def _strict_json(text: str) -> dict:
    """The report's JSON, refusing NaN and Infinity (not JSON)."""
    import json

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the JSON")

    return json.loads(text, parse_constant=refuse)


def _orders(rows: list[dict]) -> dict[tuple[str, int], list[int]]:
    """Per (module, layer): the by_update rows' orders, in the report's order."""
    out: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        out.setdefault((r["module"], r["layer"]), []).append(r["update"])
    return out


def test_sb3_other_envs_none_keeps_the_staleness_section_and_says_why_no_provenance_check(tmp_path):
    """sb3-contrib's recurrent buffer keeps each env's steps together and only rolls them by a random split index,
    so --trace-envs 2 --other-envs none leaves envs 0 and 1 in one minibatch of each epoch; with this seed never in
    minibatch 0 of epoch 0, the only one before any optimizer step. The staleness table is shown all the same,
    the provenance check says why it was not made (not a wrong 'tag the train calls'), the minibatch orders are
    their true positions (epoch x 4 + minibatch: gaps, not renumbered from 0), and a line says which
    minibatches the drifts come from. The same run with --other-envs summary checks every env."""
    import json

    run = dict(RUN, n_envs=64, steps=2048, n_steps=16, batch_size=256, hidden_size=8, capture="summary", trace_envs=2)
    none = lstm_probe.run("Pendulum-v1", tmp_path / "none.parquet", other_envs="none", **run)
    train = lstm_probe.load(none.path, phase="train", vectors=False)
    train = train[~train["padding"] & train["drift_h"].notna()]
    assert set(train["env"]) == {0, 1} and not ((train["epoch"] == 0) & (train["minibatch"] == 0)).any()
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe.cli", "report", str(none.path)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    words = " ".join(r.stdout.replace("│", " ").split())
    assert "5. Staleness" in words and "tag the train calls" not in words
    assert (
        "provenance check (first minibatch of epoch 0, before any optimizer step): not made: envs 0..1, the " in words
    )
    assert "were in no update's first minibatch" in words and "--other-envs summary keeps every env's rows" in words
    assert "by minibatch order in an iteration (epoch x 4 + minibatch; 0 = before any optimizer step)" in words
    j = subprocess.run(
        [sys.executable, "-m", "lstm_probe.cli", "report", str(none.path), "--json"], capture_output=True, text=True
    )
    assert j.returncode == 0, j.stderr
    rep = _strict_json(j.stdout)
    st = rep["staleness"]
    assert st["provenance_ok"] is None and st["by_epoch"] and st["minibatches_per_epoch"] == 4
    assert "were in no update's first minibatch" in st["provenance_note"]
    # the reason shows once, in the staleness section; "not in this log" points to it
    assert [u for u in rep["unavailable"] if "provenance" in u] == [
        "the provenance check: not made (the staleness section says why)"
    ]
    assert words.count(" ".join(st["provenance_note"].split())) == 1
    assert "not in this log: the provenance check: not made (the staleness section says why)" in words
    # the order of each minibatch is its true position in the iteration, with its rows
    order = train["epoch"].astype(int) * 4 + train["minibatch"].astype(int)
    counts = train.groupby([train["module"].astype(str), "layer", order]).size().to_dict()
    assert {(b["module"], b["layer"], b["update"]): b["rows"] for b in st["by_update"]} == counts
    assert all(b["update"] == b["epoch"] * 4 + b["minibatch"] for b in st["by_update"])
    assert 0 not in {b["update"] for b in st["by_update"]}  # no row of minibatch 0 of epoch 0: no order 0
    assert st["drift_minibatches"] == sorted(set(train["minibatch"].astype(int)))
    assert (
        "keeps the rows of envs 0..1 alone (--trace-envs 2 --other-envs none): these drifts come from"
        in (st["drift_from"])
    )
    assert " ".join(st["drift_from"].split()) in words
    # --other-envs summary: every env's drift, the check made and passed; the same orders where both have rows
    summ = lstm_probe.summarize(lstm_probe.run("Pendulum-v1", tmp_path / "summ.parquet", **run).path)
    assert summ.staleness.provenance_ok is True and summ.staleness.drift_from is None
    assert summ.staleness.provenance_note is None
    every = _orders(summ.staleness.by_update)
    assert all(v == list(range(8)) for v in every.values())
    assert all(set(v) <= set(every[k]) for k, v in _orders(st["by_update"]).items())
    json.dumps(summ.to_dict(), allow_nan=False)


def _none_staleness(out, env_id: str, framework: str, *sizes: str) -> dict:
    """``lstm-probe run ENV_ID --framework FRAMEWORK SIZES`` at hidden 8 with ``--capture summary --trace-envs 2
    --other-envs none`` into ``out``, then its report's staleness section, read as strict JSON."""
    cmd = [sys.executable, "-m", "lstm_probe", "run", env_id, "--framework", framework, *sizes, "--hidden-size", "8"]
    cmd += ["--capture", "summary", "--trace-envs", "2", "--other-envs", "none", "--out", str(out)]
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    made = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert made.returncode == 0, made.stderr
    j = subprocess.run([sys.executable, "-m", "lstm_probe.cli", "report", str(out), "--json"], capture_output=True)
    assert j.returncode == 0, j.stderr
    return _strict_json(j.stdout.decode())["staleness"]


def test_rsl_rl_other_envs_none_orders_minibatches_by_their_position_and_says_whose_drift(tmp_path):
    """rsl_rl gives envs 0..K-1 to minibatch 0 of every epoch: a --other-envs none log's drifts are minibatch 0's
    alone (epoch 0's: before any optimizer step, so 0), and the report says so in text and JSON. Its minibatch
    orders are epoch x num_mini_batches (0, 4, 8, ...), not 0, 1, 2 as if each were the next minibatch."""
    pytest.importorskip("rsl_rl")
    out = tmp_path / "none.parquet"
    st = _none_staleness(out, "Pendulum-v1", "rsl_rl", "--torch-env", "--n-envs", "16", "--steps", "768")
    per_epoch = lstm_probe.read_info(out).metadata["hyperparameters"]["num_mini_batches"]
    epochs = lstm_probe.read_info(out).metadata["hyperparameters"]["num_learning_epochs"]
    orders = [per_epoch * e for e in range(epochs)]
    assert per_epoch > 1 and _orders(st["by_update"]) == {("actor", 0): orders, ("critic", 0): orders}
    assert st["minibatches_per_epoch"] == per_epoch and st["provenance_ok"] is True
    assert st["drift_minibatches"] == [0]
    assert f"these drifts come from minibatch 0 (of {per_epoch}) of each epoch only" in st["drift_from"]
    r = subprocess.run([sys.executable, "-m", "lstm_probe.cli", "report", str(out)], capture_output=True, text=True)
    words = " ".join(r.stdout.replace("│", " ").split())
    assert " ".join(st["drift_from"].split()) in words
    assert f"0 = before any optimizer step): 0: 0, {per_epoch}: " in words


def test_torchrl_other_envs_none_trains_every_minibatch_on_the_kept_envs(tmp_path):
    """TorchRL's run trains each collector batch whole: one minibatch an epoch, which holds every env, kept or
    not. A --other-envs none log's drifts are then every minibatch's, and no line says they come from some only;
    the epochs of the staleness table are integers in the JSON, as by_update's are (they read 0.0)."""
    pytest.importorskip("torchrl")
    st = _none_staleness(
        tmp_path / "none.parquet", "CartPole-v1", "torchrl", "--n-envs", "4", "--n-steps", "16", "--steps", "128"
    )
    assert st["minibatches_per_epoch"] == 1 and st["by_epoch"] and st["drift_from"] is None
    assert all(type(row["epoch"]) is int for row in st["by_epoch"])
