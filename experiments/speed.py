"""The registered speed study (issue 42, docs/results/speed/PLAN.md): its runs, its selection, its page.

    python experiments/speed.py run select [--jobs 2]     # stage 1: every rate on the selection seeds
    python experiments/speed.py collect select            # the runs' curves into docs/results/speed/runs/
    python experiments/speed.py run report                # the selected rates on the reporting seeds
    python experiments/speed.py run mechanism             # DC-ASGD-a and its controls at every rate
    python experiments/speed.py run local --jobs 1        # the local runtime's subset, one run at a time
    python experiments/speed.py collect report           # likewise mechanism and local
    python experiments/speed.py page                      # docs/results/SPEED.md from the collected runs

Every stage is resumable: a run whose summary.json exists is skipped. The runs live in runs/speed/<stage>/; only
their curves and summaries (one line a run in docs/results/speed/runs/<stage>.jsonl) are committed, and the page
and the selection are computed from those alone, so a test regenerates the page from the repository.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

from stalegrad.core.delays import parse_delay                      # noqa: E402
from stalegrad.run.files import UnreadableFile, read_text         # noqa: E402
from stalegrad.run.results import DamagedRun, read_summary          # noqa: E402
from findings_rows import Damaged, read_input   # noqa: E402  (one reader for both study pages)
from stalegrad.study.grid import toml_value                       # noqa: E402
from stalegrad.study.report_curves import time_to_target           # noqa: E402
from stalegrad.study.selection import run_failure                  # noqa: E402

PLAN = ROOT / "experiments" / "speed" / "plan.toml"
COLLECTED = ROOT / "docs" / "results" / "speed" / "runs"
RUNS = ROOT / "runs" / "speed"
STAGES = ("select", "report", "mechanism", "local")
TRAIN_SAMPLES = 50000          # Fashion-MNIST's 60,000 training samples less the 10,000 held out
CURVE_KEYS = ("epoch", "samples", "virtual_s", "wall_s", "val_acc", "test_acc")


def load_plan(path: Path = PLAN) -> dict:
    return read_input(path, "toml")


# ---------------------------------------------------------------- the clock's horizon and a run's time

def ideal_time(profile: str, workers: int, epochs: float, batch_size: int, step_time: float = 1.0) -> float:
    """Virtual seconds that ideal asynchronous SGD takes for ``epochs``: the steps over the workers' summed
    speeds, worker i's speed being 1 / its mean step time under the profile."""
    model = parse_delay(profile, workers)
    steps = epochs * TRAIN_SAMPLES / batch_size
    return steps * step_time / sum(1.0 / model.fastest(i) for i in range(workers))


def horizon(plan: dict, profile_key: str | None, workers: int) -> float:
    """H of a cell (PLAN.md): horizon_share x the ideal 5-epoch time under the profile; ``profile_key`` None:
    sequential SGD's own horizon (one worker of speed 1)."""
    o = plan["time"]["options"]
    spec = "round-robin" if profile_key is None else plan["time"]["profiles"][profile_key]
    return plan["rules"]["horizon_share"] * ideal_time(spec, workers, o["epochs"], o["batch_size"])


def failed(run: dict, plan: dict) -> bool:
    s = run["summary"]
    acc = s.get("final_test_acc")
    return (run_failure(s, 10) is not None or not isinstance(acc, (int, float))
            or not math.isfinite(acc) or acc <= plan["rules"]["failed_at_most"])


def time_reached(run: dict, target: float, h: float, plan: dict, clock: str = "virtual_s",
                 scale: float = 1.0) -> tuple[float, bool]:
    """(T, reached): the run's first crossing of the validation ``target`` on ``clock`` / ``scale``, or
    (H, False) when it never reaches it by H or the run failed (censored: PLAN.md). On the wall clock of a
    real runtime, time counts from the profile's second 0 (the workers' common start, ``pacing.started_s``),
    not from the start of the run's processes."""
    if failed(run, plan):
        return h, False
    metrics = [dict(zip(CURVE_KEYS, row)) for row in run["curve"]]
    hit = time_to_target(metrics, target, key="val_acc")
    origin = ((run["summary"].get("pacing") or {}).get("started_s") or 0.0) if clock == "wall_s" else 0.0
    t = None if hit is None else max(0.0, hit[clock] - origin) / scale
    if t is None or t > h:
        return h, False
    return t, True


def accuracy_at(run: dict, h: float, plan: dict, clock: str = "virtual_s") -> float:
    """The validation accuracy of the run's last evaluation at or before H (a failed run: chance): what breaks
    a tie between rates whose runs were all censored (PLAN.md, change 1)."""
    if failed(run, plan):
        return plan["rules"]["chance"]
    before = [dict(zip(CURVE_KEYS, row)) for row in run["curve"]]
    before = [m for m in before if m[clock] is not None and m[clock] <= h and m["val_acc"] is not None]
    return before[-1]["val_acc"] if before else plan["rules"]["chance"]


# ---------------------------------------------------------------- the runs of each stage

def _run(name: str, options: dict) -> dict:
    return {"name": name, "options": options}


def time_runs(plan: dict, arm: str, lr: float, seeds, workers: int, profiles) -> list[dict]:
    t = plan["time"]
    spec = t["arms"][arm]
    out = []
    for p in profiles:
        for seed in seeds:
            o = {**t["options"], "algo": arm, "workers": workers, "delay": t["profiles"][p],
                 **spec.get("options", {}), "lr": lr, "seed": seed}
            m = "" if arm == "sgd" else f"_M{workers}_{p}"
            out.append(_run(f"{arm}{m}_lr{lr:g}_s{seed}", o))
    return out


def runs_of(stage: str, plan: dict, selected: dict | None = None) -> list[dict]:
    t, seeds = plan["time"], plan["seeds"]
    if stage == "select":
        out = []
        for arm, spec in t["arms"].items():
            for lr in spec["rates"]:
                if arm == "sgd":
                    out += time_runs(plan, arm, lr, seeds["select"], 1, [t["select_profile_key"]])
                    continue
                for M in t["workers"]:
                    out += time_runs(plan, arm, lr, seeds["select"], M, [t["select_profile_key"]])
        return out
    if stage == "report":
        out = time_runs(plan, "sgd", selected[("sgd", 1)], seeds["report8"], 1, [t["select_profile_key"]])
        for M in t["workers"]:          # M = 8 first: the reader's question, should the machine's time run out
            for arm in t["arms"]:
                if arm != "sgd":
                    out += time_runs(plan, arm, selected[(arm, M)], seeds[f"report{M}"], M, list(t["profiles"]))
        return out
    if stage == "local":
        loc, out = plan["local"], []
        M = loc["workers"]
        for seed in seeds["local"]:     # seed by seed: every cell has a run before any has its second
            for arm in loc["arms"]:
                for r in time_runs(plan, arm, selected[(arm, M)], [seed], M, loc["profiles"]):
                    out.append(_run("local_" + r["name"], {**r["options"], **loc["options"]}))
        return out
    if stage == "mechanism":
        mech, out = plan["mechanism"], []
        for lr in sorted(mech["rates"], key=lambda x: x != 0.1):   # the claims' rate (0.1) first
            for arm in mech["arms"]:
                for M in mech["workers"]:
                    for seed in seeds["mechanism"]:
                        o = {k: v for k, v in mech["options"].items() if k not in foreign_hyperparameters(arm)}
                        o.update(algo=arm, workers=M, lr=lr, seed=seed)
                        out.append(_run(f"{arm}_M{M}_lr{lr:g}_s{seed}", o))
        return out
    raise SystemExit(f"speed.py: no stage {stage!r}; the stages are {', '.join(STAGES)}")


def foreign_hyperparameters(arm: str) -> set[str]:
    """The hyper-parameters of other rules that ``arm`` does not take (the mechanism's lam0 for asgd): a
    setting shared by a stage's arms applies to those that have it, as in a grid's [fixed] table."""
    from dataclasses import fields
    from stalegrad.algorithms import ALGORITHMS
    every = {f.name for cls in ALGORITHMS.values() for f in fields(cls)}
    return every - {f.name for f in fields(ALGORITHMS[arm])}


def prepare(plan: dict) -> dict:
    """The plan with the homogeneous profile's key found (select_profile names a spec)."""
    t = plan["time"]
    t["select_profile_key"] = next(k for k, v in t["profiles"].items() if v == t["select_profile"])
    return plan


def _train(run: dict, stage: str, threads: int) -> tuple[str, int]:
    out = RUNS / stage / run["name"]
    if (out / "summary.json").exists():
        return run["name"], 0
    cells = RUNS / stage / "cells"
    cells.mkdir(parents=True, exist_ok=True)
    cfg = cells / f"{run['name']}.toml"
    cfg.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in run["options"].items()))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "stalegrad", "train", "--config", str(cfg), "--out", str(out), "--quiet",
           "--overwrite"]
    with open(cells / f"{run['name']}.log", "wb") as log:
        code = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env,
                              cwd=ROOT).returncode
    return run["name"], code


def run_stage(stage: str, jobs: int, threads: int, match: str | None = None) -> int:
    plan = prepare(load_plan())
    selected = None if stage in ("select", "mechanism") else selection(plan)["rates"]
    runs = [r for r in runs_of(stage, plan, selected) if match is None or re.search(match, r["name"])]
    todo = [r for r in runs if not (RUNS / stage / r["name"] / "summary.json").exists()]
    print(f"{stage}: {len(runs)} runs, {len(runs) - len(todo)} done, {len(todo)} to run, {jobs} at once", flush=True)
    bad = 0
    with ThreadPoolExecutor(jobs) as pool:
        for i, (name, code) in enumerate(pool.map(lambda r: _train(r, stage, threads), todo), 1):
            bad += code != 0
            if code or i % 20 == 0 or i == len(todo):
                print(f"  {i}/{len(todo)} {name}" + (f" exit {code}" if code else ""), flush=True)
    return 1 if bad else 0


# ---------------------------------------------------------------- collect and read back

def collect(stage: str) -> None:
    """One line a finished run: its name, options, curve (CURVE_KEYS at each evaluation) and summary."""
    plan = prepare(load_plan())
    selected = None if stage in ("select", "mechanism") else selection(plan)["rates"]
    lines = []
    for r in runs_of(stage, plan, selected):
        d = RUNS / stage / r["name"]
        if not (d / "summary.json").exists():
            continue
        try:
            summary = read_summary(d)
        except DamagedRun as e:
            raise Damaged(str(e)) from None
        keep = {k: summary.get(k) for k in ("final_test_acc", "final_test_loss", "final_val_acc",
                                            "final_val_loss", "diverged", "wall_s", "virtual_s", "samples",
                                            "updates", "updates_dropped", "tau_mean", "weights_sha256",
                                            "pacing")}
        curve = []
        for i, m in enumerate(read_input(d / "metrics.jsonl", "jsonl"), 1):
            if not isinstance(m, dict):
                raise Damaged(f"{d / 'metrics.jsonl'}: record {i} is not a JSON object")
            curve.append([m.get(k) for k in CURVE_KEYS])
        lines.append(json.dumps({"name": r["name"], "options": r["options"], "curve": curve, "summary": keep},
                                sort_keys=True))
    COLLECTED.mkdir(parents=True, exist_ok=True)
    (COLLECTED / f"{stage}.jsonl").write_text("".join(x + "\n" for x in lines))
    (COLLECTED / f"{stage}.machine.json").write_text(json.dumps(machine(stage), indent=1, sort_keys=True) + "\n")
    print(f"{stage}: {len(lines)} runs collected into {COLLECTED / (stage + '.jsonl')}")


def machine(stage: str) -> dict:
    """Where and when the stage ran: the CPU, its cores, the commit whose code made the runs (runs/speed/COMMIT:
    the study runs from a git worktree of that commit, so that edits in the working tree cannot reach a run), the
    first run's start and the last run's end."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    starts = [p.stat().st_mtime for p in (RUNS / stage / "cells").glob("*.toml")]
    ends = [p.stat().st_mtime for p in (RUNS / stage).glob("*/summary.json")]
    stamp = (lambda t: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t)))
    try:   # (a commit's name: a few bytes)
        commit = read_text(RUNS / "COMMIT", 256).strip() if (RUNS / "COMMIT").exists() else None
    except UnreadableFile as e:
        raise Damaged(f"{RUNS / 'COMMIT'} {e.reason}") from None
    return {"cpu": cpu, "cores": os.cpu_count(), "commit": commit,
            "first_start": stamp(min(starts)) if starts else None,
            "last_end": stamp(max(ends)) if ends else None,
            "span_s": round(max(ends) - min(starts)) if starts and ends else None}


def read_runs(stage: str, where: Path = COLLECTED) -> dict:
    """{name: run} of a stage's collected runs; ``Damaged`` for a line that is not a run as ``collect`` writes it."""
    path = where / f"{stage}.jsonl"
    if not path.exists():
        return {}
    runs = read_input(path, "jsonl")
    for i, r in enumerate(runs, 1):
        if not (isinstance(r, dict) and isinstance(r.get("name"), str) and isinstance(r.get("summary"), dict)
                and isinstance(r.get("curve"), list) and all(isinstance(c, list) and len(c) == len(CURVE_KEYS)
                                                             for c in r["curve"])):
            raise Damaged(f"{path}: record {i} is not a collected run (its name, summary and curve of "
                          f"{', '.join(CURVE_KEYS)})")
    return {r["name"]: r for r in runs}


# ---------------------------------------------------------------- selection (PLAN.md: before any reporting seed)

def selection(plan: dict, where: Path = COLLECTED) -> dict:
    """{"rates": {(arm, M): lr}, "scores": {(arm, M): {lr: (mean log T, reached, n, val acc at H)}},
    "best": {M: arm}}: per arm and M, the rate with the smallest mean log time over the selection seeds under
    the homogeneous profile (censored at H); ties (every run censored) to the higher mean validation accuracy
    at H (PLAN.md, change 1), then to the smaller rate; sgd at M = 1 on its own horizon."""
    plan = prepare(plan) if "select_profile_key" not in plan["time"] else plan
    t, runs = plan["time"], read_runs("select", where)
    rates, scores = {}, {}
    for arm, spec in t["arms"].items():
        for M in ([1] if arm == "sgd" else t["workers"]):
            h = horizon(plan, None if arm == "sgd" else t["select_profile_key"], M)
            target = t["target"][str(8 if arm == "sgd" else M)]
            cell = {}
            for lr in spec["rates"]:
                rs = time_runs(plan, arm, lr, plan["seeds"]["select"], M, [t["select_profile_key"]])
                got = [runs.get(r["name"]) for r in rs]
                if any(g is None for g in got):
                    cell[lr] = (math.nan, 0, len(got), math.nan)
                    continue
                times = [time_reached(g, target, h, plan) for g in got]
                cell[lr] = (sum(math.log(x) for x, _ in times) / len(times), sum(ok for _, ok in times), len(times),
                            sum(accuracy_at(g, h, plan) for g in got) / len(got))
            scores[(arm, M)] = cell
            done = [lr for lr in spec["rates"] if math.isfinite(cell[lr][0])]
            if len(done) == len(spec["rates"]):
                rates[(arm, M)] = min(done, key=lambda lr: (cell[lr][0], -cell[lr][3], lr))
    best = {}
    for M in t["workers"]:
        cands = [a for a in t["async_arms"] if (a, M) in rates]
        if len(cands) == len(t["async_arms"]):
            best[M] = min(cands, key=lambda a: (scores[(a, M)][rates[(a, M)]][0], -scores[(a, M)][rates[(a, M)]][3], a))
    return {"rates": rates, "scores": scores, "best": best}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("run", "collect", "page", "selection"))
    ap.add_argument("stage", nargs="?", choices=STAGES)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--match", default=None, help="run only the stage's runs whose name matches this regex "
                    "(an order of work; the stage is complete once every run is made)")
    a = ap.parse_args(argv)
    if a.action in ("run", "collect") and a.stage is None:
        ap.error(f"{a.action} needs a stage: one of {', '.join(STAGES)}")
    try:
        return act(a)
    except Damaged as e:   # an input that cannot be read: one line, nothing written
        print(f"speed.py: {e}", file=sys.stderr)
        return 2


def act(a: argparse.Namespace) -> int:
    if a.action == "run":
        return run_stage(a.stage, a.jobs, a.threads, a.match)
    if a.action == "collect":
        collect(a.stage)
        return 0
    if a.action == "selection":
        sel = selection(load_plan())
        for (arm, M), lr in sorted(sel["rates"].items()):
            print(f"{arm:16s} M={M:<3d} lr {lr:g}   " + "  ".join(
                f"{x:g}: {s[0]:.3f} ({s[1]}/{s[2]})" for x, s in sel["scores"][(arm, M)].items()))
        print("best asynchronous arm:", sel["best"])
        return 0
    from speed_page import write_page   # noqa: E402  (experiments/ is on sys.path when run as a script)
    write_page()
    return 0


if __name__ == "__main__":
    sys.exit(main())
