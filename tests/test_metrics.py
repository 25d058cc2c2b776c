"""Temporal efficiency (Hermans et al.): areas under piecewise-linear curves, computed by hand."""
import pytest

from stalegrad.run.metrics import area_under, temporal_efficiency


def test_unequal_lengths_and_sampling():
    a = ([0.0, 1.0, 3.0], [0.0, 1.0, 1.0])               # ends at 3: m = 3
    b = ([0.0, 2.0, 4.0, 5.0], [0.5, 0.5, 1.0, 1.0])     # sampled elsewhere, runs to 5
    # a to 3: the triangle 0..1 (0.5) and the rectangle 1..3 (2.0) = 2.5
    assert area_under(*a, 3.0) == pytest.approx(2.5)
    # b to 3: 0..2 at 0.5 (1.0), then 2..3 from 0.5 to the interpolated 0.75 (0.625) = 1.625
    assert area_under(*b, 3.0) == pytest.approx(1.625)
    assert temporal_efficiency(a, b) == pytest.approx(2.5 / 1.625)
    assert temporal_efficiency(b, a) == pytest.approx(1.625 / 2.5)   # the same cut, from either side


def test_a_curve_against_itself_and_a_scaled_copy():
    c = ([0.0, 0.5, 2.0, 7.0], [0.1, 0.4, 0.6, 0.9])
    assert temporal_efficiency(c, c) == pytest.approx(1.0)
    assert temporal_efficiency(c, (c[0], [y / 2 for y in c[1]])) == pytest.approx(2.0)
