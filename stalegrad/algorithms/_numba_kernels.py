"""The numba loops behind ``fused`` (imported only when numba is installed).

Float32 in, float32 out, every operation in the order and rounding of the torch
operators of the rule it replaces (see each kernel's comment). ``fastmath`` stays off:
LLVM may not reorder or contract the arithmetic, so it vectorises the loop (AVX2 here)
without changing a bit. The finiteness count is an integer reduction, which needs no
reordering of float arithmetic either.

Each kernel applies its update in place, ``w[i] <- fma(t[i], s, w[i])`` (torch's
``w.add_(t, alpha=s)``), keeps the old ``w[i]`` in ``old[i]``, and the old value of every state
element it writes in that state's ``keep_*`` array (the same loop: one store more, no pass of
its own), for the caller to put back when the update turns out not to be finite. It returns how
many elements are bad: ``t[i]`` NaN or above ``limit`` in magnitude (``s*t`` would overflow; see
``fused.finite_limit``), or a state value it wrote not finite (a MeanSquare, a momentum sum).

Every kernel is one body, a ``prange`` loop, compiled twice (``_serial_and_parallel``): a serial
loop, and a loop on numba's threads. A parallel launch costs about 50 us (measured), as much as
a serial pass over 200K elements, so ``fused`` runs the serial one on one thread or short vectors.
"""
from __future__ import annotations

from types import FunctionType

import numpy as np
from numba import njit, prange
from numba.core import types
from numba.extending import intrinsic


@intrinsic
def _fma(typingctx, a, b, c):
    """a*b + c rounded once (LLVM's fma): what torch's vectorised add(alpha=) computes."""
    if not (a == b == c == types.float32):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def _sqrt(typingctx, a):
    """IEEE float32 square root (LLVM's llvm.sqrt: no errno, so the loop vectorises)."""
    if a != types.float32:
        return None

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.sqrt", [args[0].type])
        return builder.call(fn, args)
    return types.float32(types.float32), codegen


# error_model="numpy": a division by zero gives inf (IEEE), as in torch, instead of raising,
# which would be an early exit that stops LLVM vectorising the loop; _nrt=False: the
# kernels allocate nothing, and the reference counting of the arrays passed to the inline
# helpers would be calls that stop it too (LLVM's remarks said so).
_SERIAL = dict(fastmath=False, cache=True, nogil=True, error_model="numpy", _nrt=False)
_PARALLEL = dict(_SERIAL, parallel=True, _nrt=True)   # a parallel reduction allocates
_INLINE = dict(inline="always", fastmath=False, error_model="numpy", _nrt=False)
_F32_MAX = np.float32(np.finfo(np.float32).max)

# Every kernel pair: name -> (serial, parallel, the kinds of the arguments that compile it or load it from
# numba's cache): "a" a float32 vector, "s" a float32 scalar, "b" a flag, "i" an int32 vector (a float32's bits).
KERNELS: dict = {}


def _serial_and_parallel(kinds: str):
    """Compile one body, a ``prange`` loop, twice: serial (numba reads ``prange`` as ``range`` without
    ``parallel``: the code of a ``range`` loop) and on numba's threads. The parallel one compiles a copy
    of the function under its own name: numba's cache names its files after the function, and keys
    them by signature and bytecode, not options, so two compilations of one would read each other's."""
    def compile_both(body):
        copy = FunctionType(body.__code__, body.__globals__, f"{body.__name__}_parallel", body.__defaults__,
                            body.__closure__)
        copy.__qualname__ = f"{body.__qualname__}_parallel"
        serial = njit(**_SERIAL)(body)
        KERNELS[body.__name__] = (serial, njit(**_PARALLEL)(copy), kinds)
        return serial
    return compile_both


@njit(**_INLINE)
def _bad(x):
    """1 when the state value x is NaN or infinite (the update that wrote it is then undone), else 0."""
    return 0 if abs(x) <= _F32_MAX else 1


@njit(**_INLINE)
def _apply(d, i, w, mom_buf, keep_buf, old, wd, mom, use_wd, use_mom, s, limit):
    """GradientAlgorithm.sgd_step on element i of direction d, then the add. torch.add(d, w,
    alpha=wd) is fma(w, wd, d); buf.mul_(mom).add_(d) rounds twice; w.add_(t, alpha=s) is fma."""
    wi = w[i]
    if use_wd:
        d = _fma(wi, wd, d)
    if use_mom:
        b = keep_buf[i] = mom_buf[i]
        d = b * mom + d
        mom_buf[i] = d
    old[i] = wi
    w[i] = _fma(d, s, wi)
    return 0 if abs(d) <= limit else 1


@njit(**_INLINE)
def _dcasgd_c(i, g, w, w_bak, lam):
    # torch.sub(w, w_bak).mul_(g); torch.addcmul(g, x, g, value=lam) = fma(lam*x, g, g)
    # (torch's CPU addcmul compiles to one fused multiply-add; tests/test_fused.py pins it)
    gi = g[i]
    return _fma(lam * ((w[i] - w_bak[i]) * gi), gi, gi)


@njit(**_INLINE)
def _dcasgd_a(i, g, w, w_bak, ms, keep_ms, lam0, ms_mom, ms_rate, eps):
    # ms.mul_(m).addcmul_(g, g, value=1-m) = fma((1-m)*g, g, ms*m); torch.sub(w, w_bak).mul_(g).mul_(g);
    # torch.addcdiv(g, x, sqrt(ms + eps), value=lam0) = g + (lam0*x)/sqrt(ms + eps), no fma.
    # The square root is IEEE's (correctly rounded); torch's CPU sqrt (MKL's) is not always.
    gi = g[i]
    mi = keep_ms[i] = ms[i]
    m = _fma(ms_rate * gi, gi, mi * ms_mom)
    ms[i] = m
    x = (w[i] - w_bak[i]) * gi * gi
    return gi + lam0 * x / _sqrt(m + eps), _bad(m)


@_serial_and_parallel("aaaaassbbss")
def sgd(g, w, mom_buf, keep_buf, old, wd, mom, use_wd, use_mom, s, limit):
    bad = 0
    for i in prange(g.size):
        bad += _apply(g[i], i, w, mom_buf, keep_buf, old, wd, mom, use_wd, use_mom, s, limit)
    return bad


@_serial_and_parallel("aaaaaasssbbss")
def dcasgd_c(g, w, w_bak, mom_buf, keep_buf, old, lam, wd, mom, use_wd, use_mom, s, limit):
    bad = 0
    for i in prange(g.size):
        bad += _apply(_dcasgd_c(i, g, w, w_bak, lam), i, w, mom_buf, keep_buf, old, wd, mom, use_wd, use_mom, s,
                      limit)
    return bad


@_serial_and_parallel("aaaaaaaassssssbbss")
def dcasgd_a(g, w, w_bak, ms, keep_ms, mom_buf, keep_buf, old, lam0, ms_mom, ms_rate, eps, wd, mom, use_wd, use_mom,
             s, limit):
    bad = 0
    for i in prange(g.size):
        d, ms_bad = _dcasgd_a(i, g, w, w_bak, ms, keep_ms, lam0, ms_mom, ms_rate, eps)
        bad += _apply(d, i, w, mom_buf, keep_buf, old, wd, mom, use_wd, use_mom, s, limit) + ms_bad
    return bad


@njit(**_INLINE)
def _sasgd(i, g, w, wd, use_wd, scale):
    # torch.add(g, w, alpha=wd, out=out).mul_(scale) = fma(w, wd, g)*scale; torch.mul(g, scale)
    d = g[i]
    if use_wd:
        d = _fma(w[i], wd, d)
    return d * scale


@njit(**_INLINE)
def _gap_aware(i, g, w, w_bak, v, bias, eps, lr_max, one, use_gap):
    # C = torch.sqrt(v / bias).add_(eps).mul_(lr_max); G = torch.sub(w, w_bak).abs_().div_(C).add_(1);
    # g / G. The square root is IEEE's (correctly rounded); torch's CPU sqrt (MKL's) is not always.
    gi = g[i]
    if not use_gap:
        return gi
    c = (_sqrt(v[i] / bias) + eps) * lr_max
    return gi / (abs(w[i] - w_bak[i]) / c + one)


@njit(**_INLINE)
def _gap_aware_grad(i, g, w, w_bak, v, keep_v, mom_buf, bias, eps, lr_max, one, beta, rate, wd, use_wd, use_mom):
    # Gap-Aware as its authors' code reads it (ga_reading "authors"): the running average first, from x = g
    # (with momentum: the buffer the previous step left), v.mul_(beta).addcmul_(x, x, value=rate) =
    # fma(rate*x, x, v*beta); C = torch.sqrt(v / bias).add_(eps).mul_(lr_max); G = torch.sub(w, w_bak).abs_()
    # .div_(C).add_(1); the weight decay penalised too: torch.add(g, w, alpha=wd) = fma(w, wd, g), .div_(G).
    gi = g[i]
    x = mom_buf[i] if use_mom else gi
    vi = keep_v[i] = v[i]
    vi = _fma(rate * x, x, vi * beta)
    v[i] = vi
    c = (_sqrt(vi / bias) + eps) * lr_max
    wi = w[i]
    d = _fma(wi, wd, gi) if use_wd else gi
    return d / (abs(wi - w_bak[i]) / c + one), _bad(vi)


@njit(**_INLINE)
def _apply_tracked(d, i, w, mom_buf, keep_buf, v, keep_v, old, wd, mom, use_wd, use_mom, beta, rate, s, limit):
    """_apply, and the running average of the step's square: v.mul_(beta).addcmul_(d, d, value=rate)
    = fma(rate*d, d, v*beta), d the direction after weight decay and momentum."""
    wi = w[i]
    if use_wd:
        d = _fma(wi, wd, d)
    if use_mom:
        b = keep_buf[i] = mom_buf[i]
        d = b * mom + d
        mom_buf[i] = d
    vi = keep_v[i] = v[i]
    vi = _fma(rate * d, d, vi * beta)
    v[i] = vi
    old[i] = wi
    w[i] = _fma(d, s, wi)
    return (0 if abs(d) <= limit else 1) + _bad(vi)


@njit(**_INLINE)
def _dana(i, g, w, w_bak, v, keep_v, vsum, keep_vsum, old, lam, use_dc, mom_m1, wd, use_wd, s, limit):
    # (DANA-DC: d = _dcasgd_c's g_dc); torch.add(d, w, alpha=wd) = fma(w, wd, d);
    # change = torch.add(d, v, alpha=gamma-1) = fma(v, gamma-1, d); v.add_(change); vsum.add_(change);
    # w.add_(v, alpha=s) = fma(v, s, w)
    d = _dcasgd_c(i, g, w, w_bak, lam) if use_dc else g[i]
    wi = w[i]
    if use_wd:
        d = _fma(wi, wd, d)
    vi = keep_v[i] = v[i]
    change = _fma(vi, mom_m1, d)
    vi = vi + change
    v[i] = vi
    si = keep_vsum[i] = vsum[i]
    si = si + change
    vsum[i] = si
    old[i] = wi
    w[i] = _fma(vi, s, wi)
    return (0 if abs(vi) <= limit else 1) + _bad(si)


@_serial_and_parallel("aaaaasssbbss")
def sasgd(g, w, mom_buf, keep_buf, old, scale, wd, mom, use_wd, use_mom, s, limit):
    bad = 0
    for i in prange(g.size):
        bad += _apply(_sasgd(i, g, w, wd, use_wd, scale), i, w, mom_buf, keep_buf, old, wd, mom, False, use_mom, s,
                      limit)
    return bad


@_serial_and_parallel("aaaaaaaassssbssssbbss")
def gap_aware(g, w, w_bak, v, keep_v, mom_buf, keep_buf, old, bias, eps, lr_max, one, use_gap, beta, rate, wd, mom,
              use_wd, use_mom, s, limit):
    bad = 0
    for i in prange(g.size):
        d = _gap_aware(i, g, w, w_bak, v, bias, eps, lr_max, one, use_gap)
        bad += _apply_tracked(d, i, w, mom_buf, keep_buf, v, keep_v, old, wd, mom, use_wd, use_mom, beta, rate, s, limit)
    return bad


@_serial_and_parallel("aaaaaaaassssssssbbss")
def gap_aware_grad(g, w, w_bak, v, keep_v, mom_buf, keep_buf, old, bias, eps, lr_max, one, beta, rate, wd, mom, use_wd,
                   use_mom, s, limit):
    bad = 0
    for i in prange(g.size):
        d, v_bad = _gap_aware_grad(i, g, w, w_bak, v, keep_v, mom_buf, bias, eps, lr_max, one, beta, rate, wd, use_wd,
                                   use_mom)
        bad += _apply(d, i, w, mom_buf, keep_buf, old, wd, mom, False, use_mom, s, limit) + v_bad
    return bad


@_serial_and_parallel("aaaaaaaasbssbss")
def dana(g, w, w_bak, v, keep_v, vsum, keep_vsum, old, lam, use_dc, mom_m1, wd, use_wd, s, limit):
    bad = 0
    for i in prange(g.size):
        bad += _dana(i, g, w, w_bak, v, keep_v, vsum, keep_vsum, old, lam, use_dc, mom_m1, wd, use_wd, s, limit)
    return bad


@njit(**_INLINE)
def _local_sgd(i, g, w, total, keep_total, b, keep_b, old, n, momentum_update, beta, alpha, use_alpha, s, limit):
    # Delayed Nesterov in the commit's sign (local_sgd.AsyncLocalSGD): total.add_(c); step = torch.div(c, n);
    # every N-th update b.mul_(beta).add_(total.div_(n)) (two roundings), step.add_(b, alpha) = fma(b, alpha,
    # step), total.zero_(); else (c > 0) step.add_(b, alpha) = fma; then w.add_(step, alpha=s) = fma
    gi = g[i]
    ti = keep_total[i] = total[i]
    ti = ti + gi
    step = gi / n
    if momentum_update:
        bi = keep_b[i] = b[i]
        bi = bi * beta + ti / n
        b[i] = bi
        step = _fma(bi, alpha, step)
        total[i] = 0
        state_bad = _bad(bi)
    else:
        total[i] = ti
        if use_alpha:
            step = _fma(b[i], alpha, step)
        state_bad = _bad(ti)
    wi = w[i]
    old[i] = wi
    w[i] = _fma(step, s, wi)
    return (0 if abs(step) <= limit else 1) + state_bad


@_serial_and_parallel("aaaaaaasbssbss")
def local_sgd(g, w, total, keep_total, b, keep_b, old, n, momentum_update, beta, alpha, use_alpha, s, limit):
    bad = 0
    for i in prange(g.size):
        bad += _local_sgd(i, g, w, total, keep_total, b, keep_b, old, n, momentum_update, beta, alpha, use_alpha, s,
                          limit)
    return bad


# max over i of (bits[i] & 0x7fffffff), bits the int32 view of a float32 vector: the largest
# magnitude's bit pattern, above 0x7f800000 for a NaN (an integer reduction: it vectorises
# without reordering float arithmetic).
@_serial_and_parallel("i")
def max_abs_bits(bits):
    top = 0
    for i in prange(bits.size):
        top = max(top, bits[i] & 0x7FFFFFFF)
    return top


_SAMPLE = {"a": lambda: np.ones(8, np.float32), "s": lambda: np.float32(0.5), "b": lambda: True,
           "i": lambda: np.ones(8, np.int32)}


def warm(name: str) -> tuple:
    """Compile (or load from numba's cache) one kernel pair for float32 vectors: (serial, parallel).
    One pair at a time, when a server first needs it: loading all nine from the cache took about 1 s,
    which every run paid at its start, even one whose rule has no fused kernel (agn, asgd)."""
    serial, parallel, kinds = KERNELS[name]
    for kernel in (serial, parallel):
        kernel(*(_SAMPLE[k]() for k in kinds))
    return serial, parallel
