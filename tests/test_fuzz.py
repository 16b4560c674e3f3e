"""summarize() on odd but schema-valid logs: it returns a Report or a clean BadLog, never a traceback."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lstm_probe
from lstm_probe.schema import COLUMN_NAMES, META_RUN_KEY, META_VERSION_KEY, SCHEMA_VERSION, log_schema

PHASES = ["rollout", "bootstrap", "train", "predict", "other"]


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
    meta = draw(
        st.sampled_from(
            [
                {},
                {"completed": True},
                {"capture": {"mode": "summary"}},
                {"framework": "rllib"},
                {"framework": "rllib", "capture": {"mode": "summary"}},
            ]
        )
    )
    chunk_rows = draw(st.sampled_from([1, 7, 10**9]))  # the report's runs of iterations, one read
    return cols, hidden, meta, chunk_rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(logs())
def test_summarize_never_raises_unexpectedly(tmp_path_factory, log):
    cols, hidden, meta, chunk_rows = log
    schema = log_schema(hidden, metadata=meta)
    arrays = []
    for name in COLUMN_NAMES:
        field = schema.field(name)
        arrays.append(pa.array(cols[name], type=field.type))
    table = pa.Table.from_arrays(arrays, schema=schema.remove_metadata()).replace_schema_metadata(
        {META_VERSION_KEY: str(SCHEMA_VERSION).encode(), META_RUN_KEY: b'{"framework": "fuzz"}'}
    )
    path = tmp_path_factory.mktemp("fuzz") / "f.parquet"
    pq.write_table(table, path)
    try:
        rep = lstm_probe.summarize(path, chunk_rows=chunk_rows)
    except lstm_probe.BadLog:
        return
    assert rep.run.rows == len(cols["call"])
    rep.to_dict()
