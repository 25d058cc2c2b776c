"""``stalegrad.train``: wire a model, data, an algorithm and a runtime together.

``TrainingRun`` is everything a runtime shares: the parameter server, the
worker factory, the learning-rate schedule, the sample budget, evaluation and
metrics. A runtime (``runtimes/base.py`` is the contract) only decides *when*
each worker pulls, computes and pushes, and how the messages travel.
"""
from __future__ import annotations

import contextlib
import math
import time
from array import array
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import torch
from torch import Tensor, nn

from ..algorithms import Algorithm
from .config import RunConfig, default_lr, samples_of  # noqa: F401  (default_lr: part of the API)
from ..errors import ConfigError
from .model_check import check_arguments, check_checkpoint, check_model, num_classes, resolve_model
from ..models.init import initialise
from .progress import Progress, make_progress
from .ahead import plan_ahead
from .results import messages_tensor, weights_sha256
from ..core.options import check_stops
from ..core.resources import check_memory
from ..runtimes.base import Evaluator
from ..core.schedules import LRSchedule
from ..core.server import ParameterServer, StalenessLog
from .validation import evaluate_val, split_run, summary_figures
from ..core.worker import FlatModel, WorkerFactory


@dataclass
class TrainResult:
    """What ``train`` returns: the records of its run directory, in memory (``docs/run-directories.md``)."""
    metrics: list[dict]
    staleness: dict
    summary: dict
    config: dict
    weights: Tensor
    model: nn.Module
    staleness_log: StalenessLog   # (worker, tau) of every applied update, in order
    messages: list[dict] = ()     # one per pushed message: MESSAGE_FIELDS (messages.jsonl)
    probes: list[dict] | None = None   # with probe_every: one record per probe (stalegrad/core/prober.py)

    def update_log(self) -> list[tuple[int, int]]:
        return list(zip(self.staleness_log.workers, self.staleness_log.taus))

    @property
    def final_accuracy(self) -> float:
        return self.summary["final_test_acc"]


# One record per pushed message: the samples counted after it, when it arrived (wall and virtual
# seconds), and its worker's mean mini-batch loss and training accuracy over that message's local steps.
MESSAGE_FIELDS = ("samples", "wall_s", "virtual_s", "loss", "train_acc")


class TrainingRun:
    """The state of one training run that every runtime drives (``runtimes.base.Training``).

    It owns the parameter server, the model the server evaluates, the
    learning-rate schedule, the sample budget, evaluation, metrics and
    checkpoint files; a runtime owns the workers (built by ``worker_factory``)
    and decides when they pull and push.
    """

    def __init__(self, module: nn.Module, train_data, test_data, config: RunConfig, *,
                 on_eval: Callable[[dict], None] | None = None, progress: Progress | None = None,
                 checkpoint_path=None, resolved: dict | None = None, val_data=None,
                 on_first_step: Callable[[], None] | None = None):
        self.config = config                   # validated: see RunConfig.validate
        self.resolved = resolved if resolved is not None else config.to_dict()   # what config.json records
        self.algorithm = algorithm = config.algorithm
        device = config.device
        self.model = FlatModel(module, device)
        self.server = ParameterServer(algorithm, self.model.flat, config.workers, on_nonfinite=config.on_nonfinite)
        self.schedule = LRSchedule(config.lr, tuple(config.lr_milestones), config.lr_gamma)
        self.test_data = SimpleNamespace(x=test_data.x.to(device), y=test_data.y.to(device))
        self.val_data = None if val_data is None else SimpleNamespace(x=val_data.x.to(device), y=val_data.y.to(device))
        self.worker_factory = WorkerFactory(algorithm, config.workers, config.batch_size, config.partition,
                                            config.seed, train_data.x.to(device), train_data.y.to(device),
                                            w0=self.server.w.clone(), model=self.model, device=device)
        self.num_samples = len(train_data.y)
        self.sample_budget = samples_of("epochs", config.epochs, self.num_samples)
        self.eval_interval = max(1, samples_of("eval_every", config.eval_every, self.num_samples))
        self.checkpoint_path = checkpoint_path if config.checkpoint_every else None
        self.samples = 0
        self.virtual_s = 0.0
        self.metrics: list[dict] = []
        self.notes: list[str] = []
        self.figures: dict = {}     # what runtimes report for summary.json (note(**figures))
        self._next_eval = 0
        self._next_checkpoint = config.checkpoint_every
        self._loss_sum, self._loss_count = 0.0, 0
        self._acc_sum, self._acc_samples = 0.0, 0
        self._messages = [array("d") for _ in MESSAGE_FIELDS]   # columns: 8 bytes a field a message
        self._start = time.perf_counter()
        self._on_eval = on_eval
        self._on_first_step = on_first_step   # called once, by started()
        self._final_state = None              # the runtime's state at the end, saved by finish()
        self._progress = progress
        self.probes = None   # the simulator's hook (runtimes/base.py), with probe_every
        if config.probe_every:
            from ..core.prober import Prober
            self.probes = Prober(config.probe_every, algorithm, self.model.module, self.worker_factory.x,
                                 self.worker_factory.y, config.seed, config.workers, epoch=lambda: self.epoch)
            self.resolved["probes"] = self.probes.describe()

    # ---- the runtime contract (runtimes/base.py) ---------------------------------
    @property
    def done(self) -> bool:
        return self.samples >= self.sample_budget

    def done_after(self, samples: int) -> bool:
        return self.samples + samples >= self.sample_budget

    @property
    def epoch(self) -> float:
        return self.samples / self.num_samples

    @property
    def lr(self) -> float:
        return self.schedule(self.epoch)

    @property
    def checkpoint_every(self) -> int:
        return self.config.checkpoint_every if self.checkpoint_path is not None else 0

    def after_push(self, samples: int, loss: float, now: float, evaluator: Evaluator | None = None,
                   train_acc: float | None = None) -> None:
        """Account for one pushed message of ``samples`` samples, mean mini-batch ``loss`` and
        training accuracy ``train_acc`` at time ``now``; evaluate when an interval is crossed."""
        self.started()
        due = self.evaluation_due(samples)
        self.samples += samples
        self.virtual_s = now
        if math.isfinite(loss):
            self._loss_sum += loss
            self._loss_count += 1
        acc = float("nan") if train_acc is None else train_acc
        if math.isfinite(acc):
            self._acc_sum += acc * samples
            self._acc_samples += samples
        for column, value in zip(self._messages, (self.samples, self.wall_s(), now, loss, acc)):
            column.append(value)
        if self._progress is not None:
            self._progress.advance(samples)
        if due:
            self.evaluate(evaluator)

    def evaluation_due(self, samples: int) -> bool:
        after = self.samples + samples
        return after >= self._next_eval and after < self.sample_budget

    def evaluate(self, evaluator: Evaluator | None = None) -> None:
        """Evaluate the server's weights now, or hand ``evaluator`` a snapshot of them
        (the record is then completed and appended when it answers)."""
        stal = self.server.staleness
        record = {
            "epoch": round(self.epoch, 6),
            "updates": self.server.version,
            "samples": self.samples,
            "wall_s": round(self.wall_s(), 4),
            "virtual_s": round(self.virtual_s, 6),
            "lr": self.lr,
            "train_loss": self._loss_sum / self._loss_count if self._loss_count else None,
            "train_acc": self._acc_sum / self._acc_samples if self._acc_samples else None,
            "test_loss": None,
            "test_acc": None,
            **({"val_loss": None, "val_acc": None} if self.val_data is not None else {}),
            "tau_mean": stal.mean,
            "nonfinite_skipped": self.server.nonfinite_skipped,
        }
        self._loss_sum, self._loss_count = 0.0, 0
        self._acc_sum, self._acc_samples = 0.0, 0
        while self._next_eval <= self.samples:
            self._next_eval += self.eval_interval
        if self.val_data is not None:
            evaluate_val(self.model, self.server.w, self.val_data, record)
        if evaluator is None:
            self._complete(record, *self.model.evaluate(self.server.w, self.test_data.x, self.test_data.y))
        else:
            evaluator.submit(self.server.w, record, self._complete)

    def _complete(self, record: dict, test_loss: float, test_acc: float) -> None:
        record["test_loss"], record["test_acc"] = test_loss, test_acc
        self.metrics.append(record)
        if self._progress is not None:
            self._progress.evaluated(record)
        if self._on_eval is not None:
            self._on_eval(record)

    def ahead(self, samples: int, messages: int) -> dict:
        """What the next messages will meet, without counting them (``run/ahead.py``; ``runtimes/base.py``)."""
        return plan_ahead(self, samples, messages)

    def checkpoint_due(self, version: int | None = None) -> bool:
        version = self.server.version if version is None else version
        return self.checkpoint_path is not None and version >= self._next_checkpoint

    def save_checkpoint(self, runtime_state: dict) -> None:
        """Write the whole state (nothing when the run writes no checkpoints). The final state (the budget
        spent) is written by ``finish``, after the final evaluation: an extension keeps that evaluation."""
        if self.checkpoint_path is None:
            return
        self.started()
        if self.done:
            self._final_state = runtime_state
        else:
            from . import checkpoint
            checkpoint.save(self.checkpoint_path, checkpoint.capture(self, runtime_state))
        every = self.config.checkpoint_every
        self._next_checkpoint = (self.server.version // every + 1) * every

    def started(self) -> None:
        """The run has taken its first step (or ended without one): ``on_first_step`` is called, once.
        Until then a run directory keeps what it held (``rundir.RunWriter.commit``)."""
        hook, self._on_first_step = self._on_first_step, None
        if hook is not None:
            hook()

    def note(self, text: str | None = None, **figures) -> None:
        if text is not None:
            self.notes.append(text)
        self.figures.update(figures)

    # ---- state, in the style of torch.nn.Module ------------------------------------
    def wall_s(self) -> float:
        return time.perf_counter() - self._start

    def state_dict(self) -> dict:
        """The server, the progress and metrics so far, the model's buffers and the torch RNG."""
        return {
            "server": self.server.state_dict(),
            "progress": {"samples": self.samples, "virtual_s": self.virtual_s, "metrics": self.metrics,
                         "notes": self.notes, "next_eval": self._next_eval, "loss_sum": self._loss_sum,
                         "loss_count": self._loss_count, "wall_s": self.wall_s(),
                         "next_checkpoint": self._next_checkpoint, "sample_budget": self.sample_budget,
                         "acc_sum": self._acc_sum, "acc_samples": self._acc_samples,
                         "messages": messages_tensor(self._messages)},
            "buffers": dict(self.model.module.named_buffers()),
            "torch_rng": torch.get_rng_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.server.load_state_dict(state["server"])
        st = state["progress"]
        self.samples, self.virtual_s = int(st["samples"]), float(st["virtual_s"])
        self.metrics, self.notes = list(st["metrics"]), list(st["notes"])
        self._next_eval, self._next_checkpoint = int(st["next_eval"]), int(st["next_checkpoint"])
        self._loss_sum, self._loss_count = float(st["loss_sum"]), int(st["loss_count"])
        self._acc_sum, self._acc_samples = float(st.get("acc_sum", 0.0)), int(st.get("acc_samples", 0))
        if "messages" in st:   # (checkpoints before 0.3 have none)
            self._messages = [array("d", column.tolist()) for column in st["messages"].T]
        self._start = time.perf_counter() - float(st["wall_s"])
        buffers = dict(self.model.module.named_buffers())
        for name, value in state["buffers"].items():
            buffers[name].copy_(value)
        torch.set_rng_state(state["torch_rng"])
        if self._progress is not None:
            self._progress.advance(self.samples)

    def message_records(self) -> list[dict]:
        """The messages so far, one dict each (``MESSAGE_FIELDS``); NaN where a value is unknown."""
        columns = [c.tolist() for c in self._messages]
        return [{"samples": int(row[0]), **dict(zip(MESSAGE_FIELDS[1:], row[1:]))} for row in zip(*columns)]

    def finish(self) -> TrainResult:
        self.started()
        if not self.metrics or self.metrics[-1]["samples"] != self.samples:
            self.evaluate()
        if self._final_state is not None:
            from . import checkpoint
            checkpoint.save(self.checkpoint_path, checkpoint.capture(self, self._final_state))
        stal = self.server.staleness.summary()
        final = self.metrics[-1]
        skipped = self.server.nonfinite_skipped
        # Diverged: the final model's loss is NaN/Inf, or most messages were NaN/Inf and skipped.
        diverged = not math.isfinite(final["test_loss"]) or skipped > self.server.version
        summary = {
            "algorithm": self.algorithm.name,
            "workers": self.config.workers,
            "final_test_acc": final["test_acc"],
            "best_test_acc": max(m["test_acc"] for m in self.metrics),
            "final_test_loss": final["test_loss"],
            **summary_figures(self.metrics),
            "epochs": round(self.epoch, 6),
            "wall_s": round(self.wall_s(), 4),
            "virtual_s": round(self.virtual_s, 6),
            "updates": self.server.version,
            "samples": self.samples,
            "tau_mean": stal["tau_mean"],
            "tau_max": stal["tau_max"],
            "nonfinite_skipped": skipped, "updates_dropped": stal["updates_dropped"],
            "diverged": diverged,
            "weights_sha256": weights_sha256(self.server.w),
            **self.server.kernels_info(),
            "notes": self.notes,
            **self.figures,
        }
        self.model.load(self.server.w)
        return TrainResult(metrics=self.metrics, staleness=stal, summary=summary, config=self.resolved,
                           weights=self.server.w.clone(), model=self.model.module,
                           staleness_log=self.server.staleness, messages=self.message_records(),
                           probes=self.probes.records if self.probes is not None else None)


def train(model, train_data, test_data, algorithm: Algorithm | str | None = None, workers: int | None = None,
          runtime=None, *, config: RunConfig | None = None, on_start: Callable | None = None,
          on_first_step: Callable[[], None] | None = None, on_eval: Callable[[dict], None] | None = None,
          progress: bool = False, checkpoint_path=None, resume=None, **options) -> TrainResult:
    """Train ``model`` with ``algorithm`` on ``workers`` workers; return the metrics.

    ``model`` is a ``torch.nn.Module``, a zero-argument factory, or a model name from ``stalegrad.models``
    (built for the data's shape). The data sets are ``stalegrad.data.Dataset`` objects (anything with ``x``,
    ``y`` tensors works). ``runtime`` defaults to the deterministic simulator.

    The options of the run are those of ``RunConfig`` (``epochs``, ``batch_size``, ``lr``, ``lr_milestones``,
    ``lr_gamma``, ``eval_every``, ``partition``, ``seed``, ``device``, ``on_nonfinite``, ``checkpoint_every``,
    ``init``, ``val_split``), given as keywords or as ``config=RunConfig(...)``; ``lr`` defaults to the
    algorithm's (0.1 for server SGD and local SGD, 0.001 for local Adam). ``algorithm`` (default asgd),
    ``workers`` and the keywords may come with ``config=``: each fills a field that ``config`` leaves at its
    default, and one that disagrees with a field ``config`` sets raises ``ConfigError``.
    Every mistake raises ``stalegrad.ConfigError`` before anything runs, a model that does not fit the
    data included (input shape and dtype, its outputs against the classes, the labels).

    ``on_start(config, metrics)`` is called before the first evaluation (metrics: a resumed run's so far),
    ``on_first_step()`` once the first message is applied (or at the end of a run without one).

    ``checkpoint_every=N`` writes the complete state to ``checkpoint_path`` every N server updates;
    ``resume=PATH`` continues from such a checkpoint (of the same configuration) instead of starting afresh.
    """
    from ..runtimes import make_runtime

    check_arguments(train_data, test_data, config, dict(on_start=on_start, on_first_step=on_first_step, on_eval=on_eval))
    given = {k: v for k, v in dict(algorithm=algorithm, workers=workers).items() if v is not None}
    if config is None:
        config = RunConfig.from_options(**given, **options)
    else:
        config = config.merged(**given, **options)
    config = config.validate()
    config.check_data(train_data, test_data)
    check_checkpoint(config, checkpoint_path)
    runtime = make_runtime(runtime if runtime is not None else "sim")
    if hasattr(runtime, "check"):   # optional part of the contract: runtime options against this run
        runtime.check(config)
    if config.probe_every and not getattr(runtime, "supports_probes", False):
        raise ConfigError("probe_every", f"needs the simulator (runtime sim), which alone can recompute a stale "
                                         f"gradient; runtime {runtime.describe().get('name')} cannot")
    check_stops(config.algorithm, config.workers, runtime)
    torch.manual_seed(config.seed)
    classes = num_classes(train_data, test_data)
    module = resolve_model(model, tuple(train_data.x.shape[1:]), classes)
    check_memory(config, module, train_data, test_data)   # the workers' and the server's copies must fit
    check_model(module, train_data, test_data, classes)
    train_data, val_data, held_out = split_run(config, train_data, module, runtime)   # (val_split)
    untouched = initialise(module, config.init)
    resolved = config.to_dict()
    resolved.update(runtime=runtime.describe(), train_samples=len(train_data.y), test_samples=len(test_data.y),
                    **held_out)
    saved = None
    if resume is not None:
        from . import checkpoint
        saved = checkpoint.load(resume)
    bar = make_progress(int(round(config.epochs * len(train_data.y))),
                        f"{config.algorithm.name} x{config.workers}") if progress else None
    # The simulator's numerics: bits that do not depend on the thread count (stalegrad/numerics.py).
    pinned = contextlib.ExitStack()
    if hasattr(runtime, "numerics"):
        resolved["numerics"] = pinned.enter_context(runtime.numerics())
    try:
        run = TrainingRun(module, train_data, test_data, config, on_eval=on_eval, progress=bar,
                          checkpoint_path=checkpoint_path, resolved=resolved, val_data=val_data,
                          on_first_step=on_first_step)
        if "numerics" in resolved:
            resolved["numerics"]["server_kernels"] = run.server.kernels
        if untouched:
            run.note(f"init {config.init}: left these layers as they were built: {', '.join(untouched)}")
        if saved is not None:   # checked whole, and loaded into memory, before on_start writes anything
            checkpoint.check_matches(resume, saved, run)
            checkpoint.check_budget(saved, run)
            resumed = checkpoint.restore(run, saved, resume)
        if on_start is not None:   # (configuration, metrics so far: those of the checkpoint when resuming)
            on_start(resolved, list(saved["run"]["progress"]["metrics"]) if saved is not None else [])
        if saved is None:
            run.evaluate()   # epoch 0: the initial weights
            runtime.run(run, seed=config.seed)
        else:
            runtime.run(run, seed=config.seed, resume=resumed)
        return run.finish()
    finally:
        pinned.close()
        if bar is not None:
            bar.close()
