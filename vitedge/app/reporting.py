"""The reports written into every bundle, by `vitedge build` and `vitedge engine` alike:
report.md (the human-readable overview and its accuracy-budget section) and report/ (the
validation's files).

The validation part is rendered by vitedge.validation.report, the same Markdown as
``report/summary.md`` and `vitedge validate`'s job summary.
"""

from __future__ import annotations

from pathlib import Path

from vitedge.backends import get_backend
from vitedge.budget import write_budget_report
from vitedge.budget.speed import budget_not_met
from vitedge.core.errors import UsageError
from vitedge.files.atomic import atomic_write_path
from vitedge.bundle.manifest import Manifest
from vitedge.bundle.sections import QuantizationSection
from vitedge.targets.table import (
    cpu_profile_gates,
    int8_not_faster_sentence,
    targets_to_try,
)
from vitedge.validation.document import ValidationReport
from vitedge.validation.normalisation import notice_text
from vitedge.validation.report import SCHEMA, gate_table, validation_markdown


def _fp32_graph_note(record: object) -> str:
    """What the bundle's FP32 ONNX graph is (``artifacts.fp32_graph``), for report.md; nothing for an earlier bundle."""
    if not isinstance(record, dict) or record.get("form") != "fused":
        return ""
    return (f" (the exported graph {str(record.get('source_sha256', ''))[:12]} with q/k/v merged and attention fused, "
            "as in the INT8 graph)")


def build_report_markdown(manifest: Manifest) -> str:

    m = manifest
    spec = m.model.spec
    lines = [
        f"# vitedge bundle: {m.target.name} ({m.target.backend}, {m.target.precision})",
        "",
        f"- model: `{m.model.source}` ({spec['family']} {spec['variant']}, {spec['image_size'][0]}x{spec['image_size'][1]})",
        f"- artifact: `{m.artifacts.model}`" + ("" if m.artifacts.is_built else " (not built here: finish it on the device)")
        + (" (the FP32 reference itself: the whole model stayed float, one graph in the bundle)" if m.artifacts.single_graph is True else ""),
        f"- FP32 reference: `{m.artifacts.reference}`" + _fp32_graph_note(m.artifacts.fp32_graph),
        f"- input: `{m.input.name}` {m.input.format} {m.input.shape}",
        f"- calibration: {m.calibration.get('summary_line', '')}",
        f"- quantization: {m.quantization.summary_line or ''}",
    ]
    not_met = budget_not_met(m)
    if not_met:
        lines.append(f"- **FAILED: {not_met}**")
    executed = executed_int8_line(m.backend_info.get("int8_layers"), m.target.backend or "")
    if executed:
        lines.append(f"- {executed}")
    if m.quantization.weight_range:
        lines.append(f"- INT8 weight range: {m.quantization.weight_range} (correct on: "
                     f"{'every CPU' if m.quantization.cpu_requirement == 'any-x86' else 'x86 CPUs with VNNI/AMX, Arm, GPUs'})")
    pre = spec.get("preprocess") or {}
    guessed = notice_text((spec.get("sources") or {}).get("preprocess"), pre.get("mean", ()), pre.get("std", ()), pre.get("channels"))
    if guessed:
        lines.append(f"- **{guessed[0].upper() + guessed[1:]}**")
    backend_name = str(m.target.backend or "")
    speedup = ValidationReport.from_json(m.validation).speedup if m.validation else None
    # one bundle's report: no other target's timing is at hand, so it names what to try, claiming nothing
    not_faster = int8_not_faster_sentence(m.target.name, backend_name, speedup if isinstance(speedup, (int, float)) else None,
                                          to_try=targets_to_try(backend_name, cpu_profile_gates(), exclude=(m.target.name,)))
    if not_faster:
        lines.append(f"- {not_faster}")
    lines += [f"- {line}" for line in (kind_line(m.quantization), payoff_line(m.quantization), layer_step_line(m.quantization),
                                       still_slower_line(m.backend_info, speedup)) if line]
    lines.append("")
    lines += _backend_lines(m)
    v = m.validation
    if v and v.get("schema") == SCHEMA:
        lines += [validation_markdown(ValidationReport.from_json(v)), "",
                  "Reports: `report/validation.json` (schema vitedge.validation/1), `report/summary.md`, `report/junit.xml`. "
                  "Re-check this bundle with `vitedge validate BUNDLE --data LABELLED_SET`.", ""]
    elif v:  # a validation recorded by code that does not write the versioned document
        rows = [dict(r, status=r.get("status") or ("pass" if r.get("passed") else "fail"), unit=r.get("unit", "")) for r in v.get("gate", [])]
        lines += ["## Gate", ""] + gate_table(rows) + [""]
    else:
        lines += ["Not validated here: " + str(m.backend_info.get("next_step", "the runtime is not available on the build machine")), ""]
    return "\n".join(lines)


def _backend_lines(m) -> list[str]:

    try:
        backend = get_backend(str(m.target.backend))
    except (UsageError, ImportError):  # unknown or not importable here: the report is still written, without it
        return []
    return backend.report_lines(m.backend_info or {})


def executed_int8_line(counts, backend: str) -> str | None:
    """What the runtime itself reports running in INT8 (backend_info.int8_layers), in one line."""
    if not isinstance(counts, dict) or "int8" not in counts:
        return None
    if counts.get("int8") is None:
        return f"INT8 layers executed by {backend}: not known ({counts.get('source', 'no account')})"
    total = (counts.get("int8") or 0) + (counts.get("other") or 0)
    kinds = counts.get("by_type") or {}
    detail = ", ".join(f"{k} {v['count'] if isinstance(v, dict) else v}" for k, v in sorted(kinds.items()))
    return (f"INT8 layers executed by {backend} (its {counts.get('source', 'own account')}): {counts['int8']} of {total} "
            f"matrix layers" + (f" ({detail})" if detail else ""))


def payoff_line(quantization: QuantizationSection) -> str | None:
    """The layers the target kept float because INT8 did not pay there, and why, in one line."""
    rec = quantization.int8_payoff or {}
    kept = rec.get("kept_float") or []
    if not kept:
        return None
    shown = "; ".join(f"`{k['name']}` ({k['why']})" for k in kept[:6]) + ("; ..." if len(kept) > 6 else "")
    where = (f"for {rec['cpu_kind']} CPUs" if rec.get("cpu_kind") and rec.get("cpu_kind") != rec.get("built_on")
             else f"on {rec.get('cpu', 'this CPU')}")
    return f"kept float where INT8 does not pay (decided {where}): {shown}"


def kind_line(quantization: QuantizationSection) -> str | None:
    """For a bundle built for another CPU kind than the build machine's: where its INT8 payoff came from, and that
    no time in its reports is of that kind, in one line."""
    rec = quantization.int8_payoff or {}
    kind, host = rec.get("cpu_kind"), rec.get("built_on")
    if not kind or not host or kind == host:
        return None
    return (f"bundle for {kind} CPUs, built on an {host} CPU: its INT8 payoff was decided by {rec.get('decided_by', 'nothing')}; "
            f"its speed is not timed on {kind} (every time in its reports is the {host} build machine's)")


def layer_step_line(quantization: QuantizationSection) -> str | None:
    """The onnx target's per-layer step when it found layers slower than FP32 but did not keep them float (the graph
    with them float was not faster end to end), in one line; when it kept them float, ``payoff_line`` names them."""
    rec = (quantization.int8_payoff or {}).get("layers")
    if not isinstance(rec, dict) or rec.get("taken") or not rec.get("candidates"):
        return None
    n = sum(len(c.get("layers") or []) for c in rec["candidates"])
    cur, cand = rec.get("current_over_fp32") or {}, rec.get("candidate_over_fp32") or {}
    figures = lambda r: "/".join(f"{r[b]:.2f}" for b in sorted(r, key=int))
    return (f"INT8 kept per layer (decided on {rec.get('timed_on', 'this CPU')}): {n} INT8 layer(s) timed slower than their "
            f"FP32 layer by ONNX Runtime's profile, but the graph with them float was not faster beyond the noise "
            f"(INT8/FP32 b{'/b'.join(sorted(cur, key=int))}: {figures(cur)} as shipped, {figures(cand)} with them float; "
            f"FP32-vs-FP32 control moved by {float(rec.get('control_noise') or 0):.0%})")


def still_slower_line(info: dict, speedup: object) -> str | None:
    """For a bundle whose INT8 still ran slower than FP32: what the build tried to make it faster, in one line,
    with each INT8/FP32 timing step it took and the one it ended on (``int8_payoff``). When that end was the whole
    model in float, the shipped graph is the FP32 one and the line says the gap is not INT8's."""
    if not isinstance(speedup, (int, float)) or speedup >= 1.0 or not info:
        return None
    tried = []
    if info.get("attention_fusion"):
        a = info["attention_fusion"]
        tried.append(f"attention fusion {a.get('fused')} of {a.get('candidates')} cores")
    if info.get("gemm_bias_fusion"):
        g = info["gemm_bias_fusion"]
        tried.append(f"GEMM bias folding {g.get('folded')} of {g.get('gemms')}")
    tried.append("sibling q/k/v layers merged into one GEMM (quantization)")
    rec = info.get("int8_payoff")
    if not isinstance(rec, dict):
        return f"INT8 still ran slower than FP32 here ({speedup:.2f}x FP32 speed at batch 1) after: " + ", ".join(tried)
    timed = rec.get("timed") if isinstance(rec.get("timed"), dict) else rec  # onnx: its timing record; intel-cpu: itself
    steps = timed.get("steps") or []
    whole = bool(timed.get("whole_model_float") or rec.get("whole_model_float"))
    kept = rec.get("kept_float") or []
    by_runtime = [k for k in kept if "runs it as a float" in str(k.get("why", ""))]
    if by_runtime and not whole:
        tried.append(f"{len(by_runtime)} layer(s) the runtime ran as float kernels kept float")
    layers = rec.get("layers") if isinstance(rec.get("layers"), dict) else {}
    per_layer = [k for k in kept if "slower than its FP32 layer" in str(k.get("why", ""))]
    floated = layers.get("floated", sum(len(c.get("layers") or []) for c in layers.get("candidates") or []))
    if layers.get("candidates") and not layers.get("taken"):
        tried.append(f"{floated} layer(s) slower per layer timed float (the graph was not faster: not taken)")
    elif layers.get("taken") and (whole or not per_layer):  # the whole model's record replaced the per-layer one
        tried.append(f"{floated} layer(s) slower per layer kept float")
    elif per_layer and not whole:
        tried.append(f"{len(per_layer)} layer(s) slower per layer kept float")
    if steps:
        tried.append("timed INT8/FP32 CPU time on " + str(timed.get("timed_on") or rec.get("cpu") or "this CPU") + " (b"
                     + "/b".join(sorted({b for s in steps for b in (s.get("int8_over_fp32") or {})}, key=int)) + "): "
                     + ", ".join(_step_text(s) for s in steps))
    noise = timed.get("control_noise", rec.get("control_noise"))
    if whole:
        return (f"the shipped graph is the FP32 one: INT8 did not pay here after {', '.join(tried)}, so the whole model "
                f"({len(kept)} INT8 layer(s)) was kept float; its {speedup:.2f}x FP32 speed at batch 1 is two runs of the same "
                "graph, i.e. timing noise" + (f" (the build's FP32-vs-FP32 control moved by {float(noise):.0%})" if noise is not None else ""))
    if kept and not by_runtime and not per_layer:
        tried.append(f"{len(kept)} layer(s) kept float")
    return f"INT8 still ran slower than FP32 here ({speedup:.2f}x FP32 speed at batch 1) after: " + ", ".join(tried)


def _step_text(step: dict) -> str:
    ratios = step.get("int8_over_fp32") or {}
    figures = "/".join(f"{ratios[b]:.2f}" for b in sorted(ratios, key=int))
    return f"{step.get('step')} {figures}" + ("" if step.get("taken", True) else " (not taken)")


def write_build_report(bundle: Path, manifest: Manifest) -> Path:

    path = bundle / "report.md"
    with atomic_write_path(path) as tmp:
        tmp.write_text(build_report_markdown(manifest))
    return path


def write_bundle_reports(bundle: Path, manifest: Manifest, checked=None, *, budget_note: str | None = None) -> None:
    """Every report of a bundle: report/ with the validation's files (``checked``: a
    vitedge.validation.bundle.BundleValidation, None when nothing was validated), report.md and its
    accuracy-budget section (``budget_note``: a line on where the budget ran)."""
    if checked is not None:
        checked.write(bundle / "report")
    write_build_report(bundle, manifest)
    write_budget_report(bundle, manifest, note=budget_note)
