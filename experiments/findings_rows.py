"""What experiments/findings.py reads and some of the rows it writes on docs/results/FINDINGS.md (issue 42): the
committed runs, each claim's regime as its runs' config.json state it, the rates the selection seeds chose (with
a rate whose next larger one failed marked as the largest stable rate), the share of the stale gradient's error
that each correction removes on the committed probes, and the words that name an interval. Not run itself.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from stalegrad.run.files import CONFIG_LIMIT, JSON_LIMIT, JSONL_LIMIT, UnreadableFile, read_parsed
from stalegrad.run.results import value_problem
from stalegrad.study.selection import run_failure
from stalegrad.study.stats import t_interval

CLASSES = 10   # every data set of the study (MNIST, Fashion-MNIST)

# The coverage stalegrad.study.intervals.bca's docstring gives for its expanded interval at a nominal 95%, as
# tests/test_intervals.py measures it, by the number of seeds.
BCA_COVERAGE = {5: "about 90-92%", 7: "about 93-94%", 10: "about 93-94%"}


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ---- what the page reads, checked -----------------------------------------------------------------------
class Damaged(Exception):
    """An input of the page that cannot be read, or lacks what the page reads: one line naming the file."""


def read_input(path: Path, kind: str):
    """The parsed ``path`` (``kind``: toml, json or jsonl), read by stalegrad's bounded reader; ``Damaged`` if not."""
    try:
        return read_parsed(path, {"toml": CONFIG_LIMIT, "json": JSON_LIMIT, "jsonl": JSONL_LIMIT}[kind], kind)
    except UnreadableFile as e:
        raise Damaged(f"{path} {e.reason}") from None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


MISSING = object()
TEXT, NUMBER, TABLE = (lambda v: isinstance(v, str), "a string"), (finite, "a finite number"), \
    (lambda v: isinstance(v, dict), "a table")
SIDE = (lambda v: isinstance(v, dict) and isinstance(v.get("grid"), str) and isinstance(v.get("algo", ""), str),
        'a table naming its grid, e.g. { grid = "dc", algo = "asgd" }')
CELLS = (lambda v: v == "thesis16" or isinstance(v, list) and all(isinstance(c, dict) for c in v),
         'a list of tables (the settings of each cell) or "thesis16"')
KINDS = ("difference", "change", "probe_mean", "probe_share")


def need(table: dict, key: str, check: tuple, where: str, optional: bool = False):
    """``table[key]`` when ``check`` (a test, what it wants) passes; else ``Damaged`` naming ``where`` and ``key``."""
    value = table.get(key, MISSING)
    if value is MISSING and optional:
        return None
    if value is MISSING:
        raise Damaged(f"{where}: {key} is missing; it must be {check[1]}")
    if not check[0](value):
        raise Damaged(f"{where}: {key} must be {check[1]}, not {value!r:.60}")
    return value


def check_rows(rows, where: str, seeds: dict, claims: bool) -> None:
    """Each claim (``claims``) or descriptive row: the keys findings.py reads, of the types it reads them as."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise Damaged(f"{where}: each {'[[claim]]' if claims else '[[row]]'} must be a table")
    for i, row in enumerate(rows, 1):
        named = f" ({row['id']})" if isinstance(row.get("id"), str) else ""
        at = f"{where}: {'claim' if claims else 'row'} {i}{named}"
        for key in ("id", "question", "text", "paper") if claims else ("text",):
            need(row, key, TEXT, at)
        need(row, "seeds", (lambda v: v in seeds, f"the name of a seed list in [seeds] ({', '.join(seeds)})"), at)
        need(row, "a", SIDE, at)
        need(row, "b", SIDE, at, optional=True)
        need(row, "cells", CELLS, at)
        kind = need(row, "kind", (lambda v: v in KINDS, f"one of {', '.join(KINDS)}"), at, optional=True)
        if claims:
            need(row, "direction", (lambda v: v in (-1, 0, 1) and not isinstance(v, bool), "-1, 0 or 1"), at)
            need(row, "deviations", TEXT, at, optional=True)
            for key in ("margin", "failed"):
                need(row, key, NUMBER, at, optional=key == "margin" or not (kind or "").startswith("probe"))
            for key in ("field", "than"):
                need(row, key, TEXT, at, optional=key == "than" or not (kind or "").startswith("probe"))
        for end in ("from", "to"):
            need(row, end, TABLE, at, optional=kind != "change")


def check_inputs(plan: dict, extra: dict, record: dict, paths: dict) -> None:
    """``Damaged`` (one line) when claims.toml, descriptive.toml or registration.toml lack what the page reads or
    hold it as another type (a rate as a string, a seed list of names, a claim naming a seed list not there)."""
    where = str(paths["claims"])
    rules = need(plan, "rules", TABLE, where)
    for key in ("alpha", "level", "chance", "failed_at_most"):
        need(rules, key, NUMBER, f"{where}: [rules]")
    seeds = need(plan, "seeds", TABLE, where)
    for name, values in seeds.items():
        need(seeds, name, (lambda v: isinstance(v, list) and all(map(_is_int, v)), "a list of integer seeds"),
             f"{where}: [seeds]")
    check_rows(need(plan, "claim", (lambda v: isinstance(v, list), "a list of [[claim]] tables"), where), where,
               seeds, claims=True)
    need(need(plan, "thesis", TABLE, where), "cells", (lambda v: isinstance(v, list) and all(
        isinstance(c, list) and len(c) == 4 and all(map(finite, c)) for c in v),
        "a list of [workers, window, AGN's accuracy, AEASGD's accuracy]"), f"{where}: [thesis]")
    where = str(paths["descriptive"])
    check_rows(extra.get("row", []), where, seeds, claims=False)
    if (spec := need(extra, "closure", TABLE, where, optional=True)) is not None:
        need(spec, "text", TEXT, f"{where}: [closure]")
        need(spec, "seeds", (lambda v: v in seeds, "the name of a seed list in [seeds]"), f"{where}: [closure]")
        for key in ("method", "baseline", "target"):
            need(spec, key, SIDE, f"{where}: [closure]")
    where = str(paths["registration"])
    for key in ("commit", "date"):
        need(record, key, TEXT, where)
    need(record, "change", (lambda v: isinstance(v, list) and all(
        isinstance(c, dict) and all(isinstance(c.get(k), str) for k in ("commit", "date", "why")) for c in v),
        "a list of [[change]] tables, each with its commit, date and why"), where, optional=True)


# ---- the runs ------------------------------------------------------------------------------------------
def read_run(cell: Path) -> tuple[dict, dict, list | None]:
    """A committed run's config.json, summary.json and probes (None without probes.jsonl), each checked for what the
    page reads of it; ``Damaged`` naming the file and its problem."""
    config, summary = read_input(cell / "config.json", "json"), read_input(cell / "summary.json", "json")
    if not (isinstance(config, dict) and isinstance(config.get("algorithm"), dict)
            and isinstance(config["algorithm"].get("name"), str) and _is_int(config.get("seed"))):
        raise Damaged(f"{cell / 'config.json'} is not a run's configuration (an algorithm's name and an integer seed)")
    if not isinstance(config.get("runtime", {}), dict) or not isinstance(config.get("numerics", {}), dict):
        raise Damaged(f"{cell / 'config.json'}: runtime and numerics must be JSON objects")
    if not isinstance(summary, dict) or "final_test_acc" not in summary:
        raise Damaged(f"{cell / 'summary.json'} is not a run's summary (a JSON object with final_test_acc)")
    for key in ("final_test_acc", "final_test_loss", "wall_s"):
        if (problem := value_problem(key, summary.get(key), nan_ok=True)) is not None:
            raise Damaged(f"{cell / 'summary.json'}: {problem}")
    probes = read_input(cell / "probes.jsonl", "jsonl") if (cell / "probes.jsonl").exists() else None
    if probes is not None and not all(isinstance(p, dict) for p in probes):
        line = next(i for i, p in enumerate(probes, 1) if not isinstance(p, dict))
        raise Damaged(f"{cell / 'probes.jsonl'}: record {line} is not a JSON object")
    return config, summary, probes


def load_runs(root: Path) -> dict:
    """{grid: [run]}: each run's settings flattened (``algo``, the algorithm's parameters, the run's options),
    its delay model, its summary and, where it has them, its probes."""
    out: dict = {}
    base = root / "docs/results/confirm/runs"
    for grid in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []:
        for cell in sorted(p for p in grid.iterdir() if (p / "summary.json").exists()):
            config, summary, probes = read_run(cell)
            algo = config.pop("algorithm")
            flat = {"algo": algo.pop("name"), **algo, **{k: v for k, v in config.items() if not isinstance(v, dict)}}
            out.setdefault(grid.name, []).append({
                "name": cell.name, "settings": flat, "numerics": config.get("numerics", {}),
                "delay": config.get("runtime", {}).get("delay"), "summary": summary, "probes": probes})
    return out


def find(runs: dict, side: dict, cell: dict, seed: int) -> dict | None:
    """The one run of ``side`` (a grid and settings) in ``cell`` with ``seed``; None if it is not there."""
    grid = cell.get("grid", side["grid"])   # a cell may move both sides to another grid (a layout's effect)
    want = {**{k: v for k, v in side.items() if k != "grid"}, **cell, "seed": seed}
    want.pop("grid", None)
    found = [r for r in runs.get(grid, []) if all(r["settings"].get(k) == v for k, v in want.items())]
    if len(found) > 1:
        raise Damaged(f"{len(found)} runs in docs/results/confirm/runs/{grid} match {want}: a claim must name one "
                      "run per seed")
    return found[0] if found else None


# ---- a claim's regime, from its runs' config.json ------------------------------------------------------
DATA = {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST", "cifar10": "CIFAR-10"}
MODELS = {"mlp": "the small mlp (784-256-128-10)", "agn-mlp": "the thesis's agn-mlp (784-1000-2000-1000-10)"}


def regime_of(run: dict) -> str:
    """One run's data set, model, epochs and schedule, batch, layout and delays, as its config.json gives them."""
    s = run["settings"]
    if "dataset" not in s:
        return "not recorded"
    held = f", {s['val_split']} held out" if s.get("val_split") else ""
    model = f"mlp ({'-'.join(map(str, s['hidden']))})" if s.get("hidden") else MODELS.get(s["model"], s["model"])
    schedule = ""
    if s.get("lr_milestones"):
        g = s.get("lr_gamma", 0.1)
        schedule = (f", rate {f'/{1 / g:g}' if 0 < g < 1 else f'×{g:g}'} at epochs "
                    f"{', '.join(f'{e:g}' for e in s['lr_milestones'])}")
    return (f"{DATA.get(s['dataset'], s['dataset'])} ({s.get('train_samples')} training samples{held}), {model}, "
            f"{s['epochs']:g} epochs{schedule}, batch {s.get('batch_size')}, `--partition {s.get('partition')}`, "
            f"{run.get('delay')} delays")


def regime(read: dict) -> str:
    """The regime of the runs a claim reads (``read``: {side: [run]}): one text when every run has the same, else
    each side's."""
    texts = {side: sorted({regime_of(r) for r in rs}) for side, rs in read.items() if rs}
    every = sorted({t for ts in texts.values() for t in ts})
    if not every:
        return "no runs yet"
    return every[0] if len(every) == 1 else "; ".join(f"{side}: {' / '.join(ts)}" for side, ts in texts.items())


# ---- the selections ------------------------------------------------------------------------------------
def failed_next(rates: list, chosen: float, failures: dict) -> str:
    """The flag of a chosen rate whose next larger rate failed on a selection seed (``failures``: {rate: [reason
    or None per selection seed]}, ``run_failure``'s): it is the largest stable rate, not an interior choice."""
    above = [r for r in rates if r > chosen]
    if not above:
        return ""
    reasons = [r for r in failures[above[0]] if r is not None]
    if not reasons:
        return ""
    chance = sum("at chance" in r for r in reasons)
    how = ("ended at chance" if chance == len(reasons) else "diverged" if not chance
           else f"failed ({len(reasons) - chance} diverged, {chance} ended at chance)")
    return (f" **the next rate, {above[0]:g}, {how} on {len(reasons)} of {len(failures[above[0]])} selection seeds: "
            "the largest stable rate, not an interior choice**")


def selections(runs: dict) -> list[str]:
    """The rate each two-stage grid selected on its selection seeds: the one its reporting-seed runs have."""
    out = ["| grid | algorithm | workers | selected lr (of the rates run on the selection seeds) |", "|---|---|---|---|"]
    for grid, rs in sorted(runs.items()):
        cells: dict = {}
        for r in rs:
            s = r["settings"]
            if s.get("lr") is None:
                continue
            cell = cells.setdefault((s["algo"], s.get("workers")), {"report": set(), "select": {}})
            if s["seed"] >= 100:
                cell["report"].add(s["lr"])
            else:
                cell["select"].setdefault(s["lr"], []).append(run_failure(r["summary"], CLASSES))
        for (algo, workers), c in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            if c["select"] and c["report"]:
                rates = sorted(c["select"])
                chosen = ", ".join(f"{lr:g}" for lr in sorted(c["report"]))
                edge = {rates[0]: " **at the grid's edge: the smallest**",
                        rates[-1]: " **at the grid's edge: the largest**"}.get(min(c["report"]), "")
                flag = edge or failed_next(rates, min(c["report"]), c["select"])
                among = ", ".join(f"{lr:g}" for lr in rates)
                out.append(f"| {grid} | {algo} | {workers} | {chosen} (of {among}){flag} |")
    return out


def machine(runs: dict) -> list[str]:
    out = ["| grid | runs | CPU | run time, hours (one thread each) |", "|---|---|---|---|"]
    for grid, rs in sorted(runs.items()):
        cpus = sorted({f"{r['numerics'].get('cpu_vendor')} {r['numerics'].get('cpu_model')}" for r in rs})
        hours = sum(r["summary"].get("wall_s", 0.0) for r in rs) / 3600
        out.append(f"| {grid} | {len(rs)} | {', '.join(cpus)} | {hours:.1f} |")
    return out


# ---- the error each correction removes (the probes) ----------------------------------------------------
CORRECTIONS = (("dc_a", "DC-ASGD-a's correction (the run's λ0)"),
               ("full_h", "the exact Hessian: g + H (w − w_bak), one Hessian-vector product"),
               ("taylor", "the exact Hessian's diagonal: g + diag(H) ⊙ (w − w_bak)"))


def removed(run: dict, key: str) -> tuple[float, int]:
    """(the median over a run's probes with a stale gradient, err_g > 0, of 1 − err_key / err_g; their number):
    the share of the stale gradient's relative error |g − g_now| / |g_now| that the correction removes."""
    vals = [1 - p[f"err_{key}"] / p["err_g"] for p in run["probes"] or []
            if finite(p.get("err_g")) and p["err_g"] > 0 and finite(p.get(f"err_{key}"))]
    return (statistics.median(vals) if vals else math.nan), len(vals)


def removed_table(by_seed: dict, claim_id: str) -> list[str]:
    """PLAN.md's registered row for DC7, the median error that DC-ASGD-a's correction removes per run, beside the
    exact Hessian's on the same probes where they record it (``by_seed``: {seed: run or None})."""
    title = f"The median error that DC-ASGD-a's correction removes per run ({claim_id}'s probes)"
    if not by_seed:   # no such claim
        return []
    if any(r is None for r in by_seed.values()):
        return [f"{title}: waits for its runs.", ""]
    failed = {s: run_failure(r["summary"], CLASSES) for s, r in by_seed.items()}
    out = [f"{title}: per run, the median over its probes with a stale gradient (τ > 0) of 1 − err(x) / err(g), "
           "err the relative error |x − g_now| / |g_now| against the fresh gradient (stalegrad/core/probes.py), "
           "beside the exact Hessian's on the same probes. A failed run's median is shown and counted, not averaged "
           "in.", "",
           "| correction | share of the stale gradient's error removed: mean of the runs' medians [95% t interval "
           "over the runs that did not fail] | each run's median (seed: share, probes) | failed runs |",
           "|---|---|---|---|"]
    for key, name in CORRECTIONS:
        if not any(f"err_{key}" in p for r in by_seed.values() for p in r["probes"] or []):
            continue
        per = {s: removed(r, key) for s, r in by_seed.items()}
        iv = t_interval([v for s, (v, _) in per.items() if not failed[s]])
        est = ("n/a" if not finite(iv["mean"]) else f"{100 * iv['mean']:.2f}% ({iv['n']} runs, no interval)"
               if not finite(iv["lo"]) else
               f"{100 * iv['mean']:.2f}% [{100 * iv['lo']:.2f}, {100 * iv['hi']:.2f}] ({iv['n']} runs)")
        each = ", ".join(f"{s}: {100 * v:.2f}% ({n}){' (failed)' if failed[s] else ''}" for s, (v, n) in per.items())
        out.append(f"| {name} | {est} | {each} | {sum(bool(f) for f in failed.values())} of {len(failed)} |")
    return out + [""]


# ---- the words for an interval -------------------------------------------------------------------------
def bca_words(iv: dict) -> str:
    """What a ``stalegrad.study.intervals.bca`` interval is, and how often it covers at its number of seeds."""
    expanded = "expanded" in iv.get("method", "")
    cover = BCA_COVERAGE.get(iv["n"]) if expanded else None
    return (f"{'expanded ' if expanded else ''}BCa bootstrap over seeds, nominal 95%, "
            + (f"{cover} coverage at {iv['n']} seeds per stalegrad/study/intervals.py" if cover
               else f"coverage not measured at {iv['n']} seeds"))


def control_note(plan: dict) -> list[str]:
    """The sentence beside a claim against ``dcasgd-a-scrambled`` (issue 42, item 1): what its control is."""
    ids = [c["id"] for c in plan["claim"]
           if "dcasgd-a-scrambled" in (c.get("a", {}).get("algo"), c.get("b", {}).get("algo"))]
    if not ids:
        return []
    return ["", f"**{', '.join(ids)}: what the control is.** `dcasgd-a-scrambled` fixes one sign per coordinate for "
            "the whole run (one mask, drawn once: stalegrad/algorithms/controls.py), so it anti-damps about half the "
            f"weights: {', '.join(ids)} compares damping against anti-damping, not compensation against none "
            "(issue 42, item 1). The verdict stands as registered; a second registered study "
            "(`docs/results/speed/`) tests redrawn-sign and damping-only controls."]
