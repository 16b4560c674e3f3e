"""Open a saved RecurrentPPO model.zip without unpickling anything from it, within a memory budget.

SB3's own load (``stable_baselines3/common/save_util.py:load_from_zip_file`` -> ``json_to_data``)
base64-decodes and cloudpickles every ``":serialized:"`` entry of the zip's ``data`` JSON (the policy
class, the spaces, the schedules, ``_last_obs``...): a crafted zip runs code on load. This reader takes
only what the zip states as data:

- from ``data``: the plain JSON fields (n_steps, batch_size, gamma...), the policy class by name (the
  plain-text ``__module__`` and ``__init__`` repr SB3 writes beside the pickle, matched against the three
  sb3-contrib recurrent policies), ``policy_kwargs`` when plain JSON (or a pickled dict whose entries are
  JSON or name an allowed torch/SB3 class), and the spaces from the plain-text fields SB3 writes beside
  each pickled space (``data_to_json`` adds an object's first-level attributes: Box dtype, shape and
  bounds as printed, Discrete n and start...), or from ``--env``'s env;
- the weights: ``policy.pth`` through ``torch.load(..., weights_only=True)``, loaded with
  ``strict=True`` into the policy built from the above (a mismatch is refused).

Whatever cannot be read that way is refused with one line naming ``--trust-model`` (SB3's full load,
for files whose author you trust). Schedules are read when they are SB3 constants
(``ConstantSchedule(val=...)``); otherwise the default stands in: ``arch`` never takes an optimizer step.

A few KB of settings can describe a network of terabytes, and a few MB of deflate can inflate to
gigabytes, so nothing is allocated before it is sized (:func:`load`'s ``max_bytes``, the memory budget):

1. the zip's central directory (members, bytes) from its end record, before ``zipfile`` parses it;
2. ``data``: its declared size, read through a bounded stream (:func:`_bounded`: a header that lies
   about the size stops the read), its JSON's item count and depth before and after parsing;
3. the spaces (shapes, dtypes, counts) and the network the settings describe (:func:`needs`: features
   extractor, LSTMs, net_arch, action net, rollout buffer), in exact integer arithmetic, before any
   gymnasium space, tensor or buffer is made;
4. ``policy.pth``: no larger than the network's weights (plus torch's zip framing), read through the
   bounded stream; its inner zip stored (not compressed) records only, summing to no more than it holds,
   before ``torch.load`` reads it from memory.

A refusal over the budget names the setting that makes the network big and how to raise the budget.

Step 3 and the build are :mod:`model_settings`' (the settings as plain data, sized, then built); this module
holds the zip's bounds and the order of the steps.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from lstm_probe.errors import BadInput
from lstm_probe.integrations.sb3.model_settings import MAX_COUNT, Unsafe, build_model, first_line, make_plan, needs
from lstm_probe.log.budget import DEFAULT_BYTES, ENV, limit, open_regular, parse_bytes, words

MAX_MODEL_BYTES = DEFAULT_BYTES
"""Default memory budget (2 GiB) for reading and analysing one model.zip, as :func:`needs` counts it. A laptop
has it to spare, and it is far above genuine recurrent policies: sb3-contrib's defaults hold ~0.6 M
parameters (~80 MiB counted, with a 2048 x 8 rollout buffer), an Atari CnnLstmPolicy ~3.3 M (~120 MiB),
lstm_hidden_size 1024 with net_arch [1024, 1024] ~12.7 M (~560 MiB). Only a file that describes a far
larger network (or a bomb) meets it. Raised with ``load(max_bytes=...)`` (the CLI's ``--max-memory``) or
the ``LSTM_PROBE_MAX_MEMORY`` environment variable."""
MAX_DATA_BYTES = 64 << 20
"""Largest ``data`` JSON read (SB3 writes a few KB; pickled ``_last_obs`` of image envs some MB)."""
MAX_JSON_ITEMS = 1 << 20
"""Most ``{``, ``[`` and ``,`` in ``data`` (each can become a Python object of ~100 bytes once parsed): SB3
writes a few hundred (its base64 pickles hold none)."""
MAX_JSON_DEPTH = 32
"""Deepest nesting accepted in ``data`` (SB3 writes 3 or 4 levels)."""
MAX_MEMBERS = 256
"""Most members in the zip (SB3 writes 6)."""
MAX_DIRECTORY_BYTES = 1 << 20
"""Largest central directory (SB3's is under 1 KB); ``zipfile`` holds it, and an object per member."""
CHUNK = 1 << 20
"""Bytes decompressed at a time by :func:`_bounded`."""


def refusal(path: str | Path, why: str) -> BadInput:
    """The one line shown when the safe reader cannot build the model."""
    return BadInput(
        f"{path}: {why}; lstm-probe does not unpickle a model by default (that can run code stored in it): "
        "pass --trust-model for SB3's full load if you trust this file"
    )


# -- the budget ----------------------------------------------------------------------------------------
def budget(max_bytes: int | str | None = None) -> int:
    """The budget in bytes: ``max_bytes`` when given, else the one every read has (``lstm_probe.log.budget``:
    ``--max-memory``, ``LSTM_PROBE_MAX_MEMORY``, 2 GiB)."""
    return parse_bytes(max_bytes) if max_bytes is not None else limit()


def _over(path: str | Path, need: int, limit: int, parts: list[tuple[int, str]]) -> BadInput:
    """The refusal of a network over the budget, naming the setting behind its largest part."""
    part, what = max(parts)
    return BadInput(
        f"{path}: the network its settings describe would take ~{words(need)} to read and analyse, over the "
        f"{words(limit)} memory budget (most of it {what}: {words(part)}); if the model is really that large, "
        f"raise the budget with --max-memory SIZE (or {ENV}=SIZE)"
    )


# -- the entry point -----------------------------------------------------------------------------------
def load(path: str | Path, env: Any = None, *, max_bytes: int | str | None = None) -> Any:
    """A RecurrentPPO built from the zip's plain data and weights (see the module docstring); ``env``
    (a VecEnv) supplies the spaces and allows a real rollout. ``max_bytes``: the memory budget (bytes or a
    size like ``"4G"``; default: :func:`budget`), which the network the zip describes, with its weights,
    must fit. Raises BadInput (see :func:`refusal`) on whatever cannot be read safely."""
    limit = budget(max_bytes)
    try:
        with _open(Path(path)) as archive:
            data = _data(archive, path, limit)
            plan = make_plan(data, env)
            runnable(path, plan.policy_kwargs)
            parts = needs(plan)
            total = sum(b for b, _ in parts)
            if total > limit:
                raise _over(path, total, limit, parts)
            weights = _weights(archive, path, plan.pth_bytes, limit)
        state = _state(weights)
        del weights
        check_weights(path, state)
        return build_model(plan, state, env)
    except Unsafe as exc:
        raise refusal(path, str(exc)) from None


def read_data(path: str | Path, max_bytes: int | str | None = None) -> dict[str, Any]:
    """The zip's ``data`` JSON, read within the same bounds as :func:`load` (BadInput otherwise)."""
    limit = budget(max_bytes)
    with _open(Path(path)) as archive:
        return _data(archive, path, limit)


def runnable(path: str | Path, policy_kwargs: dict[str, Any]) -> None:
    """Refuse (one line, before the weights are read) settings that build an ``nn.LSTM`` RecurrentPPO's
    policy cannot run: a bidirectional LSTM or one with ``proj_size`` (its states, its rollout buffer and the
    heads after it all take one direction of ``lstm_hidden_size``). SB3's own load builds such a policy and
    fails in its first forward pass; no ``--trust-model`` helps."""
    kw = policy_kwargs.get("lstm_kwargs")
    if not isinstance(kw, dict):
        return  # needs() refuses what is not a dict
    why = "RecurrentPPO's policy cannot run such an LSTM (its states and the heads after it are one direction "
    why += "of lstm_hidden_size wide); train the model without it"
    if kw.get("bidirectional") not in (None, False):
        raise _broken(path, f"its policy_kwargs ask for a bidirectional LSTM (lstm_kwargs bidirectional=True); {why}")
    proj = kw.get("proj_size")
    if proj not in (None, 0, False):
        raise _broken(path, f"its policy_kwargs ask for an LSTM with proj_size {str(proj)[:40]}; {why}")


def check_weights(path: str | Path, state: Mapping[str, Any]) -> None:
    """Refuse (one line) weights no policy acts on: sparse (or other non-dense) tensors, which SB3 never
    saves and ``load_state_dict`` cannot take, and NaN or infinite values (the action distribution fails, or
    a head answers inf, in the first step)."""
    import torch

    for name, value in state.items():
        shown = str(name)[:80]
        if value.layout != torch.strided:
            raise _broken(
                path,
                f"its weight {shown} is a {str(value.layout).removeprefix('torch.')} tensor, not "
                "a dense one as SB3 saves; re-save the model with SB3",
            )
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise _broken(
                path,
                f"its weight {shown} holds NaN or infinite values (training diverged?): a policy "
                "with them cannot act; use a checkpoint from before it diverged",
            )


# -- the zip --------------------------------------------------------------------------------------------
def _broken(path: str | Path, why: str) -> BadInput:
    """A file no loader could read: a BadInput that does not suggest --trust-model."""
    return BadInput(f"cannot load {path} as a RecurrentPPO model: {why}")


class _Archive:
    """A ``zipfile.ZipFile`` opened once its central directory is known to be small, whose read errors are
    one-line BadInputs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: BinaryIO | None = None
        self.zip: zipfile.ZipFile | None = None

    def __enter__(self) -> zipfile.ZipFile:
        try:
            # a FIFO or device named model.zip is refused, not waited on; closed in __exit__
            self.file = open_regular(self.path, "pass a saved RecurrentPPO model.zip")
            members, size = _directory(self.file)
            if members > MAX_MEMBERS or size > MAX_DIRECTORY_BYTES:
                raise _broken(
                    self.path,
                    f"its zip directory lists {members:,} members in {size:,} bytes, over the "
                    f"{MAX_MEMBERS} members in {MAX_DIRECTORY_BYTES:,} bytes this reader takes (SB3 writes 6)",
                )
            self.zip = zipfile.ZipFile(self.file)
            if len(self.zip.infolist()) > MAX_MEMBERS:
                raise _broken(self.path, f"it has over {MAX_MEMBERS} members (SB3 writes 6)")
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, struct.error) as exc:
            self.__exit__()
            raise _broken(self.path, f"it is not a readable zip file ({first_line(exc)})") from None
        except BaseException:
            self.__exit__()
            raise
        return self.zip

    def __exit__(self, *exc: object) -> None:
        if self.zip is not None:
            self.zip.close()
        if self.file is not None:
            self.file.close()


def _open(path: Path) -> _Archive:
    return _Archive(path)


def _directory(f: BinaryIO) -> tuple[int, int]:
    """The member count and central directory size a zip's end records state, found as ``zipfile`` finds
    them (``_EndRecData``: the last 22 bytes, else the last signature within 64 KiB; a zip64 record before
    its locator, or where the locator points); ``(0, 0)`` when there is none (``zipfile`` refuses it)."""
    f.seek(0, 2)
    size = f.tell()
    start = max(0, size - (1 << 16) - 22)
    f.seek(start)
    tail = f.read()
    at = len(tail) - 22 if tail[-22:-18] == b"PK\x05\x06" else tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return 0, 0
    fields = struct.unpack("<4s4H2LH", tail[at : at + 22])
    members, directory = max(fields[3], fields[4]), fields[5]
    locator = start + at - 20
    if locator >= 0:
        f.seek(locator)
        loc = f.read(20)
        if loc[:4] == b"PK\x06\x07":
            offset = struct.unpack("<4sLQL", loc)[2]
            for where in {locator - 56, offset}:  # zipfile's guess, and the locator's word
                if 0 <= where <= size - 56:
                    f.seek(where)
                    rec = f.read(56)
                    if rec[:4] == b"PK\x06\x06":
                        big = struct.unpack("<4sQ2H2L4Q", rec)
                        members, directory = max(members, big[6], big[7]), max(directory, big[8])
    return members, directory


def _bounded(archive: zipfile.ZipFile, path: str | Path, name: str, limit: int, why: str) -> bytes:
    """Member ``name``, refused when its declared size is over ``limit`` (``why`` says what sets it), and
    read ``CHUNK`` bytes of output at a time, stopping past the declared size: a header that understates
    the size cannot make the read inflate more (``zipfile`` itself inflates a whole read's worth)."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        raise _broken(path, f"it is not an SB3 model.zip (no {name} in it)") from None
    if info.file_size > limit:
        raise _broken(path, f"its {name} is {info.file_size:,} bytes, over the {limit:,} {why}")
    chunks, total = [], 0
    try:
        with archive.open(info) as f:
            while chunk := f.read(CHUNK):
                total += len(chunk)
                if total > info.file_size:
                    raise _broken(path, f"its {name} inflates past the {info.file_size:,} bytes its header states")
                chunks.append(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        raise _broken(path, f"its {name} cannot be read ({first_line(exc)})") from None
    if total != info.file_size:
        raise _broken(path, f"its {name} holds {total:,} bytes, not the {info.file_size:,} its header states")
    return b"".join(chunks)


def _data(archive: zipfile.ZipFile, path: str | Path, limit: int) -> dict[str, Any]:
    """The ``data`` JSON: at most :data:`MAX_DATA_BYTES` (and a quarter of the budget), at most
    :data:`MAX_JSON_ITEMS` items, :data:`MAX_JSON_DEPTH` deep."""
    names = set(archive.namelist())
    if "data" not in names or "policy.pth" not in names:
        raise _broken(path, "it is not an SB3 model.zip (no data or policy.pth in it)")
    cap = min(MAX_DATA_BYTES, limit // 4)
    raw = _bounded(archive, path, "data", cap, "bytes this reader takes (SB3 writes a few KB)")
    items = raw.count(b"{") + raw.count(b"[") + raw.count(b",")
    if items > MAX_JSON_ITEMS:
        raise _broken(path, f"its data holds {items:,} JSON items, over the {MAX_JSON_ITEMS:,} this reader takes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise _broken(path, "its data is not valid JSON") from None
    if not isinstance(data, dict) or _depth(data) > MAX_JSON_DEPTH:
        raise _broken(path, "its data is not the JSON object SB3 writes")
    return data


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if d <= MAX_JSON_DEPTH and isinstance(v, dict | list):
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _weights(archive: zipfile.ZipFile, path: str | Path, network: int, limit: int) -> bytes:
    """policy.pth's bytes: no more than the ``network``'s weights and torch's framing take, nor ``limit``."""
    if network <= limit:
        return _bounded(
            archive, path, "policy.pth", network, "bytes the weights of the network its settings describe take"
        )
    return _bounded(archive, path, "policy.pth", limit, f"bytes of the memory budget ({ENV} or --max-memory)")


def _state(weights: bytes) -> dict[str, Any]:
    """policy.pth as a state dict: torch's zip format only (the legacy format sizes its storages from the
    pickle), every record stored and within the bytes at hand, then ``torch.load(weights_only=True)``."""
    import torch

    try:
        with zipfile.ZipFile(io.BytesIO(weights)) as inner:
            infos = inner.infolist()
            stored = sum(i.file_size for i in infos)
            if any(i.compress_type != zipfile.ZIP_STORED or i.file_size != i.compress_size for i in infos):
                raise Unsafe("its policy.pth has compressed records (torch.save writes none)")
            if len(infos) > MAX_COUNT or stored > len(weights):
                raise Unsafe("its policy.pth states more bytes than it holds")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, struct.error):
        raise Unsafe("its policy.pth is not in torch's zip format (torch.save's since torch 1.6)") from None
    try:  # tensors and plain containers only: torch's weights_only unpickler refuses any other object
        state = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise Unsafe(f"its policy.pth holds more than tensors ({first_line(exc)})") from None
    if not isinstance(state, dict):
        raise Unsafe("its policy.pth is not a state dict")
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise Unsafe("its policy.pth holds more than tensors")
    return state
