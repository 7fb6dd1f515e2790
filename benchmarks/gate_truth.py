"""Issue 43: the accuracy gate judged against the truth, on the public corpus of ViTs other people trained.

Run by hand from the repository root (corpus cache from ``$VITEDGE_CORPUS_CACHE``; minutes per model on 2 cores)::

    VITEDGE_CORPUS_CACHE=DIR python benchmarks/gate_truth.py [--models ID,...] [--work DIR]   # outputs, then judge
    python benchmarks/gate_truth.py --judge-only [--work DIR]                                  # judge stored outputs again

Per corpus model (each has 10,000 test images): a seeded split of its test set into 200 calibration images and
9,800 others, of which a seeded 7,000 are run (the first model run kept all 9,800): a truth set of 4,000 and a gate
pool of the rest (up to 5,000). INT8 variants from good to wrecked, each built once as a
user's `vitedge build --target onnx` would build it (``quantize.calibrate`` then ``build_qdq``, full INT8, no layer
returned to float): every calibration method (the default ``select``, entropy, mse, percentile 99.99, minmax), the
percentile method at 99.9, 99, 95 and 90 (90 clips a tenth of every activation: the forced collapse), a wrong
``--mean`` (the model's mean + 0.5, the FP32 reference built with it too, as a user's build would be), and the default
graph with one activation's scale off by 4x each way. FP32 and every INT8 graph run once over all images in ONNX Runtime
(CPU); their logits are kept (``<work>/<model>.npz``). FP32 with its mean moved by +-0.25 runs too: the preprocessing
probe of the labelled gate.

Then the gate is judged in-process with the real functions (``compare_logits``, ``preprocessing_probe``,
``evaluate_gate`` at the onnx profile's thresholds) on disjoint subsets of the gate pool: 300, 500 and 1,000 images,
with their labels and without. The truth of each build is measured on the truth set, against FP32 with the model's
own (right) mean: its top-1 drop and its agreement on the images where FP32 is decisive.

* **false pass**: the gate passes a build whose truth loses more than the limit + 0.5 points of top-1, or flips more
  than 1 % of the images FP32 is decisive on;
* **false fail**: the gate fails a build whose truth is within the limit (drop <= limit, decisive agreement >= 99.5 %);
  a run whose only failing row says the images are too few to tell (the decisive row's own outcome) is counted apart,
  for good and bad builds alike.

Writes benchmarks/results/gate_truth_<isa>.md and .json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
RESULTS = REPO / "benchmarks" / "results"
MODELS = ("researchase-mnist", "kavishka-shallow", "gaurav-mnist", "smmk47-postnorm", "ashu-mha", "ashu-convt", "tintn-mayank",
          "tintn-anzksdk")
N_CALIB, N_TRUTH, N_POOL = 200, 4000, 5000  # the gate pool: up to N_POOL of the images beside the truth set
N_KEEP = 7000  # images run per model (a seeded subset of the 9,800 beside the calibration images): 4,000 truth, 3,000 pool
SIZES = (300, 500, 1000)
MEAN_SHIFT = 0.5
SCALE_OFF = 4.0
VARIANTS = (("select (default)", {}), ("entropy", {"method": "entropy"}), ("mse", {"method": "mse"}),
            ("percentile 99.99", {"method": "percentile"}), ("minmax", {"method": "minmax"}),
            ("percentile 99.9", {"method": "percentile", "percentile": 99.9}),
            ("percentile 99", {"method": "percentile", "percentile": 99.0}),
            ("percentile 95", {"method": "percentile", "percentile": 95.0}),
            ("percentile 90 (forced collapse)", {"method": "percentile", "percentile": 90.0}))
warnings.filterwarnings("ignore")


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


# --------------------------------------------------------------------------- outputs (run once per model)


def _images(folder: Path, spec) -> tuple[np.ndarray, np.ndarray]:
    from vitedge.datasources.sources import open_source

    src = open_source(folder, spec.preprocess, class_names=spec.class_names)
    batches = list(src.batches(256))
    return np.concatenate([b.images for b in batches]), np.concatenate([b.labels for b in batches])


def scale_off(model, factor: float) -> tuple[Any, str]:
    """A copy of a Q/DQ graph with one activation's scale (the middle activation QuantizeLinear, shared with its
    DequantizeLinear) multiplied by ``factor``: that layer's grid 4x coarser (or clipped 4x tighter)."""
    import copy

    from onnx import numpy_helper

    m = copy.deepcopy(model)
    inits = {i.name: i for i in m.graph.initializer}
    acts = [n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits and n.input[1] in inits]
    node = acts[len(acts) // 2]
    init = inits[node.input[1]]
    init.CopyFrom(numpy_helper.from_array((numpy_helper.to_array(init) * factor).astype(np.float32), init.name))
    return m, node.input[0]


def run_outputs(model_id: str, corpus: Path, work: Path) -> Path:
    """Every variant's logits on every image of the model's test set (but the calibration images): ``<work>/<id>.npz``."""
    import calibration_choice as cc  # noqa: E402 - its corpus split and model loading

    from vitedge.datasources.sources import open_source
    from vitedge.quantize import QuantConfig, build_qdq, calibrate
    from vitedge.validation.noise import probe_shifts

    out = work / f"{model_id}.npz"
    if out.is_file():
        return out
    args = argparse.Namespace(calib=N_CALIB, val=10000 - N_CALIB)
    fp32, spec, calib_dir, val_dir = cc.load(model_id, corpus, work, args)
    x, labels = _images(val_dir, spec)
    keep = np.sort(np.random.default_rng(1).permutation(len(x))[:N_KEEP])
    x, labels = x[keep], labels[keep]
    arrays: dict[str, np.ndarray] = {"labels": labels, "ref": cc.ort_predict(fp32, x)}
    for m, d in probe_shifts(spec.preprocess.std).items():
        arrays[f"probe{m:+g}"] = cc.ort_predict(fp32, x + d)
    calib = open_source(calib_dir, spec.preprocess, class_names=spec.class_names)
    cache, names, notes = work / f"cache-{model_id}", [], {}
    for i, (label, kwargs) in enumerate(VARIANTS):
        t0 = time.perf_counter()
        q = build_qdq(calibrate(fp32, calib, QuantConfig(**kwargs), cache_dir=cache))
        path = work / f"{model_id}.v{i}.int8.onnx"
        q.save(path)
        arrays[f"got{i}"] = cc.ort_predict(path, x)
        names.append(label)
        if i == 0:
            for factor in (SCALE_OFF, 1 / SCALE_OFF):
                tampered, tensor = scale_off(q.model, factor)
                tpath = work / f"{model_id}.scale{factor:g}.int8.onnx"
                from vitedge.onnxkit.files import save_onnx

                save_onnx(tampered, tpath)
                arrays[f"got{len(VARIANTS) + len(notes)}"] = cc.ort_predict(tpath, x)
                notes[f"one activation's scale x{factor:g} (select)"] = tensor
        log(f"{model_id} {label}: agreement {np.mean(arrays[f'got{i}'].argmax(1) == arrays['ref'].argmax(1)):.4f} "
            f"({time.perf_counter() - t0:.0f} s)")
    names += list(notes)
    # a wrong --mean: the user's whole build sees shifted inputs (its FP32 reference too)
    wfp32, wspec, _, _ = cc.load(model_id, corpus, work, args, mean_shift=MEAN_SHIFT)
    wx = _images(val_dir, wspec)[0][keep]
    wcal = open_source(calib_dir, wspec.preprocess, class_names=wspec.class_names)
    wpath = work / f"{model_id}.wrongmean.int8.onnx"
    build_qdq(calibrate(wfp32, wcal, QuantConfig(), cache_dir=cache)).save(wpath)
    arrays["wrong_ref"] = cc.ort_predict(wfp32, wx)
    arrays["wrong_got"] = cc.ort_predict(wpath, wx)
    for m, d in probe_shifts(wspec.preprocess.std).items():
        arrays[f"wrong_probe{m:+g}"] = cc.ort_predict(wfp32, wx + d)
    log(f"{model_id} wrong --mean: FP32 top-1 {np.mean(arrays['wrong_ref'].argmax(1) == labels):.4f} "
        f"(right mean {np.mean(arrays['ref'].argmax(1) == labels):.4f})")
    np.savez_compressed(work / f"{model_id}.tmp.npz", names=np.array(names), notes=json.dumps(notes), **arrays)
    os.replace(work / f"{model_id}.tmp.npz", out)
    return out


N_CONFIDENCE = 1500  # images per corpus model for the label-free normalisation check's false alarms (right mean only)
CONFIDENCE_Z = 3.09  # one-sided p 0.001, as the labelled probe's PROBE_MAX_P


def confidence_outputs(model_id: str, corpus: Path, work: Path) -> Path:
    """FP32 with the model's right mean, and with it moved by +-0.25, on a seeded N_CONFIDENCE of its test images
    (``<work>/confidence-<id>.npz``): what a label-free normalisation check would see on a build that is right."""
    import calibration_choice as cc  # noqa: E402

    from vitedge.validation.noise import probe_shifts

    out = work / f"confidence-{model_id}.npz"
    if out.is_file():
        return out
    args = argparse.Namespace(calib=N_CALIB, val=10000 - N_CALIB)
    fp32, spec, _, val_dir = cc.load(model_id, corpus, work, args)
    x = _images(val_dir, spec)[0]
    x = x[np.sort(np.random.default_rng(2).permutation(len(x))[:N_CONFIDENCE])]
    x = x[np.random.default_rng(3).permutation(len(x))]  # class folders come in order: the subsets must mix them
    arrays = {"ref": cc.ort_predict(fp32, x)}
    for m, d in probe_shifts(spec.preprocess.std).items():
        arrays[f"probe{m:+g}"] = cc.ort_predict(fp32, x + d)
    np.savez_compressed(out, **arrays)
    return out


def confidence_gain_z(base: np.ndarray, shifted: np.ndarray) -> float:
    """How far FP32's mean top-1 probability rises with the mean moved, in standard errors of the paired differences:
    a label-free sign that the given normalisation is not the one FP32 was trained with."""
    from vitedge.validation.noise import softmax

    diff = softmax(shifted).max(1) - softmax(base).max(1)
    spread = float(np.std(diff, ddof=1)) / np.sqrt(len(diff))
    return float(diff.mean()) / spread if spread > 0 else 0.0


def confidence_check(work: Path) -> list[dict[str, Any]]:
    """Per model: on disjoint subsets of SIZES images, how often the label-free check (a +-0.25 shift raises FP32's
    mean top-1 probability by more than CONFIDENCE_Z standard errors) fires with the RIGHT mean (a false alarm), and,
    where the wrong --mean build is stored, how often it fires on it."""
    out = []
    models = sorted({p.stem.split("confidence-", 1)[1] for p in work.glob("confidence-*.npz")}
                    | {p.stem for p in work.glob("*.npz") if not p.stem.startswith("confidence-") and not p.name.endswith(".tmp.npz")})
    for model in models:
        full = work / f"{model}.npz"
        d = np.load(full if full.is_file() else work / f"confidence-{model}.npz")
        keys = (("ref", "probe-0.25", "probe+0.25"),) + ((("wrong_ref", "wrong_probe-0.25", "wrong_probe+0.25"),) if "wrong_ref" in d else ())
        idx_all = (np.random.default_rng(0).permutation(len(d["ref"]))[N_TRUTH:N_TRUTH + N_POOL] if full.is_file()
                   else np.arange(len(d["ref"])))
        row: dict[str, Any] = {"model": model, "images": int(len(idx_all))}
        for which, (b, lo, hi) in zip(("right", "wrong"), keys):
            for size in SIZES:
                zs = [max(confidence_gain_z(d[b][i], d[lo][i]), confidence_gain_z(d[b][i], d[hi][i]))
                      for i in (idx_all[k * size:(k + 1) * size] for k in range(len(idx_all) // size))]
                row[f"{which} {size}"] = {"alarms": int(sum(z > CONFIDENCE_Z for z in zs)), "of": len(zs), "max_z": max(zs)}
        out.append(row)
    (work / "confidence_check.json").write_text(json.dumps(out, indent=1))
    return out


# --------------------------------------------------------------------------- judge (in-process, the real gate functions)


def truth_of(ref: np.ndarray, got: np.ndarray, labels: np.ndarray, limit: float) -> dict[str, Any]:
    """The truth of one build on the truth set, against FP32 with the model's right mean: its top-1 drop and its
    agreement on the images FP32 is decisive on (margin 0.5). ``bad``: a false pass if the gate passes it; ``good``:
    a false fail if the gate fails it (the issue's definitions); neither: not counted."""
    from vitedge.targets.profiles import DEFAULT_NEAR_TIE_MARGIN
    from vitedge.validation.noise import fp32_margins

    rp, gp = ref.argmax(1), got.argmax(1)
    drop = 100.0 * (float(np.mean(rp == labels)) - float(np.mean(gp == labels)))
    decisive = fp32_margins(ref) >= DEFAULT_NEAR_TIE_MARGIN
    dec = float(np.mean(rp[decisive] == gp[decisive])) if decisive.any() else 1.0
    eps = 1e-9  # a drop is a multiple of 100/4000 points: 28 images of 4,000 are 0.7 points, not more (float rounding)
    kind = "bad" if drop > limit + 0.5 + eps or dec < 0.99 else "good" if drop <= limit + eps and dec >= 0.995 else "between"
    return {"drop": drop, "decisive_agreement": dec, "decisive_images": int(decisive.sum()), "agreement": float(np.mean(rp == gp)),
            "kind": kind}


def gate_once(ref: np.ndarray, got: np.ndarray, labels: np.ndarray | None, probes: dict[float, np.ndarray], t) -> tuple[bool, str]:
    """The gate's accuracy verdict on one subset, as validation computes it: ``accuracy_of``, the preprocessing probe
    where ``_probe_needed`` asks for it (its FP32 passes precomputed), ``evaluate_gate``. (passed, failing rows)."""
    from types import SimpleNamespace

    from vitedge.validation import run
    from vitedge.validation.accuracy import Outputs
    from vitedge.validation.noise import preprocessing_probe

    acc = run.accuracy_of(Outputs(ref, labels), Outputs(got, labels), "logits", t, "gate-truth", lambda _m: None)
    if run._probe_needed(acc, t, lambda *_: SimpleNamespace(input_format=None), None):
        acc["fp32_preprocessing_probe"] = preprocessing_probe(ref, probes, labels)
    rows = [r for r in run.evaluate_gate(acc, None, None, t) if r.name not in ("min_speedup", "max_p99_ms")]  # the accuracy rows
    alts = alternatives(ref, got, labels, acc, rows, t)
    failing = [r for r in rows if not r.passed]
    too_few = bool(failing) and all(r.detail.startswith(getattr(run, "TOO_FEW_TEXT", "\0")) for r in failing)
    return not failing, ",".join(r.name for r in failing), alts, too_few


# --------------------------------------------------------------------------- alternative rules, judged on the same runs
# Each rule is computed here from the gate's own measurements (compare_logits' accuracy dict) and the verdicts of the
# rows it does not replace, so the same stored logits judge them all against the same truth (docs/gate.md lists them).

LOSS_FLIP_RATE = 0.01  # the truth's line: a build that flips more than 1 % of FP32's decisive images is bad


def _cp_upper(k: int, n: int, confidence: float) -> float:
    """The one-sided upper Clopper-Pearson bound of a rate with ``k`` events in ``n`` trials."""
    from vitedge.validation.noise import clopper_pearson

    return clopper_pearson(k, n, 2.0 * confidence - 1.0)[1]


def _judged(acc: dict[str, Any], t) -> bool:
    from vitedge.validation.noise import decisive_judged

    return decisive_judged(acc, t.near_tie_margin)


def _base(rows) -> bool:
    """The rows no alternative replaces: the labels' drop row and the agreement row (with the preprocessing probe)."""
    return all(r.passed for r in rows if r.name not in ("min_decisive_agreement", "max_expected_drop"))


def _dec_point(acc, t) -> bool:
    from vitedge.validation.noise import allowed_flips

    return not _judged(acc, t) or acc["decisive_flips"] <= allowed_flips(t.min_decisive_agreement, acc["decisive_samples"])


def _dec_bound(acc, t, confidence: float, zero_excused: bool = True) -> bool:
    """The decisive flip rate's one-sided upper bound within the loss line (1 %); ``zero_excused``: no flip passes."""
    if not _judged(acc, t) or (zero_excused and acc["decisive_flips"] == 0):
        return True
    return _cp_upper(acc["decisive_flips"], acc["decisive_samples"], confidence) <= LOSS_FLIP_RATE + 1e-12


def _expected(ref: np.ndarray, got: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """(mean, standard error) of the per-image cost, in points, under ``probs``."""
    rows = np.arange(len(ref))
    cost = probs[rows, ref.argmax(1)] - probs[rows, got.argmax(1)]
    return 100.0 * float(cost.mean()), 100.0 * float(cost.std(ddof=1)) / np.sqrt(len(cost))


def alternatives(ref, got, labels, acc, rows, t) -> dict[str, bool]:
    """Each alternative rule's verdict on one gate run ({} with a vitedge that lacks the functions they need)."""
    try:
        from vitedge.validation.noise import fit_temperature, softmax
        from vitedge.validation.sanity import fp32_at_chance
    except ImportError:
        return {}
    cal = None
    if labels is not None and not fp32_at_chance(float(np.mean(ref.argmax(1) == labels)), ref.shape[1], len(ref)):
        cal = _expected(ref, got, softmax(ref / fit_temperature(ref, labels)))
    e = {"judged": _judged(acc, t), "raw": _expected(ref, got, softmax(ref)), "cal": cal,
         "stand_in": {s: _expected(ref, got, softmax(ref / s)) for s in STAND_INS}, "lean": _leaning(acc)}
    return {name: bool(rule(acc, rows, t, e)) for name, rule in ALTERNATIVES.items()}


def _leaning(acc: dict[str, Any]) -> bool:
    """Whether INT8's flips lean one way between classes (the gate's symmetry test; False with a vitedge without it)."""
    try:
        from vitedge.validation.noise import FLIP_LEAN_ALPHA
    except ImportError:
        return False
    p = acc.get("flip_symmetry_p")
    return p is not None and p < FLIP_LEAN_ALPHA


Z95, Z99 = 1.645, 2.326
STAND_INS = (1.5, 2.0, 2.5, 3.0)


def _exp_standin(e: dict[str, Any], t, stand_in: float | None, z: float | None = Z95) -> bool:
    """The expected drop calibrated on the labels where there are labels FP32 is not at chance on; elsewhere priced at
    the temperature ``stand_in`` (None: not judged there)."""
    from vitedge.validation.noise import EXPECTED_DROP_SLACK

    if not e["judged"]:
        return True
    if e["cal"] is not None:
        mean, spread = e["cal"]
    elif stand_in is None:
        return True
    else:
        mean, spread = e["stand_in"][stand_in] if stand_in != 1.0 else e["raw"]
    return (mean if z is None else mean + z * spread) <= t.max_top1_drop + EXPECTED_DROP_SLACK + 1e-9


def _estimate(acc, t, line_only: bool = False, confidence: float = 0.9, z: float | str | None = "gate", within: str = "limit") -> bool:
    """The decisive row of this change (``decisive_outcome``) passing: ``line_only``, only its loss outcome fails
    (no too-few outcome: the count at the limit and the estimate at the loss line); ``confidence``, the flip-rate bound's;
    ``z``: a flip the count cannot tell passes when the estimate + z standard errors is within ``within`` (the limit or
    the loss line); "gate": the gate's own z (``DECISIVE_ESTIMATE_Z``) at the limit; None: the count's bound alone
    decides (the gate before this change)."""
    try:
        from vitedge.validation.noise import OK, decisive_loss_line, decisive_outcome
    except ImportError:
        return True
    if not _judged(acc, t):
        return True
    est = acc.get("decisive_flip_estimate")
    if line_only:
        return _dec_point(acc, t) and (est is None or est <= decisive_loss_line(t.min_decisive_agreement) + 1e-12)
    if z == "gate":
        try:
            from vitedge.validation.noise import DECISIVE_ESTIMATE_Z as z
        except ImportError:
            z = None
    spread = acc.get("decisive_flip_estimate_spread") if z is not None else None
    bound = (1.0 - t.min_decisive_agreement) if within == "limit" else decisive_loss_line(t.min_decisive_agreement)
    if z is None:
        z = 0.0
    return decisive_outcome(acc["decisive_flips"], acc["decisive_samples"], est, t.min_decisive_agreement, confidence,
                            spread=spread, estimate_z=z, estimate_within=bound)[0] == OK


def _zero_bound(acc, t, z: float) -> bool:
    """With no decisive flip: the estimate + z standard errors within the limit (the gate passes no flip on the estimate
    alone)."""
    if not _judged(acc, t) or acc["decisive_flips"] or acc.get("decisive_flip_estimate_spread") is None:
        return True
    return acc["decisive_flip_estimate"] + z * acc["decisive_flip_estimate_spread"] <= 1.0 - t.min_decisive_agreement + 1e-12


ALTERNATIVES = {
    "decisive count only (before issue 43's last change)": lambda a, r, t, e: _base(r) and _dec_point(a, t),
    "count + expected-drop bound calibrated on the labels, as they are without (start of this change)": lambda a, r, t, e: (
        _base(r) and _dec_point(a, t) and _exp_standin(e, t, 1.0)),
    "count + flip-rate bound 90 % (from one flip) + the same expected drop": lambda a, r, t, e: (
        _base(r) and _dec_point(a, t) and _dec_bound(a, t, 0.9) and _exp_standin(e, t, 1.0)),
    "count + estimate at the loss line, no too-few outcome + expected drop, stand-in 2.5": lambda a, r, t, e: (
        _base(r) and _estimate(a, t, line_only=True) and _exp_standin(e, t, 2.5)),
    "this gate's decisive row + expected drop not judged without labels": lambda a, r, t, e: (
        _base(r) and _estimate(a, t) and _exp_standin(e, t, None)),
    "this gate's decisive row + expected drop, FP32's probabilities as they are without labels": lambda a, r, t, e: (
        _base(r) and _estimate(a, t) and _exp_standin(e, t, 1.0)),
    **{f"this gate's decisive row + expected drop, stand-in {s:g} without labels": (
        lambda s: lambda a, r, t, e: _base(r) and _estimate(a, t) and _exp_standin(e, t, s))(s) for s in STAND_INS},
    **{f"this gate's decisive row + expected drop, stand-in 2.5 without labels, {s:g} when the flips lean{' (this gate)' if s == 1.5 else ''}": (
        lambda s: lambda a, r, t, e: _base(r) and _estimate(a, t) and _exp_standin(e, t, s if e["lean"] else 2.5))(s)
       for s in (1.0, 1.5, 2.0)},
    "this gate's decisive row + expected-drop point value, stand-in 2.5": lambda a, r, t, e: (
        _base(r) and _estimate(a, t) and _exp_standin(e, t, 2.5, None)),
    "this gate, the flip-rate bound of the too-few outcome at 80 %": lambda a, r, t, e: (
        _base(r) and _estimate(a, t, confidence=0.8) and _exp_standin(e, t, 2.5)),
    "decisive row before the estimate's bound (the count's bound alone decides too few)": lambda a, r, t, e: (
        _base(r) and _estimate(a, t, z=None) and _exp_standin(e, t, 2.5)),
    "this gate, and no flip passes only with the estimate + 1.645 s.e. within the limit": lambda a, r, t, e: (
        _base(r) and _estimate(a, t) and _exp_standin(e, t, 2.5) and _zero_bound(a, t, 1.645)),
    **{f"one flip or more told by the estimate + {z:g} s.e. within the {w}": (
        lambda z, w: lambda a, r, t, e: _base(r) and _estimate(a, t, z=z, within=w) and _exp_standin(e, t, 2.5))(z, w)
       for w in ("limit", "loss line") for z in (1.282, 1.645, 2.326)},
}


def _count_over_limit_chance(ref: np.ndarray, pool: np.ndarray, size: int, truth: dict[str, Any], t) -> float:
    """The expected number of this build's runs whose decisive flip count exceeds what the limit allows on their decisive
    images by chance alone, were each decisive image flipped at the truth's rate: the runs no rule that keeps "a count
    over the limit never passes" can pass (the statistical floor of "too few images to tell" on a good build)."""
    from vitedge.validation.noise import MIN_DECISIVE, allowed_flips, binom_sf, fp32_margins

    rate, total = 1.0 - truth["decisive_agreement"], 0.0
    for k in range(len(pool) // size):
        n = int(np.sum(fp32_margins(ref[pool[k * size:(k + 1) * size]]) >= t.near_tie_margin))
        if n >= MIN_DECISIVE:
            total += binom_sf(allowed_flips(t.min_decisive_agreement, n) + 1, n, rate)
    return total


def judge_model(path: Path, t) -> list[dict[str, Any]]:
    """Every build of one model: its truth, and per subset size and labels/none the gate's verdict on each
    disjoint subset of the gate pool."""
    d = np.load(path, allow_pickle=False)
    labels, ref = d["labels"], d["ref"]
    perm = np.random.default_rng(0).permutation(len(labels))
    truth, pool = perm[:N_TRUTH], perm[N_TRUTH:N_TRUTH + N_POOL]
    names = [str(n) for n in d["names"]]
    builds = [(name, ref, d[f"got{i}"], {m: d[f"probe{m:+g}"] for m in (-0.25, 0.25)}) for i, name in enumerate(names)]
    builds.append((f"wrong --mean (+{MEAN_SHIFT:g}), select", d["wrong_ref"], d["wrong_got"],
                   {m: d[f"wrong_probe{m:+g}"] for m in (-0.25, 0.25)}))
    out = []
    for name, bref, got, probes in builds:
        row = {"model": path.stem, "build": name, "truth": truth_of(ref[truth], got[truth], labels[truth], t.max_top1_drop), "gates": {}}
        for size in SIZES:
            for labelled in (True, False):
                verdicts = []
                for k in range(len(pool) // size):
                    idx = pool[k * size:(k + 1) * size]
                    verdicts.append(gate_once(bref[idx], got[idx], labels[idx] if labelled else None,
                                              {m: p[idx] for m, p in probes.items()}, t))
                row["gates"][f"{size} {'labelled' if labelled else 'no labels'}"] = {
                    "passed": sum(v[0] for v in verdicts), "of": len(verdicts), "too_few": sum(v[3] for v in verdicts),
                    "count_over_limit_chance": _count_over_limit_chance(bref, pool, size, row["truth"], t),
                    "failing_rows": sorted({v[1] for v in verdicts if v[1]}),
                    "alternatives": {a: sum(v[2][a] for v in verdicts) for a in ALTERNATIVES if verdicts and a in verdicts[0][2]}}
        out.append(row)
        log(f"{path.stem} {name}: truth {row['truth']['kind']} (drop {row['truth']['drop']:+.2f}, decisive "
            f"{100 * row['truth']['decisive_agreement']:.2f}%); passed " + ", ".join(f"{g} {v['passed']}/{v['of']}" for g, v in row["gates"].items()))
    return out


def rates(rows: list[dict[str, Any]], alternative: str | None = None) -> dict[str, dict[str, list[int]]]:
    """Per gate (subset size, labels or none): [false passes, gate runs on bad builds], [false fails, runs on good
    builds] (a failing row that says the images are too few to tell counted apart: ``too_few_good``, ``too_few_bad``),
    and the wrong --mean builds apart (no FP32-parity statistic sees them without labels). ``alternative``: the
    verdicts of that rule (ALTERNATIVES; passes only: every run it does not pass counts as failed) instead of the gate's."""
    out: dict[str, dict[str, list[int]]] = {}
    for r in rows:
        for g, v in r["gates"].items():
            passed = v["passed"] if alternative is None else v["alternatives"][alternative]
            few = v.get("too_few", 0) if alternative is None else 0
            c = out.setdefault(g, {"false_pass": [0, 0], "false_fail": [0, 0], "too_few_good": [0, 0], "too_few_bad": [0, 0],
                                   "wrong_mean_pass": [0, 0], "count_floor_good": [0.0, 0]})
            if r["build"].startswith("wrong --mean"):
                c["wrong_mean_pass"][0] += passed
                c["wrong_mean_pass"][1] += v["of"]
            elif r["truth"]["kind"] == "bad":
                c["false_pass"][0] += passed
                c["false_pass"][1] += v["of"]
                c["too_few_bad"][0] += few
                c["too_few_bad"][1] += v["of"]
            elif r["truth"]["kind"] == "good":
                c["false_fail"][0] += v["of"] - passed - few
                c["false_fail"][1] += v["of"]
                c["too_few_good"][0] += few
                c["too_few_good"][1] += v["of"]
                c["count_floor_good"][0] += v.get("count_over_limit_chance", 0.0)
                c["count_floor_good"][1] += v["of"]
    return out


CHOSEN_ON = ("ashu-mha", "researchase-mnist", "kavishka-shallow")  # the models the gate's constants were chosen on


def alternatives_markdown(doc: dict[str, Any]) -> list[str]:
    """The alternative rules on the same runs, on the models the constants were chosen on and on the others apart."""
    rows = doc["rows"]
    chosen = [r for r in rows if r["model"] in CHOSEN_ON]
    others = [r for r in rows if r["model"] not in CHOSEN_ON]
    return (_alternatives_table(chosen, f"on the models the constants were chosen on ({', '.join(CHOSEN_ON)})")
            + _alternatives_table(others, f"on the models they were NOT chosen on ({', '.join(sorted({r['model'] for r in others}))})"))


def _alternatives_table(rows: list[dict[str, Any]], which: str) -> list[str]:
    """False passes and false fails of every alternative per subset size (labelled and unlabelled runs together), and
    which bad builds each passed."""
    if not rows or not next(iter(rows[0]["gates"].values())).get("alternatives"):
        return []
    sizes = sorted({int(g.split()[0]) for g in rows[0]["gates"]})
    lines = ["", f"## Alternative rules judged on the same runs, {which}", "",
             "Each rule keeps the labels' drop row and the agreement row (with the preprocessing probe) and replaces the "
             "decisive and expected-drop rows as named; a run a rule does not pass counts as failed (a too-few outcome "
             "too); *flip-rate bound c* fails a build whose decisive flips, when there is at least one, put the one-sided c "
             "upper Clopper-Pearson bound of the decisive flip rate over 1 % (the truth's line); *stand-in T*: without "
             "labels (or on labels FP32 is at chance on) FP32's probabilities priced at temperature T. Labelled and "
             "unlabelled runs together.", "",
             "| rule | " + " | ".join(f"{s}: false passes | {s}: good not passed" for s in sizes) + " | bad builds passed |",
             "|---|" + "---:|---:|" * len(sizes) + "---|"]
    for alt in next(iter(rows[0]["gates"].values()))["alternatives"]:
        r8 = rates(rows, alt)
        cells = []
        for s in sizes:
            fp = [sum(c["false_pass"][i] for g, c in r8.items() if int(g.split()[0]) == s) for i in (0, 1)]
            ff = [sum(c["false_fail"][i] for g, c in r8.items() if int(g.split()[0]) == s) for i in (0, 1)]
            cells += [_frac(fp), _frac(ff)]
        passed = sorted({f"{r['model']} {r['build']}" for r in rows if r["truth"]["kind"] == "bad"
                         and not r["build"].startswith("wrong --mean") and any(v["alternatives"][alt] for v in r["gates"].values())})
        lines.append(f"| {alt} | " + " | ".join(cells) + f" | {'; '.join(passed) or 'none'} |")
    return lines


def judge(work: Path, label: str, decisive_limit: float | None = None, reuse: bool = False) -> dict[str, Any]:
    """Judge every stored model with this checkout's gate at the onnx profile's thresholds; ``<work>/judged_<label>.json``.
    ``reuse``: a model's rows judged before under the same label (``<work>/rows_<label>_<model>.json``, written as each
    model is judged) are read back instead of judged again: only for the same code."""
    from vitedge.targets.profiles import load_profile

    t = load_profile("onnx").thresholds
    if decisive_limit is not None:
        t = dataclasses.replace(t, min_decisive_agreement=decisive_limit)
    rows = []
    for path in sorted(work.glob("*.npz")):
        if path.name.endswith(".tmp.npz") or path.name.startswith("confidence-"):
            continue
        kept = work / f"rows_{label}_{path.stem}.json"
        if reuse and kept.is_file():
            rows += json.loads(kept.read_text())
            continue
        judged = judge_model(path, t)
        kept.write_text(json.dumps(judged, default=float))
        rows += judged
    doc = {"label": label, "thresholds": t.to_dict(), "rows": rows, "rates": rates(rows)}
    (work / f"judged_{label}.json").write_text(json.dumps(doc, indent=1, default=float))
    return doc


# --------------------------------------------------------------------------- report


def _frac(c: list[int]) -> str:
    return f"{c[0]} of {c[1]}" + (f" ({100 * c[0] / c[1]:.1f} %)" if c[1] else "")


def markdown(after: dict[str, Any], before: dict[str, Any] | None, header: str) -> str:
    lines = [header, "", "## False passes and false fails, per gate run (one run = one subset of the gate pool)", "",
             "| gate | labels | false passes (truth bad) | false fails (truth good) | too few images to tell (truth good) | "
             "too few images to tell (truth bad) | wrong `--mean` passed | count over the limit by chance alone (truth good, expected) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for label, doc in (("before", before), ("this gate", after)):
        if doc is None:
            continue
        for g, c in doc["rates"].items():
            few = [_frac(c[k]) if k in c else "- (no such outcome)" for k in ("too_few_good", "too_few_bad")]
            floor = c.get("count_floor_good")
            floor_text = f"{floor[0]:.1f} of {floor[1]} ({100 * floor[0] / floor[1]:.1f} %)" if floor and floor[1] else "-"
            lines.append(f"| {label} | {g} | {_frac(c['false_pass'])} | {_frac(c['false_fail'])} | {few[0]} | {few[1]} | "
                         f"{_frac(c['wrong_mean_pass'])} | {floor_text} |")
    passed_bad = [r for r in after["rows"] if r["truth"]["kind"] == "bad" and not r["build"].startswith("wrong --mean")
                  and any(v["passed"] for v in r["gates"].values())]
    lines += ["", "Builds whose truth is bad that this gate passed on some subset: " + ("; ".join(
        f"{r['model']} {r['build']} (truth drop {r['truth']['drop']:+.2f}, decisive {100 * r['truth']['decisive_agreement']:.2f} %: "
        + ", ".join(f"{g} {v['passed']}/{v['of']}" for g, v in r["gates"].items() if v["passed"]) + ")" for r in passed_bad) or "none") + "."]
    lines += alternatives_markdown(after)
    lines += ["", "## Every build: its truth and the gate's verdicts (passed / runs)", "",
              f"Truth on the {N_TRUTH:,} held-out images against FP32 with the model's right mean: top-1 drop (points), agreement "
              "on FP32's decisive images, overall agreement; *bad* = drop > limit + 0.5 or decisive agreement < 99 %, *good* = "
              "drop <= limit and decisive agreement >= 99.5 %.", ""]
    gates = list(after["rates"])
    lines += ["| model | build | truth drop | decisive agr. | agreement | truth | " + " | ".join(gates) + " |",
              "|---|---|---:|---:|---:|---|" + "---:|" * len(gates)]
    old = {(r["model"], r["build"]): r for r in (before or {}).get("rows", [])}
    for r in after["rows"]:
        tr = r["truth"]
        was = old.get((r["model"], r["build"]))
        cells = []
        for g in gates:
            v = r["gates"][g]
            cell = f"{v['passed']}/{v['of']}" + (f" ({v['too_few']} too few)" if v.get("too_few") else "")
            if was is not None and g in was["gates"] and was["gates"][g]["passed"] != v["passed"]:
                cell += f" (was {was['gates'][g]['passed']})"
            cells.append(cell)
        lines.append(f"| {r['model']} | {r['build']} | {tr['drop']:+.2f} | {100 * tr['decisive_agreement']:.2f} % | "
                     f"{100 * tr['agreement']:.2f} % | {tr['kind']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def confidence_markdown(work: Path) -> str:
    """The label-free normalisation check (``noise.confidence_probe``) on every corpus model whose FP32 outputs are
    stored: its alarms with the model's right mean (false alarms) and, where stored, with the wrong --mean."""
    path = work / "confidence_check.json"
    if not path.is_file():
        return ""
    rows = json.loads(path.read_text())
    lines = ["", "## Without labels: FP32's confidence with the mean moved (the label-free normalisation check)", "",
             f"Per model, on disjoint subsets of its images: how often a +-0.25 mean shift raises FP32's mean top-1 probability by "
             f"more than {CONFIDENCE_Z:g} standard errors of the paired per-image differences (`noise.confidence_probe`), with "
             "the model's RIGHT mean (a false alarm) and with the wrong `--mean` (+0.5) where that build is stored; the largest "
             "z seen in brackets.", "",
             "| model | images | " + " | ".join(f"right mean, {s}" for s in SIZES) + " | " + " | ".join(f"wrong mean, {s}" for s in SIZES) + " |",
             "|---|---:|" + "---:|" * (2 * len(SIZES))]
    for r in rows:
        cells = []
        for which in ("right", "wrong"):
            for size in SIZES:
                c = r.get(f"{which} {size}")
                cells.append(f"{c['alarms']} of {c['of']} ({c['max_z']:+.1f})" if c and c["of"] else "-")
        lines.append(f"| {r['model']} | {r['images']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_results(work: Path) -> None:
    from vitedge import __version__
    from vitedge.core.cpu import read_cpu

    cpu = read_cpu()
    after = json.loads((work / "judged_after.json").read_text())
    before_path = work / "judged_before.json"
    before = json.loads(before_path.read_text()) if before_path.is_file() else None
    import onnxruntime

    models = sorted({r["model"] for r in after["rows"]})
    t = after["thresholds"]
    header = (f"# The accuracy gate against the truth (issue 43)\n\nGenerated by `python benchmarks/gate_truth.py` on "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; vitedge {__version__}, ONNX Runtime {onnxruntime.__version__}; "
              f"CPU {cpu.model} ({cpu.isa}), shared with other jobs while it ran. Models ({len(models)} of the {len(MODELS)} corpus "
              f"models with 10,000 test images): {', '.join(models)}. Per model: {N_CALIB} calibration images, truth on {N_TRUTH:,} "
              f"others, a gate pool of the remaining 3,000-5,000 cut into disjoint subsets of {', '.join(str(s) for s in SIZES)} (each "
              f"subset gated with its labels and without). Thresholds: the onnx profile's (max_top1_drop {t['max_top1_drop']:g} points, "
              f"min_agreement {t['min_agreement']:g}, min_decisive_agreement {t.get('min_decisive_agreement')}, near_tie_margin "
              f"{t['near_tie_margin']:g}, drop_confidence {t['drop_confidence']:g}, max_expected_drop "
              f"{t['max_top1_drop'] + 0.5:g} points). *Before* (when present) is the gate this one was changed from (`--gate-from`), judged on the "
              "same stored logits; the alternative rules below, the one this change started from among them, are judged on the same "
              "runs in the same pass; *too few images to tell* counts the runs whose only failing row is the decisive row's own "
              "outcome (a failure of the gate, counted apart from the false fails); *truth bad* compares drops with a 1e-9 tolerance (28 of 4,000 images is 0.7 points, not more). "
              f"Load average while judging: {' '.join(Path('/proc/loadavg').read_text().split()[:3]) if Path('/proc/loadavg').is_file() else 'unknown'}.")
    text = markdown(after, before, header) + confidence_markdown(work)
    stem = f"gate_truth_{cpu.isa.split(' ')[0]}"  # one record per kind of CPU: avx2, avx512-vnni, amx (as build_speed's)
    (RESULTS / f"{stem}.md").write_text(text)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"cpu": cpu.isa, "cpu_model": cpu.model, "models": models, "after": after,
                                                     "before": before}, indent=1, default=float))
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--corpus", type=Path, default=REPO / "benchmarks" / "corpus", help="the corpus folder (manifest.toml, models.py)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/vitedge-gate-truth"), help="writable: splits, graphs, stored logits")
    ap.add_argument("--outputs-only", action="store_true", help="build and run the variants; judge nothing")
    ap.add_argument("--judge-only", action="store_true", help="judge the stored logits with the vitedge on PYTHONPATH")
    ap.add_argument("--label", default="after", help="the name of this judgement (before: the gate it is compared with)")
    ap.add_argument("--decisive-limit", type=float, help="judge with this min_decisive_agreement (default: the profile's)")
    ap.add_argument("--reuse", action="store_true", help="read back each model's rows judged before under the same label")
    ap.add_argument("--confidence-models", help="only run FP32 (right mean, and moved +-0.25) on these models for the "
                    "label-free normalisation check's false alarms, then judge that check")
    ap.add_argument("--gate-from", type=Path, help="judge with the vitedge of this checkout (e.g. main before the change, --label before)")
    args = ap.parse_args()
    if args.gate_from:
        sys.path.insert(0, str(args.gate_from.resolve()))
    args.work.mkdir(parents=True, exist_ok=True)
    if args.confidence_models is not None:
        for model_id in [m for m in args.confidence_models.split(",") if m]:
            try:
                confidence_outputs(model_id, args.corpus, args.work)
                log(f"{model_id}: FP32 outputs for the label-free normalisation check")
            except Exception as err:  # a model that does not load is reported, not fatal
                log(f"{model_id}: {type(err).__name__}: {str(err).splitlines()[0][:300]}")
        for row in confidence_check(args.work):
            log(json.dumps(row))
        return
    if not args.judge_only:
        for model_id in args.models.split(","):
            t0 = time.perf_counter()
            try:
                run_outputs(model_id, args.corpus, args.work)
                log(f"{model_id}: outputs in {time.perf_counter() - t0:.0f} s")
            except Exception as err:  # a model that does not load is reported, not fatal
                log(f"{model_id}: {type(err).__name__}: {str(err).splitlines()[0][:300]}")
    if args.outputs_only:
        return
    judge(args.work, args.label, args.decisive_limit, args.reuse)
    if args.label == "after":
        write_results(args.work)


if __name__ == "__main__":
    main()
