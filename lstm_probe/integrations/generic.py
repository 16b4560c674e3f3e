"""The generic torch integration: calls are tagged by the user (``with probe.tag(phase=..., env=...)``).

``lstm_probe.trace(model, out)`` hooks every recurrent module of any torch model; a training loop says
what each call is with :meth:`Tracer.tag` blocks. :class:`GenericIntegration` turns the innermost
block's tags into the core's :class:`~lstm_probe.contract.Tags`, and declares what the user tagged as
the log's capabilities.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from lstm_probe.capture.life import Probe, Tagged
from lstm_probe.capture.modules import find_recurrent
from lstm_probe.capture.tracer import CoreTracer
from lstm_probe.contract import PHASE, USER_CALL_TAGS, USER_GRID_TAGS, USER_TAGS, Capabilities, Grid, Tags
from lstm_probe.errors import BadInput
from lstm_probe.log.schema import COLUMN, PHASES
from lstm_probe.options import AUTO_WINDOW, CaptureOptions, capture_options

TAGS = USER_TAGS  # the schema's user-taggable columns
PROVENANCE = USER_GRID_TAGS
_UNTAGGED: dict[str, Any] = {}  # the tags of a call outside every block


class GenericIntegration(Tagged):
    """Tags from the user's nested ``tag()`` blocks (see :meth:`Tracer.tag`)."""

    name = "generic"
    tag_keys = TAGS
    tag_refusal = f"tags are {', '.join(TAGS)}"

    def __init__(self, metadata: dict[str, Any] | None = None):
        self._metadata = dict(metadata or {})
        self._user: list[dict[str, Any]] = []
        self._cache: dict[tuple[int, int, int], Tags] = {}
        self._cached: dict[str, Any] | None = None  # the block whose calls' tags _cache holds
        self._epochs = False

    def capabilities(self) -> Capabilities:
        """framework 'generic'; ``epochs`` once a call was tagged with an epoch."""
        return Capabilities("generic", epochs=self._epochs)

    def metadata(self) -> dict[str, Any]:
        return dict(self._metadata)

    def _check_tags(self, tags: dict[str, Any]) -> None:
        if "phase" in tags and tags["phase"] not in PHASE:
            raise BadInput(f"phase must be one of {', '.join(PHASES)}, not {tags['phase']!r}")

    def resolve(self, module: str, steps: int, batch: int) -> Tags:
        """Tags of a call from the innermost ``tag()`` block. A tag given as an (N, T) or (1, T) array
        with T > 1 describes a sequence; one-step calls inside the block then walk along it (a
        per-timestep loop over a sequence batch, path 'stepwise')."""
        user = self._user[-1] if self._user else _UNTAGGED
        if user is not self._cached:  # another block than the cached tags': they are no longer asked for
            self._cache.clear()
            self._cached = user
        prov = {k: user[k] for k in PROVENANCE if user.get(k) is not None}
        width = max([steps] + [np.shape(v)[-1] for v in prov.values() if np.ndim(v) == 2])
        key = (id(user), batch, width)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        tags = Tags(**{k: user[k] for k in USER_CALL_TAGS if k in user})
        if prov or tags.phase == "train":

            def col(key: str, dtype: Any) -> np.ndarray:
                if key not in prov:
                    return np.full((batch, width), -1, dtype)
                v = np.asarray(prov[key]).astype(dtype)
                if v.ndim == 1:
                    v = v[:, None]
                try:
                    return np.broadcast_to(v, (batch, width))
                except ValueError:
                    raise BadInput(
                        f"tag {key} has shape {np.shape(prov[key])}, which does not fit a call of "
                        f"batch {batch} over {width} step(s); give a scalar, ({batch},), ({batch}, "
                        f"{width}) or (1, {width})"
                    ) from None

            tags.grid = Grid.of({k: col(k, COLUMN[k].dtype) for k in PROVENANCE}, train=tags.phase == "train")
            if tags.grid.train:
                tags.grid.seq_len = np.full(batch, width, np.int32)
                tags.grid.seq_reason = np.full(batch, -1, np.int8)
        self._cache[key] = tags
        return tags


class Tracer(Probe, CoreTracer):
    """The core tracer with the generic integration: calls are tagged with :meth:`tag`. It is its own core
    tracer (its figures are the tracer's: ``calls``, ``rows``, ``metadata``, ``writer``, ...) and a
    :class:`~lstm_probe.capture.life.Probe`: ``start()``, ``close()``, ``with``.

    ``Tracer(modules, out, metadata, capture=..., ...)`` or ``Tracer(modules, options=CaptureOptions(...))``;
    :func:`trace` finds the modules for you.
    """

    integration: GenericIntegration

    def __init__(
        self,
        modules: Any,
        out: str | os.PathLike[str] | None = None,
        metadata: dict[str, Any] | None = None,
        *,
        options: CaptureOptions | None = None,
        shard: str | None = None,
        **capture: Any,
    ):
        super().__init__(modules, capture_options(options, out, **capture), GenericIntegration(metadata), shard=shard)

    def _core(self) -> CoreTracer:
        return self

    def tag(self, **tags: Any) -> contextlib.AbstractContextManager[None]:
        """Tag every call inside the block: phase, iteration, epoch, minibatch, env, env_step, episode,
        episode_step, episode_start (scalars, or arrays with one value per batch column).
        Nested blocks add to and override the outer ones."""
        return self.integration.tag(**tags)


def trace(
    model: nn.Module,
    out: str | Path | None = None,
    *,
    modules: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    shard: str | None = None,
    options: CaptureOptions | None = None,
    **capture: Any,
) -> Tracer:
    """Trace every nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell in ``model`` (or those named in ``modules``).

    Use as a context manager; tag calls with ``probe.tag(phase=..., iteration=..., env=..., ...)``.
    ``out``: the log [run.parquet], a file or a directory ending in '/'.
    ``shard`` names this process's part files when several processes (workers) write one directory log
    (``out`` ending in ``/``); readers then take the directory as one log.
    The capture settings: ``options`` (a :class:`~lstm_probe.options.CaptureOptions`), and keyword
    arguments of its fields' names, which override it: ``capture`` ('full' or 'summary'), ``every``,
    ``float16``, ``force``, ``writer`` ('process': a writer process of its own, the default where pipes can
    be polled, i.e. not on Windows; 'thread'), ``part_seconds``, ``part_iterations`` and
    ``reference_window`` (the env steps of rollout states kept per env, so that train rows get ``drift_h`` /
    ``drift_c`` against the rollout state of the same (env, env_step) and the report its provenance check and
    staleness: by default as many as the rollout between two training calls holds; 0 keeps none). Each is
    documented on :class:`~lstm_probe.options.CaptureOptions`.
    """
    opts = capture_options(options, out, **capture)
    if "reference_window" not in capture and opts.reference_window == 0:  # the rollout's own length
        opts = dataclasses.replace(opts, reference_window=AUTO_WINDOW)
    return Tracer(find_recurrent(model, modules), metadata=metadata, options=opts, shard=shard)
