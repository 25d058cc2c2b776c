"""docs/performance.md's figures are written from the benchmark suite's result files (benchmarks/page.py), and
`make bench` runs the suite: the page matches the committed results, without running any benchmark."""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
PAGE = ROOT / "docs" / "performance.md"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


page = load("page")
run_all = load("run_all")


def test_the_page_is_what_the_committed_results_give():
    text = PAGE.read_text()
    assert page.differing(text) == [], "docs/performance.md is out of date: run `python benchmarks/page.py`"
    assert page.render(text) == text


def test_every_script_of_the_suite_has_its_block_on_the_page_and_its_results():
    text = PAGE.read_text()
    blocks = re.findall(r"<!-- figures:(\w+) -->", text)
    assert sorted(blocks) == sorted(run_all.NAMES + ["suite"]), blocks
    assert all((BENCH / f"{name}.py").is_file() for name in run_all.NAMES)
    # gpu.py writes nothing without a CUDA device; every other script's result is committed
    assert not [n for n in run_all.NAMES if n != "gpu" and not (BENCH / "results" / f"{n}.json").is_file()]
    assert len(text.splitlines()) <= 320, "docs/performance.md is a page, not a log: the history is in NOTES.md"


def test_every_result_file_says_where_and_under_which_load_it_was_measured():
    suite = json.loads((BENCH / "results" / "run_all.json").read_text())
    assert [s["benchmark"] for s in suite["scripts"]] == run_all.NAMES
    assert suite["seconds"] >= sum(s["seconds"] for s in suite["scripts"]) - 1e-6   # (each figure rounded: a float sum)
    for name in run_all.NAMES:
        path = BENCH / "results" / f"{name}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        assert r["benchmark"] == name and r["command"].startswith(f"python benchmarks/{name}.py")
        assert len(r["load_before"]) == 3 and len(r["load_after"]) == 3
        for key in ("cpu", "cores", "torch", "omp_num_threads", "torch_threads", "commit"):
            assert key in r["machine"], (name, key)
        assert r["tables"] and all(len(row) == len(t["columns"]) for t in r["tables"] for row in t["rows"])


RESULT = {"benchmark": "capacity", "command": "python benchmarks/capacity.py --quick", "quick": True,
          "started": "2026-12-06 10:00", "seconds": 12.4,
          "machine": {"cpu": "Some CPU", "cores": 2, "torch": "2.13.0+cpu", "omp_num_threads": None,
                      "torch_threads": 1, "commit": "abc123-dirty", "clock": "cpu"},
          "load_before": [1.5, 1.0, 0.5], "load_after": [2.25, 1.0, 0.5],
          "tables": [{"title": "Pushes", "columns": ["rule", "ms"], "rows": [["asgd", "0.10"], ["a|b", "1"]]}],
          "notes": ["A note."], "data": {}}


def test_a_block_is_written_from_its_result_file(tmp_path):
    (tmp_path / "capacity.json").write_text(json.dumps(RESULT))
    text = "before\n<!-- figures:capacity -->\nstale\n<!-- /figures:capacity -->\n<!-- figures:gpu -->\n" \
           "<!-- /figures:gpu -->\nafter\n"
    expected = ("before\n<!-- figures:capacity -->\n"
                "`python benchmarks/capacity.py --quick`: 2026-12-06 10:00, commit `abc123-dirty`; Some CPU, 2 cores, "
                "torch 2.13.0+cpu, OMP_NUM_THREADS unset (1 torch thread, CPU time of this process); load average "
                "1.50 before, 2.25 after; 12 s.\n\n*Pushes*\n\n| rule | ms |\n|---|---|\n| asgd | 0.10 |\n"
                "| a\\|b | 1 |\n\nA note.\n<!-- /figures:capacity -->\n<!-- figures:gpu -->\n"
                "No result yet: run `python benchmarks/gpu.py` on a machine with a CUDA device.\n"
                "<!-- /figures:gpu -->\nafter\n")
    assert page.render(text, tmp_path) == expected
    assert page.differing(text, tmp_path) == ["capacity", "gpu"]
    assert page.differing(expected, tmp_path) == []
    with pytest.raises(ValueError, match="figures:nope"):
        page.render("<!-- figures:nope -->\n<!-- /figures:nope -->", tmp_path)


def test_page_check_fails_on_a_stale_page_and_changes_nothing(tmp_path, capsys):
    stale = tmp_path / "performance.md"
    stale.write_text(PAGE.read_text().replace("<!-- /figures:capacity -->", "a hand edit\n<!-- /figures:capacity -->"))
    before = stale.read_text()
    assert page.main(["--check", "--page", str(stale)]) == 1
    assert "out of date in: capacity" in capsys.readouterr().out
    assert stale.read_text() == before
    assert page.main(["--page", str(stale)]) == 0
    assert stale.read_text() == PAGE.read_text()


def test_make_bench_depends_on_install_and_runs_the_suite_then_the_page():
    makefile = (ROOT / "Makefile").read_text()
    rule = re.search(r"^bench: (.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert rule and rule.group(1).split() == ["install"]
    assert re.search(r"benchmarks/run_all\.py.*benchmarks/page\.py", rule.group(2))
    assert "bench" in re.search(r"^\.PHONY: (.*)$", makefile, re.M).group(1).split()


def test_run_all_refuses_an_unknown_script_in_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        run_all.main(["--only", "server_apply,nope"])
    assert stop.value.code == 2
    assert "unknown script 'nope'" in capsys.readouterr().err


def test_gpu_passes_by_with_one_line_without_a_cuda_device():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: gpu.py would measure it")
    before = sorted((BENCH / "results").iterdir())
    run = subprocess.run([sys.executable, str(BENCH / "gpu.py")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [run.stdout.strip()] and run.stdout.startswith("gpu.py: skipped, no CUDA device")
    assert sorted((BENCH / "results").iterdir()) == before
