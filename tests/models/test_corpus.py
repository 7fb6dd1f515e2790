"""The public corpus (benchmarks/corpus): ViTs other people trained, loaded strictly by our own classes.

The checkpoints and test sets are not committed (they belong to their authors): these tests run where a
corpus folder is found ($VITEDGE_CORPUS_CACHE, ~/.cache/vitedge/corpus, or shared/corpus next to the
checkout: cache.find_cache) and skip, naming what is missing, everywhere else. What needs no corpus (the
manifest, the classes, `fill` on git repositories made here) is checked always."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.corpus_suite import CORPUS, IDS, MANIFEST, cache, classes
from helpers.corpus_suite import load_module as _load
from helpers.corpus_suite import need as _need


def test_manifest_names_a_source_hash_licence_class_and_measurement_for_every_model():
    assert len(MANIFEST.models) >= 8
    for m in MANIFEST.models:
        assert len(m.file.commit) == 40 and len(m.file.sha256) == 64, m.id
        assert m.licence and m.claimed_where and m.dataset in MANIFEST.datasets, m.id
        assert m.measured_fp32_top1 is not None and 0 < m.measured_fp32_top1 < 100, m.id
        assert len(m.mean) == len(m.std) == m.channels, m.id
        module = getattr(classes, m.model_class)()
        out = module.eval()(torch.zeros(3, m.channels, m.size, m.size))
        assert out.shape == (3, m.outputs or len(MANIFEST.datasets[m.dataset].classes)), m.id
        if m.source_labels:  # scored on the labels it was trained with: every one is an output of the model
            assert max(MANIFEST.datasets[m.dataset].source_labels) < out.shape[1], m.id


def test_a_missing_file_is_named_with_how_to_bring_it(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "empty"))
    lines = cache.problems(MANIFEST, ["researchase-mnist"])
    assert any("researchase-mnist" in ln and "cache.py fill" in ln and "https://github.com/researchase/vit-mnist-explorations.git" in ln
               for ln in lines)
    assert any("mnist-test" in ln and "lijie2020/vae" in ln for ln in lines)


@pytest.mark.parametrize("model_id", IDS)
def test_corpus_model_loads_strictly_and_keeps_its_measured_accuracy(model_id, monkeypatch):
    """Our class loads the authors' state_dict with strict=True and, on 1,000 test images, scores within
    4 points of the FP32 top-1 the manifest records for the whole test set (binomial noise at ~55 % is
    +-3.1 points at 2 sigma): a wrong layout or preprocessing loses far more."""
    _need(monkeypatch, model_id)
    m = MANIFEST.model(model_id)
    module = getattr(classes, m.model_class)()
    # weights_only=True reads every corpus file, the training checkpoints (optimizer and scheduler state beside the
    # weights, under the manifest's state_dict_key) included
    module.load_state_dict(cache.weights_of(m, torch.load(m.path, map_location="cpu", weights_only=True)), strict=True)
    module.eval()
    ds = MANIFEST.datasets[m.dataset]
    items, labels = cache.load_images(ds)
    labels = cache.model_labels(m, ds, labels)
    pick = cache.split_indices(len(items), 0, 1000, seed=1).val
    x = np.stack([cache.decode(items[i], m.channels) for i in pick]).astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    x = (x - np.asarray(m.mean, np.float32).reshape(1, -1, 1, 1)) / np.asarray(m.std, np.float32).reshape(1, -1, 1, 1)
    with torch.no_grad():
        pred = module(torch.from_numpy(x)).argmax(1).numpy()
    top1 = float((pred == labels[list(pick)]).mean() * 100)
    assert abs(top1 - m.measured_fp32_top1) <= 4.0, f"{model_id}: {top1:.2f} % on 1,000 images vs {m.measured_fp32_top1} % measured"


def test_sequence_first_attention_keeps_each_image_to_itself_and_is_off_torchs_fast_path():
    """ProlaxmiSeqFirstViT turns tokens to (sequence, batch, width) around an nn.MultiheadAttention left at
    batch_first=False: a transposition mistake would let images of one batch attend to each other, so a batch's
    logits must equal each image's own. torch refuses its fused attention path for such a module (the reason
    the model is in the corpus): the reason torch gives is checked, not assumed."""
    torch.manual_seed(0)
    module = classes.ProlaxmiSeqFirstViT().eval()
    attention = module.transformer_blocks[0].multi_head_attention
    assert attention.batch_first is False and attention.num_heads == 8
    x = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        together = module(x)
        alone = torch.cat([module(x[i:i + 1]) for i in range(5)])
    assert together.shape == (5, 10)
    assert torch.allclose(together, alone, atol=1e-5)
    source = Path(torch.nn.modules.activation.__file__).read_text()
    assert 'why_not_fast_path = "batch_first was not True"' in source


def test_results_show_the_default_bundle_beside_each_anchor_per_model():
    """benchmarks/results/corpus.md: per model, the default command's bundle on each target, then every
    anchor on the same splits, with float layers counted as the layers left out of INT8."""
    bench = _load("corpus_bench_for_tests", CORPUS.parent / "corpus.py")
    build = dict(model="m1", format="state_dict", target="onnx", exit_code=0, seconds=12.0, fp32_top1=56.3, int8_top1=56.8,
                 drop_points=-0.5, agreement=97.8, int8_layers=18, layers_total=26, float_layers_returned=None, passed=True, note="")
    res = {"date": "d", "argv": [], "cpu": {"model": "cpu", "cores": 2, "flags": ["avx2"], "vnni": False}, "calib_size": 300,
           "val_size": 1000, "targets": ["onnx"], "extra": [], "builds": [build, {**build, "format": "pt2"}],
           "anchors": [{"model": "m1", "fp32_top1": 56.3, "method": "ORT quantize_static MinMax", "runtime": "onnxruntime",
                        "seconds": 3.0, "top1": 55.9, "drop": 0.4, "agreement": 89.9},
                       {"model": "m1", "method": "NNCF default (ONNX backend)", "error": "RuntimeError: refused"}]}
    text = bench.markdown(res)
    section = text.split("## The default command beside the anchors", 1)[1].split("## Every build", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| m1 |")]
    assert len(rows) == 3  # the state_dict build only, then both anchors
    assert "**vitedge default** (onnx)" in rows[0] and "| 8 of 26 |" in rows[0] and "| pass |" in rows[0]
    assert "ORT quantize_static MinMax" in rows[1] and "| 89.90 |" in rows[1] and "none (full INT8)" in rows[1]
    assert "RuntimeError: refused" in rows[2] and "none (full INT8)" not in rows[2]
    assert "no VNNI" in text



def test_every_build_row_marks_a_ratio_timed_on_a_busy_machine():
    """A build whose own timing window was busy (core_wait past the line) has its INT8/FP32 ratio marked in the
    results; a quiet one, or a report from before core_wait, is shown as it is."""
    bench = _load("corpus_bench_for_busy", CORPUS.parent / "corpus.py")
    build = dict(model="m1", format="state_dict", target="onnx", exit_code=0, seconds=12.0, fp32_top1=56.3, int8_top1=56.8,
                 drop_points=-0.5, agreement=97.8, int8_layers=18, layers_total=26, float_layers_returned=None, passed=True,
                 note="", ratio_b1=0.2, ratio_b8=0.9, core_wait_b1=1.3, core_wait_b8=0.02)
    res = {"date": "d", "argv": [], "cpu": {"model": "cpu", "cores": 2, "flags": ["avx2"], "vnni": False}, "calib_size": 300,
           "val_size": 1000, "targets": ["onnx"], "extra": [], "builds": [build, {**build, "format": "pt2", "core_wait_b1": None}]}
    rows = [l for l in bench.markdown(res).split("## Every build", 1)[1].splitlines() if l.startswith("| m1 |")]
    assert "| 0.20 (busy: core wait 1.30) | 0.90 |" in rows[0], rows[0]
    assert "| 0.20 | 0.90 |" in rows[1], rows[1]


def test_results_record_the_command_without_local_folders():
    """--work and --out name folders of the machine that ran it: the results file writes WORK and OUT instead."""
    bench = _load("corpus_bench_for_argv", CORPUS.parent / "corpus.py")
    argv = ["--models", "m1", "--work", "/home/me/w", "--out=/home/me/out", "--speed-rounds", "12"]
    assert bench.recorded_argv(argv) == ["--models", "m1", "--work", "WORK", "--out=OUT", "--speed-rounds", "12"]


def test_merged_runs_keep_only_the_later_run_of_a_model_on_a_target_or_runtime():
    """--merge: a model re-run on the onnx target replaces its earlier onnx rows; its intel-cpu rows, not re-run, stay."""
    bench = _load("corpus_bench_for_merge", CORPUS.parent / "corpus.py")
    old = [{"model": "a", "runtime": "onnxruntime", "ratio": 0.9}, {"model": "a", "runtime": "openvino", "ratio": 1.2},
           {"model": "b", "runtime": "onnxruntime", "ratio": 0.8}]
    new = [{"model": "a", "runtime": "onnxruntime", "ratio": 0.7}]
    assert bench.merged_rows("speed", [old, new]) == [old[1], old[2], new[0]]
    builds = bench.merged_rows("builds", [[{"model": "a", "target": "onnx"}, {"model": "a", "target": "intel-cpu"}],
                                          [{"model": "a", "target": "onnx", "new": True}]])
    assert builds == [{"model": "a", "target": "intel-cpu"}, {"model": "a", "target": "onnx", "new": True}]
    assert bench.merged_rows("load_average", [[1.0], [2.0]]) == [1.0, 2.0]


def test_results_summarise_int8_time_of_vitedge_beside_each_anchor_per_model_and_runtime():
    """The summary table: per model and runtime, vitedge's INT8/FP32 time at batch 1 / 8 beside ORT quantize_static
    (ONNX Runtime only) and NNCF's graph of the matching backend, then the FP32-vs-FP32 control that shows the
    timing's noise and the exported FP32 graph over the bundle's rewritten reference; a ratio above 1 is bold, a missing graph is '-'; the heading names the CPU kind."""
    bench = _load("corpus_bench_for_summary", CORPUS.parent / "corpus.py")

    def t(graph, runtime, b1, b8):
        return [dict(model="m1", batch=1, runtime=runtime, graph=graph, ratio=b1, median_ms=1.0),
                dict(model="m1", batch=8, runtime=runtime, graph=graph, ratio=b8, median_ms=1.0)]

    speed = (t("FP32", "onnxruntime", 1.0, 1.0) + t("vitedge INT8", "onnxruntime", 0.7, 1.2)
             + t("ORT quantize_static MinMax", "onnxruntime", 1.8, 1.3) + t("NNCF default (ONNX backend)", "onnxruntime", 0.9, 0.8)
             + t("FP32 control", "onnxruntime", 0.98, 1.02) + t("FP32 as exported", "onnxruntime", 1.5, 1.1)
             + t("FP32", "openvino", 1.0, 1.0) + t("vitedge INT8", "openvino", 0.6, 0.5)
             + t("NNCF default (OpenVINO backend)", "openvino", 1.1, 0.4)
             + [dict(model="m1", batch=1, runtime="openvino", graph="NNCF TRANSFORMER (OpenVINO backend)", error="refused")])
    res = {"date": "d", "argv": [], "cpu": {"model": "Xeon", "cores": 2, "flags": ["avx2", "avx512f", "avx512_vnni"], "vnni": True},
           "calib_size": 200, "val_size": 500, "targets": ["onnx", "intel-cpu"], "extra": [], "builds": [], "speed": speed}
    section = bench.markdown(res).split("## INT8/FP32 time per model", 1)[1].split("\n## ", 1)[0]
    assert "AVX-512 VNNI (Xeon)" in section.splitlines()[0]
    cells = {ln.split(" | ")[1]: [c.strip() for c in ln.strip("| ").split(" | ")[2:]]
             for ln in section.splitlines() if ln.startswith("| m1 |")}
    assert cells["onnxruntime (onnx)"] == ["0.70 / **1.20**", "**1.80** / **1.30**", "0.90 / 0.80", "-", "0.98 / **1.02**", "**1.50** / **1.10**"]
    assert cells["openvino (intel-cpu)"] == ["0.60 / 0.50", "-", "**1.10** / 0.40", "-", "-", "-"]


# ------------------------------------------------------------------ fill: real git repositories made here


def _git(*args, cwd):
    import subprocess

    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "init.defaultBranch=main", *args],
                   cwd=cwd, check=True, capture_output=True)


def _small_corpus(tmp_path: Path):
    """Two public-repository stand-ins, as real git repositories: a/ckpt (the checkpoint, changed by a later
    commit: the manifest pins the first) and b/data (a test set with a file and a folder). Returns the
    folder of the work-tree repositories, the pinned commits, and a manifest of them."""
    import hashlib
    import subprocess

    root = tmp_path / "repos"
    a, b = root / "a" / "ckpt", root / "b" / "data"
    for r in (a, b):
        r.mkdir(parents=True)
        _git("init", "-q", cwd=r)
    (a / "w").mkdir()
    (a / "w" / "model.pt").write_bytes(b"weights v1")
    _git("add", ".", cwd=a)
    _git("commit", "-qm", "v1", cwd=a)
    commit_a = subprocess.run(["git", "rev-parse", "HEAD"], cwd=a, capture_output=True, text=True).stdout.strip()
    (a / "w" / "model.pt").write_bytes(b"weights v2")
    _git("commit", "-qam", "v2", cwd=a)
    (b / "labels.gz").write_bytes(b"labels")
    for cls in ("x", "y"):
        (b / "test" / cls).mkdir(parents=True)
        (b / "test" / cls / "0.jpg").write_bytes(cls.encode() * 3)
    _git("add", ".", cwd=b)
    _git("commit", "-qm", "data", cwd=b)
    commit_b = subprocess.run(["git", "rev-parse", "HEAD"], cwd=b, capture_output=True, text=True).stdout.strip()
    sha = lambda data: hashlib.sha256(data).hexdigest()  # noqa: E731
    tree = "".join(f"{c}/0.jpg {sha(c.encode() * 3)}\n" for c in ("x", "y"))
    text = f'''
[[dataset]]
id = "tiny"
kind = "image-folders"
repo = "b/data"
commit = "{commit_b}"
licence = "none"
classes = ["x", "y"]
  [[dataset.file]]
  name = "labels.gz"
  path = "labels.gz"
  sha256 = "{sha(b'labels')}"
  [[dataset.tree]]
  name = "test"
  path = "test"
  count = 2
  digest = "{hashlib.sha256(tree.encode()).hexdigest()}"

[[model]]
id = "m"
repo = "a/ckpt"
commit = "{commit_a}"
path = "w/model.pt"
sha256 = "{sha(b'weights v1')}"
licence = "none"
dataset = "tiny"
model_class = "M"
claimed_where = "nowhere"
preprocess = {{ channels = 3, size = 32, mean = [0.5, 0.5, 0.5], std = [0.5, 0.5, 0.5] }}
'''
    (tmp_path / "manifest.toml").write_text(text)
    return root, cache.load_manifest(tmp_path / "manifest.toml")


def _filled(root: Path) -> bool:
    return ((root / "models" / "m.pt").read_bytes() == b"weights v1"
            and (root / "data" / "tiny" / "labels.gz").read_bytes() == b"labels"
            and (root / "data" / "tiny" / "test" / "y" / "0.jpg").read_bytes() == b"yyy")


def test_fill_fetches_each_file_at_its_pinned_commit_over_git(tmp_path, monkeypatch):
    """The network path, with file:// URLs standing in for GitHub: a depth-1 fetch of the pinned commit (not the
    branch tip, whose checkpoint differs), the file and the folder at that commit, every hash checked."""
    repos, manifest = _small_corpus(tmp_path)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    assert cache.fill(manifest, url=f"file://{repos}/{{repo}}") == []
    assert _filled(tmp_path / "cache")
    assert cache.problems(manifest) == []


def test_fill_reads_local_clones_bare_or_not_named_owner_plus_name_or_owner_slash_name(tmp_path, monkeypatch):
    repos, manifest = _small_corpus(tmp_path)
    clones = tmp_path / "clones"
    clones.mkdir()
    _git("clone", "-q", str(repos / "a" / "ckpt"), str(clones / "a+ckpt"), cwd=tmp_path)
    _git("clone", "-q", "--bare", str(repos / "b" / "data"), str(clones / "b" / "data"), cwd=tmp_path)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    assert cache.fill(manifest, clones=clones) == []
    assert _filled(tmp_path / "cache")


def test_fill_names_what_it_could_not_bring_and_a_wrong_hash(tmp_path, monkeypatch):
    repos, manifest = _small_corpus(tmp_path)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    lines = cache.fill(manifest, clones=tmp_path / "nothing-here")
    assert any("a/ckpt" in ln and "no git repository at" in ln and "a+ckpt" in ln for ln in lines)
    (tmp_path / "cache" / "models").mkdir(parents=True)
    (tmp_path / "cache" / "models" / "m.pt").write_bytes(b"tampered")
    lines = cache.problems(manifest)
    assert any("model m" in ln and "the manifest says" in ln for ln in lines)
    lines = cache.fill(manifest, url=f"file://{tmp_path}/no-such/{{repo}}")
    assert lines and all("git fetch" in ln or "missing" in ln or "the manifest says" in ln for ln in lines)
    assert (tmp_path / "cache" / "models" / "m.pt").read_bytes() == b"tampered"  # nothing half-written replaced it


def test_find_cache_prefers_the_variable_then_the_user_cache_then_a_folder_next_to_the_checkout(tmp_path, monkeypatch):
    repos, manifest = _small_corpus(tmp_path)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "filled"))
    assert cache.fill(manifest, url=f"file://{repos}/{{repo}}") == []
    assert cache.find_cache(manifest) == tmp_path / "filled"
    monkeypatch.delenv(cache.ENV)
    monkeypatch.setattr(cache, "DEFAULT_CACHE", tmp_path / "home-cache")
    monkeypatch.setattr(cache, "BESIDE_CHECKOUT", tmp_path / "filled")
    assert cache.find_cache(manifest) == tmp_path / "filled"  # the user cache is empty
    monkeypatch.setattr(cache, "DEFAULT_CACHE", tmp_path / "filled")
    monkeypatch.setattr(cache, "BESIDE_CHECKOUT", tmp_path / "nowhere")
    assert cache.find_cache(manifest) == tmp_path / "filled"
    monkeypatch.setenv(cache.ENV, str(tmp_path / "empty"))
    assert cache.find_cache(manifest) is None  # the variable, when set, is the only place looked at


def test_splits_go_to_a_writable_place_when_the_corpus_folder_is_read_only(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    monkeypatch.setenv(cache.ENV, str(ro))
    monkeypatch.delenv(cache.SPLITS_ENV, raising=False)
    ro.chmod(0o555)
    try:
        assert not str(cache.splits_dir()).startswith(str(ro))  # also as root, whom the permissions do not stop
    finally:
        ro.chmod(0o755)
    assert cache.splits_dir() == ro / "splits"
    monkeypatch.setenv(cache.SPLITS_ENV, str(tmp_path / "s"))
    assert cache.splits_dir() == tmp_path / "s"
