"""Look inside model archives before torch loads them, so that no pickle runs code unless trusted.

``torch.export.load`` falls back to full unpickling for sample inputs, weights flagged ``use_pickle``
and opaque constants; a TorchScript archive's pickles and ``__setstate__`` methods run when it is
loaded. Each check here reads the archive's members without executing any of them and raises
:class:`UnsafePickleError` for anything that needs more than tensors and plain containers.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import posixpath
import re
import zipfile
from pathlib import Path

from vitedge.core.errors import ModelLoadError, UnsafePickleError
from vitedge.files.safefile import MAX_DOCUMENT_BYTES, parse_json

_TRUST_HINT = "load it only if you trust its source, with --trust-pickle, or save the model.state_dict() instead"

# Globals a TorchScript archive's own pickles use: tensors, storages, containers, its compiled classes.
_TS_GLOBAL_PREFIXES = ("__torch__.", "torch._utils.", "torch.jit._pickle.")
_TS_GLOBALS = {"collections.OrderedDict"} | {
    f"torch.{k}Storage" for k in ("Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool",
                                  "ComplexFloat", "ComplexDouble", "QInt8", "QUInt8", "QInt32", "Untyped")
}
_STRING_OPS = {"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING"}
_SETSTATE = re.compile(r"\bdef\s+__setstate__\s*\(")


def unsafe(path: Path, what: str) -> UnsafePickleError:
    return UnsafePickleError(f"{path} {what}, and loading it could run arbitrary code; {_TRUST_HINT}")


def pickle_globals(data: bytes) -> set[str]:
    """Every ``module.name`` a pickle stream imports, read from its opcodes without running it.

    A STACK_GLOBAL whose operands are not plain strings is reported as ``?``."""
    found: set[str] = set()
    pushed: list[object] = []  # what each opcode pushed: a str for string operands, else None
    memo: dict[int, object] = {}
    for op, arg, _pos in pickletools.genops(data):
        name = op.name
        if name == "GLOBAL":
            found.add(str(arg).replace(" ", "."))
        elif name == "STACK_GLOBAL":
            module, attr = (pushed[-2], pushed[-1]) if len(pushed) >= 2 else (None, None)
            found.add(f"{module}.{attr}" if isinstance(module, str) and isinstance(attr, str) else "?")
        if name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = pushed[-1] if pushed else None
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            pushed.append(memo.get(int(arg)))
        elif op.stack_after:
            pushed.append(arg if name in _STRING_OPS and isinstance(arg, str) else None)
    return found


def check_torchscript(path: Path) -> None:
    """A TorchScript archive: its pickles may use only TorchScript's own globals and no compiled class
    may define ``__setstate__`` (which runs while loading)."""
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                name = info.filename
                if name.endswith(".pkl") or name.endswith(".debug_pkl"):
                    for glob in _globals_or_corrupt(path, name, zf.read(name)):
                        if not (glob in _TS_GLOBALS or glob.startswith(_TS_GLOBAL_PREFIXES)):
                            raise unsafe(path, f"is a TorchScript archive whose {name} imports '{glob}'")
                elif "/code/" in name and name.endswith(".py"):
                    if _SETSTATE.search(zf.read(name).decode("utf-8", "replace")):
                        raise unsafe(path, f"is a TorchScript archive whose {name} defines __setstate__ (code run while loading)")
    except (zipfile.BadZipFile, OSError) as err:
        raise ModelLoadError(f"{path} is truncated or corrupt and cannot be read ({err})") from None


def check_exported_program(path: Path) -> None:
    """A ``torch.export`` .pt2 archive: every member torch would unpickle must load as tensors and
    containers only (the restricted ``weights_only`` unpickler); opaque or custom-object constants
    are refused outright."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            for member, why in _pickled_members(zf, names):
                if member in names:
                    _weights_only_or_refuse(path, member, why, zf.read(member))
    except _Refuse as err:
        raise unsafe(path, f"is a torch.export archive that {err}") from None
    except (zipfile.BadZipFile, OSError, KeyError, ValueError, AttributeError) as err:
        raise ModelLoadError(f"{path} is truncated or corrupt and cannot be read ({str(err)[:160]})") from None


def _pickled_members(zf: zipfile.ZipFile, names: list[str]):
    """(member, description) for every archive member ``torch.export.load`` unpickles."""
    for name in names:
        base = posixpath.basename(name)
        parts = name.split("/")
        if "sample_inputs" in parts or base in ("serialized_state_dict.pt", "serialized_constants.pt", "serialized_example_inputs.pt"):
            yield name, "sample inputs or state" if "sample_inputs" in parts else base
        elif base.endswith("_config.json") and ("weights" in parts or "constants" in parts):
            folder = posixpath.dirname(name)
            if zf.getinfo(name).file_size > MAX_DOCUMENT_BYTES:
                raise _Refuse(f"holds a {zf.getinfo(name).file_size}-byte {base}, over the {MAX_DOCUMENT_BYTES >> 20} MB bound")
            config = parse_json(zf.read(name), name).get("config", {})
            for fqn, meta in config.items():
                path_name = str(meta.get("path_name", ""))
                if path_name.startswith(("custom_obj_", "opaque_obj_")):
                    raise _Refuse(f"holds a pickled Python object as constant '{fqn}' ({path_name})")
                if meta.get("use_pickle"):
                    yield posixpath.join(folder, path_name), f"'{fqn}' (stored as a pickle)"


class _Refuse(Exception):
    pass


def _weights_only_or_refuse(path: Path, member: str, why: str, data: bytes) -> None:
    import torch

    try:
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" in str(err):
            raise unsafe(path, f"is a torch.export archive whose {why} needs full unpickling") from None
        raise ModelLoadError(f"{path} is truncated or corrupt and cannot be read ({member} is not a valid pickle)") from None
    except Exception:
        raise ModelLoadError(f"{path} is truncated or corrupt and cannot be read ({member} is not a valid pickle)") from None


def _globals_or_corrupt(path: Path, member: str, data: bytes) -> set[str]:
    try:
        return pickle_globals(data)
    except Exception:
        raise ModelLoadError(f"{path} is truncated or corrupt and cannot be read ({member} is not a valid pickle)") from None
