"""Target families: `vitedge build --target jetson` writes one portable bundle with a plan per
Jetson profile, and `vitedge engine BUNDLE` on the device picks the profile for the module it
finds. Device facts are recorded ones (AGX Orin, Orin NX, Orin Nano, an unknown module); the
engine build is driven by the recording TensorRT stand-in (tests/helpers/tensorrt_standin.py)."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers.jetson_devices import (
    AGX_ORIN,
    DESKTOP,
    JETPACK5_ORIN,
    ORIN_NANO,
    ORIN_NX,
    ORIN_NX_CARRIER,
    UNKNOWN,
    complete_with_standin,
)

from vitedge.backends.tensorrt.device import read_device_tree
from vitedge.core.errors import BundleError, UsageError
from vitedge.targets.families import list_families, select_member
from vitedge.bundle.manifest import read_manifest, verify_bundle
from vitedge.targets.profiles import family_profile

JETSON_MEMBERS = ["jetson-orin", "jetson-orin-nx", "jetson-orin-nano"]


def _module(facts):
    from vitedge.backends.tensorrt.family import module_facts

    return module_facts(facts)


@pytest.mark.parametrize("facts, member", [
    (AGX_ORIN, "jetson-orin"), (ORIN_NX, "jetson-orin-nx"), (ORIN_NANO, "jetson-orin-nano"), (ORIN_NX_CARRIER, "jetson-orin-nx"),
])
def test_each_orin_module_is_recognised(facts, member):
    name, why = select_member(family_profile("jetson").backend_options, _module(facts))
    assert name == member and "recognised" in why and facts.l4t in why and facts.tensorrt in why


def test_an_unknown_module_names_the_profiles_and_the_flag():
    options = family_profile("jetson").backend_options
    with pytest.raises(UsageError) as info:
        select_member(options, _module(UNKNOWN))
    text = str(info.value)
    assert "AGX Thor" in text and "38.2.0" in text and "10.13.3" in text
    assert "jetson-orin, jetson-orin-nx, jetson-orin-nano" in text and "--profile NAME" in text and "\n" not in text
    assert select_member(options, _module(UNKNOWN), "jetson-orin-nano")[0] == "jetson-orin-nano"
    with pytest.raises(UsageError, match="--profile jetson-xavier is not in the jetson bundle"):
        select_member(options, _module(UNKNOWN), "jetson-xavier")


def test_jetpack5_is_refused_with_the_reason():
    with pytest.raises(UsageError, match=r"L4T 35.4.1 .*older than 8.6.*JetPack 6"):
        select_member(family_profile("jetson").backend_options, _module(JETPACK5_ORIN))


def test_nvidia_gpu_family_takes_desktop_gpus_not_jetsons():
    options = family_profile("nvidia-gpu").backend_options
    assert select_member(options, _module(DESKTOP))[0] == "desktop-gpu"
    with pytest.raises(UsageError, match="not one the nvidia-gpu family recognises"):
        select_member(options, _module(AGX_ORIN))


def test_family_profile_merges_its_members():
    prof = family_profile("jetson")
    assert prof.name == "jetson" and prof.backend == "tensorrt"
    assert list(prof.backend_options.members) == JETSON_MEMBERS
    assert prof.batch_sizes == (1, 4, 8)  # the union of the members'
    assert {p.stem for p in list_families()} == {"jetson", "nvidia-gpu"}


def test_device_tree_strings_are_read_from_the_files(tmp_path):
    (tmp_path / "model").write_bytes(b"NVIDIA Jetson Orin NX Engineering Reference Developer Kit\0")
    (tmp_path / "compatible").write_bytes(b"nvidia,p3768-0000+p3767-0000\0nvidia,p3767-0000\0nvidia,tegra234\0")
    model, compatible = read_device_tree(tmp_path)
    assert model == ORIN_NX.module and compatible == ORIN_NX.compatible
    assert read_device_tree(tmp_path / "absent") == (None, None)


# -- the bundle -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def jetson_bundle(example_bundles):
    """`vitedge build --target jetson examples/digits_vit.pt --calib calibration/digits/calib -o OUT` (with two CPU targets)."""
    out, text = example_bundles
    return out / "jetson", text


def test_build_target_jetson_writes_one_bundle_with_a_plan_per_profile(jetson_bundle):
    out, text = jetson_bundle
    manifest = verify_bundle(out)
    assert manifest.target.name == "jetson" and manifest.artifacts.built is False
    assert (out / "model.int8.onnx").is_file() and (out / "reference.fp32.onnx").is_file()
    for name in JETSON_MEMBERS:
        plan = json.loads((out / "plans" / name / "build_plan.json").read_text())
        assert plan["engines"][0]["graph"] == "model.int8.onnx"
        assert f"plans/{name}/trtexec.txt" in manifest.files
    workspaces = {n: json.loads((out / "plans" / n / "build_plan.json").read_text())["engines"][0]["workspace_bytes"] >> 20
                  for n in JETSON_MEMBERS}
    assert workspaces == {"jetson-orin": 2048, "jetson-orin-nx": 1024, "jetson-orin-nano": 512}
    assert "plan for jetson-orin, jetson-orin-nx, jetson-orin-nano" in " ".join(text.split())


def test_engine_on_an_orin_nano_builds_with_its_profile(jetson_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "cache"))
    bundle = tmp_path / "b"
    shutil.copytree(jetson_bundle[0], bundle)
    complete_with_standin(bundle, ORIN_NANO)
    manifest = verify_bundle(bundle)
    assert manifest.artifacts.built is True
    assert manifest.target.profile["name"] == "jetson-orin-nano" and manifest.target.profile["batch_sizes"] == [1, 4]
    assert manifest.target.family["selected"] == "jetson-orin-nano" and "Orin Nano" in manifest.target.family["why"]
    assert manifest.backend_info["plan"]["workspace_mb"] == 512
    assert manifest.backend_info["device"]["module"] == ORIN_NANO.module
    # a rebuild on another module (--force) picks that module's profile from the family kept in the manifest
    complete_with_standin(bundle, AGX_ORIN, force=True)
    again = read_manifest(bundle)
    assert again.target.profile["name"] == "jetson-orin" and again.backend_info["plan"]["workspace_mb"] == 2048


def test_engine_on_an_unknown_module_leaves_the_bundle_and_names_the_flag(jetson_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "cache"))
    bundle = tmp_path / "b"
    shutil.copytree(jetson_bundle[0], bundle)
    before = sorted(p.name for p in bundle.rglob("*"))
    with pytest.raises(UsageError, match="--profile NAME"):
        complete_with_standin(bundle, UNKNOWN)
    assert sorted(p.name for p in bundle.rglob("*")) == before
    complete_with_standin(bundle, UNKNOWN, profile_name="jetson-orin-nx")
    assert read_manifest(bundle).target.profile["name"] == "jetson-orin-nx"


def test_profile_flag_on_a_single_target_bundle_is_refused(jetson_bundle, tmp_path):
    from vitedge.backends.tensorrt.family import choose_member
    from vitedge.bundle.sections import TargetSection

    with pytest.raises(BundleError, match="family bundle"):
        choose_member(TargetSection(name="jetson-orin", backend="tensorrt", precision="int8",
                                    profile={"name": "jetson-orin", "backend_options": {}}), AGX_ORIN,
                      "jetson-orin-nano", tmp_path)
