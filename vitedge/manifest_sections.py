"""The typed sections of manifest.json (schema vitedge.manifest/1).

Each section is a dataclass whose ``to_json()`` writes exactly the keys (and key order) the
versioned schema has, and whose ``from_json()`` reads them back; keys this vitedge does not
know are kept as read (``more``), and an optional key absent from the file stays absent, so
reading and writing a manifest changes nothing in it. `vitedge build` and `vitedge engine`
write the manifest through these types (vitedge.app); readers keep the JSON view
(vitedge.manifest.Manifest holds each section's ``to_json()``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vitedge.errors import BundleError


class _Absent:
    """An optional key that is not in the manifest (written as no key, not as null)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()


@dataclass
class Section:
    """Base of every manifest section: to_json/from_json over the dataclass fields, in order."""

    key: ClassVar[str] = ""  # the section's key in manifest.json
    more: dict[str, Any] = field(default_factory=dict, kw_only=True)  # keys this vitedge does not know, kept as read

    @classmethod
    def _names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name != "more"]

    def to_json(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self._names() if getattr(self, name) is not ABSENT}
        out.update(self.more)
        return out

    @classmethod
    def from_json(cls, data: Any):
        if not isinstance(data, dict):
            raise BundleError(f"manifest.json: '{cls.key}' is {type(data).__name__}, expected an object; "
                              "the bundle is damaged or was edited by hand: rebuild it")
        names = cls._names()
        return cls(**{n: data.get(n, ABSENT) for n in names}, more={k: v for k, v in data.items() if k not in names})


@dataclass
class TargetSection(Section):
    key: ClassVar[str] = "target"
    name: str
    backend: str
    precision: str
    profile: dict[str, Any]  # the full target profile (TargetProfile.to_dict())
    family: dict[str, Any] = ABSENT  # a family bundle completed on the device: the member chosen, and why

    def with_member(self, profile: dict[str, Any], family: dict[str, Any]) -> TargetSection:
        """The member profile an engine was built with is the bundle's profile now; the family stays for rebuilds."""
        return dataclasses.replace(self, profile=profile, family=family)


@dataclass
class ModelSection(Section):
    key: ClassVar[str] = "model"
    source: str
    source_sha256: str | None
    spec: dict[str, Any]  # ModelSpec.to_dict()


@dataclass
class InputSection(Section):
    key: ClassVar[str] = "input"
    name: str
    format: str  # float32-nchw | uint8-nhwc (preprocessing baked into the graph)
    shape: list[Any]  # batch dim null
    dtype: str
    channels: int
    color_mode: str
    preprocess: dict[str, Any]
    preprocess_baked: bool


@dataclass
class OutputSection(Section):
    key: ClassVar[str] = "output"
    name: str  # logits | embedding
    kind: str
    class_names: list[str] | None


@dataclass
class ArtifactsSection(Section):
    key: ClassVar[str] = "artifacts"
    model: str
    reference: str
    qdq: str
    fp32_onnx: str
    built: bool  # False: the artifact is finished on the device (`vitedge engine`)
    extra: list[str]

    def completed(self, model: str, reference: str, extra: list[str]) -> ArtifactsSection:
        """The artifacts once the engine is built on the device: ``extra`` joins the files still there."""
        return dataclasses.replace(self, model=model, reference=reference, built=True, extra=sorted(set(self.extra or ()) | set(extra)))


@dataclass
class QuantizationSection(Section):
    key: ClassVar[str] = "quantization"
    config: dict[str, Any]
    layers_total: int
    layers_int8: int
    kept_float: list[str]
    layer_kinds: dict[str, Any]
    summary_line: str
    weight_range: str
    cpu_requirement: str
    kept_float_detail: list[dict[str, Any]] = ABSENT  # with the accuracy budget: why each layer stayed float
    budget: dict[str, Any] = ABSENT  # the accuracy budget's record (vitedge.budget)
    qdq_sha256: str = ABSENT  # the shared Q/DQ graph every target of the build was made from
    int8_payoff: dict[str, Any] = ABSENT  # onnx target: INT8 layers its runtime runs as float kernels, kept float (CPU kind)


SECTIONS: tuple[type[Section], ...] = (TargetSection, ModelSection, InputSection, OutputSection, ArtifactsSection,
                                       QuantizationSection)
