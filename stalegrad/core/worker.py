"""The worker side: a model over one flat weight vector, mini-batch streams,
the worker loop (pull, local steps, message) shared by every runtime, and the
factory that builds worker m the same way in any process.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import pickle
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..algorithms import Algorithm
from ..errors import ConfigError
from .options import parse_partition
from .server import to_device

TINY_BATCH = 16   # FlatModel.predict: fewer rows than this run at one thread (bits at any thread count)

class FlatModel:
    """A module whose parameters are views into one contiguous vector.

    Loading weights is one memory copy into the model's own vector, ``flat``; the gradient of a
    mini-batch lands in ``grad``, also one contiguous vector, because every ``param.grad`` is a view
    of it and autograd accumulates in place. For a mini-batch the model may instead compute at the
    caller's vector itself (``loss_and_grad``: no copy; see ``_use``).
    """

    def __init__(self, module: nn.Module, device: str | torch.device = "cpu"):
        self.module = module.to(device)
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        total = sum(p.numel() for p in params)
        self.flat = torch.empty(total, dtype=torch.float32, device=device)
        self.grad = torch.zeros(total, dtype=torch.float32, device=device)
        self._own = self.flat   # the model's own vector: what ``load`` copies into
        self._params, self._slices = params, []
        offset = 0
        for p in params:
            n = p.numel()
            self.flat[offset:offset + n].copy_(p.detach().reshape(-1))
            p.grad = self.grad[offset:offset + n].view_as(p)
            self._slices.append((offset, n))
            offset += n
        self._point(self.flat)
        self.numel = total
        self.correct: Tensor | None = None   # correct predictions of the last loss_and_grad batch
        self._training = None   # the mode this object last set (module.train() walks every submodule)

    def load(self, w: Tensor) -> None:
        """The model's weights become a copy of ``w``, in its own vector (evaluation, the module a run
        returns): nothing the caller does to ``w`` afterwards reaches the model."""
        if self.flat is not self._own:
            self._point(self._own)
        if w.data_ptr() != self._own.data_ptr():
            self._own.copy_(w)

    def _use(self, w: Tensor) -> None:
        """The model computes at ``w`` for one mini-batch. A vector laid out as the model's own (the
        CPU, float32, contiguous, of its size, at an address of the same alignment modulo 64 bytes: any
        vector that torch allocates) is used in place: the parameters become views of it, instead of a
        copy of 19 MB per local step for agn-mlp (AGN's ten steps per commit would each copy the worker's
        weights). The bits are those of a copy: the same values at the same alignment modulo
        any vector width of the CPU's kernels. ``load`` points the model back at its own vector before
        it next copies into it, so a vector used in place (such as a commit about to be pushed) is never
        written by the model."""
        if w.data_ptr() == self.flat.data_ptr():
            return
        if (w.device.type == "cpu" and w.dtype == torch.float32 and w.dim() == 1 and w.numel() == self.numel
                and w.is_contiguous() and not w.requires_grad and w.data_ptr() % 64 == self._own.data_ptr() % 64
                and self._own.device.type == "cpu"):
            self._point(w)
        else:
            self.load(w)

    def _point(self, w: Tensor) -> None:
        for p, (offset, n) in zip(self._params, self._slices):
            p.data = w[offset:offset + n].view_as(p)
        self.flat = w

    def loss_and_grad(self, w: Tensor, x: Tensor, y: Tensor) -> tuple[float, Tensor]:
        """Mini-batch loss and gradient at weights ``w`` (returns a view of ``grad``); the batch's
        number of correct predictions is left in ``correct`` (a tensor: no device sync here)."""
        self._use(w)
        if not (self._training and self.module.training):
            self.module.train()
            self._training = True
        self.grad.zero_()
        logits = self.module(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        self.correct = (logits.detach().argmax(1) == y).sum()
        return loss.item(), self.grad

    def predict(self, x: Tensor) -> Tensor:
        """The module's output on ``x``, with the same bits at any thread count: a chunk of fewer than
        ``TINY_BATCH`` rows runs at one thread. Torch's own gemm computes a product with a tiny output (an
        mlp's 10-class layer on 2 to 9 rows) by splitting its inner dimension over the threads, so at two
        threads the evaluation's last chunk (a validation set's tail) would give other bits than at one, and the
        simulator would have to run the whole run at one thread to keep them. One thread costs nothing here."""
        threads = torch.get_num_threads()
        if x.shape[0] >= TINY_BATCH or threads == 1:
            return self.module(x)
        torch.set_num_threads(1)
        try:
            return self.module(x)
        finally:
            torch.set_num_threads(threads)

    @torch.no_grad()
    def evaluate(self, w: Tensor, x: Tensor, y: Tensor, batch_size: int = 1000) -> tuple[float, float]:
        """(mean loss, accuracy) of weights ``w`` on a whole data set. The accuracy is NaN when any logit
        or the loss is not finite: the argmax of a NaN row is index 0, so counting it would score a
        diverged model as the share of class 0 instead of as failed."""
        self.load(w)
        self.module.eval()
        self._training = False
        loss_sum, correct, nonfinite = 0.0, 0, 0
        for i in range(0, len(y), batch_size):
            logits = self.predict(x[i:i + batch_size])
            target = y[i:i + batch_size]
            loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
            correct += (logits.argmax(1) == target).sum().item()
            nonfinite += (~torch.isfinite(logits)).sum().item()
        loss = loss_sum / len(y)
        return loss, (correct / len(y) if nonfinite == 0 and math.isfinite(loss) else math.nan)


@functools.lru_cache(maxsize=1)
def dealt(rows: int, seed: int) -> Tensor:
    """The one permutation of ``rows`` that shard and replicate:K deal out to the workers (never written: each
    stream copies its slice). Drawn once for a run's streams, not once a worker: M draws of N x K indices cost
    M times the time, and the freed permutations, fragmented by the workers' small tensors between them, held
    88 KB a worker (10,000 workers, replicate:4 of 4,096 samples: 885 MB against 129 MB; core/resources.py)."""
    return torch.randperm(rows, generator=torch.Generator().manual_seed(seed))


def dealt_slice(rows: int, worker: int, num_workers: int, seed: int) -> Tensor:
    """Worker ``worker``'s part of ``dealt(rows, seed)``: ``tensor_split(num_workers)[worker]`` (the first
    rows mod M parts one row longer), without making the other M - 1 views for every worker."""
    size, longer = divmod(rows, num_workers)
    return dealt(rows, seed).narrow(0, worker * size + min(worker, longer), size + (worker < longer))


class BatchStream:
    """An endless, deterministic stream of mini-batch indices for one worker.

    ``shard``: the worker owns a disjoint slice of a fixed permutation of the
    training set (dist-keras' partitions) and reshuffles it at every pass.
    ``iid``: every pass is a fresh permutation of the whole set.
    ``replicate:K``: the worker owns a slice of a fixed permutation of K copies of the
    set (the thesis's layout, ``config.parse_partition``), duplicates included.
    """

    def __init__(self, num_samples: int, worker: int, num_workers: int, batch_size: int,
                 partition: str = "shard", seed: int = 0):
        layout, copies = parse_partition(partition)
        if layout == "shard":
            self.pool = dealt_slice(num_samples, worker, num_workers, seed).clone()
        elif layout == "replicate":   # one permutation of the K copies' rows; row r is sample r mod N
            self.pool = dealt_slice(num_samples * copies, worker, num_workers, seed).remainder(num_samples)
        else:
            self.pool = torch.arange(num_samples)
        if batch_size > len(self.pool):
            raise ValueError(f"batch size {batch_size} is larger than worker {worker}'s {len(self.pool)} samples; "
                             "lower --batch-size or --workers, or use --partition iid")
        self.batch_size = batch_size
        self.rng = torch.Generator().manual_seed(seed * 1_000_003 + worker + 1)
        self.order = self.pool[torch.randperm(len(self.pool), generator=self.rng)]
        self.pos = 0

    def next(self) -> Tensor:
        pos, size, order = self.pos, self.batch_size, self.order
        if pos + size > order.shape[0]:
            # Start a new pass; the tail of the old one opens the next batch.
            fresh = self.pool.index_select(0, torch.randperm(self.pool.shape[0], generator=self.rng))
            order = self.order = fresh if pos == order.shape[0] else torch.cat([order[pos:], fresh])
            pos = 0
        self.pos = pos + size
        return order.narrow(0, pos, size)

    def last(self) -> Tensor:
        """The indices that the last ``next()`` returned (the probes recompute on that mini-batch)."""
        return self.order.narrow(0, self.pos - self.batch_size, self.batch_size)

    def extend(self, indices: Tensor) -> None:
        """Adopt more samples (a lost worker's shard): shuffled, they join the rest of
        the current pass and are part of every later pass."""
        indices = torch.as_tensor(indices, dtype=self.pool.dtype)
        self.pool = torch.cat([self.pool, indices])
        self.order = torch.cat([self.order, indices[torch.randperm(len(indices), generator=self.rng)]])

    def state_dict(self) -> dict:
        return {"pool": self.pool, "order": self.order, "pos": self.pos, "rng": self.rng.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.pool, self.order, self.pos = state["pool"], state["order"], int(state["pos"])
        self.rng.set_state(state["rng"])


class Worker:
    """One worker: its algorithm state, its mini-batches, and the model it uses.

    The loop every runtime runs, split where a runtime may wait in between:
    ``compute(pulled, lr)`` runs the local steps and returns ``(mean loss,
    computed)``; ``message(pulled, computed)`` builds what is pushed. A runtime
    pulls before ``compute`` or between the two (``algorithm.pull_before_compute``).
    """

    def __init__(self, worker_id: int, algorithm: Algorithm, model: FlatModel, x: Tensor, y: Tensor,
                 stream: BatchStream, w0: Tensor, num_workers: int):
        self.id = worker_id
        self.algorithm = algorithm
        self.model = model
        self.x, self.y = x, y
        self.stream = stream
        self.state = algorithm.worker_init(w0, num_workers)
        self.train_acc = float("nan")   # the accuracy of the last compute's mini-batches (as trained on)
        self._correct, self._seen = 0, 0

    @property
    def samples_per_message(self) -> int:
        return self.algorithm.steps_per_message * self.stream.batch_size

    def grad_fn(self, w: Tensor) -> tuple[float, Tensor]:
        idx = self.stream.next().to(self.x.device, non_blocking=True)
        # index_select: the same rows as x[idx], several times faster for image tensors
        out = self.model.loss_and_grad(w, self.x.index_select(0, idx), self.y.index_select(0, idx))
        self._correct += self.model.correct
        self._seen += idx.shape[0]
        return out

    def compute(self, pulled: Tensor | None, lr: float) -> tuple[float, object]:
        """The local steps from ``pulled``: (mean mini-batch loss, what ``message`` needs).
        Sets ``train_acc``, the accuracy on those steps' mini-batches, each at the weights it was
        trained on (the workers' training accuracy of Hermans et al.)."""
        self._correct, self._seen = 0, 0
        out = self.algorithm.worker_compute(self.state, pulled, self.grad_fn, lr)
        self.train_acc = float(self._correct) / self._seen if self._seen else float("nan")
        return out

    def message(self, pulled: Tensor | None, computed) -> Tensor:
        return self.algorithm.worker_finish(self.state, pulled, computed)

    # ---- checkpoints, in the style of torch.optim.Optimizer ------------------------
    def state_dict(self) -> dict:
        """The algorithm state (local optimizer, elastic weights) and the mini-batch stream."""
        return {"algorithm": self.state, "stream": self.stream.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.state = to_device(state["algorithm"], self.x.device)
        self.stream.load_state_dict(state["stream"])


@dataclass(frozen=True)
class WorkerFactory:
    """Builds worker m exactly the same way in this process or in another one.

    ``x``, ``y`` are the training set (on ``device``), ``w0`` the initial weights, ``model`` the
    run's own ``FlatModel``: in-process workers share it (and so its BatchNorm
    statistics) with the server's evaluation. A runtime that builds workers
    elsewhere replaces what does not travel (``dataclasses.replace``: shared
    copies of ``x`` and ``y``, ``model=None``) and passes each worker a model
    and its first weights.
    """
    algorithm: Algorithm
    num_workers: int
    batch_size: int
    partition: str
    seed: int
    x: Tensor
    y: Tensor
    w0: Tensor | None = None
    model: FlatModel | None = None
    device: str = "cpu"      # as configured: "cuda" without an index lets a runtime spread workers over GPUs

    @property
    def num_samples(self) -> int:
        return int(self.y.shape[0])

    def stream(self, m: int) -> BatchStream:
        return BatchStream(self.num_samples, m, self.num_workers, self.batch_size, self.partition, self.seed)

    def build(self, m: int, model: FlatModel | None = None, w0: Tensor | None = None) -> Worker:
        """Worker m over ``model`` (default: the run's), starting from ``w0`` (default: the initial weights)."""
        model = model if model is not None else self.model
        w0 = w0 if w0 is not None else self.w0
        if model is None or w0 is None:
            raise ValueError("this factory travelled without a model or weights: pass model= and w0=")
        device = model.flat.device
        return Worker(m, self.algorithm, model, self.x.to(device), self.y.to(device), self.stream(m), w0,
                      self.num_workers)

    def module_blob(self) -> bytes:
        """The run's model, pickled for a runtime that builds workers in other processes or on other
        machines (each one's FlatModel flattens it again)."""
        module = self.model.module
        clone = copy.deepcopy(module).cpu()
        for p in clone.parameters():   # own storages: the run's parameters are views of one flat vector
            p.data = p.data.clone()
            p.grad = None
        try:
            return pickle.dumps(clone)
        except Exception as e:
            raise ConfigError("model", f"cannot be pickled ({e}), and this runtime sends it to its workers by "
                                       f"pickling it; define {type(module).__name__} at module level") from None

    def portable(self, x: Tensor, y: Tensor) -> "WorkerFactory":
        """A copy for another process: the given (shared) data, no model, no weights."""
        return dataclasses.replace(self, x=x, y=y, w0=None, model=None)

