"""Fused CPU kernels of the element-wise server rules: one pass over memory per update.

Each torch operation of a rule is one pass over its operands, so DC-ASGD-a written with
torch operators makes about a dozen passes over 4 to 6 vectors. The kernels here do
the whole update in one loop (numba's LLVM JIT: no C compiler at the user's site): read
the message, ``w`` and the rule's state once, update the state, add the step to ``w``
in place, keep the old ``w`` and the old values of the state it writes in buffers (``old``,
``keep``), and count the elements whose step, or whose new state, is not a finite float32.
The server puts the old ``w`` and state back when that count is not zero, so an update is
still applied whole or not at all, its state included (``ParameterServer.prepare``/``commit``,
``core/transaction.py``).

Rounding: every operation rounds as the torch operator it replaces (float32, same order,
a fused multiply-add exactly where torch's CPU kernels use one). sgd, asgd, dcasgd-c, sasgd,
dana-zero, dana-dc and async-local-sgd (delayed nesterov) give torch's bits; dcasgd-a and
gap-aware differ in the last bit of some elements because their square root here is IEEE's,
correctly rounded, and torch's CPU ``sqrt`` (MKL) is not always. Rules whose state has scalars
(gap-aware's update count and largest rate, DANA's last rate, async-local-sgd's update count)
update them in ``fused_apply``, once per call: a kernel runs on the whole vectors, never on the
server's chunks.
No fast-math: the same inputs give the same bits on every run (tests/test_fused.py).

Optional: ``pip install 'numba>=0.59'`` brings numba. Without it, for tensors on a GPU,
or with ``STALEGRAD_KERNELS=torch``, the server runs the rules' torch operators.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import threading
import time

import numpy as np

from ..errors import ConfigError, RunError

# s*t must stay below this in magnitude to round to a finite float32 (as server._F32_OVERFLOW)
F32_OVERFLOW = (2 - 2 ** -24) * 2.0 ** 127
_F32_MAX = np.finfo(np.float32).max
KERNEL_SETTINGS = ("auto", "numba", "torch")
# A parallel kernel's launch costs about 50 us on a quiet machine, a serial pass over ~200K
# elements; on a busy one, waking a sleeping thread took up to 24 ms (1M elements, 2 threads, load
# average 10 on 2 cores). So parallel loops only for vectors beyond the L3 cache (16 MiB of float32),
# where the memory bandwidth of more cores pays for that risk.
PARALLEL_ABOVE = 1 << 22

_kernels = None          # the kernels module, once imported (its pairs are warmed one by one: ``_pair``)
_warmed: dict = {}       # name -> (serial, parallel), compiled or read from numba's cache
_warm_lock = threading.Lock()
_unavailable = None      # why they cannot be loaded, once known
load_seconds = 0.0       # what loading took so far: the import, then compiling or reading numba's cache


def choose(device_type: str, dtype_ok: bool, setting: str | None = None) -> str:
    """The kernels a server on this device uses: "numba" or "torch". ``setting`` (default:
    the STALEGRAD_KERNELS environment variable, else "auto") may ask for either.

    With "auto", numba is imported (0.5 s) and each kernel compiled or read from its cache (the
    first 0.8 s, then tens of ms) only when a rule first needs one (``_pair``): a run whose rule has
    no fused kernel (asgd, agn, dynsgd) never pays it, and its checks use torch's ``aminmax``."""
    setting = (setting or os.environ.get("STALEGRAD_KERNELS") or "auto").strip().lower()
    if setting not in KERNEL_SETTINGS:
        raise ConfigError("STALEGRAD_KERNELS", f"must be one of {', '.join(KERNEL_SETTINGS)}, got {setting!r}")
    if setting == "torch":
        return "torch"
    placed = device_type == "cpu" and dtype_ok
    if setting == "numba":   # asked for by name: loaded now, so that a broken install fails before the run
        if not (placed and _load() is not None):
            why = _unavailable or "they run on float32 CPU tensors only"
            raise ConfigError("STALEGRAD_KERNELS", f"is numba, which cannot be used here: {why}; "
                                                   "unset it to fall back to torch operators")
        return "numba"
    return "numba" if placed and _installed() else "torch"


def _installed() -> bool:
    if _kernels is not None or _unavailable is not None:
        return _kernels is not None
    return importlib.util.find_spec("numba") is not None


def in_use() -> bool:
    """Whether a kernel has been loaded in this process (a rule needed one): the servers' checks then use
    numba's ``max_abs`` too (cheaper than ``aminmax`` on vectors in cache), and none pays a start for it."""
    return bool(_warmed)


def describe() -> dict:
    """What the fused kernels are here: for summary.json and ``stalegrad algorithms``."""
    if _load() is None:
        return {"server_kernels": "torch", "why": _unavailable}
    import numba
    return {"server_kernels": "numba", "numba": numba.__version__, "threading_layer": _threading_layer(),
            "load_s": round(load_seconds, 3)}


def _load():
    global _kernels, _unavailable, load_seconds
    if _kernels is not None or _unavailable is not None:
        return _kernels
    start = time.perf_counter()
    try:
        from . import _numba_kernels
    except ImportError as e:     # numba is not installed (the 'fast' extra)
        _unavailable = f"numba is not installed ({e}); pip install 'numba>=0.59'"
        return None
    _prefer_workqueue()
    _kernels = _numba_kernels
    load_seconds = time.perf_counter() - start
    return _kernels


def _pair(name: str) -> tuple:
    """The (serial, parallel) kernels ``name``, warmed on first use (``_numba_kernels.warm``)."""
    global load_seconds
    pair = _warmed.get(name)
    if pair is None:
        with _warm_lock:   # (the local runtime's server thread and an evaluation thread may both ask)
            pair = _warmed.get(name)
            if pair is None:
                if _load() is None:   # numba was found but does not import: nothing was applied yet
                    raise RunError(f"the fused kernels cannot be loaded: {_unavailable}; set "
                                   "STALEGRAD_KERNELS=torch to run with torch operators")
                start = time.perf_counter()
                pair = _warmed[name] = _kernels.warm(name)
                load_seconds += time.perf_counter() - start
    return pair


def _prefer_workqueue() -> None:
    """numba's own thread pool ("workqueue") unless the user chose a threading layer.

    With its OpenMP layer, numba shares the libgomp that torch loaded, and after a kernel
    its threads kept spinning: every later torch operation of the process (a worker's step
    in the simulator) ran beside a busy core. Measured with one torch thread: a 1M-element
    copy took 8 ms of process CPU time instead of 0.07, before and after a sleep.
    The workqueue's threads sleep when idle. It does not nest parallel kernels, which
    the server never does (one thread applies the updates)."""
    import numba
    if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
        numba.config.THREADING_LAYER = "workqueue"


def _threading_layer() -> str:
    import numba
    try:
        return numba.threading_layer()
    except ValueError:           # no parallel kernel has run yet
        return "unknown"


def _kernel(name: str, n: int):
    """The serial or the parallel kernel: parallel on as many threads as torch uses
    (``torch.set_num_threads``, at most numba's pool) for vectors of PARALLEL_ABOVE elements
    or more, where it pays for its launch."""
    import numba
    import torch
    threads = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    if threads == 1 or n < PARALLEL_ABOVE:
        return _pair(name)[0]
    if numba.get_num_threads() != threads:
        numba.set_num_threads(threads)
    return _pair(name)[1]


@functools.lru_cache(maxsize=256)
def finite_limit(s: float) -> np.float32:
    """The largest float32 x with |s32 * x| < F32_OVERFLOW, computed exactly in double as
    server._scaled_finite does: s*t rounds to a finite float32 exactly when |t| <= this."""
    a = abs(float(np.float32(s)))
    if a == 0.0:
        return np.float32(_F32_MAX)
    x = np.float32(min(F32_OVERFLOW / a, float(_F32_MAX)))
    while float(x) * a >= F32_OVERFLOW:
        x = np.nextafter(x, np.float32(0))
    while x < _F32_MAX and float(np.nextafter(x, np.float32(np.inf))) * a < F32_OVERFLOW:
        x = np.nextafter(x, np.float32(np.inf))
    return x


def max_abs(t) -> float:
    """The largest |t[i]| (NaN if an element is NaN, inf if one is infinite), in one pass."""
    import torch
    top = int(_kernel("max_abs_bits", t.numel())(t.view(torch.int32).numpy()))
    return float("nan") if top > 0x7F800000 else float(np.int32(top).view(np.float32))


def kept(keep, key: str, t):
    """Where a kernel keeps the old values of the state tensor ``t`` it writes: ``keep[key]`` (the server's
    buffer, ``core/transaction.py``), or, with no buffer given, ``t`` itself (each old value stored where the
    new one is stored next: nothing kept)."""
    return (t if keep is None or keep.get(key) is None else keep[key]).numpy()


def _common(w, momentum_buffer, old, weight_decay, momentum, s, keep=None):
    f = np.float32
    buf = momentum_buffer if momentum else old   # not touched without momentum
    return (w.numpy(), buf.numpy(), kept(keep, "momentum_buffer", buf), old.numpy()), \
        (f(weight_decay), f(momentum), bool(weight_decay), bool(momentum), f(s), finite_limit(s))


def sgd_apply(g, w, momentum_buffer, old, *, weight_decay: float, momentum: float, s: float, keep=None) -> bool:
    """w += s * sgd_step(g) (weight decay, then heavy-ball momentum) in place; ``old`` gets the
    old w, ``keep`` (``{state key: tensor}``, optional) the old values of the state written. True
    when the step (and the state written) is finite."""
    arrays, scalars = _common(w, momentum_buffer, old, weight_decay, momentum, s, keep)
    return _kernel("sgd", g.numel())(g.numpy(), *arrays, *scalars) == 0


def dcasgd_c_apply(g, w, w_bak, momentum_buffer, old, *, lam: float, weight_decay: float, momentum: float,
                   s: float, keep=None) -> bool:
    """w += s * sgd_step(g + lam*g*g*(w - w_bak)) in place; as ``sgd_apply``."""
    (w_, *rest), scalars = _common(w, momentum_buffer, old, weight_decay, momentum, s, keep)
    return _kernel("dcasgd_c", g.numel())(g.numpy(), w_, w_bak.numpy(), *rest, np.float32(lam), *scalars) == 0


def dcasgd_a_apply(g, w, w_bak, mean_square, momentum_buffer, old, *, lam0: float, ms_momentum: float,
                   eps: float, weight_decay: float, momentum: float, s: float, keep=None) -> bool:
    """The MeanSquare update, then w += s * sgd_step(g + lam0/sqrt(ms+eps)*g*g*(w - w_bak)); as ``sgd_apply``."""
    (w_, *rest), scalars = _common(w, momentum_buffer, old, weight_decay, momentum, s, keep)
    f = np.float32
    return _kernel("dcasgd_a", g.numel())(g.numpy(), w_, w_bak.numpy(), mean_square.numpy(),
                                          kept(keep, "mean_square", mean_square), *rest, f(lam0), f(ms_momentum),
                                          f(1 - ms_momentum), f(eps), *scalars) == 0


def sasgd_apply(g, w, momentum_buffer, old, *, scale: float, weight_decay: float, momentum: float,
                s: float, keep=None) -> bool:
    """w += s * sgd_step((g + weight_decay*w) * scale), the weight decay inside the scaling and the
    momentum outside it (sasgd's order); as ``sgd_apply``."""
    arrays, scalars = _common(w, momentum_buffer, old, weight_decay, momentum, s, keep)
    return _kernel("sasgd", g.numel())(g.numpy(), *arrays, np.float32(scale), *scalars) == 0


def gap_aware_apply(g, w, w_bak, step_square, momentum_buffer, old, *, updates: int, lr_max: float, beta: float,
                    eps: float, weight_decay: float, momentum: float, s: float, authors: bool = True,
                    keep=None) -> bool:
    """Gap-Aware's update, ``updates`` the updates before this one; as ``sgd_apply``. ``authors`` (the
    authors' code): v <- beta*v + (1-beta)*x*x (x = g, or with momentum the buffer before this step), G = 1 +
    |w - w_bak| / (lr_max*(sqrt(v/(1 - beta^(updates+1))) + eps)), d = momentum step of (g + wd*w)/G.
    Otherwise (the applied step): d = sgd_step(g / G) with v/(1 - beta^updates) in G (G = 1 when ``updates``
    is 0), then v <- beta*v + (1-beta)*d*d. Both then w += s*d."""
    (w_, *rest), scalars = _common(w, momentum_buffer, old, weight_decay, momentum, s, keep)
    f = np.float32
    v = (step_square.numpy(), kept(keep, "step_square", step_square))
    if authors:
        wd, mom, use_wd, use_mom, s32, limit = scalars
        return _kernel("gap_aware_grad", g.numel())(g.numpy(), w_, w_bak.numpy(), *v, *rest,
                                                    f(1 - beta ** (updates + 1)), f(eps), f(lr_max), f(1), f(beta),
                                                    f(1 - beta), wd, mom, use_wd, use_mom, s32, limit) == 0
    bias = f(1 - beta ** updates) if updates else f(1)
    return _kernel("gap_aware", g.numel())(g.numpy(), w_, w_bak.numpy(), *v, *rest, bias, f(eps), f(lr_max), f(1),
                                           bool(updates), f(beta), f(1 - beta), *scalars) == 0


def dana_apply(g, w, w_bak, momentum, momentum_sum, old, *, lam: float | None, gamma: float, weight_decay: float,
               s: float, keep=None) -> bool:
    """DANA's server step: d = g (DANA-DC, ``lam`` not None: g + lam*g*g*(w - w_bak)) + weight_decay*w,
    change = (gamma - 1)*v + d, v += change, momentum_sum += change, w += s*v; as ``sgd_apply``
    (``old`` gets the old w, True when s*v is finite)."""
    f = np.float32
    dc = lam is not None
    v = momentum.numpy()
    bak = w_bak.numpy() if dc else v   # not read without the delay compensation
    return _kernel("dana", g.numel())(g.numpy(), w.numpy(), bak, v, kept(keep, "momenta", momentum),
                                      momentum_sum.numpy(), kept(keep, "momentum_sum", momentum_sum), old.numpy(),
                                      f(lam if dc else 0.0), dc, f(gamma - 1), f(weight_decay), bool(weight_decay),
                                      f(s), finite_limit(s)) == 0


def local_sgd_apply(c, w, dn_sum, buffer, old, *, n: int, momentum_update: bool, beta: float, share: float,
                    s: float, keep=None) -> bool:
    """async-local-sgd's Delayed Nesterov in the commit's sign: D += c, step = c/n, and on the n-th update
    b <- beta*b + D/n, step += (1 - share*n + share)*beta*b, D <- 0 (else step += share*beta*b when share
    > 0), then w += s*step in place; as ``sgd_apply`` (``old`` gets the old w, True when s*step is finite)."""
    f = np.float32
    alpha = (1 - share * n + share) * beta if momentum_update else share * beta
    return _kernel("local_sgd", c.numel())(c.numpy(), w.numpy(), dn_sum.numpy(), kept(keep, "dn_sum", dn_sum),
                                           buffer.numpy(), kept(keep, "outer_buffer", buffer), old.numpy(), f(n),
                                           bool(momentum_update), f(beta), f(alpha), bool(share), f(s),
                                           finite_limit(s)) == 0
