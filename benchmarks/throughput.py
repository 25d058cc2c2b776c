"""The cost model of the report's modelled time (``stalegrad report --time-model``), measured on the local
runtime: seconds of one local step and seconds of one commit's communication, per commit rule.

    .venv/bin/python benchmarks/throughput.py                       # ~3-4 min on the 2-core VM
    .venv/bin/python benchmarks/throughput.py --rounds 1 --commits 15 --algos agn,aeasgd   # a quick look

For each commit rule (agn, aeasgd, dynsgd, downpour, async-local-sgd, diloco) and window W in (10, 40)
it trains the small ``mlp`` on MNIST (``--data-dir``, default /work/shared/data; Fashion-MNIST when MNIST
is not there) with ``sg.LocalRuntime`` (real worker processes, weights through shared memory), M = 2
workers of one thread each, batch 128, each rule's default local optimizer settings (Adam, lr 0.001),
no evaluation during the run, for about ``--commits`` commits per worker. From the messages' wall times
(messages.jsonl's ``wall_s``), after the first 2M messages (the workers starting), it takes the
seconds per commit of one worker ``t(W) = M x (t_last - t_first) / (messages - 1)``, the median over
``--rounds`` interleaved rounds (every rule and window once per round). Then, per rule, the model
``t(W) = commit_s + step_s x W`` with

    commit_s = mean pull latency + mean push latency, as the workers see them (request until the weights
               are in the worker's buffer; copy into the push buffer until the server applied it: the
               server's handling and its queue included), the median over the runs of the rule;
    step_s   = sum_W W (t(W) - commit_s) / sum_W W^2 (least squares through the two windows),

a worker's compute per local step (forward, backward, the local optimizer; the rule's own per-commit
arithmetic, a few vector operations, is folded into it) and its communication per commit. The
communication of the small mlp (1 MB a way) is a few ms against tens of ms of compute per commit, so the
straight line through t(10) and t(40) alone (kept in the JSON as ``line``) would estimate commit_s
from noise; the latencies measure it directly.

Writes benchmarks/results/throughput.json (the file ``--time-model`` reads, with the command, the CPU
model, the load before and after) and throughput.md. On a shared machine the figures depend on the
load: every run's load average is recorded beside it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import common  # stalegrad, then torch

import stalegrad as sg
from stalegrad.algorithms import ALGORITHMS
from stalegrad.runtimes import LocalRuntime
from stalegrad.study.report_time import FORMAT

BATCH = 128
WINDOWS = (10, 40)
ALGOS = ("agn", "aeasgd", "dynsgd", "downpour", "async-local-sgd", "diloco")


def load_data(data_dir: str):
    try:
        train, test = sg.load_pair("mnist", data_dir)
        name = f"mnist ({data_dir})"
    except Exception:   # noqa: BLE001  a machine without MNIST: Fashion-MNIST, installed with the package
        train, test = sg.load_pair("fashion-mnist", common.FASHION if common.FASHION.is_dir() else None)
        name = "fashion-mnist"
    return (*common.for_local_runs(train, test, 500), name)


def seconds_per_commit(messages: list[dict], workers: int) -> tuple[float, int]:
    """One worker's seconds per commit in steady state (after the first 2M messages), and the messages used."""
    times = [m["wall_s"] for m in messages][2 * workers:]
    if len(times) < 2:
        raise SystemExit("throughput.py: too few messages to measure; raise --commits")
    return workers * (times[-1] - times[0]) / (len(times) - 1), len(times)


def measure(algo: str, window: int, train, test, workers: int, commits: int) -> dict:
    rt = LocalRuntime(threads_per_worker=1)
    samples = workers * commits * window * BATCH
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    res = sg.train("mlp", train, test, ALGORITHMS[algo](window=window), workers, rt, epochs=samples / len(train.y),
                   batch_size=BATCH, eval_every=1e6, seed=0, lr=0.001)
    t, used = seconds_per_commit(res.messages, workers)
    tr, st = rt.stats["transport"], rt.stats
    return {"algo": algo, "window": window, "seconds_per_commit": t, "messages_used": used,
            "pull_s_mean": statistics.fmean(st["pull_s"]) if st["pull_s"] else None,
            "push_s_mean": statistics.fmean(st["push_s"]) if st["push_s"] else None,
            "run_s": time.perf_counter() - t0, "pull_ms_median": tr["pull_ms_median"],
            "push_ms_median": tr["push_ms_median"], "server_pull_ms_median": rt.stats["server_pull_ms_median"],
            "server_push_ms_median": rt.stats["server_push_ms_median"],
            "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def fit(t: dict, commit: float) -> dict:
    """step_s by least squares through the windows, given commit_s; the plain straight line beside."""
    step = sum(w * (t[w] - commit) for w in WINDOWS) / sum(w * w for w in WINDOWS)
    line_step = (t[WINDOWS[1]] - t[WINDOWS[0]]) / (WINDOWS[1] - WINDOWS[0])
    return {"step_s": step, "commit_s": commit,
            "line": {"step_s": line_step, "commit_s": t[WINDOWS[0]] - WINDOWS[0] * line_step}}


def markdown(out: dict) -> str:
    p = out["provenance"]
    lines = ["## Cost model of the modelled time (`benchmarks/throughput.py`)", "",
             f"Command: `{p['command']}` ({p['date']}, {p['total_s']:.0f} s). Machine: {p['machine']}; "
             f"{p['data']}; M = {p['workers']} worker processes of one thread each, batch {BATCH}, the mlp, "
             f"{p['rounds']} round(s), median. Load: before `{p['uptime_before']}`, after `{p['uptime_after']}`.",
             "", "t(W): one worker's seconds per commit at window W; step_s and commit_s from t(W) = commit_s + "
             "step_s x W; commit_s: the workers' mean pull + push latency (median over the rule's runs); "
             "step_s: least squares through both windows given commit_s.", "",
             "| rule | t(10) s | t(40) s | step_s | commit_s (pull + push) | t(10) model | t(40) model | "
             "straight line: step_s, commit_s |", "|---|---|---|---|---|---|---|---|"]
    for algo, e in out["algorithms"].items():
        m = out["measured"][algo]
        lines.append(f"| {algo} | {m['10']['seconds_per_commit']:.4f} | {m['40']['seconds_per_commit']:.4f} | "
                     f"{e['step_s']:.5f} | {e['commit_s']:.5f} | {e['commit_s'] + 10 * e['step_s']:.4f} | "
                     f"{e['commit_s'] + 40 * e['step_s']:.4f} | {e['line']['step_s']:.5f}, {e['line']['commit_s']:.5f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algos", default=",".join(ALGOS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--commits", type=int, default=20, help="commits per worker in each run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data-dir", default="/work/shared/data")
    ap.add_argument("--out", default=str(common.RESULTS))
    args = ap.parse_args()
    algos = [a for a in args.algos.split(",") if a]
    t_start, before = time.perf_counter(), common.uptime()
    train, test, data = load_data(args.data_dir)
    runs = []
    for r in range(args.rounds):
        for algo in algos:
            for w in WINDOWS:
                x = measure(algo, w, train, test, args.workers, args.commits)
                runs.append({**x, "round": r})
                print(f"round {r} {algo:16} W={w:<3} {x['seconds_per_commit']:.4f} s/commit  "
                      f"pull {x['pull_ms_median']} ms push {x['push_ms_median']} ms  load {x['loadavg_1m']}  "
                      f"({x['run_s']:.1f} s)", flush=True)
    measured, entries = {}, {}
    for algo in algos:
        measured[algo] = {}
        for w in WINDOWS:
            xs = [x for x in runs if x["algo"] == algo and x["window"] == w]
            med = statistics.median(x["seconds_per_commit"] for x in xs)
            measured[algo][str(w)] = {"seconds_per_commit": med, "rounds": [x["seconds_per_commit"] for x in xs],
                                      **{k: statistics.median(x[k] for x in xs) if all(x[k] is not None for x in xs)
                                         else None for k in ("pull_ms_median", "push_ms_median", "pull_s_mean",
                                                             "push_s_mean", "server_pull_ms_median",
                                                             "server_push_ms_median")}}
        commit = statistics.median(x["pull_s_mean"] + x["push_s_mean"] for x in runs if x["algo"] == algo)
        entries[algo] = fit({w: measured[algo][str(w)]["seconds_per_commit"] for w in WINDOWS}, commit)
    out = {"format": FORMAT,
           "provenance": {"command": common.command(python=".venv/bin/python"),
                          "machine": f"{os.cpu_count()} cores, {common.cpu_model()}",
                          "date": time.strftime("%Y-%m-%d %H:%M"),
                          "load": f"before: {before}; after: {common.uptime()}", "uptime_before": before,
                          "uptime_after": common.uptime(), "data": data, "workers": args.workers, "threads_per_worker": 1,
                          "rounds": args.rounds, "commits_per_worker": args.commits, "batch_size": BATCH,
                          "model": "mlp", "runtime": "local", "total_s": time.perf_counter() - t_start},
           "algorithms": entries, "measured": measured, "runs": runs}
    dest = Path(args.out)
    common.write_json("throughput", out, dest)
    common.save(dest / "throughput.md", markdown(out))
    print(markdown(out))
    print(f"wrote {dest / 'throughput.json'} and {dest / 'throughput.md'}")


if __name__ == "__main__":
    main()
