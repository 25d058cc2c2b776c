"""Bits that do not depend on the thread count, and a thread count that suits the machine's load.

A float32 sum depends on the order of its terms. Three libraries under torch split their sums by
thread: MKL's matrix products (a thread takes a block of the inner dimension), oneDNN's convolutions
(a thread takes a part of the batch for the weight gradient), and torch's own parallel reductions.
With OMP_NUM_THREADS=1 and 2 the same asgd run then ended with different ``weights_sha256``, and, at a
chaotic learning rate, 0.40 against 0.10 test accuracy. The simulator promises that a seed fixes the
bits, so while it runs (``pinned``):

- MKL runs in *strict conditional numerical reproducibility* on its AVX2 code branch
  (``MKL_CBWR=AVX2,STRICT``; ``AUTO,STRICT`` on a CPU without AVX2): its matrix products give the same
  bits whatever the number of threads. ``import stalegrad`` sets the variable (unless the user did);
  MKL reads it when it starts, and a later ``mkl_cbwr_set`` is refused once MKL has computed anything,
  so where torch had already used MKL without it, the run falls back to one thread, which gives the
  same bits (tested);
- oneDNN is off (``torch.backends.mkldnn``): convolutions use torch's own im2col and MKL's products;
- torch's own kernels use their AVX2 versions (``ATEN_CPU_CAPABILITY=avx2``, also set by ``import
  stalegrad`` on an AVX2 CPU unless the user chose): AVX512 kernels round differently, so without the
  pin a machine with AVX512 gave other bits than one without.

Tested equal at 1 and 2 threads for every model of the zoo, the gradient, commit and vectorised paths
(tests/test_numerics.py). Across CPUs: two AMD EPYC VMs gave the same bits with the AVX2 pin; an Intel
Xeon (AVX512) gave other bits than both under every MKL branch tried (AVX2, AUTO, AVX512, COMPATIBLE):
MKL guarantees its branches on Intel CPUs only and runs its own code on AMD, so the bits are those of
the CPU vendor (docs/performance.md, "Reproducible bits"). What still fixes the bits is recorded in
config.json (``numerics``): torch's version, the CPU's vendor and model, the instruction set torch's
kernels use (``cpu_capability``), MKL's mode as MKL reports it and as it was asked (``mkl_cbwr``,
``mkl_cbwr_env``), and the server's kernel path.

The thread count is then free to follow the machine: ``ThreadGovernor`` runs at all the cores, as
OMP_NUM_THREADS set to their count would, while no other process wants them, and otherwise measures the
simulator's speed at one thread, half and all of the cores, and keeps the fastest. On a quiet 2-core
machine two threads ran the mlp 1.2x and the agn-mlp 1.7x faster than one; beside two busy processes
one thread ran the mlp 2.6x faster than two (a thread waits at every barrier for a descheduled peer;
docs/performance.md, "Threads under load"). Measuring on a quiet machine only cost time: the agn-mlp
at M = 40 ran 4 of its 47 messages at one thread, 18.9 s against 17.1 s at two.
"""
from __future__ import annotations

import ctypes
import os
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from .errors import NumericsWarning

STRICT = 0x10000   # MKL_CBWR_STRICT, or-ed into a branch
BRANCHES = {0: "OFF", 1: "BRANCH_OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1",
            8: "SSE4_2", 9: "AVX", 10: "AVX2", 12: "AVX512", 13: "AVX512_E1", 14: "AVX512_E2"}
ENV = "MKL_CBWR"


def _mkl():
    """MKL's service functions in torch's own library (MKL is linked into it), or None (no MKL)."""
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        get, set_ = lib.mkl_serv_cbwr_get, lib.mkl_serv_cbwr_set
    except (OSError, AttributeError):
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    set_.restype, set_.argtypes = ctypes.c_int, [ctypes.c_int]
    return get, set_


def mkl_mode() -> int | None:
    """MKL's reproducibility mode (a branch, or-ed with STRICT), or None without MKL."""
    mkl = _mkl()
    return None if mkl is None else mkl[0](-1)   # -1: MKL_CBWR_ALL


def describe_mode(mode: int | None) -> str:
    if mode is None:
        return "no MKL"
    name = BRANCHES.get(mode & ~STRICT, str(mode & ~STRICT))
    return f"{name},STRICT" if mode & STRICT else name


def make_strict() -> bool:
    """Strict mode on (keeping the branch the user chose), if MKL still allows it; whether it is on."""
    mkl = _mkl()
    if mkl is None:
        return False
    get, set_ = mkl
    mode = get(-1)
    if mode & STRICT:
        return True
    branch = mode & ~STRICT
    return set_((branch if branch >= 2 else 2) | STRICT) == 0 and bool(get(-1) & STRICT)


PRESSURE = "/proc/pressure/cpu"   # Linux's CPU pressure (PSI): how long runnable threads waited for a core
CONTENDED = 0.25                  # ... for this share of a window or more: another process wants the cores


def cpu_stall_seconds() -> float | None:
    """Seconds, since boot, in which some runnable thread of this machine waited for a core (PSI's
    cumulative "some" total); None where the kernel does not say (not Linux, or PSI off)."""
    try:
        with open(PRESSURE, encoding="ascii") as f:
            for line in f:
                if line.startswith("some "):
                    return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):
        pass
    return None


class ThreadGovernor:
    """torch's intra-op threads for a computation whose bits do not depend on them.

    ``threads`` fixed (an int) stays. ``None`` runs at all the cores (the count torch started with, as
    OMP_NUM_THREADS set to the core count would) as long as no other process wants them: a thread waits
    at every barrier for a descheduled peer, so on a busy machine fewer threads can run faster. At the
    end of each window at all the cores (``trial_s`` seconds for the first, then ``hold_s``), the
    kernel's CPU pressure says whether runnable threads waited for a core in it (``stall``: seconds
    since boot, or None where unknown, which counts as waiting). If they did, it measures: ``trial_s``
    seconds at each other candidate count (1, half the cores), then holds the fastest (the most messages
    a second) for ``hold_s`` seconds, and measures again. The load average cannot decide this: it lags
    by a minute and counts this process's own threads. ``tick()`` once per message."""

    def __init__(self, threads: int | None, trial_s: float = 1.0, hold_s: float = 20.0, stall=cpu_stall_seconds):
        self.fixed = threads is not None
        self.max = threads if threads is not None else torch.get_num_threads()
        self.candidates = [self.max] if self.fixed else sorted({1, max(1, self.max // 2), self.max})
        self.trial_s, self.hold_s, self._stall = trial_s, hold_s, stall
        self.messages: dict[int, int] = {}        # messages run at each thread count (summary.json)
        self._rates: dict[int, float] = {}
        self._queue: list[int] = []               # counts still to try in this round of measurements
        self._start(self.candidates[-1], self.trial_s if len(self.candidates) > 1 else float("inf"))

    def _start(self, n: int, length: float, trying: bool = False) -> None:
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
        self.current, self._length, self._trying = n, length, trying
        self._t0, self._count = None, 0   # the clock starts at the next message: set-up time is not its
        self._stall0 = self._stall()

    def _contended(self, elapsed: float) -> bool:
        """Whether some thread of this machine waited for a core in the window just ended (unknown: yes)."""
        now = self._stall()
        return now is None or self._stall0 is None or now - self._stall0 >= CONTENDED * elapsed

    def tick(self) -> None:
        """One message done."""
        self.messages[self.current] = self.messages.get(self.current, 0) + 1
        if self._t0 is None:
            self._t0 = time.perf_counter()
            return
        self._count += 1
        elapsed = time.perf_counter() - self._t0
        if elapsed < self._length or self._count < 3:
            return
        rate = self._count / elapsed
        if self._trying:                                  # a trial ended: the next, or hold the fastest
            self._rates[self.current] = rate
            if self._queue:
                self._start(self._queue.pop(0), self.trial_s, trying=True)
            else:
                self._start(max(self._rates, key=self._rates.get), self.hold_s)
        elif self.current == self.candidates[-1] and not self._contended(elapsed):   # all cores, no one else wants them
            self._start(self.current, self.hold_s)
        else:                                             # measure: the load may have changed
            self._rates = {self.current: rate}
            self._queue = [n for n in self.candidates if n != self.current]
            self._start(self._queue.pop(0), self.trial_s, trying=True)

    def restrict(self, counts: list[int]) -> None:
        """Keep only ``counts`` (those that give the bits of one thread); before the first message."""
        self.candidates = [n for n in self.candidates if n in counts] or [1]
        self._start(self.candidates[-1], self.trial_s if len(self.candidates) > 1 else float("inf"))


def agreeing_counts(step, counts: list[int]) -> list[int]:
    """The thread counts at which ``step()`` (a list of tensors) gives the bits it gives at one thread.

    MKL's strict mode and oneDNN off cover the large products; a few of torch's own kernels still split a
    sum by thread (a matrix product with a transposed operand and a tiny output, e.g. an mlp's last layer
    at batch 8, runs torch's native gemm, which splits the inner dimension). The simulator runs one
    step of the run's own shapes at each count before the first message, and keeps those that agree."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        reference = step()
        agree = [1]
        for n in sorted(set(counts) - {1}):
            torch.set_num_threads(n)
            if all(torch.equal(a, b) for a, b in zip(reference, step())):
                agree.append(n)
        return agree
    finally:
        torch.set_num_threads(before)


def warn(text: str) -> None:
    warnings.warn(text, NumericsWarning, stacklevel=2)


def fixed_threads() -> int | None:
    """The thread count the user fixed with OMP_NUM_THREADS (None: not fixed)."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


@contextmanager
def pinned(threads: int | None = None):
    """Run a block with bits that do not depend on the thread count; yields the ``ThreadGovernor``
    (``.tick()`` once per message) and restores torch's settings after."""
    before = torch.get_num_threads()
    strict = make_strict()
    if not strict:
        asked = threads if threads is not None else fixed_threads() or os.cpu_count() or 1
        threads = 1   # MKL had already run without strict mode: one thread gives the same bits
        if asked > 1:
            warn(f"threads: MKL computed before stalegrad could make it reproducible (torch was used before "
                 f"stalegrad was imported), so the simulator runs at 1 thread, not {asked}, with MKL's own code "
                 "branch (config.json's numerics); import stalegrad before torch's first computation (importing "
                 "torch first is fine) to use them")
    governor = ThreadGovernor(threads if threads is not None else fixed_threads())
    governor.strict = strict
    mkldnn = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield governor
    finally:
        torch.backends.mkldnn.enabled = mkldnn
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def cpu() -> dict:
    """The CPU's vendor and model (Linux: /proc/cpuinfo): MKL's matrix products follow code paths of
    their own per vendor, so an Intel and an AMD CPU give different bits (docs/performance.md)."""
    found = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = {"vendor_id": "cpu_vendor", "model name": "cpu_model"}.get(key.strip())
            if key and key not in found:
                found[key] = value.strip()
            if len(found) == 2:
                break
    except OSError:
        pass
    if not found:
        import platform
        found = {"cpu_vendor": None, "cpu_model": platform.processor() or platform.machine()}
    return found


def describe(governor: ThreadGovernor | None = None) -> dict:
    """What, besides the seed and the options, fixes the bits of a simulated run (config.json)."""
    mode = mkl_mode()
    out = {"torch": torch.__version__, **cpu(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           # MKL's mode as it reports it (an AMD CPU reports a requested AVX2 branch as AUTO) and as asked
           "mkl_cbwr": describe_mode(mode), "mkl_cbwr_env": os.environ.get(ENV), "mkldnn": False,
           "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY")}
    if governor is not None:
        out["threads"] = governor.max if governor.fixed else "auto"
        if not governor.strict:
            out["threads"] = 1
            out["note"] = ("MKL is not in strict mode (no MKL, or MKL ran before stalegrad could set it: import "
                           "stalegrad before torch, or set MKL_CBWR=AUTO,STRICT): one thread, the same bits")
    return out
