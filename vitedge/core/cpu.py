"""What this CPU's INT8 kernels can do, and whether a bundle's INT8 graph is safe on it.

The one fact that changes INT8 *results* (not only speed) on x86: without VNNI
(AVX512_VNNI, AVX_VNNI) or AMX, ONNX Runtime and OpenVINO multiply u8 x s8 with
VPMADDUBSW, which saturates pairs of products in int16. A graph whose weights use the
full INT8 range is then silently wrong; vitedge's default weight range ("pairwise", see
vitedge.quantize.weight_range) cannot saturate and is safe everywhere. A bundle records
what it needs (``quantization.cpu_requirement``); ``vitedge.runtime.load`` checks it here.

Reads /proc/cpuinfo (Linux). Elsewhere the flags are unknown and the check says so rather
than guessing. Nothing heavy is imported: the runtime uses this on camera boxes.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
ALLOW_ENV = "VITEDGE_ALLOW_CPU_MISMATCH"
# oneDNN's ISA cap, which OpenVINO's CPU plugin honours: at these levels its INT8 kernels are the
# pre-VNNI ones whatever the CPU has. vitedge then reads the CPU as capped (for every runtime: ONNX
# Runtime ignores the cap, so for it this is the cautious reading).
ONEDNN_CAP_ENV = "ONEDNN_MAX_CPU_ISA"
PRE_VNNI_LEVELS = ("SSE41", "AVX", "AVX2", "AVX512_CORE")
# Levels without AVX-512, where OpenVINO's CPU plugin still lists BF16 among its capabilities but cannot compile a
# bf16 Softmax ("Supported primitive descriptors list is empty"; OpenVINO 2026.4.1 on an AVX512_BF16 EPYC, where
# AVX512_CORE and every level above it compiled bf16).
NO_AVX512_LEVELS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2")

# cpu_requirement values written by the quantizer
ANY_X86 = "any-x86"
VNNI = "vnni"


@dataclass(frozen=True)
class CpuInfo:
    machine: str  # platform.machine(): x86_64, aarch64, ...
    model: str  # the model name, or "" when unknown
    flags: frozenset[str] = field(default_factory=frozenset)
    known: bool = False  # False when the flags could not be read
    isa_cap: str | None = None  # a pre-VNNI ONEDNN_MAX_CPU_ISA level in force (its flags above it are dropped)

    @property
    def is_x86(self) -> bool:
        return self.machine.lower() in ("x86_64", "amd64", "i386", "i686", "x86")

    @property
    def int8_dot_product(self) -> bool | None:
        """True with VNNI/AMX (int32 accumulation), False on x86 without them, None when unknown."""
        if not self.is_x86:
            return True  # Arm's SDOT/UDOT and its widening multiplies do not saturate int16 pairs
        if not self.known:
            return None
        return any(f in self.flags for f in VNNI_FLAGS)

    @property
    def isa(self) -> str:
        """A short label for reports and benchmark records: amx, avx512-vnni, avx-vnni, avx512, avx2, ..."""
        if not self.is_x86:
            return self.machine or "unknown"
        if not self.known:
            return "x86 (flags unknown)"
        if self.isa_cap:
            return f"{self._isa_label()}, oneDNN capped at {self.isa_cap}"
        return self._isa_label()

    def _isa_label(self) -> str:
        for flag, label in (("amx_int8", "amx"), ("avx512_vnni", "avx512-vnni"), ("avx_vnni", "avx-vnni"),
                            ("avx512f", "avx512 (no vnni)"), ("avx2", "avx2 (no vnni)")):
            if flag in self.flags:
                return label
        return "x86 (no avx2)"

    def to_dict(self) -> dict[str, object]:
        capped = {"isa_cap": self.isa_cap} if self.isa_cap else {}  # only when in force: records stay as they were
        return {"machine": self.machine, "model": self.model, "isa": self.isa, **capped,
                "int8_dot_product": self.int8_dot_product,
                "flags": sorted(f for f in self.flags if f.startswith(("avx", "amx", "sse4", "fma", "f16c")))}


def read_cpu(cpuinfo: str | Path = "/proc/cpuinfo", machine: str | None = None, *, capped: bool = True) -> CpuInfo:
    """This machine's CPU (``cpuinfo`` and ``machine`` are for tests with recorded facts); ``capped=False`` ignores a
    oneDNN ISA cap (what ONNX Runtime, which does not read it, runs on)."""
    machine = machine if machine is not None else platform.machine()
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return CpuInfo(machine=machine, model=platform.processor() or "", known=False)
    flags: set[str] = set()
    model = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "model name" and not model:
            model = value.strip()
    cap = (onednn_cap() or "") if capped else ""
    if flags and cap in PRE_VNNI_LEVELS:
        flags = capped_flags(flags, cap)
    else:
        cap = ""
    return CpuInfo(machine=machine, model=model, flags=frozenset(flags), known=bool(flags), isa_cap=cap or None)


# The CPU kinds a bundle can be built for (`vitedge build --cpu-kind`): the ISA labels results files are named by
# (benchmarks/results/*_<kind>.md), which ``cpu_kind`` gives for an x86 CPU with AVX2 or more
CPU_KINDS = ("avx2", "avx512", "avx-vnni", "avx512-vnni", "amx")


def cpu_kind(cpu: CpuInfo) -> str:
    """``cpu``'s kind: the first word of its ISA label (avx2, avx512, avx-vnni, avx512-vnni, amx; x86 or the machine
    name for the others)."""
    return cpu.isa.split(",")[0].split(" ")[0]


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, as a container or `taskset` limits it), else all of them;
    at least 1. Thread counts, the OpenVINO stream rule and `latency.device` all read this one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def timing_identity(cpu: CpuInfo | None = None) -> dict[str, object]:
    """The CPU a latency was timed on, as validation reports record it (``latency.device``): `vitedge compare` compares
    two reports' milliseconds only when these agree."""
    cpu = cpu or read_cpu()
    return {"model": cpu.model or "unknown", "isa": cpu.isa, "cpus": usable_cpus()}


def onednn_cap() -> str | None:
    """The oneDNN ISA cap in force (upper case, as oneDNN reads it case-blind), or None."""
    return os.environ.get(ONEDNN_CAP_ENV, "").strip().upper() or None


def bf16_capped_off() -> bool:
    """True when a oneDNN ISA cap below AVX-512 is in force: OpenVINO's float regions must then run f32."""
    return onednn_cap() in NO_AVX512_LEVELS


def capped_flags(flags: set[str], cap: str) -> set[str]:
    """The flags a pre-VNNI oneDNN ISA level leaves usable: no VNNI or AMX, and no AVX-512 below AVX512_CORE."""
    dropped = {f for f in flags if f in VNNI_FLAGS or f.startswith("amx")}
    if cap != "AVX512_CORE":
        dropped |= {f for f in flags if f.startswith("avx512")}
    if cap in ("SSE41", "AVX"):
        dropped |= {f for f in flags if f.startswith("avx2")}
    if cap == "SSE41":
        dropped |= {f for f in flags if f.startswith("avx")}
    return flags - dropped


@dataclass(frozen=True)
class CpuCheck:
    ok: bool
    message: str | None  # None when nothing needs saying


def check_requirement(requirement: str | None, cpu: CpuInfo | None = None) -> CpuCheck:
    """Whether a graph that needs ``requirement`` gives correct INT8 results on ``cpu``."""
    cpu = cpu or read_cpu()
    if requirement in (None, ANY_X86):
        return CpuCheck(True, None)
    if requirement != VNNI:
        return CpuCheck(True, f"the bundle names an unknown CPU requirement {requirement!r}; not checked")
    has = cpu.int8_dot_product
    if has:
        return CpuCheck(True, None)
    what = f"this CPU ({cpu.model or cpu.machine}, {cpu.isa})"
    if has is None:
        return CpuCheck(True, f"the bundle's INT8 weights use the full 8-bit range, which needs VNNI/AMX on x86; "
                              f"could not read {what}'s flags, so this was not checked")
    return CpuCheck(False, f"the bundle's INT8 weights use the full 8-bit range (weight_range = \"full\"), which pre-VNNI x86 "
                           f"kernels saturate, giving wrong results on {what}: rebuild with the default weight range "
                           f"(weight_range = \"pairwise\"), or set {ALLOW_ENV}=1 (runtime: allow_cpu_mismatch=True) to run it anyway")


def mismatch_allowed() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")
