"""benchmarks/ and experiments/ are scripts over the public API (issue 34): none imports the command line or a
private stalegrad name, and each is listed, with what it measures and how long it runs, in its folder's README."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("benchmarks", "experiments")
SCRIPTS = sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))
PACKAGE = ROOT / "stalegrad"
# Code that a script runs in a child process, written in a string: its imports are checked too.
EMBEDDED = re.compile(r"^\s*(?:from\s+(stalegrad[\w.]*)\s+import\s+([^\n#]+)|import\s+(stalegrad[\w.]*))", re.M)


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def wrong_module(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "stalegrad":
        return None
    if len(parts) > 1 and parts[1] == "cli":
        return f"imports the command line ({module}): call the library, or run `stalegrad` as a user does"
    if any(private(p) for p in parts):
        return f"imports the private module {module}"
    return None


def library_methods() -> dict[str, set[str]]:
    """Every class stalegrad defines, by name: the names of its methods (over the classes of that name)."""
    out: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, set()).update(f.name for f in node.body if isinstance(f, ast.FunctionDef))
    return out


LIBRARY = library_methods()


def problems(source: str) -> list[str]:
    """Where ``source`` reaches stalegrad other than through public names, or imports its command line."""
    tree = ast.parse(source)
    found, bound = [], set()   # bound: local names of stalegrad modules and of the names imported from them
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if why := wrong_module(a.name):
                    found.append(f"line {node.lineno}: {why}")
                if a.name.split(".")[0] == "stalegrad":
                    bound.add(a.asname or "stalegrad")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if why := wrong_module(node.module):
                found.append(f"line {node.lineno}: {why}")
            for a in node.names:   # a private name of stalegrad's, or of another script's
                if private(a.name) or (node.module == "stalegrad" and a.name == "cli"):
                    found.append(f"line {node.lineno}: imports {a.name} from {node.module}")
                if node.module.split(".")[0] == "stalegrad":
                    bound.add(a.asname or a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (private(node.attr) or node.attr == "cli"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                found.append(f"line {node.lineno}: reaches {root.id}...{node.attr}")
            elif isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id == "super" \
                    and private(node.attr):
                found.append(f"line {node.lineno}: calls the inherited private super().{node.attr}")
        elif isinstance(node, ast.ClassDef):   # a subclass of a library class that overrides one of its privates
            for base in (b for b in node.bases if _root(b) in bound):
                name = base.attr if isinstance(base, ast.Attribute) else base.id
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and private(item.name) and item.name in LIBRARY.get(name, ()):
                        found.append(f"line {item.lineno}: {node.name} overrides the private {item.name} of "
                                     f"stalegrad's {name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in EMBEDDED.finditer(node.value):
                module = m.group(1) or m.group(3)
                names = [n.split(" as ")[0].strip(" ()") for n in (m.group(2) or "").split(",")]
                if why := wrong_module(module):
                    found.append(f"line {node.lineno} (code in a string): {why}")
                found += [f"line {node.lineno} (code in a string): imports {n} from {module}"
                          for n in names if private(n)]
    return found


def _root(expr):
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def test_the_checker_finds_each_way_of_reaching_past_the_public_api():
    bad = '''
import stalegrad as sg
import stalegrad.core._secret
from stalegrad.cli.report import seed_list
from stalegrad.runtimes.ray.actors import WorkerActor, _quiet
from stalegrad import numerics
from server_apply import _server
sg._WHERE
numerics._mkl()
class Timed(WorkerActor):
    def _load(self, slices):
        return super()._load(slices)
    def _timed(self):   # a helper of its own: no name of the library's
        pass
CODE = """
import json
from stalegrad.core.worker import FlatModel, _helper
"""
'''
    found = problems(bad)
    assert len(found) == 9, found
    for expected in ("_server from server_apply", "private module stalegrad.core._secret", "command line (stalegrad.cli.report)", "_quiet from",
                     "sg..._WHERE", "numerics..._mkl", "overrides the private _load of stalegrad's WorkerActor", "super()._load", "_helper from"):
        assert sum(expected in f for f in found) == 1, (expected, found)
    good = "import stalegrad as sg\nfrom stalegrad.study.selection import seed_list\nclass S(sg.Simulator):\n" \
           "    def __init__(self):\n        self._mine = super().__init__()\nsg.train\n"
    assert problems(good) == []


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_script_imports_the_cli_or_a_private_stalegrad_name(script):
    assert not problems(script.read_text()), f"{script.relative_to(ROOT)}: {problems(script.read_text())}"


def listed(folder: str) -> dict[str, str]:
    """The README's script list: the items ``- `name.py`: ...`` and their indented continuation lines (a
    subfolder's scripts by their path in it)."""
    text = (ROOT / folder / "README.md").read_text()
    return {m.group(1): m.group(0) for m in re.finditer(r"^- `([\w/.-]+\.(?:py|sh))`.*(?:\n  .*)*", text, re.M)}


# a duration: "about 3 min", "20 s", "1.5 h", "2-4 min"
DURATION = re.compile(r"\d[\d.,]*(?:[-–]\d[\d.,]*)?\s*(?:s|ms|min|h)\b")


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_script_is_listed_in_its_readme_with_how_long_it_runs(folder):
    lines = listed(folder)
    scripts = {str(p.relative_to(ROOT / folder)) for p in SCRIPTS if p.is_relative_to(ROOT / folder)}
    assert len(scripts) > 5, scripts
    assert not scripts - lines.keys(), f"{folder}/README.md lists no line for {sorted(scripts - lines.keys())}"
    assert not {k for k in lines if k.endswith(".py")} - scripts, "the README lists scripts that are gone"
    helpers = {"benchmarks": "common.py", "experiments": "shared.py"}[folder]
    untimed = [s for s in scripts - {helpers} if not DURATION.search(lines[s])]
    assert not untimed, f"{folder}/README.md does not say how long these run: {untimed}"
