"""`load(bundle)` -> `Model`: a built bundle behind one small, thread-safe interface.

The backend (ONNX Runtime, OpenVINO, TensorRT, or one registered with
`vitedge.backends.register_backend`) is read from the bundle's manifest; its facts say which
runtime modules it needs and how to install them, and it is opened through
`vitedge.backends.get_backend(...).open_runner(...)`; the preprocessing is
the manifest's, applied by `vitedge.bundle.preprocess`. Nothing here imports torch, onnx or the
build-time tools, so a camera box needs only numpy, Pillow and its one backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import queue
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.core import limits, telemetry
from vitedge.backends import Backend, BackendFacts, backend_class, get_backend, list_backends
from vitedge.core.cpu import check_requirement, mismatch_allowed
from vitedge.core.errors import BundleError, MissingDependencyError, UsageError
from vitedge.bundle.manifest import Manifest, read_manifest, verify_bundle
from vitedge.onnxkit.metadata import FLOAT_NCHW, UINT8_NHWC_RGB
from vitedge.runtime.frames import as_frame_list, check_color, prepare_batch
from vitedge.runtime.results import SMALL_HEAD, Prediction, Predictions, top_k_one
from vitedge.runtime.results import top_k as _top_k
from vitedge.bundle.spec import Preprocess


def load(bundle: str | Path, *, verify: bool = True, warmup: int = 1, threads: int | None = None,
         runners: int = 1, max_batch: int | None = None, allow_cpu_mismatch: bool | None = None) -> "Model":
    """Open a built bundle folder for inference.

    verify:    check every file against the sha256 in manifest.json first (default); pass
               ``verify=False`` only for a bundle you have checked yourself.
    warmup:    inference runs per runner on load (0: none), so the first real frame is not slow.
    threads:   CPU threads per runner (None: the bundle profile's setting).
    runners:   how many runners (ONNX Runtime sessions, OpenVINO compiled models with their
               infer request, TensorRT contexts) to open. Calls from several threads share
               them; with 1 (default) inference is serialised by the runner pool.
    max_batch: largest batch sent to a runner at once; longer batches are split
               (default: the largest batch size of the bundle's target profile).
    allow_cpu_mismatch: open a CPU bundle whose INT8 graph needs what this CPU lacks (a
               ``weight_range = "full"`` bundle on x86 without VNNI/AMX gives wrong results
               there); default False, or the VITEDGE_ALLOW_CPU_MISMATCH environment variable.
    """
    check_load_arguments(bundle, verify=verify, warmup=warmup, threads=threads, runners=runners, max_batch=max_batch,
                         allow_cpu_mismatch=allow_cpu_mismatch)
    telemetry.silence()  # the backend's own usage reporting stays off in the app that loads a bundle
    bundle = Path(bundle)
    manifest = verify_bundle(bundle) if verify else read_manifest(bundle)
    if not manifest.artifacts.is_built:
        raise BundleError(f"{bundle} holds no {manifest.target.backend} engine yet (artifacts.built is false): "
                          f"run `vitedge engine {bundle}` on the device to build it there")
    backend_name = str(manifest.target.backend or "")
    backend_type = _backend_class(backend_name)
    _check_cpu(bundle, manifest, backend_type.facts, allow_cpu_mismatch)
    backend = _backend(backend_name, backend_type, manifest)
    options = _options(backend, manifest, bundle)
    model_path = bundle / manifest.artifacts.model
    opened = []
    try:
        for _ in range(runners):
            with _open_lock(backend_type.facts):
                runner = backend.open_runner(model_path, options, threads=threads)
                try:
                    runner.open()
                except MissingDependencyError:
                    raise _missing(backend_type.facts, manifest) from None
            opened.append(runner)
        model = Model(bundle, manifest, opened, max_batch=max_batch)
        model.warmup(warmup)
    except BaseException:
        for runner in opened:
            runner.close()
        raise
    return model


def check_load_arguments(bundle: object, *, verify: object, warmup: object, threads: object, runners: object, max_batch: object,
                         allow_cpu_mismatch: object) -> None:
    """Refuse an argument of `load` of the wrong type or out of range, before anything is opened, in one line naming
    it: a thread count past this machine's cores made the backend crash the process (SIGSEGV), ``max_batch=0`` or a
    string ``warmup`` failed later or not at all."""
    if not isinstance(bundle, (str, os.PathLike)) or not os.fspath(bundle):
        raise UsageError(f"bundle must be a bundle folder's path (str or pathlib.Path), got {bundle!r}")
    for name, value, optional in (("verify", verify, False), ("allow_cpu_mismatch", allow_cpu_mismatch, True)):
        if not (isinstance(value, bool) or (optional and value is None)):
            raise UsageError(f"{name} must be True or False{' (or None)' if optional else ''}, got {value!r}")
    limits.check_number("warmup", warmup, 0, limits.MAX_WARMUP_RUNS, integer=True)
    limits.check_number("runners", runners, 1, limits.MAX_RUNNERS, integer=True)
    if threads is not None:
        limits.check_number("threads", threads, 1, limits.max_threads(), integer=True)
    if max_batch is not None:
        limits.check_number("max_batch", max_batch, 1, limits.MAX_BATCH, integer=True)


# Backends whose runtime cannot open models from several threads at once (OpenVINO: two threads compiling at
# the same time hung past 240 s): one lock each, held while a runner opens. Inference is not serialised by it.
_OPEN_LOCKS: dict[str, threading.Lock] = {}
_OPEN_LOCKS_GUARD = threading.Lock()


def _open_lock(facts: BackendFacts) -> Any:
    if not facts.open_serially:
        return contextlib.nullcontext()
    with _OPEN_LOCKS_GUARD:
        return _OPEN_LOCKS.setdefault(facts.runtime, threading.Lock())


def _check_cpu(bundle: Path, manifest: Manifest, facts: BackendFacts, allow: bool | None) -> None:
    """Refuse (or, when allowed, warn about) a CPU bundle whose INT8 kernels would saturate here."""
    if not facts.on_cpu:
        return
    check = check_requirement(manifest.quantization.cpu_requirement or None)
    if check.ok and check.message is None:
        return
    if check.ok or (allow if allow is not None else mismatch_allowed()):
        warnings.warn(f"{bundle}: {check.message}", RuntimeWarning, stacklevel=3)
        return
    raise BundleError(f"{bundle}: {check.message}")


def _missing(facts: BackendFacts, manifest: Manifest) -> MissingDependencyError:
    return MissingDependencyError(f"{facts.runtime} (the runtime of this {manifest.target.name or facts.runtime} bundle)",
                                  facts.runtime_hint())


def _backend_class(name: str) -> type[Backend]:
    """The bundle's backend class (its facts, no runtime import); a one-line error when this vitedge lacks it."""
    if name not in list_backends():
        raise BundleError(f"the bundle's manifest names backend '{name}', which this vitedge does not know "
                          f"(known: {', '.join(list_backends())}); upgrade vitedge")
    try:
        return backend_class(name)
    except ImportError as err:
        if err.name and err.name.startswith("vitedge"):
            raise BundleError(f"this vitedge has no {name} runner ({err.name} is missing); upgrade vitedge") from None
        raise


def _backend(name: str, backend_type: type[Backend], manifest: Manifest) -> Backend:
    facts = backend_type.facts
    if any(importlib.util.find_spec(module) is None for module in facts.runtime_modules):
        raise _missing(facts, manifest)
    return get_backend(name)


def _options(backend: Backend, manifest: Manifest, bundle: Path):
    values = dict((manifest.target.profile or {}).get("backend_options") or {})
    known = {f.name for f in dataclasses.fields(backend.options_type)}
    try:
        return backend.options_type(**{k: v for k, v in values.items() if k in known})
    except (TypeError, ValueError, UsageError) as err:
        raise BundleError(f"{bundle}/manifest.json: backend_options do not fit {backend.name}: {err}") from None


class _RunnerPool:
    """Hands each call a free runner. With one runner (the default) it is a plain lock around
    it; with several, a queue of free ones."""

    def __init__(self, runners: list):
        self.runners = runners
        self._lock = threading.Lock() if len(runners) == 1 else None
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for r in runners:
            self._free.put(r)

    def infer(self, batch: np.ndarray) -> np.ndarray:
        if self._lock is not None:
            with self._lock:
                return self.runners[0].infer(batch)
        runner = self._free.get()
        try:
            return runner.infer(batch)
        finally:
            self._free.put(runner)

    def each(self):
        return list(self.runners)


class Model:
    """A loaded bundle. Make one with `vitedge.runtime.load`; safe to call from several threads.

    Frames are uint8 HxWx3 arrays of any size (``color="rgb"``, or ``"bgr"`` for OpenCV);
    a call takes one frame, a list of frames (sizes may differ) or an NxHxWx3 array. A
    1-channel (grayscale) bundle also takes HxW and HxWx1 frames and turns colour frames
    grey with ITU-R 601 luma, as Pillow's ``convert("L")``; ``model.color_mode`` says which.
    """

    def __init__(self, bundle: Path, manifest: Manifest, runners: list, *, max_batch: int | None = None):
        self.bundle = Path(bundle)
        self.manifest = manifest
        self.backend = str(manifest.target.backend)
        self.target = str(manifest.target.name)
        try:
            inp, out = manifest.input, manifest.output
            self.preprocessing: Preprocess = Preprocess.from_dict(inp.preprocess)
            self.input_format: str = str(inp.format or FLOAT_NCHW)
            self.baked: bool = self.input_format == UINT8_NHWC_RGB
            self.input_size: tuple[int, int] = tuple(self.preprocessing.crop_size)  # type: ignore[assignment]
            self.channels: int = self.preprocessing.channels
            self.color_mode: str = self.preprocessing.color_mode
            self.output_kind: str = str(out.kind or "logits")
            names = out.class_names
            self.class_names: tuple[str, ...] | None = tuple(str(n) for n in names) if names else None
            sizes = (manifest.target.profile or {}).get("batch_sizes") or [1]
            self.max_batch = int(max_batch if max_batch is not None else max(sizes))
        except (TypeError, ValueError, KeyError, AttributeError) as err:  # a field of the wrong type in manifest.json
            detail = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
            raise BundleError(f"{self.bundle}/manifest.json: its input, output or batch sizes are malformed ({detail}); "
                              "the bundle is damaged or was edited by hand: rebuild it") from None
        if self.max_batch < 1:
            raise UsageError(f"max_batch must be >= 1, got {self.max_batch}")
        for runner in runners:
            if runner.input_format != self.input_format:
                raise BundleError(f"{self.bundle}: the artifact takes {runner.input_format} input but manifest.json says "
                                  f"{self.input_format}; rebuild the bundle")
        self._pool: _RunnerPool | None = _RunnerPool(runners)

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            for runner in pool.each():
                runner.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<vitedge Model {self.target} ({self.backend}) {self.bundle}: {self.output_kind}, "
                f"{self.input_size[0]}x{self.input_size[1]} {self.input_format}>")

    def warmup(self, runs: int = 1) -> None:
        """Run a mid-grey frame through every runner `runs` times; checks the output size too."""
        if runs <= 0:
            return
        h, w = self.input_size
        batch = prepare_batch([np.full((h, w, self.channels), 128, np.uint8)], self.preprocessing, bgr=False, baked=self.baked)
        for runner in self._runners():
            for _ in range(runs):
                out = runner.infer(batch)
            if self.class_names and out.shape[-1] != len(self.class_names):
                raise BundleError(f"{self.bundle}: the model outputs {out.shape[-1]} values but manifest.json names "
                                  f"{len(self.class_names)} classes; rebuild the bundle")

    def _runners(self) -> list:
        if self._pool is None:
            raise UsageError("this model is closed; load the bundle again")
        return self._pool.each()

    # -- the four calls ----------------------------------------------------------------------------

    def preprocess(self, frames: object, *, color: str = "rgb") -> np.ndarray:
        """Frames -> the model-input batch this bundle's artifact takes (always batched, N first):
        float32 Nx3xHxW normalised, or uint8 NxHxWx3 RGB resized+cropped when the bundle bakes
        normalisation into its graph (``model.baked``)."""
        items, _ = as_frame_list(frames, self.channels)
        return self._prepare(items, check_color(color))

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Raw model output for an already preprocessed batch in this bundle's input format
        (what `preprocess` returns; ``model.input_format``). Returns an (N, ...) float array."""
        pool = self._pool
        if pool is None:
            raise UsageError("this model is closed; load the bundle again")
        if not isinstance(batch, np.ndarray):
            raise UsageError(f"infer takes a numpy array in {self.input_format} layout, got {type(batch).__name__}")
        n = batch.shape[0] if batch.ndim else 0
        if n <= self.max_batch:
            return pool.infer(batch)
        return np.concatenate([pool.infer(batch[i:i + self.max_batch]) for i in range(0, n, self.max_batch)])

    def logits(self, frames: object, *, color: str = "rgb") -> np.ndarray:
        """Raw outputs (logits, before softmax) for FRAMES, preprocessed as `predict` does.

        Equal to ``model.infer(model.preprocess(frames, color=color))``: (N, C) for a list or
        an NxHxWx3 array, (C,) for one HxWx3 frame. For an already preprocessed tensor use
        `infer`."""
        items, single = as_frame_list(frames, self.channels)
        out = self._run(items, check_color(color))
        return out[0] if single else out

    def predict(self, frames: object, *, top_k: int = 5, color: str = "rgb") -> Prediction | Predictions:
        """Top-k classes with softmax probabilities: a `Prediction` for one HxWx3 frame,
        `Predictions` (N of them, plus (N, k) arrays) for a list or an NxHxWx3 array."""
        if self.output_kind != "logits":
            raise UsageError(f"{self.bundle} is an encoder bundle (it outputs {self.output_kind}s, no classes): "
                             f"use model.embed(frames)")
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
            raise UsageError(f"top_k must be a positive integer, got {top_k!r}")
        items, single = as_frame_list(frames, self.channels)
        out = self._run(items, check_color(color))
        if out.ndim != 2:
            raise BundleError(f"{self.bundle}: expected (N, classes) logits, the model returned shape {out.shape}")
        if single and out.shape[1] <= SMALL_HEAD:
            return top_k_one(out[0], int(top_k), self.class_names)
        indices, probs = _top_k(out, int(top_k))
        result = Predictions(indices, probs, self.class_names)
        return result[0] if single else result

    def embed(self, frames: object, *, color: str = "rgb", normalize: bool = False) -> np.ndarray:
        """Embeddings of an encoder bundle: (N, D) for a list or NxHxWx3 array, (D,) for one
        frame; ``normalize=True`` scales each to unit L2 norm."""
        if self.output_kind != "embedding":
            raise UsageError(f"{self.bundle} is a classifier bundle (it outputs {self.output_kind}): "
                             f"use model.predict(frames) or model.logits(frames)")
        items, single = as_frame_list(frames, self.channels)
        out = self._run(items, check_color(color)).astype(np.float32, copy=False)
        if normalize:
            out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
        return out[0] if single else out

    # -- internals ---------------------------------------------------------------------------------

    def _prepare(self, items: Sequence[np.ndarray], bgr: bool) -> np.ndarray:
        h, w = self.input_size
        if not items:
            c = self.channels
            shape = (0, h, w, c) if self.baked else (0, c, h, w)
            return np.zeros(shape, np.uint8 if self.baked else np.float32)
        return prepare_batch(list(items), self.preprocessing, bgr=bgr, baked=self.baked)

    def _run(self, items: Sequence[np.ndarray], bgr: bool) -> np.ndarray:
        if not items:
            if self._pool is None:
                raise UsageError("this model is closed; load the bundle again")
            width = len(self.class_names) if self.class_names else 0
            return np.zeros((0, width), np.float32)
        batch = self._prepare(items, bgr)
        pool = self._pool
        if pool is not None and len(items) <= self.max_batch:
            return pool.infer(batch)  # the common case, without infer()'s checks: batch is ours
        return self.infer(batch)
