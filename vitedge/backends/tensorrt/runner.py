"""Run a TensorRT engine behind vitedge's Runner interface.

Device memory and the stream come from cuda-python (``cuda.bindings.runtime``, or the
older ``cuda.cudart``), as in TensorRT's own samples; no torch, no pycuda. I/O tensors
are bound by name (``num_io_tensors``, ``set_input_shape``, ``set_tensor_address``,
``execute_async_v3``), which every supported version has; the binding-index API
(``execute_async_v2``, ``get_binding_*``) is gone from 10.0 (surface/*.json). Batches larger than the engine's
optimization profile are split, smaller than its minimum are padded.

Before deserialising, the runner compares the device with the facts recorded beside the
engine (engine_facts.json) and refuses a mismatch with IncompatibleEngineError.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from vitedge.backends.base import Runner
from vitedge.backends.tensorrt.apply import last_error, make_logger
from vitedge.backends.tensorrt.device import (
    DeviceFacts,
    check_engine_facts,
    cuda_call,
    cudart_module,
    read_device_facts,
    read_facts_file,
)
from vitedge.backends.tensorrt.plan import TensorRtOptions
from vitedge.core.errors import BundleError, MissingDependencyError
from vitedge.onnxkit.metadata import FLOAT_NCHW, UINT8_NHWC_RGB

INSTALL = "on the device: pip install 'vitedge[tensorrt]' (x86_64), or JetPack's python3-libnvinfer on Jetson"


def import_tensorrt() -> Any:
    try:
        import tensorrt
    except ImportError:
        raise MissingDependencyError("TensorRT", INSTALL) from None
    return tensorrt


def _handle(obj: Any) -> int:
    """A cuda-python stream / pointer object as the integer TensorRT takes."""
    if isinstance(obj, int):
        return obj
    try:
        return int(obj)
    except TypeError:
        return int(obj.getPtr())


class _Tensor:
    def __init__(self, name: str, index: int, is_input: bool, dtype: np.dtype, shape: tuple[int, ...]):
        self.name, self.index, self.is_input, self.dtype, self.shape = name, index, is_input, np.dtype(dtype), shape
        self.ptr = 0
        self.capacity = 0


class TensorRtRunner(Runner):
    backend_name = "tensorrt"

    def __init__(self, model_path: Path, options: TensorRtOptions | None = None, *, trt: ModuleType | None = None, cudart: ModuleType | None = None,
                 device_facts: DeviceFacts | None = None, check_device: bool = True):
        self.model_path = Path(model_path)
        self.options = options
        self._trt, self._cudart, self._facts = trt, cudart, device_facts
        self.check_device = check_device
        self.relaxed: list[str] = []
        self.engine = self.context = self.stream = None
        self.tensors: list[_Tensor] = []
        self.min_batch = self.max_batch = 1

    # -- open / close -------------------------------------------------------------------------
    def open(self) -> None:
        trt = self._trt if self._trt is not None else import_tensorrt()
        if self._cudart is None:
            try:
                self._cudart = cudart_module()
            except ImportError:
                raise MissingDependencyError("cuda-python (device memory and streams for TensorRT)", "pip install cuda-python") from None
        cudart = self._cudart
        record = read_facts_file(self.model_path.parent) if self.check_device else None
        if record is not None:
            current = self._facts if self._facts is not None else read_device_facts(trt, cudart)
            self.relaxed = check_engine_facts(record, current, engine=self.model_path.name)
        if not self.model_path.is_file():
            raise BundleError(f"{self.model_path} does not exist; build the engine on the device with `vitedge engine BUNDLE`")

        self._logger = logger = make_logger(trt)
        runtime = trt.Runtime(logger)
        if record and record.get("version_compatible") and hasattr(runtime, "engine_host_code_allowed"):
            runtime.engine_host_code_allowed = True  # version-compatible engines embed the lean runtime
        self.engine = runtime.deserialize_cuda_engine(self.model_path.read_bytes())
        if self.engine is None:
            raise BundleError(f"TensorRT {getattr(trt, '__version__', '?')} could not deserialise {self.model_path.name}"
                              f"{self._why()} (built by another TensorRT version or for another GPU?); "
                              "rebuild it with `vitedge engine BUNDLE --force`")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise BundleError(f"TensorRT could not create an execution context for {self.model_path.name}{self._why()} "
                              "(usually out of GPU memory: close other GPU programs or lower workspace_mb and rebuild)")
        self.tensors = self._io_tensors(trt)
        inp = self._input()
        self.input_name = inp.name
        dims = inp.shape
        if inp.dtype == np.uint8:
            self.input_format = UINT8_NHWC_RGB
            hw = (dims[1], dims[2])
        else:
            self.input_format = FLOAT_NCHW
            hw = (dims[2], dims[3])
        self.input_hw = tuple(int(d) for d in hw) if all(int(d) > 0 for d in hw) else None
        c = int(dims[3] if self.input_format == UINT8_NHWC_RGB else dims[1])
        self.input_channels = c if c > 0 else 3
        self.stream = cuda_call(cudart.cudaStreamCreate(), "cudaStreamCreate")

    def _why(self) -> str:

        why = last_error(getattr(self, "_logger", None))
        return f": {why}" if why else ""

    def _io_tensors(self, trt: ModuleType) -> list[_Tensor]:
        e = self.engine
        out: list[_Tensor] = []
        for i in range(e.num_io_tensors):
            name = e.get_tensor_name(i)
            is_input = e.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            out.append(_Tensor(name, i, is_input, trt.nptype(e.get_tensor_dtype(name)), tuple(e.get_tensor_shape(name))))
            if is_input:
                lo, _opt, hi = e.get_tensor_profile_shape(name, 0)
                self.min_batch, self.max_batch = int(lo[0]), int(hi[0])
        if sum(t.is_input for t in out) != 1 or not any(not t.is_input for t in out):
            raise BundleError(f"{self.model_path.name} must have one input and at least one output")
        return out

    def _input(self) -> _Tensor:
        return next(t for t in self.tensors if t.is_input)

    def close(self) -> None:
        cudart = self._cudart
        for t in self.tensors:
            if t.ptr and cudart is not None:
                cudart.cudaFree(t.ptr)
            t.ptr, t.capacity = 0, 0
        if self.stream is not None and cudart is not None:
            cudart.cudaStreamDestroy(self.stream)
        self.stream = None
        self.context = None
        self.engine = None

    # -- inference ----------------------------------------------------------------------------
    def _ensure(self, t: _Tensor, nbytes: int) -> None:
        if t.capacity >= nbytes:
            return
        if t.ptr:
            cuda_call(self._cudart.cudaFree(t.ptr), "cudaFree")
        t.ptr = _handle(cuda_call(self._cudart.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
        t.capacity = nbytes

    def _infer_impl(self, batch: np.ndarray) -> np.ndarray:
        if self.context is None:
            self.open()
        outs = []
        for start in range(0, batch.shape[0], self.max_batch):
            outs.append(self._run_chunk(batch[start:start + self.max_batch]))
        return np.concatenate(outs, axis=0)

    def _run_chunk(self, chunk: np.ndarray) -> np.ndarray:
        cudart, ctx = self._cudart, self.context
        n = chunk.shape[0]
        if n < self.min_batch:  # the profile starts above this batch: pad with copies of the last sample
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], self.min_batch - n, axis=0)])
        inp = self._input()
        x = np.ascontiguousarray(chunk, dtype=inp.dtype)
        ok = ctx.set_input_shape(inp.name, tuple(x.shape))
        if ok is False:  # TensorRT returns False (and logs why) for a shape outside the optimization profile
            raise BundleError(f"TensorRT rejected input shape {tuple(x.shape)} for {self.model_path.name} (its profile takes "
                              f"batch {self.min_batch}-{self.max_batch}){self._why()}; rebuild the engine for these batch sizes")
        self._ensure(inp, x.nbytes)
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        cuda_call(cudart.cudaMemcpyAsync(inp.ptr, x.ctypes.data, x.nbytes, h2d, self.stream), "cudaMemcpyAsync")
        outputs: list[tuple[_Tensor, np.ndarray]] = []
        for t in self.tensors:
            if t.is_input:
                continue
            shape = tuple(ctx.get_tensor_shape(t.name))
            host = np.empty(shape, dtype=t.dtype)
            self._ensure(t, host.nbytes)
            outputs.append((t, host))
        stream = _handle(self.stream)
        for t in self.tensors:
            if ctx.set_tensor_address(t.name, t.ptr) is False:
                raise BundleError(f"TensorRT refused the device address of '{t.name}' in {self.model_path.name}{self._why()}")
        ok = ctx.execute_async_v3(stream)
        if ok is False:
            raise BundleError(f"TensorRT failed to run {self.model_path.name} on a batch of {x.shape[0]}{self._why()}")
        for t, host in outputs:
            cuda_call(cudart.cudaMemcpyAsync(host.ctypes.data, t.ptr, host.nbytes, d2h, self.stream), "cudaMemcpyAsync")
        cuda_call(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        first = outputs[0][1]
        return np.asarray(first[:n], dtype=np.float32)
