"""Validation and comparison reports: versioned JSON, Markdown, JUnit XML, PNG plots.

The JSON schema is documented in docs/reports.md; bump the major version of ``SCHEMA``
(``vitedge.validation/2``) for any change that removes or renames a key or changes a
unit, the minor rules being "add keys only". Everything is rendered in memory first and
written with ``write_report_files`` (each file atomically, after all of them rendered),
so a failing run leaves no half-written report behind.
"""

from __future__ import annotations

import io
import json
import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.core.errors import UsageError
from vitedge.files.atomic import atomic_output_dir, atomic_write_path
from vitedge.validation.core_wait import busy_note
from vitedge.validation.document import AccuracySection, LatencySection, SensitivitySection, ValidationReport
from vitedge.validation.reference_cache import shared_text

SCHEMA = "vitedge.validation/1"
COMPARE_SCHEMA = "vitedge.comparison/1"

# The files each command owns in a report folder (a file of this list that a run does
# not produce, such as sensitivity.png after --no-sensitivity, is removed as stale).
VALIDATION_FILES = ("validation.json", "summary.md", "junit.xml", "latency.png", "sensitivity.png")
COMPARE_FILES = ("compare.json", "compare.md", "compare-junit.xml")

PLOTS_HINT = "plots skipped: matplotlib is not installed (pip install 'vitedge[plots]' or pip install matplotlib)"


def schema_major(schema: object) -> tuple[str, int] | None:
    """("vitedge.validation", 1) for "vitedge.validation/1" (or "/1.2"); None when malformed."""
    if not isinstance(schema, str) or "/" not in schema:
        return None
    name, _, version = schema.partition("/")
    try:
        return name, int(version.split(".")[0])
    except ValueError:
        return None


# The keys every vitedge.validation/1 document has (docs/reports.md explains each).
# "gate[]" applies to every element of the "gate" list. Sections may carry more keys.
VALIDATION_KEYS: dict[str, tuple[str, ...]] = {
    "": ("schema", "producer", "vitedge_version", "created", "passed", "failures", "bundle", "model", "target",
         "quantization", "artifact", "runtime", "data", "thresholds", "accuracy", "latency", "speedup", "memory", "gate",
         "sensitivity", "seconds", "plots"),
    "bundle": ("path", "manifest_created", "manifest_vitedge_version"),
    "model": ("source", "source_sha256", "family", "variant", "image_size", "num_classes", "output_kind"),
    "target": ("name", "backend", "precision", "batch_sizes"),
    "quantization": ("layers_int8", "layers_total", "summary_line", "config"),
    "artifact": ("model", "bytes", "reference", "reference_bytes", "size_ratio"),
    "runtime": ("backend", "versions", "threads", "platform", "machine", "cpu_count"),
    "data": ("path", "kind", "items", "labeled", "data_hash", "classes_present"),
    "thresholds": ("max_top1_drop", "min_agreement", "min_speedup", "max_p99_ms", "overridden"),
    "accuracy": ("samples", "output_kind", "labeled", "top1_agreement"),
    "latency": ("measured", "fp32", "int8", "speedup"),
    "memory": ("method", "peak_rss_bytes"),
    "gate[]": ("name", "status", "passed", "value", "limit", "unit", "margin", "detail"),
}
# Conditional keys: accuracy of a classifier, accuracy with labels, an embedding model,
# one latency entry (latency.fp32/int8[batch]), the sensitivity section and its layers.
LOGIT_KEYS = ("logit_cosine_mean", "logit_cosine_min", "logit_abs_error_mean", "logit_abs_error_max", "softmax_kl_mean")
LABEL_KEYS = ("fp32_top1", "int8_top1", "top1_drop_points", "fp32_top5", "int8_top5")
EMBEDDING_KEYS = ("embedding_cosine_mean", "embedding_cosine_worst1pct", "nn_agreement", "embedding_cosine_low",
                  "embedding_cosine_low_percentile")
LATENCY_STATS_KEYS = ("batch", "iterations", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "throughput", "stable")
SENSITIVITY_KEYS = ("runtime", "method", "samples", "output_kind", "metric", "baseline", "full", "kept_float", "seconds", "notes", "layers")
SENSITIVITY_LAYER_KEYS = ("rank", "name", "kind", "op_type", "mse", "cosine", "one_minus_cosine")
GATE_NAMES = ("max_top1_drop", "min_agreement", "min_speedup", "max_p99_ms")
DECISIVE_GATE_NAME = "min_decisive_agreement"  # classifiers, after min_agreement (docs/gate.md)
EXPECTED_DROP_GATE_NAME = "max_expected_drop"  # classifiers, after min_decisive_agreement
# an embedding model's rows between min_agreement and min_speedup (min_nn_agreement only when set)
EMBEDDING_GATE_NAMES = ("min_embedding_cosine", "min_embedding_cosine_low", "min_nn_agreement")
STATUSES = ("pass", "fail", "skip")


def check_validation_document(doc: Any) -> list[str]:
    """What is missing or malformed in a vitedge.validation/1 document (empty when it conforms)."""
    if not isinstance(doc, dict):
        return ["the document is not a JSON object"]
    problems: list[str] = []
    if doc.get("schema") != SCHEMA:
        problems.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    for section, keys in VALIDATION_KEYS.items():
        if section == "gate[]":
            problems += _gate_problems(doc, keys)
        elif not section:
            problems += _missing("", doc, keys)
        elif section in doc:
            problems += _missing(section, doc[section], keys)
    problems += _number_problems(doc)
    problems += _range_problems(doc)
    problems += [f"{section} is not an object" for section in ("data", "target", "latency", "accuracy", "thresholds")
                 if section in doc and not isinstance(doc[section], dict)]
    problems += _conditional_problems(doc)
    if doc.get("passed") is not None and isinstance(doc.get("gate"), list):
        if bool(doc["passed"]) != all(r.get("status") != "fail" for r in doc["gate"] if isinstance(r, dict)):
            problems.append("passed disagrees with the gate rows")
    return problems


def _missing(where: str, obj: object, keys: tuple[str, ...]) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where or 'document'} is not an object"]
    return [f"{where + '.' if where else ''}{k} is missing" for k in keys if k not in obj]


def _not_numbers(where: str, obj: Any, keys: tuple[str, ...]) -> list[str]:
    if not isinstance(obj, dict):
        return []
    return [f"{where}.{k} is {obj[k]!r}, not a number" for k in keys
            if obj.get(k) is not None and (isinstance(obj[k], bool) or not isinstance(obj[k], (int, float)))]


def _gate_problems(doc: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """Each gate row's keys and status, and the rows in the order the gate writes them."""
    rows = doc.get("gate")
    if not isinstance(rows, list):
        return ["gate is not a list"]
    problems: list[str] = []
    for i, row in enumerate(rows):
        problems += _missing(f"gate[{i}]", row, keys)
        if isinstance(row, dict) and row.get("status") not in STATUSES:
            problems.append(f"gate[{i}].status is {row.get('status')!r}")
    names = [r.get("name") for r in rows if isinstance(r, dict)]
    acc = doc.get("accuracy")
    embedding = isinstance(acc, dict) and acc.get("output_kind") == "embedding"
    base = list(GATE_NAMES[:2]) + (list(EMBEDDING_GATE_NAMES[:2]) if embedding else [])
    # encoders may add min_nn_agreement; classifiers min_decisive_agreement, then max_expected_drop (reports written
    # before them have none)
    optional = ([], ["min_nn_agreement"]) if embedding else ([], [DECISIVE_GATE_NAME], [DECISIVE_GATE_NAME, EXPECTED_DROP_GATE_NAME])
    allowed = [base + extra + ["min_speedup"] + p99 for extra in optional for p99 in ([], ["max_p99_ms"])]
    if names not in allowed:
        problems.append(f"gate rows are {names}, expected {base + list(GATE_NAMES[2:3])} (and max_p99_ms when set)")
    return problems


def _number_problems(doc: dict[str, Any]) -> list[str]:
    """Figures that are not numbers: accuracy, speedup, each latency row."""
    problems = _not_numbers("accuracy", doc.get("accuracy"), LOGIT_KEYS + LABEL_KEYS + EMBEDDING_KEYS + ("top1_agreement",))
    problems += _not_numbers("document", doc, ("speedup",))
    for name in ("fp32", "int8"):
        lat_side = (doc.get("latency") or {}).get(name) if isinstance(doc.get("latency"), dict) else None
        if isinstance(lat_side, dict):
            for b, stats in lat_side.items():
                problems += _not_numbers(f"latency.{name}.{b}", stats, LATENCY_STATS_KEYS[:-1])
        elif lat_side is not None:
            problems.append(f"latency.{name} is not an object")
    return problems


FRACTION_KEYS = ("fp32_top1", "int8_top1", "fp32_top5", "int8_top5", "top1_agreement")


def _outside(where: str, value: object, lo: float, hi: float, *, lo_open: bool = False) -> list[str]:
    """``where`` is a finite number in [lo, hi] ((lo, hi] with ``lo_open``), or says what it is instead."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return []  # absent, or not a number: said by _number_problems
    inside = math.isfinite(value) and (value > lo if lo_open else value >= lo) and value <= hi
    return [] if inside else [f"{where} is {value!r}, outside {'(' if lo_open else '['}{lo:g}, {hi:g}]"]


def _range_problems(doc: dict[str, Any]) -> list[str]:
    """Every figure a gate reads, in its range: a fraction in [0, 1], a time in milliseconds above 0 and finite, a batch
    size a whole number (a report edited to say p50 0 ms, or -1, or 1e999, would pass any latency gate), the paired
    test's confidence in [0, 1)."""
    acc = doc.get("accuracy")
    problems = [p for k in FRACTION_KEYS for p in _outside(f"accuracy.{k}", acc.get(k), 0.0, 1.0)] if isinstance(acc, dict) else []
    lat = doc.get("latency")
    for name in ("fp32", "int8"):
        side = lat.get(name) if isinstance(lat, dict) else None
        for b, stats in (side.items() if isinstance(side, dict) else ()):
            if not (str(b).isdigit() and 1 <= int(b) <= 1 << 20):
                problems.append(f"latency.{name} has batch {str(b)[:20]!r}, not a batch size")
            elif isinstance(stats, dict):
                problems += [p for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms")
                             for p in _outside(f"latency.{name}.{b}.{k}", stats.get(k), 0.0, 3.6e6, lo_open=True)]
    thresholds = doc.get("thresholds")
    if isinstance(thresholds, dict):
        problems += _outside("thresholds.drop_confidence", thresholds.get("drop_confidence"), 0.0, 0.999999)
    return problems


def _conditional_problems(doc: dict[str, Any]) -> list[str]:
    """The keys a section must have given what ran: per model kind, with labels, measured latency, sensitivity."""
    problems: list[str] = []
    acc = doc.get("accuracy")
    if isinstance(acc, dict):
        if acc.get("output_kind") == "embedding":
            problems += _missing("accuracy", acc, EMBEDDING_KEYS[:2])
        else:
            problems += _missing("accuracy", acc, LOGIT_KEYS)
            if acc.get("labeled"):
                problems += _missing("accuracy", acc, LABEL_KEYS)
    lat = doc.get("latency")
    if isinstance(lat, dict) and lat.get("measured"):
        for name in ("fp32", "int8"):
            side = lat.get(name)
            for b, stats in (side.items() if isinstance(side, dict) else ()):  # not an object: said by _number_problems
                problems += _missing(f"latency.{name}.{b}", stats, LATENCY_STATS_KEYS)
        if not isinstance(lat.get("int8"), dict) or "1" not in lat["int8"]:
            problems.append("latency.int8 has no batch 1")
    sens = doc.get("sensitivity")
    if isinstance(sens, dict) and "error" not in sens:
        problems += _missing("sensitivity", sens, SENSITIVITY_KEYS)
        layers = sens.get("layers") or []
        if not isinstance(layers, list):
            problems.append(f"sensitivity.layers is a {type(layers).__name__}, not a list")
            layers = []
        for i, layer in enumerate(layers):
            problems += _missing(f"sensitivity.layers[{i}]", layer, SENSITIVITY_LAYER_KEYS)
    return problems


# --------------------------------------------------------------------------- formatting


def _pct(v: object, digits: int = 2) -> str:
    return "–" if v is None else f"{100 * v:.{digits}f}%"


def _num(v: object, fmt: str = ".3f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return format(v, fmt)


def _mb(v: object) -> str:
    return "–" if v is None else f"{v / 1e6:.2f} MB"


def _value(row: dict[str, Any], key: str = "value") -> str:
    """A gate row's ``value`` (or ``limit``) in its unit; a measured value shows decimals, a limit as given."""
    v, unit = row.get(key), row.get("unit", "")
    if v is None:
        return "–"
    if unit == "fraction":
        return _pct(v)
    if unit == "x":
        return f"{v:.2f}x" if key == "value" else f"{v:g}x"
    if unit == "%" and key == "value":
        return f"{v:+.1f}%"
    return (f"{v:.3f} {unit}" if key == "value" else f"{v:g} {unit}").strip()


def _limit(row: dict[str, Any]) -> str:
    return _value(row, "limit")


_BADGE = {"pass": "✅ pass", "fail": "❌ **fail**", "skip": "⏭️ skip"}


def gate_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| check | result | value | limit | detail |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['name']}` | {_BADGE.get(r['status'], r['status'])} | {_value(r)} | {_limit(r)} | {r['detail']} |")
    return lines


# --------------------------------------------------------------------------- validation Markdown


def validation_markdown(doc: ValidationReport | dict[str, Any], *, heading: str = "##", plots: Iterable[str] = ()) -> str:
    """summary.md (and the validation part of report.md): the verdict, the gate, accuracy, latency, sensitivity."""
    report = doc if isinstance(doc, ValidationReport) else ValidationReport.from_json(doc)
    lines = _md_heading(report, heading)
    lines += _md_gate(report)
    lines += _md_accuracy(report.accuracy, heading)
    lines += _md_latency(report.latency, heading)
    lines += _md_size(report)
    lines += _md_sensitivity(report.sensitivity, heading)
    if report.distributed:
        lines += [f"Accuracy sharded over {report.distributed['shards']} Ray tasks on {len(report.distributed['nodes'])} node(s); "
                  f"every metric computed on the driver from the merged per-sample outputs.", ""]
    plots = list(plots)
    if plots:
        lines += ["Plots: " + ", ".join(f"`{p}`" for p in plots), ""]
    return "\n".join(lines)


def _md_heading(r: ValidationReport, heading: str) -> list[str]:
    """The verdict line, what ran on what, FP32's warnings and which outputs the cache gave."""
    target, model, data, rt = r.target, r.model, r.data, r.runtime
    lines = [
        f"{heading} {'✅ PASS' if r.passed else '❌ FAIL'}: vitedge {r.producer.split()[-1]} `{target.name}` ({target.backend}, {target.precision})",
        "",
        f"`{model.source}` ({model.family} {model.variant}, {model.image_size[0]}x{model.image_size[1]}, "
        f"{model.output_kind}) as `{r.artifact.model}` on {rt.backend} {rt.versions.get(rt.backend, '')}".rstrip()
        + f"; {data.items} {'labelled ' if data.labeled else ''}inputs from `{data.path}`"
        + (" (the calibration images, not held-out data)." if data.role == "calibration" else "."),
        "",
    ]
    lines += [f"> **WARNING:** {w}\n" for w in r.accuracy.warnings]
    reused = [what for what, key in (("FP32 reference", "reference"), ("INT8 artifact", "int8_outputs")) if data.cache_hit(key)]
    if reused:
        lines += [f"Outputs reused from the validation cache (the same graph bytes, data, runtime, settings and CPU ran "
                  f"before; `--no-int8-cache` / `--no-reference-cache` run them): {', '.join(reused)}.", ""]
    shared = data.shared_fp32()
    if shared is not None:
        lines += [f"FP32 reference: {shared_text(shared, data.items or 0)}; the stricter comparison, since the INT8 error is "
                  "then measured against another runtime's FP32 (`--no-reference-cache` runs this runtime's own).", ""]
    if data.probe_outputs:
        lines += [_probe_sources(data.probe_outputs), ""]
    return lines


def _probe_sources(lookups: dict) -> str:
    """Where the FP32 preprocessing probe's outputs came from, one phrase per mean shift."""
    def source(found: dict) -> str:
        cache = found.get("cache")
        if cache == "shared":
            return f"computed by {(found.get('shared') or {}).get('runtime')} and spot-checked here"
        return "read from the validation cache" if cache == "hit" else "computed here"
    return ("FP32 preprocessing probe outputs: "
            + "; ".join(f"mean moved by {shift}: {source(found)}" for shift, found in lookups.items()) + ".")


def _md_gate(r: ValidationReport) -> list[str]:
    lines = [] if r.passed else ["**Failed:** " + "; ".join(r.failures), ""]
    lines += gate_table([row.to_dict() for row in r.gate]) + [""]
    notes = r.thresholds.notes or []
    return lines + [f"**Note:** {note}" for note in notes] + ([""] if notes else [])


def _md_accuracy(acc: AccuracySection, heading: str) -> list[str]:
    lines = [f"{heading}# Accuracy (INT8 vs FP32, same runtime, same inputs)", "", "| metric | FP32 | INT8 |", "|---|---|---|"]
    if acc.is_embedding:
        lines += [
            f"| embedding cosine, mean | | {_num(acc.embedding_cosine_mean, '.5f')} |",
            f"| embedding cosine, p{acc.get('embedding_cosine_low_percentile', 5):g} | | {_num(acc.embedding_cosine_low, '.5f')} |",
            f"| embedding cosine, worst 1% | | {_num(acc.embedding_cosine_worst1pct, '.5f')} |",
            f"| nearest-neighbour agreement | | {_pct(acc.nn_agreement)} |",
        ]
    else:
        if acc.fp32_top1 is not None:
            lines += [f"| top-1 | {_pct(acc.fp32_top1)} | {_pct(acc.int8_top1)} |",
                      f"| top-5 | {_pct(acc.fp32_top5)} | {_pct(acc.int8_top5)} |"]
        lines += [
            f"| top-1 agreement with FP32 | | {_pct(acc.top1_agreement)} |",
            f"| logit cosine, mean / min | | {_num(acc.logit_cosine_mean, '.5f')} / {_num(acc.logit_cosine_min, '.5f')} |",
            f"| logit abs error, mean / max | | {_num(acc.logit_abs_error_mean, '.4f')} / {_num(acc.logit_abs_error_max, '.4f')} |",
            f"| softmax KL(FP32 ‖ INT8), mean | | {_num(acc.softmax_kl_mean, '.2e')} |",
        ]
    return lines + [""]


def _md_latency(lat: LatencySection, heading: str) -> list[str]:
    lines = [f"{heading}# Latency", ""]
    if not lat.measured:
        return lines + ["Not measured (--no-latency)."]
    lines += ["| batch | FP32 p50 ms | INT8 p50 ms | INT8 p90 ms | INT8 p99 ms | INT8 img/s | speedup | iterations | stable |",
              "|---|---|---|---|---|---|---|---|---|"]
    for b, s in lat.int8.items():
        f = lat.fp32.get(b)
        stable = "yes" if s.stable and f is not None and f.stable else "no"
        lines.append(f"| {b} | {_num(f.p50_ms if f else None)} | {_num(s.p50_ms)} | {_num(s.p90_ms)} | {_num(s.p99_ms)} | "
                     f"{_num(s.throughput, '.1f')} | {_num(lat.speedup.get(b), '.2f')}x | {s.iterations} | {stable} |")
    lines += ["", f"<sub>{lat.method}</sub>"]
    busy = [(b, s.core_wait) for b, s in lat.int8.items() if busy_note(s.core_wait)]
    if busy:
        waits = ", ".join(f"{w:.2f} s at batch {b}" for b, w in busy)
        lines += ["", f"**A busy machine:** the timed threads waited for a core ({waits} per second they ran): other "
                  "processes held the cores, and these wall-clock figures include that load. Time it again on a quiet "
                  "machine before trusting them."]
    if lat.device:  # what `vitedge compare` checks before it compares milliseconds
        d = lat.device
        mode = f", power mode {d['power_mode']}" if d.get("power_mode") else ""
        where = (f"GPU {d.get('gpu')} (compute {d.get('compute_capability')}), {d.get('model')}{mode}" if d.get("kind") == "gpu"
                 else f"{d.get('model')} ({d.get('isa')}, {d.get('cpus')} CPU(s))")
        lines += ["", f"Timed on {where}."]
    if lat.measured_on:  # a sharded run (vitedge.distributed): one worker timed alone
        lines += ["", f"Measured on {lat.measured_on}, alone (no other shard running)."]
    return lines


def _md_size(r: ValidationReport) -> list[str]:
    art = r.artifact
    return ["", f"Artifact {_mb(art.bytes)} on disk (FP32 reference {_mb(art.reference_bytes)}"
            + (f", {art.size_ratio:.2f}x smaller" if art.size_ratio else "") + f"); peak RSS {_mb(r.memory.peak_rss_bytes)}.", ""]


def _md_sensitivity(sens: SensitivitySection | None, heading: str) -> list[str]:
    if sens is None:
        return []
    if not sens.layers:
        return [f"Sensitivity not computed: {sens.error}", ""] if sens.error else []
    metric, top = sens.metric, sens.layers[:10]
    lines = [f"{heading}# Most sensitive layers", "",
             f"Each INT8 layer quantized alone (every other layer in float), {sens.samples} inputs, run on "
             f"{sens.runtime} whatever the target's backend; ranked by `{metric}` against FP32. "
             f"Float twin vs FP32 (noise floor): {_num(sens.baseline.get(metric), '.2e')}; "
             f"whole INT8 graph: {_num(sens.full.get(metric), '.2e')}.", ""]
    cols = ["kl", "top1_flip_rate", "mse"] if sens.output_kind != "embedding" else ["one_minus_cosine", "mse"]
    lines += ["| rank | layer | kind | " + " | ".join(cols) + " |", "|---|---|---|" + "---|" * len(cols)]
    for r in top:
        vals = " | ".join(_pct(r[c], 1) if c == "top1_flip_rate" else _num(r[c], ".2e") for c in cols)
        lines.append(f"| {r['rank']} | `{r['name']}` | {r['kind']} | {vals} |")
    if len(sens.layers) > len(top):
        lines.append(f"\n{len(sens.layers) - len(top)} more layers in validation.json.")
    return lines + [""]


# --------------------------------------------------------------------------- JUnit


def junit_xml(suite: str, classname: str, rows: list[dict[str, Any]], properties: dict[str, Any], seconds: float = 0.0) -> str:
    """One testsuite; each gate row a testcase (failures carry the detail as message)."""
    failures = sum(1 for r in rows if r["status"] == "fail")
    skipped = sum(1 for r in rows if r["status"] == "skip")
    root = ET.Element("testsuites", name="vitedge", tests=str(len(rows)), failures=str(failures), errors="0",
                      skipped=str(skipped), time=f"{seconds:.3f}")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(rows)), failures=str(failures), errors="0",
                       skipped=str(skipped), time=f"{seconds:.3f}")
    props = ET.SubElement(ts, "properties")
    for k, v in properties.items():
        ET.SubElement(props, "property", name=str(k), value="" if v is None else str(v))
    for r in rows:
        case = ET.SubElement(ts, "testcase", classname=classname, name=r["name"], time="0")
        if r["status"] == "fail":
            f = ET.SubElement(case, "failure", message=r["detail"], type="GateFailure")
            f.text = f"{r['name']}: value {r.get('value')} vs limit {r.get('limit')}; {r['detail']}"
        elif r["status"] == "skip":
            ET.SubElement(case, "skipped", message=r["detail"])
        out = ET.SubElement(case, "system-out")
        out.text = r["detail"]
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def validation_junit(report: ValidationReport) -> str:
    t = report.target.name
    props = {"schema": report.schema, "model": report.model.source, "target": t, "backend": report.target.backend,
             "data_hash": report.data.data_hash, "vitedge_version": report.vitedge_version}
    return junit_xml(f"vitedge.validate.{t}", f"vitedge.gate.{t}", [r.to_dict() for r in report.gate], props, report.seconds)


# --------------------------------------------------------------------------- plots


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def latency_plot(latency: dict[str, dict[str, Any]], title: str) -> bytes | None:
    """Histograms of the timed samples, FP32 vs INT8, one panel per batch size.

    ``latency``: "fp32"/"int8" -> batch (str) -> LatencyStats (with samples)."""
    plt = _pyplot()
    batches = sorted(latency.get("int8", {}), key=int)
    if plt is None or not batches:
        return None

    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 3.2), squeeze=False)
    for ax, b in zip(axes[0], batches):
        f, q = latency["fp32"][b], latency["int8"][b]
        both = np.asarray(list(f.samples_ms) + list(q.samples_ms))
        hi = float(np.percentile(both, 99.5)) if both.size else 1.0
        lo = float(both.min()) if both.size else 0.0
        bins = np.linspace(lo, max(hi, lo + 1e-6), 40)
        ax.hist(np.clip(f.samples_ms, lo, hi), bins=bins, alpha=0.6, label=f"FP32 p50 {f.p50_ms:.2f} ms", color="#888888")
        ax.hist(np.clip(q.samples_ms, lo, hi), bins=bins, alpha=0.7, label=f"INT8 p50 {q.p50_ms:.2f} ms", color="#1f77b4")
        ax.axvline(f.p50_ms, color="#555555", lw=1)
        ax.axvline(q.p50_ms, color="#1f4e79", lw=1)
        ax.set_title(f"batch {b}: {f.p50_ms / q.p50_ms:.2f}x")
        ax.set_xlabel("ms per batch")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("iterations")
    fig.suptitle(title, fontsize=10)
    data = _png(fig)
    plt.close(fig)
    return data


_KIND_COLOURS = {"linear": "#1f77b4", "attention_matmul": "#d62728", "patch_embed": "#2ca02c", "head": "#9467bd", "conv": "#8c564b"}


def sensitivity_plot(sens: dict[str, Any], title: str, top: int = 40) -> bytes | None:
    plt = _pyplot()
    layers = sens.get("layers") or []
    if plt is None or not layers:
        return None
    metric = sens["metric"]
    shown = layers[:top][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.22 * len(shown) + 1.4))
    values = [max(r[metric], 1e-12) for r in shown]
    ax.barh(range(len(shown)), values, color=[_KIND_COLOURS.get(r["kind"], "#7f7f7f") for r in shown])
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([r["name"][-48:] for r in shown], fontsize=7)
    ax.set_xscale("log")
    floor = sens["baseline"].get(metric)
    if floor:
        ax.axvline(floor, color="black", ls=":", lw=1, label="float twin (noise floor)")
    ax.set_xlabel(f"{metric} vs FP32 with only this layer INT8")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for k, c in _KIND_COLOURS.items() if any(r["kind"] == k for r in shown)]
    labels = [k for k in _KIND_COLOURS if any(r["kind"] == k for r in shown)]
    ax.legend(handles + ax.get_legend_handles_labels()[0], labels + ax.get_legend_handles_labels()[1], fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=10)
    data = _png(fig)
    plt.close(fig)
    return data


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- writing


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def write_report_files(report_dir: Path, files: dict[str, bytes | str], owned: Iterable[str] = ()) -> list[Path]:
    """Write rendered reports into ``report_dir``: each file atomically, a new folder as a whole.

    Files of ``owned`` that this run did not produce are removed (stale plots)."""

    report_dir = Path(report_dir)
    if report_dir.exists() and not report_dir.is_dir():
        raise UsageError(f"--report-dir {report_dir} is a file, not a folder")
    mode = 0o666 & ~_umask()

    def put(path: Path, data: bytes | str) -> None:
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        os.chmod(path, mode)

    if not report_dir.exists():
        with atomic_output_dir(report_dir) as tmp:
            for name, data in files.items():
                put(tmp / name, data)
            os.chmod(tmp, 0o777 & ~_umask())
    else:
        for name, data in files.items():
            with atomic_write_path(report_dir / name) as tmp:
                put(tmp, data)
        for name in set(owned) - set(files):
            stale = report_dir / name
            if stale.is_file():
                stale.unlink()
    return [report_dir / name for name in files]


def check_report_dir(report_dir: Path | None) -> None:
    """Fail early (before any work) on a --report-dir that cannot be a folder."""

    if report_dir is None:
        return
    report_dir = Path(report_dir)
    if report_dir.exists() and not report_dir.is_dir():
        raise UsageError(f"--report-dir {report_dir} is a file, not a folder")
    parent = report_dir if report_dir.exists() else next((p for p in report_dir.parents if p.exists()), Path("."))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--report-dir {report_dir}: {parent} is not writable")


def append_step_summary(markdown: str) -> str | None:
    """Append to $GITHUB_STEP_SUMMARY when set; returns a warning line on failure."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(markdown.rstrip() + "\n\n")
    except OSError as err:
        return f"could not append to $GITHUB_STEP_SUMMARY ({path}): {err.strerror or err}"
    return None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
