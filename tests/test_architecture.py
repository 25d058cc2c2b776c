"""The layout promises of ARCHITECTURE.md: no import cycle, small files, math without I/O."""
import ast
import graphlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "stalegrad"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path) -> set[str]:
    """The stalegrad modules that ``name`` imports explicitly (anywhere in the file, lazily or not)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            submodules = {f"{base}.{a.name}" for a in node.names} & MODULES.keys()
            # `from . import x` imports module x; its package is a parent, imported implicitly (not an edge)
            found |= submodules if submodules and not node.module else {base}
    return {m for m in found if m in MODULES and m != name}


def test_the_import_graph_has_no_cycle():
    graph = {name: imports_of(name, path) for name, path in MODULES.items()}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")
    # the graph is real: the simulator imports the contract and the event loop, not the other way round
    assert {"stalegrad.runtimes.base", "stalegrad.runtimes.events"} <= graph["stalegrad.runtimes.sim"]
    assert "stalegrad.runtimes.sim" not in graph["stalegrad.runtimes.events"]
    assert "stalegrad.runtimes.sim" not in graph["stalegrad.runtimes.vectorised"]


def test_no_file_is_over_400_lines():
    long = {name: n for name, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these modules: {long}"


def test_the_math_layer_does_no_io_and_knows_no_runtime():
    for name, path in MODULES.items():
        if name.startswith("stalegrad.algorithms"):
            deps = imports_of(name, path)
            assert all(d.startswith(("stalegrad.algorithms", "stalegrad.errors", "stalegrad._lazy")) for d in deps), \
                (name, deps)
            text = path.read_text()
            assert "open(" not in text and "print(" not in text, name


# ---- the layout by layer (issue 34) --------------------------------------------------------------------
TOP_LEVEL = {"__init__", "__main__", "errors", "numerics", "_lazy"}
SUBPACKAGES = {"algorithms", "core", "run", "study", "runtimes", "data", "models", "cli"}
# What each subpackage may import (besides itself and the top-level modules): the direction of ARCHITECTURE.md.
MAY_IMPORT = {
    "algorithms": set(),
    "models": set(),
    "data": set(),
    "core": {"algorithms", "models", "data"},
    "runtimes": {"core", "algorithms", "models", "data"},
    "run": {"core", "runtimes", "algorithms", "models", "data"},
    "study": {"run", "core", "runtimes", "algorithms", "models", "data"},
    "cli": SUBPACKAGES - {"cli"},
}
# The one arrow that climbs: a grid runs each cell as `stalegrad train` and checks its options against that
# command's (stalegrad/study/__init__.py says so).
CLIMBS = {("stalegrad.study.grid", "cli"), ("stalegrad.study.grid_names", "cli")}


def layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else ""


def test_the_top_level_holds_only_the_subpackages_and_the_shared_modules():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == TOP_LEVEL, f"move these into a subpackage: {sorted(top - TOP_LEVEL)}"
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} == SUBPACKAGES


def test_every_import_goes_down_the_layers():
    wrong = []
    for name, path in MODULES.items():
        own = layer(name)
        if own not in MAY_IMPORT:
            continue
        for dep in imports_of(name, path):
            other = layer(dep)
            if other in SUBPACKAGES and other != own and other not in MAY_IMPORT[own] \
                    and (name, other) not in CLIMBS:
                wrong.append(f"{name} imports {dep}")
    assert not wrong, "imports against the layers of ARCHITECTURE.md: " + "; ".join(wrong)
    # the test sees real edges: the run imports the core and a runtime, and the core imports no run
    graph = {n: imports_of(n, p) for n, p in MODULES.items()}
    assert "stalegrad.core.server" in graph["stalegrad.run.training"]
    assert "stalegrad.runtimes" in graph["stalegrad.run.training"]


def test_each_subpackage_says_what_it_may_import():
    for sub in ("core", "run", "study"):
        doc = (PACKAGE / sub / "__init__.py").read_text()
        assert "may import" in doc and "never" in doc or sub == "study", sub


def test_every_public_name_and_old_module_path_still_imports():
    import importlib
    import warnings

    import stalegrad
    for name in stalegrad.__all__:
        assert getattr(stalegrad, name) is not None, name
    for old, new in stalegrad.MOVED.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(f"stalegrad.{old}")
        assert module is importlib.import_module(f"stalegrad.{new}"), old
        if caught:   # the first import of the old path warns (later ones find it in sys.modules)
            assert issubclass(caught[0].category, DeprecationWarning) and f"stalegrad.{new}" in str(caught[0].message)
    # in a fresh process, the first import of an old path warns, naming the new one
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", "import stalegrad.report"],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "stalegrad.report moved to stalegrad.study.report" in proc.stderr
