"""A recording stand-in for the ``tensorrt`` module (and cuda-python's runtime), in three
flavours: 8.6, 10.x and 11.x. NOT TensorRT: nothing here builds or measures an engine.

What it emulates, from TensorRT's Python API docs and the 10.x -> 11.x migration guide:
* 11.x has no BuilderFlag.INT8/FP16/OBEY_PRECISION_CONSTRAINTS/PREFER_PRECISION_CONSTRAINTS
  (using them raises AttributeError), no EXPLICIT_BATCH, and its layers have no
  precision / set_output_type; STRONGLY_TYPED is accepted (and ignored: always on);
* 10.x has STRONGLY_TYPED; setting a layer's precision in a strongly typed network raises;
* 8.6 needs EXPLICIT_BATCH, has no STRONGLY_TYPED; SAME_COMPUTE_CAPABILITY exists from 10.9
  only (10.9.0 release notes), so JetPack 6's 10.3 lacks it;
* DLA cores exist only when the flavour is given some (Jetson AGX Orin / Xavier), and never
  in 11.0-11.3.

Failure is reported the way TensorRT reports it, never by raising: OnnxParser.parse_from_file
returns False and leaves IParserError objects behind ``num_errors`` / ``get_error(i)`` (for a
file that is not ONNX, and for an operator without an importer, e.g. com.microsoft ops);
Builder.build_serialized_network returns None (precision flags on a strongly typed network,
a DLA device type without DLA cores, a layer the DLA cannot run without GPU fallback, or an
injected ``fail={"build"}``); IExecutionContext.set_input_shape returns False outside the
profile; Runtime.deserialize_cuda_engine returns None for bytes of another version or not an
engine. Each failure logs an ERROR through the ILogger the caller passed, as TensorRT does.
``fail`` also takes "api" (the binding raises TypeError, as pybind11 does for a call with
wrong argument types: a bug on the caller's side), "parse" (the first node has no importer), "deserialize", "shape"
(set_input_shape returns False), "context" (create_execution_context returns None) and
"execute" (execute_async_v3 returns False).

Every builder/config/network/layer call and attribute set is appended to ``trt.calls``.
The "engine" it serialises is a JSON note carrying the ONNX graph; its execution context
runs that file with ONNX Runtime on the stand-in device memory, so the runner, the
validation and the bundle completion can be exercised end to end offline.
"""

from __future__ import annotations

import ctypes
import enum
import json
import types
from pathlib import Path

import numpy as np
import pytest

_OP_LAYER = {
    "LayerNormalization": "NORMALIZATION", "MatMul": "MATRIX_MULTIPLY", "Gemm": "MATRIX_MULTIPLY", "Conv": "CONVOLUTION",
    "Softmax": "SOFTMAX", "QuantizeLinear": "QUANTIZE", "DequantizeLinear": "DEQUANTIZE", "Add": "ELEMENTWISE",
    "Mul": "ELEMENTWISE", "Div": "ELEMENTWISE", "Sub": "ELEMENTWISE", "Pow": "ELEMENTWISE", "Erf": "UNARY", "Sqrt": "UNARY",
    "Cast": "CAST", "Transpose": "SHUFFLE", "Reshape": "SHUFFLE", "Concat": "CONCATENATION", "Gather": "GATHER",
}
_DLA_CAN_RUN = {"CONVOLUTION", "MATRIX_MULTIPLY", "QUANTIZE", "DEQUANTIZE", "ELEMENTWISE"}


def _enum(name: str, members: list[str]) -> type:
    return enum.IntEnum(name, {m: i for i, m in enumerate(members)})


class _DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    INT64 = 6


_NP = {_DataType.FLOAT: np.float32, _DataType.HALF: np.float16, _DataType.INT8: np.int8, _DataType.INT32: np.int32,
       _DataType.BOOL: np.bool_, _DataType.UINT8: np.uint8, _DataType.INT64: np.int64}


def make_fake_trt(version: str = "10.3.0", *, dla_cores: int = 0, cudart=None, stale_cache: bytes = b"stale",
                  fail=(), inspector_layers=None) -> types.ModuleType:
    major, minor = (int(p) for p in version.split(".")[:2])
    fail = set(fail)
    if major == 11 and minor < 4:
        dla_cores = 0  # no DLA in TensorRT 11.0-11.3
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.calls = []
    rec = trt.calls.append

    flags = ["FP16", "INT8", "DEBUG", "GPU_FALLBACK", "REFIT", "DISABLE_TIMING_CACHE", "TF32", "SPARSE_WEIGHTS",
             "SAFETY_SCOPE", "OBEY_PRECISION_CONSTRAINTS", "PREFER_PRECISION_CONSTRAINTS", "DIRECT_IO",
             "REJECT_EMPTY_ALGORITHMS", "VERSION_COMPATIBLE", "EXCLUDE_LEAN_RUNTIME", "FP8"]
    if major >= 10:
        flags += ["BF16", "INT4", "WEIGHT_STREAMING"]
    if major >= 11:
        flags = [f for f in flags if f not in ("FP16", "INT8", "FP8", "BF16", "INT4", "OBEY_PRECISION_CONSTRAINTS",
                                               "PREFER_PRECISION_CONSTRAINTS", "DIRECT_IO")]
    trt.BuilderFlag = _enum("BuilderFlag", flags)
    net_flags = {8: ["EXPLICIT_BATCH", "EXPLICIT_PRECISION"], 10: ["EXPLICIT_BATCH", "STRONGLY_TYPED"], 11: ["STRONGLY_TYPED"]}[major]
    trt.NetworkDefinitionCreationFlag = _enum("NetworkDefinitionCreationFlag", net_flags)
    trt.MemoryPoolType = _enum("MemoryPoolType", ["WORKSPACE", "DLA_MANAGED_SRAM", "DLA_LOCAL_DRAM", "DLA_GLOBAL_DRAM", "TACTIC_DRAM"])
    trt.DeviceType = _enum("DeviceType", ["GPU", "DLA"])
    trt.HardwareCompatibilityLevel = _enum("HardwareCompatibilityLevel",
                                           ["NONE", "AMPERE_PLUS"] + (["SAME_COMPUTE_CAPABILITY"] if (major, minor) >= (10, 9) else []))
    trt.ProfilingVerbosity = _enum("ProfilingVerbosity", ["LAYER_NAMES_ONLY", "NONE", "DETAILED"])
    trt.LayerInformationFormat = _enum("LayerInformationFormat", ["ONELINE", "JSON"])
    trt.LayerType = _enum("LayerType", sorted(set(_OP_LAYER.values()) | {"CONSTANT", "SHAPE", "OTHER"}))
    trt.TensorIOMode = _enum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"])
    trt.DataType = _DataType
    trt.float32, trt.float16, trt.int8, trt.int32 = _DataType.FLOAT, _DataType.HALF, _DataType.INT8, _DataType.INT32
    trt.nptype = lambda dt: _NP[dt]

    class _Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    class ILogger:
        Severity = _Severity
        INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = _Severity

        def __init__(self):
            pass

        def log(self, severity, msg):
            raise NotImplementedError

    class Logger(ILogger):
        def __init__(self, min_severity=_Severity.WARNING):
            self.min_severity = min_severity
            self.messages = []

        def log(self, severity, msg):
            self.messages.append((severity, msg))

    def _log(logger, severity, msg):
        rec(("logger.log", severity.name, msg))
        if logger is not None:
            logger.log(severity, msg)

    class IParserError:
        """What get_error(i) returns; str() is its one-line description, as in the bindings."""

        def __init__(self, code, desc, node=-1, name="", op=""):
            self._code, self._desc, self._node, self._name, self._op = code, desc, node, name, op

        def code(self):
            return self._code

        def desc(self):
            return self._desc

        def node(self):
            return self._node

        if major >= 10:
            def node_name(self):
                return self._name

            def node_operator(self):
                return self._op

        def __str__(self):
            if major >= 10 and self._node >= 0:
                return f"In node {self._node} with name: {self._name} and operator: {self._op} (importFallback): {self._code}: {self._desc}"
            if self._node >= 0:
                return f"In node {self._node} (importFallback): {self._code}: {self._desc}"
            return f"{self._code}: {self._desc}"

    strongly_typed_always = major >= 11

    class Layer:
        def __init__(self, name, ltype, strongly, logger=None):
            object.__setattr__(self, "_logger", logger)
            object.__setattr__(self, "name", name)
            object.__setattr__(self, "type", ltype)
            object.__setattr__(self, "num_outputs", 1)
            object.__setattr__(self, "_strongly", strongly)

        def __setattr__(self, key, value):
            if key == "precision":
                if strongly_typed_always:
                    raise AttributeError(f"'ILayer' object has no attribute 'precision' (TensorRT {version})")
                if self._strongly:  # TensorRT logs an API usage error and ignores the call
                    _log(self._logger, _Severity.ERROR, "Error Code 3: API Usage Error (setting layer precision is not allowed in a strongly typed network)")
                    return
                rec(("layer.precision", self.name, value.name))
            object.__setattr__(self, key, value)

        def set_output_type(self, index, dtype):
            if strongly_typed_always:
                raise AttributeError(f"'ILayer' object has no attribute 'set_output_type' (TensorRT {version})")
            if self._strongly:
                _log(self._logger, _Severity.ERROR, "Error Code 3: API Usage Error (setting layer output types is not allowed in a strongly typed network)")
                return
            rec(("layer.set_output_type", self.name, index, dtype.name))

    class Network:
        def __init__(self, flags):
            self.flags = flags
            self.strongly_typed = strongly_typed_always or (
                "STRONGLY_TYPED" in trt.NetworkDefinitionCreationFlag.__members__
                and bool(flags & (1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))))
            if major < 10 and not flags & (1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)):
                raise RuntimeError("TensorRT 8.x ONNX networks need EXPLICIT_BATCH")
            self.layers = []
            self.onnx = None
            self.input = None

        @property
        def num_layers(self):
            return len(self.layers)

        def get_layer(self, i):
            return self.layers[i]

    class OnnxParser:
        def __init__(self, network, logger):
            self.network = network
            self.logger = logger
            self.errors = []

        @property
        def num_errors(self):
            return len(self.errors)

        def get_error(self, i):
            return self.errors[i]

        def clear_errors(self):
            self.errors = []

        def _fail(self, error):
            self.errors.append(error)
            _log(self.logger, _Severity.ERROR, f"ModelImporter.cpp: ERROR: {error}")
            return False

        def parse_from_file(self, path):
            import onnx

            rec(("parser.parse_from_file", Path(path).name))
            try:
                model = onnx.load(str(path), load_external_data=False)
            except Exception:
                return self._fail(IParserError("MODEL_DESERIALIZE_FAILED", f"Failed to parse ONNX model from file: {path}"))
            layer_type = trt.LayerType
            if "parse" in fail and model.graph.node:  # an op this TensorRT has no importer for
                node = model.graph.node[0]
                return self._fail(IParserError("UNSUPPORTED_NODE", f"No importer registered for op: {node.op_type}", 0,
                                               node.name, node.op_type))
            for index, node in enumerate(model.graph.node):
                if node.domain not in ("", "ai.onnx"):
                    return self._fail(IParserError("UNSUPPORTED_NODE", f"No importer registered for op: {node.op_type}",
                                                   index, node.name, node.op_type))
                if node.op_type == "Constant":
                    continue
                kind = _OP_LAYER.get(node.op_type, "OTHER")
                self.network.layers.append(Layer(node.name or node.output[0], getattr(layer_type, kind), self.network.strongly_typed,
                                                 self.logger))
            self.network.onnx = str(path)
            self.network.input = model.graph.input[0].name
            return True

    class TimingCache:
        def __init__(self, blob):
            self.blob = bytes(blob)

        def serialize(self):
            return b"timing-cache:" + version.encode() + b":" + self.blob[-8:]

    class Profile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, name, lo, opt, hi):
            rec(("profile.set_shape", name, tuple(lo), tuple(opt), tuple(hi)))
            self.shapes[name] = (tuple(lo), tuple(opt), tuple(hi))

    class IBuilderConfig:
        _attrs = {"builder_optimization_level", "default_device_type", "DLA_core", "hardware_compatibility_level",
                  "profiling_verbosity", "max_workspace_size", "int8_calibrator"}
        # pybind11 exposes these as class-level properties: feature detection looks for them
        builder_optimization_level = 3
        default_device_type = None
        DLA_core = -1
        hardware_compatibility_level = None
        profiling_verbosity = None

        def __init__(self):
            object.__setattr__(self, "flags", set())
            object.__setattr__(self, "profiles", [])
            object.__setattr__(self, "cache", None)
            object.__setattr__(self, "values", {})

        def __setattr__(self, key, value):
            if key not in self._attrs:
                raise AttributeError(f"IBuilderConfig has no attribute {key}")
            if key == "int8_calibrator" and major >= 11:
                raise AttributeError("int8_calibrator was removed in TensorRT 11")
            rec((f"config.{key}", getattr(value, "name", value)))
            self.values[key] = value

        def __getattr__(self, key):
            values = object.__getattribute__(self, "values")
            if key in values:
                return values[key]
            raise AttributeError(key)

        def set_flag(self, flag):
            assert isinstance(flag, trt.BuilderFlag), flag
            rec(("config.set_flag", flag.name))
            self.flags.add(flag.name)

        def clear_flag(self, flag):
            rec(("config.clear_flag", flag.name))
            self.flags.discard(flag.name)

        def get_flag(self, flag):
            return flag.name in self.flags

        def set_memory_pool_limit(self, pool, size):
            rec(("config.set_memory_pool_limit", pool.name, int(size)))

        def add_optimization_profile(self, profile):
            rec(("config.add_optimization_profile",))
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def can_run_on_DLA(self, layer):
            return layer.type.name in _DLA_CAN_RUN

        def create_timing_cache(self, blob):
            rec(("config.create_timing_cache", bytes(blob)))
            return TimingCache(blob)

        def set_timing_cache(self, cache, ignore_mismatch):
            rec(("config.set_timing_cache", bool(ignore_mismatch)))
            if cache.blob == stale_cache:
                return False
            object.__setattr__(self, "cache", cache)
            return True

        def get_timing_cache(self):
            return self.cache

    class Builder:
        def __init__(self, logger):
            self.num_DLA_cores = dla_cores
            self.logger = logger

        def create_network(self, flags=0):
            rec(("builder.create_network", int(flags)))
            return Network(flags)

        def create_builder_config(self):
            return IBuilderConfig()

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            rec(("builder.build_serialized_network",))

            def failed(msg):
                _log(self.logger, _Severity.ERROR, msg)
                return None

            if "build" in fail:
                return failed("[defaultAllocator.cpp::allocate] Error Code 1: Cuda Runtime (out of memory)")
            if "api" in fail:  # what pybind11 raises when a binding is called with the wrong types: a vitedge bug
                raise TypeError("build_serialized_network(): incompatible function arguments. The following argument types are supported:\n"
                                "    1. (self: tensorrt.Builder, network: tensorrt.INetworkDefinition, config: tensorrt.IBuilderConfig)")
            if major < 11 and network.strongly_typed and config.flags & {"INT8", "FP16"}:
                return failed("Error Code 4: API Usage Error (precision flags are not allowed with a strongly typed network)")
            lo, _opt, hi = config.profiles[0].shapes[network.input]
            dla = config.values.get("default_device_type") == trt.DeviceType.DLA
            if dla and self.num_DLA_cores == 0:
                return failed("Error Code 2: Internal Error (DLA requested but no DLA is available on this device)")
            if dla and "GPU_FALLBACK" not in config.flags:
                bad = [layer.name for layer in network.layers if not config.can_run_on_DLA(layer)]
                if bad:
                    return failed(f"Error Code 2: Internal Error ({bad[0]} cannot run on DLA and GPU fallback is off)")
            import base64

            onnx_bytes = base64.b64encode(Path(network.onnx).read_bytes()).decode()  # the "engine" carries its graph
            note = {"fake_tensorrt_engine": version, "onnx": onnx_bytes, "input": network.input, "min": lo, "max": hi,
                    "layers": [[layer.name, layer.type.name, bool(dla and config.can_run_on_DLA(layer)), _dtypes(layer, config)]
                               for layer in network.layers],
                    "version_compatible": "VERSION_COMPATIBLE" in config.flags}
            return json.dumps(note).encode()

    def _dtypes(layer, config):
        """(input, output) "Format/Datatype" texts: INT8 around Q/DQ, the float precision elsewhere."""
        pinned = getattr(layer, "precision", None) == _DataType.FLOAT
        flt = "FP32" if pinned or "FP16" not in config.flags else "FP16"
        kind = layer.type.name
        return ({"QUANTIZE": flt, "DEQUANTIZE": "Int8"}.get(kind, flt),
                {"QUANTIZE": "Int8", "DEQUANTIZE": flt}.get(kind, flt))

    class EngineInspector:
        def __init__(self, note):
            self.note = note

        def get_engine_information(self, fmt):
            rec(("inspector.get_engine_information", fmt.name))
            if inspector_layers is not None:  # a recorded inspector output, as a real engine would give
                return json.dumps({"Layers": inspector_layers, "Bindings": []})
            return json.dumps({"Layers": [
                {"Name": n, "LayerType": ("DLA" if on_dla else t), "Inputs": [{"Format/Datatype": f"Row major linear {din}"}],
                 "Outputs": [{"Format/Datatype": f"Row major linear {dout}"}]}
                for n, t, on_dla, (din, dout) in self.note["layers"]]})

    class IExecutionContext:
        def __init__(self, engine):
            self.engine = engine
            self.shapes = {}
            self.addresses = {}

        def set_input_shape(self, name, shape):
            lo, hi = self.engine.note["min"], self.engine.note["max"]
            if "shape" in fail or not lo[0] <= shape[0] <= hi[0]:
                _log(self.engine.logger, _Severity.ERROR, f"IExecutionContext::setInputShape: Error Code 3: API Usage Error "
                     f"(batch {shape[0]} is outside the optimization profile {lo[0]}-{hi[0]})")
                return False
            self.shapes[name] = tuple(shape)
            return True

        def get_tensor_shape(self, name):
            if name == self.engine.input:
                return self.shapes[name]
            return (self.shapes[self.engine.input][0],) + tuple(self.engine.out_shape[1:])

        def set_tensor_address(self, name, ptr):
            self.addresses[name] = int(ptr)
            return True

        def execute_async_v3(self, stream):
            if "execute" in fail:
                return False
            e = self.engine
            shape = self.shapes[e.input]
            x = cudart.read(self.addresses[e.input], shape, e.in_dtype)
            y = e.session.run(None, {e.input: x})[0]
            cudart.write(self.addresses[e.output], np.ascontiguousarray(y.astype(e.out_dtype)))
            return True

    class ICudaEngine:
        def __init__(self, note, logger=None):
            self.note = note
            self.logger = logger
            self._session = None

        @property
        def session(self):
            if self._session is None:  # ONNX Runtime stands in for the GPU kernels
                import base64

                import onnxruntime as ort

                self._session = ort.InferenceSession(base64.b64decode(self.note["onnx"]), providers=["CPUExecutionProvider"])
                i, o = self._session.get_inputs()[0], self._session.get_outputs()[0]
                self.input, self.output = i.name, o.name
                self.in_dtype = np.uint8 if "uint8" in i.type else np.float32
                self.out_dtype = np.float32
                self.in_shape = (-1,) + tuple(self.note["min"][1:])
                self.out_shape = (-1,) + tuple(o.shape[1:])
            return self._session

        def __getattr__(self, key):
            if key in ("input", "output", "in_dtype", "out_dtype", "in_shape", "out_shape"):
                self.session  # noqa: B018 - fills them in
                return self.__dict__[key]
            raise AttributeError(key)

        num_io_tensors = 2

        def get_tensor_name(self, i):
            return (self.input, self.output)[i]

        def get_tensor_mode(self, name):
            return trt.TensorIOMode.INPUT if name == self.input else trt.TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name):
            dt = self.in_dtype if name == self.input else self.out_dtype
            return {np.float32: _DataType.FLOAT, np.uint8: _DataType.UINT8}[dt]

        def get_tensor_shape(self, name):
            return self.in_shape if name == self.input else self.out_shape

        def get_tensor_profile_shape(self, name, index):
            return tuple(self.note["min"]), tuple(self.note["min"]), tuple(self.note["max"])

        def create_execution_context(self):
            if "context" in fail:
                _log(self.logger, _Severity.ERROR, "Error Code 1: Cuda Runtime (out of memory)")
                return None
            return IExecutionContext(self)

        def create_engine_inspector(self):
            return EngineInspector(self.note)

    class Runtime:
        def __init__(self, logger):
            self.logger = logger
            self.engine_host_code_allowed = False

        def deserialize_cuda_engine(self, data):
            def failed(msg):
                _log(self.logger, _Severity.ERROR, msg)
                return None

            if "deserialize" in fail:
                return failed("1: [runtime.cpp::deserializeCudaEngine] Error Code 1: Serialization (engine plan is corrupt)")
            try:
                note = json.loads(bytes(data).decode())
            except (ValueError, UnicodeDecodeError):
                return failed("1: [stdArchiveReader.cpp] Error Code 1: Serialization (Magic tag does not match)")
            if not isinstance(note, dict) or note.get("fake_tensorrt_engine") != version:
                return failed("1: [stdArchiveReader.cpp] Error Code 1: Serialization (Version tag does not match)")
            if note.get("version_compatible") and not self.engine_host_code_allowed:
                return failed("1: [runtime.cpp] Error Code 1: version-compatible plan needs engine_host_code_allowed")
            return ICudaEngine(note, self.logger)

    for cls in (ILogger, Logger, IParserError, Builder, OnnxParser, Runtime, IBuilderConfig, IExecutionContext, ICudaEngine,
                EngineInspector):
        setattr(trt, cls.__name__, cls)
    return trt


class _CudaError(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorMemoryAllocation = 2


def make_fake_cudart(*, gpu: bytes = b"Stand-in GPU (not a real device)", cc=(8, 7), runtime: int = 12020):
    """cuda-python's runtime API over host memory: (error, value) tuples like the real one."""
    ok = _CudaError.cudaSuccess
    mem: dict[int, np.ndarray] = {}
    rt = types.SimpleNamespace()
    rt.cudaError_t = _CudaError
    rt.cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2)
    rt.allocations = mem
    counter = [0x1000]

    def cudaMalloc(n):
        counter[0] += 0x10000
        mem[counter[0]] = np.zeros(int(n), np.uint8)
        return ok, counter[0]

    def cudaFree(ptr):
        mem.pop(int(ptr), None)
        return (ok,)

    def cudaMemcpyAsync(dst, src, count, kind, stream):
        if kind == 1:
            mem[int(dst)][:count] = np.frombuffer(ctypes.string_at(src, count), np.uint8)
        else:
            ctypes.memmove(dst, mem[int(src)].ctypes.data, count)
        return (ok,)

    def read(ptr, shape, dtype):
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return mem[ptr][:n].view(dtype).reshape(shape).copy()

    def write(ptr, array):
        mem[ptr][: array.nbytes] = array.view(np.uint8).reshape(-1)

    props = types.SimpleNamespace(name=gpu, major=cc[0], minor=cc[1])
    rt.cudaMalloc, rt.cudaFree, rt.cudaMemcpyAsync, rt.read, rt.write = cudaMalloc, cudaFree, cudaMemcpyAsync, read, write
    rt.cudaStreamCreate = lambda: (ok, 7)
    rt.cudaStreamSynchronize = lambda s: (ok,)
    rt.cudaStreamDestroy = lambda s: (ok,)
    rt.cudaGetDeviceCount = lambda: (ok, 1)
    rt.cudaGetDeviceProperties = lambda d: (ok, props)
    rt.cudaRuntimeGetVersion = lambda: (ok, runtime)
    rt.cudaDriverGetVersion = lambda: (ok, runtime)
    return rt


def skip_if_real_tensorrt(reason: str) -> None:
    """Skip the calling test where a real TensorRT is installed: it is about the GPU-less bundle
    that the stand-in completes (``reason`` says why)."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return
    pytest.skip(f"TensorRT is installed here: {reason}")
