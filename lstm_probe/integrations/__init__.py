"""Framework integrations: each module tells the tracer core what a framework's LSTM calls are.

``sb3`` (sb3-contrib RecurrentPPO), ``rllib`` (Ray RLlib's new API stack). Each answers the core's
contract (``lstm_probe.contract``); the core, the writer and the reader never import this package.
"""
