"""How much float batching changes an output, on models that are correct: the figures behind
``vitedge.models.batch_check.REL_TOL`` (and ``SAME_TOL``).

For each model (the examples the test suite builds, and every public corpus model whose checkpoint is in the
cache: benchmarks/corpus/manifest.toml, loaded with its class as ``--model-class`` would), vitedge's own intake and
FP32 export, then ``measure_batch_independence`` on the written graph: one batch of 4 inputs against each input
alone, in ONNX Runtime, with the first 4 calibration images of the model's split (when a split is in the cache) and
with 4 seeded random images. Prints and writes (``--out``, default benchmarks/results/batch_independence_<isa>.md):
the largest change of an output between its batch and alone, relative to that output's largest magnitude
("change"); the largest difference between two inputs' outputs, relative ("spread": a correct model's output
depends on its input); the check's CPU time; the CPU kind and the load.

    python benchmarks/batch_independence.py [--models ID ...] [--no-corpus]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "benchmarks" / "corpus"
EXAMPLES = REPO / "examples"
DIGITS = REPO / "calibration" / "digits" / "calib"
# (name, checkpoint, --model-class, calibration folder); the examples' own preprocessing comes from their files
EXAMPLE_MODELS = (
    ("digits_vit (timm)", EXAMPLES / "digits_vit.pt", None, DIGITS),
    ("lowconf_digits_vit (timm)", EXAMPLES / "lowconf_digits_vit.pt", None, DIGITS),
    ("gray_digits_vit (own class)", EXAMPLES / "gray_digits_vit.pt", f"{EXAMPLES / 'gray_vit.py'}:GrayViT", DIGITS),
    ("postnorm_vit (own class)", EXAMPLES / "postnorm_vit.pt", f"{EXAMPLES / 'postnorm_vit.py'}:PostNormViT", DIGITS),
    *((f"families/{p.stem}", p, None, DIGITS) for p in sorted((EXAMPLES / "families").glob("*.pt"))),
)


def corpus_models(only: list[str] | None):
    """(name, checkpoint, --model-class, calibration folder or None, IntakeOptions extras) for each cached corpus model."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    from corpus import cache  # benchmarks/corpus.py's loaded benchmarks/corpus/cache.py, one module for both

    manifest = cache.load_manifest()
    for m in manifest.models:
        if (only and m.id not in only) or not m.path.is_file():
            continue
        splits = sorted(cache.splits_dir().glob(f"{m.dataset}-c*"))
        calib = splits[0] / "calib" if splits else None
        extra = {"mean": m.mean, "std": m.std, "crop_pct": 1.0,
                 "input_size": (m.size, m.size) if m.needs_input_size else None}
        yield m.id, m.path, f"{CORPUS / 'models.py'}:{m.model_class}", calib, extra


def measure(name: str, path: Path, model_class: str | None, calib: Path | None, extra: dict, work: Path) -> list[dict]:
    from vitedge.datasources.sources import open_source
    from vitedge.models.batch_check import PROBE_IMAGES, measure_batch_independence, probe_inputs
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model

    loaded = load_model(path, IntakeOptions(model_class=model_class, **extra))
    graph = work / f"{abs(hash(name))}.onnx"
    export_onnx(loaded, graph)
    rows = []
    inputs = [None]
    if calib is not None and calib.is_dir():
        source = open_source(calib, loaded.spec.preprocess, limit=64, seed=0, class_names=loaded.spec.class_names, progress=False)
        inputs.insert(0, probe_inputs(source.batches(PROBE_IMAGES)))
    for x in inputs:
        c = measure_batch_independence(graph, loaded.spec, x)
        rows.append({"model": name, "inputs": c.inputs, "change": c.change, "spread": c.spread, "top1_differs": c.top1_differs,
                     "cpu_s": c.seconds, "size": f"{loaded.spec.image_size[0]}x{loaded.spec.image_size[1]}x{loaded.spec.preprocess.channels}"})
        print(f"{name:34s} {c.inputs:20s} change {c.change:.2e}  spread {c.spread:.2e}  top-1 differs {c.top1_differs}  "
              f"{c.seconds:.2f} s CPU", flush=True)
    return rows


def markdown(rows: list[dict], isa: str, loads: tuple[str, str], argv: list[str]) -> str:
    from vitedge.models.batch_check import REL_TOL, SAME_TOL

    changes = [r["change"] for r in rows]
    spreads = [r["spread"] for r in rows]
    lines = [
        f"# Batch independence on correct models ({isa})", "",
        f"`python benchmarks/batch_independence.py{''.join(' ' + a for a in argv)}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"load average {loads[0]} at the start, {loads[1]} at the end (other jobs on the same 2 cores).", "",
        "Each model through vitedge's intake and FP32 export, then its graph in ONNX Runtime on one batch of 4 inputs "
        "against each input alone (`vitedge.models.batch_check.measure_batch_independence`). *change*: the largest "
        "|batched - alone| of an input's output, relative to that output's largest magnitude. *spread*: the largest "
        "difference between two inputs' outputs, relative (a correct model's output depends on its input). CPU s: the "
        "whole check (session and 5 forward passes). The corpus models' calibration images are the first 4 of their split "
        "in the cache; the examples' are the digits calibration set (resized to each model's input).", "",
        f"Largest change on these models: **{max(changes):.2e}** (the check refuses above {REL_TOL:g}); smallest spread: "
        f"**{min(spreads):.2e}** (it refuses at or below {SAME_TOL:g}).", "",
        "| model | input | inputs | change | spread | top-1 differs | CPU s |", "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['size']} | {r['inputs']} | {r['change']:.2e} | {r['spread']:.2e} | {r['top1_differs']} | {r['cpu_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", help="corpus model ids (default: every one in the cache)")
    ap.add_argument("--no-corpus", action="store_true")
    ap.add_argument("--no-examples", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "benchmarks"))
    from timing import results_isa

    isa = results_isa()
    start_load = f"{os.getloadavg()[0]:.1f}"
    rows: list[dict] = []
    todo = [] if args.no_examples else [(n, p, c, d, {}) for n, p, c, d in EXAMPLE_MODELS if p.is_file()]
    if not args.no_corpus:
        todo += list(corpus_models(args.models))
    with tempfile.TemporaryDirectory() as work:
        for name, path, cls, calib, extra in todo:
            try:
                rows += measure(name, path, cls, calib, extra, Path(work))
            except Exception as err:  # a model this script cannot load is a line, not a stop
                print(f"{name}: not measured: {type(err).__name__}: {str(err)[:200]}", flush=True)
    end_load = f"{os.getloadavg()[0]:.1f}"
    out = args.out or REPO / "benchmarks" / "results" / f"batch_independence_{isa}.md"
    shown = [a for i, a in enumerate(argv) if a != "--out" and (i == 0 or argv[i - 1] != "--out")]  # no local path
    out.write_text(markdown(rows, isa, (start_load, end_load), shown), encoding="utf-8")
    print(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
