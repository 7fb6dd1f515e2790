"""Camera-app exports: DeepStream nvinfer configs whose arithmetic reproduces vitedge's
preprocessing, and Triton model repositories parsed with Triton's own model-config protobuf.
Neither DeepStream nor Triton runs here: the configs are checked against the bundle and the
artifacts are run with the runtimes that are here."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import run_vitedge
from helpers import nvinfer_sim
from helpers.jetson_devices import ORIN_NANO, complete_with_standin
from PIL import Image

from vitedge.camera_apps.deepstream import BAKED_GRAPH, CALIB_FILE, ENGINE_FILE, read_config, source_crop
from vitedge.bundle.manifest import read_manifest, verify_bundle
from vitedge.bundle.preprocess import normalize, preprocess_array
from vitedge.runtime.results import softmax
from vitedge.bundle.spec import Preprocess

IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
VAL = Path(__file__).resolve().parents[2] / "calibration" / "digits" / "val"
# (width, height) of camera frames: square, 4:3, 3:4, 16:9 and 9:16
FRAME_SIZES = [(32, 32), (64, 48), (48, 64), (160, 90), (90, 160)]


@pytest.fixture(scope="module")
def bundles(example_bundles):
    return example_bundles[0]


def _frames(h: int, w: int, n: int = 4) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)


def _nvinfer_input(props: dict[str, str], frame: np.ndarray) -> np.ndarray:
    """What nvinfer feeds the network: y = net-scale-factor * (x - offsets[c]), planar, in model-color-format."""
    assert props["model-color-format"] == "0"  # RGB, as the frame is
    scale = np.float32(float(props["net-scale-factor"]))
    offsets = np.asarray([float(v) for v in props["offsets"].split(";")], np.float32).reshape(3, 1, 1)
    return scale * (frame.astype(np.float32).transpose(2, 0, 1) - offsets)


def _nvinfer_own_build(props: dict[str, str]) -> str:
    """The file nvinfer saves its own build under: nvdsinfer_model_builder.cpp builds the name from the ONNX file's path,
    "_b" + batch-size, "_gpu" + gpu-id (or "_dla" + use-dla-core with enable-dla) and "_" + the network mode's name."""
    device = f"dla{props['use-dla-core']}" if props.get("enable-dla") == "1" else f"gpu{props.get('gpu-id', '0')}"
    mode = {"0": "fp32", "1": "int8", "2": "fp16"}[props["network-mode"]]
    return f"{props['onnx-file']}_b{props['batch-size']}_{device}_{mode}.engine"


def _with_manifest(src, dst, **changes):
    shutil.copytree(src, dst)
    path = dst / "manifest.json"
    doc = json.loads(path.read_text())
    for dotted, value in changes.items():
        section, key = dotted.split("__")
        doc[section][key] = value
    path.write_text(json.dumps(doc))
    return dst


def test_deepstream_config_arithmetic_matches_vitedge_preprocessing(bundles, tmp_path):
    bundle = bundles / "onnx"
    code, text = run_vitedge(["export-config", "--for", "deepstream", str(bundle), "-o", str(tmp_path / "ds")])
    assert code == 0, text
    props = read_config(tmp_path / "ds" / "config_infer.txt")
    manifest = read_manifest(bundle)
    pre = Preprocess.from_dict(manifest.input.preprocess)
    h, w = manifest.input.shape[2:]
    assert props["infer-dims"] == f"3;{h};{w}" and props["network-type"] == "1" and props["network-mode"] == "1"
    assert props["labelfile-path"] == "labels.txt" and props["batch-size"] == str(max(manifest.target.profile["batch_sizes"]))
    assert (tmp_path / "ds" / "labels.txt").read_text().strip() == ";".join(manifest.output.class_names)
    assert props["onnx-file"] == BAKED_GRAPH and props["output-blob-names"] == "probabilities"  # the graph ends in a Softmax
    assert props["classifier-threshold"] == "0" and props["maintain-aspect-ratio"] == "1" and props["symmetric-padding"] == "1"
    # an onnx bundle has no engine: nvinfer builds one (INT8 through the flag file) and loads it from the second start on
    assert props["model-engine-file"] == _nvinfer_own_build(props)
    assert props["int8-calib-file"] == CALIB_FILE and (tmp_path / "ds" / CALIB_FILE).read_bytes() == b""
    for frame in _frames(h, w):
        np.testing.assert_allclose(_nvinfer_input(props, frame), normalize(frame, pre), atol=1e-5, rtol=0)


def test_per_channel_std_is_baked_into_the_graph_and_said_so(bundles, tmp_path):
    bundle = _with_manifest(bundles / "onnx", tmp_path / "imagenet", input__preprocess={
        **read_manifest(bundles / "onnx").input.preprocess, **IMAGENET})
    code, text = run_vitedge(["export-config", "--for", "deepstream", str(bundle), "-o", str(tmp_path / "ds")])
    assert code == 0, text
    config = (tmp_path / "ds" / "config_infer.txt").read_text()
    assert "per-channel std cannot be expressed by nvinfer's single" in config and "normalisation is baked in" in config
    props = read_config(tmp_path / "ds" / "config_infer.txt")
    assert props["onnx-file"] == BAKED_GRAPH and float(props["net-scale-factor"]) == 1.0
    import onnx
    from onnx import numpy_helper

    from vitedge.onnxkit.session import ort_session

    baked = onnx.load(str(tmp_path / "ds" / BAKED_GRAPH))
    inits = {t.name: numpy_helper.to_array(t) for t in baked.graph.initializer}
    pre = Preprocess.from_dict({**read_manifest(bundle).input.preprocess, **IMAGENET})
    frames = _frames(32, 32)
    for frame in frames:  # nvinfer's arithmetic, then the graph's own Mul/Add
        y = _nvinfer_input(props, frame)[None] * inits["vitedge_nvinfer/scale"] + inits["vitedge_nvinfer/shift"]
        np.testing.assert_allclose(y[0], normalize(frame, pre), atol=1e-5, rtol=0)
    # the baked graph on raw pixels computes what the bundle's graph computes on vitedge's input
    raw = np.stack([_nvinfer_input(props, f) for f in frames])
    ref = np.stack([normalize(f, pre) for f in frames])
    got = ort_session(str(tmp_path / "ds" / BAKED_GRAPH)).run(None, {"input": raw})[0]
    want = softmax(ort_session(str(bundle / "model.int8.onnx")).run(None, {"input": ref})[0])
    assert np.array_equal(got.argmax(1), want.argmax(1)) and np.abs(got - want).max() < 1e-3  # probabilities now
    np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-5)


def test_deepstream_embedding_model_gets_tensor_meta(bundles, tmp_path):
    bundle = _with_manifest(bundles / "onnx", tmp_path / "emb", output__kind="embedding")
    assert run_vitedge(["export-config", "--for", "deepstream", str(bundle), "-o", str(tmp_path / "ds")])[0] == 0
    props = read_config(tmp_path / "ds" / "config_infer.txt")
    assert props["network-type"] == "100" and props["output-tensor-meta"] == "1" and "labelfile-path" not in props


def _model_config(path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.mark.parametrize("target, platform, backend, kind, files", [
    ("onnx", "onnxruntime_onnx", "", "KIND_CPU", ["model.onnx"]),
    ("intel-cpu", "", "openvino", "KIND_CPU", ["model.xml", "model.bin"]),
])
def test_triton_repository_matches_the_bundle(bundles, tmp_path, target, platform, backend, kind, files):
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from tritonclient.grpc import model_config_pb2 as mc

    bundle = bundles / target
    code, text = run_vitedge(["export-config", "--for", "triton", str(bundle), "-o", str(tmp_path / "repo")])
    assert code == 0, text
    [folder] = [p for p in (tmp_path / "repo").iterdir()]
    cfg = _model_config(folder / "config.pbtxt")
    manifest = read_manifest(bundle)
    profile = manifest.target.profile
    assert cfg.name == folder.name and cfg.platform == platform and cfg.backend == backend
    assert cfg.max_batch_size == max(profile["batch_sizes"])
    assert list(cfg.dynamic_batching.preferred_batch_size) == profile["batch_sizes"]
    [inp], [out] = cfg.input, cfg.output
    assert inp.name == manifest.input.name and inp.data_type == mc.TYPE_FP32 and inp.format == mc.ModelInput.FORMAT_NCHW
    assert list(inp.dims) == manifest.input.shape[1:]
    assert out.name == manifest.output.name and list(out.dims) == [len(manifest.output.class_names)]
    assert out.label_filename == "labels.txt" and (folder / "labels.txt").read_text().split() == manifest.output.class_names
    assert cfg.instance_group[0].kind == getattr(mc.ModelInstanceGroup, kind)
    assert sorted(p.name for p in (folder / "1").iterdir()) == sorted(files)
    assert (folder / "1" / files[0]).read_bytes() == (bundle / manifest.artifacts.model).read_bytes()
    if target == "onnx":  # the repository's model takes what config.pbtxt declares
        from vitedge.onnxkit.session import ort_session

        x = np.zeros((2, *inp.dims), np.float32)
        assert ort_session(str(folder / "1" / "model.onnx")).run([out.name], {inp.name: x})[0].shape == (2, *out.dims)


def test_jetson_bundle_carries_camera_configs_and_the_engine_deepstream_runs(bundles, tmp_path, monkeypatch):
    """At build: the nvinfer config (no engine yet: nvinfer's own build made INT8 by the flag file) and the Triton
    repository without its plan. `vitedge engine`: the DeepStream graph's own INT8 engine, which the config then names
    with its precision and TensorRT version, and the plan linked into the Triton repository."""
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from tritonclient.grpc import model_config_pb2 as mc

    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "cache"))
    bundle = tmp_path / "jetson"
    shutil.copytree(bundles / "jetson", bundle)
    ds = bundle / "camera" / "deepstream"
    props = read_config(ds / "config_infer.txt")
    assert props["model-engine-file"] == _nvinfer_own_build(props)  # no engine yet: nvinfer's own, saved at the first start
    assert props["int8-calib-file"] == CALIB_FILE and (ds / CALIB_FILE).is_file()
    assert "Trying FP16 mode" in (ds / "config_infer.txt").read_text()  # says what nvinfer would do without the file
    [folder] = list((bundle / "camera" / "triton").iterdir())  # the repository from the build on
    cfg = _model_config(folder / "config.pbtxt")
    assert cfg.platform == "tensorrt_plan" and cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    assert (folder / "labels.txt").is_file() and list((folder / "1").iterdir()) == []
    assert "added by `vitedge engine BUNDLE`" in (folder / "config.pbtxt").read_text()
    assert f"camera/triton/{folder.name}/config.pbtxt" in verify_bundle(bundle).files
    code, text = run_vitedge(["export-config", "--for", "triton", str(bundle), "-o", str(tmp_path / "repo")])
    assert code == 2 and "vitedge engine BUNDLE" in text and not (tmp_path / "repo").exists()

    result = complete_with_standin(bundle, ORIN_NANO)
    manifest = verify_bundle(bundle)  # the camera files and the DeepStream engine are hashed with the rest
    ds_info = manifest.backend_info["deepstream_engine"]
    assert ds_info["graph"] == f"camera/deepstream/{BAKED_GRAPH}" and ds_info["engine"] == ENGINE_FILE
    assert ds_info["tensorrt"] == ORIN_NANO.tensorrt and ds_info["precision"].startswith("INT8 where the graph has Q/DQ")
    assert ENGINE_FILE in manifest.files and ENGINE_FILE in manifest.artifacts.extra and (bundle / ENGINE_FILE).stat().st_size
    assert result.manifest.backend_info["deepstream_engine"] == ds_info
    text = (ds / "config_infer.txt").read_text()
    props = read_config(ds / "config_infer.txt")
    assert props["model-engine-file"] == f"../../{ENGINE_FILE}" and props["batch-size"] == "1"  # jetson-orin-nano's opt batch
    # when that engine does not load, nvinfer rebuilds at every start; the config names the file to point at instead
    assert f"set model-engine-file={_nvinfer_own_build(props)}" in text and "rebuilds at every start" in text
    assert f"TensorRT {ORIN_NANO.tensorrt}" in text and ds_info["precision"] in text
    [folder] = list((bundle / "camera" / "triton").iterdir())
    assert f"camera/triton/{folder.name}/config.pbtxt" in manifest.files
    cfg = _model_config(folder / "config.pbtxt")
    assert cfg.max_batch_size == 4 and list(cfg.dynamic_batching.preferred_batch_size) == [1, 4]
    assert (folder / "1" / "model.plan").read_bytes() == (bundle / "model.engine").read_bytes()
    # a Triton container that mounts only camera/triton sees the plan itself, not a link out of the mount
    assert not (folder / "1" / "model.plan").is_symlink() and f"camera/triton/{folder.name}/1/model.plan" in manifest.files
    mounted = tmp_path / "mount"
    shutil.copytree(bundle / "camera" / "triton", mounted, symlinks=True)
    assert (mounted / folder.name / "1" / "model.plan").read_bytes() == (bundle / "model.engine").read_bytes()


def test_triton_config_says_what_a_version_compatible_engine_needs(bundles):
    from vitedge.backends import backend_facts
    from vitedge.camera_apps.triton import config_text, model_name

    manifest, served = read_manifest(bundles / "jetson"), backend_facts("tensorrt")
    assert "version-compatible" not in config_text(manifest, bundles / "jetson", model_name(manifest), served)
    for member in manifest.target.profile["backend_options"]["members"].values():
        member["backend_options"]["version_compatible"] = True
    manifest.target.profile["backend_options"]["version_compatible"] = True
    assert "--backend-config=tensorrt,version-compatible=true" in config_text(manifest, bundles / "jetson", model_name(manifest),
                                                                               served)


def _digit_frames(size: tuple[int, int], n: int = 4) -> list[np.ndarray]:
    """Held-out digits as camera frames of ``size`` (width, height): smooth pictures, as a camera gives."""
    files = sorted(VAL.glob("*/*.png"))[::50][:n]
    return [np.asarray(Image.open(f).convert("RGB").resize(size, Image.Resampling.BILINEAR)) for f in files]


@pytest.mark.parametrize("std", ["one", "per-channel"])
def test_nvinfer_pipeline_matches_vitedge_runtime_on_frames_of_several_aspect_ratios(bundles, tmp_path, std):
    """The config's arithmetic, run as nvinfer runs it (src-crop, aspect-preserving scale, net-scale-factor/offsets,
    the DeepStream graph, the default classifier parser), against `vitedge.runtime` on the same frames: the same
    labels and probabilities. A stretched frame (maintain-aspect-ratio=0, no crop) is shown to differ: the check can fail."""
    from vitedge.onnxkit.session import ort_session
    from vitedge.runtime import load

    bundle = bundles / "onnx"
    if std == "per-channel":  # the normalisation baked into the DeepStream graph
        bundle = _with_manifest(bundle, tmp_path / "imagenet", input__preprocess={**read_manifest(bundle).input.preprocess, **IMAGENET})
    code, text = run_vitedge(["export-config", "--for", "deepstream", str(bundle), "-o", str(tmp_path / "ds")])
    assert code == 0, text
    props = read_config(tmp_path / "ds" / "config_infer.txt")
    labels = (tmp_path / "ds" / "labels.txt").read_text().strip().split(";")
    pre = Preprocess.from_dict(read_manifest(bundle).input.preprocess)
    session = ort_session(str(tmp_path / "ds" / props["onnx-file"]))
    compared = 0
    with load(bundle) as model:
        for size in FRAME_SIZES:
            crop = source_crop(*size, pre.crop_size, pre.crop_pct)
            for frame in _digit_frames(size):
                x = nvinfer_sim.network_input(props, nvinfer_sim.src_crop(frame, crop))
                probs = session.run(None, {session.get_inputs()[0].name: x[None]})[0][0]
                index, confidence, label = nvinfer_sim.classify(props, probs, labels)
                want = model.predict(frame, top_k=len(labels))
                want_probs = softmax(model.logits([frame]))[0]
                assert np.abs(probs - want_probs).max() < 0.06 and abs(confidence - want_probs[index]) < 0.06, size
                if want.probs[0] - want.probs[1] > 0.12:  # not a near-tie, which the resize's rounding may flip
                    assert (index, label) == (want.index, want.name), size
                    compared += 1
                ref = preprocess_array(frame, pre)
                if std == "one":  # nvinfer's output is the network input itself
                    assert np.abs(x - ref).mean() < 0.06, size  # Pillow's resize before vs after the crop
                if size[0] != size[1]:
                    stretched = nvinfer_sim.network_input(dict(props, **{"maintain-aspect-ratio": "0"}), frame)
                    if std == "one":
                        assert np.abs(stretched - ref).mean() > 0.1, size
    assert compared >= 0.8 * len(FRAME_SIZES) * 4  # labels compared on most frames


@pytest.mark.parametrize("interpolation, value", [("nearest", "0"), ("bilinear", "1"), ("bicubic", "2"), ("lanczos", "4")])
def test_scaling_filter_is_nvinfers_value_for_the_models_resize(bundles, tmp_path, interpolation, value):
    """NvBufSurfTransform_Inter: 2 is GPU cubic (VIC 5-tap), 4 GPU Lanczos; the GPU computes it (scaling-compute-hw=1)."""
    bundle = _with_manifest(bundles / "onnx", tmp_path / "b", input__preprocess={
        **read_manifest(bundles / "onnx").input.preprocess, "interpolation": interpolation})
    assert run_vitedge(["export-config", "--for", "deepstream", str(bundle), "-o", str(tmp_path / "ds")])[0] == 0
    props = read_config(tmp_path / "ds" / "config_infer.txt")
    assert props["scaling-filter"] == value and props["scaling-compute-hw"] == "1"


def test_source_crop_is_vitedges_resize_and_centre_crop():
    # 1280x720 to a 224 model at crop_pct 0.875: shorter side to 256 (455x256), centre 224 -> 630 px of the 720;
    # vitedge's crop starts at (455 - 224) // 2 = 115 resized pixels, 323.5 frame pixels: 324, not the exact centre 325
    assert source_crop(1280, 720, (224, 224), 0.875) == (324, 45, 630, 630)
    assert source_crop(720, 1280, (224, 224), 1.0) == (0, 280, 720, 720)
    assert source_crop(224, 224, (224, 224), 1.0) == (0, 0, 224, 224)


def test_embedding_model_runs_the_bundles_own_graph_and_engine(bundles, tmp_path, monkeypatch):
    """Nothing to add to an embedding model with one std: nvinfer runs the bundle's graph, and after `vitedge engine`
    the bundle's own engine, named with its precision; no second engine is built."""
    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "cache"))
    bundle = _with_manifest(bundles / "jetson", tmp_path / "emb", output__kind="embedding")
    result = complete_with_standin(bundle, ORIN_NANO)
    assert "deepstream_engine" not in result.manifest.backend_info and not (bundle / ENGINE_FILE).exists()
    ds = bundle / "camera" / "deepstream"
    props = read_config(ds / "config_infer.txt")
    assert props["onnx-file"] == "../../model.int8.onnx" and props["model-engine-file"] == "../../model.engine"
    assert props["network-type"] == "100" and props["int8-calib-file"] == CALIB_FILE and not (ds / BAKED_GRAPH).exists()
    text = (ds / "config_infer.txt").read_text()
    assert f"TensorRT {ORIN_NANO.tensorrt}" in text and "INT8 where the graph has Q/DQ, FP16 elsewhere" in text


def test_class_names_with_separators_keep_one_label_per_class(bundles, tmp_path):
    """A class name holding ';' (nvinfer's separator) or a line break (Triton's) made two labels out of one and moved
    every later class onto the wrong index, silently. Each file keeps one label per class, in order."""
    names = list(read_manifest(bundles / "onnx").output.class_names)
    names[1], names[2] = "one; uno", "two\nzwei"
    bundle = _with_manifest(bundles / "onnx", tmp_path / "b", output__class_names=names)
    code, text = run_vitedge(["export-config", "--for", "deepstream", str(bundle), "-o", str(tmp_path / "ds")])
    assert code == 0, text
    labels = (tmp_path / "ds" / "labels.txt").read_text().rstrip("\n").split(";")
    assert len(labels) == len(names) and labels[1:4] == ["one, uno", "two zwei", names[3]]
    assert "2 class names held ';' or a line break" in (tmp_path / "ds" / "config_infer.txt").read_text()
    code, text = run_vitedge(["export-config", "--for", "triton", str(bundle), "-o", str(tmp_path / "tr")])
    assert code == 0, text
    [labels_file] = list((tmp_path / "tr").rglob("labels.txt"))
    lines = labels_file.read_text().splitlines()
    assert len(lines) == len(names) and lines[1:4] == ["one; uno", "two zwei", names[3]]
    assert read_manifest(bundle).output.class_names == names  # the manifest keeps them as the model gave them


def test_triton_repository_in_the_bundle_has_labels_for_a_model_without_class_names(bundles, tmp_path):
    """config.pbtxt names labels.txt for every classifier, and Triton's label provider fails the model's load when the
    file is missing: a model without class names (a timm state_dict) gets its class indices, one per line."""
    from vitedge.backends import backend_facts
    from vitedge.camera_apps.exports import write_bundle_exports

    bundle = _with_manifest(bundles / "jetson", tmp_path / "nameless", output__class_names=None)
    manifest = read_manifest(bundle)
    written = write_bundle_exports(bundle, manifest, backend_facts("tensorrt"))
    [folder] = list((bundle / "camera" / "triton").iterdir())
    cfg = _model_config(folder / "config.pbtxt")
    assert cfg.output[0].label_filename == "labels.txt"
    classes = cfg.output[0].dims[-1]
    assert (folder / "labels.txt").read_text().splitlines() == [str(i) for i in range(classes)]
    assert f"camera/triton/{folder.name}/labels.txt" in written


def _as_member(manifest, member: str, **options):
    """``manifest`` as a bundle of family member ``member`` with ``options`` over its backend options (the target a
    member's own build, or `vitedge engine` on that module, records)."""
    profile = json.loads(json.dumps(manifest.target.profile["backend_options"]["members"][member]))
    profile["backend_options"].update(options)
    manifest.target = dataclasses.replace(manifest.target, name=member, profile=profile)
    return manifest


def test_dla_engine_is_served_on_its_core_at_its_static_batch(bundles, tmp_path):
    """A DLA engine is static at one batch (the opt batch): Triton's TensorRT backend refuses a config whose
    max_batch_size exceeds the engine's, and runs the instance on the DLA only through an NVDLA secondary device;
    nvinfer builds on the GPU unless enable-dla and use-dla-core say otherwise, and names that build ..._dla<core>_..."""
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from tritonclient.grpc import model_config_pb2 as mc

    from vitedge.backends import backend_facts
    from vitedge.camera_apps.deepstream import write_deepstream
    from vitedge.camera_apps.triton import config_text

    bundle, served = bundles / "jetson", backend_facts("tensorrt")
    manifest = _as_member(read_manifest(bundle), "jetson-orin", dla_core=1)
    path = tmp_path / "config.pbtxt"
    path.write_text(config_text(manifest, bundle, "m", served))
    cfg = _model_config(path)
    assert cfg.max_batch_size == 4 and list(cfg.dynamic_batching.preferred_batch_size) == [4]
    [group] = cfg.instance_group
    assert group.kind == mc.ModelInstanceGroup.KIND_GPU
    assert [(d.kind, d.device_id) for d in group.secondary_devices] == [(mc.ModelInstanceGroup.SecondaryDevice.KIND_NVDLA, 1)]
    (tmp_path / "ds").mkdir()
    write_deepstream(bundle, manifest, tmp_path / "ds", rel=str(bundle), served=served)
    props = read_config(tmp_path / "ds" / "config_infer.txt")
    assert props["enable-dla"] == "1" and props["use-dla-core"] == "1" and props["batch-size"] == "4"
    assert props["model-engine-file"] == _nvinfer_own_build(props) and props["model-engine-file"].endswith("_b4_dla1_int8.engine")
    gpu = _as_member(read_manifest(bundle), "jetson-orin")  # no DLA: the profile's batches, no secondary device
    path.write_text(config_text(gpu, bundle, "m", served))
    cfg = _model_config(path)
    assert cfg.max_batch_size == 8 and not cfg.instance_group[0].secondary_devices


@pytest.mark.parametrize("kind", ["classifier", "embedding"])
def test_version_compatible_bundle_gives_deepstream_an_engine_nvinfer_can_load(bundles, tmp_path, monkeypatch, kind):
    """nvinfer deserializes without allowing engine host code, so a version-compatible engine never loads there:
    `vitedge engine` builds DeepStream's engine without VERSION_COMPATIBLE (from the bundle's own graph too, when
    nvinfer runs that one), and the config points at it, never at the version-compatible one."""
    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "cache"))
    bundle = tmp_path / "vc"
    shutil.copytree(bundles / "jetson", bundle)
    path = bundle / "manifest.json"
    doc = json.loads(path.read_text())
    for member in doc["target"]["profile"]["backend_options"]["members"].values():
        member["backend_options"]["version_compatible"] = True
    if kind == "embedding":
        doc["output"]["kind"] = "embedding"
    path.write_text(json.dumps(doc))
    result = complete_with_standin(bundle, ORIN_NANO)
    info = result.manifest.backend_info
    assert info["version_compatible"] and "VERSION_COMPATIBLE" in info["plan"]["builder_flags"]
    ds_info = info["deepstream_engine"]
    assert "VERSION_COMPATIBLE" not in ds_info["builder_flags"] and (bundle / ENGINE_FILE).stat().st_size
    assert ds_info["graph"] == (f"camera/deepstream/{BAKED_GRAPH}" if kind == "classifier" else "model.int8.onnx")
    props = read_config(bundle / "camera" / "deepstream" / "config_infer.txt")
    assert props["model-engine-file"] == f"../../{ENGINE_FILE}"
    assert "version-compatible, which nvinfer cannot load" in (bundle / "camera" / "deepstream" / "config_infer.txt").read_text()
    verify_bundle(bundle)
