"""summarize() on odd but schema-valid logs: it returns a Report or a clean BadLog, never a traceback."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lstm_probe
from lstm_probe.log.schema import COLUMN_NAMES, META_RUN_KEY, META_VERSION_KEY, SCHEMA_VERSION, log_schema

PHASES = ["rollout", "bootstrap", "train", "predict", "other"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
"""Any JSON value: what a foreign or damaged writer may have put under a known key."""


def maybe_json(value):
    return st.one_of(value, JSON)


@st.composite
def run_metadata(draw, hidden):
    """Run metadata as the sb3, RLlib, generic and summary logs carry it, each key present or not, well
    formed or any JSON."""
    framework = draw(st.sampled_from(["sb3", "rllib", "generic", "fuzz"]))
    keys = {
        "framework": maybe_json(st.just(framework)),
        "hidden_size": st.just(hidden),
        "capture": maybe_json(
            st.fixed_dictionaries(
                {"mode": st.sampled_from(["full", "summary"]), "every": st.integers(1, 4)},
                optional={"dtype": st.sampled_from(["float32", "float16"])},
            )
        ),
        "n_envs": maybe_json(st.integers(1, 4)),
        "env_id": maybe_json(st.sampled_from(["Pendulum-v1", "CartPole-v1"])),
        "total_timesteps": maybe_json(st.integers(0, 10**6)),
        "start_time": maybe_json(st.just("2026-01-01T00:00:00+00:00")),
        "architecture": maybe_json(
            st.fixed_dictionaries(
                {"modules": st.just({"actor": {"hidden_size": hidden, "kind": "LSTM", "num_layers": 2}})},
                optional={
                    "gradient_flow": st.fixed_dictionaries(
                        {"verdict": st.text(max_size=10), "shared": st.booleans(), "gradient_flow": JSON}
                    ),
                    "critic": st.sampled_from(["lstm", "mlp", "shared"]),
                },
            )
        ),
        "capabilities": maybe_json(st.dictionaries(st.sampled_from(["rollout", "train", "drift"]), st.booleans())),
    }
    if framework == "rllib":
        keys["rllib"] = maybe_json(
            st.fixed_dictionaries(
                {"env_runners": st.integers(0, 3), "max_seq_len": st.integers(1, 20), "num_epochs": st.integers(1, 3)}
            )
        )
    present = draw(st.lists(st.sampled_from(sorted(keys)), unique=True))
    return {k: draw(keys[k]) for k in present if k != "hidden_size"} | {"hidden_size": hidden}


@st.composite
def final_metadata(draw):
    """The outcome a closed log's last part carries (or none: a killed run's journal)."""
    if draw(st.booleans()):
        return None
    return {
        "final": True,
        "completed": draw(maybe_json(st.booleans())),
        "stop_reason": draw(maybe_json(st.text(max_size=12))),
        "progress": draw(
            maybe_json(st.fixed_dictionaries({}, optional={"num_timesteps": st.integers(0, 10**6), "rows": JSON}))
        ),
        "probe_cost": draw(maybe_json(st.dictionaries(st.sampled_from(["seconds", "writer"]), JSON))),
    }


@st.composite
def logs(draw):
    n = draw(st.integers(0, 60))
    hidden = draw(st.sampled_from([1, 3, 300]))
    nan_everywhere = draw(st.booleans())
    only_padding = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    phases = draw(st.lists(st.sampled_from(PHASES), min_size=n, max_size=n))
    envs = rng.integers(0, draw(st.integers(1, 3)), n)

    def maybe(values, p=0.2):
        return [None if rng.random() < p else v for v in values]

    cols = {
        "call": np.arange(n) // draw(st.integers(1, 4)),
        "module": [draw(st.sampled_from(["actor", "critic"])) for _ in range(n)],
        "layer": rng.integers(0, 2, n).astype(np.int16),
        "phase": phases,
        "path": [draw(st.sampled_from(["step", "sequence", "stepwise"])) for _ in range(n)],
        "bootstrap": [("last" if p == "bootstrap" else None) for p in phases],
        "iteration": maybe(rng.integers(0, 3, n).tolist()),
        "epoch": maybe(rng.integers(0, 2, n).tolist(), 0.3),
        "minibatch": maybe(rng.integers(0, 2, n).tolist(), 0.3),
        "seq": maybe(rng.integers(0, 3, n).tolist(), 0.3),
        "t": rng.integers(-1, 5, n).astype(np.int32),
        "seq_len": maybe(rng.integers(0, 6, n).tolist(), 0.3),
        "seq_reason": maybe(
            [
                draw(st.sampled_from(["split", "episode_start", "env_boundary", "minibatch_cut", "max_seq_len"]))
                for _ in range(n)
            ],
            0.3,
        ),
        "padding": [only_padding or bool(x) for x in rng.integers(0, 2, n)],
        "worker": maybe(rng.integers(0, 2, n).tolist(), 0.5),
        "learner": maybe(rng.integers(0, 2, n).tolist(), 0.7),
        "env": maybe(envs.tolist()),
        "env_step": maybe(rng.integers(0, 50, n).tolist()),
        "episode": maybe(rng.integers(0, 3, n).tolist()),
        "episode_step": maybe(rng.integers(0, 50, n).tolist()),
        "episode_start": maybe(rng.integers(0, 2, n).astype(bool).tolist()),
    }
    h = np.full((n, hidden), np.nan, np.float32) if nan_everywhere else rng.normal(size=(n, hidden)).astype(np.float32)
    cols["h"] = maybe(list(h), 0.1)
    cols["c"] = maybe(list(h * 2), 0.3)
    norms = np.linalg.norm(h, axis=1).astype(np.float32) if n else np.zeros(0, np.float32)
    cols["h_norm"] = norms
    cols["c_norm"] = maybe(norms.tolist())
    cols["drift_h"] = maybe(rng.random(n).astype(np.float32).tolist(), 0.5)
    cols["drift_c"] = maybe(rng.random(n).astype(np.float32).tolist(), 0.5)
    meta = draw(run_metadata(hidden))
    final = draw(final_metadata())
    chunk_rows = draw(st.sampled_from([1, 7, 10**9]))  # the report's runs of iterations, one read
    return cols, hidden, meta, final, chunk_rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(logs())
def test_summarize_never_raises_unexpectedly(tmp_path_factory, log):
    import json

    from lstm_probe.log.writer import META_FINAL_KEY

    cols, hidden, meta, final, chunk_rows = log
    n = len(cols["call"])
    schema = log_schema(hidden, False, metadata=meta)
    arrays = []
    for name in COLUMN_NAMES:
        field = schema.field(name)
        # a column this generator does not know yet: all null
        arrays.append(pa.array(cols[name], type=field.type) if name in cols else pa.nulls(n, field.type))
    kv = {META_VERSION_KEY: str(SCHEMA_VERSION).encode(), META_RUN_KEY: json.dumps(meta).encode()}
    if final is not None:
        kv[META_FINAL_KEY] = json.dumps(final).encode()
    table = pa.Table.from_arrays(arrays, schema=schema.remove_metadata()).replace_schema_metadata(kv)
    path = tmp_path_factory.mktemp("fuzz") / "f.parquet"
    pq.write_table(table, path)
    try:
        info = lstm_probe.read_info(path)
    except lstm_probe.BadLog:
        return
    for key, value in meta.items():  # the drawn metadata is what the report reads (ill-typed: dropped, said)
        if key in info.metadata:
            assert info.metadata[key] == value or (final is not None and key in final), key
        else:
            assert any(f"metadata {key!r}" in w for w in info.warnings), key
    try:
        rep = lstm_probe.summarize(path, chunk_rows=chunk_rows)
    except lstm_probe.BadLog:
        return
    assert rep.run.rows == len(cols["call"])
    rep.to_dict()
