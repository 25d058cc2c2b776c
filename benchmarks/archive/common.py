"""What the archived benchmarks share: the helpers of benchmarks/common.py as they were when these scripts
were archived (the machine and its load, clocks and interleaved timing, the standard data and timed simulators,
peak memory, the options of the old run_all's sections, tables and result files). The archived scripts write
into archive/results/.

Import it first: it puts the checkout on sys.path and imports stalegrad before torch (stalegrad's
OMP_WAIT_POLICY default must reach libgomp), so every benchmark runs as a user's run does. The scripts
reach stalegrad only through its public names (tests/test_scripts.py checks it).

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

import argparse
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:        # run from a checkout, without installing
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import stalegrad as sg  # noqa: E402  before torch: its OMP_WAIT_POLICY default must reach libgomp
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from stalegrad import numerics  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FASHION = Path("/usr/share/datasets/fashion-mnist")


# ---- the machine and its load ------------------------------------------------------------------------

def cpu_model() -> str:
    return numerics.cpu()["cpu_model"] or "unknown"


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def machine() -> dict:
    return {
        "nproc": os.cpu_count(),
        "cores": cores(),
        "cpu": cpu_model(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": load(),
        "clock": clock_name(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def uptime() -> str:
    """``uptime``'s line (the load beside every figure), or the load averages where it is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def command(argv: list[str] | None = None, python: str = "python") -> str:
    """This script's command line, to write beside its figures: ``python benchmarks/x.py ARGS``."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return " ".join(shlex.quote(a) for a in [python, str(shown), *(sys.argv[1:] if argv is None else argv)])


def processes() -> dict[int, tuple[str, int, int]]:
    """Every process: pid -> (command name, parent pid, CPU ticks: user + system), from /proc (Linux;
    empty elsewhere). A process that ends while it is read is left out."""
    out = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            rest = text[text.rindex(")") + 2:].split()
            out[int(entry)] = (text[text.index("(") + 1:text.rindex(")")], int(rest[1]),
                               int(rest[11]) + int(rest[12]))
    return out


def descendants(root: int, procs: dict | None = None) -> set[int]:
    """``root`` and every process below it."""
    procs = processes() if procs is None else procs
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += [c for c, (_, parent, _) in procs.items() if parent == pid and c not in found]
    return found


# ---- clocks and timing --------------------------------------------------------------------------------

_CLOCK = time.perf_counter


def clock() -> float:
    return _CLOCK()


def use_cpu_clock() -> None:
    global _CLOCK
    _CLOCK = time.process_time


def clock_name() -> str:
    return "cpu" if _CLOCK is time.process_time else "wall"


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


def mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def crossing(points: list[tuple[float, float | None]], target: float) -> float | None:
    """The x of (x, test accuracy) points at which the accuracy first reaches ``target``, linearly
    interpolated between the two evaluations around the crossing (none before it, or a non-finite one:
    that evaluation's x); None if never."""
    prev = None
    for x, acc in points:
        if acc is not None and acc >= target:
            if prev is None or prev[1] is None or not math.isfinite(prev[1]):
                return x
            x0, a0 = prev
            return x0 + (target - a0) / (acc - a0) * (x - x0)
        prev = (x, acc)
    return None


# ---- data, servers and runs ---------------------------------------------------------------------------

def image_data(n_train: int, n_test: int = 1000, seed: int = 0):
    """MNIST-shaped data: Fashion-MNIST when it is installed, else synthetic.

    Returns (train, test, source). Synthetic: class-dependent means plus
    noise, (1,28,28) float32, 10 classes, generated here from ``seed``.
    """
    if FASHION.is_dir():
        try:
            train, test = sg.load_pair("fashion-mnist", FASHION)
            train.x, train.y = train.x[:n_train].contiguous(), train.y[:n_train].contiguous()
            test.x, test.y = test.x[:n_test].contiguous(), test.y[:n_test].contiguous()
            return train, test, "fashion-mnist"
        except Exception:   # unreadable: fall through to synthetic
            pass
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(10, 1, 28, 28, generator=gen)

    def split(n):
        y = torch.randint(0, 10, (n,), generator=gen)
        x = means[y] + torch.randn(n, 1, 28, 28, generator=gen)
        return SimpleNamespace(x=x.contiguous(), y=y, num_classes=10)

    return split(n_train), split(n_test), "synthetic (1,28,28)"


def for_local_runs(train, test, n_test: int):
    """The training set in shared memory (once: the local runtime maps it in every run) and the first
    ``n_test`` test samples (the evaluation is not what these runs time)."""
    train.x.share_memory_(), train.y.share_memory_()
    return train, SimpleNamespace(x=test.x[:n_test], y=test.y[:n_test], num_classes=train.num_classes)


def kernel_paths() -> list[str]:
    """The server's kernel paths on this machine: torch's operators, and numba's fused kernels if installed."""
    from stalegrad.algorithms import fused
    return ["torch", "numba"] if fused.choose("cpu", True, "auto") == "numba" else ["torch"]


PUSH_LR = 0.1   # the learning rate of the pushes the server benchmarks time


def pushing_server(algo: str, params: dict, n: int, gen: torch.Generator, kernels: str, workers: int = 4):
    """(server, message): a ParameterServer of ``algo`` on ``n`` random weights that every worker has pulled,
    and a small random message to push again and again."""
    w0 = torch.randn(n, generator=gen)
    server = sg.ParameterServer(sg.make_algorithm(algo, **params), w0, workers, kernels=kernels)
    for m in range(workers):
        server.pull(m)
    return server, torch.randn(n, generator=gen).mul_(1e-3)


def plain_samples_per_s(model, opt, train, steps: int, batch: int) -> float:
    """samples/s of ``steps`` plain PyTorch training steps of ``model`` with ``opt`` (the baseline the
    simulator is held against): shuffled mini-batches gathered as the workers gather theirs."""
    gen = torch.Generator().manual_seed(0)
    x, y, n = train.x, train.y, len(train.y)
    perm, pos = torch.randperm(n, generator=gen), 0
    model.train()
    t = clock()
    for _ in range(steps):
        if pos + batch > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        idx = perm[pos:pos + batch]
        pos += batch
        opt.zero_grad()
        loss = F.cross_entropy(model(x.index_select(0, idx)), y.index_select(0, idx))
        loss.backward()
        opt.step()
        loss.item()
    return steps * batch / (clock() - t)


def sync(device: str) -> None:
    """Wait for the device's queued work (a GPU computes asynchronously), so that a clock reads it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class TimedSimulator(sg.Simulator):
    """The simulator, timing only its event loop (no evaluation, no set-up): ``elapsed``. On a GPU
    (``device``), the device's queue is waited for at both ends."""
    device = "cpu"

    def run(self, *args, **kwargs):
        sync(self.device)
        t = clock()
        super().run(*args, **kwargs)
        sync(self.device)
        self.elapsed = clock() - t


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakRSS:
    """Peak resident memory while a block runs, sampled every ``every`` seconds."""

    def __init__(self, every: float = 0.02):
        self.every, self.peak, self.base = every, 0, 0
        self.stop = threading.Event()

    def __enter__(self):
        self.base = self.peak = rss_bytes()
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()
        return self

    def poll(self):
        while not self.stop.wait(self.every):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 2**20


# ---- Ray's transport ------------------------------------------------------------------------------------

def echo_actors(ray, numel: int = 50_826):
    """Two zero-CPU actors that time Ray's transport alone: ``Echo.ping(x)`` returns ``x`` and ``Echo.make()``
    a ``numel`` float32 array (a digits-mlp message by default); ``Caller.calls(other, arg, n)`` returns the
    median ms of ``n`` calls of ``other.ping(arg)`` from inside an actor (what a worker's push costs at least),
    ``Caller.socket_calls(Echo.listen(), arg, n)`` the same through the direct path's socket."""

    @ray.remote(num_cpus=0)
    class Echo:
        def make(self):
            return np.zeros(numel, np.float32)

        def ping(self, x=None):
            return x

        def listen(self):
            """The direct path's socket (``channel.py``), answering each call with its argument."""
            import threading
            from stalegrad.runtimes.ray.channel import ShardListener
            self.listener = ShardListener(lambda op, x: x, threading.Lock())
            return self.listener.channel

    @ray.remote(num_cpus=0)
    class Caller:
        def calls(self, other, arg, n):
            times = []
            for _ in range(n):
                t = time.perf_counter()
                ray.get(other.ping.remote(arg))
                times.append(time.perf_counter() - t)
            return 1000 * statistics.median(times)

        def socket_calls(self, channel, arg, n):
            """The same through the socket of ``Echo.listen``."""
            from stalegrad.runtimes.ray.channel import connect
            conn, times = connect(channel), []
            for _ in range(n):
                t = time.perf_counter()
                conn.call("ping", arg)
                times.append(time.perf_counter() - t)
            conn.close()
            return 1000 * statistics.median(times)

    return Echo.remote(), Caller.remote()


# ---- the options of run_all's sections -------------------------------------------------------------

def options(doc: str, threads: bool = True, clock: bool = True) -> argparse.ArgumentParser:
    """The options a section script takes when run alone (and run_all.py for all): --quick, --threads,
    --clock; ``settle`` applies them."""
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short smoke run (seconds, not minutes)")
    if threads:
        ap.add_argument("--threads", type=int, default=None, help="torch threads [default: torch's, one per core]")
    if clock:
        ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time, or this process's CPU time with one thread (steadier on a busy machine; "
                             "sets --threads 1)")
    return ap


def settle(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Set the torch threads and the clock that ``options`` parsed."""
    if getattr(args, "clock", "wall") == "cpu":
        if getattr(args, "threads", None) not in (None, 1):
            ap.error("--clock cpu needs --threads 1 (more threads spin, and CPU time counts the spinning)")
        args.threads = 1
        use_cpu_clock()
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)


def show(result: dict) -> None:
    """A section's table, then its targets and the load average."""
    print(result["table"])
    print(result["targets"], "load average", load())


# ---- tables and result files --------------------------------------------------------------------------

def table(columns: list[str], rows: list[list]) -> str:
    """A GitHub-flavoured Markdown table (it also reads well in a terminal)."""
    cells = [[str(c) for c in columns]] + [[str(c) for c in r] for r in rows]
    width = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    fmt = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, width)) + " |"   # noqa: E731
    lines = [fmt(cells[0]), "|" + "|".join("-" * (w + 2) for w in width) + "|"]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)


def md_table(columns: list[str], rows: list[list]) -> str:
    """The same table unpadded (``|---|``), as the pages in docs/results/ write them."""
    return "\n".join(["| " + " | ".join(map(str, columns)) + " |", "|" + "---|" * len(columns),
                      *("| " + " | ".join(map(str, r)) + " |" for r in rows)])


def verdict(ok: bool) -> str:
    return "yes" if ok else "NO"


def compact_json(payload: dict, one_line: tuple[str, ...] = ()) -> str:
    """JSON with every list of numbers on one line, and every object whose first key is in ``one_line``
    (a curve's points: ``"epoch"``): the curves stay readable and small."""
    text = json.dumps(payload, indent=2)
    text = re.sub(r"\[\s*((?:-?[0-9.eE+-]+|null)(?:,\s*(?:-?[0-9.eE+-]+|null))*)\s*\]",
                  lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)
    for key in one_line:
        text = re.sub(r"\{\s*(\"" + re.escape(key) + r"\"[^{}]*?)\s*\}",
                      lambda m: "{" + re.sub(r",\s+", ", ", m.group(1)) + "}", text)
    return text + "\n"


def save(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all (a file beside it, renamed), its folder made."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def write_json(name: str, payload: dict, out_dir: Path = RESULTS, indent: int = 2) -> Path:
    """``payload`` as ``out_dir/name.json``."""
    return save(Path(out_dir) / f"{name}.json", json.dumps(payload, indent=indent) + "\n")
