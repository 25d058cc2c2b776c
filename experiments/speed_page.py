"""docs/results/SPEED.md, the speed study's page (docs/results/speed/PLAN.md), from the runs that
experiments/speed.py collected into docs/results/speed/runs/ and nothing else: tests/test_speed_study.py
regenerates it byte for byte.

    python experiments/speed.py page
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import speed as S
from stalegrad.study.report_target import survival
from stalegrad.study.stats import holm, paired_t, t_interval

PAGE = S.ROOT / "docs" / "results" / "SPEED.md"
REGISTRATION = S.ROOT / "docs" / "results" / "speed" / "registration.toml"
NAMES = {"homogeneous": "homogeneous (gamma:2)", "straggler": "one straggler (straggler:10)",
         "sqrt": "heterogeneous:sqrt", "heavy": "heavy-tailed (lognormal:1.5)"}
# What each claim's source measured, against what this study runs (PLAN.md, "Regime and deviations").
SOURCES = {
    "dcasgd-a": "paper: CIFAR-10 ResNet-20 and ImageNet on GPU clusters, real time; here Fashion-MNIST, small mlp, "
                "simulated clock",
    "agn": "thesis: MNIST, agn-mlp (4.8M weights), Spark, 40 epochs over 11 copies; here Fashion-MNIST, small mlp, "
           "5 epochs, simulated clock",
    "ringmaster": "paper: theory, and small-scale runs of its own; here Fashion-MNIST, small mlp, simulated clock",
    "best-async": "Ringmaster, Rennala and m-synchronous SGD papers: theory with small runs; here Fashion-MNIST, "
                  "small mlp, simulated clock",
}


def seeds_for(plan: dict, M: int) -> list[int]:
    return plan["seeds"][f"report{M}"]


def run_of(plan: dict, runs: dict, arm: str, lr: float, M: int, profile: str, seed: int, prefix: str = ""):
    (r,) = S.time_runs(plan, arm, lr, [seed], 1 if arm == "sgd" else M, [profile])
    return runs.get(prefix + r["name"])


def cell_time(plan, sel, runs, arm, M, profile, seed, clock="virtual_s", scale=1.0, prefix="", target=None):
    """(T, reached) of one run against its cell's horizon and target (or ``target``), or None when the run is
    missing."""
    lr = sel["rates"].get((arm, 1 if arm == "sgd" else M))
    if lr is None:
        return None
    r = run_of(plan, runs, arm, lr, M, profile, seed, prefix)
    if r is None:
        return None
    target = plan["time"]["target"][str(M)] if target is None else target
    return S.time_reached(r, target, S.horizon(plan, profile, M), plan, clock, scale)


# ---------------------------------------------------------------- the claims

def time_claim(c, plan, sel, runs) -> dict:
    M = c["workers"]
    a = sel["best"].get(M) if c["a"] == "best-async" else c["a"]
    values, censored, missing = {}, {"a": 0, "b": 0}, 0
    for seed in seeds_for(plan, M):
        logs = []
        for p in c["profiles"]:
            ta, tb = (cell_time(plan, sel, runs, x, M, p, seed) for x in (a, c["b"]))
            if ta is None or tb is None:
                missing += (ta is None) + (tb is None)
                continue
            censored["a"] += not ta[1]
            censored["b"] += not tb[1]
            logs.append(math.log(ta[0] / tb[0]))
        if len(logs) == len(c["profiles"]):
            values[seed] = statistics.fmean(logs)
    n = len(seeds_for(plan, M)) * len(c["profiles"])
    return {"values": values, "missing": missing, "count": {k: (v, n) for k, v in censored.items()}, "a": a}


def accuracy(run: dict | None, plan: dict) -> float | None:
    if run is None:
        return None
    return plan["rules"]["chance"] if S.failed(run, plan) else run["summary"]["final_test_acc"]


def mech_name(arm, M, lr, seed) -> str:
    return f"{arm}_M{M}_lr{lr:g}_s{seed}"


def accuracy_claim(c, plan, runs) -> dict:
    values, fails, missing = {}, {"a": 0, "b": 0}, 0
    for seed in plan["seeds"]["mechanism"]:
        diffs = []
        for M in c["workers"]:
            ra, rb = (runs.get(mech_name(x, M, c["lr"], seed)) for x in (c["a"], c["b"]))
            if ra is None or rb is None:
                missing += (ra is None) + (rb is None)
                continue
            fails["a"] += S.failed(ra, plan)
            fails["b"] += S.failed(rb, plan)
            diffs.append(accuracy(ra, plan) - accuracy(rb, plan))
        if len(diffs) == len(c["workers"]):
            values[seed] = statistics.fmean(diffs)
    n = len(plan["seeds"]["mechanism"]) * len(c["workers"])
    return {"values": values, "missing": missing, "count": {k: (v, n) for k, v in fails.items()}, "a": c["a"]}


def evaluate(c, plan, sel, time_runs, mech_runs) -> dict:
    r = time_claim(c, plan, sel, time_runs) if c["kind"] == "time" else accuracy_claim(c, plan, mech_runs)
    if r["missing"] or (c["kind"] == "time" and r["a"] is None):
        return {**r, "p": 1.0, "interval": None}
    v = list(r["values"].values())
    test = paired_t(v, c["direction"] or 1)
    p = test["p_two_sided"] if c["direction"] == 0 else test["p_one_sided"]
    p = 1.0 if math.isnan(p) else p            # no spread and a mean of 0 (every seed censored on both sides)
    return {**r, "p": p, "interval": t_interval(v, plan["rules"]["level"])}


def verdict(r: dict, c: dict, adj: dict) -> str:
    if r["interval"] is None:
        return f"missing: {r['missing']} runs" if r["missing"] else "missing: the selection"
    iv, d = r["interval"], c["direction"]
    if adj["reject"]:
        if d:
            return "holds"
        ahead_a = iv["mean"] < 0 if c["kind"] == "time" else iv["mean"] > 0
        return f"holds: {r['a'] if ahead_a else c['b']} {'sooner' if c['kind'] == 'time' else 'ahead'}"
    if d and (iv["lo"] > 0 if d < 0 else iv["hi"] < 0):
        return "does not hold"
    return "inconclusive"


def ratio_text(iv: dict | None) -> str:
    if not iv or not math.isfinite(iv["mean"]):
        return "n/a"
    if not (math.isfinite(iv["lo"]) and math.isfinite(iv["hi"])):
        return f"×{math.exp(iv['mean']):.2f} ({iv['n']} seeds, no interval)"
    return f"×{math.exp(iv['mean']):.2f} [{math.exp(iv['lo']):.2f}, {math.exp(iv['hi']):.2f}] ({iv['n']} seeds)"


def points_text(iv: dict | None) -> str:
    if not iv or not math.isfinite(iv["mean"]):
        return "n/a"
    lo, hi = (f"{100 * iv[k]:+.2f}" if math.isfinite(iv[k]) else "n/a" for k in ("lo", "hi"))
    return f"{100 * iv['mean']:+.2f} points [{lo}, {hi}] ({iv['n']} seeds)"


def regime(c: dict, plan: dict, sel: dict) -> str:
    if c["kind"] == "accuracy":
        return ("Fashion-MNIST, mlp, 5 epochs (rate /10 at 3 and 4), disjoint shards, gamma:2, final test accuracy; "
                "paper: no such control")
    M, t = c["workers"], plan["time"]
    hs = ", ".join(f"{S.horizon(plan, p, M):.0f}" for p in c["profiles"])
    src = SOURCES.get(c["a"], SOURCES["dcasgd-a"])
    return (f"Fashion-MNIST, mlp, {t['options']['epochs']}-epoch budget, disjoint shards, "
            f"{' + '.join(NAMES[p] for p in c['profiles'])}, target {100 * t['target'][str(M)]:.0f}% validation, "
            f"H = {hs} s; {src}")


def claims_table(plan, sel, time_runs, mech_runs) -> tuple[list[str], dict]:
    results = {c["id"]: evaluate(c, plan, sel, time_runs, mech_runs) for c in plan["claim"]}
    adjusted = holm({k: r["p"] for k, r in results.items()}, plan["rules"]["alpha"])
    out = ["| id | claim | regime and deviations | verdict | estimate: T_a / T_b, or accuracy a − b [95% interval] | "
           "p (Holm-adjusted) | censored or failed (a; b) |", "|---|---|---|---|---|---|---|"]
    for c in plan["claim"]:
        r, adj = results[c["id"]], adjusted[c["id"]]
        est = (ratio_text if c["kind"] == "time" else points_text)(r["interval"])
        p = "n/a" if r["interval"] is None else f"{r['p']:.3g} ({adj['p_adjusted']:.3g})"
        cnt = "; ".join(f"{k} of {n}" for k, n in (r["count"]["a"], r["count"]["b"]))
        who = f" (the best asynchronous arm: {r['a']})" if c["a"] == "best-async" and r["a"] else ""
        out.append(f"| {c['id']} | {c['text']}{who} | {regime(c, plan, sel)} | **{verdict(r, c, adj)}** | {est} | "
                   f"{p} | {cnt} |")
    return out, results


# ---------------------------------------------------------------- the reader's table: which arm is soonest

def km_median(times: list[tuple[float, bool]]) -> float:
    """The Kaplan-Meier median of (T, reached) pairs; inf when fewer than half reach the target."""
    s = survival([t for t, ok in times if ok], [t for t, ok in times if not ok])
    return next((t for t, frac in s if frac <= 0.5), math.inf)


def soonest(plan, sel, runs, M: int, seeds=None, clock="virtual_s", scale=1.0, prefix="", arms=None,
            profiles=None, target=None) -> dict:
    """{profile: {arm: [(T, reached) per seed]}} for every arm with all its runs."""
    seeds = seeds or seeds_for(plan, M)
    arms = arms or [a for a in plan["time"]["arms"]]
    out = {}
    for p in profiles or plan["time"]["profiles"]:
        cell = {}
        for a in arms:
            if (a, 1 if a == "sgd" else M) not in sel["rates"]:
                continue
            ts = [cell_time(plan, sel, runs, a, M, p, s, clock, scale, prefix, target) for s in seeds]
            if all(t is not None for t in ts):
                cell[a] = ts
        out[p] = cell
    return out


def soonest_table(plan, sel, runs, M: int) -> list[str]:
    cells = soonest(plan, sel, runs, M)
    profiles = list(plan["time"]["profiles"])
    out = ["| arm (its rate) | " + " | ".join(NAMES[p] for p in profiles) + " |", "|---|" + "---|" * len(profiles)]
    fastest = {p: min(c, key=lambda a: statistics.fmean(math.log(t) for t, _ in c[a])) for p, c in cells.items() if c}
    for a in plan["time"]["arms"]:
        row = [f"{a} ({sel['rates'][(a, 1 if a == 'sgd' else M)]:g})" if (a, 1 if a == "sgd" else M) in sel["rates"]
               else a]
        for p in profiles:
            ts = cells.get(p, {}).get(a)
            if ts is None:
                row.append("missing")
                continue
            med = km_median(ts)
            reached = sum(ok for _, ok in ts)
            f = fastest[p]
            if a == f:
                rel = "**the soonest**"
            else:
                iv = t_interval([math.log(t / u) for (t, _), (u, _) in zip(ts, cells[p][f])], plan["rules"]["level"])
                rel = ratio_text(iv).replace(f" ({iv['n']} seeds)", "")
            row.append(f"{'> H' if math.isinf(med) else f'{med:.0f} s'}, {reached}/{len(ts)}; {rel}")
        out.append("| " + " | ".join(row) + " |")
    return out


def higher_target(plan, sel, runs, M: int = 8, target: float = 0.85) -> str:
    """How many reporting runs at M reached ``target`` by their cell's horizon: why the registered target is
    lower (PLAN.md, the pilots)."""
    times = [t for cell in soonest(plan, sel, runs, M, target=target).values() for ts in cell.values() for t in ts]
    got, reached = len(times), sum(ok for _, ok in times)
    return (f"Why 80% and not 85%: of the {got} reporting runs at M = {M}, {reached} reached {100 * target:.0f}% "
            "validation accuracy by their cell's horizon.")


def local_table(plan, sel, sim_runs, local_runs) -> list[str]:
    loc = plan["local"]
    M, seeds, st = loc["workers"], plan["seeds"]["local"], loc["options"]["step_time"]
    sim = soonest(plan, sel, sim_runs, M, seeds, arms=loc["arms"], profiles=loc["profiles"])
    real = soonest(plan, sel, local_runs, M, seeds, "wall_s", st, "local_", loc["arms"], loc["profiles"])
    out = ["| profile | arm | simulator: median time, reached | local runtime: median time ÷ step time, reached |",
           "|---|---|---|---|"]
    orders = {}
    for p in loc["profiles"]:
        for which, cells in (("sim", sim[p]), ("local", real[p])):
            orders[(p, which)] = sorted(cells, key=lambda a: (km_median(cells[a]), a))
        for a in loc["arms"]:
            cols = []
            for cells in (sim[p], real[p]):
                ts = cells.get(a)
                cols.append("missing" if ts is None else
                            f"{'> H' if math.isinf(km_median(ts)) else f'{km_median(ts):.0f} s'}, "
                            f"{sum(ok for _, ok in ts)}/{len(ts)}")
            out.append(f"| {NAMES[p]} | {a} | {cols[0]} | {cols[1]} |")
    late = msgs = 0
    for r in local_runs.values():
        for w in ((r["summary"].get("pacing") or {}).get("per_worker") or []):
            late, msgs = late + w["overruns"], msgs + w["messages"]
    out += ["", f"Pacing held: {late} of the local runs' {msgs} messages took longer to compute than their drawn "
            "time (core/pacing.py's overruns); every other message waited out exactly its drawn time."]
    for p in loc["profiles"]:
        text = {}
        for which, cells in (("sim", sim[p]), ("local", real[p])):
            reached = [a for a in orders[(p, which)] if math.isfinite(km_median(cells[a]))]
            behind = sorted(set(cells) - set(reached))
            text[which] = (" < ".join(reached) or "none") + (f"; not by H: {', '.join(behind)}" if behind else "")
        same = text["sim"] == text["local"]
        out.append(f"- {NAMES[p]}: simulator {text['sim']}; local runtime {text['local']}: "
                   f"**{'the same order' if same else 'a different order'}**.")
    return out


# ---------------------------------------------------------------- the mechanism at every rate, the selection

def mechanism_table(plan, runs) -> list[str]:
    mech = plan["mechanism"]
    arms = mech["arms"]
    out = ["| M | lr | " + " | ".join(f"{a}: test accuracy (failed)" for a in arms) + " | DC − redrawn | DC − damped | "
           "DC − ASGD |", "|---|---|" + "---|" * (len(arms) + 3)]
    for M in mech["workers"]:
        for lr in mech["rates"]:
            acc = {a: [accuracy(runs.get(mech_name(a, M, lr, s)), plan) for s in plan["seeds"]["mechanism"]]
                   for a in arms}
            if any(x is None for v in acc.values() for x in v):
                out.append(f"| {M} | {lr:g} | " + " | ".join("missing" for _ in range(len(arms) + 3)) + " |")
                continue
            fails = {a: sum(S.failed(runs[mech_name(a, M, lr, s)], plan) for s in plan["seeds"]["mechanism"])
                     for a in arms}
            cols = [f"{100 * statistics.fmean(acc[a]):.2f} ({fails[a]})" for a in arms]
            for b in ("dcasgd-a-redrawn", "dcasgd-a-damped", "asgd"):
                cols.append(points_text(t_interval([x - y for x, y in zip(acc["dcasgd-a"], acc[b])])))
            out.append(f"| {M} | {lr:g} | " + " | ".join(cols) + " |")
    return out


def selection_table(plan, sel) -> list[str]:
    out = ["| arm | M | selected lr | each rate: geometric mean time to the target over seeds 0, 8, 9 (reached) |",
           "|---|---|---|---|"]
    for (arm, M), cell in sel["scores"].items():
        rates = plan["time"]["arms"][arm]["rates"]
        lr = sel["rates"].get((arm, M))
        edge = "" if lr is None or lr not in (rates[0], rates[-1]) else " (at the grid's edge)"
        each = "; ".join(f"{x:g}: " + ("missing" if not math.isfinite(s[0]) else f"{math.exp(s[0]):.0f} s ({s[1]}/{s[2]})")
                         for x, s in cell.items())
        out.append(f"| {arm} | {M} | {'missing' if lr is None else f'{lr:g}'}{edge} | {each} |")
    best = ", ".join(f"M = {M}: {a}" for M, a in sorted(sel["best"].items()))
    return out + ["", f"The best asynchronous arm on the selection seeds: {best or 'not yet selected'}."]


def cpu_hours(stages: dict) -> str:
    secs = sum(r["summary"].get("wall_s") or 0 for runs in stages.values() for r in runs.values())
    n = sum(len(runs) for runs in stages.values())
    return (f"In all {n} runs and {secs / 3600:.1f} CPU hours of training (each simulated run on one thread; a local "
            "run's wall seconds, its 8 workers sharing the 2 cores), plus about 2 s of start-up a run.")


def runs_line(stages: dict, where: Path) -> list[str]:
    out = ["| stage | runs | training seconds (sum of the runs' wall_s) | machine | code (commit) | first start, last end "
           "(span) |", "|---|---|---|---|---|---|"]
    for st, runs in stages.items():
        m = where / f"{st}.machine.json"
        info = S.read_input(m, "json") if m.exists() else {}
        if not isinstance(info, dict):
            raise S.Damaged(f"{m} is not a JSON object (the machine a stage ran on)")
        secs = sum(r["summary"].get("wall_s") or 0 for r in runs.values())
        if not runs:
            out.append(f"| {st} | 0 | 0 | not run | | |")
            continue
        out.append(f"| {st} | {len(runs)} | {secs:.0f} | {info.get('cpu', 'n/a')}, {info.get('cores', 'n/a')} cores | "
                   f"`{info.get('commit')}` | "
                   f"{info.get('first_start')}, {info.get('last_end')} ({info.get('span_s')} s) |")
    return out


def render(where: Path = S.COLLECTED, plan: dict | None = None, registration: Path = REGISTRATION) -> str:
    plan = S.prepare(plan or S.load_plan())
    reg = S.read_input(registration, "toml")
    stages = {st: S.read_runs(st, where) for st in S.STAGES}
    sel = S.selection(plan, where)
    claims, _ = claims_table(plan, sel, stages["report"], stages["mechanism"])
    changes = [f"- `{c['commit']}` ({c['date']}): {c['why']}" for c in reg.get("change", [])] or ["None."]
    lines = [
        "# Speed: which method reaches a target soonest on uneven machines (issue 42)", "",
        "<!-- generated by `python experiments/speed.py page`; do not edit: tests/test_speed_study.py regenerates it -->",
        "",
        f"The plan, [speed/PLAN.md](speed/PLAN.md), was registered in commit `{reg['commit']}` on {reg['date']}, "
        f"before any of its runs (the first started {reg['first_run']}). Every number below is computed by "
        "`experiments/speed_page.py` from the runs' curves committed in [speed/runs/](speed/runs/); the claims are "
        "[experiments/speed/plan.toml](../../experiments/speed/plan.toml)'s. Time is the simulator's virtual "
        "seconds (one local step of a speed-1 worker: 1 s). A run that does not reach the target by its cell's "
        "horizon H, or fails, enters at H. Verdicts: Holm over the "
        f"{len(plan['claim'])} claims at family-wise α = {plan['rules']['alpha']}; *holds* when the adjusted p is "
        "below it, *does not hold* when the 95% t interval lies wholly on the other side of the null, else "
        "*inconclusive*. A ratio T_a / T_b below 1: a is sooner.", "",
        "Commands: `python experiments/speed.py run STAGE` (STAGE: select, report, mechanism, local; resumable), "
        "`python experiments/speed.py collect STAGE`, then `python experiments/speed.py page`.", "",
        "## The claims", "", *claims, "",
        "## On 8 uneven workers, which method reaches 80% soonest?", "",
        "Each cell: the Kaplan-Meier median time to 80% validation accuracy over the reporting seeds (censored at "
        "H), how many of them reached it, and the ratio of the arm's time to the soonest arm's in that column "
        "(geometric mean over seeds, 95% t interval on the paired log ratios).", "",
        *soonest_table(plan, sel, stages["report"], 8), "", higher_target(plan, sel, stages["report"]), "",
        "## The same at 32 workers (target 75%)", "", *soonest_table(plan, sel, stages["report"], 32), "",
        "## The local runtime's subset: does the order depend on the simulator?", "",
        *local_table(plan, sel, stages["report"], stages["local"]), "",
        "## DC-ASGD-a and its controls at every rate", "",
        "The confirmatory setting, seeds 110-114: the mean final test accuracy (a failed run at chance; its count "
        "in brackets) and DC-ASGD-a's difference to each control with a 95% t interval. DC7's size, the share of "
        "the stale gradient's error that the correction removes beside the exact Hessian's, is on "
        "[FINDINGS.md](FINDINGS.md) (from the confirmatory probes).", "",
        *mechanism_table(plan, stages["mechanism"]), "",
        "## What the selection seeds chose", "",
        "Per arm and M under the homogeneous profile, before any reporting seed ran; the same rate then ran under "
        "every profile. sequential SGD (M = 1) on its own horizon.", "", *selection_table(plan, sel), "",
        "## Changes after registration", "", *changes, "",
        "## The runs", "", *runs_line(stages, where), "", cpu_hours(stages), "",
    ]
    return "\n".join(lines)


def write_page() -> None:
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
