"""TensorRT family bundles (`--target jetson`, `--target nvidia-gpu`): one portable bundle with
the checked Q/DQ graph and a plan per member profile under plans/NAME/, completed on the
device by `vitedge engine BUNDLE`, which picks the member for the module it finds there.

The engine is always built on the device, even where a GPU is present at build time: which
member applies is a fact of the device that runs it, not of the machine that quantized.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitedge.backends.base import BuildContext, BuiltArtifact
from vitedge.backends.tensorrt.bundle import (
    NEXT_STEP,
    NOT_MEASURED,
    load_checked_graph,
    plan_bundle,
)
from vitedge.backends.tensorrt.device import DeviceFacts
from vitedge.backends.tensorrt.members import FamilyOptions, ModuleFacts, select_member
from vitedge.backends.tensorrt.plan import ENGINE, REFERENCE_ENGINE, TensorRtOptions
from vitedge.core.errors import BundleError
from vitedge.bundle.sections import TargetSection

PLANS_DIR = "plans"


def build_family(ctx: BuildContext, offline_caps) -> BuiltArtifact:
    """Plan every member of the family into plans/NAME/ (build_plan.json, trtexec.txt)."""

    say = ctx.log or (lambda _m: None)
    opts: FamilyOptions = ctx.options
    model = load_checked_graph(ctx.qdq_path)
    say("Q/DQ graph passes TensorRT's explicit-quantization rules (symmetric INT8, per-channel weights, float residuals)")
    files: list[str] = []
    members: dict[str, Any] = {}
    for name, profile in opts.members.items():
        options = TensorRtOptions(**profile["backend_options"])
        caps = offline_caps(options)
        folder = ctx.out_dir / PLANS_DIR / name
        folder.mkdir(parents=True, exist_ok=True)
        planned = plan_bundle(folder, options, tuple(profile["batch_sizes"]), caps, model=model)
        files += [f"{PLANS_DIR}/{name}/{f}" for f in planned.files]
        members[name] = {"plan_file": f"{PLANS_DIR}/{name}/build_plan.json", "planned_for_tensorrt": caps.version,
                         "batch_sizes": list(profile["batch_sizes"])}
    for w in planned.attention_warnings:  # one graph for every member: the same attention facts
        say("warning: " + w)
    family = opts.family.get("name", "?")
    say(f"{family} family: one bundle with a plan for {', '.join(opts.members)}; "
        f"on the device, `vitedge engine BUNDLE` picks the profile for the module it finds")
    info = {
        "engine_built": False,
        "next_step": NEXT_STEP,
        "reason": f"a {family} family bundle: the engine is built on the device for the module found there",
        "family": {"name": family, "members": members},
        "attention": planned.attention_info(),
        "measured": NOT_MEASURED,
    }
    return BuiltArtifact(model=ENGINE, reference=REFERENCE_ENGINE, extra_files=files, built=False, info=info)


def module_facts(facts: DeviceFacts) -> ModuleFacts:
    return ModuleFacts(model=facts.module, compatible=facts.compatible, l4t=facts.l4t, jetpack=facts.jetpack,
                       tensorrt=facts.tensorrt, gpu_name=facts.gpu_name)


def family_record(target: TargetSection) -> dict[str, Any] | None:
    """The family profile a bundle was built for: kept under target.family once an engine was
    built (target.profile is then the chosen member's), else target.profile itself."""
    kept = (target.family or {}).get("profile")
    if kept:
        return kept
    profile = target.profile or {}
    options = profile.get("backend_options") or {}
    return profile if "members" in options and "family" in options else None


def choose_member(target: TargetSection, facts: DeviceFacts, requested: str | None, bundle: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(profile to build with, the target.family record to write) for a bundle's manifest target."""
    family = family_record(target)
    if family is None:
        if requested is not None:
            raise BundleError(f"{bundle} was built for the single target {target.name}; "
                              "--profile chooses among a family bundle's profiles (vitedge build --target jetson)")
        return target.profile or {}, None
    options = FamilyOptions(**family["backend_options"])
    name, why = select_member(options, module_facts(facts), requested)
    return options.members[name], {"name": family.get("name"), "selected": name, "why": why,
                                   "members": list(options.members), "profile": family}
