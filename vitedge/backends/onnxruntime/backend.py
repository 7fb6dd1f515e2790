"""ONNX Runtime (CPU) backend: the generic `onnx` target.

The artifact is the Q/DQ graph itself, so it runs on any stock ONNX Runtime, and on
anything else that reads ONNX QuantizeLinear/DequantizeLinear.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.backends.base import CPU, Backend, BackendFacts, BuildContext, BuiltArtifact, EnvironmentStatus, Runner
from vitedge.backends.int8_timing import WITHIN_NOISE
from vitedge.backends.onnxruntime.attention import AttentionFusion, fuse_attention
from vitedge.backends.onnxruntime.gemm_bias import GemmBiasFusion, fuse_gemm_bias, unfold_gemm_bias
from vitedge.backends.onnxruntime.patch_embed import PatchEmbedFusion, fuse_patch_embedding, unfold_patch_embedding
from vitedge.backends.float_layers import return_to_float
from vitedge.backends.onnxruntime import layer_payoff
from vitedge.backends.onnxruntime.figures import MEASURED, NONE, RECORDED, KindDecision, decide_source, layer_shapes, recorded_verdicts
from vitedge.backends.onnxruntime.residual_sum import unfuse_skip_norm
from vitedge.backends.onnxruntime.shape_constants import fold_shape_arithmetic
from vitedge.backends.onnxruntime.transpose_pairs import cancel_transpose_pairs
from vitedge.backends.onnxruntime.zero_add import drop_zero_adds
from vitedge.backends.onnxruntime.payoff import Int8Payoff, attention_fusion_pays, keep_float_if_slower, keep_unpaid_float, one_thread_run
from vitedge.core.cpu import read_cpu
from vitedge.core import telemetry
from vitedge.core.errors import BundleError, UsageError
from vitedge.core.limits import MAX_PROFILE_THREADS, check_number
from vitedge.onnxkit.files import DATA_SUFFIX, copy_onnx, external_data_files, is_large, onnx_sha256, save_onnx
from vitedge.onnxkit.metadata import FLOAT_NCHW, FP32_SOURCE_KEY, INPUT_FORMAT_KEY, set_metadata
from vitedge.onnxkit.session import OPTIMIZATION_LEVELS, SessionSettings, ort_session
from vitedge.files.swap import work_prefix

if TYPE_CHECKING:
    from onnx import ModelProto


@dataclass(frozen=True)
class OnnxRuntimeOptions:
    """[backend_options] of an onnxruntime profile."""

    graph_optimization: str = "all"  # ONNX Runtime's session optimisation level at load time
    threads: int = 0  # intra-op threads; 0 = all cores
    # Fuse each float attention core into com.microsoft.MultiHeadAttention (see
    # vitedge/backends/onnxruntime/attention.py), each INT8 GEMM's bias into com.microsoft.MatMulIntegerToFloat
    # (vitedge/backends/onnxruntime/gemm_bias.py), and run the INT8 patch-embedding Conv as one of those GEMMs
    # (vitedge/backends/onnxruntime/patch_embed.py). Measured faster (docs/cpu-targets.md); the artifact then
    # needs ONNX Runtime (any stock build) rather than any ONNX reader.
    fuse_attention: bool = True
    # Time INT8 against FP32 on the build machine; when INT8 is slower at a profile batch size, ship the model in
    # float (vitedge/backends/onnxruntime/payoff.py keep_float_if_slower)
    int8_payoff: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.int8_payoff, bool):
            raise UsageError(f"int8_payoff must be true or false, got {self.int8_payoff!r}")
        if not isinstance(self.fuse_attention, bool):
            raise UsageError(f"fuse_attention must be true or false, got {self.fuse_attention!r}")
        if self.graph_optimization not in OPTIMIZATION_LEVELS:
            raise UsageError(f"graph_optimization must be one of {', '.join(OPTIMIZATION_LEVELS)}, got '{self.graph_optimization}'")
        check_number("threads", self.threads, 0, MAX_PROFILE_THREADS, integer=True)


class OnnxRuntimeRunner(Runner):
    backend_name = "onnxruntime"

    def __init__(self, model_path: Path, options: OnnxRuntimeOptions, threads: int | None = None):
        self.model_path = Path(model_path)
        self.options = options
        self.threads = threads if threads is not None else options.threads
        self.session = None

    def open(self) -> None:
        try:
            self.session = ort_session(self.model_path, SessionSettings(threads=self.threads, optimization=self.options.graph_optimization))
        except ImportError:
            raise  # no onnxruntime: the caller names the package to install
        except Exception as err:
            raise BundleError(f"ONNX Runtime cannot load {self.model_path}: {str(err).splitlines()[0][:200]}") from err
        meta = self.session.get_modelmeta().custom_metadata_map  # no `onnx` import: runtime boxes lack it
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.input_format = meta.get(INPUT_FORMAT_KEY, FLOAT_NCHW)
        dims = inp.shape
        hw = (dims[1], dims[2]) if self.input_format != FLOAT_NCHW else (dims[2], dims[3])
        self.input_hw = tuple(hw) if all(isinstance(d, int) for d in hw) else None
        c = dims[3] if self.input_format != FLOAT_NCHW else dims[1]
        self.input_channels = c if isinstance(c, int) else 3

    def close(self) -> None:
        self.session = None

    def _infer_impl(self, batch: np.ndarray) -> np.ndarray:
        if self.session is None:
            self.open()
        return self.session.run(None, {self.input_name: batch})[0]


class OnnxRuntimeBackend(Backend[OnnxRuntimeOptions]):
    name = "onnxruntime"
    options_type = OnnxRuntimeOptions
    facts = BackendFacts(runtime="ONNX Runtime", runs_on=CPU, runtime_modules=("onnxruntime",),
                         install_hint="pip install onnxruntime", runtime_install="pip install onnxruntime",
                         runtime_extra="onnxruntime", triton_platform="onnxruntime_onnx")

    def check_environment(self) -> EnvironmentStatus:
        try:
            ort = telemetry.onnxruntime()
        except ImportError:
            return EnvironmentStatus(False, False, "onnxruntime is not installed", self.facts.install_hint)
        return EnvironmentStatus(True, True, f"onnxruntime {ort.__version__} (CPUExecutionProvider)")

    def versions(self) -> dict[str, str]:
        ort = telemetry.onnxruntime()

        return {"onnxruntime": ort.__version__}

    def build(self, ctx: BuildContext[OnnxRuntimeOptions]) -> BuiltArtifact:
        model = ctx.out_dir / "model.int8.onnx"
        info: dict[str, Any] = {"execution_provider": "CPUExecutionProvider"}
        options = ctx.options or OnnxRuntimeOptions()
        # which source decides what INT8 keeps float: this CPU's timing, or recorded figures of the bundle's CPU kind
        decision = decide_source(ctx.cpu_kind, ctx.host_kind) if options.int8_payoff else None
        shapes = _shapes(ctx.qdq_path) if decision is not None and decision.source == RECORDED and options.fuse_attention else {}
        reference = ctx.out_dir / REFERENCE
        if not reference.exists():
            copy_onnx(ctx.fp32_path, reference)
        attention = options.fuse_attention
        if options.fuse_attention:  # the FP32 anchor gets the float rewrites the INT8 graph gets
            reference, attention = _reference(reference, ctx, info, decision)
        if options.fuse_attention:
            unfused = None if attention else AttentionFusion(
                info["reference_attention_fusion"]["candidates"], 0, (), ("not used: MultiHeadAttention timed slower than the exported attention here",))
            report, gemm_bias, patch, payoff = _fuse_file(ctx.qdq_path, model, unfused)
            if ctx.log:
                for line in (report.one_line(), gemm_bias.one_line(), patch.one_line(), payoff.one_line()):
                    ctx.log(line)
            info["attention_fusion"] = report.to_dict()
            info["gemm_bias_fusion"] = {"gemms": gemm_bias.gemms, "folded": gemm_bias.folded, "skipped": list(gemm_bias.skipped)}
            info["int8_payoff"] = payoff.to_dict()
        elif ctx.qdq_path.resolve() != model.resolve():
            copy_onnx(ctx.qdq_path, model)
        with OnnxRuntimeRunner(model, options):  # proves the stock CPU provider loads it
            pass
        if decision is not None and _payoff(model, reference, ctx, unfused if options.fuse_attention else None, info, decision,
                                            shapes if options.fuse_attention else None):
            _remove_onnx(model)  # the whole model stays float: the bundle holds its FP32 graph once, as the artifact too
            info["int8_layers"] = int8_layer_share(reference, options)
            return BuiltArtifact(model=reference.name, reference=reference.name, qdq=reference.name, info=info)
        info["int8_layers"] = int8_layer_share(model, options)
        return BuiltArtifact(model=model.name, reference=reference.name, info=info)

    def shipped_graph(self, src: Path, role: str, options: OnnxRuntimeOptions, out_dir: Path) -> Path:
        """``build`` ships the Q/DQ graph with its attention cores, GEMM biases and patch embedding fused, and the
        FP32 reference with its attention cores fused (when the profile fuses them; the FP32 graph as it is when
        no core fuses), both written by the same code as here (the reference under the bundle's name ``REFERENCE``,
        where the fused graph takes the exported graph's place: the same bytes for a graph without external data)."""
        if not (options or OnnxRuntimeOptions()).fuse_attention:
            return src
        if role == "reference":
            _fuse_reference(src, out_dir / FUSED_REFERENCE)
            return out_dir / FUSED_REFERENCE if (out_dir / FUSED_REFERENCE).exists() else src
        _fuse_file(src, out_dir / "model.int8.onnx")
        return out_dir / "model.int8.onnx"

    def open_runner(self, model_path: Path, options: OnnxRuntimeOptions, *, threads: int | None = None) -> Runner:
        return OnnxRuntimeRunner(model_path, options or OnnxRuntimeOptions(), threads)


def _shapes(qdq_path: Path) -> dict[str, tuple[int, int, int]]:
    """The INT8 layers' GEMM shapes of the Q/DQ graph, read before the artifact takes its place (``figures``)."""
    import onnx

    try:
        return layer_shapes(onnx.load(str(qdq_path), load_external_data=False))
    except Exception:  # noqa: BLE001 - a graph shape inference cannot read: no layer is judged by the figures
        return {}


def _payoff(model: Path, reference: Path, ctx: BuildContext, unfused: AttentionFusion | None, info: dict[str, Any],
            decision: KindDecision, shapes: dict[str, tuple[int, int, int]] | None) -> bool:
    """The keep-float steps for the bundle's CPU kind (``decision``): per layer (``shapes`` not None: the rewrites ran),
    then the whole model, timed here when this CPU is of that kind; from recorded figures, or not at all, otherwise.
    Records which source decided; True when the whole model stays float."""
    record = info.setdefault("int8_payoff", {"cpu": read_cpu().isa, "source": "onnxruntime timing on the build machine", "kept_float": []})
    record.update({"cpu_kind": decision.kind, "built_on": decision.host, "decided_by": decision.decided_by()})
    if decision.source == MEASURED:
        if shapes is not None:
            _layer_payoff(model, reference, ctx, unfused, info)
        return _timed_payoff(model, reference, ctx, info)
    if decision.source == RECORDED and shapes is not None:
        _recorded_layer_payoff(model, ctx, unfused, info, decision, shapes)
    elif ctx.log and decision.source == NONE:
        ctx.log(decision.not_judged_line())
    record["timed"] = {"timed_on": None, "whole_model_float": False, "not_timed": decision.not_timed()}
    if ctx.log:
        ctx.log(f"INT8 payoff: INT8 against FP32 of the whole graph is {decision.not_timed()}: its INT8 is kept")
    return False


def _float_candidate(ctx: BuildContext, chosen: dict[str, str], unfused: AttentionFusion | None, out: Path) -> tuple[list[dict[str, str]], GemmBiasFusion, Int8Payoff]:
    """The artifact with the ``chosen`` INT8 layers (Q/DQ name -> why) back to float, written to ``out`` by the same
    rewrites: the artifact's INT8 rewrites unfolded to the Q/DQ form first, so the layers are found by their names.
    Returns (the layers floated, the GEMM-bias report, the runtime's own keep-float report)."""
    import onnx

    graph = onnx.load(str(ctx.qdq_path))
    unfold_int8_rewrites(graph)  # MatMulIntegerToFloat (GEMM with bias, patch embedding) back to DequantizeLinear -> MatMul
    kept = return_to_float(graph, lambda node, dq: chosen.get(node.name))
    qdq = out.with_name("layers.qdq.onnx")
    save_onnx(graph, qdq)
    _, gemm_bias, _, payoff = _fuse_file(qdq, out, unfused)
    return kept, gemm_bias, payoff


def _layer_payoff(model: Path, reference: Path, ctx: BuildContext, unfused: AttentionFusion | None, info: dict[str, Any]) -> None:
    """The INT8 layers that do not pay here back to float, when the whole graph then times faster
    (``layer_payoff``); ``model`` is replaced by that graph and ``info`` records the step either way."""
    cpu = read_cpu().isa
    batches = tuple(sorted({1, *(ctx.batch_sizes or ())}))
    try:
        verdicts = layer_payoff.profile_verdicts(model, reference, batches)
    except Exception as err:  # noqa: BLE001 - a graph the profiler cannot run keeps its layers as they are
        info.setdefault("int8_payoff", {})["layers"] = {"timed_on": cpu, "unavailable": str(err).splitlines()[0][:120] if str(err) else type(err).__name__}
        return
    chosen = {n: v for v in verdicts if v.to_float for n in v.group.names}
    record: dict[str, Any] = {"timed_on": cpu, "batches": list(batches), "groups_timed": len(verdicts), "taken": False,
                              "source": "onnxruntime profiler, one thread, per node p20; then the whole graph side by side",
                              "rule": "a group of INT8 layers reading one quantized activation goes float when that lowers the sum over the "
                                      "batch sizes of the graph's INT8/FP32 ratio; kept only when the whole graph then times faster beyond "
                                      "the FP32-vs-FP32 control's noise and slower at no batch size",
                              "candidates": [{"layers": list(v.group.names), "gain": round(v.gain, 4),
                                              "int8_over_fp32": {str(b): round(v.int8_us[b] / v.fp32_us[b], 3) for b in v.int8_us if v.fp32_us[b] > 0}}
                                             for v in verdicts if v.to_float]}
    info.setdefault("int8_payoff", {})["layers"] = record
    if chosen:
        with tempfile.TemporaryDirectory(prefix=work_prefix("ort-opt")) as tmp:
            candidate = Path(tmp) / "model.int8.onnx"
            kept, gemm_bias, payoff = _float_candidate(ctx, {n: v.why(cpu) for n, v in chosen.items()}, unfused, candidate)
            timed = layer_payoff.side_by_side(reference, model, candidate, batches, one_thread_run)
            take, noise = layer_payoff.candidate_pays(timed)
            record.update({"taken": take, "control_noise": round(noise, 4), "floated": len(kept),
                           **{f"{k}_over_fp32": {str(b): round(r, 4) for b, r in timed[k].items()} for k in ("current", "candidate")}})
            if take:
                copy_onnx(candidate, model)
                rec = info["int8_payoff"]
                rec["kept_float"] = list(payoff.to_dict()["kept_float"]) + kept
                info["gemm_bias_fusion"] = {"gemms": gemm_bias.gemms, "folded": gemm_bias.folded, "skipped": list(gemm_bias.skipped)}
    if ctx.log:
        ctx.log(layer_payoff_line(record, len(chosen)))


def _recorded_layer_payoff(model: Path, ctx: BuildContext, unfused: AttentionFusion | None, info: dict[str, Any],
                           decision: KindDecision, shapes: dict[str, tuple[int, int, int]]) -> None:
    """The INT8 layers that do not pay on the bundle's CPU kind by its recorded figures back to float (``figures``):
    nothing is timed (this CPU is of another kind); ``model`` is replaced by that graph and ``info`` records the step."""
    figures = decision.figures
    assert figures is not None
    batches = tuple(sorted({1, *(ctx.batch_sizes or ())}))
    graph = layer_payoff.optimized_graph(model)
    verdicts = recorded_verdicts(layer_payoff.layer_groups(graph), shapes, figures, batches, layer_payoff.sole_readers(graph))
    chosen = {n: v for v in verdicts if v.to_float for n in v.group.names}
    record: dict[str, Any] = {"cpu_kind": decision.kind, "timed_on": None, "figures": figures.to_dict(), "batches": list(batches),
                              "groups_judged": len(verdicts), "taken": bool(chosen), "not_timed": decision.not_timed(),
                              "rule": "a group of INT8 layers reading one quantized activation goes float when, by the recorded figures "
                                      "of its GEMM shapes, its INT8 time exceeds its FP32 time by more than the figures' noise at every "
                                      "batch size; the whole graph is not timed",
                              "candidates": [{"layers": list(v.group.names), "int8_over_fp32": {str(b): round(v.int8_us[b] / v.fp32_us[b], 3)
                                                                                                 for b in v.int8_us}} for v in verdicts if v.to_float]}
    info["int8_payoff"]["layers"] = record
    if chosen:
        why = {n: (f"its INT8 (kernel + input quantization) is slower than its FP32 layer on {decision.kind} CPUs by "
                   f"{figures.label()}: INT8/FP32 per layer " + ", ".join(f"b{b} {v.int8_us[b] / v.fp32_us[b]:.2f}" for b in sorted(v.int8_us))
                   + f"; {decision.not_timed()}") for n, v in chosen.items()}
        with tempfile.TemporaryDirectory(prefix=work_prefix("ort-opt")) as tmp:
            candidate = Path(tmp) / "model.int8.onnx"
            kept, gemm_bias, payoff = _float_candidate(ctx, why, unfused, candidate)
            copy_onnx(candidate, model)
        record["floated"] = len(kept)
        info["int8_payoff"]["kept_float"] = list(payoff.to_dict()["kept_float"]) + kept
        info["gemm_bias_fusion"] = {"gemms": gemm_bias.gemms, "folded": gemm_bias.folded, "skipped": list(gemm_bias.skipped)}
    if ctx.log:
        ctx.log(f"INT8 payoff per layer for {decision.kind} CPUs, by {figures.label()}: "
                + (f"{len(chosen)} INT8 layer(s) kept float (slower than FP32 there at every batch size beyond the figures' noise)"
                   if chosen else f"no INT8 layer is slower than FP32 there beyond the figures' noise ({len(verdicts)} groups judged)")
                + f"; {decision.not_timed()}")


def layer_payoff_line(record: dict[str, Any], chosen: int) -> str:
    """The per-layer step in one line: which layers went float and the whole graph's ratios before and after."""
    cpu = record["timed_on"]
    if not chosen:
        return f"INT8 payoff per layer: every INT8 layer timed no slower than its FP32 layer in ONNX Runtime on {cpu}"
    ratios = lambda k: "/".join(f"{r:.2f}" for _, r in sorted(record[k].items(), key=lambda kv: int(kv[0])))
    b = "/".join(f"b{x}" for x in record["batches"])
    if record["taken"]:
        return (f"INT8 payoff per layer: {chosen} INT8 layer(s) kept float, slower than FP32 per layer in ONNX Runtime on {cpu}; "
                f"INT8/FP32 ({b}) {ratios('current_over_fp32')} -> {ratios('candidate_over_fp32')}")
    return (f"INT8 payoff per layer: {chosen} INT8 layer(s) timed slower than FP32 per layer on {cpu}, but the graph with them "
            f"float was not faster beyond the noise ({b} {ratios('current_over_fp32')} -> {ratios('candidate_over_fp32')}, "
            f"control {record['control_noise']:.0%}): kept INT8")


def _timed_payoff(model: Path, reference: Path, ctx: BuildContext, info: dict[str, Any]) -> bool:
    """INT8 timed against FP32 here (recorded in ``info``); True when INT8 is not faster and the whole model stays float
    (the bundle then ships ``reference`` as its artifact)."""
    cpu = read_cpu().isa
    timed = keep_float_if_slower(model, reference, tuple(sorted({1, *(ctx.batch_sizes or ())})), cpu)
    record = info.setdefault("int8_payoff", {"cpu": cpu, "source": "onnxruntime timing on the build machine", "kept_float": []})
    whole = timed.pop("kept_float_whole", None)
    why = timed.pop("float_reason", "slower than FP32")
    record["timed"] = timed
    ratios = ", ".join(f"b{b} {r:.2f}" for b, r in timed["steps"][0]["int8_over_fp32"].items())
    if whole is not None:
        record["kept_float"] = whole
        line = (f"INT8 payoff: INT8 of this model is {why} in ONNX Runtime on {cpu} ({ratios}): the whole model is "
                f"kept float, and the bundle holds its FP32 graph once ({REFERENCE}, the artifact too)")
    elif "undecided" in timed:
        line = f"INT8 payoff: {timed['undecided']} (INT8/FP32 CPU time at one thread {ratios})"
    elif any(v == WITHIN_NOISE for v in timed["verdicts"].values()):
        line = (f"INT8 payoff: INT8 is kept, faster than FP32 on the mean of the batch sizes and not slower beyond this "
                f"machine's noise at any in ONNX Runtime on {cpu} (INT8/FP32 CPU time at one thread {ratios}, the "
                f"FP32-vs-FP32 control moved by {timed['control_noise']:.0%})")
    else:
        line = f"INT8 payoff: INT8 pays in ONNX Runtime on {cpu} (INT8/FP32 CPU time at one thread {ratios})"
    if ctx.log:
        ctx.log(line)
    return whole is not None


# The onnx bundle's one FP32 graph: the exported graph with the INT8 graph's float rewrites (q/k/v merged, attention
# cores fused) where they fuse and are not timed slower here, else the exported graph as it is. It is the graph INT8 is
# timed and validated against, what the analysis reads (its layers keep the Q/DQ graph's node names), and what ships
# when the whole model stays float; a rewritten one records the exported graph it computes (FP32_SOURCE_KEY), and the
# manifest says which it is (artifacts.fp32_graph). Without the rewrites the anchor kept what the INT8 graph's
# rewrites remove: a sequence-first attention export's shape arithmetic (961 nodes against the INT8 graph's 259), a
# dozen small kernels per attention core, per-head q/k/v GEMMs.
REFERENCE = "reference.fp32.onnx"
# Where the rewrite is written while the build times it against the exported graph. Bundles of earlier versions ship
# it under this name beside the exported reference.fp32.onnx (their manifest names both: artifacts.reference, fp32_onnx).
FUSED_REFERENCE = "reference.fp32.fused.onnx"


def _fuse_reference(src: Path, dst: Path) -> AttentionFusion:
    """Write the FP32 graph ``src`` to ``dst`` with the float rewrites its INT8 graph got: q/k/v layers that read
    one activation as one GEMM (``quantize/merge``, done to the FP32 graph before quantization), its attention
    cores fused, each with its numeric check, its Adds of zeros removed (``zero_add``), and its residual Adds only a
    LayerNorm reads (post-norm blocks, a pre-norm model's last) as Sum (``residual_sum``), its shape arithmetic folded
    (``shape_constants``) and the Transposes that undo each other around row-wise layers removed (``transpose_pairs``). ``dst`` is removed first and written only
    when one of these rewrote something: after the call it exists exactly then."""
    import onnx

    from vitedge.quantize.graph import GraphIndex  # build-only modules (they pull in the console): not at import time
    from vitedge.quantize.merge import merge_sibling_linears

    graph = onnx.load(str(src))
    dst.unlink(missing_ok=True)
    gi = GraphIndex(graph)
    merge_sibling_linears(graph, check=not is_large(graph), constant=lambda name: gi.value(name) if gi.is_const(name) else None)
    report = fuse_attention(graph)
    zeros = drop_zero_adds(graph).dropped  # Adds of zeros (a pruned block's zeros_like) go as in the INT8 graph
    summed = unfuse_skip_norm(graph)
    folded = fold_shape_arithmetic(graph).replaced  # shape arithmetic and Transpose pairs go as in the INT8 graph (_fuse_file)
    paired = cancel_transpose_pairs(graph)
    if summed or zeros or folded or paired or report.fused:
        set_metadata(graph, {FP32_SOURCE_KEY: onnx_sha256(src)})  # the function it computes: FP32 outputs are shared by it
        save_onnx(graph, dst)
    return report


def _reference(exported: Path, ctx: BuildContext, info: dict[str, Any], decision: KindDecision | None) -> tuple[Path, bool]:
    """(the FP32 reference, whether the attention cores are fused): the exported graph with the INT8 graph's float
    rewrites, unless timing here (``int8_payoff``, on a CPU of the bundle's kind) finds the fused attention slower than
    the exported graph's, in which case neither graph fuses it (recorded in ``info['reference_attention_fusion']``).
    Either way one FP32 graph is left, at ``exported``'s path: the rewrite takes the exported graph's place once kept."""
    fused = ctx.out_dir / FUSED_REFERENCE
    fusion = _fuse_reference(exported, fused)
    record = info["reference_attention_fusion"] = fusion.to_dict()
    if not fused.exists():
        return exported, True
    if not fusion.fused:  # only residual Adds, shape inputs or Transpose pairs rewritten: the same arithmetic, nothing to time
        _take_place(fused, exported)
        return exported, True
    if decision is not None and decision.source != MEASURED:  # no figures of it: the fusion is kept, as without timing
        record["not_timed"] = decision.not_timed()
    elif decision is not None:
        cpu = read_cpu().isa
        timed = record["timed"] = attention_fusion_pays(exported, fused, tuple(sorted({1, *(ctx.batch_sizes or ())})), cpu)
        ratios = ", ".join(f"b{b} {r:.2f}" for b, r in timed["fused_over_exported"].items())
        if timed["slower"]:
            _remove_onnx(fused)
            if ctx.log:
                ctx.log(f"attention fusion: not used, MultiHeadAttention is slower than the exported attention in ONNX "
                        f"Runtime on {cpu} (fused/exported FP32 CPU time at one thread {ratios})")
            return exported, False
        if ctx.log:
            ctx.log(f"FP32 reference: {fusion.one_line()} (fused/exported FP32 CPU time at one thread {ratios})")
    _take_place(fused, exported)
    return exported, True


def _remove_onnx(path: Path) -> None:
    for f in (path, path.with_name(path.name + DATA_SUFFIX)):
        f.unlink(missing_ok=True)


def _take_place(src: Path, dst: Path) -> None:
    """The graph ``src`` (with its external data) becomes ``dst``, replacing it; ``src`` is removed. No data file
    of the graph ``dst`` was is left behind when ``src`` has none. Both are in one folder: a self-contained graph is
    renamed, not copied (a ViT-B/16 is ~345 MB)."""
    if external_data_files(src):
        written = copy_onnx(src, dst)  # its data file takes dst's name, and the graph names it so
        _remove_onnx(src)
    else:
        os.replace(src, dst)
        written = [dst]
    stale = dst.with_name(dst.name + DATA_SUFFIX)
    if stale not in written:
        stale.unlink(missing_ok=True)


def _fuse_file(src: Path, dst: Path, unfused: AttentionFusion | None = None) -> tuple[AttentionFusion, GemmBiasFusion, PatchEmbedFusion, Int8Payoff]:
    """Write the Q/DQ graph ``src`` to ``dst`` with its float attention cores fused (unless ``unfused`` says why
    not: the build timed the fusion slower here; it is then the report), its INT8 GEMMs' biases folded into MatMulIntegerToFloat and its
    INT8 patch embedding run as one, and the INT8 layers ONNX Runtime would still run as float kernels back in float
    (vitedge/backends/onnxruntime/payoff.py), and its residual Adds only a LayerNorm reads written as Sum
    (vitedge/backends/onnxruntime/residual_sum.py); returns the reports."""
    import onnx

    graph = onnx.load(str(src))
    report = fuse_attention(graph) if unfused is None else unfused
    gemm_bias = fuse_gemm_bias(graph)
    patch = fuse_patch_embedding(graph)
    drop_zero_adds(graph)  # Add(x, zeros of x's shape) is x: the zeros' LayerNorm -> Shape -> ConstantOfShape go with it
    unfuse_skip_norm(graph)  # residual Adds only a LayerNorm reads, as Sum: ONNX Runtime's SkipLayerNormalization is slower here
    fold_shape_arithmetic(graph)  # Reshape/Expand targets as constants: no Shape/Gather/Concat chains run per inference
    cancel_transpose_pairs(graph)  # sequence-first Transposes that undo each other around a GEMM: both go
    payoff = keep_unpaid_float(graph, read_cpu().isa)
    save_onnx(graph, dst)
    return report, gemm_bias, patch, payoff



def unfold_int8_rewrites(model: ModelProto) -> int:
    """The onnx artifact's INT8 layers in their Q/DQ form again, under their node names (in place): what
    ``_fuse_file`` made MatMulIntegerToFloat (the GEMMs with their biases, the patch embedding) back to
    ``DequantizeLinear -> MatMul`` / ``-> Conv``. The attention fusion stays (it holds no INT8 layer). For readers
    that find INT8 layers that way (per-layer sensitivity). Returns how many layers were unfolded."""
    return unfold_gemm_bias(model) + unfold_patch_embedding(model)

# Optimized-graph op types that do matrix work, by what they compute in.
_INT8_OPS = ("QLinearMatMul", "MatMulIntegerToFloat", "MatMulInteger", "QLinearConv", "ConvInteger", "QGemm",
             "DynamicQuantizeMatMul", "QAttention", "QOrderedMatMul")
_FLOAT_OPS = ("MatMul", "Gemm", "Conv", "FusedMatMul", "FusedGemm", "FusedConv", "NhwcFusedConv", "MultiHeadAttention",
              "Attention", "MatMulNBits")


def int8_layer_share(model_path: Path, options: OnnxRuntimeOptions) -> dict[str, Any]:
    """How many matrix ops run in INT8, read from the graph ONNX Runtime itself optimized for
    this CPU (``SessionOptions.optimized_model_filepath``), not from the Q/DQ pattern."""

    import onnx

    with tempfile.TemporaryDirectory(prefix=work_prefix("ort-opt")) as tmp:
        out = Path(tmp) / "optimized.onnx"
        try:
            ort_session(model_path, SessionSettings(optimization=options.graph_optimization, optimized_model_path=out))
            graph = onnx.load(str(out), load_external_data=False)
        except Exception as err:
            return {"int8": None, "other": None, "source": f"unavailable: {str(err).splitlines()[0][:120] if str(err) else type(err).__name__}"}
    by_type: dict[str, int] = {}
    counts: dict[str, Any] = {"int8": 0, "other": 0}
    for node in graph.graph.node:
        if node.op_type in _INT8_OPS or node.op_type in _FLOAT_OPS:
            counts["int8" if node.op_type in _INT8_OPS else "other"] += 1
            by_type[node.op_type] = by_type.get(node.op_type, 0) + 1
    counts["by_type"] = by_type
    counts["source"] = "onnxruntime optimized graph"
    return counts
