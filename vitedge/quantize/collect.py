"""The calibration pass: running the FP32 graph over the data (``CalibrationPass``) and what is measured
from it, batch by batch (``Collector``).

One streaming pass over the data measures everything: max |x| of every activation; for the
histogram methods a histogram of |x| per activation whose range grows with the data
(``vitedge.quantize.histogram``); per-channel histograms at the SmoothQuant sites, from which the
histogram of the smoothed activation x / s is derived once the scales s are known; and, for bias
correction, per-channel histograms and sums at the inputs of the Linear layers. Memory is fixed by
the graph, not by the number of images. The same pass keeps what method ``select`` scores its
candidates on (``Kept``): the first model-ready batches and the FP32 graph's own output on them, so
the data is read and decoded once per calibration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from vitedge.datasources.base import CalibrationSource, check_inputs_vary
from vitedge.core.errors import CalibrationError, QuantizationError
from vitedge.core.cpu import usable_cpus
from vitedge.onnxkit.files import is_large
from vitedge.onnxkit.metadata import FLOAT_NCHW, INPUT_FORMAT_KEY, SPEC_KEY, UINT8_NHWC_RGB
from vitedge.onnxkit.session import SessionSettings, lean_settings, ort_session
from vitedge.onnxkit.structure import graph_inputs
from vitedge.quantize import stats
from vitedge.quantize.histogram import ChannelHistogram
from vitedge.files.safefile import parse_json
from vitedge.bundle.spec import ModelSpec

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from onnx import ModelProto

# Fixed so the statistics do not depend on the machine. (ONNX Runtime's CPU results were
# bit-identical for 1-4 threads and batch 1 vs 8 in our measurements; fixing both anyway
# costs little.)
CALIBRATION_THREADS = 2
CALIBRATION_BATCH = 8
# Past 2 GB (vit_h_14) each run returns every activation of its batch as a graph output (~0.6 GB per
# image): batches of one, and ONNX Runtime without pre-packed weights or arena (onnxutil.lean_settings).
LARGE_GRAPH_BATCH = 1
# Calibration's sessions (the pass, method select's candidates): idle intra-op threads sleep instead
# of busy-waiting. Every run is a whole batch of millisecond-long ops, so spinning saves nothing, and on
# a shared CPU spinning threads take the cores from the ones working (ViT-S/16 INT8 candidate, 32 images,
# 2 threads, load average 11-16: 12.3-13.3 s without spinning, 16.3-18.3 s with). Results are the same.
CALIBRATION_SESSION = SessionSettings(spinning=False)
# Threads that count a batch's tensors into their histograms while ONNX Runtime waits for the next batch
# (the same two cores; issue 28 item 3). Never more than the CPUs this process may run on.
COUNTING_THREADS = min(CALIBRATION_THREADS, usable_cpus())


def _detached(message: Message) -> Any:
    """A copy of a protobuf sub-message that does not hold on to the message it came from."""
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def _large_graph_run(model: ModelProto) -> tuple[int | None, SessionSettings]:
    """(batch size or None for the default, session settings) for running ``model`` in calibration."""
    if is_large(model):
        return LARGE_GRAPH_BATCH, lean_settings(CALIBRATION_SESSION)
    return None, CALIBRATION_SESSION


@dataclass
class Kept:
    """What the pass keeps for method ``select``: the first ``samples`` model-ready inputs, batch by
    batch as the pass ran them, and the FP32 graph's output ``output`` on them (its reference)."""

    samples: int
    output: str
    input: str = ""  # the graph input's name (set by the CalibrationPass)
    feeds: list[np.ndarray] = field(default_factory=list)
    reference: list[np.ndarray] = field(default_factory=list)

    @property
    def count(self) -> int:
        return int(sum(len(x) for x in self.feeds))

    def add(self, feed: np.ndarray, values: dict[str, np.ndarray]) -> None:
        take = self.samples - self.count
        if take <= 0:
            return
        self.feeds.append(feed[:take])
        self.reference.append(np.array(values[self.output][:take]))  # a copy: the run's buffers go


# One-channel histograms of |x| are kept this many times finer than num_bins (the range
# grows by doubling, so the final [0, max] still spans at least 4x num_bins of their bins).
FINE_BINS_FACTOR = 8
# Bins per channel and sign of the per-channel histograms (SmoothQuant sites, the bias
# correction's layer inputs); fewer (down to MIN_CHANNEL_BINS) when all of them would
# pass CHANNEL_HISTOGRAM_BUDGET_BYTES (int32 counts).
CHANNEL_BINS = 256
MIN_CHANNEL_BINS = 64
CHANNEL_HISTOGRAM_BUDGET_BYTES = 256 * 2**20


def per_tensor(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(x) for x in items]``, on ``COUNTING_THREADS`` threads: for what is computed from the pass's
    histograms tensor by tensor (each result depends on its own tensor only, so the results are the same)."""
    if COUNTING_THREADS < 2 or len(items) < 2:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=COUNTING_THREADS, thread_name_prefix="vitedge-stats") as pool:
        return list(pool.map(fn, items))


def pass_outputs(tensors: list[str], site_inputs: set[str] | list[str]) -> list[str]:
    """The tensors the calibration pass asks ONNX Runtime for (besides the graph's own output)."""
    return sorted(set(tensors) | set(site_inputs))


class Collector:
    """Everything calibration measures, accumulated batch by batch in one pass.

    Per activation tensor: max |x| (softmax outputs: only that); a one-channel histogram of
    |x| when the method needs histograms; per-channel signed histograms (and channel sums)
    at SmoothQuant sites (the histogram of x / s is derived once s is known) and at the
    inputs of the layers whose biases get corrected."""

    def __init__(self, tensors: list[str], site_inputs: list[str], probs: set[str], num_bins: int, moment_inputs: set[str]):
        self.tensors = list(tensors)
        self.site_inputs = set(site_inputs)
        self.probs = set(probs)
        self.num_bins = num_bins
        self.moment_tensors = sorted(set(moment_inputs) & set(self.tensors))
        self.per_channel = sorted(self.site_inputs | set(self.moment_tensors))
        self.peak: dict[str, float] = {t: 0.0 for t in self.tensors}
        self.whole: dict[str, ChannelHistogram] = {}
        self.channel: dict[str, ChannelHistogram] = {}
        self.channel_bins = CHANNEL_BINS

    @property
    def outputs(self) -> list[str]:
        return pass_outputs(self.tensors, self.site_inputs)

    @property
    def wanted(self) -> set[str]:
        return set(self.tensors) | self.site_inputs

    def add(self, values: dict[str, np.ndarray], pool: Executor | None = None) -> None:
        """Count one batch. With ``pool``, the tensors are counted on its threads: each tensor's
        histograms are its own, so the counts are the same as one at a time (numpy releases the GIL in
        the passes and in ``bincount``, and ONNX Runtime's threads sit idle while a batch is counted)."""
        if not self.channel and self.per_channel:
            self._size_channel_histograms(values)
        for t in values:  # created here, in order, not on the threads
            if t not in self.whole and self.num_bins and t not in self.probs and t not in self.site_inputs:
                self.whole[t] = ChannelHistogram(1, FINE_BINS_FACTOR * self.num_bins)
        items = sorted(values.items(), key=lambda tv: -np.asarray(tv[1]).size)  # the largest first: the threads end together
        peaks = list(pool.map(self._count, items)) if pool is not None else [self._count(tv) for tv in items]
        for (t, _), peak in sorted(zip(items, peaks), key=lambda x: x[0][0]):
            if not np.isfinite(peak):
                raise CalibrationError(f"activation '{t}' is not finite (inf/NaN) on the calibration data: check the model and its preprocessing")
            if t in self.peak:
                self.peak[t] = max(self.peak[t], peak)

    def _count(self, item: tuple[str, np.ndarray]) -> float:
        """One tensor of a batch into its histograms; its max |x| (not finite: inf/NaN in it)."""
        t, v = item
        v = np.asarray(v)
        peak = None
        if t in self.channel:
            peak = self.channel[t].add(v)
        if t in self.whole:
            peak = self.whole[t].add(v)
        return stats.absmax(v) if peak is None else peak

    def _size_channel_histograms(self, values: dict[str, np.ndarray]) -> None:
        widths = {t: int(np.asarray(values[t]).shape[-1]) for t in self.per_channel}
        bins = CHANNEL_BINS
        while bins > MIN_CHANNEL_BINS and sum(widths.values()) * 2 * bins * 4 > CHANNEL_HISTOGRAM_BUDGET_BYTES:
            bins //= 2
        self.channel_bins = bins
        self.channel = {t: ChannelHistogram(w, bins, signed=t in self.moment_tensors) for t, w in widths.items()}

    def absmax(self) -> dict[str, float]:
        return dict(self.peak)

    def channel_absmax(self) -> dict[str, np.ndarray]:
        return {t: self.channel[t].absmax.copy() for t in self.site_inputs if t in self.channel}

    def histogram(self, t: str, top: float, num_bins: int, scale: np.ndarray | None) -> np.ndarray:
        """The histogram of |x| (of |x / s| at a SmoothQuant site) over [0, top]."""
        if t in self.site_inputs:
            return self.channel[t].histogram(top, num_bins, scale)
        return self.whole[t].histogram(top, num_bins)

    def moments(self, t: str, threshold: float, scale: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Per channel: the mean of x and of Q(x) (x / s and Q(x / s) at a SmoothQuant site)."""
        h = self.channel[t]
        s = np.ones(h.channels) if scale is None else np.asarray(scale, dtype=np.float64)
        return h.mean() / s, h.mean_fake_quant(threshold, s)


# --------------------------------------------------------------------------- running the graph


class CalibrationPass:
    """Runs a graph with extra outputs over the calibration source, batch by batch."""

    def __init__(self, model: ModelProto, meta: dict[str, str], source: CalibrationSource, progress: bool):
        self.model = model
        self.source = source
        self.progress = progress
        self.runs = 0
        self.uint8 = meta.get(INPUT_FORMAT_KEY, FLOAT_NCHW) == UINT8_NHWC_RGB
        self.preprocess = None
        try:  # what the graph says its preprocessing is, to name in an error
            self.stated = parse_json(meta[SPEC_KEY], "the graph's spec").get("preprocess") if SPEC_KEY in meta else None
        except ValueError:
            self.stated = None
        if self.uint8:

            try:
                self.preprocess = ModelSpec.from_json(meta[SPEC_KEY]).preprocess
            except Exception as err:
                raise QuantizationError("the graph takes uint8 frames but carries no vitedge.spec metadata to undo the normalisation: calibrate the float graph") from err
        inputs = graph_inputs(model)
        if len(inputs) != 1:
            raise QuantizationError(f"vitedge calibrates graphs with one image input; this one has {len(inputs)}")
        self.input = _detached(inputs[0])  # not a view into `model`: one would keep the whole graph alive (upb arenas)
        dims = self.input.type.tensor_type.shape.dim
        self.fixed_batch = dims[0].dim_value if len(dims) and dims[0].HasField("dim_value") else 0
        large_batch, self.session_settings = _large_graph_run(model)
        self.batch = self.fixed_batch or large_batch or CALIBRATION_BATCH

    def _session(self, outputs: list[str]):
        import onnx
        from onnx import TensorProto, helper


        # the graph's outputs are swapped in place and restored: a copy of a 2.5 GB graph (vit_h_14)
        # would cost as much memory again
        m = self.model
        original = [onnx.ValueInfoProto.FromString(v.SerializeToString()) for v in m.graph.output]
        known = {v.name: v for v in m.graph.value_info}
        wanted = []
        for name in outputs:
            vi = known.get(name)
            if vi is None or not vi.type.tensor_type.elem_type:
                vi = helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
            wanted.append(onnx.ValueInfoProto.FromString(vi.SerializeToString()))
        del m.graph.output[:]
        m.graph.output.extend(wanted)
        try:
            return ort_session(m, self.session_settings, threads=CALIBRATION_THREADS)  # past 2 GB: through external data
        except Exception as err:
            raise QuantizationError(f"ONNX Runtime cannot run the FP32 graph for calibration: {str(err).splitlines()[0][:200]}") from err
        finally:
            del m.graph.output[:]
            m.graph.output.extend(original)

    def _feeds(self, description: str):
        total = -(-len(self.source) // self.batch)
        bar = None
        if self.progress:

            bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("batches"),
                           TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True), transient=False)
            bar.start()
            task = bar.add_task(description, total=total)
        try:
            for i, batch in enumerate(self.source.batches(self.batch)):
                x = batch.images
                if i == 0:
                    check_inputs_vary(x, self.stated)  # a --std of 1e30: every image one value, FP32 one answer
                if self.fixed_batch and x.shape[0] != self.fixed_batch:
                    raise QuantizationError(
                        f"the FP32 graph has a fixed batch of {self.fixed_batch} and {len(self.source)} calibration items do not fill "
                        "its batches: re-export with a dynamic batch (vitedge export does) or pick --calib-size as a multiple of it")
                self._check_shape(x)
                yield self._to_input(x)
                if bar is not None:
                    bar.advance(task)
        finally:
            if bar is not None:
                bar.stop()

    def _check_shape(self, x: np.ndarray) -> None:
        dims = self.input.type.tensor_type.shape.dim
        want = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        if self.uint8:  # NHWC
            want = [want[0], want[3], want[1], want[2]] if len(want) == 4 else want
        got = list(x.shape)
        if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want[1:], got[1:])):
            shape = "x".join(str(v) for v in got[1:])
            model = "x".join("?" if v is None else str(v) for v in want[1:])
            raise CalibrationError(f"calibration items are {shape} after preprocessing but the model takes {model}: "
                                   "open the source with the model's preprocessing")

    def _to_input(self, x: np.ndarray) -> np.ndarray:
        if not self.uint8:
            return x
        pre = self.preprocess
        mean = np.asarray(pre.mean, dtype=np.float64).reshape(1, -1, 1, 1)
        std = np.asarray(pre.std, dtype=np.float64).reshape(1, -1, 1, 1)
        frames = np.clip(np.rint((x * std + mean) * 255.0), 0, 255).astype(np.uint8)
        return np.ascontiguousarray(frames.transpose(0, 2, 3, 1))

    def _run(self, outputs: list[str], description: str):
        for _, values in self._run_feeds(outputs, description):
            yield values

    def _run_feeds(self, outputs: list[str], description: str):
        """(model-ready input, {tensor: value}) batch by batch; the values are the run's own arrays."""
        name = self.input.name
        from_input = [t for t in outputs if t == name]
        run_outputs = [t for t in outputs if t != name]
        sess = self._session(run_outputs) if run_outputs else None
        for feed in self._feeds(description):
            values = dict(zip(run_outputs, sess.run(run_outputs, {name: feed}))) if sess is not None else {}
            for t in from_input:
                values[t] = feed
            self.runs += 1 if sess is not None else 0
            yield feed, values
            del values  # not alive while the next batch's outputs are computed

    def collect(self, collector: Collector, kept: Kept | None = None) -> None:
        """The calibration pass: every batch into ``collector``; the first ones also into ``kept``."""
        outputs = collector.outputs if kept is None else sorted(set(collector.outputs) | {kept.output})
        if kept is not None:
            kept.input = self.input.name
        with ThreadPoolExecutor(max_workers=COUNTING_THREADS, thread_name_prefix="vitedge-count") as pool:
            for feed, values in self._run_feeds(outputs, "calibrating"):
                if kept is not None:
                    kept.add(feed, values)
                collector.add({t: v for t, v in values.items() if t in collector.wanted}, pool)
                del values

    def keep(self, kept: Kept, outputs: list[str]) -> None:
        """Only what ``collect`` keeps for method ``select``, reading no more data than that: when the
        statistics came from the cache and the selection did not. ``outputs``: the pass's
        (``pass_outputs``), so that ONNX Runtime runs the same session and the reference is the same."""
        kept.input = self.input.name
        for feed, values in self._run_feeds(sorted(set(outputs) | {kept.output}), "select"):
            kept.add(feed, values)
            if kept.count >= kept.samples:
                break
