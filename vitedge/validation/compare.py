"""`vitedge compare OLD.json NEW.json`: gate a regression between two validation reports.

Rows (each a JUnit test case):
  top1_regression        INT8 top-1 lost since OLD, in points (labelled data only)
  agreement_regression   top-1 (or nearest-neighbour) agreement with FP32 lost, in points
                         Both fail only when the loss is real: on one data set with the per-image bits of both
                         reports (``accuracy.per_sample``), when the exact paired interval lies wholly above the
                         limit (at the new report's ``drop_confidence``; 0: the point figure decides, as without them)
  p50_regression_bN      INT8 median latency growth at batch N, as a fraction (+0.1 = 10% slower)
  int8_fp32_ratio_regression_bN
                         instead of p50 when the reports were timed on different devices (``latency.device``: a CPU's
                         model, ISA and CPU count, or a GPU and its module) or thread settings: the growth of INT8's
                         time over FP32's at batch N, each pair timed interleaved in its own run; milliseconds of two
                         machines compare the machines

Both reports must be ``vitedge.validation/1`` documents of the same model (file name,
architecture, input size, classes) on the same target; otherwise compare refuses (exit 2)
unless ``allow_mismatch``. Different validation data (``data.data_hash``) is a warning:
the accuracy rows then compare different sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from vitedge import __version__
from vitedge.core.errors import DataError, UsageError
from vitedge.targets.profiles import DEFAULT_DROP_CONFIDENCE
from vitedge.files.safefile import BadDocument, read_json
from vitedge.validation import per_sample
from vitedge.validation import report as rpt
from vitedge.validation.core_wait import busy_note
from vitedge.validation.defaults import (
    DEFAULT_MAX_ACCURACY_REGRESSION,
    DEFAULT_MAX_LATENCY_REGRESSION,
)
from vitedge.validation.document import LatencySection, ValidationReport
from vitedge.validation.gate import FAIL, PASS, SKIP, GateRow
from vitedge.validation.noise import discordant_interval


# validation.json: a few kB, up to ~1 MB with per-layer sensitivity and the per-image bits of 2,000,000 images
MAX_REPORT_BYTES = 64 << 20


def parse_fraction(text: str | float, flag: str = "--max-latency-regression") -> float:
    """"10%" or "0.1" -> 0.1. A bare number above 1 is refused as ambiguous."""
    raw = str(text).strip()
    try:
        if raw.endswith("%"):
            value = float(raw[:-1]) / 100.0
        else:
            value = float(raw)
            if value > 1.0:
                raise UsageError(f"{flag} {raw} is ambiguous: write {raw}% for a percentage, or a fraction such as 0.1")
    except ValueError:
        raise UsageError(f"{flag} must be a percentage such as 10% or a fraction such as 0.1, got {raw!r}") from None
    if not value >= 0 or value != value or value == float("inf"):
        raise UsageError(f"{flag} must be 0 or more, got {raw!r}")
    return value


def report_path(path: Path) -> Path:
    """``path``, or for a bundle folder its build's report (``report/validation.json``)."""
    path = Path(path)
    return path / "report" / "validation.json" if path.is_dir() and (path / "report" / "validation.json").is_file() else path


def load_report(path: Path) -> ValidationReport:
    """A validation report (``report_path``), checked to be ``vitedge.validation/1`` with the keys compare reads."""
    path = report_path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist: pass a validation.json written by `vitedge validate` or `vitedge build`")
    try:  # a report may come from another job's artifacts: a FIFO would block, a huge file fill memory
        doc = read_json(path, what="vitedge validation report", limit=MAX_REPORT_BYTES)
    except OSError as err:
        raise DataError(f"{err}: pass a validation.json written by `vitedge validate` or `vitedge build`") from None
    except BadDocument as err:
        raise DataError(f"{err}: pass a validation.json written by `vitedge validate` or `vitedge build`") from None
    parsed = rpt.schema_major(doc.get("schema"))
    want = rpt.schema_major(rpt.SCHEMA)
    if parsed is None or parsed[0] != want[0]:
        raise DataError(f"{path} is not a vitedge validation report (schema {doc.get('schema')!r}, expected '{rpt.SCHEMA}')")
    if parsed[1] != want[1]:
        raise DataError(f"{path} uses schema {doc['schema']} but this vitedge reads major version {want[1]} ({rpt.SCHEMA}); "
                        f"re-run `vitedge validate` with one vitedge version for both reports")
    problems = rpt.check_validation_document(doc)
    if problems:
        raise DataError(f"{path} does not follow {rpt.SCHEMA}: {problems[0]}"
                        + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "") + "; a damaged or hand-edited report")
    return ValidationReport.from_json(doc)


def _identity(report: ValidationReport) -> dict[str, Any]:
    m = report.model
    return {"model": m.source, "family": m.family, "variant": m.variant, "image_size": m.image_size,
            "num_classes": m.num_classes, "output_kind": m.output_kind}


@dataclass
class Comparison:
    rows: list[GateRow]
    document: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def target_name(self) -> str | None:
        return self.document["target"]["name"]

    def failure_line(self) -> str:
        return "regression: " + "; ".join(r.detail for r in self.rows if not r.passed)

    def markdown(self) -> str:
        d = self.document
        verdict = "✅ PASS" if d["passed"] else "❌ FAIL"
        lines = [f"## {verdict}: vitedge compare `{d['target']['name']}` ({d['model']['model']})", "",
                 f"Old: `{d['old']['path']}` ({d['old']['created']}, vitedge {d['old']['vitedge_version']}) → "
                 f"new: `{d['new']['path']}` ({d['new']['created']}, vitedge {d['new']['vitedge_version']}). "
                 f"Limits: latency +{100 * d['limits']['max_latency_regression']:g}%, accuracy "
                 f"{d['limits']['max_accuracy_regression']:g} points.", ""]
        timed = [f"{side} timed on {_device_label(d[side]['timed_on'])}" for side in ("old", "new") if d[side].get("timed_on")]
        if timed:
            lines += ["; ".join(timed) + ".", ""]
        if d["warnings"]:
            lines += ["> " + w for w in d["warnings"]] + [""]
        if not d["passed"]:
            lines += ["**Failed:** " + "; ".join(d["failures"]), ""]
        lines += ["| check | result | old | new | change | limit | detail |", "|---|---|---|---|---|---|---|"]
        for r in d["gate"]:
            lines.append(f"| `{r['name']}` | {rpt._BADGE.get(r['status'], r['status'])} | {_fmt(r, 'old')} | {_fmt(r, 'new')} | "
                         f"{rpt._value(r)} | {rpt._limit(r)} | {r['detail']} |")
        return "\n".join(lines) + "\n"

    def junit(self) -> str:
        d = self.document
        props = {"schema": d["schema"], "model": d["model"]["model"], "target": d["target"]["name"],
                 "old": d["old"]["path"], "new": d["new"]["path"]}
        t = d["target"]["name"]
        return rpt.junit_xml(f"vitedge.compare.{t}", f"vitedge.regression.{t}", d["gate"], props)

    def files(self) -> dict[str, str]:
        return {"compare.json": rpt.to_json(self.document), "compare.md": self.markdown(), "compare-junit.xml": self.junit()}

    def write(self, report_dir: Path) -> list[Path]:
        return rpt.write_report_files(report_dir, self.files(), rpt.COMPARE_FILES)


def _fmt(row: dict[str, Any], key: str) -> str:
    v = row.get(key)
    if v is None:
        return "–"
    if row["name"].startswith("p50"):
        return f"{v:.3f} ms"
    return f"{v:.3f}" if row["name"].startswith("int8_fp32_ratio") else f"{100 * v:.2f}%"


def _row(name: str, old: float | None, new: float | None, change: float | None, limit: float, unit: str,
         ok: bool, detail: str, status: str | None = None) -> tuple[GateRow, dict[str, Any]]:
    st = status or (PASS if ok else FAIL)
    margin = None if change is None else change - limit
    row = GateRow(name, change, limit, st != FAIL, detail, st, unit, margin)
    return row, {"old": old, "new": new}


def compare_reports(old: ValidationReport, new: ValidationReport, *, old_path: str = "OLD", new_path: str = "NEW",
                    max_latency_regression: float = DEFAULT_MAX_LATENCY_REGRESSION,
                    max_accuracy_regression: float = DEFAULT_MAX_ACCURACY_REGRESSION,
                    allow_mismatch: bool = False) -> Comparison:
    """The regression rows of NEW against OLD: top-1, agreement, INT8 p50 per batch size in common."""
    if max_accuracy_regression < 0:
        raise UsageError(f"--max-accuracy-regression must be 0 or more points, got {max_accuracy_regression}")
    warnings = _mismatches(old, new, old_path, new_path, allow_mismatch)
    lim, llim = max_accuracy_regression, max_latency_regression
    pairing = _Pairing.of(old, new)
    rows = [
        _points_row("top1_regression", "INT8 top-1", old.accuracy.int8_top1, new.accuracy.int8_top1, lim,
                    "not checked: a report has no labelled top-1", skip_values=True,
                    paired=pairing.of_key("int8_correct", old.accuracy.int8_top1, new.accuracy.int8_top1)),
        _points_row("agreement_regression", "agreement with FP32", old.accuracy.top1_agreement, new.accuracy.top1_agreement,
                    lim, "not checked: a report has no agreement", skip_values=False,
                    paired=pairing.of_key("int8_agrees", old.accuracy.top1_agreement, new.accuracy.top1_agreement)),
        *_latency_rows(old, new, llim, old_path, new_path, warnings),
    ]
    doc = {
        "schema": rpt.COMPARE_SCHEMA,
        "producer": "vitedge compare",
        "vitedge_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "passed": all(r.passed for r, _ in rows),
        "failures": [r.detail for r, _ in rows if not r.passed],
        "old": _side(old, old_path),
        "new": _side(new, new_path),
        "model": _identity(new),
        "target": {"name": new.target.name, "backend": new.target.backend},
        "limits": {"max_latency_regression": llim, "max_accuracy_regression": lim},
        "warnings": warnings,
        "gate": [dict(r.to_dict(), **extra) for r, extra in rows],
    }
    return Comparison([r for r, _ in rows], doc, warnings)


def _mismatches(old: ValidationReport, new: ValidationReport, old_path: str, new_path: str, allow_mismatch: bool) -> list[str]:
    """Warnings for reports of different models, targets or data; a refusal (exit 2) for the first two unless allowed."""
    warnings: list[str] = []
    io, inew = _identity(old), _identity(new)
    if io != inew:
        diff = next(k for k in io if io[k] != inew[k])
        msg = f"the reports are of different models ({diff}: {io[diff]!r} in {old_path} vs {inew[diff]!r} in {new_path})"
        if not allow_mismatch:
            raise UsageError(msg + "; compare reports of one model (or pass --allow-mismatch)")
        warnings.append(msg)
    to, tn = old.target.name, new.target.name
    if to != tn:
        msg = f"the reports are of different targets ('{to}' in {old_path} vs '{tn}' in {new_path})"
        if not allow_mismatch:
            raise UsageError(msg + "; compare reports of one target (or pass --allow-mismatch)")
        warnings.append(msg)
    if old.data.data_hash != new.data.data_hash:
        warnings.append("the reports were validated on different data (data_hash differs): accuracy changes mix model and data")
    return warnings


@dataclass
class _Pairing:
    """The per-image bits of both reports (``accuracy.per_sample``), when they are of one data set, and the confidence
    of the paired test (the new report's ``drop_confidence``: 0 turns it off, as in the gate)."""

    old: dict[str, Any] | None
    new: dict[str, Any] | None
    confidence: float
    why_not: str | None = None  # why the rows cannot be paired, when they cannot

    @classmethod
    def of(cls, old: ValidationReport, new: ValidationReport) -> _Pairing:
        confidence = new.thresholds.limits.get("drop_confidence")
        confidence = float(confidence) if isinstance(confidence, (int, float)) else DEFAULT_DROP_CONFIDENCE
        if confidence <= 0:
            return cls(None, None, confidence, "the new report's drop_confidence is 0")
        if old.data.data_hash is None or old.data.data_hash != new.data.data_hash:
            return cls(None, None, confidence, "the reports are of different data")
        return cls(old.accuracy.per_sample, new.accuracy.per_sample, confidence)

    def of_key(self, key: str, old_value: float | None, new_value: float | None) -> tuple[np.ndarray, np.ndarray, float] | str:
        """(old bits, new bits, confidence) of ``key``, or why they cannot be paired: absent, of other lengths, or not
        adding up to the report's own figure (``old_value``, ``new_value``: an edited or damaged report)."""
        if self.why_not is not None:
            return self.why_not
        a, b = per_sample.bits(self.old, key), per_sample.bits(self.new, key)
        if a is None or b is None:
            return "a report holds no per-image results (written before vitedge kept them, or over its size limit)"
        if len(a) != len(b) or not len(a) or old_value is None or new_value is None:
            return "the per-image results are of different lengths"
        if abs(a.mean() - old_value) > 1e-9 or abs(b.mean() - new_value) > 1e-9:
            return "the per-image results do not add up to the reports' figures (an edited or damaged report)"
        return a, b, self.confidence


def _points_row(name: str, what: str, old: float | None, new: float | None, lim: float, skip: str, *,
                skip_values: bool, paired: tuple[np.ndarray, np.ndarray, float] | str = "") -> tuple[GateRow, dict[str, Any]]:
    """A fraction lost since OLD, in points (``skip_values``: a skipped row still shows the values it has). With the
    per-image bits of both (``paired``), the loss fails only when its exact paired interval lies wholly above the limit:
    the images one report got and the other missed decide, and a flip or two of near-ties is not shown to be a loss."""
    if old is None or new is None:
        return _row(name, old if skip_values else None, new if skip_values else None, None, lim, "points", True, skip, SKIP)
    drop = 100.0 * (old - new)
    text = f"{what} {100 * old:.2f}% -> {100 * new:.2f}%: {'lost' if drop > 0 else 'gained'} {abs(drop):.3f} points (limit {lim:g})"
    if drop <= lim + 1e-9:
        return _row(name, old, new, drop, lim, "points", True, text)
    if not isinstance(paired, str):
        before, after, confidence = paired
        lost, gained = int(np.sum(before & ~after)), int(np.sum(~before & after))
        (low, high), _ = discordant_interval(lost, gained, len(before), confidence)
        images = f"paired on {len(before)} images: {lost} lost, {gained} gained"
        interval = f"{100 * confidence:g}% interval [{low:.2f}, {high:.2f}] points"
        if low <= lim + 1e-9:
            return _row(name, old, new, drop, lim, "points", True, f"{text}: within noise, {interval} reaches the limit ({images})")
        return _row(name, old, new, drop, lim, "points", False,
                    f"{text}, over by {drop - lim:.3f} points; {interval} lies above the limit: a real loss ({images})")
    why = f" (the figures decide, unpaired: {paired})" if paired else ""
    return _row(name, old, new, drop, lim, "points", False, f"{text}, over by {drop - lim:.3f} points{why}")


def timed_apart(old: ValidationReport, new: ValidationReport) -> str | None:
    """Why the two reports' milliseconds cannot be compared (timed on other devices or thread settings), or None."""
    do, dn = old.latency.device, new.latency.device
    if do and dn and do != dn:
        kinds = {do.get("kind"), dn.get("kind")}
        what = "CPUs" if kinds == {"cpu"} else "GPUs" if kinds == {"gpu"} else "devices"
        return f"timed on different {what} ({_device_label(do)} vs {_device_label(dn)})"
    if old.runtime.threads != new.runtime.threads:
        return f"timed with different thread settings ({old.runtime.threads} vs {new.runtime.threads})"
    return None


def _device_label(d: dict[str, Any]) -> str:
    if d.get("kind") == "gpu":
        mode = f", power mode {d['power_mode']}" if d.get("power_mode") else ""
        return f"{d.get('model')}, GPU {d.get('gpu')}, compute {d.get('compute_capability')}{mode}"
    return f"{d.get('model')}, {d.get('isa')}, {d.get('cpus')} CPU(s)"


def _latency_rows(old: ValidationReport, new: ValidationReport, llim: float, old_path: str, new_path: str,
                  warnings: list[str]) -> list[tuple[GateRow, dict[str, Any]]]:
    """INT8 median latency growth per batch size both reports measured; INT8/FP32 time growth when they were timed
    apart (``timed_apart``); a warning when a report does not say what timed it."""
    lo, ln = old.latency, new.latency
    if not (lo.measured and ln.measured):
        which = "either report" if not lo.measured and not ln.measured else (old_path if not lo.measured else new_path)
        return [_row("p50_regression", None, None, None, 100 * llim, "%", True, f"not checked: latency not measured in {which}", SKIP)]
    common = sorted(set(lo.int8) & set(ln.int8), key=int)
    if not common:
        return [_row("p50_regression", None, None, None, llim, "%", True, "not checked: no batch size in common", SKIP)]
    apart = timed_apart(old, new)
    if apart is not None:
        warnings.append(f"latency was {apart}: INT8 p50 is not compared; the INT8/FP32 time ratio is, each timed "
                        "interleaved in its own run")
        return [_ratio_row(b, lo, ln, llim, apart, old_path, new_path) for b in common]
    unknown = [p for p, sec in ((old_path, lo), (new_path, ln)) if not sec.device]
    if unknown:
        warnings.append(f"{' and '.join(unknown)} does not record the device its latency was timed on (a report from before "
                        "vitedge recorded it): INT8 p50 compared as measured; if the machines differ, that compares the machines")
    rows = []
    for b in common:
        po, pn = lo.int8[b].p50_ms, ln.int8[b].p50_ms
        change = pn / po - 1.0 if po > 0 else 0.0
        ok = change <= llim + 1e-12
        rows.append(_row(f"p50_regression_b{b}", po, pn, 100 * change, 100 * llim, "%", ok,
                         f"INT8 p50 at batch {b} {po:.3f} -> {pn:.3f} ms ({100 * change:+.1f}%, limit +{100 * llim:g}%)"
                         + ("" if ok else f", over by {100 * (change - llim):.1f} points") + _unsteady(b, lo, ln, old_path, new_path)))
    return rows


def _unsteady(b: str, lo: LatencySection, ln: LatencySection, old_path: str, new_path: str,
              sides: tuple[str, ...] = ("int8",)) -> str:
    """A note when a median the row reads (``sides``) at batch ``b`` never settled in a report (``stable`` false: the
    machine was busy), or was timed while its threads waited for a core (``core_wait`` past ``core_wait.BUSY_ABOVE``)."""
    which, busy = [], []
    for path, sec in ((old_path, lo), (new_path, ln)):
        stats = [s for s in (getattr(sec, side).get(b) for side in sides) if s is not None]
        if any(not s.stable for s in stats):
            which.append(path)
        elif any(busy_note(s.core_wait) for s in stats):
            busy.append(path)
    note = f"; the median did not settle in {' and '.join(which)} (a busy machine)" if which else ""
    if busy:
        note += (f"; {' and '.join(busy)} {'was' if len(busy) == 1 else 'were'} timed on a busy machine (the timed threads "
                 "waited for a core, core_wait)")
    return note + ": re-run it before trusting this row" if note else ""


def _ratio_row(b: str, lo: LatencySection, ln: LatencySection, llim: float, apart: str, old_path: str,
               new_path: str) -> tuple[GateRow, dict[str, Any]]:
    """INT8's time over FP32's at batch ``b`` in each report, and its growth."""
    name = f"int8_fp32_ratio_regression_b{b}"
    ro, rn = _time_ratio(lo, b), _time_ratio(ln, b)
    if ro is None or rn is None:
        return _row(name, ro, rn, None, 100 * llim, "%", True,
                    f"not checked: {apart}, and a report has no FP32 time at batch {b} to compare ratios", SKIP)
    change = rn / ro - 1.0
    ok = change <= llim + 1e-12
    return _row(name, ro, rn, 100 * change, 100 * llim, "%", ok,
                f"INT8/FP32 time at batch {b} {ro:.3f} -> {rn:.3f} ({100 * change:+.1f}%, limit +{100 * llim:g}%; {apart})"
                + ("" if ok else f", over by {100 * (change - llim):.1f} points") + _unsteady(b, lo, ln, old_path, new_path, ("int8", "fp32")))


def _time_ratio(section: LatencySection, b: str) -> float | None:
    fp32, int8 = section.fp32.get(b), section.int8.get(b)
    if fp32 is None or int8 is None or fp32.p50_ms <= 0:
        return None
    return int8.p50_ms / fp32.p50_ms


def _side(report: ValidationReport, path: str) -> dict[str, Any]:
    return {"path": path, "schema": report.schema, "created": report.created, "vitedge_version": report.vitedge_version,
            "data_hash": report.data.data_hash, "passed": report.passed, "timed_on": report.latency.device}
