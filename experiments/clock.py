"""The simulator's clock against real runs (issue 41).

One speed profile (``--delay``) is the simulator's clock and, in the local and Ray runtimes, a real cluster: each
worker waits out its message's drawn time (stalegrad/core/pacing.py). Here every profile runs for real, then in
the simulator with the same step time, twice: with the step time alone ("sim"), and with the real run's transport
modelled ("sim+t": each message's drawn from an exponential whose median is the real run's pull and push medians,
``--message-time``, and the pull where the runtime makes it, ``--pull``). The page compares, per profile and
runtime:

- the time at which each run first reaches two validation accuracies (the real run's clock starts when its
  workers do: ``pacing.started_s``), medians over the seeds;
- the tau histograms (total-variation distance, the seeds pooled);
- each worker's share of the updates;

and draws validation accuracy against time, real and simulated. Goals (the issue's): the simulated time to each
target within 15% of the real one, the tau histograms within a distance of 0.1.

    python experiments/clock.py run [--out runs/clock] [--seeds 0,1,2]   # the runs (about 20 min on 2 cores)
    python experiments/clock.py collect runs/clock                     # their small files into the repository
    python experiments/clock.py page                                   # docs/results/clock.md and clock.png

The settings below were fixed on the pilot seed (100) before the reporting seeds (0, 1, 2) ran.
tests/test_clock.py regenerates the committed page from the committed files byte for byte.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = Path("docs/results/clock/runs")
PAGE = Path("docs/results/clock.md")
PLOT = Path("docs/results/clock.png")

# ---- the registered settings (fixed on the pilot seed 100) --------------------------------------------------
PROFILES = ("round-robin", "straggler:10", "heterogeneous:sqrt", "lognormal:1", "slowdown:8@2")
KINDS = {"round-robin": "homogeneous", "straggler:10": "one straggler", "heterogeneous:sqrt": "constant per worker",
         "lognormal:1": "heavy-tailed", "slowdown:8@2": "changes in time"}
ARMS = (("local", 4), ("local", 8), ("ray", 4))
SEEDS = (0, 1, 2)
PILOT_SEED = 100
STEP_TIME = 0.04          # seconds per message of a speed-1 worker: 1 local step of a batch of 32
TARGETS = (0.8, 0.88)     # validation accuracies (the pilot's runs peaked at 0.89 to 0.94)
COMMON = ["--algo", "asgd", "--dataset", "digits", "--model", "mlp", "--batch-size", "32", "--lr", "0.05",
          "--epochs", "16", "--eval-every", "0.25", "--val-split", "300", "--step-time", str(STEP_TIME), "-q"]
TIME_GOAL, TV_GOAL = 0.15, 0.1
# where a worker's next weights come from: the local runtime asks in a second request, after its push's answer;
# Ray's direct path sends them in the push's answer
PULL = {"local": "separate", "ray": "with-push"}
FILES = ("config.json", "summary.json", "metrics.jsonl", "staleness.json")


def slug(profile: str) -> str:
    return profile.replace(":", "-").replace("@", "-at-")


def name(kind: str, runtime: str, M: int, profile: str, seed: int) -> str:
    """kind: real, sim (step time alone) or simt (with the real run's transport)."""
    return f"{kind}-{runtime}-M{M}-{slug(profile)}-s{seed}"


# ---- running -----------------------------------------------------------------------------------------------
def train(out: Path, *args: str) -> None:
    if (out / "summary.json").is_file():
        return   # done (the runs resume: a finished one is kept)
    cmd = [sys.executable, "-m", "stalegrad", "train", *COMMON, *args, "--out", str(out), "--overwrite"]
    print(" ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)


def transport_s(summary: dict) -> float:
    """Seconds a real message spends beyond its computation: the worker's pull and push medians (the Ray
    direct path's push round trip carries the next weights: its pull is in it)."""
    t = summary["transport"]
    return ((t.get("pull_ms_median") or 0.0) + (t.get("push_ms_median") or 0.0)) / 1000


def run_all(out: Path, seeds) -> None:
    for profile in PROFILES:
        for runtime, M in ARMS:
            for seed in seeds:
                common = ["--workers", str(M), "--delay", profile, "--seed", str(seed)]
                real = out / name("real", runtime, M, profile, seed)
                train(real, "--runtime", runtime, *common)
                summary = json.loads((real / "summary.json").read_text())
                train(out / name("sim", runtime, M, profile, seed), *common)
                train(out / name("simt", runtime, M, profile, seed), *common,
                      "--message-time", f"{transport_s(summary):.6f}", "--pull", PULL[runtime])


def collect(src: Path, root: Path) -> None:
    dest = root / RUNS
    for run in sorted(p for p in src.iterdir() if (p / "summary.json").is_file()):
        (dest / run.name).mkdir(parents=True, exist_ok=True)
        for f in FILES:
            shutil.copyfile(run / f, dest / run.name / f)


# ---- reading -------------------------------------------------------------------------------------------------
def load(root: Path, run: str) -> dict | None:
    d = root / RUNS / run
    if not (d / "summary.json").is_file():
        return None
    summary = json.loads((d / "summary.json").read_text())
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines() if line.strip()]
    # virtual_s: a real runtime's second of the push on the run's clock (wall_s is when the driver accounted
    # for it: a Ray run's driver reads the shard's records in batches), the simulator's virtual second
    origin = summary["pacing"]["started_s"] if summary.get("pacing") else 0.0
    curve = [(r["virtual_s"] - origin, r["val_acc"]) for r in rows]
    staleness = json.loads((d / "staleness.json").read_text())
    return {"summary": summary, "curve": [(max(0.0, t), a) for t, a in curve],
            "histogram": {int(k): v for k, v in staleness["histogram"].items()},
            "updates": [w["updates"] for w in staleness["per_worker"]]}


def time_to(run: dict, target: float) -> float | None:
    """The first evaluation at or above ``target``, in seconds from the start; None if it never came."""
    return next((t for t, acc in run["curve"] if acc >= target), None)


def median_time(runs: list[dict], target: float) -> tuple[float | None, int]:
    """The median time to ``target`` over the runs, and how many never reached it (a median that a run which
    never reached it could move is not given: None)."""
    times = [time_to(r, target) for r in runs]
    reached = sorted(t for t in times if t is not None)
    censored = len(times) - len(reached)
    if censored * 2 >= len(times):
        return None, censored
    # the censored runs count as later than every reached one
    ordered = reached + [float("inf")] * censored
    mid = statistics.median(ordered)
    return (mid if mid != float("inf") else None), censored


def pooled(runs: list[dict], key: str):
    if key == "histogram":
        out: dict[int, int] = {}
        for r in runs:
            for k, v in r["histogram"].items():
                out[k] = out.get(k, 0) + v
        return out
    total = [sum(x) for x in zip(*(r["updates"] for r in runs))]
    return [u / sum(total) for u in total]


def tv_distance(p: dict, q: dict) -> float:
    sp, sq = sum(p.values()), sum(q.values())
    return 0.5 * sum(abs(p.get(k, 0) / sp - q.get(k, 0) / sq) for k in set(p) | set(q))


# ---- the page ------------------------------------------------------------------------------------------------
def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def compare(root: Path) -> list[dict]:
    rows = []
    for profile in PROFILES:
        for runtime, M in ARMS:
            got = {kind: [load(root, name(kind, runtime, M, profile, s)) for s in SEEDS] for kind in ("real", "sim", "simt")}
            if any(r is None for runs in got.values() for r in runs):
                continue
            real = got["real"]
            row = {"profile": profile, "runtime": runtime, "M": M, "times": {}, "ratios": {}}
            for target in TARGETS:
                for kind in ("real", "sim", "simt"):
                    row["times"][(kind, target)] = median_time(got[kind], target)
                t_real = row["times"][("real", target)][0]
                for kind in ("sim", "simt"):
                    t = row["times"][(kind, target)][0]
                    row["ratios"][(kind, target)] = t / t_real if t is not None and t_real else None
            hist = pooled(real, "histogram")
            row["tv"] = {kind: tv_distance(hist, pooled(got[kind], "histogram")) for kind in ("sim", "simt")}
            shares = pooled(real, "shares")
            row["share_gap"] = {kind: max(abs(a - b) for a, b in zip(shares, pooled(got[kind], "shares")))
                                for kind in ("sim", "simt")}
            row["slowest_share"] = (shares[-1], pooled(got["simt"], "shares")[-1])
            per = [f for r in real for f in r["summary"]["pacing"]["per_worker"]]
            messages = sum(f["messages"] for f in per)
            row["overruns"] = sum(f["overruns"] for f in per) / messages if messages else 0.0
            measured = statistics.median(r["summary"]["pacing"]["measured_step_s"] for r in real)
            row["stretch"] = statistics.median(f["compute_s"] / f["messages"] for f in per if f["messages"]) / measured
            row["transport_ms"] = 1000 * statistics.median(transport_s(r["summary"]) for r in real)
            row["meets"] = {kind: all(row["ratios"][(kind, t)] is not None and
                                      abs(row["ratios"][(kind, t)] - 1) <= TIME_GOAL for t in TARGETS)
                            and row["tv"][kind] < TV_GOAL for kind in ("sim", "simt")}
            row["curves"] = {kind: [r["curve"] for r in got[kind]] for kind in ("real", "simt")}
            row["seeds"] = {(kind, t): [time_to(r, t) for r in got[kind]] for kind in ("real", "simt") for t in TARGETS}
            row["inside"] = {(kind, t): inside(row["times"][(kind, t)][0], row["seeds"][("real", t)])
                             for kind in ("sim", "simt") for t in TARGETS}
            rows.append(row)
    return rows


def inside(t: float | None, real: list[float | None]) -> bool | None:
    """Whether a simulated median time lies within the real seeds' range (None: a time unknown)."""
    if t is None or any(x is None for x in real):
        return None
    return min(real) <= t <= max(real)


def seconds(times: list[float | None]) -> str:
    return ", ".join("never" if t is None else f"{t:.2f}" for t in times)


def page(rows: list[dict], machine: str) -> str:
    t1, t2 = TARGETS
    lines = [
        "# The simulator's clock against real runs",
        "",
        "Generated by `python experiments/clock.py page` from the runs in `docs/results/clock/runs/` (made by "
        "`python experiments/clock.py run` and `collect`); `tests/test_clock.py` regenerates this page byte for byte.",
        "",
        f"**Setting.** asgd, digits, mlp, batch 32, lr 0.05, 16 epochs, a validation split of 300, an evaluation every "
        f"0.25 epoch; step time {STEP_TIME} s per message of a speed-1 worker; seeds {', '.join(map(str, SEEDS))} "
        f"(the settings were fixed on the pilot seed {PILOT_SEED}). Real runs: `--runtime local` (M = 4, 8) and "
        "`--runtime ray` (M = 4, a local Ray), each worker waiting out its drawn time; their clock starts when the "
        "workers do. **sim**: the simulator with the same profile and step time; **sim+t**: the same with each "
        "message's transport drawn from an exponential whose median is the real run's (pull + push medians, "
        "`--message-time`), and the local runtime's pull as its second request (`--pull separate`; Ray's direct "
        "path answers a push with the next weights: `--pull with-push`).",
        f"**Machine.** {machine}",
        "",
        f"Goals: simulated time to each target within {TIME_GOAL:.0%} of the real one (medians over the seeds), "
        f"tau histograms within a total-variation distance of {TV_GOAL}.",
        "",
        f"| profile | runtime | M | real s to {t1} | sim / real | sim+t / real | real s to {t2} | sim / real | "
        "sim+t / real | TV sim | TV sim+t | share gap sim+t | last worker's share real / sim+t | overruns | "
        "compute stretch | transport ms | goals sim / sim+t |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [f"`{r['profile']}` ({KINDS[r['profile']]})", r["runtime"], str(r["M"])]
        for target in TARGETS:
            t, censored = r["times"][("real", target)]
            cells.append(fmt(t) + (f" ({censored} never)" if censored else ""))
            cells += [fmt(r["ratios"][("sim", target)]), fmt(r["ratios"][("simt", target)])]
        cells += [fmt(r["tv"]["sim"], 3), fmt(r["tv"]["simt"], 3), fmt(r["share_gap"]["simt"], 3),
                  f"{r['slowest_share'][0]:.3f} / {r['slowest_share'][1]:.3f}", f"{r['overruns']:.1%}",
                  f"{r['stretch']:.2f}", f"{r['transport_ms']:.2f}",
                  " / ".join("met" if r["meets"][k] else "missed" for k in ("sim", "simt"))]
        lines.append("| " + " | ".join(cells) + " |")
    by_profile: dict[str, list[bool]] = {}
    for r in rows:
        by_profile.setdefault(r["profile"], []).append(r["meets"]["simt"])
    met = [p for p, ok in by_profile.items() if all(ok)]
    tv_rows = lambda kind, rt: [r["tv"][kind] for r in rows if r["runtime"] == rt]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    time_ok = sum(all(r["ratios"][("simt", t)] is not None and abs(r["ratios"][("simt", t)] - 1) <= TIME_GOAL
                      for t in TARGETS) for r in rows)
    inside_count = {kind: sum(bool(r["inside"][(kind, t)]) for r in rows for t in TARGETS) for kind in ("sim", "simt")}
    pairs = len(rows) * len(TARGETS)
    lines += [
        "",
        f"**Profiles whose every runtime meets both goals with sim+t: {len(met)} of {len(by_profile)}** "
        f"({', '.join(f'`{p}`' for p in met) or 'none'}). Rows: {sum(r['meets']['simt'] for r in rows)} of "
        f"{len(rows)} meet both; {time_ok} of {len(rows)} the time goal, "
        f"{sum(r['tv']['simt'] < TV_GOAL for r in rows)} of {len(rows)} the tau goal.",
        "",
        "## What the misses are made of",
        "",
        f"- **The time to a target is noisier than the goal.** The first evaluation at or above a validation "
        f"accuracy is a threshold crossing of a noisy curve (300 validation samples, lr 0.05): the same real run on "
        f"three seeds reaches it at times up to twice apart (the table below). A 15% goal on the median of three "
        f"seeds is inside that noise, so a time miss alone does not say that the clock is wrong. A check that "
        f"allows for it: if the simulated runs were draws of the real clock, the median of three simulated seeds "
        f"would fall within the range of the three real ones with probability 12/20 (of the 20 orders of six "
        f"draws, 12 put a real one on each side of it): {0.6 * pairs:.0f} of the {pairs} (row, target) pairs "
        f"expected. Observed: {inside_count['simt']} for sim+t, {inside_count['sim']} for sim (the simulated and "
        f"real runs of a seed share its data order and first weights, which brings them closer than independent "
        f"draws). The data cannot tell these clocks from the real one at this noise: inconclusive, and a finer "
        f"check needs more seeds or less noisy targets.",
        f"- **The tau histograms of the local runtime: its pull is a second request.** Ray's direct path answers "
        f"a push with the next weights, as the simulator's pull at push time models; the local runtime's worker "
        f"asks for them in a second request, which the server answers after whatever reached it meanwhile, and "
        f"equal speeds make pushes arrive together. The plain simulator, whose ties break in a fixed order, "
        f"keeps lockstep exactly (tau = M - 1). Mean TV, local rows: {mean(tv_rows('sim', 'local')):.3f} for sim, "
        f"{mean(tv_rows('simt', 'local')):.3f} for sim+t, which draws each message's transport (ties break at "
        f"random) and pulls it after the push; Ray rows: {mean(tv_rows('sim', 'ray')):.3f} and "
        f"{mean(tv_rows('simt', 'ray')):.3f}. What remains in the local rows at M = 8 is not modelled: the server "
        f"is one process and the transports of pushes that queue at it are not independent draws.",
        f"- **The 2 shared cores.** A worker's computation took {min(r['stretch'] for r in rows):.1f} to "
        f"{max(r['stretch'] for r in rows):.1f} times the step measured alone before the run (the workers, the "
        f"server, the evaluator and Ray's processes share 2 cores), and a message's transport "
        f"{min(r['transport_ms'] for r in rows):.2f} to {max(r['transport_ms'] for r in rows):.2f} ms. The step "
        f"time (40 ms) leaves room for both: at most "
        f"{max(r['overruns'] for r in rows):.1%} of the real messages outlasted their drawn time, so the profiles "
        f"held, and the clock's error from the cores is the transport, {max(r['transport_ms'] for r in rows) / 40:.1%} "
        f"of a step at most, which sim+t adds.",
        "",
        "### Time to each target, seed by seed",
        "",
        f"| profile | runtime | M | real s to {t1} | sim+t | inside | real s to {t2} | sim+t | inside |",
        "|---|---|---|---|---|---|---|---|---|",
        *("| " + " | ".join([f"`{r['profile']}`", r["runtime"], str(r["M"]),
                              *(cell for t in TARGETS for cell in (
                                  seconds(r["seeds"][("real", t)]), seconds(r["seeds"][("simt", t)]),
                                  {True: "yes", False: "no", None: "-"}[r["inside"][("simt", t)]]))]) + " |"
          for r in rows),
        "",
        "*inside*: sim+t's median time within the real seeds' range.",
        "",
        "Columns: *share gap*: the largest difference between a worker's share of the updates, real and simulated "
        "(seeds pooled); *overruns*: the real messages whose computation outlasted their drawn time; *compute "
        "stretch*: a real message's median computation over one step measured alone before the run (how much the "
        "2 shared cores slow each worker); *transport ms*: the median pull + push a real message adds.",
        "",
        "![validation accuracy against time, real (solid) and sim+t (dashed)](clock.png)",
        "",
    ]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(PROFILES), len(ARMS), figsize=(4 * len(ARMS), 2.6 * len(PROFILES)), squeeze=False,
                             sharey=True)
    where = {(p, a): (i, j) for i, p in enumerate(PROFILES) for j, a in enumerate(ARMS)}
    for r in rows:
        ax = axes[where[(r["profile"], (r["runtime"], r["M"]))]]
        for s, (real, sim) in enumerate(zip(r["curves"]["real"], r["curves"]["simt"])):
            color = f"C{s}"
            ax.plot(*zip(*real), color=color, lw=1, label=f"real, seed {SEEDS[s]}")
            ax.plot(*zip(*sim), color=color, lw=1, ls="--", label=f"sim+t, seed {SEEDS[s]}")
        for t in TARGETS:
            ax.axhline(t, color="grey", lw=0.5)
        ax.set_title(f"{r['profile']}, {r['runtime']} M={r['M']}", fontsize=9)
        ax.set_ylim(0, 1)
    for ax in axes[-1]:
        ax.set_xlabel("seconds from the workers' start (real; sim: virtual)")
    for ax in axes[:, 0]:
        ax.set_ylabel("validation accuracy")
    axes[0][0].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)


def machine(root: Path) -> str:
    note = root / RUNS.parent / "MACHINE.md"
    return note.read_text().strip() if note.is_file() else "not recorded"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, default=Path("runs/clock"))
    r.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    c = sub.add_parser("collect")
    c.add_argument("src", type=Path)
    c.add_argument("--root", type=Path, default=ROOT)
    p = sub.add_parser("page")
    p.add_argument("--root", type=Path, default=ROOT)
    p.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "run":
        run_all(args.out, [int(s) for s in args.seeds.split(",")])
    elif args.command == "collect":
        collect(args.src, args.root)
    else:
        rows = compare(args.root)
        (args.root / PAGE).write_text(page(rows, machine(args.root)))
        if not args.no_plot:
            plot(rows, args.root / PLOT)
        print(f"{args.root / PAGE}: {len(rows)} rows")


if __name__ == "__main__":
    main()
