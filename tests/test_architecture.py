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
