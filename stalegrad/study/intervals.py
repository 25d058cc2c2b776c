"""Intervals that cover at 5-10 seeds. Pure functions, no I/O.

The percentile bootstrap of ``stats.bootstrap`` is too narrow at a few seeds: it covers about 87% at
7 seeds where it claims 95% (``tests/test_intervals.py`` measures it). The t-based intervals here are
shown by simulation in that file to cover 95% within a band of sampling error at n = 5, 7 and 10; the
bootstraps from 7 seeds (0.93-0.94), not at 5 (0.90-0.92). Which to use:

- a mean, or a paired difference: ``stats.t_interval`` (exact for normal per-seed values);
- a ratio of paired means whose denominator may come near 0, such as the gap closure
  ``(X - L) / (H - L)`` (numerator ``X - L``, denominator ``H - L`` per seed): ``fieller`` (exact for
  normal per-seed values; no interval, with the reason, when the denominator is not distinguishable
  from 0 at the level: the ratios the data allow are then unbounded);
- a ratio of positive paired means (``mean A / mean B``): ``log_ratio_interval``;
- any other statistic of paired per-seed columns: ``bca`` (bias-corrected and accelerated bootstrap);
- many correlated observations per run (probes): ``cluster_t_interval`` (the t interval over the runs'
  means) or ``cluster_bootstrap`` (whole runs resampled), never an interval that counts probes as
  independent.

Every function returns ``{"value", "lo", "hi", "n", "method", "reason"}``: ``value`` the estimate,
``n`` the number of seeds (runs), ``reason`` None, or why ``lo`` and ``hi`` are NaN.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from statistics import NormalDist

import numpy as np

from .stats import BOOTSTRAP_SEED, LEVEL, t_quantile

RESAMPLES = 10000
_NORMAL = NormalDist()


def _result(value, lo, hi, n, method, reason=None) -> dict:
    if reason is not None:
        lo = hi = math.nan
    return {"value": float(value), "lo": float(lo), "hi": float(hi), "n": n, "method": method, "reason": reason}


FEWER_THAN_2 = "fewer than 2 seeds"


def _columns(columns) -> tuple[list[np.ndarray], int, str | None]:
    """The per-seed columns as float64 arrays, their length n, and why they give no interval (None when
    they do; ``FEWER_THAN_2`` when they give an estimate but no interval)."""
    cols = [np.asarray(c, dtype=np.float64) for c in columns]
    n = len(cols[0]) if cols else 0
    if not cols or n == 0 or any(c.ndim != 1 or len(c) != n for c in cols):
        return cols, n, "no seeds, or the columns are not paired (one value per seed in each)"
    if any(not np.isfinite(c).all() for c in cols):
        return cols, n, "a value is not finite (a failed run): no interval over the others"
    return cols, n, FEWER_THAN_2 if n < 2 else None


def fieller(numerator: Sequence[float], denominator: Sequence[float], level: float = LEVEL) -> dict:
    """Fieller's interval for ``mean(numerator) / mean(denominator)``, paired per seed.

    For the true ratio r, ``d_i = numerator_i - r * denominator_i`` has mean 0, so its t statistic
    follows Student's t with n - 1 degrees of freedom (exactly, for normal per-seed values). The
    interval is every r whose t is within the two-sided quantile: the r with
    ``(mean_a - r mean_b)^2 <= q (s_aa - 2 r s_ab + r^2 s_bb)``, ``q = t^2 / n``, a quadratic in r.
    When ``mean_b^2 <= q s_bb`` (the denominator's own t interval holds 0) that set is unbounded: no
    interval, and the reason says so. The closure's gap ``H - L`` must be established for the same
    reason; here that condition is part of the interval."""
    method = "Fieller (t on the paired linear contrast)"
    (a, b), n, why = _columns([numerator, denominator])
    ma, mb = (a.mean(), b.mean()) if why in (None, FEWER_THAN_2) else (math.nan, math.nan)
    value = ma / mb if mb != 0 else math.nan
    if why is not None:
        return _result(value, 0, 0, n, method, why)
    s = np.cov(a, b, ddof=1)
    q = t_quantile(0.5 + level / 2.0, n - 1) ** 2 / n
    qa, qb, qc = mb * mb - q * s[1, 1], ma * mb - q * s[0, 1], ma * ma - q * s[0, 0]
    if qa <= 0:
        return _result(value, 0, 0, n, method, f"the denominator's mean {mb:.4g} is not distinguishable from 0 "
                       f"at {level:.0%} (its t interval holds 0): the ratios the data allow are unbounded")
    root = math.sqrt(max(qb * qb - qa * qc, 0.0))
    return _result(value, (qb - root) / qa, (qb + root) / qa, n, method)


def log_ratio_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> dict:
    """The interval of ``mean(a) / mean(b)`` for positive means, paired per seed: a t interval of
    ``log mean(a) - log mean(b)``, exponentiated.

    Its standard error is the delta method's, ``sd(z) / sqrt(n)`` with ``z_i = a_i / mean(a) -
    b_i / mean(b)`` (the pairing enters through the covariance of a and b), with t's n - 1 degrees of
    freedom. The delta method estimates the ratio of the means itself; the mean of per-seed log ratios
    would estimate the ratio of geometric means instead, another quantity, and would need every per-seed
    value positive. Working on the log scale keeps the interval positive and lets it be asymmetric, as
    a ratio's is."""
    method = "t on the log ratio (delta method)"
    (x, y), n, why = _columns([a, b])
    mx, my = (x.mean(), y.mean()) if why in (None, FEWER_THAN_2) else (math.nan, math.nan)
    value = mx / my if my != 0 else math.nan
    if why is None and not (mx > 0 and my > 0):
        why = f"the means are not both positive ({mx:.4g}, {my:.4g}): the log ratio is not defined"
    if why is not None:
        return _result(value, 0, 0, n, method, why)
    z = x / mx - y / my
    half = t_quantile(0.5 + level / 2.0, n - 1) * z.std(ddof=1) / math.sqrt(n)
    return _result(value, value * math.exp(-half), value * math.exp(half), n, method)


def _quantile_index(q: float, count: int) -> int:
    """The 0-based index of the ``q`` quantile among ``count`` sorted values (the inverse CDF)."""
    return min(max(math.ceil(q * count - 1e-9), 1), count) - 1


def _bca_bounds(value: float, boot: np.ndarray, jack: np.ndarray, level: float, n: int,
                expand: bool) -> tuple[float, float, str | None]:
    """(lo, hi, reason): the BCa interval from the bootstrap and jackknife values of a statistic.

    A resample whose statistic is not finite (a ratio whose gap is <= 0 in it) is not dropped: it
    counts as lying beyond both ends (it lowers the lower bound and raises the upper one), and as half
    below the estimate in the bias correction. When a bound falls among the undefined resamples (about
    ``(1 - level) / 2`` of them or more), or a jackknife value is undefined, there is no interval."""
    undefined = int((~np.isfinite(boot)).sum())
    alpha = 1.0 - level
    if not np.isfinite(jack).all():
        return math.nan, math.nan, "the statistic is undefined when one seed is left out (jackknife)"
    defined = np.sort(boot[np.isfinite(boot)])
    below = (defined < value).sum() + 0.5 * (defined == value).sum() + 0.5 * undefined
    share = min(max(below / len(boot), 0.5 / len(boot)), 1.0 - 0.5 / len(boot))
    z0 = _NORMAL.inv_cdf(share)
    d = jack.mean() - jack
    denom = 6.0 * (d * d).sum() ** 1.5
    accel = float((d ** 3).sum() / denom) if denom > 0 else 0.0
    bounds = []
    for q in (alpha / 2.0, 1.0 - alpha / 2.0):
        # Hesterberg's expansion: the t quantile and sqrt(n / (n - 1)) for the normal one, which makes
        # the bootstrap's plug-in spread (divided by n) as wide as the unbiased one and its tails t's
        zq = math.sqrt(n / (n - 1)) * t_quantile(q, n - 1) if expand else _NORMAL.inv_cdf(q)
        adjusted = _NORMAL.cdf(z0 + (z0 + zq) / (1.0 - accel * (z0 + zq)))
        bounds.append(adjusted)
    k_lo = _quantile_index(bounds[0], len(boot)) - undefined    # the undefined sit below every defined value
    k_hi = _quantile_index(bounds[1], len(boot))                # ... and above every one
    if k_lo < 0 or k_hi >= len(defined):
        return math.nan, math.nan, (f"the statistic is undefined (not finite) in {undefined} of {len(boot)} "
                                    "resamples, and a bound falls among them: the interval is unbounded")
    return float(defined[k_lo]), float(defined[k_hi]), None


def _leave_one_out(n: int) -> np.ndarray:
    """(n, n - 1) indices: row i holds every index but i (the jackknife's samples)."""
    return np.array([[j for j in range(n) if j != i] for i in range(n)])


def bca(columns: Sequence[Sequence[float]], statistic: Callable[..., np.ndarray], level: float = LEVEL,
        resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED, expand: bool = True) -> dict:
    """The BCa (bias-corrected and accelerated) bootstrap interval of ``statistic`` over paired seeds.

    ``columns``: one sequence per quantity, entry i the value of seed i (the seeds are resampled
    together: a seed fixes the data order, the shards and the initial weights of every algorithm).
    ``statistic(*cols)`` gets arrays whose last axis runs over the seeds of a sample and returns one
    value per leading index (``lambda x, lo, hi: (x.mean(-1) - lo.mean(-1)) / (hi.mean(-1) - lo.mean(-1))``).
    The resamples are ``resamples`` draws of ``numpy.random.default_rng(seed)``; the acceleration comes
    from the jackknife (each seed left out once), the bias correction from the share of resamples below
    the estimate (Efron 1987). ``expand`` (default) widens it for small n as Hesterberg (2015) does the
    percentile interval: t quantiles with n - 1 degrees of freedom times ``sqrt(n / (n - 1))`` in place of
    the normal ones. Expanded, it covers 93-94% at 7 and 10 seeds but only 90-92% at 5 (use a t-based
    interval there); without it, 83%, 88% and 91%, as little as the percentile bootstrap
    (``tests/test_intervals.py``). Undefined resamples: see ``_bca_bounds``."""
    method = f"BCa bootstrap{' (expanded)' if expand else ''} ({resamples} resamples, seed {seed})"
    cols, n, why = _columns(columns)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = float(statistic(*cols)) if why in (None, FEWER_THAN_2) else math.nan
    if why is None and not math.isfinite(value):
        why = "the statistic is not finite on the seeds themselves"
    if why is not None:
        return _result(value, 0, 0, n, method, why)
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = np.asarray(statistic(*(c[idx] for c in cols)), dtype=np.float64)
        jack = np.asarray(statistic(*(c[_leave_one_out(n)] for c in cols)), dtype=np.float64)
    lo, hi, reason = _bca_bounds(value, boot, jack, level, n, expand)
    return _result(value, lo, hi, n, method, reason)


def cluster_bootstrap(clusters: Sequence[Sequence[float]], statistic: Callable[[np.ndarray], float] | None = None,
                      level: float = LEVEL, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
                      expand: bool = True) -> dict:
    """The BCa interval of a statistic of pooled observations, resampling whole clusters (runs), not
    observations: the probes of one run share its weights and its trajectory, so they are correlated,
    and an interval that treats 130 of them as independent is far too narrow.

    ``clusters``: one sequence of observations per run. ``statistic(values)`` gets one resample's pooled
    observations (the resampled runs' concatenated) and returns a number; None (the default) is the
    pooled mean (every observation weighs the same; computed from each run's sum and count, so fast). The
    bootstrap draws runs with replacement (``numpy.random.default_rng(seed)``), the jackknife leaves out
    one run, and the interval is ``bca``'s (``expand`` with the number of runs as n). ``n`` counts runs."""
    method = (f"cluster BCa bootstrap{' (expanded)' if expand else ''} over runs ({resamples} resamples, "
              f"seed {seed})")
    data = [np.asarray(c, dtype=np.float64) for c in clusters]
    n = len(data)
    if n == 0 or any(c.ndim != 1 or len(c) == 0 for c in data):
        return _result(math.nan, 0, 0, n, method, "no runs, or a run with no observations")
    if any(not np.isfinite(c).all() for c in data):
        return _result(math.nan, 0, 0, n, method, "an observation is not finite: no interval over the others")
    sums, counts = np.array([c.sum() for c in data]), np.array([float(len(c)) for c in data])

    def pooled(rows: np.ndarray) -> np.ndarray:
        """The statistic of the pooled observations of each row of run indices."""
        if statistic is None:
            return sums[rows].sum(-1) / counts[rows].sum(-1)
        return np.array([statistic(np.concatenate([data[i] for i in row])) for row in rows], dtype=np.float64)

    value = float(pooled(np.arange(n)[None, :])[0])
    if n < 2:
        return _result(value, 0, 0, n, method, "fewer than 2 runs")
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = pooled(np.random.default_rng(seed).integers(0, n, size=(resamples, n)))
        jack = pooled(_leave_one_out(n))
    lo, hi, reason = _bca_bounds(value, boot, jack, level, n, expand)
    return _result(value, lo, hi, n, method, reason)


def cluster_t_interval(clusters: Sequence[Sequence[float]], level: float = LEVEL) -> dict:
    """The t interval over the runs' own means (every run weighs the same, whatever its number of
    observations): the correlated observations of one run count once. ``n`` counts runs."""
    method = "t interval over the runs' means"
    means = [float(np.mean(c)) if len(c) else math.nan for c in clusters]
    (m,), n, why = _columns([means])
    if why is not None:
        return _result(m.mean() if why == FEWER_THAN_2 else math.nan, 0, 0, n, method, why)
    half = t_quantile(0.5 + level / 2.0, n - 1) * m.std(ddof=1) / math.sqrt(n)
    return _result(m.mean(), m.mean() - half, m.mean() + half, n, method)
