"""What DeepStream's nvinfer does with the engine files a config names, read from its sources.

The sources are those NVIDIA publishes with the DeepStream SDK (``sources/libs/nvdsinfer`` and
``sources/gst-plugins/gst-nvinfer``); the line numbers below are those of DeepStream 6.2's files as
mirrored on GitHub (hiennguyen9874/deepstream-sources), read 2026-11-28. Nothing here ran nvinfer.

* ``nvdsinfer_context_impl.cpp`` ``generateBackendContext`` (l. 1755-1792): nvinfer deserializes
  ``model-engine-file`` when the key is set; when it is unset, or the file does not deserialize
  ("deserialize backend context from engine from file :%s failed, try rebuild"), or the engine does
  not match the config, it builds from the model file (``buildModel``, l. 1700-1745) and serializes
  the build to the path ``TrtModelBuilder::buildModel`` suggests. It never looks for that file on
  its own: only ``model-engine-file`` is ever loaded.
* ``nvdsinfer_model_builder.cpp`` ``buildModel`` (l. 716-724): the suggested path is
  ``modelPath + "_b" + maxBatchSize + "_" + devId + "_" + networkMode2Str(networkMode) + ".engine"``,
  where ``modelPath`` is the ONNX parser's model name, i.e. ``onnx-file`` made absolute against the
  config's folder (``get_absolute_file_path``, ``gstnvinfer_property_parser.cpp`` l. 30-80),
  ``maxBatchSize`` is ``batch-size``, ``devId`` is ``gpu<gpu-id>``, or ``dla<use-dla-core>`` when
  ``enable-dla`` is set and the core is >= 0, and ``networkMode2Str`` (``nvdsinfer_func_utils.cpp``
  l. 159-171) gives ``fp32``, ``int8`` or ``fp16``. A folder nvinfer cannot write into leaves
  the build unsaved ("Serialize engine failed because of file path: %s opened error", l. 1246-1250).
* ``nvdsinfer_model_builder.cpp`` ``deserializeEngine`` (l. 1266-1312) creates the runtime and
  deserializes without ``setEngineHostCodeAllowed``: a version-compatible engine (which embeds its
  lean runtime as host code) does not load in nvinfer.

So a config whose ``model-engine-file`` is the name nvinfer saves its own build under loads that
build at every start after the first.
"""

from __future__ import annotations

# NvDsInferNetworkMode -> networkMode2Str (nvdsinfer_func_utils.cpp l. 159-171)
NETWORK_MODE_NAMES = {0: "fp32", 1: "int8", 2: "fp16"}


def nvinfer_engine_name(onnx_file: str, batch_size: int, *, gpu_id: int = 0, dla_core: int | None = None,
                        network_mode: int = 1) -> str:
    """The file nvinfer saves its own build of ``onnx_file`` under (as the config writes the path:
    relative paths stay relative to the config's folder, which is how nvinfer resolves both keys)."""
    device = f"dla{dla_core}" if dla_core is not None and dla_core >= 0 else f"gpu{gpu_id}"
    return f"{onnx_file}_b{int(batch_size)}_{device}_{NETWORK_MODE_NAMES[network_mode]}.engine"
