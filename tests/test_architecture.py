"""The layout promises of ARCHITECTURE.md: no import cycle, small files, math without I/O."""
import ast
import graphlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "stalegrad"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def absolute(module: str, anchor: str) -> str:
    """``module`` as an absolute name: a relative one (``.sim``, ``..cli.run``) from the package ``anchor``."""
    level = len(module) - len(module.lstrip("."))
    if not level:
        return module
    base = anchor.split(".")[:len(anchor.split(".")) - level + 1]
    return ".".join(base + ([module.lstrip(".")] if module.lstrip(".") else []))


# Calls that import the module their first argument names: importlib's, Python's own, runpy's and _lazy's.
DYNAMIC = {"import_module", "__import__", "run_module", "LazyModule"}
MODULE_NAME = re.compile(r"\.+\w+(\.\w+)*|stalegrad(\.\w+)+")


def imports_in(name: str, source: str, is_package: bool = False) -> set[str]:
    """The stalegrad modules that the module ``name`` (of ``source``) imports: every import statement, in
    functions too, and every dynamic import. A dynamic import whose name is computed counts every module
    name the file spells as a string (``runtimes/__init__.py``'s table), and "?" if it spells none."""
    package = name if is_package else name.rpartition(".")[0]
    found, tree = set(), ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = absolute("." * node.level + (node.module or ""), package)
            submodules = {f"{base}.{a.name}" for a in node.names} & MODULES.keys()
            # `from . import x` imports module x; its package is a parent, imported implicitly (not an edge)
            found |= submodules if submodules and not node.module else {base}
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in DYNAMIC:
            anchor = name if any(getattr(a, "id", None) == "__name__" for a in node.args[1:]) else package
            target = node.args[0] if node.args else None
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                found.add(absolute(target.value, anchor))
            else:
                spelled = {absolute(c.value, anchor) for c in ast.walk(tree) if isinstance(c, ast.Constant)
                           and isinstance(c.value, str) and MODULE_NAME.fullmatch(c.value)}
                found |= (spelled & MODULES.keys()) or {"?"}
    return {m for m in found if (m in MODULES or m == "?") and m != name}


def imports_of(name: str, path: Path) -> set[str]:
    return imports_in(name, path.read_text(), path.name == "__init__.py")


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


def layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else ""


def test_the_top_level_holds_only_the_subpackages_and_the_shared_modules():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == TOP_LEVEL, f"move these into a subpackage: {sorted(top - TOP_LEVEL)}"
    assert {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} == SUBPACKAGES


def wrong_imports(name: str, deps: set[str]) -> list[str]:
    """The imports of module ``name`` that go against the layers (MAY_IMPORT), and those the test cannot see."""
    own = layer(name)
    return [f"{name} imports {dep}" if dep != "?" else f"{name} imports a module whose name it computes: spell it"
            for dep in sorted(deps) if dep == "?" or layer(dep) in SUBPACKAGES - {own} - MAY_IMPORT[own]]


def test_every_import_goes_down_the_layers():
    assert set(MAY_IMPORT) == SUBPACKAGES
    wrong = [w for name, path in MODULES.items() if layer(name) in SUBPACKAGES
             for w in wrong_imports(name, imports_of(name, path))]
    assert not wrong, "imports against the layers of ARCHITECTURE.md: " + "; ".join(wrong)
    # the modules every layer shares import none (_lazy imports the name each LazyModule(...) call, checked, gives)
    for shared in ("errors", "numerics", "_lazy"):
        deps = imports_of(f"stalegrad.{shared}", PACKAGE / f"{shared}.py")
        assert not {layer(d) for d in deps} & SUBPACKAGES, (shared, deps)
    # the test sees real edges: the run imports the core and a runtime, and the core imports no run
    graph = {n: imports_of(n, p) for n, p in MODULES.items()}
    assert "stalegrad.core.server" in graph["stalegrad.run.training"]
    assert "stalegrad.runtimes" in graph["stalegrad.run.training"]
    # ... and the dynamic ones: the runtimes by name from a table, ResNet-20's module on first use
    assert {"stalegrad.runtimes.sim", "stalegrad.runtimes.local", "stalegrad.runtimes.ray"} <= graph["stalegrad.runtimes"]
    assert "stalegrad.models.zoo" in graph["stalegrad.models"]
    # a grid checks its cells against the options in run/, not the command line's
    assert "stalegrad.run.options" in graph["stalegrad.study.grid"]


CLIMBING = """
import importlib
from .. import errors

def late():
    from ..cli import options
    import stalegrad.cli.run

def dynamic(name):
    importlib.import_module("stalegrad.cli.grid")
    importlib.import_module("..cli.report", __package__)
    __import__("stalegrad.cli.tools")
"""


@pytest.mark.parametrize("source, found", [
    (CLIMBING, {"stalegrad.errors", "stalegrad.cli", "stalegrad.cli.run", "stalegrad.cli.grid",
                "stalegrad.cli.report", "stalegrad.cli.tools"}),
    ("import importlib\nMODULES = {'r': '.grid', 's': '.stats'}\n"
     "def load(k):\n    return importlib.import_module(MODULES[k], __package__)\n",
     {"stalegrad.study.grid", "stalegrad.study.stats"}),
    ("import importlib\ndef load(k):\n    return importlib.import_module(f'stalegrad.{k}')\n", {"?"}),
])
def test_the_layer_check_sees_imports_in_functions_and_dynamic_ones(source, found):
    """A study module that climbed into the command line every way Python allows is caught, each import named."""
    deps = imports_in("stalegrad.study.fake", source)
    assert deps == found
    wrong = wrong_imports("stalegrad.study.fake", deps)
    assert len(wrong) == len(found - {"stalegrad.errors", "stalegrad.study.grid", "stalegrad.study.stats"})
    assert all(w.startswith("stalegrad.study.fake imports") for w in wrong)


def test_each_subpackage_says_what_it_may_import():
    """Every subpackage's docstring names the layers it may import and those it never does, as MAY_IMPORT has them."""
    def layers(text: str) -> set[str]:
        return set(re.findall(r"``(\w+)``", text)) & SUBPACKAGES
    for sub in sorted(SUBPACKAGES):
        doc = ast.get_docstring(ast.parse((PACKAGE / sub / "__init__.py").read_text())) or ""
        assert "may import" in doc, sub
        sentence = re.split(r"\.(?:\s|$)", doc[doc.index("may import"):])[0]
        may, _, never = sentence.partition("never")
        assert layers(may) == MAY_IMPORT[sub], (sub, sentence)
        assert layers(never) == SUBPACKAGES - MAY_IMPORT[sub] - {sub}, (sub, sentence)


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
