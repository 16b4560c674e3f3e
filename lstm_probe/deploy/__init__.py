"""The deploy layer: what reads, exports and replays a trained policy, framework-neutral.

``spec.py``: the interface (:class:`~lstm_probe.deploy.spec.Spec`, ``Step``, and ``Policy``, what a
framework's ``Loader`` hands the layer: its policy's spec, its step as a torch module with the LSTM state
explicit, its own reference step); ``runtime.py``: a policy's step whatever its form (torch, TorchScript,
ONNX, float16 emulated), an exported file read back, the time steps may take; ``checks.py``: an ONNX graph
checked before onnxruntime runs it; ``foreign.py``: an ONNX policy lstm-probe did not write (rsl_rl's, Isaac
Lab's), its spec inferred from its graph; ``export.py``: ``lstm_probe.export``; ``replay.py``: ``lstm_probe.replay``;
``trace.py``: a recorded run and VecNormalize statistics read and checked. A framework's policy is found through
``integrations.deploy_policy`` (sb3's loader: ``integrations/sb3/deployed.py``, rsl_rl's:
``integrations/rsl_rl/deployed.py``); ``saved.py``: where ``run`` saves the trained model; nothing here imports a
framework. The public entries are ``lstm_probe.export`` and ``lstm_probe.replay``.
"""
