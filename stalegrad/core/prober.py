"""The simulator's probes (``--probe-every K``): measure stale messages without changing the run.

``Prober.observe`` is the simulator's one hook, called with each message just
before the server applies it (``events.py``, ``vectorised.py``). On every K-th
server version it records one line of ``probes.jsonl`` (the math is in
``stalegrad.core.probes``):

- gradient rules (sgd, asgd, dcasgd-c, dcasgd-a): ``g_now``, the gradient at the
  server's current weights on the *same* mini-batch the worker used (its
  indices are read back from the worker's stream, never drawn again), and the
  relative error and cosine against it of the stale ``g``, of the DC-ASGD-c
  and DC-ASGD-a corrections, whichever rule trains, and of the first-order
  prediction ``g + H (w - w_bak)`` with the whole Hessian (one Hessian-vector
  product); on models where it is affordable, the Hessian diagonal at the
  pulled weights (exact for piecewise linear networks, Hutchinson's estimate
  otherwise) against ``g*g``, and the first-order prediction with it;
- every rule it supports: the cosine of the update (``-g`` or the commit) with
  minus the gradient of a fixed batch of training samples at the pulled
  weights, and with the previous update of another worker; the update's norm.

Probing never changes training: it computes with ``torch.func.functional_call``
on its own tensors (the model's flat weights and gradient buffer stay as they
are), restores the model's buffers and the torch RNG afterwards, and draws its
fixed batch and Hutchinson vectors from generators of its own.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, jacrev, vmap

from . import probes as pm
from .options import probe_kind
from ..algorithms import Algorithm, DCASGDAdaptive, DCASGDConstant

EVAL_BATCH = 512              # training samples of the fixed batch whose gradient points towards the minimum
HESSIAN_MAX = 1_000_000       # parameters up to which the probes compute a Hessian diagonal
HUTCHINSON_SAMPLES = 16
PROBE_SEED = 0x9E3779B9       # offsets the run's seed: the probes' own random streams
# Module types through which the logits are piecewise linear in every single weight.
PIECEWISE_LINEAR = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ReLU, nn.Flatten, nn.MaxPool1d, nn.MaxPool2d,
                    nn.MaxPool3d, nn.Identity)


def piecewise_linear(module: nn.Module) -> bool:
    """Whether ``module`` is a Sequential of layers whose logits are piecewise linear in each weight."""
    for m in module.modules():
        if any(True for _ in m.children()):
            if type(m) is not nn.Sequential:   # a custom forward may hide any nonlinearity
                return False
        elif isinstance(m, nn.Dropout):
            if m.p > 0:
                return False
        elif not isinstance(m, PIECEWISE_LINEAR):
            return False
    return True


class Prober:
    """Measures every ``every``-th server update of one simulated run (see the module docstring)."""

    def __init__(self, every: int, algorithm: Algorithm, module: nn.Module, x: Tensor, y: Tensor, seed: int,
                 num_workers: int, hessian: str | None = "auto", epoch=lambda: 0.0):
        self.every, self.algorithm, self.module, self.x, self.y = every, algorithm, module, x, y
        self.epoch = epoch   # the run's epoch now, for the records
        self.kind = probe_kind(algorithm)
        self.layout, offset = [], 0
        for name, p in module.named_parameters():
            if p.requires_grad:
                self.layout.append((name, offset, offset + p.numel(), p.shape))
                offset += p.numel()
        self.numel = offset
        gen = torch.Generator().manual_seed(seed + PROBE_SEED)
        self.eval_idx = torch.randperm(len(y), generator=gen)[:EVAL_BATCH].to(x.device)
        self.noise = torch.Generator().manual_seed(seed + 2 * PROBE_SEED)
        # The corrections measured whatever the rule: the training rule's own parameters when it is one,
        # else the defaults (dataclass fields of a frozen dataclass: read them from a default instance).
        c = algorithm if isinstance(algorithm, DCASGDConstant) else DCASGDConstant()
        a = algorithm if isinstance(algorithm, DCASGDAdaptive) else DCASGDAdaptive()
        self.lam, self.lam0, self.ms_momentum, self.eps = c.lam, a.lam0, a.ms_momentum, a.eps
        self.mean_square: list[Tensor | None] = [None] * num_workers
        self.last: tuple[Tensor, int] | None = None    # the latest update and its worker
        self.other: tuple[Tensor, int] | None = None   # the latest by a worker other than last's
        if hessian == "auto":
            hessian = None if self.kind != "gradient" or self.numel > HESSIAN_MAX else \
                ("exact" if piecewise_linear(module) else "hutchinson")
        self.hessian = hessian
        self.records: list[dict] = []

    def describe(self) -> dict:
        return {"every": self.every, "kind": self.kind, "hessian": self.hessian, "eval_batch": len(self.eval_idx),
                **({"lam": self.lam, "lam0": self.lam0, "ms_momentum": self.ms_momentum, "eps": self.eps}
                   if self.kind == "gradient" else {})}

    # ---- the hook ------------------------------------------------------------------
    def observe(self, m: int, worker, pulled: Tensor, msg: Tensor, server, lr: float) -> None:
        """Worker ``m``'s message ``msg``, computed from ``pulled``, is about to be pushed to ``server``."""
        # One pass, no allocation (an overflowing sum of finite values is merely not remembered).
        if not math.isfinite(float(msg.sum())):
            return   # the server skips it too
        ms = None
        if self.kind == "gradient":   # this worker's MeanSquare, pm.mean_square in place: every message counts
            ms = self.mean_square[m]
            if ms is None:
                ms = self.mean_square[m] = torch.zeros_like(msg)
            ms.mul_(self.ms_momentum).addcmul_(msg, msg, value=1 - self.ms_momentum)
        if server.version % self.every == 0:
            tau = server.version - server.pulled_version[m]
            record = {"update": server.version, "epoch": round(self.epoch(), 6), "worker": m, "tau": tau}
            update = -lr * msg if self.kind == "gradient" else msg
            with self._isolated():
                if self.kind == "gradient":
                    record.update(self._compensation(worker, pulled, msg, server.w, ms))
                record.update(self._alignment(m, pulled, update))
            self.records.append(record)
        self._remember(msg, m)

    # ---- what one probe measures ---------------------------------------------------
    def _compensation(self, worker, pulled: Tensor, g: Tensor, w: Tensor, ms: Tensor) -> dict:
        idx = worker.stream.last().to(self.x.device)
        x, y = self.x.index_select(0, idx), self.y.index_select(0, idx)
        g = g.detach().clone()   # a view of the model's gradient buffer in the one-by-one simulator
        g_now = self.gradient(w, x, y)
        out = {"drift": float(torch.linalg.vector_norm(w - pulled)), "norm_g_now": float(torch.linalg.vector_norm(g_now))}
        guesses = {"g": g, "dc_c": pm.dc_constant(g, w, pulled, self.lam),
                   "dc_a": pm.dc_adaptive(g, w, pulled, ms, self.lam0, self.eps),
                   # the whole first-order term H (w - w_bak), one Hessian-vector product: first order alone
                   "full_h": g + self.hessian_vector(pulled, x, y, w - pulled)}
        if self.hessian is not None:
            h = self.hessian_diagonal(pulled, x, y)
            guesses["taylor"] = pm.taylor(g, h, w, pulled)
            gg = g * g
            out["corr_h_gg"] = pm.pearson(h, gg)
            out["lam_fit"] = pm.best_scale(h, gg)
        for name, guess in guesses.items():
            out[f"err_{name}"] = pm.rel_error(guess, g_now)
            out[f"cos_{name}"] = pm.cosine(guess, g_now)
        return out

    def _alignment(self, m: int, pulled: Tensor, update: Tensor) -> dict:
        toward = -self.gradient(pulled, self.x.index_select(0, self.eval_idx), self.y.index_select(0, self.eval_idx))
        prev = self.last if self.last is not None and self.last[1] != m else self.other
        # prev is a message: a gradient rule's update is -lr times it, the same direction as this one's -lr*g
        sign = -1.0 if self.kind == "gradient" else 1.0
        return {"cos_eval": pm.cosine(update, toward),
                "cos_prev": pm.cosine(update, sign * prev[0]) if prev else None,
                "update_norm": float(torch.linalg.vector_norm(update))}

    def _remember(self, msg: Tensor, m: int) -> None:
        """Keep the latest message and the latest of another worker, in two buffers that swap roles."""
        if self.last is not None and self.last[1] != m:
            self.last, self.other = self.other, self.last
        buf = self.last[0] if self.last is not None else torch.empty_like(msg)
        self.last = (buf.copy_(msg), m)

    # ---- gradients and Hessian diagonals on the probes' own tensors ----------------
    def _params(self, w: Tensor) -> dict:
        return {name: w[a:b].view(shape) for name, a, b, shape in self.layout}

    def _loss(self, w: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(self.module, self._params(w), (x,)), y)

    def gradient(self, w: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """The mini-batch loss's gradient at flat weights ``w`` (a new tensor)."""
        leaf = w.detach().clone().requires_grad_(True)
        return torch.autograd.grad(self._loss(leaf, x, y), leaf)[0]

    def hessian_vector(self, w: Tensor, x: Tensor, y: Tensor, v: Tensor) -> Tensor:
        """H v, the mini-batch loss's Hessian at ``w`` times ``v`` (double backward)."""
        leaf = w.detach().clone().requires_grad_(True)
        grad = torch.autograd.grad(self._loss(leaf, x, y), leaf, create_graph=True)[0]
        return torch.autograd.grad(grad, leaf, v)[0].detach()

    def hessian_diagonal(self, w: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """The diagonal of the mini-batch loss's Hessian at ``w``: exact (Gauss-Newton, which equals it for a
        piecewise linear network) or Hutchinson's estimate, as ``self.hessian`` says."""
        w = w.detach()
        if self.hessian == "exact" and all(isinstance(m, nn.Linear) for m in self.module.modules()
                                           if any(True for _ in m.parameters(recurse=False))):
            return self._linear_ggn_diagonal(w, x)
        if self.hessian == "exact":
            def logits_one(v, x1):
                return functional_call(self.module, self._params(v), (x1.unsqueeze(0),))[0]
            per_sample = vmap(jacrev(logits_one), in_dims=(None, 0))
            total = torch.zeros_like(w)
            with torch.no_grad():
                classes = functional_call(self.module, self._params(w), (x[:1],)).shape[1]
            chunk = max(1, (1 << 24) // (classes * self.numel))
            for xc in x.split(chunk):
                with torch.no_grad():
                    probs = functional_call(self.module, self._params(w), (xc,)).softmax(-1)
                total += pm.softmax_ggn_diagonal(per_sample(w, xc).detach(), probs)
            return total / len(x)
        leaf = w.clone().requires_grad_(True)
        grad = torch.autograd.grad(self._loss(leaf, x, y), leaf, create_graph=True)[0]
        def hvp(z):
            return torch.autograd.grad(grad, leaf, z, retain_graph=True)[0]
        return pm.hutchinson_diagonal(hvp, self.numel, HUTCHINSON_SAMPLES, self.noise, w).detach()

    def _linear_ggn_diagonal(self, w: Tensor, x: Tensor) -> Tensor:
        """The Gauss-Newton diagonal of a network whose only weights are Linear layers, one backward pass
        per class: for weight (i, j) of a layer with input a and output z, sum_b a_bj^2 v_bi with
        v_b = sum_c p_bc D_bc^2 - (sum_c p_bc D_bc)^2, D_bc = d logit_bc / d z_b (samples are independent)."""
        seen: dict[str, tuple[Tensor, Tensor]] = {}
        hooks = [m.register_forward_hook(lambda mod, args, out, name=name: seen.__setitem__(name, (args[0], out)))
                 for name, m in self.module.named_modules() if isinstance(m, nn.Linear)]
        try:
            logits = functional_call(self.module, self._params(w.clone().requires_grad_(True)), (x,))
        finally:
            for h in hooks:
                h.remove()
        probs = logits.detach().softmax(-1)
        names = list(seen)
        outs = [seen[n][1] for n in names]
        first = [torch.zeros_like(o) for o in outs]
        mixed = [torch.zeros_like(o) for o in outs]
        for c in range(logits.shape[1]):
            grads = torch.autograd.grad(logits[:, c].sum(), outs, retain_graph=True)
            p = probs[:, c:c + 1]
            for k, d in enumerate(grads):
                first[k] += p * d * d
                mixed[k] += p * d
        total = torch.empty_like(w)
        where = {name: (a, b) for name, a, b, _ in self.layout}
        for k, name in enumerate(names):
            v = first[k] - mixed[k] * mixed[k]                      # (B, out)
            a_in = seen[name][0].detach().flatten(1)
            prefix = f"{name}." if name else ""
            a, b = where[prefix + "weight"]
            total[a:b] = (v.t() @ (a_in * a_in)).reshape(-1)
            if prefix + "bias" in where:
                a, b = where[prefix + "bias"]
                total[a:b] = v.sum(0)
        return total / len(x)

    @contextlib.contextmanager
    def _isolated(self):
        """The torch RNG (dropout draws), the model's buffers (BatchNorm statistics) and its mode as they were."""
        rng = torch.get_rng_state()
        cuda = torch.cuda.get_rng_state_all() if self.x.is_cuda else None
        buffers = [(b, b.clone()) for b in self.module.buffers()]
        training = self.module.training
        self.module.train()
        try:
            yield
        finally:
            for b, saved in buffers:
                b.copy_(saved)
            self.module.train(training)
            torch.set_rng_state(rng)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)

