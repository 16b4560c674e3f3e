"""The keys of a log's run metadata (JSON under ``lstm_probe.run`` in the Parquet file's key-value metadata),
each with what it holds: the metadata half of the contract that ``schema.py``'s columns are the other half of.
``lstm-probe schema`` prints both; docs/schema.md is that output."""

from __future__ import annotations

from typing import Any

METADATA_KEYS: dict[str, str] = {
    "schema_version": "Version of this schema (also stored under its own key).",
    "lstm_probe_version": "Version of lstm-probe that wrote the log.",
    "framework": "'sb3', 'rllib', 'rsl_rl', 'torchrl' or 'generic'.",
    "versions": "torch, numpy, pyarrow and python versions, and of the libraries the run loaded (stable-baselines3, "
    "sb3-contrib, gymnasium, ray, rsl_rl, torchrl, tensordict).",
    "env_id": "Gymnasium env id (sb3 runs).",
    "algorithm": "Algorithm class name, e.g. RecurrentPPO (RLlib: PPO).",
    "rllib": "RLlib runs: env_runners, learners, envs_per_env_runner, lstm_cell_size, vf_share_layers (its "
    "training settings are under hyperparameters; older logs also repeated rollout_fragment_length, "
    "train_batch_size, minibatch_size, num_epochs, max_seq_len, lr, gamma and lambda here).",
    "shards": "Multi-process logs (read back, not stored): per writing process, completed and progress.",
    "policy": "Policy class name.",
    "hyperparameters": "The algorithm's hyperparameters actually used (RecurrentPPO: n_steps, batch_size, n_epochs, "
    "...; rsl_rl: num_steps_per_env, num_mini_batches, clip_param, ...; RLlib: its AlgorithmConfig's "
    "train_batch_size_per_learner, minibatch_size, num_epochs, max_seq_len, lr, lambda, ...).",
    "seed": "Seed passed to the algorithm (null when none).",
    "n_envs": "Number of envs in the vectorized env.",
    "autoreset_mode": "Own loops given envs= (lstm_probe.trace): the vector env's gymnasium autoreset mode, "
    "'NextStep', 'SameStep' or 'Disabled' (the doctor says what NextStep means for state resets and training data).",
    "total_timesteps": "Env steps asked for by learn() (sb3: counted from the model's first step, as its "
    "num_timesteps is).",
    "start_timesteps": "sb3, only where learn() went on from a trained model (reset_num_timesteps=False): the "
    "model's num_timesteps when the probe started; the log's env_step and iteration count from there, "
    "total_timesteps and progress include the steps before it.",
    "command": "The command line that made the log (CLI runs).",
    "architecture": "modules: {name: {kind, hidden_size, num_layers, input_size; dropout: nn.LSTM/nn.GRU's "
    "dropout between layers, absent for cells and in older logs}}, shared_lstm, "
    "critic ('lstm' | 'shared' | 'mlp'); untraced: {name: {class or kind, hidden_size, num_layers; why}}, the "
    "models the integration left out of the log (rsl_rl's distillation: an MLP teacher, or one of another hidden "
    "size).",
    "capabilities": "What the writing integration's logs can hold (framework, shards, epochs, rollout_buffer, "
    "max_seq_len, stored_states, replay, respond, observe; rollout_start and rollout_zeroed where declared): report "
    "sections ask these, never the framework's name.",
    "not_measurable": "Only where the integration says so: what_if, memory, returns -> why it cannot measure them "
    "for this run (TorchRL: the loss is not a ClipPPOLoss; no collector batch holds the rewards); capabilities then "
    "declare neither replay nor respond (no returns). staleness -> why train rows carry no env step, so no drift "
    "(TorchRL: the loss's samples carry no step_count).",
    "hidden_size": "Length of the h and c vectors.",
    "capture": "'full' | 'summary'; with every_k and dtype ('float32' | 'float16'), and trace_envs K where only env "
    "columns 0..K-1 store vectors, whatever the mode (--trace-envs; padding rows store none), other_envs 'none' "
    "where the other env columns have no rows.",
    "start_time": "UTC ISO time the probe started.",
    "end_time": "UTC ISO time the log was closed (final part only).",
    "completed": "True only when training ran to its end; false after an error or an interruption.",
    "stop_reason": "Null when completed, else what stopped the run (the exception's one-line summary).",
    "progress": "num_timesteps reached, iterations started, calls and rows written.",
    "unsupported_calls": "LSTM calls on inputs the tracer cannot lay out as rows (not in the log; the report warns).",
    "empty_calls": "Only where there were any: LSTM calls with no batch column, so no rows (e.g. a framework "
    "cutting more minibatches than it has envs trains on empty ones; the report warns).",
    "cudnn_tf32": "Only where true: a traced module's weights were on CUDA with cuDNN allowed to compute in TF32 "
    "(torch.backends.cudnn.allow_tf32, PyTorch's default); the report's provenance check then allows 1e-2 "
    "rather than 1e-4 (TF32 keeps a 10-bit mantissa).",
    "final": "True in the metadata of the part that closed the log (absent from parts written before).",
    "minibatch_paths": "sb3 runs: per path of sb3-contrib's _process_sequence ('sequence': one call over "
    "the minibatch, 'stepwise': one call per step because the minibatch holds an episode start), the "
    "minibatches and the training wall seconds the probe measured for them (from one minibatch's "
    "_get_samples to the next, or to the end of train()).",
    "obs_size": "--capture-obs: length of the `obs` vectors (the flattened observation).",
    "obs_keys": "--capture-obs of a Dict observation (sb3) or of several observation groups (rsl_rl): per key or "
    "group, in the order the framework concatenates them, its slice of `obs` (key, start, size; encoding 'one-hot' "
    "for Discrete/MultiDiscrete, else 'values'; space); names obs:KEY[i].",
    "info_keys": "--info: the info keys stored in the `info` vectors, in their order.",
    "returns": "Where the integration declares the returns capability: the episodes that ended in each iteration "
    "(rollout), as source ('monitor': sb3's Monitor info['episode'], raw rewards even under VecNormalize; 'rewards': "
    "the sum of the rewards the algorithm saw; 'normalized': the same where sb3's VecNormalize normalized them "
    "(norm_reward, no Monitor beneath; or a VecMonitor above it, whose episodes sum them); 'rllib': RLlib's "
    "episode metrics; 'user': an own loop's "
    "Tracer.episodes), stride (iterations per entry: past 500 entries neighbours merge, the stride doubling), "
    "episodes, partial (episodes begun before the probe, not counted), best (return, iteration), iterations (RLlib: "
    "the training iterations its env runners collected) and by_iteration: "
    "lists of iteration (an entry's first), episodes, return_sum, return_sq (sum of squares), return_min, return_max "
    "and length_sum. Kept up to date while the run goes (written with every part: a killed run keeps it). A log of "
    "several writing processes (RLlib's env runners) holds {by_shard: {shard: record}}; the record of an "
    "evaluation's process (RLlib's evaluation runners) says evaluation: true, and its episodes are counted apart from "
    "training's.",
    "training_mode": "Per traced module with dropout > 0, every integration: per phase (rollout, train, bootstrap, "
    "value, other), [calls made in training mode, calls]: where dropout acted (nn.LSTM/nn.GRU apply it in training "
    "mode only). Absent where no module has dropout, and in older logs (before this, TorchRL's alone). Kept up to "
    "date while the run goes (published once per iteration where it changed, written with every part: a killed run "
    "keeps its counts up to then). A log of several writing processes (RLlib's env runners and learners) holds their "
    "counts added up.",
    "optimizer_steps": "rsl_rl distillation: the optimizer steps training took (counted by a step hook on its "
    "optimizer). 0 where gradient_length exceeds an update's student calls (epochs x steps): rsl_rl never steps, "
    "its gradients never applied, and the report states no BPTT horizon. Kept up to date while the run goes (written "
    "with every part: a killed run keeps the count of its finished updates); a distillation log without it states no "
    "horizon.",
    "what_if": "--what-if: the counterfactual initial states measured on a copy of the policy (settings, sampling, "
    "records: columnar, per measured minibatch; past 500 iterations every other one is dropped, the stride "
    "doubling). Kept up to date while the run goes (written with every part: a killed run keeps it).",
    "memory": "--memory: the memory horizon measured on a copy of the policy (settings, sampling, lags, episode "
    "lengths, records: columnar, per measured iteration; thinned past 500 iterations as what_if; RLlib: each update's "
    "chunks read to its longest, at most sampling.max_chunk_steps, sampling.cut_updates counting the updates cut). "
    "Kept up to date while the run goes (written with every part: a killed run keeps it).",
    "probe_cost": "What recording cost, measured by the probe while it ran: seconds (start to close, wall), "
    "calls, hook_seconds and integration_seconds (training thread: hooks, the integration's callbacks), "
    "writer (process or thread: where rows were made and written), writer_cpu_seconds and "
    "writer_busy_seconds (that writer process or thread), wait_seconds (training waiting for room in the "
    "writer's queue or pipe); with a writer process on Linux also writer_peak_rss_mb (its peak RSS, shared "
    "libraries included) and writer_peak_private_mb (its peak private memory, sampled each second); with "
    "encoding threads also writer_encode_threads and writer_threaded_row_groups (the row groups they wrote). "
    "Summed over processes in multi-process logs.",
}

LIVE_KEYS: tuple[str, ...] = ("returns", "what_if", "memory", "optimizer_steps", "training_mode")
"""Run metadata the training side keeps up to date while the run goes: carried in the writer's progress and written
beside it with every part (``writer.part_doc``), so that a killed run's log keeps what it had (the reader takes each
shard's last part's; the measurements' from the most authoritative shard that has one, as the close would)."""
SUMMED_LIVE_KEYS: tuple[str, ...] = ("returns",)
"""The live records several shards hold side by side (``{by_shard: ...}``, added up by the report)."""


def live_metadata(metadata: dict[str, Any], records: dict[str, dict[str, Any]], shards: list[str]) -> None:
    """Into ``metadata`` (a log's, as read), the :data:`LIVE_KEYS` records each shard's last part carried
    (``records``: per shard; ``shards``: the most authoritative first). Returns: several shards' side by side
    (``{by_shard: ...}``); a measurement's (what_if, memory) where the close wrote none: the first shard's."""
    for key in LIVE_KEYS:
        held = {s: records[s][key] for s in shards if key in records.get(s, {})}
        if key in SUMMED_LIVE_KEYS:
            if held:
                metadata[key] = next(iter(held.values())) if len(held) == 1 else {"by_shard": held}
            continue
        known = [v for v in held.values() if v is not None]
        if known and metadata.get(key) is None:
            metadata[key] = known[0]
