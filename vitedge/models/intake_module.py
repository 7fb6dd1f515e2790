"""The intake of a built module (a pickled nn.Module, TorchScript, a torch.export program, a Hugging Face
folder): its weights checked, its architecture read, its input size and channels found, its output
probed, then its spec.
"""

from __future__ import annotations

import warnings
from typing import Any

from vitedge.bundle.spec import SOURCE_DEFAULT, SOURCE_FILE, SOURCE_FLAG, ModelSpec, Preprocess
from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.models import channels as chan
from vitedge.models import checks
from vitedge.models.formats import RawModel
from vitedge.models.hf import load_hf_folder, read_preprocess
from vitedge.models.intake_spec import (
    apply_preprocess_flags,
    fit_channels,
    preprocess_from_cfg,
    read_class_names,
    resolve_preprocess,
)
from vitedge.models.intake_types import IntakeOptions, LoadedModel
from vitedge.models.layouts import Layout, infer_layout
from vitedge.models.stem import candidates_text, stem_input_size, stem_layers


def load_module(raw: RawModel, opt: IntakeOptions) -> LoadedModel:
    family = type(raw.module).__module__.split(".")[0]
    family = {"timm": "timm", "torchvision": "torchvision", "transformers": "huggingface"}.get(family, "custom")
    return from_module(raw, opt, raw.module.eval(), family=family, meta=raw.meta or {}, kwargs={})


def load_torchscript(raw: RawModel, opt: IntakeOptions) -> LoadedModel:
    return from_module(raw, opt, raw.module.eval(), family="torchscript", meta={}, kwargs={})


def load_exported(raw: RawModel, opt: IntakeOptions) -> LoadedModel:
    program = raw.module
    _refuse_fixed_batch(program, str(raw.path))
    loaded = from_module(raw, opt, program.module(), family="torch.export", meta={}, kwargs={}, example_shape=program_input_shape(program))
    loaded.module = program
    loaded.exporter = "dynamo"
    return loaded


def _refuse_fixed_batch(program, where: str) -> None:
    """A program exported with torch.export's defaults has its batch fixed (usually at 1); its ONNX graph
    would too, and validation (and a runtime batch) would fail at the end. Refuse it at once."""
    for spec in program.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            node = next((n for n in program.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name), None)
            val = node.meta.get("val") if node is not None else None
            if val is not None and len(val.shape) == 4 and isinstance(val.shape[0], int):
                raise ModelLoadError(
                    f"{where} was exported with a fixed batch of {val.shape[0]}; vitedge validates and serves any batch size: "
                    "re-export with torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim('batch')},))"
                )
            return


def program_input_shape(program) -> tuple[int, ...] | None:
    for spec in program.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name)
            val = node.meta.get("val")
            if val is not None:
                return tuple(int(d) if str(d).isdigit() else 1 for d in val.shape)
    return None


def from_module(raw: RawModel, opt: IntakeOptions, module, *, family: str, meta: dict, kwargs: dict, example_shape=None,
                 arch_name: str | None = None) -> LoadedModel:
    """A built module of any class: its weights checked, its architecture read, its input size and channels
    found, its output probed, then its spec."""
    where = str(raw.path)
    sd, layout = _weights_and_layout(module, where)
    checks.check_meta(meta, where)
    checks.check_finite_weights(sd, where)
    facts = _describe_module(module, sd, layout)
    checks.check_heads_agree(opt.num_heads, facts.get("num_heads"), f"the attention layers of {where} have")
    cfg = getattr(module, "pretrained_cfg", None) or getattr(module, "default_cfg", None) or {}
    sources: dict[str, str] = {}
    image_size = _module_image_size(opt, sd, layout, facts, cfg, kwargs, example_shape, where, family, sources, module)
    channels, _ = chan.module_channels(module, sd, cfg, kwargs, example_shape)
    output, channels = _probe_output(module, image_size, where, channels)
    # a class that keeps no num_heads and no position table (attention written by hand, positions added
    # otherwise) shows its attention only when it runs
    if not facts.get("is_vit") and layout is None and not _runs_attention(module, image_size, channels):
        raise ModelLoadError(f"{where}: found a {type(module).__name__} with no patch embedding or attention layers, not a Vision Transformer")
    sources["channels"] = SOURCE_FILE
    file_pre = meta.get("preprocess") or (cfg if isinstance(cfg, dict) and cfg.get("mean") else None)
    if file_pre and "crop_size" not in file_pre:
        file_pre = preprocess_from_cfg(file_pre, image_size).to_dict()
    preprocess, sources["preprocess"] = resolve_preprocess(opt, image_size, file_pre, None, family=family, channels=channels)
    spec = _module_spec(opt, sd, layout, facts, sources, family=family, image_size=image_size, output=output,
                        preprocess=preprocess, meta=meta, arch_name=arch_name)
    return LoadedModel(spec=spec, path=raw.path, module=module)


def _weights_and_layout(module, where: str) -> tuple[dict[str, Any], Layout | None]:
    """The module's state_dict (empty when it has none to give) and the ViT layout its key names show."""
    try:
        sd = dict(module.state_dict().items())
    except Exception:
        sd = {}
    try:
        return sd, (infer_layout(sd, where) if sd else None)
    except ModelLoadError:
        return sd, None


def _size_from_stem(module, sd: dict[str, Any], facts: dict[str, Any], where: str, sources: dict[str, str]) -> tuple[int, int] | None:
    """The input size a convolutional stem with strides and pooling (a CCT's tokenizer) makes the position
    embedding's token count from (models/stem); None when the stem is one patch convolution or cannot tell.
    Several sizes fit and none is the stride's multiple: refused, listing them."""
    tables = chan.position_tables(sd)
    if not tables or (tables[0][2] and not chan.conv_makes_width(sd, tables[0][1])):  # a 2-D table must be the tokens'
        return None
    prefix = facts.get("num_prefix_tokens")
    size = stem_input_size(stem_layers(module), tables[0][0], ((prefix,) if prefix is not None else ()) + (1, 0, 2, 5))
    if size is None:
        return None
    if size.side is None:
        raise ModelLoadError(f"{where}: cannot tell the input size: its convolutional stem (total stride {size.stride}) makes the "
                             f"{size.grid}x{size.grid} tokens of its position embedding from inputs of {candidates_text(size)} "
                             f"pixels a side; pass --input-size H W (e.g. --input-size {size.candidates[0]} {size.candidates[0]})")
    sources["image_size"] = f"{SOURCE_FILE} (position-embedding grid x the stem's total stride {size.stride})"
    return (size.side, size.side)


def _module_image_size(opt: IntakeOptions, sd: dict[str, Any], layout: Layout | None, facts: dict[str, Any], cfg,
                       kwargs: dict, example_shape, where: str, family: str, sources: dict[str, str],
                       module=None) -> tuple[int, int]:
    """The input size, from the first that says it: the file's example input, the layout, the class's
    config or constructor arguments, the weights (patch side x position grid); --input-size must agree
    with what the file fixes. Records its source in ``sources``."""
    image_size = None
    if example_shape is not None and len(example_shape) == 4:
        image_size, sources["image_size"] = (example_shape[2], example_shape[3]), SOURCE_FILE
    elif layout is not None:
        image_size, sources["image_size"] = (layout.grid[0] * layout.patch_size, layout.grid[1] * layout.patch_size), SOURCE_FILE
    elif isinstance(cfg, dict) and cfg.get("input_size"):
        image_size, sources["image_size"] = tuple(int(v) for v in cfg["input_size"][-2:]), SOURCE_FILE
    else:
        key = next((k for k in ("image_size", "img_size", "input_size") if k in kwargs), None)
        if key is not None:
            v = kwargs[key]
            image_size, sources["image_size"] = ((int(v), int(v)) if isinstance(v, int) else tuple(int(x) for x in v[-2:])), SOURCE_FILE
    if image_size is None and opt.input_size is None:
        image_size = _size_from_stem(module, sd, facts, where, sources)
    if image_size is None and opt.input_size is None:
        image_size = chan.input_size_from_weights(sd, facts.get("num_prefix_tokens"))
        if image_size is not None:
            sources["image_size"] = f"{SOURCE_FILE} (patch side x position-embedding grid)"
    if opt.input_size is not None:
        if image_size is not None and tuple(opt.input_size) != tuple(image_size):
            raise UsageError(
                f"{where} is a built {family} model for {image_size[0]}x{image_size[1]} inputs and cannot be re-sized; "
                "pass its state_dict to export at another --input-size"
            )
        image_size, sources["image_size"] = tuple(opt.input_size), SOURCE_FLAG
    if image_size is None:
        raise ModelLoadError(f"{where}: cannot tell the input size of this {family} model from its weights "
                             "(no convolutional or Linear patch embedding with a square position-embedding grid); pass --input-size H W")
    return tuple(image_size)  # type: ignore[return-value]


def _module_spec(opt: IntakeOptions, sd: dict[str, Any], layout: Layout | None, facts: dict[str, Any],
                 sources: dict[str, str], *, family: str, image_size: tuple[int, int], output, preprocess: Preprocess,
                 meta: dict, arch_name: str | None) -> ModelSpec:
    """The spec of a built module: architecture from its layout or its layers, output kind and classes."""
    import torch

    output_kind = opt.output_kind or ("embedding" if (layout is not None and layout.num_classes == 0) else "logits")
    sources["num_classes"] = SOURCE_FLAG if opt.output_kind else SOURCE_FILE
    patch = layout.patch_size if layout else facts.get("patch_size")
    heads = opt.num_heads or facts.get("num_heads")
    for k, v in (("patch_size", patch), ("embed_dim", layout.embed_dim if layout else facts.get("embed_dim")),
                 ("depth", layout.depth if layout else facts.get("depth")), ("num_heads", heads)):
        sources[k] = (SOURCE_FLAG if (k == "num_heads" and opt.num_heads) else SOURCE_FILE) if v else SOURCE_DEFAULT
    classes = int(output) if output_kind == "logits" else None
    return ModelSpec(
        family=family,
        image_size=tuple(image_size),  # type: ignore[arg-type]
        patch_size=patch,
        embed_dim=layout.embed_dim if layout else facts.get("embed_dim"),
        depth=layout.depth if layout else facts.get("depth"),
        num_heads=heads,
        num_classes=classes,
        num_prefix_tokens=layout.num_prefix_tokens if layout else facts.get("num_prefix_tokens"),
        num_params=sum(int(t.numel()) for t in sd.values() if isinstance(t, torch.Tensor) and t.is_floating_point()) or None,
        preprocess=preprocess,
        variant="encoder" if output_kind == "embedding" else (layout.variant if layout else "vit"),
        output_kind=output_kind,
        class_names=read_class_names(meta, classes),
        arch_name=arch_name,
        sources=sources,
    )


def _describe_module(module, sd: dict[str, Any], layout: Layout | None) -> dict[str, Any]:
    """Architecture facts of a built module of unknown class, read from its layers."""
    import torch

    facts: dict[str, Any] = {}
    attn_heads = []
    depth = 0
    try:
        named = list(module.named_modules())
    except Exception:
        named = []
    for _, m in named:
        if isinstance(m, torch.nn.Conv2d) and "patch_size" not in facts and tuple(m.kernel_size) == tuple(m.stride):
            facts["patch_size"], facts["embed_dim"] = int(m.kernel_size[0]), int(m.out_channels)
        heads = getattr(m, "num_heads", None)
        if isinstance(heads, int):
            attn_heads.append(heads)
            depth += 1
    if attn_heads:
        facts["num_heads"], facts["depth"] = attn_heads[0], depth
    declared = getattr(module, "patch_size", None)
    if facts.get("patch_size") is None and isinstance(declared, int) and declared > 0:
        facts["patch_size"] = declared  # e.g. a Linear patch embedding on reshaped patches
    pos = [v for k, v in sd.items() if "pos" in k.lower() and getattr(v, "ndim", 0) == 3]
    if pos:
        facts.setdefault("embed_dim", int(pos[0].shape[-1]))
        if facts.get("patch_size") is None:
            pass
    cls_like = [k for k in sd if ("cls" in k.lower() or "class_token" in k.lower()) and getattr(sd[k], "ndim", 0) == 3]
    facts["num_prefix_tokens"] = len(cls_like) or None
    facts["is_vit"] = bool(attn_heads or pos) or _graph_has_attention(module)
    return facts


def _runs_attention(module, image_size, channels: int | None) -> bool:
    """Does one forward pass compute attention (a softmax over a matmul of tokens)? Traced at the input size,
    with the fused attention kernels off so that the plain ops show."""
    import torch

    if _graph_has_attention(module):
        return True
    if not isinstance(module, torch.nn.Module) or isinstance(module, torch.jit.ScriptModule):
        return False
    mha = getattr(torch.backends, "mha", None)
    before = mha.get_fastpath_enabled() if mha is not None else None
    try:
        if mha is not None:
            mha.set_fastpath_enabled(False)
        x = torch.zeros(1, int(channels or 3), int(image_size[0]), int(image_size[1]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(module, x, check_trace=False)
        return _graph_has_attention(traced)
    except Exception:
        return False
    finally:
        if mha is not None:
            mha.set_fastpath_enabled(before)


_ATTENTION_KINDS = {"aten::scaled_dot_product_attention", "aten::_native_multi_head_attention",
                    "aten::_transformer_encoder_layer_fwd"}


def _graph_has_attention(module) -> bool:
    """A TorchScript file or a torch.export program keeps no layer attributes (num_heads) and may keep no
    position table (a ViT may add its positions otherwise): its graph still shows attention, a softmax over
    a matmul of tokens."""
    graph = getattr(module, "inlined_graph", None)
    try:
        if graph is not None:
            kinds = {node.kind() for node in graph.nodes()}
        elif hasattr(getattr(module, "graph", None), "nodes"):  # a torch.fx GraphModule (torch.export's .module())
            kinds = {"aten::" + str(getattr(n.target, "__name__", n.target)).split(".")[0]
                     for n in module.graph.nodes if n.op == "call_function"}
        else:
            return False
    except Exception:
        return False
    if "aten::_softmax" in kinds:
        kinds.add("aten::softmax")
    return bool(kinds & _ATTENTION_KINDS) or ("aten::softmax" in kinds and bool(kinds & {"aten::matmul", "aten::bmm", "aten::einsum"}))


def _probe_output(module, image_size, where: str, channels: int | None = None) -> tuple[int, int]:
    """(output width, input channels) from a forward pass on zeros; with `channels`
    unknown, the common counts are tried in turn (RGB first)."""
    import torch

    tries = (channels,) if channels else chan.PROBE_CHANNELS
    first_err: Exception | None = None
    for c in tries:
        x = torch.zeros(1, c, int(image_size[0]), int(image_size[1]))
        try:
            with torch.no_grad():
                y = module(x)
            channels = c
            break
        except Exception as err:
            first_err = first_err or err
    else:
        err = first_err
        shape = f"1x{tries[0]}x{image_size[0]}x{image_size[1]}" if len(tries) == 1 else f"1xCx{image_size[0]}x{image_size[1]} (C = {', '.join(map(str, tries))})"
        raise ModelLoadError(
            f"{where}: a forward pass on a {shape} input failed "
            f"({type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}); check --input-size / --model-kwargs"
        ) from err
    if isinstance(y, (tuple, list)):
        y = y[0]
    if not isinstance(y, torch.Tensor) or y.ndim != 2:
        raise ModelLoadError(f"{where}: the model's output is {type(y).__name__} {tuple(getattr(y, 'shape', ()))}; vitedge needs a (batch, classes) or (batch, features) tensor")
    return int(y.shape[1]), int(channels)


def load_huggingface(raw: RawModel, opt: IntakeOptions) -> LoadedModel:
    import torch


    module, facts = load_hf_folder(raw.path, input_size=opt.input_size)
    checks.check_finite_weights(module.state_dict(), str(raw.path))
    image_size = facts["image_size"]
    file_pre, source = read_preprocess(raw.path, image_size)
    channels = int(getattr(getattr(getattr(module, "model", module), "config", None), "num_channels", 3) or 3)
    preprocess, pre_source = apply_preprocess_flags(fit_channels(file_pre, channels, source), source, opt)
    sources = {k: SOURCE_FILE for k in ("patch_size", "embed_dim", "depth", "num_heads", "num_classes", "image_size")}
    if opt.input_size is not None:
        sources["image_size"] = SOURCE_FLAG
    sources["preprocess"] = pre_source
    spec = ModelSpec(
        family="huggingface",
        image_size=tuple(image_size),  # type: ignore[arg-type]
        patch_size=facts["patch_size"],
        embed_dim=facts["embed_dim"],
        depth=facts["depth"],
        num_heads=facts["num_heads"],
        num_classes=facts["num_classes"],
        num_prefix_tokens=facts["num_prefix_tokens"],
        num_params=sum(int(p.numel()) for p in module.parameters()),
        preprocess=preprocess,
        variant=facts["variant"],
        output_kind=facts["output_kind"],
        class_names=facts["class_names"],
        arch_name=facts["arch_name"],
        sources=sources,
    )
    del torch
    return LoadedModel(spec=spec, path=raw.path, module=module)
