"""``stalegrad.train``: wire a model, data, an algorithm and a runtime together.

``TrainingRun`` is everything a runtime shares: the parameter server, the
workers, the learning-rate schedule, the sample budget, evaluation and
metrics. A runtime only decides *when* each worker pulls, computes and pushes.
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from .algorithms import Algorithm, make_algorithm
from .schedules import LRSchedule
from .server import ParameterServer, StalenessLog
from .worker import PARTITIONS, BatchStream, FlatModel, Worker


@dataclass
class TrainResult:
    metrics: list[dict]
    staleness: dict
    summary: dict
    config: dict
    weights: Tensor
    model: nn.Module
    staleness_log: StalenessLog   # (worker, tau) of every applied update, in order

    def update_log(self) -> list[tuple[int, int]]:
        return list(zip(self.staleness_log.workers, self.staleness_log.taus))

    @property
    def final_accuracy(self) -> float:
        return self.summary["final_test_acc"]


@dataclass(frozen=True)
class WorkerSpec:
    """What defines worker m besides its model, data and initial weights.

    Small and picklable, so that a real runtime builds, in another process,
    exactly the worker that ``TrainingRun.make_worker`` builds here.
    """
    algorithm: Algorithm
    num_samples: int
    num_workers: int
    batch_size: int
    partition: str
    seed: int

    def build(self, m: int, model: FlatModel, x: Tensor, y: Tensor, w0: Tensor) -> Worker:
        stream = BatchStream(self.num_samples, m, self.num_workers, self.batch_size, self.partition, self.seed)
        return Worker(m, self.algorithm, model, x, y, stream, w0, self.num_workers)


def weights_sha256(w: Tensor) -> str:
    return hashlib.sha256(w.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()).hexdigest()


class TrainingRun:
    """The state of one training run that every runtime drives."""

    def __init__(self, *, module: nn.Module, train_data, test_data, algorithm: Algorithm, num_workers: int,
                 epochs: float, batch_size: int, schedule: LRSchedule, eval_every: float, partition: str,
                 seed: int, device: str, on_nonfinite: str, config: dict,
                 on_eval: Callable[[dict], None] | None = None, progress=None,
                 checkpoint_every: int = 0, checkpoint_path=None):
        self.algorithm = algorithm
        self.num_workers = num_workers
        self.device = device
        self.config = config
        self.schedule = schedule
        self.train_data, self.test_data = train_data, test_data
        self.model = FlatModel(module, device)
        self.server = ParameterServer(algorithm, self.model.flat, num_workers, on_nonfinite=on_nonfinite)
        self.train_x, self.train_y = train_data.x.to(device), train_data.y.to(device)
        self.test_x, self.test_y = test_data.x.to(device), test_data.y.to(device)
        self.num_samples = len(self.train_y)
        self.batch_size, self.partition, self.seed = batch_size, partition, seed
        self.workers = [self.make_worker(m, self.model) for m in range(num_workers)]
        self.sample_budget = int(round(epochs * self.num_samples))
        self.eval_interval = max(1, int(round(eval_every * self.num_samples)))
        self.samples = 0
        self.virtual_s = 0.0
        self.metrics: list[dict] = []
        self.notes: list[str] = []
        self.summary_extra: dict = {}   # runtime-specific entries of summary.json (local: workers_lost)
        # A runtime may set an evaluator: evaluate() then hands it a snapshot of the weights, and
        # the record joins self.metrics (in order) when the result comes back; see runtimes/local.py.
        self.evaluator = None
        self._next_eval = 0
        self._loss_sum, self._loss_count = 0.0, 0
        self._start = time.perf_counter()
        self._on_eval = on_eval
        self._progress = progress
        self.checkpoint_every = checkpoint_every
        self.checkpoint_path = checkpoint_path if checkpoint_every else None
        self._next_checkpoint = checkpoint_every

    # ---- checkpoints ------------------------------------------------------------
    def progress_state(self) -> dict:
        return {"samples": self.samples, "virtual_s": self.virtual_s, "metrics": self.metrics,
                "notes": self.notes, "next_eval": self._next_eval, "loss_sum": self._loss_sum,
                "loss_count": self._loss_count, "wall_s": self.wall_s(), "next_checkpoint": self._next_checkpoint}

    def load_progress_state(self, st: dict) -> None:
        self.samples, self.virtual_s = int(st["samples"]), float(st["virtual_s"])
        self.metrics, self.notes = list(st["metrics"]), list(st["notes"])
        self._next_eval, self._next_checkpoint = int(st["next_eval"]), int(st["next_checkpoint"])
        self._loss_sum, self._loss_count = float(st["loss_sum"]), int(st["loss_count"])
        self._start = time.perf_counter() - float(st["wall_s"])
        if self._progress is not None:
            self._progress.update(self.samples)

    def checkpoint_due(self) -> bool:
        return self.checkpoint_path is not None and self.server.version >= self._next_checkpoint

    def save_checkpoint(self, runtime_state: dict) -> None:
        """Write the whole state; runtimes call this when ``checkpoint_due()``."""
        from . import checkpoint
        checkpoint.save(self.checkpoint_path, checkpoint.capture(self, runtime_state))
        every = self.checkpoint_every
        self._next_checkpoint = (self.server.version // every + 1) * every

    @property
    def worker_spec(self) -> WorkerSpec:
        return WorkerSpec(self.algorithm, self.num_samples, self.num_workers, self.batch_size, self.partition,
                          self.seed)

    def make_worker(self, m: int, model: FlatModel) -> Worker:
        """Worker m as this run defines it (a real runtime builds it in its own process
        with ``worker_spec.build``)."""
        return self.worker_spec.build(m, model, self.train_x, self.train_y, self.server.w)

    # ---- what runtimes call ---------------------------------------------------
    @property
    def done(self) -> bool:
        return self.samples >= self.sample_budget

    @property
    def epoch(self) -> float:
        return self.samples / self.num_samples

    @property
    def lr(self) -> float:
        return self.schedule(self.epoch)

    def wall_s(self) -> float:
        return time.perf_counter() - self._start

    def after_push(self, samples: int, loss: float, virtual_s: float) -> None:
        """Account for one pushed message of ``samples`` samples and mean
        mini-batch ``loss``; evaluate when an interval is crossed."""
        self.samples += samples
        self.virtual_s = virtual_s
        if math.isfinite(loss):
            self._loss_sum += loss
            self._loss_count += 1
        if self._progress is not None:
            self._progress.update(samples)
        if self.samples >= self._next_eval and not self.done:
            self.evaluate()

    def evaluate(self) -> dict:
        """Evaluate the server's weights now, or, with an evaluator, a snapshot of them
        (the record is then completed and appended when the evaluator answers)."""
        if self.evaluator is None:
            test_loss, test_acc = self.model.evaluate(self.server.w, self.test_x, self.test_y)
        stal = self.server.staleness
        record = {
            "epoch": round(self.epoch, 6),
            "updates": self.server.version,
            "samples": self.samples,
            "wall_s": round(self.wall_s(), 4),
            "virtual_s": round(self.virtual_s, 6),
            "lr": self.lr,
            "train_loss": self._loss_sum / self._loss_count if self._loss_count else None,
            "test_loss": None,
            "test_acc": None,
            "tau_mean": stal.mean,
            "nonfinite_skipped": self.server.nonfinite_skipped,
        }
        self._loss_sum, self._loss_count = 0.0, 0
        while self._next_eval <= self.samples:
            self._next_eval += self.eval_interval
        if self.evaluator is None:
            self.record_evaluation(record, test_loss, test_acc)
        else:
            self.evaluator.submit(self.server.w, record)
        return record

    def record_evaluation(self, record: dict, test_loss: float, test_acc: float) -> None:
        """Complete ``record`` with its test figures and append it to the metrics."""
        record["test_loss"], record["test_acc"] = test_loss, test_acc
        self.metrics.append(record)
        if self._progress is not None:
            self._progress.set_postfix(epoch=f"{record['epoch']:.2f}", updates=record["updates"],
                                       loss=f"{test_loss:.4f}", acc=f"{test_acc:.4f}", refresh=False)
        if self._on_eval is not None:
            self._on_eval(record)

    def finish(self) -> TrainResult:
        if not self.metrics or self.metrics[-1]["samples"] != self.samples:
            self.evaluate()
        stal = self.server.staleness.summary()
        final = self.metrics[-1]
        summary = {
            "algorithm": self.algorithm.name,
            "workers": self.num_workers,
            "final_test_acc": final["test_acc"],
            "best_test_acc": max(m["test_acc"] for m in self.metrics),
            "final_test_loss": final["test_loss"],
            "epochs": round(self.epoch, 6),
            "wall_s": round(self.wall_s(), 4),
            "virtual_s": round(self.virtual_s, 6),
            "updates": self.server.version,
            "samples": self.samples,
            "tau_mean": stal["tau_mean"],
            "tau_max": stal["tau_max"],
            "nonfinite_skipped": self.server.nonfinite_skipped,
            "weights_sha256": weights_sha256(self.server.w),
            "notes": self.notes,
            **self.summary_extra,
        }
        self.model.load(self.server.w)
        return TrainResult(metrics=self.metrics, staleness=stal, summary=summary, config=self.config,
                           weights=self.server.w.clone(), model=self.model.module,
                           staleness_log=self.server.staleness)


def _resolve_model(model, input_shape, num_classes) -> nn.Module:
    from .models import build_model
    if isinstance(model, nn.Module):
        return model
    if isinstance(model, str):
        return build_model(model, input_shape, num_classes)
    if callable(model):
        built = model()
        if not isinstance(built, nn.Module):
            raise TypeError(f"the model factory returned {type(built).__name__}, not a torch.nn.Module")
        return built
    raise TypeError(f"model must be a torch.nn.Module, a factory, or a model name, not {type(model).__name__}")


def train(model, train_data, test_data, algorithm: Algorithm | str = "asgd", workers: int = 4,
          runtime=None, *, epochs: float = 1.0, batch_size: int = 128, lr: float | None = None,
          lr_milestones: tuple[float, ...] = (), lr_gamma: float = 0.1, eval_every: float = 1.0,
          partition: str = "shard", seed: int = 0, device: str = "cpu", on_nonfinite: str = "skip",
          on_start: Callable[[dict], None] | None = None, on_eval: Callable[[dict], None] | None = None,
          progress: bool = False, config: dict | None = None, checkpoint_every: int = 0,
          checkpoint_path=None, resume=None) -> TrainResult:
    """Train ``model`` with ``algorithm`` on ``workers`` workers; return the metrics.

    ``model`` is a ``torch.nn.Module``, a zero-argument factory, or a model
    name from ``stalegrad.models`` (built for the data's shape). The data sets
    are ``stalegrad.data.Dataset`` objects (anything with ``x``, ``y`` tensors
    works). ``runtime`` defaults to the deterministic simulator. ``lr``
    defaults to the algorithm's (0.1 for server SGD and local SGD, 0.001 for
    local Adam).

    ``checkpoint_every=N`` writes the complete state to ``checkpoint_path``
    every N server updates; ``resume=PATH`` continues from such a checkpoint
    (made with the same configuration) instead of starting afresh.
    """
    from .runtimes import make_runtime

    if isinstance(algorithm, str):
        algorithm = make_algorithm(algorithm)
    algorithm.validate()
    _check_positive_int("workers", workers)
    _check_positive_int("batch_size", batch_size)
    if not epochs > 0:
        raise ValueError(f"epochs must be > 0, got {epochs!r}")
    if not eval_every > 0:
        raise ValueError(f"eval_every must be > 0, got {eval_every!r}")
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
    if algorithm.sequential and workers != 1:
        raise ValueError(f"{algorithm.name} is sequential and runs exactly one worker; pass workers=1 "
                         "(or compare with asgd for M asynchronous workers)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available here; use device='cpu'")
    if not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be a non-negative integer (updates), got {checkpoint_every!r}")
    if checkpoint_every and checkpoint_path is None:
        raise ValueError("checkpoint_every needs a checkpoint_path to write to")
    runtime = make_runtime(runtime if runtime is not None else "sim", workers)
    schedule = LRSchedule(lr if lr is not None else default_lr(algorithm), tuple(lr_milestones), lr_gamma)

    torch.manual_seed(seed)
    num_classes = int(getattr(train_data, "num_classes", int(train_data.y.max()) + 1))
    module = _resolve_model(model, tuple(train_data.x.shape[1:]), num_classes)
    resolved = {
        "algorithm": algorithm.to_dict(), "workers": workers, "runtime": runtime.describe(),
        "epochs": epochs, "batch_size": batch_size, "lr": schedule.base, "lr_milestones": list(schedule.milestones),
        "lr_gamma": schedule.gamma, "eval_every": eval_every, "partition": partition, "seed": seed,
        "device": device, "on_nonfinite": on_nonfinite,
        "train_samples": len(train_data.y), "test_samples": len(test_data.y),
    }
    resolved.update(config or {})
    saved = None
    if resume is not None:
        from . import checkpoint
        saved = checkpoint.load(resume)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=int(round(epochs * len(train_data.y))), unit="sample", unit_scale=True,
                   desc=f"{algorithm.name} x{workers}", leave=False, dynamic_ncols=True)
    try:
        run = TrainingRun(module=module, train_data=train_data, test_data=test_data, algorithm=algorithm,
                          num_workers=workers, epochs=epochs, batch_size=batch_size, schedule=schedule,
                          eval_every=eval_every, partition=partition, seed=seed, device=device,
                          on_nonfinite=on_nonfinite, config=resolved, on_eval=on_eval, progress=bar,
                          checkpoint_every=checkpoint_every, checkpoint_path=checkpoint_path)
        if saved is not None:   # checked before on_start writes anything
            checkpoint.check_matches(resume, saved, run)
        if on_start is not None:   # (configuration, metrics so far: those of the checkpoint when resuming)
            on_start(resolved, list(saved["run"]["metrics"]) if saved is not None else [])
        if saved is None:
            run.evaluate()   # epoch 0: the initial weights
            runtime.run(run, seed=seed)
        else:
            runtime_state = checkpoint.restore(run, saved)
            runtime.run(run, seed=seed, resume=runtime_state)
        return run.finish()
    finally:
        if bar is not None:
            bar.close()


def default_lr(algorithm: Algorithm) -> float:
    return 0.001 if getattr(algorithm, "local_opt", "sgd") == "adam" else 0.1


def _check_positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
