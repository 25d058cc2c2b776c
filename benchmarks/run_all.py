"""The benchmark suite, ``make bench``: every script of SUITE in a fresh process, one after the other.

    .venv/bin/python benchmarks/run_all.py                        # make bench: each at --quick, about 10 min on 2 cores
    .venv/bin/python benchmarks/run_all.py --full                 # each at its full size: about an hour
    .venv/bin/python benchmarks/run_all.py --only server_apply,capacity

Each script prints its tables and writes ``benchmarks/results/<script>.json`` (the machine, the command, the
load average before and after, its tables and raw figures); a run of the whole suite writes
``results/run_all.json`` (each script's command, wall time, exit code and load average, and the whole run's). ``make bench`` then runs
``benchmarks/page.py``, which writes the figures of docs/performance.md from those files. A script that fails
is reported and the others still run (exit code 1 at the end). Nothing here imports torch: the scripts do, each
in its own process, so that each starts as a user's run does.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

# (script, the question it answers, the options make bench gives it). The server's micro-benchmarks run on one
# thread and time this process's CPU: on a shared machine that is the figure least moved by other processes.
SUITE = [
    ("server_apply", "the time of one server update, per rule and kernel path, against a memory copy",
     ["--quick", "--threads", "1", "--clock", "cpu"]),
    ("capacity", "how many workers one server shard keeps up with, per model and rule",
     ["--quick", "--threads", "1", "--clock", "cpu"]),
    ("sim_vs_plain", "the simulator's samples/s against a plain PyTorch loop, M = 1 to 40",
     ["--quick", "--threads", "1", "--clock", "cpu"]),
    ("vectorised", "what Simulator(vectorised=True) gains, per model", ["--quick", "--threads", "1", "--clock", "cpu"]),
    ("bench_local", "--runtime local against a plain loop in one process, M = 1 to 4", ["--quick"]),
    ("ray_overhead", "--runtime ray against --runtime local, and Ray's transport alone", ["--quick"]),
    ("time_to_accuracy", "wall seconds to a test accuracy, against a plain Adam loop", ["--quick"]),
    ("gpu", "the simulator and the vectorised rules on a CUDA device (one line and nothing else without one)", []),
]
NAMES = [name for name, _, _ in SUITE]


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=ROOT, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_one(name: str, options: list[str]) -> dict:
    """Run one script in a fresh process, its output shown as it comes; its wall time, exit code and load."""
    command = ["python", f"benchmarks/{name}.py", *options]
    print(f"\n## {name}: {' '.join(command)}\n", flush=True)
    before, start, wall = load(), time.time(), time.perf_counter()
    code = subprocess.run([sys.executable, str(HERE / f"{name}.py"), *options], cwd=ROOT).returncode
    result = RESULTS / f"{name}.json"
    return {"benchmark": name, "command": " ".join(command), "seconds": round(time.perf_counter() - wall, 1),
            "returncode": code, "load_before": before, "load_after": load(),
            "wrote": result.exists() and result.stat().st_mtime >= start}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(NAMES), help="comma-separated scripts: " + ", ".join(NAMES))
    ap.add_argument("--full", action="store_true", help="every script at its full size, not --quick's")
    args = ap.parse_args(argv)
    only = [name for name in NAMES if name in {s.strip() for s in args.only.split(",")}]
    unknown = [s.strip() for s in args.only.split(",") if s.strip() and s.strip() not in NAMES]
    if unknown:
        ap.error(f"unknown script {unknown[0]!r}; choose from {', '.join(NAMES)}")
    started, before, wall = time.strftime("%Y-%m-%d %H:%M"), load(), time.perf_counter()
    print(f"benchmark suite: {len(only)} scripts, load average {before}" + (" [--full]" if args.full else ""))
    runs = []
    for name, _, options in SUITE:
        if name in only:
            runs.append(run_one(name, [o for o in options if o != "--quick"] if args.full else options))
    summary = {"command": "python benchmarks/run_all.py" + "".join(f" {a}" for a in (argv or sys.argv[1:])),
               "started": started, "commit": git_commit(), "full": args.full,
               "seconds": round(time.perf_counter() - wall, 1), "load_before": before, "load_after": load(),
               "scripts": runs}
    written = "not written (--only)"
    if only == NAMES:   # run_all.json is the whole suite's run; a part of it does not replace it
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "run_all.json").write_text(json.dumps(summary, indent=2) + "\n")
        written = str(RESULTS / "run_all.json")
    failed = [r["benchmark"] for r in runs if r["returncode"] != 0]
    print(f"\nsuite: {summary['seconds']:.0f} s, load average {before} -> {summary['load_after']}"
          + (f"; FAILED: {', '.join(failed)}" if failed else "") + f" -> {written}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
