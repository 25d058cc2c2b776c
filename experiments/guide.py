"""docs/guide.md, "Which rule for M workers, on which evidence", from the two registered studies and nothing else:
the confirmatory study's claims (experiments/confirm/claims.toml over the committed runs in
docs/results/confirm/runs/, the verdicts of docs/results/FINDINGS.md) and the speed study's (experiments/speed/
plan.toml over docs/results/speed/runs/*.jsonl, the verdicts of docs/results/SPEED.md), each verdict computed by
that study's own code.

    python experiments/guide.py [--out docs/guide.md]

A rule is named for M only where a registered claim at that M holds; the claims at M that do not decide are
named as such, and an M that no claim covers is "no evidence". A claim over several M together (a mean over
M = 8 and 16) is listed apart, never as evidence at one of them. tests/test_guide.py regenerates the committed
page byte for byte.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import tomllib
from pathlib import Path

import findings
import speed as S
import speed_page as P
from findings_rows import load_runs
from stalegrad.algorithms import ALGORITHMS
from stalegrad.study.stats import holm

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "guide.md"
SHOWN_M = (1, 4, 8, 16, 32)     # the counts a reader asks about; any other M a claim covers alone is added
GOALS = {"accuracy": "the most accurate after a fixed budget", "time": "the soonest to a target on uneven workers"}
PAGES = {"FINDINGS": "results/FINDINGS.md", "SPEED": "results/SPEED.md"}


def control(name: str | None) -> bool:
    """A mechanism control (stalegrad/algorithms/controls.py) is no rule to choose."""
    return name in ALGORITHMS and ALGORITHMS[name].summary.startswith("control:")


def evidence(id, page, goal, text, workers, a, b, verdict, estimate, choice) -> dict:
    """One claim as the guide reads it. ``choice``: it compares two different rules at the same M (not a control,
    a probe, a change across M or a rule against itself), so a verdict that holds names the rule ahead."""
    winner = None
    if choice and verdict == "holds":
        winner = a
    elif choice and (m := re.fullmatch(r"holds: (\S+) (?:ahead|sooner)", verdict)):
        winner = {"a": a, "b": b}.get(m[1], m[1])
    return {"id": id, "page": page, "goal": goal, "text": text, "workers": tuple(workers), "a": a, "b": b,
            "verdict": verdict, "estimate": estimate, "choice": choice, "winner": winner}


def confirm_evidence(root: Path) -> list[dict]:
    """The confirmatory study's claims with findings.py's verdicts (Holm over all of them)."""
    plan = tomllib.loads((root / "experiments/confirm/claims.toml").read_text())
    runs = load_runs(root)
    results = {c["id"]: findings.evaluate(c, plan, runs) for c in plan["claim"]}
    adjusted = holm({k: r["p"] for k, r in results.items()}, plan["rules"]["alpha"])
    out = []
    for c in plan["claim"]:
        r, kind = results[c["id"]], c.get("kind", "difference")
        read = findings.runs_read(c, plan, runs)
        ms = {side: sorted({run["settings"].get("workers") for run in rs}) for side, rs in read.items()}
        a, b = c["a"]["algo"], c.get("b", {}).get("algo")
        choice = kind == "difference" and b not in (None, a) and not control(a) and not control(b) \
            and ms.get("a") == ms.get("b")
        scale, fmt = (1.0, ".3f") if kind == "probe_share" else (1.0, "+.3f") if kind.startswith("probe") \
            else (100.0, "+.2f")
        estimate = "n/a" if r["missing"] else findings.interval_text(r["interval"], scale, fmt)
        if not kind.startswith("probe"):    # in points, as the speed page writes its accuracy claims
            estimate = estimate.replace(" [", " points [", 1)
        out.append(evidence(c["id"], "FINDINGS", "accuracy", c["text"], ms.get("a", []), a, b,
                            findings.verdict(r, c, adjusted[c["id"]]), estimate, choice))
    return out


def speed_data() -> tuple[dict, dict, dict]:
    plan = S.prepare(S.load_plan())
    return plan, S.selection(plan), {st: S.read_runs(st) for st in ("report", "mechanism")}


def speed_evidence(plan: dict, sel: dict, runs: dict) -> list[dict]:
    """The speed study's claims with speed_page.py's verdicts (Holm over all of them)."""
    results = {c["id"]: P.evaluate(c, plan, sel, runs["report"], runs["mechanism"]) for c in plan["claim"]}
    adjusted = holm({k: r["p"] for k, r in results.items()}, plan["rules"]["alpha"])
    out = []
    for c in plan["claim"]:
        r = results[c["id"]]
        a, time = r["a"] or c["a"], c["kind"] == "time"
        workers = [c["workers"]] if isinstance(c["workers"], int) else c["workers"]
        choice = a != c["b"] and not control(a) and not control(c["b"])
        who = f" (the best asynchronous arm: {r['a']})" if c["a"] == "best-async" and r["a"] else ""
        out.append(evidence(c["id"], "SPEED", "time" if time else "accuracy", c["text"] + who, workers, a, c["b"],
                            P.verdict(r, c, adjusted[c["id"]]),
                            (P.ratio_text if time else P.points_text)(r["interval"]), choice))
    return out


def soonest_arms(plan: dict, sel: dict, runs: dict, M: int) -> dict:
    """{profile: arm} with the smallest geometric mean time in the speed page's table at M (its own rule): a
    description, not a test."""
    if M not in plan["time"]["workers"]:
        return {}
    cells = P.soonest(plan, sel, runs["report"], M)
    return {P.NAMES[p]: min(c, key=lambda a: sum(math.log(t) for t, _ in c[a]) / len(c[a]))
            for p, c in cells.items() if c}


def leaderboard_counts(root: Path) -> set[int]:
    """The M (or n) at which the leaderboard, tuned alike but uncorrected, has tables."""
    page = root / "docs/results/leaderboard.md"
    return {int(m) for m in re.findall(r"^### .*\b[Mn] = (\d+)$", page.read_text(), flags=re.M)} \
        if page.exists() else set()


def ids(ev: list[dict]) -> str:
    return ", ".join(e["id"] for e in ev)


def decide(ev: list[dict], extra: str = "") -> str:
    """The cell for one M and goal from the claims at exactly that M: the rules ahead of another and behind
    none, with the claims that say so; the claims that did not decide; "no evidence" without a claim."""
    chosen = [e for e in ev if e["choice"]]
    if not chosen:
        return "no evidence" + extra
    beats: dict = {}
    behind = set()
    for e in chosen:
        if e["winner"]:
            loser = e["b"] if e["winner"] == e["a"] else e["a"]
            beats.setdefault(e["winner"], {}).setdefault(loser, []).append(e)
            behind.add(loser)
    top = [w for w in beats if w not in behind]
    parts = [f"**{w}** (" + "; ".join(f"over {loser}: {ids(es)}" for loser, es in beats[w].items()) + ")"
             for w in top]
    text = ", ".join(parts) + ("; not compared with each other" if len(top) > 1 else "") if top else \
        "no rule ahead of every rule it was compared with" if beats else "inconclusive"
    undecided = [e for e in chosen if not e["winner"]]
    if undecided and top:
        text += f"; undecided: {ids(undecided)}"
    elif undecided:
        text += f" ({ids(undecided)})"
    return text + extra


def others(ev: list[dict]) -> str:
    """The claims at this M that choose no rule (a probe, a rule against one worker), named beside the cell."""
    rest = [e for e in ev if not e["choice"]]
    return "; other claims at this M: " + ", ".join(f"{e['id']} ({e['verdict']})" for e in rest) if rest else ""


def link(e: dict) -> str:
    return f"[{e['id']}]({PAGES[e['page']]}#the-claims)"


def claim_rows(ev: list[dict], first: str) -> list[str]:
    head = f"| {first} | goal | claim | what it says | verdict | estimate [95% interval] |"
    rows = [head, "|---|---|---|---|---|---|"]
    for e in ev:
        ms = ", ".join(map(str, e["workers"]))
        rows.append(f"| {ms} | {e['goal']} | {link(e)} | {e['text']} | **{e['verdict']}** | {e['estimate']} |")
    return rows


def render(root: Path = ROOT) -> str:
    plan, sel, runs = speed_data()
    ev = confirm_evidence(root) + speed_evidence(plan, sel, runs)
    single = sorted((e for e in ev if len(e["workers"]) == 1), key=lambda e: (e["workers"], list(GOALS).index(e["goal"])))
    pooled = [e for e in ev if len(e["workers"]) > 1]
    shown = sorted(set(SHOWN_M) | {e["workers"][0] for e in single if e["choice"]})
    board = leaderboard_counts(root)
    table = ["| M | " + " | ".join(GOALS.values()) + " |", "|---|---|---|"]
    for M in shown:
        cells = []
        for goal in GOALS:
            at = [e for e in single if e["workers"] == (M,) and e["goal"] == goal]
            extra = others(at)
            if goal == "time" and (soon := soonest_arms(plan, sel, runs, M)):
                arms: dict = {}
                for profile, arm in soon.items():
                    arms.setdefault(arm, []).append(profile)
                extra += "; the soonest in the study's table (a description, not a test): " + ", ".join(
                    f"{arm} under {'every profile' if len(ps) == len(soon) else ' and '.join(ps)}"
                    for arm, ps in arms.items())
            if goal == "accuracy" and M in board and not [e for e in at if e["choice"]]:
                extra += ("; [the leaderboard](results/leaderboard.md) has tables at this M, every rule tuned alike, "
                          "without a correction for multiple comparisons")
            cells.append(decide(at, extra))
        table.append(f"| {M} | " + " | ".join(cells) + " |")
    lines = [
        "# Which rule for M workers, on which evidence", "",
        "<!-- generated by `python experiments/guide.py`; do not edit: tests/test_guide.py regenerates it -->", "",
        "What the project's two registered studies say about choosing an update rule for M workers, and nothing "
        "more. The claims and their verdicts are those of [the findings](results/FINDINGS.md) (final test accuracy "
        "after a fixed budget of epochs) and of [the speed study](results/SPEED.md) (simulated time to a validation "
        "target on uneven workers), each with Holm's correction over its own claims; this page recomputes them "
        "from the committed runs with the studies' own code. Both studies ran small models (the mlp, once the AGN "
        "thesis's agn-mlp) on Fashion-MNIST and MNIST in the simulator: nothing here is evidence about other "
        "models, data or machines, and each claim's regime is on its row of the study's page.", "",
        "A rule is named for M only where a registered claim at that M *holds* (\"over asgd: DC1\": ahead of "
        "asgd by claim DC1); two rules named for one M were not compared with each other by any claim. The claims "
        "that hold no rule ahead are *undecided* (inconclusive, or a claim that does not hold); *no evidence*: no "
        "claim compares two rules at that M. One worker (M = 1) is sequential SGD, the studies' baseline. A claim "
        "over several M together decides none of them alone: those are listed below the claims at one M.", "",
        *table, "",
        "## The claims at one M", "", *claim_rows(single, "M"), "",
        "## The claims over several M together", "",
        "Each is a mean over the M (or the cells) it names: it says what holds on average over them, not at "
        "each.", "", *claim_rows(pooled, "M (together)"), "",
        "Commands: `python experiments/guide.py` (this page, in a few seconds, from the committed runs); the "
        "studies' own commands are on their pages.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=PAGE)
    args = ap.parse_args(argv)
    args.out.write_text(render())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
