"""The torch device a training run (``lstm-probe run``) trains on, checked before anything is built: sb3's
``--device`` and rsl_rl's take the same words (``auto``, ``cpu``, ``cuda``, ``cuda:1``, ...) and refuse the same
way, in one line."""

from __future__ import annotations

from lstm_probe.errors import BadInput


def checked(device: str) -> str:
    """``device`` as torch names it (``auto``: CUDA where torch sees one, else the CPU); :class:`BadInput` for a
    word torch does not take or CUDA asked for where torch sees none."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        torch.device(device)
    except RuntimeError as exc:
        raise BadInput(f"--device {device!r}: {exc}") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BadInput(f"--device {device}: CUDA is not available here; use --device cpu")
    return device
