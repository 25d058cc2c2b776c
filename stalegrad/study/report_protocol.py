"""The report's protocol section: selection on validation accuracy, reporting on other seeds, intervals
and verdicts. The statistic and the edge check are ``selection.py``, the intervals and the
verdict rule ``stats.py``; this module only gathers the runs' figures and writes the section.

The protocol (``spec``, from a grid's ``[protocol]`` table or ``stalegrad report``'s flags):

- ``select_seeds``, ``report_seeds``: disjoint lists of seeds. Given neither, both are every seed (the
  section then says loudly that the reported accuracies are those the selection saw); given one, the
  other is every other seed.
- ``tune``: the axes selected over (default ``["lr"]``): lr, lam, lam0, window, ... Every other axis
  (workers, delay, ...) is a cell of its own.
- ``arms``: ``{name: {setting: value, ...}}``: the groups with those settings become an algorithm
  ``name`` of their own (``{"dcasgd-c-placebo": {"algo": "dcasgd-c", "lam": 0.0}}``): selected
  apart, compared as any algorithm.
- ``compare``: claims ``"A>B"`` (A more accurate than B, paired by seed), default every algorithm
  against the report's baseline; ``closure``: ``[low, high]``, default ``["asgd", "sgd"]`` when both
  ran: the gap closure ``(acc_X - acc_low) / (acc_high - acc_low)`` of every other algorithm X.

The statistic is chosen per cell (``with_statistic``, which ``stages.py`` applies to a grid's stage 2 as
well): the final validation accuracy when every run of the cell has one (it was made with --val-split),
else the final TEST accuracy, which cannot select honestly: the section then says, in its title and in
the table's column "selected on", which cells were selected on test accuracy, and that for them this is
not a valid protocol.

A claim the runs cannot evaluate is refused when it cannot mean anything (a name that is no algorithm or
arm, an algorithm compared with itself, a tuned seed or algorithm, a tuned setting no run has), and
otherwise listed in ``not_evaluated`` (one line each, which the CLI prints as warnings): an algorithm
without a run, a claim no cell can pair, a selection or reporting seed without a run.
"""
from __future__ import annotations

import math

from ..errors import UsageError
from .selection import cell_key, edge_text, failure_rate, run_failure, select
from .stats import (DOES_NOT_HOLD, HOLDS, INCONCLUSIVE, LEVEL, bootstrap, ratio_of_gaps, t_interval,
                    verdict)

SPEC_KEYS = ("select_seeds", "report_seeds", "tune", "arms", "compare", "closure", "stages")
VAL, TEST = "final_val_acc", "final_test_acc"
NOT_TUNED = {"seed": "the selection averages over the seeds", "algo": "algorithms are compared, not selected "
             "(an arm makes a variant of one an algorithm of its own)",
             "val_split": "the split is what the selection is measured on"}


def check_spec(spec: dict, where: str) -> dict:
    """``spec`` with its types checked (``UsageError`` naming ``where`` and the key)."""
    unknown = [k for k in spec if k not in SPEC_KEYS]
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}; keys are {', '.join(SPEC_KEYS)}")
    out = dict(spec)
    for k in ("select_seeds", "report_seeds"):
        v = spec.get(k)
        if v is not None and (not isinstance(v, list) or not v or
                              not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in v)):
            raise UsageError(f"{where}: {k} must be a non-empty list of seeds (integers >= 0), e.g. [0, 1, 2], "
                             f"got {v!r}")
    both = set(spec.get("select_seeds") or ()) & set(spec.get("report_seeds") or ())
    if both:
        raise UsageError(f"{where}: seed {min(both)} is both a selection seed and a reporting seed; keep them "
                         "apart (e.g. select_seeds = [0, 1, 2], report_seeds = [3, 4, 5, 6, 7, 8, 9])")
    for k in ("tune", "compare", "closure"):
        v = spec.get(k)
        if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
            raise UsageError(f"{where}: {k} must be a list of strings, got {v!r}")
    if spec.get("closure") is not None and len(spec["closure"]) != 2:
        raise UsageError(f"{where}: closure must name two algorithms, [low, high], e.g. [\"asgd\", \"sgd\"]")
    for axis in spec.get("tune") or ():
        if axis in NOT_TUNED:
            raise UsageError(f"{where}: tune {axis!r}: not a setting to select over ({NOT_TUNED[axis]}); tune "
                             "settings such as lr, lam, lam0, window")
    for claim in spec.get("compare") or ():
        if claim.count(">") != 1 or not all(p.strip() for p in claim.split(">")):
            raise UsageError(f"{where}: compare {claim!r}: write a claim as \"A>B\" (A more accurate than B)")
        a, b = (x.strip() for x in claim.split(">"))
        if a == b:
            raise UsageError(f"{where}: compare {claim!r} compares {a} with itself; name two algorithms")
    if spec.get("closure") is not None and spec["closure"][0] == spec["closure"][1]:
        raise UsageError(f"{where}: closure names {spec['closure'][0]} twice; name the low and the high algorithm")
    if spec.get("stages", 2) not in (1, 2) or isinstance(spec.get("stages"), bool):
        raise UsageError(f"{where}: stages must be 2 (the selection seeds first, then the reporting seeds of the "
                         f"selected settings only; the default) or 1 (the whole product), got {spec['stages']!r}")
    arms = spec.get("arms")
    if arms is not None and (not isinstance(arms, dict) or not all(isinstance(v, dict) and v for v in arms.values())):
        raise UsageError(f"{where}: arms must be a table of name = {{setting = value, ...}}, got {arms!r}")
    from ..algorithms import ALGORITHMS
    known = [*ALGORITHMS, *(arms or {})]
    for key, name in claim_names(spec):
        if name not in known:
            raise UsageError(f"{where}: {key} names {name!r}, which is no algorithm{' or arm' * bool(arms)}; "
                             f"choose from {', '.join(known)}")
    return out


def claim_names(spec: dict) -> list[tuple[str, str]]:
    """(key, name) of every algorithm or arm that ``spec``'s claims name: ``compare 'A>B'`` and ``closure``."""
    names = [(f"compare {c!r}", x.strip()) for c in spec.get("compare") or () for x in c.split(">")]
    return names + [("closure", x) for x in spec.get("closure") or ()]


# summary.json does not record the number of classes; every data set stalegrad loads has 10
# (tests/test_selection.py checks data.DATASETS), so a run is at chance against 10 classes.
NUM_CLASSES = 10


def with_statistic(candidates: list[dict], tune) -> dict:
    """The selection statistic of each cell, one rule for the report and a grid's stage 2: ``final_val_acc``
    when every run of the cell has one, i.e. was made with --val-split, else ``final_test_acc``. Each candidate (``{"algo", "setting", "summaries": {seed: summary}}``) gets its
    ``values`` (seed -> that statistic) and ``failures`` (seed -> why its run failed, ``selection.run_failure``,
    or None) for ``selection.select``; returns {(algo, cell): statistic}."""
    cells: dict = {}
    for c in candidates:
        cells.setdefault((c["algo"], cell_key(c["setting"], tune)), []).append(c)
    out = {}
    for key, cs in cells.items():
        out[key] = VAL if all(VAL in s for c in cs for s in c["summaries"].values()) else TEST
        for c in cs:
            c["values"] = {seed: s.get(out[key]) for seed, s in c["summaries"].items()}
            c["failures"] = {seed: run_failure(s, NUM_CLASSES) for seed, s in c["summaries"].items()}
    return out


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def arm_label(g: dict, arms: dict) -> str:
    """The name a group of runs is selected and compared under: the first arm whose settings it has, else
    its algorithm (``g``: ``{"key": settings, "algo": name}``)."""
    for name, match in arms.items():
        if all(g["key"].get(k) == v or (k == "algo" and g["algo"] == v) for k, v in match.items()):
            return name
    return g["algo"]


def _context(g: dict, other: dict) -> dict:
    """The settings two groups must share to be compared: not the algorithm's own parameters (unless both
    algorithms have them), not the tuned axes (``cell``), not the worker count against one worker."""
    shared = g["algo_keys"] & other["algo_keys"]
    one = g["cell"].get("workers") == 1 or other["cell"].get("workers") == 1
    return {k: v for k, v in g["cell"].items()
            if k not in ("algo", "label") and (k not in g["algo_keys"] or k in shared) and not (one and k == "workers")}


def _seed_values(group: dict, key: str, seeds) -> dict:
    return {r["seed"]: r["summary"].get(key) for r in group["runs"] if r["seed"] in seeds}


def analyse_protocol(groups: list[dict], spec: dict | None, baseline: str, efficiency, beside=None) -> dict:
    """The protocol section of report.json (see the module docstring). ``efficiency(run_a, run_b)``: the
    temporal efficiency of the report's variant; ``beside``: the central variant's, given a second
    figure ("temporal efficiency (central)") beside each, or None."""
    spec = check_spec(dict(spec or {}), "the protocol")
    seeds = sorted({r["seed"] for g in groups for r in g["runs"]})
    sel, rep = spec.get("select_seeds"), spec.get("report_seeds")
    if sel is None and rep is None:
        sel = rep = seeds
    elif sel is None:
        sel = [s for s in seeds if s not in rep]
    elif rep is None:
        rep = [s for s in seeds if s not in sel]
    tune, arms = list(spec.get("tune") or ["lr"]), dict(spec.get("arms") or {})
    settings = {k for g in groups for k in g["key"]}
    for axis in spec.get("tune") or ():
        if axis not in settings:
            varied = sorted(k for k in settings if len({repr(g["key"].get(k)) for g in groups}) > 1)
            raise UsageError(f"the protocol: tune {axis!r} is no setting of the runs (the settings that vary among "
                             f"them: {', '.join(varied) or 'none'})")
    cands = [{"algo": arm_label(g, arms), "setting": {k: v for k, v in g["key"].items() if k != "algo"},
              "summaries": {r["seed"]: r["summary"] for r in g["runs"]}, "group": g}   # (select reads sel's)
             for g in groups]
    statistic = with_statistic(cands, tune)
    picks = select(cands, tune, sel)
    chosen = []
    for p in picks:
        c, stat = p["chosen"], statistic[(p["algo"], cell_key(p["cell"], ()))]
        entry = {"algo": p["algo"], "cell": p["cell"], "tuned": p["tuned"], "score": p["score"], "scores": p["scores"],
                 "statistic": stat, "selected_on": "validation" if stat == VAL else "TEST",
                 "edges": [dict(e, text=edge_text(e)) for e in p["edges"]],
                 "group": c["group"]["label"] if c else None}
        if c is not None:
            g = c["group"]
            test = _seed_values(g, TEST, rep)
            entry["report_test_acc"] = t_interval([test[s] if _finite(test[s]) else math.nan for s in sorted(test)])
            entry["report_seeds"] = sorted(test)
            failed = {s: c["failures"][s] for s in rep if s in c["failures"]}   # (with_statistic's): counted
            # beside the interval, whose mean is NaN if one is not finite
            entry["report_failed"] = {s: why for s, why in failed.items() if why}
            entry["report_failure_rate"] = failure_rate(failed)
            chosen.append({**entry, "_g": g, "cell": dict(cell_key(p["cell"], ())), "algo_keys": g["algo_keys"]})
        p["entry"] = entry
    on_test = [p["entry"] for p in picks if p["entry"]["statistic"] == TEST]
    selected_on = "TEST" if len(on_test) == len(picks) else "mixed" if on_test else "validation"
    algos = list(dict.fromkeys(p["algo"] for p in picks))
    claims = [tuple(x.strip() for x in c.split(">")) for c in spec.get("compare") or []] or \
        [(a, baseline) for a in algos if a != baseline]
    closure = spec.get("closure") or (["asgd", "sgd"] if {"asgd", "sgd"} <= set(algos) else None)
    # a cell's label names the settings that vary among the groups that have them: an algorithm's own fixed
    # settings (agn's outer_lr=1.0, dcasgd-a's eps) tell no cells apart, so they stay out of it
    shown = {k for g in groups for k in g["key"]
             if len({repr(h["key"][k]) for h in groups if k in h["key"]}) > 1} - {"algo"}
    figures = _figures(chosen, claims, closure, rep, efficiency, beside, shown)
    for e in (p["entry"] for p in picks):
        e["where"] = _where(e["cell"], shown)
    warnings = []
    if on_test:
        named = "; ".join(f"{e['algo']} {e['where']}" for e in on_test)
        cells = "" if selected_on == "TEST" else f" in {len(on_test)} of {len(picks)} cells ({named})"
        warnings.append(f"selected on TEST accuracy{cells} (their runs have no --val-split): not a valid protocol "
                        "there; rerun them with --val-split N to select on validation accuracy")
    if set(sel) & set(rep):
        warnings.append("the selection seeds are the reporting seeds: the reported test accuracies are those of the "
                        "runs the selection saw (give select_seeds and report_seeds apart)")
    not_evaluated = _not_evaluated(spec, sel, rep, seeds, algos, figures)
    stat_text = {"TEST": f"mean {TEST}", "validation": f"mean {VAL}",
                 "mixed": f"mean {VAL} (mean {TEST} in a cell whose runs have no validation split)"}[selected_on]
    return {"statistic": f"{stat_text} over the selection seeds", "selected_on": selected_on,
            "select_seeds": list(sel), "report_seeds": list(rep), "tune": tune, "arms": arms, "level": LEVEL,
            "warnings": warnings, "not_evaluated": not_evaluated, "selections": [p["entry"] for p in picks],
            "figures": figures,
            "edge_warnings": [f"{e['algo']} {e['where']}: {x['text']}" for e in (p["entry"] for p in picks)
                              for x in e["edges"]]}


def _not_evaluated(spec: dict, sel, rep, seeds, algos: list, figures: list) -> list[str]:
    """One line for each seed and each claim of ``spec`` that the runs cannot evaluate."""
    out = []
    for which, wanted in (("selection", sel), ("reporting", rep)):
        if missing := [s for s in wanted if s not in seeds]:
            out.append(f"no run of {which} seed(s) {', '.join(map(str, missing))} (the runs' seeds: "
                       f"{', '.join(map(str, seeds))})" + ("; a setting without a run of every selection seed is "
                                                           "not selected" if which == "selection" else ""))
    claimed = {f["claim"] if f["kind"] == "difference" else f["kind"] for f in figures}
    explicit = [(f"compare '{a}>{b}'", (a, b), f"{a} more accurate than {b}")
                for a, b in (tuple(x.strip() for x in c.split(">")) for c in spec.get("compare") or ())]
    if spec.get("closure"):
        explicit.append((f"closure {','.join(spec['closure'])}", tuple(spec["closure"]), "gap closure"))
    for what, names, claim in explicit:
        if claim in claimed:
            continue
        absent = [n for n in names if n not in algos]
        why = (f"no run of {' or '.join(absent)} (the runs have {', '.join(algos)})" if absent else
               f"no algorithm but {' and '.join(names)} ran" if claim == "gap closure" and set(algos) <= set(names)
               else "no cell where each was selected with the same other settings")
        out.append(f"{what}: not evaluated: {why}")
    return out


def _where(cell: dict, shown=None) -> str:
    """The settings of a cell that vary between groups (``shown``), as ``workers=8 delay=gamma:2``."""
    return " ".join(f"{k}={v}" for k, v in cell.items() if shown is None or k in shown) or "all runs"


def _paired(a: dict, b: dict, key: str, seeds) -> tuple[list, list, list]:
    """The seeds both selected groups ran among ``seeds``, and their values of ``key`` (NaN: not finite)."""
    va, vb = _seed_values(a["_g"], key, seeds), _seed_values(b["_g"], key, seeds)
    common = sorted(set(va) & set(vb))
    f = lambda x: float(x) if _finite(x) else math.nan   # noqa: E731
    return common, [f(va[s]) for s in common], [f(vb[s]) for s in common]


def _match(x: dict, algo: str, chosen: list[dict]) -> dict | None:
    return next((c for c in chosen if c["algo"] == algo and _context(x, c) == _context(c, x)), None)


def _figures(chosen, claims, closure, rep, efficiency, beside, shown) -> list[dict]:
    """Every derived figure with its interval and verdict, per cell of the first algorithm of a claim."""
    out = []
    for a_name, b_name in claims:
        for a in (c for c in chosen if c["algo"] == a_name):
            b = _match(a, b_name, chosen)
            if b is None:
                continue
            seeds, xa, xb = _paired(a, b, "final_test_acc", rep)
            iv = t_interval([p - q for p, q in zip(xa, xb)])
            out.append({"kind": "difference", "claim": f"{a_name} more accurate than {b_name}", "where": _where(a["cell"], shown),
                        **iv, "null": 0.0, "verdict": verdict(iv["lo"], iv["hi"], 0.0), "seeds": seeds})
            ta = {r["seed"]: r for r in a["_g"]["runs"]}
            tb = {r["seed"]: r for r in b["_g"]["runs"]}
            for kind, fn in (("temporal efficiency", efficiency), ("temporal efficiency (central)", beside)):
                if fn is None:
                    continue
                iv = t_interval([fn(ta[s], tb[s]) for s in seeds])
                out.append({"kind": kind, "claim": f"{a_name} reaches higher accuracy sooner than {b_name} "
                            f"(E > 1{', central variant' if fn is beside else ''})", "where": _where(a["cell"], shown),
                            **iv, "null": 1.0, "verdict": verdict(iv["lo"], iv["hi"], 1.0), "seeds": seeds})
    if closure:
        lo_name, hi_name = closure
        for x in (c for c in chosen if c["algo"] not in closure):
            lo, hi = _match(x, lo_name, chosen), _match(x, hi_name, chosen)
            if lo is None or hi is None:
                continue
            vals = [_seed_values(c["_g"], "final_test_acc", rep) for c in (x, lo, hi)]
            seeds = sorted(set(vals[0]) & set(vals[1]) & set(vals[2]))
            xs, ls, hs = ([float(v[s]) if _finite(v[s]) else math.nan for s in seeds] for v in vals)
            gap = t_interval([h - lv for h, lv in zip(hs, ls)])
            b = bootstrap([xs, ls, hs], ratio_of_gaps)
            v = verdict(b["lo"], b["hi"], 0.0)
            why = ""
            if verdict(gap["lo"], gap["hi"], 0.0) != HOLDS:
                v, why = INCONCLUSIVE, (f"the gap {hi_name} - {lo_name} is not established "
                                        f"({gap['mean']:.4f}, interval [{gap['lo']:.4f}, {gap['hi']:.4f}])")
            out.append({"kind": "gap closure", "claim": f"{x['algo']} closes part of the gap from {lo_name} to "
                        f"{hi_name} (closure > 0)", "where": _where(x["cell"], shown), "mean": b["value"],
                        "lo": b["lo"], "hi": b["hi"], "n": b["n"], "method": b["method"], "null": 0.0,
                        "verdict": v, "why": why, "gap": gap, "seeds": seeds})
    return out


def _iv(d: dict, spec: str = ".4f") -> str:
    if not _finite(d.get("mean")):
        return "-"
    if not (_finite(d.get("lo")) and _finite(d.get("hi"))):
        return f"{d['mean']:{spec}} (no interval, n={d['n']})"
    return f"{d['mean']:{spec}} [{d['lo']:{spec}}, {d['hi']:{spec}}] (n={d['n']})"


def render_protocol(p: dict) -> list[str]:
    """The section's markdown lines."""
    title = "## Protocol: " + {
        "TEST": "selected on TEST accuracy (no --val-split): not a valid protocol",
        "mixed": "selected on validation accuracy where the runs have a validation split, on TEST accuracy in "
                 f"{sum(s['selected_on'] == 'TEST' for s in p['selections'])} of {len(p['selections'])} cells "
                 "(no --val-split): not a valid protocol there",
        "validation": "selection on validation accuracy, test accuracy on the reporting seeds"}[p["selected_on"]]
    out = [title, "",
           f"Statistic: the {p['statistic']} ({', '.join(map(str, p['select_seeds']))}); tuned: "
           f"{', '.join(p['tune'])}; every other setting is a cell of its own. Test accuracy of the selected "
           f"setting on the reporting seeds ({', '.join(map(str, p['report_seeds']))}). Intervals: "
           f"{p['level']:.0%}; t interval over seeds for means and paired differences, percentile bootstrap over "
           "seeds for the gap closure (stalegrad/study/stats.py).", ""]
    said = p["warnings"] + p.get("not_evaluated", [])
    out += [f"**Warning:** {w}." for w in said] + ([""] if said else [])
    out += ["The sections after this one describe every group on every seed, test accuracy included: they "
            "select nothing.", ""]
    rows = []
    for s in p["selections"]:
        tuned = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in s["tuned"].items())
        on = s.get("selected_on", p["selected_on"])
        test_acc = _iv(s.get("report_test_acc", {}))
        if s.get("report_failed"):
            test_acc += f"; {s['report_failure_rate']}"
        rows.append([s["algo"], s["where"], tuned or "-", "**TEST**" if on == "TEST" else on,
                     f"{s['score']:.4f}" if _finite(s["score"]) else "none finite",
                     test_acc, "; ".join(e["text"] for e in s["edges"]) or "-"])
    out += ["| algorithm | cell | selected | selected on | selection score | test acc, reporting seeds | grid edge |",
            "|---|---|---|---|---|---|---|", *("| " + " | ".join(r) + " |" for r in rows), ""]
    if p["figures"]:
        out += ["### Derived figures and verdicts", "",
                "| claim | where | estimate [interval] (n) | method | no effect | verdict |", "|---|---|---|---|---|---|"]
        for f in p["figures"]:
            v = f["verdict"] + (f" ({f['why']})" if f.get("why") else "")
            out.append(f"| {f['claim']} | {f['where']} | {_iv(f)} | {f['method']} | {f['null']:g} | {v} |")
        out += ["", f"A verdict is '{HOLDS}' when the whole interval lies on the claim's side of the no-effect value, "
                f"'{DOES_NOT_HOLD}' when it lies wholly on the other side, '{INCONCLUSIVE}' when it holds that value. "
                "No correction for multiple comparisons.", ""]
    if p["edge_warnings"]:
        out += ["**Grid edges:** " + str(len(p["edge_warnings"])) + " selected value(s) at the edge of their grid:", ""]
        out += [f"- {w}" for w in p["edge_warnings"]] + [""]
    return out


def grid_protocol(path, table: dict, fixed: dict, axes: dict, algos) -> dict:
    """A grid file's [protocol] table, checked against the grid: its seeds are the grid's, its tuned
    settings are axes, its claims name the grid's algorithms (``algos``) or arms, and every cell holds out a
    validation split to select on."""
    where = f"{path}: [protocol]"
    spec = check_spec(dict(table), where)
    for key, name in claim_names(spec):
        if name not in algos and name not in (spec.get("arms") or {}):
            raise UsageError(f"{where}: {key} names {name}, which the grid does not run (its algorithms: "
                             f"{', '.join(algos)}{'; arms: ' + ', '.join(spec['arms']) if spec.get('arms') else ''})")
    seeds = axes.get("seed", [fixed.get("seed", 0)])
    for k in ("select_seeds", "report_seeds"):
        extra = [s for s in spec.get(k) or () if s not in seeds]
        if extra:
            raise UsageError(f"{where}: {k} lists seed {extra[0]}, which the grid does not run (its seeds: "
                             f"{', '.join(map(str, seeds))}); add it to [axes] seeds")
    for axis in spec.get("tune") or ["lr"]:
        if axis not in axes and axis != "lr":
            raise UsageError(f"{where}: tune {axis!r} is not an axis of the grid ([axes]: {', '.join(axes)})")
    if "val_split" in axes and not all(axes["val_split"]):
        raise UsageError(f"{where}: selection uses validation accuracy, but the cells of val_split = 0 in [axes] "
                         "hold out no validation samples; give val_split values > 0 only (e.g. val_split = [10000])")
    if "val_split" not in axes and not fixed.get("val_split"):
        raise UsageError(f"{where}: selection uses validation accuracy, but the runs hold out no validation "
                         "samples; set val_split in [fixed] (e.g. val_split = 10000)")
    return spec
