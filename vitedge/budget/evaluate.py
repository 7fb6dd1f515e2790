"""Evaluating a candidate Q/DQ graph: run it and the FP32 graph on the validation data in
every target runtime that will consume it, and apply the build gate's own accuracy rows
(``vitedge.validation.run.evaluate_gate``). A candidate passes only when it passes on all of them.

Also which runtimes those are (``target_runtimes``) and the one set of thresholds several
targets sharing a graph must all meet (``strictest``).

Heavy imports (onnxruntime) happen inside the functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.backends.base import Backend, Runner
from vitedge.onnxkit.files import save_onnx
from vitedge.onnxkit.metadata import UINT8_NHWC_RGB
from vitedge.onnxkit.session import ort_session
from vitedge.targets.profiles import TargetProfile, Thresholds
from vitedge.files.swap import work_prefix
from vitedge.core.ui import StageLog
from vitedge.validation import passes
from vitedge.validation.accuracy import Outputs, compare_embeddings, compare_logits, eval_batch
from vitedge.validation.embedding_gate import ACCURACY_GATE_NAMES
from vitedge.validation.inputs import feed_for
from vitedge.validation.noise import certain_agreement_miss
from vitedge.validation.reference_cache import (
    HIT,
    ReferenceCacheSettings,
    ReferenceLookup,
    SharedFp32,
    key_parts,
    model_sha256,
    reference_outputs,
    verify_sample,
)
from vitedge.validation.run import evaluate_gate

if TYPE_CHECKING:
    from onnx import ModelProto

    from vitedge.datasources.base import CalibrationSource
    from vitedge.bundle.preprocess import Preprocess

_EVAL_BATCH = 64
_MEMO_BYTES = 512 * 2**20  # keep the validation inputs in memory up to this size


# A runtime the budget evaluates candidates on: (name, open(path) -> a Runner with .infer(batch)).
# None opens ONNX Runtime's CPU provider, as the onnx target runs it.
RuntimeOpener = tuple[str, Callable[[Path], Runner] | None]
# What the budget runs on a runtime, and what the reference cache keys its outputs on: (its backend, the
# profile's backend options dataclass, the profile's batch sizes). With them the budget runs the files that
# target ships, at validation's batch, and validation reuses those outputs (issue 28 item 4).
RuntimeFacts = tuple[Backend, object, tuple[int, ...]]


class Evaluator:
    """Runs a graph on the validation data in every target runtime that will run it, and
    compares each with FP32's outputs on that same runtime. A candidate passes only when it
    passes on all of them: the build gate of each target is what the budget must predict."""

    def __init__(self, fp32: str | Path | ModelProto, source: CalibrationSource, output_kind: str, thresholds: Thresholds, *,
                 threads: int | None = None, runtimes: Sequence[RuntimeOpener] | None = None,
                 reference_cache: ReferenceCacheSettings | None = None, runtime_facts: Mapping[str, RuntimeFacts] | None = None,
                 preprocess: Preprocess | None = None):
        """``reference_cache`` and ``runtime_facts`` (runtime name -> (backend, its options, batch sizes), see
        ``runtime_facts``): on each runtime the FP32 reference and the candidates run as the files its target
        ships, at validation's batch, and their outputs are read from, or written to, validation's cache
        under validation's own keys: a cold build runs each (graph, runtime, data) pass once."""
        self.source = source
        self.output_kind = output_kind
        self.thresholds = thresholds
        self.threads = threads
        self.runtimes: list[RuntimeOpener] = list(runtimes) if runtimes else [("onnxruntime", None)]
        self._memo: dict[int, list[Any] | None] = {}  # batch size -> the data in batches of it (None: too large to keep)
        self.labels = None
        self.reference_cache, self.runtime_facts, self.preprocess = reference_cache, runtime_facts or {}, preprocess
        self.lookups: dict[str, ReferenceLookup] = {}
        self.reused: list[str] = []  # runtimes whose candidate outputs came from the cache, one entry per evaluation
        self.refs = {name: self._reference(fp32, name, opener) for name, opener in self.runtimes}
        self.ref = self.refs[self.runtimes[0][0]]
        self.runs = 0

    def _facts(self, name: str) -> RuntimeFacts | None:
        return self.runtime_facts.get(name)

    def _batch(self, name: str) -> int:
        """Inputs per call on runtime ``name``: validation's (``eval_batch`` of the target's batch sizes),
        so the outputs are the ones validation computes and its cache finds them."""
        facts = self._facts(name)
        return eval_batch(facts[2]) if facts is not None else _EVAL_BATCH

    def _reference(self, fp32: str | Path | ModelProto, name: str, opener: Callable[[Path], Any] | None) -> np.ndarray:
        """FP32 outputs on runtime ``name``: of the reference file its target ships (``Backend.shipped_graph``),
        under validation's own key, so its FP32 side reads them instead of running again."""
        facts = self._facts(name)
        if facts is None or not isinstance(fp32, (str, Path)):
            return self._outputs(fp32, opener, census=("fp32", name))[0]
        backend, options, _sizes = facts
        batch = self._batch(name)
        with tempfile.TemporaryDirectory(prefix=work_prefix("budget")) as tmp, contextlib.ExitStack() as stack:
            shipped = backend.shipped_graph(Path(fp32), "reference", options, Path(tmp))

            def compute() -> Outputs:
                values, _ = self._outputs(shipped, opener, batch=batch, census=("fp32", name))
                return Outputs(values, self.labels)

            outputs, lookup = reference_outputs(
                None, self.source, self.preprocess, batch=batch, settings=self._settings(False), compute=compute,
                key_of=lambda: key_parts(shipped, self.source, self.preprocess, backend, options, self.threads, batch),
                share=self._share(fp32, backend, shipped, opener, stack))
        self.lookups[name] = lookup
        if self.labels is None and outputs.labels is not None:
            self.labels = outputs.labels
        return outputs.values

    def _share(self, fp32: str | Path, backend: Backend, shipped: Path, opener: Callable[[Path], Any] | None,
               stack: contextlib.ExitStack) -> SharedFp32 | None:
        """How runtime ``backend`` may take the FP32 outputs another runtime computed for the same FP32 graph
        (``fp32``'s bytes): its spot check runs ``shipped`` (its own FP32 file), opened on first use."""
        if opener is None:
            return None
        opened: list[Runner] = []

        def run_batch(images: np.ndarray) -> np.ndarray:
            if not opened:
                runner = opener(shipped)
                runner.open()
                stack.callback(runner.close)
                opened.append(runner)
            return opened[0].infer(self._feed(opened[0], images))

        try:
            versions = backend.versions()
        except Exception:  # noqa: BLE001 - a runtime that cannot say: recorded as unknown
            versions = {}
        return SharedFp32(model_sha256(fp32), backend.name, versions, run_batch)

    def _settings(self, int8: bool) -> ReferenceCacheSettings:
        if self.reference_cache is None:
            return ReferenceCacheSettings(enabled=False)
        return self.reference_cache.for_int8() if int8 else self.reference_cache

    def _batches(self, batch: int):
        if batch not in self._memo:
            self._memo[batch] = self._memoize(batch)
        memo = self._memo[batch]
        return iter(memo) if memo is not None else self.source.batches(batch)

    def _memoize(self, batch: int) -> list[Any] | None:
        memo, size = [], 0
        for b in self.source.batches(batch):
            size += b.images.nbytes
            if size > _MEMO_BYTES:
                return None
            memo.append(b)
        return memo

    def _infer_fn(self, model: str | Path | ModelProto, opener: Callable[[Path], Any] | None, tmp: Path) -> tuple[Callable[[np.ndarray], np.ndarray], Any]:
        if opener is None:

            sess = ort_session(Path(model) if isinstance(model, str) else model, threads=self.threads)  # past 2 GB via external data
            name = sess.get_inputs()[0].name
            return (lambda x: sess.run(None, {name: np.ascontiguousarray(x, dtype=np.float32)})[0]), None
        path = Path(model) if isinstance(model, (str, Path)) else tmp / "candidate.onnx"
        if not isinstance(model, (str, Path)):

            save_onnx(model, path)
        runner = opener(path)
        runner.open()
        return (lambda x: runner.infer(self._feed(runner, x))), runner

    def _feed(self, runner: Runner, images: np.ndarray) -> np.ndarray:
        """What validation feeds ``runner`` (``feed_for``): model-ready float32, or uint8 frames for a baked graph."""
        if self.preprocess is not None and getattr(runner, "input_format", None) == UINT8_NHWC_RGB:
            return feed_for(runner, images, self.preprocess)
        return np.ascontiguousarray(images, dtype=np.float32)

    def _outputs(self, model: str | Path | ModelProto, opener: Callable[[Path], Any] | None = None,
                 stop: Callable[[np.ndarray], str | None] | None = None, ref: np.ndarray | None = None, *,
                 batch: int = _EVAL_BATCH, census: tuple[str, str] = ("int8", "onnxruntime")) -> tuple[np.ndarray, str | None]:
        """Outputs of ``model`` on the data, ``batch`` inputs per call; ``census``: (side, runtime) for the pass record."""
        outs, labels, labelled = [], [], True
        reason = None
        with tempfile.TemporaryDirectory(prefix=work_prefix("budget")) as tmp:
            infer, runner = self._infer_fn(model, opener, Path(tmp))
            try:
                for b in self._batches(batch):
                    y = np.asarray(infer(b.images), dtype=np.float32)
                    outs.append(y.reshape(y.shape[0], -1))
                    if b.labels is None:
                        labelled = False
                    else:
                        labels.append(b.labels)
                    if stop is not None:
                        reason = stop(np.concatenate(outs), ref)
                        if reason:
                            break
            finally:
                if runner is not None:
                    runner.close()
        values = np.concatenate(outs)
        self._record(model, census, len(values), batch)
        if self.labels is None and labelled and labels and reason is None:
            self.labels = np.concatenate(labels)
        return values, reason

    def _record(self, model: str | Path | ModelProto, census: tuple[str, str], items: int, batch: int) -> None:
        side, name = census
        facts = self._facts(name)
        runtime = facts[0].name if facts is not None else "onnxruntime"
        passes.record(passes.InferencePass("budget", side, runtime, model_sha256(model), self.source.summary.data_hash, items, batch))

    def _candidate_outputs(self, candidate: Path, name: str, opener: Callable[[Path], Any] | None,
                           stop: Callable[[np.ndarray], str | None] | None, ref: np.ndarray, tmp: Path) -> tuple[np.ndarray, str | None]:
        """A candidate's outputs on runtime ``name``: of the artifact its target would ship for it
        (``Backend.shipped_graph``), under validation's own INT8 key. Read from the cache when that very
        artifact ran complete on the same data, runtime, settings and CPU before, and only after a random
        sample of it runs again and agrees (``verify_sample``, as validation does); else run. Only complete
        runs are stored (an early stop's are partial): validation then reuses the accepted candidate's."""
        facts = self._facts(name)
        if facts is None:
            return self._outputs(candidate, opener, stop, ref, census=("int8", name))
        backend, options, _sizes = facts
        batch = self._batch(name)
        out = Path(tempfile.mkdtemp(prefix="shipped-", dir=tmp))  # this runtime's artifact, beside the candidate
        shipped = backend.shipped_graph(candidate, "model", options, out)
        stopped: list[str | None] = []

        def compute() -> Outputs:
            got, reason = self._outputs(shipped, opener, stop, ref, batch=batch, census=("int8", name))
            stopped.append(reason)
            return Outputs(got, self.labels)

        outputs, lookup = reference_outputs(
            None, self.source, self.preprocess, batch=batch, settings=self._settings(True), compute=compute, label="budget candidate",
            key_of=lambda: key_parts(shipped, self.source, self.preprocess, backend, options, self.threads, batch),
            keep=lambda o: stopped[0] is None and len(o.values) == len(self.source),
            verify=lambda cached: self._spot_check(shipped, opener, batch, cached))
        if lookup.cache == HIT:
            self.reused.append(name)
            return outputs.values, None
        return outputs.values, stopped[0]

    def _spot_check(self, path: Path, opener: Callable[[Path], Any] | None, batch: int, cached: Outputs) -> str | None:
        """``verify_sample`` with the runner of ``path``: cached INT8 outputs are believed only when a sample agrees."""
        if opener is None:
            return "no runner to check it with"
        runner = opener(path)
        runner.open()
        try:
            return verify_sample(lambda images: runner.infer(self._feed(runner, images)), self.source, batch, cached)
        finally:
            runner.close()

    def _usable_labels(self) -> np.ndarray | None:
        labels = self.labels
        if labels is not None and (labels.min() < 0 or labels.max() >= self.ref.shape[1]):
            return None  # the validation gate reports this as a data error; the budget uses agreement
        return labels

    def _certain_miss(self, got: np.ndarray, ref: np.ndarray | None = None) -> str | None:
        """Why this candidate already misses the budget whatever the remaining items give, or None (``certain_miss``)."""
        return certain_miss(self.ref if ref is None else ref, got, self._usable_labels(), self.thresholds)

    def accuracy(self, model: str | Path | ModelProto, *, early_stop: bool = True) -> dict[str, Any]:
        """Accuracy of ``model`` vs FP32. With ``early_stop`` (classifiers), the run stops as soon as the
        budget is certainly missed; the figures then cover the items run (``samples``)."""

        stop = self._certain_miss if early_stop and self.output_kind != "embedding" else None
        with tempfile.TemporaryDirectory(prefix=work_prefix("budget")) as tmp:
            return self._accuracy(model, stop, Path(tmp))

    def _accuracy(self, model: str | Path | ModelProto, stop: Callable[..., str | None] | None, tmp: Path) -> dict[str, Any]:
        per_runtime: dict[str, dict[str, Any]] = {}
        worst: dict[str, Any] | None = None
        candidate: Path | None = Path(model) if isinstance(model, (str, Path)) else None
        for name, opener in self.runtimes:
            full_ref = self.refs[name]
            if opener is None or self._facts(name) is None:  # the ONNX Runtime stand-in runs the graph in memory
                got, reason = self._outputs(model, opener, stop, full_ref, census=("int8", name))
            else:
                if candidate is None:  # saved once for every runtime's artifact
                    candidate = tmp / "candidate.onnx"
                    save_onnx(model, candidate)
                got, reason = self._candidate_outputs(candidate, name, opener, stop, full_ref, tmp)
            ref = full_ref[: len(got)]
            if self.output_kind == "embedding":
                acc = compare_embeddings(ref, got, self.thresholds.embedding_cosine_percentile)
            else:
                labels = self._usable_labels()
                acc = compare_logits(ref, got, None if labels is None else labels[: len(got)],
                                     near_tie_margin=self.thresholds.near_tie_margin, drop_confidence=self.thresholds.drop_confidence)
            acc["output_kind"] = self.output_kind
            acc["runtime"] = name
            if reason:
                acc["stopped_early"] = f"{name}: {reason}" if len(self.runtimes) > 1 else reason
            per_runtime[name] = acc
            if worst is None or self._worse(acc, worst):
                worst = acc
            if reason:  # a certain miss on one runtime is a miss: the others need not run
                break
        self.runs += 1
        result = dict(worst)
        if len(self.runtimes) > 1:
            result["runtimes"] = per_runtime
        return result

    def _worse(self, a: dict[str, Any], b: dict[str, Any]) -> bool:
        """Whether accuracy ``a`` is further from the budget than ``b`` (a miss beats a pass)."""
        fail_a, fail_b = not self.verdict(a)[0], not self.verdict(b)[0]
        if fail_a != fail_b:
            return fail_a
        key = "embedding_cosine_mean" if self.output_kind == "embedding" else "top1_agreement"
        return (a.get(key) if a.get(key) is not None else 1.0) < (b.get(key) if b.get(key) is not None else 1.0)

    def verdict(self, accuracy: dict[str, Any]) -> tuple[bool, list[str]]:
        """The build gate's own accuracy rows (speed rows are not the budget's)."""

        if accuracy.get("stopped_early"):
            return False, [accuracy["stopped_early"]]
        rows = [r for r in evaluate_gate(accuracy, None, None, self.thresholds) if r.name in ACCURACY_GATE_NAMES]
        return all(r.passed for r in rows), [r.detail for r in rows if not r.passed]


def strictest(thresholds: Sequence[Thresholds]) -> Thresholds:
    """One budget for a graph several targets share: the tightest of each accuracy threshold."""
    first = thresholds[0]
    nn = [t.min_nn_agreement for t in thresholds if t.min_nn_agreement is not None]
    return dataclasses.replace(first, max_top1_drop=min(t.max_top1_drop for t in thresholds),
                               min_agreement=max(t.min_agreement for t in thresholds),
                               min_decisive_agreement=max(t.min_decisive_agreement for t in thresholds),
                               min_embedding_cosine=max(t.min_embedding_cosine for t in thresholds),
                               min_embedding_cosine_low=max(t.min_embedding_cosine_low for t in thresholds),
                               embedding_cosine_percentile=min(t.embedding_cosine_percentile for t in thresholds),
                               min_nn_agreement=max(nn) if nn else None,
                               near_tie_margin=min(t.near_tie_margin for t in thresholds),
                               drop_confidence=min(t.drop_confidence for t in thresholds))


def target_runtimes(profiles: list[TargetProfile], backends: Mapping[str, Backend], threads: int | None,
                    log: StageLog) -> list[RuntimeOpener]:
    """The runtimes the accuracy budget must hold on: each target's own that runs here (once per
    backend and options). TensorRT runs on the device: its plan is checked there, and the budget
    stands in with ONNX Runtime when no other target runs here."""
    runtimes: list[RuntimeOpener] = [
        (name, lambda path, b=backend, o=p.backend_options: b.open_runner(path, o, threads=threads))
        for name, backend, p in _runtimes_here(profiles, backends)]
    if not runtimes:
        log.info("accuracy budget: no target runtime runs here; evaluating in ONNX Runtime (CPU) as a stand-in")
    return runtimes


def runtime_facts(profiles: list[TargetProfile], backends: Mapping[str, Backend]) -> dict[str, RuntimeFacts]:
    """Runtime name (as ``target_runtimes`` names it) -> (backend, backend options): what the FP32
    reference cache keys each runtime's outputs on."""
    return {name: (backend, p.backend_options, tuple(p.batch_sizes)) for name, backend, p in _runtimes_here(profiles, backends)}


def _runtimes_here(profiles: list[TargetProfile], backends: dict[str, Any]) -> list[tuple[str, Any, TargetProfile]]:
    out: list[tuple[str, Any, TargetProfile]] = []
    seen: set[str] = set()
    for p in profiles:
        backend = backends[p.name]
        env = backend.check_environment()
        if not env.can_run or not backend.facts.runs_qdq_graph:  # TensorRT's runner opens engines, not the graph
            continue
        key = f"{p.backend} {p.backend_options!r}"
        if key in seen:
            continue
        seen.add(key)
        name = p.backend if all(q.backend != p.backend or q is p for q in profiles) else f"{p.backend} ({p.name})"
        out.append((name, backend, p))
    return out


def certain_miss(full_ref: np.ndarray, got: np.ndarray, labels: np.ndarray | None, t: Thresholds) -> str | None:
    """Why a candidate whose first ``len(got)`` outputs are ``got`` already misses the gate's accuracy rows
    whatever the remaining items give, or None. ``full_ref``: FP32's outputs on every item; ``labels``: every
    item's label, or None.

    Exact bounds, so stopping early never changes a verdict: top-1 disagreements with FP32 only grow, and each
    remaining item can win back at most one correct prediction. Labels never excuse a flip (docs/gate.md), so the
    agreement rows stop a labelled run as they stop an unlabelled one; the drop row's interval of a partial run
    bounds nothing exactly, so the drop stops a run only under the plain point estimate (drop_confidence 0)."""
    total, n = len(full_ref), len(got)
    if n >= total:
        return None
    miss = certain_agreement_miss(full_ref, got, t.min_agreement, t.near_tie_margin, t.min_decisive_agreement)
    if miss is not None:
        return miss
    if labels is not None and t.drop_confidence == 0:  # the interval of a partial run bounds nothing exactly
        ref, pred, y = full_ref[:n].argmax(1), got.argmax(1), labels[:n]
        net = int(np.sum((ref == y) & (pred != y)) - np.sum((ref != y) & (pred == y)))
        allowed_lost = math.floor(t.max_top1_drop / 100.0 * total + 1e-9)
        if net - (total - n) > allowed_lost:
            return (f"stopped after {n} of {total} items: {net} correct predictions lost, more than the {total - n} "
                    f"remaining items could win back within a {t.max_top1_drop:g}-point drop")
    return None
