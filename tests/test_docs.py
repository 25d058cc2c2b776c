"""Documentation that names files or commands stays true to them."""
import re
from pathlib import Path

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
