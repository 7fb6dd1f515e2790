"""The typed sections of manifest.json (schema vitedge.manifest/1).

Each section is a ``vitedge.core.json_sections.Section``: its ``to_json()`` writes exactly the keys (and
key order) the versioned schema has, and its ``from_json()`` reads them back; keys this vitedge does
not know are kept as read (``more``), and an optional key absent from the file stays absent, so
reading and writing a manifest changes nothing in it. ``vitedge.bundle.manifest.Manifest`` holds these
typed sections; readers use their attributes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from vitedge.core.errors import BundleError
from vitedge.core.json_sections import ABSENT, JsonDict, Section


@dataclass
class ManifestSection(Section):
    """A section of manifest.json: one that is not a JSON object is a damaged bundle."""

    @classmethod
    def not_an_object(cls, data: object) -> JsonDict:
        raise BundleError(f"manifest.json: '{cls.key}' is {type(data).__name__}, expected an object; "
                          "the bundle is damaged or was edited by hand: rebuild it")

    # The JSON view, read-only, for code written when `vitedge.runtime.load(...).manifest` held each section as a
    # dict (``model.manifest.target["name"]``). vitedge itself reads the attributes.
    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def get(self, key: str, default: object = None) -> Any:
        return self.to_json().get(key, default)


@dataclass
class TargetSection(ManifestSection):
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
class ModelSection(ManifestSection):
    key: ClassVar[str] = "model"
    source: str
    source_sha256: str | None
    spec: dict[str, Any]  # ModelSpec.to_dict()


@dataclass
class InputSection(ManifestSection):
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
class OutputSection(ManifestSection):
    key: ClassVar[str] = "output"
    name: str  # logits | embedding
    kind: str
    class_names: list[str] | None


@dataclass
class ArtifactsSection(ManifestSection):
    key: ClassVar[str] = "artifacts"
    model: str
    reference: str
    qdq: str
    fp32_onnx: str
    built: bool  # False: the artifact is finished on the device (`vitedge engine`)
    extra: list[str]
    # fp32_onnx, the bundle's FP32 ONNX graph: {"form": "fused" (the onnx target's float rewrites of the exported
    # graph) | "exported", "source_sha256": the exported graph's sha256}; absent in bundles of earlier versions
    fp32_graph: dict[str, str] = ABSENT
    # True when the artifact is the FP32 reference itself (the target's INT8 payoff kept the whole model float): model
    # and reference name one file, and qdq and fp32_onnx one ONNX graph (the onnx target: all four the same file; intel-cpu:
    # its FP32 IR, and the FP32 ONNX graph), held once; absent otherwise and in bundles of earlier versions, which held
    # such a graph twice (model.int8.onnx a copy of it; intel-cpu also model.xml, an IR of it)
    single_graph: bool = ABSENT

    @property
    def is_built(self) -> bool:
        """Whether the artifact is finished (a manifest without the key is one written before the flag: built)."""
        return True if self.built is ABSENT else bool(self.built)

    def with_extra(self, names: set[str]) -> ArtifactsSection:
        """``names`` join the files the bundle holds beside its artifacts."""
        return dataclasses.replace(self, extra=sorted(set(self.extra or ()) | names))

    def completed(self, model: str, reference: str, extra: list[str]) -> ArtifactsSection:
        """The artifacts once the engine is built on the device: ``extra`` joins the files still there."""
        return dataclasses.replace(self, model=model, reference=reference, built=True, extra=sorted(set(self.extra or ()) | set(extra)))


@dataclass
class QuantizationSection(ManifestSection):
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
    small_gemms: dict[str, Any] = ABSENT  # float_small_gemms: {"rule": ModelOpt's source, "float": {layer: why}}
    budget: dict[str, Any] = ABSENT  # the accuracy budget's record (vitedge.budget)
    qdq_sha256: str = ABSENT  # the shared Q/DQ graph every target of the build was made from
    int8_payoff: dict[str, Any] = ABSENT  # onnx target: INT8 layers its runtime runs as float kernels, kept float (CPU kind)


SECTIONS: tuple[type[ManifestSection], ...] = (TargetSection, ModelSection, InputSection, OutputSection, ArtifactsSection,
                                       QuantizationSection)
