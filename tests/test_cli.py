"""The command line as a user runs it: real subprocesses, real files."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ROOT_DIR = Path(__file__).resolve().parents[1]


def cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "lstm_probe", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=ENV,
        timeout=300,
    )


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    r = cli(
        "run",
        "CartPole-v1",
        "--steps",
        "64",
        "--n-steps",
        "32",
        "--batch-size",
        "16",
        "--n-epochs",
        "2",
        "--hidden-size",
        "8",
        "--torch-threads",
        "1",
        "--progress-seconds",
        "0.05",
        cwd=d,
    )
    assert r.returncode == 0, r.stderr
    return d, r


def test_run_writes_log_and_says_where(made):
    d, r = made
    assert "wrote run.parquet" in r.stdout and "next: lstm-probe report run.parquet" in r.stdout
    df = pd.read_parquet(d / "run.parquet")
    assert len(df) > 0 and set(df.phase) >= {"rollout", "train"}


def test_report_text_and_json(made):
    d, _ = made
    r = cli("report", "run.parquet", cwd=d)
    assert r.returncode == 0, r.stderr
    for title in (
        "1. Run",
        "2. Architecture",
        "3. Calls",
        "4. Sequences",
        "5. Staleness",
        "6. State health",
        "7. Doctor",
        "8. Findings",
        "provenance check",
        "by minibatch order in an iteration (epoch x ",
        "0 = before any optimizer step): 0: ",
        "probe cost: ",
        "CPU on the writer process",  # the default writer
    ):
        assert title in r.stdout
    j = cli("report", "run.parquet", "--json", cwd=d)
    assert j.returncode == 0
    rep = json.loads(j.stdout)
    assert list(rep) == [
        "path",
        "schema_version",
        "warnings",
        "verdict",
        "run",
        "architecture",
        "calls",
        "sequences",
        "staleness",
        "health",
        "doctor",
        "findings",
        "unavailable",
        "returns",
        "cross_process",
        "memory",
        "probes",
        "what_if",
    ]
    assert rep["cross_process"] is None  # RLlib logs only
    assert rep["returns"]["source"] == "monitor" and rep["returns"]["episodes"] > 0  # sb3's Monitor episodes
    assert rep["run"]["env_id"] == "CartPole-v1" and rep["run"]["completed"] is True
    assert rep["staleness"]["provenance_ok"] is True


def test_schema_command_matches_docs():
    r = cli("schema", "--markdown")
    assert r.returncode == 0
    docs = open(os.path.join(os.path.dirname(__file__), "..", "docs", "schema.md")).read()
    assert r.stdout == docs, "docs/schema.md is stale: regenerate it with `lstm-probe schema --markdown`"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "Pendulumm-v1"], "unknown env id 'Pendulumm-v1': did you mean Pendulum-v1"),
        (["run", "Pendulum-v1", "--steps", "0"], "--steps must be >= 1"),
        (["run", "Pendulum-v1", "--steps", "ten"], "Invalid value for '--steps'"),
        (["run", "Pendulum-v1", "--hyperparam", "gama=0.9"], "did you mean gamma"),
        (["run", "Pendulum-v1", "--hyperparam", "gamma"], "is not KEY=VALUE"),
        (["run", "Pendulum-v1", "--out", "/proc/nope/run.parquet"], "not writable"),
        (["run", "Pendulum-v1", "--capture", "most"], "--capture must be full or summary"),
        (["run", "Pendulum-v1", "--part-iterations", "2"], "it needs a directory --out, e.g. --out run/"),
        (["report", "missing.parquet"], "does not exist"),
        (["report", "notparquet.txt"], "not a readable Parquet file"),
        (["report", "foreign.parquet"], "not an lstm-probe log"),
        (["bogus"], "No such command"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path, args, needle):
    (tmp_path / "notparquet.txt").write_text("hello")
    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "foreign.parquet")
    r = cli(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle in lines[0] and "Traceback" not in r.stderr


def test_existing_output_needs_force(made):
    d, _ = made
    r = cli("run", "CartPole-v1", "--steps", "8", cwd=d)
    assert r.returncode == 2 and "already exists; pass --force" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_an_existing_directory_with_other_files_is_refused(tmp_path):
    """`--out DIR` (with or without the trailing slash, even with --force) where DIR holds files that are not a log's
    wrote the log's part files among them: refused in one line, nothing written; a directory holding a log's own
    files alone is refused as a log ("already holds a log")."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "notes.txt").write_text("mine")
    for out in (["results"], ["results/"], ["results", "--force"]):
        r = cli("run", "CartPole-v1", "--steps", "8", "--n-steps", "8", "--out", *out, cwd=tmp_path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (out, r.stderr)
        assert "results/ holds files that are not a log's (notes.txt); name a new or empty directory" in lines[0]
        assert sorted(p.name for p in results.iterdir()) == ["notes.txt"] and not list(tmp_path.glob("*.model.*"))
    log = tmp_path / "log"
    log.mkdir()
    for name in ("part-00000.parquet", "part-runner1-00002.parquet", ".part-learner0-00001.parquet.tmp"):
        (log / name).write_bytes(b"")
    (log / ".lstm-probe.lock").write_bytes(b"")
    r = cli("run", "CartPole-v1", "--steps", "8", "--n-steps", "8", "--out", "log", cwd=tmp_path)
    assert r.returncode == 2 and "log/ already holds a log; pass --force" in r.stderr, r.stderr


def test_traceback_flag_shows_traceback(tmp_path):
    r = cli("report", "missing.parquet", "--traceback", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_env_with_unsupported_spaces(tmp_path):
    # gymnasium's Blackjack has a Tuple observation space, which RecurrentPPO cannot take
    r = cli("run", "Blackjack-v1", "--steps", "8", cwd=tmp_path)
    assert r.returncode == 2 and "cannot take Tuple observations" in r.stderr
    assert not (tmp_path / "run.parquet").exists()


def test_report_of_the_rllib_sample_needs_no_ray(tmp_path):
    """The RLlib sample log (one part file per process) is read as one log, cross-process check included."""
    r = cli("report", str(ROOT_DIR / "sample_runs" / "cartpole-rllib"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "provenance check (RLlib, across processes)" in r.stdout and "max |diff| 0 OK" in r.stdout
    assert "5. Staleness (RLlib)" in r.stdout and "RLlib oracle:" in r.stdout
    j = json.loads(cli("report", str(ROOT_DIR / "sample_runs" / "cartpole-rllib"), "--json", cwd=tmp_path).stdout)
    assert j["run"]["framework"] == "rllib" and j["cross_process"]["state_in_ok"] is True
    assert j["architecture"]["shared_lstm"] is False


def test_run_prints_plain_progress_lines_off_a_terminal(made):
    _, r = made
    lines = [line for line in r.stdout.splitlines() if line.startswith("training CartPole-v1: ")]
    assert lines, r.stdout
    for word in ("/64 env steps", "steps/s", "iteration ", " rows", "on disk", "elapsed"):
        assert word in lines[-1], lines[-1]


def test_progress_display_terminal_quiet_and_eta():
    import io

    from rich.console import Console

    from lstm_probe.cli.app import _RunDisplay

    def shown(quiet, terminal):
        buf = io.StringIO()
        console = Console(file=buf, force_terminal=terminal, width=200)
        live = lambda: {"iteration": 3, "rows": 12345}  # noqa: E731
        with _RunDisplay("Pendulum-v1", 100, "nowhere.parquet", live, quiet, 0.0, console) as d:
            d.start -= 10.0  # 10 s in, a refresh due
            d.due = 0.0
            d.update(50, 100)
            if d.bar is not None:
                d.bar.refresh()
        return buf.getvalue()

    plain = shown(False, False)
    assert "50/100 env steps, 5 steps/s, iteration 3, 12,345 rows, 0 B on disk, ETA 0:10" in plain
    assert "12,345 rows" in shown(False, True) and "ETA 0:10" in shown(False, True)
    assert shown(True, False) == "" and shown(True, True) == ""


def test_bad_options_are_refused_before_torch_loads():
    code = (
        "import sys\nfrom lstm_probe.cli.app import main\n"
        "try:\n    main(['run', 'Pendulum-v1', '--steps', '0'])\n"
        "except SystemExit as e:\n    print(e.code, sorted(m for m in ('torch', 'stable_baselines3', 'gymnasium') "
        "if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.stdout.strip() == "2 []", (r.stdout, r.stderr)
    assert "--steps must be >= 1" in r.stderr


def test_version():
    from lstm_probe import __version__

    r = cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"lstm-probe {__version__}"


def test_a_bare_command_prints_the_help():
    """`lstm-probe` alone: the help a newcomer asked for, as `--help` prints it (not an error line of
    escaped newlines)."""
    r = cli()
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout == cli("--help").stdout and r.stdout.startswith("Usage: lstm-probe [OPTIONS] COMMAND")


@pytest.mark.parametrize("command", ["run", "report", "arch", "schema"])
def test_help_shows_every_default_and_extra(command):
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", command, "--help"],
        capture_output=True,
        text=True,
        env={**ENV, "COLUMNS": "100"},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    entries = re.split(r"\n(?=  -)", r.stdout.split("Options:", 1)[1])
    for entry in entries:
        if not entry.strip() or entry.strip().startswith("--help"):
            continue
        assert "[default:" in entry, entry
    text = " ".join(r.stdout.split())
    if command == "run":
        assert "'.[rllib]'" in text
        # each framework's own default, named (rsl_rl's 64-unit RNN read as "256" for every framework)
        assert "LSTM hidden size. [default: sb3 and rllib 256, rsl_rl 64, torchrl 32]" in text
        assert "Rollout length per env. [default: the framework's: sb3, torchrl and rllib 128, rsl_rl 24]" in text
        assert "--torch-threads" in text and "sb3 on CPU: 1" in text
        # a flag every framework takes names none; one some take names them
        assert "--what-if Do stale stored states matter?" in text and "--info <list[str]> sb3: Store info" in text
    if command == "report":
        assert "the extra html, pip install '.[html]'" in text
    # the usage names the argument as the summary line and README do (ENV_ID, not env_id)
    usage = {"run": "{ENV_ID}", "report": "{PATH}", "arch": "{TARGET}", "schema": "[OPTIONS]"}[command]
    assert r.stdout.splitlines()[0] == f"Usage: lstm-probe {command} [OPTIONS]" + (f" {usage}" if "{" in usage else "")
    if command == "arch":  # a flag only some frameworks' arch takes says which, as run's do
        assert "--rnn-type <str> rsl_rl, torchrl: lstm or gru" in text
        assert "--hyperparam <list[str]> sb3: KEY=VALUE" in text and "sb3: Give the critic its own LSTM." in text


def test_one_torch_thread_by_default_on_cpu(monkeypatch):
    from lstm_probe.integrations.sb3 import commands
    from lstm_probe.integrations.sb3 import run as training

    assert os.environ.get("OMP_NUM_THREADS") == "1"  # conftest, before torch: pytest alone behaves as CI
    import torch

    assert torch.get_num_threads() == 1
    assert commands.default_threads("CartPole-v1", "cpu") == 1
    assert commands.default_threads("CartPole-v1", "cuda") is None
    seen = {}
    monkeypatch.setattr(training, "run", lambda env_id, **kw: seen.update(kw))
    commands.run("CartPole-v1", device="cpu")
    assert seen["train"].torch_threads == 1
    commands.run("CartPole-v1", device="cpu", torch_threads=2)
    assert seen["train"].torch_threads == 2


def test_arch_refuses_a_non_recurrent_model_in_one_line(tmp_path):
    from stable_baselines3 import PPO

    PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=16).save(tmp_path / "ppo.zip")
    for extra in ([], ["--trust-model"]):
        r = cli("arch", "ppo.zip", *extra, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "ActorCriticPolicy" in lines[0] and "no LSTM" in lines[0], r.stderr
        assert "RecurrentPPO" in lines[0] and "lstm_actor" not in lines[0] and "--trust-model" not in lines[0]


def test_arch_at_80_columns_shows_every_column(tmp_path):
    args = ["arch", "CartPole-v1", "--hidden-size", "8"]
    j = json.loads(cli(*args, "--json", cwd=tmp_path).stdout)
    r = subprocess.run(
        [sys.executable, "-m", "lstm_probe", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**ENV, "COLUMNS": "80"},
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    for header in ("parameter", "shape", "actor", "critic", "policy loss", "value loss", "entropy", "trained by"):
        assert header in r.stdout
    lines = r.stdout.splitlines()
    for p in j["params"]:
        line = next(x for x in lines if f" {p['name']} " in x)
        for value in ("x".join(map(str, p["shape"])), p["policy_loss"], p["value_loss"], p["trained_by"]):
            assert str(value) in line, (value, line)


def test_report_hint_fits_the_file(tmp_path):
    (tmp_path / "runs.csv").write_text("a,b\n1,2\n")
    r = cli("report", "runs.csv", cwd=tmp_path)
    assert r.returncode == 2 and "partial" not in r.stderr and "Parquet logs" in r.stderr, r.stderr
    (tmp_path / "run.parquet").write_text("not parquet")
    (tmp_path / "run.parquet.partial").mkdir()
    r = cli("report", "run.parquet", cwd=tmp_path)
    assert r.returncode == 2 and "run.parquet.partial/" in r.stderr, r.stderr


def test_probe_beside_progress_bar_and_tensorboard(tmp_path):
    """SB3's progress_bar=True and a ProbeCallback together: training completes, the log is complete, and the
    probe's per-iteration figures reach TensorBoard through SB3's logger (read back with TensorBoard's reader)."""
    from sb3_contrib import RecurrentPPO
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lstm_probe import ProbeCallback, read_info

    model = RecurrentPPO(
        "MlpLstmPolicy",
        "CartPole-v1",
        n_steps=32,
        batch_size=16,
        n_epochs=2,
        seed=0,
        policy_kwargs={"lstm_hidden_size": 8},
        tensorboard_log=str(tmp_path / "tb"),
    )
    with ProbeCallback(tmp_path / "run.parquet") as probe:
        model.learn(32 * 4, callback=probe, progress_bar=True)
    info = read_info(tmp_path / "run.parquet")
    assert info.metadata["completed"] is True and info.rows > 0
    (run_dir,) = (tmp_path / "tb").iterdir()
    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for module in ("actor", "critic"):
        for figure in ("drift_first_epoch", "drift_last_epoch", "h_norm", "c_norm", "saturation"):
            assert f"lstm_probe/{module}_{figure}" in tags, sorted(tags)
    for figure in ("padding_share", "sequences_per_minibatch", "stepwise_share"):
        assert f"lstm_probe/{figure}" in tags
    # the first epoch's drift is the log's own (train rows against the rollout rows of the same env step)
    df = pd.read_parquet(tmp_path / "run.parquet")
    train = df[(df.phase == "train") & df.drift_h.notna() & (df.module == "actor") & (df.epoch == 0)]
    logged = {s.step: s.value for s in events.Scalars("lstm_probe/actor_drift_first_epoch")}
    assert len(logged) == 3  # iterations 0-2: each dumped after the next rollout (the last one never is, as sb3's)
    by_iteration = train.groupby("iteration").drift_h.mean()
    for it, step in enumerate(sorted(logged)):
        assert logged[step] == pytest.approx(by_iteration[it], rel=1e-3)
    padding = df[(df.phase == "train") & (df.module == "actor")].groupby("iteration").padding.mean()
    shares = [s.value for s in events.Scalars("lstm_probe/padding_share")]
    assert shares == pytest.approx(list(padding[:3]), rel=1e-6)


# What each command loads: a read command runs on a machine without torch or a framework, and starts in a
# fraction of a second (benchmarks/startup.py measures it). sys.modules is read when the command is done.
AUDIT = """
import json, sys
from lstm_probe.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = ("torch", "stable_baselines3", "sb3_contrib", "gymnasium", "ray", "pandas", "rich", "matplotlib")
print("loaded: " + json.dumps(sorted(m for m in heavy if m in sys.modules)), file=sys.stderr)
"""
FRAMEWORK_MODULES = {"torch", "stable_baselines3", "sb3_contrib", "gymnasium", "ray"}
SAMPLES = ROOT_DIR / "sample_runs"


def loaded_by(*args, cwd=None):
    """The heavy modules ``lstm-probe ARGS`` imported (its exit code must be 0)."""
    r = subprocess.run(
        [sys.executable, "-c", AUDIT, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=300
    )
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("loaded: ") and "error" not in r.stderr, r.stderr
    return set(json.loads(last.removeprefix("loaded: ")))


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["report", "--help"],
        ["report", SAMPLES / "pendulum-1env.parquet", "--json"],
        ["report", SAMPLES / "cartpole-4env.parquet", "--json"],
        ["report", SAMPLES / "cartpole-rllib", "--json"],
    ],
    ids=lambda a: " ".join(str(x).rpartition("/")[2] for x in a),
)
def test_read_commands_load_no_framework_and_no_rich(tmp_path, args):
    assert loaded_by(*args, cwd=tmp_path) & (FRAMEWORK_MODULES | {"rich", "matplotlib"}) == set()


@pytest.mark.parametrize("log", ["pendulum-1env.parquet", "cartpole-4env.parquet", "cartpole-rllib"])
def test_report_loads_no_pandas(tmp_path, log):
    """pandas is most of a small log's report start-up; text and JSON reports need none."""
    assert loaded_by("report", SAMPLES / log, cwd=tmp_path) & (FRAMEWORK_MODULES | {"pandas"}) == set()
    assert loaded_by("report", SAMPLES / log, "--json", cwd=tmp_path) & (FRAMEWORK_MODULES | {"pandas"}) == set()


def test_report_of_a_log_with_probe_targets_loads_no_pandas(tmp_path):
    """Observations and info values in the rollout rows: the report's Linear probes section fits its probes in
    numpy (probes.probe_rows), text and JSON alike."""
    r = cli(
        "run", "CartPole-v1", "--steps", "64", "--n-steps", "32", "--batch-size", "32", "--n-epochs", "1",
        "--hidden-size", "8", "--torch-threads", "1", "--capture-obs", "--info", "absent", "-q", "-o", "obs.parquet",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    log = tmp_path / "obs.parquet"
    assert loaded_by("report", log, cwd=tmp_path) & (FRAMEWORK_MODULES | {"pandas"}) == set()
    assert loaded_by("report", log, "--json", cwd=tmp_path) & (FRAMEWORK_MODULES | {"pandas"}) == set()
    doc = json.loads(cli("report", log, "--json", cwd=tmp_path).stdout)["probes"]
    assert doc["targets"] == ["obs:0", "obs:1", "obs:2", "obs:3", "info:absent"] and doc["iterations"] == [0, 1]
    assert len(doc["rows"]) == 2 * 2 * 5 * 2  # iterations, modules (actor, critic), targets, lags


def test_probe_loads_no_pandas_and_prints_the_library_rows(tmp_path):
    log = SAMPLES / "pendulum-1env.parquet"
    assert loaded_by("probe", log, "--lags", "0,1", cwd=tmp_path) & (FRAMEWORK_MODULES | {"pandas"}) == set()
    r = cli("probe", log, "--lags", "0,1", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import lstm_probe

    want = lstm_probe.probe(log, "episode_step", lags=[0, 1]).to_dict(orient="records")
    assert json.loads(r.stdout) == [{k: None if v != v else v for k, v in row.items()} for row in want]


def test_report_json_without_pandas_is_the_library_report(tmp_path):
    """The CLI loads pyarrow with pandas hidden from it (cli._pyarrow_without_pandas); the report is the
    same as the library's in a process where pyarrow knows pandas (this one)."""
    from lstm_probe import summarize

    for log in [*sorted(SAMPLES.glob("*.parquet")), SAMPLES / "cartpole-rllib"]:
        r = cli("report", log, "--json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == json.loads(json.dumps(summarize(log).to_dict())), log.name


def test_import_lstm_probe_is_cheap_and_lazy():
    """`import lstm_probe` loads only the exceptions; each re-exported name loads its module on first use."""
    code = (
        "import sys\nimport lstm_probe\n"
        "print(sorted(m for m in ('numpy', 'pyarrow', 'pandas', 'torch', 'rich', 'typer', 'importlib.metadata') "
        "if m in sys.modules))\n"
        "from lstm_probe import __version__, load, summarize, CaptureOptions\n"
        "print(type(__version__).__name__, load.__module__, summarize.__module__, CaptureOptions.__module__)\n"
        "print(sorted(m for m in ('torch', 'stable_baselines3', 'gymnasium') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.stdout.splitlines() == [
        "[]",
        "str lstm_probe.log.reader lstm_probe.report.summary lstm_probe.options",
        "[]",
    ], r.stderr


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_json_and_negative_r2_is_marked():
    from lstm_probe.text import strict_json

    assert (
        strict_json({"a": float("nan"), "b": [np.float32("inf"), 1.5, np.int64(3)]})
        == '{"a": null, "b": [null, 1.5, 3]}'
    )
    log = str(ROOT_DIR / "sample_runs" / "pendulum-1env.parquet")
    rows = _strict(cli("probe", log, "--lags", "0,1", "--json").stdout)
    _strict(cli("report", log, "--json").stdout)
    text = cli("probe", log, "--lags", "0,1").stdout
    worse = [r for r in rows if r["worse_than_mean"]]
    assert worse, "the sample log has probes worse than the mean"
    assert text.count("*") == len(worse) + 1  # each marked row, and the note
    assert "worse than predicting their mean" in " ".join(text.split())


def test_probe_of_an_iteration_the_log_lacks_is_refused_in_one_line():
    """``probe --iteration 9`` of a log with fewer iterations printed an empty table and exited 0 (the HTML
    page's ``--iteration`` was refused); now one line that says which iterations the log holds, exit 2."""
    log = str(ROOT_DIR / "sample_runs" / "pendulum-1env.parquet")
    r = cli("probe", log, "--iteration", "999")
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "iteration 999 is not in the log (it holds iterations 0.." in line
    assert cli("probe", log, "--iteration", "0").returncode == 0
