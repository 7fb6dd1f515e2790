"""Issue 28 item 3: method select's first look, checked on ViTs other people trained.

Every candidate of method ``select`` is scored on the first ``SELECT_FIRST_LOOK`` (8 since 2026-11-26, 16 before) calibration
images; only entropy (the first candidate) and the candidates ``SELECT_CONTEND_RATIO`` (3) times closer
to FP32 there go on to all 64 (vitedge/quantize/select.py). This script scores EVERY candidate on all 64
images (the first look switched off in-process), keeps the per-image errors, and replays both rules on
them: the old one (everyone on 64) and the first-look one, for several first-look sizes and ratios. It
prints, per model, the largest ratio entropy/candidate on the first look and both choices.

Models: the 8 corpus ViTs (benchmarks/corpus; their cache must be filled: ``python
benchmarks/corpus/cache.py check``), calibrated as benchmarks/corpus.py builds them (the seeded split of
300 calibration images, each model's mean/std, crop 1.0), and the bundled digits, post-norm and
low-confidence digits ViTs on calibration/digits/calib. Run from the repository root::

    python benchmarks/select_first_look.py [--models ID,...]

Writes benchmarks/results/select_first_look.md and .json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "benchmarks" / "corpus"))
RESULTS = REPO / "benchmarks" / "results"
LOOKS = (8, 16, 32)
RATIOS = (3.0,)


def jobs() -> list[tuple[str, list[str]]]:
    import cache  # benchmarks/corpus/cache.py
    import corpus

    manifest = cache.load_manifest()
    out = []
    for m in manifest.models:
        split = cache.make_split(manifest.datasets[m.dataset], 300, 1000, 0)
        args = [str(m.path), "--model-class", f"{corpus.MODELS_PY}:{m.model_class}", "--calib", str(split / "calib"),
                "--mean", *map(str, m.mean), "--std", *map(str, m.std), "--crop-pct", "1.0"]
        if m.needs_input_size:
            args += ["--input-size", str(m.size), str(m.size)]
        out.append((m.id, args))
    kwargs = json.loads((REPO / "examples" / "postnorm_vit.json").read_text())["model_kwargs"]
    digits = str(REPO / "calibration" / "digits" / "calib")
    out += [("digits", [str(REPO / "examples" / "digits_vit.pt"), "--calib", digits]),
            ("postnorm", [str(REPO / "examples" / "postnorm_vit.pt"), "--model-class", f"{REPO / 'examples' / 'postnorm_vit.py'}:PostNormViT",
                          "--model-kwargs", json.dumps(kwargs), "--calib", digits]),
            ("lowconf", [str(REPO / "examples" / "lowconf_digits_vit.pt"), "--calib", digits])]
    return out


def per_image_errors(args: list[str]) -> dict[str, list[float]]:
    """Every candidate's per-image error on all the images select keeps (the first look switched off)."""
    from vitedge.cli import entry as cli
    from vitedge.quantize import select

    seen: dict[str, list[float]] = {}
    decide = select._decide

    def capture(calibration, scorer, same, first):
        seen.update({n: scorer.errors[same[n] or n].tolist() for n in calibration.variants})
        return decide(calibration, scorer, same, first)

    select.SELECT_FIRST_LOOK, select._decide = 10**9, capture
    try:
        with tempfile.TemporaryDirectory() as d:
            try:
                cli.main(["calibrate", *args, "--cache-dir", d, "-q"])
            except SystemExit as err:
                if err.code:
                    raise RuntimeError(f"vitedge calibrate exited {err.code}") from None
    finally:
        select.SELECT_FIRST_LOOK, select._decide = 16, decide
    return seen


def choice(errors: dict[str, list[float]], n: int, names: list[str], plain: bool = False) -> tuple[str, float, float]:
    """The rule (10x at t >= 2 over ``first``: the t of the per-image log distances, or with ``plain`` of the
    distances themselves, the rule before issue 28) on the first ``n`` images of ``names``: (choice, ratio, t)."""
    from vitedge.quantize.select import SELECT_MIN_RATIO, SELECT_MIN_T, log_ratio_t, paired_t

    first = next(iter(errors))
    err = {k: float(np.mean(errors[k][:n])) for k in names}
    best = min(names, key=lambda k: (err[k], list(errors).index(k)))
    t = (paired_t if plain else log_ratio_t)(np.asarray(errors[first][:n]), np.asarray(errors[best][:n]))
    ok = best == first or (t >= SELECT_MIN_T and err[best] * SELECT_MIN_RATIO <= err[first])
    return (best if ok else first), err[first] / max(err[best], 1e-300), t


def replay(errors: dict[str, list[float]], look: int, ratio: float) -> dict[str, object]:
    first = next(iter(errors))
    total = len(errors[first])
    err = {k: float(np.mean(v[:look])) for k, v in errors.items()}
    r = {k: err[first] / max(err[k], 1e-300) for k in errors if k != first}
    contenders = [k for k in r if r[k] >= ratio] if look < total else []
    chosen = choice(errors, total, [first, *contenders])[0] if contenders else choice(errors, min(look, total), list(errors))[0]
    runs = len(errors) * min(look, total) + ((1 + len(contenders)) * (total - look) if contenders else 0)
    return {"look": look, "ratio": ratio, "max_ratio": max(r.values()), "contenders": contenders, "chosen": chosen,
            "image_runs": runs, "image_runs_all_on_64": len(errors) * total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="")
    args = ap.parse_args()
    only = [m for m in args.models.split(",") if m]
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "models": {}}
    for mid, cli_args in jobs():
        if only and mid not in only:
            continue
        print(f"== {mid}", flush=True)
        errors = per_image_errors(cli_args)
        n = len(next(iter(errors.values())))
        full, r, t = choice(errors, n, list(errors), plain=True)
        now, _, log_t = choice(errors, n, list(errors))
        res["models"][mid] = {"errors": errors, "all_on_64": {"chosen": full, "ratio": r, "t": t, "log_t": log_t, "chosen_log_t": now},
                              "first_look": [replay(errors, look, ratio) for look in LOOKS for ratio in RATIOS]}
        print(f"   all on 64: {full} (entropy/best {r:.1f}x, t {t:.2f}); "
              + "; ".join(f"look {x['look']}: max {x['max_ratio']:.1f}x -> {x['chosen']}" for x in res["models"][mid]["first_look"]), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "select_first_look.json").write_text(json.dumps(res) + "\n")
    (RESULTS / "select_first_look.md").write_text(markdown(res))
    print(markdown(res))
    return 0


def markdown(res: dict) -> str:
    lines = ["# Method select's first look, replayed on every candidate's per-image scores (issue 28 item 3)", "",
             f"Measured {res['date']} by `python benchmarks/select_first_look.py`: every candidate scored on all 64 images, "
             "then the rule replayed: everyone on 64 (before) and the first look (every candidate on the first N images, "
             "entropy and the candidates 3x closer there on all 64). The choice does not depend on the CPU's ISA beyond "
             "float noise; the image-runs column is what select costs.", "",
             "Columns: the rule before issue 28 (everyone on 64, plain paired t); the same with the t of the per-image log "
             "distances (select.log_ratio_t, the rule now); then the first look (entropy/candidate ratio of means on its "
             "images) with the log-t rule, and whether it chooses what the log-t rule on all 64 chooses.", "",
             "| model | before: choice (entropy/best, plain t) | all on 64, log t: choice (t) | first look | largest entropy/candidate ratio there | contenders | choice | same | image runs (of all-on-64) |",
             "|---|---|---|---:|---:|---:|---|---|---|"]
    for mid, m in res["models"].items():
        a = m["all_on_64"]
        for x in m["first_look"]:
            lines.append(f"| {mid} | {a['chosen']} ({a['ratio']:.1f}x, t {a['t']:.2f}) | {a['chosen_log_t']} (t {a['log_t']:.2f}) | "
                         f"{x['look']} | {x['max_ratio']:.1f}x | "
                         f"{len(x['contenders'])} | {x['chosen']} | {'yes' if x['chosen'] == a['chosen_log_t'] else '**no**'} | "
                         f"{x['image_runs']} ({x['image_runs_all_on_64']}) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
