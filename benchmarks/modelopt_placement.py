"""Where vitedge's Q/DQ differ from NVIDIA's own ONNX PTQ (ModelOpt), node by node, and what each difference does to accuracy.

NVIDIA's ModelOpt (``pip install 'nvidia-modelopt[onnx]'``, ``modelopt.onnx.quantization.quantize``) quantizes
ONNX graphs for TensorRT and runs its calibration on CPU. Per model (``--models``: the bundled digits ViT,
ViT-B/16, the corpus models of benchmarks/corpus/manifest.toml present in the corpus cache), this script:

1. builds the model for the ``jetson`` family without a GPU (the NVIDIA graph: attention matmuls quantized, the
   small GEMMs float as ModelOpt keeps them: ``float_small_gemms``); its ``reference.fp32.onnx`` is the FP32 graph
   both quantizers start from; and again with ``--quantize-small-gemms`` (unless ``--no-before``), the NVIDIA graph
   as it was before that default, evaluated beside it;
2. quantizes that graph with ModelOpt (INT8, max calibration, CPU, float32 elsewhere) on the same calibration
   images, in ``--modelopt-python`` (an interpreter where ModelOpt is installed; its ONNX pins differ from
   this environment's, so a separate venv is usual);
3. lists, for every GEMM/MatMul (the linears, Q.K^T and P.V), Softmax and residual Add, where each graph has
   Q/DQ: on each input, and on the output (a QuantizeLinear reading it, directly or behind Transpose/Reshape);
4. makes vitedge's graph with each kind of difference switched to ModelOpt's choice (the residual Adds; the
   linears; the attention matmuls and softmax; all of them), taking ModelOpt's own scales for any Q/DQ it adds and the FP32 weights for any it
   removes, and checks that the switched nodes then match ModelOpt's;
5. runs every graph with ONNX Runtime (CPU) on the held-out images: top-1 against the labels, top-1 agreement
   with the FP32 graph, and the SQNR of the logits against FP32.

ONNX Runtime on CPU stands in for TensorRT, which does not run here: these are accuracy figures only. What a
placement is for on a GPU (an INT8 residual Add fused with the GEMM before it, a float head) is speed, which
only ``benchmarks/tensorrt_device.py`` on a device can measure.

ViT-B/16 is timm's ``vit_base_patch16_224`` with seeded random weights unless ``--vit-b16 FILE`` gives a state_dict:
placement does not depend on the weights, and its accuracy rows then say only how far each INT8 graph moves from
its own FP32 (no top-1: its labels are not ImageNet's). Its images are the corpus CIFAR-10 split resized by timm's
preprocessing, or ``--vit-b16-images DIR`` (calib/ and val/). It is built with ``--no-fallback`` (the accuracy budget
would otherwise chase a gate that random weights cannot mean anything for).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks")]
OUT = ROOT / "benchmarks" / "results" / "modelopt_placement.md"
SHAPE_OPS = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze")
ROLES = ("linear", "qk_matmul", "pv_matmul", "softmax", "residual_add")
VIT_B16 = "vit_b16"
MODELOPT = """
import sys, numpy as np
from modelopt.onnx.quantization import quantize
quantize(sys.argv[1], quantize_mode="int8", calibration_data=np.load(sys.argv[2]), calibration_method="max",
         calibration_eps=["cpu"], high_precision_dtype="fp32", output_path=sys.argv[3], log_level="WARNING")
import modelopt; print(modelopt.__version__)
"""
# what each variant switches to ModelOpt's choice: the nodes of these roles where the two graphs differ
BEFORE = "vitedge, small GEMMs INT8 (--quantize-small-gemms)"
MODELOPT_IN_FLOAT = "modelopt, Q/DQ computed in float"
VARIANTS = {"vitedge, residual Adds as ModelOpt": ("residual_add",), "vitedge, linears as ModelOpt": ("linear",),
            "vitedge, attention as ModelOpt": ("qk_matmul", "pv_matmul", "softmax"),
            "vitedge, every difference as ModelOpt": ROLES}


@dataclass
class Source:
    """What to build one model from."""

    name: str
    checkpoint: Path
    flags: list[str]
    calib: Path
    val: Path
    labelled: bool = True  # top-1 against the folder labels means something
    note: str = ""


@dataclass
class ModelResult:
    model: str
    note: str = ""
    rows: list[dict[str, str]] = field(default_factory=list)
    accuracy: dict[str, dict[str, float | None]] = field(default_factory=dict)
    switched: dict[str, dict[str, object]] = field(default_factory=dict)  # variant -> nodes switched, still differing
    error: str | None = None
    small_gemms: list[str] = field(default_factory=list)  # float in vitedge's jetson graph, INT8 with --quantize-small-gemms


# ---------------------------------------------------------------------------------------- placement


def _const_names(graph) -> set[str]:
    """Initializers, Constant outputs, and Identity/Cast of those (the exporter shares equal biases through Identity)."""
    out = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    for n in graph.node:  # graph order: a constant's Identity comes after it
        if n.op_type in ("Identity", "Cast") and n.input and n.input[0] in out:
            out.update(n.output)
    return out


def roles(graph) -> dict[str, str]:
    """Node name -> role: linear / qk_matmul / pv_matmul / softmax / residual_add, in an FP32 graph."""
    from vitedge.onnxkit.structure import node_index

    index = node_index(list(graph.node))
    consts = _const_names(graph)
    out: dict[str, str] = {}
    for n in graph.node:
        if n.op_type == "Softmax":
            out[n.name] = "softmax"
            p = index.producer.get(n.input[0])
            while p is not None and p.op_type in ("Mul", "Div", "Add") and p.op_type != "MatMul":  # scale, mask
                p = next((index.producer.get(i) for i in p.input if i not in consts and i in index.producer), None)
            if p is not None and p.op_type == "MatMul":
                out[p.name] = "qk_matmul"
            for r in index.readers(n.output[0]):
                if r.op_type == "MatMul":
                    out[r.name] = "pv_matmul"
    for n in graph.node:
        if n.name in out:
            continue
        if n.op_type in ("Gemm", "MatMul") and len(n.input) > 1 and n.input[1] in consts:
            out[n.name] = "linear"
        elif n.op_type == "Add" and len(n.input) == 2 and not any(i in consts for i in n.input):
            out[n.name] = "residual_add"
    return out


def _dq_feeding(index, tensor: str):
    p = index.producer.get(tensor)
    return p if p is not None and p.op_type == "DequantizeLinear" else None


def placement(graph) -> dict[str, tuple[str, str]]:
    """Node name -> (inputs with Q/DQ, output Q/DQ), for every named node of ``graph``."""
    from vitedge.onnxkit.structure import node_index

    index = node_index(list(graph.node))

    def out_q(t: str, hops: int = 0) -> str:
        readers = index.readers(t)
        if any(r.op_type == "QuantizeLinear" for r in readers):
            return "direct" if hops == 0 else "after shape ops"
        shape = [r for r in readers if r.op_type in SHAPE_OPS]
        return out_q(shape[0].output[0], hops + 1) if shape and hops < 4 else "no"

    return {n.name: ("".join("Q" if _dq_feeding(index, i) else "-" for i in n.input[:2]), out_q(n.output[0]))
            for n in graph.node if n.name}


def compare(fp32, ours, theirs) -> list[dict[str, str]]:
    """One row per FP32 node of a role: each graph's placement there."""
    a, b = placement(ours.graph), placement(theirs.graph)
    rows = []
    for name, role in roles(fp32.graph).items():
        va, vb = a.get(name, ("?", "?")), b.get(name, ("?", "?"))
        same = "yes" if va == vb else "rewritten" if "?" in (va[0], vb[0]) else "no"
        rows.append({"node": name, "role": role, "vitedge_in": va[0], "modelopt_in": vb[0], "vitedge_out": va[1],
                     "modelopt_out": vb[1], "same": same})
    return rows


# ---------------------------------------------------------------------------------------- switching


def switch_to_theirs(fp32, ours, theirs, names: set[str]):
    """A copy of ``ours`` whose nodes ``names`` take ``theirs``' Q/DQ choice on every input; where an output's
    Q/DQ differs, the readers of that output in the graph that has it switch too. Added Q/DQ carry ``theirs``'
    scales; a removed weight Q/DQ gives back the FP32 graph's weight. Returns (model, names switched)."""
    import copy

    import onnx
    from onnx import helper, numpy_helper

    from vitedge.onnxkit.structure import node_index, topological_sort

    m = copy.deepcopy(ours)
    oi, ti = node_index(list(m.graph.node)), node_index(list(theirs.graph.node))
    by_ours = {n.name: n for n in m.graph.node if n.name}
    by_theirs = {n.name: n for n in theirs.graph.node if n.name}
    by_fp32 = {n.name: n for n in fp32.graph.node if n.name}
    t_init = {t.name: t for t in theirs.graph.initializer}
    f_init = {t.name: t for t in fp32.graph.initializer}

    todo = set(names)
    for name in names:  # readers of an output quantized in only one of the graphs
        for graph_index, node in ((oi, by_ours.get(name)), (ti, by_theirs.get(name))):
            if node is None:
                continue
            for q in (r for r in graph_index.readers(node.output[0]) if r.op_type == "QuantizeLinear"):
                for dq in (r for r in graph_index.readers(q.output[0]) if r.op_type == "DequantizeLinear"):
                    todo.update(r.name for r in graph_index.readers(dq.output[0]) if r.name in by_ours and r.name in by_theirs)
    added: list = []
    for name in sorted(todo):
        a, b, f = by_ours.get(name), by_theirs.get(name), by_fp32.get(name)
        if a is None or b is None:
            continue
        for i in range(min(len(a.input), len(b.input))):
            qa, qb = _dq_feeding(oi, a.input[i]), _dq_feeding(ti, b.input[i])
            if qa is not None and qb is None:
                q = oi.producer.get(qa.input[0])
                if q is not None and q.op_type == "QuantizeLinear":
                    a.input[i] = q.input[0]
                elif f is not None and i < len(f.input) and f.input[i] in f_init:
                    w = float_weight(a, i, numpy_helper.to_array(f_init[f.input[i]]), qa, {t.name: t for t in m.graph.initializer})
                    t = numpy_helper.from_array(w, f"{name}/modelopt_float_weight{i}")
                    m.graph.initializer.append(t)
                    a.input[i] = t.name
                    if a.op_type == "Gemm" and len(a.input) > 2 and len(f.input) > 2 and f.input[2] in f_init \
                            and a.input[2] != f.input[2]:  # vitedge's bias correction is for its INT8 weight
                        m.graph.initializer.append(copy.deepcopy(f_init[f.input[2]]))
                        a.input[2] = f.input[2]
                else:
                    raise ValueError(f"{name}: input {i} has no float source to go back to")
            elif qb is not None and qa is None:
                tag = f"{name}/modelopt_in{i}"
                extra = []
                for k, src in enumerate(qb.input[1:3], start=1):
                    arr = numpy_helper.to_array(t_init[src]) if src in t_init else None
                    if arr is None:
                        raise ValueError(f"{name}: ModelOpt's Q/DQ parameter {src} is not an initializer")
                    t = numpy_helper.from_array(arr, f"{tag}/{'scale' if k == 1 else 'zero_point'}")
                    m.graph.initializer.append(t)
                    extra.append(t.name)
                axis = [x for x in qb.attribute if x.name == "axis"]
                kw = {"axis": onnx.helper.get_attribute_value(axis[0])} if axis else {}
                added.append(helper.make_node("QuantizeLinear", [a.input[i], *extra], [f"{tag}/q"], name=f"{tag}/Q", **kw))
                added.append(helper.make_node("DequantizeLinear", [f"{tag}/q", *extra], [f"{tag}/dq"], name=f"{tag}/DQ", **kw))
                a.input[i] = f"{tag}/dq"
    nodes = topological_sort(added + list(m.graph.node))
    outputs = {o.name for o in m.graph.output}
    while True:  # drop the Q/DQ pairs nothing reads any more (a removed input's)
        read = {i for n in nodes for i in n.input} | outputs
        dead = [n for n in nodes if n.op_type in ("QuantizeLinear", "DequantizeLinear") and not any(o in read for o in n.output)]
        if not dead:
            break
        nodes = [n for n in nodes if n not in dead]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m, todo


def float_weight(node, i: int, w: np.ndarray, dq, inits: dict) -> np.ndarray:
    """The float weight that vitedge's INT8 weight of ``node`` input ``i`` stands for: the FP32 weight ``w`` times
    the SmoothQuant factor vitedge folded into it (one per input channel, estimated from the INT8 weight by least
    squares: exact to a fraction of an INT8 step, not to float precision), checked to
    lie within one INT8 step of vitedge's INT8 weight (its
    pairwise weight range moves some weights past nearest rounding); ``w`` itself where nothing was folded."""
    from onnx import helper, numpy_helper

    q = numpy_helper.to_array(inits[dq.input[0]]).astype(np.float64)
    scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
    axis = next((helper.get_attribute_value(x) for x in dq.attribute if x.name == "axis"), 1)
    shape = [1] * q.ndim
    if scale.ndim == 1 and q.ndim == 2:
        shape[axis] = -1
    deq = q * scale.reshape(shape)
    trans_b = next((helper.get_attribute_value(x) for x in node.attribute if x.name == "transB"), 0)
    k_axis = 1 if node.op_type == "Gemm" and trans_b else 0  # the input-channel axis the factor runs along
    other = 1 - k_axis
    s = (deq * w).sum(axis=other, keepdims=True) / np.maximum((w.astype(np.float64) ** 2).sum(axis=other, keepdims=True), 1e-30)
    for candidate in (np.ones_like(s), s):
        folded = w * candidate
        if np.all(np.abs(deq - folded) <= np.broadcast_to(scale.reshape(shape), deq.shape) * 1.001 + 1e-7):
            return folded.astype(np.float32)
    raise ValueError(f"{node.name}: no FP32 weight (with or without a per-input-channel factor) lies within one step of vitedge's INT8 weight")


# ---------------------------------------------------------------------------------------- accuracy


def images(folder: Path, bundle: Path) -> tuple[np.ndarray, np.ndarray]:
    from vitedge.datasources.sources import open_source
    from vitedge.bundle.manifest import read_manifest
    from vitedge.bundle.spec import Preprocess

    manifest = read_manifest(bundle)
    src = open_source(folder, Preprocess.from_dict(manifest.input.preprocess), class_names=manifest.output.class_names)
    xs, ys = [], []
    for batch in src.batches(32):
        xs.append(batch.images)
        ys.append(batch.labels if batch.labels is not None else np.full(len(batch.images), -1))
    return np.concatenate(xs), np.concatenate(ys)


def logits(path: Path, x: np.ndarray, in_float: bool = False) -> np.ndarray:
    """The graph's outputs on ``x``; ``in_float``: graph optimizations off, so ONNX Runtime computes each
    QuantizeLinear/DequantizeLinear as written and every MatMul in float, with no INT8 kernel of this CPU."""
    from vitedge.onnxkit.session import SessionSettings, ort_session

    s = ort_session(str(path), SessionSettings(optimization="disabled") if in_float else None)
    name = s.get_inputs()[0].name
    return np.concatenate([s.run(None, {name: x[i:i + 32]})[0] for i in range(0, len(x), 32)])


def accuracy(outs: dict[str, np.ndarray], y: np.ndarray, labelled: bool) -> dict[str, dict[str, float | None]]:
    ref = outs["fp32"]
    res = {}
    for k, o in outs.items():
        noise = float(np.sum((o - ref) ** 2))
        sqnr = float("inf") if noise == 0 else float(10 * np.log10(np.sum(ref ** 2) / noise))
        res[k] = {"top1": float((o.argmax(1) == y).mean() * 100) if labelled else None,
                  "agreement": float((o.argmax(1) == ref.argmax(1)).mean() * 100), "sqnr_db": sqnr}
    return res


# ---------------------------------------------------------------------------------------- models


def sources(names: list[str], args: argparse.Namespace, work: Path) -> list[Source | str]:
    """One Source per model name, or a line saying why it cannot run here."""
    from corpus import MODELS_PY, cache

    manifest = cache.load_manifest()
    found = cache.find_cache(manifest) or (Path(os.environ[cache.ENV]) if os.environ.get(cache.ENV) else None)
    if found is not None:  # a partial cache too: the models and data present in it run
        cache.use_cache(found)
    out: list[Source | str] = []
    expanded = []
    for n in names:
        expanded += [m.id for m in manifest.models if not cache.problems(manifest, [m.id])] if n == "corpus" else [n]
    for name in expanded:
        if name == "digits":
            out.append(Source(name, ROOT / "examples" / "digits_vit.pt", [], ROOT / "calibration" / "digits" / "calib",
                              ROOT / "calibration" / "digits" / "val", note="the bundled example (6 blocks), trained by vitedge"))
        elif name == VIT_B16:
            ckpt, note = args.vit_b16, "timm vit_base_patch16_224, weights from --vit-b16"
            if ckpt is None:
                import timm
                import torch

                ckpt, note = work / "vit_b16_random.pth", "timm vit_base_patch16_224 with seeded random weights (placement only)"
                torch.manual_seed(0)
                torch.save(timm.create_model("vit_base_patch16_224", pretrained=False).state_dict(), ckpt)
            if args.vit_b16_images:
                folder = args.vit_b16_images
            elif any(m.dataset == "cifar10-test-jpeg" and not cache.problems(manifest, [m.id]) for m in manifest.models):
                folder = cache.make_split(manifest.datasets["cifar10-test-jpeg"], args.vit_b16_calib, args.vit_b16_val, 0)
                note += f"; CIFAR-10 test images ({args.vit_b16_calib} calib, {args.vit_b16_val} held out) resized to 224"
            else:
                out.append(f"{name}: needs --vit-b16-images DIR or the corpus cache (benchmarks/corpus/fetch.md)")
                continue
            out.append(Source(name, ckpt, ["--arch", "vit_base_patch16_224", "--no-fallback"], folder / "calib", folder / "val",
                              labelled=args.vit_b16 is not None and args.vit_b16_images is not None, note=note))
        else:
            try:
                model = manifest.model(name)
            except Exception:
                out.append(f"{name}: not a model of benchmarks/corpus/manifest.toml")
                continue
            missing = cache.problems(manifest, [name])
            if missing:
                out.append(f"{name}: {missing[0]}")
                continue
            split = cache.make_split(manifest.datasets[model.dataset], args.calib_size, args.val_size, 0)
            flags = ["--model-class", f"{MODELS_PY}:{model.model_class}", "--mean", *map(str, model.mean), "--std",
                     *map(str, model.std), "--crop-pct", "1.0"]
            flags += ["--input-size", str(model.size), str(model.size)] if model.needs_input_size else []
            out.append(Source(name, model.path, flags, split / "calib", split / "val",
                              note=f"corpus, {model.dataset} ({args.calib_size} calib, {args.val_size} held out)"))
    return out


def build(src: Source, work: Path, reuse: bool = False, extra: tuple[str, ...] = (), tag: str = "") -> Path:
    out = work / f"bundle-{src.name}{tag}"
    for folder in (out / "jetson", out):
        if reuse and (folder / "model.int8.onnx").is_file():
            return folder
    cmd = [sys.executable, "-m", "vitedge", "build", str(src.checkpoint), *src.flags, *extra, "--target", "jetson",
           "--calib", str(src.calib), "--val", str(src.val), "-o", str(out), "--no-latency", "--force"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    bundle = out / "jetson" if (out / "jetson").is_dir() else out
    if not (bundle / "model.int8.onnx").is_file():
        raise RuntimeError(f"vitedge build exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-400:]}")
    return bundle


def run_model(src: Source, args: argparse.Namespace, work: Path) -> tuple[ModelResult, str]:
    import onnx

    res = ModelResult(src.name, src.note)
    bundle = build(src, work, args.reuse_bundles)
    calib, _ = images(src.calib, bundle)
    np.save(work / f"{src.name}.calib.npy", calib[: args.modelopt_calib])
    theirs_path = work / f"{src.name}.modelopt.int8.onnx"
    version_file = theirs_path.with_suffix(".version")
    if not (args.reuse_bundles and theirs_path.is_file() and version_file.is_file()):
        proc = subprocess.run([args.modelopt_python, "-c", MODELOPT, str(bundle / "reference.fp32.onnx"),
                               str(work / f"{src.name}.calib.npy"), str(theirs_path)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"ModelOpt failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}")
        version_file.write_text(proc.stdout.strip().splitlines()[-1])
    fp32, ours, theirs = (onnx.load(str(p)) for p in (bundle / "reference.fp32.onnx", bundle / "model.int8.onnx", theirs_path))
    res.rows = compare(fp32, ours, theirs)
    paths = {"fp32": bundle / "reference.fp32.onnx", "vitedge": bundle / "model.int8.onnx", "modelopt": theirs_path}
    if not args.no_before:  # the jetson graph as it was before float_small_gemms: the measured reason for that default
        before = build(src, work, args.reuse_bundles, ("--quantize-small-gemms",), "-small-gemms-int8")
        paths[BEFORE] = before / "model.int8.onnx"
        res.small_gemms = _int8_layers(before, bundle)
    for label, kinds in VARIANTS.items():
        names = {r["node"] for r in res.rows if r["same"] == "no" and r["role"] in kinds}
        if not names:
            continue
        model, done = switch_to_theirs(fp32, ours, theirs, names)
        path = work / f"{src.name}.{label.split(', ')[1].replace(' ', '_')}.int8.onnx"  # one file per variant
        onnx.save(model, str(path))
        still = [r["node"] for r in compare(fp32, model, theirs) if r["node"] in names and r["same"] == "no"]
        res.switched[label] = {"nodes": len(names), "also_switched_readers": len(done - names), "still_differ": still}
        paths[label] = path
    x, y = images(src.val, bundle)
    if args.eval_limit and len(x) > args.eval_limit:  # a seeded subset, every class folder represented alike
        keep = np.sort(np.random.default_rng(0).permutation(len(x))[: args.eval_limit])
        x, y = x[keep], y[keep]
        res.note += f"; accuracy on a seeded {args.eval_limit} of the held-out images"
    outs = {k: logits(p, x) for k, p in paths.items()}
    outs[MODELOPT_IN_FLOAT] = logits(theirs_path, x, in_float=True)
    res.accuracy = accuracy(outs, y, src.labelled)
    return res, version_file.read_text().strip()


def _int8_layers(before: Path, bundle: Path) -> list[str]:
    """The layers INT8 in ``before``'s graph and float in ``bundle``'s (the manifests' kept_float)."""
    def kept(folder: Path) -> set[str]:
        return set(json.loads((folder / "manifest.json").read_text())["quantization"]["kept_float"])

    return sorted(kept(bundle) - kept(before))


# ---------------------------------------------------------------------------------------- report


def _fmt(v: float | None, unit: str = "") -> str:
    return "n/a" if v is None else ("inf" if v == float("inf") else f"{v:.2f}{unit}")


def normalize(res: ModelResult) -> ModelResult:
    """Rows of nodes one graph does not have under their FP32 name are ``rewritten`` (vitedge merges per-head
    q/k/v linears into one, for one), not placement differences; a variant's ``still_differ`` leaves them out."""
    for x in res.rows:
        if x["same"] == "no" and "?" in (x["vitedge_in"], x["modelopt_in"]):
            x["same"] = "rewritten"
    rewritten = {x["node"] for x in res.rows if x["same"] == "rewritten"}
    for s in res.switched.values():
        s["still_differ"] = [n for n in s["still_differ"] if n not in rewritten]
    return res


def markdown(results: list[ModelResult], skipped: list[str], versions: dict[str, str]) -> str:
    lines = [f"# vitedge's Q/DQ against ModelOpt's, node by node ({versions['date']})", "",
             f"ModelOpt {versions['modelopt']} (INT8, max calibration, CPU), ONNX Runtime {versions['onnxruntime']} (CPU) "
             f"standing in for TensorRT, {versions['cpu']}, a shared loaded machine: accuracy only, no timing. vitedge "
             "builds each model for the `jetson` family (the NVIDIA graph) without a GPU. Made by "
             "`python benchmarks/modelopt_placement.py --modelopt-python VENV/bin/python`.", "",
             "Inputs: one character per input (first two), `Q` = fed by DequantizeLinear, `-` = float. Output: a "
             "QuantizeLinear reading it, directly or behind Transpose/Reshape. A switched variant is vitedge's graph with "
             "the differing nodes of that kind given ModelOpt's Q/DQ (ModelOpt's scales; FP32 weights, times vitedge's "
             "SmoothQuant factor as estimated from its INT8 weight, and the FP32 bias where a weight Q/DQ goes), and the readers of an output only one "
             "graph quantizes switched along (after a residual Add: the next LayerNorm). \"rewritten\": FP32 nodes "
             "vitedge's graph does not have under their name (it merges per-head q/k/v linears into one), not counted. "
             f"\"{BEFORE}\": the same build with the small GEMMs INT8, as the NVIDIA profiles built them before "
             "`float_small_gemms` (the layers it quantizes besides are listed under Models). "
             f"\"{MODELOPT_IN_FLOAT}\": ModelOpt's graph with ONNX Runtime's graph optimizations off, so that each Q/DQ is "
             "computed as written and every MatMul in float, with no INT8 kernel of this CPU: on a CPU without VNNI, ONNX "
             "Runtime's INT8 kernels saturate on weights that use the full INT8 range (ModelOpt's; vitedge limits its own, "
             "`weight_range`), which a GPU does not do.",
             "", "## Differences per model (differ of compared)", "",
             "| model | " + " | ".join(ROLES) + " |", "|---|" + "---|" * len(ROLES)]
    for r in results:
        cells = []
        for role in ROLES:
            of = [x for x in r.rows if x["role"] == role]
            moved = sum(x["same"] == "rewritten" for x in of)
            cells.append(f"{sum(x['same'] == 'no' for x in of)} of {len(of) - moved}" + (f" (+{moved} rewritten)" if moved else ""))
        lines.append(f"| {r.model} | " + " | ".join(cells) + " |")
    lines += ["", "## Accuracy on the held-out images", "",
              "| model | graph | top-1 % | agreement with FP32 % | logit SQNR dB |", "|---|---|---|---|---|"]
    for r in results:
        for k, v in r.accuracy.items():
            lines.append(f"| {r.model} | {k} | {_fmt(v['top1'])} | {_fmt(v['agreement'])} | {_fmt(v['sqnr_db'])} |")
    lines += ["", "## Models", ""] + [f"- {r.model}: {r.note}" + (f"; switched: " + "; ".join(
        f"{k.split(', ')[1]}: {s['nodes']} nodes (+{s['also_switched_readers']} readers), {len(s['still_differ'])} still differ"
        for k, s in r.switched.items()) if r.switched else "") for r in results]
    lines += [f"- {r.model}: small GEMMs float in vitedge's graph ({len(r.small_gemms)}): "
              + ", ".join(f"`{n}`" for n in r.small_gemms) for r in results if r.small_gemms]
    lines += [f"- not run: {s}" for s in skipped]
    for r in results:
        diff = [x for x in r.rows if x["same"] == "no"]
        lines += ["", f"## {r.model}: every differing node", "",
                  "| node | role | vitedge in | ModelOpt in | vitedge out | ModelOpt out |", "|---|---|---|---|---|---|"]
        lines += [f"| `{x['node']}` | {x['role']} | {x['vitedge_in']} | {x['modelopt_in']} | {x['vitedge_out']} | {x['modelopt_out']} |"
                  for x in diff] or ["| (none) | | | | | |"]
        moved = [x["node"] for x in r.rows if x["same"] == "rewritten"]
        if moved:
            lines += ["", f"Rewritten ({len(moved)}): " + ", ".join(f"`{n}`" for n in moved[:6]) + (", ..." if len(moved) > 6 else "")]
    return "\n".join(lines) + "\n"


def cpu_isa() -> str:
    info = Path("/proc/cpuinfo")
    flags = info.read_text().split("flags")[1].split("\n")[0] if info.is_file() else ""
    return "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX2" if "avx2" in flags else platform.machine()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["digits", VIT_B16, "corpus"],
                    help="digits, vit_b16, corpus model ids, or 'corpus' for every corpus model present (default: all three)")
    ap.add_argument("--modelopt-python", default=sys.executable, help="an interpreter with nvidia-modelopt[onnx]")
    ap.add_argument("--vit-b16", type=Path, help="a timm vit_base_patch16_224 state_dict (default: seeded random weights)")
    ap.add_argument("--vit-b16-images", type=Path, help="folder with calib/ and val/ for ViT-B/16 (default: corpus CIFAR-10)")
    ap.add_argument("--vit-b16-calib", type=int, default=64, help="ViT-B/16 calibration images from the corpus (default 64)")
    ap.add_argument("--vit-b16-val", type=int, default=200, help="ViT-B/16 held-out images from the corpus (default 200)")
    ap.add_argument("--calib-size", type=int, default=200, help="corpus calibration images per model (default 200)")
    ap.add_argument("--val-size", type=int, default=500, help="corpus held-out images per model (default 500)")
    ap.add_argument("--modelopt-calib", type=int, default=200, help="most calibration images handed to ModelOpt (default 200)")
    ap.add_argument("--work", type=Path, help="keep the bundles and graphs here (default: a temporary folder)")
    ap.add_argument("--reuse-bundles", action="store_true",
                    help="use the bundles and ModelOpt graphs already in --work instead of making them again")
    ap.add_argument("--eval-limit", type=int, default=0, help="evaluate on a seeded subset of this many held-out images")
    ap.add_argument("--report-only", action="store_true",
                    help="write the report from the per-model results already in --work (for runs split across processes)")
    ap.add_argument("--no-before", action="store_true",
                    help="skip the second build with --quantize-small-gemms (the jetson graph before float_small_gemms)")
    ap.add_argument("--out", type=Path, default=OUT)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import onnxruntime

    with tempfile.TemporaryDirectory(prefix="vitedge-modelopt-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results, skipped, modelopt = [], [], "?"
        for src in sources(args.models, args, work):
            saved = work / f"{src.name if isinstance(src, Source) else '-'}.result.json"
            if isinstance(src, str) or (args.report_only and not saved.is_file()):
                skipped.append(src if isinstance(src, str) else f"{src.name}: no result in --work")
                print(f"skipped {skipped[-1]}", file=sys.stderr)
                continue
            if args.report_only:
                data = json.loads(saved.read_text())
                modelopt = data.pop("modelopt")
                results.append(normalize(ModelResult(**data)))
                continue
            print(f"{src.name} ...", file=sys.stderr, flush=True)
            try:
                res, modelopt = run_model(src, args, work)
            except (RuntimeError, ValueError) as err:
                skipped.append(f"{src.name}: {err}")
                print(f"failed {src.name}: {err}", file=sys.stderr)
                continue
            saved.write_text(json.dumps({**asdict(res), "modelopt": modelopt}, indent=1) + "\n")
            results.append(normalize(res))
        if not results:
            print("error: no model ran; " + "; ".join(skipped), file=sys.stderr)
            return 1
        versions = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"), "modelopt": modelopt,
                    "onnxruntime": onnxruntime.__version__, "cpu": cpu_isa()}
        text = markdown(results, skipped, versions)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps({"versions": versions, "skipped": skipped,
                                                             "models": [asdict(r) for r in results]}, indent=1) + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
