"""`vitedge calibrate`: the work behind the command, in named steps (the command only parses flags, applies
the replace rule and the output lock, and prints what this returns).

load the model -> open the calibration data -> export FP32 to a work folder -> calibrate (cached)
-> the Q/DQ graph (when written or a layer is kept float) -> save it to ``out``."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vitedge.datasources.sources import CalibrationSource, open_source
from vitedge.datasources.split import calibration_part
from vitedge.models.batch_check import PROBE_IMAGES, check_batch_independence, probe_inputs
from vitedge.models.export import ExportOptions, export_onnx
from vitedge.models.intake import IntakeOptions, load_model
from vitedge.quantize import Calibration, QuantConfig, build_qdq, calibrate
from vitedge.bundle.spec import ModelSpec
from vitedge.files.swap import work_prefix


@dataclass(frozen=True)
class CalibrateRequest:
    model: str
    calib: Path
    out: Path | None
    intake: IntakeOptions
    config: QuantConfig
    calib_size: int | None = None
    seed: int = 0
    keep_float: tuple[str, ...] = ()
    cache_dir: Path | None = None
    quiet: bool = False


def run_calibrate(req: CalibrateRequest, say: Callable[[str], None]) -> None:
    """Calibrate, print each result line through ``say``, and write ``req.out`` when given."""
    loaded = load_model(req.model, req.intake)
    source = _open_data(req, loaded.spec, say)
    with tempfile.TemporaryDirectory(prefix=work_prefix("calibrate")) as work:
        fp32 = Path(work) / "model.fp32.onnx"
        export_onnx(loaded, fp32, ExportOptions())
        say(check_batch_independence(fp32, loaded.spec, probe_inputs(source.batches(PROBE_IMAGES)), seed=req.seed).one_line())
        cal = calibrate(fp32, source, req.config, cache_dir=req.cache_dir, progress=not req.quiet)
        graph = build_qdq(cal, keep_float=req.keep_float) if (req.out is not None or req.keep_float) else None
    for line in _summary_lines(cal, req.config):
        say(line)
    if graph is not None:
        say(f"layers: {graph.one_line()}")
    if req.out is not None and graph is not None:
        graph.save(req.out)
        say(f"wrote {req.out} ({req.out.stat().st_size / 1e6:.1f} MB)")


def _open_data(req: CalibrateRequest, spec: ModelSpec, say: Callable[[str], None]) -> CalibrationSource:
    calib_part, split = calibration_part(Path(req.calib), spec.class_names)
    if split:
        say(split.one_line())
    source = open_source(calib_part, spec.preprocess, limit=req.calib_size, seed=req.seed, class_names=spec.class_names,
                         progress=not req.quiet)
    say(f"calibration data: {source.summary.one_line()}")
    return source


def _summary_lines(cal: Calibration, config: QuantConfig) -> list[str]:
    s = cal.summary
    lines = [f"method: {config.describe()}",
             f"items: {s.used} used, {sum(s.skipped.values())} skipped, {sum(s.converted.values())} converted; seed {s.seed}; "
             f"data hash {s.data_hash[:16]}"]
    if cal.reused:
        lines.append(f"statistics: reused from the cache ({cal.cache_path}), no forward pass")
    else:
        where = f", cached in {cal.cache_path}" if cal.cache_path else ""
        lines.append(f"statistics: computed, {cal.forward_passes} forward passes in {cal.timings.get('statistics', 0.0):.1f} s{where}")
    if cal.cache_note:
        lines.append(f"note: {cal.cache_note}")
    return lines
