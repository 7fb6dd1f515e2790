"""Model intake: any supported file -> a torch module (or ONNX file) plus a ModelSpec.

Every fact in the spec records where it came from: the file itself, a named preset,
a flag, or a default. `vitedge inspect` prints them.

`load_model` reads the file (models/formats) and hands it to the loader of its kind: a state_dict
(models/intake_state_dict), a built module, TorchScript, a torch.export program or a Hugging Face
folder (models/intake_module), an ONNX file (models/intake_onnx). What every loader resolves alike,
the preprocessing and the class names, is models/intake_spec; the request and result types are
models/intake_types (and importable from here).
"""

from __future__ import annotations

from pathlib import Path

from vitedge.bundle.fields import check_spec_bounds
from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.core.limits import check_attention_fits
from vitedge.models.formats import read_model_file
from vitedge.models.intake_module import load_exported, load_huggingface, load_module, load_torchscript
from vitedge.models.intake_onnx import load_onnx
from vitedge.models.intake_state_dict import load_state_dict_checkpoint
from vitedge.models.intake_types import IntakeOptions, LoadedModel


def load_model(path: str | Path, options: IntakeOptions | None = None) -> LoadedModel:
    options = options or IntakeOptions()
    path = Path(path)
    raw = read_model_file(path, trust_pickle=options.trust_pickle)
    if options.model_class and raw.kind != "state_dict":
        raise UsageError(f"--model-class needs a state_dict checkpoint, but {path} holds a {raw.kind.replace('_', ' ')}")
    loader = _LOADERS[raw.kind]
    loaded = loader(raw, options)
    spec = loaded.spec
    # the bounds runtime.load holds a bundle's spec to (class count, sizes, mean/std), checked where the model is read
    check_spec_bounds(spec, str(path), ModelLoadError, "vitedge builds only what a bundle can hold and runtime.load accepts")
    check_attention_fits(spec.num_tokens, spec.num_heads, spec.image_size)  # before any export allocates for it
    return loaded


_LOADERS = {
    "state_dict": load_state_dict_checkpoint,
    "module": load_module,
    "torchscript": load_torchscript,
    "exported_program": load_exported,
    "huggingface": load_huggingface,
    "onnx": load_onnx,
}
