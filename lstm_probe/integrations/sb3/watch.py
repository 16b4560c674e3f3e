"""``lstm_probe.watch(model)``: the Doctor over an sb3-contrib model's ``predict`` calls outside ``learn()``.

It traces ``model.predict`` calls (evaluation or deployment code) into a log and gives the report's Doctor
findings about them when the block ends (:class:`Watch`). ``policies.py:RecurrentActorCriticPolicy.predict(
observation, state, episode_start, deterministic)`` calls the actor LSTM once per call (``get_distribution``);
``model.predict`` reaches it through the policy's attribute, which the block wraps (an instance attribute,
removed on the way out).
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lstm_probe.capture.tracer import CoreTracer
from lstm_probe.contract import Capabilities, Grid, Tags
from lstm_probe.errors import BadInput
from lstm_probe.integrations.sb3.callback import model_metadata
from lstm_probe.options import capture_options


class _PredictIntegration:
    """Tags of the predict calls of a watched model: phase 'predict', env column = batch column, each
    env column's own step counter, and the ``episode_start`` passed to ``predict``."""

    name = "sb3"

    def __init__(self, metadata: dict[str, Any]):
        self._metadata = metadata
        self.start: Any = None
        self.env_step = np.zeros(0, np.int64)
        self.current: Tags | None = None
        self.active = False

    def capabilities(self) -> Capabilities:
        return Capabilities("sb3")

    def metadata(self) -> dict[str, Any]:
        return self._metadata

    def resolve(self, module: str, steps: int, batch: int) -> Tags:
        if not self.active:
            return Tags()
        current = self.current
        if current is not None and current.grid is not None and current.grid.shape[0] == batch:
            return current
        # the predict call's first LSTM call: its env columns are the batch columns
        if len(self.env_step) < batch:
            self.env_step = np.concatenate([self.env_step, np.zeros(batch - len(self.env_step), np.int64)])
        starts = np.full(batch, -1, np.int8)
        if self.start is not None:
            given = np.asarray(self.start).reshape(-1)
            if len(given) == batch:
                starts = given.astype(bool).astype(np.int8)
        step = self.env_step[:batch].copy()
        self.env_step[:batch] += 1
        self.current = Tags("predict", grid=Grid.one_step(np.arange(batch), step, -1, -1, starts))
        return self.current


class Watch:
    """What :func:`watch` gives once the block has ended: ``findings`` (the report's Doctor findings about
    the watched predict calls, plain sentences; empty when none), ``doctor`` (the report's whole Doctor
    section) and ``path`` (the log, where ``out`` was given)."""

    def __init__(self) -> None:
        self.findings: list[str] = []
        self.doctor: Any = None
        self.path: Path | None = None


@contextlib.contextmanager
def watch(model: Any, out: str | Path | None = None, **capture: Any) -> Iterator[Watch]:
    """Check evaluation or deployment code: trace every ``model.predict`` call inside the block (outside
    ``learn()``), then give the Doctor's findings about where each call's LSTM state came from (is the
    state passed back, reset at episode starts, taken from the right env column?).

    ``with lstm_probe.watch(model) as w: ... model.predict(obs, state=state, episode_start=starts) ...``;
    afterwards ``w.findings`` holds them, and each is also emitted with ``warnings.warn``. ``out``: keep
    the log there (default: a temporary log, deleted afterwards). The episode starts are the
    ``episode_start`` passed to ``predict``; env columns are the batch columns of ``obs``. Keyword
    arguments set the log's capture settings (:class:`~lstm_probe.options.CaptureOptions`: ``force=True``).
    """
    from lstm_probe.report import summarize

    policy = getattr(model, "policy", None)
    if policy is None or not hasattr(policy, "lstm_actor"):
        raise BadInput(f"watch needs an sb3-contrib recurrent model (RecurrentPPO), not {type(model).__name__}")
    result = Watch()
    with contextlib.ExitStack() as stack:
        log_path = Path(out) if out is not None else None
        if log_path is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="lstm-probe-watch-"))
            log_path = Path(tmp) / "watch.parquet"
        integration = _PredictIntegration({**model_metadata(model), "watch": True})
        options = capture_options(None, log_path, **{"writer": "thread", **capture})
        tracer = CoreTracer({"actor": policy.lstm_actor}, options, integration).start()
        own = vars(policy)
        previous = own.get("predict")
        inner = policy.predict

        @functools.wraps(inner)
        def predict(observation: Any, state: Any = None, episode_start: Any = None, deterministic: bool = False) -> Any:
            # policies.py:RecurrentActorCriticPolicy.predict(observation, state, episode_start, deterministic)
            integration.start, integration.current, integration.active = episode_start, None, True
            try:
                return inner(observation, state, episode_start, deterministic)
            finally:
                integration.active = False

        own["predict"] = predict
        completed = False
        try:
            yield result
            completed = True
        finally:
            if previous is not None:
                own["predict"] = previous
            else:
                own.pop("predict", None)
            written = tracer.close(completed=completed)
        if written is not None:
            doctor = summarize(written).doctor
            result.doctor = doctor
            result.findings = list(doctor.findings) if doctor is not None else []
            result.path = written if out is not None else None
    for finding in result.findings:
        warnings.warn(f"lstm-probe watch: {finding}", stacklevel=3)
