"""Model intake: every format and family users bring, and every bad input, on real models."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import CUSTOM_VIT_SOURCE, EXAMPLES

from vitedge.core.errors import ModelLoadError, UnsafePickleError, UsageError
from vitedge.models.formats import read_model_file
from vitedge.models.intake import IntakeOptions, load_model


def _same_output(a, b, shape):
    x = torch.randn(*shape)
    with torch.no_grad():
        ya, yb = a(x), b(x)
    return float((ya - yb).abs().max())


def test_timm_state_dict(timm_vit):
    module, path = timm_vit
    loaded = load_model(path)
    s = loaded.spec
    assert (s.family, s.variant, s.image_size, s.patch_size, s.embed_dim, s.depth, s.num_classes) == ("timm", "vit", (32, 32), 8, 192, 2, 10)
    assert s.num_tokens == 17 and s.num_prefix_tokens == 1
    assert s.num_heads == 3 and s.sources["num_heads"].startswith("preset")
    assert s.sources["preprocess"] == "default"
    assert s.num_params == sum(p.numel() for p in module.parameters())
    assert _same_output(loaded.module, module, (2, 3, 32, 32)) == 0.0


def test_torchvision_state_dict(torchvision_vit):
    module, path = torchvision_vit
    with pytest.raises(ModelLoadError, match="--num-heads"):
        load_model(path)  # width 64 matches no published ViT: heads cannot be inferred
    loaded = load_model(path, IntakeOptions(num_heads=4))
    s = loaded.spec
    assert (s.family, s.embed_dim, s.depth, s.num_classes, s.patch_size) == ("torchvision", 64, 2, 5, 8)
    assert s.sources["num_heads"] == "flag"
    assert s.preprocess.interpolation == "bilinear"
    assert _same_output(loaded.module, module, (2, 3, 32, 32)) == 0.0


def test_torchvision_vit_b16_any_depth(model_dir):
    import torchvision

    m = torchvision.models.vit_b_16()
    m.encoder.layers = m.encoder.layers[:1]
    sd = {k.replace("encoder_layer_", "encoder_layer_"): v for k, v in m.state_dict().items()}
    path = model_dir / "vit_b16_depth1.pth"
    torch.save(sd, path)
    loaded = load_model(path, IntakeOptions(arch="vit_b_16"))
    assert loaded.spec.depth == 1 and loaded.spec.num_heads == 12 and loaded.spec.num_tokens == 197
    assert loaded.spec.sources["preprocess"] == "preset"
    assert loaded.spec.preprocess.resize_size == (256, 256)


def test_distilled_deit(deit_distilled):
    module, path = deit_distilled
    loaded = load_model(path)
    assert loaded.spec.variant == "deit-distilled" and loaded.spec.num_prefix_tokens == 2
    assert loaded.spec.num_tokens == 16 + 2
    assert _same_output(loaded.module, module, (1, 3, 32, 32)) == 0.0


def test_encoder_without_head(model_dir):
    import timm

    m = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=32, depth=1, num_classes=0).eval()
    path = model_dir / "dino_like.pt"
    torch.save(m.state_dict(), path)
    spec = load_model(path).spec
    assert spec.output_kind == "embedding" and spec.num_classes is None and spec.variant == "encoder"


def test_hybrid_resnet_vit(model_dir):
    import timm

    m = timm.create_model("vit_tiny_r_s16_p8_224", pretrained=False, img_size=64, num_classes=3).eval()
    path = model_dir / "hybrid.pt"
    torch.save(m.state_dict(), path)
    loaded = load_model(path)
    assert loaded.spec.variant == "hybrid-resnet" and loaded.spec.arch_name == "vit_tiny_r_s16_p8_224"
    assert _same_output(loaded.module, m, (1, 3, 64, 64)) == 0.0


def test_safetensors_and_vitedge_metadata(timm_vit, model_dir):
    from safetensors.torch import save_file

    module, _ = timm_vit
    meta = {"family": "timm", "model_kwargs": {"num_heads": 3}, "preprocess": {"crop_size": [32, 32], "crop_pct": 1.0,
            "interpolation": "bilinear", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
            "class_names": [f"c{i}" for i in range(10)]}
    path = model_dir / "vit.safetensors"
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(path), metadata={"vitedge": json.dumps(meta)})
    s = load_model(path).spec
    assert s.sources["num_heads"] == "file" and s.sources["preprocess"] == "file"
    assert s.preprocess.std == (0.25, 0.25, 0.25) and s.class_names[3] == "c3"


def test_preprocess_flags_override(timm_vit):
    _, path = timm_vit
    s = load_model(path, IntakeOptions(mean=(0.5, 0.5, 0.5), crop_pct=1.0, interpolation="bilinear")).spec
    assert s.preprocess.mean == (0.5, 0.5, 0.5) and s.preprocess.crop_pct == 1.0
    assert s.sources["preprocess"].startswith("default + flags")


def test_input_size_interpolates_position_embedding(timm_vit):
    module, path = timm_vit
    loaded = load_model(path, IntakeOptions(input_size=(48, 64)))
    assert loaded.spec.image_size == (48, 64) and loaded.spec.num_tokens == 6 * 8 + 1
    assert loaded.spec.sources["image_size"] == "flag"
    pe = loaded.module.pos_embed
    assert pe.shape[1] == 49
    assert torch.equal(pe[:, 0], module.pos_embed[:, 0])  # the class token's embedding is kept
    assert loaded.module(torch.randn(1, 3, 48, 64)).shape == (1, 10)
    with pytest.raises(UsageError, match="multiple of the patch size"):
        load_model(path, IntakeOptions(input_size=(50, 64)))


def test_torchscript_and_export_program(timm_vit, model_dir):
    module, _ = timm_vit
    ts = model_dir / "vit_ts.pt"
    torch.jit.trace(module, torch.randn(1, 3, 32, 32)).save(str(ts))
    s = load_model(ts).spec
    assert s.family == "torchscript" and s.num_classes == 10 and s.image_size == (32, 32)
    ep = torch.export.export(module, (torch.randn(2, 3, 32, 32),), dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=64)}})
    pt2 = model_dir / "vit.pt2"
    torch.export.save(ep, str(pt2))
    loaded = load_model(pt2)
    assert loaded.spec.family == "torch.export" and loaded.exporter == "dynamo" and loaded.spec.num_classes == 10


def test_custom_model_class(tmp_path):
    src = tmp_path / "my_vit.py"
    src.write_text(CUSTOM_VIT_SOURCE)
    import importlib.util

    spec = importlib.util.spec_from_file_location("my_vit_ref", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ref = mod.TinyViT(dim=32, classes=4).eval()
    ckpt = tmp_path / "tiny.pt"
    torch.save(ref.state_dict(), ckpt)
    loaded = load_model(ckpt, IntakeOptions(model_class=f"{src}:TinyViT", model_kwargs={"dim": 32, "classes": 4}))
    s = loaded.spec
    assert (s.family, s.image_size, s.patch_size, s.embed_dim, s.num_heads, s.depth, s.num_classes) == ("custom", (32, 32), 8, 32, 2, 2, 4)
    assert s.preprocess.mean == (0.5, 0.5, 0.5) and s.sources["preprocess"] == "file"
    assert _same_output(loaded.module, ref, (2, 3, 32, 32)) == 0.0
    with pytest.raises(UsageError, match="defines no 'Nope'"):
        load_model(ckpt, IntakeOptions(model_class=f"{src}:Nope"))
    with pytest.raises(UsageError, match="fix --model-kwargs"):
        load_model(ckpt, IntakeOptions(model_class=f"{src}:TinyViT", model_kwargs={"bogus": 1}))
    with pytest.raises(ModelLoadError, match="do not fit"):
        load_model(ckpt, IntakeOptions(model_class=f"{src}:TinyViT", model_kwargs={"dim": 32, "classes": 5}))


def test_huggingface_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                                    intermediate_size=96, num_labels=3, id2label={0: "cat", 1: "dog", 2: "bird"},
                                    label2id={"cat": 0, "dog": 1, "bird": 2}, architectures=["ViTForImageClassification"])
    model = transformers.ViTForImageClassification(config).eval()
    model.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 2, "size": {"height": 32, "width": 32}}))
    loaded = load_model(tmp_path / "hf")
    s = loaded.spec
    assert (s.family, s.num_heads, s.depth, s.num_classes, s.class_names) == ("huggingface", 3, 2, 3, ("cat", "dog", "bird"))
    assert s.preprocess.mean == (0.5, 0.5, 0.5) and s.preprocess.interpolation == "bilinear" and s.sources["preprocess"] == "file"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(loaded.module(x), model(pixel_values=x).logits, atol=1e-6)
    resized = load_model(tmp_path / "hf", IntakeOptions(input_size=(48, 48)))
    assert resized.spec.image_size == (48, 48) and resized.module(torch.randn(1, 3, 48, 48)).shape == (1, 3)


def test_whole_module_needs_trust_pickle(timm_vit, model_dir):
    module, _ = timm_vit
    path = model_dir / "whole.pt"
    torch.save(module, path)
    with pytest.raises(UnsafePickleError, match="--trust-pickle"):
        load_model(path)
    loaded = load_model(path, IntakeOptions(trust_pickle=True))
    assert loaded.spec.family == "timm" and loaded.spec.num_heads == 3


@pytest.mark.parametrize("case", ["truncated", "garbage", "empty", "resnet", "text", "unknown", "suffix", "missing"])
def test_bad_model_files(case, tmp_path, timm_vit):
    path = tmp_path / "model.pt"
    if case == "truncated":
        data = timm_vit[1].read_bytes()
        path.write_bytes(data[: len(data) // 2])
        match = "truncated or corrupt"
    elif case == "garbage":
        path.write_bytes(b"\x00not a checkpoint" * 10)
        match = "truncated or corrupt"
    elif case == "empty":
        path.write_bytes(b"")
        match = "empty"
    elif case == "resnet":
        import torchvision

        torch.save(torchvision.models.resnet18().state_dict(), path)
        match = "ResNet-style CNN"
    elif case == "text":
        torch.save({"embeddings.word_embeddings.weight": torch.zeros(10, 4), "encoder.layer.0.attention.self.query.weight": torch.zeros(4, 4)}, path)
        match = "text model"
    elif case == "unknown":
        torch.save({"a.weight": torch.zeros(2, 2)}, path)
        match = "matches no known ViT"
    elif case == "suffix":
        path = tmp_path / "model.h5"
        path.write_bytes(b"x")
        match = "unrecognised model file type"
    else:
        path = tmp_path / "absent.pt"
        match = "does not exist"
    with pytest.raises(ModelLoadError, match=match) as info:
        load_model(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("form", ["zip", "legacy-pickle", "torchscript", "safetensors", "exported-program"])
@pytest.mark.parametrize("name", ["vit1", "model.weights"])
def test_a_model_file_without_a_known_suffix_is_read_by_its_content(timm_vit, tmp_path, form, name):
    """A checkpoint saved as ``checkpoints/vit1`` (a corpus model's file) or with a suffix no format uses is read by
    its first bytes, as its suffix would have it read, with the same safety checks; other content still gets the
    one-line refusal."""
    m, pt = timm_vit
    path = tmp_path / name
    if form == "zip":
        shutil.copyfile(pt, path)
    elif form == "legacy-pickle":
        torch.save(m.state_dict(), path, _use_new_zipfile_serialization=False)
    elif form == "torchscript":
        torch.jit.trace(m, torch.randn(1, 3, 32, 32)).save(str(path))
    elif form == "safetensors":
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(path))
    else:
        program = torch.export.export(m, (torch.randn(2, 3, 32, 32),), dynamic_shapes=({0: torch.export.Dim("batch")},))
        torch.export.save(program, str(path))
    want = {"torchscript": "torchscript", "exported-program": "exported_program"}.get(form, "state_dict")
    assert read_model_file(path).kind == want
    loaded = load_model(path)
    assert loaded.spec.image_size == (32, 32) and loaded.spec.num_classes == 10
    other = tmp_path / (name + "-text")
    other.write_bytes(b"model weights, as text\n" * 4)
    with pytest.raises(ModelLoadError, match="unrecognised model file type") as info:
        load_model(other)
    assert "\n" not in str(info.value)


def test_arch_preset_mismatch(timm_vit):
    with pytest.raises(UsageError, match="pick the matching --arch"):
        load_model(timm_vit[1], IntakeOptions(arch="vit_base_patch16_224"))
    with pytest.raises(UsageError, match="unknown --arch"):
        load_model(timm_vit[1], IntakeOptions(arch="vit_nonexistent"))


def test_bundled_example_reads_its_metadata():
    path = EXAMPLES / "digits_vit.pt"
    if not path.exists():
        pytest.skip("bundled example not trained yet")
    s = load_model(path).spec
    assert s.num_heads == 3 and s.sources["num_heads"] == "file" and s.sources["preprocess"] == "file"
    assert s.class_names == tuple(str(i) for i in range(10)) and s.image_size == (32, 32)


def test_small_inputs_default_to_the_whole_image_and_imagenet_sizes_keep_the_0875_crop(tmp_path):
    """A file that carries no preprocessing: 28x28 / 32x32 models (MNIST, CIFAR) are trained and tested on
    the whole image, and a 0.875 centre crop cost the corpus models up to 27 points of FP32 top-1; a 224
    model keeps ImageNet's crop. --crop-pct still decides when given."""
    from vitedge.models.intake_spec import default_crop_pct

    assert default_crop_pct((28, 28)) == 1.0 and default_crop_pct((64, 64)) == 1.0
    assert default_crop_pct((65, 65)) == 0.875 and default_crop_pct((224, 224)) == 0.875
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16,
                                             mlp_dim=32, num_classes=10).eval()
    path = tmp_path / "small.pt2"
    torch.export.save(torch.export.export(m, (torch.randn(2, 3, 32, 32),),
                                          dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},)), str(path))
    assert load_model(path).spec.preprocess.crop_pct == 1.0
    assert load_model(path, IntakeOptions(crop_pct=0.875)).spec.preprocess.crop_pct == 0.875
