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

import configparser
import re
from dataclasses import dataclass
from pathlib import Path

# NvDsInferNetworkMode -> networkMode2Str (nvdsinfer_func_utils.cpp l. 159-171)
NETWORK_MODE_NAMES = {0: "fp32", 1: "int8", 2: "fp16"}


def nvinfer_engine_name(onnx_file: str, batch_size: int, *, gpu_id: int = 0, dla_core: int | None = None,
                        network_mode: int = 1) -> str:
    """The file nvinfer saves its own build of ``onnx_file`` under (as the config writes the path:
    relative paths stay relative to the config's folder, which is how nvinfer resolves both keys)."""
    device = f"dla{dla_core}" if dla_core is not None and dla_core >= 0 else f"gpu{gpu_id}"
    return f"{onnx_file}_b{int(batch_size)}_{device}_{NETWORK_MODE_NAMES[network_mode]}.engine"


# -- the [property] keys vitedge writes, as nvinfer's property parser reads them ----------------------------------
# gstnvinfer_property_parser.cpp (DeepStream 6.2): keys of [property] are read one by one; a key the parser does
# not know is reported ("Unknown or legacy key specified", l. 481) and ignored. Values go through GLib's key file
# readers: g_key_file_get_integer (a decimal integer), _get_double, _get_boolean (true/false/1/0), and the list
# readers, which split on ';'. Where the parser checks a range, the rule below is that check.
PARSER = "gstnvinfer_property_parser.cpp"
CONTEXT = "nvdsinfer_context_impl.cpp"


@dataclass(frozen=True)
class KeyRule:
    kind: str  # int | double | bool | string | int_list | double_list | path
    source: str  # file:line of the parser branch that reads it
    allowed: tuple[int, ...] = ()  # the values the parser accepts (int keys), empty: any
    low: float | None = None  # the smallest value it accepts
    high: float | None = None
    length: tuple[int, int] | None = None  # (min, max) length of a list
    when: str = ""  # the mode in which nvinfer reads it (documentation; checked in check_nvinfer_config)


NVINFER_KEYS: dict[str, KeyRule] = {
    "gpu-id": KeyRule("int", f"{PARSER}:559", low=0),
    "onnx-file": KeyRule("path", f"{PARSER}:996", when="the model nvinfer builds from when model-engine-file does not load"),
    "model-engine-file": KeyRule("path", f"{PARSER}:655", when="the only engine nvinfer loads (nvdsinfer_context_impl.cpp:1764)"),
    "int8-calib-file": KeyRule("path", f"{PARSER}:668", when="network-mode=1: INT8 flag only when the file exists (nvdsinfer_context_impl.cpp:1707)"),
    "infer-dims": KeyRule("int_list", f"{PARSER}:623", low=1, length=(3, 3)),
    "model-color-format": KeyRule("int", f"{PARSER}:720", allowed=(0, 1, 2)),
    "net-scale-factor": KeyRule("double", f"{PARSER}:740", when="> 0: scale and offsets are applied (nvdsinfer_context_impl.cpp:875)"),
    "offsets": KeyRule("double_list", f"{PARSER}:744", length=(1, 4), when="one per input channel (nvdsinfer_context_impl.cpp:110)"),
    "network-mode": KeyRule("int", f"{PARSER}:638", allowed=(0, 1, 2)),
    "batch-size": KeyRule("int", f"{PARSER}:593", low=1, high=1024),  # NVDSINFER_MAX_BATCH_SIZE, nvdsinfer_context.h:106
    "process-mode": KeyRule("int", f"{PARSER}:301", allowed=(1, 2)),
    "maintain-aspect-ratio": KeyRule("bool", f"{PARSER}:352"),
    "symmetric-padding": KeyRule("bool", f"{PARSER}:357"),
    "scaling-filter": KeyRule("int", f"{PARSER}:455", allowed=(0, 1, 2, 3, 4, 5, 6)),  # NvBufSurfTransformInter_*
    "scaling-compute-hw": KeyRule("int", f"{PARSER}:437", allowed=(0, 1, 2), when="2 (VIC) on Jetson (aarch64) only"),
    "network-type": KeyRule("int", f"{PARSER}:701", allowed=(0, 1, 2, 3, 100)),
    "output-tensor-meta": KeyRule("bool", f"{PARSER}:338", when="network-type=100: the output reaches the app as tensor meta"),
    "output-blob-names": KeyRule("string", f"{PARSER}:679", when="network-type=1: the classifier's output layers"),
    "labelfile-path": KeyRule("path", f"{PARSER}:548", when="network-type=1: opened at start (nvdsinfer_context_impl.cpp:514)"),
    "classifier-threshold": KeyRule("double", f"{PARSER}:1063", low=0.0, when="network-type=1"),
    "classifier-async-mode": KeyRule("bool", f"{PARSER}:319", when="network-type=1 in secondary mode"),
    "enable-dla": KeyRule("bool", f"{PARSER}:580"),
    "use-dla-core": KeyRule("int", f"{PARSER}:585", low=0, when="enable-dla=1"),
}
_INT = re.compile(r"^[+-]?\d+$")
_BOOLS = ("true", "false", "1", "0")


def _value_problem(key: str, rule: KeyRule, value: str) -> str | None:
    """What nvinfer's parser would refuse in ``value`` (None: it reads it)."""
    items = [v.strip() for v in value.rstrip(";").split(";")] if rule.kind.endswith("_list") else [value.strip()]
    if rule.kind in ("int", "int_list") and not all(_INT.match(v) for v in items):
        return f"{key}={value}: not an integer{' list' if rule.kind == 'int_list' else ''} ({rule.source})"
    if rule.kind in ("double", "double_list"):
        try:
            [float(v) for v in items]
        except ValueError:
            return f"{key}={value}: not a number ({rule.source})"
    if rule.kind == "bool" and value.strip().lower() not in _BOOLS:
        return f"{key}={value}: not a boolean ({rule.source})"
    if rule.kind in ("path", "string") and not value.strip():
        return f"{key} is empty ({rule.source})"
    if rule.length and not rule.length[0] <= len(items) <= rule.length[1]:
        return f"{key}={value}: {len(items)} values, nvinfer takes {rule.length[0]}-{rule.length[1]} ({rule.source})"
    if rule.kind.startswith(("int", "double")):
        numbers = [float(v) for v in items]
        if rule.allowed and any(int(n) not in rule.allowed for n in numbers):
            return f"{key}={value}: nvinfer accepts {', '.join(map(str, rule.allowed))} ({rule.source})"
        if (rule.low is not None and min(numbers) < rule.low) or (rule.high is not None and max(numbers) > rule.high):
            return f"{key}={value}: outside {rule.low}..{rule.high} ({rule.source})"
    return None


def check_nvinfer_config(path: Path, *, engines: tuple[str, ...] = ()) -> list[str]:
    """Each way ``path`` (a config_infer.txt) breaks nvinfer's rules: keys its parser does not read, values it
    refuses, keys its mode needs, files it opens, and a model-engine-file that is neither an engine vitedge built
    (``engines``: paths as the config writes them) nor the name nvinfer saves its own build under."""
    cp = configparser.ConfigParser(interpolation=None, comment_prefixes=("#",), delimiters=("=",))
    cp.optionxform = str  # nvinfer's keys are case-sensitive
    cp.read_string(path.read_text())
    props = dict(cp["property"]) if cp.has_section("property") else {}
    problems = [f"no [property] group ({PARSER}:1147)"] if not props else []
    for key, value in props.items():
        rule = NVINFER_KEYS.get(key)
        if rule is None:
            problems.append(f"{key}: a key nvinfer does not read (\"Unknown or legacy key\", {PARSER}:481)")
        elif (problem := _value_problem(key, rule, value)) is not None:
            problems.append(problem)
    return problems + _mode_problems(path.parent, props, engines)


def _mode_problems(folder: Path, props: dict[str, str], engines: tuple[str, ...]) -> list[str]:
    out = []
    need = ["onnx-file", "infer-dims", "network-mode", "batch-size", "model-engine-file"]
    kind = props.get("network-type", "0")
    if kind == "1":
        need += ["output-blob-names", "labelfile-path"]
    if kind == "100":
        need += ["output-tensor-meta"]
    if props.get("enable-dla", "0").lower() in ("1", "true"):
        need += ["use-dla-core"]
    if props.get("network-mode") == "1":
        need += ["int8-calib-file"]
    out += [f"{key} missing: nvinfer needs it here ({NVINFER_KEYS[key].when or NVINFER_KEYS[key].source})"
            for key in need if key not in props]
    for key in ("onnx-file", "labelfile-path", "int8-calib-file"):
        if key in props and not (folder / props[key]).is_file():
            out.append(f"{key}={props[key]}: no such file beside the config (nvinfer opens it: {NVINFER_KEYS[key].source})")
    dims = [v for v in props.get("infer-dims", "").rstrip(";").split(";") if v]
    offsets = [v for v in props.get("offsets", "").rstrip(";").split(";") if v]
    if dims and offsets and len(offsets) != int(dims[0]):
        out.append(f"offsets has {len(offsets)} values for {dims[0]} channels ({CONTEXT}:110)")
    if props.get("model-color-format") == "2" and dims and dims[0] != "1":
        out.append(f"model-color-format=2 (GRAY) with {dims[0]} channels")
    engine = props.get("model-engine-file")
    if engine and "onnx-file" in props and "batch-size" in props and props.get("network-mode") in ("0", "1", "2"):
        dla = int(props["use-dla-core"]) if props.get("enable-dla", "0").lower() in ("1", "true") and "use-dla-core" in props else None
        own = nvinfer_engine_name(props["onnx-file"], int(props["batch-size"]), gpu_id=int(props.get("gpu-id", "0")),
                                  dla_core=dla, network_mode=int(props["network-mode"]))
        if engine != own and engine not in engines:
            out.append(f"model-engine-file={engine}: neither an engine vitedge built nor {own}, the file nvinfer saves its own "
                       "build under, so it would build at every start (nvdsinfer_model_builder.cpp:723)")
    return out
