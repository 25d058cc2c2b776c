"""AGN on Fashion-MNIST: the effect of the weight initialisation, and of the delay model.

    .venv/bin/python benchmarks/archive/init_effect.py --epochs 4              # everything, about 30 min on 2 cores
    .venv/bin/python benchmarks/archive/init_effect.py --epochs 0.1 --seeds 1 --out - --no-plot   # a smoke run
    .venv/bin/python benchmarks/archive/init_effect.py --report                # tables and plot from the JSON

The AGN paper (Hermans et al. 2017) trained its 784-1000-2000-1000-10 MLP
(``agn-mlp``) with Keras 2.0's defaults: glorot-uniform weights, zero biases,
local Adam at lr 0.001, batch 128. Every run here is

    stalegrad.train("agn-mlp", train, test, stalegrad.make_algorithm("agn", window=W), n,
                    runtime, epochs=E, batch_size=128, eval_every=0.5, seed=s, init=INIT)

on Fashion-MNIST (60,000 train / 10,000 test), in four parts:

1. ``init`` torch vs glorot-uniform, n = 40 workers, window 40, uniform delays, seeds 0..S-1;
2. the same with n = 8, window 10;
3. the delay model at n = 40, window 40, glorot-uniform, seed 0: uniform (the part-1 run,
   not repeated), gamma:2, exponential;
4. the local runtime (real processes) at n = 2, window 40, glorot-uniform, seed 0, with its push
   order recorded to ``benchmarks/archive/results/init_effect_local_n2.csv``, next to the simulator's
   run (uniform delays) of the same configuration.

Per run the JSON keeps the curve (epoch, virtual_s, wall_s, test_acc, tau_mean at every
evaluation), the summary, the staleness (tau mean and max; the mean and max after the first n
commits, ``tau_mean_after_first_round``, which with uniform delays is exactly the first round; the
histogram) and the epochs and virtual seconds to reach 0.85 and 0.88 test accuracy (linear
interpolation between the two evaluations around the first crossing; None if never). The JSON
is rewritten after every run, so an interrupted invocation keeps what it finished.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import common
import torch

import stalegrad as sg

TARGETS = (0.85, 0.88)
INITS = ("torch", "glorot-uniform")
CONFIGS = ((40, 40), (8, 10))                  # (n workers, window) of parts 1 and 2
DELAYS = ("uniform", "gamma:2", "exponential")  # part 3
LOCAL_N, LOCAL_WINDOW = 2, 40                   # part 4
OUT = common.RESULTS / "init_effect.json"
TRACE = common.RESULTS / "init_effect_local_n2.csv"
PNG = common.ROOT / "docs" / "results" / "init_effect.png"


# ---------------------------------------------------------------------------------------------
# the plan and one run

def plan(seeds: list[int], parts: set[int]) -> list[dict]:
    runs = []
    for part, (n, window) in ((1, CONFIGS[0]), (2, CONFIGS[1])):
        if part in parts:
            runs += [dict(part=part, runtime="sim", workers=n, window=window, delay="uniform", init=init, seed=s)
                     for init in INITS for s in seeds]
    if 3 in parts:
        n, window = CONFIGS[0]
        for delay in DELAYS:
            if delay == "uniform" and 1 in parts and 0 in seeds:
                continue   # the part-1 run (glorot-uniform, seed 0) is this one
            runs.append(dict(part=3, runtime="sim", workers=n, window=window, delay=delay, init="glorot-uniform", seed=0))
    if 4 in parts:
        runs.append(dict(part=4, runtime="local", workers=LOCAL_N, window=LOCAL_WINDOW, delay=None,
                         init="glorot-uniform", seed=0))
        runs.append(dict(part=4, runtime="sim", workers=LOCAL_N, window=LOCAL_WINDOW, delay="uniform",
                         init="glorot-uniform", seed=0))
    return runs


def crossing(curve: list[dict], key: str, target: float) -> float | None:
    """``key`` (epoch or virtual_s) at which test accuracy first reaches ``target`` (``common.crossing``)."""
    return common.crossing([(m[key], m["test_acc"]) for m in curve], target)


def r4(x):
    return round(x, 4) if isinstance(x, float) and math.isfinite(x) else (None if isinstance(x, float) else x)


def one_run(spec: dict, train, test, epochs: float, trace: Path) -> dict:
    algorithm = sg.make_algorithm("agn", window=spec["window"])
    if spec["runtime"] == "local":
        runtime = sg.LocalRuntime(record_trace=str(trace))
    else:
        runtime = sg.Simulator(delay=spec["delay"])
    t = time.perf_counter()
    res = sg.train("agn-mlp", train, test, algorithm, spec["workers"], runtime, epochs=epochs, batch_size=128,
                   eval_every=0.5, seed=spec["seed"], init=spec["init"])
    wall = time.perf_counter() - t
    s, st = res.summary, res.staleness
    curve = [{"epoch": r4(m["epoch"]), "virtual_s": r4(m["virtual_s"]), "wall_s": r4(m["wall_s"]),
              "test_acc": r4(m["test_acc"]), "tau_mean": r4(m.get("tau_mean"))} for m in res.metrics]
    taus = [tau for _, tau in res.update_log()]
    warm = taus[spec["workers"]:]   # after the first n commits (the first round, which starts with tau 0)
    out = dict(spec)
    out.update({
        "summary": {k: s.get(k) for k in ("final_test_acc", "best_test_acc", "final_test_loss", "virtual_s", "wall_s",
                                          "updates", "samples", "tau_mean", "tau_max", "nonfinite_skipped",
                                          "diverged", "notes", "weights_sha256", "workers_lost",
                                          "threads_per_worker", "transport") if k in s},
        "staleness": {"tau_mean": st["tau_mean"], "tau_max": st["tau_max"],
                      "tau_mean_after_first_round": statistics.fmean(warm) if warm else None,
                      "tau_max_after_first_round": max(warm) if warm else None,
                      "histogram": st["histogram"]},
        "to_target": {f"{t:g}": {"epoch": r4(crossing(curve, "epoch", t)), "virtual_s": r4(crossing(curve, "virtual_s", t))}
                      for t in TARGETS},
        "run_wall_s": round(wall, 1),
        "curve": curve,
    })
    if spec["runtime"] == "local":
        out["trace"] = str(trace.relative_to(common.ROOT)) if trace.is_relative_to(common.ROOT) else str(trace)
    return out


# ---------------------------------------------------------------------------------------------
# aggregation and tables

def fmt_pm(xs: list[float], digits: int) -> str:
    m, s = common.mean_std(xs)
    return f"{m:.{digits}f} ± {s:.{digits}f} (n={len(xs)})" if len(xs) > 1 else f"{m:.{digits}f} (n=1)"


def fmt_reach(vals: list[float | None], digits: int) -> str:
    got = [v for v in vals if v is not None]
    n, k = len(vals), len(got)
    if k == 0:
        return f"not reached (0 of {n})"
    text = fmt_pm(got, digits)
    return text if k == n else text.replace(f" (n={k})", "") + f", not reached ({n - k} of {n})"


def select(runs: list[dict], **keys) -> list[dict]:
    return [r for r in runs if all(r[k] == v for k, v in keys.items())]


def row_cells(group: list[dict]) -> list[str]:
    cells = [fmt_pm([r["summary"]["final_test_acc"] for r in group], 4),
             fmt_pm([r["summary"]["best_test_acc"] for r in group], 4)]
    for t in TARGETS:
        cells.append(fmt_reach([r["to_target"][f"{t:g}"]["epoch"] for r in group], 2))
        cells.append(fmt_reach([r["to_target"][f"{t:g}"]["virtual_s"] for r in group], 0))
    return cells


TARGET_COLS = [c for t in TARGETS for c in (f"epochs to {t:g}", f"virtual s to {t:g}")]


def tau_cells(group: list[dict]) -> list[str]:
    st = [r["staleness"] for r in group]
    warm = [x["tau_mean_after_first_round"] for x in st if x["tau_mean_after_first_round"] is not None]
    return [f"{statistics.fmean(x['tau_mean'] for x in st):.1f}",
            f"{statistics.fmean(warm):.1f}" if warm else "–",
            str(max(x["tau_max"] for x in st)), f"{statistics.fmean(r['summary']['updates'] for r in group):.0f}"]


def tables(runs: list[dict]) -> dict[str, str]:
    out = {}
    for part, (n, window) in ((1, CONFIGS[0]), (2, CONFIGS[1])):
        body = []
        for init in INITS:
            g = select(runs, part=part, init=init)
            if g:
                body.append([n, window, init] + row_cells(g) + tau_cells(g))
        if body:
            out[f"part{part}"] = common.table(["n", "window", "init", "final acc", "best acc"] + TARGET_COLS
                                              + ["tau mean", "tau mean after first n commits", "tau max", "commits"], body)
    body = []
    n, window = CONFIGS[0]
    for delay in DELAYS:
        g = [r for r in runs if r["runtime"] == "sim" and r["workers"] == n and r["window"] == window
             and r["delay"] == delay and r["init"] == "glorot-uniform" and r["seed"] == 0]
        if g:
            body.append([delay] + row_cells(g[:1]) + tau_cells(g[:1]))
    if body:
        out["part3"] = common.table(["delay", "final acc", "best acc"] + TARGET_COLS
                                    + ["tau mean", "tau mean after first n commits", "tau max", "commits"], body)
    body = []
    for r in select(runs, part=4):
        st = r["staleness"]
        hist = ", ".join(f"{k}: {v}" for k, v in st["histogram"].items())
        name = "local (real processes)" if r["runtime"] == "local" else f"sim, {r['delay']}"
        body.append([name] + row_cells([r]) + [f"{st['tau_mean']:.2f}", str(st["tau_max"]), hist,
                                               str(r["summary"]["updates"]), f"{r['summary']['wall_s']:.0f}"])
    if body:
        out["part4"] = common.table(["runtime (n=2, window 40)", "final acc", "best acc"] + TARGET_COLS
                                    + ["tau mean", "tau max", "tau histogram (tau: commits)", "commits", "wall s"], body)
    return out


# ---------------------------------------------------------------------------------------------
# the plot

def plot(runs: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    panels = [(1, CONFIGS[0]), (2, CONFIGS[1])]
    extra = select(runs, part=3) or select(runs, part=4)
    fig, axes = plt.subplots(1, 3 if extra else 2, figsize=(15 if extra else 10, 4.2), sharey=True)
    colours = {"torch": "tab:blue", "glorot-uniform": "tab:orange"}
    for ax, (part, (n, window)) in zip(axes, panels):
        for init in INITS:
            g = select(runs, part=part, init=init)
            if not g:
                continue
            grid = sorted({m["epoch"] for r in g for m in r["curve"]})
            ys = np.array([np.interp(grid, [m["epoch"] for m in r["curve"]], [m["test_acc"] for m in r["curve"]])
                           for r in g])
            ax.plot(grid, ys.mean(0), color=colours[init], label=f"{init} (mean of {len(g)} seeds)")
            if len(g) > 1:
                ax.fill_between(grid, ys.min(0), ys.max(0), color=colours[init], alpha=0.25, linewidth=0)
        ax.set_title(f"AGN, n = {n}, window {window}, uniform delays")
        ax.set_xlabel("epochs (samples / 60,000)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    if extra:
        ax = axes[2]
        n, window = CONFIGS[0]
        styles = {"uniform": "-", "gamma:2": "--", "exponential": ":"}
        for delay in DELAYS:
            g = [r for r in runs if r["runtime"] == "sim" and r["workers"] == n and r["window"] == window
                 and r["delay"] == delay and r["init"] == "glorot-uniform" and r["seed"] == 0]
            if g:
                c = g[0]["curve"]
                ax.plot([m["epoch"] for m in c], [m["test_acc"] for m in c], styles[delay], color="tab:orange",
                        label=f"sim n={n} w={window}, {delay}")
        for r in select(runs, part=4):
            c = r["curve"]
            label = "local runtime n=2 w=40" if r["runtime"] == "local" else "sim n=2 w=40, uniform"
            ax.plot([m["epoch"] for m in c], [m["test_acc"] for m in c], "-" if r["runtime"] == "local" else "--",
                    color="tab:green", label=label)
        ax.set_title("glorot-uniform, seed 0: delay model and runtime")
        ax.set_xlabel("epochs (samples / 60,000)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[0].set_ylabel("Fashion-MNIST test accuracy")
    axes[0].set_ylim(0.6, 0.9)
    for ax in axes:
        for t in TARGETS:
            ax.axhline(t, color="grey", linewidth=0.6, linestyle=":")
    fig.suptitle("AGN (agn-mlp 784-1000-2000-1000-10, local Adam lr 0.001, batch 128) on Fashion-MNIST; "
                 "band: min-max over seeds", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------

def print_report(payload: dict) -> None:
    runs = payload["runs"]
    print(f"command: `{payload['command']}`\n")
    m = payload["machine"]
    print(f"machine: {m['nproc']} cores, {m['cpu']}, torch {m['torch']}, {payload['threads']} torch thread(s) in "
          f"the simulator, python {m['python']}; started {m['time']}; load average {payload['loadavg_before']} -> "
          f"{payload['loadavg_after']}; {payload['seconds']} s\n")
    for name, text in tables(runs).items():
        print(f"### {name}\n\n{text}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=float, default=4, help="epochs of every run [%(default)s]")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 of parts 1 and 2 [%(default)s]")
    ap.add_argument("--parts", default="1,2,3,4", help="which parts to run [%(default)s]")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the simulator runs [%(default)s]")
    ap.add_argument("--out", default=str(OUT), help="JSON file, or - for none [%(default)s]")
    ap.add_argument("--trace", default=str(TRACE), help="the local run's trace [%(default)s]")
    ap.add_argument("--plot", default=str(PNG), help="PNG of the curves [%(default)s]")
    ap.add_argument("--no-plot", action="store_true", help="draw no PNG")
    ap.add_argument("--report", action="store_true", help="run nothing: print the tables and draw the plot from --out")
    args = ap.parse_args(argv)

    if args.report:
        payload = json.loads(Path(args.out).read_text())
        print_report(payload)
        if not args.no_plot:
            plot(payload["runs"], Path(args.plot))
            print(f"-> {args.plot}")
        return 0

    parts = {int(p) for p in args.parts.split(",") if p.strip()}
    seeds = list(range(args.seeds))
    torch.set_num_threads(args.threads)
    command = common.command(argv)
    machine = common.machine()
    train, test = sg.load_pair("fashion-mnist")
    todo = plan(seeds, parts)
    print(f"machine: {machine['nproc']} cores, {machine['cpu']}, torch {machine['torch']}, load average "
          f"{machine['loadavg']}, {machine['time']}; {len(todo)} runs of {args.epochs:g} epochs", file=sys.stderr)
    payload = {
        "command": command, "date": machine["time"], "torch": machine["torch"], "cores": machine["nproc"],
        "machine": machine, "threads": args.threads, "loadavg_before": machine["loadavg"], "loadavg_after": None,
        "seconds": None, "complete": False,
        "setup": {"dataset": "fashion-mnist", "train_samples": len(train.y), "test_samples": len(test.y),
                  "model": "agn-mlp", "algorithm": "agn (local adam, lr 0.001)", "partition": "shard",
                  "epochs": args.epochs, "batch_size": 128, "eval_every": 0.5, "seeds": seeds, "parts": sorted(parts),
                  "targets": list(TARGETS), "trace": args.trace},
        "runs": [],
    }
    start = time.perf_counter()

    def save():
        payload["seconds"] = round(time.perf_counter() - start, 1)
        payload["loadavg_after"] = common.load()
        if args.out != "-":
            common.save(args.out, common.compact_json(payload, one_line=("epoch",)))

    for i, spec in enumerate(todo, 1):
        r = one_run(spec, train, test, args.epochs, Path(args.trace))
        payload["runs"].append(r)
        s, st = r["summary"], r["staleness"]
        print(f"[{i}/{len(todo)}] part {spec['part']} {spec['runtime']} n={spec['workers']} w={spec['window']} "
              f"{spec['delay']} {spec['init']} seed {spec['seed']}: final {s['final_test_acc']:.4f} best "
              f"{s['best_test_acc']:.4f} tau {st['tau_mean']:.2f}/{st['tau_max']} to 0.85/0.88 (epochs) "
              f"{r['to_target']['0.85']['epoch']}/{r['to_target']['0.88']['epoch']} ({r['run_wall_s']} s, "
              f"{time.perf_counter() - start:.0f} s in all, load {common.load()})", file=sys.stderr, flush=True)
        save()
    payload["complete"] = True
    save()
    print_report(payload)
    if args.out != "-":
        print(f"-> {args.out}")
    if not args.no_plot:
        plot(payload["runs"], Path(args.plot))
        print(f"-> {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
