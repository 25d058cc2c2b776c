"""The table of docs/results/delay_models.md: every family under every delay model (issue 21).

    python benchmarks/archive/delay_models.py runs/delays_gradient runs/delays_commit
    python benchmarks/archive/delay_models.py --stability     # the linear check of the lockstep effect

reads the finished runs of the two grids (experiments/delays_gradient.toml, delays_commit.toml) and
prints, per algorithm and setting (rows) and delay model (columns), the final test accuracy: the mean
over the seeds that finished, with a 95% t interval (mean ± t(0.975, n-1) * s / sqrt(n)) when there
are 2 or more, and the number of seeds; then the mean tau and the largest tau of each cell (seed 0).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import common

DELAYS = ("round-robin", "gamma:2", "exponential", "heterogeneous:sqrt")
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def runs(grid_dir: Path):
    for run in sorted((grid_dir / "runs").iterdir()) if (grid_dir / "runs").is_dir() else []:
        try:
            summary = json.loads((run / "summary.json").read_text())
            config = json.loads((run / "config.json").read_text())
        except (OSError, ValueError):
            continue       # not finished
        algo = config["algorithm"]
        setting = f"M = {config['workers']}, lr {config['lr']:g}" if "window" not in algo else \
            f"n = {config['workers']}, window {algo['window']}"
        yield algo["name"], setting, config["runtime"]["delay"], config["seed"], summary


def cell(values: list[float]) -> str:
    n = len(values)
    if n == 0:
        return "—"
    mean = statistics.fmean(values)
    if n == 1:
        return f"{mean:.3f} (1)"
    half = T975[n - 1] * statistics.stdev(values) / math.sqrt(n)
    return f"{mean:.3f} ± {half:.3f} ({n})"


def main(dirs: list[str]) -> None:
    table: dict = {}
    taus: dict = {}
    for d in dirs:
        for algo, setting, delay, seed, summary in runs(Path(d)):
            table.setdefault((setting, algo), {}).setdefault(delay, []).append(summary["final_test_acc"])
            if seed == 0:
                taus[(setting, algo, delay)] = (summary["tau_mean"], summary["tau_max"])
    print(common.md_table(["setting", "algorithm", *DELAYS],
                          [[setting, algo, *(cell(by_delay.get(d, [])) for d in DELAYS)]
                           for (setting, algo), by_delay in table.items()]))
    print()
    shown = lambda r: "—" if r is None else f"{r[0]:.1f} / {r[1]}"   # noqa: E731
    print(common.md_table(["setting", "algorithm", *(f"{d}: tau mean / max" for d in DELAYS)],
                          [[setting, algo, *(shown(taus.get((setting, algo, d))) for d in DELAYS)]
                           for setting, algo in table]))


def stability(n: int = 40, pushes: int = 40000) -> None:
    """The largest step a for which x_{k+1} = x_k - a * sum_tau p(tau) x_{k-tau} is stable (spectral radius
    below 1), p the simulator's tau histogram at n workers under each model (``delay_traces.simulate``)."""
    import numpy as np
    from delay_traces import histogram, simulate

    def radius(a, p):
        c = np.zeros(max(p) + 2)          # z^(J+1) - z^J + a * sum_j p_j z^(J-j)
        c[0], c[1] = 1.0, -1.0
        for j, pj in p.items():
            c[1 + j] += a * pj
        return max(abs(np.roots(c)))

    for spec in ("round-robin", "heterogeneous:sqrt", "gamma:2"):
        _, taus = simulate(spec, n, pushes)
        h = {k: v for k, v in histogram(taus[2 * n:]).items() if v > 1e-5}
        total = sum(h.values())
        p = {k: v / total for k, v in h.items()}
        lo, hi = 1e-5, 2.0
        for _ in range(40):                # bisection on a log scale
            mid = (lo * hi) ** 0.5
            lo, hi = (mid, hi) if radius(mid, p) < 1 else (lo, mid)
        print(f"{spec}: mean tau {sum(k * v for k, v in p.items()):.1f}, largest stable a {lo:.4f}")
    beta = 1 - 1 / n
    print(f"exponential (tau geometric: heavy-ball momentum beta = 1 - 1/n): a < 2(1 + beta)/(1 - beta) = "
          f"{2 * (1 + beta) / (1 - beta):.0f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("grid_dirs", nargs="*", default=["runs/delays_gradient", "runs/delays_commit"])
    ap.add_argument("--stability", action="store_true", help="the linear check of the lockstep effect instead")
    args = ap.parse_args()
    stability() if args.stability else main(args.grid_dirs)
