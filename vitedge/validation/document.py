"""The typed validation document: what ``validation.json`` (schema ``vitedge.validation/1``) holds.

``ValidationReport.to_json()`` is the one serializer: it gives the document's keys in the
order docs/reports.md lists them, with the values they always had, so validation.json and
the ``validation`` section of manifest.json keep their bytes. ``ValidationReport.from_json()``
reads a document back (manifest.json, a validation.json for `vitedge compare`).

Sections with a fixed set of keys are dataclasses. The accuracy and sensitivity sections,
whose keys depend on the model kind and on what the data allowed, keep their values in
order and name the figures readers use as attributes. Keys a section does not name (written
by a newer vitedge of the same major version) are kept in ``more`` and written back after
the named ones. Every section is written and read by vitedge.core.json_sections, as the manifest's are.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import ClassVar

from vitedge.core.json_sections import JsonDict, Section, ValuesSection, as_object, register_codec, value
from vitedge.validation.gate import GateRow
from vitedge.validation.latency import LatencyStats


@dataclass
class BundleSection(Section):
    path: str
    manifest_created: str | None = None
    manifest_vitedge_version: str | None = None


@dataclass
class ModelSection(Section):
    """validation.json's ``model``: what it says of the manifest's model section (its own keys)."""

    source: str | None = None
    source_sha256: str | None = None
    family: str | None = None
    variant: str | None = None
    image_size: list[int] | None = None
    num_classes: int | None = None
    output_kind: str | None = None


@dataclass
class TargetSection(Section):
    """validation.json's ``target``: the manifest's target, with the batch sizes validated."""

    name: str | None = None
    backend: str | None = None
    precision: str | None = None
    batch_sizes: list[int] = field(default_factory=list)


@dataclass
class QuantizationSection(Section):
    """validation.json's ``quantization``: the manifest's quantization section in brief."""

    layers_int8: int | None = None
    layers_total: int | None = None
    summary_line: str | None = None
    config: JsonDict | None = None


@dataclass
class ArtifactSection(Section):
    model: str | None = None
    bytes: int | None = None
    reference: str | None = None
    reference_bytes: int | None = None
    size_ratio: float | None = None


@dataclass
class RuntimeSection(Section):
    backend: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    threads: int | None = None
    platform: str | None = None
    machine: str | None = None
    cpu_count: int | None = None


@dataclass
class DataSection(Section):
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
class ThresholdsSection(Section):
    """The limits the gate applied (the profile's, locked or overridden), which flags overrode them, and notes."""

    limits: dict[str, float | None] = field(default_factory=dict)
    overridden: list[str] = field(default_factory=list)
    notes: list[str] | None = None

    def to_json(self) -> JsonDict:
        out: JsonDict = dict(self.limits, overridden=self.overridden)
        if self.notes is not None:
            out["notes"] = self.notes
        return out

    @classmethod
    def from_json(cls, data: object) -> ThresholdsSection:
        data = as_object(data)  # the limits are the keys but these two: a limit a newer vitedge adds is read as one
        overridden, notes = data.pop("overridden", []), data.pop("notes", None)
        return cls(data, overridden, notes)


class AccuracySection(ValuesSection):
    """INT8 vs FP32 on the same inputs (keys per model kind: docs/reports.md)."""

    output_kind = value("output_kind")
    labeled = value("labeled")
    samples = value("samples")
    top1_agreement = value("top1_agreement")
    fp32_top1 = value("fp32_top1")
    int8_top1 = value("int8_top1")
    fp32_top5 = value("fp32_top5")
    int8_top5 = value("int8_top5")
    top1_drop_points = value("top1_drop_points")
    logit_cosine_mean = value("logit_cosine_mean")
    logit_cosine_min = value("logit_cosine_min")
    logit_abs_error_mean = value("logit_abs_error_mean")
    logit_abs_error_max = value("logit_abs_error_max")
    softmax_kl_mean = value("softmax_kl_mean")
    embedding_cosine_mean = value("embedding_cosine_mean")
    embedding_cosine_worst1pct = value("embedding_cosine_worst1pct")
    embedding_cosine_low = value("embedding_cosine_low")
    nn_agreement = value("nn_agreement")
    per_sample = value("per_sample")  # per-image bits for `vitedge compare` (validation.per_sample)

    @property
    def is_embedding(self) -> bool:
        return self.output_kind == "embedding"

    @property
    def warnings(self) -> list[str]:
        return list(self.values.get("warnings") or ())


@dataclass
class LatencySection(Section):
    """Interleaved FP32/INT8 latency per batch size (str), when measured."""

    OMIT_NONE: ClassVar[tuple[str, ...]] = ("method", "settings", "measured_on", "device")
    measured: bool = False
    method: str | None = None
    settings: JsonDict | None = None
    fp32: dict[str, LatencyStats] = field(default_factory=dict)
    int8: dict[str, LatencyStats] = field(default_factory=dict)
    speedup: dict[str, float] = field(default_factory=dict)
    measured_on: str | None = None  # a sharded run: the node one worker timed alone on
    device: JsonDict | None = None  # what the timing ran on (Backend.timing_device); absent in reports before it

    def p50_ms(self, side: str, batch: str = "1") -> float | None:
        stats = getattr(self, side).get(batch)
        return None if stats is None else stats.p50_ms


def _latency_stats(row: JsonDict) -> LatencyStats:
    """A latency row read back; a key an unmeasured run's row lacks reads as None."""
    required = [f.name for f in fields(LatencyStats) if f.name not in ("stable", "samples_ms")]
    return LatencyStats(**{k: row.get(k) for k in required}, stable=row.get("stable", True))


@dataclass
class MemorySection(Section):
    """RSS growth of each model's load and run (``*_load_rss_bytes``), the peak RSS, and how it was read."""

    values: dict[str, int | None] = field(default_factory=dict)
    method: str | None = None

    @property
    def peak_rss_bytes(self) -> int | None:
        return self.values.get("peak_rss_bytes")

    def to_json(self) -> JsonDict:
        return dict(self.values) if self.method is None else dict(self.values, method=self.method)

    @classmethod
    def from_json(cls, data: object) -> MemorySection:
        data = as_object(data)
        return cls(data, data.pop("method", None))


class SensitivitySection(ValuesSection):
    """Per-layer sensitivity (``layers`` ranked), or ``error``: why it was not computed."""

    metric = value("metric")
    error = value("error")
    samples = value("samples")
    runtime = value("runtime")
    output_kind = value("output_kind")

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


register_codec(LatencyStats, LatencyStats.to_dict, _latency_stats)
register_codec(GateRow, GateRow.to_dict, _gate_row)


@dataclass
class ValidationReport(Section):
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

    _SECTIONS: ClassVar[tuple[str, ...]] = ("bundle", "model", "target", "quantization", "artifact", "runtime", "data",
                                            "thresholds", "accuracy", "latency", "memory")
    OMIT_NONE: ClassVar[tuple[str, ...]] = ("config", "distributed")

    def with_plots(self, plots: list[str]) -> ValidationReport:
        return replace(self, plots=list(plots))

    @classmethod
    def from_json(cls, data: object) -> ValidationReport:
        """A document read back (keys a newer vitedge added are kept in ``more``): a key it lacks reads as None, a
        section it lacks as an empty one, a list as an empty list."""
        data = as_object(data)
        filled: JsonDict = {f.name: None for f in fields(cls) if f.name != "more"}
        filled.update(data, seconds=data.get("seconds", 0.0))
        for name in cls._SECTIONS:
            filled[name] = as_object(data.get(name))
        for name in ("failures", "plots", "gate"):
            filled[name] = list(data.get(name) or ())
        return super().from_json(filled)
