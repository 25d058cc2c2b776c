"""The papers' comparison metrics, computed from metrics.jsonl curves."""
from __future__ import annotations


def area_under(xs: list[float], ys: list[float], upto: float) -> float:
    """Trapezoidal area under the piecewise-linear curve (xs, ys) on [xs[0], upto]."""
    area = 0.0
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 >= upto:
            break
        if x1 > upto:   # cut the last segment at ``upto``
            y1 = y0 + (y1 - y0) * (upto - x0) / (x1 - x0)
            x1 = upto
        area += 0.5 * (y0 + y1) * (x1 - x0)
    return area


def temporal_efficiency(curve_a: tuple[list[float], list[float]], curve_b: tuple[list[float], list[float]]) -> float:
    """Hermans et al.'s temporal efficiency E(a, b): the ratio of the areas under
    two metric-over-time curves, both cut at the shorter run's end. E > 1
    means ``a`` reached higher values sooner (for accuracy curves)."""
    (xa, ya), (xb, yb) = curve_a, curve_b
    m = min(xa[-1], xb[-1])
    denom = area_under(xb, yb, m)
    return area_under(xa, ya, m) / denom if denom else float("nan")
