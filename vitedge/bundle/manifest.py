"""manifest.json: the typed record written beside every artifact, and its verification.

A bundle is trusted only when every file the manifest lists is present with the
recorded sha256. The runtime and `validate` refuse a bundle that fails that check.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from vitedge import __version__
from vitedge.bundle import trust as bundle_trust
from vitedge.core.errors import BundleError
from vitedge.files.atomic import atomic_write_path, sha256_file
from vitedge.bundle.sections import (
    ArtifactsSection,
    InputSection,
    ModelSection,
    OutputSection,
    QuantizationSection,
    TargetSection,
)
from vitedge.bundle.fields import check_field_types
from vitedge.files.safefile import BadDocument, read_json
from vitedge.bundle.spec import ModelSpec
from vitedge.files.swap import recover_swap

SCHEMA = "vitedge.manifest/1"
MANIFEST = "manifest.json"
KNOWN_SCHEMAS = (SCHEMA,)  # the manifest versions this vitedge reads


@dataclass
class Manifest:
    target: TargetSection  # profile name, backend, precision, the full profile
    model: ModelSection  # source file name and hash, ModelSpec dict
    input: InputSection  # name, format, shape (batch dim null), dtype
    output: OutputSection  # name, kind
    calibration: dict[str, Any]  # vitedge.quantize.record.Calibration.to_dict() and its summary line
    quantization: QuantizationSection
    artifacts: ArtifactsSection  # role -> relative path: model, reference, qdq, ...; plus built flag
    toolchain: dict[str, str]
    backend_info: dict[str, Any] = field(default_factory=dict)
    validation: dict[str, Any] | None = None  # ValidationReport.to_json(): typed in the validation layer, above this one
    validation_data: dict[str, Any] | None = None  # what the build validated on (vitedge.validation.data_record)
    files: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    schema: str = SCHEMA
    vitedge_version: str = __version__
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec.from_dict(self.model.spec)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "vitedge_version": self.vitedge_version,
            "created": self.created,
            "target": self.target.to_json(),
            "model": self.model.to_json(),
            "input": self.input.to_json(),
            "output": self.output.to_json(),
            "calibration": self.calibration,
            "quantization": self.quantization.to_json(),
            "artifacts": self.artifacts.to_json(),
            "backend_info": self.backend_info,
            "toolchain": self.toolchain,
            "validation": self.validation,
            "validation_data": self.validation_data,
            "files": self.files,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Manifest":
        keys = ("target", "model", "input", "output", "calibration", "quantization", "artifacts", "toolchain")
        missing = [k for k in keys if k not in d]
        if missing:
            raise BundleError(f"manifest.json lacks '{missing[0]}'; the bundle was not written by this vitedge or is damaged")
        check_field_types(d, keys)
        return cls(
            target=TargetSection.from_json(d["target"]),
            model=ModelSection.from_json(d["model"]),
            input=InputSection.from_json(d["input"]),
            output=OutputSection.from_json(d["output"]),
            calibration=d["calibration"],
            quantization=QuantizationSection.from_json(d["quantization"]),
            artifacts=ArtifactsSection.from_json(d["artifacts"]),
            toolchain=d["toolchain"],
            backend_info=d.get("backend_info", {}),
            validation=d.get("validation"),
            validation_data=d.get("validation_data"),
            files=d.get("files", {}),
            schema=d.get("schema", SCHEMA),
            vitedge_version=d.get("vitedge_version", "?"),
            created=d.get("created", ""),
        )

    def hash_files(self, bundle: Path) -> None:
        """Record the sha256 of every file in the bundle but the manifest and reports."""
        self.files = {
            str(p.relative_to(bundle)): sha256_file(p)
            for p in sorted(bundle.rglob("*"))
            if p.is_file() and p.name not in (MANIFEST, bundle_trust.SIGNATURE) and not p.relative_to(bundle).parts[0] == "report"
        }

    def write(self, bundle: Path) -> Path:

        path = bundle / MANIFEST
        with atomic_write_path(path) as tmp:
            tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")
        bundle_trust.sign(bundle)
        return path


MAX_MANIFEST_BYTES = 64 << 20  # a manifest is kB to a few MB (validation's per-image bits of 2,000,000 images: ~0.7 MB)


def read_manifest(bundle: Path) -> Manifest:
    bundle = Path(bundle)
    recover_swap(bundle)  # a --force rebuild killed mid-swap: finish or roll back first
    if not bundle.is_dir():
        raise BundleError(f"bundle {bundle} does not exist or is not a folder")
    path = bundle / MANIFEST
    if not path.is_file():
        raise BundleError(f"{bundle} has no manifest.json: not a complete vitedge bundle (an interrupted build leaves none)")
    try:
        data = read_json(path, what="vitedge manifest", limit=MAX_MANIFEST_BYTES)
    except OSError as err:  # a bundle from elsewhere: its manifest is data, a regular file of a few MB at most
        raise BundleError(f"{err}: not a vitedge manifest") from None
    except BadDocument as err:
        raise BundleError(f"{err}; rebuild the bundle") from None
    if not str(data.get("schema", "")).startswith("vitedge.manifest/"):
        raise BundleError(f"{path} is not a vitedge manifest (no 'schema': '{SCHEMA}')")
    if data["schema"] not in KNOWN_SCHEMAS:  # another version's fields would be read as this one's
        raise BundleError(f"{path} has schema {str(data['schema'])[:80]!r}, which this vitedge does not read (it reads "
                          f"{', '.join(KNOWN_SCHEMAS)}): a bundle from another vitedge version; rebuild it with this one")
    manifest = Manifest.from_dict(data)
    bundle_trust.check_contained(bundle, manifest)
    return manifest


def verify_bundle(bundle: Path) -> Manifest:
    """Read the manifest and check every listed file's hash; a one-line BundleError otherwise."""
    bundle = Path(bundle)
    manifest = read_manifest(bundle)
    bundle_trust.check_signature(bundle)
    for rel, digest in manifest.files.items():
        path = bundle / rel
        if not path.is_file():
            raise BundleError(f"{bundle}: {rel} is listed in manifest.json but missing; rebuild the bundle")
        if sha256_file(path) != digest:
            raise BundleError(f"{bundle}: {rel} does not match its sha256 in manifest.json (altered or corrupt); rebuild the bundle")
    for role in ("model", "reference"):
        rel = getattr(manifest.artifacts, role)
        if rel and rel not in manifest.files and manifest.artifacts.is_built:
            raise BundleError(f"{bundle}: manifest.json names {role} '{rel}' but records no hash for it")
    return manifest


def toolchain_versions(extra: dict[str, str] | None = None) -> dict[str, str]:
    versions = {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(), "vitedge": __version__}
    for name in ("torch", "onnx", "onnxruntime", "numpy"):
        module = sys.modules.get(name)
        if module is None:
            try:
                module = __import__(name)
            except ImportError:
                continue
        versions[name] = getattr(module, "__version__", "?")
    versions.update(extra or {})
    return versions
