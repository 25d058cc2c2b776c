"""Write the figures of docs/performance.md from the suite's result files, benchmarks/results/*.json.

    .venv/bin/python benchmarks/page.py           # rewrite the blocks between the page's markers (make bench runs it)
    .venv/bin/python benchmarks/page.py --check   # exit 1, naming the blocks, if the page differs from the results

The page marks each generated block ``<!-- figures:NAME -->`` ... ``<!-- /figures:NAME -->``: NAME is a script of
the suite (its tables, notes, command, machine and load, from ``results/NAME.json``) or ``suite`` (the last
``make bench``: each script's command, wall time and load, from ``results/run_all.json``). Everything outside
the markers is written by hand. Reads JSON only: no benchmark runs, nothing imports torch.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run_all import NAMES, SUITE  # noqa: E402

PAGE = HERE.parent / "docs" / "performance.md"
RESULTS = HERE / "results"
BLOCK = re.compile(r"(?P<open><!-- figures:(?P<name>\w+) -->\n)(?P<body>.*?)(?P<close><!-- /figures:(?P=name) -->)",
                   re.S)


def md_table(columns: list[str], rows: list[list[str]]) -> str:
    cell = lambda c: str(c).replace("|", "\\|")   # noqa: E731  (a bar inside a cell would split it)
    return "\n".join(["| " + " | ".join(map(cell, columns)) + " |", "|" + "---|" * len(columns),
                      *("| " + " | ".join(map(cell, r)) + " |" for r in rows)])


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def load_text(avg: list[float]) -> str:
    return f"{avg[0]:.2f}"


def provenance(r: dict) -> str:
    """One line: the command, when, on what, under which load."""
    m = r["machine"]
    threads = f"OMP_NUM_THREADS={m['omp_num_threads']}" if m.get("omp_num_threads") else "OMP_NUM_THREADS unset"
    clock = ", CPU time of this process" if m.get("clock") == "cpu" else ""
    gpu = f", {m['gpu']} (CUDA {m.get('cuda')})" if m.get("gpu") else ""
    return (f"`{r['command']}`: {r['started']}, commit `{m.get('commit') or 'unknown'}`; {m['cpu']}, {m['cores']} "
            f"cores{gpu}, torch {m['torch']}, {threads} ({plural(m['torch_threads'], 'torch thread')}{clock}); load average "
            f"{load_text(r['load_before'])} before, {load_text(r['load_after'])} after; {r['seconds']:.0f} s.")


def script_block(name: str, results: Path) -> str:
    path = results / f"{name}.json"
    if not path.exists():
        where = " on a machine with a CUDA device" if name == "gpu" else ""
        return f"No result yet: run `python benchmarks/{name}.py`{where}.\n"
    r = json.loads(path.read_text())
    parts = [provenance(r)]
    for t in r["tables"]:
        parts += [f"*{t['title']}*", md_table(t["columns"], t["rows"])]
    parts += list(r["notes"])
    return "\n\n".join(parts) + "\n"


def suite_block(results: Path) -> str:
    path = results / "run_all.json"
    if not path.exists():
        return "No run of the whole suite yet: run `make bench`.\n"
    r = json.loads(path.read_text())
    questions = {name: question for name, question, _ in SUITE}
    rows = [[f"`{s['command']}`", questions.get(s["benchmark"], ""), f"{s['seconds']:.0f}",
             f"{load_text(s['load_before'])} / {load_text(s['load_after'])}",
             "yes" if s["wrote"] else ("failed" if s["returncode"] else "no")] for s in r["scripts"]]
    head = (f"`make bench` (`{r['command']}`), {r['started']}, commit `{r.get('commit') or 'unknown'}`: "
            f"**{r['seconds'] / 60:.1f} minutes** in all, load average {load_text(r['load_before'])} before and "
            f"{load_text(r['load_after'])} after.")
    return head + "\n\n" + md_table(["command", "answers", "wall s", "load average before / after",
                                     "wrote its JSON"], rows) + "\n"


def block(name: str, results: Path) -> str:
    if name == "suite":
        return suite_block(results)
    if name not in NAMES:
        raise ValueError(f"the page marks a block 'figures:{name}', which is neither 'suite' nor a script of the "
                         f"suite ({', '.join(NAMES)})")
    return script_block(name, results)


def render(text: str, results: Path = RESULTS) -> str:
    """``text`` with every marked block written from the result files."""
    return BLOCK.sub(lambda m: m["open"] + block(m["name"], results) + m["close"], text)


def differing(text: str, results: Path = RESULTS) -> list[str]:
    """The blocks of ``text`` whose content is not what the result files give."""
    return [m["name"] for m in BLOCK.finditer(text) if m["body"] != block(m["name"], results)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if the page is not up to date")
    ap.add_argument("--page", default=str(PAGE), help="the page [docs/performance.md]")
    args = ap.parse_args(argv)
    page = Path(args.page)
    text = page.read_text()
    try:
        stale = differing(text)
        new = render(text)
    except (ValueError, KeyError, OSError) as e:
        print(f"page.py: error: {e}", file=sys.stderr)
        return 2
    if args.check:
        print(f"page.py: {page} is out of date in: {', '.join(stale)}" if stale else f"page.py: {page} is up to date")
        return 1 if stale else 0
    if new != text:
        page.write_text(new)
    print(f"page.py: {page}: {len(stale)} block(s) rewritten" + (f" ({', '.join(stale)})" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
