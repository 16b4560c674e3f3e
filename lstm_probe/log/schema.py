"""The one Arrow schema of an lstm-probe log, its version and its metadata keys.

Every file the writer produces goes through :func:`log_schema`; every reader checks a file against
:func:`required_columns` and :data:`SCHEMA_VERSION`. The declarations below also drive the writer's row
buffers and encoder (``writer.py``), the sink's row filling and null filling (``sink.py``), the per-cell
columns of :class:`lstm_probe.contract.Grid`, the keys of ``Tracer.tag()`` and docs/schema.md
(``lstm-probe schema --markdown``), so none of them lists the columns by hand.

Adding a column
---------------
1. Declare it in :data:`COLUMNS` below: name, Arrow type, nullability, doc, ``source`` (who knows its
   value), ``since=`` the new :data:`SCHEMA_VERSION` (bump it; older logs read the column as null).
2. Fill it where its value is known, by its source:
   - ``"tags"`` (one value per call): add a field of the same name to ``contract.Tags`` and set it in
     the integration (``lstm_probe/integrations/``); ``user=True`` also makes it a ``Tracer.tag()`` key.
   - ``"grid"`` (one value per batch column and timestep): the integration passes it to its ``Grid``
     (``Grid(..., name=array)``); a grid that does not carry it writes the column's null. A vector of its
     own length (``type=None, width=KEY``: obs, info) is (N, T, width) in the grid; the writer reads the
     length from the run metadata's KEY, which the integration sets before the log opens.
   - ``"sequence"`` (one value per sequence of a train grid): as ``"grid"``, an (N,) array.
   - ``"state"``: computed by the sink from the states (``Sink.rows``).
   ``"call"`` and ``"position"`` columns are the sink's own (the call, its module, layer and path; the
   row's place in its call).
3. Regenerate docs/schema.md: ``lstm-probe schema --markdown > docs/schema.md``.
Nothing else changes: buffers, encoding, null filling, Grid columns and tag keys follow the declaration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # imported where a schema is built: the training process never needs pyarrow
    import pyarrow as pa

from lstm_probe.log.metadata_keys import METADATA_KEYS

SCHEMA_VERSION = 4
"""Bumped whenever a column is added, removed, renamed or changes meaning. Readers refuse newer versions
and read older ones (a column newer than a log's version, see ``Column.since``, reads as null)."""

META_VERSION_KEY = b"lstm_probe.schema_version"
META_RUN_KEY = b"lstm_probe.run"
"""Key of the JSON document with the run's metadata (see ``metadata_keys.METADATA_KEYS``)."""

# Values of the string columns. Stored as plain strings (Parquet dictionary-encodes them on disk).
PHASES = ("rollout", "bootstrap", "train", "predict", "other", "value")
PATHS = ("step", "sequence", "stepwise")
BOOTSTRAPS = ("terminal", "last")
SEQ_REASONS = ("episode_start", "env_boundary", "split", "minibatch_cut", "max_seq_len", "gradient_window")
INITS = ("zero", "previous", "reset", "stored", "other", "other_env")

SOURCES = ("call", "tags", "grid", "sequence", "position", "state")
"""Who fills a column (see the recipe above)."""

ROW_FLAGS = {
    "has_c": "the row's module has a cell state (an LSTM, not a GRU)",
    "vectors": "the row stores its h and c vectors (full capture, an iteration that every_k keeps)",
    "has_drift": "a rollout state of the same (module, layer, env, env_step) was found for the drifts",
}
"""Per-row booleans of the row buffers that are not columns: a ``valid`` float column is null where one
of its flags is False."""


@dataclass(frozen=True)
class Column:
    """One column of the log.

    ``type`` is an Arrow type name (``pyarrow.type_for_alias``), or None for the state vectors
    (fixed-size lists of ``hidden_size`` floats, or of the length :attr:`width` names; a grid vector column
    is (N, T, width) in a :class:`~lstm_probe.contract.Grid`). The row buffers store each column by its :attr:`kind`,
    with its null convention: integers as themselves, null = -1 (so nullable integer columns hold values
    >= 0; a non-nullable integer may be negative); strings as int8 codes into ``values`` (the log's
    modules for ``module``), null = -1; a nullable bool as int8 -1 (null) / 0 / 1; floats (and vectors)
    null where one of the ``valid`` row flags (:data:`ROW_FLAGS`) is False, or, without flags, where NaN.
    """

    name: str
    type: str | None
    nullable: bool
    doc: str
    source: str
    since: int = 1
    """The first :data:`SCHEMA_VERSION` that has the column; older logs read it as null."""
    values: tuple[str, ...] = ()
    """A string column's values (empty for ``module``: the log's module names)."""
    valid: tuple[str, ...] = ()
    """Float and vector columns: the row flags that must all be True for a value (else null)."""
    user: bool = False
    """A key of ``Tracer.tag()`` (sources ``tags`` and ``grid``)."""
    cell: bool = False
    """A ``tags`` column a Grid may also carry per cell, overriding the call's value (``bootstrap``)."""
    width: str | None = None
    """Vector columns: the metadata key whose value gives the vector's length (an int, or a list: its
    length; at least 1, all null where the key is absent); None: ``hidden_size`` (the states)."""
    initial: str = "first"
    """Grid columns, in the rows of the states train sequences started from (``t = -1``): ``first`` the
    sequence's first step's value, ``previous`` a step counter's value one step earlier (null where the
    sequence starts an episode), ``null``."""

    def __post_init__(self) -> None:
        assert self.source in SOURCES, self.source
        assert self.initial in ("first", "previous", "null"), self.initial

    @property
    def kind(self) -> str:
        """How the row buffers hold it: int, code, bool, tribool, float or vector."""
        if self.type is None:
            return "vector"
        if self.type == "string":
            return "code"
        if self.type == "bool":
            return "tribool" if self.nullable else "bool"
        return "float" if self.type.startswith(("float", "halffloat", "double")) else "int"

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy dtype of its row buffer (and of a Grid's array for it)."""
        kind = self.kind
        if kind in ("code", "tribool"):
            return np.dtype(np.int8)
        if kind == "bool":
            return np.dtype(np.bool_)
        if kind == "vector":
            return np.dtype(np.float32)
        return np.dtype(self.type)

    @property
    def fill(self) -> Any:
        """What a row without a value holds in its buffer: the null (-1, or NaN for a float without
        flags) for a nullable column, -1 for a string code, zero otherwise."""
        kind = self.kind
        if kind in ("float", "vector"):
            return np.nan if self.nullable and not self.valid else 0.0
        if self.nullable or kind == "code":
            return -1
        return False if kind == "bool" else 0


COLUMNS: tuple[Column, ...] = (
    Column(
        "call",
        "int64",
        False,
        "Order of LSTM forward calls (0-based, all modules together) in the writing process. RLlib logs have "
        "one writer per process: env runner k numbers its calls from k * 10**12, learner r from "
        "(1000 + r) * 10**12, evaluation env runner k from (2000 + k) * 10**12, so (call, module) names one "
        "call across the log.",
        "call",
    ),
    Column(
        "module",
        "string",
        False,
        "Role of the hooked recurrent module: 'actor' | 'critic' for sb3 (with shared_lstm the one LSTM is "
        "'actor'), the module's name for the generic tracer.",
        "call",
    ),
    Column("layer", "int16", False, "Layer of the module, 0 = first (closest to the input).", "call"),
    Column(
        "phase",
        "string",
        False,
        "'rollout' (acting in the env), 'bootstrap' (critic-only value calls, see `bootstrap`), 'train' "
        "(recomputed in a gradient step), 'value' (RLlib: the learner's whole-batch critic pass for GAE, "
        "gradients on, before any optimizer step of the update), 'predict' (model.predict / evaluation), "
        "'other' (untagged).",
        "tags",
        values=PHASES,
        user=True,
    ),
    Column(
        "path",
        "string",
        False,
        "How the module was run in this call: 'step' (one-step call), 'sequence' (one multi-step call; "
        "per-step states recovered exactly), 'stepwise' (one call per timestep of a sequence batch).",
        "call",
        values=PATHS,
    ),
    Column(
        "bootstrap",
        "string",
        True,
        "sb3, phase 'bootstrap': 'terminal' (value of a truncated episode's terminal observation) or "
        "'last' (value of the observation after the rollout's last step). RLlib: rows whose input is not "
        "a step the agent acted on: 'terminal' (an episode's terminal observation: the env runner's "
        "discarded forward pass after the episode ended, and the learner's appended bootstrap timestep "
        "of a finished episode) or 'last' (the learner's appended timestep of an episode chunk cut at "
        "the end of a rollout fragment). Null otherwise.",
        "tags",
        values=BOOTSTRAPS,
        cell=True,
        initial="null",
    ),
    Column(
        "iteration",
        "int32",
        True,
        "Rollout/update cycle, 0-based; train rows carry the iteration whose rollout they train on. RLlib: "
        "rollout rows carry the weights version the env runner acted with (weights_seq_no), learner rows "
        "the learner's update count; equal numbers mean the same policy weights.",
        "tags",
        user=True,
    ),
    Column(
        "epoch",
        "int32",
        True,
        "Training epoch within the iteration (sb3 train rows). Null for RLlib, whose minibatches cycle "
        "through the batch across epoch boundaries.",
        "tags",
        user=True,
    ),
    Column(
        "minibatch",
        "int32",
        True,
        "Minibatch within the epoch (sb3 train rows); RLlib: minibatch within the update.",
        "tags",
        user=True,
    ),
    Column(
        "seq",
        "int32",
        True,
        "Sequence index within the minibatch = batch column of the call (train rows). Rows of calls no "
        "integration tagged (env null) carry their batch column here too; null otherwise.",
        "position",
    ),
    Column(
        "t",
        "int32",
        False,
        "Step within the sequence (train rows), within the call for calls no integration tagged (env null); "
        "0 otherwise. -1 marks a sequence's initial-state row (RLlib "
        "learner calls): the state the sequence started from (RLlib's STATE_IN), keyed to the step before its "
        "first step, so it pairs with the rollout row that produced it; env_step is null where the sequence "
        "starts an episode (the state is the initial zeros).",
        "position",
    ),
    Column("seq_len", "int32", True, "Unpadded length of the row's sequence (train rows only).", "sequence"),
    Column(
        "seq_reason",
        "string",
        True,
        "Why the row's sequence starts where it does (train rows only): 'episode_start', 'env_boundary' "
        "(first step of an env's rollout), 'split' (the rollout buffer's random shuffling split point), "
        "'minibatch_cut' (the previous minibatch ended there), 'max_seq_len' (RLlib: the previous chunk of "
        "the episode reached max_seq_len), 'gradient_window' (a per-step training pass's truncated-BPTT cut: "
        "the previous gradient window's optimizer step came there, and the state goes on from the pass's "
        "previous step, detached). RLlib uses 'env_boundary' for a chunk that starts where the "
        "env runner's previous rollout fragment ended.",
        "sequence",
        values=SEQ_REASONS,
    ),
    Column("padding", "bool", False, "True for the zero-padding steps appended to short sequences (train).", "grid"),
    Column(
        "worker",
        "int32",
        True,
        "RLlib: index of the env runner whose env produced the row's data (0 = the driver's local env "
        "runner); with `env` it names one env. Evaluation env runners are 2000 + k. Null for sb3 and generic "
        "logs, and on padding rows.",
        "grid",
        since=2,
    ),
    Column(
        "learner",
        "int32",
        True,
        "RLlib: rank of the learner that made a train or value call. Null elsewhere.",
        "tags",
        since=2,
    ),
    Column(
        "env",
        "int32",
        True,
        "Env index in the vectorized env (of that worker). Null on padding rows.",
        "grid",
        user=True,
    ),
    Column(
        "env_step",
        "int64",
        True,
        "That env's own step counter since the probe started: the step whose observation went in. For "
        "bootstrap 'last' rows it is the step after the rollout's last one (whose observation is evaluated; "
        "the next rollout's first call uses the same input). For bootstrap 'terminal' rows it is the step after "
        "the episode's last step: the terminal observation stands where the episode's next step would be. "
        "Null on padding rows.",
        "grid",
        user=True,
        initial="previous",
    ),
    Column(
        "episode",
        "int64",
        True,
        "Per-env episode counter since the probe started. Null on padding rows.",
        "grid",
        user=True,
    ),
    Column(
        "episode_step",
        "int64",
        True,
        "Step within the episode (0 at its first observation). Null on padding rows, and for an episode that "
        "began before the probe did (learn() continued without a reset) where the env does not count its steps; "
        "rsl_rl: from the env's own count (episode_length_buf, randomized by init_at_random_ep_len) if any.",
        "grid",
        user=True,
        initial="previous",
    ),
    Column(
        "episode_start",
        "bool",
        True,
        "True where an episode starts at this step (its observation is the episode's first), whether or not the "
        "state was reset there (the doctor judges that). Train rows of next observations (TorchRL's value passes on "
        "data['next']): True after a sequence's first step where the episode is not the previous step's.",
        "grid",
        user=True,
        initial="null",
    ),
    Column(
        "h",
        None,
        True,
        "Hidden state AFTER this step, this layer (fixed-size list of float32, or float16 with --float16). "
        "Null in summary capture.",
        "state",
        valid=("vectors",),
    ),
    Column(
        "c",
        None,
        True,
        "Cell state AFTER this step, this layer (LSTM only; null for GRU and in summary capture).",
        "state",
        valid=("vectors", "has_c"),
    ),
    Column(
        "init",
        "string",
        True,
        "Where the state this row's batch column started the call from came from, at the column's first step "
        "of the call (null at t > 0, on padding and on initial-state rows), computed by the tracer in the "
        "training process from the call's input state: 'zero' (all zeros, no episode start tagged), 'reset' "
        "(all zeros at a tagged episode start, or the first state the probe saw for that env column), "
        "'previous' (bit-equal to the state this module last returned for the same env column in the same "
        "phase; bootstrap calls: in the rollout), 'stored' (train: bit-equal to the rollout state of the same "
        "env one env step before the sequence's first step; RLlib learners and logs whose rollout states the "
        "training process does not hold: any non-zero state, which the framework takes from its stored "
        "states), 'other_env' (bit-equal to the state another env column last returned), 'other' (none of "
        "these).",
        "state",
        since=3,
        values=INITS,
    ),
    Column(
        "init_norm",
        "float32",
        True,
        "L2 norm of this layer's input state (h and c together) where `init` is set; null elsewhere.",
        "state",
        since=3,
    ),
    Column(
        "obs",
        None,
        True,
        "Rollout rows with --capture-obs: the observation the policy saw at this step, flattened (fixed-size "
        "list of float32, length `obs_size` in the metadata; sb3: the model's last observation passed to the "
        "policy, after any VecNormalize; a Dict's keys as `obs_keys` says). Null on other rows and without "
        "--capture-obs (then of length 1).",
        "grid",
        since=4,
        width="obs_size",
        initial="null",
    ),
    Column(
        "info",
        None,
        True,
        "Rollout rows with --info KEY: info[KEY] of the env step whose observation went in (the reset info "
        "at an episode's first step), one float per key in the order of `info_keys` in the metadata (NaN "
        "where the info lacks the key or its value is not a number). Null on other rows and without --info.",
        "grid",
        since=4,
        width="info_keys",
        initial="null",
    ),
    Column("h_norm", "float32", False, "L2 norm of h (computed from the full-precision state).", "state"),
    Column("c_norm", "float32", True, "L2 norm of c (null for GRU).", "state", valid=("has_c",)),
    Column(
        "drift_h",
        "float32",
        True,
        "Train rows: relative L2 distance ||h_train - h_rollout|| / ||h_rollout|| to the rollout state of the "
        "same (module, layer, env, env_step), computed in the probe. Null when there is no rollout partner.",
        "state",
        valid=("has_drift",),
    ),
    Column("drift_c", "float32", True, "As drift_h, for c.", "state", valid=("has_drift", "has_c")),
)


COLUMN_NAMES = [c.name for c in COLUMNS]
COLUMN = {c.name: c for c in COLUMNS}
CODES: dict[str, tuple[str, ...]] = {c.name: c.values for c in COLUMNS if c.values}
"""The values of each string column with fixed values: a row buffer stores their index."""
CODE: dict[str, dict[str, int]] = {name: {v: i for i, v in enumerate(vals)} for name, vals in CODES.items()}

WHAT_IF_METRICS = (
    "value_abs",
    "value_rel",
    "kl",
    "logp_abs",
    "ratio_change",
    "clip_fraction_delta",
    "policy_loss_delta",
    "value_loss_delta",
    "entropy_loss_delta",
    "grad_cos_policy",
    "grad_cos_value",
)
"""The per-minibatch figures of the `what_if` metadata (one list per figure) that the report averages by
epoch: the sb3 integration records them (``integrations/sb3/whatif.py``), the report reads them
(``report/sections/what_if.py``), each with figures of its own besides."""
WHAT_IF_NOISE = ("grad_noise_policy", "grad_noise_value")
"""The stored records' sampling spread of ``grad_cos_policy``/``grad_cos_value`` where the framework's loss draws
random numbers (a sampled entropy estimate; absent elsewhere): per side, the least cosine between two draws of
the copy's own loss gradient from the same states (``measure/whatif.py``, ``report/sections/what_if_noise.py``)."""


def required_columns(version: int) -> frozenset[str]:
    """The columns a log of schema ``version`` has; the newer ones read as null."""
    return frozenset(c.name for c in COLUMNS if c.since <= version)


def vector_width(column: Column, hidden_size: int, metadata: dict[str, Any] | None) -> int:
    """Length of a vector column's lists in a log with this ``hidden_size`` and run metadata."""
    if column.width is None:
        return hidden_size
    value = (metadata or {}).get(column.width)
    n = len(value) if isinstance(value, list | tuple) else int(value) if isinstance(value, int) else 0
    return max(n, 1)


def traced_envs(capture: Any) -> int | None:
    """K of a log written with ``--trace-envs K``, from its ``capture`` metadata entry (envs 0..K-1 keep their
    vectors); None where no K was given or the entry holds no positive count. At most 2**31: the env column
    is int32, so that K covers every env."""
    k = capture.get("trace_envs") if isinstance(capture, dict) else None
    return min(k, 1 << 31) if isinstance(k, int) and not isinstance(k, bool) and k > 0 else None


def summary_capture(meta: dict[str, Any]) -> bool:
    """Whether a log was written with ``--capture summary`` (its metadata's ``capture``)."""
    capture = meta.get("capture")
    return isinstance(capture, dict) and capture.get("mode") == "summary"


def stores_vectors(meta: dict[str, Any]) -> bool:
    """Whether a log's rows may hold h/c vectors: every row's unless it was written with ``--capture summary``;
    the traced envs' rows where ``--trace-envs K`` was given, whatever the mode (``--capture summary
    --trace-envs 16``: envs 0..15 keep their vectors, the others are summary rows)."""
    return not summary_capture(meta) or traced_envs(meta.get("capture")) is not None


def scalar_row_bytes() -> int:
    """Bytes one row takes in a row buffer without its vectors: every scalar column and row flag."""
    scalars = sum(c.dtype.itemsize for c in COLUMNS if c.kind != "vector")
    return scalars + len(ROW_FLAGS) * np.dtype(np.bool_).itemsize


def row_norms(states: np.ndarray) -> np.ndarray:
    """What the h_norm / c_norm columns mean: the L2 norm of each row of ``states`` (n, hidden), in float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.sqrt(np.einsum("ij,ij->i", states, states, dtype=np.float64))


def relative_l2(states: np.ndarray, reference: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """What the drift_h / drift_c columns mean: ||states - reference|| / ||reference|| per row (rows of
    (n, hidden) arrays); a zero reference norm is floored at 1e-12. ``out``: an (n, hidden) array the
    difference may be written into (no new array of that size)."""
    d = np.subtract(states, reference, out=out)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        num = np.sqrt(np.einsum("ij,ij->i", d, d))
        den = np.sqrt(np.einsum("ij,ij->i", reference, reference))
        return num / np.maximum(den, 1e-12)


def state_type(hidden_size: int, float16: bool) -> pa.DataType:
    """Arrow type of the h and c columns."""
    import pyarrow as pa

    return pa.list_(pa.float16() if float16 else pa.float32(), hidden_size)


def log_schema(hidden_size: int, float16: bool, metadata: dict[str, Any] | None = None) -> pa.Schema:
    """The schema of a log whose state vectors have ``hidden_size`` entries."""
    import pyarrow as pa

    fields = []
    for c in COLUMNS:
        if c.type is None:  # the states (float16 with --float16), or float32 vectors of their own width
            width = vector_width(c, hidden_size, metadata)
            arrow_type = pa.list_(pa.float32(), width) if c.width else state_type(hidden_size, float16)
        else:
            arrow_type = pa.type_for_alias(c.type)
        fields.append(pa.field(c.name, arrow_type, nullable=c.nullable, metadata={b"doc": c.doc.encode()}))
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
        "Row groups hold one kind of row each: train rows in some, every other phase in others (so a filter",
        "on `phase` skips row groups by their statistics). Within each kind, rows come in blocks, each of one",
        "module: a run of one-step calls under the same tags (a rollout's steps: its actor rows, then its critic",
        "rows) or one multi-step call, by layer, then batch column and step. So rows are not in call order: sort",
        "by `call` (a stable sort keeps each call's own row order) for the global order.",
        "",
        "## Columns",
        "",
        "| column | type | nullable | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for c in COLUMNS:
        size = c.width or "hidden_size"
        tname = f"fixed_size_list<float32, {size}>" if c.type is None else c.type
        lines.append(f"| `{c.name}` | {tname} | {'yes' if c.nullable else 'no'} | {c.doc} |")
    lines += ["", "## Metadata keys (`lstm_probe.run` JSON)", "", "| key | meaning |", "| --- | --- |"]
    for key, doc in METADATA_KEYS.items():
        lines.append(f"| `{key}` | {doc} |")
    return "\n".join(lines) + "\n"
