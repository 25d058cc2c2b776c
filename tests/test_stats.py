"""stalegrad/study/stats.py: the paired t test against its closed form and scipy, Holm's correction against a
hand-computed family and against its textbook definition on random families, and the percentile
bootstrap's handling of resamples where a ratio is undefined (issue 31, items 4 and 6)."""
import itertools
import math
import random

import pytest

from stalegrad.study.stats import bootstrap, holm, paired_t, ratio_of_gaps, t_interval


# ---------------------------------------------------------------- paired_t

def test_paired_t_of_1_2_3_4_against_the_closed_form_of_t_with_3_degrees_of_freedom():
    # mean 2.5, s = sqrt(5/3), se = s / 2, t = 2.5 / se = 3.872983; for 3 degrees of freedom
    # P(|T| > t) = 1 - (2/pi) (theta + sin(theta) cos(theta)), theta = atan(t / sqrt(3))
    r = paired_t([1, 2, 3, 4])
    t = 2.5 / (math.sqrt(5 / 3) / 2)
    theta = math.atan(t / math.sqrt(3))
    p_two = 1 - 2 / math.pi * (theta + math.sin(theta) * math.cos(theta))
    assert (r["n"], r["df"], r["mean"]) == (4, 3, 2.5)
    assert r["sd"] == pytest.approx(math.sqrt(5 / 3)) and r["se"] == pytest.approx(math.sqrt(5 / 3) / 2)
    assert r["t"] == pytest.approx(t) and r["p_two_sided"] == pytest.approx(p_two, rel=1e-9)
    assert r["p_one_sided"] == pytest.approx(p_two / 2, rel=1e-9)              # the claimed side, +1
    assert paired_t([1, 2, 3, 4], direction=-1)["p_one_sided"] == pytest.approx(1 - p_two / 2, rel=1e-9)
    assert paired_t([-1, -2, -3, -4], direction=-1)["p_one_sided"] == pytest.approx(p_two / 2, rel=1e-9)


def test_paired_t_agrees_with_scipy_and_with_the_t_interval():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(3)
    for n in (2, 5, 7, 10, 30):
        d = [rng.gauss(0.3, 1.0) for _ in range(n)]
        r, ref = paired_t(d), stats.ttest_1samp(d, 0.0)
        assert r["t"] == pytest.approx(ref.statistic, rel=1e-12)
        assert r["p_two_sided"] == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-15)
        assert r["p_one_sided"] == pytest.approx(stats.ttest_1samp(d, 0.0, alternative="greater").pvalue, rel=1e-9)
        # the test and the interval agree: 0 lies outside the 95% interval exactly when p < 0.05
        iv = t_interval(d)
        assert (iv["lo"] > 0 or iv["hi"] < 0) == (r["p_two_sided"] < 0.05)


def test_paired_t_never_drops_a_failed_run_and_handles_no_spread():
    r = paired_t([0.1, 0.2, math.nan, 0.3])
    assert r["n"] == 4 and all(math.isnan(r[k]) for k in ("mean", "sd", "t", "p_two_sided", "p_one_sided"))
    assert math.isnan(paired_t([0.5])["p_two_sided"]) and math.isnan(paired_t([])["t"])
    same = paired_t([0.2, 0.2, 0.2])
    assert same["t"] == math.inf and same["p_two_sided"] == 0.0 and same["p_one_sided"] == 0.0
    assert paired_t([0.2, 0.2, 0.2], direction=-1)["p_one_sided"] == 1.0
    assert math.isnan(paired_t([0.0, 0.0])["p_two_sided"])
    with pytest.raises(ValueError, match="direction must be"):
        paired_t([1, 2], direction=0)


# ---------------------------------------------------------------- holm

def test_holm_against_a_hand_computed_family():
    # sorted: d 0.005, a 0.01, c 0.03, b 0.04 (m = 4): 4 x 0.005 = 0.02; max(0.02, 3 x 0.01) = 0.03;
    # max(0.03, 2 x 0.03) = 0.06; max(0.06, 1 x 0.04) = 0.06 (monotone). At 0.05: d and a hold.
    h = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005})
    assert list(h) == ["a", "b", "c", "d"]                        # the order given
    assert {k: v["p_adjusted"] for k, v in h.items()} == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06, "d": 0.02})
    assert {k for k, v in h.items() if v["reject"]} == {"a", "d"}
    assert {k: v["rank"] for k, v in h.items()} == {"a": 2, "b": 4, "c": 3, "d": 1}
    assert h["b"]["p"] == 0.04
    # a missing claim (NaN p) is listed, never rejected, and still counts in m = 5
    h = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005, "e": math.nan})
    assert h["e"]["reject"] is False and math.isnan(h["e"]["p_adjusted"]) and h["e"]["rank"] is None
    assert h["d"]["p_adjusted"] == pytest.approx(0.025) and h["a"]["p_adjusted"] == pytest.approx(0.04)
    assert h["c"]["p_adjusted"] == pytest.approx(0.09) and h["b"]["p_adjusted"] == pytest.approx(0.09)
    assert holm({"x": 0.6, "y": 0.7})["x"]["p_adjusted"] == 1.0   # capped at 1
    assert holm({}) == {}


def textbook_holm(p: list[float], alpha: float) -> set[int]:
    """Holm (1979): order the p values; reject H_(1), ..., H_(k-1) where k is the first with
    p_(k) > alpha / (m - k + 1); reject all if there is none."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    rejected = set()
    for k, i in enumerate(order, start=1):
        if p[i] > alpha / (m - k + 1):
            break
        rejected.add(i)
    return rejected


def test_holm_equals_the_textbook_step_down_on_random_families():
    rng = random.Random(31)
    for trial in range(2000):
        m = rng.randint(1, 12)
        p = [rng.choice([rng.random(), rng.random() * 0.05, rng.random() * 0.01]) for _ in range(m)]
        alpha = rng.choice([0.01, 0.05, 0.1])
        h = holm({i: x for i, x in enumerate(p)}, alpha)
        assert {i for i, v in h.items() if v["reject"]} == textbook_holm(p, alpha), (p, alpha)
        adj = [h[i]["p_adjusted"] for i in sorted(range(m), key=lambda i: p[i])]
        assert adj == sorted(adj) and all(p[i] <= h[i]["p_adjusted"] <= 1 for i in range(m))   # monotone, capped
        # an adjusted p value below 1 is the smallest alpha at which the claim is rejected
        for i in (i for i in range(m) if h[i]["p_adjusted"] < 1):
            assert i in textbook_holm(p, h[i]["p_adjusted"] * (1 + 1e-12))
            assert i not in textbook_holm(p, h[i]["p_adjusted"] * (1 - 1e-9))


def test_holm_refuses_what_is_not_a_p_value():
    with pytest.raises(ValueError, match=r"p values must lie in \[0, 1\]"):
        holm({"a": 1.5})
    with pytest.raises(ValueError, match="alpha"):
        holm({"a": 0.1}, alpha=0)


# ---------------------------------------------------------------- the percentile bootstrap's undefined resamples

def test_a_resample_with_no_gap_is_kept_beyond_both_ends_not_dropped():
    # n = 4, exact: 256 resamples. Seed 3's gap is 0, so the resample (3, 3, 3, 3) alone has gap 0;
    # the others have positive gaps. Kept beyond both ends, it shifts each quantile by one place.
    x, lo, hi = [0.80, 0.82, 0.78, 0.75], [0.70, 0.75, 0.74, 0.75], [0.90, 0.88, 0.91, 0.75]
    stats = []
    for idx in itertools.product(range(4), repeat=4):
        gap = sum(hi[i] for i in idx) - sum(lo[i] for i in idx)
        stats.append((sum(x[i] for i in idx) - sum(lo[i] for i in idx)) / gap if gap > 1e-12 else None)
    defined = sorted(s for s in stats if s is not None)
    assert len(defined) == 255
    b = bootstrap([x, lo, hi], ratio_of_gaps, level=0.8)
    assert b["undefined"] == 1 and b["reason"] is None
    below = [-math.inf] + defined                          # the lower quantile counts it below every value
    above = defined + [math.inf]                           # the upper one above every value
    assert b["lo"] == pytest.approx(below[math.ceil(0.1 * 256) - 1])
    assert b["hi"] == pytest.approx(above[math.ceil(0.9 * 256) - 1])


def test_a_ratio_undefined_in_too_many_resamples_has_no_interval_and_says_why():
    b = bootstrap([[1, 2], [0, 0], [0, 0]], ratio_of_gaps)       # every resample has gap 0
    assert math.isnan(b["lo"]) and math.isnan(b["hi"]) and b["undefined"] == 4
    assert "undefined (not finite) in 4 of 4 resamples" in b["reason"]
    # gaps 0.2, 0.2, -0.1: a resample's gap is <= 0 when it draws the third seed 2 or 3 times, 3 x 2 + 1
    # of the 27 resamples, more than 2.5%: no interval
    b = bootstrap([[0.8, 0.8, 0.8], [0.7, 0.7, 0.9], [0.9, 0.9, 0.8]], ratio_of_gaps)
    assert b["undefined"] == 7 and math.isnan(b["lo"]) and "in 7 of 27 resamples" in b["reason"]
    assert bootstrap([[1, 2, 3]], lambda m: m)["reason"] is None
