"""Writes tests/data/gymnasium_spaces.json: the spaces of Pendulum-v1 and CartPole-v1 (and an 84x84 image
Box) as each gymnasium writes them into a model.zip's ``data`` (SB3's ``save_util.data_to_json``: the
space's attributes as JSON or as their ``str``; the pickle under ``:serialized:`` dropped, as the safe
reader never reads it), and under ``bounds`` what the spaces hold. Run once per gymnasium version, each
on its own path, e.g.::

    pip install --no-deps --target gym-1.4.0 gymnasium==1.4.0
    PYTHONPATH=gym-1.4.0 python tests/data/gymnasium_spaces.py

Each run adds its version to the file (tests/test_gymnasium_spaces.py reads every version in it).
"""

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.save_util import data_to_json

OUT = Path(__file__).with_suffix(".json")
pendulum, cartpole = gym.make("Pendulum-v1"), gym.make("CartPole-v1")
found = {
    "pendulum_obs": pendulum.observation_space,
    "pendulum_act": pendulum.action_space,
    "cartpole_obs": cartpole.observation_space,
    "cartpole_act": cartpole.action_space,
    "image": spaces.Box(0, 255, (84, 84, 1), np.uint8),
}
entries = json.loads(data_to_json(found))
for entry in entries.values():
    entry.pop(":serialized:", None)
entries["bounds"] = {  # what each space holds in this version, to compare the reader's spaces with
    k: {"low": v.low.tolist(), "high": v.high.tolist()} if isinstance(v, spaces.Box) else {"n": int(v.n)}
    for k, v in found.items()
    if k != "image"
}
doc = json.loads(OUT.read_text()) if OUT.exists() else {}
doc[gym.__version__] = entries
OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
print(f"{OUT.name}: gymnasium {gym.__version__}")
