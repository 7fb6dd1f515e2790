"""Issue 30 items 4 and 6: the calibration choice (method ``select``) and the near-tie gate, measured
on the public corpus of ViTs other people trained (benchmarks/corpus/, read-only here) and on the
bundled digits ViTs.

Run by hand from the repository root (minutes per model on 2 cores)::

    python benchmarks/calibration_choice.py [--models ID,...] [--calib 200] [--val 1000] [--corpus DIR]

Per model: export the FP32 graph, calibrate on ``--calib`` images and evaluate on ``--val`` other
images of its test set (a seeded split; the digits ViTs use calibration/digits), all in ONNX Runtime
(CPU). For each fixed method (entropy, mse, percentile 99.99, minmax) and for ``select`` (its choice
and every candidate's score): full-INT8 agreement with FP32, top-1 drop with its exact paired 95 %
interval, agreement on the decisive images, the expected drop under FP32's probabilities, and the
verdict of the plain gate (point estimates) and of the near-tie gate, at the onnx profile's
thresholds (0.2 points, 99.5 %). Then two builds that really lose accuracy: a forced collapse
(``percentile`` at 90 %, clipping a tenth of every activation) and a wrong ``--mean`` (the model's
mean + 0.5 per channel) calibrated and validated with that mean; both must be refused.

Writes benchmarks/results/calibration_choice.md and .json. The corpus models need the corpus cache
(benchmarks/corpus/fetch.md in the corpus branch); a model that is missing is reported, not fatal.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
DIGITS = {"digits": "digits_vit.pt", "postnorm": "postnorm_vit.pt", "lowconf": "lowconf_digits_vit.pt"}
METHODS = (("entropy", {"method": "entropy"}), ("mse", {"method": "mse"}), ("percentile 99.99", {"method": "percentile"}),
           ("minmax", {"method": "minmax"}))
ACCURACY_ROWS = ("max_top1_drop", "min_agreement", "min_decisive_agreement")  # the gate's classifier accuracy rows
warnings.filterwarnings("ignore")


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def ort_predict(path: Path, x: np.ndarray) -> np.ndarray:
    from vitedge.onnxkit.session import ort_session

    sess = ort_session(path, threads=2)
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + 100]})[0] for i in range(0, len(x), 100)])


def corpus_split(corpus: Path, model_id: str, n_calib: int, n_val: int, work: Path) -> tuple[Path, Any]:
    """(split folder with calib/ and val/, manifest model): the corpus's own seeded split, written under ``work``."""
    sys.path.insert(0, str(corpus))
    import cache as corpus_cache  # benchmarks/corpus/cache.py of the corpus branch

    manifest = corpus_cache.load_manifest(corpus / "manifest.toml")
    model = manifest.model(model_id)
    ds = manifest.datasets[model.dataset]
    out = work / "splits" / f"{ds.id}-c{n_calib}-v{n_val}"
    if not (out / ".complete").is_file():
        from PIL import Image

        items, labels = corpus_cache.load_images(ds)
        split = corpus_cache.split_indices(len(items), n_calib, n_val, 0)
        for sub, idx in (("calib", split.calib), ("val", split.val)):
            for i in idx:
                name, data = items[i]
                folder = out / sub / str(int(labels[i]))
                folder.mkdir(parents=True, exist_ok=True)
                if isinstance(data, (bytes, bytearray)):
                    (folder / f"{i:05d}{Path(name).suffix}").write_bytes(data)
                else:
                    Image.fromarray(np.asarray(data)).save(folder / f"{i:05d}.png")
        (out / ".complete").write_text("ok\n")
    return out, model


def load(which: str, corpus: Path, work: Path, args, mean_shift: float = 0.0):
    """(fp32 onnx, spec, calib dir, val dir) of a digits ViT or a corpus model."""
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model

    if which in DIGITS:
        opts = IntakeOptions()
        ckpt = REPO / "examples" / DIGITS[which]
        calib, val = REPO / "calibration" / "digits" / "calib", REPO / "calibration" / "digits" / "val"
        if mean_shift:
            spec = load_model(ckpt, opts).spec
            opts = IntakeOptions(mean=tuple(m + mean_shift for m in spec.preprocess.mean))
    else:
        split, model = corpus_split(corpus, which, args.calib, args.val, work)
        ckpt = model.path
        mean = tuple(float(m) + mean_shift for m in model.mean)
        opts = IntakeOptions(model_class=f"{corpus / 'models.py'}:{model.model_class}", trust_pickle=True,
                             input_size=(model.size, model.size), mean=mean, std=tuple(float(s) for s in model.std))
        calib, val = split / "calib", split / "val"
    loaded = load_model(ckpt, opts)
    out = work / f"{which}{'-wrongmean' if mean_shift else ''}.fp32.onnx"
    export_onnx(loaded, out)
    return out, loaded.spec, calib, val


def evaluate(ref: np.ndarray, got: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    from vitedge.targets.profiles import Thresholds
    from vitedge.validation.accuracy import compare_logits
    from vitedge.validation.run import evaluate_gate

    t = Thresholds(max_top1_drop=0.2, min_agreement=0.995)  # the onnx / intel-cpu profiles
    acc = compare_logits(ref, got, labels)
    acc["output_kind"] = "logits"
    plain = dataclasses.replace(t, near_tie_margin=0.0, drop_confidence=0.0)
    rows = {r.name: r for r in evaluate_gate(acc, None, None, t) if r.name in ACCURACY_ROWS}
    plain_rows = [r for r in evaluate_gate(acc, None, None, plain) if r.name in ACCURACY_ROWS]
    keys = ("fp32_top1", "int8_top1", "top1_drop_points", "top1_drop_ci_points", "top1_discordant", "top1_agreement",
            "decisive_samples", "decisive_agreement", "near_tie_flips", "decisive_flips", "expected_drop_points", "softmax_kl_mean")
    return {**{k: acc.get(k) for k in keys}, "gate_plain": all(r.passed for r in plain_rows),
            "gate_near_tie": all(r.passed for r in rows.values()),
            "refusal": "; ".join(r.detail for r in rows.values() if not r.passed) or None}


def run_model(which: str, corpus: Path, work: Path, args) -> dict[str, Any]:
    from vitedge.datasources.sources import open_source
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    log(f"== {which}")
    try:
        fp32, spec, calib_dir, val_dir = load(which, corpus, work, args)
    except Exception as err:  # a model missing from the corpus cache, or one that does not load
        return {"model": which, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
    calib = open_source(calib_dir, spec.preprocess, class_names=spec.class_names)
    val = open_source(val_dir, spec.preprocess, class_names=spec.class_names)
    x = np.concatenate([b.images for b in val.batches(128)])
    labels = np.concatenate([b.labels for b in val.batches(128)])
    ref = ort_predict(fp32, x)
    rows = []
    cache = work / f"cache-{which}"
    for label, kwargs in METHODS + (("select (default)", {}), ("forced collapse: percentile 90", {"method": "percentile", "percentile": 90.0})):
        t0 = time.perf_counter()
        cal = calibrate(fp32, calib, QuantConfig(**kwargs), cache_dir=cache)
        q = build_qdq(cal)
        path = work / f"{which}.{len(rows)}.int8.onnx"
        q.save(path)
        got = ort_predict(path, x)
        np.savez_compressed(work / f"{which}.{len(rows)}.outputs.npz", ref=ref, got=got, labels=labels)  # to re-judge offline
        row = {"method": label, "seconds": time.perf_counter() - t0, **evaluate(ref, got, labels)}
        if cal.selection is not None:
            row["chosen"] = cal.selection.chosen
            row["selection"] = cal.selection.to_dict()
        rows.append(row)
        log(f"{which} {label}: agreement {100 * row['top1_agreement']:.2f}%, drop {row['top1_drop_points']:+.2f} "
            f"{row['top1_drop_ci_points']}, decisive {row['decisive_agreement']}, plain {row['gate_plain']}, near-tie {row['gate_near_tie']}")
    try:  # a wrong --mean: the whole build (FP32 reference too) sees shifted inputs
        wfp32, wspec, _, _ = load(which, corpus, work, args, mean_shift=0.5)
        wcal_src = open_source(calib_dir, wspec.preprocess, class_names=wspec.class_names)
        wval = open_source(val_dir, wspec.preprocess, class_names=wspec.class_names)
        wx = np.concatenate([b.images for b in wval.batches(128)])
        wref = ort_predict(wfp32, wx)
        q = build_qdq(calibrate(wfp32, wcal_src, QuantConfig(), cache_dir=cache))
        path = work / f"{which}.wrongmean.int8.onnx"
        q.save(path)
        wgot = ort_predict(path, wx)
        np.savez_compressed(work / f"{which}.wrongmean.outputs.npz", ref=wref, got=wgot, labels=labels, right_ref=ref)
        rows.append({"method": "wrong --mean (+0.5), select", "fp32_top1_right_mean": float((ref.argmax(1) == labels).mean()),
                     **evaluate(wref, wgot, labels)})
        log(f"{which} wrong mean: {rows[-1]}")
    except Exception as err:
        rows.append({"method": "wrong --mean (+0.5), select", "error": f"{type(err).__name__}: {err}"[:200]})
    margins = np.sort(ref, axis=1)
    return {"model": which, "val_images": int(len(x)), "calib_images": len(calib), "val_dir": str(val_dir),
            "fp32_top1": float((ref.argmax(1) == labels).mean()),
            "fp32_median_top2_logit_margin": float(np.median(margins[:, -1] - margins[:, -2])), "rows": rows}


def markdown(results: list[dict[str, Any]], header: str) -> str:
    out = [header, ""]
    for res in results:
        if "error" in res:
            out += [f"## {res['model']}: not measured ({res['error']})", ""]
            continue
        out += [f"## {res['model']}: FP32 top-1 {100 * res['fp32_top1']:.2f} % on {res['val_images']} held-out images "
                f"(calibration {res['calib_images']}), median top-2 logit margin {res['fp32_median_top2_logit_margin']:.2f}", "",
                "| calibration | agreement % | top-1 drop (pt) [95 % CI] | decisive images: agreement % | near-tie flips | "
                "expected drop (pt) | plain gate | near-tie gate |", "|---|---:|---|---:|---:|---:|---|---|"]
        for r in res["rows"]:
            if "error" in r:
                out.append(f"| {r['method']} | error: {r['error']} | | | | | | |")
                continue
            ci = r.get("top1_drop_ci_points") or [float("nan")] * 2
            dec = r.get("decisive_agreement")
            name = r["method"] + (f" -> **{r['chosen']}**" if r.get("chosen") else "")
            out.append(f"| {name} | {100 * r['top1_agreement']:.2f} | {r['top1_drop_points']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}] | "
                       f"{'-' if dec is None else f'{100 * dec:.2f}'} ({r['decisive_samples']}) | {r['near_tie_flips']} | "
                       f"{r['expected_drop_points']:.2f} | {'pass' if r['gate_plain'] else 'FAIL'} | "
                       f"{'pass' if r['gate_near_tie'] else 'FAIL'} |")
        sel = next((r for r in res["rows"] if r.get("selection")), None)
        if sel:
            scores = ", ".join(f"{c['name']} {c['error']:.3g} (t {c['paired_t']:.1f})" for c in sel["selection"]["candidates"])
            out += ["", f"select's scores (softmax KL to FP32 on {sel['selection']['samples']} calibration images, paired t vs "
                    f"entropy): {scores}"]
        refused = [r for r in res["rows"] if r.get("refusal") and ("collapse" in r["method"] or "wrong" in r["method"])]
        for r in refused:
            out += ["", f"{r['method']} refused: {r['refusal']}"]
        out.append("")
    return "\n".join(out)


def select_rule(selection: dict[str, Any]) -> str:
    """Method select's choice from its stored scores, by the rule of this checkout (vitedge.quantize.select)."""
    from vitedge.quantize.select import SELECT_MIN_RATIO, SELECT_MIN_T

    cands = selection["candidates"]
    first = next(c for c in cands if c["name"] == selection.get("first", "entropy"))
    best = cands[0]
    ok = best["name"] == first["name"] or (best["paired_t"] >= SELECT_MIN_T and best["error"] * SELECT_MIN_RATIO <= first["error"])
    return best["name"] if ok else first["name"]


def rejudge(results: list[dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    """Every row judged again from its stored outputs with this checkout's gate, and select's choice
    taken again by this checkout's rule (a changed choice reads the fixed method's outputs: its
    candidates are the same thresholds and bias correction)."""
    same = {"entropy": 0, "mse": 1, "p99.99": 2, "minmax": 3}
    for res in results:
        for k, row in enumerate(res.get("rows", [])):
            if "error" in row:
                continue
            f = work / (f"{res['model']}.wrongmean.outputs.npz" if row["method"].startswith("wrong") else f"{res['model']}.{k}.outputs.npz")
            if row.get("selection"):
                chosen = select_rule(row["selection"])
                if chosen != row["chosen"]:
                    f = work / f"{res['model']}.{same[chosen]}.outputs.npz"
                    row["chosen"] = chosen
            d = np.load(f)
            row.update(evaluate(d["ref"], d["got"], d["labels"]))
    return results


def probe_all(results: list[dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    """The FP32 preprocessing probe on each model's FP32 graph with its right mean and with the mean + 0.5."""
    import onnx

    from vitedge.datasources.sources import open_source
    from vitedge.onnxkit.metadata import SPEC_KEY, get_metadata
    from vitedge.bundle.spec import ModelSpec
    from vitedge.validation.noise import preprocessing_probe, probe_shifts

    out = []
    for res in results:
        if "error" in res:
            continue
        for tag in ("", "-wrongmean"):
            path = work / f"{res['model']}{tag}.fp32.onnx"
            if not path.is_file():
                continue
            spec = ModelSpec.from_json(get_metadata(onnx.load(str(path)))[SPEC_KEY])
            val = open_source(res["val_dir"], spec.preprocess, class_names=spec.class_names)
            x = np.concatenate([b.images for b in val.batches(128)])
            labels = np.concatenate([b.labels for b in val.batches(128)])
            ref = ort_predict(path, x)
            shifted = {m: ort_predict_delta(path, x, d) for m, d in probe_shifts(spec.preprocess.std).items()}
            out.append({"model": res["model"], "mean": "right" if not tag else "right + 0.5", **preprocessing_probe(ref, shifted, labels)})
            log(f"probe {res['model']}{tag}: suspect {out[-1]['suspect']}")
    return out


def ort_predict_delta(path: Path, x: np.ndarray, delta: np.ndarray) -> np.ndarray:
    return ort_predict(path, (x + delta).astype(np.float32))


def probe_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["## The FP32 preprocessing probe (wrong --mean)", "",
             "FP32 top-1 on the held-out images with the mean as given and moved by -0.25 / +0.25 (pixel units); "
             "suspect: a gain of >= 1 point at exact paired p < 0.001 (docs/gate.md).", "",
             "| model | mean | FP32 top-1 % | mean -0.25: gain (pt), p | mean +0.25: gain (pt), p | suspect |", "|---|---|---:|---|---|---|"]
    for r in rows:
        a, b = r["shifts"]
        lines.append(f"| {r['model']} | {r['mean']} | {100 * r['fp32_top1']:.1f} | {a['gain_points']:+.1f}, {a['p_value']:.1g} | "
                     f"{b['gain_points']:+.1f}, {b['p_value']:.1g} | {'**yes**' if r['suspect'] else 'no'} |")
    return "\n".join(lines) + "\n"


def judge_all(work: Path) -> dict[str, Any]:
    """False pass / false fail of each gate over every stored build (``*.outputs.npz`` in ``work``).

    Truth, per build, from its labels on the held-out images: *within noise* when the exact paired 95 %
    interval of the top-1 drop reaches down to the 0.2-point limit, *a real loss* when it lies above it.
    A wrong --mean is its own class: FP32 itself loses accuracy there, which no INT8-vs-FP32 statistic
    sees (its INT8 follows FP32 faithfully), so it is counted apart."""
    import dataclasses as dc

    from vitedge.targets.profiles import Thresholds
    from vitedge.validation.accuracy import compare_logits
    from vitedge.validation.run import evaluate_gate

    gates = {"plain, labelled": (True, dc.replace(Thresholds(max_top1_drop=0.2, min_agreement=0.995), near_tie_margin=0.0, drop_confidence=0.0)),
             "near-tie, labelled": (True, Thresholds(max_top1_drop=0.2, min_agreement=0.995)),
             "plain, no labels": (False, dc.replace(Thresholds(max_top1_drop=0.2, min_agreement=0.995), near_tie_margin=0.0, drop_confidence=0.0)),
             "near-tie, no labels": (False, Thresholds(max_top1_drop=0.2, min_agreement=0.995))}
    counts = {g: {"noise": [0, 0], "loss": [0, 0], "wrong_mean": [0, 0]} for g in gates}  # [refused, of]
    for f in sorted(work.glob("*.outputs.npz")):
        d = np.load(f)
        ref, got, labels = d["ref"], d["got"], d["labels"]
        truth = compare_logits(ref, got, labels)
        kind = "wrong_mean" if "wrongmean" in f.name else ("loss" if truth["top1_drop_ci_points"][0] > 0.2 + 1e-9 else "noise")
        for g, (labelled, t) in gates.items():
            acc = compare_logits(ref, got, labels if labelled else None, near_tie_margin=t.near_tie_margin, drop_confidence=t.drop_confidence)
            acc["output_kind"] = "logits"
            refused = not all(r.passed for r in evaluate_gate(acc, None, None, t) if r.name in ACCURACY_ROWS)
            counts[g][kind][0] += int(refused)
            counts[g][kind][1] += 1
    return counts


def rates_markdown(counts: dict[str, Any]) -> str:
    lines = ["## False fail / false pass of each gate over every build above", "",
             "| gate | within noise, refused (false fail) | real loss, passed (false pass) | wrong --mean, passed |", "|---|---:|---:|---:|"]
    for g, c in counts.items():
        nf, nn = c["noise"]
        lf, ln = c["loss"]
        wf, wn = c["wrong_mean"]
        lines.append(f"| {g} | {nf} of {nn} | {ln - lf} of {ln} | {wn - wf} of {wn} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="digits,postnorm,lowconf,researchase-mnist,kavishka-shallow,gaurav-mnist,smmk47-postnorm,"
                                        "ashu-mha,ashu-convt,tintn-mayank,tintn-anzksdk")
    ap.add_argument("--corpus", type=Path, default=REPO / "benchmarks" / "corpus",
                    help="the corpus folder (manifest.toml, models.py, cache.py)")
    ap.add_argument("--corpus-cache", default="~/.cache/vitedge/corpus")
    ap.add_argument("--calib", type=int, default=200)
    ap.add_argument("--val", type=int, default=1000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/vitedge-calibration-choice"))
    ap.add_argument("--out", default="calibration_choice")
    ap.add_argument("--rates-only", action="store_true", help="only re-judge the builds stored in --work")
    ap.add_argument("--rejudge", action="store_true", help="re-judge the stored outputs of the last run with this checkout's gate")
    args = ap.parse_args()
    if args.rates_only:
        print(rates_markdown(judge_all(args.work)))
        return
    if args.rejudge:  # the stored outputs of an earlier run, judged by this checkout's gate and select rule
        doc = json.loads((RESULTS / f"{args.out}.json").read_text())
        results = rejudge(doc["results"], args.work)
        for res in results:  # runs before val_dir was recorded
            if "error" not in res and "val_dir" not in res:
                res["val_dir"] = str(REPO / "calibration" / "digits" / "val") if res["model"] in DIGITS else str(
                    args.work / "splits" / ("mnist-test-c200-v1000" if "mnist" in res["model"] else "cifar10-test-jpeg-c200-v1000") / "val")
        probes = probe_all(results, args.work)
        counts = judge_all(args.work)
        header = doc.get("header", "# Calibration choice and the near-tie gate (issue 30 items 4 and 6)") + (
            f"\n\nRe-judged on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `--rejudge`: the gate columns, decisive "
            "figures and select's choice are this checkout's (near_tie_margin 0.5; select switches from entropy only at t >= 2 "
            "and >= 10x closer), from the outputs the run stored; the measurements themselves are the run's.")
        text = markdown(results, header) + "\n" + rates_markdown(counts) + "\n" + probe_markdown(probes)
        (RESULTS / f"{args.out}.md").write_text(text)
        (RESULTS / f"{args.out}.json").write_text(json.dumps(dict(doc, results=results, gate_counts=counts, probes=probes), indent=1, default=float))
        print(text)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    from vitedge.core.cpu import read_cpu

    cpu = read_cpu()
    start = time.perf_counter()
    results = []
    for which in args.models.split(","):
        results.append(run_model(which, args.corpus, args.work, args))
        (RESULTS / f"{args.out}.json").write_text(json.dumps({"cpu": cpu.isa, "results": results}, indent=1, default=float))
    header = (f"# Calibration choice and the near-tie gate (issue 30 items 4 and 6)\n\nGenerated by `python "
              f"benchmarks/calibration_choice.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} in "
              f"{time.perf_counter() - start:.0f} s; CPU {cpu.model} ({cpu.isa}); ONNX Runtime (CPU), full INT8 graphs "
              "(no layer returned to float), gate thresholds of the onnx profile (0.2 points, 99.5 %). Decisive images: FP32's "
              "top-1 softmax probability beats its runner-up's by >= near_tie_margin (0.5). The plain gate is the point estimates alone "
              "(near_tie_margin = drop_confidence = 0).")
    counts = judge_all(args.work)
    text = markdown(results, header) + "\n" + rates_markdown(counts)
    (RESULTS / f"{args.out}.md").write_text(text)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"cpu": cpu.isa, "results": results, "gate_counts": counts}, indent=1, default=float))
    print(text)


if __name__ == "__main__":
    main()
