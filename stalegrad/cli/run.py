"""``stalegrad train`` and ``stalegrad compare``: runs into run directories."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import click
from click.core import ParameterSource

from ..algorithms import ALGORITHMS, as_saved
from ..core.delays import DEFAULT_DELAY, renamed_delay
from ..errors import UsageError
from ..run.files import CONFIG_LIMIT, UnreadableFile, loads_json, read_text
from ..run.option_files import file_value
from ..run.options import ALGO_FLAGS, COMPARE_OPTIONS, NOT_IN_CONFIG, TRAIN_OPTIONS, build_config, check_options
from .options import apply_config_file, click_options, named_in_file


def load_data(params: dict):
    from ..data import load_pair
    return load_pair(params["dataset"], params["data_dir"], seed=params["seed"])


def train_one(algo_name: str, params: dict, train_set, test_set, out: Path, progress: bool, resume: bool = False,
              tensorboard: str | Path | None = None, writer=None):
    """One run into ``out`` (or its continuation from ``out``'s checkpoint), and TensorBoard logs into
    ``tensorboard``; returns the TrainResult. ``writer``: the run directory, already opened (locked)
    by the caller; else it is opened here.

    Everything is checked (options, runtime, model against the data) before the run directory is touched.
    """
    import torch

    from ..run.checkpoint import CHECKPOINT_FILE
    from ..models import build_model
    from ..core.resources import check_memory, meta_model
    from ..run.rundir import RunWriter
    from ..run.training import train

    config, runtime = check_options(algo_name, params)
    config.check_data(train_set, test_set)
    shape, classes = tuple(train_set.x.shape[1:]), train_set.num_classes
    def build():
        return build_model(params["model"], shape, classes, hidden=params["hidden"])
    check_memory(config, meta_model(build), train_set, test_set)    # a model too large is refused, not built
    torch.manual_seed(config.seed)
    module = build()
    checkpoint_path = out / CHECKPOINT_FILE
    model_spec = {"name": params["model"], "input_shape": list(shape), "num_classes": classes,
                  "hidden": list(params["hidden"]) if params["hidden"] else None}
    opened = writer is not None
    if not opened:
        writer = RunWriter(out, overwrite=params["overwrite"], resume=resume)
    with contextlib.nullcontext(writer) if opened else writer:   # locked for the run
        on_eval, board = writer.metric, None
        if tensorboard is not None:
            from ..run.tblog import TensorBoardLog
            board = TensorBoardLog(tensorboard)

            def on_eval(record):
                writer.metric(record)
                board.metric(record)
        try:
            result = train(module, train_set, test_set, runtime=runtime, config=config, progress=progress,
                           on_start=writer.start, on_first_step=writer.commit, on_eval=on_eval,
                           checkpoint_path=checkpoint_path if config.checkpoint_every else None,
                           resume=checkpoint_path if resume else None)
            writer.finish(result, model_spec)
            if board is not None:
                board.finish(result)
        finally:
            if board is not None:
                board.close()
    warn_if_not_trained(result)
    return result


def warn_if_not_trained(result) -> None:
    s = result.summary
    skipped, messages = s["nonfinite_skipped"], s["nonfinite_skipped"] + s["updates"]
    if s.get("diverged"):
        click.echo(f"stalegrad: warning: the run diverged: {skipped} of {messages} updates were NaN/Inf and "
                   "skipped; lower --lr, or pass --on-nonfinite stop to stop at the first one", err=True)
    elif s["updates"] == 0 and s["samples"] > 0:
        # a window or a round longer than the budget: the run spent its samples and the weights never moved
        click.echo(f"stalegrad: warning: the budget ended before the first update ({s['samples']} samples, "
                   "no message applied): the weights are the initial ones; raise --epochs, or lower --window "
                   "or --workers", err=True)


def summary_line(name: str, res, out: Path) -> str:
    s = res.summary
    dropped = f" ({s['updates_dropped']} messages dropped)" if s.get("updates_dropped") else ""
    return (f"{name} x{s['workers']}: test acc {s['final_test_acc']:.4f} (best {s['best_test_acc']:.4f}), "
            f"tau mean {s['tau_mean']:.2f} max {s['tau_max']}, {s['updates']} updates{dropped}, "
            f"{s['virtual_s']:.1f} virtual s, {s['wall_s']:.1f} s wall -> {out}")


@click.command()
@click_options(TRAIN_OPTIONS)
@click.pass_context
def train(ctx, algo, out, resume, **params):
    """Train one model with one algorithm and write the run to --out (or continue one with --resume)."""
    from ..run.rundir import RunWriter   # (no torch: the refusals below come before it is imported)

    params["algo"] = algo
    origins: dict = {}   # the options a --config file gave: its errors name the file
    if resume is not None:
        refuse_resume_options(ctx, Path(resume))
        writer = RunWriter(resume, resume=True)   # the output checks of a new run, before config.json is read
        params = resume_params(ctx, Path(resume), params, origins)
        out = resume
    else:
        params = apply_config_file(ctx, params, origins)
        out = params.pop("out", None) or out     # an `out` key of the TOML file (the flag wins)
        if out is None:
            raise UsageError("--out DIR is required: the directory for the run's results (or --resume DIR)")
        writer = None
    with named_in_file(ctx.command, origins):
        res = _train(params, Path(out), writer, resume is not None)
    click.echo(summary_line(params["algo"], res, Path(out)))


def _train(params: dict, out: Path, writer, resume: bool):
    """``train``'s run, its options resolved."""
    from ..run.rundir import RunWriter
    algo = params["algo"]
    params = {k: v for k, v in params.items() if k != "algo"}
    check_options(algo, params)   # a bad option fails fast, before the data set is read
    if writer is None:
        writer = RunWriter(out, overwrite=params["overwrite"])   # a run already there is refused here
    writer.before_summary = finishing   # from summary.json on, the run is finished: exit 0, not interrupted
    # Locked before torch is imported and the data read: a second run on DIR is refused at once.
    with writer:
        train_set, test_set = load_data(params)
        return train_one(algo, params, train_set, test_set, out, progress=not params["quiet"], resume=resume,
                         tensorboard=params.get("tensorboard"), writer=writer)


def finishing() -> None:
    """The run's last write begins: from here it is finished, and an interrupt (Ctrl-C) is ignored until the
    command ends (main restores the handler; the process exits 0 without a traceback)."""
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


_RESUME_MAY_CHANGE = {"epochs", "data_dir", "quiet", "resume", "algo", "tensorboard"}


def refuse_resume_options(ctx: click.Context, run_dir: Path) -> None:
    """An option that --resume takes from config.json, given on the command line, is an error."""
    given = [p for p in ctx.command.params if ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE
             and p.name not in _RESUME_MAY_CHANGE]
    if given:
        raise UsageError(f"--resume takes its options from {run_dir}/config.json; drop {max(given[0].opts, key=len)} "
                         "(only --epochs, --data-dir, --quiet and --tensorboard may be given)")
    if ctx.get_parameter_source("algo") == ParameterSource.COMMANDLINE:
        raise UsageError(f"--resume takes its options from {run_dir}/config.json; drop --algo")


def resume_params(ctx: click.Context, run_dir: Path, params: dict, origins: dict | None = None) -> dict:
    """The options of the run in ``run_dir``, from its config.json; ``origins`` (when given) gets
    ``{option: (where, key)}`` for each, as ``apply_config_file`` gives it (a ConfigError names the file)."""
    refuse_resume_options(ctx, run_dir)
    try:
        cfg = loads_json(read_text(run_dir / "config.json", CONFIG_LIMIT))
        algorithm = dict(cfg["algorithm"])
        runtime = dict(cfg["runtime"])
    except FileNotFoundError:
        raise UsageError(f"--resume {run_dir}: not a stalegrad run directory (no config.json)") from None
    except UnreadableFile as e:   # (a FIFO, /dev/zero, gigabytes: refused before anything is read)
        raise UsageError(f"--resume {run_dir}: config.json {e.reason}; restore the file the run wrote, or start "
                         "afresh with --out") from None
    except OSError as e:   # a directory in its place, no permission to read it
        raise UsageError(f"--resume {run_dir}: cannot read config.json ({e.strerror or e}); make it the "
                         "readable file the run wrote, or start afresh with --out") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise UsageError(f"--resume {run_dir}: config.json is damaged ({e})") from None
    resumed = dict(params)
    for k in ALGO_FLAGS:
        resumed[k] = None
    resumed["algo"] = algorithm.pop("name", None)
    if resumed["algo"] not in ALGORITHMS:
        raise UsageError(f"--resume {run_dir}: config.json is damaged (algorithm {resumed['algo']!r})")
    options = set(params) - set(NOT_IN_CONFIG) - {"algo"} - set(ALGO_FLAGS)   # (those: in "algorithm" only)
    unknown = next((f"algorithm.{k}" for k in algorithm if k not in ALGO_FLAGS), None) \
        or next((f"runtime.{k}" for k in runtime if k not in options | RECORDED_RUNTIME_KEYS), None) \
        or next((k for k in cfg if k not in options | RECORDED_KEYS), None)
    if unknown is not None:   # an edit the run would not follow: refused, never dropped
        raise UsageError(f"--resume {run_dir}: config.json holds {unknown!r}, which is no option of a run; remove "
                         "it (the file must be as the run wrote it, but for what --resume may change)")
    by_name = {o.name: o for o in TRAIN_OPTIONS}
    given = [(f"algorithm.{k}", k, v) for k, v in as_saved(resumed["algo"], algorithm).items()]   # (a parameter
    given.append(("runtime.name", "runtime", runtime.pop("name", "sim")))   # added since: as the run ran)
    given += [(f"runtime.{k}", k, v) for k, v in runtime.items()] + [(k, k, v) for k, v in cfg.items()]
    for shown, key, value in given:   # each of the type its flag takes, and one of its choices
        if key not in by_name or key in RECORDED_RUNTIME_KEYS or (shown, key) == ("runtime", "runtime"):
            continue
        if key in ("epochs", "data_dir") and ctx.get_parameter_source(key) == ParameterSource.COMMANDLINE:
            continue
        resumed[key] = None if value is None and params.get(key) is None else file_value(   # (None: its default)
            by_name[key], value, f"--resume {run_dir}: config.json: {shown}",
            "; restore the file the run wrote, or start afresh with --out")
        if origins is not None:
            origins[key] = (f"--resume {run_dir}: config.json", shown)
    resumed["overwrite"] = False
    return resumed


# What config.json records besides the options: the data's sizes, the split's seed, the numerics and probes
# (train), and what a runtime measures or is given only in Python (RuntimeX.describe()).
RECORDED_KEYS = {"algorithm", "runtime", "train_samples", "test_samples", "val_samples", "val_split_seed",
                 "numerics", "probes"}
RECORDED_RUNTIME_KEYS = {"name", "cores", "start_method", "worker_resources", "shard_resources"}


@click.command()
@click_options(COMPARE_OPTIONS)
@click.pass_context
def compare(ctx, algos, out, **params):
    """Run several algorithms on the same data and settings; print a table.

    sgd runs sequentially (one worker); the others with --workers. The table's
    TE column is the AGN paper's temporal efficiency of test accuracy over
    virtual time against the first algorithm (E > 1: better sooner).
    """
    origins: dict = {}
    params = apply_config_file(ctx, params, origins)
    names = [a.strip() for a in algos.split(",") if a.strip()]
    unknown = [a for a in names if a not in ALGORITHMS]
    if unknown or not names:
        raise UsageError(f"--algos: unknown algorithm {unknown[0] if unknown else '(none)'!r}; "
                         f"choose from {', '.join(ALGORITHMS)}")
    if params.get("record_trace") is not None:
        raise UsageError("--record-trace records one run: use it with 'stalegrad train'")
    out = Path(out)
    with named_in_file(ctx.command, origins):
        per_algo = _check_compare(names, params, out)   # every run checked before the first one starts
    from ..run.metrics import temporal_efficiency
    from ..run.results import write_json

    train_set, test_set = load_data(params)
    with named_in_file(ctx.command, origins):
        for name, p in per_algo:
            build_config(name, p).check_data(train_set, test_set)
    rows, curves = [], {}
    for name, p in per_algo:
        board = params.get("tensorboard")
        res = train_one(name, p, train_set, test_set, out / name, progress=not params["quiet"],
                        tensorboard=Path(board) / name if board is not None else None)
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


def _check_compare(names: list[str], params: dict, out: Path) -> list[tuple[str, dict]]:
    """Every run of a comparison checked before the first one trains: no algorithm twice, no algorithm
    flag that none of them takes, each one's options, and each one's output directory OUT/ALGO."""
    from ..algorithms import renamed
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise UsageError(f"--algos lists {twice} twice; each algorithm runs once, into --out/{twice}")
    owns = {n: {f.name for f in ALGORITHMS[n].hyperparameters()} for n in names}
    for key, flag in ALGO_FLAGS.items():
        if params.get(key) is not None and not any(key in own or renamed(ALGORITHMS[n], key) for n, own in owns.items()):
            takers = [n for n, c in ALGORITHMS.items() if key in {f.name for f in c.hyperparameters()}]
            raise UsageError(f"{flag} applies to none of the compared algorithms ({', '.join(names)}); it is a "
                             f"parameter of {', '.join(takers)}")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory; choose another path")
    per_algo = []
    for name in names:
        p = dict(params)
        p["workers"] = 1 if ALGORITHMS[name].sequential else params["workers"]
        # Parameters of other algorithms in the comparison are not errors here.
        for k in ALGO_FLAGS:
            if k not in owns[name] and not renamed(ALGORITHMS[name], k):
                p[k] = None
        check_options(name, p)
        per_algo.append((name, p))
    from ..run.rundir import RunWriter   # (imports torch: not for a mistake in the options)
    for name, _ in per_algo:
        RunWriter(out / name, overwrite=params["overwrite"])   # only checks: an existing run, a file in the way
    return per_algo


def shown_delay(delay) -> str:
    delay = DEFAULT_DELAY if delay is None else delay
    return renamed_delay(delay) or delay


def _table(rows: list[dict], params: dict, base: str) -> str:
    from ..run.progress import count
    head = (f"{params['dataset']} / {params['model']}, {count(params['epochs'], 'epoch')}, batch {params['batch_size']}, "
            f"delay {shown_delay(params.get('delay'))}, seed {params['seed']}")
    cols = ["algorithm", "M", "test acc", "best acc", "test loss", "tau mean", "tau max", "updates",
            "virtual s", "wall s", f"TE vs {base}"]
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        cells = [r["algorithm"], str(r["workers"]), f"{r['final_test_acc']:.4f}", f"{r['best_test_acc']:.4f}",
                 f"{r['final_test_loss']:.4f}", f"{r['tau_mean']:.2f}", str(r["tau_max"]), str(r["updates"]),
                 f"{r['virtual_s']:.0f}", f"{r['wall_s']:.1f}", f"{r['temporal_efficiency']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
