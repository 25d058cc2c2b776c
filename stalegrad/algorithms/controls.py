"""Mechanism controls: rules built to have an algorithm's size but not its mechanism.

``dcasgd-a-scrambled`` is DC-ASGD-a with the signs of w - w_bak[m] scrambled per coordinate:

    g_c = g + lam0/sqrt(ms[m]+eps) * g*g*(s * (w - w_bak[m])),   s in {-1, +1}^n fixed

At every coordinate and every push the added term has exactly DC-ASGD-a's magnitude, but its sign
agrees with the delay's first-order effect on only a random half of the coordinates, so on average it
compensates nothing. A gain of DC-ASGD-a over ASGD that this control also shows is not delay
compensation (issue 31). A fixed sign mask rather than a permutation of the coordinates keeps the rule
element-wise: chunked, sharded and the same size at every coordinate, not only in distribution. The mask
comes from a fixed seed, the same in every run, so that the control differs from DC-ASGD-a only in the
sign.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._lazy import torch

from .dcasgd import DCASGDAdaptive

SIGN_SEED = 31   # the control's one sign mask; any fixed value: no run's seed may steer the mask


def sign_mask(n: int, device, dtype):
    """n signs, each -1 or +1 with probability 1/2, the same for every run of n weights."""
    bits = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(SIGN_SEED))
    return (bits * 2 - 1).to(device=device, dtype=dtype)


@dataclass(frozen=True)
class DCASGDAdaptiveScrambled(DCASGDAdaptive):
    name = "dcasgd-a-scrambled"
    summary = "control: DC-ASGD-a with the Taylor term's signs scrambled per coordinate (compensates nothing)"
    rule = ("ms[m] <- mom*ms[m] + (1-mom)*g*g;  "
            "w <- w - lr*(g + lam0/sqrt(ms[m]+eps) * g*g*(s*(w - w_bak[m]))), s a fixed random sign per weight")
    per_element_state = DCASGDAdaptive.per_element_state + ("sign",)

    def server_init(self, w, num_workers):
        state = super().server_init(w, num_workers)
        state["sign"] = sign_mask(w.numel(), w.device, w.dtype)
        return state

    def drift(self, state, w, worker, out):
        return super().drift(state, w, worker, out).mul_(state["sign"])   # the sign scrambled per coordinate

    def fused_apply(self, state, w, worker, msg, tau, lr, old):
        return None   # no fused kernel: the torch operators of DCASGDAdaptive.server_delta
