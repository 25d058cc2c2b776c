"""Throughput of ``--runtime local`` against sequential SGD in one plain process.

    .venv/bin/python benchmarks/bench_local.py --quick    # make bench: agn-mlp, window 10, M = 1, 2, 4
    .venv/bin/python benchmarks/bench_local.py            # ~4 min on a quiet 2-core machine
                                                          # (+ up to --max-wait s when other jobs run)

For each configuration (model, AGN window, AGN's local optimizer: agn-mlp with
window 1 and 40, Adam, and window 40 with local SGD, whose steps are those of
the plain SGD loop; cnn with window 1, Adam) it measures, on the same
data, batch size and cores:

- the baseline: a plain PyTorch loop in this process (forward, backward,
  ``torch.optim.SGD`` step), with ``torch.set_num_threads(cores)``, measured
  right before and right after every local run: other jobs may share the
  machine, so each ratio is against the mean of the two measurements around
  it; and once per model the same loop with ``torch.optim.Adam``, the local
  optimizer AGN uses;
- ``--runtime local`` with M = 1, 2, 4, 8 worker processes
  (``threads_per_worker = max(1, cores // M)``): samples/s computed by the
  workers in steady state (from the runtime's count of local steps, from the
  moment every worker is up to the moment the sample budget is reached), pull
  and push latency seen by the workers (median, p90), and the bytes of
  weights moved per update.

Every rate is the best 2-second stretch of its measurement, which filters out
other jobs that come and go on a shared machine; whole-run means are kept in
the JSON. A monitor thread measures how many cores other processes use during
each measurement (the ``others`` column); the script waits for them to leave
before measuring, and measures again when they did not (``--max-wait`` seconds
in all). The ``transport`` column, the workers' share of time spent in pulls
and pushes, is the runtime's own cost and holds under contention.

Writes benchmarks/results/bench_local.json.
"""
from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

# torch before stalegrad, as this script has always run: the plain loops in this process are plain
# PyTorch, with torch's own OpenMP and MKL settings (the workers' processes import stalegrad first)
import torch
import torch.nn.functional as F

import common

import stalegrad as sg
from stalegrad.models import build_model
from stalegrad.runtimes import LocalRuntime

BATCH = 128
WINDOW = 2.0   # seconds: rates are the best such stretch (other jobs on the machine come and go)
FLOOR_RATE = 2000.0   # samples/s assumed at least when sizing a local run
# (model, AGN window, AGN's local optimizer): Adam is AGN's default; with local SGD a worker's step is
# the plain SGD loop's step, so the ratio to plain SGD is the runtime's own cost.
# cnn has 0.4M parameters: its transport is cheap even at window 1, so one window shows it.
CONFIGS = [("agn-mlp", 1, "adam"), ("agn-mlp", 40, "adam"), ("agn-mlp", 40, "sgd"), ("cnn", 1, "adam")]
QUICK_CONFIGS = [("agn-mlp", 10, "adam")]


cores = common.cores


class CpuMonitor:
    """How many cores *other* processes use: all busy CPU time (/proc/stat) minus that of this
    process and its descendants (the workers, the evaluator, the fork server), sampled every 0.5 s."""

    def __init__(self):
        self.tick = os.sysconf("SC_CLK_TCK")
        self.samples: list[tuple[float, float]] = []   # (time, other processes' cores over the last interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _busy() -> int:
        f = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)   # user nice system irq softirq steal

    @staticmethod
    def _ours() -> dict[int, int]:
        procs = common.processes()
        return {pid: procs[pid][2] if pid in procs else 0 for pid in common.descendants(os.getpid(), procs)}

    def _loop(self) -> None:
        t0, busy0, ours0 = time.perf_counter(), self._busy(), self._ours()
        while not self._stop.wait(0.5):
            t1, busy1, ours1 = time.perf_counter(), self._busy(), self._ours()
            ours = sum(v - ours0.get(pid, 0) for pid, v in ours1.items())
            self.samples.append((t1, max(0.0, (busy1 - busy0 - ours) / self.tick / (t1 - t0))))
            t0, busy0, ours0 = t1, busy1, ours1

    def start(self) -> "CpuMonitor":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def others(self, t0: float, t1: float) -> float | None:
        """Mean cores used by other processes between t0 and t1 (perf_counter)."""
        vals = [c for t, c in self.samples if t0 < t <= t1 + 0.5]
        return sum(vals) / len(vals) if vals else None

    def wait_quiet(self, budget: list[float], limit: float = 0.3, longest: float = 10.0) -> float:
        """Wait (at most ``longest`` s, and while ``budget[0]`` lasts) until other processes use
        under ``limit`` cores for a second; returns the seconds waited."""
        t0 = time.perf_counter()
        while True:
            time.sleep(1.0)
            now = time.perf_counter()
            recent = self.others(now - 1.0, now)
            waited = now - t0
            if (recent is not None and recent < limit) or waited >= longest or waited >= budget[0]:
                budget[0] -= waited
                return waited


def load_data():
    train, test, source = common.image_data(60_000, 1000)
    return (*common.for_local_runs(train, test, 1000), source)


def best_window(points: list[tuple[float, float]], window: float) -> float:
    """The highest rate over any stretch of at least ``window`` seconds of (time, count) points."""
    best = 0.0
    j = 0
    for i, (t0, c0) in enumerate(points):
        j = max(j, i + 1)
        while j < len(points) and points[j][0] - t0 < window:
            j += 1
        if j == len(points):
            break
        t1, c1 = points[j]
        best = max(best, (c1 - c0) / (t1 - t0))
    if best == 0.0 and len(points) >= 2:   # shorter than one window: the whole of it
        (t0, c0), (t1, c1) = points[0], points[-1]
        best = (c1 - c0) / max(t1 - t0, 1e-9)
    return best


def plain_loop(model_name: str, opt: str, data, seconds: float) -> dict:
    """Samples/s of a plain training loop in this process on all cores: mean and best window."""
    torch.set_num_threads(cores())
    torch.manual_seed(0)
    model = build_model(model_name, tuple(data.x.shape[1:]), 10)
    optim = (torch.optim.SGD(model.parameters(), lr=0.01) if opt == "sgd"
             else torch.optim.Adam(model.parameters(), lr=0.001))
    g = torch.Generator().manual_seed(0)
    n = len(data.y)

    def step():
        idx = torch.randint(0, n, (BATCH,), generator=g)
        optim.zero_grad(set_to_none=False)
        F.cross_entropy(model(data.x[idx]), data.y[idx]).backward()
        optim.step()

    for _ in range(3):
        step()
    t0 = time.perf_counter()
    points = [(t0, 0)]
    while points[-1][0] - t0 < seconds:
        step()
        points.append((time.perf_counter(), points[-1][1] + BATCH))
    return {"mean": points[-1][1] / (points[-1][0] - t0), "best": best_window(points, WINDOW)}


def steady_rate(stats: dict, batch: int) -> tuple[float, float, float]:
    """Samples/s computed by the workers from 'all up' (+0.5 s) to the end of the budget:
    (mean, best window, seconds measured)."""
    timeline = [(t, s * batch) for t, s in stats["timeline"]]
    start = max(stats["ready_at"].values()) + 0.5
    after = [(t, s) for t, s in timeline if t >= start]
    if len(after) < 2:
        after = timeline[-2:]   # a very short run: take what there is
    (t0, s0), (t1, s1) = after[0], after[-1]
    return (s1 - s0) / max(t1 - t0, 1e-9), best_window(after, WINDOW), t1 - t0


def local_run(model_name: str, window: int, opt: str, workers: int, train, test, rate_guess: float,
              seconds: float) -> dict:
    # Enough samples for ~`seconds` of training at the fastest rate seen (at least FLOOR_RATE,
    # so that a slowed-down baseline does not make the run too short to measure), and for most
    # workers to push (a window-40 message of batch 128 is 5120 samples).
    budget = max(max(rate_guess, FLOOR_RATE) * seconds, 0.6 * workers * window * BATCH)
    rt = LocalRuntime()
    t0 = time.perf_counter()
    res = sg.train(model_name, train, test, sg.AGN(window=window, local_opt=opt), workers, rt,
                   epochs=budget / len(train.y), lr=0.001 if opt == "adam" else 0.01,
                   batch_size=BATCH, eval_every=1e6, seed=0)
    total = time.perf_counter() - t0
    mean, rate, span = steady_rate(rt.stats, BATCH)
    tr = rt.stats["transport"]
    st = rt.stats
    # the workers' time spent pulling and pushing (each keeps its last 4096 latencies of each kind)
    span_all = max(st["timeline"][-1][0] - min(st["ready_at"].values()), 1e-9)
    transport_share = (sum(st["pull_s"]) + sum(st["push_s"])) / (workers * span_all)
    return {"transport_share": transport_share,"workers": workers, "threads_per_worker": st["threads_per_worker"], "samples_per_s": rate,
            "samples_per_s_mean": mean,
            "server_pull_ms_median": st["server_pull_ms_median"], "server_push_ms_median": st["server_push_ms_median"],
            "server_busy_fraction": st["server_busy_s"] / max(total, 1e-9),
            "measured_s": span, "run_s": total, "updates": res.summary["updates"],
            "tau_mean": res.summary["tau_mean"], "pull_ms_median": tr["pull_ms_median"],
            "pull_ms_p90": tr["pull_ms_p90"], "push_ms_median": tr["push_ms_median"],
            "push_ms_p90": tr["push_ms_p90"], "bytes_per_update": tr["weight_bytes_per_message"],
            "pushes": sum(rt.stats["pushes"])}


def fmt(v, spec=".0f"):
    return "-" if v is None else format(v, spec)


def table(result: dict) -> dict:
    """The page's table: each configuration's plain loops, then its local runs."""
    cores_ = cores()
    cols = ["model", "window, local opt", "M", "threads/worker", "samples/s", "vs plain SGD", "vs plain Adam",
            "others (cores)", "transport", "pull ms (med / p90)", "push ms (med / p90)", "MB per update", "tau mean"]
    body = []
    for cfg in result["configs"]:
        sgd, adam = cfg["baseline_sgd"], cfg["baseline_adam"]
        head = [cfg["model"], f"{cfg['window']}, {cfg['local_opt']}"]
        body.append(head + ["plain SGD", cores_, f"{sgd['mean']:,.0f}", "1.00", f"{sgd['mean'] / adam['best']:.2f}",
                            fmt(sgd["others_mean"], ".2f"), "", "", "", "", ""])
        body.append(head + ["plain Adam", cores_, f"{adam['best']:,.0f}", f"{adam['best'] / sgd['mean']:.2f}", "1.00",
                            fmt(adam["others"], ".2f"), "", "", "", "", ""])
        for r in cfg["local"]:
            body.append(head + [r["workers"], r["threads_per_worker"], f"{r['samples_per_s']:,.0f}", f"{r['vs_sgd']:.2f}",
                                f"{r['vs_adam']:.2f}", fmt(r["others"], ".2f"), f"{100 * r['transport_share']:.1f}%",
                                f"{fmt(r['pull_ms_median'], '.2f')} / {fmt(r['pull_ms_p90'], '.2f')}",
                                f"{fmt(r['push_ms_median'], '.2f')} / {fmt(r['push_ms_p90'], '.2f')}",
                                f"{r['bytes_per_update'] / 1e6:.1f}", f"{r['tau_mean']:.2f}"])
    return common.page_table(f"AGN on --runtime local against plain loops in one process (batch {BATCH}; rates: "
                             f"the best {WINDOW:.0f}-second stretch)", cols, body)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the size `make bench` runs: one configuration, M = 1, "
                    "2, 4, 3-second runs, no waiting for a quiet machine")
    ap.add_argument("--seconds", type=float, default=None, help="target length of each local run [4; --quick 3]")
    ap.add_argument("--workers", default=None, help="comma-separated M [1,2,4,8; --quick 1,2,4]")
    ap.add_argument("--max-wait", type=float, default=None,
                    help="seconds, in all, to spend waiting for other jobs to leave the CPUs, or measuring "
                         "again when they did not [120; --quick 0]")
    args = ap.parse_args(argv)
    quick = args.quick
    args.seconds = args.seconds or (3.0 if quick else 4.0)
    args.max_wait = args.max_wait if args.max_wait is not None else (0.0 if quick else 120.0)
    workers = [int(v) for v in (args.workers or ("1,2,4" if quick else "1,2,4,8")).split(",")]
    bench = common.Benchmark("bench_local", quick)
    monitor = CpuMonitor().start()
    wait_budget = [args.max_wait]
    train, test, data_name = load_data()
    result = {"data": data_name, "batch_size": BATCH, "window_s": WINDOW, "max_wait_s": args.max_wait, "configs": []}
    print(f"{cores()} cores, {common.cpu_model()}, torch {torch.__version__}; data {data_name}; "
          f"load {bench.load_before[0]:.2f}", flush=True)
    print(f"{'model':8} {'win':>4} {'M':>10} {'thr':>3} {'samples/s':>9} {'vs sgd':>6} {'vs adam':>7} "
          f"{'others':>6} {'pull ms':>13} {'push ms':>13} {'MB/upd':>6}", flush=True)
    threads = torch.get_num_threads()
    base_s = WINDOW + 1.0
    adams: dict[str, dict] = {}
    all_plain: dict[str, list] = {}

    def measured(fn, *a, retries: int = 2):
        """Measure when the machine is quiet; measure again (keeping the least disturbed attempt)
        when other processes took 0.3 cores or more meanwhile, while the waiting budget lasts."""
        best = None
        for attempt in range(1, retries + 2):
            waited = monitor.wait_quiet(wait_budget)
            t0 = time.perf_counter()
            out = fn(*a)
            t1 = time.perf_counter()
            others = monitor.others(t0, t1)
            out.update(others=others, waited_s=waited, attempts=attempt, loadavg_1m=os.getloadavg()[0])
            if best is None or (others or 0.0) < (best["others"] or 0.0):
                best = out
            if (others or 0.0) < 0.3 or wait_budget[0] <= 0:
                break
            wait_budget[0] -= t1 - t0
        return best

    def plain(model_name, opt):
        out = measured(plain_loop, model_name, opt, train, base_s)
        torch.set_num_threads(threads)
        return out

    for model_name, window, opt in (QUICK_CONFIGS if quick else CONFIGS):
        if model_name not in adams:
            adams[model_name] = plain(model_name, "adam")
        adam = adams[model_name]
        plain_runs = [plain(model_name, "sgd")]
        runs = []
        for M in workers:
            fastest = max(p["best"] for p in plain_runs + all_plain.get(model_name, []))   # not a slowed-down one
            r = measured(local_run, model_name, window, opt, M, train, test, fastest, args.seconds)
            plain_runs.append(plain(model_name, "sgd"))
            around = [p["best"] for p in plain_runs[-2:]]
            r["sgd_around"] = around
            r["vs_sgd"] = r["samples_per_s"] / (sum(around) / 2)
            r["vs_adam"] = r["samples_per_s"] / adam["best"]
            r["vs_sgd_mean"] = r["samples_per_s_mean"] / (sum(p["mean"] for p in plain_runs[-2:]) / 2)
            runs.append(r)
        all_plain.setdefault(model_name, []).extend(plain_runs)
        bests = [p["best"] for p in plain_runs]
        others = [p["others"] for p in plain_runs if p["others"] is not None]
        base_sgd = {"measurements": bests, "mean": sum(bests) / len(bests), "plain_runs": plain_runs,
                    "others_mean": sum(others) / len(others) if others else None}
        print(f"{model_name:8} {window:>3}{opt[0]} {'plain sgd':>10} {cores():>3} {base_sgd['mean']:>9.0f} {1.0:>6.2f} "
              f"{base_sgd['mean'] / adam['best']:>7.2f} {fmt(base_sgd['others_mean'], '.2f'):>6}"
              f"   (each: {', '.join(f'{v:.0f}' for v in bests)})", flush=True)
        print(f"{model_name:8} {window:>3}{opt[0]} {'plain adam':>10} {cores():>3} {adam['best']:>9.0f} "
              f"{adam['best'] / base_sgd['mean']:>6.2f} {1.0:>7.2f} {fmt(adam['others'], '.2f'):>6}", flush=True)
        for r in runs:
            print(f"{model_name:8} {window:>3}{opt[0]} {r['workers']:>10} {r['threads_per_worker']:>3} "
                  f"{r['samples_per_s']:>9.0f} {r['vs_sgd']:>6.2f} {r['vs_adam']:>7.2f} {fmt(r['others'], '.2f'):>6} "
                  f"{fmt(r['pull_ms_median'], '.2f'):>6}/{fmt(r['pull_ms_p90'], '.2f'):>6} "
                  f"{fmt(r['push_ms_median'], '.2f'):>6}/{fmt(r['push_ms_p90'], '.2f'):>6} "
                  f"{r['bytes_per_update'] / 1e6:>6.1f} transport {100 * r['transport_share']:4.1f}%"
                  f"   server {fmt(r['server_pull_ms_median'], '.1f')}/{fmt(r['server_push_ms_median'], '.1f')} ms, "
                  f"busy {100 * r['server_busy_fraction']:.0f}%", flush=True)
        result["configs"].append({"model": model_name, "window": window, "local_opt": opt, "baseline_sgd": base_sgd,
                                  "baseline_adam": adam, "local": runs})
    monitor.stop()
    bench.finish([table(result)], result,
                 notes=[f"data: {data_name}; others: the cores other processes used during the measurement"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
