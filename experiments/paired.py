"""A paired difference of two algorithms' final test accuracy over seeds, where nothing is selected:
``python experiments/paired.py RUNS_DIR ALGO_A ALGO_B``.

For grids whose every setting is fixed but the algorithm and the seed (experiments/agn_decisive_agnmlp_cut.toml:
the thesis's rates, no sweep), so there is nothing to select and every seed reports. Pairs the two algorithms'
runs by seed (a seed fixes the initial weights, shards, batch order and delays), and prints each mean, the
difference A − B with its 95% t interval, and the verdict on "A more accurate than B" (``stalegrad.study.stats``).
"""
from __future__ import annotations

import argparse
import sys

from shared import pct

from stalegrad.errors import StalegradError
from stalegrad.study.report import load_runs
from stalegrad.study.stats import t_interval, verdict


def by_seed(runs: list[dict], algo: str) -> dict:
    out: dict = {}
    for r in runs:
        if r["flat"].get("algo") != algo:
            continue
        if r["seed"] in out:
            sys.exit(f"paired.py: two runs of {algo} with seed {r['seed']} ({r['dir']}); this pairs grids that vary only "
                     "the algorithm and the seed: for a grid with settings to select, use stalegrad report --compare")
        out[r["seed"]] = r["summary"].get("final_test_acc")
    return out


def paired(runs: list[dict], a: str, b: str) -> dict:
    x, y = by_seed(runs, a), by_seed(runs, b)
    seeds = sorted(set(x) & set(y))
    if len(seeds) < 2:
        sys.exit(f"paired.py: {a} and {b} share {len(seeds)} seed(s) here; an interval needs at least 2")
    d = t_interval([x[s] - y[s] for s in seeds])
    return {"seeds": seeds, a: t_interval([x[s] for s in seeds]), b: t_interval([y[s] for s in seeds]),
            "difference": d, "verdict": verdict(d["lo"], d["hi"], 0.0)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs_dir")
    ap.add_argument("a")
    ap.add_argument("b")
    args = ap.parse_args(argv)
    try:
        runs = load_runs([args.runs_dir])
    except StalegradError as e:
        sys.exit(f"paired.py: {e}")
    p = paired(runs, args.a, args.b)
    d = p["difference"]
    print(f"seeds {', '.join(map(str, p['seeds']))}: {args.a} {pct(p[args.a])}, {args.b} {pct(p[args.b])}; "
          f"{args.a} − {args.b} {100 * d['mean']:+.2f} [{100 * d['lo']:+.2f}, {100 * d['hi']:+.2f}] points "
          f"(95% t interval, paired by seed): {args.a} more accurate than {args.b}: {p['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
