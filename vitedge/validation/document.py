"""The typed validation document: what ``validation.json`` (schema ``vitedge.validation/1``) holds.

``ValidationReport.to_json()`` is the one serializer: it gives the document's keys in the
order docs/reports.md lists them, with the values they always had, so validation.json and
the ``validation`` section of manifest.json keep their bytes. ``ValidationReport.from_json()``
reads a document back (manifest.json, a validation.json for `vitedge compare`).

Sections with a fixed set of keys are dataclasses. The accuracy and sensitivity sections,
whose keys depend on the model kind and on what the data allowed, keep their values in
order and name the figures readers use as attributes. Keys a section does not name (written
by a newer vitedge of the same major version) are kept in ``extra`` and written back after
the named ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, TypeVar

from vitedge.validation.gate import GateRow
from vitedge.validation.latency import LatencyStats

JsonDict = dict[str, Any]
S = TypeVar("S", bound="_Section")


class _Section:
    """A section with named keys: written in field order, ``None`` left out for the ``OMIT_NONE`` ones."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ()
    extra: JsonDict

    def section_json(self) -> JsonDict:
        out: JsonDict = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name != "extra" and not (value is None and f.name in self.OMIT_NONE):
                out[f.name] = value
        out.update(self.extra)
        return out

    @classmethod
    def section_from(cls: type[S], data: JsonDict | None) -> S:
        data = _obj(data)
        names = [f.name for f in fields(cls) if f.name != "extra"]  # type: ignore[arg-type]
        return cls(**{n: data.get(n) for n in names}, extra={k: v for k, v in data.items() if k not in names})


class _Values:
    """A section whose keys vary: its values in order, the ones readers use named by attributes."""

    def __init__(self, values: JsonDict | None = None) -> None:
        self.values: JsonDict = _obj(values)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def section_json(self) -> JsonDict:
        return dict(self.values)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.values == self.values  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.values!r})"


def _obj(value: object) -> JsonDict:
    """A JSON object as a new dict; anything else (a malformed document) as an empty one."""
    return dict(value) if isinstance(value, dict) else {}


def _value(key: str) -> property:
    return property(lambda self: self.values.get(key), doc=f"the document's ``{key}``, None when absent")


@dataclass
class BundleSection(_Section):
    path: str
    manifest_created: str | None = None
    manifest_vitedge_version: str | None = None
    extra: JsonDict = field(default_factory=dict)


@dataclass
class ModelSection(_Section):
    source: str | None = None
    source_sha256: str | None = None
    family: str | None = None
    variant: str | None = None
    image_size: list[int] | None = None
    num_classes: int | None = None
    output_kind: str | None = None
    extra: JsonDict = field(default_factory=dict)


@dataclass
class TargetSection(_Section):
    name: str | None = None
    backend: str | None = None
    precision: str | None = None
    batch_sizes: list[int] = field(default_factory=list)
    extra: JsonDict = field(default_factory=dict)


@dataclass
class QuantizationSection(_Section):
    layers_int8: int | None = None
    layers_total: int | None = None
    summary_line: str | None = None
    config: JsonDict | None = None
    extra: JsonDict = field(default_factory=dict)


@dataclass
class ArtifactSection(_Section):
    model: str | None = None
    bytes: int | None = None
    reference: str | None = None
    reference_bytes: int | None = None
    size_ratio: float | None = None
    extra: JsonDict = field(default_factory=dict)


@dataclass
class RuntimeSection(_Section):
    backend: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    threads: int | None = None
    platform: str | None = None
    machine: str | None = None
    cpu_count: int | None = None
    extra: JsonDict = field(default_factory=dict)


@dataclass
class DataSection(_Section):
    """What the inputs were; ``reference``/``int8_outputs``: the output caches' lookups; ``probe_outputs``: the FP32
    preprocessing probe's, per mean shift ("-0.25", "+0.25"), when it ran; ``role``: validation or calibration."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("reference", "int8_outputs", "probe_outputs", "role")
    path: str | None = None
    kind: str | None = None
    items: int | None = None
    labeled: bool | None = None
    data_hash: str | None = None
    classes_present: int | None = None
    reference: JsonDict | None = None
    int8_outputs: JsonDict | None = None
    probe_outputs: JsonDict | None = None
    role: str | None = None
    extra: JsonDict = field(default_factory=dict)

    def cache_hit(self, key: str) -> bool:
        """Whether the outputs named ``key`` (reference, int8_outputs) came from the validation cache."""
        return (getattr(self, key) or {}).get("cache") == "hit"

    def shared_fp32(self) -> JsonDict | None:
        """When the FP32 outputs were computed by another runtime for the same FP32 graph and spot-checked here
        (``reference_cache.SHARED``): who computed them and what the spot check saw; else None."""
        ref = self.reference or {}
        shared = ref.get("shared")
        return shared if ref.get("cache") == "shared" and isinstance(shared, dict) else None


@dataclass
class ThresholdsSection:
    """The limits the gate applied (the profile's, locked or overridden), which flags overrode them, and notes."""

    limits: dict[str, float | None] = field(default_factory=dict)
    overridden: list[str] = field(default_factory=list)
    notes: list[str] | None = None

    def section_json(self) -> JsonDict:
        out: JsonDict = dict(self.limits, overridden=self.overridden)
        if self.notes is not None:
            out["notes"] = self.notes
        return out

    @classmethod
    def section_from(cls, data: JsonDict | None) -> ThresholdsSection:
        data = _obj(data)
        overridden, notes = data.pop("overridden", []), data.pop("notes", None)
        return cls(data, overridden, notes)


class AccuracySection(_Values):
    """INT8 vs FP32 on the same inputs (keys per model kind: docs/reports.md)."""

    output_kind = _value("output_kind")
    labeled = _value("labeled")
    samples = _value("samples")
    top1_agreement = _value("top1_agreement")
    fp32_top1 = _value("fp32_top1")
    int8_top1 = _value("int8_top1")
    fp32_top5 = _value("fp32_top5")
    int8_top5 = _value("int8_top5")
    top1_drop_points = _value("top1_drop_points")
    logit_cosine_mean = _value("logit_cosine_mean")
    logit_cosine_min = _value("logit_cosine_min")
    logit_abs_error_mean = _value("logit_abs_error_mean")
    logit_abs_error_max = _value("logit_abs_error_max")
    softmax_kl_mean = _value("softmax_kl_mean")
    embedding_cosine_mean = _value("embedding_cosine_mean")
    embedding_cosine_worst1pct = _value("embedding_cosine_worst1pct")
    embedding_cosine_low = _value("embedding_cosine_low")
    nn_agreement = _value("nn_agreement")
    per_sample = _value("per_sample")  # per-image bits for `vitedge compare` (validation.per_sample)

    @property
    def is_embedding(self) -> bool:
        return self.output_kind == "embedding"

    @property
    def warnings(self) -> list[str]:
        return list(self.values.get("warnings") or ())


@dataclass
class LatencySection:
    """Interleaved FP32/INT8 latency per batch size (str), when measured."""

    measured: bool = False
    method: str | None = None
    settings: JsonDict | None = None
    fp32: dict[str, LatencyStats] = field(default_factory=dict)
    int8: dict[str, LatencyStats] = field(default_factory=dict)
    speedup: dict[str, float] = field(default_factory=dict)
    measured_on: str | None = None  # a sharded run: the node one worker timed alone on
    device: JsonDict | None = None  # what the timing ran on (Backend.timing_device); absent in reports before it

    def section_json(self) -> JsonDict:
        out: JsonDict = {"measured": self.measured}
        if self.method is not None:
            out["method"] = self.method
        if self.settings is not None:
            out["settings"] = self.settings
        out["fp32"] = {b: s.to_dict() for b, s in self.fp32.items()}
        out["int8"] = {b: s.to_dict() for b, s in self.int8.items()}
        out["speedup"] = self.speedup
        if self.measured_on is not None:
            out["measured_on"] = self.measured_on
        if self.device is not None:
            out["device"] = self.device
        return out

    @classmethod
    def section_from(cls, data: JsonDict | None) -> LatencySection:
        data = _obj(data)
        return cls(bool(data.get("measured")), data.get("method"), data.get("settings"), _stats(data.get("fp32")),
                   _stats(data.get("int8")), _obj(data.get("speedup")), data.get("measured_on"),
                   data.get("device") if isinstance(data.get("device"), dict) else None)

    def p50_ms(self, side: str, batch: str = "1") -> float | None:
        stats = getattr(self, side).get(batch)
        return None if stats is None else stats.p50_ms


def _stats(rows: dict[str, JsonDict] | None) -> dict[str, LatencyStats]:
    """Latency rows read back; a key an unmeasured run's row lacks reads as None."""
    required = [f.name for f in fields(LatencyStats) if f.name not in ("stable", "samples_ms")]
    return {b: LatencyStats(**{k: row.get(k) for k in required}, stable=row.get("stable", True))
            for b, row in _obj(rows).items() if isinstance(row, dict)}


@dataclass
class MemorySection:
    """RSS growth of each model's load and run (``*_load_rss_bytes``), the peak RSS, and how it was read."""

    values: dict[str, int | None] = field(default_factory=dict)
    method: str | None = None

    @property
    def peak_rss_bytes(self) -> int | None:
        return self.values.get("peak_rss_bytes")

    def section_json(self) -> JsonDict:
        return dict(self.values) if self.method is None else dict(self.values, method=self.method)

    @classmethod
    def section_from(cls, data: JsonDict | None) -> MemorySection:
        data = _obj(data)
        return cls(data, data.pop("method", None))


class SensitivitySection(_Values):
    """Per-layer sensitivity (``layers`` ranked), or ``error``: why it was not computed."""

    metric = _value("metric")
    error = _value("error")
    samples = _value("samples")
    runtime = _value("runtime")
    output_kind = _value("output_kind")

    @property
    def layers(self) -> list[JsonDict]:
        return list(self.values.get("layers") or ())

    @property
    def baseline(self) -> JsonDict:
        return self.values.get("baseline") or {}

    @property
    def full(self) -> JsonDict:
        return self.values.get("full") or {}


def _gate_row(data: JsonDict) -> GateRow:
    names = [f.name for f in fields(GateRow)]
    return GateRow(**{k: v for k, v in data.items() if k in names})


@dataclass
class ValidationReport:
    """One validation of a bundle: the content of validation.json, typed."""

    schema: str
    producer: str
    vitedge_version: str
    created: str
    passed: bool
    failures: list[str]
    bundle: BundleSection
    model: ModelSection
    target: TargetSection
    quantization: QuantizationSection
    artifact: ArtifactSection
    runtime: RuntimeSection
    data: DataSection
    thresholds: ThresholdsSection
    accuracy: AccuracySection
    latency: LatencySection
    speedup: float | None
    memory: MemorySection
    gate: list[GateRow]
    sensitivity: SensitivitySection | None = None
    seconds: float = 0.0
    plots: list[str] = field(default_factory=list)
    config: JsonDict | None = None  # the project config the command read (absent when none was)
    distributed: JsonDict | None = None  # a sharded run: what ran where (vitedge.distributed)
    extra: JsonDict = field(default_factory=dict)

    _SECTIONS: ClassVar[dict[str, Any]] = {
        "bundle": BundleSection, "model": ModelSection, "target": TargetSection, "quantization": QuantizationSection,
        "artifact": ArtifactSection, "runtime": RuntimeSection, "data": DataSection, "thresholds": ThresholdsSection,
        "accuracy": AccuracySection, "latency": LatencySection, "memory": MemorySection,
    }
    _OMIT_NONE: ClassVar[tuple[str, ...]] = ("config", "distributed")

    def with_plots(self, plots: list[str]) -> ValidationReport:
        return replace(self, plots=list(plots))

    def to_json(self) -> JsonDict:
        """The document, as written to validation.json and manifest.json (the one serializer)."""
        out: JsonDict = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (value is None and f.name in self._OMIT_NONE):
                continue
            if f.name == "gate":
                value = [r.to_dict() for r in value]
            elif value is not None and hasattr(value, "section_json"):
                value = value.section_json()
            out[f.name] = value
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, data: JsonDict) -> ValidationReport:
        """A document read back (keys a newer vitedge added are kept in ``extra``)."""
        names = [f.name for f in fields(cls) if f.name != "extra"]
        values: JsonDict = {n: data.get(n) for n in names}
        for name, kind in cls._SECTIONS.items():
            values[name] = kind(data.get(name)) if issubclass(kind, _Values) else kind.section_from(data.get(name))
        sens = data.get("sensitivity")
        values["sensitivity"] = None if sens is None else SensitivitySection(sens)
        values["gate"] = [_gate_row(r) for r in data.get("gate") or () if isinstance(r, dict)]
        values["failures"] = list(data.get("failures") or ())
        values["plots"] = list(data.get("plots") or ())
        values["seconds"] = data.get("seconds", 0.0)
        return cls(**values, extra={k: v for k, v in data.items() if k not in names})
