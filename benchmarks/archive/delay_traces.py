"""Real delays against the simulator's delay models (issue 21).

Two steps, each rerunnable on its own:

    python benchmarks/archive/delay_traces.py record     # the real runs: --record-trace of local and ray runs
    python benchmarks/archive/delay_traces.py analyse    # statistics, fits, JSON and the figure

``record`` runs ``stalegrad train --record-trace`` for every entry of ``RUNS`` (asgd, Fashion-MNIST,
the mlp, batch 128: one push per mini-batch) and writes each trace to
``benchmarks/archive/results/delay_traces/<name>.csv`` with the machine's load beside it
(``<name>.json``). The heterogeneous runs slow one worker for real: ``nice`` renices worker 0
(the forkserver's first child: the local runtime starts worker 0 first) to nice +10 once it runs.

``analyse`` reads the traces and, for each, computes the distribution of tau (applied minus pulled
version) after the warm-up (the first 2M pushes), the workers' inter-push gaps (what a delay model
draws: one message's duration), how far the order of pushes is from lockstep, and the distance
(total variation, Kolmogorov-Smirnov) between the trace's tau histogram and the tau histogram the
simulator produces at the same M under each delay model (its event loop's schedule, replayed here
without training: same heap, same tie-break, same draws). It writes
``benchmarks/archive/results/delay_traces.json`` and ``docs/results/delay_traces.png``.
"""
from __future__ import annotations

import csv
import heapq
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common  # the checkout on sys.path, stalegrad first
from common import RESULTS, ROOT

from stalegrad.core.delays import parse_delay

TRACES = RESULTS / "delay_traces"
FIGURE = ROOT / "docs" / "results" / "delay_traces.png"
STALEGRAD = [sys.executable, "-m", "stalegrad"]
COMMON = ["train", "--algo", "asgd", "--dataset", "fashion-mnist", "--model", "mlp", "--batch-size", "128",
          "--quiet", "--overwrite"]

# name: (workers, runtime, epochs, extra flags, how: "plain" or "nice")
RUNS = {
    "local-M2": (2, "local", 2, [], "plain"),
    "local-M4": (4, "local", 2, [], "plain"),
    "local-M8": (8, "local", 2, [], "plain"),
    "local-M16": (16, "local", 2, [], "plain"),
    "local-M4-threads2": (4, "local", 2, ["--threads-per-worker", "2"], "plain"),
    "local-M4-nice": (4, "local", 2, [], "nice"),
    "local-M8-nice": (8, "local", 2, [], "nice"),
    "ray-M4": (4, "ray", 2, [], "plain"),
}
# The models compared with every trace, at the trace's M. gamma's shape is also fitted (FIT_SHAPES).
MODELS = ("round-robin", "exponential", "gamma:2", "heterogeneous:sqrt", "heterogeneous:linear", "straggler:10")
FIT_SHAPES = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0)
SIM_PUSHES = 20000


# ---- record --------------------------------------------------------------------------------------

def children(pid: int) -> list[int]:
    """The child processes of ``pid``, in the order they were started (pid order)."""
    return sorted(c for c, (_, parent, _) in common.processes().items() if parent == pid)


def renice_first_worker(proc: subprocess.Popen, niceness: int = 10, wait_s: float = 60.0) -> int | None:
    """Renice worker 0 of the local run ``proc`` (the forkserver's first child) once it exists."""
    t0 = time.time()
    while time.time() - t0 < wait_s and proc.poll() is None:
        for server in children(proc.pid):          # the server's children: the fork server (and others)
            workers = children(server)
            if workers:
                os.setpriority(os.PRIO_PROCESS, workers[0], niceness)
                return workers[0]
        time.sleep(0.05)
    return None


def record(names: list[str]) -> None:
    TRACES.mkdir(parents=True, exist_ok=True)
    for name in names:
        M, runtime, epochs, extra, how = RUNS[name]
        trace, out = TRACES / f"{name}.csv", Path("/tmp") / f"delay-traces-{name}"
        cmd = [*STALEGRAD, *COMMON, "--runtime", runtime, "--workers", str(M), "--epochs", str(epochs), *extra,
               "--record-trace", str(trace), "--out", str(out)]
        load_before = os.getloadavg()
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=ROOT)
        niced = renice_first_worker(proc) if how == "nice" else None
        code = proc.wait()
        meta = {"name": name, "command": " ".join(["stalegrad", *cmd[3:]]), "exit_code": code,
                "wall_s": round(time.time() - t0, 1), "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "niced_pid": niced, "niceness": 10 if how == "nice" else 0,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (TRACES / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{name}: exit {code}, {meta['wall_s']} s, load {meta['loadavg_after']}", flush=True)


# ---- analyse -------------------------------------------------------------------------------------

def read(path: Path) -> tuple[list[int], list[int], list[float]]:
    """(worker, tau, wall_s) of every push of a trace."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return ([int(r["worker"]) for r in rows], [int(r["applied"]) - int(r["pulled"]) for r in rows],
            [float(r["wall_s"]) for r in rows])


def simulate(spec: str, M: int, pushes: int = SIM_PUSHES, seed: int = 0) -> tuple[list[int], list[int]]:
    """(worker, tau) of the simulator's schedule under delay ``spec`` for a gradient rule (pull, compute
    one step, push, pull again): ``events.EventLoop``'s heap, tie-break and draws, without training."""
    delay, rng = parse_delay(spec, M), random.Random(seed)
    heap, now, version, pulled, seq = [], 0.0, 0, [0] * M, 0
    for m in range(M):
        heapq.heappush(heap, (now + delay.factor(m, rng), seq, m))
        seq += 1
    workers, taus = [], []
    while len(taus) < pushes:
        now, _, m = heapq.heappop(heap)
        workers.append(m)
        taus.append(version - pulled[m])
        version += 1
        pulled[m] = version
        heapq.heappush(heap, (now + delay.factor(m, rng), seq, m))
        seq += 1
    return workers, taus


def histogram(taus: list) -> dict:
    n = len(taus)
    h: dict[int, float] = {}
    for t in taus:
        h[t] = h.get(t, 0.0) + 1.0 / n
    return h


def tv(p: dict, q: dict) -> float:
    """Total variation distance between two histograms of tau: half the L1 distance."""
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in set(p) | set(q))


def ks(p: dict, q: dict) -> float:
    """Kolmogorov-Smirnov distance: the largest gap between the two cumulative distributions."""
    a = b = gap = 0.0
    for k in sorted(set(p) | set(q)):
        a, b = a + p.get(k, 0.0), b + q.get(k, 0.0)
        gap = max(gap, abs(a - b))
    return gap


def ks_shape(a: list[int], b: list[int]) -> float:
    """The KS distance between tau/mean(tau) of two samples: their shapes, whatever their means."""
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    p, q = histogram([t / ma for t in a]), histogram([t / mb for t in b])
    return ks(p, q)


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def autocorr(xs: list[float], lag: int = 1) -> float | None:
    if len(xs) <= lag + 1:
        return None
    mu = statistics.fmean(xs)
    var = sum((x - mu) ** 2 for x in xs)
    return sum((xs[i] - mu) * (xs[i + lag] - mu) for i in range(len(xs) - lag)) / var if var > 0 else None


def lockstep(workers: list[int], taus: list[int], M: int) -> dict:
    """How close the order of pushes is to round robin: the share of pushes by the worker that pushed M
    pushes earlier (1 under round robin; about 1/M for an order drawn at random), and of tau = M - 1."""
    n = len(workers)
    return {"cycle_repeat": sum(workers[i] == workers[i - M] for i in range(M, n)) / max(1, n - M),
            "tau_is_M_minus_1": sum(t == M - 1 for t in taus) / max(1, len(taus)),
            "tau_lag1_autocorr": autocorr([float(t) for t in taus])}


def describe_taus(taus: list[int]) -> dict:
    mean = statistics.fmean(taus)
    std = statistics.pstdev(taus)
    return {"pushes": len(taus), "mean": mean, "std": std, "cv": std / mean if mean > 0 else None,
            "p50": quantile(taus, 0.5), "p95": quantile(taus, 0.95), "p99": quantile(taus, 0.99), "max": max(taus)}


def gaps(workers: list[int], wall: list[float]) -> dict[int, list[float]]:
    """Each worker's seconds between two of its pushes: the duration of one message (pull, compute, push)."""
    last, out = {}, {}
    for w, t in zip(workers, wall):
        if w in last:
            out.setdefault(w, []).append(t - last[w])
        last[w] = t
    return out


def describe_gaps(per_worker: dict[int, list[float]]) -> dict:
    pooled = [g for gs in per_worker.values() for g in gs]
    mean = statistics.fmean(pooled)
    means = {w: statistics.fmean(gs) for w, gs in per_worker.items() if gs}
    within = [g / means[w] for w, gs in per_worker.items() for g in gs if means[w] > 0]
    cv = statistics.pstdev(pooled) / mean
    cv_within = statistics.pstdev(within)
    spread = [means[w] / mean for w in sorted(means)]
    return {"mean_ms": 1000 * mean, "cv": cv, "cv_within_worker": cv_within,
            "gamma_shape_moments": 1 / cv_within ** 2 if cv_within > 0 else None,
            "worker_mean_over_overall": spread, "slowest_over_fastest": max(spread) / min(spread),
            "lag1_autocorr_median": statistics.median(
                [a for a in (autocorr(gs) for gs in per_worker.values()) if a is not None] or [float("nan")]),
            "p99_over_median": quantile(pooled, 0.99) / quantile(pooled, 0.5)}


def analyse() -> dict:
    out = {"machine": machine(), "models": list(MODELS), "fit_shapes": list(FIT_SHAPES), "sim_pushes": SIM_PUSHES,
           "traces": {}}
    for path in sorted(TRACES.glob("*.csv")):
        name = path.stem
        meta = json.loads(path.with_suffix(".json").read_text())
        M = RUNS[name][0] if name in RUNS else max(read(path)[0]) + 1
        workers, taus, wall = read(path)
        warm = 2 * M
        trace_h = histogram(taus[warm:])
        entry = {"workers": M, **meta, "tau": describe_taus(taus[warm:]), "lockstep": lockstep(workers, taus[warm:], M),
                 "gaps": describe_gaps(gaps(workers, wall)),
                 "pushes_per_worker": [workers.count(m) for m in range(M)], "histogram": trace_h, "models": {}}
        specs = list(MODELS) + [f"gamma:{k:g}" for k in FIT_SHAPES if f"gamma:{k:g}" not in MODELS]
        for spec in specs:
            w, t = simulate(spec, M)
            h = histogram(t[warm:])
            entry["models"][spec] = {"tv": tv(trace_h, h), "ks": ks(trace_h, h), "ks_shape": ks_shape(taus[warm:], t[warm:]),
                                     "tau": describe_taus(t[warm:]),
                                     "lockstep": lockstep(w[warm:], t[warm:], M), "histogram": h}
        named = {s: v["tv"] for s, v in entry["models"].items() if s in MODELS}
        shapes = {s: v["tv"] for s, v in entry["models"].items() if s.startswith("gamma:")}
        entry["best_named"] = min(named, key=named.get)
        entry["best_gamma"] = min(shapes, key=shapes.get)
        out["traces"][name] = entry
    # One model for all traces: the smallest mean TV over them (the default's criterion).
    specs = list(next(iter(out["traces"].values()))["models"]) if out["traces"] else []
    out["mean_tv"] = {s: statistics.fmean(e["models"][s]["tv"] for e in out["traces"].values()) for s in specs}
    out["mean_ks"] = {s: statistics.fmean(e["models"][s]["ks"] for e in out["traces"].values()) for s in specs}
    out["mean_ks_shape"] = {s: statistics.fmean(e["models"][s]["ks_shape"] for e in out["traces"].values())
                            for s in specs}
    plain = [e for n, e in out["traces"].items() if n in RUNS and RUNS[n][4] == "plain" and not RUNS[n][3]]
    out["mean_tv_plain"] = {s: statistics.fmean(e["models"][s]["tv"] for e in plain) for s in specs} if plain else {}
    out["best_overall"] = min(out["mean_tv"], key=out["mean_tv"].get) if specs else None
    return out


def machine() -> dict:
    m = common.machine()
    m["loadavg_at_analysis"] = m.pop("loadavg")
    return m


def figure(result: dict, path: Path = FIGURE, shown=("round-robin", "exponential", "gamma:2", "heterogeneous:sqrt")) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(result["traces"])
    cols = 4
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        e = result["traces"][name]
        M = e["workers"]
        top = max(2 * M, int(e["tau"]["p99"]) + 2)
        ks_ = list(range(top + 1))
        ax.bar(ks_, [e["histogram"].get(str(k), e["histogram"].get(k, 0.0)) for k in ks_], color="0.75",
               label=f"trace (mean {e['tau']['mean']:.2f})")
        for spec in dict.fromkeys([*shown, e["best_gamma"]]):
            m = e["models"][spec]
            h = m["histogram"]
            ax.plot(ks_, [h.get(str(k), h.get(k, 0.0)) for k in ks_], marker=".", lw=1,
                    label=f"{spec} (TV {m['tv']:.2f})")
        ax.set_title(f"{name} (M = {M}), load {e['loadavg_after'][0]:.1f}", fontsize=9)
        ax.set_xlabel("tau")
        ax.set_ylim(0, 0.6)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "record":
        record(sys.argv[2:] or list(RUNS))
    elif len(sys.argv) > 1 and sys.argv[1] == "analyse":
        result = analyse()
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "delay_traces.json").write_text(json.dumps(result, indent=1) + "\n")
        figure(json.loads((RESULTS / "delay_traces.json").read_text()))
        print(f"{'trace':20} {'M':>3} {'tau mean':>8} {'cv':>5} {'p99':>4} {'max':>4} {'cycle':>5} "
              f"{'gap cv':>6} {'shape':>5} {'best':>20} {'best gamma':>10}  TV: " + " ".join(MODELS))
        for name, e in result["traces"].items():
            t, g = e["tau"], e["gaps"]
            print(f"{name:20} {e['workers']:3} {t['mean']:8.2f} {t['cv']:5.2f} {t['p99']:4} {t['max']:4} "
                  f"{e['lockstep']['cycle_repeat']:5.2f} {g['cv_within_worker']:6.2f} "
                  f"{g['gamma_shape_moments']:5.2f} {e['best_named']:>20} {e['best_gamma']:>10}  "
                  + " ".join(f"{e['models'][s]['tv']:.2f}" for s in MODELS))
        print("mean TV over traces:", {s: round(v, 3) for s, v in sorted(result["mean_tv"].items(), key=lambda kv: kv[1])})
        for key in ("mean_ks", "mean_ks_shape", "mean_tv_plain"):
            print(key, {s: round(v, 3) for s, v in sorted(result[key].items(), key=lambda kv: kv[1])})
        print("best overall (mean TV):", result["best_overall"])
    else:
        sys.exit(__doc__)
