"""What the experiments' scripts share: a protocol report read and checked, its per-seed figures, seed-paired
differences, and how the pages write them (numbers, intervals, verdict counts, Markdown tables).

Not a script: ``decisive.py``, ``agn_thesis.py``, ``lambda_sweep.py``, ``selection_seeds.py``, ``leaderboard.py``,
``paired.py`` and ``papers.py`` import it (as ``shared``: the scripts' folder is on sys.path when one runs, and
tests/helpers.py's ``experiment`` puts it there). Like them, it reaches stalegrad only through public names
(tests/test_scripts.py checks it).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from stalegrad.study.stats import DOES_NOT_HOLD, HOLDS, INCONCLUSIVE, t_interval


def load_report(path: Path, script: str, hint: str) -> dict:
    """A protocol report.json, refused in one line unless it selected on validation accuracy."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        sys.exit(f"{script}: cannot read {path} ({e}); {hint}")
    if not report.get("protocol") or report["protocol"].get("selected_on") != "validation":
        sys.exit(f"{script}: {path} has no protocol selected on validation accuracy; run a grid with a "
                 "[protocol] table and val_split")
    return report


def load_grid(grid_dir: Path, script: str) -> dict:
    """The protocol report of a finished grid directory (GRID_DIR/report/report.json), as ``load_report``."""
    return load_report(Path(grid_dir) / "report" / "report.json", script,
                       "run the grid to its end first (it writes the report)")


def per_seed(report: dict) -> dict:
    """(selected algorithm, where) -> {seed: final test accuracy} on the reporting seeds."""
    groups = {g["label"]: g for g in report["groups"]}
    p = report["protocol"]
    out = {}
    for s in p["selections"]:
        g = groups.get(s.get("group"))
        if g is not None:
            out[(s["algo"], s["where"])] = {r["seed"]: r["final_test_acc"] for r in g["runs"]
                                            if r["seed"] in p["report_seeds"]}
    return out


def cell(where: str) -> dict:
    """``"window=10 workers=8"`` (the report's ``where``) as ``{"window": "10", "workers": "8"}``."""
    return dict(part.split("=", 1) for part in where.split() if "=" in part)


def shown(where: str) -> str:
    """The parts of a cell that tell the cells of a grid apart (an algorithm's own fixed parameters, such
    as dcasgd-a's eps, are not a cell)."""
    return " ".join(f"{k}={v}" for k, v in cell(where).items() if k in ("workers", "window", "delay")) or where


def difference(a: dict, b: dict) -> dict:
    """a - b of two {seed: value}, paired by the seeds both have, with its t interval and those seeds."""
    seeds = sorted(set(a) & set(b))
    return {**t_interval([a[s] - b[s] for s in seeds]), "seeds": seeds}


def fmt(x: float, spec: str = ".4f") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def iv(f: dict, spec: str = ".4f") -> str:
    """``mean [lo, hi] (n=N)`` of an interval."""
    return f"{fmt(f['mean'], spec)} [{fmt(f['lo'], spec)}, {fmt(f['hi'], spec)}] (n={f['n']})"


def pct(f: dict) -> str:
    """``mean [lo, hi]`` of an interval of accuracies, in percent."""
    return f"{100 * f['mean']:.2f} [{100 * f['lo']:.2f}, {100 * f['hi']:.2f}]"


def tally(verdicts: list[str], none: str = "none") -> str:
    """``2 holds, 1 inconclusive``: how many verdicts hold, do not hold, are inconclusive (``none`` if none)."""
    return ", ".join(f"{verdicts.count(v)} {v}" for v in (HOLDS, DOES_NOT_HOLD, INCONCLUSIVE)
                     if verdicts.count(v)) or none


def summary(rows: list[list[str]], col: int = -1) -> str:
    """One line: how many of the rows' verdicts (column ``col``, its note in brackets left out) hold, do not
    hold, are inconclusive."""
    return tally([r[col].split(" (")[0] for r in rows], "no figure")


def table(rows: list[list[str]], head: list[str]) -> list[str]:
    """A Markdown table's lines, and the empty line after it."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows), ""]
