"""An exported policy file run as a deployed loop runs it, read with onnxruntime / torch.jit alone (never
through lstm-probe): shared by the deploy tests of each framework, which compare it with the framework's own
policy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch


def file_run(path: Path, obs, starts):
    """One env's steps through the file at ``path``: actions, values (steps,), new states (states, layers,
    step, hidden), its metadata. Observations are cast to float32, as a deployed loop feeds them."""
    if path.suffix == ".onnx":
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path))
        meta = json.loads(sess.get_modelmeta().custom_metadata_map["lstm_probe.deploy"])
        names = [i.name for i in sess.get_inputs()][2:]

        def run(o, s, state):
            return sess.run(None, {"obs": o, "episode_start": s, **dict(zip(names, state, strict=True))})

    else:
        files = {"lstm_probe.deploy.json": ""}
        module = torch.jit.load(str(path), _extra_files=files)
        meta = json.loads(files["lstm_probe.deploy.json"])
        names = [n["name"] if isinstance(n, dict) else n for n in meta["inputs"]][2:]

        def run(o, s, state):
            with torch.no_grad():
                res = module(torch.as_tensor(o), torch.as_tensor(s), *map(torch.as_tensor, state))
            return [r.numpy() for r in res]

    state = [np.zeros((meta["layers"], 1, meta["hidden"]), np.float32) for _ in names]
    actions, values, new = [], [], []
    for o, s in zip(obs, starts, strict=True):
        action, value, *state = run(o[None].astype(np.float32), np.array([float(s)], np.float32), state)
        actions.append(action)
        values.append(np.reshape(value, (1,)))  # one value per step
        new.append(np.stack(state))
    return np.concatenate(actions), np.concatenate(values), np.concatenate(new, axis=2), meta


def relative(got, want) -> float:
    """max |got - want| over the largest |want|, of arrays of one shape (never broadcast)."""
    assert np.shape(got) == np.shape(want), (np.shape(got), np.shape(want))
    return float(np.abs(got - want).max() / np.abs(want).max())
