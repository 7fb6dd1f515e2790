"""A recording stand-in for the ``tensorrt`` module (and cuda-python's runtime), for every TensorRT
version vitedge supports. NOT TensorRT: nothing here builds or measures an engine.

Its API is exactly the one recorded from NVIDIA's real bindings of that version
(vitedge/backends/tensorrt/surface/<major>.<minor>.json, tools/trt_surface.py): every enum has
exactly the recorded values, every recorded class exists with exactly the recorded public members,
and nothing else. Members the stand-in does not emulate are there (so ``hasattr`` answers as on the
real module) but raise NotImplementedError when called; names the version lacks raise AttributeError
(e.g. ``IBuilderConfig.max_workspace_size`` on 10+, ``BuilderFlag.INT8`` on 11). ``_conform`` enforces
this when the module is made, and tests/backends/trt/test_tensorrt_surface.py checks it for every version.

Behaviour it emulates, from TensorRT's Python API docs and the migration guides:
* 11.x has no BuilderFlag.INT8/FP16/OBEY_PRECISION_CONSTRAINTS/PREFER_PRECISION_CONSTRAINTS
  (using them raises AttributeError), no EXPLICIT_BATCH, and its layers have no
  precision / set_output_type; every network is strongly typed, STRONGLY_TYPED is accepted (its
  docstring: deprecated, always on, ignored);
* 10.x has STRONGLY_TYPED; setting a layer's precision in a strongly typed network raises;
* 8.6 needs EXPLICIT_BATCH, has no STRONGLY_TYPED; SAME_COMPUTE_CAPABILITY exists from 10.9
  only (10.9.0 release notes), so JetPack 6's 10.3 lacks it;
* DLA cores exist only when the flavour is given some (Jetson AGX Orin / Xavier), and only in the
  releases that build for the DLA (versions.dla_available: 8.6-10.7 and 11.4.1+). The DLA takes
  static shapes only: a DLA build whose profile has min != max returns None with a logged error
  (the wording is the stand-in's), and can_run_on_DLA answers False for every layer then;
* the engine inspector reports, like the real one, "N/A due to dynamic shapes" for every tensor
  format of an engine with a dynamic profile unless an execution context with its input shape set
  is bound (``inspector.execution_context = context``); 10.x writes "Bindings" (names) and
  "Format/Datatype", 11.x writes "I/O Tensors" (objects, "DataType", TensorRT 11 IEngineInspector
  migration guide) and, per layer tensor, a "Format" without the type and a separate "Datatype"
  (the spelling NVIDIA's own readers of 11.x records use, issue #44).

Failure is reported the way TensorRT reports it, never by raising: OnnxParser.parse_from_file
returns False and leaves ParserError objects (the bindings' name) behind ``num_errors`` / ``get_error(i)`` (for a
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


_PYTHON_SIDE = {"nptype", "calls"}  # tensorrt/__init__.py's helper (not in tensorrt.so) and the call record
_ALWAYS = {"__init__", "__getitem__", "__len__", "__enter__", "__exit__"}


def _surface(major: int, minor: int) -> dict:
    from vitedge.backends.tensorrt.versions import load_surface

    return load_surface(f"{major}.{minor}")


def _unemulated(cls_name: str, member: str):
    def stub(*_args, **_kwargs):
        raise NotImplementedError(f"the TensorRT stand-in does not emulate {cls_name}.{member} (it exists in the real bindings)")

    stub.__name__ = member
    return stub


def _conform(trt, surface: dict) -> None:
    """Give every recorded class exactly its recorded public members: add the ones the stand-in does not
    emulate as stubs that raise NotImplementedError, and fail if the stand-in defines one the real
    bindings of this version lack (the stand-in must never accept what TensorRT would refuse)."""
    version = trt.__version__
    for cls_name, entry in surface["classes"].items():
        if entry["kind"] == "enum":
            continue
        cls = trt.__dict__.get(cls_name)
        if cls is None:
            cls = type(cls_name, (), {"__init__": _unemulated(cls_name, "__init__")})
            setattr(trt, cls_name, cls)
        wanted = {m for m in entry["members"] if not m.startswith("__")}
        extra = {n for n in dir(cls) if not n.startswith("_")} - wanted
        if extra:
            raise AssertionError(f"the stand-in's {cls_name} defines {sorted(extra)}, absent from TensorRT {version}'s bindings")
        for member in wanted:
            if not hasattr(cls, member):
                setattr(cls, member, _unemulated(cls_name, member))
    recorded = set(surface["classes"]) | set(surface["functions"]) | set(surface["values"])
    extra = {n for n in vars(trt) if not n.startswith("_")} - recorded - _PYTHON_SIDE
    if extra:
        raise AssertionError(f"the stand-in module defines {sorted(extra)}, absent from TensorRT {version}'s bindings")
    for name in set(surface["functions"]) - set(vars(trt)):
        setattr(trt, name, _unemulated("tensorrt", name))
    for name in set(surface["values"]) - set(vars(trt)):
        setattr(trt, name, None)


def make_fake_trt(version: str = "10.3.0", *, dla_cores: int = 0, cudart=None, stale_cache: bytes = b"stale",
                  fail=(), inspector_layers=None) -> types.ModuleType:
    from vitedge.backends.tensorrt.versions import dla_available, parse_release

    major, minor, _patch = parse_release(version)
    fail = set(fail)
    if not dla_available(parse_release(version)):
        dla_cores = 0  # this release does not build for the DLA (10.8-11.4.0)
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.calls = []
    rec = trt.calls.append

    surface = _surface(major, minor)
    for cls_name, entry in surface["classes"].items():  # every enum with exactly its recorded values
        if entry["kind"] == "enum":
            setattr(trt, cls_name, _enum(cls_name, entry["values"]))
    data_type = trt.DataType
    for alias, member in (("float32", "FLOAT"), ("float16", "HALF"), ("int8", "INT8"), ("int32", "INT32"), ("uint8", "UINT8"),
                          ("bool", "BOOL"), ("int64", "INT64")):
        if alias in surface["values"]:
            setattr(trt, alias, getattr(data_type, member))
    _np = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32, "BOOL": np.bool_, "UINT8": np.uint8,
           "INT64": np.int64}
    trt.nptype = lambda dt: _np[dt.name]

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
        min_severity = _Severity.WARNING

        def __init__(self, min_severity=_Severity.WARNING):
            self.min_severity = min_severity
            self._messages = []

        def log(self, severity, msg):
            self._messages.append((severity, msg))

    def _log(logger, severity, msg):
        rec(("logger.log", severity.name, msg))
        if logger is not None:
            logger.log(severity, msg)

    class ParserError:
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
    layer_members = set(surface["classes"]["ILayer"]["members"])

    class ILayer:
        def __init__(self, name, ltype, strongly, logger=None):
            object.__setattr__(self, "_logger", logger)
            object.__setattr__(self, "name", name)
            object.__setattr__(self, "type", ltype)
            object.__setattr__(self, "num_outputs", 1)
            object.__setattr__(self, "_strongly", strongly)

        def __setattr__(self, key, value):
            if key not in layer_members:
                raise AttributeError(f"'tensorrt.ILayer' object has no attribute '{key}' (TensorRT {version})")
            if key == "precision":
                if self._strongly:  # TensorRT logs an API usage error and ignores the call
                    _log(self._logger, _Severity.ERROR, "Error Code 3: API Usage Error (setting layer precision is not allowed in a strongly typed network)")
                    return
                rec(("layer.precision", self.name, value.name))
            object.__setattr__(self, key, value)

        if "set_output_type" in layer_members:
            def set_output_type(self, index, dtype):
                if self._strongly:
                    _log(self._logger, _Severity.ERROR, "Error Code 3: API Usage Error (setting layer output types is not allowed in a strongly typed network)")
                    return
                rec(("layer.set_output_type", self.name, index, dtype.name))

    class INetworkDefinition:
        def __init__(self, flags):
            net_flag = trt.NetworkDefinitionCreationFlag
            self._flags = flags
            self._strongly_typed = strongly_typed_always or (
                "STRONGLY_TYPED" in net_flag.__members__ and bool(flags & (1 << int(net_flag.STRONGLY_TYPED))))
            if major < 10 and not flags & (1 << int(net_flag.EXPLICIT_BATCH)):
                raise RuntimeError("TensorRT 8.x ONNX networks need EXPLICIT_BATCH")
            self._layers = []
            self._onnx = None
            self._input = None

        @property
        def num_layers(self):
            return len(self._layers)

        def get_layer(self, i):
            return self._layers[i]

    class OnnxParser:
        def __init__(self, network, logger):
            self._network = network
            self._logger = logger
            self._errors = []

        @property
        def num_errors(self):
            return len(self._errors)

        def get_error(self, i):
            return self._errors[i]

        def clear_errors(self):
            self._errors = []

        def _fail(self, error):
            self._errors.append(error)
            _log(self._logger, _Severity.ERROR, f"ModelImporter.cpp: ERROR: {error}")
            return False

        def parse_from_file(self, path):
            import onnx

            rec(("parser.parse_from_file", Path(path).name))
            try:
                model = onnx.load(str(path), load_external_data=False)
            except Exception:
                return self._fail(ParserError("MODEL_DESERIALIZE_FAILED", f"Failed to parse ONNX model from file: {path}"))
            layer_type = trt.LayerType
            if "parse" in fail and model.graph.node:  # an op this TensorRT has no importer for
                node = model.graph.node[0]
                return self._fail(ParserError("UNSUPPORTED_NODE", f"No importer registered for op: {node.op_type}", 0,
                                              node.name, node.op_type))
            net = self._network
            for index, node in enumerate(model.graph.node):
                if node.domain not in ("", "ai.onnx"):
                    return self._fail(ParserError("UNSUPPORTED_NODE", f"No importer registered for op: {node.op_type}",
                                                  index, node.name, node.op_type))
                if node.op_type == "Constant":
                    continue
                kind = _OP_LAYER.get(node.op_type, "IDENTITY")
                net._layers.append(ILayer(node.name or node.output[0], getattr(layer_type, kind), net._strongly_typed, self._logger))
            net._onnx = str(path)
            net._input = model.graph.input[0].name
            return True

    class ITimingCache:
        def __init__(self, blob):
            self._blob = bytes(blob)

        def serialize(self):
            return b"timing-cache:" + version.encode() + b":" + self._blob[-8:]

    class IOptimizationProfile:
        def __init__(self):
            self._shapes = {}

        def set_shape(self, name, lo, opt, hi):
            rec(("profile.set_shape", name, tuple(lo), tuple(opt), tuple(hi)))
            self._shapes[name] = (tuple(lo), tuple(opt), tuple(hi))

    config_members = set(surface["classes"]["IBuilderConfig"]["members"])

    class IBuilderConfig:
        def __init__(self):
            object.__setattr__(self, "_flags", set())
            object.__setattr__(self, "_profiles", [])
            object.__setattr__(self, "_cache", None)
            object.__setattr__(self, "_values", {})

        def __setattr__(self, key, value):
            # the real bindings refuse a name this version lacks (max_workspace_size on 10+, int8_calibrator on 11)
            if key not in config_members:
                raise AttributeError(f"'tensorrt.IBuilderConfig' object has no attribute '{key}' (TensorRT {version})")
            rec((f"config.{key}", getattr(value, "name", value)))
            self._values[key] = value

        def set_flag(self, flag):
            assert isinstance(flag, trt.BuilderFlag), flag
            rec(("config.set_flag", flag.name))
            self._flags.add(flag.name)

        def clear_flag(self, flag):
            rec(("config.clear_flag", flag.name))
            self._flags.discard(flag.name)

        def get_flag(self, flag):
            return flag.name in self._flags

        def set_memory_pool_limit(self, pool, size):
            rec(("config.set_memory_pool_limit", pool.name, int(size)))

        def add_optimization_profile(self, profile):
            rec(("config.add_optimization_profile",))
            self._profiles.append(profile)
            return len(self._profiles) - 1

        def can_run_on_DLA(self, layer):
            # the layer type, and static shapes: with a dynamic profile no layer can run on the DLA (the DLA
            # takes static shapes only; that the real call answers so is the stand-in's assumption)
            static = all(lo == hi for prof in self._profiles for lo, _opt, hi in prof._shapes.values())
            return static and layer.type.name in _DLA_CAN_RUN

        def create_timing_cache(self, blob):
            rec(("config.create_timing_cache", bytes(blob)))
            return ITimingCache(blob)

        def set_timing_cache(self, cache, ignore_mismatch):
            rec(("config.set_timing_cache", bool(ignore_mismatch)))
            if cache._blob == stale_cache:
                return False
            object.__setattr__(self, "_cache", cache)
            return True

        def get_timing_cache(self):
            return self._cache

    class Builder:
        def __init__(self, logger):
            self.num_DLA_cores = dla_cores
            self.logger = logger

        def create_network(self, flags=0):
            rec(("builder.create_network", int(flags)))
            return INetworkDefinition(flags)

        def create_builder_config(self):
            return IBuilderConfig()

        def create_optimization_profile(self):
            return IOptimizationProfile()

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
            if major < 11 and network._strongly_typed and config._flags & {"INT8", "FP16"}:
                return failed("Error Code 4: API Usage Error (precision flags are not allowed with a strongly typed network)")
            lo, opt, hi = config._profiles[0]._shapes[network._input]
            dla = config._values.get("default_device_type") == trt.DeviceType.DLA
            if dla and self.num_DLA_cores == 0:
                return failed("Error Code 2: Internal Error (DLA requested but no DLA is available on this device)")
            if dla and lo != hi:  # the DLA takes static shapes only (TensorRT's DLA restrictions); stand-in wording
                return failed(f"Error Code 2: Internal Error (DLA does not support dynamic shapes: the profile of "
                              f"'{network._input}' has min {lo} != max {hi})")
            if dla and "GPU_FALLBACK" not in config._flags:
                bad = [layer.name for layer in network._layers if not config.can_run_on_DLA(layer)]
                if bad:
                    return failed(f"Error Code 2: Internal Error ({bad[0]} cannot run on DLA and GPU fallback is off)")
            import base64

            onnx_bytes = base64.b64encode(Path(network._onnx).read_bytes()).decode()  # the "engine" carries its graph
            note = {"fake_tensorrt_engine": version, "onnx": onnx_bytes, "input": network._input, "min": lo, "opt": opt, "max": hi,
                    "layers": [[layer.name, layer.type.name, bool(dla and config.can_run_on_DLA(layer)), _dtypes(layer, config)]
                               for layer in network._layers],
                    "version_compatible": "VERSION_COMPATIBLE" in config._flags}
            return json.dumps(note).encode()

    def _dtypes(layer, config):
        """(input, output) data types: INT8 around Q/DQ, the float precision elsewhere."""
        pinned = layer.__dict__.get("precision") == trt.DataType.FLOAT
        flt = "FP32" if pinned or "FP16" not in config._flags else "FP16"
        kind = layer.type.name
        return ({"QUANTIZE": flt, "DEQUANTIZE": "Int8"}.get(kind, flt),
                {"QUANTIZE": "Int8", "DEQUANTIZE": flt}.get(kind, flt))

    _NAMES_11 = {"FP32": "Float", "FP16": "Half", "Int8": "Int8"}

    class EngineInspector:
        def __init__(self, engine):
            self._engine = engine
            self._context = None

        @property
        def execution_context(self):
            return self._context

        @execution_context.setter
        def execution_context(self, context):
            rec(("inspector.execution_context", context is not None))
            self._context = context

        def _shape(self):
            """The input shape the report can state: fixed when the profile is static, else only with a bound
            context whose input shape is set; None otherwise (the real inspector then says N/A)."""
            note = self._engine._note
            if note["min"] == note["max"]:
                return tuple(note["min"])
            if self._context is not None and note["input"] in self._context._shapes:
                return self._context._shapes[note["input"]]
            return None

        def get_engine_information(self, fmt):
            rec(("inspector.get_engine_information", fmt.name))
            note, shape = self._engine._note, self._shape()
            if inspector_layers is not None:  # a recorded inspector output, as a real engine would give
                return json.dumps({"Layers": inspector_layers, "Bindings": []})
            dims = list(shape) if shape else [-1] + list(note["min"][1:])

            def tensor(name, dtype):
                if major >= 11:
                    return {"Name": name, "Location": "Device", "Dimensions": dims,
                            "Format": "Row major linear format" if shape else "N/A due to dynamic shapes",
                            "Datatype": _NAMES_11[dtype] if shape else "N/A due to dynamic shapes"}
                return {"Name": name, "Location": "Device", "Dimensions": dims,
                        "Format/Datatype": f"Row major linear {dtype}" if shape else "N/A due to dynamic shapes"}

            layers = [{"Name": n, "LayerType": ("DLA" if on_dla else t), "Inputs": [tensor(n + "_in", din)],
                       "Outputs": [tensor(n + "_out", dout)]} for n, t, on_dla, (din, dout) in note["layers"]]
            if major >= 11:
                io = [{"Name": note["input"], "IOMode": "Input", "DataType": "Float", "Dimensions": dims, "Location": "Device",
                       "IsShapeInferenceIO": False, "ProfileInfo": [{"MinShape": note["min"], "OptShape": note["opt"],
                                                                      "MaxShape": note["max"], "Format": "Row major linear FP32 format (kLINEAR)"}]}]
                return json.dumps({"Layers": layers, "I/O Tensors": io})
            return json.dumps({"Layers": layers, "Bindings": [note["input"], self._engine._output]})

    class IExecutionContext:
        def __init__(self, engine):
            self._engine = engine
            self._shapes = {}
            self._addresses = {}

        def set_input_shape(self, name, shape):
            note = self._engine._note
            lo, hi = note["min"], note["max"]
            if "shape" in fail or not lo[0] <= shape[0] <= hi[0]:
                _log(self._engine._logger, _Severity.ERROR, f"IExecutionContext::setInputShape: Error Code 3: API Usage Error "
                     f"(batch {shape[0]} is outside the optimization profile {lo[0]}-{hi[0]})")
                return False
            rec(("context.set_input_shape", name, tuple(shape)))
            self._shapes[name] = tuple(shape)
            return True

        def get_tensor_shape(self, name):
            e = self._engine
            if name == e._input:
                return self._shapes[name]
            return (self._shapes[e._input][0],) + tuple(e._out_shape[1:])

        def set_tensor_address(self, name, ptr):
            self._addresses[name] = int(ptr)
            return True

        def execute_async_v3(self, stream):
            if "execute" in fail:
                return False
            e = self._engine
            shape = self._shapes[e._input]
            x = cudart.read(self._addresses[e._input], shape, e._in_dtype)
            y = e._session.run(None, {e._input: x})[0]
            cudart.write(self._addresses[e._output], np.ascontiguousarray(y.astype(e._out_dtype)))
            return True

    class ICudaEngine:
        num_io_tensors = 2

        def __init__(self, note, logger=None):
            import base64

            import onnxruntime as ort

            self._note = note
            self._logger = logger
            # ONNX Runtime stands in for the GPU kernels
            self._session = ort.InferenceSession(base64.b64decode(note["onnx"]), providers=["CPUExecutionProvider"])
            i, o = self._session.get_inputs()[0], self._session.get_outputs()[0]
            self._input, self._output = i.name, o.name
            self._in_dtype = np.uint8 if "uint8" in i.type else np.float32
            self._out_dtype = np.float32
            self._in_shape = (-1,) + tuple(note["min"][1:])
            self._out_shape = (-1,) + tuple(o.shape[1:])

        def get_tensor_name(self, i):
            return (self._input, self._output)[i]

        def get_tensor_mode(self, name):
            return trt.TensorIOMode.INPUT if name == self._input else trt.TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name):
            dt = self._in_dtype if name == self._input else self._out_dtype
            return {np.float32: trt.DataType.FLOAT, np.uint8: trt.DataType.UINT8}[dt]

        def get_tensor_shape(self, name):
            return self._in_shape if name == self._input else self._out_shape

        def get_tensor_profile_shape(self, name, index):
            return tuple(self._note["min"]), tuple(self._note["opt"]), tuple(self._note["max"])

        def create_execution_context(self):
            if "context" in fail:
                _log(self._logger, _Severity.ERROR, "Error Code 1: Cuda Runtime (out of memory)")
                return None
            return IExecutionContext(self)

        def create_engine_inspector(self):
            return EngineInspector(self)

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

    for cls in (ILogger, Logger, ParserError, Builder, OnnxParser, Runtime, IBuilderConfig, IExecutionContext, ICudaEngine,
                EngineInspector, ILayer, INetworkDefinition, IOptimizationProfile, ITimingCache):
        setattr(trt, cls.__name__, cls)
    _conform(trt, surface)
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
