"""Shared fixtures: small real models (random weights), saved in the formats users bring, and the
bundles several test modules share (built once per test session). Plain helpers: tests/helpers/."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest

# No process of the run may outlive it: tests/helpers/leftover_plugin.py.
from helpers.leftover_plugin import pytest_sessionfinish, pytest_terminal_summary, pytest_testnodedown  # noqa: F401
# Library objects kept out of full garbage collections: tests/helpers/gc_freeze.py.
from helpers.gc_freeze import pytest_fixture_setup, pytest_runtest_setup  # noqa: F401
from helpers.schedule import heaviest_first, keep_collection_order

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
CALIB_DIR = REPO / "calibration" / "digits" / "calib"
VAL_DIR = REPO / "calibration" / "digits" / "val"

# A user's own ViT class (pre-norm nn.TransformerEncoder), written to a file by tests
# that exercise --model-class.
CUSTOM_VIT_SOURCE = (
    "import torch\n"
    "class TinyViT(torch.nn.Module):\n"
    "    pretrained_cfg = {'mean': (0.5, 0.5, 0.5), 'std': (0.5, 0.5, 0.5), 'crop_pct': 1.0, 'interpolation': 'bilinear', 'input_size': (3, 32, 32)}\n"
    "    def __init__(self, dim=32, depth=2, heads=2, classes=4):\n"
    "        super().__init__()\n"
    "        self.embed = torch.nn.Conv2d(3, dim, 8, 8)\n"
    "        self.cls = torch.nn.Parameter(torch.zeros(1, 1, dim))\n"
    "        self.pos = torch.nn.Parameter(torch.randn(1, 17, dim) * .02)\n"
    "        layer = torch.nn.TransformerEncoderLayer(dim, heads, 2 * dim, batch_first=True, norm_first=True)\n"
    "        self.encoder = torch.nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)\n"
    "        self.out = torch.nn.Linear(dim, classes)\n"
    "    def forward(self, x):\n"
    "        x = self.embed(x).flatten(2).transpose(1, 2)\n"
    "        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos\n"
    "        return self.out(self.encoder(x)[:, 0])\n"
)

# OpenVINO's and NNCF's telemetry forks a sender that hangs on this closed network holding the run's
# pipe; vitedge blocks it in its own processes, and the test processes do the same before any import.
from vitedge.backends.openvino import block_vendor_telemetry  # noqa: E402

block_vendor_telemetry()
os.environ.setdefault("VITEDGE_CACHE_DIR", str(Path(os.environ.get("TMPDIR", "/tmp")) / "vitedge-test-cache"))
# The workers (and their children) share the cores: idle ONNX Runtime threads sleep instead of spinning, which about
# halves the CPU time of its runs here (vitedge.onnxkit.session.SPINNING_ENV; tests/onnxkit/test_ort_spinning.py).
os.environ.setdefault("VITEDGE_ORT_SPINNING", "0")
warnings.filterwarnings("ignore", category=DeprecationWarning)


def pytest_configure(config):
    keep_collection_order(config)  # xdist hands out the files in the order below (tests/helpers/schedule.py)


def pytest_collection_modifyitems(session, config, items):
    items[:] = heaviest_first(items)  # the files measured heaviest first, so none of them is left to run alone at the end


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


def _seeded():
    import torch

    torch.manual_seed(0)
    return torch


@pytest.fixture(scope="session")
def timm_vit(model_dir):
    """A 2-block timm ViT at 32x32 with patch 8, as (module, state_dict path)."""
    torch = _seeded()
    import timm

    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=10).eval()
    path = model_dir / "timm_vit.pt"
    torch.save(m.state_dict(), path)
    return m, path


@pytest.fixture(scope="session")
def timm_qdq(timm_vit, tmp_path_factory):
    """(the Q/DQ graph ``build_qdq`` writes for ``timm_vit`` from 16 digits calibration images, its depth): what
    the onnx target's rewrites (attention, GEMM bias, patch embedding) start from. Tests copy it before rewriting."""
    from vitedge.datasources.sources import open_source
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import load_model
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    folder = tmp_path_factory.mktemp("timm-qdq")
    loaded = load_model(timm_vit[1], None)
    export_onnx(loaded, folder / "model.fp32.onnx")
    source = open_source(CALIB_DIR, loaded.spec.preprocess, limit=16, seed=0, class_names=None)
    cal = calibrate(folder / "model.fp32.onnx", source, QuantConfig(), cache_dir=folder / "cache")
    return build_qdq(cal).model, loaded.spec.depth


@pytest.fixture(scope="session")
def torchvision_vit(model_dir):
    torch = _seeded()
    from torchvision.models.vision_transformer import VisionTransformer

    m = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=5).eval()
    torch.nn.init.normal_(m.heads.head.weight, std=0.5)  # torchvision zero-initialises the head
    path = model_dir / "tv_vit.pt"
    torch.save(m.state_dict(), path)
    return m, path


@pytest.fixture(scope="session")
def deit_distilled(model_dir):
    torch = _seeded()
    import timm

    m = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=7).eval()
    path = model_dir / "deit_distilled.pt"
    torch.save(m.state_dict(), path)
    return m, path


@pytest.fixture(scope="session")
def example_bundles(tmp_path_factory, untimed_targets_dir):
    """One GPU-less build of the bundled example for onnx, intel-cpu and the jetson family (the
    accuracy gate loosened: these bundles serve family and camera-app tests, not accuracy ones; no INT8 timing),
    once per test run (shared by xdist workers; the tests read it or copy it): (bundles folder, the build's output)."""
    from camera_support import build_example_bundles, skip_without_example_bundles
    from helpers.once_per_run import once_per_run
    from helpers.profiles import untimed_targets

    def make(root: Path) -> None:
        _, text = build_example_bundles(root / "digits")
        (root / "build-output.txt").write_text(text, encoding="utf-8")

    skip_without_example_bundles()  # each worker skips for itself, not only the one that builds
    with untimed_targets(untimed_targets_dir):
        root = once_per_run(tmp_path_factory, "example-bundles", make)
    return root / "digits", (root / "build-output.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def built_bundle(tmp_path_factory, untimed_targets_dir) -> Path:
    """One `onnx` bundle of examples/digits_vit.pt per test run (shared by xdist workers: tests read it or copy it;
    latency not measured, no INT8 timing)."""
    from helpers.once_per_run import once_per_run
    from helpers.profiles import untimed_targets
    from vitedge.app.build import BuildRequest, run_build
    from vitedge.core.ui import StageLog

    def make(root: Path) -> None:
        run_build(BuildRequest(model=EXAMPLES / "digits_vit.pt", targets=("onnx",), calib=CALIB_DIR, val=VAL_DIR, out=root / "onnx",
                               measure_speed=False), StageLog(quiet=True))

    with untimed_targets(untimed_targets_dir):
        return once_per_run(tmp_path_factory, "validate-bundles", make) / "onnx"


@pytest.fixture
def bundle(built_bundle, tmp_path) -> Path:
    """A private copy of the built bundle, without the report/ folder the build wrote."""
    dst = tmp_path / "bundle"
    shutil.copytree(built_bundle, dst)
    shutil.rmtree(dst / "report")
    return dst


@pytest.fixture(scope="session")
def runtime_bundles(tmp_path_factory, untimed_targets_dir) -> dict[str, dict[str, Path]]:
    """{"plain"|"baked": {target: bundle}}, built once per test run (shared by xdist workers; no INT8 timing)."""
    from helpers.once_per_run import once_per_run
    from helpers.profiles import untimed_targets
    from helpers.runtime_bundles import KINDS, TARGETS, build_runtime_bundles

    with untimed_targets(untimed_targets_dir):
        root = once_per_run(tmp_path_factory, "runtime-bundles", lambda r: build_runtime_bundles(r, EXAMPLES / "digits_vit.pt", CALIB_DIR, VAL_DIR))
    return {kind: {t: root / kind / t for t in TARGETS} for kind in KINDS}


@pytest.fixture(scope="session")
def earlier_onnx_bundle(tmp_path_factory) -> tuple[Path, Path]:
    """(bundle, cache): an `onnx` bundle of examples/digits_vit.pt built on the calibration set (no --val, latency not
    measured) with its own cache, once per test run (shared by xdist workers). The SIGTERM cases
    (tests/reliability/test_sigterm*.py) build over copies of it; the late ones start from its calibration statistics."""
    from helpers.once_per_run import once_per_run
    from vitedge.app.build import BuildRequest, run_build
    from vitedge.core.ui import StageLog
    from vitedge.validation.reference_cache import ReferenceCacheSettings

    def make(root: Path) -> None:
        results = run_build(BuildRequest(model=EXAMPLES / "digits_vit.pt", targets=("onnx",), calib=CALIB_DIR, out=root / "b",
                                         measure_speed=False, cache=ReferenceCacheSettings(root=root / "cache")), StageLog(quiet=True))
        assert [r.passed for r in results] == [True], results  # the CLI's exit 0

    root = once_per_run(tmp_path_factory, "earlier-onnx-bundle", make)
    return root / "b", root / "cache"


@pytest.fixture(scope="session")
def outlier_vit(tmp_path_factory) -> Path:
    """examples/digits_vit.pt with activation outliers planted by a function-preserving rewrite
    (examples/make_outlier_vit.py, k = 300), once per test run (shared by xdist workers): the accuracy-budget tests
    (tests/budget/test_budget*.py) build it. examples/ is put on sys.path, so a test can `import make_outlier_vit`."""
    import sys

    from helpers.once_per_run import once_per_run

    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    import make_outlier_vit as mo

    root = once_per_run(tmp_path_factory, "outlier-vit", lambda r: mo.make_checkpoint(r / "digits_vit_outliers.pt", k=300.0))
    return root / "digits_vit_outliers.pt"


@pytest.fixture(scope="session")
def untimed_targets_dir(tmp_path_factory) -> Path:
    """A VITEDGE_TARGETS_PATH folder whose onnx, intel-cpu and intel-cpu-vnni profiles are the shipped ones with
    ``int8_payoff = false`` (tests/helpers/profiles.py), once per test process."""
    from helpers.profiles import write_untimed_targets

    return write_untimed_targets(tmp_path_factory.mktemp("untimed-targets"))


@pytest.fixture
def no_int8_timing(untimed_targets_dir, monkeypatch) -> None:
    """Builds by target name in this test (in this process and in its children) skip the INT8-vs-FP32 timing: for
    tests that pin something else (the timing's own tests are tests/backends/test_int8_payoff.py,
    tests/app/test_int8_not_faster.py and the payoff records in tests/app/test_shipped.py)."""
    from helpers.profiles import untimed_targets_env

    for key, value in untimed_targets_env(untimed_targets_dir).items():
        monkeypatch.setenv(key, value)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A small Q/DQ graph (see helpers.tensorrt_graphs) as (path, GraphFacts), one per test module."""
    from helpers.tensorrt_graphs import write_tiny_qdq_graph

    return write_tiny_qdq_graph(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def force_external(monkeypatch):
    """Every graph counts as past protobuf's 2 GiB limit, so a small model takes the external-data path."""
    from vitedge.onnxkit.files import EXTERNAL_DATA_ENV

    monkeypatch.setenv(EXTERNAL_DATA_ENV, "0")
