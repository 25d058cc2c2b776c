"""Simulated cluster: accuracy, staleness and virtual time past one machine (M = 16 to 256 workers).

    .venv/bin/python benchmarks/archive/sim_cluster.py                  # the full grid, a few minutes
    .venv/bin/python benchmarks/archive/sim_cluster.py --quick --out -  # a smoke run, nothing written

For every delay model, number of workers M and algorithm, and for every seed,
one ``stalegrad.train`` on the deterministic simulator
(``Simulator(delay=..., vectorised=True)`` for the gradient rules, one worker
at a time for AGN, whose local steps cannot be batched). Every run gets the
same sample budget (``--epochs`` passes over the training set, whatever M),
the same per-worker mini-batch, and one learning rate per algorithm, the same
for every M and delay. Each worker samples the whole training set
(``partition="iid"``): with M = 256 a disjoint shard of the 1437 digits
training samples would hold 5 of them.

Per cell, over the seeds: tau (mean, median, max), final and best test
accuracy (mean +- sample std), the virtual seconds to reach ``--target``
test accuracy (linear interpolation between the two evaluations around the
first crossing), the virtual seconds and server updates of the whole run, and
the NaN/Inf messages the server skipped. A reference row trains sequential
SGD (M = 1, uniform delay: one virtual second per step) on the same budget.

All figures are of the simulator's virtual clock (one unit per local step of
a speed-1 worker) and of test accuracy: the same command gives the same table
on any machine with the same torch version and thread count; only the
"wall s" fields of the JSON depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import common
import torch

import stalegrad as sg

WORKERS = (16, 32, 64, 128, 256)
DELAYS = ("heterogeneous:sqrt", "straggler:10")
ALGOS = ("asgd", "dcasgd-a", "agn", "ssgd")
# One learning rate per algorithm, for every M and delay: the server's for the gradient rules,
# the local Adam's for AGN (window 10).
LR = {"sgd": 0.05, "asgd": 0.05, "dcasgd-a": 0.05, "dcasgd-c": 0.05, "ssgd": 0.05, "agn": 0.001}
PARAMS = {"agn": {"window": 10, "local_opt": "adam"}}


def tau_median(histogram: dict[str, int]) -> float:
    total = sum(histogram.values())
    if not total:
        return 0.0
    seen, half = 0, (total - 1) / 2
    for tau, n in sorted(((int(k), v) for k, v in histogram.items())):
        seen += n
        if seen > half:
            return float(tau)
    return 0.0


def one_run(train, test, model: str, algo: str, workers: int, delay: str, seed: int, args) -> dict:
    algorithm = sg.make_algorithm(algo, **PARAMS.get(algo, {}))
    runtime = sg.Simulator(delay=delay, vectorised=bool(algorithm.vectorisable))
    lr = args.lr[algo]
    t = time.perf_counter()
    res = sg.train(model, train, test, algorithm, workers, runtime, epochs=args.epochs,
                   batch_size=args.batch_size, lr=lr, eval_every=args.eval_every, partition="iid", seed=seed)
    wall = time.perf_counter() - t
    s = res.summary
    curve = [(m["virtual_s"], m["test_acc"]) for m in res.metrics]
    return {
        "seed": seed, "lr": lr,
        "final_test_acc": s["final_test_acc"], "best_test_acc": s["best_test_acc"],
        "final_test_loss": s["final_test_loss"],
        "tau_mean": s["tau_mean"], "tau_median": tau_median(res.staleness["histogram"]), "tau_max": s["tau_max"],
        "virtual_s_to_target": common.crossing(curve, args.target),
        "virtual_s": s["virtual_s"], "updates": s["updates"], "samples": s["samples"],
        "nonfinite_skipped": s["nonfinite_skipped"], "diverged": s["diverged"], "notes": s["notes"],
        "wall_s": round(wall, 2),
        # the curve: (virtual s, test accuracy) at every evaluation
        "curve_virtual_s": [round(v, 3) for v, _ in curve],
        "curve_test_acc": [round(a, 4) if a is not None and math.isfinite(a) else None for _, a in curve],
    }


def aggregate(runs: list[dict]) -> dict:
    n = len(runs)
    reached = [r["virtual_s_to_target"] for r in runs if r["virtual_s_to_target"] is not None]
    out = {"seeds": n}
    for key in ("final_test_acc", "best_test_acc", "virtual_s", "updates", "tau_mean", "tau_median"):
        out[key + "_mean"], out[key + "_std"] = common.mean_std([r[key] for r in runs])
    out["tau_max"] = max(r["tau_max"] for r in runs)
    out["reached"] = len(reached)
    if reached:
        out["virtual_s_to_target_mean"], out["virtual_s_to_target_std"] = common.mean_std(reached)
    out["nonfinite_skipped"] = [r["nonfinite_skipped"] for r in runs]
    out["diverged"] = sum(bool(r["diverged"]) for r in runs)
    return out


def fmt_pm(mean: float, std: float, digits: int = 3) -> str:
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def fmt_time(a: dict) -> str:
    n, k = a["seeds"], a["reached"]
    if k == 0:
        return f"not reached (0 of {n})"
    m, s = a["virtual_s_to_target_mean"], a["virtual_s_to_target_std"]
    text = f"{m:.1f} ± {s:.1f}" if k > 1 else f"{m:.1f}"
    return text if k == n else f"{text}, reached {k} of {n}"


def table(cells: list[dict], target: float) -> str:
    cols = ["delay", "M", "algorithm", "lr", "tau mean", "tau p50", "tau max", "final acc", "best acc",
            f"virtual s to {target:g}", "virtual s (run)", "updates", "NaN/Inf skipped (per seed)"]
    body = []
    for c in cells:
        a = c["agg"]
        skipped = a["nonfinite_skipped"]
        body.append([c["delay"], c["workers"], c["algorithm"], f"{c['lr']:g}", f"{a['tau_mean_mean']:.1f}",
                     f"{a['tau_median_mean']:.0f}", a["tau_max"], fmt_pm(a["final_test_acc_mean"], a["final_test_acc_std"]),
                     fmt_pm(a["best_test_acc_mean"], a["best_test_acc_std"]), fmt_time(a),
                     f"{a['virtual_s_mean']:.0f}", f"{a['updates_mean']:.0f}",
                     "0" if not any(skipped) else " / ".join(str(x) for x in skipped)
                     + (f" ({a['diverged']} diverged)" if a["diverged"] else "")])
    return common.table(cols, body)


def parse_lr(text: str) -> dict[str, float]:
    lr = dict(LR)
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = item.partition("=")
        lr[name.strip()] = float(value)
    return lr


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default=",".join(map(str, WORKERS)), help="comma-separated M [%(default)s]")
    ap.add_argument("--delays", default=",".join(DELAYS), help="comma-separated delay models [%(default)s]")
    ap.add_argument("--algos", default=",".join(ALGOS), help="comma-separated algorithms [%(default)s]")
    ap.add_argument("--seeds", type=int, default=2, help="seeds 0..N-1 [%(default)s]")
    ap.add_argument("--epochs", type=float, default=60, help="sample budget of every run, in epochs [%(default)s]")
    ap.add_argument("--batch-size", type=int, default=16, help="per-worker mini-batch [%(default)s]")
    ap.add_argument("--eval-every", type=float, default=0.25, help="epochs between evaluations [%(default)s]")
    ap.add_argument("--target", type=float, default=0.85, help="test accuracy for the time-to-target column [%(default)s]")
    ap.add_argument("--dataset", default="digits", choices=("digits", "synthetic"), help="[%(default)s]")
    ap.add_argument("--model", default="mlp", help="[%(default)s]")
    ap.add_argument("--lr", type=parse_lr, default=dict(LR),
                    help="learning rates to change, e.g. asgd=0.02,agn=0.002 [" + ",".join(f"{k}={v:g}" for k, v in LR.items()) + "]")
    ap.add_argument("--no-baseline", action="store_true", help="skip the sequential SGD reference row")
    ap.add_argument("--no-curves", action="store_true",
                    help="leave the per-run accuracy curves out of the JSON (most of its size)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads [%(default)s]")
    ap.add_argument("--quick", action="store_true", help="smoke run: M = 16 and 64, 2 epochs, 1 seed")
    ap.add_argument("--out", default=str(common.RESULTS / "sim_cluster.json"), help="JSON file, or - for none [%(default)s]")
    args = ap.parse_args(argv)
    if args.quick:
        args.workers, args.epochs, args.seeds = "16,64", 2.0, 1
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    delays = [d.strip() for d in args.delays.split(",") if d.strip()]
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    missing = [a for a in algos + ["sgd"] if a not in args.lr]
    if missing:
        ap.error(f"no learning rate for {missing[0]}; give it with --lr {missing[0]}=VALUE")
    torch.set_num_threads(args.threads)
    seeds = list(range(args.seeds))

    command = common.command(argv)
    machine = common.machine()
    train, test = sg.load_pair(args.dataset)
    print(f"machine: {machine['nproc']} cores, {machine['cpu']}, torch {machine['torch']}, {machine['threads']} "
          f"threads, load average {machine['loadavg']}, {machine['time']}", file=sys.stderr)
    start = time.perf_counter()

    cells = []
    plan = [("uniform", 1, "sgd")] if not args.no_baseline else []
    plan += [(d, m, a) for d in delays for m in workers for a in algos]
    for delay, m, algo in plan:
        runs = []
        for seed in seeds:
            r = one_run(train, test, args.model, algo, m, delay, seed, args)
            if args.no_curves:
                del r["curve_virtual_s"], r["curve_test_acc"]
            runs.append(r)
            print(f"  {delay:>18s} M={m:<4d} {algo:9s} seed {seed}: final {r['final_test_acc']:.3f} best "
                  f"{r['best_test_acc']:.3f} tau {r['tau_mean']:.1f}/{r['tau_max']} to-target "
                  f"{r['virtual_s_to_target']} skipped {r['nonfinite_skipped']} ({r['wall_s']} s)",
                  file=sys.stderr, flush=True)
        cells.append({"delay": delay, "workers": m, "algorithm": algo, "lr": args.lr[algo],
                      "params": PARAMS.get(algo, {}), "agg": aggregate(runs), "runs": runs})
    seconds = round(time.perf_counter() - start, 1)

    text = table(cells, args.target)
    setup = {
        "dataset": args.dataset, "train_samples": len(train.y), "test_samples": len(test.y), "model": args.model,
        "partition": "iid", "epochs": args.epochs, "batch_size": args.batch_size, "eval_every": args.eval_every,
        "target": args.target, "seeds": seeds, "lr": {a: args.lr[a] for a in ["sgd"] + algos},
        "params": PARAMS, "workers": workers, "delays": delays, "algorithms": algos,
        "baseline": None if args.no_baseline else "sgd, M = 1, uniform delay",
    }
    payload = {"command": command, "machine": machine, "loadavg_before": machine["loadavg"],
               "loadavg_after": common.load(), "seconds": seconds, "quick": args.quick, "setup": setup,
               "table": text, "cells": cells}
    print(f"command: `{command}`\n")
    print(f"{args.dataset} ({len(train.y)} train / {len(test.y)} test samples), model {args.model}, "
          f"partition iid (every worker samples the whole training set), {args.epochs:g} epochs per run, "
          f"batch {args.batch_size} per worker, evaluation every {args.eval_every:g} epochs, seeds "
          f"{', '.join(map(str, seeds))}; lr " + ", ".join(f"{a} {args.lr[a]:g}" for a in ["sgd"] + algos)
          + " (agn: local Adam, window 10); threads " + str(args.threads) + ".\n")
    print(text)
    print(f"\nmachine: {machine['nproc']} cores, {machine['cpu']}, torch {machine['torch']}, {machine['time']}; "
          f"load average {payload['loadavg_before']} -> {payload['loadavg_after']}; {seconds} s")
    if args.out != "-":
        print(f"-> {common.save(args.out, common.compact_json(payload))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
