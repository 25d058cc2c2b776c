"""The options of ``train`` and ``compare``, and how they become a ``RunConfig``.

Options come from three places, in rising priority: defaults, ``--config
FILE.toml``, flags. The flags only parse; every check lives in ``RunConfig``,
the algorithms and the runtimes, whose ``ConfigError`` names the parameter in
Python terms. ``flag_of`` gives the flag of a parameter, so that the CLI
prints the library's message with the flag in it.
"""
from __future__ import annotations

import contextlib
import sys

import click
from click.core import ParameterSource

from ..algorithms import ALGORITHMS, make_algorithm, renamed
from ..run.config import ON_NONFINITE, PARTITIONS, RunConfig
from ..data import DATASETS
from ..core.delays import DEFAULT_DELAY, DELAY_MODELS, deprecation, renamed_delay
from ..errors import ConfigError, UsageError
from ..models import INITS, MODELS
from ..runtimes import RUNTIMES
from .option_files import CONFIG_TABLE, csv_floats, csv_ints, file_value, read_config_table, toml_value_problem  # noqa: F401
# Run options that are not RunConfig fields: where the data and the model come from, and the CLI's own.
CLI_ONLY = ("dataset", "model", "hidden", "data_dir", "config_file", "overwrite", "quiet")


def _algorithm_flags() -> dict[str, tuple]:
    """Every algorithm hyper-parameter as (flag, type, help), merged by name (a choice parameter takes
    the choices of every algorithm that has it: each algorithm checks its own)."""
    flags: dict[str, tuple] = {}
    choices: dict[str, list] = {}
    for cls in ALGORITHMS.values():
        for f in cls.hyperparameters():
            for c in f.metadata.get("choices") or ():
                if c not in choices.setdefault(f.name, []):
                    choices[f.name].append(c)
            if f.name not in flags:
                flags[f.name] = (f.metadata["flag"], {int: int, float: float}.get(type(f.default), str),
                                 f.metadata["help"])
    return {name: (flag, click.Choice(choices[name]) if name in choices else ftype, help_)
            for name, (flag, ftype, help_) in flags.items()}


ALGO_FLAGS = _algorithm_flags()


def flag_of(command: click.Command, param: str) -> str | None:
    """The flag of ``command`` for a parameter name (``lr`` -> ``--lr``, ``algorithm`` -> ``--algo``);
    None for a parameter that is no flag (a Python-only argument)."""
    if param in ALGO_FLAGS:
        return ALGO_FLAGS[param][0]
    if param == "algorithm":
        return "--algo"
    for p in command.params:
        if p.name == param and p.opts:
            return max(p.opts, key=len)
    return None


def run_options(f):
    """Options shared by ``train`` and ``compare`` (algorithm flags included)."""
    opts = [
        click.option("--workers", "-M", type=int, default=None, help="number of workers M  [default: 4; 1 for sgd]"),
        click.option("--dataset", type=click.Choice(DATASETS), default="digits", show_default=True),
        click.option("--model", type=click.Choice(MODELS), default="mlp", show_default=True),
        click.option("--hidden", callback=csv_ints, default=None, help="mlp hidden sizes, e.g. 256,128"),
        click.option("--init", type=click.Choice(INITS), default="torch", show_default=True,
                     help="weight initialisation: torch's defaults, glorot-uniform (Keras, the AGN paper) or "
                          "he-normal (the ResNet paper); biases zero for the last two"),
        click.option("--epochs", type=float, default=1.0, show_default=True),
        click.option("--batch-size", type=int, default=128, show_default=True),
        click.option("--lr", type=float, default=None,
                     help="learning rate (server SGD, or the local optimizer)  [default: 0.1; 0.001 with local adam]"),
        click.option("--lr-milestones", callback=csv_floats, default=None,
                     help="step decay: epochs at which lr is multiplied by --lr-gamma, e.g. 80,120"),
        click.option("--lr-gamma", type=float, default=0.1, show_default=True),
        click.option("--delay", help="speed profile: " + ", ".join(DELAY_MODELS) + " (docs/delays.md): the "
                     f"simulator's clock; real workers wait out each drawn time  [default: sim {DEFAULT_DELAY}; else none]"),
        click.option("--step-time", type=float, help="seconds of one local step of a speed-1 worker "
                     "(virtual in sim)  [default: sim 1.0; local, ray: sized from one measured step]"),
        click.option("--message-time", type=float, help="--runtime sim: median seconds of a message's transport, "
                     "drawn per message (docs/delays.md)  [default: 0]"),
        click.option("--pull", type=click.Choice(["with-push", "separate"]), help="--runtime sim, --message-time: "
                     "the weights come with the push's answer, or in a second request  [default: with-push]"),
        click.option("--vectorised", is_flag=True,
                     help="--runtime sim: compute the gradients (or, commit rules, the windows) of waiting "
                          "workers as one batched computation (see docs/performance.md)"),
        click.option("--threads", type=int, default=None,
                     help="--runtime sim: torch's threads; the bits do not depend on it  [default: $OMP_NUM_THREADS, "
                          "else measured while running: 1 or every core, whichever is faster]"),
        click.option("--runtime", type=click.Choice(RUNTIMES), default="sim", show_default=True,
                     help="sim: deterministic simulator; local: real worker processes on this machine; "
                          "ray: worker and server actors on a Ray cluster (docs/cluster.md)"),
        click.option("--address", default=None,
                     help="--runtime ray: 'auto' or HOST:PORT of a running Ray cluster  [default: start a local one]"),
        click.option("--ps-shards", type=int, default=1, show_default=True,
                     help="--runtime ray: server actors, each owning one slice of the weights"),
        click.option("--cpus-per-worker", type=float, default=1.0, show_default=True,
                     help="--runtime ray: CPUs each worker actor asks Ray for (and its torch threads)"),
        click.option("--gpus-per-worker", type=float, default=0.0, show_default=True,
                     help="--runtime ray: GPUs each worker actor asks Ray for (fractions share a GPU)"),
        click.option("--same-node-socket/--no-same-node-socket", default=True, show_default=True,
                     help="--runtime ray, one shard, an asynchronous rule: workers on the shard's machine push and "
                          "pull through its Unix socket rather than a Ray call (docs/cluster.md, Transport)"),
        click.option("--connect-timeout", type=float, default=None,
                     help="--runtime ray with --address: seconds to join the cluster before giving up  [default: 30]"),
        click.option("--restart-timeout", type=float, default=None,
                     help="--runtime ray: seconds to wait for a lost worker's replacement actor to start (then its "
                          "samples go to the others; at once when the cluster has no room), and for a killed server "
                          "shard's restart (then the run stops); e.g. 120 on a loaded machine  [default: 10]"),
        click.option("--threads-per-worker", type=int, default=None,
                     help="--runtime local: torch threads of each worker process  [default: max(1, cores // M)]"),
        click.option("--worker-timeout", type=float, default=None,
                     help="--runtime local: seconds a worker may send nothing while the server waits for it; "
                          "then it is lost, as a killed one is  [default: 300]"),
        click.option("--record-trace", type=click.Path(dir_okay=False), default=None,
                     help="--runtime local or ray: write the real order of pushes to this CSV "
                          "(replay it with --runtime sim --delay trace:FILE)"),
        click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N"),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--data-dir", type=click.Path(file_okay=False), default=None,
                     help="where the data set lies (else $STALEGRAD_DATA, the cache, /usr/share/datasets)"),
        click.option("--partition", default="shard", show_default=True, metavar="|".join(PARTITIONS),
                     help="shard: disjoint shard per worker; iid: every worker samples the whole set; "
                          "replicate:K: the set K times over, dealt to the workers (the thesis's layout: "
                          "replicate:11); an epoch is always one pass's worth of the set given"),
        click.option("--val-split", type=float, default=0, show_default=True, metavar="N",
                     help="hold N training samples (an integer, or a fraction in (0, 1)) out of training, the same "
                          "ones for every seed; each evaluation then records val_acc and val_loss (0: none)"),
        click.option("--eval-every", type=float, default=1.0, show_default=True,
                     help="evaluate the server's model every this many epochs"),
        click.option("--on-nonfinite", type=click.Choice(ON_NONFINITE), default="skip", show_default=True,
                     help="a NaN/Inf gradient or commit: skip it (and count it) or stop the run"),
        click.option("--checkpoint-every", type=int, default=0, show_default=True,
                     help="save the complete state to --out/checkpoint.pt every N server updates (0: never)"),
        click.option("--probe-every", type=int, default=0, show_default=True,
                     help="--runtime sim: every K-th server update, measure the stale message against the fresh "
                          "gradient and its alignment; writes --out/probes.jsonl (0: never; see README)"),
        click.option("--tensorboard", type=click.Path(file_okay=False), default=None,
                     help="also write TensorBoard logs (scalars, the tau histogram) to DIR (compare: DIR/ALGO); "
                          "needs pip install 'tensorboard>=2.14'"),
        click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
                     help="TOML file of options (keys as flag names); flags win"),
        click.option("--overwrite", is_flag=True, help="replace a run already in --out"),
        click.option("--quiet", "-q", is_flag=True, help="no progress output"),
    ]
    for name, (flag, ftype, help_) in ALGO_FLAGS.items():
        owners = [n for n, c in ALGORITHMS.items() if name in {x.name for x in c.hyperparameters()}]
        opts.append(click.option(flag, name, type=ftype, default=None,
                                 help=f"{help_}  [{', '.join(owners)}; see 'stalegrad algorithms']"))
    for opt in reversed(opts):
        f = opt(f)
    return f


NOT_IN_CONFIG = ("config_file", "overwrite", "quiet", "resume")


def apply_config_file(ctx: click.Context, params: dict, origins: dict | None = None) -> dict:
    """Fill every option not given on the command line from --config; ``origins`` (when given) gets
    ``{option: (file, key as written)}`` for each option the file gave (``named_in_file``)."""
    path = params.pop("config_file", None)
    if not path:
        return params
    by_name = {p.name: p for p in ctx.command.params}
    flag_names = {opt.lstrip("-"): p.name for p in ctx.command.params for opt in p.opts}

    def option(key: str) -> str:
        return flag_names.get(key.replace("_", "-"), key.replace("-", "_"))
    table = read_config_table(path, lambda key: key != CONFIG_TABLE and option(key) in by_name)
    known = sorted(n.replace("_", "-") for n in by_name if n not in NOT_IN_CONFIG)
    spelled: dict[str, str] = {}   # option -> its key as the file wrote it
    for key, value in table.items():
        name = option(key)
        if name not in by_name or name in NOT_IN_CONFIG:
            raise UsageError(f"{path}: unknown key {key!r}; keys are the flag names of "
                             f"'stalegrad {ctx.command.name}': {', '.join(known)}")
        if name in spelled:   # batch-size and batch_size (or M and workers): never the last one silently
            raise UsageError(f"{path}: {spelled[name]!r} and {key!r} are one option "
                             f"({max(by_name[name].opts, key=len)}); give it once")
        spelled[name] = key
        param = by_name[name]
        problem = toml_value_problem(param, value)
        if problem is not None:
            raise UsageError(f"{path}: {key} {problem}")
        if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            continue
        params[name] = file_value(ctx, param, value, f"{path}: {key}")
        if origins is not None:
            origins[name] = (path, key)
    return params


@contextlib.contextmanager
def named_in_file(command: click.Command, origins: dict):
    """A ``ConfigError`` about an option that a --config file gave names the file and its key as written
    there (``FILE: val_split must be ...``), not the flag that was never typed."""
    try:
        yield
    except ConfigError as e:
        if e.param not in origins:
            raise
        path, key = origins[e.param]
        text = e.for_cli(lambda p: key if p == e.param else flag_of(command, p))
        raise UsageError(f"{path}: {text}") from None


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
            print(f"stalegrad: warning: {ALGO_FLAGS[key][0]} for {name} is now {ALGO_FLAGS[new][0]}; "
                  "the old spelling goes in the next release", file=sys.stderr)
            given[new] = given.pop(key)
        elif key not in own:
            takers = [n for n, c in ALGORITHMS.items() if key in {x.name for x in c.hyperparameters()}]
            raise UsageError(f"{ALGO_FLAGS[key][0]} does not apply to {name}; it is a parameter of {', '.join(takers)}")
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


WARNED: set[str] = set()   # the deprecation lines printed by this command (main() clears it)


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
