"""Target profiles: one TOML file per device, validated strictly.

A profile names its backend, precision, batch sizes, backend options and the parity
thresholds a build must meet. Users add a device by adding a file (to `targets/`, or to a folder
of their own listed in VITEDGE_TARGETS_PATH); a typo'd key is an error naming the file and the
key, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from vitedge.core import limits
from vitedge.backends import get_backend, list_backends
from vitedge.backends.tensorrt.members import FamilyOptions
from vitedge.core.cpu import CpuInfo, read_cpu
from vitedge.core.errors import ProfileError, UsageError
from vitedge.targets.families import is_family, list_families, load_family
from vitedge.core.limits import check_number
from vitedge.core.paths import find_target_file, target_files
from vitedge.files.safefile import BadDocument, read_toml
from vitedge.quantize.config import QuantConfig

PRECISIONS = ("int8",)
DEFAULT_NEAR_TIE_MARGIN = 0.5  # see Thresholds.near_tie_margin; measured on the corpus: docs/gate.md
DEFAULT_DROP_CONFIDENCE = 0.95  # see Thresholds.drop_confidence
DEFAULT_MIN_DECISIVE_AGREEMENT = 0.995  # see Thresholds.min_decisive_agreement; measured on the corpus: docs/gate.md


@dataclass(frozen=True)
class Thresholds:
    """The parity gate. Drops are in top-1 percentage points; agreement is a fraction.

    Embedding models (headless encoders) are gated on the per-sample cosine similarity of their
    INT8 and FP32 embeddings instead: its mean, and its ``embedding_cosine_percentile``-th
    percentile (the worst samples). Nearest-neighbour agreement is reported for them, and gated
    only when ``min_nn_agreement`` is set (it is chaotic when the embeddings lie close together)."""

    max_top1_drop: float = 0.5
    min_agreement: float = 0.99
    min_speedup: float = 1.0
    max_p99_ms: float | None = None
    # The speed floor on x86 CPUs without VNNI/AMX, where a runtime may have no INT8 kernel
    # faster than its FP32 one (OpenVINO's pre-VNNI int8 GEMM: docs/cpu-targets.md). None:
    # min_speedup everywhere. Passing --min-speedup overrides both.
    min_speedup_without_vnni: float | None = None
    min_embedding_cosine: float = 0.99
    min_embedding_cosine_low: float = 0.98
    embedding_cosine_percentile: float = 5.0
    min_nn_agreement: float | None = None
    # Near-tie noise (vitedge.validation.noise, docs/gate.md): an image is decisive when FP32's top-1
    # softmax probability beats its runner-up's by this much. Agreement on the decisive images is its own
    # row (min_decisive_agreement), always judged; overall agreement under min_agreement is then shown as
    # information (the flips beyond it are near-ties). 0: every image counts (the plain agreement gate).
    near_tie_margin: float = DEFAULT_NEAR_TIE_MARGIN
    # Least top-1 agreement with FP32 on the decisive images (a fraction): flips of more than 0.5 % of the images
    # FP32 is sure of fail, whatever the labels say (0.99 let builds that flip 1.4 % of them pass on a few hundred
    # images: docs/gate.md). Judged with at least 30 decisive images.
    min_decisive_agreement: float = DEFAULT_MIN_DECISIVE_AGREEMENT
    # Two-sided confidence of the top-1 drop's exact paired interval; the drop fails only when the
    # interval lies above max_top1_drop. 0: the plain point estimate decides.
    drop_confidence: float = DEFAULT_DROP_CONFIDENCE

    def __post_init__(self) -> None:
        for name in ("max_top1_drop", "min_agreement", "min_speedup", "max_p99_ms"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
                raise UsageError(f"{name} must be a finite number, got {value!r}")
        if self.max_top1_drop < 0:
            raise UsageError(f"max_top1_drop must be >= 0 points, got {self.max_top1_drop}")
        if not 0 <= self.min_agreement <= 1:
            raise UsageError(f"min_agreement must be a fraction in [0, 1], got {self.min_agreement}")
        value = self.min_decisive_agreement
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise UsageError(f"min_decisive_agreement must be a fraction in [0, 1], got {value!r}")
        if self.min_speedup < 0:
            raise UsageError(f"min_speedup must be >= 0, got {self.min_speedup}")
        if self.min_speedup_without_vnni is not None and self.min_speedup_without_vnni < 0:
            raise UsageError(f"min_speedup_without_vnni must be >= 0, got {self.min_speedup_without_vnni}")
        if self.max_p99_ms is not None and self.max_p99_ms <= 0:
            raise UsageError(f"max_p99_ms must be positive, got {self.max_p99_ms}")
        for name in ("min_embedding_cosine", "min_embedding_cosine_low"):
            if not -1 <= getattr(self, name) <= 1:
                raise UsageError(f"{name} must be a cosine in [-1, 1], got {getattr(self, name)}")
        if not 0 <= self.embedding_cosine_percentile <= 50:
            raise UsageError(f"embedding_cosine_percentile must be in [0, 50] (a low percentile), got {self.embedding_cosine_percentile}")
        if self.min_nn_agreement is not None and not 0 <= self.min_nn_agreement <= 1:
            raise UsageError(f"min_nn_agreement must be a fraction in [0, 1], got {self.min_nn_agreement}")
        # then every field finite and within its sane bound (vitedge.core.limits): nan passes the comparisons above
        check_number("max_top1_drop (points)", self.max_top1_drop, 0.0, limits.MAX_TOP1_DROP)
        check_number("min_speedup", self.min_speedup, 0.0, limits.MAX_SPEEDUP)
        if self.max_p99_ms is not None:
            check_number("max_p99_ms", self.max_p99_ms, 0.0, limits.MAX_P99_MS, lo_open=True)
        if self.min_speedup_without_vnni is not None:
            check_number("min_speedup_without_vnni", self.min_speedup_without_vnni, 0.0, limits.MAX_SPEEDUP)
        for name in ("min_embedding_cosine", "min_embedding_cosine_low"):
            check_number(name, getattr(self, name), -1.0, 1.0)
        check_number("embedding_cosine_percentile", self.embedding_cosine_percentile, 0.0, 50.0)
        if self.min_nn_agreement is not None:
            check_number("min_nn_agreement", self.min_nn_agreement, 0.0, 1.0)
        for name, top in (("near_tie_margin", 1.0), ("drop_confidence", 0.9999)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= top:
                raise UsageError(f"{name} must be a number in [0, {top:g}] (0 switches it off), got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def speedup_floor(self, cpu: CpuInfo | None = None) -> tuple[float, str]:
        """(the least speedup the gate accepts on ``cpu``, why): min_speedup, or the profile's
        min_speedup_without_vnni on an x86 CPU without VNNI/AMX."""
        if self.min_speedup_without_vnni is None:
            return self.min_speedup, ""

        cpu = cpu or read_cpu()
        if cpu.is_x86 and cpu.int8_dot_product is False:
            return self.min_speedup_without_vnni, f" on this {cpu.isa} CPU (profile min_speedup_without_vnni)"
        return self.min_speedup, ""

    def with_overrides(self, overrides: dict[str, Any]) -> "Thresholds":
        """These thresholds with the CLI's (non-None) values; --min-speedup replaces the CPU-dependent floor too."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        if "min_speedup" in changes:
            changes.setdefault("min_speedup_without_vnni", None)
        return dataclasses.replace(self, **changes) if changes else self


THRESHOLD_FIELDS = ("max_top1_drop", "min_agreement", "min_speedup", "max_p99_ms", "min_embedding_cosine",
                    "min_embedding_cosine_low", "min_nn_agreement", "near_tie_margin", "drop_confidence",
                    "min_decisive_agreement")


@dataclass(frozen=True, kw_only=True)
class ThresholdOverrides:
    """The gate flags of `vitedge build` (and a matrix's ``[build]`` table), each named as the
    ``vitedge.targets.profiles.Thresholds`` field it sets."""

    max_top1_drop: float | None = None
    min_agreement: float | None = None
    min_speedup: float | None = None
    max_p99_ms: float | None = None
    min_embedding_cosine: float | None = None
    min_embedding_cosine_low: float | None = None
    min_nn_agreement: float | None = None
    near_tie_margin: float | None = None
    drop_confidence: float | None = None
    min_decisive_agreement: float | None = None

    @classmethod
    def of(cls, values: Mapping[str, float | None]) -> ThresholdOverrides:
        """From a mapping of field -> value (unknown names are a bug of the caller: TypeError)."""
        return cls(**dict(values))

    @classmethod
    def pop_flags(cls, flags: dict[str, object]) -> ThresholdOverrides:
        """Take the gate flags (``THRESHOLD_FIELDS``) out of a command's flags and read them."""
        return cls.of({k: flags.pop(k, None) for k in THRESHOLD_FIELDS})  # type: ignore[misc]

    def set_values(self) -> dict[str, float]:
        """Only the fields set, by name."""
        return {k: getattr(self, k) for k in THRESHOLD_FIELDS if getattr(self, k) is not None}

    def over(self, base: Thresholds) -> Thresholds:
        """``base`` with the values set here over it (checked where they were read: ``apply``, the command)."""
        return base.with_overrides(self.set_values())

    def apply(self, base: Thresholds) -> Thresholds:
        """``base`` with these values over it; a value out of range names the flag, not the profile key."""
        for k, v in self.set_values().items():
            try:
                dataclasses.replace(Thresholds(), **{k: v})
            except UsageError as err:
                raise UsageError(f"--{k.replace('_', '-')}: {err}") from None
        return self.over(base)


@dataclass(frozen=True)
class TargetProfile:
    name: str
    description: str
    backend: str
    precision: str
    batch_sizes: tuple[int, ...]
    thresholds: Thresholds
    backend_options: Any  # the backend's options dataclass
    quantization: dict[str, Any] = field(default_factory=dict)  # QuantConfig overrides
    source: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "backend": self.backend,
            "precision": self.precision,
            "batch_sizes": list(self.batch_sizes),
            "thresholds": self.thresholds.to_dict(),
            "backend_options": dataclasses.asdict(self.backend_options),
            "quantization": dict(self.quantization),
            "source": str(self.source) if self.source else None,
        }


_TOP_KEYS = {"name", "description", "backend", "precision", "batch_sizes", "thresholds", "backend_options", "quantization"}
_REQUIRED = ("backend", "precision")


def list_profiles() -> list[Path]:
    """Every target profile file: vitedge's `targets/` and the folders in VITEDGE_TARGETS_PATH (vitedge.core.paths)."""
    return target_files()


def resolve_profile_path(name_or_path: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or "/" in name_or_path or candidate.exists():
        if not candidate.is_file():
            raise ProfileError(f"target profile file {candidate} does not exist")
        return candidate
    path = find_target_file(name_or_path)
    if path is None:

        known = ", ".join([p.stem for p in list_profiles()] + [p.stem for p in list_families()])
        raise ProfileError(f"unknown target '{name_or_path}'; known targets: {known} (or pass a path to your own .toml)")
    return path


def load_profile(name_or_path: str) -> TargetProfile:

    if is_family(name_or_path):  # jetson, nvidia-gpu: one bundle for several device profiles
        return family_profile(name_or_path)
    path = resolve_profile_path(name_or_path)
    try:
        data = read_toml(path)
    except BadDocument as err:
        raise ProfileError(str(err)) from None
    except OSError as err:
        raise ProfileError(f"{path}: cannot be read as a profile ({err}); pass a target name or a profile .toml") from None
    return parse_profile(data, path)


def _type_error(path: Path, key: str, expected: str, value: object) -> ProfileError:
    return ProfileError(f"{path}: '{key}' must be {expected}, got {value!r}")


def parse_profile(data: dict[str, Any], path: Path) -> TargetProfile:

    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ProfileError(f"{path}: unknown key '{unknown[0]}' (allowed: {', '.join(sorted(_TOP_KEYS))})")
    for key in _REQUIRED:
        if key not in data:
            raise ProfileError(f"{path}: missing required key '{key}'")
    backend = data["backend"]
    if backend not in list_backends():
        raise ProfileError(f"{path}: unknown backend '{backend}' (known: {', '.join(list_backends())})")
    precision = data["precision"]
    if precision not in PRECISIONS:
        raise ProfileError(f"{path}: precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    sizes = data.get("batch_sizes", [1])
    if not isinstance(sizes, list) or not sizes or not all(limits.within(b, 1, limits.MAX_BATCH, integer=True) for b in sizes):
        raise _type_error(path, "batch_sizes", f"a non-empty list of integers in [1, {limits.MAX_BATCH}]", sizes)
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise _type_error(path, key, "a string", data[key])
    thresholds = _parse_section(Thresholds, data.get("thresholds", {}), path, "thresholds")
    options_type = get_backend(backend).options_type
    options = _parse_section(options_type, data.get("backend_options", {}), path, "backend_options")
    quant = data.get("quantization", {})
    if not isinstance(quant, dict):
        raise _type_error(path, "quantization", "a table", quant)
    _check_quantization_keys(quant, path)
    return TargetProfile(
        name=data.get("name", path.stem),
        description=data.get("description", ""),
        backend=backend,
        precision=precision,
        batch_sizes=tuple(sorted(set(sizes))),
        thresholds=thresholds,
        backend_options=options,
        quantization=quant,
        source=path,
    )


def _parse_section(cls: type, values: Any, path: Path, section: str) -> Any:
    if not isinstance(values, dict):
        raise _type_error(path, section, "a table", values)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in values.items():
        if key not in fields:
            raise ProfileError(f"{path}: unknown key '{section}.{key}' (allowed: {', '.join(sorted(fields))})")
        expected = _expected_types(fields[key])
        if expected and not (isinstance(value, expected) and not (isinstance(value, bool) and bool not in expected)):
            names = " or ".join(t.__name__ for t in expected)
            raise _type_error(path, f"{section}.{key}", f"of type {names}", value)
    try:
        return cls(**values)
    except UsageError as err:
        raise ProfileError(f"{path}: [{section}] {err}") from None


def _expected_types(f: dataclasses.Field) -> tuple[type, ...]:
    text = str(f.type)
    out: list[type] = []
    for name, typ in (("bool", bool), ("int", int), ("float", float), ("str", str), ("list", list), ("tuple", list), ("dict", dict)):
        if name in text:
            out.append(typ)
    if float in out and int not in out:
        out.append(int)  # 1 is a fine float in TOML
    return tuple(out)


def _check_quantization_keys(quant: dict[str, Any], path: Path) -> None:
    allowed = {f.name for f in dataclasses.fields(QuantConfig)}
    for key in quant:
        if key not in allowed:
            raise ProfileError(f"{path}: unknown key 'quantization.{key}' (allowed: {', '.join(sorted(allowed))})")
    try:
        QuantConfig(**quant)
    except (UsageError, TypeError) as err:
        # QuantConfig names CLI flags; here the value came from the profile, so name its key
        text = re.sub(r"--([a-z-]+)", lambda m: "quantization." + m.group(1).replace("-", "_"), str(err))
        raise ProfileError(f"{path}: [quantization] {text}") from None


def family_profile(name: str):
    """The TargetProfile `vitedge build --target FAMILY` builds with: the members' union of batch
    sizes, the strictest accuracy gate, and every member's profile in its backend_options."""

    fam = load_family(name)
    members = [load_profile(p) for p in fam.profiles]
    wrong = [m.name for m in members if m.backend != fam.backend]
    if wrong:
        raise ProfileError(f"{fam.source}: member profile {wrong[0]} is not a {fam.backend} profile")
    quant = [m.quantization for m in members]
    if any(q != quant[0] for q in quant):
        raise ProfileError(f"{fam.source}: member profiles set different [quantization]; a family shares one Q/DQ graph")
    thresholds = dataclasses.replace(
        members[0].thresholds,
        max_top1_drop=min(m.thresholds.max_top1_drop for m in members),
        min_agreement=max(m.thresholds.min_agreement for m in members),
        min_decisive_agreement=max(m.thresholds.min_decisive_agreement for m in members),
    )
    return TargetProfile(
        name=fam.name, description=fam.description, backend=fam.backend, precision=members[0].precision,
        batch_sizes=tuple(sorted({b for m in members for b in m.batch_sizes})), thresholds=thresholds,
        backend_options=FamilyOptions(family=fam.to_dict(), members={m.name: m.to_dict() for m in members}),
        quantization=dict(quant[0]), source=fam.source)
