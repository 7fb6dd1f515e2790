"""The ONNX Runtime backend and the graph rewrites it makes before a session."""
