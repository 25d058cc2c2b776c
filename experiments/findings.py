"""The confirmatory study's findings page (issue 31), generated: every number on docs/results/FINDINGS.md comes
from here, reading the registered claims (experiments/confirm/claims.toml), the descriptive rows
(experiments/confirm/descriptive.toml), the registration record (docs/results/confirm/registration.toml) and the
committed run summaries (docs/results/confirm/runs/<grid>/<cell>/). Nothing is selected here: the rules are
docs/results/confirm/PLAN.md's.

    python experiments/findings.py [--out docs/results/FINDINGS.md] [--root .]

experiments/findings_rows.py holds what it reads (the runs) and some of its rows (each claim's regime from its runs'
config.json, the selections, the error each correction removes on the probes, the words for an interval).

tests/test_findings.py regenerates the committed page byte for byte.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import tomllib
from pathlib import Path

import numpy as np

from findings_rows import (CLASSES, Damaged, bca_words, check_inputs, control_note, find, finite, load_runs, machine,
                           read_input, regime, removed_table, selections)
from stalegrad.study.intervals import bca
from stalegrad.study.selection import CHANCE_MARGIN, run_failure
from stalegrad.study.stats import holm, paired_t, t_interval


# ---- the runs ------------------------------------------------------------------------------------------
def accuracy(run: dict, rules: dict) -> float:
    """Final test accuracy; a failed run enters at chance (PLAN.md: it counts against its own side)."""
    return rules["chance"] if run_failure(run["summary"], CLASSES) else run["summary"]["final_test_acc"]


def probe_value(run: dict, claim: dict) -> float:
    """A run's probe statistic: the share of probes where ``field`` < ``than``, or the mean of ``field``. A failed
    run enters at the claim's ``failed`` value, its null (PLAN.md, change 1), not at the share of its finite probes."""
    if run_failure(run["summary"], CLASSES):
        return claim["failed"]
    field, than = claim["field"], claim.get("than")
    rows = [p for p in run["probes"] or [] if finite(p.get(field)) and (than is None or finite(p.get(than)))]
    if not rows:
        return math.nan
    if claim["kind"] == "probe_share":
        return sum(p[field] < p[than] for p in rows) / len(rows)
    return statistics.fmean(p[field] for p in rows)


# ---- one claim -----------------------------------------------------------------------------------------
def cells_of(claim: dict, plan: dict) -> list[dict]:
    if claim["cells"] == "thesis16":
        return [{"workers": n, "window": lam} for n, lam, _, _ in plan["thesis"]["cells"]]
    return claim["cells"]


def per_seed(claim: dict, plan: dict, runs: dict) -> dict:
    """{values: {seed: value}, needed, present, failed: {side: [k, n]}} of one claim or descriptive row."""
    kind, rules = claim.get("kind", "difference"), plan["rules"]
    values, needed, present = {}, 0, 0
    failed = {"a": [0, 0], "b": [0, 0]}

    def value(side: str, cell: dict, seed: int):
        nonlocal needed, present
        if side not in claim:
            return 0.0
        needed += 1
        run = find(runs, claim[side], cell, seed)
        if run is None:
            return None
        present += 1
        failed[side][1] += 1
        failed[side][0] += run_failure(run["summary"], CLASSES) is not None
        return probe_value(run, claim) if kind.startswith("probe") else accuracy(run, rules)

    for seed in plan["seeds"][claim["seeds"]]:
        terms = []
        for cell in cells_of(claim, plan):
            if kind == "change":
                ends = [{**cell, **claim[end]} for end in ("to", "from")]
                parts = [value(s, c, seed) for c in ends for s in ("a", "b")]
                terms.append(None if None in parts else (parts[0] - parts[1]) - (parts[2] - parts[3]))
            else:
                a, b = value("a", cell, seed), value("b", cell, seed)
                terms.append(None if a is None or b is None else a - b)
        if None not in terms:
            values[seed] = statistics.fmean(terms)
    return {"values": values, "needed": needed, "present": present, "failed": failed}


def evaluate(claim: dict, plan: dict, runs: dict) -> dict:
    got = per_seed(claim, plan, runs)
    margin, direction = claim.get("margin", 0.0), claim["direction"]
    if got["present"] < got["needed"]:
        return {**got, "missing": got["needed"] - got["present"], "p": 1.0}
    test = paired_t([v - margin for v in got["values"].values()], direction or 1)
    p = test["p_two_sided"] if direction == 0 else test["p_one_sided"]
    return {**got, "missing": 0, "p": p, "interval": t_interval(list(got["values"].values()), plan["rules"]["level"])}


def thesis_figure(claim: dict, plan: dict) -> str:
    """The claim's statistic on the thesis's table (one run per cell), where both sides are in it."""
    table = {(n, lam): {"agn": agn / 100, "aeasgd": ae / 100} for n, lam, agn, ae in plan["thesis"]["cells"]}

    def acc(side: str, cell: dict):
        where = {**claim[side], **cell}
        return table.get((where.get("workers"), where.get("window")), {}).get(where["algo"])

    terms = []
    for cell in cells_of(claim, plan):
        ends = [{**cell, **claim[e]} for e in ("to", "from")] if claim.get("kind") == "change" else [cell]
        parts = [acc(s, c) for c in ends for s in ("a", "b")]
        if None in parts:
            return "thesis: not in its table"
        terms.append(parts[0] - parts[1] if len(parts) == 2 else (parts[0] - parts[1]) - (parts[2] - parts[3]))
    ahead = f", positive in {sum(t > 0 for t in terms)} of {len(terms)} cells" if len(terms) > 1 else ""
    return (f"thesis (its table, one run a cell; background agn.md §4, table:agn_experiments_summary): "
            f"{points(statistics.fmean(terms))}{ahead}")


def verdict(result: dict, claim: dict, adjusted: dict) -> str:
    if result["missing"]:
        return f"missing: {result['missing']} of {result['needed']} runs"
    iv, margin, direction = result["interval"], claim.get("margin", 0.0), claim["direction"]
    if adjusted["reject"]:
        return ("holds: a ahead" if iv["mean"] > margin else "holds: b ahead") if direction == 0 else "holds"
    if direction and (iv["hi"] < margin if direction > 0 else iv["lo"] > margin):
        return "does not hold"
    return "inconclusive"


# ---- the page ------------------------------------------------------------------------------------------
def points(x: float, signed: bool = True) -> str:
    return "n/a" if not finite(x) else f"{100 * x:+.2f}" if signed else f"{100 * x:.2f}"


def interval_text(iv: dict, scale: float = 100.0, fmt: str = "+.2f") -> str:
    if not iv or not finite(iv.get("mean")):
        return "n/a"
    if not (finite(iv.get("lo")) and finite(iv.get("hi"))):   # one seed so far: no interval yet
        return f"{scale * iv['mean']:{fmt}} ({iv['n']} seed{'s' * (iv['n'] != 1)}, no interval)"
    return f"{scale * iv['mean']:{fmt}} [{scale * iv['lo']:{fmt}}, {scale * iv['hi']:{fmt}}] ({iv['n']} seeds)"


def runs_read(claim: dict, plan: dict, runs: dict) -> dict:
    """{side: [run]}: the runs a claim reads, over its cells (both ends of a change) and its seeds."""
    cells = cells_of(claim, plan)
    if claim.get("kind") == "change":
        cells = [{**c, **claim[end]} for c in cells for end in ("to", "from")]
    return {side: [r for c in cells for s in plan["seeds"][claim["seeds"]] if (r := find(runs, claim[side], c, s))]
            for side in ("a", "b") if side in claim}


def claims_table(plan: dict, runs: dict) -> list[str]:
    results = {c["id"]: evaluate(c, plan, runs) for c in plan["claim"]}
    adjusted = holm({k: r["p"] for k, r in results.items()}, plan["rules"]["alpha"])
    out = ["| id | question | claim | verdict | estimate, points (a probe claim: its unit) [95% t interval over seeds] "
           "| p (Holm-adjusted) | failed runs (a; b) | the paper's figure (its source) | our regime (the runs' "
           "config.json) | deviations from the paper |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in plan["claim"]:
        r, adj = results[c["id"]], adjusted[c["id"]]
        # a probe claim is in its own unit (a share, a cosine), not in accuracy points
        kind = c.get("kind", "")
        scale, fmt = (1.0, ".3f") if kind == "probe_share" else (1.0, "+.3f") if kind.startswith("probe") \
            else (100.0, "+.2f")
        est = "n/a" if r["missing"] else interval_text(r["interval"], scale, fmt)
        p = "n/a" if r["missing"] else f"{r['p']:.3g} ({adj['p_adjusted']:.3g})"
        fails = "; ".join(f"{k} of {n}" for k, n in (r["failed"]["a"], r["failed"]["b"]) if n)
        out.append(f"| {c['id']} | {c['question']} | {c['text']} | **{verdict(r, c, adj)}** | {est} | {p} | "
                   f"{fails or '-'} | {thesis_figure(c, plan) if c['paper'] == 'thesis' else c['paper']} | "
                   f"{regime(runs_read(c, plan, runs))} | {c.get('deviations', '-')} |")
    if any(r["missing"] for r in results.values()):
        out += ["", "A claim marked *missing* waits for runs not made yet: the grids run in the plan's order over several "
                "sessions ([confirm/RUNS.md](confirm/RUNS.md)), and none was left out. Until it has its runs, it enters "
                "Holm's correction at p = 1, so the other claims' adjusted p can only fall when it arrives."]
    return out


def thesis_cells(plan: dict, runs: dict, grid: str) -> tuple[list[str], dict]:
    """The 16 cells, ours beside the thesis's, and the agreement across cells."""
    out = ["| n | λ | AGN thesis | AGN ours | AGN ours − thesis | AEASGD thesis | AEASGD ours | AEASGD ours − thesis "
           "| AGN − AEASGD thesis | AGN − AEASGD ours [95% t interval over seeds] |", "|---" * 10 + "|"]
    seeds = plan["seeds"].get("agn", [])
    ours, theirs, complete = {}, {}, bool(seeds)   # no seed list: nothing is complete
    for n, lam, t_agn, t_ae in plan["thesis"]["cells"]:
        cell = {"workers": n, "window": lam}
        acc = {a: {s: find(runs, {"grid": grid, "algo": a}, cell, s) for s in seeds} for a in ("agn", "aeasgd")}
        acc = {a: {s: accuracy(r, plan["rules"]) for s, r in by.items() if r} for a, by in acc.items()}
        both = sorted(set(acc["agn"]) & set(acc["aeasgd"]))
        complete &= len(both) == len(seeds)
        ours[(n, lam)] = {s: acc["agn"][s] - acc["aeasgd"][s] for s in both}
        theirs[(n, lam)] = (t_agn - t_ae) / 100
        mean = {a: 100 * statistics.fmean(v.values()) if v else math.nan for a, v in acc.items()}
        diff = t_interval(list(ours[(n, lam)].values())) if both else {}
        out.append(f"| {n} | {lam} | {t_agn:.2f} | {mean['agn']:.2f} | {mean['agn'] - t_agn:+.2f} | {t_ae:.2f} | "
                   f"{mean['aeasgd']:.2f} | {mean['aeasgd'] - t_ae:+.2f} | {t_agn - t_ae:+.2f} | "
                   f"{interval_text(diff)} |")
    return out, {"ours": ours, "theirs": theirs, "complete": complete, "seeds": seeds}


def ranks(values: list[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank (what Spearman's ρ correlates)."""
    places: dict[float, list[int]] = {}
    for place, v in enumerate(sorted(values), start=1):
        places.setdefault(v, []).append(place)
    return [statistics.fmean(places[v]) for v in values]


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's ρ: Pearson's r of the ranks (statistics.correlation's method="ranked" needs Python 3.12)."""
    return statistics.correlation(ranks(x), ranks(y))


def headline(plan: dict, runs: dict, claim_id: str = "AG2") -> list[str]:
    """The headline cell with the thesis's own model: each side's level beside the thesis's table at its cell."""
    claim = next((c for c in plan["claim"] if c["id"] == claim_id), None)
    if claim is None:
        return []
    seeds = plan["seeds"][claim["seeds"]]
    found = {side: [r for s in seeds if (r := find(runs, claim[side], {}, s))] for side in ("a", "b")}
    if any(len(rs) < len(seeds) for rs in found.values()):
        return [f"The headline cell's levels ({claim_id}) wait for its runs.", ""]
    where = found["a"][0]["settings"]
    thesis = {(n, lam): (agn, ae) for n, lam, agn, ae in plan["thesis"]["cells"]}[(where["workers"], where["window"])]
    mean = {side: 100 * statistics.fmean(accuracy(r, plan["rules"]) for r in rs) for side, rs in found.items()}
    return [f"The headline cell with the thesis's own model ({claim_id}: {where['model']}, n = {where['workers']}, "
            f"λ = {where['window']}), mean over the {len(seeds)} seeds: {claim['a']['algo'].upper()} "
            f"{mean['a']:.2f} (thesis {thesis[0]:.2f}), {claim['b']['algo'].upper()} {mean['b']:.2f} "
            f"(thesis {thesis[1]:.2f}).", ""]


def agreement(cells: dict) -> list[str]:
    """Pearson's r and Spearman's ρ across cells of our AGN − AEASGD with the thesis's, each with its BCa interval
    over seeds (PLAN.md registers both with one)."""
    if not cells["ours"]:
        return []
    if not cells["complete"]:
        return ["The agreement across cells waits for every cell's runs."]
    keys = sorted(cells["ours"])
    theirs = [cells["theirs"][k] for k in keys]

    columns = [[cells["ours"][k][s] for s in cells["seeds"]] for k in keys]   # one column per cell, over seeds
    t = np.asarray(theirs) - np.mean(theirs)

    def pearson(*cols, ranked=False):   # each col: (..., seeds); the cells' means, correlated with the thesis's
        means = np.stack([c.mean(-1) for c in cols], axis=-1)
        if ranked:   # Spearman: the ranks of the cells' means against the ranks of the thesis's
            means = np.apply_along_axis(lambda v: np.asarray(ranks(list(v))), -1, means)
        d, u = means - means.mean(-1, keepdims=True), tr if ranked else t
        return (d * u).sum(-1) / np.sqrt((d * d).sum(-1) * (u * u).sum())

    tr = np.asarray(ranks(theirs)) - np.mean(ranks(theirs))
    ours = [statistics.fmean(cells["ours"][k].values()) for k in keys]
    r, rho = statistics.correlation(ours, theirs), spearman(ours, theirs)
    ivs = [bca(columns, pearson), bca(columns, lambda *c: pearson(*c, ranked=True))]
    shown = ["undefined" if not finite(iv["lo"]) else f"[{iv['lo']:+.2f}, {iv['hi']:+.2f}]" for iv in ivs]
    return [f"Across the {len(keys)} cells, our AGN − AEASGD against the thesis's: Pearson r = {r:+.2f} "
            f"{shown[0]}, Spearman ρ = {rho:+.2f} {shown[1]} (each interval: {bca_words(ivs[0])})."]


def describe(plan: dict, extra: dict, runs: dict) -> list[str]:
    out = ["| row | estimate, points [95% t interval over seeds] | failed runs (a; b) |", "|---|---|---|"]
    for row in extra.get("row", []):
        r = per_seed(row, plan, runs)
        if r["present"] < r["needed"]:
            out.append(f"| {row['text']} | missing: {r['needed'] - r['present']} of {r['needed']} runs | - |")
            continue
        fails = "; ".join(f"{k} of {n}" for k, n in (r["failed"]["a"], r["failed"]["b"]) if n)
        out.append(f"| {row['text']} | {interval_text(t_interval(list(r['values'].values())))} | {fails or '-'} |")
    return out


def closure(plan: dict, extra: dict, runs: dict) -> list[str]:
    """The share of ASGD's gap to sequential SGD that DC-ASGD-a closes: (DC − ASGD) / (SGD − ASGD)."""
    spec = extra.get("closure")
    if not spec:
        return []
    seeds = plan["seeds"][spec["seeds"]]
    cols = {k: [find(runs, spec[k], {}, s) for s in seeds] for k in ("method", "baseline", "target")}
    if any(r is None for rs in cols.values() for r in rs):
        return [f"{spec['text']}: waits for its runs."]
    acc = {k: [accuracy(r, plan["rules"]) for r in rs] for k, rs in cols.items()}
    gained = [m - b for m, b in zip(acc["method"], acc["baseline"])]
    gap = [t - b for t, b in zip(acc["target"], acc["baseline"])]
    ratios = [g / h if h else math.nan for g, h in zip(gained, gap)]
    if statistics.fmean(gap) <= 0:   # PLAN.md: undefined when the gap to close is not positive
        return [f"{spec['text']}: undefined, sequential SGD is not ahead of ASGD ({len(seeds)} seeds)."]
    if all(finite(r) and r > 0 for r in ratios):   # PLAN.md: a t interval on the per-seed log of the ratio
        iv = t_interval([math.log(r) for r in ratios])
        shown = (f"{math.exp(iv['mean']):.2f} [{math.exp(iv['lo']):.2f}, {math.exp(iv['hi']):.2f}] "
                 "(the geometric mean of the per-seed ratios; 95% t interval on their logs")
    else:   # else the BCa bootstrap over seeds of the ratio of the means
        iv = bca([gained, gap], lambda g, h: g.mean(-1) / h.mean(-1))
        shown = ("undefined" if not finite(iv["lo"]) else
                 f"{iv['value']:.2f} [{iv['lo']:.2f}, {iv['hi']:.2f}]") + f" (the ratio of the means; {bca_words(iv)}"
    return [f"{spec['text']}: {shown}; {len(seeds)} seeds)."]


def dc7_runs(plan: dict, runs: dict, claim_id: str = "DC7") -> dict:
    """{seed: run or None}: the probe runs of DC7's side a, which PLAN.md's row of removed error reads."""
    claim = next((c for c in plan["claim"] if c["id"] == claim_id), None)
    return {s: find(runs, claim["a"], {}, s) for s in plan["seeds"][claim["seeds"]]} if claim else {}


def render(root: Path) -> str:
    paths = {"claims": root / "experiments/confirm/claims.toml",
             "descriptive": root / "experiments/confirm/descriptive.toml",
             "registration": root / "docs/results/confirm/registration.toml"}
    plan, extra, record = (read_input(path, "toml") for path in paths.values())
    check_inputs(plan, extra, record, paths)
    if not math.isclose(1 / CLASSES + CHANCE_MARGIN, plan["rules"]["failed_at_most"]):   # the registered rule
        raise Damaged(f"{paths['claims']}: failed_at_most is not selection.run_failure's chance threshold, "
                      f"{1 / CLASSES + CHANCE_MARGIN:g}")
    runs = load_runs(root)
    cells, agree = thesis_cells(plan, runs, "agn_thesis_layout")
    shards, _ = thesis_cells(plan, runs, "agn_shard")
    lines = [
        "# Findings: the confirmatory study (issue 31)", "",
        "<!-- generated by `python experiments/findings.py`; do not edit: tests/test_findings.py regenerates it -->", "",
        f"The plan, [confirm/PLAN.md](confirm/PLAN.md), was registered in commit `{record['commit']}` on "
        f"{record['date']}, before any of its runs. Every number below comes from "
        "`experiments/findings.py` over the committed run summaries in [confirm/runs/](confirm/runs/); the claims' "
        "statistics are the plan's ([experiments/confirm/claims.toml](../../experiments/confirm/claims.toml)). "
        f"Verdicts: Holm's correction over the {len(plan['claim'])} claims at family-wise α = "
        f"{plan['rules']['alpha']}; *holds* when the adjusted p is below it, *does not hold* when the 95% t interval "
        "over seeds lies wholly on the other side of the claim's null or margin, else *inconclusive*. Accuracies in "
        "points; a failed run (diverged, or at chance) enters its comparison at chance accuracy and is counted.", "",
        "Commands: `sh experiments/confirm/run.sh` (the grids, resumable), then `python experiments/findings.py`.", "",
        "## The claims", "",
        "Each row names its own regime, read from its runs' config.json, and how it departs from the paper's. The "
        "paper's figures come from the project's background notes on the papers (dcasgd.md, agn.md; each cell names "
        "its section); those notes could not read the DC-ASGD paper's body, so a figure they do not give is *not "
        "reported*.", "",
        *claims_table(plan, runs), *control_note(plan), "",
        "## AGN against AEASGD, cell by cell, beside the thesis", "",
        f"Ours: {regime({'runs': runs.get('agn_thesis_layout', [])})}; mean over the seeds. Our 40 epochs are 40 "
        "passes over MNIST; the thesis's 40 epochs over its 11-copy file would be 440 (PLAN.md; "
        "[aeasgd_gap.md](aeasgd_gap.md)), with its agn-mlp. The thesis's figures are its validation accuracy (the "
        "MNIST test set), one run each (background agn.md §4).", "",
        *cells, "", *agreement(agree), "", *headline(plan, runs),
        "## Descriptive rows", "", *describe(plan, extra, runs), "", *closure(plan, extra, runs), "",
        *removed_table(dc7_runs(plan, runs), "DC7"),
        f"The same 16 cells under disjoint shards: {regime({'runs': runs.get('agn_shard', [])})}; the thesis's "
        "figures as above (its layout, not shards).", "", *shards, "",
        "## What the selection seeds chose", "",
        "Selected per algorithm and cell on the mean final validation accuracy of seeds 0, 8, 9 (`stalegrad grid`'s "
        "first stage), before any reporting seed ran. The plan extends no grid: a rate at an edge is reported as "
        "such, and the best rate may lie beyond it. A setting with a failed run on a selection seed cannot be "
        "selected (stalegrad/study/selection.py, run_failure): a chosen rate whose next larger rate failed is the "
        "largest stable rate, flagged as such.", "", *selections(runs), "",
        "## Machine and cost", "", *machine(runs), "",
        "## Changes to the plan", "",
        *([f"- `{c['commit']}` ({c['date']}): {c['why']}" for c in record.get("change", [])] or ["None."]), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or args.root / "docs/results/FINDINGS.md"
    try:
        page = render(args.root)
    except Damaged as e:   # an input that cannot be read or lacks what the page reads: one line, nothing written
        print(f"findings.py: {e}", file=sys.stderr)
        return 2
    out.write_text(page)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
