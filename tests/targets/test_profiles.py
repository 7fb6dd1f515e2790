"""Target profiles: the shipped ones parse, and every malformed one names its file and key."""

from __future__ import annotations

import pytest
from conftest import REPO

from vitedge.core.errors import ProfileError
from vitedge.targets.profiles import list_profiles, load_profile

GOOD = """
name = "my-box"
backend = "onnxruntime"
precision = "int8"
batch_sizes = [1, 4]
[thresholds]
max_top1_drop = 1
min_agreement = 0.98
[backend_options]
threads = 1
"""


def test_shipped_profiles_cover_the_devices():
    names = {p.stem for p in list_profiles()}
    assert {"onnx", "intel-cpu", "desktop-gpu", "jetson-orin", "jetson-orin-nano"} <= names


@pytest.mark.parametrize("name", ["onnx", "intel-cpu"])
def test_cpu_profiles_load(name):
    p = load_profile(name)
    assert p.name == name and p.precision == "int8" and 1 in p.batch_sizes
    assert 0 < p.thresholds.min_agreement <= 1


def test_user_profile_file(tmp_path):
    path = tmp_path / "my-box.toml"
    path.write_text(GOOD)
    p = load_profile(str(path))
    assert (p.name, p.backend, p.batch_sizes, p.thresholds.max_top1_drop, p.backend_options.threads) == ("my-box", "onnxruntime", (1, 4), 1, 1)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: "speed = 3\n" + s, "unknown key 'speed'"),
        (lambda s: s.replace("threads = 1", "threds = 1"), "unknown key 'backend_options.threds'"),
        (lambda s: s.replace("threads = 1", 'threads = "two"'), "'backend_options.threads' must be of type int"),
        (lambda s: s.replace("threads = 1", 'threads = 1\nfuse_attention = "yes"'), "'backend_options.fuse_attention' must be of type bool"),
        (lambda s: s.replace("threads = 1", "threads = 1\nfuse_attention = 1"), "'backend_options.fuse_attention' must be of type bool"),
        (lambda s: s.replace("min_agreement = 0.98", "min_agreement = 98"), "min_agreement must be a fraction"),
        (lambda s: s.replace("min_agreement = 0.98", "min_agreemnt = 0.98"), "unknown key 'thresholds.min_agreemnt'"),
        (lambda s: s.replace('backend = "onnxruntime"', 'backend = "tflite"'), "unknown backend 'tflite'"),
        (lambda s: s.replace('backend = "onnxruntime"\n', ""), "missing required key 'backend'"),
        (lambda s: s.replace('precision = "int8"', 'precision = "int4"'), "precision must be one of"),
        (lambda s: s.replace("batch_sizes = [1, 4]", "batch_sizes = [0]"), "'batch_sizes' must be a non-empty list"),
        (lambda s: s.replace("[thresholds]", "[thresholds"), "not valid TOML"),
        (lambda s: s + '\n[quantization]\nmethd = "mse"\n', "unknown key 'quantization.methd'"),
    ],
)
def test_malformed_profiles_name_file_and_key(tmp_path, edit, message):
    path = tmp_path / "bad.toml"
    path.write_text(edit(GOOD))
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert message in str(info.value) and str(path) in str(info.value)


def test_attention_fusion_switch(tmp_path):
    """The shipped onnx profile fuses attention; a copy can turn it off, but only with a TOML boolean."""
    assert load_profile("onnx").backend_options.fuse_attention is True
    shipped = (REPO / "targets" / "onnx.toml").read_text()
    off = tmp_path / "onnx-plain.toml"
    off.write_text(shipped.replace("fuse_attention = true", "fuse_attention = false"))
    assert load_profile(str(off)).backend_options.fuse_attention is False
    bad = tmp_path / "onnx-yes.toml"
    bad.write_text(shipped.replace("fuse_attention = true", 'fuse_attention = "yes"'))
    with pytest.raises(ProfileError) as info:
        load_profile(str(bad))
    message = str(info.value)
    assert "\n" not in message and str(bad) in message and "backend_options.fuse_attention" in message and "bool" in message


def test_unknown_target_lists_known_ones():
    with pytest.raises(ProfileError, match="known targets: .*intel-cpu"):
        load_profile("raspberry-pi")
