"""Run every benchmark, print its table, write its JSON into benchmarks/results/.

    .venv/bin/python benchmarks/run_all.py            # everything, ~45 minutes
    .venv/bin/python benchmarks/run_all.py --quick    # a short smoke run
    .venv/bin/python benchmarks/run_all.py --only server_apply,compute --threads 1
    .venv/bin/python benchmarks/run_all.py --only server_apply --rules async-local-sgd   # and asgd

Sections, by the part of issue 11 they answer (issue 4's first four are the
same scripts): server_apply (1: server rules against copy bandwidth),
vectorised (2: batched simulation), sim_overhead (3: the simulator against a
plain loop, M up to 40), stalls (4: diverging runs timed per 1/16 epoch),
time_to_accuracy (5: wall time to a test accuracy against plain Adam),
commit_rules (2 and 3: commit rules' windows vectorised, agn-mlp at M = 40
against plain loops, memory against M), compute (issue 4: a step against
matmul peak), and capacity (1: updates/s of one server shard and the workers it
serves, against each model's step). A section whose script is not
in this tree is skipped, and the run says so; a section that fails is
reported and the others still run (exit code 1 at the end). See each module's
docstring and docs/performance.md. Every figure with a target is a ratio of
two things timed in the same run; the machine (cores, CPU, torch, threads)
and the load average before and after each section go into the JSON. stalls
and time_to_accuracy always use wall time (waiting is what they measure).
These are not tests: nothing here runs under pytest. The GPU script is
``benchmarks/gpu.py`` (not part of this run).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "5")   # keep torch.profiler quiet (compute section)

import common  # noqa: E402  (imports stalegrad, then torch)

HERE = Path(__file__).resolve().parent
SECTIONS = ("server_apply", "vectorised", "sim_overhead", "stalls", "time_to_accuracy", "compute", "capacity",
            "commit_rules")
TITLES = {
    "server_apply": "1. Server apply: time per update through ParameterServer.push, against a memory copy",
    "vectorised": "2. Vectorised simulation: Simulator(vectorised=True) against one worker at a time",
    "sim_overhead": "3. Simulator overhead: the simulator's samples/s against a plain PyTorch loop",
    "stalls": "4. Stalls: diverging runs per 1/16 epoch, OpenMP wait policy and denormals",
    "time_to_accuracy": "5. Time to accuracy: wall time to a test accuracy against a plain Adam loop",
    "compute": "Compute efficiency (issue 4): one agn-mlp training step against float32 matmul peak",
    "capacity": "1b. Capacity of one server shard: updates/s, and workers served against a worker's step",
    "commit_rules": "2-3. Commit rules: vectorised windows, agn-mlp at M = 40 against plain PyTorch, memory against M",
}


def main(argv=None) -> int:
    ap = common.options(__doc__)
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections: " + ", ".join(SECTIONS))
    ap.add_argument("--out", default=str(common.RESULTS), help="directory for the JSON files")
    ap.add_argument("--rules", default=None, help="server_apply only: comma-separated rules to time (asgd, the "
                    "reference of 'time vs asgd', always) [default: every rule]")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    common.settle(ap, args)
    machine = common.machine()
    print(f"machine: {machine['nproc']} cores, {machine['cpu']}, torch {machine['torch']}, "
          f"{machine['threads']} threads, {machine['clock']} clock, load average {machine['loadavg']}"
          + ("  [--quick]" if args.quick else ""))
    summary = {"machine": machine, "quick": args.quick, "sections": {}}
    start = time.perf_counter()
    failed = []
    for name in only:
        if not (HERE / f"{name}.py").exists():
            print(f"\n## {TITLES[name]}\n\nskipped: benchmarks/{name}.py is not in this tree")
            summary["sections"][name] = {"skipped": f"benchmarks/{name}.py is not in this tree"}
            continue
        load_before = common.load()
        t = time.perf_counter()
        try:
            extra = {"rules": args.rules.split(",")} if args.rules and name == "server_apply" else {}
            result = __import__(name).run(quick=args.quick, **extra)
        except Exception as e:   # one broken section must not cost the others' figures
            print(f"\n## {TITLES[name]}\n\nFAILED: {type(e).__name__}: {e}")
            summary["sections"][name] = {"failed": f"{type(e).__name__}: {e}"}
            failed.append(name)
            continue
        result.update(machine=machine, quick=args.quick, seconds=round(time.perf_counter() - t, 1),
                      loadavg_before=load_before, loadavg_after=common.load())
        path = common.write_json(name + ("_quick" if args.quick else ""), result, out_dir=Path(args.out))
        print(f"\n## {TITLES[name]}\n")
        print(result["table"])
        targets = "; ".join(f"{k}: {common.verdict(v)}" for k, v in result["targets"].items())
        print(f"\ntargets: {targets}\nload average {result['loadavg_before']} -> {result['loadavg_after']}, "
              f"{result['seconds']} s -> {path}")
        summary["sections"][name] = {"targets": result["targets"], "seconds": result["seconds"],
                                     "loadavg": [result["loadavg_before"], result["loadavg_after"]]}
    summary["seconds"] = round(time.perf_counter() - start, 1)
    path = common.write_json("run_all" + ("_quick" if args.quick else ""), summary, out_dir=Path(args.out))
    print(f"\nall sections: {summary['seconds']} s -> {path}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
