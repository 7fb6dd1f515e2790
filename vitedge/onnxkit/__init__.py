"""The ONNX toolkit: files and external data, metadata, sessions, graph editing."""
