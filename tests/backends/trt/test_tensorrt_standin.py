"""The recording TensorRT stand-in's own behaviour (tests/helpers/tensorrt_standin.py), so the
other tests can rely on it."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.tensorrt_standin import make_fake_cudart, make_fake_trt


@pytest.mark.parametrize("version", ["11.0.0", "11.4.0"])
def test_trt11_standin_has_no_weak_typing(version):
    trt = make_fake_trt(version)
    for name in ("INT8", "FP16", "OBEY_PRECISION_CONSTRAINTS", "PREFER_PRECISION_CONSTRAINTS"):
        with pytest.raises(AttributeError):
            getattr(trt.BuilderFlag, name)
    assert not hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH")
    with pytest.raises(AttributeError):
        trt.Builder(trt.Logger()).create_builder_config().int8_calibrator = object()


def test_standin_refuses_engines_of_another_version(tiny):
    path, _graph = tiny
    built = make_fake_trt("10.3.0")
    other = make_fake_trt("10.4.0")
    b = built.Builder(built.Logger())
    net = b.create_network(1 << int(built.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    assert built.OnnxParser(net, built.Logger()).parse_from_file(str(path))
    cfg = b.create_builder_config()
    p = b.create_optimization_profile()
    p.set_shape("input", (1, 3, 8, 8), (1, 3, 8, 8), (2, 3, 8, 8))
    cfg.add_optimization_profile(p)
    data = b.build_serialized_network(net, cfg)
    assert other.Runtime(other.Logger()).deserialize_cuda_engine(data) is None


def test_fake_cudart_round_trips_memory():
    rt = make_fake_cudart()
    _, ptr = rt.cudaMalloc(16)
    x = np.arange(4, dtype=np.float32)
    rt.cudaMemcpyAsync(ptr, x.ctypes.data, x.nbytes, rt.cudaMemcpyKind.cudaMemcpyHostToDevice, 7)
    y = np.zeros(4, np.float32)
    rt.cudaMemcpyAsync(y.ctypes.data, ptr, y.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, 7)
    assert np.array_equal(x, y)
