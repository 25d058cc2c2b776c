"""The report over many run directories: which algorithm, under which staleness, reaches which
accuracy, how fast, over seeds.

Runs that differ only by their seed form a *group*; every figure of a group is the mean and the
sample standard deviation over its seeds, with their number. ``write_report`` writes ``report.md``,
``report.json`` (strict JSON) and the PNG plots of ``report_plots.py`` into one directory.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from ..errors import RunError, UsageError
from .report_group import Group
from .report_plots import PLOTS, choose_heatmap_axes, fmt_value, make_plots, order, render
from .report_probes import analyse_probes, plot_probes, read_probes, render_probes
from .report_protocol import analyse_protocol, render_protocol
from .report_curves import (TIMES, WINDOW_S, central_curve, efficiencies, logs_train_acc, pair_efficiency,
                            time_to_target)
from .report_target import FILE as TARGET_PLOT, analyse_target, plot_target, render_target
from .report_time import MESSAGES_PER_WINDOW, WINDOWS, load_time_model, seconds_per_virtual_second, summarise
from ..run.files import StagedFiles, disk_full
from ..run.results import DamagedRun, flat_config, read_run, write_json

# Settings that do not change the experiment (where files go, how often to checkpoint), and the seed.
IGNORED = ("seed", "data_dir", "checkpoint_every", "record_trace", "probe_every", "probes",   # probes change nothing
           "threads", "numerics")   # the simulator's bits do not depend on its threads
VARIANTS = ("central", "workers", "workers-modelled")
# workers-modelled: the workers' training accuracy over modelled cluster time (report_time.py, --time-model)
TARGET_FRACTION = 0.9   # default target: 0.9 x the best group's mean best test accuracy
_MISSING = object()


class ReportError(UsageError):
    """Run directories that cannot be reported on (one-line message)."""


# ---------------------------------------------------------------- loading and grouping

def find_runs(paths) -> list[Path]:
    """Every run directory in ``paths``: each is a run directory or holds some at any depth."""
    found: list[Path] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        if not p.is_dir():
            raise ReportError(f"{p}: no such directory")
        if (p / "summary.json").exists():
            inner = [p]
        else:
            inner = sorted(s.parent for s in p.rglob("summary.json"))
            if not inner:
                raise ReportError(f"{p}: not a stalegrad run directory, and holds none (no summary.json at any depth)")
        for d in inner:
            if d.resolve() not in seen:
                seen.add(d.resolve())
                found.append(d)
    if not found:
        raise ReportError("no run directory given")
    return found


def load_runs(paths, skipped: list | None = None) -> list[dict]:
    """The usable runs in ``paths``. A damaged run raises ``DamagedRun``, or, given a list ``skipped``,
    is left out and appended to it as (directory, reason)."""
    runs = []
    lenient = skipped is not None
    skipped = skipped if lenient else []
    for d in find_runs(paths):
        try:
            runs.append(usable_run(d))
        except DamagedRun as e:
            if not lenient:
                raise
            skipped.append((e.dir, e.reason))
    if not runs:
        first = f"{skipped[0][0]}: {skipped[0][1]}"
        more = f" (and {len(skipped) - 1} more damaged run{'s' * (len(skipped) > 2)})" if len(skipped) > 1 else ""
        raise ReportError(f"no usable run to report on: {first}{more}")
    return runs


def usable_run(d: Path) -> dict:
    """The run in ``d`` with what the report needs; ``DamagedRun`` if it cannot be reported on."""
    run = read_run(d)
    try:
        run["flat"], run["algo_keys"] = flat_config(run["config"])
        run["seed"], run["algo"] = run["flat"]["seed"], run["flat"]["algo"]
    except (KeyError, AttributeError, TypeError):
        raise DamagedRun(d, "config.json is not a stalegrad run configuration (no seed or algorithm)") from None
    if not isinstance(run["algo"], str) or not isinstance(run["seed"], int):
        raise DamagedRun(d, "config.json is not a stalegrad run configuration (the algorithm is not a name, "
                            "or the seed not an integer)")
    if not central_curve(run)[0]:
        raise DamagedRun(d, "metrics.jsonl has no evaluation with a test accuracy and a virtual time")
    run["probes"] = read_probes(d)
    return run


def group_runs(runs: list[dict]) -> tuple[list[Group], dict, list[str]]:
    """Groups of runs that differ only by seed, in a stable order; the axes that vary between groups
    (name -> sorted values); notes on runs left out."""
    from ..algorithms import ALGORITHMS
    by_key: dict = {}
    notes = []
    for run in runs:
        key = tuple(sorted(((k, v) for k, v in run["flat"].items() if k not in IGNORED), key=lambda kv: kv[0]))
        g = by_key.setdefault(key, Group(dict(key), run["algo"], run["algo_keys"]))
        twin = next((r for r in g.runs if r["seed"] == run["seed"]), None)
        if twin is not None:
            notes.append(f"left out {run['dir']}: a second run of seed {run['seed']} of the same configuration "
                         f"as {twin['dir']}")
            continue
        g.runs.append(run)
    groups = list(by_key.values())
    values: dict = {}
    for g in groups:
        for k, v in g["key"].items():
            values.setdefault(k, set()).add(v)
    algo_rank = {a: i for i, a in enumerate(ALGORITHMS)}
    first = ("algo", "workers", "window", "lr", "delay")
    axes = {k: sorted(values[k], key=lambda v: (algo_rank.get(v, len(algo_rank)), v) if k == "algo" else order(v))
            for k in sorted(values, key=lambda k: (first.index(k) if k in first else len(first), k))
            if len(values[k]) > 1}
    groups.sort(key=lambda g: (algo_rank.get(g["algo"], len(algo_rank)), g["algo"],
                               *(order(g["key"].get(a)) for a in axes)))
    labels = set()
    for g in groups:
        g["runs"].sort(key=lambda r: order(r["seed"]))
        label = " ".join([g["algo"]] + [f"{a}={fmt_value(g['key'][a])}" for a in axes if a != "algo" and a in g["key"]])
        while label in labels:
            label += "'"
        labels.add(label)
        g.label = label
    return groups, axes, notes


# ---------------------------------------------------------------- statistics over seeds

def _finite(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def stat(values) -> dict:
    """Mean, sample standard deviation (n - 1) and number of the finite values (NaN where undefined)."""
    v = [float(x) for x in values if _finite(x)]
    return {"mean": statistics.fmean(v) if v else math.nan, "std": statistics.stdev(v) if len(v) > 1 else math.nan,
            "n": len(v)}


def _context(g: Group, drop_workers: bool, shared: set) -> dict:
    """A group's settings apart from its algorithm and the parameters only it has (``shared``: those both
    algorithms have, e.g. agn's and aeasgd's window, count), and the worker count against one worker."""
    return {k: v for k, v in g["key"].items()
            if k != "algo" and (k not in g["algo_keys"] or k in shared) and not (drop_workers and k == "workers")}


def baseline_for(g: Group, candidates: list[Group]) -> tuple[Group, list[str]]:
    """The baseline group with the same settings as ``g`` (the closest one if none has them all),
    and the settings in which they differ."""
    best = None
    for i, b in enumerate(candidates):
        drop, shared = b["key"].get("workers") == 1, g["algo_keys"] & b["algo_keys"]
        ca, cb = _context(g, drop, shared), _context(b, drop, shared)
        diff = sorted(k for k in ca.keys() | cb.keys() if ca.get(k, _MISSING) != cb.get(k, _MISSING))
        rank = (len(diff), b is not g, i)
        if best is None or rank < best[0]:
            best = (rank, b, diff)
    return best[1], best[2]


# ---------------------------------------------------------------- the analysis

def _lr_sweeps(groups: list[Group], axes: dict) -> dict:
    """Per algorithm and other settings: the best learning rate of the sweep, and the shared one."""
    if "lr" not in axes:
        return {"shared_lr": None, "rows": [], "why_none": "every run used one learning rate"}
    lrs_of: dict = {}
    for g in groups:
        lrs_of.setdefault(g["algo"], set()).add(g["key"]["lr"])
    shared = set.intersection(*lrs_of.values())
    best_acc = {id(g): g["best_test_acc"]["mean"] for g in groups}
    shared_lr = max(sorted(shared), key=lambda lr: statistics.fmean(
        [best_acc[id(g)] for g in groups if g["key"]["lr"] == lr and math.isfinite(best_acc[id(g)])] or [-1.0]),
        default=None)
    sweeps: dict = {}
    for g in groups:
        rest = tuple((a, g["key"].get(a)) for a in axes if a not in ("lr", "algo"))
        sweeps.setdefault((g["algo"], rest), []).append(g)
    rows = []
    for (algo, rest), gs in sweeps.items():
        if len(gs) < 2:
            continue
        best = max(gs, key=lambda g: best_acc[id(g)] if math.isfinite(best_acc[id(g)]) else -1.0)
        at_shared = next((g for g in gs if g["key"]["lr"] == shared_lr), None)
        rows.append({"setting": " ".join([algo] + [f"{a}={fmt_value(v)}" for a, v in rest if v is not None]),
                     "lrs": [g["key"]["lr"] for g in gs], "best_lr": best["key"]["lr"], "best_group": best["label"],
                     "best_test_acc": best["best_test_acc"], "final_test_acc": best["final_test_acc"],
                     "shared_lr_test_acc": at_shared["best_test_acc"] if at_shared else None,
                     "shared_lr_final_acc": at_shared["final_test_acc"] if at_shared else None})
    why = "" if rows else "no algorithm was run with more than one learning rate under the same other settings"
    return {"shared_lr": shared_lr, "rows": rows, "why_none": why}


def analyse(run_dirs, *, target=None, baseline=None, variant="central", heatmap=None,
            given_in=None, protocol=None, time_model=None) -> tuple[dict, list, tuple]:
    """Everything in report.json, the groups (``report_group.Group``, with their runs), and the heat map's axes.
    ``given_in``: where ``target`` and ``baseline`` came from (default: the options --target and --baseline);
    ``time_model``: the file of ``--time-model`` (report_time.py), for the workers-modelled variant."""
    if variant not in VARIANTS:
        raise ReportError(f"--variant {variant!r}: choose one of {', '.join(VARIANTS)}")
    if variant == "workers-modelled" and time_model is None:
        raise ReportError("--variant workers-modelled needs --time-model FILE (the measured cost of each "
                          "algorithm: benchmarks/throughput.py writes one)")
    if time_model is not None and variant != "workers-modelled":
        raise ReportError(f"--time-model is for --variant workers-modelled, not {variant}")
    model = load_time_model(time_model) if time_model is not None else None
    if target is not None and not (_finite(target) and 0 < target <= 1):
        raise ReportError(f"--target must be an accuracy in (0, 1], got {target!r}")
    skipped: list = []
    runs = load_runs(run_dirs, skipped)
    groups, axes, notes = group_runs(runs)
    notes[:0] = [f"left out {d}: {reason}" for d, reason in skipped]
    algos = list(dict.fromkeys(g["algo"] for g in groups))
    if baseline is not None and baseline not in algos:
        raise ReportError(f"--baseline {baseline!r}: no run of that algorithm; the runs have {', '.join(algos)}")
    heat_axes, heat_why = choose_heatmap_axes(axes, heatmap)
    base_default = baseline is None
    baseline = baseline or ("sgd" if "sgd" in algos else algos[0])

    for g in groups:
        rs = g.runs
        for k in ("final_test_acc", "best_test_acc", "tau_mean", "tau_max", "nonfinite_skipped"):
            g[k] = stat(r["summary"].get(k) for r in rs)
        g.diverged = [str(r["dir"]) for r in rs
                      if r["summary"].get("diverged") or not _finite(r["summary"].get("final_test_loss"))]
    best_group = max(groups, key=lambda g: g["best_test_acc"]["mean"] if g["best_test_acc"]["n"] else -1.0)
    target_default = target is None
    if target_default:
        target = TARGET_FRACTION * best_group["best_test_acc"]["mean"]
        target_rule = (f"{TARGET_FRACTION:g} x {best_group['best_test_acc']['mean']:.4f}, the mean best test accuracy "
                       f"of the best group ({best_group['label']}); set another with --target")
    else:
        target_rule = f"given in {given_in}" if given_in else "given with --target"

    used, variant_note = variant, ""
    if variant != "central" and not all(logs_train_acc(r) for g in groups for r in g["runs"]):
        used = "central"
        variant_note = (f"the {variant} variant needs per-message training accuracy (messages.jsonl, written "
                        "since stalegrad 0.3), which these runs lack; the central variant was used instead")
    modelled = None
    if model is not None:   # checked on every run before anything is written, even when the variant falls back
        for g in groups:
            for r in g["runs"]:
                r["time_scale"] = seconds_per_virtual_second(model, r)
        modelled = summarise(groups, model)
        if used == "workers-modelled" and modelled["approximate"]:
            notes.append("modelled time: the delay model of " + ", ".join(modelled["approximate"]) + " has factors "
                         "that do not average 1; its commit term assumes a speed-1 worker (report_time.py)")
    efficiency = pair_efficiency(used)
    described = {"workers": "f = the workers' mini-batch training accuracy averaged over windows of "
                            f"{WINDOW_S:g} s of real (wall) time",
                 "workers-modelled": "f = the workers' mini-batch training accuracy over modelled cluster time "
                                     "T = V x t(W) / (step_time x W), t(W) = step_s x W + commit_s the measured "
                                     "seconds per commit of the run's algorithm (--time-model), averaged over "
                                     f"the same windows for both runs of a pair: {WINDOWS} windows over the "
                                     f"shorter run, fewer when it has under {MESSAGES_PER_WINDOW} messages a "
                                     "window (at least 2)",
                 "central": "f = the central model's test accuracy over virtual time"}[used]
    beside = pair_efficiency("central") if used == "workers-modelled" else None
    candidates = [g for g in groups if g["algo"] == baseline]
    unmatched: dict[str, list[str]] = {}
    for g in groups:
        for r in g["runs"]:
            r["time_to_target"] = time_to_target(r["metrics"], target)
        reached = [r["time_to_target"] for r in g.runs if r["time_to_target"]]
        g.time_to_target = {**{k: stat(t[k] for t in reached) for k in TIMES}, "reached": len(reached),
                            "n": len(g.runs)}
        base, diff = baseline_for(g, candidates)
        per_seed = efficiencies(g, base, efficiency)
        for r in g["runs"]:
            r["temporal_efficiency"] = per_seed.get(r["seed"])
        g.temporal_efficiency = {**stat(per_seed.values()), "baseline_group": base.label, "differs_in": diff,
                                 "unpaired_seeds": [r["seed"] for r in g.runs if r["seed"] not in per_seed]}
        if beside is not None:   # the central variant beside the modelled one
            g.temporal_efficiency_central = stat(efficiencies(g, base, beside).values())
        if diff:
            unmatched.setdefault(", ".join(diff), []).append(g["label"])
        if g["temporal_efficiency"]["unpaired_seeds"]:
            notes.append(f"{g['label']}: no {base['label']} run of seed(s) "
                         f"{', '.join(map(str, g['temporal_efficiency']['unpaired_seeds']))}; left out of E")
    for diff, labels in unmatched.items():
        notes.append(f"no {baseline} group has all the settings of {'; '.join(labels)}: each is compared with the "
                     f"closest {baseline} group (column 'against'), which differs in {diff}")

    fixed = {k: v for k, v in groups[0]["key"].items() if k not in axes and all(k in g["key"] for g in groups)}
    seeds = sorted({r["seed"] for r in runs}, key=order)
    report = {
        "compared": {"runs": sum(len(g["runs"]) for g in groups), "groups": len(groups),
                     "seeds": seeds, "axes": axes, "fixed": fixed},
        "statistics": "mean ± sample standard deviation (n - 1) over seeds, (n) the number of seeds",
        "target": {"test_acc": target, "default": target_default, "rule": target_rule},
        "time_to_target_censored": analyse_target(groups, target),   # test and validation (report_target.py)
        "baseline": {"algorithm": baseline, "default": base_default,
                     "rule": ("the default: sgd when present, else the first algorithm in the order of "
                              "`stalegrad algorithms`") if base_default else
                             f"given in {given_in}" if given_in else "given with --baseline"},
        "variant": {"requested": variant, "used": used, "f": described, "note": variant_note,
                    **({"time_model": modelled} if modelled is not None else {})},
        "groups": [{**{k: g[k] for k in ("label", "algo", "final_test_acc", "best_test_acc", "time_to_target",
                                         "temporal_efficiency", "tau_mean", "tau_max", "nonfinite_skipped",
                                         "diverged")},
                    **({"temporal_efficiency_central": g["temporal_efficiency_central"]}
                       if "temporal_efficiency_central" in g else {}),
                    **({"modelled": g["modelled"]} if "modelled" in g else {}),
                    "config": g["key"], "seeds": [r["seed"] for r in g["runs"]],
                    "runs": [{"dir": str(r["dir"]), "seed": r["seed"],
                              **{k: r["summary"].get(k) for k in ("final_test_acc", "best_test_acc", "diverged")},
                              "time_to_target": r["time_to_target"], "temporal_efficiency": r["temporal_efficiency"]}
                             for r in g["runs"]]} for g in groups],
        "lr_sweep": _lr_sweeps(groups, axes),
        "protocol": analyse_protocol(groups, protocol, baseline, efficiency, beside),   # report_protocol.py
        "heatmap_axes": list(heat_axes) if heat_axes else None,
        "notes": notes,
        "skipped_runs": [{"dir": str(d), "reason": reason} for d, reason in skipped],
    }
    return report, groups, (heat_axes, heat_why)


def write_report(run_dirs, out_dir, *, target=None, baseline=None, variant="central", heatmap=None,
                 on_skip=None, given_in=None, protocol=None, time_model=None, on_warning=None) -> Path:
    """Write report.md, report.json and the plots for ``run_dirs`` into ``out_dir``; return report.md's path.

    ``target``: the test accuracy for the time-to-target tables, the same on validation accuracy where the
    runs have it (report_target.py; default 0.9 x the best group's mean best test accuracy); ``baseline``:
    the algorithm of the temporal efficiency (default sgd if present, else the first in ``ALGORITHMS`` order);
    ``variant``: ``central``, ``workers`` or ``workers-modelled`` (with ``time_model``, the path of a
    time-model file: report_time.py; the central variant is shown beside it); ``heatmap``: ``"X,Y"``, the
    heat map's two axes; ``given_in``: where ``target`` and ``baseline`` came from, for the report's
    words (default: the options --target and --baseline); ``on_skip(dir, reason)``: called for each damaged run that is left out (the
    report's notes and ``skipped_runs`` name them too); ``on_warning(line)``: called for each claim or seed of
    the protocol that the runs cannot evaluate (report.json's ``protocol.not_evaluated``).
    Raises ``ReportError`` (a ``UsageError``) for bad input, or when no run is usable, before anything
    is written; ``RunError`` when the disk is full, with nothing written (``results.StagedFiles``).
    """
    if str(out_dir) == "":
        raise ReportError("--out is empty; give a directory name (. for the current directory)")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out}: exists and is not a directory")
    report, groups, (heat_axes, heat_why) = analyse(run_dirs, target=target, baseline=baseline, variant=variant,
                                                    heatmap=heatmap, given_in=given_in, protocol=protocol,
                                                    time_model=time_model)
    for skip in report["skipped_runs"]:
        if on_skip is not None:
            on_skip(skip["dir"], skip["reason"])
    for line in report["protocol"]["not_evaluated"]:
        if on_warning is not None:
            on_warning(line)
    try:
        with StagedFiles(out) as files:   # every file of the report, or none (a full disk)
            report["plots"], report["skipped_plots"] = make_plots(groups, report, files.dir, heat_axes, heat_why)
            for name in report["skipped_plots"]:
                files.remove(PLOTS[name][0])   # not a stale figure of an earlier report
            censored = report["time_to_target_censored"]
            censored["plot"] = plot_target(groups, censored["target"], files.dir)
            if not censored["plot"]["file"]:
                files.remove(TARGET_PLOT)
            report["probes"] = analyse_probes(groups)   # runs with --probe-every (report_probes.py)
            probe_plots = plot_probes(report["probes"], files.dir)
            write_json(files.dir / "report.json", report)
            # the protocol first: what it selected; the censored time to target after the first time table
            head, table, rest = render(report, render_target(censored)).partition("## Test accuracy")
            text = "\n".join([head + "\n".join(render_protocol(report["protocol"])) + "\n" + table + rest,
                              *render_probes(report["probes"], probe_plots)])
            (files.dir / "report.md").write_text(text)
    except OSError as e:
        if disk_full(e):
            raise RunError(f"--out {out}: cannot write the report ({e.strerror}); nothing of it was written "
                           "(a report is written whole or not at all): free space there, or give another --out, "
                           "then run it again") from None
        raise ReportError(f"--out {out}: cannot write the report there ({e.strerror or e}); give another --out") \
            from None
    return out / "report.md"
