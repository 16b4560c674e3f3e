"""A model.zip cannot make the safe reader allocate past its memory budget (issue #37).

Each hostile zip is crafted here from a genuine ``RecurrentPPO.save`` zip: settings that describe a huge
network, a policy.pth deflate bomb (honest and lying headers), too many members. ``lstm-probe arch`` on it
exits 2 with one line, and the child's peak RSS (``ru_maxrss``, written at exit) stays near the
interpreter's own: the refusal comes before the allocation. Genuine zips still read without ``--env`` or
``--trust-model``, and :func:`model_zip.needs` counts exactly the parameters SB3 builds.
"""

import io
import json
import os
import resource
import struct
import subprocess
import sys
import zipfile
import zlib

import numpy as np
import pytest
from refusals import one_line_error

from lstm_probe import BadInput, load_model
from lstm_probe.integrations.sb3 import model_settings, model_zip

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ENV.pop(model_zip.ENV, None)
PEAK_MB = 600
"""Peak RSS allowed to a refused ``lstm-probe arch`` (the interpreter with torch and SB3 takes ~350 MB)."""
CAP = 4 << 30
"""Cap on the child's heap (RLIMIT_DATA: private writable memory, not the libraries torch maps, which a CUDA
build makes gigabytes of address space), so that a reader which does allocate fails fast instead of taking
the machine. A refused arch holds ~200 MB of it, a genuine one ~350 MB."""
BOMB = 512 << 20
"""Bytes the policy.pth bomb inflates to (~0.5 MB deflated)."""


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (CAP, CAP))


def cli(*args, cwd, cap=True):
    """``lstm-probe ARGS`` in a subprocess (its address space capped at ``CAP`` when ``cap``): the result,
    and the child's peak RSS in MB (None if it died before writing it)."""
    out = cwd / "peak-kb"
    prelude = (
        "import atexit\n"
        # VmHWM starts anew at exec; ru_maxrss would count the RSS of the (large) test process at fork
        "peak = lambda: next(x.split()[1] for x in open('/proc/self/status') if x.startswith('VmHWM'))\n"
        f"atexit.register(lambda: open({str(out)!r}, 'w').write(peak()))\n"
        "from lstm_probe.cli.app import main\nmain()"
    )
    r = subprocess.run(
        [sys.executable, "-c", prelude, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=ENV,
        timeout=300,
        preexec_fn=_cap if cap else None,
    )
    peak = int(out.read_text()) / 1024 if out.exists() else None
    return r, peak


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    """A RecurrentPPO zip saved right after construction (no training)."""
    from sb3_contrib import RecurrentPPO

    path = tmp_path_factory.mktemp("genuine") / "model.zip"
    tiny = {"n_steps": 16, "batch_size": 16, "n_epochs": 1, "seed": 0, "policy_kwargs": {"lstm_hidden_size": 8}}
    RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", device="cpu", **tiny).save(path)
    return path


@pytest.fixture(scope="module")
def bomb():
    """``BOMB`` zero bytes, raw-deflated, and the CRC-32 of what they inflate to."""
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk, parts, crc = bytes(1 << 20), [], 0
    for _ in range(BOMB >> 20):
        parts.append(z.compress(chunk))
        crc = zlib.crc32(chunk, crc)
    parts.append(z.flush())
    return b"".join(parts), crc


def members(src):
    with zipfile.ZipFile(src) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def rewrite(src, dst, edit):
    """A copy of the zip ``src`` with its ``data`` JSON passed through ``edit``."""
    files = members(src)
    doc = json.loads(files["data"])
    edit(doc)
    files["data"] = json.dumps(doc).encode()
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as z:
        for name, raw in files.items():
            z.writestr(name, raw)
    return dst


def raw_zip(dst, entries):
    """A zip written byte by byte: ``entries`` are (name, stored bytes, method, crc, declared size), so a
    header can state what it likes."""
    body, directory = bytearray(), bytearray()
    for name, data, method, crc, size in entries:
        n = name.encode()
        offset = len(body)
        body += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0x21, crc, len(data), size, len(n), 0)
        body += n + data
        directory += struct.pack(
            "<4s6H3L5H2L",
            b"PK\x01\x02",
            20,
            20,
            0,
            method,
            0,
            0x21,
            crc,
            len(data),
            size,
            len(n),
            0,
            0,
            0,
            0,
            0,
            offset,
        )
        directory += n
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(directory), len(body), 0)
    dst.write_bytes(bytes(body + directory + end))
    return dst


def stored(name, data):
    return (name, data, zipfile.ZIP_STORED, zlib.crc32(data), len(data))


# -- (a) settings that describe a huge network -------------------------------------------------------------
def _kwargs(**kw):
    return lambda d: d["policy_kwargs"].update(kw)


def _space(key, **fields):
    return lambda d: d.__setitem__(key, fields)


BOX = "<class 'gymnasium.spaces.box.Box'>"
DISCRETE = "<class 'gymnasium.spaces.discrete.Discrete'>"
HUGE = {
    "hidden-10000": (_kwargs(lstm_hidden_size=10_000), "lstm_hidden_size 10,000"),
    "box-20000x20000": (
        _space(
            "observation_space",
            **{":type:": BOX, "dtype": "float32", "_shape": [20_000, 20_000], "low_repr": "-1.0", "high_repr": "1.0"},
        ),
        "observation space Box(20000, 20000)",
    ),
    "obs-discrete-5e7": (
        _space("observation_space", **{":type:": DISCRETE, "n": "50000000", "start": "0"}),
        "observation space Discrete(50,000,000)",
    ),
    "act-discrete-5e7": (
        _space("action_space", **{":type:": DISCRETE, "n": "50000000", "start": "0"}),
        "action space Discrete(50,000,000)",
    ),
    "net-arch-2^20": (_kwargs(net_arch=[2**20, 2**20]), "net_arch [1048576, 1048576]"),
}


@pytest.mark.parametrize("case", list(HUGE))
def test_settings_of_a_huge_network_are_refused_before_it_is_built(genuine, tmp_path, case):
    edit, named = HUGE[case]
    path = rewrite(genuine, tmp_path / "huge.zip", edit)
    assert path.stat().st_size < 64 << 10
    r, peak = cli("arch", path, cwd=tmp_path)
    line = one_line_error(r, named, "memory budget", "--max-memory")
    assert "--trust-model" not in line  # SB3's load would build the same network
    assert peak is not None and peak < PEAK_MB, f"peak RSS {peak} MB"


# -- (b), (c) policy.pth deflate bombs -----------------------------------------------------------------------
def test_a_policy_pth_bomb_is_refused_before_it_is_inflated(genuine, tmp_path, bomb):
    """The header states the bomb's true size (512 MiB from 0.5 MB): over what the settings' network
    (a few thousand parameters) can hold, so it is never read."""
    data, crc = bomb
    files = members(genuine)
    path = raw_zip(tmp_path / "bomb.zip", [stored("data", files["data"]), ("policy.pth", data, 8, crc, BOMB)])
    assert path.stat().st_size < 1 << 20
    r, peak = cli("arch", path, cwd=tmp_path)
    one_line_error(r, "policy.pth", f"{BOMB:,} bytes")
    assert peak is not None and peak < PEAK_MB, f"peak RSS {peak} MB"


def test_a_header_that_understates_a_member_cannot_make_it_inflate(genuine, tmp_path, bomb):
    """The header says policy.pth is as small as the genuine one; the stream inflates to 512 MiB. The
    read stops a chunk past the stated size."""
    data, crc = bomb
    files = members(genuine)
    small = len(files["policy.pth"])
    path = raw_zip(tmp_path / "liar.zip", [stored("data", files["data"]), ("policy.pth", data, 8, crc, small)])
    r, peak = cli("arch", path, cwd=tmp_path)
    one_line_error(r, "policy.pth")
    assert peak is not None and peak < PEAK_MB, f"peak RSS {peak} MB"


def test_a_lying_data_member_is_refused(genuine, tmp_path, bomb):
    data, crc = bomb
    path = raw_zip(tmp_path / "data-liar.zip", [("data", data, 8, crc, 4096), stored("policy.pth", b"x")])
    with pytest.raises(BadInput, match="its data"):
        load_model(str(path))


def test_a_compressed_record_inside_policy_pth_is_refused(genuine, tmp_path):
    """torch.save stores its records; a deflated one would be inflated by torch's own reader."""
    files = members(genuine)
    inner = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(files["policy.pth"])) as src, zipfile.ZipFile(inner, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    files["policy.pth"] = inner.getvalue()
    path = raw_zip(tmp_path / "inner.zip", [stored(n, b) for n, b in files.items()])
    with pytest.raises(BadInput, match="compressed records"):
        load_model(str(path))


def test_too_many_members_are_refused_before_the_directory_is_parsed(genuine, tmp_path):
    files = members(genuine)
    extra = [stored(f"pad{i}", b"") for i in range(model_zip.MAX_MEMBERS + 1)]
    path = raw_zip(tmp_path / "many.zip", [stored(n, b) for n, b in files.items()] + extra)
    with pytest.raises(BadInput, match="members"):
        load_model(str(path))


def test_a_directory_larger_than_stated_bounds_is_refused(tmp_path):
    """An end record claiming a 100 MB directory of a million members: refused from the end record alone."""
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 100 << 20, 0, 0)
    path = tmp_path / "directory.zip"
    path.write_bytes(b"\0" * 64 + end)
    with pytest.raises(BadInput, match="zip directory"):
        load_model(str(path))


# -- (c2) weights and LSTM settings no policy acts on (issue #46) -------------------------------------------
def with_weights(src, dst, edit):
    """A copy of the zip ``src`` with its policy.pth's state dict passed through ``edit``."""
    import torch

    files = members(src)
    state = torch.load(io.BytesIO(files["policy.pth"]), weights_only=True)
    edit(state)
    buf = io.BytesIO()
    torch.save(state, buf)
    files["policy.pth"] = buf.getvalue()
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as z:
        for name, raw in files.items():
            z.writestr(name, raw)
    return dst


def _set(key, value):
    def edit(state):
        state[key][0, 0] = value

    return edit


def _sparse(state):
    state["lstm_actor.weight_hh_l0"] = state["lstm_actor.weight_hh_l0"].to_sparse()


WEIGHTS = {
    "nan": (_set("lstm_actor.weight_hh_l0", float("nan")), "lstm_actor.weight_hh_l0 holds NaN or infinite"),
    "inf": (_set("value_net.weight", float("-inf")), "value_net.weight holds NaN or infinite"),
    "sparse": (_sparse, "lstm_actor.weight_hh_l0 is a sparse_coo tensor"),
}


@pytest.mark.parametrize("case", list(WEIGHTS))
@pytest.mark.parametrize("command", ["arch", "export", "replay"])
def test_weights_no_policy_acts_on_are_refused_in_one_line(genuine, tmp_path, case, command):
    """NaN weights failed in arch's rollout with a torch ValueError (exit 1), inf ones were analysed as if
    nothing was wrong, sparse ones failed with NotImplementedError: refused now, before anything is built."""
    edit, named = WEIGHTS[case]
    path = with_weights(genuine, tmp_path / f"{case}.zip", edit)
    args = {
        "arch": ["arch", path],
        "export": ["export", path, tmp_path / "p.onnx", "--env", "Pendulum-v1"],
        "replay": ["replay", tmp_path / "trace.csv", "--policy", path],  # the policy is read before the trace
    }[command]
    r, peak = cli(*args, cwd=tmp_path)
    line = one_line_error(r, f"{path.name} as a RecurrentPPO model", named)
    assert "--trust-model" not in line
    assert peak is not None and peak < PEAK_MB, f"peak RSS {peak} MB"
    assert not (tmp_path / "p.onnx").exists()


@pytest.mark.parametrize("lstm_kwargs", [{"bidirectional": True}, {"proj_size": 4}])
@pytest.mark.parametrize("trust", [False, True])
def test_an_lstm_recurrentppo_cannot_run_is_refused_before_its_weights_are_read(tmp_path, lstm_kwargs, trust):
    """A genuine zip of a RecurrentPPO built with lstm_kwargs bidirectional=True or proj_size > 0: SB3 saves
    it, but its policy fails in its first forward pass. The safe reader blamed the weights and suggested
    --trust-model (with a zip whose weights did fit, arch failed in its rollout); refused now, either way."""
    from sb3_contrib import RecurrentPPO

    path = tmp_path / "model.zip"
    kwargs = {"lstm_hidden_size": 8, "lstm_kwargs": lstm_kwargs}
    RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", n_steps=16, batch_size=16, policy_kwargs=kwargs, device="cpu").save(
        path
    )
    r, _ = cli("arch", path, *(["--trust-model"] if trust else []), cwd=tmp_path)
    named = "bidirectional" if "bidirectional" in lstm_kwargs else "proj_size 4"
    line = one_line_error(r, "cannot run such an LSTM", named)
    assert "--trust-model" not in line


# -- (d) genuine zips still read, without --env or --trust-model ----------------------------------------
def test_a_genuine_zip_reads_without_env_or_trust(genuine, tmp_path):
    r, peak = cli("arch", genuine, "--json", cwd=tmp_path, cap=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["policy"] == "RecurrentActorCriticPolicy"
    assert peak is not None


def _env(obs, act):
    """A VecEnv of one env on the given spaces (for the Cnn and MultiInput policies)."""
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv

    class Env(gym.Env):
        observation_space, action_space = obs, act

        def reset(self, seed=None, options=None):
            return self.observation_space.sample(), {}

        def step(self, action):
            return self.observation_space.sample(), 0.0, False, False, {}

    return DummyVecEnv([Env])


def _spaces():
    from gymnasium import spaces

    image = spaces.Box(0, 255, (3, 40, 40), np.uint8)
    return {
        "box": ("MlpLstmPolicy", spaces.Box(-1, 1, (5,), np.float32), spaces.Box(-2, 2, (2,), np.float32)),
        "discrete": ("MlpLstmPolicy", spaces.Discrete(7), spaces.Discrete(3)),
        "multibinary": ("MlpLstmPolicy", spaces.MultiBinary(4), spaces.MultiDiscrete([2, 3])),
        "image": ("CnnLstmPolicy", image, spaces.Discrete(4)),
        "dict": (
            "MultiInputLstmPolicy",
            spaces.Dict({"v": spaces.Box(-1, 1, (3,)), "im": image}),
            spaces.MultiBinary(2),
        ),
    }


KWARGS = [
    {"lstm_hidden_size": 8},
    {"lstm_hidden_size": 8, "n_lstm_layers": 2, "net_arch": [16], "shared_lstm": True, "enable_critic_lstm": False},
    {"lstm_hidden_size": 6, "enable_critic_lstm": False, "net_arch": {"pi": [12, 4], "vf": []}},
    {"lstm_hidden_size": 8, "share_features_extractor": False, "lstm_kwargs": {"proj_size": 3, "bidirectional": True}},
]


@pytest.mark.parametrize("kind", ["box", "discrete", "multibinary", "image", "dict"])
@pytest.mark.parametrize("k", range(len(KWARGS)))
def test_the_size_check_counts_what_sb3_builds(tmp_path, kind, k):
    """The parameters :func:`model_zip.needs` counts from the settings are exactly those SB3 builds, and the
    genuine zip reads back without --env (Dict spaces: with the env, as before)."""
    from sb3_contrib import RecurrentPPO

    policy, obs, act = _spaces()[kind]
    env = _env(obs, act)
    use_sde = kind == "box" and k == 0
    model = RecurrentPPO(policy, env, n_steps=8, batch_size=8, use_sde=use_sde, policy_kwargs=KWARGS[k], device="cpu")
    path = tmp_path / "model.zip"
    model.save(path)
    built = sum(p.numel() for p in model.policy.parameters())
    data = model_zip.read_data(path)
    for given in [env] if kind == "dict" else [env, None]:
        plan = model_settings.make_plan(data, given)
        model_settings.needs(plan)
        assert plan.params == built
    if kind != "dict" and "lstm_kwargs" in KWARGS[k]:  # sized, but a policy that cannot act (issue #46)
        with pytest.raises(BadInput, match="cannot run such an LSTM"):
            model_zip.load(path)
    elif kind == "image" and data["observation_space"]["low_repr"] is None:  # gymnasium >= 1.3: stated in part
        with pytest.raises(BadInput, match=r"stated in part only .* pass --env ENV_ID"):
            model_zip.load(path)
        assert sum(p.numel() for p in model_zip.load(path, env).policy.parameters()) == built
    elif kind != "dict":
        loaded = model_zip.load(path)
        assert sum(p.numel() for p in loaded.policy.parameters()) == built


# -- the budget ----------------------------------------------------------------------------------------
def test_the_budget_can_be_raised(tmp_path, monkeypatch):
    """sb3-contrib's default LSTM (hidden 256: ~0.6 M parameters) is refused under a 4 MiB budget, naming
    the setting, and reads under a larger one: by argument or by LSTM_PROBE_MAX_MEMORY."""
    from sb3_contrib import RecurrentPPO

    path = tmp_path / "default.zip"
    RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", n_steps=16, batch_size=16, device="cpu").save(path)
    named = r"over the 4 MiB memory budget \(most of it lstm_hidden_size 256 .*--max-memory"
    with pytest.raises(BadInput, match=named):
        model_zip.load(path, max_bytes="4M")
    assert model_zip.load(path, max_bytes=64 << 20).policy.lstm_actor.hidden_size == 256
    monkeypatch.setenv(model_zip.ENV, "4MiB")
    with pytest.raises(BadInput, match="4 MiB memory budget"):
        model_zip.load(path)
    monkeypatch.setenv(model_zip.ENV, "0.5G")
    assert model_zip.budget() == 512 << 20
    assert model_zip.load(path).policy.lstm_actor.hidden_size == 256
    monkeypatch.setenv(model_zip.ENV, "lots")
    with pytest.raises(BadInput, match=model_zip.ENV):
        model_zip.load(path)


@pytest.mark.parametrize(
    ("text", "value"),
    [("4G", 4 << 30), ("512MiB", 512 << 20), ("1.5g", 3 << 29), ("2000000", 2_000_000), (1 << 30, 1 << 30)],
)
def test_parse_bytes(text, value):
    assert model_zip.parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "4X", "-1G", "1k", "lots"])
def test_parse_bytes_refuses(text):
    with pytest.raises(BadInput):
        model_zip.parse_bytes(text)
