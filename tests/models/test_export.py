"""FP32 export: parity with PyTorch, dynamic batch, baked preprocessing, refusal to write a wrong graph."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from vitedge.core.errors import ExportError, UsageError
from vitedge.models.export import ExportOptions, export_onnx
from vitedge.models.intake import IntakeOptions, load_model
from vitedge.onnxkit.metadata import INPUT_FORMAT_KEY, SPEC_KEY, get_metadata
from vitedge.onnxkit.session import ort_session
from vitedge.bundle.preprocess import normalize
from vitedge.bundle.spec import ModelSpec


def _run(path, feed_name, x):
    return ort_session(path).run(None, {feed_name: x})[0]


@pytest.mark.parametrize("fixture", ["timm_vit", "torchvision_vit", "deit_distilled"])
def test_export_matches_pytorch_at_several_batches(fixture, request, tmp_path):
    module, path = request.getfixturevalue(fixture)
    loaded = load_model(path, IntakeOptions(num_heads=4) if fixture == "torchvision_vit" else None)
    out = tmp_path / "m.onnx"
    result = export_onnx(loaded, out)
    assert result.max_abs_diff is not None and result.max_abs_diff <= result.tolerance
    model = onnx.load(out)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
    assert [i.name for i in model.graph.input] == ["input"] and model.graph.output[0].name == "logits"
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    meta = get_metadata(model)
    assert ModelSpec.from_json(meta[SPEC_KEY]) == loaded.spec
    for batch in (1, 5):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            ref = module(x).numpy()
        np.testing.assert_allclose(_run(out, "input", x.numpy()), ref, atol=1e-4, rtol=1e-4)


def test_bake_preprocess_takes_uint8_frames(timm_vit, tmp_path):
    module, path = timm_vit
    loaded = load_model(path, IntakeOptions(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3)))
    out = tmp_path / "baked.onnx"
    export_onnx(loaded, out, ExportOptions(bake_preprocess=True))
    model = onnx.load(out)
    assert model.graph.input[0].name == "frames"
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert get_metadata(model)[INPUT_FORMAT_KEY] == "uint8-nhwc-rgb"
    frames = np.random.default_rng(1).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    x = torch.from_numpy(np.stack([normalize(f, loaded.spec.preprocess) for f in frames]))
    with torch.no_grad():
        ref = module(x).numpy()
    np.testing.assert_allclose(_run(out, "frames", frames), ref, atol=1e-4, rtol=1e-4)


def test_encoder_exports_embedding(model_dir, tmp_path):
    import timm

    m = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=32, depth=1, num_classes=0).eval()
    torch.save(m.state_dict(), model_dir / "enc_export.pt")
    out = tmp_path / "enc.onnx"
    export_onnx(load_model(model_dir / "enc_export.pt"), out)
    assert onnx.load(out).graph.output[0].name == "embedding"


def test_onnx_input_skips_export_and_keeps_spec(timm_vit, tmp_path):
    _, path = timm_vit
    first = tmp_path / "first.onnx"
    export_onnx(load_model(path), first)
    again = load_model(first)
    assert again.is_onnx and again.spec.num_heads == 3 and again.spec.sources["preprocess"] == "file"
    second = tmp_path / "second.onnx"
    result = export_onnx(again, second)
    assert result.max_abs_diff is None and second.exists()


def test_foreign_onnx_gets_default_preprocess(timm_vit, tmp_path):
    module, _ = timm_vit
    foreign = tmp_path / "foreign.onnx"
    torch.onnx.export(module, (torch.randn(1, 3, 32, 32),), str(foreign), opset_version=17, dynamo=False,
                      input_names=["x"], dynamic_axes={"x": {0: "batch"}})  # a fixed batch is refused (tests/reliability)
    spec = load_model(foreign).spec
    assert spec.family == "onnx" and spec.image_size == (32, 32) and spec.patch_size == 8 and spec.depth == 2
    assert spec.sources["preprocess"] == "default"


def test_export_refuses_a_graph_that_disagrees(timm_vit, tmp_path, monkeypatch):
    """A PyTorch model whose traced graph differs from its eager forward (data-dependent
    Python control flow) must not be written."""

    class Sneaky(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            y = self.inner(x)
            if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
                return y
            return y + 1.0  # eager output differs from what the exporter records

    module, path = timm_vit
    loaded = load_model(path)
    loaded.module = Sneaky(loaded.module).eval()
    out = tmp_path / "bad.onnx"
    with pytest.raises(ExportError, match="disagrees with PyTorch"):
        export_onnx(loaded, out)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_low_opset_rejected():
    with pytest.raises(UsageError, match="at least 17"):
        ExportOptions(opset=13)


def test_transformer_encoder_exports_even_under_no_grad(tmp_path):
    """nn.TransformerEncoder's fused inference path has no ONNX form; export must avoid it."""
    from conftest import EXAMPLES

    ckpt = EXAMPLES / "postnorm_vit.pt"
    if not ckpt.exists():
        pytest.skip("post-norm example not present")
    loaded = load_model(ckpt, IntakeOptions(model_class=f"{EXAMPLES / 'postnorm_vit.py'}:PostNormViT"))
    assert loaded.spec.patch_size == 4 and loaded.spec.num_tokens == 65
    with torch.no_grad():
        result = export_onnx(loaded, tmp_path / "postnorm.onnx")
    assert result.max_abs_diff <= result.tolerance
