"""Where a CPU target's INT8 is not faster than its FP32 on the CPU at hand, `vitedge build`'s summary,
the bundle's report.md and `vitedge targets` say so plainly, and name another target as faster only when the same run
measured it faster (otherwise what to try, claiming nothing).

The build test holds on any CPU: the sentence must appear exactly for the targets whose measured
INT8/FP32 speedup is below 1 (on an AVX2-only CPU that is intel-cpu; on a VNNI CPU usually none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import run_vitedge

from vitedge.core.cpu import CpuInfo, read_cpu
from vitedge.app.build import BuildSummary, TargetResult
from vitedge.app.summary import not_faster_lines
from vitedge.targets.profiles import load_profile
from vitedge.targets.table import (
    NOT_FASTER,
    MeasuredSpeed,
    collect,
    cpu_profile_gates,
    int8_not_faster_sentence,
    render_text,
    targets_to_try,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = str(REPO / "examples" / "digits_vit.pt")
AVX2_EPYC = CpuInfo("x86_64", "AMD EPYC", frozenset({"avx", "avx2", "fma"}), known=True)
VNNI_XEON = CpuInfo("x86_64", "Intel Xeon", frozenset({"avx2", "avx512f", "avx512_vnni"}), known=True)


# Which CPU shows what: on an AVX2-only CPU the native run is the pre-VNNI path of both runtimes; on
# a VNNI CPU the native run is the VNNI path, and the forced run caps OpenVINO's oneDNN at AVX2 so
# that its pre-VNNI kernels run there too. ONNX Runtime has no such switch: its pre-VNNI kernels
# are exercised only on an AVX2-only machine.
@pytest.mark.parametrize("forced_isa", [None, "AVX2"], ids=["native", "openvino-at-avx2"])
def test_build_says_int8_not_faster_exactly_when_measured_slower(tmp_path, forced_isa):
    out = tmp_path / "digits"
    # --min-speedup 0: the speed gate is not what this test checks, and timings on a shared machine vary
    args = ["build", EXAMPLES, "--target", "onnx", "--target", "intel-cpu", "--calib", str(REPO / "calibration/digits/calib"),
            "--val", str(REPO / "calibration/digits/val"), "--min-speedup", "0", "-o", str(out), "--force"]
    if forced_isa is None:
        code, text = run_vitedge(args)
    else:
        if not read_cpu().int8_dot_product:
            pytest.skip("this CPU has no VNNI: the native run already takes the pre-VNNI path")
        # oneDNN reads its cap when OpenVINO loads, so the build runs in a fresh process
        proc = subprocess.run([sys.executable, "-m", "vitedge", *args], capture_output=True, text=True, timeout=900,
                              env={**os.environ, "ONEDNN_MAX_CPU_ISA": forced_isa})
        code, text = proc.returncode, proc.stdout + proc.stderr
    assert code == 0, text
    for target in ("onnx", "intel-cpu"):
        speedup = json.loads((out / target / "manifest.json").read_text())["validation"]["speedup"]
        assert speedup is not None, target
        report = (out / target / "report.md").read_text()
        said = f"{target}: {NOT_FASTER}"
        if speedup < 1:
            assert said in text and said in report, (target, speedup, text)
            line = next(ln for ln in text.splitlines() if said in ln)
            assert f"{speedup:.2f}x FP32 speed" in line, line
            # names a target this build measured faster, or (when none did, which timing noise on a shared machine
            # can do to onnx) says to use the FP32 model
            assert "target is faster here" in line or "use the FP32 model on this CPU" in line, line
            other = "intel-cpu" if target == "onnx" else "onnx"
            if f"the {other} target is faster here" in line:
                mine = json.loads((out / other / "manifest.json").read_text())["validation"]["speedup"]
                assert mine >= 1 and mine > speedup, (line, mine)
        else:
            assert said not in text and said not in report, (target, speedup)


def test_sentence_only_for_cpu_runtimes_slower_than_fp32():
    onnx = MeasuredSpeed("onnx", "onnxruntime", 1.14, 2.0)
    assert int8_not_faster_sentence("intel-cpu", "openvino", 0.7, AVX2_EPYC, faster=onnx) == (
        "intel-cpu: INT8 is not faster than FP32 on this CPU (AMD EPYC, avx2 (no vnni)): INT8 ran at 0.70x FP32 speed "
        "at batch 1; the onnx target is faster here (its INT8 at 1.14x its FP32 in this run)")
    assert int8_not_faster_sentence("intel-cpu", "openvino", 1.0, AVX2_EPYC, faster=onnx) is None
    assert int8_not_faster_sentence("intel-cpu", "openvino", None, AVX2_EPYC) is None
    assert int8_not_faster_sentence("jetson-orin", "tensorrt", 0.5, AVX2_EPYC) is None  # not a CPU runtime


def _results(measured: dict[str, tuple[float, float]]) -> list[TargetResult]:
    """Build results carrying recorded figures: target -> (speedup at batch 1, INT8 ms at batch 1)."""
    out = []
    for name, (speedup, int8_ms) in measured.items():
        prof = load_profile(name)
        out.append(TargetResult(prof, Path(name), True, True, BuildSummary("model.onnx", speedup=speedup, int8_ms=int8_ms, fp32_ms=speedup * int8_ms)))
    return out


def test_summary_names_no_faster_target_the_run_did_not_measure_faster():
    # recorded on the AVX2 EPYC (a DeiT with per-head q/k/v layers): onnx INT8 0.20x its FP32, intel-cpu 0.65x
    lines = not_faster_lines(_results({"onnx": (0.20, 9.6), "intel-cpu": (0.65, 3.1)}), AVX2_EPYC)
    onnx = next(ln for ln in lines if ln.startswith("onnx:"))
    intel = next(ln for ln in lines if ln.startswith("intel-cpu:"))
    assert "faster here" not in " ".join(lines), lines
    assert "intel-cpu-vnni" not in " ".join(lines), lines  # its weights are wrong on a CPU without VNNI
    # onnx: intel-cpu measured faster in this run, but below FP32 too
    assert "the intel-cpu target's INT8 ran faster in this run (0.65x its FP32) but no faster than FP32 either" in onnx, onnx
    assert onnx.endswith("use the FP32 model on this CPU"), onnx
    assert intel.endswith("use the FP32 model on this CPU"), intel
    assert "onnx target" not in intel, intel


def test_summary_names_the_target_this_run_measured_faster():
    # recorded on the AVX2 EPYC (the bundled digits ViT): onnx INT8 1.16x its FP32, intel-cpu 0.78x
    lines = not_faster_lines(_results({"onnx": (1.16, 0.61), "intel-cpu": (0.78, 0.95)}), AVX2_EPYC)
    assert lines == ["intel-cpu: INT8 is not faster than FP32 on this CPU (AMD EPYC, avx2 (no vnni)): INT8 ran at 0.78x FP32 "
                     "speed at batch 1; the onnx target is faster here (its INT8 at 1.16x its FP32 in this run)"], lines
    # a better ratio is not enough when the target's INT8 took longer on this CPU in the same run
    slower_ms = not_faster_lines(_results({"onnx": (1.16, 1.20), "intel-cpu": (0.78, 0.95)}), AVX2_EPYC)
    assert "faster here" not in slower_ms[0], slower_ms


def test_summary_on_its_own_names_what_to_try_without_claiming():
    alone = not_faster_lines(_results({"onnx": (0.40, 5.0)}), VNNI_XEON)
    assert alone == ["onnx: INT8 is not faster than FP32 on this CPU (Intel Xeon, avx512-vnni): INT8 ran at 0.40x FP32 "
                     "speed at batch 1; use the FP32 model on this CPU, or try the intel-cpu or intel-cpu-vnni target "
                     "(not measured in this run)"], alone
    # without VNNI: intel-cpu admits INT8 below 1x there and intel-cpu-vnni's weights are wrong there: nothing to try
    avx2 = not_faster_lines(_results({"onnx": (0.40, 5.0)}), AVX2_EPYC)
    assert avx2[0].endswith("use the FP32 model on this CPU"), avx2
    assert targets_to_try("onnxruntime", cpu_profile_gates(), AVX2_EPYC) == []
    assert "intel-cpu" in targets_to_try("onnxruntime", cpu_profile_gates(), VNNI_XEON)


def test_targets_table_names_the_target_to_try_only_without_vnni():
    slow = render_text(collect(AVX2_EPYC))
    assert f"intel-cpu: {NOT_FASTER} (AMD EPYC, avx2 (no vnni)); its gate accepts 0.6x here; try the onnx target" \
        in " ".join(slow.split())
    assert NOT_FASTER not in render_text(collect(VNNI_XEON))
    here = render_text(collect())  # this machine, read from /proc/cpuinfo
    cpu = read_cpu()
    assert (NOT_FASTER in " ".join(here.split())) == (cpu.is_x86 and cpu.int8_dot_product is False)
