"""Documentation that names files or commands stays true to them."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_experiment_file_is_listed_in_experiments_readme():
    readme = (ROOT / "experiments" / "README.md").read_text()
    listed = set(re.findall(r"`([\w.-]+\.toml)`", readme))
    files = {p.name for p in (ROOT / "experiments").glob("*.toml")}
    assert files, "no experiment files found"
    assert not files - listed, f"experiments/README.md does not list {sorted(files - listed)}"


def test_the_demo_comments_name_every_algorithm_the_demo_runs():
    makefile = (ROOT / "Makefile").read_text()
    demo = makefile[makefile.index("\ndemo:"):]
    algos = re.search(r"--algos (\S+)", demo).group(1).split(",")
    comment = makefile[:makefile.index("\ndemo:")].splitlines()[-1]
    readme = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("make demo "))
    for text in (comment, readme):
        named = [a for a in re.findall(r"[a-z][a-z-]*", text.split("#", 1)[1])
                 if a in {"sgd", "ssgd", "asgd", "dcasgd-c", "dcasgd-a", "agn", "downpour", "dynsgd", "easgd",
                          "aeasgd"}]
        assert sorted(named) == sorted(algos), (text, algos)


def readme_block(after_heading: str, fence: str) -> str:
    """The first fenced block of kind ``fence`` in the README section that starts with ``after_heading``."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(f"\n## {after_heading}\n"):]
    start = section.index(f"```{fence}\n") + len(fence) + 4
    return section[start:section.index("```", start)]


def test_the_readme_is_a_front_page_whose_quick_start_is_the_two_make_commands():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250, "the README is a front page: move detail to docs/"
    commands = [line.split("#")[0].strip() for line in readme_block("Quick start", "sh").splitlines()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert "\ndemo:" in makefile and "\ntest:" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text(), "CI runs the README's test command"


def test_the_readme_python_example_prints_what_the_readme_says(tmp_path):
    """The README's example, run as a script, prints its expected output (the bits of one CPU kind)."""
    from stalegrad.numerics import cpu
    torch = pytest.importorskip("torch")
    if cpu().get("cpu_vendor") != "AuthenticAMD" or "avx2" not in Path("/proc/cpuinfo").read_text() \
            or not torch.__version__.startswith("2.13.0") or importlib.util.find_spec("numba") is None:
        pytest.skip("the README's output is the bits of an AMD CPU with AVX2, torch 2.13.0 and numba's kernels")
    script = tmp_path / "example.py"
    script.write_text(readme_block("Python API", "python"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout == readme_block("Python API", "text")


def test_the_documentation_site_builds_strictly_without_a_warning(tmp_path):
    """mkdocs.yml's site (make docs): a broken link, anchor or API reference fails the build."""
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "pymdownx"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: pip install -e '.[docs]' (make install does)")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert not [line for line in output.splitlines() if "WARNING" in line], output
    # mkdocstrings passes over a member that a ::: block names but the module lacks: every one is on its page
    for page in (ROOT / "docs" / "api").glob("*.md"):
        html = (tmp_path / "site" / "api" / page.with_suffix(".html").name).read_text()
        blocks = re.findall(r"^::: ([\w.]+)\n((?:    .*\n)*)", page.read_text(), flags=re.M)
        assert blocks, page
        for identifier, options in blocks:
            members = re.search(r"members: \[(.*)\]", options)
            names = [f"{identifier}.{m.strip()}" for m in members.group(1).split(",")] if members else [identifier]
            missing = [name for name in names if f'id="{name}"' not in html]
            assert not missing, f"{page.name}: {missing} not rendered"
