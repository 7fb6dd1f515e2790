"""Read a model file into one of a few raw forms, safely.

Detection is by content where it matters (a TorchScript archive and a pickled
checkpoint share the ``.pt`` suffix) and by suffix elsewhere. Checkpoints load with
``torch.load(weights_only=True)``; anything needing full unpickling is refused unless
the user passes ``--trust-pickle``.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitedge.core.errors import MissingDependencyError, ModelLoadError, UnsafePickleError
from vitedge.models import archive_safety
from vitedge.models.checkpoint import META_KEY, STATE_DICT_KEYS
from vitedge.files.safefile import check_regular, parse_json

# Prefixes added by DataParallel / DDP and torch.compile.
_STRIP_PREFIXES = ("module.", "_orig_mod.")


@dataclass
class RawModel:
    """What was in the file, before vitedge interprets it."""

    kind: str  # state_dict, module, torchscript, exported_program, onnx, huggingface
    path: Path
    state_dict: dict[str, Any] | None = None
    module: Any = None  # nn.Module / ScriptModule / ExportedProgram
    meta: dict[str, Any] = field(default_factory=dict)  # vitedge metadata carried by the file


_KIND_BY_SUFFIX = {".safetensors": "safetensors", ".pt2": "exported_program",
                   **dict.fromkeys((".pt", ".pth", ".bin", ".ckpt", ".tar", ".jit", ".ts"), "torch")}


def read_model_file(path: Path, *, trust_pickle: bool = False) -> RawModel:
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    if path.is_dir():
        if (path / "config.json").is_file():
            return RawModel(kind="huggingface", path=path)
        raise ModelLoadError(f"{path} is a folder without config.json; pass a checkpoint file or a Hugging Face model folder")
    try:
        check_regular(path)
    except OSError as err:
        raise ModelLoadError(f"{err}; pass a model file or a Hugging Face model folder") from None
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{path} is empty (0 bytes)")
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return RawModel(kind="onnx", path=path)
    # by suffix; with no suffix, or one no format uses ("checkpoints/vit1", "model.weights"), by the first bytes
    kind = _KIND_BY_SUFFIX.get(suffix) or sniff_format(path)
    if kind == "safetensors":
        return _read_safetensors(path)
    if kind == "exported_program":
        if not trust_pickle:
            archive_safety.check_exported_program(path)
        return _read_exported_program(path)
    if kind == "torch":
        return _read_torch_file(path, trust_pickle)
    raise ModelLoadError(
        f"{path}: unrecognised model file type '{suffix or path.name}' (its content is no PyTorch, TorchScript, "
        "torch.export or safetensors file); vitedge reads .pt/.pth/.safetensors checkpoints, "
        "TorchScript, .pt2 (torch.export), .onnx files and Hugging Face model folders"
    )


def sniff_format(path: Path) -> str | None:
    """"torch" (torch.save's zip archive or a legacy pickle stream, TorchScript included), "exported_program" (a
    torch.export archive), "safetensors" (an 8-byte little-endian header length, then the JSON header), or None.
    ONNX has no magic bytes to tell it by: it is read by its suffix only."""
    with open(path, "rb") as f:
        head = f.read(9)
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
        except (zipfile.BadZipFile, OSError):
            return None
        if any(n.endswith("/archive_format") for n in names) and any("/models/" in n for n in names):
            return "exported_program"
        return "torch" if any(n.endswith("data.pkl") or n.endswith("constants.pkl") for n in names) else None
    if head.startswith(b"\x80"):
        return "torch"
    if len(head) == 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < path.stat().st_size:
        return "safetensors"
    return None


def _read_torch_file(path: Path, trust_pickle: bool) -> RawModel:
    if _is_torchscript(path):
        if not trust_pickle:
            archive_safety.check_torchscript(path)
        return _read_torchscript(path)
    return _read_checkpoint(path, trust_pickle=trust_pickle)


def _is_torchscript(path: Path) -> bool:
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return any(n.endswith("constants.pkl") for n in names) and any("/code/" in n for n in names)


def _corrupt(path: Path, err: BaseException) -> ModelLoadError:
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    return ModelLoadError(f"{path} is truncated or corrupt and cannot be read ({detail[:160]})")


def _read_torchscript(path: Path) -> RawModel:
    import torch

    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as err:  # torch raises RuntimeError with C++ text for corrupt archives
        raise _corrupt(path, err) from err
    return RawModel(kind="torchscript", path=path, module=module)


def _read_exported_program(path: Path) -> RawModel:
    import torch

    try:
        program = torch.export.load(str(path))
    except Exception as err:
        raise _corrupt(path, err) from err
    return RawModel(kind="exported_program", path=path, module=program)


def _read_safetensors(path: Path) -> RawModel:
    try:
        from safetensors import safe_open
        from safetensors.torch import load_file
    except ImportError:
        raise MissingDependencyError("safetensors (to read .safetensors files)", "pip install 'vitedge[models]'") from None
    try:
        state_dict = load_file(str(path), device="cpu")
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
    except Exception as err:
        raise _corrupt(path, err) from err
    meta: dict[str, Any] = {}
    if META_KEY in header:
        try:
            meta = parse_json(header[META_KEY], f"{path} metadata")
        except ValueError:
            meta = {}
    return RawModel(kind="state_dict", path=path, state_dict=_strip_prefixes(state_dict), meta=meta)


def _read_checkpoint(path: Path, *, trust_pickle: bool) -> RawModel:
    import torch

    with open(path, "rb") as f:
        head = f.read(2)
    if not zipfile.is_zipfile(path) and not head.startswith(b"\x80"):
        # Neither torch's zip format nor a pickle stream (legacy torch.save starts with PROTO).
        raise ModelLoadError(f"{path} is truncated or corrupt and cannot be read (not a PyTorch checkpoint archive)")
    try:
        with warnings.catch_warnings():  # torch's pickle-protocol notes on a damaged file are noise: the error says it
            warnings.simplefilter("ignore")
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        text = str(err).lower()
        if "weights only load failed" not in text or "unsupported global" not in text:
            # not a pickled Python object the safe loader refused (e.g. a damaged stream: "Unsupported operand")
            raise ModelLoadError(f"{path} is truncated or corrupt and cannot be read (not a valid PyTorch checkpoint)") from err
        if not trust_pickle:
            raise UnsafePickleError(
                f"{path} holds pickled Python objects (e.g. a whole saved nn.Module), and unpickling can run arbitrary code; "
                "load it only if you trust its source, with --trust-pickle, or save model.state_dict() instead"
            ) from err
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=False)
        except Exception as err2:
            raise ModelLoadError(f"{path} could not be unpickled ({str(err2).splitlines()[0][:160]})") from err2
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as err:
        raise _corrupt(path, err) from err
    return _interpret_loaded(path, obj)


def _interpret_loaded(path: Path, obj: Any) -> RawModel:
    import torch

    if isinstance(obj, torch.nn.Module):
        return RawModel(kind="module", path=path, module=obj)
    if not isinstance(obj, dict):
        raise ModelLoadError(f"{path} holds a {type(obj).__name__}, not a model or a state_dict")
    meta = obj.get(META_KEY) if isinstance(obj.get(META_KEY), dict) else {}
    if not _is_tensor_dict(obj):
        for key in STATE_DICT_KEYS:
            inner = obj.get(key)
            if isinstance(inner, torch.nn.Module):
                return RawModel(kind="module", path=path, module=inner, meta=meta)
            if isinstance(inner, dict) and _is_tensor_dict(inner):
                return RawModel(kind="state_dict", path=path, state_dict=_strip_prefixes(inner), meta=meta)
        raise ModelLoadError(
            f"{path} is a dict with keys {sorted(map(str, obj))[:8]} but no state_dict of tensors under any of "
            f"{', '.join(STATE_DICT_KEYS)}"
        )
    return RawModel(kind="state_dict", path=path, state_dict=_strip_prefixes(obj), meta=meta)


def _is_tensor_dict(d: dict) -> bool:
    import torch

    return bool(d) and all(isinstance(v, torch.Tensor) for v in d.values())


def _strip_prefixes(sd: dict[str, Any]) -> dict[str, Any]:
    for prefix in _STRIP_PREFIXES:
        if sd and all(k.startswith(prefix) for k in sd):
            sd = {k[len(prefix):]: v for k, v in sd.items()}
    return sd
