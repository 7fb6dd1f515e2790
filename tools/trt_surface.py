"""Record the Python API surface of each TensorRT version from NVIDIA's real bindings wheels.

    python tools/trt_surface.py [--versions 10.12 11.4] [--wheels DIR] [--out vitedge/backends/tensorrt/surface]

For every TensorRT minor vitedge supports (``SUPPORTED`` below: the newest build of each minor on
PyPI), this script

1. downloads the bindings wheel with ``pip download --no-deps --only-binary :all:`` for CPython 3.11
   on x86_64 Linux (``tensorrt-bindings==8.6.1``, ``tensorrt-cu12-bindings==10.x/11.x``). The wheel
   holds ``tensorrt.so``, the pybind11 module, but not libnvinfer, so it cannot be imported as it is;
2. compiles stub shared objects for the libraries ``tensorrt.so`` links (libnvinfer, libnvonnxparser,
   libnvinfer_plugin). TensorRT's C++ API is virtual interfaces: the module imports only a handful of
   factory functions (``createInferBuilder_INTERNAL``, ``getPluginRegistry``, ...), which the stubs
   define to return 0. No stub is ever called while the module is only loaded and introspected;
3. imports ``tensorrt.so`` in a child process with the stubs on ``LD_LIBRARY_PATH`` and reads what
   pybind11 registered: every class, its members (methods, properties, enum values) and the
   docstrings, from which the deprecation notes ("[DEPRECATED] Deprecated in TensorRT 10.12.
   Superseded by strong typing.") are kept;
4. writes ``surface/<major>.<minor>.json`` (names sorted, so a diff shows what changed).

Nothing is built or run on a GPU: this reads names and docstrings only. Needs a C compiler, pip and
network access to pypi.org. The JSON files are committed; tests/backends/trt/test_tensorrt_surface.py checks the
stand-in and vitedge's calls against them, and vitedge/backends/tensorrt/versions.py reads them.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# minor -> (distribution, exact version): the newest build of each minor on pypi.org (checked with
# `pip index versions tensorrt-cu12-bindings` and `tensorrt-bindings`, 2026-11-25).
SUPPORTED: dict[str, tuple[str, str]] = {
    "8.6": ("tensorrt-bindings", "8.6.1"),
    "10.0": ("tensorrt-cu12-bindings", "10.0.1"),
    "10.1": ("tensorrt-cu12-bindings", "10.1.0"),
    "10.2": ("tensorrt-cu12-bindings", "10.2.0.post1"),
    "10.3": ("tensorrt-cu12-bindings", "10.3.0"),
    "10.4": ("tensorrt-cu12-bindings", "10.4.0"),
    "10.5": ("tensorrt-cu12-bindings", "10.5.0"),
    "10.6": ("tensorrt-cu12-bindings", "10.6.0.post2"),
    "10.7": ("tensorrt-cu12-bindings", "10.7.0.post1"),
    "10.8": ("tensorrt-cu12-bindings", "10.8.0.43"),
    "10.9": ("tensorrt-cu12-bindings", "10.9.0.34"),
    "10.10": ("tensorrt-cu12-bindings", "10.10.0.31"),
    "10.11": ("tensorrt-cu12-bindings", "10.11.0.33"),
    "10.12": ("tensorrt-cu12-bindings", "10.12.0.36"),
    "10.13": ("tensorrt-cu12-bindings", "10.13.3.9.post1"),
    "10.14": ("tensorrt-cu12-bindings", "10.14.1.48.post1"),
    "10.15": ("tensorrt-cu12-bindings", "10.15.1.29"),
    "10.16": ("tensorrt-cu12-bindings", "10.16.1.11"),
    "11.0": ("tensorrt-cu12-bindings", "11.0.0.114"),
    "11.1": ("tensorrt-cu12-bindings", "11.1.0.106"),
    "11.2": ("tensorrt-cu12-bindings", "11.2.1.2"),
    "11.3": ("tensorrt-cu12-bindings", "11.3.0.99"),
    "11.4": ("tensorrt-cu12-bindings", "11.4.0.106"),
}
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64")
SCHEMA = "vitedge.tensorrt-surface/1"
_NOT_STUBBED = re.compile(r"^(_?Py|_ITM_|__gmon|__pthread|__cxa|_Unwind|dl(open|sym|close|error)$)")

# Runs in the child process: argv[1] = tensorrt.so. Prints the surface as JSON.
_DUMP = r'''
import importlib.util, inspect, json, re, sys
spec = importlib.util.spec_from_file_location("tensorrt", sys.argv[1])
trt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(trt)
DEP = re.compile(r"\[?DEPRECATED\]?[^\n]*|[Dd]eprecated in TensorRT [0-9.]+[^\n]*")

def note(doc):
    m = DEP.search(doc or "")
    return re.sub(r"\s+", " ", m.group(0)).strip() if m else None

def enum_notes(doc):
    # pybind11 enums list "  NAME : text" under "Members:"; continuation lines are indented further.
    out, cur = {}, None
    for line in (doc or "").split("Members:", 1)[-1].splitlines():
        m = re.match(r"^  ([A-Za-z_][A-Za-z0-9_]*) :(.*)$", line)
        if m:
            cur = m.group(1); out[cur] = m.group(2)
        elif cur:
            out[cur] += "\n" + line
    return {k: note(v) for k, v in out.items() if note(v)}

classes, functions, values = {}, {}, {}
for name, obj in sorted(vars(trt).items()):
    if name.startswith("__"):
        continue
    if inspect.isclass(obj):
        entry = {"doc": (obj.__doc__ or "").strip().splitlines()[0][:200] if obj.__doc__ else ""}
        members = getattr(obj, "__members__", None)
        if isinstance(members, dict) and hasattr(obj, "value"):
            entry["kind"] = "enum"
            entry["values"] = sorted(members)
            dep = enum_notes(obj.__doc__)
        else:
            entry["kind"] = "class"
            dep = {}
        own = []
        for m in sorted(dir(obj)):
            if m.startswith("_pybind11") or (m.startswith("__") and m not in ("__init__", "__enter__", "__exit__",
                                                                                 "__len__", "__getitem__")):
                continue
            if "values" in entry and m in entry["values"]:
                continue
            own.append(m)
            try:
                attr = inspect.getattr_static(obj, m)
                doc = getattr(attr, "__doc__", None)
            except AttributeError:
                doc = None
            n = note(doc) if doc and not isinstance(attr, (int, str)) else None
            if n and doc is not type(obj).__doc__:
                dep[m] = n
        entry["members"] = own
        if dep:
            entry["deprecated"] = dict(sorted(dep.items()))
        classes[name] = entry
    elif callable(obj):
        functions[name] = note(getattr(obj, "__doc__", None)) or ""
    else:
        values[name] = type(obj).__name__
print(json.dumps({"classes": classes, "functions": functions, "values": values}))
'''


def download(dist: str, version: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--python-version", "3.11",
           "--implementation", "cp", "-d", str(dest), f"{dist}=={version}"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    found = sorted(dest.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
    if not found:
        raise SystemExit(f"pip download wrote no wheel for {dist}=={version} into {dest}")
    return found[0]


def stub_libraries(so: Path, out: Path) -> None:
    """One stub .so per NEEDED TensorRT library, each defining every undefined function of ``so``
    that neither Python nor libc provides. They return 0 and are never called during introspection."""
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(libnv[^\]]+)\]", subprocess.run(
        ["readelf", "-d", str(so)], check=True, capture_output=True, text=True).stdout)
    undefined = [line.split()[-1] for line in subprocess.run(["nm", "-D", "--undefined-only", str(so)], check=True,
                                                             capture_output=True, text=True).stdout.splitlines()]
    symbols = sorted({s for s in undefined if "@" not in s and not _NOT_STUBBED.match(s)})
    source = out / "stub.c"
    source.write_text("".join(f"void *{s}(void) {{ return 0; }}\n" for s in symbols))
    for lib in needed:
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out / lib), str(source)], check=True)


def extract(wheel: Path, work: Path) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith("/tensorrt.so") or re.search(r"/tensorrt\.cpython[^/]*\.so$", n)]
        if not names:
            raise SystemExit(f"{wheel.name} holds no tensorrt.so")
        zf.extract(names[0], work)
    so = work / names[0]
    stub_libraries(so, work)
    proc = subprocess.run([sys.executable, "-c", _DUMP, str(so)], capture_output=True, text=True, timeout=300,
                          env={"LD_LIBRARY_PATH": str(work), "PATH": "/usr/bin:/bin"})
    if proc.returncode != 0:
        raise SystemExit(f"could not load {so.name} from {wheel.name} with stub libraries: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def _dumps(record: dict) -> str:
    """One class per line: small files whose diffs between versions read as API changes."""
    head = {k: v for k, v in record.items() if k != "classes"}
    lines = [json.dumps(head)[:-1] + ', "classes": {']
    items = list(record["classes"].items())
    for i, (name, entry) in enumerate(items):
        lines.append(f" {json.dumps(name)}: {json.dumps(entry)}" + ("," if i < len(items) - 1 else ""))
    return "\n".join(lines) + "\n}}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", nargs="*", default=list(SUPPORTED), help="minors to record (default: all supported)")
    ap.add_argument("--wheels", type=Path, default=Path(tempfile.gettempdir()) / "vitedge-trt-wheels",
                    help="where the wheels are downloaded (reused when present)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "vitedge/backends/tensorrt/surface")
    args = ap.parse_args(argv)
    unknown = [v for v in args.versions if v not in SUPPORTED]
    if unknown:
        print(f"error: no wheel known for TensorRT {', '.join(unknown)}; known: {', '.join(SUPPORTED)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for minor in args.versions:
        dist, version = SUPPORTED[minor]
        wheel = download(dist, version, args.wheels)
        with tempfile.TemporaryDirectory() as tmp:
            api = extract(wheel, Path(tmp))
        record = {"schema": SCHEMA, "tensorrt": minor, "wheel": wheel.name, "distribution": f"{dist}=={version}",
                  "source": "names and docstrings registered by tensorrt.so, loaded with stub libnvinfer (tools/trt_surface.py)",
                  **api}
        path = args.out / f"{minor}.json"
        tmp_path = path.with_suffix(".json.tmp")
        tmp_path.write_text(_dumps(record))
        tmp_path.replace(path)
        n_members = sum(len(c["members"]) + len(c.get("values", [])) for c in api["classes"].values())
        print(f"TensorRT {minor}: {wheel.name}: {len(api['classes'])} classes, {n_members} members -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
