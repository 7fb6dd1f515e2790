"""Camera-app exports: DeepStream nvinfer configs whose arithmetic reproduces vitedge's
preprocessing, and Triton model repositories parsed with Triton's own model-config protobuf.
Neither DeepStream nor Triton runs here: the configs are checked against the bundle and the
artifacts are run with the runtimes that are here."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from helpers.cli import run_vitedge
from helpers.jetson_devices import ORIN_NANO, complete_with_standin

from vitedge.camera_apps.deepstream import BAKED_GRAPH, read_config
from vitedge.manifest import read_manifest, verify_bundle
from vitedge.preprocess import normalize
from vitedge.spec import Preprocess

IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


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
    pre = Preprocess.from_dict(manifest.input["preprocess"])
    h, w = manifest.input["shape"][2:]
    assert props["infer-dims"] == f"3;{h};{w}" and props["network-type"] == "1" and props["network-mode"] == "1"
    assert props["labelfile-path"] == "labels.txt" and props["batch-size"] == str(max(manifest.target["profile"]["batch_sizes"]))
    assert (tmp_path / "ds" / "labels.txt").read_text().strip() == ";".join(manifest.output["class_names"])
    assert os.path.normpath(tmp_path / "ds" / props["onnx-file"]) == os.path.normpath(bundle.resolve() / "model.int8.onnx")
    assert "model-engine-file" not in props  # an onnx bundle has no engine
    for frame in _frames(h, w):
        np.testing.assert_allclose(_nvinfer_input(props, frame), normalize(frame, pre), atol=1e-5, rtol=0)


def test_per_channel_std_is_baked_into_the_graph_and_said_so(bundles, tmp_path):
    bundle = _with_manifest(bundles / "onnx", tmp_path / "imagenet", input__preprocess={
        **read_manifest(bundles / "onnx").input["preprocess"], **IMAGENET})
    code, text = run_vitedge(["export-config", "--for", "deepstream", str(bundle), "-o", str(tmp_path / "ds")])
    assert code == 0, text
    config = (tmp_path / "ds" / "config_infer.txt").read_text()
    assert "Per-channel std cannot be expressed by nvinfer's single net-scale-factor" in config and "baked" in config
    props = read_config(tmp_path / "ds" / "config_infer.txt")
    assert props["onnx-file"] == BAKED_GRAPH and float(props["net-scale-factor"]) == 1.0
    import onnx
    from onnx import numpy_helper

    from vitedge.onnxutil import ort_session

    baked = onnx.load(str(tmp_path / "ds" / BAKED_GRAPH))
    inits = {t.name: numpy_helper.to_array(t) for t in baked.graph.initializer}
    pre = Preprocess.from_dict({**read_manifest(bundle).input["preprocess"], **IMAGENET})
    frames = _frames(32, 32)
    for frame in frames:  # nvinfer's arithmetic, then the graph's own Mul/Add
        y = _nvinfer_input(props, frame)[None] * inits["vitedge_nvinfer/scale"] + inits["vitedge_nvinfer/shift"]
        np.testing.assert_allclose(y[0], normalize(frame, pre), atol=1e-5, rtol=0)
    # the baked graph on raw pixels computes what the bundle's graph computes on vitedge's input
    raw = np.stack([_nvinfer_input(props, f) for f in frames])
    ref = np.stack([normalize(f, pre) for f in frames])
    got = ort_session(str(tmp_path / "ds" / BAKED_GRAPH)).run(None, {"input": raw})[0]
    want = ort_session(str(bundle / "model.int8.onnx")).run(None, {"input": ref})[0]
    assert np.array_equal(got.argmax(1), want.argmax(1)) and np.abs(got - want).max() < 1e-2 * max(1.0, np.abs(want).max())


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
    profile = manifest.target["profile"]
    assert cfg.name == folder.name and cfg.platform == platform and cfg.backend == backend
    assert cfg.max_batch_size == max(profile["batch_sizes"])
    assert list(cfg.dynamic_batching.preferred_batch_size) == profile["batch_sizes"]
    [inp], [out] = cfg.input, cfg.output
    assert inp.name == manifest.input["name"] and inp.data_type == mc.TYPE_FP32 and inp.format == mc.ModelInput.FORMAT_NCHW
    assert list(inp.dims) == manifest.input["shape"][1:]
    assert out.name == manifest.output["name"] and list(out.dims) == [len(manifest.output["class_names"])]
    assert out.label_filename == "labels.txt" and (folder / "labels.txt").read_text().split() == manifest.output["class_names"]
    assert cfg.instance_group[0].kind == getattr(mc.ModelInstanceGroup, kind)
    assert sorted(p.name for p in (folder / "1").iterdir()) == sorted(files)
    assert (folder / "1" / files[0]).read_bytes() == (bundle / manifest.artifacts["model"]).read_bytes()
    if target == "onnx":  # the repository's model takes what config.pbtxt declares
        from vitedge.onnxutil import ort_session

        x = np.zeros((2, *inp.dims), np.float32)
        assert ort_session(str(folder / "1" / "model.onnx")).run([out.name], {inp.name: x})[0].shape == (2, *out.dims)


def test_jetson_bundle_carries_camera_configs_and_triton_after_the_engine(bundles, tmp_path, monkeypatch):
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "cache"))
    bundle = tmp_path / "jetson"
    shutil.copytree(bundles / "jetson", bundle)
    assert (bundle / "camera" / "deepstream" / "config_infer.txt").is_file()
    assert not (bundle / "camera" / "triton").exists()  # no engine yet
    code, text = run_vitedge(["export-config", "--for", "triton", str(bundle), "-o", str(tmp_path / "repo")])
    assert code == 2 and "vitedge engine BUNDLE" in text and not (tmp_path / "repo").exists()

    complete_with_standin(bundle, ORIN_NANO)
    manifest = verify_bundle(bundle)  # the camera files are hashed with the rest
    [folder] = list((bundle / "camera" / "triton").iterdir())
    assert f"camera/triton/{folder.name}/config.pbtxt" in manifest.files
    cfg = _model_config(folder / "config.pbtxt")
    assert cfg.platform == "tensorrt_plan" and cfg.max_batch_size == 4 and list(cfg.dynamic_batching.preferred_batch_size) == [1, 4]
    assert (folder / "1" / "model.plan").read_bytes() == (bundle / "model.engine").read_bytes()
    props = read_config(bundle / "camera" / "deepstream" / "config_infer.txt")
    assert props["model-engine-file"] == "../../model.engine" and props["batch-size"] == "1"  # jetson-orin-nano's opt batch
