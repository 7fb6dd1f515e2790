"""A backend is one class that owns its facts (issue 27, item 1).

The proof: a backend defined here, registered with the public `register_backend`, with a target
profile in a folder of its own (VITEDGE_TARGETS_PATH), works in `vitedge targets`, `vitedge build`
(--dry-run and a real build of the example), `vitedge.runtime.load` and `vitedge export-config`,
and no vitedge module was edited for it. Also: the facts of the shipped backends are readable
without their runtimes, and no module above the backend layer decides by a backend's name.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import CALIB_DIR, EXAMPLES, VAL_DIR
from helpers.cli import run_vitedge

from vitedge.backends import (
    CPU,
    Backend,
    BackendFacts,
    BuildContext,
    BuiltArtifact,
    EnvironmentStatus,
    Runner,
    backend_facts,
    list_backends,
    register_backend,
    unregister_backend,
)
from vitedge.core.errors import MissingDependencyError
from vitedge.onnxkit.files import copy_onnx

REPO = Path(__file__).resolve().parents[2]
NAME = "fakert"  # the backend
TARGET = "fake-cpu"  # its target profile
ARTIFACT = "model.fakert.onnx"


@dataclass(frozen=True)
class FakeOptions:
    """[backend_options] of a fakert profile."""

    threads: int = 1


class FakeRunner(Runner):
    """Runs the (renamed) ONNX graph with ONNX Runtime's CPU provider."""

    backend_name = NAME

    def __init__(self, model_path: Path, threads: int):
        self.model_path, self.threads, self.session = Path(model_path), threads, None

    def open(self) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        self.session = ort.InferenceSession(str(self.model_path), opts, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def close(self) -> None:
        self.session = None

    def _infer_impl(self, batch: np.ndarray) -> np.ndarray:
        if self.session is None:
            self.open()
        return self.session.run(None, {self.input_name: batch})[0]


class FakeBackend(Backend):
    name = NAME
    options_type = FakeOptions
    facts = BackendFacts(runtime="FakeRT", runs_on=CPU, runtime_modules=("onnxruntime",),
                         install_hint="pip install fakert", runtime_install="pip install fakert",
                         triton_platform="onnxruntime_onnx")

    def check_environment(self) -> EnvironmentStatus:
        return EnvironmentStatus(True, True, "fakert 0.1 (ONNX Runtime underneath)")

    def build(self, ctx: BuildContext) -> BuiltArtifact:
        copy_onnx(ctx.qdq_path, ctx.out_dir / ARTIFACT)
        return BuiltArtifact(model=ARTIFACT, reference=ctx.fp32_path.name, info={"built_by": NAME})

    def open_runner(self, model_path: Path, options: FakeOptions, *, threads: int | None = None) -> Runner:
        return FakeRunner(model_path, threads or (options or FakeOptions()).threads)


PROFILE = f"""name = "{TARGET}"
description = "a backend registered by a test"
backend = "{NAME}"
precision = "int8"
batch_sizes = [1, 4]

[thresholds]
max_top1_drop = 5.0
min_agreement = 0.8
min_speedup = 0.0

[backend_options]
threads = 2
"""


@pytest.fixture(scope="module")
def fake_target(tmp_path_factory):
    """The fake backend registered and its profile in a folder on VITEDGE_TARGETS_PATH (both undone after)."""
    folder = tmp_path_factory.mktemp("my-targets")
    (folder / f"{TARGET}.toml").write_text(PROFILE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VITEDGE_TARGETS_PATH", str(folder))
        register_backend(NAME, FakeBackend)
        try:
            yield folder
        finally:
            unregister_backend(NAME)


@pytest.fixture(scope="module")
def fake_bundle(fake_target, tmp_path_factory) -> Path:
    """`vitedge build --target fake-cpu` of the example model, through the command line."""
    out = tmp_path_factory.mktemp("fake-build") / "out"
    code, text = run_vitedge(["build", str(EXAMPLES / "digits_vit.pt"), "--target", TARGET, "--calib", str(CALIB_DIR),
                              "--val", str(VAL_DIR), "-o", str(out), "--no-latency", "--quiet"])
    assert code == 0, text
    return out


def test_the_fake_backend_is_listed_by_vitedge_targets(fake_target):
    assert NAME in list_backends()
    code, text = run_vitedge(["targets", "--json"])
    assert code == 0, text
    rows = {t["name"]: t for t in json.loads(text)["targets"]}
    assert rows[TARGET]["backend"] == NAME and rows[TARGET]["status"] == "ready" and rows[TARGET]["batch_sizes"] == [1, 4]
    assert rows[TARGET]["detail"] == "fakert 0.1 (ONNX Runtime underneath)"
    assert "onnx" in rows  # vitedge's own profiles are still there
    code, text = run_vitedge(["targets"])
    assert code == 0 and any(line.split()[:2] == [TARGET, NAME] for line in text.splitlines()), text


def test_build_dry_run_takes_the_fake_target(fake_target):
    code, text = run_vitedge(["build", "--dry-run", str(EXAMPLES / "digits_vit.pt"), "--target", TARGET,
                              "--calib", str(CALIB_DIR), "--val", str(VAL_DIR)])
    assert code == 0, text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()[1:] if line.strip()}
    assert rows["--target"] == [TARGET, "flag"]


def test_a_real_build_writes_the_fake_artifact_and_validates_it(fake_bundle):
    manifest = json.loads((fake_bundle / "manifest.json").read_text())
    assert manifest["target"]["backend"] == NAME and manifest["target"]["name"] == TARGET
    assert manifest["artifacts"]["model"] == ARTIFACT and (fake_bundle / ARTIFACT).is_file()
    assert manifest["backend_info"] == {"built_by": NAME}
    validation = manifest["validation"]
    assert validation["passed"] is True and validation["runtime"]["backend"] == NAME
    assert validation["artifact"]["model"] == ARTIFACT and validation["accuracy"]["samples"] > 0
    assert not (fake_bundle / "camera").exists()  # camera/ is for bundles holding a TensorRT engine


def test_runtime_load_runs_the_fake_bundle(fake_bundle):
    import onnxruntime as ort

    from vitedge.runtime import load

    frames = [np.asarray(np.random.default_rng(i).integers(0, 256, (40, 36, 3)), np.uint8) for i in range(3)]
    with load(fake_bundle, runners=2) as model:
        assert model.backend == NAME
        batch = model.preprocess(frames)
        logits = model.logits(frames)
        top = model.predict(frames, top_k=1)
    session = ort.InferenceSession(str(fake_bundle / ARTIFACT), providers=["CPUExecutionProvider"])
    expected = session.run(None, {session.get_inputs()[0].name: batch})[0]
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    assert list(top.indices[:, 0]) == list(expected.argmax(axis=1))


def test_runtime_load_names_the_fake_backends_own_install_hint(fake_bundle):
    """The runtime's missing-dependency message comes from the backend's facts, not from a table."""
    from vitedge.runtime import load

    class Missing(FakeBackend):
        facts = BackendFacts(runtime="FakeRT", runs_on=CPU, runtime_modules=("fakert_runtime_not_installed",),
                             install_hint="pip install fakert", runtime_install="pip install fakert", runtime_extra="fakert")

    register_backend(NAME, Missing)
    try:
        with pytest.raises(MissingDependencyError) as err:
            load(fake_bundle)
    finally:
        register_backend(NAME, FakeBackend)
    text = str(err.value)
    assert "FakeRT" in text and "pip install fakert (or: pip install 'vitedge-runtime[fakert]')" in text, text


def test_export_config_writes_triton_and_deepstream_configs_for_the_fake_bundle(fake_bundle, tmp_path):
    code, text = run_vitedge(["export-config", "--for", "triton", str(fake_bundle), "-o", str(tmp_path / "triton")])
    assert code == 0, text
    (repo_model,) = (tmp_path / "triton").iterdir()
    config = (repo_model / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in config and "kind: KIND_CPU" in config and "max_batch_size: 4" in config
    assert (repo_model / "1" / "model.onnx").read_bytes() == (fake_bundle / ARTIFACT).read_bytes()
    code, text = run_vitedge(["export-config", "--for", "deepstream", str(fake_bundle), "-o", str(tmp_path / "ds")])
    assert code == 0, text
    assert "No engine vitedge built for nvinfer yet" in (tmp_path / "ds" / "config_infer.txt").read_text()


def test_register_backend_refuses_a_class_without_facts():
    class NoFacts(Backend):
        name = "nofacts"

    with pytest.raises(TypeError, match="BackendFacts"):
        register_backend("nofacts", NoFacts)
    with pytest.raises(TypeError, match="Backend subclass"):
        register_backend("nofacts", object)  # type: ignore[arg-type]
    assert "nofacts" not in list_backends()


def test_a_missing_targets_path_folder_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("VITEDGE_TARGETS_PATH", str(tmp_path / "nowhere"))
    code, text = run_vitedge(["targets"])
    assert code == 2 and "VITEDGE_TARGETS_PATH" in text and "nowhere" in text and "Traceback" not in text, text


def test_shipped_backend_facts_are_read_without_their_runtimes():
    """backend_facts imports the backend module, never onnxruntime, openvino or tensorrt."""
    code = ("import sys\nfrom vitedge.backends import backend_facts, list_backends\n"
            "facts = {n: backend_facts(n) for n in list_backends()}\n"
            "print(sorted(m for m in ('onnxruntime', 'openvino', 'tensorrt', 'cuda', 'torch', 'onnx') if m in sys.modules))\n"
            "print(sorted(n for n, f in facts.items() if f.on_cpu))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "['onnxruntime', 'openvino']"


def test_each_runtime_extra_is_one_of_the_runtime_distributions_extras():
    extras = tomllib.loads((REPO / "packaging" / "runtime" / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name in ("onnxruntime", "openvino", "tensorrt"):
        facts = backend_facts(name)
        assert facts.runtime_extra in extras, name
        assert all(module.split(".")[0] in " ".join(extras[facts.runtime_extra]) for module in facts.runtime_modules), name


# Modules outside the backend layer may hold a backend's name as data, never decide by it.
ALLOWED_NAME_TESTS = {
    # the accuracy budget's own stand-in runtime (ONNX Runtime, opened without a backend) in its record
    "vitedge/budget/record.py",
}


def test_no_module_outside_the_backends_decides_by_a_backend_name():
    names = {"onnxruntime", "openvino", "tensorrt"}
    found = []
    below = ("vitedge/backends/",)  # the backends themselves; camera apps read facts handed in
    for path in sorted((REPO / "vitedge").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(below) or rel in ALLOWED_NAME_TESTS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                consts = [c for side in [node.left, *node.comparators]
                          for c in ([side] if isinstance(side, ast.Constant) else getattr(side, "elts", []))]
                if any(isinstance(c, ast.Constant) and c.value in names for c in consts):
                    found.append(f"{rel}:{node.lineno}")
    assert not found, "compare the backend's facts (vitedge.backends.backend_facts), not its name: " + ", ".join(found)


def test_a_targets_path_folder_comes_first_and_its_families_are_found(tmp_path, monkeypatch):
    """VITEDGE_TARGETS_PATH folders are searched before vitedge's own targets/: a profile of the same name hides it."""
    from vitedge.targets.profiles import list_profiles, load_profile
    from vitedge.targets.families import is_family, list_families

    (tmp_path / "onnx.toml").write_text('backend = "onnxruntime"\nprecision = "int8"\nbatch_sizes = [2]\n')
    (tmp_path / "families").mkdir()
    (tmp_path / "families" / "my-cpus.toml").write_text("# listed only\n")
    monkeypatch.setenv("VITEDGE_TARGETS_PATH", str(tmp_path))
    assert load_profile("onnx").source == tmp_path / "onnx.toml" and load_profile("onnx").batch_sizes == (2,)
    assert [p for p in list_profiles() if p.stem == "onnx"] == [tmp_path / "onnx.toml"]
    assert is_family("my-cpus") and tmp_path / "families" / "my-cpus.toml" in list_families()
    assert load_profile("intel-cpu").source.parent != tmp_path  # the rest still come from vitedge's own folder
