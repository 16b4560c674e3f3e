"""A probe's life is written once (lstm_probe/capture/life.py): no integration has a ``with`` or a run skeleton of its
own, and a run that fails mid-training ends its log with the same stop reason whatever the framework."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import lstm_probe
from lstm_probe.capture.life import stop_reason

INTEGRATIONS = Path(lstm_probe.__file__).parent / "integrations"
CONTEXTS = {("sb3/model_zip.py", "_Archive")}
"""The classes under integrations/ that may be context managers: a file they open, not a probe."""


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(INTEGRATIONS)), ast.parse(p.read_text())) for p in sorted(INTEGRATIONS.rglob("*.py"))]


def test_no_integration_writes_its_own_with_or_run_skeleton() -> None:
    """``with``, start/close and the stop reason are life.Probe's (life.Scope's); the run skeleton (loop,
    progress, close, read_info, RunResult) is life.train's."""
    seen = set()
    for name, tree in _modules():
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            methods = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
            if methods & {"__enter__", "__exit__"}:
                seen.add((name, cls.name))
                assert (name, cls.name) in CONTEXTS, f"{name}: {cls.name} defines its own `with`: use life.Probe"
        for node in ast.walk(tree):
            if isinstance(node, ast.Name | ast.Attribute):
                word = node.id if isinstance(node, ast.Name) else node.attr
                assert word != "read_info", f"{name}:{node.lineno} reads the log itself: life.train does"
            if isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                assert called != "RunResult", f"{name}:{node.lineno} makes a RunResult: life.train does"
                for kw in node.keywords:  # a stop reason is passed along (a name) or a fixed sentence
                    if kw.arg == "stop_reason" and not isinstance(kw.value, ast.Name | ast.Constant):
                        pytest.fail(f"{name}:{node.lineno} words a stop reason: life.stop_reason does")
            if isinstance(node, ast.FunctionDef) and node.name == "run":
                tries = [t for t in ast.walk(node) if isinstance(t, ast.Try)]
                assert not tries, f"{name}: run has a try of its own: hand life.train the loop and the close"
    assert seen == CONTEXTS  # the check sees what it checks


def test_the_stop_reason_is_worded_once() -> None:
    assert stop_reason(RuntimeError("first line\nsecond line")) == "RuntimeError: first line"
    assert stop_reason(KeyboardInterrupt()) == "KeyboardInterrupt: interrupted"
    assert stop_reason(KeyboardInterrupt("signal SIGTERM")) == "KeyboardInterrupt: signal SIGTERM"


# -- a real run that fails mid-training, in each framework --------------------------------------------------
BREAKS_AT = 40  # the env step that fails: in the third iteration of 16 steps
FAILURES = {
    "error": (RuntimeError, f"the env broke at step {BREAKS_AT}\nand a second line the log never shows"),
    "ctrl-c": (KeyboardInterrupt, ""),  # a bare Ctrl-C landing in the env's step
}
FRAMEWORKS = {
    "sb3": ("sb3_contrib", "Pendulum-v1"),
    "torchrl": ("torchrl", "CartPole-v1"),
    "rsl_rl": ("rsl_rl", "Pendulum-v1"),
}


class _Breaks(gym.Wrapper):
    def __init__(self, env: gym.Env, failure: str) -> None:
        super().__init__(env)
        self.failure, self.steps = failure, 0

    def step(self, action):  # type: ignore[no-untyped-def]
        self.steps += 1
        if self.steps == BREAKS_AT:
            kind, message = FAILURES[self.failure]
            raise kind(message)
        return self.env.step(action)


def _broken_env(base: str, failure: str) -> str:
    env_id = f"LstmProbeBroken{base.split('-')[0]}{failure.title().replace('-', '')}-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=lambda **kw: _Breaks(gym.make(base, **kw), failure))
    return env_id


def _run(framework: str, env_id: str, out: Path) -> None:
    tiny = dict(steps=96, n_steps=16, batch_size=16, n_epochs=1, hidden_size=8, seed=0, force=True)
    if framework == "sb3":
        lstm_probe.run(env_id, out, **tiny)
    else:
        torch.distributions.Distribution.set_default_validate_args(False)  # as the framework sets it (conftest)
        module = importlib.import_module(f"lstm_probe.integrations.{framework}")
        module.run(env_id, out, **tiny)


@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_a_run_that_fails_mid_training_ends_its_log_the_same_way(tmp_path: Path, framework: str, failure: str) -> None:
    package, base = FRAMEWORKS[framework]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed")
    kind, message = FAILURES[failure]
    out = tmp_path / "run.parquet"
    with pytest.raises(kind) as raised:
        _run(framework, _broken_env(base, failure), out)
    assert str(raised.value) == message  # the run's own exception goes on, untouched
    info = lstm_probe.read_info(out)
    expected = {"error": f"RuntimeError: the env broke at step {BREAKS_AT}", "ctrl-c": "KeyboardInterrupt: interrupted"}
    assert not info.completed and info.metadata["stop_reason"] == expected[failure]
    assert info.rows > 0  # the partial log is kept: the rows up to the failure
