"""Seeded fuzzing of vitedge's file inputs: random mutations of valid inputs, each run through the CLI.

    python tools/fuzz_inputs.py --seed 46 --runs 2000 [--out tools/fuzz_inputs_result]

Input kinds (each a valid input of the bundled digits example, mutated):

    model-pt     a state_dict checkpoint (examples/digits_vit.pt): its metadata, its tensors or its bytes -> `inspect`
    model-onnx   the FP32 ONNX graph of a digits bundle: its proto (shapes, metadata, nodes, initializers,
                 opset) or its bytes -> `inspect`
    config       vitedge.toml: its keys, values and text -> `config`
    matrix       matrix.toml: its rows, keys, values and text -> `build-matrix`'s reader (load_matrix)
    report       validation.json given to `compare` (old, new or both) -> `compare --report-dir OUT`
    bundle       a bundle's manifest.json, model bytes, signature -> `vitedge.runtime.load` (and a frame), or
                 `validate --no-latency --report-dir OUT`
    images       a labelled image folder: image bytes, headers, names, layout -> `validate --data`
    arrays       a .npz / .npy of frames and labels: dtype, shape, labels, keys, header, bytes -> `validate --data`

Each run goes through `vitedge.cli.entry.main` in this process (its real error mapping: one line and an exit code), or,
for the two library entry points, through the same mapping (a VitedgeError's exit code, an OSError the machine
caused -> 2, anything else -> 3). A run fails the pass when it exits 3, runs past its timeout (SIGALRM), or changes
any file outside its output folder (every input of the case and the shared valid inputs are hashed before and after).
The cheap stages (parsing, loading) get most runs; the runs that read data run one validation of a small set.

The result (seed, runs and exit codes per kind, every failure with its mutation, time) is written as JSON and
Markdown; tools/fuzz_inputs_result.md is the last committed pass.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import io
import json
import math
import os
import platform
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = REPO / "examples" / "digits_vit.pt"
CALIB = REPO / "calibration" / "digits" / "calib"
VAL = REPO / "calibration" / "digits" / "val"

# share of the runs per kind: the parsing and loading stages get most
WEIGHTS = {"model-pt": 8, "model-onnx": 14, "config": 14, "matrix": 12, "report": 18, "bundle": 18, "images": 8, "arrays": 8}
TIMEOUT = {"images": 120, "arrays": 120, "bundle": 120}
DEFAULT_TIMEOUT = 60
VALIDATE_SHARE = 0.1  # of the bundle, image and array cases: a full `validate` (about 10 s each here); the rest stop after loading


class Hang(BaseException):
    """Raised by SIGALRM in the run that went past its timeout (a BaseException: no `except Exception` swallows it)."""


def _alarm(signum, frame):  # noqa: ARG001 - signal handler signature
    raise Hang()


# ---- running one case ------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    code: int | str  # exit code, or "hang"
    line: str  # the last stderr line (the one-line error), or the exception


def run_cli(args: list[Any], cwd: Path, timeout: float) -> Outcome:
    from vitedge.cli.entry import main

    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    code: int | str = 0
    os.chdir(cwd)
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([os.fspath(a) if isinstance(a, Path) else str(a) for a in args])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Hang:
        code = "hang"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        os.chdir(old)
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    return Outcome(code, lines[-1][:300] if lines else "")


def run_api(fn: Callable[[], Any], timeout: float) -> Outcome:
    """A library entry point under the CLI's mapping: VitedgeError -> its code, a machine's OSError -> 2, else 3."""
    from vitedge.core.errors import VitedgeError, environment_error

    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        fn()
        return Outcome(0, "")
    except Hang:
        return Outcome("hang", "")
    except VitedgeError as err:
        return Outcome(err.exit_code, f"vitedge: error: {err}"[:300])
    except Exception as err:  # noqa: BLE001 - what the CLI would call an internal error
        known = environment_error(err)
        if known is not None:
            return Outcome(known.exit_code, f"vitedge: error: {known}"[:300])
        return Outcome(3, f"internal error: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def snapshot(*roots: Path, skip: Path | None = None) -> dict[str, str]:
    found = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [n for n in dirnames if skip is None or Path(dirpath, n).resolve() != skip.resolve()]
            for name in filenames:
                p = Path(dirpath) / name
                try:
                    found[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else "special"
                except OSError:
                    found[str(p)] = "unreadable"
            for name in dirnames:
                found[str(Path(dirpath) / name) + "/"] = "dir"
    return found


# ---- mutations -------------------------------------------------------------------------------------------------

ODD_VALUES: list[Any] = [None, -1, 0, 1, -(2**63), 2**63, 1e308, -1e308, 1e-308, math.nan, math.inf, -math.inf, "", "x",
                         "../../outside", "/etc/passwd", "\u202eevil", "a" * 5000, [], {}, [1, 2, 3], {"a": 1}, True, False, 0.5,
                         -0.5, 3, 1000000, "nan", "1e30", [[[[[[1]]]]]], {"schema": "vitedge.manifest/9"}]


def odd_value(rng: random.Random) -> Any:
    return copy.deepcopy(rng.choice(ODD_VALUES))


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    data = bytearray(data)
    how = rng.choice(["flip", "truncate", "insert", "zero", "duplicate", "empty"])
    if how == "empty" or not data:
        return b"", "empty"
    if how == "flip":
        for _ in range(rng.randint(1, 16)):
            i = rng.randrange(len(data))
            data[i] = rng.randrange(256)
        return bytes(data), "flip bytes"
    if how == "truncate":
        n = rng.randrange(len(data))
        return bytes(data[:n]), f"truncate to {n}"
    if how == "insert":
        i = rng.randrange(len(data))
        return bytes(data[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) + data[i:]), "insert bytes"
    if how == "zero":
        i = rng.randrange(len(data))
        n = rng.randint(1, 4096)
        data[i:i + n] = bytes(len(data[i:i + n]))
        return bytes(data), "zero a range"
    i = rng.randrange(len(data))
    return bytes(data[:i] + data[i:i + 512] + data[i:]), "duplicate a chunk"


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:20]):
            out += _paths(v, prefix + (i,))
    return out


def mutate_tree(obj: Any, rng: random.Random, n: int | None = None) -> tuple[Any, str]:
    """A JSON-like value with 1..n random edits: a value replaced by an odd one, a key deleted, a key added."""
    obj = copy.deepcopy(obj)
    notes = []
    for _ in range(n or rng.randint(1, 3)):
        paths = [p for p in _paths(obj) if p]
        if not paths:
            break
        path = rng.choice(paths)
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        how = rng.random()
        if how < 0.6:
            parent[path[-1]] = odd_value(rng)
            notes.append(f"{'.'.join(map(str, path))}={str(parent[path[-1]])[:40]!r}")
        elif how < 0.85 and isinstance(parent, dict):
            del parent[path[-1]]
            notes.append(f"del {'.'.join(map(str, path))}")
        elif isinstance(parent, dict):
            parent[rng.choice(["extra", "schema", "files", "x" * 10])] = odd_value(rng)
            notes.append(f"add key under {'.'.join(map(str, path[:-1])) or 'top'}")
        else:
            parent[path[-1]] = odd_value(rng)
            notes.append(f"{'.'.join(map(str, path))} replaced")
    return obj, "; ".join(notes)


def json_text(obj: Any) -> str:
    return json.dumps(obj, allow_nan=True, default=str)


def toml_text(data: dict[str, Any]) -> str:
    """A small TOML writer for the fuzzed tables (values it cannot write become strings)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(str(k))} = {value(x)}" for k, x in v.items()) + "}"
        return json.dumps(str(v) if v is not None else "")

    lines, tables = [], []
    for k, v in data.items():
        if isinstance(v, dict) and k in ("build", "thresholds"):
            tables.append((k, v))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v) and k == "models":
            tables.extend((f"[{k}]", x) for x in v)
        else:
            lines.append(f"{json.dumps(str(k))} = {value(v)}")
    for name, table in tables:
        lines.append(f"[{name}]")
        lines += [f"{json.dumps(str(k))} = {value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def mutate_text(text: str, rng: random.Random) -> tuple[str, str]:
    data, how = mutate_bytes(text.encode(), rng)
    return data.decode("utf-8", "replace"), how


# ---- the valid inputs ------------------------------------------------------------------------------------------

@dataclass
class Bases:
    root: Path
    bundle: Path  # a complete onnx bundle of the digits ViT
    onnx: Path  # its FP32 graph
    report: Path  # a validation.json with latency rows
    frames: Any = None
    labels: Any = None
    state: dict = field(default_factory=dict)  # the checkpoint, as torch.load reads it
    cache: dict = field(default_factory=dict)  # parsed valid inputs, made once


def make_bases(root: Path, seed: int) -> Bases:
    """One onnx bundle of the digits ViT and its validation report (a few seconds; a cache under root)."""
    import numpy as np
    from PIL import Image

    from vitedge.app.build import BuildRequest, run_build
    from vitedge.core.ui import StageLog
    from vitedge.validation.reference_cache import ReferenceCacheSettings

    bundle = root / "base" / "onnx"
    run_build(BuildRequest(model=MODEL, targets=("onnx",), calib=CALIB, out=bundle, measure_speed=False,
                           cache=ReferenceCacheSettings(root=root / "base-cache")), StageLog(quiet=True))
    report_dir = root / "base" / "report"
    outcome = run_cli(["validate", bundle, "--data", VAL, "--data-size", "64", "--latency-seconds", "0.3", "--report-dir", report_dir,
                       "-q", "--cache-dir", root / "base-cache"], root, 600)
    if outcome.code not in (0, 1):
        raise SystemExit(f"the base report could not be made: {outcome}")
    files = sorted(VAL.glob("*/*.png"))[:48]
    frames = np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files])
    labels = np.array([int(f.parent.name) for f in files])
    import torch

    state = torch.load(MODEL, weights_only=True)
    return Bases(root, bundle, bundle / "reference.fp32.onnx", report_dir / "validation.json", frames, labels, state)


# ---- one case per kind: (args or callable, mutation note, extra roots to hash) ---------------------------------

@dataclass
class Case:
    kind: str
    note: str
    cli: list[Any] | None = None
    api: Callable[[], Any] | None = None


def case_model_pt(b: Bases, d: Path, rng: random.Random) -> Case:
    import torch

    obj = copy.deepcopy(b.state)
    path = d / "model.pt"
    how = rng.random()
    if how < 0.5:
        obj["vitedge"], note = mutate_tree(obj["vitedge"], rng)
        torch.save(obj, path)
    elif how < 0.75:
        sd = obj["state_dict"]
        key = rng.choice(sorted(sd))
        op = rng.choice(["drop", "shape", "dtype", "nan", "scalar", "extra"])
        if op == "drop":
            del sd[key]
        elif op == "shape":
            sd[key] = sd[key].flatten()[: max(1, sd[key].numel() // rng.choice([2, 3, 7]))]
        elif op == "dtype":
            sd[key] = sd[key].to(rng.choice([torch.float16, torch.int32, torch.bool, torch.float64]))
        elif op == "nan":
            sd[key] = torch.full_like(sd[key], float("nan")) if sd[key].is_floating_point() else sd[key]
        elif op == "scalar":
            sd[key] = torch.tensor(rng.choice([0.0, 1e30, -1.0]))
        else:
            sd[f"blocks.{rng.randint(6, 99)}.attn.qkv.weight"] = torch.zeros(3, 3)
        note = f"tensor {op} {key}"
        torch.save(obj, path)
    else:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data, note = mutate_bytes(buf.getvalue(), rng)
        path.write_bytes(data)
    return Case("model-pt", note, cli=["inspect", path])


def case_model_onnx(b: Bases, d: Path, rng: random.Random) -> Case:
    import onnx

    path = d / "model.onnx"
    if rng.random() < 0.3:
        data, note = mutate_bytes(b.onnx.read_bytes(), rng)
        path.write_bytes(data)
        return Case("model-onnx", note, cli=["inspect", path])
    m = b.cache.setdefault("onnx", onnx.load(str(b.onnx)))
    m = copy.deepcopy(m)
    op = rng.choice(["in-dim", "out-dim", "metadata", "drop-node", "init-dims", "init-data", "opset", "rename-input", "external"])
    g = m.graph
    if op in ("in-dim", "out-dim"):
        vi = (g.input if op == "in-dim" else g.output)[0]
        dims = vi.type.tensor_type.shape.dim
        dim = dims[rng.randrange(len(dims))]
        choice = rng.choice([0, -1, 1, 3, 7, 10**9, "p"])
        if choice == "p":
            dim.dim_param = "anything"
        else:
            dim.dim_value = choice
        note = f"{op} -> {choice}"
    elif op == "metadata":
        if m.metadata_props and rng.random() < 0.7:
            prop = rng.choice(list(m.metadata_props))
            try:
                value = json.loads(prop.value)
                value, note = mutate_tree(value, rng)
                prop.value = json_text(value)
            except (ValueError, TypeError):
                prop.value, note = mutate_text(prop.value, rng)
            note = f"metadata {prop.key}: {note}"
        else:
            p = m.metadata_props.add()
            p.key, p.value = rng.choice(["vitedge", "preprocess", "class_names", "x"]), json_text(odd_value(rng))
            note = f"metadata add {p.key}"
    elif op == "drop-node":
        i = rng.randrange(len(g.node))
        note = f"drop node {g.node[i].op_type}"
        del g.node[i]
    elif op == "init-dims":
        init = g.initializer[rng.randrange(len(g.initializer))]
        if init.dims:
            init.dims[rng.randrange(len(init.dims))] = rng.choice([0, 1, 2, 10**6])
        note = f"initializer dims {init.name}"
    elif op == "init-data":
        init = g.initializer[rng.randrange(len(g.initializer))]
        if init.raw_data:
            init.raw_data = init.raw_data[: rng.randrange(len(init.raw_data))]
        note = f"initializer data cut {init.name}"
    elif op == "opset":
        m.opset_import[0].version = rng.choice([1, 7, 13, 16, 99, 0])
        note = f"opset {m.opset_import[0].version}"
    elif op == "rename-input":
        g.input[0].name = rng.choice(["", "other", "x" * 300])
        note = "rename input"
    else:
        init = g.initializer[rng.randrange(len(g.initializer))]
        init.data_location = onnx.TensorProto.EXTERNAL
        init.ClearField("raw_data")
        for k, v in (("location", rng.choice(["w.bin", "../w.bin", "/etc/hostname", ""])), ("offset", rng.choice(["0", "-5", "x"])),
                     ("length", rng.choice(["16", "-1", "99999999999"]))):
            e = init.external_data.add()
            e.key, e.value = k, v
        note = f"external data {init.name}"
    path.write_bytes(m.SerializeToString())
    return Case("model-onnx", note, cli=["inspect", path])


def _base_config(b: Bases) -> dict[str, Any]:
    return {"model": str(MODEL), "calib": str(CALIB), "val": str(VAL), "targets": ["onnx"], "output": "out", "calib_size": 64,
            "seed": 0, "no_latency": True, "crop_pct": 1.0, "mean": [0.3, 0.3, 0.3], "input_size": [32, 32],
            "thresholds": {"min_agreement": 0.9, "max_top1_drop": 2.0}}


def case_config(b: Bases, d: Path, rng: random.Random) -> Case:
    data = _base_config(b)
    if rng.random() < 0.75:
        data, note = mutate_tree(data, rng)
        text = toml_text(data)
    else:
        text, note = mutate_text(toml_text(data), rng)
    (d / "vitedge.toml").write_text(text, encoding="utf-8", errors="replace")
    return Case("config", note, cli=["config", "--config", d / "vitedge.toml"])


def case_matrix(b: Bases, d: Path, rng: random.Random) -> Case:
    from vitedge.app.matrix.config import load_matrix

    data = {"out": str(d / "out"), "targets": ["onnx"], "build": {"latency": False, "fallback": False, "calib_size": 32},
            "models": [{"name": "digits", "path": str(MODEL), "calib": str(CALIB), "val": str(VAL)},
                       {"name": "second", "path": str(MODEL), "calib": str(CALIB), "targets": ["onnx", "intel-cpu"]}]}
    if rng.random() < 0.8:
        data, note = mutate_tree(data, rng)
        text = toml_text(data)
    else:
        text, note = mutate_text(toml_text(data), rng)
    path = d / "matrix.toml"
    path.write_text(text, encoding="utf-8", errors="replace")
    return Case("matrix", note, api=lambda: load_matrix(path))


def case_report(b: Bases, d: Path, rng: random.Random) -> Case:
    base = json.loads(b.report.read_text())
    which = rng.choice(["old", "new", "both"])
    files = {}
    note = []
    for side in ("old", "new"):
        obj = base
        if which in (side, "both"):
            if rng.random() < 0.85:
                obj, n = mutate_tree(base, rng, rng.randint(1, 4))
                text = json_text(obj)
            else:
                text, n = mutate_text(json_text(base), rng)
            note.append(f"{side}: {n}")
        else:
            text = json_text(obj)
        files[side] = d / f"{side}.json"
        files[side].write_text(text, encoding="utf-8", errors="replace")
    return Case("report", "; ".join(note), cli=["compare", files["old"], files["new"], "--report-dir", d / "out"])


def case_bundle(b: Bases, d: Path, rng: random.Random) -> Case:
    import numpy as np

    bundle = d / "bundle"
    shutil.copytree(b.bundle, bundle)
    how = rng.random()
    if how < 0.6:
        manifest = json.loads((bundle / "manifest.json").read_text())
        if rng.random() < 0.85:
            manifest, note = mutate_tree(manifest, rng, rng.randint(1, 3))
            (bundle / "manifest.json").write_text(json_text(manifest))
        else:
            text, note = mutate_text(json_text(manifest), rng)
            (bundle / "manifest.json").write_text(text, encoding="utf-8", errors="replace")
        note = f"manifest: {note}"
    elif how < 0.85:
        name = rng.choice(["model.int8.onnx", "reference.fp32.onnx", "report.md"])
        data, note = mutate_bytes((bundle / name).read_bytes(), rng)
        (bundle / name).write_bytes(data)
        note = f"{name}: {note}"
    else:
        (bundle / "manifest.sig").write_bytes(mutate_bytes(b"hmac-sha256:" + b"0" * 64, rng)[0])
        note = "a signature without a key"
    if rng.random() < VALIDATE_SHARE:
        return Case("bundle", note, cli=["validate", bundle, "--data", VAL, "--data-size", "16", "--no-latency", "--report-dir", d / "out",
                                         "-q", "--cache-dir", d / "out" / "cache"])

    def load_and_predict():
        from vitedge.runtime import load

        with load(bundle, warmup=1) as model:
            model.predict(np.full((40, 30, 3), 100, np.uint8))

    return Case("bundle", note, api=load_and_predict)


def _png_with_size(w: int, h: int) -> bytes:
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    raw = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def case_images(b: Bases, d: Path, rng: random.Random) -> Case:
    data = d / "data"
    for cls in ("0", "1", "2"):
        (data / cls).mkdir(parents=True)
        for f in sorted((VAL / cls).glob("*.png"))[:4]:
            shutil.copy(f, data / cls / f.name)
    notes = []
    for _ in range(rng.randint(1, 3)):
        files = sorted(data.rglob("*.png"))
        target = rng.choice(files) if files else data / "0" / "x.png"
        op = rng.choice(["bytes", "header", "empty", "rename", "text", "nest", "new-class", "huge-claim", "thin"])
        if op == "bytes" and target.exists():
            out, how = mutate_bytes(target.read_bytes(), rng)
            target.write_bytes(out)
            notes.append(f"{target.name}: {how}")
        elif op == "header":
            target.write_bytes(_png_with_size(rng.choice([0, 1, 2**31 - 1, 65535]), rng.choice([0, 1, 2**31 - 1, 65535])))
            notes.append("png header size")
        elif op == "empty":
            target.write_bytes(b"")
            notes.append("empty image")
        elif op == "rename" and target.exists():
            target.rename(target.with_name(rng.choice(["\u202egnp.exe.png", "a b.PNG", ".hidden.png", "x.jpeg", "noext"])))
            notes.append("rename")
        elif op == "text":
            target.write_text("not an image")
            notes.append("text as png")
        elif op == "nest":
            (data / "0" / "sub").mkdir(exist_ok=True)
            if target.exists():
                shutil.copy(target, data / "0" / "sub" / "n.png")
            notes.append("nested folder")
        elif op == "new-class":
            (data / rng.choice(["99", "cat", "-1", "10"])).mkdir(exist_ok=True)
            notes.append("extra class folder")
        elif op == "huge-claim":
            target.write_bytes(_png_with_size(100000, 100000))
            notes.append("png claims 10 gigapixels")
        else:
            target.write_bytes(_png_with_size(rng.choice([1, 2]), rng.choice([300000, 1000000])))
            notes.append("thin png")
    return _data_case(b, d, rng, "images", "; ".join(notes), data)


def case_arrays(b: Bases, d: Path, rng: random.Random) -> Case:
    import numpy as np

    images, labels = b.frames.copy(), b.labels.copy()
    op = rng.choice(["dtype", "shape", "labels", "keys", "npy", "bytes", "version", "float", "channels-first"])
    keys = {"images": images, "labels": labels}
    if op == "dtype":
        keys["images"] = images.astype(rng.choice([np.float64, np.int16, np.float16, np.bool_, np.complex64]))
    elif op == "shape":
        keys["images"] = images.reshape(rng.choice([(-1,), (48, 32, 96), (1, 48, 32, 32, 3), (48 * 32, 32, 3, 1)]))
    elif op == "labels":
        keys["labels"] = rng.choice([labels.astype(np.float32), -labels, labels[:5], labels.reshape(6, 8), labels + 1000,
                                     np.array(["a"] * 48)])
    elif op == "keys":
        keys = {rng.choice(["x", "imgs", "images"]): images, rng.choice(["y", "lbl"]): labels}
    elif op == "float":
        keys["images"] = np.full((4, 3, 32, 32), rng.choice([np.nan, np.inf, 1e30, 0.0]), np.float32)
    elif op == "channels-first":
        keys["images"] = np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    path = d / ("frames.npy" if op == "npy" else "frames.npz")
    if op == "npy":
        np.save(path, images)
    else:
        np.savez(path, **keys)
    if op == "bytes":
        data, how = mutate_bytes(path.read_bytes(), rng)
        path.write_bytes(data)
        op = f"bytes: {how}"
    elif op == "version":
        with zipfile.ZipFile(path) as z:
            member = z.read("images.npy")
        member = member[:6] + bytes([rng.choice([1, 2, 3, 4, 0, 255]), rng.choice([0, 1])]) + member[8:]
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("images.npy", member)
            z.writestr("labels.npy", io.BytesIO().getvalue() or _npy_bytes(labels))
        op = f"npy version {member[6]}.{member[7]}"
    return _data_case(b, d, rng, "arrays", op, path)


def _data_case(b: Bases, d: Path, rng: random.Random, kind: str, note: str, data: Path) -> Case:
    """Most data cases stop after reading (vitedge.datasources.open_source, the loading stage of every command that
    reads data); one in VALIDATE_SHARE runs `validate` on the digits bundle with it."""
    if rng.random() < VALIDATE_SHARE:
        return Case(kind, note, cli=["validate", b.bundle, "--data", data, "--no-latency", "--report-dir", d / "out", "-q",
                                     "--cache-dir", d / "out" / "cache"])
    from vitedge.datasources.sources import open_source
    from vitedge.bundle.manifest import read_manifest
    from vitedge.bundle.spec import Preprocess

    pre = b.cache.setdefault("pre", Preprocess.from_dict(read_manifest(b.bundle).model.spec["preprocess"]))
    names = [str(i) for i in range(10)]

    def read_all():
        source = open_source(data, pre, class_names=names, min_count=1)
        for _ in source.batches(16):  # every item preprocessed, as calibration and validation read them
            pass

    return Case(kind, note, api=read_all)


def _npy_bytes(a) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


MAKERS = {"model-pt": case_model_pt, "model-onnx": case_model_onnx, "config": case_config, "matrix": case_matrix,
          "report": case_report, "bundle": case_bundle, "images": case_images, "arrays": case_arrays}


# ---- the pass ---------------------------------------------------------------------------------------------------

def plan(runs: int, rng: random.Random) -> list[str]:
    total = sum(WEIGHTS.values())
    kinds = [k for k, w in WEIGHTS.items() for _ in range(round(runs * w / total))]
    while len(kinds) < runs:
        kinds.append(rng.choice(list(WEIGHTS)))
    rng.shuffle(kinds)
    return kinds[:runs]


def fuzz(seed: int, runs: int, work: Path, kinds_only: set[str] | None = None, progress: bool = True) -> dict[str, Any]:
    from vitedge.core import telemetry

    telemetry.silence()
    rng = random.Random(seed)
    started = time.time()
    bases = make_bases(work, seed)
    shared = snapshot(REPO / "examples", REPO / "calibration", bases.bundle, bases.report.parent)
    counts: dict[str, Counter] = {k: Counter() for k in WEIGHTS}
    failures: list[dict[str, Any]] = []
    seconds: Counter = Counter()
    kinds = plan(runs, rng)
    if kinds_only:
        kinds = [k for k in kinds if k in kinds_only]
    for i, kind in enumerate(kinds):
        case_rng = random.Random(f"{seed}-{i}")
        d = work / "cases" / f"{i:05d}"
        d.mkdir(parents=True)
        t0 = time.time()
        try:
            case = MAKERS[kind](bases, d, case_rng)
        except Exception as err:  # noqa: BLE001 - a mutation the maker itself cannot write: not a vitedge run
            counts[kind]["not made"] += 1
            shutil.rmtree(d, ignore_errors=True)
            if progress:
                print(f"{i:5d} {kind:10s} not made: {type(err).__name__}: {err}", file=sys.stderr)
            continue
        before = snapshot(d, skip=d / "out")
        timeout = TIMEOUT.get(kind, DEFAULT_TIMEOUT)
        outcome = run_cli(case.cli, d, timeout) if case.cli is not None else run_api(case.api, timeout)
        after = snapshot(d, skip=d / "out")
        changed = sorted(set(before.items()) ^ set(after.items()))
        seconds[kind] += time.time() - t0
        counts[kind][str(outcome.code)] += 1
        bad = []
        if outcome.code == 3:
            bad.append("exit 3")
        if outcome.code == "hang":
            bad.append(f"no answer within {timeout} s")
        if changed:
            bad.append(f"changed outside the output: {sorted({p for p, _ in changed})[:3]}")
        if bad:
            failures.append({"run": i, "kind": kind, "mutation": case.note[:300], "problems": bad, "code": outcome.code,
                             "line": outcome.line})
        if progress:
            mark = "FAIL " + ", ".join(bad) if bad else ""
            print(f"{i:5d} {kind:10s} exit {outcome.code!s:4s} {time.time() - t0:5.1f}s {case.note[:60]!r} {mark} {outcome.line[:120]}",
                  file=sys.stderr)
        shutil.rmtree(d, ignore_errors=True)
    if snapshot(REPO / "examples", REPO / "calibration", bases.bundle, bases.report.parent) != shared:
        failures.append({"run": -1, "kind": "shared", "mutation": "", "problems": ["a shared valid input changed"], "code": "", "line": ""})
    return {
        "seed": seed,
        "runs": sum(sum(c.values()) - c.get("not made", 0) for c in counts.values()),
        "not_made": sum(c.get("not made", 0) for c in counts.values()),
        "per_kind": {k: dict(sorted(c.items())) for k, c in counts.items()},
        "seconds_per_kind": {k: round(v, 1) for k, v in seconds.items()},
        "failures": failures,
        "seconds": round(time.time() - started, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def markdown(result: dict[str, Any]) -> str:
    from vitedge import __version__

    lines = [
        "# Fuzzing vitedge's file inputs (tools/fuzz_inputs.py)",
        "",
        f"Seed {result['seed']}, {result['runs']} runs ({result['not_made']} mutations the maker could not write are not "
        f"counted), {result['seconds']:.0f} s on {result['platform']}, Python {result['python']}, vitedge {__version__}, "
        f"{result['date']}. The machine was shared with other work while it ran, so the times are loose.",
        "",
        "A run fails when it exits 3 (an internal error), answers nothing within its timeout, or changes a file outside "
        "its output folder.",
        "",
        "| input | runs | exit codes | seconds |",
        "|---|---|---|---|",
    ]
    for kind, counts in result["per_kind"].items():
        n = sum(v for k, v in counts.items() if k != "not made")
        codes = ", ".join(f"{k}: {v}" for k, v in counts.items() if k != "not made")
        lines.append(f"| {kind} | {n} | {codes} | {result['seconds_per_kind'].get(kind, 0):.0f} |")
    lines += ["", f"Failures: {len(result['failures'])}."]
    for f in result["failures"]:
        lines.append(f"- run {f['run']} ({f['kind']}): {', '.join(f['problems'])}; mutation: {f['mutation']}; {f['line']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--kinds", default="", help="comma-separated input kinds to run (default: all)")
    parser.add_argument("--out", type=Path, default=REPO / "tools" / "fuzz_inputs_result",
                        help="writes OUT.json and OUT.md")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vitedge-fuzz-") as tmp:
        os.environ.setdefault("VITEDGE_CACHE_DIR", str(Path(tmp) / "cache"))
        result = fuzz(args.seed, args.runs, Path(tmp), set(filter(None, args.kinds.split(","))) or None, not args.quiet)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
