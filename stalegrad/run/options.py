"""The options of a run, as ``stalegrad train`` and ``compare`` take them: each one's name, flags, type, default,
choices, bounds and help. The command line builds its flags from them (``cli/options.py``); a ``--config`` file,
a grid's cells and a resumed run's config.json give values of the same options (``option_files.py``); and
``check_options`` turns the parsed options into a checked ``RunConfig`` and runtime before anything runs. Free of
click, so that a grid checks its cells here without the command line, and of torch, which ``--help`` never loads.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from ..algorithms import ALGORITHMS, make_algorithm, renamed
from ..core.delays import DEFAULT_DELAY, DELAY_MODELS, SECONDS, deprecation, renamed_delay
from ..data import DATASETS
from ..errors import ConfigError, UsageError
from ..models import INITS, MODELS
from ..runtimes import RUNTIMES
from .config import ON_NONFINITE, PARTITIONS, RunConfig

# What a value of an option is: true/false, an integer, a number, a list of integers (sizes) or of numbers, a
# string, or a path that must not be a file ("dir") or not a directory ("file").
KINDS = ("flag", "int", "number", "ints", "numbers", "string", "dir", "file")
# The longest a run's option may wait on a clock of this machine: 31 years, "never" for any run, and below the
# 9.2e9 seconds a socket's or a sleep's timeout holds (1e308 was an OverflowError traceback).
MAX_WAIT_S = 1e9


@dataclass(frozen=True)
class Option:
    """One option: ``name`` (the parameter, as ``RunConfig``, a --config file and config.json spell it), its
    ``flags`` (messages name the longest), ``kind`` (KINDS), ``default``, ``choices``, ``most`` (the largest value,
    ``check_bounds``; ``why``: the reason it gives) and what ``--help`` shows (``help``, ``show_default``,
    ``metavar``); ``off``: the flag that turns off a flag that is on by default."""
    name: str
    flags: tuple[str, ...]
    kind: str = "string"
    default: object = None
    help: str | None = None
    choices: tuple[str, ...] | None = None
    show_default: bool = False
    metavar: str | None = None
    off: str | None = None
    required: bool = False
    most: float | None = None
    why: str = ""

    @property
    def flag(self) -> str:
        return max(self.flags, key=len)

    @property
    def parsed_default(self):
        """The default as the parsed value (a number option's default 0 is 0.0)."""
        if self.default is None:
            return None
        return {"flag": bool, "int": int, "number": float}.get(self.kind, lambda v: v)(self.default)


def _opt(flags: str, name: str | None = None, **kw) -> Option:
    flags = tuple(flags.split())
    return Option(name or flags[0].lstrip("-").replace("-", "_"), flags, **kw)


# A message's transport is drawn from an exponential of this median, at most 53 times it (random()'s 53 bits), and
# added to the virtual clock: 1e308 overflowed it, and the run exited 0. The bound is the one every other time in
# a speed profile has (core/delays.py, SECONDS: pause:D@T's D and T): 31,700 years, far past any transport worth
# simulating, and draws of at most 5.3e13 seconds, which the clock adds up without overflow.
_TRANSPORT = " (31,700 years: the bound of every time in a speed profile, which keeps the virtual clock finite)"
WAIT_WHY = " (about 31 years: a larger one overflows this machine's clock)"

RUN_OPTIONS = (
    _opt("--workers -M", kind="int", help="number of workers M  [default: 4; 1 for sgd]"),
    _opt("--dataset", choices=tuple(DATASETS), default="digits", show_default=True),
    _opt("--model", choices=tuple(MODELS), default="mlp", show_default=True),
    _opt("--hidden", kind="ints", help="mlp hidden sizes, e.g. 256,128"),
    _opt("--init", choices=tuple(INITS), default="torch", show_default=True,
         help="weight initialisation: torch's defaults, glorot-uniform (Keras, the AGN paper) or "
              "he-normal (the ResNet paper); biases zero for the last two"),
    _opt("--epochs", kind="number", default=1.0, show_default=True),
    _opt("--batch-size", kind="int", default=128, show_default=True),
    _opt("--lr", kind="number",
         help="learning rate (server SGD, or the local optimizer)  [default: 0.1; 0.001 with local adam]"),
    _opt("--lr-milestones", kind="numbers",
         help="step decay: epochs at which lr is multiplied by --lr-gamma, e.g. 80,120"),
    _opt("--lr-gamma", kind="number", default=0.1, show_default=True),
    _opt("--delay", help="speed profile: " + ", ".join(DELAY_MODELS) + " (docs/delays.md): the "
         f"simulator's clock; real workers wait out each drawn time  [default: sim {DEFAULT_DELAY}; else none]"),
    _opt("--step-time", kind="number", help="seconds of one local step of a speed-1 worker "
         "(virtual in sim)  [default: sim 1.0; local, ray: sized from one measured step]"),
    _opt("--message-time", kind="number", help="--runtime sim: median seconds of a message's transport, "
         "drawn per message (docs/delays.md)  [default: 0]", most=SECONDS[1], why=_TRANSPORT),
    _opt("--pull", choices=("with-push", "separate"), help="--runtime sim, --message-time: "
         "the weights come with the push's answer, or in a second request  [default: with-push]"),
    _opt("--vectorised", kind="flag", default=False,
         help="--runtime sim: compute the gradients (or, commit rules, the windows) of waiting "
              "workers as one batched computation (see docs/performance.md)"),
    _opt("--threads", kind="int",
         help="--runtime sim: torch's threads; the bits do not depend on it  [default: $OMP_NUM_THREADS, "
              "else measured while running: 1 or every core, whichever is faster]"),
    _opt("--runtime", choices=tuple(RUNTIMES), default="sim", show_default=True,
         help="sim: deterministic simulator; local: real worker processes on this machine; "
              "ray: worker and server actors on a Ray cluster (docs/cluster.md)"),
    _opt("--address", help="--runtime ray: 'auto' or HOST:PORT of a running Ray cluster  [default: start a local one]"),
    _opt("--ps-shards", kind="int", default=1, show_default=True,
         help="--runtime ray: server actors, each owning one slice of the weights"),
    _opt("--cpus-per-worker", kind="number", default=1.0, show_default=True,
         help="--runtime ray: CPUs each worker actor asks Ray for (and its torch threads)"),
    _opt("--gpus-per-worker", kind="number", default=0.0, show_default=True,
         help="--runtime ray: GPUs each worker actor asks Ray for (fractions share a GPU)"),
    _opt("--same-node-socket", kind="flag", off="--no-same-node-socket", default=True, show_default=True,
         help="--runtime ray, one shard, an asynchronous rule: workers on the shard's machine push and "
              "pull through its Unix socket rather than a Ray call (docs/cluster.md, Transport)"),
    _opt("--connect-timeout", kind="number", most=MAX_WAIT_S, why=WAIT_WHY,
         help="--runtime ray with --address: seconds to join the cluster before giving up  [default: 30]"),
    _opt("--restart-timeout", kind="number", most=MAX_WAIT_S, why=WAIT_WHY,
         help="--runtime ray: seconds to wait for a lost worker's replacement actor to start (then its "
              "samples go to the others; at once when the cluster has no room), and for a killed server "
              "shard's restart (then the run stops); e.g. 120 on a loaded machine  [default: 10]"),
    _opt("--threads-per-worker", kind="int",
         help="--runtime local: torch threads of each worker process  [default: max(1, cores // M)]"),
    _opt("--worker-timeout", kind="number", most=MAX_WAIT_S, why=WAIT_WHY,
         help="--runtime local: seconds a worker may send nothing while the server waits for it; "
              "then it is lost, as a killed one is  [default: 300]"),
    _opt("--record-trace", kind="file",
         help="--runtime local or ray: write the real order of pushes to this CSV "
              "(replay it with --runtime sim --delay trace:FILE)"),
    _opt("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N"),
    _opt("--seed", kind="int", default=0, show_default=True),
    _opt("--data-dir", kind="dir", help="where the data set lies (else $STALEGRAD_DATA, the cache, /usr/share/datasets)"),
    _opt("--partition", default="shard", show_default=True, metavar="|".join(PARTITIONS),
         help="shard: disjoint shard per worker; iid: every worker samples the whole set; "
              "replicate:K: the set K times over, dealt to the workers (the thesis's layout: "
              "replicate:11); an epoch is always one pass's worth of the set given"),
    _opt("--val-split", kind="number", default=0, show_default=True, metavar="N",
         help="hold N training samples (an integer, or a fraction in (0, 1)) out of training, the same "
              "ones for every seed; each evaluation then records val_acc and val_loss (0: none)"),
    _opt("--eval-every", kind="number", default=1.0, show_default=True,
         help="evaluate the server's model every this many epochs"),
    _opt("--on-nonfinite", choices=tuple(ON_NONFINITE), default="skip", show_default=True,
         help="a NaN/Inf gradient or commit: skip it (and count it) or stop the run"),
    _opt("--checkpoint-every", kind="int", default=0, show_default=True,
         help="save the complete state to --out/checkpoint.pt every N server updates (0: never)"),
    _opt("--probe-every", kind="int", default=0, show_default=True,
         help="--runtime sim: every K-th server update, measure the stale message against the fresh "
              "gradient and its alignment; writes --out/probes.jsonl (0: never; see README)"),
    _opt("--tensorboard", kind="dir",
         help="also write TensorBoard logs (scalars, the tau histogram) to DIR (compare: DIR/ALGO); "
              "needs pip install 'tensorboard>=2.14'"),
    _opt("--config", "config_file", kind="file", help="TOML file of options (keys as flag names); flags win"),
    _opt("--overwrite", kind="flag", default=False, help="replace a run already in --out"),
    _opt("--quiet -q", kind="flag", default=False, help="no progress output"),
)


def _algorithm_options() -> dict[str, Option]:
    """Every algorithm hyper-parameter as an option, merged by name (a choice parameter takes the choices of
    every algorithm that has it: each algorithm checks its own); its help names the algorithms that have it."""
    options: dict[str, Option] = {}
    choices: dict[str, list] = {}
    for cls in ALGORITHMS.values():
        for f in cls.hyperparameters():
            for c in f.metadata.get("choices") or ():
                if c not in choices.setdefault(f.name, []):
                    choices[f.name].append(c)
            if f.name not in options:
                owners = [n for n, c in ALGORITHMS.items() if f.name in {x.name for x in c.hyperparameters()}]
                options[f.name] = Option(f.name, (f.metadata["flag"],),
                                         {int: "int", float: "number"}.get(type(f.default), "string"),
                                         help=f"{f.metadata['help']}  [{', '.join(owners)}; see 'stalegrad algorithms']")
    return {name: Option(o.name, o.flags, "string", help=o.help, choices=tuple(choices[name])) if name in choices
            else o for name, o in options.items()}


ALGO_OPTIONS = _algorithm_options()
ALGO_FLAGS = {name: o.flag for name, o in ALGO_OPTIONS.items()}   # lam0 -> --lam0, local_opt -> --local-opt, ...

TRAIN_OPTIONS = (
    _opt("--algo", choices=tuple(ALGORITHMS), default="asgd", show_default=True),
    *RUN_OPTIONS, *ALGO_OPTIONS.values(),
    _opt("--out", kind="dir", help="run directory for the results (required, unless --resume gives it)"),
    _opt("--resume", kind="dir",
         help="continue the run in DIR from its last checkpoint; DIR/config.json gives every other option "
              "(only --epochs, to extend it, --data-dir, --quiet and --tensorboard may be given)"),
)
COMPARE_OPTIONS = (
    _opt("--algos", default="sgd,asgd,dcasgd-a,agn", show_default=True,
         help="comma-separated algorithms to run one after the other"),
    *RUN_OPTIONS, *ALGO_OPTIONS.values(),
    _opt("--out", kind="dir", required=True, help="directory; one run per algorithm inside"),
)
# Options of a command that a --config file may not give.
NOT_IN_CONFIG = ("config_file", "overwrite", "quiet", "resume")


def check_bounds(params: dict) -> None:
    """ConfigError for an option past its largest value (``Option.most``); a value that is no finite number
    is left to the option's own check, which says what it must be."""
    for o in RUN_OPTIONS:
        v = params.get(o.name)
        if o.most is not None and isinstance(v, (int, float)) and not isinstance(v, bool) \
                and math.isfinite(v) and v > o.most:
            raise ConfigError(o.name, f"must be at most {o.most:g} seconds{o.why}, got {v:g}")


def build_algorithm(name: str, params: dict):
    """The algorithm ``name`` with the hyper-parameters given as flags; removes them from ``params``."""
    given = {k: params.pop(k) for k in list(ALGO_FLAGS) if params.get(k) is not None}
    for k in list(ALGO_FLAGS):
        params.pop(k, None)
    cls = ALGORITHMS[name]
    own = {f.name for f in cls.hyperparameters()}
    for key in list(given):
        new = renamed(cls, key)
        if new is not None and new not in given:
            print(f"stalegrad: warning: {ALGO_FLAGS[key]} for {name} is now {ALGO_FLAGS[new]}; "
                  "the old spelling goes in the next release", file=sys.stderr)
            given[new] = given.pop(key)
        elif key not in own:
            takers = [n for n, c in ALGORITHMS.items() if key in {x.name for x in c.hyperparameters()}]
            raise UsageError(f"{ALGO_FLAGS[key]} does not apply to {name}; it is a parameter of {', '.join(takers)}")
    return make_algorithm(name, **given)


def build_config(algo_name: str, params: dict) -> RunConfig:
    """The validated RunConfig of one run from the parsed options (``params`` is not changed)."""
    p = dict(params)
    algorithm = build_algorithm(algo_name, p)
    if p["hidden"] is not None and p["model"] != "mlp":
        raise ConfigError("hidden", f"applies to model mlp only, not {p['model']}")
    extra = {"dataset": p["dataset"], "model": p["model"], "hidden": list(p["hidden"]) if p["hidden"] else None,
             "data_dir": p["data_dir"]}
    return RunConfig(algorithm=algorithm, workers=p["workers"], epochs=p["epochs"], batch_size=p["batch_size"],
                     lr=p["lr"], lr_milestones=p["lr_milestones"] or (), lr_gamma=p["lr_gamma"],
                     eval_every=p["eval_every"], partition=p["partition"], seed=p["seed"], device=p["device"],
                     on_nonfinite=p["on_nonfinite"], checkpoint_every=p["checkpoint_every"], init=p["init"],
                     probe_every=p.get("probe_every", 0), val_split=p.get("val_split") or 0, extra=extra).validate()


SIM_ONLY = (("vectorised", False), ("threads", None), ("message_time", None), ("pull", None))
LOCAL_ONLY = ("threads_per_worker", "worker_timeout")
RAY_ONLY = (("address", None), ("ps_shards", 1), ("cpus_per_worker", 1.0), ("gpus_per_worker", 0.0),
            ("connect_timeout", None), ("restart_timeout", None), ("same_node_socket", True))


WARNED: set[str] = set()   # the deprecation lines printed by this command (the command line's main() clears it)


def warn_once(line: str) -> None:
    """Print a warning line on stderr once per command (a grid checks every cell, compare every run)."""
    if line not in WARNED:
        WARNED.add(line)
        print(line, file=sys.stderr)


def build_runtime(p: dict):
    """The runtime that --runtime names, with its options (flags of another runtime are refused)."""
    runtime, delay = p["runtime"], p.get("delay")   # a speed profile in every runtime
    if renamed_delay(delay) is not None:
        warn_once(f"stalegrad: warning: {deprecation(delay)}")
        delay = renamed_delay(delay)
    if runtime != "sim" and p.get("probe_every"):
        raise ConfigError("probe_every", f"applies to runtime sim: only the simulator can recompute a stale gradient "
                                         f"at the server's weights; runtime {runtime} cannot")
    for name, default in SIM_ONLY if runtime != "sim" else ():
        if p.get(name, default) != default:
            raise ConfigError(name, f"applies to runtime sim only: runtime {runtime}'s workers are real processes" +
                              ("; give them threads with --threads-per-worker (local) or --cpus-per-worker (ray)"
                               if name == "threads" else ""))
    if runtime != "local":
        for name in LOCAL_ONLY:
            if p.get(name) is not None:
                raise ConfigError(name, "applies to runtime local only")
    if runtime != "ray":
        for name, default in RAY_ONLY:
            if p.get(name, default) != default:
                raise ConfigError(name, "applies to runtime ray only")
    if runtime == "local":
        from ..runtimes.local import LocalRuntime
        timeout = {} if p.get("worker_timeout") is None else {"worker_timeout": p["worker_timeout"]}
        return LocalRuntime(threads_per_worker=p.get("threads_per_worker"), record_trace=p.get("record_trace"),
                            delay=delay, step_time=p.get("step_time"), **timeout)
    if runtime == "ray":
        from ..runtimes.ray import RayRuntime
        timeouts = {k: p[k] for k in ("connect_timeout", "restart_timeout") if p.get(k) is not None}
        return RayRuntime(address=p.get("address"), ps_shards=p.get("ps_shards", 1),
                          cpus_per_worker=p.get("cpus_per_worker", 1.0), gpus_per_worker=p.get("gpus_per_worker", 0.0),
                          record_trace=p.get("record_trace"), same_node_socket=p.get("same_node_socket", True),
                          delay=delay, step_time=p.get("step_time"), **timeouts)
    if p.get("record_trace") is not None:
        raise ConfigError("record_trace", "records a real run: use it with runtime local or ray "
                                          "(runtime sim replays a recorded trace with --delay trace:FILE)")
    from ..runtimes.sim import Simulator
    step_time = 1.0 if p.get("step_time") is None else p["step_time"]
    return Simulator(delay=DEFAULT_DELAY if delay is None else delay, step_time=step_time, threads=p.get("threads"),
                     vectorised=bool(p.get("vectorised")), message_time=p.get("message_time") or 0.0,
                     pull=p.get("pull") or "with-push")


def check_options(algo_name: str, params: dict):
    """The validated (RunConfig, runtime) of one run from its parsed options (``train``'s, a grid cell's);
    checked before any data is loaded or anything written."""
    check_bounds(params)
    config = build_config(algo_name, params)
    runtime = build_runtime(params)
    runtime.check(config)
    if params.get("tensorboard") is not None:
        from .tblog import check_logdir
        check_logdir(params["tensorboard"])
    return config, runtime
