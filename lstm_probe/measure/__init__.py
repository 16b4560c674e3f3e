"""Measurements on a copy of a policy while it trains, for any framework that provides the capability.

- ``whatif.py``: counterfactual initial states and burn-in (the *evaluate* capability: a framework hands over a
  training minibatch, the rollout it was cut from, and a function that evaluates the minibatch on its copy from
  given initial states);
- ``memory.py``: the memory horizon (the *respond* capability: the rollout's inputs and stored states, and the
  policy's outputs from its recurrent modules' outputs);
- ``copies.py``: the private copies they run on.

The engines know no RL framework; each integration provides its adapter (``integrations/sb3/whatif.py``,
``integrations/rsl_rl/whatif.py``, ...).
"""
