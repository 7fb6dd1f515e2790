"""Sane bounds for every number a flag, a target profile or a manifest gives vitedge.

A number outside these bounds is a mistake (a typo, an extra zero, nan from a script), never a
setting anyone needs, and left unchecked it makes a run never end (`--latency-seconds inf`), crawl
(`--threads 3000` on a 2-core machine) or die with an allocation failure (`--input-size 100000
100000`). Each is refused before any work with one line naming the flag or key and the bound.

The bounds that depend on this machine (threads) are read when first asked, from the CPUs this
process may run on. docs/reliability.md lists every bound.
"""

from __future__ import annotations

import math
import os

import numpy as np

from vitedge.core.cpu import usable_cpus
from vitedge.core.errors import UsageError

# a thread count above this many per CPU this process may use only oversubscribes the cores
THREADS_PER_CPU = 4
# the longest timed window per model and batch size (--latency-seconds); the default is a few seconds
MAX_LATENCY_SECONDS = 600.0
# the largest input side (--input-size H W, a profile's or manifest's spec); 4096 px with 16 px patches is
# already 65 536 tokens, whose attention matrix alone is 17 GB per head
MAX_INPUT_SIDE = 4096
# the largest batch size (profile batch_sizes, TensorRT opt_batch, a manifest's batch sizes)
MAX_BATCH = 4096
# seeds are 32-bit for every generator vitedge seeds
MAX_SEED = 2**32 - 1
# subset sizes (--calib-size, --data-size); bigger than the data simply means all of it
MAX_ITEMS = 10_000_000
# a profile's thread counts (threads, num_streams): a profile may describe a bigger device than this one,
# so this is absolute; --threads, which runs here, is bounded by max_threads()
MAX_PROFILE_THREADS = 256
MAX_HEADS = 1024
# vitedge.runtime.load: runners (sessions) per loaded bundle, warm-up runs per runner
MAX_RUNNERS = 256
MAX_WARMUP_RUNS = 1000
MAX_WORKERS = 1024  # Ray workers: a cluster may be bigger than this machine, so not relative to it
MAX_SENSITIVITY_SAMPLES = 100_000
MAX_FALLBACK_EVALS = 1000
MAX_SPEEDUP = 1000.0  # a speed gate of more than 1000x FP32 cannot be met by any INT8 build
MAX_P99_MS = 3_600_000.0  # one hour per batch-1 inference
MAX_TOP1_DROP = 100.0  # percentage points
MAX_WORKSPACE_MB = 1 << 20  # TensorRT builder workspace: 1 TiB
MAX_DLA_CORE = 15
# the most classes a model may declare: a bundle's manifest names each class, and past this many it outgrows the
# bound a manifest is read with (vitedge.bundle.manifest.MAX_MANIFEST_BYTES), so runtime.load would refuse the bundle
MAX_CLASSES = 100_000
# the decompression-bomb limit: an image whose header claims more pixels than this is refused before
# it is decoded (PIL's own default warns at 89 M and refuses at 179 M pixels)
MAX_IMAGE_PIXELS = 64 * 1024 * 1024
# the largest image the resize step may make (before the centre crop): the resize keeps the aspect ratio, so a
# 1x1,000,000-pixel PNG (4 KB on disk, 1 megapixel decoded) became 36 x 36,000,000 pixels (5.3 GB) to cover a
# 32-pixel crop. 16 megapixels covers a 256-pixel resize of a panorama of 250:1
MAX_RESIZED_PIXELS = 16 * 1024 * 1024
# the smallest centre-crop fraction: the resize side is crop / crop_pct, so --crop-pct 0.01 resized every image
# to 100x the crop (3.2 megapixels for a 32-pixel crop) to keep its middle 1 %; published models use 0.875-1.0
MIN_CROP_PCT = 0.25


def max_threads() -> int:
    """The most runtime threads worth asking for on this machine."""
    return THREADS_PER_CPU * max(usable_cpus(), os.cpu_count() or 1)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_number(name: str, value: object, lo: float | None = None, hi: float | None = None, *, integer: bool = False,
                 lo_open: bool = False, error: type[Exception] = UsageError) -> None:
    """Raise ``error`` (one line naming ``name`` and the bound) unless ``value`` is a finite number
    (an integer when ``integer``) in [lo, hi] (lo excluded when ``lo_open``)."""
    if not within(value, lo, hi, integer=integer, lo_open=lo_open):
        raise error(f"{name} must be {kind_text(integer)}{bounds_text(lo, hi, lo_open)}, got {value!r}")


def within(value: object, lo: float | None, hi: float | None, *, integer: bool = False, lo_open: bool = False) -> bool:
    ok = is_number(value) and (not integer or isinstance(value, int)) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    return ok


def kind_text(integer: bool) -> str:
    return "an integer" if integer else "a finite number"


def number_text(x: float) -> str:
    """A bound as a reader types it: whole numbers in full (10000000, not 1e+07), others as %g."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def bounds_text(lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    if lo is None and hi is None:
        return ""
    if hi is None:
        return f" {'>' if lo_open else '>='} {number_text(lo)}"
    if lo is None:
        return f" <= {number_text(hi)}"
    return f" in {'(' if lo_open else '['}{number_text(lo)}, {number_text(hi)}]"


def physical_memory() -> int | None:
    """Bytes of RAM on this machine, or None where the OS cannot say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def check_attention_fits(tokens: int | None, heads: int | None, size: tuple[int, int]) -> None:
    """Refuse an input size whose attention scores alone (tokens^2 x heads float32 values, one layer, batch 1)
    would need more than half of this machine's RAM: the export would die with an allocation failure."""
    memory = physical_memory()
    if not tokens or not memory:
        return
    need = int(tokens) ** 2 * max(int(heads or 1), 1) * 4
    if need > memory // 2:
        raise UsageError(f"input size {size[0]}x{size[1]} gives {tokens} tokens, whose attention scores need {need / 2**30:.1f} GiB "
                         f"per layer at batch 1, more than half of this machine's {memory / 2**30:.1f} GiB; use a smaller --input-size")

# relative: normalized images spread over ~1, and float32 still tells 1 part in 10**7 apart; inputs spread less than
# this around their size are one value (datasources.base.check_inputs_vary, models.batch_check)
INPUT_SPREAD_FLOOR = 1e-4


def input_spread(images) -> tuple[float, float, bool]:
    """(spread: largest minus smallest value, centre: mean magnitude, whether the images vary): they vary when the
    spread is finite and above ``INPUT_SPREAD_FLOOR`` around their size. One rule for the calibration's data check and
    the batch check, so that inputs one of them finds one value the other does too."""
    x = np.asarray(images, dtype=np.float64)
    spread, centre = float(x.max() - x.min()), float(np.abs(x).mean())
    return spread, centre, bool(np.isfinite(spread) and spread > INPUT_SPREAD_FLOOR * (1.0 + centre))
