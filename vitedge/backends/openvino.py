"""OpenVINO backend: the `intel-cpu` target.

The INT8 IR is converted from the same Q/DQ graph every other target uses (calibrate
once); OpenVINO turns the Q/DQ pairs into FakeQuantize and runs INT8 kernels (VNNI /
AMX where the CPU has them). The FP32 reference is the FP32 ONNX graph converted too,
so parity is measured on the same runtime.

``float_precision`` is the precision of the INT8 IR's float regions (attention, GELU,
LayerNorm, residual adds): ``bf16`` where the CPU has bf16 units (AVX512_BF16 / AMX),
else ``f32``. The FP32 reference always runs in f32: each IR carries its role in its
rt_info, and the runner reads it, so validation proves parity against true FP32 and the
embedding runtime runs the artifact exactly as it was validated.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.backends.base import CPU, Backend, BackendFacts, BuildContext, BuiltArtifact, EnvironmentStatus, Runner
from vitedge.core import telemetry
from vitedge.backends.ov_payoff import PayoffRun, settle
from vitedge.core.cpu import bf16_capped_off, read_cpu
from vitedge.core.errors import BundleError, MissingDependencyError, UsageError
from vitedge.core.cpu import usable_cpus
from vitedge.core.limits import MAX_PROFILE_THREADS, check_number
from vitedge.onnxkit.files import copy_onnx, onnx_sha256
from vitedge.onnxkit.metadata import FLOAT_NCHW, INPUT_FORMAT_KEY, UINT8_NHWC_RGB, get_metadata
from vitedge.core.signals import raise_if_interrupted

if TYPE_CHECKING:
    import openvino

_HINTS = ("LATENCY", "THROUGHPUT")
_FLOAT_PRECISIONS = ("f32", "bf16")
INSTALL = "pip install 'vitedge[openvino]'"
ROLE_KEY = "vitedge.role"  # rt_info of each IR: "int8" (the artifact) or "fp32-reference"
REFERENCE_ROLE = "fp32-reference"
# rt_info of an INT8 IR whose float regions the build chose by timing (ov_payoff): the precision they run in,
# over the profile's float_precision
PRECISION_KEY = "vitedge.float_precision"
# rt_info of the FP32 reference IR: the sha256 (onnxutil.onnx_sha256) of the FP32 ONNX graph it was converted
# from, so the validation cache can tie it to the FP32 outputs ONNX Runtime computed for those bytes
SOURCE_KEY = "vitedge.fp32_source_sha256"
_SOURCE_RE = re.compile(r'<vitedge\.fp32_source_sha256 value="([0-9a-f]{64})"\s*/>')


@dataclass(frozen=True)
class OpenVinoOptions:
    """[backend_options] of an openvino profile."""

    device: str = "CPU"
    performance_hint: str = "LATENCY"
    threads: int = 0  # 0 = OpenVINO's default (all physical cores)
    num_streams: int = 0  # 0 = chosen by the hint
    float_precision: str = "f32"  # the INT8 IR's float regions: f32, or bf16 where the CPU has it
    # Time INT8 against FP32 on the build machine and keep float what does not pay there (vitedge/backends/ov_payoff.py)
    int8_payoff: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.int8_payoff, bool):
            raise UsageError(f"int8_payoff must be true or false, got {self.int8_payoff!r}")
        if self.float_precision not in _FLOAT_PRECISIONS:
            raise UsageError(f"float_precision must be one of {', '.join(_FLOAT_PRECISIONS)}, got '{self.float_precision}'")
        if self.performance_hint not in _HINTS:
            raise UsageError(f"performance_hint must be one of {', '.join(_HINTS)}, got '{self.performance_hint}'")
        check_number("threads", self.threads, 0, MAX_PROFILE_THREADS, integer=True)
        check_number("num_streams", self.num_streams, 0, MAX_PROFILE_THREADS, integer=True)


def float_precision_used(core: openvino.Core, device: str, requested: str) -> str:
    """``requested``, or f32 when it is bf16 and the device reports no BF16 capability, or when oneDNN is capped
    below AVX-512 (``ONEDNN_MAX_CPU_ISA=AVX2`` on a bf16 CPU: the plugin still reports BF16 but cannot compile it)."""
    if requested != "bf16" or bf16_capped_off():
        return "f32"
    try:
        caps = [str(c).upper() for c in core.get_property(device, "OPTIMIZATION_CAPABILITIES")]
    except Exception:  # noqa: BLE001 - a device that cannot say gets f32
        return "f32"
    return "bf16" if "BF16" in caps else "f32"


def _rt_str(model: openvino.Model, key: str) -> str | None:
    """A string the build stored in the model's rt_info (``set_rt_info(value, key)``), else None."""
    try:
        return str(model.get_rt_info([key]).astype(str)) if model.has_rt_info([key]) else None
    except Exception:  # noqa: BLE001 - absent or unreadable: treated as unset
        return None


# OpenVINO's converter (ovc) and NNCF send usage telemetry to Google Analytics unless the user opted
# out or CI=true: a forked process per event, which on a closed network (a camera box, a CI runner
# without DNS) hangs in getaddrinfo for good and keeps the parent's stdout pipe open (seen: a test run
# that never closed its pipe). vitedge.core.telemetry switches theirs off (with every other library's) in
# vitedge's processes; both fall back to their own no-op stubs when `openvino_telemetry` cannot be imported.
ALLOW_TELEMETRY_ENV = telemetry.ALLOW_TELEMETRY_ENV


def block_vendor_telemetry() -> bool:
    """Every library's telemetry off in this process (vitedge.core.telemetry.silence); True when blocked, False
    when the user allowed it (VITEDGE_ALLOW_VENDOR_TELEMETRY=1) or `openvino_telemetry` was already imported
    by someone else before vitedge (then it is left as it is)."""
    return telemetry.silence() and sys.modules.get("openvino_telemetry", 0) is None


def _ov():
    block_vendor_telemetry()
    try:
        import openvino as ov
    except ImportError:
        raise MissingDependencyError("OpenVINO (for the intel-cpu target)", INSTALL) from None
    return ov


# Batches a validation pass keeps in flight (``OpenVinoRunner.infer_all``), each stream on an equal share of
# the threads. Measured on ViT-B/16, 96 images in batches of 8, 2 cores (AVX2 EPYC, no VNNI), compile included:
# the INT8 IR in 0.87-0.91 of the time of one batch at a time on the LATENCY compile, the FP32 one in 0.85-0.98,
# outputs bit-identical (benchmarks/pass_streams.py, results/pass_streams_avx2.md). Not measured on a VNNI CPU
# or on more cores; float regions in bf16 run one batch at a time (``infer_all``).
PASS_STREAMS = 2


class OpenVinoRunner(Runner):
    backend_name = "openvino"

    def __init__(self, model_path: Path, options: OpenVinoOptions, threads: int | None = None, hint: str | None = None):
        self.model_path = Path(model_path)
        self.options = options
        self.threads = threads if threads is not None else options.threads
        self.hint = hint or options.performance_hint
        self.compiled = None
        self.request = None

    def open(self) -> None:
        self.compiled = self._compile()
        self.request = self.compiled.create_infer_request()

    def _compile(self, streams: int = 0) -> Any:
        """The graph compiled with the profile's settings (for ``streams`` streams splitting the threads, when
        given and the float regions run in f32); sets the input's facts and ``float_precision``."""
        ov = _ov()
        core = ov.Core()
        try:
            model = core.read_model(str(self.model_path))
        except Exception as err:
            raise BundleError(f"OpenVINO cannot read {self.model_path}: {str(err).splitlines()[0][:200]}") from err
        fmt = _rt_str(model, INPUT_FORMAT_KEY) or FLOAT_NCHW
        self.role = _rt_str(model, ROLE_KEY)
        self.input_format = UINT8_NHWC_RGB if model.inputs[0].get_element_type() == ov.Type.u8 else fmt
        config: dict[str, Any] = {"PERFORMANCE_HINT": self.hint}
        if self.threads:
            config["INFERENCE_NUM_THREADS"] = int(self.threads)
        if self.options.num_streams:
            config["NUM_STREAMS"] = str(self.options.num_streams)
        # Always set: CPUs with bf16/fp16 units would otherwise lower float regions silently.
        # The FP32 reference runs in f32 whatever the profile says (parity is against FP32).
        requested = "f32" if self.role == REFERENCE_ROLE else (_rt_str(model, PRECISION_KEY) or self.options.float_precision)
        self.float_precision = float_precision_used(core, self.options.device, requested)
        config["INFERENCE_PRECISION_HINT"] = self.float_precision
        if streams and self.float_precision == "f32":
            config.update({"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": str(streams),
                           "INFERENCE_NUM_THREADS": int(self.threads or usable_cpus())})
        compiled = core.compile_model(model, self.options.device, config)
        port = compiled.inputs[0]
        self.input_name = port.get_any_name()
        shape = port.get_partial_shape()
        dims = [d.get_length() if d.is_static else None for d in shape]
        hw = (dims[1], dims[2]) if self.input_format == UINT8_NHWC_RGB else (dims[2], dims[3])
        self.input_hw = tuple(hw) if all(h is not None for h in hw) else None
        c = dims[3] if self.input_format == UINT8_NHWC_RGB else dims[1]
        self.input_channels = c if c is not None else 3
        return compiled

    def close(self) -> None:
        self.request = None
        self.compiled = None

    def infer_all(self, batches):
        """``PASS_STREAMS`` batches at once: the graph compiled again for that many streams (THROUGHPUT, an
        equal share of the threads each), fed by an ``AsyncInferQueue``; outputs in order. The latency-compiled
        graph is released first and compiled again on the next ``infer``. Only where the float regions run in
        f32, where the two compiles gave bit-identical outputs (every round on the AVX2 EPYC; on a Zen 5 VNNI EPYC
        one FP32-reference round of 11 was not, by an amount not recorded: benchmarks/results/
        pass_streams_avx512-vnni.md); bf16 ones (CPUs with AVX512_BF16 or AMX) are not measured, and a difference
        there would fail the reference cache's spot check of stored INT8 outputs (``verify_sample``, 1e-4 of the
        output scale), so they run one batch at a time. Faster on the AVX2 EPYC (0.885 INT8, 0.93 FP32), within
        ~3 % either way on the Zen 5 one."""
        if (self.threads or usable_cpus()) < PASS_STREAMS:
            yield from super().infer_all(batches)
            return
        self.close()
        compiled = self._compile(streams=PASS_STREAMS)
        if self.float_precision != "f32":
            self.compiled, self.request = compiled, compiled.create_infer_request()
            yield from super().infer_all(batches)
            return
        queue = _ov().AsyncInferQueue(compiled, PASS_STREAMS)
        done: dict[int, np.ndarray] = {}
        queue.set_callback(lambda request, i: done.__setitem__(i, np.asarray(request.get_output_tensor(0).data).copy()))
        taken = started = 0
        try:
            for batch in batches:
                queue.start_async({0: self._checked(batch)}, started)  # waits for an idle request
                started += 1
                while taken in done:
                    yield done.pop(taken)
                    taken += 1
                raise_if_interrupted()
            queue.wait_all()
            while taken in done:
                yield done.pop(taken)
                taken += 1
        finally:  # an error or a caller that stopped early: nothing keeps running behind it
            queue.wait_all()
        if taken != started:
            raise BundleError(f"OpenVINO returned outputs for {taken} of {started} batches of {self.model_path.name}: run it again with --debug")

    def _infer_impl(self, batch: np.ndarray) -> np.ndarray:
        if self.request is None:
            self.open()
        result = self.request.infer({0: batch})
        return np.asarray(next(iter(result.values()))).copy()


class OpenVinoBackend(Backend[OpenVinoOptions]):
    name = "openvino"
    options_type = OpenVinoOptions
    facts = BackendFacts(runtime="OpenVINO", runs_on=CPU, runtime_modules=("openvino",), install_hint=INSTALL,
                         runtime_install="pip install openvino", runtime_extra="openvino", triton_backend="openvino", open_serially=True)

    def check_environment(self) -> EnvironmentStatus:
        block_vendor_telemetry()
        try:
            import openvino as ov
        except ImportError:
            return EnvironmentStatus(False, False, "OpenVINO is not installed", INSTALL)
        devices = ov.Core().available_devices
        ok = "CPU" in devices
        return EnvironmentStatus(ok, ok, f"openvino {ov.__version__}, devices {', '.join(devices) or 'none'}",
                                 None if ok else "OpenVINO found no CPU device")

    def check_options(self, options: OpenVinoOptions) -> None:
        """A plain device name (CPU, GPU, NPU) must be one OpenVINO finds here; AUTO/MULTI/HETERO choose for themselves."""
        device = options.device.split(".")[0].upper()
        if device in ("AUTO", "MULTI", "HETERO") or ":" in options.device:
            return
        devices = _ov().Core().available_devices
        if options.device not in devices and device not in {d.split(".")[0].upper() for d in devices}:
            raise BundleError(f"OpenVINO device '{options.device}' (backend_options.device) is not available on this machine "
                              f"(found: {', '.join(devices) or 'none'}); use device = \"CPU\" or build on a machine with that device")

    def versions(self) -> dict[str, str]:
        ov = _ov()
        return {"openvino": ov.__version__}

    def build(self, ctx: BuildContext[OpenVinoOptions]) -> BuiltArtifact:
        fmt = _input_format(ctx.qdq_path)
        _convert(ctx.qdq_path, "model", fmt, ctx.out_dir)
        _convert(ctx.fp32_path, "reference", fmt, ctx.out_dir, source_sha256=onnx_sha256(ctx.fp32_path))
        payoff = _settle_payoff(ctx, fmt) if ctx.options.int8_payoff and ctx.options.device.upper() == "CPU" else None
        cpu = read_cpu()
        if payoff is None and ctx.options.int8_payoff and ctx.options.device.upper() == "CPU" and cpu.int8_dot_product is False and ctx.log:
            ctx.log(f"INT8 payoff: not timed on {cpu.isa}: without VNNI/AMX the intel-cpu profile keeps INT8 with its stated "
                    "speed allowance (min_speedup_without_vnni)")
        whole = payoff is not None and payoff.whole_model  # the FP32 reference IR ships as the artifact, held once
        model, extra = ("reference.fp32.xml", ["reference.fp32.bin"]) if whole else ("model.xml", ["model.bin", "reference.fp32.bin"])
        if whole:
            ctx.qdq_path.unlink(missing_ok=True)  # no Q/DQ graph ships: the FP32 ONNX graph is the bundle's one graph
        with OpenVinoRunner(ctx.out_dir / model, ctx.options) as runner:
            exec_precision = _int8_layer_share(runner.compiled)
            used = runner.float_precision
        info = {"device": ctx.options.device, "performance_hint": ctx.options.performance_hint, "int8_layers": exec_precision,
                "float_precision": {"requested": ctx.options.float_precision, "used": used, "reference": "f32"}}
        if payoff is not None:
            info["int8_payoff"] = payoff.to_dict()
        if used != ctx.options.float_precision and ctx.log and not (payoff and payoff.float_precision == used):
            ctx.log(f"float regions run in {used}: {ctx.options.device} reports no {ctx.options.float_precision.upper()} capability")
        return BuiltArtifact(model=model, reference="reference.fp32.xml", extra_files=extra, info=info,
                             qdq=ctx.fp32_path.name if whole else None)

    def shipped_graph(self, src: Path, role: str, options: OpenVinoOptions, out_dir: Path) -> Path:
        """The IR ``build`` writes for ``src``, by the same conversion (the input format read from ``src``,
        which for the FP32 graph is the Q/DQ graph's: both carry the export's). The IR records its source's
        file name (``conversion_parameters``), so ``src`` is converted under the name the bundle gives it."""
        named = out_dir / _STEMS[role][2]
        source_sha256 = onnx_sha256(Path(src)) if role == "reference" else None  # of src, as build records it
        if Path(src).name != named.name:
            copy_onnx(src, named)
            src = named
        return _convert(src, role, _input_format(src), out_dir, source_sha256=source_sha256)

    def open_runner(self, model_path: Path, options: OpenVinoOptions, *, threads: int | None = None) -> Runner:
        return OpenVinoRunner(model_path, options or OpenVinoOptions(), threads)


def _settle_payoff(ctx: BuildContext, fmt: str) -> Any:
    """Time the INT8 IR against the FP32 one here and keep float what does not pay (vitedge/backends/ov_payoff.py);
    the float regions' precision it chose is stored in the IR's rt_info (``PRECISION_KEY``). None on an x86 CPU
    without VNNI/AMX, where the intel-cpu profile keeps INT8 with its stated allowance (issue 47 item 2)."""
    if read_cpu().int8_dot_product is False:  # AVX2: INT8 is known not to beat FP32 there; the profile's allowance stands
        return None
    ov = _ov()
    model_xml = ctx.out_dir / "model.xml"
    precision = float_precision_used(ov.Core(), ctx.options.device, ctx.options.float_precision)
    run = PayoffRun(qdq=ctx.qdq_path, fp32=ctx.fp32_path, model_xml=model_xml, reference_xml=ctx.out_dir / "reference.fp32.xml",
                    convert=lambda src: _convert(src, "model", fmt, ctx.out_dir), precision=precision, cpu=read_cpu().isa,
                    batches=tuple(sorted({1, *(ctx.batch_sizes or ())})), log=ctx.log)
    payoff = settle(run)
    if payoff.float_precision and payoff.float_precision != precision and not payoff.whole_model:
        model = ov.Core().read_model(str(model_xml))
        model.set_rt_info(payoff.float_precision, PRECISION_KEY)
        staged = ctx.out_dir / "model.staged.xml"
        ov.save_model(model, str(staged), compress_to_fp16=False)
        del model
        staged.replace(model_xml)
        staged.with_suffix(".bin").replace(model_xml.with_suffix(".bin"))
    return payoff


# role -> (IR stem, rt_info role, the ONNX file's name in the bundle)
_STEMS = {"model": ("model", "int8", "model.int8.onnx"), "reference": ("reference.fp32", REFERENCE_ROLE, "reference.fp32.onnx")}


def _input_format(src: Path) -> str:
    import onnx

    return get_metadata(onnx.load(str(src), load_external_data=False)).get(INPUT_FORMAT_KEY, FLOAT_NCHW)


def ir_source_sha256(xml_path: Path) -> str | None:
    """The FP32 ONNX graph's sha256 a reference IR records (``SOURCE_KEY``), read from the .xml text without
    OpenVINO; None when it records none (built by an older vitedge, or not by vitedge) or cannot be read."""
    try:
        found = _SOURCE_RE.findall(Path(xml_path).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    return found[0] if len(found) == 1 else None


def _convert(src: Path, role: str, fmt: str, out_dir: Path, *, source_sha256: str | None = None) -> Path:
    """Convert the ONNX graph ``src`` to the IR shipped for ``role`` ("model" | "reference") in ``out_dir``;
    ``source_sha256``: the FP32 graph's bytes the reference IR records in its rt_info (``SOURCE_KEY``)."""
    ov = _ov()
    stem, rt_role, _name = _STEMS[role]
    try:
        model = ov.convert_model(str(src))
    except Exception as err:
        # SIGTERM or Ctrl-C while OpenVINO's frontend runs reaches us as its own conversion error ("Check
        # 'false' failed ..."): the interrupt it swallowed is raised instead (exit 143/130, not 2)
        raise_if_interrupted()
        raise BundleError(f"OpenVINO could not convert {src.name}: {str(err).splitlines()[0][:200]}") from err
    _stable_names(model)
    model.set_rt_info(fmt, INPUT_FORMAT_KEY)
    model.set_rt_info(rt_role, ROLE_KEY)
    if source_sha256 is not None:
        model.set_rt_info(source_sha256, SOURCE_KEY)
    out = out_dir / f"{stem}.xml"
    ov.save_model(model, str(out), compress_to_fp16=False)
    return out


# A name OpenVINO made up for a node the ONNX graph did not name ("Constant_40457", "ShapeOf_47200"):
# its number is a counter global to the process, so it depends on how many models were converted before.
_GENERATED_NAME = re.compile(r"^[A-Za-z]+_\d+$")


def _stable_names(model: openvino.Model) -> None:
    """Number OpenVINO's generated node names in graph order, so that one Q/DQ graph gives the same IR bytes
    whatever the process converted before (the accuracy budget converts candidates before the build does, and
    the validation cache and `tools/bundle_diff.py` compare artifacts by their bytes). Names the ONNX graph
    gave, and every tensor name, stay as they are."""
    for index, op in enumerate(model.get_ordered_ops()):
        name = op.get_friendly_name()
        if _GENERATED_NAME.match(name):
            op.set_friendly_name(f"{name.rsplit('_', 1)[0]}_{index}")


# Runtime-graph layer types that do the matrix work (OpenVINO renames FullyConnected by version).
_COMPUTE_LAYERS = ("FullyConnected", "FullyConnectedQuantizedLegacy", "FullyConnectedQuantized", "MatMul", "Convolution")


def _int8_layer_share(compiled) -> dict[str, Any]:
    """How many executed matrix layers run in INT8 (u8/i8), read from OpenVINO's runtime graph:
    what the CPU plugin actually executes, not what the IR asked for."""
    counts: dict[str, Any] = {"int8": 0, "other": 0, "by_type": {}, "source": "openvino runtime model"}
    try:
        ops = compiled.get_runtime_model().get_ordered_ops()
    except Exception as err:  # a plugin without a runtime model: say so rather than report zeros
        return {"int8": None, "other": None, "source": f"unavailable: {str(err).splitlines()[0][:120] if str(err) else type(err).__name__}"}
    for op in ops:
        info = op.get_rt_info()
        prec = str(info["runtimePrecision"].astype(str)) if "runtimePrecision" in info else ""
        layer_type = str(info["layerType"].astype(str)) if "layerType" in info else ""
        if layer_type in _COMPUTE_LAYERS:
            key = "int8" if prec.lower() in ("i8", "u8") else "other"
            counts[key] += 1
            kernel = str(info["primitiveType"].astype(str)) if "primitiveType" in info else "?"
            row = counts["by_type"].setdefault(f"{layer_type} {prec.lower() or '?'}", {"count": 0, "kernels": []})
            row["count"] += 1
            if kernel not in row["kernels"]:
                row["kernels"].append(kernel)
    return counts
