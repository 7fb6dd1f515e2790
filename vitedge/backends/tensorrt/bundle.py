"""TensorRT bundle steps: plan files where no engine can be built, and the on-device engine
build (`vitedge engine BUNDLE` runs it through vitedge.app.engine_completion).

Where TensorRT or a GPU is missing, a tensorrt bundle still holds everything the device
needs: the validated Q/DQ graph, the FP32 graph for the reference engine, build_plan.json
and trtexec.txt. Nothing in it claims an engine, an accuracy or a latency.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from vitedge.backends.tensorrt.attention import attention_blocks, fusion_warnings
from vitedge.backends.tensorrt.apply import EngineBuild, apply_plan, write_engine
from vitedge.backends.tensorrt.device import FACTS_FILE, DeviceFacts, read_device_facts
from vitedge.backends.tensorrt.plan import (
    ENGINE,
    PLAN_FILE,
    QDQ_GRAPH,
    REFERENCE_ENGINE,
    TIMING_CACHE,
    TRTEXEC_FILE,
    TYPED_GRAPH,
    BuildPlan,
    GraphFacts,
    TensorRtOptions,
    TrtCapabilities,
    capabilities_from_module,
    plan_build,
    reference_plan,
    trtexec_command,
    write_plan_files,
)
from vitedge.backends.tensorrt.typed import make_strongly_typed
from vitedge.core.errors import UsageError
from vitedge.files.atomic import atomic_write_path, sha256_bytes
from vitedge.onnxkit.files import save_onnx
from vitedge.core.paths import cache_dir

if TYPE_CHECKING:
    from onnx import ModelProto

NEXT_STEP = "build the engine on the device: vitedge engine BUNDLE"
NOT_MEASURED = "no engine was built here, so no TensorRT accuracy or latency was measured"


@dataclass
class PlannedBuild:
    graph: GraphFacts
    caps: TrtCapabilities
    plan: BuildPlan
    reference: BuildPlan
    typed_report: dict[str, Any] | None
    files: list[str]  # written into the bundle, relative
    attention: list[dict[str, Any]] = field(default_factory=list)  # attention.AttentionBlock dicts
    attention_warnings: list[str] = field(default_factory=list)  # why INT8 fused MHA cannot happen, before any build

    def attention_info(self) -> dict[str, Any]:
        return {"blocks": self.attention, "warnings": self.attention_warnings}


def load_checked_graph(qdq_path: Path) -> Any:
    """The Q/DQ graph, after the TensorRT explicit-quantization checker passed on it."""
    import onnx

    # The quantizer is not in the runtime distribution, which ships this module: imported here.
    from vitedge.quantize.checker import assert_qdq_graph

    model = onnx.load(str(qdq_path))  # with its external data: the typed graph rewrites weights
    assert_qdq_graph(model)  # raises QuantizationError naming the broken rules
    return model


def plan_bundle(out_dir: Path, options: TensorRtOptions, batch_sizes: tuple[int, ...], caps: TrtCapabilities,
                *, model: ModelProto | None = None) -> PlannedBuild:
    """Check the Q/DQ graph, plan both engines and write the plan files (and the strongly
    typed graph when the plan builds from it) into ``out_dir``."""
    if model is None:
        model = load_checked_graph(out_dir / QDQ_GRAPH)
    graph = GraphFacts.from_model(model)
    plan = plan_build(options, batch_sizes, caps, graph=graph)
    ref = reference_plan(plan)

    blocks = attention_blocks(model)
    attention = [b.to_dict() for b in blocks]
    warnings = fusion_warnings(blocks)
    files = write_plan_files(out_dir, [plan, ref], caps, graph, {"blocks": attention, "warnings": warnings})
    typed_report = None
    if plan.typed_graph is not None:

        typed, report = make_strongly_typed(model, **plan.typed_graph)
        save_onnx(typed, out_dir / TYPED_GRAPH)
        typed_report = report.to_dict()
        files.append(TYPED_GRAPH)
    return PlannedBuild(graph, caps, plan, ref, typed_report, files, attention, warnings)


def offline_info(planned: PlannedBuild, reason: str, install_hint: str | None) -> dict[str, Any]:
    """backend_info for a bundle whose engine could not be built here."""
    return {
        "engine_built": False,
        "next_step": NEXT_STEP,
        "reason": reason,
        "install_hint": install_hint,
        "planned_for_tensorrt": planned.caps.version,
        "capabilities_assumed": planned.caps.assumed,
        "plan_file": PLAN_FILE,
        "trtexec_file": TRTEXEC_FILE,
        "trtexec": trtexec_command(planned.plan, tf32_flag=planned.caps.tf32_flag),
        "typed_graph": planned.typed_report,
        "attention": planned.attention_info(),
        "measured": NOT_MEASURED,
    }


# -- timing cache ----------------------------------------------------------------------------

def timing_cache_parts(facts: DeviceFacts, plan: BuildPlan) -> dict[str, Any]:
    """What a timing cache is valid for: one GPU, CUDA, TensorRT version and set of builder flags."""
    return {"tensorrt": facts.tensorrt, "gpu": facts.gpu_name, "cc": facts.compute_capability, "cuda": facts.cuda_runtime,
            "machine": facts.machine, "l4t": facts.l4t, "flags": sorted(plan.builder_flags),
            "hardware": plan.hardware_compatibility, "dla": plan.dla_core}


def timing_cache_key(facts: DeviceFacts, plan: BuildPlan) -> str:
    return hashlib.sha256(json.dumps(timing_cache_parts(facts, plan), sort_keys=True).encode()).hexdigest()[:24]


def _user_cache_path(key: str) -> Path:

    return cache_dir() / "tensorrt" / f"timing-{key}.cache"


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    diffs = [f"{k} {new.get(k)!r} here vs {old.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return "; ".join(diffs[:3]) or "the recorded key differs"


def _load_timing_cache(bundle_dir: Path, previous: dict[str, Any] | None, key: str,
                       parts: dict[str, Any] | None = None) -> tuple[bytes | None, str]:
    """(cache bytes or None, why). A cache is used only when its key (device, TensorRT, flags)
    matches and its bytes hash to the sha256 recorded when it was written; otherwise the
    reason the rebuild starts fresh is returned, so the report can say why it is not the
    same build."""
    prev = (previous or {}).get("timing_cache") or {}
    path = bundle_dir / TIMING_CACHE
    notes: list[str] = []
    if path.is_file():
        data = path.read_bytes()
        if prev.get("key") != key:
            old_parts = prev.get("parts")
            why = _differences(old_parts, parts) if isinstance(old_parts, dict) and parts else "another device/TensorRT/flags"
            notes.append(f"the bundle's timing cache was made for {why}")
        elif not prev.get("sha256"):
            notes.append("the bundle's timing cache has no recorded sha256 to check it against")
        elif sha256_bytes(data) != prev["sha256"]:
            notes.append("the bundle's timing.cache does not match the sha256 recorded in manifest.json (modified or corrupt)")
        else:
            return data, f"the bundle's timing cache (same device, TensorRT and flags; sha256 {prev['sha256'][:12]} checked)"
    user = _user_cache_path(key)
    if user.is_file():
        data = user.read_bytes()
        recorded = _read_sidecar(user)
        if recorded and sha256_bytes(data) == recorded:
            return data, "; ".join(notes + [f"the timing cache in {user.parent} (sha256 {recorded[:12]} checked)"])
        notes.append(f"{user.name} " + ("does not match its recorded sha256" if recorded else "has no recorded sha256") + ": ignored")
    if not notes:
        return None, "no timing cache yet: started a fresh one"
    return None, "; ".join(notes) + ": started a fresh one"


def _read_sidecar(path: Path) -> str | None:
    try:
        return path.with_suffix(".sha256").read_text().strip() or None
    except OSError:
        return None


def _store_user_cache(key: str, data: bytes) -> None:

    path = _user_cache_path(key)
    try:
        with atomic_write_path(path) as tmp:
            tmp.write_bytes(data)
        with atomic_write_path(path.with_suffix(".sha256")) as tmp:
            tmp.write_text(sha256_bytes(data) + "\n")
    except OSError:
        pass  # a cache we cannot write only costs build time


# -- the on-device build ---------------------------------------------------------------------

def build_on_device(trt: ModuleType, out_dir: Path, options: TensorRtOptions, batch_sizes: tuple[int, ...], *,
                    log: Callable[[str], None] | None = None, cudart: ModuleType | None = None, facts: DeviceFacts | None = None,
                    previous: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Plan for the TensorRT found here, build the INT8 and FP32-reference engines into
    ``out_dir`` and record the device. Returns (backend_info, extra files)."""

    say = log or (lambda _m: None)
    caps = capabilities_from_module(trt)
    facts = facts if facts is not None else read_device_facts(trt, cudart)
    if options.hardware_compatibility == "ampere_plus":
        cc = tuple(int(p) for p in (facts.compute_capability or "0.0").split(".")[:2])
        if cc < (8, 0):
            raise UsageError(f"hardware_compatibility = \"ampere_plus\" must be built on an Ampere or newer GPU; "
                             f"this one is compute {facts.compute_capability}")
    planned = plan_bundle(out_dir, options, batch_sizes, caps)
    plan, ref = planned.plan, planned.reference
    for w in planned.attention_warnings:
        say("warning: " + w)
    parts = timing_cache_parts(facts, plan)
    key = timing_cache_key(facts, plan)
    cache, cache_note = (None, "timing cache off") if not plan.timing_cache else _load_timing_cache(out_dir, previous, key, parts)
    input_sha = sha256_bytes(cache) if cache is not None else None
    say(f"TensorRT {caps.version} on {facts.describe()}; {cache_note}")
    builds: dict[str, EngineBuild] = {}
    for p in (plan, ref):
        attention = planned.attention if p.role == "int8" else None
        result = apply_plan(trt, p, out_dir / p.graph, timing_cache=cache, log=say, attention=attention)
        write_engine(out_dir / p.engine, result.engine)
        if result.timing_cache is not None:
            cache = result.timing_cache  # the reference build extends the same cache
        builds[p.role] = result
        for w in result.warnings:
            say("warning: " + w)
    extra = list(planned.files) + [REFERENCE_ENGINE, FACTS_FILE]
    timing: dict[str, Any] | None = None
    if plan.timing_cache and cache is not None:
        write_engine(out_dir / TIMING_CACHE, cache)
        _store_user_cache(key, cache)
        extra.append(TIMING_CACHE)
        timing = {"file": TIMING_CACHE, "key": key, "parts": parts, "sha256": sha256_bytes(cache), "input_sha256": input_sha,
                  "device": facts.to_dict(), "builder_flags": list(plan.builder_flags),
                  "reused": builds["int8"].timing_cache_reused, "source": cache_note,
                  "note": "valid only for this GPU, CUDA, TensorRT version and builder flags"}
    record = {
        "schema": "vitedge.tensorrt-engine/1",
        "engine": ENGINE,
        "reference": REFERENCE_ENGINE,
        "device": facts.to_dict(),
        "hardware_compatibility": plan.hardware_compatibility,
        "version_compatible": plan.version_compatible,
    }
    write_engine(out_dir / FACTS_FILE, (json.dumps(record, indent=2) + "\n").encode())
    info = dict(record)
    info.pop("schema")
    info.update({
        "engine_built": True,
        "relaxed_by_compatibility": _relaxed_description(plan),
        "tensorrt_capabilities": caps.to_dict(),
        "plan": {"file": PLAN_FILE, "strongly_typed": plan.strongly_typed, "network_flags": list(plan.network_flags),
                 "builder_flags": list(plan.builder_flags), "workspace_mb": plan.workspace_bytes >> 20,
                 "optimization_level": plan.optimization_level,
                 "profile": {"min": list(plan.profile_min), "opt": list(plan.profile_opt), "max": list(plan.profile_max)},
                 "fp32_layers": len(builds["int8"].fp32_layers), "dla_core": plan.dla_core, "gpu_fallback": plan.gpu_fallback},
        "build": {role: b.info() for role, b in builds.items()},
        "timing_cache": timing,
        "typed_graph": planned.typed_report,
        "attention": planned.attention_info(),
        "trtexec": trtexec_command(plan, tf32_flag=caps.tf32_flag),
    })
    if plan.dla_core is not None:
        fallback = builds["int8"].dla_fallback or []
        info["dla"] = {"core": plan.dla_core, "gpu_fallback": plan.gpu_fallback, "gpu_fallback_layers": fallback,
                       "gpu_fallback_count": len(fallback)}
    return info, extra


def _relaxed_description(plan: BuildPlan) -> list[str]:
    out = []
    if plan.hardware_compatibility == "ampere_plus":
        out.append("GPU model: any Ampere or newer GPU (compute capability >= 8.0) may load it")
    elif plan.hardware_compatibility == "same_compute_capability":
        out.append("GPU model: any GPU of the same compute capability may load it")
    if plan.version_compatible:
        out.append("TensorRT version: the same or a later TensorRT may load it")
    return out
