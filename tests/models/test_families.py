"""Today's ViT families through the front door: state_dicts saved as users save them.

SigLIP-style MAP head, relative-position ViT, EVA-02, BEiT, timm Swin and torchvision
Swin, each a tiny random-weight model (2 blocks or 2 stages, 28-32 px inputs): read
with no --arch, the same numbers as the model that was saved, exported, placed
ViT-aware, and built and validated on both CPU targets. Plus `--arch` for any timm
architecture and the errors for what does not fit.
"""

from __future__ import annotations

import collections
import re

import pytest
from conftest import CALIB_DIR, VAL_DIR

from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.models.intake import IntakeOptions, load_model

# name -> (builder, input size, expected variant, heads the file says (None: from --num-heads), linear layers)
FAMILIES = {
    "siglip": (lambda timm: timm.create_model("vit_base_patch16_siglip_224", img_size=32, patch_size=8, embed_dim=64, depth=2,
                                              num_heads=2, num_classes=10), 32, "vit", None, 11),
    "relpos": (lambda timm: timm.create_model("vit_relpos_small_patch16_224", img_size=32, patch_size=8, embed_dim=64, depth=2,
                                              num_heads=2, num_classes=10), 32, "relpos", 2, 8),
    "eva02": (lambda timm: timm.create_model("eva02_tiny_patch14_224", img_size=28, patch_size=7, embed_dim=64, depth=2,
                                             num_heads=2, num_classes=10), 28, "eva02", None, 8),
    "beit": (lambda timm: timm.create_model("beit_base_patch16_224", img_size=32, patch_size=8, embed_dim=64, depth=2,
                                            num_heads=2, num_classes=10), 32, "beit", 2, 8),
    "swin": (lambda timm: timm.create_model("swin_tiny_patch4_window7_224", img_size=32, patch_size=2, embed_dim=16, depths=(1, 1),
                                            num_heads=(2, 4), window_size=4, num_classes=10), 32, "swin", 2, 9),
    "tv_swin": (None, 32, "swin", 2, 9),
}


def _make(name: str):
    import torch

    torch.manual_seed(0)
    make = FAMILIES[name][0]
    if make is None:
        from torchvision.models.swin_transformer import SwinTransformer

        m = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=[4, 4], num_classes=10)
    else:
        import timm

        m = make(timm)
    head = m.get_classifier() if hasattr(m, "get_classifier") else m.head
    torch.nn.init.normal_(head.weight, std=0.5)  # timm / torchvision start heads at (near) zero
    return m.eval()


@pytest.fixture(scope="module")
def family_files(tmp_path_factory):
    import torch

    root = tmp_path_factory.mktemp("families")
    out = {}
    for name in FAMILIES:
        m = _make(name)
        path = root / f"{name}.pt"
        torch.save(m.state_dict(), path)
        out[name] = (m, path)
    return out


def _options(name: str) -> IntakeOptions:
    _, size, _, file_heads, _ = FAMILIES[name]
    return IntakeOptions(input_size=(size, size), num_heads=None if file_heads else 2)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_reads_from_its_keys_and_computes_the_same(family_files, name):
    import torch

    module, path = family_files[name]
    _, size, variant, file_heads, _ = FAMILIES[name]
    loaded = load_model(path, _options(name))
    spec = loaded.spec
    assert spec.variant == variant and spec.num_classes == 10 and spec.image_size == (size, size)
    if file_heads:  # read from the relative position tables, no flag needed
        assert spec.num_heads == file_heads and spec.sources["num_heads"] == "file"
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(module(x), loaded.module(x), atol=1e-5)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_exports_and_places_int8_vit_aware(family_files, tmp_path, name):
    """Projections and MLPs INT8; attention matmuls (with their relative-position bias, rotary
    q/k and shifted-window masks around them) float; position MLPs and the MAP pool's latent
    query are constants, not layers."""
    import onnx

    from vitedge.models.export import export_onnx
    from vitedge.quantize.graph import GraphIndex, find_layers, prepare

    _, path = family_files[name]
    linear = FAMILIES[name][4]
    result = export_onnx(load_model(path, _options(name)), tmp_path / "m.onnx")
    assert result.max_abs_diff is not None and result.max_abs_diff <= result.tolerance
    layers = find_layers(GraphIndex(prepare(onnx.load(tmp_path / "m.onnx"))))
    kinds = collections.Counter(l.kind for l in layers)
    expected = {"linear": linear, "attention_matmul": 4, "patch_embed": 1, "head": 1}  # 2 attention matmuls per block
    if name == "siglip":  # the MAP pool: its own attention, and a key/value projection that stays float
        expected.update(attention_matmul=6, pool_kv=1)
    assert kinds == expected


def test_relpos_needs_its_input_size_only_for_speed(family_files):
    """The relative-position MLP fits any grid: without --input-size the model is built at its
    architecture's 224 x 224, and says where that came from."""
    _, path = family_files["relpos"]
    spec = load_model(path).spec
    assert spec.image_size == (224, 224) and spec.sources["image_size"].startswith("default")


def test_swin_input_must_fit_its_windows(family_files):
    _, path = family_files["swin"]
    with pytest.raises(UsageError, match="multiple of 16"):
        load_model(path, IntakeOptions(input_size=(40, 40)))


def test_heads_that_contradict_the_tables_are_refused(family_files):
    _, path = family_files["beit"]
    with pytest.raises(UsageError, match="contradicts the weights"):
        load_model(path, IntakeOptions(num_heads=4))


@pytest.mark.parametrize("name", ["siglip", "swin", "tv_swin"])
def test_family_builds_and_validates_on_both_cpu_targets(family_files, tmp_path, name, no_int8_timing):
    """Random tiny models on the near-alike digits images have close logits, so top-1 agreement
    is coarse (a Swin of width 16 sits at 82-84% with logit cosine 0.99); a broken artifact
    scores near chance (10%). What is pinned is the family's build, not the INT8 timing (``no_int8_timing``)."""
    from vitedge.budget import BudgetSettings
    from vitedge.app.build import BuildRequest, run_build
    from vitedge.app.overrides import ThresholdOverrides
    from vitedge.validation.reference_cache import ReferenceCacheSettings
    from vitedge.bundle.manifest import verify_bundle
    from vitedge.core.ui import StageLog

    _, path = family_files[name]
    req = BuildRequest(model=path, targets=("onnx", "intel-cpu"), calib=CALIB_DIR, val=VAL_DIR, out=tmp_path / "out", intake=_options(name),
                       calib_size=16, cache=ReferenceCacheSettings(root=tmp_path / "cache"), measure_speed=False, budget=BudgetSettings(enabled=False),
                       threshold_overrides=ThresholdOverrides(min_agreement=0.75, max_top1_drop=10.0))
    results = run_build(req, StageLog(quiet=True))
    assert [r.profile.name for r in results] == ["onnx", "intel-cpu"]
    for r in results:
        assert r.built and r.passed, (r.profile.name, r.summary)
        m = verify_bundle(r.bundle)
        assert m.spec.variant == FAMILIES[name][2]


def test_arch_builds_timms_own_class_strictly(tmp_path):
    """--arch NAME for a timm architecture vitedge has no preset for (timm's small MAP-head
    test_vit3): timm's own class and settings, the head sized from the weights."""
    import timm
    import torch

    torch.manual_seed(0)
    m = timm.create_model("test_vit3", num_classes=3).eval()
    path = tmp_path / "test_vit3.pt"
    torch.save(m.state_dict(), path)
    loaded = load_model(path, IntakeOptions(arch="test_vit3"))
    assert loaded.module.global_pool == "map" and loaded.spec.arch_name == "test_vit3"
    assert loaded.spec.num_classes == 3 and loaded.spec.image_size == (160, 160)
    x = torch.randn(1, 3, 160, 160)
    with torch.no_grad():
        assert torch.allclose(m(x), loaded.module(x), atol=1e-5)


def test_arch_that_does_not_fit_lists_the_closest_timm_architectures(family_files):
    _, path = family_files["beit"]
    with pytest.raises(ModelLoadError) as err:
        load_model(path, IntakeOptions(arch="vit_relpos_small_patch16_224"))
    msg = str(err.value)
    assert "do not fit timm's vit_relpos_small_patch16_224" in msg and "closest timm architectures: beit_" in msg
    assert "\n" not in msg


def test_arch_naming_a_cnn_is_refused(family_files):
    _, path = family_files["beit"]
    with pytest.raises(ModelLoadError, match=r"resnet18 is a ResNet \(timm family 'resnet'\) with no attention layers, not a vision transformer"):
        load_model(path, IntakeOptions(arch="resnet18"))


def test_unknown_arch_is_a_one_line_usage_error(family_files):
    _, path = family_files["beit"]
    with pytest.raises(UsageError, match="unknown --arch 'beit_nonexistent_model'.*similar timm names: beit"):
        load_model(path, IntakeOptions(arch="beit_nonexistent_model"))


@pytest.mark.parametrize("arch, family", [("resnet18", "ResNet-style CNN"), ("test_efficientnet", "EfficientNet/MobileNet-style CNN"),
                                          ("test_convnext", "ConvNeXt-style CNN"), (None, "convolutional network (2 convolution weights")])
def test_a_cnn_state_dict_is_named_and_refused(tmp_path, arch, family):
    import timm
    import torch

    path = tmp_path / f"{arch}.pt"
    if arch is None:  # a plain CNN of the user's own
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3))
    else:
        model = timm.create_model(arch, num_classes=4)
    torch.save(model.state_dict(), path)
    with pytest.raises(ModelLoadError, match=f"found an? {re.escape(family)} .*not a Vision Transformer") as err:
        load_model(path)
    assert "\n" not in str(err.value)


def test_unknown_layout_lists_the_closest_timm_architectures(family_files, tmp_path):
    """A ViT-like state_dict no recogniser reads (here: a BEiT whose tables were dropped) names
    timm architectures to try with --arch."""
    import torch

    module, _ = family_files["beit"]
    sd = {k: v for k, v in module.state_dict().items() if "relative_position" not in k and k != "cls_token" and not k.startswith("blocks.0.")}
    path = tmp_path / "odd.pt"
    torch.save(sd, path)
    with pytest.raises(ModelLoadError, match="closest timm architectures .*beit_"):
        load_model(path)
