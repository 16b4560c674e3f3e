"""The one Arrow schema of an lstm-probe log, its version and its metadata keys.

Every file the writer produces goes through :func:`log_schema`; every reader checks a file against
:data:`REQUIRED_COLUMNS` and :data:`SCHEMA_VERSION`. docs/schema.md is generated from the same
tables (``lstm-probe schema --markdown``), so the documentation cannot drift from the code.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # imported where a schema is built: the training process never needs pyarrow
    import pyarrow as pa

SCHEMA_VERSION = 2
"""Bumped whenever a column is added, removed, renamed or changes meaning. Readers refuse newer versions
and read older ones (version 1 lacks ``worker`` and ``learner``: read as null)."""

META_VERSION_KEY = b"lstm_probe.schema_version"
META_RUN_KEY = b"lstm_probe.run"
"""Key of the JSON document with the run's metadata (see :data:`METADATA_KEYS`)."""

# Values of the string columns. Stored as plain strings (Parquet dictionary-encodes them on disk).
PHASES = ("rollout", "bootstrap", "train", "predict", "other", "value")
PATHS = ("step", "sequence", "stepwise")
BOOTSTRAPS = ("terminal", "last")
SEQ_REASONS = ("episode_start", "env_boundary", "split", "minibatch_cut", "max_seq_len")

# (name, Arrow type name (pyarrow.type_for_alias) or None for the state vectors, nullable, description)
COLUMNS: list[tuple[str, str | None, bool, str]] = [
    (
        "call",
        "int64",
        False,
        "Order of LSTM forward calls (0-based, all modules together) in the writing process. RLlib logs have "
        "one writer per process: env runner k numbers its calls from k * 10**12, learner r from "
        "(1000 + r) * 10**12, evaluation env runner k from (2000 + k) * 10**12, so (call, module) names one "
        "call across the log.",
    ),
    (
        "module",
        "string",
        False,
        "Role of the hooked recurrent module: 'actor' | 'critic' for sb3 (with shared_lstm the one LSTM is "
        "'actor'), the module's name for the generic tracer.",
    ),
    ("layer", "int16", False, "Layer of the module, 0 = first (closest to the input)."),
    (
        "phase",
        "string",
        False,
        "'rollout' (acting in the env), 'bootstrap' (critic-only value calls, see `bootstrap`), 'train' "
        "(recomputed in a gradient step), 'value' (RLlib: the learner's whole-batch critic pass for GAE, "
        "gradients on, before any optimizer step of the update), 'predict' (model.predict / evaluation), "
        "'other' (untagged).",
    ),
    (
        "path",
        "string",
        False,
        "How the module was run in this call: 'step' (one-step call), 'sequence' (one multi-step call; "
        "per-step states recovered exactly), 'stepwise' (one call per timestep of a sequence batch).",
    ),
    (
        "bootstrap",
        "string",
        True,
        "sb3, phase 'bootstrap': 'terminal' (value of a truncated episode's terminal observation) or "
        "'last' (value of the observation after the rollout's last step). RLlib: rows whose input is not "
        "a step the agent acted on: 'terminal' (an episode's terminal observation: the env runner's "
        "discarded forward pass after the episode ended, and the learner's appended bootstrap timestep "
        "of a finished episode) or 'last' (the learner's appended timestep of an episode chunk cut at "
        "the end of a rollout fragment). Null otherwise.",
    ),
    (
        "iteration",
        "int32",
        True,
        "Rollout/update cycle, 0-based; train rows carry the iteration whose rollout they train on. RLlib: "
        "rollout rows carry the weights version the env runner acted with (weights_seq_no), learner rows "
        "the learner's update count; equal numbers mean the same policy weights.",
    ),
    (
        "epoch",
        "int32",
        True,
        "Training epoch within the iteration (sb3 train rows). Null for RLlib, whose minibatches cycle "
        "through the batch across epoch boundaries.",
    ),
    (
        "minibatch",
        "int32",
        True,
        "Minibatch within the epoch (sb3 train rows); RLlib: minibatch within the update.",
    ),
    (
        "seq",
        "int32",
        True,
        "Sequence index within the minibatch = batch column of the call (train rows). Rows of calls no "
        "integration tagged (env null) carry their batch column here too; null otherwise.",
    ),
    (
        "t",
        "int32",
        False,
        "Step within the sequence (train rows), within the call for calls no integration tagged (env null); "
        "0 otherwise. -1 marks a sequence's initial-state row (RLlib "
        "learner calls): the state the sequence started from (RLlib's STATE_IN), keyed to the step before its "
        "first step, so it pairs with the rollout row that produced it; env_step is null where the sequence "
        "starts an episode (the state is the initial zeros).",
    ),
    ("seq_len", "int32", True, "Unpadded length of the row's sequence (train rows only)."),
    (
        "seq_reason",
        "string",
        True,
        "Why the row's sequence starts where it does (train rows only): 'episode_start', 'env_boundary' "
        "(first step of an env's rollout), 'split' (the rollout buffer's random shuffling split point), "
        "'minibatch_cut' (the previous minibatch ended there), 'max_seq_len' (RLlib: the previous chunk of "
        "the episode reached max_seq_len). RLlib uses 'env_boundary' for a chunk that starts where the "
        "env runner's previous rollout fragment ended.",
    ),
    ("padding", "bool", False, "True for the zero-padding steps appended to short sequences (train)."),
    (
        "worker",
        "int32",
        True,
        "RLlib: index of the env runner whose env produced the row's data (0 = the driver's local env "
        "runner); with `env` it names one env. Evaluation env runners are 2000 + k. Null for sb3 and generic "
        "logs, and on padding rows.",
    ),
    (
        "learner",
        "int32",
        True,
        "RLlib: rank of the learner that made a train or value call. Null elsewhere.",
    ),
    ("env", "int32", True, "Env index in the vectorized env (of that worker). Null on padding rows."),
    (
        "env_step",
        "int64",
        True,
        "That env's own step counter since the probe started: the step whose observation went in. For "
        "bootstrap 'last' rows it is the step after the rollout's last one (whose observation is evaluated; "
        "the next rollout's first call uses the same input). For bootstrap 'terminal' rows it is the step after "
        "the episode's last step: the terminal observation stands where the episode's next step would be. "
        "Null on padding rows.",
    ),
    ("episode", "int64", True, "Per-env episode counter since the probe started. Null on padding rows."),
    (
        "episode_step",
        "int64",
        True,
        "Step within the episode (0 at its first observation). Null on padding rows, and for an episode "
        "that began before the probe did (learn() continued without a reset).",
    ),
    ("episode_start", "bool", True, "True when the state was reset before this step (first step of an episode)."),
    (
        "h",
        None,
        True,
        "Hidden state AFTER this step, this layer (fixed-size list of float32, or float16 with --float16). "
        "Null in summary capture.",
    ),
    ("c", None, True, "Cell state AFTER this step, this layer (LSTM only; null for GRU and in summary capture)."),
    ("h_norm", "float32", False, "L2 norm of h (computed from the full-precision state)."),
    ("c_norm", "float32", True, "L2 norm of c (null for GRU)."),
    (
        "drift_h",
        "float32",
        True,
        "Train rows: relative L2 distance ||h_train - h_rollout|| / ||h_rollout|| to the rollout state of the "
        "same (module, layer, env, env_step), computed in the probe. Null when there is no rollout partner.",
    ),
    ("drift_c", "float32", True, "As drift_h, for c."),
]

COLUMN_NAMES = [name for name, *_ in COLUMNS]
REQUIRED_COLUMNS = frozenset(COLUMN_NAMES)
ADDED_IN_V2 = frozenset({"worker", "learner"})
"""Columns a version-1 log lacks; readers treat them as null."""

METADATA_KEYS: dict[str, str] = {
    "schema_version": "Version of this schema (also stored under its own key).",
    "lstm_probe_version": "Version of lstm-probe that wrote the log.",
    "framework": "'sb3', 'rllib' or 'generic'.",
    "versions": "torch, stable-baselines3, sb3-contrib, gymnasium, numpy, pyarrow versions.",
    "env_id": "Gymnasium env id (sb3 runs).",
    "algorithm": "Algorithm class name, e.g. RecurrentPPO (RLlib: PPO).",
    "rllib": "RLlib runs: env runners, learners, envs per runner, rollout_fragment_length, "
    "train_batch_size, minibatch_size, num_epochs, max_seq_len, vf_share_layers, lstm_cell_size.",
    "shards": "Multi-process logs (read back, not stored): per writing process, completed and progress.",
    "policy": "Policy class name.",
    "hyperparameters": "Every RecurrentPPO hyperparameter actually used (n_steps, batch_size, n_epochs, ...).",
    "seed": "Seed passed to the algorithm (null when none).",
    "n_envs": "Number of envs in the vectorized env.",
    "total_timesteps": "Env steps asked for by learn().",
    "command": "The command line that made the log (CLI runs).",
    "architecture": "modules: {name: {kind, hidden_size, num_layers, input_size}}, shared_lstm, "
    "critic ('lstm' | 'shared' | 'mlp').",
    "capabilities": "What the writing integration's logs can hold (framework, shards, epochs, rollout_buffer, "
    "max_seq_len, stored_states, replay): report sections ask these, never the framework's name.",
    "hidden_size": "Length of the h and c vectors.",
    "capture": "'full' | 'summary'; with every_k and dtype ('float32' | 'float16').",
    "start_time": "UTC ISO time the probe started.",
    "end_time": "UTC ISO time the log was closed (final part only).",
    "completed": "True only when training ran to its end; false after an error or an interruption.",
    "stop_reason": "Null when completed, else what stopped the run (the exception's one-line summary).",
    "progress": "num_timesteps reached, iterations started, calls and rows written.",
    "final": "True in the metadata of the part that closed the log (absent from parts written before).",
    "probe_cost": "What recording cost, measured by the probe while it ran: seconds (start to close, wall), "
    "calls, hook_seconds and integration_seconds (training thread: hooks, the integration's callbacks), "
    "writer (process or thread: where rows were made and written), writer_cpu_seconds and "
    "writer_busy_seconds (that writer process or thread), wait_seconds (training waiting for room in the "
    "writer's queue or pipe); with a writer process on Linux also writer_peak_rss_mb (its peak RSS, shared "
    "libraries included) and writer_peak_private_mb (its peak private memory, sampled each second). "
    "Summed over processes in multi-process logs.",
}


def relative_l2(states: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """What the drift_h / drift_c columns mean: ||states - reference|| / ||reference|| per row (rows of
    (n, hidden) arrays); a zero reference norm is floored at 1e-12."""
    d = states - reference
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        num = np.sqrt(np.einsum("ij,ij->i", d, d))
        den = np.sqrt(np.einsum("ij,ij->i", reference, reference))
        return num / np.maximum(den, 1e-12)


def state_type(hidden_size: int, float16: bool = False) -> pa.DataType:
    """Arrow type of the h and c columns."""
    import pyarrow as pa

    return pa.list_(pa.float16() if float16 else pa.float32(), hidden_size)


def log_schema(hidden_size: int, float16: bool = False, metadata: dict[str, Any] | None = None) -> pa.Schema:
    """The schema of a log whose state vectors have ``hidden_size`` entries."""
    import pyarrow as pa

    fields = []
    for name, typ, nullable, doc in COLUMNS:
        arrow_type = state_type(hidden_size, float16) if typ is None else pa.type_for_alias(typ)
        fields.append(pa.field(name, arrow_type, nullable=nullable, metadata={b"doc": doc.encode()}))
    meta = {META_VERSION_KEY: str(SCHEMA_VERSION).encode()}
    if metadata is not None:
        meta[META_RUN_KEY] = json.dumps(metadata, default=str, sort_keys=True).encode()
    return pa.schema(fields, metadata=meta)


def schema_markdown() -> str:
    """docs/schema.md: every column and metadata key, generated from the tables above."""
    lines = [
        "# lstm-probe log schema",
        "",
        f"Schema version {SCHEMA_VERSION}. One row per (LSTM call, layer, batch column, timestep).",
        "The version is in the Parquet key-value metadata under `lstm_probe.schema_version`; the run's",
        "metadata is a JSON document under `lstm_probe.run`. Generated by `lstm-probe schema --markdown`.",
        "",
        "## Columns",
        "",
        "| column | type | nullable | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for name, typ, nullable, doc in COLUMNS:
        tname = "fixed_size_list<float32, hidden_size>" if typ is None else str(typ)
        lines.append(f"| `{name}` | {tname} | {'yes' if nullable else 'no'} | {doc} |")
    lines += ["", "## Metadata keys (`lstm_probe.run` JSON)", "", "| key | meaning |", "| --- | --- |"]
    for key, doc in METADATA_KEYS.items():
        lines.append(f"| `{key}` | {doc} |")
    return "\n".join(lines) + "\n"
