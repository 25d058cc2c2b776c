"""Shared helpers of the benchmarks: machine description, timing, tables, JSON.

The machine these run on is shared and noisy, so every figure that matters is
a ratio of two things timed in the same run, interleaved: each *round* times
every item once (best of a few calls), and the reported value is the median
over the rounds.

``clock()`` is wall time by default. ``use_cpu_clock()`` switches every
timing to the CPU time of this process (``time.process_time``): with one
thread (``--threads 1``) that is the work done, without the time other
processes on a busy machine take from it (with more threads it also counts
the OpenMP threads' spinning, so it is not used then).
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:        # run from a checkout, without installing
    sys.path.insert(0, str(ROOT))

import stalegrad  # noqa: E402,F401  before torch: its OMP_WAIT_POLICY default must reach libgomp
import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "clock": clock_name(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


_CLOCK = time.perf_counter


def clock() -> float:
    return _CLOCK()


def use_cpu_clock() -> None:
    global _CLOCK
    _CLOCK = time.process_time


def clock_name() -> str:
    return "cpu" if _CLOCK is time.process_time else "wall"


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def best_of(fn: Callable[[], object], calls: int) -> float:
    """Seconds of the fastest of ``calls`` calls of ``fn``."""
    best = float("inf")
    for _ in range(calls):
        t = clock()
        fn()
        best = min(best, clock() - t)
    return best


def interleaved(items: dict[str, Callable[[], object]], rounds: int, calls: int) -> dict[str, list[float]]:
    """Time every item once per round (best of ``calls``), rounds interleaved."""
    times: dict[str, list[float]] = {k: [] for k in items}
    for _ in range(rounds):
        for name, fn in items.items():
            times[name].append(best_of(fn, calls))
    return times


def median(xs) -> float:
    return statistics.median(xs)


def median_ratio(num: list[float], den: list[float]) -> float:
    """Median over rounds of num/den, each pair timed in the same round."""
    return statistics.median(a / b for a, b in zip(num, den))


def table(columns: list[str], rows: list[list]) -> str:
    """A GitHub-flavoured Markdown table (it also reads well in a terminal)."""
    cells = [[str(c) for c in columns]] + [[str(c) for c in r] for r in rows]
    width = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    fmt = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, width)) + " |"
    lines = [fmt(cells[0]), "|" + "|".join("-" * (w + 2) for w in width) + "|"]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "yes" if ok else "NO"


def write_json(name: str, payload: dict, out_dir: Path = RESULTS) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
