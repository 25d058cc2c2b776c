"""Run every benchmark, print its table, write its JSON into benchmarks/results/.

    .venv/bin/python benchmarks/run_all.py            # everything, a few minutes
    .venv/bin/python benchmarks/run_all.py --quick    # a short smoke run
    .venv/bin/python benchmarks/run_all.py --only server_apply,compute --threads 1

Sections: server_apply (1), sim_overhead (2), vectorised (3), compute (4), commit_rules (5); see
each module's docstring and docs/performance.md. Every figure with a target is
a ratio of two things timed in the same run; the machine (cores, CPU, torch,
threads) and the load average before and after each section go into the JSON.
These are not tests: nothing here runs under pytest.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("KINETO_LOG_LEVEL", "5")   # keep torch.profiler quiet (compute section)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import torch  # noqa: E402

SECTIONS = ("server_apply", "sim_overhead", "vectorised", "compute", "commit_rules")
TITLES = {
    "server_apply": "1. Server apply: time per update through ParameterServer.push, against a memory copy",
    "sim_overhead": "2. Simulator overhead: the simulator's samples/s against a plain PyTorch loop",
    "vectorised": "3. Vectorised simulation: Simulator(vectorised=True) against one worker at a time",
    "compute": "4. Compute efficiency: one agn-mlp training step against float32 matmul peak",
    "commit_rules": "5. Commit rules: vectorised windows, agn-mlp at M = 40 against plain PyTorch, memory against M",
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short smoke run (seconds, not minutes)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections: " + ", ".join(SECTIONS))
    ap.add_argument("--threads", type=int, default=None, help="torch threads [default: torch's, one per core]")
    ap.add_argument("--out", default=str(common.RESULTS), help="directory for the JSON files")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall time, or this process's CPU time (steadier on a busy machine; needs --threads 1)")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu":
        if torch.get_num_threads() != 1:
            ap.error("--clock cpu needs --threads 1 (more threads spin, and CPU time counts the spinning)")
        common.use_cpu_clock()
    machine = common.machine()
    print(f"machine: {machine['nproc']} cores, {machine['cpu']}, torch {machine['torch']}, "
          f"{machine['threads']} threads, {machine['clock']} clock, load average {machine['loadavg']}"
          + ("  [--quick]" if args.quick else ""))
    summary = {"machine": machine, "quick": args.quick, "sections": {}}
    start = time.perf_counter()
    for name in only:
        module = __import__(name)
        load_before = common.load()
        t = time.perf_counter()
        result = module.run(quick=args.quick)
        result.update(machine=machine, quick=args.quick, seconds=round(time.perf_counter() - t, 1),
                      loadavg_before=load_before, loadavg_after=common.load())
        path = common.write_json(name + ("_quick" if args.quick else ""), result, out_dir=_out(args.out))
        print(f"\n## {TITLES[name]}\n")
        print(result["table"])
        targets = "; ".join(f"{k}: {common.verdict(v)}" for k, v in result["targets"].items())
        print(f"\ntargets: {targets}\nload average {result['loadavg_before']} -> {result['loadavg_after']}, "
              f"{result['seconds']} s -> {path}")
        summary["sections"][name] = {"targets": result["targets"], "seconds": result["seconds"],
                                     "loadavg": [result["loadavg_before"], result["loadavg_after"]]}
    summary["seconds"] = round(time.perf_counter() - start, 1)
    path = common.write_json("run_all" + ("_quick" if args.quick else ""), summary, out_dir=_out(args.out))
    print(f"\nall sections: {summary['seconds']} s -> {path}")
    return 0


def _out(path: str):
    from pathlib import Path
    return Path(path)


if __name__ == "__main__":
    sys.exit(main())
