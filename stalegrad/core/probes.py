"""The math of the simulator's probes (``--probe-every K``): small pure functions on flat vectors.

The probes answer the two papers' own questions for one stale message, which
only a simulator can: it can recompute, on the *same* mini-batch, the gradient
``g_now`` at the server's current weights ``w``, that the worker would have sent
had it not been stale (``stalegrad.core.prober`` gathers the vectors; this module
only computes).

DC-ASGD (Zheng et al. 2017) approximates ``g_now`` by a first-order Taylor
step from the weights ``w_bak`` the worker pulled, with ``lam * g*g`` for the
Hessian's diagonal. Two approximations are in there, measured apart:
``taylor(g, h, w, w_bak)`` with the exact diagonal ``h`` is the first-order
error alone; ``dc_constant``/``dc_adaptive`` add the ``g*g`` one.

AGN (Hermans et al. 2017) argues that averaged accumulated commits are better
aligned with the direction towards the minimum, and with each other, than
single gradients: ``cosine`` of the update with minus the gradient of a large
fixed batch, and with the previous update of another worker.
"""
from __future__ import annotations

import math

from .._lazy import torch


def rel_error(x, ref) -> float:
    """|x - ref| / |ref| (0 when both are 0; inf when only ref is)."""
    diff = float(torch.linalg.vector_norm(x - ref))
    scale = float(torch.linalg.vector_norm(ref))
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


def cosine(a, b) -> float:
    """<a, b> / (|a| |b|); NaN when either is zero (no direction)."""
    a, b = a.double(), b.double()   # in float64, norms by the same dot: cosine(u, u) is 1 to 1e-15
    aa, bb = float(torch.dot(a, a)), float(torch.dot(b, b))
    if aa == 0.0 or bb == 0.0:
        return math.nan
    return max(-1.0, min(1.0, float(torch.dot(a, b)) / math.sqrt(aa * bb)))


def dc_constant(g, w, w_bak, lam: float):
    """DC-ASGD-c's corrected gradient ``g + lam * g*g*(w - w_bak)``."""
    return g + lam * g * g * (w - w_bak)


def mean_square(ms, g, momentum: float):
    """DC-ASGD-a's MeanSquare after message ``g``: ``momentum*ms + (1-momentum)*g*g`` (a new tensor)."""
    return ms * momentum + (1 - momentum) * g * g


def dc_adaptive(g, w, w_bak, ms, lam0: float, eps: float):
    """DC-ASGD-a's corrected gradient ``g + lam0/sqrt(ms+eps) * g*g*(w - w_bak)``, ``ms`` already updated."""
    return g + lam0 / torch.sqrt(ms + eps) * g * g * (w - w_bak)


def taylor(g, hessian_diagonal, w, w_bak):
    """The first-order prediction of ``g_now`` with a Hessian diagonal: ``g + h*(w - w_bak)``."""
    return g + hessian_diagonal * (w - w_bak)


def pearson(a, b) -> float:
    """Pearson correlation of two vectors' elements; NaN when either is constant."""
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    na, nb = float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b))
    if na == 0.0 or nb == 0.0:
        return math.nan
    return float(torch.dot(a, b)) / (na * nb)


def best_scale(target, approx) -> float:
    """The least-squares ``s`` of ``target ~ s * approx``: the lambda that ``g*g`` would need
    to best fit the Hessian diagonal (NaN when ``approx`` is zero)."""
    denom = float(torch.dot(approx.double(), approx.double()))
    return float(torch.dot(target.double(), approx.double())) / denom if denom else math.nan


def softmax_ggn_diagonal(jacobians, probs):
    """sum_b of the diagonal of J_b^T (diag(p_b) - p_b p_b^T) J_b, the Gauss-Newton matrix of the
    cross-entropy loss, for per-sample logit Jacobians ``jacobians`` (B, C, n) and softmax
    probabilities ``probs`` (B, C). Divide by the batch size for a mean loss.

    For a network that is piecewise linear in each single weight (linear layers, ReLU, max-pooling:
    ``stalegrad.core.prober.piecewise_linear``) the logits have no second derivative along one weight, so
    this *is* the exact diagonal of the loss's Hessian, almost everywhere (tests check it against
    ``torch.func.hessian``).
    """
    p = probs.unsqueeze(-1)
    first = (p * jacobians * jacobians).sum(dim=(0, 1))
    mixed = (p * jacobians).sum(dim=1)
    return first - (mixed * mixed).sum(dim=0)


def hutchinson_diagonal(hvp, n: int, samples: int, generator, like):
    """Hutchinson's estimate ``mean_s z_s * H z_s`` of a Hessian's diagonal, ``z_s`` Rademacher
    vectors drawn from ``generator`` (the probes' own: the run's random streams stay untouched)."""
    total = torch.zeros(n, dtype=like.dtype, device=like.device)
    for _ in range(samples):
        z = (torch.randint(0, 2, (n,), generator=generator, dtype=like.dtype) * 2 - 1).to(like.device)
        total += z * hvp(z)
    return total / samples
