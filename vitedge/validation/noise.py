"""Telling real accuracy loss from near-tie noise: the statistics behind the classifier gate rows.

An INT8 graph perturbs every logit a little. On an image where FP32 is decisive that changes
nothing; on an image where FP32 hesitates between two classes (a near-tie) it can flip the top-1,
and on low-accuracy models many images are near-ties. Such a flip is not a loss: FP32 itself was
about as likely to be wrong as right there. Two measurements separate the two (docs/gate.md):

* **with labels, a paired test of the top-1 drop.** Only the discordant images carry information:
  ``b`` that FP32 gets right and INT8 wrong, ``c`` the reverse; the drop is ``(b - c) / N``. Given
  ``n = b + c``, ``b`` is binomial(n, pi) and the drop is ``n / N * (2 pi - 1)``: the exact
  (Clopper-Pearson) interval for ``pi`` gives an exact confidence interval for the drop, conditional
  on ``n`` (McNemar's exact test is the same binomial). A drop whose interval reaches down to the
  limit is not shown to exceed it.
* **with or without labels, the FP32 margin.** An image is *decisive* when FP32's top-1 softmax
  probability exceeds its runner-up's by at least ``near_tie_margin`` (default 0.5). A flip on a
  near-tie costs at most that margin of expected top-1 under FP32's own probabilities. The *expected
  drop* (``max_expected_drop``) sums, over the flipped images, FP32's probability of its own class minus
  its probability of the class INT8 chose: a label-free estimate of the top-1 drop, pessimistic for the
  over-confident low-accuracy models, so with labels FP32's probabilities are first calibrated by one
  temperature >= 1 fitted on them (``fit_temperature``, docs/gate.md); without labels they are softened by the
  stand-in ``UNLABELLED_TEMPERATURE``, or by the smaller ``LEANING_TEMPERATURE`` when INT8's flips lean one way
  between classes (``flip_symmetry_p``): then they are no unbiased noise, and their cost is FP32's calibration's.
* **the decisive flip rate estimated from every decisive image** (``decisive_flip_estimate``): the margin INT8 took
  off each sure answer, paired with every sure answer's margin; far less spread than the flip count on a few hundred
  images.

The gate (``vitedge.validation.run.evaluate_gate``, docs/gate.md) uses them so:

* ``min_decisive_agreement`` (its own row, always judged, labels or not): agreement on the decisive images meets
  its limit. A flip where FP32 was decisive is a change of behaviour whatever the labels say, so nothing excuses
  it. Its outcomes (``decisive_outcome``): a loss, too few images to tell (both fail), or a pass. It needs at least ``MIN_DECISIVE`` decisive images; with fewer (or ``near_tie_margin`` 0) it is not judged
  and overall agreement is judged plainly instead.
* ``max_top1_drop`` (with labels): passes when the drop is within the limit, fails when its confidence interval
  lies wholly above the limit (a proven loss); in between it is not decided ("within noise", with how many
  labelled images it would take to tell). Labels can add a failure; they never excuse one.
* ``min_agreement``: its literal meaning. Where the decisive row judges, overall agreement under its limit is
  shown as information (the flips beyond it are near-ties), not as a pass.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from vitedge.targets.profiles import DEFAULT_DROP_CONFIDENCE, DEFAULT_MIN_DECISIVE_AGREEMENT, DEFAULT_NEAR_TIE_MARGIN  # noqa: F401 - the defaults live with Thresholds
from vitedge.validation.sanity import fp32_at_chance

MIN_DECISIVE = 30  # decisive images the decisive-agreement row needs before it judges (fewer: plain agreement)


def softmax(x: np.ndarray) -> np.ndarray:
    z = x.astype(np.float64) - x.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def fp32_margins(ref: np.ndarray) -> np.ndarray:
    """Per image: FP32's top-1 softmax probability minus its runner-up's (1.0 with one class)."""
    if ref.shape[1] < 2:
        return np.ones(len(ref))
    p = np.sort(softmax(ref), axis=1)
    return p[:, -1] - p[:, -2]


def _log_binom_pmf(k: np.ndarray, n: int, p: float) -> np.ndarray:
    if p <= 0.0:
        return np.where(k == 0, 0.0, -np.inf)
    if p >= 1.0:
        return np.where(k == n, 0.0, -np.inf)
    lg = np.vectorize(math.lgamma)
    return lg(n + 1) - lg(k + 1) - lg(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)


def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    ks = np.arange(k, n + 1)
    return float(min(1.0, np.exp(_log_binom_pmf(ks, n, p)).sum()))


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    ks = np.arange(0, k + 1)
    return float(min(1.0, np.exp(_log_binom_pmf(ks, n, p)).sum()))


def clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """The exact two-sided interval for a binomial proportion with ``k`` successes in ``n`` trials."""
    if n <= 0:
        return 0.0, 1.0
    alpha = (1.0 - confidence) / 2.0

    def solve(f, target: float) -> float:  # f increasing in p: bisection to 1e-10
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2.0
            if f(mid) < target:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2.0

    lower = 0.0 if k == 0 else solve(lambda p: binom_sf(k, n, p), alpha)  # P(X >= k | p) = alpha
    upper = 1.0 if k == n else solve(lambda p: 1.0 - binom_cdf(k, n, p), 1.0 - alpha)  # P(X <= k | p) = alpha
    return lower, upper


def paired_drop(ref_pred: np.ndarray, got_pred: np.ndarray, labels: np.ndarray, confidence: float) -> dict[str, Any]:
    """The top-1 drop (points) with its exact paired confidence interval and the one-sided p-value of
    "INT8 loses no top-1" (exact binomial on the discordant pairs, McNemar's exact test)."""
    right_ref, right_got = ref_pred == labels, got_pred == labels
    b = int(np.sum(right_ref & ~right_got))
    c = int(np.sum(~right_ref & right_got))
    ci, p_value = discordant_interval(b, c, len(labels), confidence)
    return {
        "top1_discordant": {"fp32_only": b, "int8_only": c},
        "top1_drop_ci_points": ci,
        "top1_drop_confidence": float(confidence),
        "top1_loss_p_value": p_value,
    }


def discordant_interval(lost: int, gained: int, total: int, confidence: float) -> tuple[list[float], float]:
    """The exact confidence interval (points) of a paired drop ``(lost - gained) / total`` and the one-sided p-value of
    "no loss": ``lost`` items right before and wrong after, ``gained`` the reverse (McNemar's exact test)."""
    n = lost + gained
    if not n:
        return [0.0, 0.0], 1.0
    lo_pi, hi_pi = clopper_pearson(lost, n, confidence)
    scale = 100.0 * n / max(total, 1)
    return [scale * (2.0 * lo_pi - 1.0), scale * (2.0 * hi_pi - 1.0)], binom_sf(lost, n, 0.5)


EXPECTED_DROP_Z = 1.645  # one-sided 95 % (normal approximation of the mean of the per-image costs)
EXPECTED_DROP_SLACK = 0.5  # points: max_expected_drop = max_top1_drop + this (docs/gate.md)


def fit_temperature(ref: np.ndarray, labels: np.ndarray) -> float:
    """The one temperature ``T`` >= 1 that makes FP32's probabilities ``softmax(ref / T)`` fit the labels best (the mean
    negative log-likelihood, minimised over T in [1, 50] by ternary search on log T; convex there). Never below 1:
    calibration corrects an over-confident FP32 and leaves the rest as it is. A fit below 1 comes from the images FP32
    is sure and right on and would sharpen its near-ties as well, pricing a coin-flip near-tie as a loss."""
    z = ref.astype(np.float64)
    rows = np.arange(len(z))

    def nll(log_t: float) -> float:
        s = z / math.exp(log_t)
        s = s - s.max(axis=1, keepdims=True)
        return float(np.mean(np.log(np.exp(s).sum(axis=1)) - s[rows, labels]))

    lo, hi = 0.0, math.log(50.0)
    for _ in range(60):
        a, b = lo + (hi - lo) / 3.0, hi - (hi - lo) / 3.0
        if nll(a) < nll(b):
            hi = b
        else:
            lo = a
    return math.exp((lo + hi) / 2.0)


UNLABELLED_TEMPERATURE = 2.5  # the stand-in for a fitted temperature where no labels can calibrate FP32 (docs/gate.md)
# Without labels, when INT8's flips lean one way between classes (``flip_symmetry_p`` under FLIP_LEAN_ALPHA), the
# stand-in softens FP32's probabilities less: the near-tie flips are then no unbiased noise (docs/gate.md)
LEANING_TEMPERATURE = 1.5
FLIP_LEAN_ALPHA = 0.01
FLIP_SYMMETRY_DRAWS = 4000
SYMMETRY_DRAW_CELLS = 1_000_000  # binomial draws held at once (a 1,000-class model can flip between thousands of pairs)


def flip_symmetry_p(ref_pred: np.ndarray, got_pred: np.ndarray, classes: int, draws: int = FLIP_SYMMETRY_DRAWS) -> float | None:
    """How likely INT8's flips are to lean between classes as much as they do if they were unbiased noise: Bowker's
    test of symmetry of the paired FP32/INT8 top-1 table, its p-value by Monte Carlo (seeded, so the same outputs give
    the same p). An INT8 graph that only perturbs the logits a little flips an image from class a to b when FP32's
    a-over-b lead is just above 0, and from b to a when it is just below 0: with a continuous lead, as often one way
    as the other, whatever FP32's calibration. A graph that shifts the logits toward some classes (a clipped
    activation, a biased layer) moves images one way. Given a pair's ``s`` flips (a to b or b to a), under symmetry
    ``a to b`` is binomial(s, 1/2); the statistic sums ``(n_ab - n_ba)^2 / s`` over the pairs. None without a flip."""
    flipped = ref_pred != got_pred
    if not flipped.any():
        return None
    table = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(table, (ref_pred[flipped], got_pred[flipped]), 1)
    upper = np.triu_indices(classes, 1)
    pairs = (table + table.T)[upper]
    one_way = table[upper]
    keep = pairs > 0
    pairs, one_way = pairs[keep], one_way[keep]
    observed = float(np.sum((2 * one_way - pairs) ** 2 / pairs))
    rng, as_large = np.random.default_rng(0), 0
    rows = max(1, SYMMETRY_DRAW_CELLS // len(pairs))  # draws per block: memory stays bounded with many class pairs
    for start in range(0, draws, rows):  # the generator fills blocks in the order one (draws, pairs) array would take
        simulated = rng.binomial(np.broadcast_to(pairs, (min(rows, draws - start), len(pairs))), 0.5)
        as_large += int(np.sum(np.sum((2 * simulated - pairs) ** 2 / pairs, axis=1) >= observed - 1e-9))
    return float((1 + as_large) / (draws + 1))


def decisive_flip_estimate(ref: np.ndarray, got: np.ndarray, margin: float) -> float | None:
    """A smooth estimate of the share of FP32's decisive images INT8 flips, from every decisive image rather than the
    few flips: per decisive image ``i`` FP32's lead ``f_i`` (its top logit minus the largest other) and how much INT8
    took off that lead, ``loss_i`` (FP32's lead minus INT8's lead of the same class). A flip is ``loss_i > f_i``; the
    estimate is the share of pairs ``(i, j)`` with ``loss_j > f_i``: how often the losses INT8 showed on these images
    would flip their decisions if any loss could land on any of them. Unlike the flip count it moves with every
    image's error, so a few hundred images tell a build at the limit from one at the loss line better than the count
    does (docs/gate.md). None without a decisive image or with one class."""
    leads = decisive_leads(ref, got, margin)
    return None if leads is None else _estimate(*leads)


def _estimate(f: np.ndarray, loss: np.ndarray) -> float:
    loss = np.sort(loss)
    beaten = len(loss) - np.searchsorted(loss, f, side="right")  # per i: the losses j with loss_j > f_i
    return float(beaten.sum()) / float(len(f)) ** 2


def decisive_leads(ref: np.ndarray, got: np.ndarray, margin: float) -> tuple[np.ndarray, np.ndarray] | None:
    """Per decisive image (FP32's margin at least ``margin``): FP32's lead ``f`` (its top logit minus the largest
    other) and INT8's ``loss`` of it (FP32's lead minus INT8's lead of the same class), in float64; None without a
    decisive image or with one class. What ``decisive_flip_estimate`` and its spread are computed from."""
    if ref.shape[1] < 2:
        return None
    decisive = fp32_margins(ref) >= margin
    if not decisive.any():
        return None
    r, g = ref[decisive].astype(np.float64), got[decisive].astype(np.float64)
    rows, top = np.arange(len(r)), r.argmax(1)

    def lead(z: np.ndarray) -> np.ndarray:
        others = z.copy()
        others[rows, top] = -np.inf
        return z[rows, top] - others.max(axis=1)

    f = lead(r)
    return f, f - lead(g)


def decisive_flip_estimate_spread(ref: np.ndarray, got: np.ndarray, margin: float) -> float | None:
    """The standard error of ``decisive_flip_estimate``, from its first-order (Hoeffding) projection: the estimate is the
    mean over pairs ``(i, j)`` of ``[loss_j > f_i]``, each image giving both an ``f`` and a ``loss``, so its variance is
    about ``Var(a_k + b_k) / n`` with ``a_k`` the share of losses over image k's lead and ``b_k`` the share of leads
    under image k's loss. None where the estimate is None."""
    leads = decisive_leads(ref, got, margin)
    return None if leads is None else _spread(*leads)


def _spread(f: np.ndarray, loss: np.ndarray) -> float:
    n = len(f)
    if n < 2:
        return 0.0
    a = (n - np.searchsorted(np.sort(loss), f, side="right")) / n  # per k: the losses over its lead
    b = np.searchsorted(np.sort(f), loss, side="left") / n  # per k: the leads under its loss
    return float(np.std(a + b, ddof=1)) / math.sqrt(n)


def near_ties(ref: np.ndarray, got: np.ndarray, margin: float, labels: np.ndarray | None = None) -> dict[str, Any]:
    """Agreement on the images where FP32 is decisive, the flips on near-ties, and the expected top-1
    drop under FP32's own probabilities. With ``labels`` (FP32 not at chance on them) those probabilities are first
    calibrated by one temperature fitted on them (``fit_temperature``): an over-confident FP32 (the corpus's 55-60 %
    CIFAR-10 ViTs give their top class 0.9 on average) would otherwise price every near-tie flip several times over
    (docs/gate.md). The decisive images are FP32's own margins, uncalibrated, either way."""
    ref_pred, got_pred = ref.argmax(1), got.argmax(1)
    flips = ref_pred != got_pred
    gaps = fp32_margins(ref)
    decisive = gaps >= margin
    temperature, source = UNLABELLED_TEMPERATURE, "stand-in"
    symmetry_p = flip_symmetry_p(ref_pred, got_pred, int(ref.shape[1]))
    if labels is not None and len(ref) > 1 and not fp32_at_chance(float(np.mean(ref_pred == labels)), int(ref.shape[1]), len(ref)):
        temperature, source = fit_temperature(ref, labels), "labels"
    elif symmetry_p is not None and symmetry_p < FLIP_LEAN_ALPHA:
        temperature, source = LEANING_TEMPERATURE, "stand-in, flips lean"
    p = softmax(ref.astype(np.float64) / temperature)
    rows = np.arange(len(ref))
    costs = p[rows, ref_pred] - p[rows, got_pred]
    expected = float(np.sum(costs)) / max(len(ref), 1)
    # one-sided 95 % upper bound: the mean of the per-image costs plus EXPECTED_DROP_Z standard errors
    spread = float(np.std(costs, ddof=1)) / math.sqrt(len(ref)) if len(ref) > 1 else 0.0
    n_decisive = int(decisive.sum())
    leads = decisive_leads(ref, got, margin)  # the flip-rate estimate and its spread read the same leads
    return {
        "near_tie_margin": float(margin),
        "decisive_samples": n_decisive,
        "decisive_agreement": float(np.mean(~flips[decisive])) if n_decisive else None,
        "decisive_flips": int(np.sum(flips & decisive)),
        "near_tie_flips": int(np.sum(flips & ~decisive)),
        "expected_drop_points": 100.0 * expected,
        "expected_drop_points_upper": 100.0 * (expected + EXPECTED_DROP_Z * spread),
        "expected_drop_points_temperature": temperature,
        "expected_drop_points_temperature_from": source,  # labels: fitted on them; stand-in: UNLABELLED_TEMPERATURE (no labels, or FP32 at chance); "stand-in, flips lean": LEANING_TEMPERATURE
        "flip_symmetry_p": symmetry_p,
        "decisive_flip_estimate": None if leads is None else _estimate(*leads),
        "decisive_flip_estimate_spread": None if leads is None else _spread(*leads),
        "fp32_margin_median": float(np.median(gaps)) if len(gaps) else None,
    }


def drop_within_noise(accuracy: dict[str, Any], limit: float) -> bool:
    """Whether the top-1 drop's confidence interval reaches down to ``limit`` (not shown to exceed it)."""
    ci = accuracy.get("top1_drop_ci_points")
    return bool(ci) and ci[0] <= limit + 1e-9


def images_to_tell(accuracy: dict[str, Any], limit: float) -> int | None:
    """About how many labelled images it would take, at the discordance and drop measured, for the drop's
    interval to lie wholly above ``limit`` (points): McNemar's normal approximation, ``N = z^2 (d - D^2) / (D - L)^2``
    with ``d`` the discordant share, ``D`` the drop and ``L`` the limit (fractions). None when the drop is not over it."""
    drop, d = accuracy.get("top1_drop_points"), accuracy.get("top1_discordant")
    samples = accuracy.get("samples") or 0
    if drop is None or not d or not samples or drop <= limit + 1e-9:
        return None
    z = _normal_quantile(0.5 + float(accuracy.get("top1_drop_confidence", 0.95)) / 2.0)
    share, big_d, lim = (d["fp32_only"] + d["int8_only"]) / samples, drop / 100.0, limit / 100.0
    return int(math.ceil(z * z * max(share - big_d * big_d, 1e-12) / (big_d - lim) ** 2))


DETECT_LOSS_POINTS = 1.0  # the top-1 loss a validation set should be able to show (issue 43: "too few images" below it)


def images_to_detect_loss(accuracy: dict[str, Any], limit: float) -> tuple[float, int] | None:
    """(loss, images): about how many labelled images it would take for the paired test to show a loss of ``loss``
    points (``DETECT_LOSS_POINTS``, or the limit + 0.5 when that is larger) beyond ``limit``, at the rate of
    disagreement measured (at least the loss itself): McNemar's normal approximation as in ``images_to_tell``.
    None without labels."""
    d, samples = accuracy.get("top1_discordant"), accuracy.get("samples") or 0
    if not d or not samples or accuracy.get("top1_drop_points") is None:
        return None
    loss = max(DETECT_LOSS_POINTS, limit + EXPECTED_DROP_SLACK)
    z = _normal_quantile(0.5 + float(accuracy.get("top1_drop_confidence", 0.95)) / 2.0)
    big_d, lim = loss / 100.0, limit / 100.0
    share = max((d["fp32_only"] + d["int8_only"]) / samples, big_d)
    return loss, int(math.ceil(z * z * (share - big_d * big_d) / (big_d - lim) ** 2))


def _normal_quantile(p: float) -> float:
    """The standard normal quantile (bisection on erf: no scipy)."""
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2.0
        if 0.5 * (1.0 + math.erf(mid / math.sqrt(2.0))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def decisive_judged(accuracy: dict[str, Any], margin: float) -> bool:
    """Whether the decisive-agreement row judges (the near-tie rule is on and FP32 is decisive on at least
    ``MIN_DECISIVE`` images); else overall agreement is judged plainly."""
    return margin > 0 and accuracy.get("decisive_agreement") is not None and accuracy.get("decisive_samples", 0) >= MIN_DECISIVE


def allowed_flips(limit: float, images: int) -> int:
    """The most top-1 disagreements on ``images`` images that agreement >= ``limit`` allows."""
    return math.floor((1.0 - limit) * images + 1e-9)


DECISIVE_BOUND_CONFIDENCE = 0.9  # one-sided: the decisive flip rate's upper bound, for the "too few decisive images" line
DECISIVE_LOSS_FACTOR = 2.0  # the loss line of the decisive row: this many times the flips its limit allows (0.5 % -> 1 %)


def decisive_loss_line(limit: float) -> float:
    """The decisive flip rate past which a build counts as a loss (docs/gate.md: 1 % at the default 99.5 % limit)."""
    return DECISIVE_LOSS_FACTOR * (1.0 - limit)


@lru_cache(maxsize=4096)
def flip_rate_upper(flips: int, images: int, confidence: float = DECISIVE_BOUND_CONFIDENCE) -> float:
    """The one-sided upper (Clopper-Pearson) bound of a flip rate: the rate ``p`` at which ``flips`` or fewer of
    ``images`` would be seen with probability ``1 - confidence``."""
    if images <= 0 or flips >= images:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):  # P(X <= flips | p) decreases in p
        mid = (lo + hi) / 2.0
        if binom_cdf(flips, images, mid) > 1.0 - confidence:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def decisive_images_to_tell(flips: int, images: int, limit: float, confidence: float = DECISIVE_BOUND_CONFIDENCE) -> int | None:
    """About how many decisive images it would take, at the flip rate seen, for the flip rate's one-sided upper bound to
    fall within the loss line (``decisive_loss_line``): the decisive row can then tell a build at its limit from one at
    the loss line. None when the rate seen is over the limit. With no flip: the fewest decisive images whose bound with
    no flip is within the line (230 at 0.995 and 90 %)."""
    line, rate = decisive_loss_line(limit), flips / max(images, 1)
    if line <= 0 or line >= 1 or rate > 1.0 - limit + 1e-12:
        return None
    if flips == 0:  # (1 - line)^n <= 1 - confidence
        return max(images, int(math.ceil(math.log(1.0 - confidence) / math.log(1.0 - line))))
    n = max(images, 1)
    while n < 10_000_000:
        k = int(round(rate * n))
        if flip_rate_upper(k, n, confidence) <= line + 1e-12 and k <= allowed_flips(limit, n):
            return n
        n = int(math.ceil(n * 1.05)) + 1
    return None


OK, LOSS, TOO_FEW = "pass", "loss", "too few"  # decisive_outcome's verdicts


DECISIVE_ESTIMATE_Z = 1.645  # one-sided 95 %: the estimate's upper bound that can tell a build with a flip (docs/gate.md)


def decisive_outcome(flips: int, images: int, estimate: float | None, limit: float,
                     confidence: float = DECISIVE_BOUND_CONFIDENCE, spread: float | None = None,
                     estimate_z: float = DECISIVE_ESTIMATE_Z, estimate_within: float | None = None) -> tuple[str, str]:
    """The decisive row's verdict on ``flips`` of ``images`` decisive images and the smooth flip-rate estimate
    (``decisive_flip_estimate``), with why: LOSS when the flips exceed what the loss line (``decisive_loss_line``, 1 % at
    0.995) allows, or the estimate is over that line; else TOO_FEW when the images cannot tell the limit from the loss
    line: the flips exceed what the limit allows (but not the loss line), the estimate is over the limit, or, once there
    is a flip, the flip rate's one-sided upper bound (``flip_rate_upper``) is over the loss line; else OK (no flip with
    the estimate within the limit passes at any image count). Nothing excuses a flip: a count over the limit never
    passes (docs/gate.md)."""
    line = decisive_loss_line(limit)
    if flips > allowed_flips(1.0 - line, images):
        return LOSS, f"more than the {allowed_flips(1.0 - line, images)} the {100 * (1 - line):g}% loss line allows"
    if estimate is not None and estimate > line + 1e-12:
        return LOSS, f"the estimated flip rate {100 * estimate:.2f}% is over the {100 * line:g}% loss line"
    if flips > allowed_flips(limit, images):
        return TOO_FEW, (f"{flips} flips miss the limit, yet so few decisive images cannot show a rate over the {100 * line:g}% "
                         "loss line")
    if estimate is not None and estimate > 1.0 - limit + 1e-12:
        return TOO_FEW, f"the estimated flip rate {100 * estimate:.2f}% lies between the limit and the loss line"
    upper = flip_rate_upper(flips, images, confidence)
    if flips and upper > line + 1e-12:
        within = 1.0 - limit if estimate_within is None else estimate_within
        if estimate is not None and spread is not None and estimate + estimate_z * spread <= within + 1e-12:
            return OK, ""  # the estimate tells what the count cannot: its upper bound is within the limit
        return TOO_FEW, f"with {flips} flips the flip rate's {100 * confidence:g}% upper bound is {100 * upper:.2f}%" + (
            "" if estimate is None or spread is None else
            f" and the estimate's upper bound {100 * (estimate + estimate_z * spread):.2f}% is over {100 * within:g}%")
    return OK, ""


def certain_agreement_miss(ref: np.ndarray, got: np.ndarray, min_agreement: float, margin: float,
                           min_decisive_agreement: float = DEFAULT_MIN_DECISIVE_AGREEMENT) -> str | None:
    """Early stop of the accuracy budget: whether the first ``len(got)`` outputs already make an agreement row
    fail whatever the rest gives (``ref`` covers every item). Exact: disagreements only grow. Where the decisive
    row judges (at least ``MIN_DECISIVE`` decisive images, ``margin`` > 0), it fails for sure once the decisive
    images' flips exceed what its limit allows on all of them; elsewhere overall agreement is the plain rule."""
    total, n = len(ref), len(got)
    pred, head = got.argmax(1), ref[:n].argmax(1)
    flips = head != pred
    if margin > 0:
        decisive = fp32_margins(ref) >= margin
        total_decisive = int(decisive.sum())
        if total_decisive >= MIN_DECISIVE:
            allowed_decisive = allowed_flips(min_decisive_agreement, total_decisive)
            if int(np.sum(flips & decisive[:n])) <= allowed_decisive:
                return None
            return (f"stopped after {n} of {total} items: {int(np.sum(flips & decisive[:n]))} top-1 disagreements on images where FP32 "
                    f"is decisive already exceed the {allowed_decisive} that decisive agreement >= {100 * min_decisive_agreement:g}% "
                    f"allows on its {total_decisive} decisive images")
    allowed = allowed_flips(min_agreement, total)
    if int(flips.sum()) <= allowed:
        return None
    return (f"stopped after {n} of {total} items: {int(flips.sum())} top-1 disagreements with FP32 already exceed the {allowed} "
            f"that agreement >= {100 * min_agreement:g}% allows")


# The FP32 preprocessing probe (docs/gate.md): a wrong --mean damages FP32 itself and INT8 follows it, so
# no INT8-vs-FP32 statistic sees it; FP32's own top-1 with the mean moved does.
PROBE_MEAN_SHIFT = 0.25  # in [0, 1] pixel units, each way
PROBE_MIN_GAIN_POINTS = 1.0
PROBE_MAX_P = 0.001


def probe_shifts(std: tuple[float, ...], shift: float = PROBE_MEAN_SHIFT) -> dict[float, np.ndarray]:
    """Mean shift (pixel units) -> what to add to a model-ready NCHW batch: moving the mean by ``m``
    moves ``(x - mean) / std`` by ``-m / std``."""
    s = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    return {m: (-m / s).astype(np.float32) for m in (-shift, shift)}


def preprocessing_probe(ref: np.ndarray, shifted: dict[float, np.ndarray], labels: np.ndarray) -> dict[str, Any]:
    """Whether FP32 is significantly more accurate with its mean moved: per shift, its top-1, the gain in
    points and the one-sided exact p-value of "no gain" on the discordant images. ``suspect`` when a shift
    gains at least PROBE_MIN_GAIN_POINTS with p below PROBE_MAX_P.

    Where FP32 is at chance on ``labels`` (``fp32_at_chance``) only a shift that also takes FP32 out of chance
    counts: on labels FP32 gets wrong (class folders that do not map to the model's classes) any shift that
    makes FP32 worse moves it towards chance and "gains" (the digits ViT with its folders rotated by one:
    0.8 % -> 10.1 % at p 7e-11), while a mean wrong enough to put FP32 at chance is moved back well above it."""
    right = ref.argmax(1) == labels
    classes, items = int(ref.shape[1]), len(labels)
    at_chance = fp32_at_chance(float(np.mean(right)), classes, items)
    rows = []
    for m, logits in sorted(shifted.items()):
        other = logits.argmax(1) == labels
        gained, lost = int(np.sum(other & ~right)), int(np.sum(right & ~other))
        rows.append({"mean_shift": float(m), "fp32_top1": float(np.mean(other)), "gain_points": 100.0 * (gained - lost) / len(labels),
                     "p_value": binom_sf(gained, gained + lost, 0.5) if gained + lost else 1.0})
    counted = [r for r in rows if not at_chance or not fp32_at_chance(r["fp32_top1"], classes, items)]
    best = max(counted, key=lambda r: r["gain_points"]) if counted else None
    suspect = best is not None and best["gain_points"] >= PROBE_MIN_GAIN_POINTS and best["p_value"] < PROBE_MAX_P
    return {"fp32_top1": float(np.mean(right)), "fp32_at_chance": at_chance, "shifts": rows, "suspect": bool(suspect),
            "suspect_shift": best["mean_shift"] if suspect else None}


def probe_text(probe: dict[str, Any]) -> str:
    """The line of a suspect probe: the shift that made it suspect (``preprocessing_probe``'s rule)."""
    shifts = probe["shifts"]
    best = next((r for r in shifts if r["mean_shift"] == probe.get("suspect_shift")), None) or max(shifts, key=lambda r: r["gain_points"])
    return (f"FP32 itself gains {best['gain_points']:.1f} points of top-1 ({100 * probe['fp32_top1']:.1f}% -> "
            f"{100 * best['fp32_top1']:.1f}%, exact paired p {best['p_value']:.1g}) with the mean moved by {best['mean_shift']:+g}: "
            "the preprocessing looks wrong (INT8 follows FP32 there), check --mean/--std")
