"""Runner.infer_all, the pass validation and the FP32 probe run over a data set: the same outputs as infer on
each batch, in order, on both CPU runtimes and both input formats; OpenVINO keeps PASS_STREAMS batches in
flight. A bad batch mid-pass is the same one-line error as for infer, and the runner still infers after a
pass, after an early stop and after an error.

"The same" is the reference cache's own bar for outputs run again (verify_sample: 1e-4 of the output scale):
the outputs were bit-identical on the AVX2 EPYC, and another CPU's kernels may split the work by thread
count differently. The batches are random, so outputs out of order fail it by far."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.runtime_bundles import TARGETS

from vitedge.backends import get_backend
from vitedge.core.errors import UsageError
from vitedge.bundle.manifest import read_manifest
from vitedge.onnxkit.metadata import UINT8_NHWC_RGB


def _runner(bundle, threads: int = 2):
    manifest = read_manifest(bundle)
    backend = get_backend(manifest.target.profile["backend"])
    options = backend.options_type(**manifest.target.profile["backend_options"])
    return backend.open_runner(bundle / manifest.artifacts.model, options, threads=threads)


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and float(np.max(np.abs(got - want))) <= 1e-4 * max(float(np.max(np.abs(want))), 1.0)


def _batches(runner, sizes: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    h, w = runner.input_hw
    if runner.input_format == UINT8_NHWC_RGB:
        return [rng.integers(0, 256, (n, h, w, runner.input_channels), dtype=np.uint8) for n in sizes]
    return [rng.standard_normal((n, runner.input_channels, h, w), dtype=np.float32) for n in sizes]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", ["plain", "baked"])
def test_a_pass_gives_what_infer_gives_batch_by_batch_in_order(runtime_bundles, kind, target):
    with _runner(runtime_bundles[kind][target]) as runner:
        batches = _batches(runner, (8, 8, 8, 8, 8, 3))  # more batches than streams, a short last one
        one_by_one = [runner.infer(b) for b in batches]
        in_pass = list(runner.infer_all(iter(batches)))
        after = runner.infer(batches[2])
    assert [o.shape for o in in_pass] == [o.shape for o in one_by_one]
    assert all(_same(got, want) for got, want in zip(in_pass, one_by_one))
    assert _same(after, one_by_one[2])


@pytest.mark.parametrize("target", TARGETS)
def test_one_thread_runs_the_pass_one_batch_at_a_time_with_the_same_outputs(runtime_bundles, target):
    with _runner(runtime_bundles["plain"][target], threads=1) as runner:
        batches = _batches(runner, (8, 5))
        assert all(_same(a, runner.infer(b)) for a, b in zip(runner.infer_all(batches), batches))


@pytest.mark.parametrize("target", TARGETS)
def test_a_bad_batch_mid_pass_raises_the_same_error_as_infer_and_the_runner_goes_on(runtime_bundles, target):
    with _runner(runtime_bundles["plain"][target]) as runner:
        good = _batches(runner, (8, 8))
        bad = good[0][:, :, :-1, :]  # one row short
        seen = []
        with pytest.raises(UsageError, match="runner expects"):
            for out in runner.infer_all(iter([good[0], good[1], bad, good[0]])):
                seen.append(out)
        assert len(seen) <= 2 and all(_same(a, runner.infer(b)) for a, b in zip(seen, good))
        passes = runner.infer_all(iter(good * 3))
        first = next(passes)  # a caller that stops early
        passes.close()
        assert _same(first, runner.infer(good[0]))
