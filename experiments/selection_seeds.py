"""How much the number of selection seeds matters: two protocol reports of the same runs, selected on
different seeds, compared selection by selection and verdict by verdict:
``python experiments/selection_seeds.py A/report.json B/report.json --out FILE.md``.

A and B are ``stalegrad report`` outputs (report.json) over the same run directories with the same
``--report-seeds`` and ``--compare``, differing in ``--select-seeds`` (for example seed 0 alone against
seeds 0, 8, 9: experiments/agn_selection3.toml). For each (algorithm, cell) this prints the setting each
selected and its test accuracy on the reporting seeds; for each claim and cell, both verdicts. A verdict
that changes with the selection seeds was decided by the selection's noise, not by the methods.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shared import iv, load_report, shown, table


def load(path: Path) -> dict:
    return load_report(path, "selection_seeds.py", "give the report.json of `stalegrad report`")


def tuned(s: dict) -> str:
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in s["tuned"].items()) or "-"


def compare(a: dict, b: dict) -> tuple[dict, list[str]]:
    pa, pb = a["protocol"], b["protocol"]
    if pa["report_seeds"] != pb["report_seeds"]:
        sys.exit(f"selection_seeds.py: the reports' reporting seeds differ ({pa['report_seeds']} and "
                 f"{pb['report_seeds']}); compare two selections reported on the same seeds")
    sa = {(s["algo"], shown(s["where"])): s for s in pa["selections"]}
    sb = {(s["algo"], shown(s["where"])): s for s in pb["selections"]}
    seeds = [", ".join(map(str, p["select_seeds"])) for p in (pa, pb)]
    rows, changed = [], 0
    for key in [k for k in sa if k in sb]:
        x, y = sa[key], sb[key]
        same = x["tuned"] == y["tuned"]
        changed += not same
        rows.append([key[0], key[1], tuned(x), tuned(y), "same" if same else "**changed**",
                     iv(x["report_test_acc"]) if x.get("report_test_acc") else "-",
                     iv(y["report_test_acc"]) if y.get("report_test_acc") else "-"])
    lines = table(rows, ["algorithm", "cell", f"selected on seeds {seeds[0]}", f"selected on seeds {seeds[1]}",
                         "selection", "test acc (A)", "test acc (B)"])
    lines.append(f"The selection changes in {changed} of {len(rows)} (algorithm, cell) pairs.")
    lines.append("")
    fa = {(f["claim"], shown(f["where"])): f for f in pa["figures"]}
    fb = {(f["claim"], shown(f["where"])): f for f in pb["figures"]}
    vrows, flipped = [], 0
    for key in [k for k in fa if k in fb]:
        x, y = fa[key], fb[key]
        flipped += x["verdict"] != y["verdict"]
        vrows.append([key[0], key[1], f"{iv(x)} {x['verdict']}", f"{iv(y)} {y['verdict']}",
                      "same" if x["verdict"] == y["verdict"] else "**changed**"])
    lines += table(vrows, ["claim", "cell", f"A: seeds {seeds[0]}", f"B: seeds {seeds[1]}", "verdict"])
    lines.append(f"The verdict changes in {flipped} of {len(vrows)} claims.")
    return {"selections": len(rows), "selections_changed": changed, "verdicts": len(vrows),
            "verdicts_changed": flipped}, lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path, help="report.json selected on one set of seeds")
    ap.add_argument("b", type=Path, help="report.json of the same runs selected on another")
    ap.add_argument("--out", type=Path, help="write the markdown here; else print it")
    args = ap.parse_args(argv)
    _, lines = compare(load(args.a), load(args.b))
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
