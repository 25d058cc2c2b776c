"""Confidence intervals and tests over seeds, the verdict they give a claim, and Holm's correction for
a family of claims. Pure functions, no I/O.

Which interval is used where (docs/results/README.md, "Protocol", says the same):

- a mean over seeds (a test accuracy, a paired difference between two algorithms, a temporal
  efficiency per seed): the **t interval** ``mean ± t_{1-a/2, n-1} · s / sqrt(n)`` (``t_interval``);
  its test, ``paired_t``, gives the p values that ``holm`` adjusts;
- a ratio of means (the gap closure ``(mean_X - mean_lo) / (mean_hi - mean_lo)``): the report's
  protocol section still uses the **percentile bootstrap over seeds** (``bootstrap``): the seeds are
  resampled with replacement, the same seeds for every algorithm of the ratio (they are paired: a seed
  fixes the data order, the shards and the initial weights), exactly (every one of the n^n resamples)
  for n <= ``EXACT_MAX``, else from ``resamples`` draws of a ``random.Random(seed)``; the interval is
  the a/2 and 1 - a/2 quantiles of the statistic over the resamples (the smallest value whose share at
  or below it reaches q). **It is too narrow at a few seeds**: a nominal 95% covers about 83% at 5
  seeds, 87% at 7 and 90% at 10 (``tests/test_intervals.py``). New analyses use ``intervals.py``
  (Fieller's interval for the closure, a t interval on the log ratio, BCa), whose coverage that test
  shows.

``verdict(interval, null, direction)``: an interval that holds the no-effect value ``null`` (or does not
exist: fewer than 2 seeds, a NaN) is **inconclusive**; one wholly on the side the claim predicts
(``direction`` +1: above ``null``, -1: below) means the claim **holds**; wholly on the other side, it
**does not hold**. ``verdict`` makes no correction for multiple comparisons: a report with many verdicts
holds some that are wrong by chance at the rate ``1 - level`` each. ``holm`` corrects a registered
family of claims (Holm's step-down on their p values: the chance of any false "holds" in the family
stays at most ``alpha``).
"""
from __future__ import annotations

import functools
import itertools
import math
import random
import statistics
from collections.abc import Callable, Sequence

LEVEL = 0.95
EXACT_MAX = 6          # up to 6 seeds the bootstrap enumerates all n^n resamples (6^6 = 46656)
RESAMPLES = 10000
BOOTSTRAP_SEED = 0
HOLDS, DOES_NOT_HOLD, INCONCLUSIVE = "holds", "does not hold", "inconclusive"


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_tail(t: float, df: float) -> float:
    """P(T > |t|) for Student's t with ``df`` degrees of freedom (0 for an infinite t)."""
    return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t)) if math.isfinite(t) else 0.0


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = _t_tail(t, df)
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on ``t_cdf``; cached:
    the intervals ask for the same few quantiles again and again)."""
    if not 0 < p < 1 or not df > 0:
        raise ValueError(f"need 0 < p < 1 and df > 0, got p={p!r}, df={df!r}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def finite(values) -> list[float]:
    """The finite numbers of ``values``, as floats (None, NaN, Inf, bools and strings left out)."""
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def t_interval(values: Sequence[float], level: float = LEVEL) -> dict:
    """{mean, lo, hi, n, method}: the t interval of the mean of ``values`` (NaN bounds under 2 values).
    A non-finite value (a diverged run) is kept as NaN: the interval is then NaN too, never silently
    computed over the seeds that happened to finish."""
    v = [float(x) for x in values]
    n = len(v)
    if n == 0 or any(not math.isfinite(x) for x in v):
        return {"mean": math.nan, "lo": math.nan, "hi": math.nan, "n": n, "method": "t"}
    mean = statistics.fmean(v)
    if n < 2:
        return {"mean": mean, "lo": math.nan, "hi": math.nan, "n": n, "method": "t"}
    half = t_quantile(0.5 + level / 2.0, n - 1) * statistics.stdev(v) / math.sqrt(n)
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n, "method": "t"}


def paired_t(diffs: Sequence[float], direction: int = 1) -> dict:
    """Student's t test that the mean of the paired differences ``diffs`` (one per seed) is 0::

        {"n", "mean", "sd", "se", "t", "df", "p_two_sided", "p_one_sided", "direction"}

    ``p_one_sided`` is the p value of the claim that the mean lies on the ``direction`` side of 0 (+1:
    above, -1: below): P(T >= t) for +1, P(T <= t) for -1. A non-finite difference (a diverged run)
    makes every figure but ``n`` and ``df`` NaN: it is never dropped. Fewer than 2 differences give NaN
    too (no spread to test against). Differences with no spread give t = ±inf and p = 0 when their mean
    is not 0, NaN when it is."""
    if direction not in (1, -1):
        raise ValueError(f"direction must be +1 (above 0) or -1 (below 0), got {direction!r}")
    v = [float(x) for x in diffs]
    n = len(v)
    out = {"n": n, "mean": math.nan, "sd": math.nan, "se": math.nan, "t": math.nan, "df": n - 1,
           "p_two_sided": math.nan, "p_one_sided": math.nan, "direction": direction}
    if n < 2 or any(not math.isfinite(x) for x in v):
        return out
    mean, sd = statistics.fmean(v), statistics.stdev(v)
    se = sd / math.sqrt(n)
    t = mean / se if se > 0 else (math.copysign(math.inf, mean) if mean != 0 else math.nan)
    out.update(mean=mean, sd=sd, se=se, t=t)
    if math.isnan(t):
        return out
    tail = _t_tail(t, n - 1)
    out.update(p_two_sided=min(1.0, 2.0 * tail), p_one_sided=tail if t * direction > 0 else 1.0 - tail)
    return out


def holm(pvalues: dict, alpha: float = 0.05) -> dict:
    """Holm's step-down correction of a family of p values: ``{name: {"p", "p_adjusted", "reject",
    "rank"}}``, in the order given.

    The m p values are sorted, p_(1) <= ... <= p_(m) (ties in the order given); the adjusted p value of
    the i-th is ``max over j <= i of min(1, (m - j + 1) p_(j))`` (monotone, capped at 1), and a claim
    is rejected (its effect holds) when its adjusted p value is at most ``alpha``: exactly the claims
    before the first i with ``p_(i) > alpha / (m - i + 1)``. A NaN (or missing) p value, a claim whose
    runs are missing or failed, is listed, never rejected, with a NaN adjusted p and no rank; it still
    counts in m, so the others are corrected as for the whole registered family (conservative)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    m = len(pvalues)
    p = {k: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
         for k, v in pvalues.items()}
    if any(not 0 <= x <= 1 for x in p.values() if not math.isnan(x)):
        raise ValueError(f"p values must lie in [0, 1], got {pvalues!r}")
    order = sorted((k for k in p if not math.isnan(p[k])), key=lambda k: p[k])
    out = {k: {"p": p[k], "p_adjusted": math.nan, "reject": False, "rank": None} for k in p}
    running = 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[k]))
        out[k].update(p_adjusted=running, reject=running <= alpha, rank=i + 1)
    return out


def quantile(values: Sequence[float], q: float) -> float:
    """The smallest of ``values`` whose share of values at or below it is at least ``q`` (inverse CDF)."""
    s = sorted(values)
    k = max(1, math.ceil(q * len(s) - 1e-9))
    return s[min(k, len(s)) - 1]


def bootstrap(columns: Sequence[Sequence[float]], statistic: Callable[..., float], level: float = LEVEL,
              resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """{value, lo, hi, n, method, undefined, reason}: the percentile bootstrap interval of ``statistic``.
    Too narrow at a few seeds (the module docstring); kept for the report's closure and its pages.

    ``columns`` are paired per seed (column j, entry i: seed i's value of the j-th quantity);
    ``statistic(*means)`` gets each column's mean over a resample. A resample whose statistic is not
    finite (a gap of zero or less in a ratio: the ratio is unbounded there) is counted in ``undefined``
    and kept, as lying beyond both ends: it lowers the lower quantile and raises the upper one (dropping
    it would narrow the interval exactly where the ratio is least known). When a bound falls among
    them (at least ``(1 - level) / 2`` of the resamples), the interval is unbounded: NaN bounds, and
    ``reason`` says why (None otherwise)."""
    cols = [[float(x) for x in c] for c in columns]
    n = len(cols[0]) if cols else 0
    method = "bootstrap (exact)" if n <= EXACT_MAX else f"bootstrap ({resamples} resamples, seed {seed})"
    nan = {"value": math.nan, "lo": math.nan, "hi": math.nan, "n": n, "method": method, "undefined": 0,
           "reason": "no seeds, unpaired columns, or a value that is not finite (a failed run)"}
    if n == 0 or any(len(c) != n for c in cols) or any(not math.isfinite(x) for c in cols for x in c):
        return nan
    value = statistic(*(statistics.fmean(c) for c in cols))
    if n < 2:
        return dict(nan, value=value, reason="fewer than 2 seeds")
    if n <= EXACT_MAX:
        draws = itertools.product(range(n), repeat=n)
    else:
        rng = random.Random(seed)
        draws = ([rng.randrange(n) for _ in range(n)] for _ in range(resamples))
    stats, undefined = [], 0
    for idx in draws:
        s = statistic(*(math.fsum(c[i] for i in idx) / n for c in cols))
        if math.isfinite(s):
            stats.append(s)
        else:
            undefined += 1
    alpha = 1.0 - level
    lo = quantile([-math.inf] * undefined + stats, alpha / 2.0)
    hi = quantile(stats + [math.inf] * undefined, 1.0 - alpha / 2.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return dict(nan, value=value, undefined=undefined, reason=(
            f"the statistic is undefined (not finite) in {undefined} of {len(stats) + undefined} resamples, at "
            f"least {alpha / 2:.1%}: the interval is unbounded"))
    return {"value": value, "lo": lo, "hi": hi, "n": n, "method": method, "undefined": undefined, "reason": None}


def ratio_of_gaps(x: float, lo: float, hi: float) -> float:
    """(x - lo) / (hi - lo): the gap closure; NaN where the gap ``hi - lo`` is not positive."""
    gap = hi - lo
    return (x - lo) / gap if gap > 0 else math.nan


def verdict(lo: float, hi: float, null: float, direction: int = 1) -> str:
    """``holds``, ``does not hold`` or ``inconclusive`` for a claim that the effect lies on the
    ``direction`` side (+1 above, -1 below) of the no-effect value ``null``, given its interval."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= null <= hi:
        return INCONCLUSIVE
    above = lo > null
    return HOLDS if above == (direction > 0) else DOES_NOT_HOLD
