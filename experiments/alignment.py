"""AGN RQ4 over seeds: do accumulated, normalised commits align better than single steps?
``python experiments/alignment.py RUNS_DIR [RUNS_DIR ...] --out FILE.md``.

For probe grids (``--probe-every``: experiments/probes_agn_seeds.toml) whose runs vary only the window, the
number of workers and the seed. Each run's probes (``probes.jsonl``, stalegrad/core/prober.py) give two cosines
per probed commit: with minus the gradient of the probes' fixed batch at the pulled weights ("towards the
minimum", ``cos_eval``) and with the previous commit of another worker ("agreement", ``cos_prev``). A run is
summarised by the mean of each over its probes (stalegrad/study/report_probes.py's alignment row); then, per number
of workers, every window w > 1 is paired with window 1 (single steps: AGN's commits without accumulation) by
seed, and the difference of the per-run means gets a 95% t interval over seeds and a verdict
(``stalegrad.study.stats``: *holds* when the whole interval is above 0). The seed, not the probe, is the unit: the
probes of one run are not independent.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shared import table

from stalegrad.errors import StalegradError
from stalegrad.study.report import load_runs
from stalegrad.study.report_probes import alignment_row, read_probes
from stalegrad.study.stats import t_interval, verdict

MEASURES = (("cos_eval", "points more towards the minimum"), ("cos_prev", "agrees more with another worker's commit"))


def per_run(runs: list[dict]) -> dict:
    """{(algo, workers, window): {seed: alignment row}} over the runs that wrote probes."""
    out: dict = {}
    for r in runs:
        probes = r.get("probes") or read_probes(r["dir"])
        if not probes:
            continue
        f = r["flat"]
        key = (f.get("algo"), f.get("workers"), f.get("window") or 1)
        cell = out.setdefault(key, {})
        if r["seed"] in cell:
            sys.exit(f"alignment.py: two runs of {key[0]} with {key[1]} workers, window {key[2]} and seed {r['seed']} "
                     f"({r['dir']}); this pairs grids that vary only the window, the workers and the seed")
        cell[r["seed"]] = alignment_row(probes)
    if not out:
        sys.exit("alignment.py: no run here wrote probes; run the grid with probe_every (experiments/"
                 "probes_agn_seeds.toml)")
    return out


def compare(cells: dict) -> list[dict]:
    """Every window w > 1 against window 1 of the same algorithm and workers, paired by seed."""
    rows = []
    for (algo, workers, window), runs in sorted(cells.items()):
        base = cells.get((algo, workers, 1))
        if window == 1 or base is None:
            continue
        seeds = sorted(s for s in set(runs) & set(base)
                       if all(runs[s][m] is not None and base[s][m] is not None for m, _ in MEASURES))
        if len(seeds) < 2:
            continue
        for measure, claim in MEASURES:
            d = t_interval([runs[s][measure] - base[s][measure] for s in seeds])
            rows.append({"algo": algo, "workers": workers, "window": window, "measure": measure, "claim": claim,
                         "seeds": seeds, "difference": d, "verdict": verdict(d["lo"], d["hi"], 0.0)})
    return rows


def render(cells: dict, rows: list[dict]) -> str:
    signed = lambda f: f"{f['mean']:+.3f} [{f['lo']:+.3f}, {f['hi']:+.3f}]"  # noqa: E731
    per_cell = []
    for (algo, workers, window), runs in sorted(cells.items()):
        col = lambda m: t_interval([r[m] for r in runs.values() if r[m] is not None])  # noqa: E731
        ce, cp = col("cos_eval"), col("cos_prev")
        n = sorted(r["n"] for r in runs.values())
        per_cell.append([str(algo), str(workers), str(window), f"{n[0]}-{n[-1]}", f"{signed(ce)} (n={ce['n']})",
                         f"{signed(cp)} (n={cp['n']})"])
    paired = [[str(r["algo"]), str(r["workers"]), str(r["window"]), f"the commit {r['claim']} than a single step",
               f"{signed(r['difference'])} ({len(r['seeds'])})", r["verdict"]] for r in rows]
    held = sum(r["verdict"] == "holds" for r in rows)
    lines = ["# AGN RQ4 over seeds: the alignment of commits, window by window", "",
             "Per run: the mean over its probes; per cell: the mean over seeds with a 95% t interval (n seeds).", "",
             *table(per_cell, ["rule", "workers", "window", "probes a run", "cos towards minimum",
                               "cos with another worker's commit"]),
             "Window w against window 1 (single steps), the difference of the per-run means, paired by seed:", "",
             *table(paired, ["rule", "workers", "window", "claim", "difference [95% t] (seeds)", "verdict"]),
             f"{held} of {len(rows)} comparisons hold."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs_dirs", nargs="+")
    ap.add_argument("--out", required=True, help="the Markdown file to write")
    args = ap.parse_args(argv)
    try:
        runs = load_runs(args.runs_dirs)
    except StalegradError as e:
        sys.exit(f"alignment.py: {e}")
    cells = per_run(runs)
    rows = compare(cells)
    if not rows:
        sys.exit("alignment.py: no window > 1 shares 2 seeds with window 1 of the same rule and workers; nothing to "
                 "compare")
    Path(args.out).write_text(render(cells, rows))
    print(f"alignment.py: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
