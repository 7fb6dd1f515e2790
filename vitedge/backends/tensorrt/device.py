"""Device facts an engine is tied to, read on the device, and the check that refuses a
mismatched engine.

A TensorRT engine (and its timing cache) is specific to the GPU, the TensorRT version and
the platform it was built on (TensorRT docs: "Serialized engines are not portable across
platforms or TensorRT versions"). vitedge records those facts beside the engine
(engine_facts.json and the manifest's backend_info) and compares them with the device
before it loads an engine, so the user reads which fact differs instead of a
deserialisation failure or silent misbehaviour. Building with hardware or version
compatibility relaxes exactly the facts those modes cover, and the message says so.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from vitedge.core.errors import BundleError, IncompatibleEngineError, MissingDependencyError
from vitedge.bundle.manifest import Manifest

FACTS_FILE = "engine_facts.json"
NV_TEGRA_RELEASE = Path("/etc/nv_tegra_release")
DEVICE_TREE = Path("/proc/device-tree")


@dataclass(frozen=True)
class DeviceFacts:
    tensorrt: str | None = None
    gpu_name: str | None = None
    compute_capability: str | None = None  # "8.7"
    cuda_runtime: str | None = None  # "12.2"
    cuda_driver: str | None = None
    l4t: str | None = None  # Jetson Linux release, "36.3.0"
    jetpack: str | None = None  # nvidia-jetpack package version, "6.0+b106"
    module: str | None = None  # device-tree model, "NVIDIA Jetson AGX Orin Developer Kit"
    compatible: str | None = None  # device-tree compatible, "nvidia,p3737-0000+p3701-0005 nvidia,tegra234"
    machine: str = dataclasses.field(default_factory=platform.machine)
    # a Jetson's nvpmodel power mode ("MAXN", "15W", ...): it moves latency by 2x or more and does not change what
    # an engine is compatible with, so compare_facts ignores it; timing_device records it
    power_mode: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DeviceFacts":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def timing_device(self) -> dict[str, Any]:
        """What a TensorRT latency is timed on (``latency.device`` of a validation report): the GPU and the module it
        sits in. Not the TensorRT version: a new TensorRT timing slower on the same GPU is what `vitedge compare` is
        for."""
        out: dict[str, Any] = {"kind": "gpu", "model": self.module or self.gpu_name or "unknown", "gpu": self.gpu_name,
                               "compute_capability": self.compute_capability}
        if self.power_mode is not None:
            out["power_mode"] = self.power_mode
        return out

    def describe(self) -> str:
        parts = [f"GPU {self.gpu_name or '?'} (compute {self.compute_capability or '?'})", f"TensorRT {self.tensorrt or '?'}",
                 f"CUDA {self.cuda_runtime or '?'}"]
        if self.l4t or self.jetpack:
            parts.append(f"JetPack {self.jetpack or '?'} / L4T {self.l4t or '?'}")
        return ", ".join(parts) + f", {self.machine}"


def parse_nv_tegra_release(text: str) -> str | None:
    """'# R36 (release), REVISION: 3.0, GCID: ...' -> '36.3.0'."""
    m = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def parse_dpkg_jetpack(text: str) -> str | None:
    """`dpkg-query -W nvidia-jetpack` output 'nvidia-jetpack\\t6.0+b106' -> '6.0+b106'."""
    parts = (text or "").strip().split()
    return parts[1] if len(parts) >= 2 and parts[0].startswith("nvidia-jetpack") else None


def _cuda_version(code: int) -> str | None:
    return f"{code // 1000}.{(code % 1000) // 10}" if code else None


def read_jetson_release() -> tuple[str | None, str | None]:
    """(L4T release, JetPack version) on a Jetson; (None, None) elsewhere."""
    l4t = None
    try:
        l4t = parse_nv_tegra_release(NV_TEGRA_RELEASE.read_text(errors="replace"))
    except OSError:
        pass
    jetpack = None
    if l4t is not None:
        try:
            out = subprocess.run(["dpkg-query", "-W", "nvidia-jetpack"], capture_output=True, text=True, timeout=10)
            jetpack = parse_dpkg_jetpack(out.stdout) if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            jetpack = None
    return l4t, jetpack


def parse_nvpmodel_query(text: str) -> str | None:
    """`nvpmodel -q` output ('NV Fan Mode:cool\\nNV Power Mode: MAXN\\n0') -> 'MAXN'."""
    m = re.search(r"NV Power Mode:\s*(\S[^\n]*)", text or "")
    return m.group(1).strip() if m else None


def read_power_mode() -> str | None:
    """A Jetson's power mode from `nvpmodel -q`; None where there is no nvpmodel or it does not answer (it may need root
    on some releases). Parsed from recorded outputs of JetPack 4-6 devices; not run on a Jetson by vitedge's tests."""
    exe = shutil.which("nvpmodel")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvpmodel_query(out.stdout) if out.returncode == 0 else None


def read_device_tree(root: Path = DEVICE_TREE) -> tuple[str | None, str | None]:
    """(model, compatible) from the device tree (NUL-separated strings), (None, None) without one."""
    out: list[str | None] = []
    for name in ("model", "compatible"):
        try:
            raw = (root / name).read_bytes()
        except OSError:
            out.append(None)
            continue
        text = " ".join(p.decode(errors="replace").strip() for p in raw.split(b"\0") if p.strip())
        out.append(text or None)
    return out[0], out[1]


# The cuda-python range whose layouts this module handles (pyproject's [tensorrt] extra pins it):
# 12.0-12.5 have only ``cuda.cudart``; 12.6+ add ``cuda.bindings.runtime``; 13.x has only the
# latter (checked against cuda-bindings 13.5). Both expose the same (error, value...) calls.
CUDA_PYTHON_RANGE = ">=12.0,<14"
REQUIRED_CALLS = ("cudaGetDeviceCount", "cudaGetDeviceProperties", "cudaRuntimeGetVersion", "cudaDriverGetVersion",
                  "cudaStreamCreate", "cudaStreamSynchronize", "cudaStreamDestroy", "cudaMalloc", "cudaFree",
                  "cudaMemcpyAsync", "cudaMemcpyKind")


def cudart_module() -> Any:
    """cuda-python's runtime API: ``cuda.bindings.runtime`` (12.6+), or the older ``cuda.cudart``.
    ImportError when neither exists; MissingDependencyError when the module lacks a call vitedge makes."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        from cuda import cudart as runtime  # cuda-python 12.0-12.5
    missing = [name for name in REQUIRED_CALLS if not hasattr(runtime, name)]
    if missing:

        raise MissingDependencyError(f"a cuda-python whose {runtime.__name__} has {', '.join(missing[:3])}",
                                     f"pip install 'cuda-python{CUDA_PYTHON_RANGE}'")
    return runtime


def cuda_call(result: Any, what: str) -> Any:
    """Unpack cuda-python's (error, value...) tuples; a BundleError naming the call otherwise."""
    if not isinstance(result, tuple):
        result = (result,)
    err, rest = result[0], result[1:]
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise BundleError(f"CUDA call {what} failed: {name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def read_device_facts(trt: ModuleType | None = None, cudart: ModuleType | None = None, *, device: int = 0) -> DeviceFacts:
    """Facts of this machine. Needs TensorRT and cuda-python for the GPU facts; any that
    cannot be read stay None."""
    gpu = cc = runtime = driver = None
    try:
        rt = cudart if cudart is not None else cudart_module()
        runtime = _cuda_version(cuda_call(rt.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion"))
        driver = _cuda_version(cuda_call(rt.cudaDriverGetVersion(), "cudaDriverGetVersion"))
        prop = cuda_call(rt.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
        name = prop.name
        gpu = (name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name)).strip()
        cc = f"{prop.major}.{prop.minor}"
    except Exception:
        pass
    l4t, jetpack = read_jetson_release()
    module, compatible = read_device_tree()
    version = getattr(trt, "__version__", None) if trt is not None else None
    return DeviceFacts(tensorrt=version, gpu_name=gpu, compute_capability=cc, cuda_runtime=runtime, cuda_driver=driver,
                       l4t=l4t, jetpack=jetpack, module=module, compatible=compatible,
                       power_mode=read_power_mode() if l4t is not None else None)


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(text or ""))[:4])


def _cc_tuple(text: str | None) -> tuple[int, int]:
    parts = _version_tuple(text)
    return (parts + (0, 0))[:2] if parts else (0, 0)


def compare_facts(recorded: DeviceFacts, current: DeviceFacts, *, hardware_compatibility: str = "none",
                  version_compatible: bool = False) -> tuple[list[str], list[str]]:
    """(differences that forbid loading, differences the build's compatibility mode allows)."""
    refuse: list[str] = []
    relaxed: list[str] = []

    def differ(label: str, a: object, b: object) -> str:
        return f"{label} {b!r} here vs {a!r} recorded"

    if recorded.machine != current.machine:
        refuse.append(differ("platform", recorded.machine, current.machine))
    if recorded.tensorrt != current.tensorrt:
        line = differ("TensorRT", recorded.tensorrt, current.tensorrt)
        newer = _version_tuple(current.tensorrt) > _version_tuple(recorded.tensorrt)
        if version_compatible and newer and _version_tuple(recorded.tensorrt) >= (8, 6):
            relaxed.append(line + " (allowed: built version-compatible, and this TensorRT is newer)")
        else:
            refuse.append(line + (" (a version-compatible engine loads only on the same or a newer TensorRT)" if version_compatible else ""))
    for label, attr in (("JetPack", "jetpack"), ("L4T release", "l4t")):
        a, b = getattr(recorded, attr), getattr(current, attr)
        if a != b:
            (relaxed if version_compatible and a and b else refuse).append(
                differ(label, a, b) + (" (allowed: built version-compatible)" if version_compatible and a and b else ""))
    cc_diff = recorded.compute_capability != current.compute_capability
    name_diff = recorded.gpu_name != current.gpu_name
    if hardware_compatibility == "ampere_plus":
        if _cc_tuple(current.compute_capability) < (8, 0):
            refuse.append(differ("compute capability", recorded.compute_capability, current.compute_capability)
                          + " (an ampere_plus engine needs compute capability 8.0 or newer)")
        elif cc_diff or name_diff:
            relaxed.append(differ("GPU", f"{recorded.gpu_name} ({recorded.compute_capability})", f"{current.gpu_name} ({current.compute_capability})")
                           + " (allowed: built hardware-compatible for Ampere and newer)")
    elif hardware_compatibility == "same_compute_capability":
        if cc_diff:
            refuse.append(differ("compute capability", recorded.compute_capability, current.compute_capability)
                          + " (a same_compute_capability engine needs the same compute capability)")
        elif name_diff:
            relaxed.append(differ("GPU", recorded.gpu_name, current.gpu_name) + " (allowed: same compute capability)")
    else:
        if name_diff:
            refuse.append(differ("GPU", recorded.gpu_name, current.gpu_name))
        if cc_diff:
            refuse.append(differ("compute capability", recorded.compute_capability, current.compute_capability))
    rec_cuda, cur_cuda = _version_tuple(recorded.cuda_runtime)[:1], _version_tuple(current.cuda_runtime)[:1]
    if rec_cuda != cur_cuda:
        line = differ("CUDA major", recorded.cuda_runtime, current.cuda_runtime)
        (relaxed if version_compatible else refuse).append(line + (" (allowed: built version-compatible)" if version_compatible else ""))
    return refuse, relaxed


def check_engine_facts(recorded: dict[str, Any], current: DeviceFacts, *, engine: str = "the engine") -> list[str]:
    """Raise IncompatibleEngineError when ``current`` cannot load an engine built with
    ``recorded`` (an engine_facts.json / backend_info record); return the relaxed
    differences otherwise (empty for an exact match)."""
    device = recorded.get("device") or {}
    built = DeviceFacts.from_dict(device)
    hw = recorded.get("hardware_compatibility", "none")
    vc = bool(recorded.get("version_compatible", False))
    refuse, relaxed = compare_facts(built, current, hardware_compatibility=hw, version_compatible=vc)
    if refuse:
        raise IncompatibleEngineError(
            f"{engine} was built for {built.describe()} and cannot be loaded here: {'; '.join(refuse)}. "
            "TensorRT engines are tied to the GPU, TensorRT version and platform they were built on; "
            "rebuild it on this device with `vitedge engine BUNDLE --force`")
    return relaxed


def read_facts_file(folder: Path) -> dict[str, Any] | None:
    path = Path(folder) / FACTS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BundleError(f"{path} is not readable JSON ({err})") from None
    return data if isinstance(data, dict) else None


def check_engine_manifest(manifest: Manifest, current: DeviceFacts) -> list[str]:
    """The same check from a bundle's manifest (backend_info written by the engine build)."""
    info = manifest.backend_info if hasattr(manifest, "backend_info") else dict(manifest)
    if not info.get("engine_built"):
        raise BundleError("this bundle holds no TensorRT engine yet; build it on the device with `vitedge engine BUNDLE`")
    return check_engine_facts(info, current, engine=str(info.get("engine", "model.engine")))
