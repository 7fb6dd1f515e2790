"""vitedge.runtime on real bundles of the bundled digits ViT (onnx and intel-cpu, plain and
with baked preprocessing): agreement with the build's own validation and with the runners,
colour order, mixed frame sizes, bad input, bundle checks, threads, and a light import."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLES, VAL_DIR
from helpers.runtime_bundles import HEAVY, TARGETS
from PIL import Image

from vitedge.core.errors import BundleError, MissingDependencyError, UsageError
from vitedge.bundle.preprocess import preprocess_array
from vitedge.runtime import FrameError, Prediction, Predictions, load


@pytest.fixture(scope="session")
def val_set() -> tuple[list[np.ndarray], np.ndarray]:
    files = sorted(VAL_DIR.glob("*/*.png"))
    frames = [np.asarray(Image.open(f).convert("RGB")) for f in files]
    labels = np.array([int(f.parent.name) for f in files])
    return frames, labels


@pytest.fixture(scope="session")
def models(runtime_bundles):
    opened = {(kind, t): load(path) for kind, by_target in runtime_bundles.items() for t, path in by_target.items()}
    yield opened
    for m in opened.values():
        m.close()


def _copy(bundle: Path, dst: Path, **manifest_changes) -> Path:
    out = dst / bundle.name
    shutil.copytree(bundle, out)
    if manifest_changes:
        data = json.loads((out / "manifest.json").read_text())
        for dotted, value in manifest_changes.items():
            node = data
            *parents, last = dotted.split("__")
            for key in parents:
                node = node[key]
            node[last] = value
        (out / "manifest.json").write_text(json.dumps(data))
    return out


# -- agreement with the build ---------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", ["plain", "baked"])
def test_top1_equals_the_bundles_own_validation(models, val_set, kind, target):
    model = models[(kind, target)]
    frames, labels = val_set
    preds = model.predict(frames, top_k=5)
    acc = model.manifest.validation["accuracy"]
    assert len(preds) == acc["samples"] == len(frames)
    assert float(np.mean(preds.top1 == labels)) == pytest.approx(acc["int8_top1"], abs=1e-12)
    top5 = float(np.mean(np.any(preds.indices == labels[:, None], axis=1)))
    assert top5 == pytest.approx(acc["int8_top5"], abs=1e-12)


@pytest.mark.parametrize("target", TARGETS)
def test_baked_and_plain_preprocessing_give_the_same_top1(models, val_set, target):
    frames, _ = val_set
    plain = models[("plain", target)].predict(frames, top_k=1).top1
    baked = models[("baked", target)].predict(frames, top_k=1).top1
    assert np.array_equal(plain, baked)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", ["plain", "baked"])
def test_logits_equal_the_runner_on_the_same_preprocessed_input(models, val_set, kind, target):
    from vitedge.backends import get_backend
    from vitedge.validation.inputs import to_uint8_frames

    model = models[(kind, target)]
    frames = val_set[0][:8]
    pre = model.preprocessing
    tensor = np.stack([preprocess_array(f, pre) for f in frames])  # the build's own preprocessing
    feed = to_uint8_frames(tensor, pre) if model.baked else tensor
    assert np.array_equal(model.preprocess(frames), feed)
    backend = get_backend(model.backend)
    options = backend.options_type(**model.manifest.target.profile["backend_options"])
    with backend.open_runner(model.bundle / model.manifest.artifacts.model, options) as runner:
        expected = runner.infer(feed)
    np.testing.assert_allclose(model.logits(frames), expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(model.infer(feed), expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(model.logits(frames[0]), expected[0], rtol=0, atol=1e-5)  # one frame -> (C,)
    probs = np.exp(expected - expected.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    preds = model.predict(frames, top_k=10)
    np.testing.assert_allclose(preds.probs, np.take_along_axis(probs, preds.indices, 1), atol=1e-6)


# -- frames ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_bgr_frames_with_color_bgr_equal_rgb_frames(models, val_set, target):
    model = models[("plain", target)]
    # the digits are grey (R = G = B): tint them so the channel order matters
    frames = [(f * np.array([1.0, 0.7, 0.35])).astype(np.uint8) for f in val_set[0][:6]]
    frames.append(np.random.default_rng(0).integers(0, 256, (50, 70, 3), dtype=np.uint8))
    bgr = [np.ascontiguousarray(f[..., ::-1]) for f in frames]
    assert np.array_equal(model.logits(bgr, color="bgr"), model.logits(frames, color="rgb"))
    assert np.array_equal(model.preprocess(bgr, color="BGR"), model.preprocess(frames))
    # and BGR read as RGB is a different input: the flag matters
    assert not np.array_equal(model.preprocess(bgr), model.preprocess(frames))


@pytest.mark.parametrize("kind", ["plain", "baked"])
def test_preprocess_is_bit_identical_to_vitedge_preprocess(models, kind):
    from vitedge.bundle.preprocess import image_to_uint8

    model = models[(kind, "onnx")]
    pre = model.preprocessing
    rng = np.random.default_rng(1)
    for h, w in ((480, 640), (37, 101), (32, 32), (1, 1), (300, 20)):
        frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        for bgr in (False, True):
            want = preprocess_array(frame, pre, bgr=bgr)  # the function calibration and validation use
            if model.baked:
                rgb = frame[..., ::-1] if bgr else frame
                want = image_to_uint8(Image.fromarray(np.ascontiguousarray(rgb)), pre)
            got = model.preprocess(frame, color="bgr" if bgr else "rgb")[0]
            assert got.dtype == want.dtype and np.array_equal(got, want), (h, w, bgr)


def _on_canvas(frame: np.ndarray, h: int, w: int) -> np.ndarray:
    canvas = np.zeros((h, w, 3), np.uint8)
    fh, fw = frame.shape[:2]
    canvas[(h - fh) // 2:(h - fh) // 2 + fh, (w - fw) // 2:(w - fw) // 2 + fw] = frame
    return canvas


@pytest.mark.parametrize("kind", ["plain", "baked"])
def test_a_batch_may_mix_frame_sizes(models, val_set, kind):
    model = models[(kind, "onnx")]
    f = val_set[0]
    frames = [f[0], _on_canvas(f[1], 96, 128), np.asarray(Image.fromarray(f[2]).resize((200, 150))),
              f[3][5:60, 10:40], _on_canvas(f[4], 480, 640)]
    preds = model.predict(frames, top_k=3)
    assert isinstance(preds, Predictions) and len(preds) == 5 and preds.indices.shape == (5, 3)
    for frame, pred in zip(frames, preds):
        single = model.predict(frame, top_k=3)
        assert isinstance(single, Prediction)
        assert single.indices == pred.indices
        assert single.probs == pytest.approx(pred.probs, abs=1e-6)
    h, w = model.input_size
    assert model.preprocess(frames).shape == ((5, h, w, 3) if model.baked else (5, 3, h, w))
    stacked = np.stack([_on_canvas(x, 80, 80) for x in f[:4]])  # an NxHxWx3 array is a batch too
    assert len(model.predict(stacked)) == 4


def test_prediction_results_are_typed_and_consistent(models, val_set):
    model = models[("plain", "onnx")]
    frames, labels = val_set
    one = model.predict(frames[0], top_k=3)
    assert isinstance(one, Prediction) and len(one.indices) == 3
    assert one.name == model.class_names[one.index] and one.label == one.name
    assert list(one.probs) == sorted(one.probs, reverse=True) and 0 < sum(one.probs) <= 1 + 1e-6
    assert one.to_dict()["names"] == [model.class_names[i] for i in one.indices]
    batch = model.predict(frames[:10], top_k=20)  # k is capped at the number of classes
    assert batch.probs.shape == (10, 10) and np.allclose(batch.probs.sum(1), 1, atol=1e-5)
    assert batch.names[0] == tuple(model.class_names[i] for i in batch.indices[0])
    assert isinstance(batch[2:5], Predictions) and len(batch[2:5]) == 3
    assert np.array_equal(batch.top1, model.logits(frames[:10]).argmax(1))
    empty = model.predict([])
    assert len(empty) == 0 and empty.indices.shape[0] == 0


def test_top_k_paths_agree_on_ranking_ties_and_probabilities():
    from vitedge.runtime.results import softmax, top_k, top_k_one

    rng = np.random.default_rng(3)
    for c in (2, 10, 300, 5000):
        logits = rng.normal(size=(4, c)).astype(np.float32) * 5
        logits[0, 1] = logits[0, c - 1] = logits[0].max() + 1  # a tie for the top: the lower index wins
        for k in (1, 3, 12):
            kk = min(k, c)
            want = np.argsort(-logits, axis=1, kind="stable")[:, :kk]
            idx, probs = top_k(logits, k)
            assert np.array_equal(idx, want) and np.array_equal(idx[:, 0], logits.argmax(1))
            np.testing.assert_allclose(probs, np.take_along_axis(softmax(logits), want, 1), atol=1e-6)
            for row in range(4):
                one = top_k_one(logits[row], k, None)
                assert one.indices == tuple(want[row]) and one.names is None
                np.testing.assert_allclose(one.probs, probs[row], atol=1e-6)


@pytest.mark.parametrize(
    "frame, words",
    [
        (np.zeros((64, 64, 3), np.float32), ["float32", "uint8", "model.infer"]),
        (np.zeros((64, 64), np.uint8), ["grayscale", "3 channels"]),
        (np.zeros((64, 64, 1), np.uint8), ["grayscale"]),
        (np.zeros((64, 64, 4), np.uint8), ["4 channels", "frame[..., :3]"]),
        (np.zeros((3, 64, 64), np.uint8), ["channels-first", "transpose"]),
        (np.zeros((0, 64, 3), np.uint8), ["empty"]),
        (np.zeros((2, 2, 64, 64, 3), np.uint8), ["shape"]),
        ("frame.png", ["numpy array"]),
        (Image.new("RGB", (8, 8)), ["np.asarray"]),
        ([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8, 3), np.uint16)], ["frame 1", "uint16"]),
    ],
    ids=["float", "gray2d", "gray1ch", "rgba", "chw", "empty", "5d", "path", "pil", "mixed-dtype"],
)
def test_bad_frames_raise_one_line_errors(models, frame, words):
    model = models[("plain", "onnx")]
    with pytest.raises(FrameError) as err:
        model.predict(frame)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_bad_arguments_raise_usage_errors(models, val_set):
    model = models[("plain", "onnx")]
    frame = val_set[0][0]
    with pytest.raises(UsageError, match="'rgb' or 'bgr'"):
        model.predict(frame, color="rgba")
    with pytest.raises(UsageError, match="top_k"):
        model.predict(frame, top_k=0)
    with pytest.raises(UsageError, match="classifier bundle"):
        model.embed(frame)
    with pytest.raises(UsageError, match="float32"):
        model.infer(np.zeros((1, 32, 32, 3), np.uint8))  # the plain bundle takes float32 NCHW


# -- bundles --------------------------------------------------------------------------------------


def test_altered_bundle_is_refused_unless_verify_is_false(runtime_bundles, tmp_path, val_set):
    bundle = _copy(runtime_bundles["plain"]["onnx"], tmp_path)
    with open(bundle / "reference.fp32.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(BundleError, match="sha256") as err:
        load(bundle)
    assert "\n" not in str(err.value)
    with load(bundle, verify=False, warmup=0) as model:
        assert model.predict(val_set[0][0]).index == val_set[1][0]
    (bundle / "model.int8.onnx").unlink()
    with pytest.raises(BundleError, match="missing"):
        load(bundle)


def test_unbuilt_tensorrt_bundle_says_to_build_the_engine_on_the_device(runtime_bundles, tmp_path):
    bundle = _copy(runtime_bundles["plain"]["onnx"], tmp_path, target__backend="tensorrt", target__name="jetson-orin",
                   artifacts__built=False, artifacts__model="model.engine")
    with pytest.raises(BundleError) as err:
        load(bundle)
    assert f"vitedge engine {bundle}" in str(err.value) and "on the device" in str(err.value)


def test_missing_backend_says_what_to_pip_install(runtime_bundles, tmp_path, monkeypatch):
    import vitedge.runtime.model as rt

    real = rt.importlib.util.find_spec
    monkeypatch.setattr(rt.importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    with pytest.raises(MissingDependencyError) as err:
        load(runtime_bundles["plain"]["intel-cpu"])
    assert "OpenVINO" in str(err.value) and "pip install openvino" in str(err.value)
    monkeypatch.undo()
    if real("tensorrt") is None:  # a real missing backend on this machine
        bundle = _copy(runtime_bundles["plain"]["onnx"], tmp_path, target__backend="tensorrt", target__name="jetson-orin")
        with pytest.raises(MissingDependencyError, match="TensorRT .* pip install tensorrt"):
            load(bundle)


def test_unknown_backend_and_damaged_manifest(runtime_bundles, tmp_path):
    bundle = _copy(runtime_bundles["plain"]["onnx"], tmp_path, target__backend="coreml")
    with pytest.raises(BundleError, match="coreml"):
        load(bundle)
    (bundle / "manifest.json").write_text("{")
    with pytest.raises(BundleError, match="not valid JSON"):
        load(bundle)
    with pytest.raises(BundleError, match="does not exist"):
        load(tmp_path / "nope")


def test_encoder_bundle_embeds_and_refuses_predict(runtime_bundles, tmp_path, val_set):
    bundle = _copy(runtime_bundles["plain"]["onnx"], tmp_path, output__kind="embedding", output__class_names=None)
    with load(bundle) as model:
        frames = val_set[0][:3]
        with pytest.raises(UsageError, match="encoder bundle.*model.embed"):
            model.predict(frames)
        emb = model.embed(frames)
        assert emb.shape == (3, 10) and model.embed(frames[0]).shape == (10,)
        assert np.allclose(np.linalg.norm(model.embed(frames, normalize=True), axis=1), 1, atol=1e-5)


def test_load_options_and_close(runtime_bundles, val_set):
    frames = val_set[0][:20]
    with load(runtime_bundles["plain"]["onnx"], warmup=0, threads=1, max_batch=3) as model:
        assert model.max_batch == 3
        chunked = model.logits(frames)  # 20 frames in chunks of 3
    with load(runtime_bundles["plain"]["onnx"]) as model:
        np.testing.assert_allclose(model.logits(frames), chunked, atol=1e-5)
    with pytest.raises(UsageError, match="closed"):
        model.predict(frames[0])
    with pytest.raises(UsageError, match="runners"):
        load(runtime_bundles["plain"]["onnx"], runners=0)


# -- threads --------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("runners", [1, 2])
def test_concurrent_predict_matches_sequential(runtime_bundles, val_set, target, runners):
    frames = val_set[0][:64]
    chunks = [frames[i:i + 4] for i in range(0, len(frames), 4)]
    with load(runtime_bundles["plain"][target], runners=runners, threads=1) as model:
        expected = [model.predict(c, top_k=3) for c in chunks]
        results: dict[tuple[int, int], Predictions] = {}
        errors: list[BaseException] = []

        def work(worker: int) -> None:
            try:
                for rep in range(3):
                    for i, c in enumerate(chunks):
                        results[(worker, rep * len(chunks) + i)] = model.predict(c, top_k=3)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert len(results) == 4 * 3 * len(chunks)
    for (_, n), got in results.items():
        want = expected[n % len(chunks)]
        assert np.array_equal(got.indices, want.indices)
        np.testing.assert_allclose(got.probs, want.probs, atol=1e-6)


# -- imports --------------------------------------------------------------------------------------


def _modules_after(code: str) -> dict:
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_does_not_load_heavy_or_backend_modules():
    loaded = _modules_after("import vitedge.runtime")
    assert not [m for m in HEAVY + ("onnxruntime", "openvino", "tensorrt") if m in loaded]


def test_load_and_predict_do_not_import_build_tools(runtime_bundles):
    paths = [str(p) for kind in ("plain", "baked") for p in runtime_bundles[kind].values()]
    code = (
        "import numpy as np\nfrom vitedge.runtime import load\n"
        f"for p in {paths!r}:\n"
        "    m = load(p)\n"
        "    m.predict(np.zeros((48, 64, 3), np.uint8), color='bgr'); m.logits([np.zeros((9, 9, 3), np.uint8)])\n"
    )
    loaded = _modules_after(code)
    assert {"onnxruntime", "openvino"} <= loaded  # it did run both backends
    assert not [m for m in HEAVY if m in loaded]


# -- the example app ------------------------------------------------------------------------------


def test_camera_loop_example_annotates_the_demo_video(runtime_bundles, tmp_path):
    cv2 = pytest.importorskip("cv2")
    video = tmp_path / "demo.avi"
    make = subprocess.run([sys.executable, str(EXAMPLES / "make_demo_video.py"), "-o", str(video), "--frames-per-digit", "6"],
                          capture_output=True, text=True, timeout=300)
    assert make.returncode == 0, make.stderr
    out, snap = tmp_path / "annotated.avi", tmp_path / "snap.png"
    run = subprocess.run([sys.executable, str(EXAMPLES / "camera_loop.py"), str(runtime_bundles["baked"]["intel-cpu"]),
                          "--source", str(video), "--out", str(out), "--max-frames", "24", "--snapshot", str(snap),
                          "--snapshot-at", "7"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "24 frames" in run.stdout and "top-1 in order: 0 x6, 1 x6, 2 x6, 3 x6" in run.stdout
    cap = cv2.VideoCapture(str(out))
    assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == 24
    cap.release()
    shot = cv2.imread(str(snap))
    assert shot.shape == (240, 320, 3)
    assert shot[:12, :60, 1].max() > 200  # the green label text sits on the darkened top strip
    bad = subprocess.run([sys.executable, str(EXAMPLES / "camera_loop.py"), str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "does not exist" in bad.stderr


def test_runtime_refuses_a_full_range_bundle_where_it_would_be_wrong(runtime_bundles, tmp_path, monkeypatch):
    """A bundle that records weight_range=full opens on VNNI CPUs and is refused on pre-VNNI
    x86 (or opened with a warning when allowed)."""
    import warnings

    import vitedge.core.cpu as cpu_mod
    from vitedge import runtime
    from vitedge.core.cpu import ANY_X86, VNNI, CpuInfo
    from vitedge.bundle.manifest import read_manifest

    avx2_only = CpuInfo(machine="x86_64", model="AMD EPYC", flags=frozenset({"avx2"}), known=True)
    vnni = CpuInfo(machine="x86_64", model="Intel Xeon", flags=frozenset({"avx2", "avx512_vnni"}), known=True)
    bundle = tmp_path / "onnx"
    shutil.copytree(runtime_bundles["plain"]["onnx"], bundle)
    doc = json.loads((bundle / "manifest.json").read_text())
    assert doc["quantization"]["cpu_requirement"] == ANY_X86 and doc["quantization"]["weight_range"] == "pairwise"
    doc["quantization"]["cpu_requirement"] = VNNI
    (bundle / "manifest.json").write_text(json.dumps(doc))
    assert read_manifest(bundle).quantization.cpu_requirement == VNNI
    monkeypatch.setattr(cpu_mod, "read_cpu", lambda *a, **k: avx2_only)
    with pytest.raises(BundleError, match="saturate.*VITEDGE_ALLOW_CPU_MISMATCH"):
        runtime.load(bundle, verify=False, warmup=0)
    with pytest.warns(RuntimeWarning, match="saturate"):
        runtime.load(bundle, verify=False, warmup=0, allow_cpu_mismatch=True).close()
    monkeypatch.setattr(cpu_mod, "read_cpu", lambda *a, **k: vnni)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runtime.load(bundle, verify=False, warmup=0).close()


def test_int8_layer_counts_come_from_each_runtime(runtime_bundles):
    """backend_info.int8_layers is read from what the runtime executes (issue 13: OpenVINO's
    count said 0 of 26 while its runtime model ran 25 FullyConnected in i8 and the conv in u8)."""
    from vitedge.bundle.manifest import read_manifest

    ov = read_manifest(runtime_bundles["plain"]["intel-cpu"])
    counts = ov.backend_info["int8_layers"]
    assert counts["source"] == "openvino runtime model"
    assert counts["int8"] == ov.quantization.layers_int8 > 0 and counts["other"] == 0, counts
    assert sum(row["count"] for key, row in counts["by_type"].items() if key.endswith((" i8", " u8"))) == counts["int8"]
    report = (runtime_bundles["plain"]["intel-cpu"] / "report.md").read_text()
    assert f"INT8 layers executed by openvino (its openvino runtime model): {counts['int8']} of {counts['int8']}" in report
    ort = read_manifest(runtime_bundles["plain"]["onnx"])
    counts = ort.backend_info["int8_layers"]
    assert counts["source"] == "onnxruntime optimized graph"
    assert 0 < counts["int8"] <= ort.quantization.layers_int8 and counts["by_type"].get("MatMulIntegerToFloat", 0) > 0
    assert counts["by_type"].get("MultiHeadAttention") == 6  # the fused float attention cores, counted as float
