"""The intake of an ONNX file: its external data by the folder rule, FP32, its batch, and its spec
(the one vitedge wrote into its metadata, or read off the graph).
"""

from __future__ import annotations

from pathlib import Path

from vitedge.bundle.spec import SOURCE_DEFAULT, SOURCE_FILE, SOURCE_FLAG, ModelSpec, Preprocess
from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.models import checks
from vitedge.models.formats import RawModel
from vitedge.models.intake_spec import apply_preprocess_flags, default_crop_pct, fit_channels
from vitedge.models.intake_types import IntakeOptions, LoadedModel
from vitedge.onnxkit.files import check_external_data
from vitedge.onnxkit.structure import graph_inputs


ONNX_SPEC_KEY = "vitedge.spec"


def load_onnx(raw: RawModel, opt: IntakeOptions) -> LoadedModel:
    import onnx

    try:
        model = onnx.load(str(raw.path), load_external_data=False)
    except Exception as err:
        raise ModelLoadError(f"{raw.path} is truncated or corrupt and cannot be read as ONNX ({str(err).splitlines()[0][:120]})") from err
    check_external_data(model, Path(raw.path).parent, str(raw.path))
    checks.check_onnx_fp32(model, str(raw.path))
    props = {p.key: p.value for p in model.metadata_props}
    if ONNX_SPEC_KEY in props:
        checks.check_onnx_batch(model.graph, str(raw.path))
        try:
            spec = ModelSpec.from_json(props[ONNX_SPEC_KEY])
        except ValueError as err:  # BadDocument or SpecError: one line, here naming the file
            raise ModelLoadError(f"{raw.path}: its '{ONNX_SPEC_KEY}' metadata: {err}; re-export the model with `vitedge export`, "
                                 "or remove that metadata") from None
        spec = spec.with_changes(sources={k: SOURCE_FILE for k in spec.sources} | {"preprocess": SOURCE_FILE})
        pre, pre_source = apply_preprocess_flags(spec.preprocess, SOURCE_FILE, opt)
        spec = spec.with_changes(preprocess=pre, sources=dict(spec.sources, preprocess=pre_source))
        return LoadedModel(spec=spec, path=raw.path, onnx_path=raw.path)
    graph = model.graph
    inputs = graph_inputs(graph)
    if len(inputs) != 1:
        raise ModelLoadError(f"{raw.path}: the ONNX graph has {len(inputs)} inputs; vitedge needs one image input")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inputs[0].type.tensor_type.shape.dim]
    if len(dims) != 4 or not dims[1]:
        raise ModelLoadError(f"{raw.path}: the ONNX input has shape {dims}; vitedge needs (batch, channels, height, width) with a fixed channel count")
    checks.check_onnx_is_vit(graph, str(raw.path))
    checks.check_finite_onnx_weights(graph, str(raw.path))
    sources: dict[str, str] = {}
    if dims[2] and dims[3]:
        image_size, sources["image_size"] = (dims[2], dims[3]), SOURCE_FILE
        if opt.input_size and tuple(opt.input_size) != image_size:
            raise UsageError(f"{raw.path} has a fixed {dims[2]}x{dims[3]} input; --input-size cannot change it")
    elif opt.input_size:
        image_size, sources["image_size"] = tuple(opt.input_size), SOURCE_FLAG
    else:
        raise ModelLoadError(f"{raw.path}: the ONNX input height/width are not fixed; pass --input-size H W")
    out_dims = [d.dim_value if d.HasField("dim_value") else None for d in graph.output[0].type.tensor_type.shape.dim]
    ops = [n.op_type for n in graph.node]
    conv = next((n for n in graph.node if n.op_type == "Conv"), None)
    patch = embed = None
    weights = {i.name: i for i in graph.initializer}
    if conv is not None and conv.input[1] in weights:
        w = weights[conv.input[1]]
        embed, patch = int(w.dims[0]), int(w.dims[-1])
    output_kind = opt.output_kind or ("embedding" if "embed" in graph.output[0].name.lower() else "logits")
    width = out_dims[-1] if out_dims and out_dims[-1] else None
    pre, pre_source = apply_preprocess_flags(
        fit_channels(Preprocess(crop_size=tuple(image_size), crop_pct=default_crop_pct(image_size), interpolation="bicubic"),  # type: ignore[arg-type]
                      int(dims[1]), SOURCE_DEFAULT),
        SOURCE_DEFAULT, opt,
    )
    sources.update({"channels": SOURCE_FILE, "patch_size": SOURCE_FILE, "embed_dim": SOURCE_FILE, "depth": SOURCE_FILE, "num_classes": SOURCE_FILE, "preprocess": pre_source})
    spec = ModelSpec(
        family="onnx",
        image_size=tuple(image_size),  # type: ignore[arg-type]
        patch_size=patch,
        embed_dim=embed,
        depth=ops.count("Softmax") or None,
        num_heads=opt.num_heads,
        num_classes=width if output_kind == "logits" else None,
        num_prefix_tokens=None,
        num_params=sum(_numel(i) for i in graph.initializer) or None,
        preprocess=pre,
        variant="encoder" if output_kind == "embedding" else "vit",
        output_kind=output_kind,
        sources=sources,
    )
    return LoadedModel(spec=spec, path=raw.path, onnx_path=raw.path)


def _numel(t) -> int:
    n = 1
    for d in t.dims:
        n *= int(d)
    return n if t.data_type in (1, 10, 11, 16) else 0  # float, float16, double, bfloat16
