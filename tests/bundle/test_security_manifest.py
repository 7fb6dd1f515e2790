"""How far manifest.json is trusted: paths stay inside the bundle, the gate keeps the build's thresholds
after the profile is edited, and with a signing key an edited manifest is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vitedge.core.errors import BundleError
from vitedge.files.atomic import sha256_file
from vitedge.bundle.manifest import read_manifest, verify_bundle

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "examples" / "digits_vit.pt"
CALIB = REPO / "calibration" / "digits" / "calib"


@pytest.fixture(scope="module")
def built(tmp_path_factory, untimed_targets_dir) -> Path:
    """One real onnx bundle of the bundled digits ViT, gated at min_agreement 0.9."""
    from vitedge.budget import BudgetSettings
    from vitedge.app.build import BuildRequest, run_build
    from vitedge.app.overrides import ThresholdOverrides
    from helpers.profiles import untimed_targets
    from vitedge.core.ui import StageLog

    out = tmp_path_factory.mktemp("manifest") / "bundle"
    with untimed_targets(untimed_targets_dir):  # what a manifest's checks refuse, not the INT8 timing
        run_build(BuildRequest(model=DIGITS, targets=("onnx",), calib=CALIB, out=out, calib_size=16, measure_speed=False,
                               threshold_overrides=ThresholdOverrides(min_agreement=0.9), budget=BudgetSettings(enabled=False, measure_cost=False)),
                  StageLog(quiet=True))
    return out


@pytest.fixture
def bundle(built, tmp_path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(built, copy, symlinks=True)
    return copy


def _edit(bundle: Path, change) -> None:
    path = bundle / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_artifact_path_outside_the_bundle_is_refused(bundle, tmp_path):
    from vitedge.runtime import load

    other = tmp_path / "other"
    other.mkdir()
    shutil.copyfile(bundle / "model.int8.onnx", other / "model.int8.onnx")

    def point_outside(m):
        m["artifacts"]["model"] = "../other/model.int8.onnx"
        m["files"]["../other/model.int8.onnx"] = sha256_file(other / "model.int8.onnx")

    _edit(bundle, point_outside)
    with pytest.raises(BundleError, match="outside the bundle"):
        verify_bundle(bundle)
    with pytest.raises(BundleError, match="outside the bundle"):
        load(bundle, verify=False)


def test_symlink_leading_outside_the_bundle_is_refused(bundle, tmp_path):
    outside = tmp_path / "elsewhere.onnx"
    shutil.copyfile(bundle / "model.int8.onnx", outside)
    (bundle / "model.int8.onnx").unlink()
    (bundle / "model.int8.onnx").symlink_to(outside)
    with pytest.raises(BundleError, match="leads outside the bundle"):
        read_manifest(bundle)


def test_absolute_or_non_string_paths_are_refused(bundle):
    _edit(bundle, lambda m: m["artifacts"].update(reference="/etc/passwd"))
    with pytest.raises(BundleError, match="outside the bundle"):
        read_manifest(bundle)
    _edit(bundle, lambda m: m["artifacts"].update(reference=7))
    with pytest.raises(BundleError, match="not a relative file path|expected a file name"):
        read_manifest(bundle)


def test_edited_profile_thresholds_do_not_loosen_the_gate(bundle):
    from vitedge.datasources.sources import open_source
    from vitedge.validation.bundle import ValidateOptions, validate_bundle

    recorded = read_manifest(bundle).validation["thresholds"]
    assert recorded["min_agreement"] == 0.9

    def loosen(m):
        m["target"]["profile"]["thresholds"].update(min_agreement=0.08, max_top1_drop=100.0)

    _edit(bundle, loosen)
    manifest = verify_bundle(bundle)  # the manifest itself is not hashed: this edit alone is not detected
    notes: list[str] = []

    class Log:
        info = staticmethod(notes.append)

    source = open_source(CALIB, manifest.spec.preprocess, limit=16, class_names=manifest.spec.class_names)
    checked = validate_bundle(bundle, manifest, source, ValidateOptions(measure_speed=False, sensitivity=False), log=Log())
    assert checked.thresholds.min_agreement == 0.9 and checked.thresholds.max_top1_drop == recorded["max_top1_drop"]
    said = [n for n in notes if n.startswith("NOTE ")]
    assert len(said) == 2 and any("min_agreement = 0.08" in n and "gated with 0.9 (a build flag)" in n for n in said)
    assert checked.document["thresholds"]["notes"] == [n[len("NOTE "):] for n in said]
    from vitedge.validation.report import validation_markdown

    assert "**Note:** manifest.json's profile sets min_agreement = 0.08" in validation_markdown(checked.document)


def test_signing_key_refuses_an_edited_or_unsigned_manifest(bundle, monkeypatch):
    verify_bundle(bundle)  # built without a key: accepted while no key is set
    monkeypatch.setenv("VITEDGE_SIGNING_KEY", "s3cret")
    with pytest.raises(BundleError, match="no manifest.sig"):
        verify_bundle(bundle)
    read_manifest(bundle).write(bundle)  # what a build with the key writes
    assert (bundle / "manifest.sig").read_text().startswith("hmac-sha256:")
    verify_bundle(bundle)
    _edit(bundle, lambda m: m["target"]["profile"]["thresholds"].update(min_agreement=0.08))
    with pytest.raises(BundleError, match="does not match manifest.sig"):
        verify_bundle(bundle)
    monkeypatch.setenv("VITEDGE_SIGNING_KEY", "another")
    read_manifest(bundle).write(bundle)
    monkeypatch.setenv("VITEDGE_SIGNING_KEY", "s3cret")
    with pytest.raises(BundleError, match="does not match"):
        verify_bundle(bundle)


def test_a_manifest_over_its_bound_is_refused_without_reading_it(bundle):
    """A bundle from elsewhere is data: a manifest.json of 65 MB (sparse here) is refused in one line, not parsed."""
    manifest = bundle / "manifest.json"
    with open(manifest, "r+b") as f:
        f.truncate(65 << 20)
    with pytest.raises(BundleError, match="MB bound: not a vitedge manifest"):
        read_manifest(bundle)
