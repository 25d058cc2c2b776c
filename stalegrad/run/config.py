"""``RunConfig``: every option of one training run, validated in one place.

Both ``stalegrad.train(...)`` and ``stalegrad train`` build one; ``validate()``
returns it resolved (the algorithm built, the defaults that depend on it
filled in) or raises ``ConfigError`` naming the parameter, so the API and the
CLI refuse the same mistakes with the same message (the CLI spells the
parameter as its flag). Runtime options (delay model, threads per worker)
belong to the runtime objects, which check them the same way.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

from ..algorithms import Algorithm, make_algorithm
from ..errors import ConfigError, check_finite_positive
from ..core.options import MAX_COPIES, MAX_SEED, ON_NONFINITE, PARTITIONS, canonical_partition, parse_partition, probe_kind
from ..models.init import INITS

__all__ = ["RunConfig", "ON_NONFINITE", "PARTITIONS", "MAX_COPIES", "parse_partition", "probe_kind"]  # the last five: core's, re-exported

_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


@dataclass
class RunConfig:
    """The options of one run. ``None`` means "the default for this algorithm"."""
    algorithm: Algorithm | str = "asgd"
    workers: int | None = None           # 1 for sequential sgd, else 4
    epochs: float = 1.0
    batch_size: int = 128
    lr: float | None = None              # 0.1 for server or local SGD, 0.001 for local Adam
    lr_milestones: tuple[float, ...] = ()
    lr_gamma: float = 0.1
    eval_every: float = 1.0
    partition: str = "shard"
    seed: int = 0
    device: str = "cpu"
    on_nonfinite: str = "skip"
    checkpoint_every: int = 0
    init: str = "torch"                  # weight initialisation: torch, glorot-uniform, he-normal (models/init.py)
    probe_every: int = 0                 # simulator probes every this many server updates (stalegrad/core/prober.py)
    val_split: int | float = 0           # training samples held out for validation: a count, or a fraction in (0, 1)
    extra: dict = field(default_factory=dict)   # recorded in config.json as given (data set, model name, ...)

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra")

    @classmethod
    def from_options(cls, **options) -> "RunConfig":
        unknown = sorted(set(options) - set(cls.fields()))
        if unknown:
            raise ConfigError(unknown[0], f"is not an option of a run; the options are {', '.join(cls.fields())}")
        return cls(**options)

    def merged(self, **options) -> "RunConfig":
        """This configuration with ``options`` filling the fields it leaves at their defaults; an option
        that disagrees with a field this configuration sets raises ``ConfigError`` (never silently one
        or the other)."""
        RunConfig.from_options(**options)   # unknown names
        defaults = RunConfig()
        changes = {}
        for name, value in options.items():
            mine = getattr(self, name)
            if _same(name, mine, getattr(defaults, name)):
                changes[name] = value
            elif not _same(name, mine, value):
                raise ConfigError(name, f"is given twice, as {_show(value)} and as {_show(mine)} in config=; "
                                        "give it in one place")
        return dataclasses.replace(self, **changes)

    def validate(self) -> "RunConfig":
        """A resolved, checked copy (``algorithm`` an ``Algorithm``, ``workers`` and ``lr`` set)."""
        algo = self.algorithm
        if isinstance(algo, str):
            algo = make_algorithm(algo)
        elif isinstance(algo, Algorithm):
            algo.validate()
        else:
            raise ConfigError("algorithm", f"must be an algorithm name or an Algorithm, not {type(algo).__name__}")
        workers = self.workers if self.workers is not None else (1 if algo.sequential else 4)
        _positive_int("workers", workers)
        algo.check_workers(workers)
        if algo.sequential and workers != 1:
            raise ConfigError("workers", f"must be 1 for {algo.name}, which is sequential, got {workers!r} "
                                         "(asgd is its asynchronous counterpart)")
        epochs = check_finite_positive("epochs", self.epochs)
        eval_every = check_finite_positive("eval_every", self.eval_every)
        _positive_int("batch_size", self.batch_size)
        lr = default_lr(algo) if self.lr is None else check_finite_positive("lr", self.lr)
        lr_gamma = check_finite_positive("lr_gamma", self.lr_gamma)
        milestones = self._milestones()
        for k in range(1, len(milestones) + 1):   # every rate of the schedule: LRSchedule computes lr * gamma**k
            try:
                scheduled = lr * lr_gamma ** k
            except OverflowError:
                scheduled = math.inf
            if not math.isfinite(scheduled) or scheduled <= 0:
                raise ConfigError("lr_gamma", f"is {lr_gamma:g}: after milestone {k} the learning rate {lr:g} x "
                                              f"{lr_gamma:g}^{k} is {scheduled:g}, not a finite number > 0; "
                                              "give a gamma that keeps it one, e.g. 0.1")
        partition = canonical_partition(self.partition)   # replicate:011 is replicate:11
        _choice("on_nonfinite", self.on_nonfinite, ON_NONFINITE)
        _choice("init", self.init, INITS)
        if not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError("seed", f"must be an integer from 0 to {MAX_SEED}, got {self.seed!r}")
        if not _is_int(self.checkpoint_every) or self.checkpoint_every < 0:
            raise ConfigError("checkpoint_every", f"must be a non-negative integer (server updates), "
                                                  f"got {self.checkpoint_every!r}")
        self._check_probes(algo)
        self._check_device()
        return dataclasses.replace(self, algorithm=algo, workers=workers, epochs=epochs, eval_every=eval_every,
                                   lr=lr, lr_gamma=lr_gamma, lr_milestones=milestones, partition=partition,
                                   val_split=self._val_split())

    def _val_split(self) -> int | float:
        """``val_split`` as a count (an int >= 1), a fraction in (0, 1), or 0 (no split)."""
        v = self.val_split
        if _number(v) and math.isfinite(v) and (0 < v < 1 or v == 0 or (v >= 1 and v == int(v))):
            return int(v) if v >= 1 or v == 0 else float(v)
        raise ConfigError("val_split", f"must be a count of training samples to hold out (an integer >= 1), a "
                                       f"fraction in (0, 1), or 0 for none, got {v!r}")

    def val_samples(self, n: int) -> int:
        """How many of ``n`` training samples this (validated) configuration holds out for validation."""
        from ..data.split import val_count
        return val_count(self.val_split, n)

    def _milestones(self) -> tuple[float, ...]:
        try:
            values = tuple(self.lr_milestones)
        except TypeError:
            values = None
        if values is None or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise ConfigError("lr_milestones", f"must be a list of epochs, e.g. (80, 120), got {self.lr_milestones!r}")
        values = tuple(float(v) for v in values)
        if any(not math.isfinite(v) or v <= 0 for v in values):
            raise ConfigError("lr_milestones", f"must be finite epochs > 0, got {list(values)}")
        if any(b <= a for a, b in zip(values, values[1:])):
            raise ConfigError("lr_milestones", f"must be increasing, e.g. 80,120, got {list(values)}")
        return values

    def _check_probes(self, algo: Algorithm) -> None:
        if not _is_int(self.probe_every) or self.probe_every < 0:
            raise ConfigError("probe_every", f"must be a non-negative integer (server updates; 0: no probes), "
                                             f"got {self.probe_every!r}")
        if self.probe_every and probe_kind(algo) is None:
            raise ConfigError("probe_every", f"measures asynchronous gradients and commits (sgd, asgd, dcasgd-c, "
                                             f"dcasgd-a, agn, downpour, dynsgd), not {algo.name}")
        if self.probe_every and self.checkpoint_every:
            raise ConfigError("probe_every", "cannot be combined with checkpoint_every: checkpoints do not hold "
                                             "the probes' state; drop one of them")

    def _check_device(self) -> None:
        if not isinstance(self.device, str) or not _DEVICE.fullmatch(self.device):
            raise ConfigError("device", f"must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.device.startswith("cuda"):
            import torch
            if not torch.cuda.is_available():
                raise ConfigError("device", f"is {self.device} but CUDA is not available on this machine; use cpu")

    def check_data(self, train_data, test_data) -> None:
        """The data sets fit this (validated) configuration: same sample shape, enough samples."""
        train_shape, test_shape = tuple(train_data.x.shape[1:]), tuple(test_data.x.shape[1:])
        if train_shape != test_shape:
            raise ConfigError("test_data", f"holds samples of shape {test_shape} but the training set's are "
                                           f"{train_shape}; use a test set of the same data set")
        if len(train_data.y) != len(train_data.x) or len(test_data.y) != len(test_data.x):
            raise ConfigError("train_data", "has a different number of samples and labels")
        if len(test_data.y) == 0:
            raise ConfigError("test_data", "is empty")
        n = total = len(train_data.y)
        if total == 0:
            raise ConfigError("train_data", "is empty: it holds no samples to train on")
        held = self.val_samples(total)
        if self.val_split and held < 1:
            raise ConfigError("val_split", f"is {self.val_split:g}: {self.val_split:g} x {total} training samples "
                                           "rounds to 0 samples; give a larger fraction or a count >= 1")
        if held >= total:
            raise ConfigError("val_split", f"holds out {held} of the {total} training samples, leaving none to train "
                                           "on; give fewer")
        n = total - held
        budget, steps = samples_of("epochs", self.epochs, n), self.algorithm.steps_per_message
        samples_of("eval_every", self.eval_every, n)
        if steps > 1 and steps * self.batch_size > budget:   # the run would be one commit, past its budget
            raise ConfigError("window", f"is {steps}: one commit of {steps} mini-batches of {self.batch_size} is "
                                        f"{steps * self.batch_size} samples, more than the whole budget of "
                                        f"{self.epochs:g} epoch{'s' * (format(self.epochs, 'g') != '1')} ({budget} samples); give at most window "
                                        f"{max(1, budget // self.batch_size)}, or more epochs",
                              self.algorithm.name, mentions=("window",))
        check_updates = getattr(self.algorithm, "check_updates", None)   # (an algorithm with a count of updates)
        if check_updates is not None:
            check_updates(-(-budget // (steps * self.batch_size)))   # one server update per message
        layout, copies = parse_partition(self.partition)
        per_worker = n if layout == "iid" else n * copies // self.workers
        if self.batch_size > per_worker and held and self.batch_size <= (total if layout == "iid"
                                                                         else total * copies // self.workers):
            most = total - (self.batch_size if layout == "iid" else -(-self.batch_size * self.workers // copies))
            raise ConfigError("val_split", f"holds out {held} of the {total} training samples, leaving each worker "
                                           f"{per_worker}, fewer than a mini-batch of {self.batch_size}; hold out at "
                                           f"most {most}")
        if self.batch_size > per_worker:
            raise ConfigError("batch_size", f"is {self.batch_size}, larger than each worker's {per_worker} samples "
                                            f"({n} samples, {self.workers} workers); lower it or the workers, "
                                            "or use partition 'iid'")

    def to_dict(self) -> dict:
        """The resolved options as config.json records them."""
        algo = self.algorithm if isinstance(self.algorithm, Algorithm) else make_algorithm(self.algorithm)
        return {"algorithm": algo.to_dict(), "workers": self.workers, "epochs": self.epochs,
                "batch_size": self.batch_size, "lr": self.lr, "lr_milestones": list(self.lr_milestones),
                "lr_gamma": self.lr_gamma, "eval_every": self.eval_every, "partition": self.partition,
                "seed": self.seed, "device": self.device, "on_nonfinite": self.on_nonfinite,
                "checkpoint_every": self.checkpoint_every, "init": self.init, "probe_every": self.probe_every,
                # only with a split: the config.json of a run without one is as it was before val_split
                **({"val_split": self.val_split} if self.val_split else {}), **self.extra}


# The most samples a run may count: its counts are float64 columns (messages.jsonl) and JSON numbers, exact to
# 2**53; a budget past it (epochs 1e308: an infinite product) was an OverflowError.
MAX_SAMPLES = 2**53


def samples_of(name: str, epochs: float, n: int) -> int:
    """``epochs`` passes over ``n`` training samples as a count of samples (the sample budget, the interval of
    evaluations); ConfigError naming ``name`` when that is more than a run can count."""
    samples = epochs * n
    if not samples <= MAX_SAMPLES:
        raise ConfigError(name, f"is {epochs:g}: {epochs:g} x {n} training samples is {samples:g} samples, more "
                                f"than a run can count ({MAX_SAMPLES:.4g}); give at most {MAX_SAMPLES / n:.4g}")
    return int(round(samples))


def _same(name: str, a, b) -> bool:
    """Whether two values of one option mean the same (an algorithm by name or as an object)."""
    if name == "algorithm":
        a, b = (make_algorithm(v) if isinstance(v, str) else v for v in (a, b))
    elif name == "lr_milestones":
        a, b = (tuple(v) if isinstance(v, (list, tuple)) else v for v in (a, b))
    try:
        return bool(a == b) and type(a) is type(b) or (_number(a) and _number(b) and a == b)
    except Exception:   # e.g. a tensor given where a number belongs: validate() names the problem
        return False


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _show(value) -> str:
    return value.name if isinstance(value, Algorithm) and value == make_algorithm(value.name) else repr(value)


def default_lr(algorithm: Algorithm) -> float:
    own = algorithm.default_lr()
    if own is not None:
        return own
    return 0.001 if getattr(algorithm, "local_opt", "sgd") == "adam" else 0.1


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(name: str, value) -> None:
    if not _is_int(value) or value < 1:
        raise ConfigError(name, f"must be a positive integer, got {value!r}")


def _choice(name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(name, f"must be one of {', '.join(choices)}, got {value!r}")
