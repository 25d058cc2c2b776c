"""The two stages of a grid with a ``[protocol]`` table: first every setting on the selection seeds, then
the reporting seeds of the selected settings only. No I/O: ``cli/grid.py`` runs the stages.

A decisive grid tunes several axes (lr, lam, lam0, ...) and reports on many seeds; its full product runs
the reporting seeds of every setting, though the protocol looks at them only for the selected ones. Two
stages run exactly what the protocol reads: for ``select_seeds = [0, 1, 2]``, ``report_seeds = [3..9]``
and 40 settings per cell, 40 x 3 + 1 x 7 runs per cell and algorithm instead of 40 x 10.

Stage 2 is chosen with the report's own rule (``selection.select`` over the statistic that
``report_protocol.with_statistic`` gives each cell: the mean final validation accuracy on the selection
seeds, which every cell of a [protocol] grid has, since its file is refused without a validation split;
arms labelled as ``report_protocol.arm_label`` labels them), so the report's protocol section selects the
same settings from the same runs. ``stages = 1`` in the
[protocol] table runs the whole product instead (to study the selection itself).
"""
from __future__ import annotations

from .report_protocol import arm_label, with_statistic
from .selection import select


def setting(cell) -> dict:
    """The cell's axis values but the seed and the algorithm: what the selection compares."""
    return {k: v for k, v in cell.axes.items() if k not in ("seed", "algo")}


def _key(label: str, values: dict) -> tuple:
    return label, tuple(sorted((k, repr(v)) for k, v in values.items()))


def two_stage(spec: dict | None) -> bool:
    """Whether a grid with this [protocol] table runs in two stages: it has reporting seeds and does not
    ask for the whole product (``stages = 1``)."""
    return bool(spec) and bool(spec.get("report_seeds")) and spec.get("stages", 2) == 2


def split(cells: list, spec: dict | None) -> tuple[list, list]:
    """(stage 1: the cells of every seed that is not a reporting seed, stage 2: those of a reporting seed);
    (every cell, none) for a grid that runs in one stage (``two_stage``)."""
    if not two_stage(spec):
        return cells, []
    report = set(spec["report_seeds"])
    first = [c for c in cells if c.options.get("seed", 0) not in report]
    return first, [c for c in cells if c.options.get("seed", 0) in report]


def choose(first: list, second: list, spec: dict, results: dict) -> tuple[list, list]:
    """(the stage-2 cells of the selected settings, the selections). ``results``: cell name -> the figures of
    its finished run's summary.json (``final_val_acc``, ``final_test_acc``, ``diverged``; absent: not finished,
    or its process failed). A run that failed (``selection.run_failure``: diverged, not finite, at chance) makes
    its setting's score NaN and is listed in the selections. A cell whose settings all lack a finished run of
    some selection seed, or all have a failed one, selects nothing, and runs no reporting seed."""
    tune, arms = list(spec.get("tune") or ["lr"]), dict(spec.get("arms") or {})
    seeds = spec.get("select_seeds") or sorted({c.options.get("seed", 0) for c in first})
    label = lambda c: arm_label({"key": c.options, "algo": c.algo}, arms)   # noqa: E731
    groups: dict = {}
    for c in first:
        g = groups.setdefault(_key(label(c), setting(c)), {"algo": label(c), "setting": setting(c), "summaries": {}})
        if c.name in results:
            g["summaries"][c.options.get("seed", 0)] = results[c.name]
    with_statistic(list(groups.values()), tune)
    picks = select(list(groups.values()), tune, seeds)
    chosen = {_key(p["algo"], p["chosen"]["setting"]) for p in picks if p["chosen"] is not None}
    return [c for c in second if _key(label(c), setting(c)) in chosen], picks
