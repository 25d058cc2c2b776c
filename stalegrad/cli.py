"""The ``stalegrad`` command line: train, compare, data fetch, algorithms.

Every user mistake ends in one line on stderr, ``stalegrad: error: ...``, and
exit code 2, before any training starts. Options come from three places, in
rising priority: defaults, ``--config FILE.toml``, flags.
"""
from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import click
from click.core import ParameterSource

from .algorithms import ALGORITHMS, make_algorithm
from .data import DATASETS, DataError
from .delays import DELAY_MODELS
from .models import MODELS, ModelError
from .results import OutputError
from .runtimes import RUNTIMES
from .runtimes.local import WorkerError
from .server import ON_NONFINITE, NonFiniteError
from .worker import PARTITIONS


class UserError(click.ClickException):
    exit_code = 2


def _algorithm_flags() -> dict[str, tuple]:
    """Every algorithm hyper-parameter as (flag, type, help), merged by name."""
    flags: dict[str, tuple] = {}
    for cls in ALGORITHMS.values():
        for f in cls.hyperparameters():
            if f.name not in flags:
                choices = f.metadata.get("choices")
                ftype = click.Choice(choices) if choices else {int: click.IntRange(min=1), float: float}.get(type(f.default), str)
                flags[f.name] = (f.metadata["flag"], ftype, f.metadata["help"])
    return flags


ALGO_FLAGS = _algorithm_flags()


def _csv_floats(ctx, param, value):
    if value is None or isinstance(value, (list, tuple)):
        return tuple(value) if value is not None else None
    try:
        return tuple(float(v) for v in str(value).split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers like 80,120, got {value!r}") from None


def _csv_ints(ctx, param, value):
    if value is None or isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value) if value is not None else None
    try:
        sizes = tuple(int(v) for v in str(value).split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated sizes like 256,128, got {value!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise click.BadParameter(f"hidden sizes must be positive integers, got {value!r}")
    return sizes


def run_options(f):
    """Options shared by ``train`` and ``compare`` (algorithm flags included)."""
    opts = [
        click.option("--workers", "-M", type=click.IntRange(min=1), default=None,
                     help="number of workers M  [default: 4; 1 for sgd]"),
        click.option("--dataset", type=click.Choice(DATASETS), default="digits", show_default=True),
        click.option("--model", type=click.Choice(MODELS), default="mlp", show_default=True),
        click.option("--hidden", callback=_csv_ints, default=None, help="mlp hidden sizes, e.g. 256,128"),
        click.option("--epochs", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True),
        click.option("--batch-size", type=click.IntRange(min=1), default=128, show_default=True),
        click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="learning rate (server SGD, or the local optimizer)  [default: 0.1; 0.001 with local adam]"),
        click.option("--lr-milestones", callback=_csv_floats, default=None,
                     help="step decay: epochs at which lr is multiplied by --lr-gamma, e.g. 80,120"),
        click.option("--lr-gamma", type=click.FloatRange(min=0, min_open=True), default=0.1, show_default=True),
        click.option("--delay", default="uniform", show_default=True, help="simulator delay model: " + ", ".join(DELAY_MODELS)),
        click.option("--step-time", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
                     help="virtual seconds of one local step of a speed-1 worker"),
        click.option("--vectorised", is_flag=True,
                     help="--runtime sim: compute the gradients of waiting workers in one batched call "
                          "(gradient algorithms; see docs/performance.md)"),
        click.option("--runtime", type=click.Choice(RUNTIMES), default="sim", show_default=True,
                     help="sim: deterministic simulator; local: real worker processes on this machine"),
        click.option("--threads-per-worker", type=click.IntRange(min=1), default=None,
                     help="--runtime local: torch threads of each worker process  [default: max(1, cores // M)]"),
        click.option("--record-trace", type=click.Path(dir_okay=False), default=None,
                     help="--runtime local: write the real order of pushes to this CSV "
                          "(replay it with --runtime sim --delay trace:FILE)"),
        click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N]"),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--data-dir", type=click.Path(file_okay=False), default=None,
                     help="where the data set lies (else $STALEGRAD_DATA, the cache, /usr/share/datasets)"),
        click.option("--partition", type=click.Choice(PARTITIONS), default="shard", show_default=True,
                     help="shard: disjoint shard per worker; iid: every worker samples the whole set"),
        click.option("--eval-every", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
                     help="evaluate the server's model every this many epochs"),
        click.option("--on-nonfinite", type=click.Choice(ON_NONFINITE), default="skip", show_default=True,
                     help="a NaN/Inf gradient or commit: skip it (and count it) or stop the run"),
        click.option("--checkpoint-every", type=click.IntRange(min=0), default=0, show_default=True,
                     help="save the complete state to --out/checkpoint.pt every N server updates (0: never)"),
        click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
                     help="TOML file of options (keys as flag names); flags win"),
        click.option("--overwrite", is_flag=True, help="replace a run already in --out"),
        click.option("--quiet", "-q", is_flag=True, help="no progress bar"),
    ]
    for name, (flag, ftype, help_) in ALGO_FLAGS.items():
        owners = [n for n, c in ALGORITHMS.items() if name in {x.name for x in c.hyperparameters()}]
        opts.append(click.option(flag, name, type=ftype, default=None,
                                 help=f"{help_}  [{', '.join(owners)}; see 'stalegrad algorithms']"))
    for opt in reversed(opts):
        f = opt(f)
    return f


def _apply_config(ctx: click.Context, params: dict) -> dict:
    """Fill every option not given on the command line from --config."""
    path = params.pop("config_file", None)
    if not path:
        return params
    try:
        with open(path, "rb") as fh:
            table = tomllib.load(fh)
    except FileNotFoundError:
        raise UserError(f"--config {path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"--config {path}: not valid TOML ({e})") from None
    table = table.get("train", table)  # allow either flat keys or a [train] table
    by_name = {p.name: p for p in ctx.command.params}
    flag_names = {opt.lstrip("-"): p.name for p in ctx.command.params for opt in p.opts}
    for key, value in table.items():
        name = flag_names.get(key.replace("_", "-"), key.replace("-", "_"))
        if name not in by_name or name in ("config_file", "overwrite", "quiet"):
            raise UserError(f"--config {path}: unknown key {key!r}; keys are the flag names, e.g. algo, workers, lam0")
        if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            continue
        param = by_name[name]
        try:
            if param.callback is not None:
                value = param.callback(ctx, param, value)
            else:
                value = param.type_cast_value(ctx, value)
        except click.BadParameter as e:
            raise UserError(f"--config {path}: {key}: {e.message}") from None
        params[name] = value
    return params


def _build_algorithm(name: str, params: dict):
    given = {k: params.pop(k) for k in list(ALGO_FLAGS) if params.get(k) is not None}
    own = {f.name for f in ALGORITHMS[name].hyperparameters()}
    for key in given:
        if key not in own:
            flag = ALGO_FLAGS[key][0]
            takers = [n for n, c in ALGORITHMS.items() if key in {x.name for x in c.hyperparameters()}]
            raise UserError(f"{flag} does not apply to {name}; it is a parameter of {', '.join(takers)}")
    for k in list(ALGO_FLAGS):
        params.pop(k, None)
    try:
        return make_algorithm(name, **given)
    except ValueError as e:
        raise UserError(str(e)) from None


def _load_data(params: dict):
    from .data import load_pair
    try:
        return load_pair(params["dataset"], params["data_dir"], seed=params["seed"])
    except DataError as e:
        raise UserError(str(e)) from None


def _train_one(algo_name: str, params: dict, train_set, test_set, out: Path, progress: bool, resume: bool = False):
    """One run into ``out`` (or its continuation from ``out``'s checkpoint); returns the TrainResult."""
    from .checkpoint import CHECKPOINT_FILE, CheckpointError
    from .models import build_model
    from .results import RunWriter
    from .train import train

    p = dict(params)
    algorithm = _build_algorithm(algo_name, p)
    workers = p["workers"] if p["workers"] is not None else (1 if algorithm.sequential else 4)
    if algorithm.sequential and workers != 1:
        raise UserError(f"--algo {algo_name} is sequential and runs one worker; pass --workers 1 "
                        "(asgd is its asynchronous counterpart)")
    if p["device"] != "cpu" and not p["device"].startswith("cuda"):
        raise UserError(f"--device {p['device']!r}: use cpu or cuda[:N]")
    if p["device"].startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise UserError(f"--device {p['device']}: CUDA is not available on this machine; use --device cpu")
    if p["hidden"] is not None and p["model"] != "mlp":
        raise UserError(f"--hidden applies to --model mlp only, not {p['model']}")
    runtime = _build_runtime(p, workers)
    shape, classes = tuple(train_set.x.shape[1:]), train_set.num_classes
    try:
        import torch
        torch.manual_seed(p["seed"])
        module = build_model(p["model"], shape, classes, hidden=p["hidden"])
    except ModelError as e:
        raise UserError(f"{e} (dataset {p['dataset']})") from None
    batch = p["batch_size"]
    per_worker = len(train_set.y) if p["partition"] == "iid" else len(train_set.y) // workers
    if batch > per_worker:
        raise UserError(f"--batch-size {batch} is larger than each worker's {per_worker} samples "
                        f"({p['dataset']}, {workers} workers); lower --batch-size or --workers, or use --partition iid")
    try:
        writer = RunWriter(out, overwrite=p["overwrite"], resume=resume)
    except OutputError as e:
        raise UserError(str(e)) from None
    config = {"dataset": p["dataset"], "model": p["model"], "hidden": list(p["hidden"]) if p["hidden"] else None,
              "data_dir": p["data_dir"], "checkpoint_every": p["checkpoint_every"]}
    checkpoint_path = out / CHECKPOINT_FILE
    model_spec = {"name": p["model"], "input_shape": list(shape), "num_classes": classes,
                  "hidden": list(p["hidden"]) if p["hidden"] else None}
    try:
        result = train(module, train_set, test_set, algorithm, workers, runtime, epochs=p["epochs"],
                       batch_size=batch, lr=p["lr"], lr_milestones=p["lr_milestones"] or (), lr_gamma=p["lr_gamma"],
                       eval_every=p["eval_every"], partition=p["partition"], seed=p["seed"], device=p["device"],
                       on_nonfinite=p["on_nonfinite"], progress=progress, config=config,
                       on_start=writer.start, on_eval=writer.metric,
                       checkpoint_every=p["checkpoint_every"] or 0, checkpoint_path=checkpoint_path,
                       resume=checkpoint_path if resume else None)
    except CheckpointError as e:
        raise UserError(str(e)) from None
    writer.finish(result, model_spec)
    return result


def _build_runtime(p: dict, workers: int):
    """The runtime that --runtime names, with its options checked (UserError otherwise)."""
    from .runtimes import LocalRuntime, Simulator
    if p["runtime"] == "local":
        if p["delay"] != "uniform" or p["step_time"] != 1.0:
            flag = "--delay" if p["delay"] != "uniform" else "--step-time"
            raise UserError(f"{flag} applies to --runtime sim; --runtime local measures real delays "
                            "(record them with --record-trace FILE, replay them with --runtime sim --delay trace:FILE)")
        if p.get("vectorised"):
            raise UserError("--vectorised applies to --runtime sim")
        trace = p.get("record_trace")
        if trace is not None and not Path(trace).resolve().parent.is_dir():
            raise UserError(f"--record-trace {trace}: the directory {Path(trace).parent} does not exist")
        return LocalRuntime(threads_per_worker=p.get("threads_per_worker"), record_trace=trace)
    if p.get("record_trace") is not None:
        raise UserError("--record-trace records a real run: use it with --runtime local "
                        "(--runtime sim replays a recorded trace with --delay trace:FILE)")
    if p.get("threads_per_worker") is not None:
        raise UserError("--threads-per-worker applies to --runtime local only")
    try:
        from .delays import parse_delay
        parse_delay(p["delay"], workers)        # validate before any work
        return Simulator(delay=p["delay"], step_time=p["step_time"], vectorised=bool(p.get("vectorised")))
    except ValueError as e:
        raise UserError(str(e)) from None


def _summary_line(name: str, res, out: Path) -> str:
    s = res.summary
    return (f"{name} x{s['workers']}: test acc {s['final_test_acc']:.4f} (best {s['best_test_acc']:.4f}), "
            f"tau mean {s['tau_mean']:.2f} max {s['tau_max']}, {s['updates']} updates, "
            f"{s['virtual_s']:.1f} virtual s, {s['wall_s']:.1f} s wall -> {out}")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="stalegrad")
def cli():
    """Asynchronous data-parallel training with staleness-aware optimizers (DC-ASGD, AGN, and baselines)."""


@cli.command()
@click.option("--algo", type=click.Choice(list(ALGORITHMS)), default="asgd", show_default=True)
@run_options
@click.option("--out", type=click.Path(file_okay=False), default=None, help="run directory for the results  [required]")
@click.option("--resume", type=click.Path(file_okay=False), default=None,
              help="continue the run in DIR from its last checkpoint; DIR/config.json gives every other option "
                   "(only --epochs, to extend it, --data-dir and --quiet may be given)")
@click.pass_context
def train(ctx, algo, out, resume, **params):
    """Train one model with one algorithm and write the run to --out."""
    params["algo"] = algo
    if resume is not None:
        params = _resume_params(ctx, Path(resume), params)
        out = resume
    else:
        params = _apply_config(ctx, params)
        out = params.pop("out", None) or out
        if out is None:
            raise UserError("--out DIR is required: the directory for the run's results (or --resume DIR)")
    out = Path(out)
    algo = params.pop("algo")
    train_set, test_set = _load_data(params)
    res = _train_one(algo, params, train_set, test_set, out, progress=not params["quiet"], resume=resume is not None)
    click.echo(_summary_line(algo, res, out))


_RESUME_MAY_CHANGE = {"epochs", "data_dir", "quiet", "resume", "algo"}


def _resume_params(ctx: click.Context, run_dir: Path, params: dict) -> dict:
    """The options of the run in ``run_dir``, from its config.json."""
    given = [p for p in ctx.command.params if ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE
             and p.name not in _RESUME_MAY_CHANGE]
    if given:
        raise UserError(f"--resume takes its options from {run_dir}/config.json; drop {max(given[0].opts, key=len)} "
                        "(only --epochs, --data-dir and --quiet may be given)")
    if ctx.get_parameter_source("algo") == ParameterSource.COMMANDLINE:
        raise UserError(f"--resume takes its options from {run_dir}/config.json; drop --algo")
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
        algorithm = dict(cfg["algorithm"])
        runtime = dict(cfg["runtime"])
    except FileNotFoundError:
        raise UserError(f"--resume {run_dir}: not a stalegrad run directory (no config.json)") from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"--resume {run_dir}: config.json is damaged ({e})") from None
    resumed = dict(params)
    for k in ALGO_FLAGS:
        resumed[k] = None
    resumed["algo"] = algorithm.pop("name")
    resumed.update(algorithm)
    resumed["runtime"] = runtime.pop("name", "sim")
    for key, value in list(runtime.items()) + list(cfg.items()):
        if key in resumed and key not in ("algorithm", "runtime"):
            if key == "epochs" and ctx.get_parameter_source("epochs") == ParameterSource.COMMANDLINE:
                continue
            if key == "data_dir" and ctx.get_parameter_source("data_dir") == ParameterSource.COMMANDLINE:
                continue
            resumed[key] = tuple(value) if isinstance(value, list) else value
    resumed["overwrite"] = False
    return resumed


@cli.command()
@click.option("--algos", default="sgd,asgd,dcasgd-a,agn", show_default=True,
              help="comma-separated algorithms to run one after the other")
@run_options
@click.option("--out", type=click.Path(file_okay=False), required=True, help="directory; one run per algorithm inside")
@click.pass_context
def compare(ctx, algos, out, **params):
    """Run several algorithms on the same data and settings; print a table.

    sgd runs sequentially (one worker); the others with --workers. The table's
    TE column is the AGN paper's temporal efficiency of test accuracy over
    virtual time against the first algorithm (E > 1: better sooner).
    """
    from .metrics import temporal_efficiency
    from .results import write_json

    params = _apply_config(ctx, params)
    names = [a.strip() for a in algos.split(",") if a.strip()]
    unknown = [a for a in names if a not in ALGORITHMS]
    if unknown or not names:
        raise UserError(f"--algos: unknown algorithm {unknown[0] if unknown else '(none)'!r}; "
                        f"choose from {', '.join(ALGORITHMS)}")
    workers = params["workers"]
    if params.get("record_trace") is not None:
        raise UserError("--record-trace records one run: use it with 'stalegrad train'")
    train_set, test_set = _load_data(params)
    out = Path(out)
    rows, curves = [], {}
    for name in names:
        p = dict(params)
        if ALGORITHMS[name].sequential:
            p["workers"] = 1
        elif workers is None:
            p["workers"] = 4
        # Parameters of other algorithms in the comparison are not errors here.
        own = {f.name for f in ALGORITHMS[name].hyperparameters()}
        for k in ALGO_FLAGS:
            if k not in own:
                p[k] = None
        res = _train_one(name, p, train_set, test_set, out / name, progress=not params["quiet"])
        curves[name] = ([m["virtual_s"] for m in res.metrics], [m["test_acc"] for m in res.metrics])
        rows.append({"algorithm": name, **{k: res.summary[k] for k in (
            "workers", "final_test_acc", "best_test_acc", "final_test_loss", "tau_mean", "tau_max", "updates",
            "virtual_s", "wall_s", "nonfinite_skipped")}})
    base = names[0]
    for row in rows:
        row["temporal_efficiency"] = temporal_efficiency(curves[row["algorithm"]], curves[base])
    write_json(out / "comparison.json", {"baseline": base, "rows": rows})
    table = _table(rows, params, base)
    (out / "comparison.md").write_text(table + "\n")
    click.echo(table)


def _table(rows: list[dict], params: dict, base: str) -> str:
    head = f"{params['dataset']} / {params['model']}, {params['epochs']:g} epochs, batch {params['batch_size']}, delay {params['delay']}, seed {params['seed']}"
    cols = ["algorithm", "M", "test acc", "best acc", "test loss", "tau mean", "tau max", "updates",
            "virtual s", "wall s", f"TE vs {base}"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        cells = [r["algorithm"], str(r["workers"]), f"{r['final_test_acc']:.4f}", f"{r['best_test_acc']:.4f}",
                 f"{r['final_test_loss']:.4f}", f"{r['tau_mean']:.2f}", str(r["tau_max"]), str(r["updates"]),
                 f"{r['virtual_s']:.0f}", f"{r['wall_s']:.1f}", f"{r['temporal_efficiency']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="image file (.png, .pdf, .svg)")
@click.option("--x", "x_axis", default="virtual_s", show_default=True, help="virtual_s, wall_s, epoch, updates or samples")
@click.option("--y", "y_axis", default="test_acc", show_default=True, help="test_acc, test_loss, train_loss, tau_mean or lr")
@click.option("--no-staleness", is_flag=True, help="leave out the staleness histogram panel")
@click.option("--title", default=None)
def plot(runs, out, x_axis, y_axis, no_staleness, title):
    """Plot the metric curves (and tau histograms) of run directories.

    A compare directory stands for all its runs.
    """
    from .plot import PlotError, plot_runs
    dirs = []
    for r in map(Path, runs):
        inner = sorted(p.parent for p in r.glob("*/summary.json")) if not (r / "summary.json").exists() else []
        dirs.extend(inner or [r])
    try:
        path = plot_runs(dirs, out, x=x_axis, y=y_axis, staleness=not no_staleness, title=title)
    except (PlotError, OutputError) as e:
        raise UserError(str(e)) from None
    click.echo(f"wrote {path}")


@cli.command("algorithms")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def algorithms_cmd(as_json):
    """Every algorithm with its update rule, parameters and defaults."""
    if as_json:
        click.echo(json.dumps({n: {"summary": c.summary, "rule": c.rule, "synchronous": c.synchronous,
                                   "parameters": {f.name: {"default": f.default, "flag": f.metadata["flag"],
                                                           "help": f.metadata["help"]} for f in c.hyperparameters()}}
                               for n, c in ALGORITHMS.items()}, indent=2))
        return
    for name, cls in ALGORITHMS.items():
        kind = "synchronous" if cls.synchronous else ("sequential" if cls.sequential else "asynchronous")
        click.echo(f"{name}  ({kind})\n  {cls.summary}\n  rule: {cls.rule}")
        for f in cls.hyperparameters():
            choices = f.metadata.get("choices")
            extra = f"  one of {', '.join(choices)}" if choices else ""
            click.echo(f"    {f.metadata['flag']:<18} {f.default!s:<8} {f.metadata['help']}{extra}")
        click.echo("")


@cli.group()
def data():
    """Data sets: fetch them into the cache."""


@data.command("fetch")
@click.argument("name", type=click.Choice(DATASETS))
@click.option("--dest", type=click.Path(file_okay=False), default=None, help="target directory [default: the user cache]")
def data_fetch(name, dest):
    """Download a data set from its canonical source, checking its checksums."""
    from .data import FILE_DATASETS, fetch
    try:
        path = fetch(name, Path(dest) if dest else None)
    except DataError as e:
        raise UserError(str(e)) from None
    if name in FILE_DATASETS:
        click.echo(f"{name}: ready in {path}")


def main(argv=None) -> int:
    """Entry point: one-line errors, exit 2 for usage errors, 1 for a failed run."""
    try:
        cli.main(args=argv, prog_name="stalegrad", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("stalegrad: interrupted", err=True)
        return 130
    except click.ClickException as e:
        msg = e.format_message().replace("\n", " ")
        hint = ""
        if isinstance(e, click.UsageError) and not isinstance(e, UserError) and e.ctx is not None:
            hint = f" (see '{e.ctx.command_path} --help')"
        click.echo(f"stalegrad: error: {msg}{hint}", err=True)
        return e.exit_code
    except (NonFiniteError, WorkerError) as e:   # the run failed, not the user
        click.echo(f"stalegrad: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("stalegrad: interrupted", err=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
