"""Target-family members: the pure rules that pick a family bundle's member profile for the device
found at engine-build time (no files read here: vitedge.targets.families loads the TOML files).

A family record (TargetFamily.to_dict(), kept in the bundle's manifest) lists its member profiles
and the rules that recognise each member's device from facts read on it (the device-tree model
and compatible strings, the L4T release); `select_member` applies them.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitedge.core.errors import ProfileError, UsageError

_TOP_KEYS = {"name", "description", "backend", "profiles", "match", "min_l4t"}
_RULE_KEYS = {"profile", "model", "compatible", "jetson"}


@dataclass(frozen=True)
class ModuleFacts:
    """What identifies the device a family bundle's engine is being built on."""

    model: str | None = None  # /proc/device-tree/model, e.g. "NVIDIA Jetson AGX Orin Developer Kit"
    compatible: str | None = None  # /proc/device-tree/compatible, NULs as spaces
    l4t: str | None = None  # "36.4.0"
    jetpack: str | None = None
    tensorrt: str | None = None
    gpu_name: str | None = None

    @property
    def is_jetson(self) -> bool:
        return bool(self.model and "jetson" in self.model.lower()) or bool(self.l4t)

    def describe(self) -> str:
        parts = [f"module {self.model!r}" if self.model else "no device-tree model (not a Jetson)"]
        if self.l4t or self.jetpack:
            parts.append(f"L4T {self.l4t or '?'} (JetPack {self.jetpack or '?'})")
        parts.append(f"TensorRT {self.tensorrt or '?'}")
        if self.gpu_name:
            parts.append(f"GPU {self.gpu_name}")
        return ", ".join(parts)


@dataclass(frozen=True)
class MatchRule:
    """One member's device: `jetson` (when given) must hold, and the model string or the part
    number in the compatible string must contain one of the given substrings (case-insensitive)."""

    profile: str
    model: tuple[str, ...] = ()
    compatible: tuple[str, ...] = ()
    jetson: bool | None = None

    def matches(self, facts: ModuleFacts) -> bool:
        if self.jetson is not None and facts.is_jetson != self.jetson:
            return False
        hits = []
        if self.model:
            hits.append(_contains_any(facts.model, self.model))
        if self.compatible:
            hits.append(_contains_any(facts.compatible, self.compatible))
        # a module is recognised by its model string or its part number, whichever it reports
        return any(hits) if hits else self.jetson is not None


def _contains_any(text: str | None, needles: tuple[str, ...]) -> bool:
    low = (text or "").lower()
    return bool(low) and any(n.lower() in low for n in needles)


@dataclass(frozen=True)
class TargetFamily:
    name: str
    description: str
    backend: str
    profiles: tuple[str, ...]
    rules: tuple[MatchRule, ...]
    min_l4t: str | None = None
    source: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "backend": self.backend, "profiles": list(self.profiles),
                "match": [dict(dataclasses.asdict(r), model=list(r.model), compatible=list(r.compatible)) for r in self.rules], "min_l4t": self.min_l4t}


@dataclass(frozen=True)
class FamilyOptions:
    """A family profile's backend_options: every member's profile, and how to pick one."""

    family: dict[str, Any] = field(default_factory=dict)  # TargetFamily.to_dict()
    members: dict[str, dict[str, Any]] = field(default_factory=dict)  # profile name -> TargetProfile.to_dict()


def parse_family(data: dict[str, Any], path: Path) -> TargetFamily:
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ProfileError(f"{path}: unknown key '{unknown[0]}' (allowed: {', '.join(sorted(_TOP_KEYS))})")
    profiles = data.get("profiles")
    if not isinstance(profiles, list) or not profiles or not all(isinstance(p, str) for p in profiles):
        raise ProfileError(f"{path}: 'profiles' must be a non-empty list of profile names, got {profiles!r}")
    rules = []
    for i, raw in enumerate(data.get("match", [])):
        if not isinstance(raw, dict):
            raise ProfileError(f"{path}: match[{i}] must be a table")
        bad = sorted(set(raw) - _RULE_KEYS)
        if bad:
            raise ProfileError(f"{path}: unknown key 'match[{i}].{bad[0]}' (allowed: {', '.join(sorted(_RULE_KEYS))})")
        if raw.get("profile") not in profiles:
            raise ProfileError(f"{path}: match[{i}].profile must be one of {', '.join(profiles)}, got {raw.get('profile')!r}")
        for key in ("model", "compatible"):
            if not isinstance(raw.get(key, []), list):
                raise ProfileError(f"{path}: match[{i}].{key} must be a list of strings")
        if raw.get("jetson") is not None and not isinstance(raw["jetson"], bool):
            raise ProfileError(f"{path}: match[{i}].jetson must be true or false")
        rules.append(MatchRule(profile=raw["profile"], model=tuple(raw.get("model", ())),
                               compatible=tuple(raw.get("compatible", ())), jetson=raw.get("jetson")))
    return TargetFamily(name=str(data.get("name", path.stem)), description=str(data.get("description", "")),
                        backend=str(data.get("backend", "tensorrt")), profiles=tuple(profiles), rules=tuple(rules),
                        min_l4t=str(data["min_l4t"]) if "min_l4t" in data else None, source=path)


def _release_tuple(text: str | None) -> tuple[int, ...]:

    return tuple(int(p) for p in re.findall(r"\d+", str(text or "")))


def select_member(options: FamilyOptions | dict[str, Any], facts: ModuleFacts, requested: str | None = None) -> tuple[str, str]:
    """(member profile name, why) for the device described by ``facts``; a one-line error naming
    the known profiles and `--profile` when the device is not recognised."""
    opts = options if isinstance(options, FamilyOptions) else FamilyOptions(**options)
    fam = parse_family(dict(opts.family), Path(f"family {opts.family.get('name', '?')}"))
    known = ", ".join(fam.profiles)
    if requested is not None:
        if requested not in opts.members:
            raise UsageError(f"--profile {requested} is not in the {fam.name} bundle; it holds plans for: {known}")
        return requested, f"chosen with --profile ({facts.describe()})"
    if fam.min_l4t and facts.l4t and _release_tuple(facts.l4t)[:1] < _release_tuple(fam.min_l4t)[:1]:
        raise UsageError(f"this Jetson runs L4T {facts.l4t} (JetPack {facts.jetpack or '?'}), whose TensorRT is older than 8.6; "
                         f"the {fam.name} family needs L4T {fam.min_l4t} or newer (JetPack 6): upgrade JetPack")
    for rule in fam.rules:
        if rule.matches(facts):
            return rule.profile, f"recognised {facts.describe()}"
    raise UsageError(f"this device is not one the {fam.name} family recognises ({facts.describe()}); "
                     f"known profiles: {known}; choose one with `vitedge engine BUNDLE --profile NAME`")
