"""Is each image's output its own? The FP32 graph run on a batch of a few inputs against each input alone.

A model whose output for one image depends on the other images in its batch gives other answers when it is
served at another batch size (DeepStream's batching, Triton's dynamic batching, batch 1), and no INT8-vs-FP32
gate sees it: both run the same batches. The layout seen in published checkpoints: batch-first tokens
``(B, T, D)`` fed to an ``nn.MultiheadAttention`` (or ``nn.TransformerEncoder(Layer)``) left at its default
``batch_first=False``, which takes dim 0 as the sequence, so attention runs across the images of the batch.
Read out through the class token, the same layout gives the other face of the fault: the class token (the same
vector in every image) attends only to the other images' class tokens, and the output no longer depends on the
image at all (the public checkpoint docs/reliability.md names: the same logits for all 10,000 MNIST test images).

Both are refused in one line (``ModelLoadError``, exit 2). What float batching explains is allowed: the largest
change of an image's output between its batch and alone, relative to that output's largest magnitude, up to
``REL_TOL`` (1e-3); measured at most 7.0e-7 on the examples the suite builds and on all 16 public corpus models,
whose outputs for two different inputs differed by at least 7.0e-2 (benchmarks/results/batch_independence_avx2.md). BatchNorm in eval mode uses its running statistics, so it is not
batch-dependent and passes.

Cost: one ONNX Runtime session on the FP32 graph and ``PROBE_IMAGES + 1`` forward passes (one batch, then each
input alone).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitedge.bundle.preprocess import normalize
from vitedge.bundle.spec import ModelSpec
from vitedge.core import telemetry
from vitedge.core import limits
from vitedge.core.errors import ModelLoadError
from vitedge.onnxkit.files import DATA_SUFFIX
from vitedge.onnxkit.metadata import INPUT_FORMAT_KEY, UINT8_NHWC_RGB
from vitedge.onnxkit.session import SessionSettings, lean_settings, ort_session

PROBE_IMAGES = 4  # one batch of this many inputs, then each alone
REL_TOL = 1e-3  # float batching changed an output by at most 7.0e-7 of its magnitude on every model measured
SAME_TOL = 1e-6  # distinct inputs whose outputs differ by no more than this (relative) give "the same output"

CAUSE = ("likely cause: batch-first tokens (B, T, D) fed to nn.MultiheadAttention or nn.TransformerEncoder(Layer) left at "
         "batch_first=False, so attention runs across the images of a batch; set batch_first=True on it or transpose the "
         "tokens to (T, B, D) around it, then save the state_dict again")


@dataclass(frozen=True)
class BatchCheck:
    """What the check measured: the inputs, the largest change of an output between its batch and alone, and the
    largest difference between two inputs' outputs (both relative to the output's largest magnitude)."""

    images: int
    inputs: str  # "calibration images" or "seeded random inputs"
    change: float
    spread: float
    top1_differs: int  # inputs whose top-1 class differs between their batch and alone
    worst: int  # the input with the largest change
    largest_abs_change: float
    seconds: float  # CPU time of the check (session and forward passes)
    finite: bool = True  # False: an output held inf/NaN, nothing judged (calibration refuses it, naming the activation)
    inputs_differ: bool = True  # False: the inputs are one value (preprocessing erased them): "the same output" not judged

    def one_line(self) -> str:
        if not self.finite:
            return (f"batch check: not judged, the FP32 outputs of {self.images} {self.inputs} are not all finite "
                    f"(the calibration names the activation); {self.seconds:.2f} s CPU")
        return (f"batch check: {self.images} {self.inputs} give the same outputs alone as in one batch (largest change "
                f"{self.change:.1e} of an output's magnitude, limit {REL_TOL:g}); {self.seconds:.2f} s CPU")


def check_batch_independence(graph: Path, spec: ModelSpec, inputs: np.ndarray | None = None, *, seed: int = 0) -> BatchCheck:
    """Run the FP32 ``graph`` on ``inputs`` (model-ready float NCHW, at least two distinct ones; else seeded random
    images in the model's input range) as one batch and each alone; refuse (ModelLoadError) a model whose outputs
    change with the batch, whose output is the same for every input, or whose graph cannot run another batch size."""
    check = measure_batch_independence(graph, spec, inputs, seed=seed)
    what = "embeddings" if spec.output_kind == "embedding" else "logits"
    if not check.finite:
        return check
    if check.change > REL_TOL:
        top1 = "" if what == "embeddings" else f"; top-1 differs on {check.top1_differs} of {check.images}"
        raise ModelLoadError(
            f"the model's output for one image depends on the other images in its batch: on {check.images} {check.inputs}, "
            f"image {check.worst}'s {what} change by {check.largest_abs_change:.3g} ({check.change:.2g} of their largest "
            f"magnitude, float batching explains {REL_TOL:g}{top1}) when other images share its batch, so it would answer "
            f"differently at another batch size (batch 1, DeepStream or Triton batching); {CAUSE}")
    if check.spread <= SAME_TOL and check.inputs_differ:  # inputs made one value: the calibration's data check names --mean/--std
        raise ModelLoadError(
            f"the model gives the same {what} for {check.images} different {check.inputs} (they differ by "
            f"{check.spread:.1e} of their magnitude): its output does not depend on the image; {CAUSE} (the class token then "
            "attends only to the class tokens of the batch, the same vector in every image); or its weights did not load "
            "(an untrained, all-zero head)")
    return check


def measure_batch_independence(graph: Path, spec: ModelSpec, inputs: np.ndarray | None = None, *, seed: int = 0) -> BatchCheck:
    """The check's figures, without a verdict (benchmarks/batch_independence.py reports them)."""
    start = time.process_time()
    large = Path(str(graph) + DATA_SUFFIX).is_file()
    session = ort_session(str(graph), lean_settings() if large else SessionSettings())
    meta = session.get_modelmeta().custom_metadata_map
    uint8 = meta.get(INPUT_FORMAT_KEY) == UINT8_NHWC_RGB
    name, dims = session.get_inputs()[0].name, session.get_inputs()[0].shape
    if dims and isinstance(dims[0], int):
        raise ModelLoadError(f"the FP32 graph has a fixed batch of {dims[0]}; vitedge validates and serves batches of any size: "
                             "re-export it with a dynamic batch axis")
    x, where = _probe(spec, inputs, seed)
    feed = _frames(x, spec) if uint8 else x
    batched = _run(session, name, feed)
    alone = np.concatenate([_run(session, name, feed[i:i + 1]) for i in range(len(feed))])
    del session
    finite = bool(np.isfinite(batched).all() and np.isfinite(alone).all())
    if not finite:
        batched, alone = np.nan_to_num(batched), np.nan_to_num(alone)
    diff = np.abs(batched - alone).max(axis=1)
    scale = np.abs(alone).max(axis=1)
    rel = np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), np.where(diff > 0, np.inf, 0.0))
    worst = int(np.argmax(rel))
    top = float(scale.max())
    spread = float(np.abs(alone - alone[:1]).max()) / top if top > 0 else 0.0
    return BatchCheck(images=len(x), inputs=where, change=float(rel[worst]), spread=spread,
                      top1_differs=int((batched.argmax(axis=1) != alone.argmax(axis=1)).sum()), worst=worst,
                      largest_abs_change=float(diff[worst]), seconds=time.process_time() - start, finite=finite,
                      inputs_differ=limits.input_spread(x)[2])  # the calibration's data check's rule


def probe_inputs(batches, count: int = PROBE_IMAGES) -> np.ndarray | None:
    """The first ``count`` model-ready inputs of an iterator of batches (a calibration source's ``batches(count)``),
    or None when there are none."""
    for batch in batches:
        return np.asarray(batch.images[:count], dtype=np.float32)
    return None


def _probe(spec: ModelSpec, inputs: np.ndarray | None, seed: int) -> tuple[np.ndarray, str]:
    """The inputs (float NCHW, model-ready) and what they are: the given ones when at least two differ, else seeded
    random images (uniform pixels, the model's own normalisation)."""
    if inputs is not None and len(inputs) >= 2:
        x = np.ascontiguousarray(inputs[:PROBE_IMAGES], dtype=np.float32)
        if any(not np.array_equal(x[0], other) for other in x[1:]):
            return x, "calibration images"
    pre = spec.preprocess
    h, w = spec.image_size
    frames = np.random.default_rng(seed).integers(0, 256, size=(PROBE_IMAGES, h, w, pre.channels), dtype=np.uint8)
    return np.stack([normalize(f, pre) for f in frames]), "seeded random inputs"


def _frames(x: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """Model-ready float NCHW back to the uint8 NHWC frames a graph with baked preprocessing takes."""
    pre = spec.preprocess
    mean = np.asarray(pre.mean, dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(pre.std, dtype=np.float32).reshape(1, -1, 1, 1)
    return np.clip(np.rint((x * std + mean) * 255.0), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1).copy()


def _run(session, name: str, feed: np.ndarray) -> np.ndarray:
    quiet = telemetry.onnxruntime().RunOptions()
    quiet.log_severity_level = 4  # the failure is said in the one line below, not also logged by ONNX Runtime
    try:
        out = session.run(None, {name: feed}, quiet)[0]
    except Exception as err:  # ONNX Runtime's Fail/InvalidArgument: a shape fixed at export that this batch does not fit
        detail = _ort_detail(str(err))
        raise ModelLoadError(
            f"the FP32 graph cannot run a batch of {len(feed)} (ONNX Runtime: {detail}): a size read from the batch axis was "
            f"fixed in it when it was exported at another batch, so it answers only at that batch size; {CAUSE}") from None
    return np.asarray(out, dtype=np.float64).reshape(len(feed), -1)


def _ort_detail(text: str) -> str:
    """ONNX Runtime's failure as "Reshape node '/blocks.0/attn/Reshape_4': <what>", without its source paths."""
    text = " ".join(text.split())
    node = re.search(r"running (\w+) node\. Name:'([^']*)'", text)
    what = text.split("Status Message:", 1)[-1]
    what = what.split(" was false.", 1)[-1] if " was false." in what else re.sub(r"^\S*/onnxruntime_src/\S*\s*", "", what.strip())
    return ((f"{node.group(1)} node '{node.group(2)}': " if node else "") + what.strip())[:240]
