"""TensorRT backend: the desktop-gpu, jetson-orin and jetson-orin-nano targets.

The engine is built from the same Q/DQ graph every other target uses (explicit
quantization: INT8 comes from the graph's QuantizeLinear/DequantizeLinear pairs, never
from a calibrator). An engine is specific to the GPU, TensorRT version and platform it
is built on, so:

* with TensorRT and a CUDA GPU here, ``build`` writes ``model.engine`` (and the FP32
  reference engine the parity check compares against, plus the timing cache) and the
  pipeline validates it like any target;
* without them, ``build`` still writes the bundle with the checked Q/DQ graph,
  ``build_plan.json`` and ``trtexec.txt``, and reports that the engine was not built;
  ``vitedge engine BUNDLE`` on the device builds, validates and completes it.

Modules: plan (settings -> BuildPlan, trtexec line), build (apply_plan:
the TensorRT API calls), typed (the strongly typed cast graph for TensorRT 10.12+),
device (device facts and the engine compatibility check), runner
(TensorRtRunner on cuda-python), bundle (plan files, on-device build). Completing a
bundle on the device (`vitedge engine`) is the application layer's job: vitedge.app.engine_completion.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from vitedge.backends.base import GPU, Backend, BackendFacts, BuildContext, BuiltArtifact, EnvironmentStatus, Runner
from vitedge.backends.tensorrt.bundle import (
    build_on_device,
    load_checked_graph,
    offline_info,
    plan_bundle,
)
from vitedge.backends.tensorrt.device import DeviceFacts, cudart_module, read_device_facts
from vitedge.backends.tensorrt.family import build_family
from vitedge.backends.tensorrt.members import FamilyOptions
from vitedge.backends.tensorrt.plan import (
    ENGINE,
    REFERENCE_ENGINE,
    TensorRtOptions,
    assumed_capabilities,
    capabilities_from_module,
)
from vitedge.backends.tensorrt.report import report_lines
from vitedge.backends.tensorrt.runner import TensorRtRunner
from vitedge.core.errors import MissingDependencyError

INSTALL_HINT = ("on the device: pip install 'vitedge[tensorrt]' --extra-index-url https://pypi.nvidia.com "
                "(desktop GPUs), or JetPack's python3-libnvinfer on a Jetson (sudo apt install python3-libnvinfer)")
GPU_HINT = "build the engine where the NVIDIA GPU is (on a Jetson, the Jetson itself): vitedge engine BUNDLE"


class TensorRtBackend(Backend[TensorRtOptions]):
    name = "tensorrt"
    options_type = TensorRtOptions
    # builds_without_runtime: the pipeline may call build() where check_environment() says it
    # cannot build; the bundle then holds the plan, and the engine is built on the device.
    # runs_qdq_graph is False: its runner opens engines, so the accuracy budget runs elsewhere.
    facts = BackendFacts(runtime="TensorRT", runs_on=GPU, runtime_modules=("tensorrt",), install_hint=INSTALL_HINT,
                         runtime_install="JetPack's python3-libnvinfer on a Jetson; elsewhere pip install tensorrt cuda-python",
                         runtime_extra="tensorrt", builds_without_runtime=True, runs_qdq_graph=False,
                         triton_platform="tensorrt_plan")

    def check_environment(self) -> EnvironmentStatus:
        try:
            import tensorrt as trt
        except ImportError:
            return EnvironmentStatus(False, False, "TensorRT is not installed", INSTALL_HINT)
        version = getattr(trt, "__version__", "?")
        try:
            cudart = cudart_module()
        except ImportError:
            return EnvironmentStatus(False, False, f"TensorRT {version} is installed but cuda-python is not",
                                     "pip install 'cuda-python>=12.0,<14' (vitedge uses it for device memory and streams)")
        except MissingDependencyError as err:
            return EnvironmentStatus(False, False, f"TensorRT {version} is installed but {err}", None)
        try:
            result = cudart.cudaGetDeviceCount()
            err, count = int(result[0]), int(result[1] or 0)
            err_name = getattr(result[0], "name", str(result[0]))
        except Exception as exc:  # a broken driver install
            err, count, err_name = 1, 0, type(exc).__name__
        if err != 0 or count == 0:
            why = f"CUDA reports {err_name}" if err != 0 else "CUDA sees 0 devices"
            return EnvironmentStatus(False, False, f"no CUDA GPU ({why}; TensorRT {version} is installed)", GPU_HINT)

        return EnvironmentStatus(True, True, read_device_facts(trt, cudart).describe())

    def versions(self) -> dict[str, str]:
        try:
            import tensorrt as trt
        except ImportError:
            return {}
        return {"tensorrt": str(getattr(trt, "__version__", "?"))}

    def timing_device(self) -> dict[str, Any]:
        try:
            import tensorrt as trt
        except ImportError:
            trt = None
        return read_device_facts(trt).timing_device()

    def report_lines(self, backend_info: dict[str, Any]) -> list[str]:

        return report_lines(backend_info)

    def build(self, ctx: BuildContext[TensorRtOptions]) -> BuiltArtifact:


        if isinstance(ctx.options, FamilyOptions):  # --target jetson / nvidia-gpu: plans for every member

            return build_family(ctx, self._offline_capabilities)
        say = ctx.log or (lambda _m: None)
        options: TensorRtOptions = ctx.options or TensorRtOptions()
        model = load_checked_graph(ctx.qdq_path)  # fails loudly if the graph breaks a TensorRT Q/DQ rule
        say("Q/DQ graph passes TensorRT's explicit-quantization rules (symmetric INT8, per-channel weights, float residuals)")
        env = self.check_environment()
        if env.can_build:
            import tensorrt as trt

            info, extra = build_on_device(trt, ctx.out_dir, options, tuple(ctx.batch_sizes), log=say)
            return BuiltArtifact(model=ENGINE, reference=REFERENCE_ENGINE, extra_files=extra, built=True, info=info)
        caps = self._offline_capabilities(options)
        planned = plan_bundle(ctx.out_dir, options, tuple(ctx.batch_sizes), caps, model=model)
        for w in planned.attention_warnings:
            say("warning: " + w)
        assumed = " (assumed: set trt_major in the profile to plan for another)" if caps.assumed else ""
        say(f"TensorRT engine not built here ({env.detail}); wrote {', '.join(planned.files)} for TensorRT {caps.version}{assumed}")
        return BuiltArtifact(model=ENGINE, reference=REFERENCE_ENGINE, extra_files=list(planned.files), built=False,
                             info=offline_info(planned, env.detail, env.install_hint))

    @staticmethod
    def _offline_capabilities(options: TensorRtOptions):
        if options.trt_major:
            return assumed_capabilities(options.trt_major)
        try:
            import tensorrt as trt
        except ImportError:
            return assumed_capabilities(0)
        return capabilities_from_module(trt)  # TensorRT is here, only the GPU is missing

    def open_runner(self, model_path: Path, options: TensorRtOptions, *, threads: int | None = None) -> Runner:

        return TensorRtRunner(model_path, options or TensorRtOptions())


class BoundTensorRtBackend(TensorRtBackend):
    """The TensorRT backend on given modules: the tensorrt and cuda-python found on the device
    (or the recording stand-in), and the facts of that device, as `vitedge engine` builds with."""

    def __init__(self, trt: ModuleType, cudart: ModuleType | None = None, facts: DeviceFacts | None = None):
        self.trt, self.cudart, self.device_facts = trt, cudart, facts  # `facts` is the backend's own (BackendFacts)

    def check_environment(self) -> EnvironmentStatus:
        detail = (self.device_facts.describe() if self.device_facts is not None
                  else f"TensorRT {getattr(self.trt, '__version__', '?')}")
        return EnvironmentStatus(True, True, detail)

    def versions(self) -> dict[str, str]:
        return {"tensorrt": str(getattr(self.trt, "__version__", "?"))}

    def timing_device(self) -> dict[str, Any]:
        facts = self.device_facts if self.device_facts is not None else read_device_facts(self.trt, self.cudart)
        return facts.timing_device()

    def open_runner(self, model_path: Path, options: TensorRtOptions, *, threads: int | None = None) -> Runner:

        return TensorRtRunner(model_path, options or TensorRtOptions(), trt=self.trt, cudart=self.cudart,
                              device_facts=self.device_facts)
