"""Vectorised simulation (``Simulator(vectorised=True)``, ``--vectorised``).

A worker's gradient depends only on the weights it pulled and on its own next
mini-batch, both fixed when it starts. So the simulator need not compute it
when the worker starts, nor one worker at a time: it keeps the started
workers waiting, and when the event loop pops a worker whose gradient is not
computed yet, it computes the gradients of *all* waiting workers in one
batched call, ``torch.func.vmap`` over ``grad_and_value`` of the model's
``functional_call``, on their stacked weights and mini-batches. Under round
robin that is M workers' gradients every M events.

Everything else is the one-by-one event loop (``events.EventLoop``): the same
heap, the same delay draws, the same pulls (and snapshots) at the same
versions, and the server applies the pushes one at a time, in event order. The
result equals the one-by-one mode's to floating-point tolerance (batched
matrix products sum in another order); ``tests/test_vectorised.py`` checks the
final weights and the (worker, tau) sequence.

BatchNorm: each gradient uses its own mini-batch's statistics, as in the
one-by-one mode. The running statistics that the one-by-one mode updates in
every forward pass are updated here from each mini-batch's mean and variance,
collected during the batched call and folded in when that worker's event is
popped, so evaluations in between see the same statistics.

Scope: the gradient algorithms (sgd, ssgd, asgd, dcasgd-c, dcasgd-a), whose
message is one gradient at the pulled weights (``Algorithm.vectorisable``). Commit and elastic algorithms
(agn, downpour, dynsgd, easgd, aeasgd) take local steps that depend on each
other, trace replays pull at recorded versions, checkpoints save the streams
of the workers mid-flight, and dropout draws random numbers per worker: for
those the simulator runs one worker at a time, as without the flag, and says
so in the run's notes (``summary.json``).
"""
from __future__ import annotations

import heapq

import torch
from torch import Tensor, nn

from ..delays import Trace
from ..worker import FlatModel
from .base import Training
from .events import EventLoop

# The stacked weights and gradients of one batched call stay under this many bytes.
GROUP_BYTES = 256 * 2**20


def unsupported(training: Training, delay, resume) -> str | None:
    """Why this run cannot be vectorised, or None."""
    algo = training.server.algorithm
    if not (algo.vectorisable and algo.pull_before_compute):
        return (f"{algo.name} does not send one gradient at the pulled weights (only sgd, ssgd, asgd, "
                "dcasgd-c and dcasgd-a do)")
    if isinstance(delay, Trace) and not algo.synchronous:
        return "a trace replay pulls at recorded versions"
    if resume is not None or training.checkpoint_every:
        return "checkpoints record the workers' mini-batch streams one event at a time"
    model = training.worker_factory.model
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.module.modules()):
        return "the model has dropout, whose random draws differ between batched and one-by-one calls"
    return None


class BatchedGradient:
    """Loss and flat gradient of a FlatModel's module for K weight vectors at once.

    ``__call__(W, X, Y)``: W is (K, n) flat weights, X (K, B, ...) and Y (K, B)
    K mini-batches; returns the K mean losses, the (K, n) gradients, per
    BatchNorm layer with running statistics the (K, C) batch means and
    unbiased variances, and the K mini-batches' numbers of correct predictions.

    ``vmap`` over ``grad_and_value`` of the loss of ``functional_call``, with
    the parameters given as (K, *shape) views of W, one per parameter: that is
    faster than slicing one (K, n) input inside the transformed function
    (whose backward zero-fills a (K, n) gradient per parameter).
    """

    def __init__(self, model: FlatModel):
        from torch.func import functional_call, grad_and_value, vmap

        module = model.module
        self.module = module
        self.layout = []
        offset = 0
        for name, p in module.named_parameters():
            if p.requires_grad:
                self.layout.append((name, offset, offset + p.numel(), p.shape))
                offset += p.numel()
        if offset != model.numel:
            raise ValueError("the model's trainable parameters do not match its flat vector")
        self.norms = [m for m in module.modules()
                      if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
        self._stats: list = []

        def loss(params: dict, x: Tensor, y: Tensor):
            self._stats = []
            logits = functional_call(module, params, (x,))
            # cross-entropy as log_softmax + gather: under vmap F.cross_entropy's nll_loss runs a
            # Python decomposition, ~20% of a small model's batched call
            out = -logits.log_softmax(-1).gather(-1, y.unsqueeze(-1)).mean()
            correct = (logits.detach().argmax(-1) == y).sum()
            return out, (tuple(self._stats), correct)

        self._batched = vmap(grad_and_value(loss, has_aux=True), randomness="error")

    def _collect(self, norm, args) -> None:
        # The input of a BatchNorm layer: its batch statistics, as its running update would use them.
        x = args[0].detach()
        dims = [d for d in range(x.dim()) if d != 1]
        self._stats.append((x.mean(dims), x.var(dims, unbiased=True)))

    def __call__(self, W: Tensor, X: Tensor, Y: Tensor):
        K = W.shape[0]
        params = {name: W[:, a:b].view(K, *shape) for name, a, b, shape in self.layout}
        self.module.train()
        hooks = [m.register_forward_pre_hook(self._collect) for m in self.norms]
        for m in self.norms:            # batch statistics only: the running ones are folded in later
            m.track_running_stats = False
        try:
            grads, (losses, (stats, correct)) = self._batched(params, X, Y)
        finally:
            for m in self.norms:
                m.track_running_stats = True
            for h in hooks:
                h.remove()
        flat = torch.cat([grads[name].reshape(K, -1) for name, *_ in self.layout], dim=1)
        return losses, flat, stats, correct

    def fold_running_stats(self, stats) -> None:
        """Update the running statistics with one mini-batch's ((mean, var) per layer), as F.batch_norm does."""
        with torch.no_grad():
            for m, (mean, var) in zip(self.norms, stats):
                m.num_batches_tracked.add_(1)
                f = m.momentum if m.momentum is not None else 1.0 / float(m.num_batches_tracked)
                m.running_mean.mul_(1 - f).add_(mean, alpha=f)
                m.running_var.mul_(1 - f).add_(var, alpha=f)


class VectorisedLoop(EventLoop):
    """The event loop, with every waiting worker's gradient computed in one batched call."""

    def __init__(self, training: Training, delay, step_time, rng):
        super().__init__(training, delay, step_time, rng)
        model = training.worker_factory.model
        self.x, self.y = training.worker_factory.x, training.worker_factory.y
        self.grad = BatchedGradient(model)
        self.waiting: list[int] = []        # started; gradient not computed yet (in start order)
        self.ready: dict[int, tuple] = {}   # m -> (loss, gradient, batch statistics, train acc), not pushed yet
        self.group = max(1, GROUP_BYTES // (8 * model.numel))   # weights + gradients of one call

    def start(self, m: int) -> None:
        super().start(m)
        self.waiting.append(m)

    def compute_waiting(self) -> None:
        waiting = self.waiting
        for i in range(0, len(waiting), self.group):
            ms = waiting[i:i + self.group]
            idx = torch.cat([self.workers[m].stream.next() for m in ms]).to(self.x.device)
            x = self.x.index_select(0, idx)   # the rows each worker's grad_fn would gather
            y = self.y.index_select(0, idx)
            K = len(ms)
            W = torch.stack([self.pulled[m] for m in ms])
            losses, grads, stats, correct = self.grad(W, x.view(K, -1, *x.shape[1:]), y.view(K, -1))
            accs = (correct.double() / y.shape[0] * K).tolist()
            for k, (m, loss) in enumerate(zip(ms, losses.tolist())):
                self.ready[m] = (loss, grads[k], [(mean[k], var[k]) for mean, var in stats], accs[k])
        waiting.clear()

    def run(self) -> None:
        training, server = self.training, self.server
        while not training.done:
            self.now, _, m = heapq.heappop(self.heap)
            if m not in self.ready:
                self.compute_waiting()
            loss, g, stats, train_acc = self.ready.pop(m)
            if stats:
                self.grad.fold_running_stats(stats)
            worker = self.workers[m]
            lr = training.lr
            server.push(m, worker.message(self.pulled[m], g), lr)
            training.after_push(worker.samples_per_message, loss, self.now, train_acc=train_acc)
            self.continue_after_push(m)
