"""stalegrad/study/intervals.py: intervals that cover at 5-10 seeds (issue 31, item 6), shown by simulation.

Each coverage test draws many synthetic experiments from a known distribution with a fixed seed, computes
the 95% interval of each, and counts how often it holds the true value. With R replications the count's
standard error is sqrt(0.95 x 0.05 / R) (0.5 points at R = 2000, 0.7 at R = 1000), so the band
[0.92, 0.975] is 4-6 standard errors below and 3-5 above the nominal 0.95: an interval that covers
95% passes, one that covers 90% fails.

Measured by these tests (their seeds and replications; R = 2000 for the first three rows, 1000 below):

================================================  ======  ======  ======
95% interval                                       n = 5   n = 7   n = 10
================================================  ======  ======  ======
t interval of a mean (stats.t_interval)            0.955   0.957   0.952
Fieller, the gap closure                           0.941   0.944   0.948
t on the log ratio (delta method), CV 20%          0.956   0.959   0.950
BCa, expanded, of a mean                           0.901   0.935   0.937
BCa, expanded, of the closure                      0.923   0.934   0.939
BCa, plain (Efron), of the closure                 0.829   0.878   0.909
percentile bootstrap (stats.bootstrap), closure    0.834   0.869   0.901
================================================  ======  ======  ======

(the last row: R = 1000 with 2000 resamples, measured once, closure_runs' experiments with seeds
12345 + n; the test re-measures it at 7 seeds on R = 300 and 500 resamples, for speed: 0.89.) Runs and
probes (7 runs of 130 probes, half the variance shared within a run, R = 1000): the cluster bootstrap
0.940, the t interval over the runs' means 0.944, the t interval over the probes as if independent 0.165
(R = 200), ten times narrower. So: at 5 seeds only the t-based intervals (t, Fieller, log ratio) cover;
BCa comes near nominal (0.93-0.94) from 7 seeds once expanded; the percentile bootstrap that the report
used for the closure covers about 87% at 7 seeds where it claims 95%.
"""
import math

import numpy as np
import pytest

from stalegrad.study.intervals import bca, cluster_bootstrap, cluster_t_interval, fieller, log_ratio_interval
from stalegrad.study.stats import bootstrap, ratio_of_gaps, t_interval

BAND = (0.92, 0.975)
CLOSURE = 0.3        # the true closure of the synthetic experiments: X is 30% of the way from L to H


def coverage(intervals, truth) -> float:
    """The share of intervals that hold ``truth``; an interval with no bounds does not."""
    return sum(iv["lo"] <= truth <= iv["hi"] for iv in intervals) / len(intervals)


def closure_runs(n: int, reps: int, seed: int):
    """(X, L, H) of ``reps`` experiments of ``n`` seeds: accuracies 0.83, 0.80, 0.90 with a per-seed
    offset shared by the three algorithms (the same data order and initial weights) and noise of
    their own; the true closure is (0.83 - 0.80) / (0.90 - 0.80) = 0.3."""
    rng = np.random.default_rng(seed)
    common = rng.normal(0.0, 0.01, (reps, n))
    return tuple(mean + common + rng.normal(0.0, 0.01, (reps, n)) for mean in (0.83, 0.80, 0.90))


def closure_statistic(x, lo, hi):
    return (x.mean(-1) - lo.mean(-1)) / (hi.mean(-1) - lo.mean(-1))


@pytest.mark.parametrize("n", [5, 7, 10])
def test_the_t_interval_of_a_mean_covers(n):
    d = np.random.default_rng(100 + n).normal(0.5, 1.0, (2000, n))
    got = coverage([dict(t_interval(row)) for row in d.tolist()], 0.5)
    assert BAND[0] <= got <= BAND[1], got


@pytest.mark.parametrize("n", [5, 7, 10])
def test_fiellers_interval_of_the_gap_closure_covers(n):
    x, lo, hi = closure_runs(n, 2000, 200 + n)
    ivs = [fieller(a - c, b - c) for a, c, b in zip(x, lo, hi)]
    assert all(iv["reason"] is None for iv in ivs)      # the gap is clear here: every interval is bounded
    got = coverage(ivs, CLOSURE)
    assert BAND[0] <= got <= BAND[1], got


@pytest.mark.parametrize("n", [5, 7, 10])
def test_the_log_ratio_interval_of_a_ratio_of_positive_means_covers(n):
    # A and B positive, correlated (rho 0.5) as paired seeds are, with a coefficient of variation of 20%;
    # the true ratio of their means is 1.2
    rng = np.random.default_rng(300 + n)
    z1, z2 = rng.normal(size=(2, 2000, n))
    a, b = 1.2 * (1 + 0.2 * z1), 1.0 * (1 + 0.2 * (0.5 * z1 + math.sqrt(0.75) * z2))
    got = coverage([log_ratio_interval(p, q) for p, q in zip(a, b)], 1.2)
    assert BAND[0] <= got <= BAND[1], got


@pytest.mark.parametrize("n, kind", [(7, "mean"), (10, "mean"), (7, "closure"), (10, "closure")])
def test_the_expanded_bca_covers_from_7_seeds(n, kind):
    if kind == "mean":
        cols, stat, truth = [[row] for row in np.random.default_rng(400 + n).normal(0.5, 1.0, (1000, n))], \
            (lambda x: x.mean(-1)), 0.5
    else:
        cols, stat, truth = list(zip(*closure_runs(n, 1000, 500 + n))), closure_statistic, CLOSURE
    got = coverage([bca(c, stat, resamples=1000, seed=i) for i, c in enumerate(cols)], truth)
    assert BAND[0] <= got <= BAND[1], got


def test_at_5_seeds_bca_undercovers_even_expanded_and_the_percentile_bootstrap_at_7():
    """The figures the module docstrings quote: BCa expanded covers about 90% of a mean at 5 seeds (use a
    t-based interval there); plain BCa and the percentile bootstrap about 87% at 7."""
    d = np.random.default_rng(405).normal(0.5, 1.0, (1000, 5))
    got = coverage([bca([row], lambda x: x.mean(-1), resamples=1000, seed=i) for i, row in enumerate(d)], 0.5)
    assert 0.87 <= got < BAND[0], got
    x, lo, hi = closure_runs(7, 1000, 507)
    got = coverage([bca([a, c, b], closure_statistic, resamples=1000, seed=i, expand=False)
                    for i, (a, c, b) in enumerate(zip(x, lo, hi))], CLOSURE)
    assert 0.84 <= got <= 0.90, got
    x, lo, hi = closure_runs(7, 300, 707)
    got = coverage([bootstrap([a, c, b], ratio_of_gaps, resamples=500, seed=i)
                    for i, (a, c, b) in enumerate(zip(x.tolist(), lo.tolist(), hi.tolist()))], CLOSURE)
    assert 0.82 <= got <= 0.91, got


# ---------------------------------------------------------------- clustered observations (RQ4's probes)

def clustered(runs: int, reps: int, seed: int, probes: int = 130):
    """``reps`` experiments of ``runs`` runs of ``probes`` observations each: a run's own offset (sd 1)
    plus each probe's noise (sd 1), so half the variance is shared within a run. The true mean is 0."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(reps, runs, 1)) + rng.normal(size=(reps, runs, probes))


def naive_t(clusters):
    """The interval that treats every probe as independent (what RQ4's Wilson intervals did)."""
    return t_interval(np.concatenate(clusters).tolist())


def test_the_cluster_intervals_are_wider_than_the_naive_one_and_cover_at_the_run_level():
    data = clustered(7, 1000, 600)
    boot = [cluster_bootstrap(list(c), resamples=1000, seed=i) for i, c in enumerate(data)]
    per_run = [cluster_t_interval(list(c)) for c in data]
    naive = [naive_t(list(c)) for c in data[:200]]
    assert BAND[0] <= coverage(boot, 0.0) <= BAND[1], coverage(boot, 0.0)
    assert BAND[0] <= coverage(per_run, 0.0) <= BAND[1], coverage(per_run, 0.0)
    assert coverage(naive, 0.0) < 0.5                    # probes counted as independent: far too narrow
    width = lambda ivs: np.median([iv["hi"] - iv["lo"] for iv in ivs])   # noqa: E731
    assert width(boot[:200]) > 5 * width(naive) and width(per_run[:200]) > 5 * width(naive)


def test_the_cluster_bootstrap_resamples_whole_runs():
    # two runs of very different sizes: resampling probes would weigh the big run's level; whole runs
    # give resamples that hold only the small run (pooled mean 10) or only the big one (0)
    clusters = [[10.0] * 3, [0.0] * 300]
    r = cluster_bootstrap(clusters, resamples=200)
    assert r["value"] == pytest.approx(30 / 303) and r["n"] == 2
    median = cluster_bootstrap([[1.0, 2.0, 3.0], [4.0, 5.0], [6.0]], statistic=np.median, resamples=200)
    assert median["value"] == 3.5 and median["reason"] is None
    assert cluster_bootstrap([[1.0, math.nan], [2.0]])["reason"].startswith("an observation is not finite")
    assert cluster_bootstrap([[1.0, 2.0]])["reason"] == "fewer than 2 runs"
    per_run = cluster_t_interval([[10.0] * 3, [0.0] * 300, [5.0]])
    assert per_run["value"] == 5.0 and per_run["n"] == 3        # every run weighs the same


# ---------------------------------------------------------------- what each gives when it cannot give an interval

def test_fieller_by_hand_and_when_the_gap_is_not_established():
    # numerator 1, 2, 3 (mean 2, var 1), denominator 2, 2, 2 (no spread): the set is
    # |2 - 2r| <= t sqrt(1 / 3), t = t_{0.975, 2} = 4.302653: r in 1 -+ 4.302653 / (2 sqrt 3)
    iv = fieller([1, 2, 3], [2, 2, 2])
    half = 4.302653 / (2 * math.sqrt(3))
    assert iv["value"] == 1.0
    assert iv["lo"] == pytest.approx(1 - half, abs=1e-6) and iv["hi"] == pytest.approx(1 + half, abs=1e-6)
    flat = fieller([0.05] * 4, [0.1] * 4)
    assert flat["lo"] == flat["hi"] == flat["value"] == 0.5          # no spread at all: the ratio itself
    none = fieller([0.01, 0.02, 0.0], [0.01, -0.01, 0.005])
    assert math.isnan(none["lo"]) and "not distinguishable from 0" in none["reason"]
    failed = fieller([0.1, math.nan, 0.2], [0.2, 0.2, 0.2])
    assert math.isnan(failed["value"]) and "not finite" in failed["reason"]


def test_the_log_ratio_interval_by_hand_and_its_refusals():
    # a = 2, 3, 4 (mean 3), b = 1, 1, 1 (mean 1): z = a/3 - b/1 = -1/3, 0, 1/3, sd 1/3; half width
    # on the log scale t_{0.975,2} x (1/3) / sqrt(3)
    iv = log_ratio_interval([2, 3, 4], [1, 1, 1])
    half = 4.302653 * (1 / 3) / math.sqrt(3)
    assert iv["value"] == 3.0 and iv["lo"] == pytest.approx(3 * math.exp(-half), rel=1e-6)
    assert iv["hi"] == pytest.approx(3 * math.exp(half), rel=1e-6) and iv["hi"] - 3 > 3 - iv["lo"]   # asymmetric
    assert "not both positive" in log_ratio_interval([-1, 0.5], [1, 1])["reason"]
    assert log_ratio_interval([1.0], [2.0])["reason"] == "fewer than 2 seeds"


def test_bca_is_seeded_and_refuses_what_it_cannot_bound():
    cols = [np.linspace(0.7, 0.9, 7), np.linspace(0.6, 0.7, 7)]
    diff = lambda a, b: a.mean(-1) - b.mean(-1)   # noqa: E731
    assert bca(cols, diff) == bca(cols, diff) and bca(cols, diff, seed=1) != bca(cols, diff)
    r = bca(cols, diff)
    assert r["lo"] < r["value"] < r["hi"] and r["method"] == "BCa bootstrap (expanded) (10000 resamples, seed 0)"
    assert "not finite" in bca([[0.1, math.nan, 0.3]], lambda x: x.mean(-1))["reason"]
    # a ratio whose gap is 0 on one seed of three: leaving out the others gives a jackknife gap of 0
    gap = bca([[0.8, 0.8, 0.8], [0.7, 0.7, 0.8], [0.9, 0.9, 0.8]], closure_statistic)
    assert math.isnan(gap["lo"]) and gap["reason"] is not None
