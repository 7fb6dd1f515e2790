"""The model stage of benchmarks/tensorrt_device.py, run in the interpreter that holds the TensorRT under test.

Never run on a device (see benchmarks/tensorrt_device.py): written where no GPU was available.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]
VIT_B16 = "vit_base_patch16_224"
FRAME = (1280, 720)


@dataclass
class ModelRun:
    model: str
    bundle: str | None = None
    tensorrt: str | None = None
    int8_layers: int | None = None
    layers: int | None = None
    mha: dict[str, int] = field(default_factory=dict)  # fused / not_fused / unknown blocks
    int8_p50_ms: float | None = None
    fp16_p50_ms: float | None = None
    agreement: float | None = None
    frame: dict[str, Any] = field(default_factory=dict)  # the nvinfer-equivalent frame against the runtime
    mismatches: list[str] = field(default_factory=list)
    missing: str | None = None  # what to bring for this model to run


def _sources(name: str, args: Any, work: Path) -> tuple[Path, list[str], Path, Path] | str:
    """(checkpoint, build flags, calib dir, val dir) of ``name``, or what is missing."""
    if name == VIT_B16:
        if not args.imagenet:
            return "ViT-B/16 needs --imagenet DIR with ImageNet-style calib/ and val/ folders"
        ckpt = Path(args.vit_b16) if args.vit_b16 else work / "vit_b16.pth"
        if not ckpt.is_file():
            import timm
            import torch

            torch.save(timm.create_model(VIT_B16, pretrained=True).state_dict(), ckpt)  # timm's download
        return ckpt, ["--arch", VIT_B16], Path(args.imagenet) / "calib", Path(args.imagenet) / "val"
    from corpus import MODELS_PY
    from corpus import cache

    manifest = cache.load_manifest()
    missing = cache.problems(manifest, [name])
    if missing:
        return f"corpus model {name}: {missing[0]} (benchmarks/corpus/fetch.md)"
    model = manifest.model(name)
    split = cache.make_split(manifest.datasets[model.dataset], 300, 1000, 0)
    flags = ["--model-class", f"{MODELS_PY}:{model.model_class}", "--mean", *map(str, model.mean), "--std", *map(str, model.std),
             "--crop-pct", "1.0"] + (["--input-size", str(model.size), str(model.size)] if model.needs_input_size else [])
    return model.path, flags, split / "calib", split / "val"


def default_models() -> list[str]:
    from corpus import cache

    return [VIT_B16] + [m.id for m in cache.load_manifest().models[:2]]


def run_model(name: str, args: Any, work: Path) -> ModelRun:
    row = ModelRun(name)
    src = _sources(name, args, work)
    if isinstance(src, str):
        row.missing = src
        return row
    ckpt, flags, calib, val = src
    target = "jetson" if Path("/etc/nv_tegra_release").is_file() else "nvidia-gpu"
    out = work / f"bundle-{name}"
    cmd = [sys.executable, "-m", "vitedge", "build", str(ckpt), *flags, "--target", target, "--calib", str(calib),
           "--val", str(val), "-o", str(out), "--force"]
    proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    bundle = out / target if (out / target).is_dir() else out
    if not (bundle / "manifest.json").is_file():
        row.mismatches.append(f"vitedge build exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}")
        return row
    row.bundle = str(bundle)
    _engine_facts(row, bundle)
    _fp16_latency(row, bundle)
    _camera_frame(row, bundle, val)
    return row


def _engine_facts(row: ModelRun, bundle: Path) -> None:
    """INT8 layers, MHA fusion and the validation from the manifest, against what the plan promised."""
    from vitedge.bundle.manifest import verify_bundle

    manifest = verify_bundle(bundle)
    promise_check(row, manifest.backend_info or {}, manifest.validation or {})


def promise_check(row: ModelRun, info: dict[str, Any], validation: dict[str, Any]) -> None:
    """Fill ``row`` from a bundle's ``backend_info`` and ``validation`` after ``vitedge build`` on the device, and
    add a mismatch for each promise the bundle broke: no engine built, a block the plan allowed to fuse (Q/DQ
    in all three places of NVIDIA's rule, allowed head size and tokens) that did not fuse, a missed gate."""
    from vitedge.backends.tensorrt.attention import AttentionBlock

    row.tensorrt = (info.get("device") or {}).get("tensorrt")
    if not info.get("engine_built"):
        row.mismatches.append("no engine was built by vitedge build on this device")
        return
    layers = info["build"]["int8"]["engine_layers"]
    precision = layers.get("layer_precision") or {}
    row.layers, row.int8_layers = layers.get("count"), sum(1 for p in precision.values() if p == "int8")
    attention = layers.get("attention") or {}
    row.mha = {k: attention.get(k, 0) for k in ("fused", "not_fused", "unknown")}
    state = {b["scope"]: b.get("mha") for b in attention.get("blocks") or []}
    for block in (AttentionBlock(**b) for b in (info.get("attention") or {}).get("blocks") or []):
        promised = not block.int8_mha_blockers() and block.pv_output_qdq == "direct"
        if promised and state.get(block.scope) != "fused":
            row.mismatches.append(f"{block.scope}: the plan allowed INT8 fused MHA, the engine shows {state.get(block.scope)}")
    row.agreement = ((validation.get("accuracy") or {}).get("agreement"))
    latency = ((validation.get("latency") or {}).get("int8") or {})
    row.int8_p50_ms = next((v.get("p50_ms") for v in latency.values() if isinstance(v, dict)), None) if isinstance(latency, dict) else None
    if validation and not all(r.get("passed") for r in validation.get("gate") or []):
        row.mismatches.append("the INT8 engine missed the bundle's gate on this device")


def _fp16_latency(row: ModelRun, bundle: Path) -> None:
    """Batch-1 latency of an FP16 engine of the FP32 graph (weakly typed; TensorRT 11 has no FP16 flag)."""
    import tensorrt as trt

    from vitedge.backends.tensorrt.runner import TensorRtRunner
    from vitedge.validation.latency import measure_latency

    if not hasattr(trt.BuilderFlag, "FP16"):
        row.frame["fp16"] = f"TensorRT {trt.__version__}: no weakly typed FP16 flag, no FP16 engine built"
        return
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    explicit = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH) if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH") else 0
    network = builder.create_network(explicit)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(bundle / "reference.fp32.onnx")):
        row.mismatches.append("the FP32 graph did not parse for the FP16 engine")
        return
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.FP16)
    shape = tuple(network.get_input(0).shape)[1:]
    profile = builder.create_optimization_profile()
    profile.set_shape(network.get_input(0).name, (1, *shape), (1, *shape), (1, *shape))
    config.add_optimization_profile(profile)
    blob = builder.build_serialized_network(network, config)
    path = bundle.parent / f"{bundle.name}.fp16.engine"
    path.write_bytes(bytes(blob))
    x = np.random.default_rng(0).standard_normal((1, *shape)).astype(np.float32)
    with TensorRtRunner(path) as fp16, TensorRtRunner(bundle / "model.engine") as int8:
        row.fp16_p50_ms = measure_latency(fp16.infer, x).p50_ms
        row.int8_p50_ms = row.int8_p50_ms or measure_latency(int8.infer, x).p50_ms


def _camera_frame(row: ModelRun, bundle: Path, val: Path) -> None:
    """A 1280x720 frame through the nvinfer config's arithmetic and the DeepStream engine, against vitedge.runtime."""
    from helpers import nvinfer_sim
    from PIL import Image

    from vitedge.backends.tensorrt.runner import TensorRtRunner
    from vitedge.camera_apps.deepstream import read_config, source_crop
    from vitedge.runtime import load

    files = sorted(p for p in val.rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if not files:
        row.mismatches.append(f"no image in {val} for the camera frame")
        return
    frame = np.asarray(Image.open(files[0]).convert("RGB").resize(FRAME, Image.Resampling.BILINEAR))
    config = bundle / "camera" / "deepstream" / "config_infer.txt"
    props = read_config(config)
    engine = (config.parent / props["model-engine-file"]).resolve()
    with load(bundle) as model:
        pre = model.preprocessing
        want = model.predict(frame, top_k=2)
    x = nvinfer_sim.network_input(props, nvinfer_sim.src_crop(frame, source_crop(*FRAME, pre.crop_size, pre.crop_pct)))
    with TensorRtRunner(engine) as ds:
        probs = ds.infer(x[None])[0]
    got = int(np.argmax(probs))
    row.frame.update({"engine": str(engine.name), "top1": got, "runtime_top1": want.index,
                      "runtime_margin": float(want.probs[0] - want.probs[1])})
    if got != want.index and want.probs[0] - want.probs[1] > 0.12:
        row.mismatches.append(f"camera frame: the DeepStream engine says class {got}, vitedge.runtime {want.index} "
                              f"(margin {want.probs[0] - want.probs[1]:.2f})")


def stage(args: Any) -> int:
    """Run every model; write the rows as JSON to ``args.stage_out``; 1 on any mismatch or missing input."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = [run_model(name, args, work) for name in (args.models or default_models())]
    for r in rows:
        print(f"{r.model}: TensorRT {r.tensorrt}  INT8 layers {r.int8_layers}/{r.layers}  MHA {r.mha}  "
              f"INT8 {r.int8_p50_ms} ms vs FP16 {r.fp16_p50_ms} ms  agreement {r.agreement}  frame {r.frame}"
              + (f"  MISSING: {r.missing}" if r.missing else "") + "".join(f"\n  MISMATCH: {m}" for m in r.mismatches))
    Path(args.stage_out).write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 1 if any(r.mismatches or r.missing for r in rows) else 0
