"""The embedding runtime: run a built bundle in an application.

    from vitedge.runtime import load

    model = load("build/intel-cpu")
    pred = model.predict(frame, top_k=5, color="bgr")   # one uint8 HxWx3 frame, any size
    print(pred.label, pred.prob)

Imports numpy, Pillow and the bundle's one backend (at `load`), never torch, onnx or the
build-time tools: `pip install vitedge-runtime[onnxruntime]` is all a camera box needs.
See docs/runtime.md.
"""

from vitedge.runtime.frames import FrameError
from vitedge.runtime.model import Model, load
from vitedge.runtime.results import Prediction, Predictions

__all__ = ["FrameError", "Model", "Prediction", "Predictions", "load"]
