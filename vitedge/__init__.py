"""vitedge: ship a trained Vision Transformer to the edge.

Importing this package is cheap: torch, ONNX Runtime, OpenVINO and TensorRT are imported
only by the modules that use them.
"""

__version__ = "0.1.0"

from vitedge.core import oldpaths  # noqa: E402  (light: the standard library only)
from vitedge.core.errors import VitedgeError  # noqa: E402  (light, no third-party imports)

oldpaths.install()  # `vitedge.onnxutil`, `vitedge.cli_options`, ...: the names modules had before their folders

__all__ = ["VitedgeError", "__version__"]
