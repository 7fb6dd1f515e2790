"""The input size of a ViT with a convolutional tokenizer (issue 47 item 6): a CCT (stride-2 conv, stride-2 pooling,
no class token, sequence pooling) given with --model-class and no --input-size gets the size its position embedding
and its stem's strides fix; where several sizes fit, the refusal lists them and each of them runs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from helpers.cli import run_vitedge

from vitedge.core.errors import ModelLoadError
from vitedge.models.intake import IntakeOptions, load_model
from vitedge.models.stem import StemLayer, stem_input_size

CCT_FILE = Path(__file__).resolve().parents[1] / "helpers" / "cct_vit.py"


def _cct(**kwargs):
    sys.path.insert(0, str(CCT_FILE.parent))
    try:
        from cct_vit import CCT
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    return CCT(**kwargs).eval()


def _saved(tmp_path: Path, **kwargs) -> Path:
    path = tmp_path / "cct.pt"
    torch.save(_cct(**kwargs).state_dict(), path)
    return path


@pytest.mark.parametrize("kwargs,size", [({}, 32), ({"image": 48}, 48), ({"pool": "avg", "channels": 1, "image": 64}, 64)],
                         ids=["maxpool-32", "maxpool-48", "avgpool-gray-64"])
def test_conv_tokenizer_size_from_positions_and_stride(tmp_path, kwargs, size):
    loaded = load_model(_saved(tmp_path, **kwargs), IntakeOptions(model_class=f"{CCT_FILE}:CCT", model_kwargs=kwargs))
    assert loaded.spec.image_size == (size, size)
    assert "stride 4" in loaded.spec.sources["image_size"], loaded.spec.sources
    assert loaded.spec.preprocess.channels == kwargs.get("channels", 3)


def test_the_command_line_reads_it_too(tmp_path):
    code, text = run_vitedge(["inspect", str(_saved(tmp_path)), "--model-class", f"{CCT_FILE}:CCT", "--json"])
    assert code == 0, text
    assert re.search(r'"image_size": \[\s*32,\s*32\s*\]', text), text


def test_ambiguous_stem_lists_the_sizes_that_fit(tmp_path):
    # a 7x7 stride-2 conv without padding then a 3x3 stride-2 max-pool: 41x41 gives 9x9 tokens, and so do three
    # other sizes, none of them 9 x the total stride 4
    kwargs = {"kernel": 7, "padding": 0, "image": 41}
    with pytest.raises(ModelLoadError) as err:
        load_model(_saved(tmp_path, **kwargs), IntakeOptions(model_class=f"{CCT_FILE}:CCT", model_kwargs=kwargs))
    line = str(err.value)
    assert "--input-size" in line and "total stride 4" in line, line
    listed = [int(v) for v in re.search(r"from inputs of ([\d, or]+) pixels", line).group(1).replace(" or ", ", ").split(", ")]
    assert 41 in listed and 36 not in listed, listed
    model = _cct(**kwargs)
    for side in listed:  # every size it lists runs, and no other near it does
        with torch.no_grad():
            model(torch.zeros(1, 3, side, side))
    for side in (min(listed) - 1, max(listed) + 1):
        with pytest.raises(RuntimeError), torch.no_grad():
            model(torch.zeros(1, 3, side, side))


def test_stem_arithmetic_is_pytorchs():
    for layers in ([StemLayer(3, 2, 1), StemLayer(3, 2, 1)], [StemLayer(7, 2, 3), StemLayer(3, 2, 1, ceil_mode=True)],
                   [StemLayer(3, 1, 1), StemLayer(2, 2, 0), StemLayer(3, 2, 0)]):
        modules = [torch.nn.Conv2d(1, 1, l.kernel, l.stride, l.padding) if i == 0 else
                   torch.nn.MaxPool2d(l.kernel, l.stride, l.padding, ceil_mode=l.ceil_mode) for i, l in enumerate(layers)]
        stem = torch.nn.Sequential(*modules)
        for side in range(8, 70):
            want = stem(torch.zeros(1, 1, side, side)).shape[-1]
            got = side
            for layer in layers:
                got = layer.side(got)
            assert got == want, (layers, side, got, want)
    # a plain patch embedding (kernel = stride, no padding) is left to the patch rule
    assert stem_input_size([StemLayer(16, 16, 0)], 197, (1,)) is None
