"""The numba loops behind ``fused`` (imported only when numba is installed).

Float32 in, float32 out, every operation in the order and rounding of the torch
operators of the rule it replaces (see each kernel's comment). ``fastmath`` stays off:
LLVM may not reorder or contract the arithmetic, so it vectorises the loop (AVX2 here)
without changing a bit. The finiteness count is an integer reduction, which needs no
reordering of float arithmetic either.

Each kernel applies its update in place, ``w[i] <- fma(t[i], s, w[i])`` (torch's
``w.add_(t, alpha=s)``), keeps the old ``w[i]`` in ``old[i]`` for the caller to put back
when the update turns out not to be finite, and returns how many ``t[i]`` are NaN or
above ``limit`` in magnitude (``s*t`` would overflow; see ``fused.finite_limit``).
"""
from __future__ import annotations

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


_JIT = dict(parallel=True, fastmath=False, cache=True, nogil=True)


@njit(inline="always")
def _apply(d, i, w, mom_buf, old, wd, mom, use_wd, use_mom, s, limit):
    """GradientAlgorithm.sgd_step on element i of direction d, then the add. torch.add(d, w,
    alpha=wd) is fma(w, wd, d); buf.mul_(mom).add_(d) rounds twice; w.add_(t, alpha=s) is fma."""
    wi = w[i]
    if use_wd:
        d = _fma(wi, wd, d)
    if use_mom:
        d = mom_buf[i] * mom + d
        mom_buf[i] = d
    old[i] = wi
    w[i] = _fma(d, s, wi)
    return 0 if abs(d) <= limit else 1


@njit(**_JIT)
def sgd(g, w, mom_buf, old, wd, mom, use_wd, use_mom, s, limit):
    bad = 0
    for i in prange(g.size):
        bad += _apply(g[i], i, w, mom_buf, old, wd, mom, use_wd, use_mom, s, limit)
    return bad


@njit(**_JIT)
def dcasgd_c(g, w, w_bak, mom_buf, old, lam, wd, mom, use_wd, use_mom, s, limit):
    # torch.sub(w, w_bak).mul_(g); torch.addcmul(g, x, g, value=lam) = fma(lam*x, g, g)
    # (torch's CPU addcmul compiles to one fused multiply-add; tests/test_fused.py pins it)
    bad = 0
    for i in prange(g.size):
        gi = g[i]
        x = (w[i] - w_bak[i]) * gi
        d = _fma(lam * x, gi, gi)
        bad += _apply(d, i, w, mom_buf, old, wd, mom, use_wd, use_mom, s, limit)
    return bad


@njit(**_JIT)
def dcasgd_a(g, w, w_bak, ms, mom_buf, old, lam0, ms_mom, ms_rate, eps, wd, mom, use_wd, use_mom, s, limit):
    # ms.mul_(m).addcmul_(g, g, value=1-m) = fma((1-m)*g, g, ms*m); torch.sub(w, w_bak).mul_(g).mul_(g);
    # torch.addcdiv(g, x, sqrt(ms + eps), value=lam0) = g + (lam0*x)/sqrt(ms + eps), no fma.
    # The square root is IEEE's (correctly rounded); torch's CPU sqrt (MKL's) is not always.
    bad = 0
    for i in prange(g.size):
        gi = g[i]
        m = _fma(ms_rate * gi, gi, ms[i] * ms_mom)
        ms[i] = m
        x = (w[i] - w_bak[i]) * gi * gi
        d = gi + lam0 * x / np.sqrt(m + eps)
        bad += _apply(d, i, w, mom_buf, old, wd, mom, use_wd, use_mom, s, limit)
    return bad


@njit(**_JIT)
def max_abs_bits(bits):
    """max over i of (bits[i] & 0x7fffffff), bits the int32 view of a float32 vector: the
    largest magnitude's bit pattern, above 0x7f800000 for a NaN (an integer reduction,
    which vectorises without reordering float arithmetic)."""
    top = 0
    for i in prange(bits.size):
        top = max(top, bits[i] & 0x7FFFFFFF)
    return top


def warm() -> dict:
    """Compile (or load from numba's cache) every kernel for float32 vectors; the kernels by name."""
    v = np.ones(8, np.float32)
    f, t = np.float32(0.5), True
    sgd(v, v.copy(), v.copy(), v.copy(), f, f, t, t, f, f)
    dcasgd_c(v, v.copy(), v, v.copy(), v.copy(), f, f, f, t, t, f, f)
    dcasgd_a(v, v.copy(), v, v.copy(), v.copy(), v.copy(), f, f, f, f, f, f, t, t, f, f)
    max_abs_bits(v.view(np.int32))
    return {"sgd": sgd, "dcasgd_c": dcasgd_c, "dcasgd_a": dcasgd_a, "max_abs_bits": max_abs_bits}
