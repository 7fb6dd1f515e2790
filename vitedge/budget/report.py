"""The accuracy budget in words and pictures, from its manifest record (``BudgetResult.to_dict()``):
the one-line summary, the build report's section, the sensitivity plot, and writing both into
a bundle. Works on the stored record only, so it reads a bundle's manifest as well as a fresh run.

Heavy imports (matplotlib) happen inside the functions.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from vitedge.files.atomic import atomic_write_path
from vitedge.bundle.manifest import Manifest


def describe_record(rec: dict[str, Any]) -> str:
    """One line for logs and summaries, from ``BudgetResult.to_dict()`` (as stored in the manifest)."""
    if not rec or rec.get("status") == "off":
        return "accuracy budget: off (--no-fallback)"
    n, used, cap = len(rec.get("returned") or []), rec.get("evaluations_used", 0), rec.get("max_evals")
    sens = rec.get("sensitivity") or {}
    how = f"{used}/{cap} evaluations, {rec.get('seconds', 0):.1f} s"
    if sens:
        how += f"; sensitivities {'reused from cache' if sens.get('cache') == 'reused' else 'computed'} ({sens.get('evaluations', 0)} layer evaluations)"
    if rec["status"] == "int8":
        return f"accuracy budget met by the full INT8 graph, no layer returned to float ({how})"
    if rec["status"] == "fallback":
        lat = rec.get("latency") or {}
        cost = ""
        if lat.get("int8_ms") and lat.get("chosen_ms"):
            cost = f"; cost {lat['chosen_ms'] - lat['int8_ms']:+.3f} ms/image on ORT (INT8 {lat['int8_ms']:.3f} -> {lat['chosen_ms']:.3f} ms, FP32 {lat['fp32_ms']:.3f} ms)"
        return f"accuracy budget met with {n} of {rec.get('candidates')} INT8 layers returned to float ({how}){cost}"
    return f"accuracy budget NOT met: {rec.get('reason', '')} ({how})"


def budget_criterion(t: dict[str, Any], output_kind: str | None) -> str:
    """The budget's accuracy criterion in words: the build gate's accuracy rows for this kind of model."""
    if output_kind == "embedding":
        text = (f"INT8 vs FP32 embedding cosine, mean >= {t.get('min_embedding_cosine')} and "
                f"p{float(t.get('embedding_cosine_percentile', 5)):g} >= {t.get('min_embedding_cosine_low')}")
        if t.get("min_nn_agreement") is not None:
            text += f", nearest-neighbour agreement >= {100 * float(t['min_nn_agreement']):.2f}%"
        return text
    return (f"top-1 drop <= {t.get('max_top1_drop')} points (when labelled), top-1 agreement >= "
            f"{100 * float(t.get('min_agreement', 0)):.2f}%")


def budget_markdown(rec: dict[str, Any], *, heading: str = "##") -> str:
    """The build report's section on the budget (from the manifest record)."""
    if not rec:
        return ""
    lines = [f"{heading} Accuracy budget", "", describe_record(rec), ""]
    if rec.get("status") == "off":
        return "\n".join(lines)
    t = rec.get("thresholds") or {}
    data = rec.get("evaluated_on") or {}
    lines += [f"Budget: {budget_criterion(t, data.get('output_kind'))}; evaluated on {data.get('items', '?')} items of `{data.get('path', '?')}`"
              f" ({'labelled' if data.get('labeled') else 'no labels: agreement only'}) with {rec.get('runtime')}. "
              f"Search: {rec.get('search')}.", ""]
    costs = [c for c in rec.get("layer_costs") or [] if c["why"] != "config"]
    by_config = [c for c in rec.get("layer_costs") or [] if c["why"] == "config"]
    if by_config:
        kinds = sorted({c["kind"] for c in by_config})
        lines += [f"{len(by_config)} layer(s) float by the quantizer's configuration ({', '.join(kinds)}); not the budget's doing.", ""]
    if costs:
        lines += ["| layer kept in float | kind | why | sensitivity rank | float us | INT8 us | cost us/image |",
                  "|---|---|---|---|---|---|---|"]
        for c in costs:
            f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
            lines.append(f"| `{c['name']}` | {c['kind']} | {c['why']} | {c.get('rank') or '-'} | {f(c.get('float_us'))} | "
                         f"{f(c.get('int8_us'))} | {f(c.get('cost_us'))} |")
        lines += ["", "Per-layer cost: that node's kernel time in ONNX Runtime's profiler (median, batch 1), float in the "
                  "shipped graph minus INT8 in the full INT8 graph; activation-quantize nodes are counted in the end-to-end "
                  "figure only.", ""]
    lat = rec.get("latency")
    if lat:
        lines += [f"End-to-end, {lat.get('runtime')}, batch 1 (p50, interleaved): FP32 {lat['fp32_ms']:.3f} ms, full INT8 "
                  f"{lat['int8_ms']:.3f} ms, shipped graph {lat['chosen_ms']:.3f} ms: {lat['chosen_speedup']:.2f}x FP32 "
                  f"(full INT8 {lat['int8_speedup']:.2f}x).", ""]
    evals = rec.get("evaluations") or []
    if evals:
        embedding = data.get("output_kind") == "embedding"
        head = "embedding cosine mean | embedding cosine, low percentile" if embedding else "top-1 drop (pt) | agreement"
        lines += [f"| # | step | float layers | {head} | verdict |", "|---|---|---|---|---|---|"]
        for e in evals:
            a = e["accuracy"]
            drop = "-" if a.get("top1_drop_points") is None else f"{a['top1_drop_points']:.2f}"
            agree = "-" if a.get("top1_agreement") is None else f"{100 * a['top1_agreement']:.2f}%"
            if embedding:
                drop, agree = (("-" if a.get(k) is None else f"{a[k]:.5f}") for k in ("embedding_cosine_mean", "embedding_cosine_low"))
            verdict = "pass" if e["passed"] else "miss" if not a.get("stopped_early") else f"miss (stopped after {a.get('samples')} items)"
            lines.append(f"| {e['index']} | {e['step']} | {e['float_layers']} | {drop} | {agree} | {verdict} |")
        lines.append("")
    return "\n".join(lines)


def budget_plot(rec: dict[str, Any], title: str, top: int = 40) -> bytes | None:
    """Per-layer sensitivity bars, the layers the budget returned to float marked; None without
    matplotlib or without a ranking."""
    sens = (rec or {}).get("sensitivity") or {}
    layers = sens.get("layers") or []
    if not layers:
        return None
    try:
        import matplotlib
    except ImportError:
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = sens["metric"]
    returned = set(rec.get("returned") or [])
    shown = layers[:top][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.22 * len(shown) + 1.6))
    colours = ["#d62728" if r["name"] in returned else "#1f77b4" for r in shown]
    ax.barh(range(len(shown)), [max(r[metric], 1e-12) for r in shown], color=colours)
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([("[float] " if r["name"] in returned else "") + r["name"][-48:] for r in shown], fontsize=7)
    ax.set_xscale("log")
    floor = (sens.get("baseline") or {}).get(metric)
    if floor:
        ax.axvline(floor, color="black", ls=":", lw=1)
    ax.set_xlabel(f"{metric} vs FP32 with only this layer INT8")
    handles = [plt.Rectangle((0, 0), 1, 1, color="#d62728"), plt.Rectangle((0, 0), 1, 1, color="#1f77b4")]
    ax.legend(handles, [f"returned to float by the budget ({len(returned)})", "INT8"], fontsize=7, loc="lower right")
    pinned = rec.get("pinned") or []
    ax.set_title(title + (f"\n{len(pinned)} layer(s) pinned float by --keep-float (not ranked)" if pinned else ""), fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


BUDGET_NOT_RUN = "Not run: this bundle records no accuracy budget (it was built without one)."


def write_budget_report(bundle: Path, manifest: Manifest, *, note: str | None = None) -> None:
    """The budget's section of report.md and its plot (report/budget.png: ranking, float layers marked).
    A bundle without a budget record says so; ``note`` is a line on where the budget ran."""

    rec = manifest.quantization.budget
    section = budget_markdown(rec) if rec else f"## Accuracy budget\n\n{BUDGET_NOT_RUN}"
    if note:
        heading, _, body = section.partition("\n\n")
        section = f"{heading}\n\n{note}\n\n{body}"
    report = bundle / "report.md"
    text = report.read_text() if report.is_file() else ""
    with atomic_write_path(report) as tmp:
        tmp.write_text(text.rstrip("\n") + "\n\n" + section + "\n")
    png = budget_plot(rec, f"accuracy budget, {manifest.target.name}") if rec else None
    if png:
        with atomic_write_path(bundle / "report" / "budget.png") as tmp:
            tmp.write_bytes(png)
