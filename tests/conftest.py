import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

# Bit-identity holds only at a fixed thread count (1- and 2-thread runs differ even without a probe).
torch.set_num_threads(1)

TINY = {"n_steps": 32, "batch_size": 16, "n_epochs": 2, "hidden_size": 16, "steps": 192}


@pytest.fixture(scope="session", autouse=True)
def _sb3_logdir(tmp_path_factory):
    """sb3's default logger makes a directory per learn() (SB3_LOGDIR, else a new one in the temp dir):
    tests that build RecurrentPPO themselves put it under pytest's temp dirs."""
    os.environ.setdefault("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3-logs")))


_DISTRIBUTION_CHECKS = torch.distributions.Distribution._validate_args  # torch's default, before any import


@pytest.fixture(autouse=True)
def _distribution_checks(request):
    """rsl_rl (modules/distribution.py, in its policy's constructor) and TorchRL (on import, in
    modules/distributions/continuous.py) turn torch's distribution argument checks off for the whole process;
    sb3's tests expect torch's default (a NaN action mean raises ValueError). Each test runs with torch's
    default, or with its module's DISTRIBUTION_CHECKS (what its framework sets)."""
    torch.distributions.Distribution.set_default_validate_args(
        getattr(request.module, "DISTRIBUTION_CHECKS", _DISTRIBUTION_CHECKS)
    )
    yield
    torch.distributions.Distribution.set_default_validate_args(_DISTRIBUTION_CHECKS)


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


_cache: dict = {}


def probed_run(runs_dir, env_id="Pendulum-v1", **overrides):
    """One real probed RecurrentPPO run per configuration, shared by the tests of a session."""
    from lstm_probe import run

    opts = {**TINY, **overrides}
    key = (env_id, tuple(sorted(opts.items())))
    if key not in _cache:
        name = f"{env_id}-{abs(hash(key))}.parquet"
        _cache[key] = run(env_id, runs_dir / name, seed=0, force=True, **opts)
    return _cache[key]
