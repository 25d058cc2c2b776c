"""Mechanism controls: rules built to have an algorithm's size but not its mechanism.

DC-ASGD-a adds to the gradient the term ``lam0/sqrt(ms[m]+eps) * g*g*(w - w_bak[m])``. It does two
things at once: it shapes the correction coordinate by coordinate with g*g (the diagonal of the Taylor
expansion, the compensation the paper claims), and, since its factor is positive, it pulls every weight
back towards the point worker m pulled (w_bak[m]): it damps. Each control below keeps some of this and
removes the rest, so that a gain of DC-ASGD-a over ASGD can be traced to its mechanism.

``dcasgd-a-scrambled`` is DC-ASGD-a with the signs of w - w_bak[m] scrambled per coordinate:

    g_c = g + lam0/sqrt(ms[m]+eps) * g*g*(s * (w - w_bak[m])),   s in {-1, +1}^n fixed

At every coordinate and every push the added term has exactly DC-ASGD-a's magnitude, but its sign
agrees with the delay's first-order effect on only a random half of the coordinates, so on average it
compensates nothing. A gain of DC-ASGD-a over ASGD that this control also shows is not delay
compensation. A fixed sign mask rather than a permutation of the coordinates keeps the rule
element-wise: chunked, sharded and the same size at every coordinate, not only in distribution. The mask
comes from a fixed seed, the same in every run, so that the control differs from DC-ASGD-a only in the
sign. It is not a placebo: with s = -1 the term pushes a weight further along its drift at
every push, so half of the weights are anti-damped, always the same half, and the control can diverge
where ASGD trains. A loss of the control is then no evidence for compensation; the two below tell.

``dcasgd-a-redrawn`` redraws the sign at every push t, independently per coordinate:

    g_c = g + lam0/sqrt(ms[m]+eps) * g*g*(s_t * (w - w_bak[m])),   s_t in {-1, +1}^n fresh at every push

The same size as DC-ASGD-a at every coordinate and push, no compensation on average, and no weight
anti-damped systematically: its expected pull is zero at every push. The sign of coordinate i at push t
is a hash of (REDRAW_SEED, t, i) alone (``redrawn_signs``: splitmix64 of the key i + t*2**32, which each
weight keeps in the rule's state), the same in every run, at any thread count, on resume and however the
server splits the vector into chunks or shards: the rule stays element-wise. t counts the updates applied
(the versions: an update skipped as non-finite puts the keys back with the rest of the state).

``dcasgd-a-damped`` keeps the pull and drops the shape:

    c_t = mean_i(lam0/sqrt(ms[m]_i+eps) * g_i*g_i),   g_c = g + c_t * (w - w_bak[m])

ms[m] updated first, as in DC-ASGD-a. One scalar per push, DC-ASGD-a's factor averaged over the
coordinates: the same damping on average, not shaped by g*g. DC-ASGD-a ahead of this control is Taylor
compensation; level with it, plain damping of stale gradients. The mean is over every weight the server
holds, so the rule is not element-wise (the server runs it on whole vectors, never on chunks). On a
server split into shards (``--ps-shards K``, Ray) each shard averages over its own slice: K scalars per
push, each the mean of DC-ASGD-a's factor over that shard's weights.

The three keep DC-ASGD-a's hyper-parameters (lam0, ms_momentum, eps, and the server's momentum and
weight decay, which act on g_c afterwards) and run on the torch operators: no fused kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .._lazy import torch

from .dcasgd import DCASGDAdaptive
from .state import per_element

if TYPE_CHECKING:
    from torch import Tensor

SIGN_SEED = 31   # the control's one sign mask; any fixed value: no run's seed may steer the mask
REDRAW_SEED = 42   # the redrawn control's hash key; as SIGN_SEED, no run's seed may steer it


def sign_mask(n: int, device, dtype):
    """n signs, each -1 or +1 with probability 1/2, the same for every run of n weights."""
    bits = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(SIGN_SEED))
    return (bits * 2 - 1).to(device=device, dtype=dtype)


@dataclass(frozen=True)
class DCASGDAdaptiveScrambled(DCASGDAdaptive):
    """DC-ASGD-a with one fixed random sign per coordinate on its Taylor term: the term's size, no compensation
    on average; it anti-damps half of the weights at every push. See the module."""
    name = "dcasgd-a-scrambled"
    summary = "control: DC-ASGD-a with the Taylor term's signs scrambled per coordinate (compensates nothing)"
    rule = ("ms[m] <- mom*ms[m] + (1-mom)*g*g;  "
            "w <- w - lr*(g + lam0/sqrt(ms[m]+eps) * g*g*(s*(w - w_bak[m]))), s a fixed random sign per weight")

    @dataclass
    class State(DCASGDAdaptive.State):
        sign: Tensor | None = per_element()   # the fixed sign of each weight (-1 or +1), read only

    def server_init(self, w, num_workers):
        state = super().server_init(w, num_workers)
        state.sign = sign_mask(w.numel(), w.device, w.dtype)
        return state

    def drift(self, state, w, worker, out):
        return super().drift(state, w, worker, out).mul_(state.sign)   # the sign scrambled per coordinate

    def fused_apply(self, state, w, worker, msg, tau, lr, old, keep=None):
        return None   # no fused kernel: the torch operators of DCASGDAdaptive.server_delta


# ---- the redrawn signs: a counter-based hash of (REDRAW_SEED, t, i) ---------------------------------------
PUSH = 1 << 32   # a sign key per weight: key = i + t*2**32 for weight i at push t, advanced by PUSH per push
_GOLDEN, _MIX1, _MIX2 = (np.uint64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def sign_keys(n: int, device):
    """The redrawn control's sign keys at push 0: 0, 1, ..., n-1 (int64). (A model of more than 2**32
    weights would give weight i + 2**32 at push t the sign of weight i at push t + 1.)"""
    return torch.arange(n, dtype=torch.int64, device=device)


def redrawn_signs(keys, dtype):
    """The signs, -1 or +1 in ``dtype``, of the weights whose sign keys are ``keys`` (a slice of
    ``sign_keys``, advanced by PUSH at every push): the top bit of splitmix64's output for
    REDRAW_SEED + key * 0x9E3779B97F4A7C15 (Steele, Lea, Flood 2014; Vigna's splitmix64.c), that is,
    the key-th draw of splitmix64 seeded with REDRAW_SEED. Distinct keys give distinct 64-bit outputs,
    and every output bit depends on every key bit. A function of (REDRAW_SEED, t, i) alone, in numpy's
    uint64 arithmetic, which wraps modulo 2**64 by definition (torch's int64 promises no wrap-around):
    the same bits on every machine and thread count, and a chunk or a shard gets the signs of its slice
    of the whole vector. Computed on the CPU (keys elsewhere are copied there and back)."""
    z = keys.detach().cpu().numpy().view(np.uint64) * _GOLDEN
    z += np.uint64(REDRAW_SEED)
    tmp = np.empty_like(z)
    for shift, mix in ((30, _MIX1), (27, _MIX2)):
        np.right_shift(z, np.uint64(shift), out=tmp)
        z ^= tmp
        z *= mix
    np.right_shift(z, np.uint64(31), out=tmp)
    z ^= tmp
    z >>= np.uint64(63)   # the top bit: 0 or 1
    return torch.from_numpy(z.view(np.int64)).mul_(2).sub_(1).to(device=keys.device, dtype=dtype)


@dataclass(frozen=True)
class DCASGDAdaptiveRedrawn(DCASGDAdaptive):
    """DC-ASGD-a with the Taylor term's sign redrawn per coordinate at every push: the term's size at every
    coordinate and push, no compensation and no systematic damping or anti-damping. Tests whether
    DC-ASGD-a's gain needs the term's sign at all. Element-wise: chunked and sharded alike."""
    name = "dcasgd-a-redrawn"
    summary = "control: DC-ASGD-a with the Taylor term's signs redrawn per coordinate at every push (neither " \
              "compensates nor anti-damps)"
    rule = ("ms[m] <- mom*ms[m] + (1-mom)*g*g;  "
            "w <- w - lr*(g + lam0/sqrt(ms[m]+eps) * g*g*(s_t*(w - w_bak[m]))), s_t a random sign per weight, "
            "redrawn at every push")
    # sign_key: i + t*2**32 (int64), which carries the push count t in every element: the server runs the
    # rule on chunks, each with its slice of the state, so a scalar counter would count chunks, not pushes
    server_writes = DCASGDAdaptive.server_writes + ("sign_key",)

    @dataclass
    class State(DCASGDAdaptive.State):
        sign_key: Tensor | None = per_element()   # each weight's sign key, i + t*2**32 (int64)

    def server_init(self, w, num_workers):
        state = super().server_init(w, num_workers)
        state.sign_key = sign_keys(w.numel(), w.device)
        return state

    def drift(self, state, w, worker, out):
        keys = state.sign_key
        super().drift(state, w, worker, out).mul_(redrawn_signs(keys, out.dtype))   # this push's signs
        keys.add_(PUSH)   # in place: the next push's (t + 1)
        return out

    def fused_apply(self, state, w, worker, msg, tau, lr, old, keep=None):
        return None   # no fused kernel: the torch operators of DCASGDAdaptive.server_delta, on chunks


def mean64(t) -> float:
    """The mean of ``t``, summed in float64 in an order fixed by its length alone: numpy's pairwise sum (one
    thread) on the CPU, where torch's own reduction splits the sum by thread (``numerics``); torch's on a GPU."""
    if t.device.type == "cpu":
        return float(np.mean(t.numpy(), dtype=np.float64))
    return float(t.mean(dtype=torch.float64))


@dataclass(frozen=True)
class DCASGDAdaptiveDamped(DCASGDAdaptive):
    """A pull towards w_bak[m] by one scalar per push, the mean of DC-ASGD-a's factor lam0/sqrt(ms+eps)*g*g:
    DC-ASGD-a's damping on average without its g*g shape. Tests Taylor compensation against plain
    damping. Not element-wise: whole vectors; on K server shards, one mean per shard (see the module)."""
    name = "dcasgd-a-damped"
    summary = "control: a scalar pull towards w_bak[m] of DC-ASGD-a's mean size (damping without the Taylor shape)"
    rule = ("ms[m] <- mom*ms[m] + (1-mom)*g*g;  c = mean_i(lam0/sqrt(ms[m]+eps) * g*g);  "
            "w <- w - lr*(g + c*(w - w_bak[m]))")

    def server_delta(self, state, w, worker, msg, tau, lr, out):
        # not @elementwise: c is a mean over every weight (whole vectors, never chunks)
        g = msg
        ms = state.mean_square[worker]
        ms.mul_(self.ms_momentum).addcmul_(g, g, value=1 - self.ms_momentum)
        torch.mul(g, g, out=out).div_(ms.add(self.eps).sqrt_())   # DC-ASGD-a's factor, without lam0
        c = self.lam0 * mean64(out)
        torch.add(g, self.drift(state, w, worker, out), alpha=c, out=out)   # g + c*(w - w_bak)
        return self.sgd_step(state, w, out, lr, out)

    def fused_apply(self, state, w, worker, msg, tau, lr, old, keep=None):
        return None   # no fused kernel (nor chunks): the torch operators of server_delta
