"""Every camera export of every target profile, checked by the consumers' own rules offline: config_infer.txt key by
key against nvinfer's property parser and its engine-file naming (vitedge.camera_apps.nvinfer_rules), config.pbtxt
parsed with Triton's model_config.proto and checked against the TensorRT / ONNX Runtime / OpenVINO backends' load
rules (vitedge.camera_apps.triton_rules). Neither consumer runs here; the rules were read from their sources."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.cli import run_vitedge
from helpers.jetson_devices import AGX_ORIN, DESKTOP, ORIN_NANO, ORIN_NX
from helpers.tensorrt_standin import make_fake_cudart, make_fake_trt

from vitedge.camera_apps.nvinfer_rules import check_nvinfer_config
from vitedge.camera_apps.triton_rules import ServedModel, check_triton_model
from vitedge.bundle.manifest import read_manifest, verify_bundle
from vitedge.targets.profiles import load_profile

pytest.importorskip("tritonclient.grpc.model_config_pb2")
TARGETS = Path(__file__).resolve().parents[2] / "targets"
NVIDIA = {"jetson-orin": AGX_ORIN, "jetson-orin-nx": ORIN_NX, "jetson-orin-nano": ORIN_NANO, "desktop-gpu": DESKTOP}
# (profile, backend options over it): every NVIDIA profile as shipped, version-compatible, and on a DLA core where it has one
VARIANTS = [(name, {}) for name in NVIDIA] + [(name, {"version_compatible": True}) for name in NVIDIA] + [
    ("jetson-orin", {"dla_core": 0}), ("jetson-orin", {"dla_core": 1}), ("jetson-orin-nx", {"dla_core": 0})]
ENGINES = ("../../model.deepstream.engine", "../../model.engine")


def test_every_shipped_profile_is_covered():
    names = {load_profile(str(p)).name for p in TARGETS.glob("*.toml")}
    assert names == set(NVIDIA) | {"onnx", "intel-cpu", "intel-cpu-vnni"}


def _with_profile(src: Path, dst: Path, name: str, options: dict) -> Path:
    shutil.copytree(src, dst)
    path = dst / "manifest.json"
    doc = json.loads(path.read_text())
    profile = load_profile(name).to_dict()
    profile["backend_options"].update(options)
    doc["target"] = dict(doc["target"], name=name, profile=profile)
    path.write_text(json.dumps(doc))
    return dst


def _served(bundle: Path, manifest) -> ServedModel:
    """What the artifact takes: a built engine's own profile, else the profile's batches (one static batch on a DLA)."""
    import onnx

    out = onnx.load(str(bundle / manifest.artifacts.qdq), load_external_data=False).graph.output[0]
    dims = tuple(manifest.input.shape[1:]), (out.type.tensor_type.shape.dim[-1].dim_value,)
    plan = (manifest.backend_info or {}).get("plan") or {}
    if plan.get("profile"):
        return ServedModel(*dims, max_batch=plan["profile"]["max"][0], min_batch=plan["profile"]["min"][0], dla_core=plan.get("dla_core"))
    profile = manifest.target.profile
    options = profile.get("backend_options") or {}
    dla = options.get("dla_core", -1)
    if dla is not None and dla >= 0:
        batch = options.get("opt_batch") or max(profile["batch_sizes"])
        return ServedModel(*dims, max_batch=batch, min_batch=batch, dla_core=dla)
    return ServedModel(*dims, max_batch=max(profile["batch_sizes"]))


def _check_bundle(bundle: Path, *, built: bool) -> None:
    manifest = verify_bundle(bundle)
    problems = check_nvinfer_config(bundle / "camera" / "deepstream" / "config_infer.txt", engines=ENGINES if built else ())
    [folder] = list((bundle / "camera" / "triton").iterdir())
    problems += check_triton_model(folder, _served(bundle, manifest), plan_present=built)
    assert problems == []


@pytest.mark.parametrize("name, options", VARIANTS, ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'shipped'}" for n, o in VARIANTS])
def test_nvidia_bundle_camera_files_pass_the_consumers_rules_before_and_after_the_engine(example_bundles, tmp_path, monkeypatch,
                                                                                         name, options):
    from vitedge.app.engine_completion import complete_bundle
    from vitedge.backends import backend_facts
    from vitedge.camera_apps.exports import write_bundle_exports

    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "cache"))
    bundle = _with_profile(example_bundles[0] / "jetson", tmp_path / name, name, options)
    manifest = read_manifest(bundle)
    write_bundle_exports(bundle, manifest, backend_facts("tensorrt"))  # what the build writes for this profile
    manifest.hash_files(bundle)
    manifest.write(bundle)
    _check_bundle(bundle, built=False)
    facts = NVIDIA[name]
    cudart = make_fake_cudart()
    trt = make_fake_trt(facts.tensorrt, cudart=cudart, dla_cores=2 if "dla_core" in options else 0)
    complete_bundle(bundle, trt=trt, cudart=cudart, facts=facts, measure_speed=False)
    _check_bundle(bundle, built=True)


@pytest.mark.parametrize("target, profile", [("onnx", "onnx"), ("intel-cpu", "intel-cpu"), ("intel-cpu", "intel-cpu-vnni")])
def test_cpu_bundle_exports_pass_the_consumers_rules(example_bundles, tmp_path, target, profile):
    bundle = _with_profile(example_bundles[0] / target, tmp_path / profile, profile, {})
    for kind in ("deepstream", "triton"):
        code, text = run_vitedge(["export-config", "--for", kind, str(bundle), "-o", str(tmp_path / kind)])
        assert code == 0, text
    assert check_nvinfer_config(tmp_path / "deepstream" / "config_infer.txt") == []
    [folder] = list((tmp_path / "triton").iterdir())
    assert check_triton_model(folder, _served(bundle, read_manifest(bundle))) == []


def test_the_checks_catch_what_the_consumers_refuse(example_bundles, tmp_path):
    """Each rule can fail: an unknown key, a value out of the parser's range, offsets for the wrong channel count, an
    engine name nvinfer never saves; a max_batch_size above the engine's, a missing label file, a CPU instance of a plan."""
    bundle = tmp_path / "b"
    shutil.copytree(example_bundles[0] / "jetson", bundle)
    config = bundle / "camera" / "deepstream" / "config_infer.txt"
    text = config.read_text()
    config.write_text(text.replace("scaling-filter=", "scaling-filter=9\n#").replace("process-mode=1", "process-mode=1\nbatch_size=4")
                      .replace("model-engine-file=", "model-engine-file=model.engine\n#").replace("offsets=", "offsets=0;0\n#"))
    problems = " | ".join(check_nvinfer_config(config))
    for expected in ("scaling-filter=9: nvinfer accepts", "batch_size: a key nvinfer does not read", "offsets has 2 values for 3 channels",
                     "model-engine-file=model.engine: neither an engine vitedge built nor model.deepstream.onnx_b"):
        assert expected in problems
    [folder] = list((bundle / "camera" / "triton").iterdir())
    manifest = read_manifest(bundle)
    served = _served(bundle, manifest)
    assert check_triton_model(folder, served, plan_present=False) == []
    (folder / "labels.txt").unlink()
    cfg = (folder / "config.pbtxt").read_text()
    (folder / "config.pbtxt").write_text(cfg.replace("max_batch_size: 8", "max_batch_size: 16").replace("KIND_GPU", "KIND_CPU"))
    problems = " | ".join(check_triton_model(folder, served, plan_present=False))
    for expected in ("max_batch_size 16 but the model takes at most 8", "names labels.txt, which is not in the folder",
                     "instance kind KIND_CPU: the TensorRT backend runs GPU instances"):
        assert expected in problems
