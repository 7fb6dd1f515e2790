"""FP32 ONNX export, proven against the PyTorch model it came from.

The export fails, with the measured difference, when ONNX Runtime and PyTorch disagree
on the same inputs by more than the tolerance. ``bake_preprocess`` prepends the
normalisation to the graph so it takes the uint8 NHWC RGB frames a camera delivers.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitedge.core.errors import ExportError, UsageError, environment_error
from vitedge.core.memory import release_freed_memory
from vitedge.models.batch_check import BatchCheck, check_batch_independence
from vitedge.models.intake import LoadedModel
from vitedge.models.intake_module import program_input_shape
from vitedge.models.torchscript import dynamic_batch_program
from vitedge.onnxkit.files import DATA_SUFFIX, has_external_tensors, inline_attribute_tensors, is_large, save_onnx
from vitedge.onnxkit.metadata import FLOAT_NCHW, INPUT_FORMAT_KEY, SPEC_KEY, UINT8_NHWC_RGB, get_metadata, set_metadata
from vitedge.onnxkit.session import SessionSettings, lean_settings, ort_session
from vitedge.onnxkit.structure import graph_inputs, opset_version
from vitedge.bundle.preprocess import normalize
from vitedge.bundle.spec import Preprocess
from vitedge.files.swap import work_prefix

MIN_OPSET = 17


@dataclass(frozen=True)
class ExportOptions:
    opset: int = 17
    bake_preprocess: bool = False
    check: bool = True
    atol: float = 1e-4
    rtol: float = 1e-3  # relative to the largest output magnitude
    check_batch: int = 2
    seed: int = 0
    free_module: bool = False  # drop loaded.module once exported (the build uses only the graph from then on)
    # run the written graph on a batch of seeded random inputs against each alone (models/batch_check); the build and
    # `vitedge calibrate` run that check themselves, on calibration images, once their data is open
    batch_check: bool = False

    def __post_init__(self) -> None:
        if self.opset < MIN_OPSET:
            raise UsageError(f"--opset must be at least {MIN_OPSET} (LayerNormalization and per-channel Q/DQ), got {self.opset}")


@dataclass(frozen=True)
class ExportResult:
    path: Path
    input_name: str
    output_name: str
    input_format: str
    opset: int
    max_abs_diff: float | None
    tolerance: float | None
    seconds: float
    batch_check: BatchCheck | None = None

    def one_line(self) -> str:
        check = (
            f"max |PyTorch - ONNX Runtime| = {self.max_abs_diff:.2e} (tolerance {self.tolerance:.2e})"
            if self.max_abs_diff is not None
            else "parity check skipped"
        )
        return f"exported {self.path} (opset {self.opset}, input '{self.input_name}' {self.input_format}); {check}"


def export_onnx(loaded: LoadedModel, out_path: str | Path, options: ExportOptions | None = None) -> ExportResult:
    """Export (or take) the FP32 graph, write ``out_path`` and check it against PyTorch.

    Memory, for graphs past 2 GB (vit_h_14: 2.5 GB of weights): the graph is held without its
    weights (they stay in the exporter's files and are streamed into ``<out_path>.data``); the
    PyTorch reference output is computed before the export, so ``free_module`` can drop the
    module before ONNX Runtime opens the written file for the parity check."""
    import onnx

    options = options or ExportOptions()
    out_path = Path(out_path)
    start = time.perf_counter()
    output_name = "embedding" if loaded.spec.output_kind == "embedding" else "logits"
    input_format = UINT8_NHWC_RGB if options.bake_preprocess else FLOAT_NCHW
    with tempfile.TemporaryDirectory(prefix=work_prefix("export")) as tmp:
        base_dir: Path | None = None
        probe = None
        if loaded.is_onnx:
            model = onnx.load(str(loaded.onnx_path), load_external_data=False)  # weights, if external, stay in their files
            base_dir = Path(loaded.onnx_path).parent
            inline_attribute_tensors(model, base_dir, str(loaded.path))  # the folder rule for Constants' values too
            if get_metadata(model).get(INPUT_FORMAT_KEY) == UINT8_NHWC_RGB:
                if not options.bake_preprocess:
                    raise UsageError(f"{loaded.path} already takes uint8 frames (preprocessing baked in); pass --bake-preprocess to keep it")
                options = ExportOptions(**{**options.__dict__, "bake_preprocess": False})
                input_format = UINT8_NHWC_RGB
            opset = opset_version(model)
            if opset < MIN_OPSET:
                raise ExportError(f"{loaded.path} uses opset {opset}; vitedge needs opset >= {MIN_OPSET}: re-export it, or pass the PyTorch model")
        else:
            if options.check:
                probe = _reference(loaded, input_format, options)  # while the module is here
            model = _torch_to_onnx(loaded, options, output_name, Path(tmp))
            base_dir = Path(tmp)
            opset = opset_version(model)
            if options.free_module:
                loaded.module = None  # from here on only the graph is used: the weights go (2.5 GB for vit_h_14)
                release_freed_memory()
        graph_input = graph_inputs(model)[0].name
        if options.bake_preprocess:
            model = bake_preprocess(model, loaded.spec.preprocess)
            graph_input = "frames"
        meta = get_metadata(model)
        set_metadata(model, {
            SPEC_KEY: loaded.spec.to_json(),
            INPUT_FORMAT_KEY: UINT8_NHWC_RGB if (options.bake_preprocess or meta.get(INPUT_FORMAT_KEY) == UINT8_NHWC_RGB) else FLOAT_NCHW,
        })
        input_format = get_metadata(model)[INPUT_FORMAT_KEY]
        large = has_external_tensors(model) or is_large(model)
        output = model.graph.output[0].name
        save_onnx(model, out_path, external=large, base_dir=base_dir)
    del model  # the check opens the file just written, as every later stage does
    release_freed_memory()
    diff = tol = batch = None
    try:
        if probe is not None:
            diff, tol = _check_parity(out_path, graph_input, probe, large, options)
        if options.batch_check:
            batch = check_batch_independence(out_path, loaded.spec, seed=options.seed)
    except BaseException:
        for f in (out_path, out_path.with_name(out_path.name + DATA_SUFFIX)):
            f.unlink(missing_ok=True)
        raise
    return ExportResult(out_path, graph_input, output, input_format, opset, diff, tol, time.perf_counter() - start, batch)


def _torch_to_onnx(loaded: LoadedModel, options: ExportOptions, output_name: str, tmp: Path):
    """The exported graph; past 2 GB its weights stay in the exporter's files in ``tmp``
    (the graph is loaded without them)."""
    import onnx
    import torch

    h, w = loaded.spec.image_size
    c = loaded.spec.preprocess.channels
    example = torch.randn(2, c, h, w, generator=torch.Generator().manual_seed(options.seed))
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), _no_mha_fastpath():
            warnings.simplefilter("ignore")
            if loaded.exporter == "dynamo":
                program = loaded.module
                onnx_program = torch.onnx.export(program, (example[:_program_batch(loaded)],), dynamo=True,
                                                 opset_version=max(options.opset, 18), input_names=["input"], output_names=[output_name])
                model = onnx_program.model_proto
            elif loaded.spec.family == "torchscript":
                model = _torchscript_to_onnx(loaded, example, options, output_name, tmp)
            else:
                model = _legacy_export(loaded.module, example, options, output_name, tmp)
    except ExportError:
        raise
    except Exception as err:
        known = environment_error(err)
        if known is not None:  # a full disk or an unwritable temp folder, not the model's fault
            raise known from err
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise ExportError(f"ONNX export of {loaded.path} failed: {type(err).__name__}: {first}") from err
    return model


def _legacy_export(module, example, options: ExportOptions, output_name: str, tmp: Path):
    """The TorchScript-based exporter, to a file: past 2 GB it writes the weights as external data beside it."""
    import onnx
    import torch

    path = tmp / "model.onnx"
    with _native_stdout_silenced():  # on failure torch dumps the whole graph to fd 1 from C++
        torch.onnx.export(
            module, (example,), str(path), opset_version=options.opset, dynamo=False,
            input_names=["input"], output_names=[output_name],
            dynamic_axes={"input": {0: "batch"}, output_name: {0: "batch"}}, do_constant_folding=True,
        )
    gc.collect()  # the exporter's temporaries, before the graph is read
    return onnx.load(str(path), load_external_data=False)  # external weights stay in their files


def _torchscript_to_onnx(loaded: LoadedModel, example, options: ExportOptions, output_name: str, tmp: Path):
    """A TorchScript file's graph keeps no tensor shapes: its values are typed "Tensor", not "Float(2, 17, 64)"
    as when an nn.Module is traced for export. The TorchScript-based exporter needs the rank of some inputs
    (a transpose with a negative dimension, an unflatten): a traced torchvision ViT, whose attention computes
    `unflatten(-1, (3, E))` with E read from `size(-1)`, stops at "ONNX export of transpose for tensor of
    unknown rank". So when that exporter refuses the file, vitedge makes a torch.export program of it with a
    dynamic batch, and exports that as it exports a `.pt2` file: first with torch's TorchScript-to-torch.export
    converter (it runs the program on an example input, so every value gets its shape), then, for what that
    converter refuses (a scripted ViT's list comprehension over `chunk`, nn.MultiheadAttention's scripted
    fast-path checks, a trace holding torch's fused fast-path attention: that one goes there at once), from the
    aten ops the module runs (models/torchscript.py). The parity check afterwards
    compares the graph with the TorchScript module itself."""
    import torch

    try:
        return _legacy_export(loaded.module, example, options, output_name, tmp)
    except Exception as first:
        errors = [first]
    for make in _program_makers(loaded.module):
        try:
            program = make(loaded, example)
            onnx_program = torch.onnx.export(program, (example,), dynamo=True, opset_version=max(options.opset, 18),
                                             input_names=["input"], output_names=[output_name])
            return onnx_program.model_proto
        except Exception as err:
            errors.append(err)
    first, *others = errors
    why = "; ".join(f"{type(e).__name__}: {_first_line(e)[:120]}" for e in others)
    raise ExportError(
        f"ONNX export of {loaded.path} failed: {type(first).__name__}: {_first_line(first)}; making a torch.export "
        f"program of the TorchScript module failed too ({why}): save the model with torch.export.save, or pass its "
        "state_dict with --model-class"
    ) from first


# fused kernels of torch's attention fast path: no ONNX function and no torch decomposition (models/fused_ops.py)
_FAST_PATH_KINDS = frozenset({"aten::_native_multi_head_attention", "aten::_transformer_encoder_layer_fwd"})


def _program_makers(module) -> tuple:
    """The converter keeps the ops a TorchScript file holds; a trace taken on torch's attention fast path holds its
    fused kernels, so the converter's program fails at the ONNX step every time (a 32x32 ViT of two blocks: 2.7-3.6 s
    with torch's exporter already imported, a quarter of the file's export; 6 s of 14 in a fresh process): such a
    file goes to the record (which decomposes them) at once."""
    try:
        kinds = {n.kind() for n in module.inlined_graph.nodes()}
    except Exception:  # no TorchScript graph to read: try both in turn
        kinds = set()
    return (_recorded_program,) if kinds & _FAST_PATH_KINDS else (_ts2ep_program, _recorded_program)


def _ts2ep_program(loaded: LoadedModel, example):
    import torch
    from torch._export.converter import TS2EPConverter

    program = TS2EPConverter(loaded.module, (example,)).convert()
    return torch.export.export(program.module(), (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))


def _recorded_program(loaded: LoadedModel, example):
    return dynamic_batch_program(loaded.module, tuple(example.shape[1:]))


@contextlib.contextmanager
def _native_stdout_silenced():
    """File descriptor 1 to the null device: the TorchScript exporter writes "Torch IR graph at exception: ..."
    (hundreds of lines) from C++, past Python's sys.stdout, before its error reaches vitedge's one line."""
    for stream in (sys.stdout, sys.__stdout__):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 (a daemon): nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().split(" [Caused by ", 1)[0]  # torch appends a dump of the graph node
    return text.splitlines()[0][:200] if text else type(err).__name__


@contextlib.contextmanager
def _no_mha_fastpath():
    """nn.TransformerEncoder's inference fast path (aten::_transformer_encoder_layer_fwd)
    has no ONNX form; under no_grad it would be taken. Export the plain ops instead."""
    import torch

    mha = getattr(torch.backends, "mha", None)
    if mha is None or not hasattr(mha, "set_fastpath_enabled"):
        yield
        return
    before = mha.get_fastpath_enabled()
    mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        mha.set_fastpath_enabled(before)


def _program_batch(loaded: LoadedModel) -> int:

    shape = program_input_shape(loaded.module)
    return int(shape[0]) if shape else 1


def bake_preprocess(model, pre: Preprocess):
    """Prepend uint8 NHWC frames (RGB, or the model's channel count: 1 = grey) -> normalised
    float NCHW to the graph's single image input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    old_input = graph_inputs(graph)[0]
    dims = old_input.type.tensor_type.shape.dim
    h = dims[2].dim_value or pre.crop_size[0]
    w = dims[3].dim_value or pre.crop_size[1]
    batch = dims[0].dim_param or (dims[0].dim_value if dims[0].dim_value else "batch")
    c = pre.channels
    frames = helper.make_tensor_value_info("frames", TensorProto.UINT8, [batch, h, w, c])
    scale = (1.0 / (255.0 * np.asarray(pre.std, dtype=np.float64))).astype(np.float32).reshape(1, c, 1, 1)
    shift = (-np.asarray(pre.mean, dtype=np.float64) / np.asarray(pre.std, dtype=np.float64)).astype(np.float32).reshape(1, c, 1, 1)
    nodes = [
        helper.make_node("Cast", ["frames"], ["vitedge_pre/float"], to=TensorProto.FLOAT, name="vitedge_pre/Cast"),
        helper.make_node("Transpose", ["vitedge_pre/float"], ["vitedge_pre/nchw"], perm=[0, 3, 1, 2], name="vitedge_pre/Transpose"),
        helper.make_node("Mul", ["vitedge_pre/nchw", "vitedge_pre/scale"], ["vitedge_pre/scaled"], name="vitedge_pre/Mul"),
        helper.make_node("Add", ["vitedge_pre/scaled", "vitedge_pre/shift"], [old_input.name], name="vitedge_pre/Add"),
    ]
    graph.initializer.extend([numpy_helper.from_array(scale, "vitedge_pre/scale"), numpy_helper.from_array(shift, "vitedge_pre/shift")])
    new_nodes = nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.input.remove(old_input)
    graph.input.insert(0, frames)
    if not has_external_tensors(model):  # weights still in their files: the checker would look for them beside the cwd
        onnx.checker.check_model(model)
    return model


@dataclass(frozen=True)
class _Probe:
    """The parity check's input (as the graph takes it) and PyTorch's output for it."""

    feed: np.ndarray
    reference: np.ndarray


def _reference(loaded: LoadedModel, input_format: str, options: ExportOptions) -> _Probe:
    import torch

    h, w = loaded.spec.image_size
    rng = np.random.default_rng(options.seed)
    batch = options.check_batch if loaded.exporter != "dynamo" else _program_batch(loaded)
    if input_format == UINT8_NHWC_RGB:
        c = loaded.spec.preprocess.channels
        frames = rng.integers(0, 256, size=(batch, h, w, c), dtype=np.uint8)
        x = np.stack([normalize(f, loaded.spec.preprocess) for f in frames])
        feed = frames
    else:
        x = rng.standard_normal((batch, loaded.spec.preprocess.channels, h, w)).astype(np.float32)
        feed = x
    module = loaded.module.module() if loaded.exporter == "dynamo" else loaded.module
    with torch.no_grad():
        ref = module(torch.from_numpy(x))
    ref = (ref[0] if isinstance(ref, (tuple, list)) else ref).numpy()
    if not np.all(np.isfinite(ref)):
        raise ExportError(f"the model's output is not finite (inf/NaN) on a probe input{_first_non_finite(module, x)}: "
                          "a weight or activation overflows float32; check the checkpoint (an earlier one, or the right --model-class)")
    return _Probe(feed, ref)


def _first_non_finite(module, x: np.ndarray) -> str:
    """", first in module 'NAME' (Class)": the first submodule, in the order they ran, whose output held inf or NaN
    on ``x``; "" when none can be told (the output of a functional op, or a module that is not an nn.Module)."""
    import torch

    if not isinstance(module, torch.nn.Module):
        return ""
    found: list[str] = []

    def hook(name):
        def check(_mod, _inputs, out):
            t = out[0] if isinstance(out, (tuple, list)) and out else out
            if not found and isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                found.append(f", first in module '{name}' ({type(_mod).__name__})")
        return check

    handles = [m.register_forward_hook(hook(n)) for n, m in module.named_modules() if n]
    try:
        with torch.no_grad():
            module(torch.from_numpy(x))
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else ""


def _check_parity(path: Path, input_name: str, probe: _Probe, large: bool, options: ExportOptions) -> tuple[float, float]:
    """Run the written graph (``path``) in ONNX Runtime on the probe input and compare with PyTorch."""
    try:
        sess = ort_session(path, _parity_settings(large))
    except UsageError:
        raise
    except Exception as err:
        raise ExportError(f"ONNX Runtime cannot load the exported graph: {str(err).splitlines()[0][:200]}") from err
    got = sess.run(None, {input_name: probe.feed})[0]
    del sess
    ref = probe.reference
    if got.shape != ref.shape:
        raise ExportError(f"ONNX Runtime output shape {got.shape} differs from PyTorch's {ref.shape}")
    diff = float(np.max(np.abs(got - ref)))
    tol = options.atol + options.rtol * float(np.max(np.abs(ref)))
    if not np.isfinite(diff) or diff > tol:
        raise ExportError(f"the exported graph disagrees with PyTorch: max |difference| {diff:.3e} exceeds the tolerance {tol:.3e}; nothing was written")
    return diff, tol


def _parity_settings(large: bool) -> SessionSettings:
    """ONNX Runtime settings for the parity check: for a graph past 2 GB, no pre-packed second copy
    of the weights and no memory arena (vit_h_14 ran out of 24 GB)."""
    return lean_settings() if large else SessionSettings()


def bake_file(src: Path, dst: Path, pre: Preprocess) -> None:
    """Write `dst`: the graph in `src` taking uint8 NHWC RGB frames, normalising them itself."""
    import onnx

    model = onnx.load(str(src))
    model = bake_preprocess(model, pre)
    set_metadata(model, {INPUT_FORMAT_KEY: UINT8_NHWC_RGB})
    save_onnx(model, dst)
