"""The selection statistic and the grid-edge check, written in one place. Pure functions, no I/O.

**The statistic:** a setting's score is the mean, over the *selection seeds*, of its runs' final
validation accuracy (``final_val_acc`` in summary.json). Within each *cell* (one algorithm, one value
of every axis that is not tuned: workers, delay, window, ...) the setting of the tuned axes (lr, lam,
lam0, ...) with the highest score is selected; ties go to the first in sorted order of the tuned
values. A setting that lacks a run of a selection seed is not a candidate (it is listed as missing).

**Failed runs are counted, never averaged away.** A run *fails* (``run_failure``) when summary.json
says ``diverged``, when a final loss or accuracy is not finite, or when a final accuracy is at chance
(at most ``1 / num_classes + CHANCE_MARGIN``). A setting with a failed run of a selection seed scores
NaN, so it ranks below every finite score, and ``select`` lists each setting's failures as "k of n
diverged" (``failure_rate``) with their reasons. Test accuracy is then reported only for the selected
settings, on the *reporting seeds*, which the selection never saw (``report_protocol.py``).

**The edge check:** a selected value that is the smallest or the largest of the (at least two) values
its axis takes in the cell is at the edge of the grid: the optimum may lie outside it. ``edges`` says
which, and ``extend`` the next value a grid should add (one more step of the grid's own spacing:
geometric for positive values, else arithmetic).
"""
from __future__ import annotations

import math
import statistics

from ..core.options import MAX_SEED
from ..errors import UsageError


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _sort_key(v):
    return (0, v, "") if _number(v) else (1, 0, str(v))


# A collapsed model predicts one class and scores that class's share, about 1/K on the balanced data sets
# here (at most 1.35 points above: MNIST test's "1", 11.35%); guessing scores 1/K give or take 0.3 points
# on 10000 samples, 1.7 on digits' 300 validation samples. A margin of 5 points (15% for K = 10) is 3 of
# those 1.7-point deviations above chance, and an absolute margin, unlike a multiple of 1/K, still means
# "chance" for K = 2 (55%, where 1.5/K would call a 70% classifier failed). In the committed reports
# (docs/results/*/report.json, 342 runs) 25 runs end at 0.0999-0.1178, only 4 of them flagged `diverged`;
# the next lowest end at 0.16-0.19, above chance: not failed (their low score ranks them low on its own).
CHANCE_MARGIN = 0.05
_LOSSES = (("final_test_loss", "final test loss"), ("final_val_loss", "final validation loss"))
_ACCURACIES = (("final_val_acc", "final validation accuracy"), ("final_test_acc", "final test accuracy"))


def run_failure(summary: dict, num_classes: int | None = None) -> str | None:
    """Why a finished run failed, or None when it did not. ``summary``: summary.json's fields (or a grid
    record's copy of some of them); a field that is absent is not checked, one that is present but null
    counts as not finite (summary.json writes NaN and infinities as null). A run fails when

    - ``diverged`` is true (training.py: the final test loss is not finite, or more messages were
      skipped as non-finite than updates applied);
    - ``final_test_loss``, ``final_val_loss``, ``final_val_acc`` or ``final_test_acc`` is not finite;
    - a final accuracy is at chance: at most ``1 / num_classes + CHANCE_MARGIN``. summary.json does not
      record the number of classes: the caller gives it (``num_classes``; None: no chance check)."""
    if summary.get("diverged") is True:
        return "diverged (summary.json)"
    for key, name in _LOSSES + _ACCURACIES:
        if key in summary and not (_number(summary[key]) and math.isfinite(summary[key])):
            return f"{name} is not finite"
    if num_classes:
        chance = 1.0 / num_classes + CHANCE_MARGIN
        for key, name in _ACCURACIES:
            if key in summary and summary[key] <= chance:
                return (f"{name} {summary[key]:.4f} is at chance "
                        f"(at most 1/{num_classes} + {CHANCE_MARGIN:g} = {chance:.4f})")
    return None


def failure_rate(failures) -> str:
    """``"k of n diverged"``: ``failures`` holds one entry per run (a mapping seed -> ``run_failure``'s
    reason or None, or a list of them); "diverged" means failed in ``run_failure``'s sense."""
    reasons = list(failures.values()) if isinstance(failures, dict) else list(failures)
    return f"{sum(r is not None for r in reasons)} of {len(reasons)} diverged"


def score(values: dict, seeds, failures: dict | None = None) -> tuple[float, list]:
    """(mean of ``values[seed]`` over ``seeds``, the seeds missing from ``values``); NaN when any value
    is absent (None) or not finite, or when ``failures[seed]`` gives a reason (``run_failure``): a failed
    run is never averaged away."""
    missing = [s for s in seeds if s not in values]
    if missing or not seeds:
        return math.nan, missing
    v = [values[s] for s in seeds]
    if any(not _number(x) or not math.isfinite(x) for x in v) or any((failures or {}).get(s) for s in seeds):
        return math.nan, []
    return statistics.fmean(float(x) for x in v), []


def cell_key(setting: dict, tune) -> tuple:
    """The settings of a candidate apart from the tuned axes, as a hashable key."""
    return tuple(sorted(((k, v) for k, v in setting.items() if k not in tune), key=lambda kv: kv[0]))


def select(candidates: list[dict], tune, seeds) -> list[dict]:
    """One selection per cell. Each candidate is ``{"algo", "setting": {axis: value}, "values": {seed:
    selection statistic}, "failures": {seed: reason or None} (optional, ``run_failure``), ...}`` (other
    keys are kept); ``setting`` holds every setting but the seed (the algorithm's name included or not).
    Returns, in the order the cells first appear::

        {"algo", "cell": {axis: value}, "chosen": candidate or None, "tuned": {axis: value}, "score",
         "scores": [{"tuned", "score", "missing", "failed": {seed: reason}, "failure_rate"}],
         "edges": [...] (see ``edges``)}

    ``failed`` and ``failure_rate`` ("k of n diverged") count the selection seeds' failed runs.
    ``chosen`` is None when no candidate of the cell has a finite score."""
    tune = tuple(tune)
    cells: dict = {}
    for c in candidates:
        cells.setdefault((c["algo"], cell_key(c["setting"], tune)), []).append(c)
    out = []
    for (algo, key), cs in cells.items():
        cs = sorted(cs, key=lambda c: tuple(_sort_key(c["setting"].get(a)) for a in tune))
        scored = []
        for c in cs:
            s, missing = score(c["values"], seeds, c.get("failures"))
            scored.append((c, s, missing))
        finite = [(c, s) for c, s, missing in scored if not missing and math.isfinite(s)]
        chosen, best = None, math.nan
        for c, s in finite:   # the first of the highest: ties go to the first in sorted order
            if chosen is None or s > best:
                chosen, best = c, s
        tuned = {a: chosen["setting"][a] for a in tune if a in chosen["setting"]} if chosen else {}
        values = {a: [c["setting"][a] for c in cs if a in c["setting"]] for a in tuned}
        out.append({"algo": algo, "cell": dict(key), "chosen": chosen, "tuned": tuned, "score": best,
                    "scores": [{"tuned": {a: c["setting"].get(a) for a in tune if a in c["setting"]}, "score": s,
                                "missing": missing, **_failed(c, seeds)} for c, s, missing in scored],
                    "edges": edges(tuned, values)})
    return out


def _failed(candidate: dict, seeds) -> dict:
    """A candidate's failed runs of ``seeds`` (``{seed: reason}``) and their rate over those that ran."""
    failures = candidate.get("failures") or {}
    ran = {s: failures.get(s) for s in seeds if s in candidate["values"]}
    return {"failed": {s: r for s, r in ran.items() if r}, "failure_rate": failure_rate(ran)}


def edges(chosen: dict, values: dict) -> list[dict]:
    """The tuned axes whose selected value ``chosen[axis]`` is the smallest or largest of the at least
    two numeric values ``values[axis]`` of the cell: ``{"axis", "value", "side": "smallest"|"largest",
    "values": sorted values, "suggest": the next value to add}``."""
    out = []
    for axis, v in chosen.items():
        vs = sorted({x for x in values.get(axis, []) if _number(x)})
        if len(vs) < 2 or not _number(v) or vs[0] < v < vs[-1]:
            continue
        side = "smallest" if v == vs[0] else "largest"
        out.append({"axis": axis, "value": v, "side": side, "values": vs, "suggest": extend(vs, side)})
    return out


def extend(values, side: str) -> float | None:
    """The value one step beyond the ``side`` ("smallest" or "largest") end of the sorted ``values``:
    the ratio of the two outermost values when every value is positive (a geometric grid), else their
    difference; None below a smallest value of 0 (lr, lam, lam0, window are not negative)."""
    a, b = (values[1], values[0]) if side == "smallest" else (values[-2], values[-1])
    if side == "smallest" and b == 0:
        return None
    if all(v > 0 for v in values):
        nxt = b * (b / a)
    else:
        nxt = b + (b - a)
    return float(f"{nxt:.6g}")


def edge_text(edge: dict) -> str:
    """One line: ``lr 0.1 is the largest of 0.01, 0.03, 0.1: extend the grid (e.g. 0.333)``."""
    shown = ", ".join(f"{v:g}" for v in edge["values"])
    if edge["suggest"] is None:
        return (f"{edge['axis']} {edge['value']:g} is the smallest of {shown}, and no smaller value exists: "
                f"nothing to extend")
    return (f"{edge['axis']} {edge['value']:g} is the {edge['side']} of {shown}: the best value may lie "
            f"outside the grid; extend it (e.g. {edge['axis']} {edge['suggest']:g})")


MAX_SEEDS = 10_000   # a list of seeds is one run per seed and setting: more than this is no protocol, but a typo


def seed_list(name: str, text: str | None) -> list[int] | None:
    """The seeds a protocol lists, as ``stalegrad report --select-seeds`` and the study's scripts read them:
    ``"0-2,5"`` -> [0, 1, 2, 5] (at most ``MAX_SEEDS`` seeds, each at most ``MAX_SEED``); None for None.
    Anything else is a one-line ``UsageError`` that starts with ``name`` (the option), raised before any
    list is built."""
    if text is None:
        return None
    ranges = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            a, _, b = part.partition("-")
            lo, hi = int(a), int(b) if b else int(a)
            if lo < 0 or hi < lo:
                raise ValueError
            ranges.append((lo, hi))
    except ValueError:
        ranges = []
    if not ranges:
        raise UsageError(f"{name} {text!r}: give seeds as integers >= 0 and ranges, e.g. 0-2 or 0,1,2")
    if (top := max(hi for _, hi in ranges)) > MAX_SEED:
        raise UsageError(f"{name} {text!r}: seed {top} is larger than any seed a run takes ({MAX_SEED})")
    if (n := sum(hi - lo + 1 for lo, hi in ranges)) > MAX_SEEDS:
        raise UsageError(f"{name} {text!r}: {n} seeds, more than the {MAX_SEEDS} a protocol may list; give "
                         "the seeds the runs have, e.g. 0-2")
    return list(dict.fromkeys(s for lo, hi in ranges for s in range(lo, hi + 1)))
