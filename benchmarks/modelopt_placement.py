"""Where vitedge's Q/DQ differ from NVIDIA's own ONNX PTQ (ModelOpt), node by node, on one ViT.

NVIDIA's ModelOpt (``pip install 'nvidia-modelopt[onnx]'``, ``modelopt.onnx.quantization.quantize``) quantizes
ONNX graphs for TensorRT and runs its calibration on CPU. This script:

1. builds the bundled digits ViT for the ``jetson`` family without a GPU (the NVIDIA graph: attention matmuls
   quantized), or takes ``--bundle``; its ``reference.fp32.onnx`` is the FP32 graph both quantizers start from;
2. quantizes that graph with ModelOpt (INT8, max calibration, CPU, float32 elsewhere) on the same calibration
   images, in ``--modelopt-python`` (an interpreter where ModelOpt is installed; its ONNX pins may differ from
   this environment's, so a separate venv is usual);
3. lists, for every GEMM/MatMul (the linears, Q.K^T and P.V), Softmax and residual Add, where each graph has
   Q/DQ: on each input, and on the output (a QuantizeLinear reading it, directly or behind Transpose/Reshape);
4. runs both graphs and the FP32 one with ONNX Runtime (CPU) on the held-out digits: top-1 and agreement with FP32.

Writes benchmarks/results/modelopt_placement.md. Accuracy is of this small model on 397 digits only; ONNX
Runtime on CPU stands in for TensorRT, which does not run here.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "modelopt_placement.md"
SHAPE_OPS = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze")
MODELOPT = """
import sys, numpy as np
from modelopt.onnx.quantization import quantize
quantize(sys.argv[1], quantize_mode="int8", calibration_data=np.load(sys.argv[2]), calibration_method="max",
         calibration_eps=["cpu"], high_precision_dtype="fp32", output_path=sys.argv[3], log_level="WARNING")
import modelopt; print(modelopt.__version__)
"""


def _images(folder: Path, bundle: Path) -> tuple[np.ndarray, np.ndarray]:
    from vitedge.datasources.sources import open_source
    from vitedge.manifest import read_manifest
    from vitedge.spec import Preprocess

    manifest = read_manifest(bundle)
    src = open_source(folder, Preprocess.from_dict(manifest.input.preprocess), class_names=manifest.output.class_names)
    xs, ys = [], []
    for batch in src.batches(64):
        xs.append(batch.images)
        ys.append(batch.labels if batch.labels is not None else np.full(len(batch.images), -1))
    return np.concatenate(xs), np.concatenate(ys)


def _roles(graph) -> dict[str, str]:
    """Node name -> role: linear / qk_matmul / pv_matmul / softmax / residual_add."""
    from vitedge.onnxutil import node_index

    index = node_index(list(graph.node))
    inits = {t.name for t in graph.initializer}
    roles = {}
    for n in graph.node:
        if n.op_type == "Softmax":
            roles[n.name] = "softmax"
            p = index.producer.get(n.input[0])
            if p is not None and p.op_type == "MatMul":
                roles[p.name] = "qk_matmul"
            for r in index.readers(n.output[0]):
                if r.op_type == "MatMul":
                    roles[r.name] = "pv_matmul"
        elif n.op_type in ("Gemm", "MatMul") and n.name not in roles and any(i in inits for i in n.input[1:2]):
            roles[n.name] = "linear"
        elif n.op_type == "Add" and not any(i in inits for i in n.input) and len(n.input) == 2:
            roles[n.name] = "residual_add"
    return roles


def _placement(graph) -> dict[str, tuple[str, str]]:
    """Node name -> (inputs with Q/DQ, output Q/DQ) in this graph, for the nodes of the FP32 graph."""
    from vitedge.onnxutil import node_index

    index = node_index(list(graph.node))

    def from_dq(t: str) -> bool:
        p = index.producer.get(t)
        return p is not None and p.op_type == "DequantizeLinear"

    def out_q(t: str, hops: int = 0) -> str:
        readers = index.readers(t)
        if any(r.op_type == "QuantizeLinear" for r in readers):
            return "direct" if hops == 0 else "after shape ops"
        shape = [r for r in readers if r.op_type in SHAPE_OPS]
        return out_q(shape[0].output[0], hops + 1) if shape and hops < 4 else "no"

    return {n.name: ("".join("Q" if from_dq(i) else "-" for i in n.input[:2]), out_q(n.output[0])) for n in graph.node if n.name}


def compare(fp32: Path, ours: Path, theirs: Path) -> list[dict[str, str]]:
    import onnx

    roles = _roles(onnx.load(str(fp32)).graph)
    a, b = _placement(onnx.load(str(ours)).graph), _placement(onnx.load(str(theirs)).graph)
    rows = []
    for name, role in roles.items():
        va, vb = a.get(name, ("?", "?")), b.get(name, ("?", "?"))
        rows.append({"node": name, "role": role, "vitedge_in": va[0], "modelopt_in": vb[0], "vitedge_out": va[1],
                     "modelopt_out": vb[1], "same": "yes" if va == vb else "no"})
    return rows


def accuracy(paths: dict[str, Path], x: np.ndarray, y: np.ndarray) -> dict[str, dict[str, float]]:
    from vitedge.onnxutil import ort_session

    preds = {}
    for key, path in paths.items():
        s = ort_session(str(path))
        name = s.get_inputs()[0].name
        preds[key] = np.concatenate([s.run(None, {name: x[i:i + 64]})[0].argmax(1) for i in range(0, len(x), 64)])
    return {k: {"top1": float((p == y).mean() * 100), "agreement": float((p == preds["fp32"]).mean() * 100)} for k, p in preds.items()}


def _bundle(work: Path) -> Path:
    out = work / "digits"
    cmd = [sys.executable, "-m", "vitedge", "build", str(ROOT / "examples" / "digits_vit.pt"), "--target", "jetson",
           "--calib", str(ROOT / "calibration" / "digits" / "calib"), "--val", str(ROOT / "calibration" / "digits" / "val"),
           "-o", str(out), "--no-latency", "--force"]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    return out / "jetson" if (out / "jetson").is_dir() else out


def markdown(rows: list[dict[str, str]], acc: dict, versions: dict[str, str]) -> str:
    diff = [r for r in rows if r["same"] == "no"]
    lines = [f"# vitedge's Q/DQ against ModelOpt's, node by node ({versions['date']})", "",
             f"ModelOpt {versions['modelopt']}, ONNX Runtime {versions['onnxruntime']} (CPU), {versions['cpu']}; the bundled "
             "digits ViT (6 blocks); a loaded shared machine (accuracy only, no timing).", "",
             "Inputs: one character per input (first two), `Q` = fed by DequantizeLinear, `-` = float. Output: a "
             "QuantizeLinear reading it, directly or behind Transpose/Reshape.", "",
             "| role | nodes | differ |", "|---|---|---|"]
    for role in ("linear", "qk_matmul", "pv_matmul", "softmax", "residual_add"):
        of = [r for r in rows if r["role"] == role]
        lines.append(f"| {role} | {len(of)} | {sum(r['same'] == 'no' for r in of)} |")
    lines += ["", "| node | role | vitedge in | ModelOpt in | vitedge out | ModelOpt out |", "|---|---|---|---|---|---|"]
    lines += [f"| `{r['node']}` | {r['role']} | {r['vitedge_in']} | {r['modelopt_in']} | {r['vitedge_out']} | {r['modelopt_out']} |"
              for r in diff] or ["| (none) | | | | | |"]
    lines += ["", "| graph | top-1 % | agreement with FP32 % |", "|---|---|---|"]
    lines += [f"| {k} | {v['top1']:.2f} | {v['agreement']:.2f} |" for k, v in acc.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, help="a jetson bundle of the digits ViT (default: built here)")
    ap.add_argument("--modelopt-python", default=sys.executable, help="an interpreter with nvidia-modelopt[onnx]")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vitedge-modelopt-") as tmp:
        work = Path(tmp)
        bundle = args.bundle or _bundle(work)
        calib, _ = _images(ROOT / "calibration" / "digits" / "calib", bundle)
        np.save(work / "calib.npy", calib)
        theirs = work / "modelopt.int8.onnx"
        proc = subprocess.run([args.modelopt_python, "-c", MODELOPT, str(bundle / "reference.fp32.onnx"), str(work / "calib.npy"),
                               str(theirs)], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"ModelOpt failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}", file=sys.stderr)
            return 1
        rows = compare(bundle / "reference.fp32.onnx", bundle / "model.int8.onnx", theirs)
        x, y = _images(ROOT / "calibration" / "digits" / "val", bundle)
        acc = accuracy({"fp32": bundle / "reference.fp32.onnx", "vitedge": bundle / "model.int8.onnx", "modelopt": theirs}, x, y)
        import onnxruntime

        flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0] if Path("/proc/cpuinfo").is_file() else ""
        isa = "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX2" if "avx2" in flags else platform.machine()
        versions = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"), "modelopt": proc.stdout.strip().splitlines()[-1],
                    "onnxruntime": onnxruntime.__version__, "cpu": isa}
        text = markdown(rows, acc, versions)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps({"versions": versions, "rows": rows, "accuracy": acc}, indent=1) + "\n")
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
