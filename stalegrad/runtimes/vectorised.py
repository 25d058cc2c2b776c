"""Vectorised simulation (``Simulator(vectorised=True)``, ``--vectorised``).

A worker's gradient depends only on the weights it pulled and on its own next
mini-batch, both fixed when it starts. So the simulator need not compute it
when the worker starts, nor one worker at a time: it keeps the started
workers waiting, and when the event loop pops a worker whose gradient is not
computed yet, it computes the gradients of that worker and of the workers
waiting longest (up to a group) in one batched call, ``torch.func.vmap`` over
``grad_and_value`` of the model's ``functional_call``, on their stacked weights
and mini-batches. Under round robin that is a group's gradients every group of
events.

The commit and elastic rules (agn, downpour, dynsgd, easgd, aeasgd;
``Algorithm.batched_compute``) are batched the same way, a whole window at a
time: a worker's window depends only on what it pulled (or, elastic, on its own
weights), its optimizer state and its own mini-batches. Their states are
stacked (``stack_states``: weights and Adam moments to (K, n), Adam's step
counts to one per row), the algorithm's own ``worker_compute`` runs ``window``
batched steps (``local_opt.step`` on (K, n), each row the step that worker
would take alone) with batched gradients, and the states are written back.
The learning rate of a group is the one at its first pop, so this needs a
constant learning rate.

Everything else is the one-by-one event loop (``events.EventLoop``): the same
heap, the same delay draws, the same pulls (and snapshots) at the same
versions, and the server applies the pushes one at a time, in event order. The
result equals the one-by-one mode's to floating-point tolerance (batched
matrix products sum in another order); ``tests/test_vectorised.py`` checks the
final weights and the (worker, tau) sequence.

BatchNorm: each gradient uses its own mini-batch's statistics, as in the
one-by-one mode. The running statistics that the one-by-one mode updates in
every forward pass are updated here from each mini-batch's mean and variance,
collected during the batched call and folded in (every local step's, in order)
when that worker's event is popped, so evaluations in between see the same
statistics.

Scope: the gradient algorithms (sgd, ssgd, asgd, dcasgd-c, dcasgd-a, sasgd,
gap-aware, dana-zero, dana-dc, whose message is one gradient at the pulled
weights, DANA's look-ahead included: ``Algorithm.vectorisable``) and the commit
and elastic ones. Runs whose learning rate changes (commit rules),
models too large to stack two workers on the CPU (commit rules:
``CPU_STACK_BYTES``), trace replays (pulls at recorded versions), checkpoints
(they save the workers' streams mid-flight) and dropout (random numbers per
worker) run one worker at a time, as without the flag, and say so in the run's
notes (``summary.json``).
"""
from __future__ import annotations

import heapq

import torch
from torch import Tensor, nn

from ..core.delays import Trace
from ..core.worker import FlatModel
from .base import Training
from .events import EventLoop

# The stacked weights and gradients of one batched call stay under this many bytes; for windows of
# local steps, the stacked weights, gradients, optimizer state and temporaries.
GROUP_BYTES = 256 * 2**20
WINDOW_GROUP_BYTES = 1024 * 2**20
# On the CPU, a window's stacked vectors and their temporaries are allocated at every local step; glibc
# serves blocks above 32 MB with a fresh mmap, whose pages fault again at every step (measured: 5x the
# system time, 0.7 of the one-by-one speed for mlp at M = 40), so each stacked vector stays below this.
CPU_STACK_BYTES = 24 * 2**20


def unsupported(training: Training, delay, resume) -> str | None:
    """Why this run cannot be vectorised, or None."""
    algo = training.server.algorithm
    if not (algo.vectorisable and algo.pull_before_compute) and not algo.batched_compute:
        return (f"{algo.name} neither sends one gradient at the pulled weights nor batches its local steps "
                "(the gradient, commit and elastic rules do)")
    if algo.batched_compute and constant_lr(training) is not True:
        return "the learning rate changes during the run, and a batch of windows would use the rate at its start"
    if algo.batched_compute and window_group(training.worker_factory.model) < 2:
        return (f"one worker's weights ({4 * training.worker_factory.model.numel / 2**20:.0f} MB) leave no room "
                f"to stack two under {CPU_STACK_BYTES // 2**20} MB per vector on the CPU")
    if isinstance(delay, Trace) and not algo.synchronous:
        return "a trace replay pulls at recorded versions"
    if algo.stop_threshold(training.server.num_workers) is not None:
        return "its workers' computations are stopped mid-flight (stops on), and a batch computes them ahead"
    if resume is not None or training.checkpoint_every:
        return "checkpoints record the workers' mini-batch streams one event at a time"
    model = training.worker_factory.model
    if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.module.modules()):
        return "the model has dropout, whose random draws differ between batched and one-by-one calls"
    return None


def window_group(model: FlatModel) -> int:
    """How many workers' windows one batched computation stacks."""
    group = WINDOW_GROUP_BYTES // (4 * 8 * model.numel)   # weights, gradients, pulled, optimizer state, temporaries
    if model.flat.device.type == "cpu":
        group = min(group, CPU_STACK_BYTES // (4 * model.numel))
    return group


def constant_lr(training: Training) -> bool | None:
    """Whether the learning rate stays the same all run (None: this training run does not say)."""
    milestones = getattr(getattr(training, "schedule", None), "milestones", None)
    return None if milestones is None else not milestones


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
    """The event loop, with the computations of all waiting workers run as one batched computation:
    their gradients (gradient rules), or their windows of local steps (``batched_compute`` rules)."""

    def __init__(self, training: Training, delay, step_time, rng):
        super().__init__(training, delay, step_time, rng)
        model = training.worker_factory.model
        self.x, self.y = training.worker_factory.x, training.worker_factory.y
        self.batch_size = training.worker_factory.batch_size
        self.grad = BatchedGradient(model)
        self.waiting: list[int] = []        # started; not computed yet (in start order)
        # m -> (loss, computed, batch statistics of each step, training accuracy), not pushed yet
        self.ready: dict[int, tuple] = {}
        # the stacked vectors of one batched call: weights and gradients, plus for a window the pulled
        # weights, the optimizer state, its temporaries and the commit
        self.group = max(1, GROUP_BYTES // (8 * model.numel))
        if self.algo.batched_compute:
            self.group = window_group(model)

    def start(self, m: int) -> None:
        super().start(m)
        self.waiting.append(m)

    def gradients(self, ms: list[int], W: Tensor):
        """Each worker's next mini-batch, and the loss and gradient of row k of W on worker ms[k]'s."""
        idx = torch.cat([self.workers[m].stream.next() for m in ms]).to(self.x.device)
        x = self.x.index_select(0, idx)   # the rows each worker's grad_fn would gather
        y = self.y.index_select(0, idx)
        K = len(ms)
        return self.grad(W, x.view(K, -1, *x.shape[1:]), y.view(K, -1))

    def compute_waiting(self, m: int) -> None:
        """Compute worker m's message together with those of the workers that started first (up to a group)."""
        waiting = self.waiting
        waiting.remove(m)
        ms = [m] + waiting[:self.group - 1]
        del waiting[:self.group - 1]
        if self.algo.batched_compute:
            self.compute_windows(ms)
            return
        losses, grads, stats, correct = self.gradients(ms, torch.stack([self.pulled[k] for k in ms]))
        accs = (correct.double() / self.batch_size).tolist()
        for i, (k, loss) in enumerate(zip(ms, losses.tolist())):
            self.ready[k] = (loss, grads[i], [[(mean[i], var[i]) for mean, var in stats]], accs[i])

    def compute_windows(self, ms: list[int]) -> None:
        """The local steps of workers ms, stacked: each row the window that worker would run alone."""
        algo = self.algo
        states = [self.workers[m].state for m in ms]
        batched = algo.stack_states(states)
        pulled = torch.stack([self.pulled[m] for m in ms]) if algo.pull_before_compute else None
        steps = []   # the batch statistics of each local step
        correct = 0  # each worker's correct predictions over its window

        def grad_fn(W):
            nonlocal correct
            losses, grads, stats, right = self.gradients(ms, W)
            steps.append(stats)
            correct = correct + right
            return losses.double(), grads   # one by one, the mean loss is a sum of Python floats

        losses, computed = algo.worker_compute(batched, pulled, grad_fn, self.training.lr)
        algo.unstack_states(batched, states)
        accs = (correct.double() / (len(steps) * self.batch_size)).tolist()
        for k, (m, loss) in enumerate(zip(ms, losses.tolist())):
            self.ready[m] = (loss, None if computed is None else computed[k],
                             [[(mean[k], var[k]) for mean, var in stats] for stats in steps], accs[k])

    def run(self) -> None:
        training = self.training
        while not training.done:
            self.now, _, m = heapq.heappop(self.heap)
            if m not in self.ready:
                self.compute_waiting(m)
            loss, computed, steps, train_acc = self.ready.pop(m)
            if self.grad.norms:
                for stats in steps:
                    self.grad.fold_running_stats(stats)
            self.deliver(m, loss, computed, training.lr, train_acc)
            self.pace()
